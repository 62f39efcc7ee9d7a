//! Accepting TCP connections under pressure, for both servers (the agent's mTLS API and
//! the extension's HTTPS endpoint).
//!
//! - **A cap on descriptors.** A permit of a [`Gate`] is taken *before* `accept(2)` and
//!   travels with the connection until it closes, so the connections of one listener
//!   never take more descriptors than the cap. For TLS listeners the cap is
//!   `handshake_budget + 2 × max_connections` and is not what keeps anyone out: pending
//!   handshakes are bounded by the handshake budget, which drops old ones for new ones
//!   ([`super::handshakes`]), and places are taken only after authentication
//!   ([`super::places`]). Plain listeners (metrics on loopback, `insecure_loopback`)
//!   use it as their connection cap, later connections waiting in the listen backlog.
//!   The cap is far below the descriptor limit, which keeps a reserve for the agent's own
//!   work and its local socket (root's `inplacectl` keeps working while the TCP port is
//!   flooded).
//! - **Back-off on accept errors.** `EMFILE`, `ENFILE`, `ENOBUFS` and `ENOMEM` leave the
//!   pending connection in the backlog, so retrying at once spins a core. The loop waits
//!   5 ms, doubling up to 1 s, and resets after a success; the error is logged once, then
//!   at most once every 10 s with the number of errors in between.
//! - [`raise_nofile_limit`] lifts the soft `RLIMIT_NOFILE` to the hard limit at start-up
//!   (systemd's default soft limit is 1024; the unit sets `LimitNOFILE=`).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::closer::{Closer, Side};

/// The descriptor cap of one listener (its connection cap for plain listeners).
#[derive(Debug, Clone)]
pub struct Gate {
    permits: Arc<Semaphore>,
}

impl Gate {
    /// A cap of `max` open connections (at least 1).
    pub fn new(max: usize) -> Gate {
        Gate {
            permits: Arc::new(Semaphore::new(max.max(1))),
        }
    }
}

/// A connection and its permit (dropping the permit frees a place under the cap).
#[derive(Debug)]
pub struct Accepted {
    /// The socket.
    pub stream: TcpStream,
    /// The peer's address.
    pub remote: SocketAddr,
    /// The place under the cap this connection holds.
    pub permit: OwnedSemaphorePermit,
}

/// Accept errors seen since the last log line.
#[derive(Debug)]
pub struct Backoff {
    delay: Duration,
    suppressed: u64,
    logged: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            delay: FIRST_DELAY,
            suppressed: 0,
            logged: None,
        }
    }
}

const FIRST_DELAY: Duration = Duration::from_millis(5);
const MAX_DELAY: Duration = Duration::from_secs(1);
const LOG_EVERY: Duration = Duration::from_secs(10);

impl Backoff {
    /// Records an accept error `e` of listener `what`; returns how long to wait.
    fn failed(&mut self, what: &str, e: &std::io::Error) -> Duration {
        let now = Instant::now();
        if self
            .logged
            .is_none_or(|t| now.duration_since(t) >= LOG_EVERY)
        {
            tracing::warn!(listener = what, error = %e, suppressed = self.suppressed, "accepting a connection failed; backing off");
            self.logged = Some(now);
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
        let d = self.delay;
        self.delay = (self.delay * 2).min(MAX_DELAY);
        d
    }

    fn succeeded(&mut self) {
        self.delay = FIRST_DELAY;
    }
}

/// The next connection of `listener` within the cap of `gate`: waits for a free place,
/// then accepts, backing off on errors. `what` names the listener in logs.
pub async fn accept(
    listener: &TcpListener,
    gate: &Gate,
    backoff: &mut Backoff,
    what: &str,
) -> Accepted {
    let permit = match gate.permits.clone().acquire_owned().await {
        Ok(p) => p,
        // The semaphore is never closed; wait forever rather than spin if it were.
        Err(_) => std::future::pending().await,
    };
    loop {
        match listener.accept().await {
            Ok((stream, remote)) => {
                backoff.succeeded();
                // Request-answer traffic: without TCP_NODELAY an answer written in two
                // pieces (HTTP/2 HEADERS and DATA, each its own TLS record) waits for
                // the peer's delayed ACK, about 40 ms per call (measured: 88 ms for one
                // Inspect round trip on loopback).
                let _ = stream.set_nodelay(true);
                return Accepted {
                    stream,
                    remote,
                    permit,
                };
            }
            Err(e) => tokio::time::sleep(backoff.failed(what, &e)).await,
        }
    }
}

/// How long a client of the local socket has, from its connection, to send its first
/// bytes (the HTTP/2 preface, which a gRPC client writes at once), as TCP clients have
/// [`crate::tls::HELLO_TIMEOUT`] for their ClientHello: connections that never sent a
/// byte were held until the client went away, and 24 000 of them used up the agent's
/// descriptors, after which `inplacectl status` hung.
pub const UNIX_FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection of the local socket: the stream, failing its reads and writes once its
/// [`Closer`] closes it ([`crate::closer`]).
#[derive(Debug)]
pub struct LocalConn {
    stream: tokio::net::UnixStream,
    closer: Closer,
}

/// Who is on the other end of a [`LocalConn`] (its connection info, in every request's
/// extensions).
#[derive(Debug, Clone)]
pub struct LocalPeer {
    /// The peer's address and credentials (`SO_PEERCRED`), as tonic gives them for a
    /// plain `UnixStream`.
    pub uds: tonic::transport::server::UdsConnectInfo,
    /// Closes this connection.
    pub closer: Closer,
}

impl tonic::transport::server::Connected for LocalConn {
    type ConnectInfo = LocalPeer;
    fn connect_info(&self) -> LocalPeer {
        LocalPeer {
            uds: self.stream.connect_info(),
            closer: self.closer.clone(),
        }
    }
}

impl tokio::io::AsyncRead for LocalConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.closer.check(Side::Read, cx)?;
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for LocalConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.closer.check(Side::Write, cx)?;
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.closer.check(Side::Write, cx)?;
        Pin::new(&mut this.stream).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.closer.check(Side::Write, cx)?;
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }
}

