//! glibc malloc settings and giving freed memory back after a burst of hooks.
//!
//! At fleet size (N = 1000 concurrent hooks, BENCHMARKS.md "Issue 28: the extension's
//! memory at N = 1000"), about 60 MiB of the extension's 150 MiB RSS was memory already
//! freed: the hooks' transient allocations (request bodies, parsed JSON, specs, TLS
//! handshakes) interleave with the connections' long-lived buffers, so the freed chunks
//! sit between live ones and glibc keeps them (its automatic trim only returns the top
//! of the heap). `malloc_trim(0)` hands every free page back (`madvise`), measured with
//! gdb on the running extension: 152 → 89 MiB. The last hook in flight trims when it
//! ends (at most once per [`TRIM_AFTER_LAST`]), and the pool's prune tick every
//! [`TRIM_EVERY`] when a hook ended since the last trim ([`Activity::trim_if_used`]), so
//! memory falls back within a second of a burst, a long burst is trimmed as it goes,
//! and an idle extension does no work.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How often the pool's prune tick trims when a hook ended since the last trim (a trim
/// walks the free lists under the arena locks).
pub(crate) const TRIM_EVERY: Duration = Duration::from_secs(1);

/// Least time between a trim and the one the last hook in flight makes when it ends. It
/// was [`TRIM_EVERY`]: a burst whose last hook ended within a second of the tick's trim
/// kept what its last second freed until the next tick, so the RSS read as the burst
/// ended was the burst's peak in some runs and half of it in others (at N = 1000: 61
/// against 109 MiB, with the same build). It bounds the trims of hooks that come one at a
/// time to ten a second.
pub(crate) const TRIM_AFTER_LAST: Duration = Duration::from_millis(100);

/// `M_ARENA_MAX` for glibc: 2 arenas instead of 8 per core. Each arena keeps its own
/// freed memory, and each thread that allocates gets one until the limit. Measured at
/// N = 1000 with 16 runtime workers (`TOKIO_WORKER_THREADS=16`, pool of 256): RSS after
/// the hooks 148 → 118 MiB without trimming, 54 → 48 MiB with it, peak 141 → 116 MiB.
/// Set by [`configure`] rather than `MALLOC_ARENA_MAX` in a unit, as the extension runs
/// in a container whose environment is the operator's.
pub(crate) const ARENAS: i32 = 2;

// The one unsafe code of the extension: two glibc calls that take no pointers.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
mod sys {
    unsafe extern "C" {
        fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    /// glibc's `M_ARENA_MAX` (malloc.h).
    const M_ARENA_MAX: std::ffi::c_int = -8;

    pub(super) fn arena_max(n: i32) -> bool {
        // SAFETY: mallopt only sets a malloc parameter; called before other threads start
        unsafe { mallopt(M_ARENA_MAX, n) == 1 }
    }

    pub(super) fn trim() {
        // SAFETY: malloc_trim takes the arena locks itself; no pointers are passed
        unsafe {
            malloc_trim(0);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod sys {
    pub(super) fn arena_max(_: i32) -> bool {
        false
    }
    pub(super) fn trim() {}
}

/// Sets glibc's arena count to [`ARENAS`]; call at start, before the runtime's threads.
/// Returns whether the allocator took it (false on other C libraries).
pub(crate) fn configure() -> bool {
    sys::arena_max(ARENAS)
}

/// Hooks in flight, and whether memory was used since the last trim.
#[derive(Debug)]
pub(crate) struct Activity {
    in_flight: AtomicUsize,
    used: AtomicBool,
    last_trim: Mutex<Option<Instant>>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            used: AtomicBool::new(false),
            last_trim: Mutex::new(None),
        }
    }
}

/// One hook in flight; dropping it may trim ([`Activity`]).
#[derive(Debug)]
pub(crate) struct Busy<'a>(&'a Activity);

impl Activity {
    /// Counts a hook in flight until the guard is dropped.
    pub(crate) fn busy(&self) -> Busy<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(self)
    }

    /// Trims when a hook ended since the last trim and the last trim is at least `gap`
    /// old; true when it did. The last hook in flight calls it with [`TRIM_AFTER_LAST`], the
    /// prune tick (every [`TRIM_EVERY`]) with no gap, so memory freed by a burst is
    /// given back within a second of its end also when its last hook came too soon
    /// after a trim.
    pub(crate) fn trim_if_used(&self, gap: Duration) -> bool {
        let mut last = self.last_trim.lock().unwrap_or_else(|p| p.into_inner());
        if !self.used.load(Ordering::Acquire) || last.is_some_and(|t| t.elapsed() < gap) {
            return false;
        }
        self.used.store(false, Ordering::Release);
        *last = Some(Instant::now());
        drop(last);
        sys::trim();
        true
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        // the hook's memory is freed by now (its request, answer and parsed forms are
        // dropped before the guard, which is made first)
        self.0.used.store(true, Ordering::Release);
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.trim_if_used(TRIM_AFTER_LAST);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_after_the_last_hook_and_at_the_tick() {
        let a = Activity::default();
        // nothing ended: nothing to give back
        assert!(!a.trim_if_used(Duration::ZERO));
        let one = a.busy();
        let two = a.busy();
        drop(one);
        // a hook still in flight: no trim when one ends (the tick's, or the last hook's)
        assert!(a.used.load(Ordering::Acquire));
        drop(two);
        assert!(!a.used.load(Ordering::Acquire), "the last hook trimmed");
        // a hook that starts after a trim and ends within TRIM_AFTER_LAST of it: too
        // soon for the last hook, left for the tick
        let three = a.busy();
        assert!(!a.trim_if_used(Duration::ZERO), "nothing ended since");
        drop(three);
        assert!(
            a.used.load(Ordering::Acquire),
            "too soon after the last trim"
        );
        assert!(a.trim_if_used(Duration::ZERO), "the tick trims it");
        assert!(!a.trim_if_used(Duration::ZERO), "nothing ended since");
        // a burst whose hooks started before a tick's trim and end after it: their
        // memory is freed at the end, so it is trimmed again
        let four = a.busy();
        let five = a.busy();
        drop(four);
        assert!(a.trim_if_used(Duration::ZERO), "the tick, mid-burst");
        *a.last_trim.lock().unwrap() = Some(Instant::now() - TRIM_AFTER_LAST);
        drop(five);
        assert!(!a.used.load(Ordering::Acquire), "the last hook trimmed");
        // the last hook of a burst trims also when the tick trimmed less than a second
        // before (what the burst freed since is not left until the next tick)
        let six = a.busy();
        let seven = a.busy();
        drop(six);
        assert!(a.trim_if_used(Duration::ZERO), "the tick, mid-burst");
        *a.last_trim.lock().unwrap() = Some(Instant::now() - Duration::from_millis(200));
        drop(seven);
        assert!(
            !a.used.load(Ordering::Acquire),
            "the last hook trims 200 ms after the tick"
        );
    }

    #[test]
    fn the_arena_count_is_set_on_glibc() {
        assert_eq!(
            configure(),
            cfg!(all(target_os = "linux", target_env = "gnu"))
        );
    }
}
