//! The daemon's allocator: jemalloc (the `tikv-jemallocator` crate, registered as the
//! global allocator by `src/bin/inplaced.rs`) with the settings in [`MALLOC_CONF`], and
//! the per-thread caches handed back when a thread goes idle ([`release_thread_cache`]).
//!
//! **Why not glibc's malloc.** Under its peak load (8 coverage clients and 200-file
//! operations) the daemon's live heap is 3.6-4.5 MB, but glibc's arenas held about twice
//! that (10.4-12.0 MiB of anonymous RSS at the peak, with at most 2 arenas, no fastbins and a
//! 1 MiB trim threshold; `malloc_trim` every second did not lower it): its free chunks
//! sit on pages that still hold live ones, and it gives back only the free top of a heap
//! unless trimmed. jemalloc keeps the objects of one size class together in slabs and
//! gives back every page a decay period has left unused. Measured with
//! `BENCH_ONLY=memory` (BENCHMARKS.md, "jemalloc (session 15)"): the anonymous peak fell
//! from 10.4-12.0 to 6.2-6.7 MiB and the RSS peak from 18.9-20.3 to 15.1-15.8 MiB, with
//! more coverage calls answered in the same window (175-201 thousand against 155-173).
//! After four 199 000-sysctl specs at once the RSS returns to 31 MiB, where glibc kept
//! about 140 MiB (`tests/memory_bounds.rs`). mimalloc (38-115 MiB at the peak, session
//! 12) and tcmalloc (52 MiB, session 15) kept far more.
//!
//! **The settings**, each measured against the others in the same bench:
//!
//! - `narenas:1`: one arena for every thread (the default is 4 per core). The daemon's
//!   concurrency is bounded by its own limits (4 coverage computations, 1 operation), and
//!   each extra arena keeps its own partly used slabs.
//! - Small thread caches (`tcache_max:4096`, `tcache_nslots_small_max:16`,
//!   `tcache_nslots_large:4`), flushed when a thread goes idle: with jemalloc's default
//!   caches the RSS peak was 29.3 MiB (each of the 20-30 threads at the peak keeps up to
//!   200 objects of every small size class), 19.1 MiB with the flushes, 15.3 with the
//!   small caches too. Without any (`tcache:false`) the peak was 14.6-14.8 MiB, but
//!   every allocation took the arena's lock: callgrind counted 4.32 M instructions per
//!   computed `full.yaml` answer against 2.77 M with glibc and 2.98 M with these.
//! - `background_thread:true`, `max_background_threads:1`, `dirty_decay_ms:50`,
//!   `muzzy_decay_ms:0`: pages left unused for 50 ms are given back with
//!   `madvise(MADV_DONTNEED)` by jemalloc's own thread, also once the daemon is idle (no
//!   allocation then drives the purge). No lazy `MADV_FREE` stage: such pages stay in the
//!   RSS until the kernel is short of memory. Purging at once (`dirty_decay_ms:0`) halved
//!   the coverage calls answered under load (one `madvise` per freed run); 10 ms and 50
//!   ms gave the same peak, 200 ms 0.7 MiB more. Without the background thread the RSS
//!   after a burst of operations stayed 2.1 MiB higher (nothing purges an idle daemon).
//!   The purges did not measurably lengthen the tail of a stream of calls: over 20 000
//!   coverage calls of the example the p99 was 1.08-1.58x an empty call's as set here,
//!   1.09-1.70x with a 1 s decay and 1.13-1.34x without the background thread (three runs
//!   each; BENCHMARKS.md, "How many calls a p99 needs", which also says why session 15's
//!   2000-call runs had pointed at the purges). A 1 s decay raised the RSS peak to 18.2
//!   MiB.
//!
//! The environment variable `_RJEM_MALLOC_CONF` (jemalloc's `MALLOC_CONF` under the
//! crate's symbol prefix) overrides these for a measurement: jemalloc reads it after the
//! compiled-in string (jemalloc(3), "TUNING").

/// A C string jemalloc reads as `malloc_conf` (see [`MALLOC_CONF`]). Its layout is one
/// `const char *`, as jemalloc declares the symbol.
#[repr(transparent)]
#[derive(Debug)]
pub struct MallocConf(*const std::ffi::c_char);

// SAFETY: the pointer is to a `'static` string literal, never written.
#[allow(unsafe_code)]
unsafe impl Sync for MallocConf {}

/// The daemon's jemalloc settings (the module documentation says why each). The binary
/// exports it under the name jemalloc looks up, `_rjem_malloc_conf`.
pub const MALLOC_CONF: MallocConf = MallocConf(
    c"narenas:1,tcache_max:4096,tcache_nslots_small_max:16,tcache_nslots_large:4,background_thread:true,max_background_threads:1,dirty_decay_ms:50,muzzy_decay_ms:0"
        .as_ptr(),
);

/// Returns the calling thread's cached free objects to the arena (jemalloc's
/// `thread.tcache.flush`), so that a thread going idle does not keep them: called when a
/// request's blocking task ends, an operation ends and an async worker parks. The name is
/// looked up once (`mallctlnametomib`); each call is then one `mallctlbymib`, as it runs
/// on every park. A no-op (jemalloc then only sets itself up) in a process whose global
/// allocator is not jemalloc.
pub(crate) fn release_thread_cache() {
    static MIB: std::sync::OnceLock<Option<[usize; 3]>> = std::sync::OnceLock::new();
    let Some(mib) = MIB.get_or_init(|| {
        let mut mib = [0usize; 3];
        let mut len = mib.len();
        // SAFETY: the name is NUL-terminated; `mib` has room for `len` components, and
        // jemalloc writes at most that many and the count back to `len`.
        #[allow(unsafe_code)]
        let rc = unsafe {
            tikv_jemalloc_sys::mallctlnametomib(
                c"thread.tcache.flush".as_ptr(),
                mib.as_mut_ptr(),
                &mut len,
            )
        };
        (rc == 0 && len == mib.len()).then_some(mib)
    }) else {
        return;
    };
    // SAFETY: `thread.tcache.flush` is a void control (jemalloc(3), "MALLCTL NAMESPACE"):
    // no old or new value is read or written; `mib` is the 3 components looked up above.
    #[allow(unsafe_code)]
    let _ = unsafe {
        tikv_jemalloc_sys::mallctlbymib(
            mib.as_ptr(),
            mib.len(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
}
