//! Connections a server closes from outside their I/O: each accepted connection gets a
//! [`Closer`], carried in its connection info ([`crate::tls::TlsPeer::closer`] on TCP,
//! [`crate::accept::LocalPeer::closer`] on the local socket, which tonic puts in every
//! request's extensions) and checked by the connection's reads and writes
//! ([`crate::tls::Conn`], [`crate::accept::LocalConn`]).
//!
//! Why from outside: hyper serves each connection in a task that tonic spawns and keeps
//! no handle to (tonic 0.14 `transport::server::serve_connection`), and it polls a
//! response body only while the stream has HTTP/2 send capacity (hyper 1.x
//! `proto::h2::PipeToSendStream` waits in `poll_capacity`), so a response whose client
//! keeps its window at 0 can neither be ended by its body nor reset by the service: it
//! stays, with what it holds, until the connection ends.
//!
//! Once [`Closer::close`] is called, the connection's next read or write fails with
//! `ConnectionAborted` (the task polling it is woken for that). hyper's HTTP/2 connection
//! ends with that error and tonic drops it; h2 then ends every stream of it
//! (`Connection::drop` calls `Streams::recv_eof`: each stream's queued frames are cleared
//! and its task woken), so each stream's task ends and drops its response body and the
//! data it was about to send; the socket is closed with the connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Waker};

/// The handle that closes one connection; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Closer(Arc<State>);

#[derive(Debug, Default)]
struct State {
    closed: AtomicBool,
    /// The tasks last polling the connection's reads and writes (hyper polls both from
    /// its connection task; kept apart should they ever differ).
    wakers: Mutex<[Option<Waker>; 2]>,
}

/// Which half of a connection is polled, for [`Closer::check`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Side {
    Read = 0,
    Write = 1,
}

impl Closer {
    /// A handle for a new, open connection.
    pub fn new() -> Closer {
        Closer::default()
    }

    /// Closes the connection: its next read or write fails, and the task polling it is
    /// woken to make it. Idempotent.
    pub fn close(&self) {
        self.0.closed.store(true, Ordering::Release);
        let wakers =
            std::mem::take(&mut *self.0.wakers.lock().unwrap_or_else(PoisonError::into_inner));
        wakers.into_iter().flatten().for_each(Waker::wake);
    }

    /// Whether [`Closer::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
    }

    /// For a connection's `poll_*` on `side`: the error to return once closed; else
    /// `Ok`, with `cx`'s task registered to be woken by [`Closer::close`].
    pub(crate) fn check(&self, side: Side, cx: &Context<'_>) -> std::io::Result<()> {
        if self.is_closed() {
            return Err(closed());
        }
        {
            let mut wakers = self.0.wakers.lock().unwrap_or_else(PoisonError::into_inner);
            let slot = &mut wakers[side as usize];
            if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *slot = Some(cx.waker().clone());
            }
        }
        // closed between the first look and the registration: its wake may have missed us
        if self.is_closed() {
            return Err(closed());
        }
        Ok(())
    }
}

fn closed() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "connection closed by the server",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn closing_wakes_the_polling_task_and_fails_its_next_poll() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let cx = Context::from_waker(&waker);
        let c = Closer::new();
        assert!(c.check(Side::Read, &cx).is_ok());
        assert!(c.check(Side::Write, &cx).is_ok());
        c.clone().close();
        assert_eq!(count.0.load(Ordering::SeqCst), 2, "both halves woken");
        let e = c.check(Side::Read, &cx).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionAborted);
        assert!(c.check(Side::Write, &cx).is_err());
        c.close();
        assert_eq!(count.0.load(Ordering::SeqCst), 2, "nothing left to wake");
    }
}