/// The connections of the local Unix socket as a stream for tonic, accepted with the
/// same back-off as TCP: a client waiting in the socket's backlog while the descriptor
/// table is full makes `accept(2)` fail with `EMFILE` at once, and a stream that yields
/// the error (as `UnixListenerStream` does, which tonic logs and polls again) spins a core
/// for as long as the table stays full (measured: 3.0 s of CPU in 3 s). A connection is
/// handed on once it has bytes to read; one with none after
/// [`UNIX_FIRST_BYTES_TIMEOUT`] is closed.
pub fn unix_incoming(
    listener: tokio::net::UnixListener,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<LocalConn>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let mut backoff = Backoff::default();
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => {
                    backoff.succeeded();
                    stream
                }
                Err(e) => {
                    tokio::time::sleep(backoff.failed("socket", &e)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(UNIX_FIRST_BYTES_TIMEOUT, first_bytes(&stream)).await {
                    Ok(Ok(())) => {
                        let conn = LocalConn {
                            stream,
                            closer: Closer::new(),
                        };
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "local connection failed before its first bytes")
                    }
                    Err(_) => tracing::debug!(
                        "local connection closed: no bytes within {UNIX_FIRST_BYTES_TIMEOUT:?}"
                    ),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Waits until `stream` has bytes to read or its peer closed it, without reading them
/// (`MSG_PEEK`): tokio's readiness may report a new socket readable before any byte came.
async fn first_bytes(stream: &tokio::net::UnixStream) -> std::io::Result<()> {
    use std::os::fd::AsFd as _;
    loop {
        stream.readable().await?;
        let peeked = stream.try_io(tokio::io::Interest::READABLE, || {
            let mut b = [0u8; 1];
            rustix::net::recv(
                stream.as_fd(),
                &mut b,
                rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
            )
            .map_err(std::io::Error::from)
        });
        match peeked {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns (soft, hard) afterwards.
/// Errors leave the limit as it was (it is logged by the caller).
pub fn raise_nofile_limit() -> std::io::Result<(u64, u64)> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let l = getrlimit(Resource::Nofile);
    let hard = l.maximum;
    if l.current != hard {
        setrlimit(
            Resource::Nofile,
            rustix::process::Rlimit {
                current: hard,
                maximum: hard,
            },
        )?;
    }
    let l = getrlimit(Resource::Nofile);
    Ok((l.current.unwrap_or(u64::MAX), l.maximum.unwrap_or(u64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_ceiling_and_resets() {
        let mut b = Backoff::default();
        let e = std::io::Error::from_raw_os_error(24);
        let waits: Vec<Duration> = (0..10).map(|_| b.failed("t", &e)).collect();
        assert_eq!(waits[0], Duration::from_millis(5));
        assert_eq!(waits[1], Duration::from_millis(10));
        assert_eq!(*waits.last().unwrap(), MAX_DELAY);
        // one log line, nine suppressed
        assert_eq!(b.suppressed, 9);
        b.succeeded();
        assert_eq!(b.failed("t", &e), FIRST_DELAY);
    }

    #[tokio::test]
    async fn the_cap_holds_connections_in_the_backlog() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let gate = Gate::new(1);
        let mut b = Backoff::default();
        let _c1 = TcpStream::connect(addr).await.unwrap();
        let _c2 = TcpStream::connect(addr).await.unwrap();
        let first = accept(&l, &gate, &mut b, "t").await;
        let second =
            tokio::time::timeout(Duration::from_millis(200), accept(&l, &gate, &mut b, "t")).await;
        assert!(
            second.is_err(),
            "a second connection was accepted over the cap of 1"
        );
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), accept(&l, &gate, &mut b, "t"))
            .await
            .expect("the place freed by the first connection serves the second");
    }
}
