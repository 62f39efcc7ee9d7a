//! Failpoints: named places where the agent can be made to die, to test crash recovery.
//!
//! `INPLACED_FAILPOINTS="write:3,act"` makes the process SIGKILL itself the 3rd time it
//! reaches `write` and the first time it reaches `act` (the same as a power cut at that
//! instant: no destructor runs, no buffer is flushed). The variable is read once; when it
//! is unset every failpoint is a no-op load of an empty list.
//!
//! The failpoints, in the order an operation meets them:
//!
//! | name | where |
//! | --- | --- |
//! | `stage` | pre-images and the intent are in the journal; nothing written yet |
//! | `write-temp` | a temporary file is written and fsynced, not yet renamed over its target |
//! | `write` | after each file write (renamed; its directory is fsynced after the last write) |
//! | `remove` | after each file removal (unlinked; its directory is fsynced after the last one) |
//! | `sysctl` | after the live sysctl writes |
//! | `act` | after the unit actions, before the health check and verification |
//! | `record` | the new applied record and the commit marker are in the journal |
//! | `applied` | the applied record is installed; the journal is not yet removed |
//! | `reboot-required` | the operation is persisted as RebootRequired, before any reboot |
//! | `coverage` | a coverage answer is about to be computed (a request's thread, not an operation's) |
//!
//! `INPLACED_FAILPOINTS="stage-enospc"` instead makes staging fail with ENOSPC, as a
//! full state directory would; `effect-marker-enospc:N` the Nth durable marker of an
//! effect's step (a Kubernetes upgrade's). `state-full:N` makes the Nth write to the state directory
//! and every later one fail with ENOSPC (a state directory that fills up and stays full:
//! [`sticky`]). `full-after-commit` fills it just after the commit point (through
//! `state-full`), before the applied record is installed.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

fn table() -> &'static Mutex<HashMap<String, u32>> {
    static T: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
    T.get_or_init(|| {
        let mut m = HashMap::new();
        if let Ok(v) = std::env::var("INPLACED_FAILPOINTS") {
            for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let (name, n) = match item.split_once(':') {
                    Some((a, b)) => (a, b.parse().unwrap_or(1)),
                    None => (item, 1),
                };
                m.insert(name.to_string(), n);
            }
        }
        Mutex::new(m)
    })
}

/// True once the failpoint `name` is reached its configured number of times.
pub fn triggered(name: &str) -> bool {
    let mut t = table().lock().unwrap_or_else(|p| p.into_inner());
    match t.get_mut(name) {
        Some(n) if *n <= 1 => {
            t.remove(name);
            true
        }
        Some(n) => {
            *n -= 1;
            false
        }
        None => false,
    }
}

/// Dies by SIGKILL if the failpoint `name` triggers; panics instead when the
/// environment says `INPLACED_FAILPOINT_PANIC=1` (read once), which tests what a bug does:
/// on the daemon's own threads its panic hook ends the process by SIGABRT at that instant,
/// as SIGKILL would; on a request's thread the request fails alone (`inplaced`'s
/// `abort_on_panic_outside_requests`).
pub fn hit(name: &str) {
    if triggered(name) {
        static PANIC: OnceLock<bool> = OnceLock::new();
        if *PANIC
            .get_or_init(|| std::env::var_os("INPLACED_FAILPOINT_PANIC").is_some_and(|v| v == "1"))
        {
            panic!("failpoint {name} reached (INPLACED_FAILPOINT_PANIC=1)");
        }
        tracing::warn!(failpoint = name, "failpoint reached: killing the process");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        std::process::abort();
    }
}

/// True from the moment the failpoint `name` is reached its configured number of times
/// on: a condition that, once it holds, keeps holding (a full disk).
pub fn sticky(name: &str) -> bool {
    static ON: OnceLock<Mutex<std::collections::HashSet<String>>> = OnceLock::new();
    let on = ON.get_or_init(|| Mutex::new(std::collections::HashSet::new()));
    let mut on = on.lock().unwrap_or_else(|p| p.into_inner());
    if on.contains(name) {
        return true;
    }
    if triggered(name) {
        on.insert(name.to_string());
        return true;
    }
    false
}

/// Turns the sticky condition `name` on now (a failpoint that fills the disk at a chosen
/// instant).
pub fn set_sticky(name: &str) {
    {
        let mut t = table().lock().unwrap_or_else(|p| p.into_inner());
        t.insert(name.to_string(), 1);
    }
    let _ = sticky(name);
}
