//! The drift watcher: a thread that rescans managed items when inotify reports a change in
//! one of their directories, and every `drift.interval_secs` anyway (a change inotify can
//! not see, such as one on another mount of the same file system, is caught by the
//! periodic scan). It never repairs: drift is recorded (`drift.json`) and reported in
//! status. Scans are skipped while an operation runs, whose own writes are not drift.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::inotify::{self, CreateFlags, WatchFlags};

use super::Agent;

/// Runs until `stop` is set. Blocks: start it on its own thread.
pub(crate) fn run(agent: Arc<Agent>, interval: Duration, stop: Arc<AtomicBool>) {
    let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 4096];
    while !stop.load(Ordering::Relaxed) {
        let Ok(fd) = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK) else {
            std::thread::sleep(interval);
            continue;
        };
        for d in agent.watched_dirs() {
            let host = agent.root().path().join(d.trim_start_matches('/'));
            let _ = inotify::add_watch(
                &fd,
                &host,
                WatchFlags::CLOSE_WRITE
                    | WatchFlags::MOVED_TO
                    | WatchFlags::MOVED_FROM
                    | WatchFlags::CREATE
                    | WatchFlags::DELETE
                    | WatchFlags::ATTRIB
                    | WatchFlags::ONLYDIR,
            );
        }
        // wake at least once a second to notice `stop`
        let mut waited = Duration::ZERO;
        let mut event = false;
        while waited < interval && !stop.load(Ordering::Relaxed) {
            let step = Duration::from_secs(1).min(interval - waited);
            let ts = Timespec {
                tv_sec: step.as_secs() as i64,
                tv_nsec: step.subsec_nanos() as i64,
            };
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            if matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(n) if n > 0) {
                event = true;
                break;
            }
            waited += step;
        }
        if event {
            // let a burst of writes settle, then drain the queue
            std::thread::sleep(Duration::from_millis(200));
            let mut reader = inotify::Reader::new(&fd, &mut buf);
            while reader.next().is_ok() {}
        }
        if !agent.is_busy() {
            let _ = agent.scan_drift();
        }
    }
}
