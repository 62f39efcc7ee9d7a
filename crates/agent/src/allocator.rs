//! The daemon's settings of glibc's allocator, and when it gives memory back.
//!
//! - **At most 2 arenas** (`mallopt(M_ARENA_MAX, 2)` at start, before any thread). glibc
//!   otherwise gives each thread that allocates while another holds an arena a new one,
//!   up to 8 per core, each up to 64 MiB of address space; freed memory stays in the arena
//!   it came from. The daemon's threads (2 async workers, the blocking pool planning
//!   coverage, the operation thread, the drift watcher) would each keep their own: with 8
//!   concurrent coverage clients the RSS rose to 56-132 MiB (BENCHMARKS.md, issue 16
//!   §1). The unit sets `MALLOC_ARENA_MAX=2` too; this makes it hold however the daemon
//!   is started (a container, a test, a shell). An explicit `MALLOC_ARENA_MAX` in the
//!   environment wins, so the setting can still be measured against others.
//! - **Free pages given back once an operation has settled and the agent is idle**
//!   (`malloc_trim(0)`, [`release_free_memory`]: called by the operation thread after
//!   [`TRIM_AFTER`] without a next operation). An operation plans, journals and verifies
//!   with a few MiB of short-lived allocations; glibc keeps the freed pages mapped (only a
//!   free top of the heap above `trim_threshold` goes back), so the RSS after a burst of
//!   operations stayed at its peak. Trimming after every operation instead would cost the
//!   next one its page faults (about 1 µs a page) on back-to-back applies.
//!
//! The system allocator is kept: no other allocator was measured clearly better here
//! (BENCHMARKS.md, "Issue 28: removal, apply CPU and memory (session 8)").

/// How long an operation thread waits idle after its operation before the allocator's
/// free pages are given back.
pub(crate) const TRIM_AFTER: std::time::Duration = std::time::Duration::from_millis(500);

/// Caps glibc's arenas at 2 unless `MALLOC_ARENA_MAX` is set; call before any thread is
/// started. A no-op on other C libraries.
pub(crate) fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a parameter of the allocator; M_ARENA_MAX takes
        // any positive count. Called from main before other threads exist.
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

/// Gives the allocator's free pages back to the kernel (every arena, the middle of the
/// heap too). A no-op on other C libraries.
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system; it takes the arenas'
    // own locks and is safe to call from any thread at any time.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}
