//! The threads operations run on: one is kept after its operation ends, for the next
//! one, instead of a thread created (stack mapped, first pages faulted) and torn down per
//! operation.
//!
//! An operation may block for a long time (a health gate, a reboot it waits for), and the
//! next operation must not wait behind it (it may be the one that supersedes it): a new
//! operation takes an idle thread when there is one, else a new thread is started, as
//! before. A thread idle for [`IDLE`] ends, so a burst leaves no threads behind.

use std::sync::Mutex;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Duration;

/// How long a thread waits for its next operation before it ends.
const IDLE: Duration = Duration::from_secs(300);

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A set of reusable threads.
#[derive(Debug)]
pub(super) struct Workers {
    /// Idle threads: (thread number, the sender of its next job).
    idle: Mutex<Vec<(u64, Sender<Job>)>>,
    next: std::sync::atomic::AtomicU64,
}

/// The threads of operations. A thread hands its allocator cache back after each
/// operation; the pages an operation freed go back to the kernel by the allocator's own
/// decay ([`crate::allocator`]).
pub(super) static OPERATIONS: Workers = Workers::new();

impl Workers {
    const fn new() -> Workers {
        Workers {
            idle: Mutex::new(Vec::new()),
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Sender<Job>)>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `job` on an idle thread, or on a new one named `name`.
    pub(super) fn run(
        &'static self,
        name: &str,
        job: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<()> {
        let job: Job = Box::new(job);
        // a thread in the list only leaves it under the lock (see `worker`): once popped,
        // its receiver stays open until it has taken this job
        let popped = self.idle().pop();
        if let Some((_, tx)) = popped {
            return tx
                .send(job)
                .map_err(|_| std::io::Error::other("operation thread gone"));
        }
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || self.worker(n, job, tx, rx))
            .map(|_| ())
    }

    fn worker(&self, n: u64, mut job: Job, tx: Sender<Job>, rx: Receiver<Job>) {
        loop {
            job();
            crate::allocator::release_thread_cache();
            self.idle().push((n, tx.clone()));
            job = match rx.recv_timeout(IDLE) {
                Ok(j) => j,
                Err(RecvTimeoutError::Timeout) => {
                    let mut list = self.idle();
                    match list.iter().position(|(m, _)| *m == n) {
                        // still listed: nobody will send; end
                        Some(i) => {
                            list.swap_remove(i);
                            return;
                        }
                        // taken by `run` meanwhile: its job is on the way
                        None => {
                            drop(list);
                            match rx.recv() {
                                Ok(j) => j,
                                Err(_) => return,
                            }
                        }
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_reused_and_a_busy_one_is_not_waited_for() {
        static W: Workers = Workers::new();
        fn run(job: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
            W.run("test", job)
        }
        let (done_tx, done_rx) = channel();
        let d = done_tx.clone();
        run(move || d.send(std::thread::current().id()).unwrap()).unwrap();
        let first = done_rx.recv().unwrap();
        // the thread lists itself as idle right after its job
        std::thread::sleep(Duration::from_millis(50));
        let d = done_tx.clone();
        run(move || d.send(std::thread::current().id()).unwrap()).unwrap();
        assert_eq!(done_rx.recv().unwrap(), first, "reused");
        // a blocked operation: the next one runs on another thread meanwhile
        std::thread::sleep(Duration::from_millis(50));
        let (block_tx, block_rx) = channel::<()>();
        run(move || block_rx.recv().unwrap()).unwrap();
        let d = done_tx.clone();
        run(move || d.send(std::thread::current().id()).unwrap()).unwrap();
        let other = done_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("not queued behind the blocked one");
        assert_ne!(other, first);
        block_tx.send(()).unwrap();
    }
}
