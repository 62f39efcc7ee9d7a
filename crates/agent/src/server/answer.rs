//! The answers of calls that hold their reservations until they are sent (those carrying
//! a NodeSpec, [`super::admit`]): handed to hyper in copied pieces, and their connection
//! closed when one is not read within [`UNREAD_ANSWER_TIMEOUT`].
//!
//! A GetCoverage of a spec at the limits (1000 files of 60 kB and 100 000 sysctls) holds
//! the whole planning budget and most of the receive budget until its answer is sent. A
//! reader that sent it on an HTTP/2 connection whose window stays 0 and never read held
//! them until the connection's age limit (30 min + 5 min grace): every other GetCoverage
//! ran into its deadline and every Apply waited. Releasing the reservations without the
//! answer would leave memory unaccounted: hyper polls the body before it waits for
//! window (hyper 1.x `proto::h2::PipeToSendStream` keeps the polled chunk while it waits
//! in `poll_capacity`), so the encoded answer (up to about 42 MB) stays in memory for as
//! long as the stream lives, and neither the body nor the service can end a stream hyper
//! is not polling. So the answer and its reservations go together, with the connection:
//!
//! - When the service hands the answer's head to hyper (its planning done, the answer
//!   about to be encoded and sent), a reaper task starts; when the body is dropped (hyper
//!   has handed its last piece and its trailers to h2, or the stream ended), it stands
//!   down. At [`UNREAD_ANSWER_TIMEOUT`] it closes the call's connection
//!   ([`inplace_edge::closer`]): the stream's task ends and drops the body, its pieces
//!   and the reservations; h2 clears what it had queued. The connection's other calls
//!   (a `WatchOperation` stream too) end with it; clients connect again. A stream alone
//!   can not be reset from here: hyper resets one only on an error from a body it polls.
//! - The body is handed on in copies of at most [`PIECE`] bytes: hyper takes the next
//!   piece only while the stream has capacity (h2 `Stream::capacity`: the window, at most
//!   hyper's server send buffer of 400 KiB, less what is buffered), so the body ends, and
//!   the reservations go, only once all but one piece and that buffer are with h2, and
//!   what h2 still holds are copies (a slice would keep the whole encoded answer alive
//!   until its last byte is sent, unaccounted). Handed on whole, the answer went to h2 as
//!   soon as the window opened by one byte, and its reservations with it.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf as _, Bytes};
use hyper::body::{Frame, SizeHint};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;

use inplace_edge::closer::Closer;

/// Longest an answer that holds reservations may take to be read, from its head being
/// handed to hyper to its last piece being handed to h2; then its connection is closed.
///
/// 30 s, the time a caller has to send its request ([`super::admit::MESSAGE_READ_TIMEOUT`]),
/// chosen for what an honest slow reader needs: the largest answer (199 000 changes) is
/// about 42 MB, which at 30 s takes 1.4 MB/s (11 Mbit/s), less than the 65 MiB a caller
/// must be able to send in the same time; a few-KB answer (an ordinary spec) takes one
/// round trip. Callers read as fast as their link and their HTTP/2 window allow (tonic's
/// client, with hyper's defaults, announces 2 MiB a stream; grpc-go and grpc-core grow
/// theirs by BDP probing); the CAPI extension gives up on a call after
/// `agent.timeout_seconds` (5 s by default) and CAPI on a hook after at most 30 s (its
/// `timeoutSeconds` limit), so an answer unread after 30 s has nobody waiting for it.
/// The time counts the whole answer, not pauses: a reader that trickles a byte now and
/// then is closed too. A caller that keeps its window closed holds the budgets at most
/// this long per call, where it held them up to 35 min. A constant, as the other I/O
/// deadlines of the API ([`super::admit::MESSAGE_READ_TIMEOUT`],
/// `inplace_edge::tls::HANDSHAKE_TIMEOUT`): its config (`[api]`, `[policy]`) sets counts
/// and sizes, no deadlines.
pub(crate) const UNREAD_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest piece of an answer handed to hyper at once, bytes: one HTTP/2 DATA frame at
/// the default `SETTINGS_MAX_FRAME_SIZE` (16 KiB, RFC 9113 §6.5.2).
pub(crate) const PIECE: usize = 16 << 10;

/// `body`, the answer to the call `what` on the connection `closer` closes, holding
/// `held` until it is sent (handed on in pieces); its connection closed when that takes
/// longer than [`UNREAD_ANSWER_TIMEOUT`]. Without a closer (a transport without one),
/// nothing is closed.
pub(crate) fn watched(
    body: Body,
    held: super::admit::Held,
    closer: Option<Closer>,
    what: String,
) -> Body {
    let sending = closer.map(|c| reaper(c, what));
    Body::new(Answer {
        inner: body,
        rest: Bytes::new(),
        _held: held,
        _sending: sending,
    })
}

/// Starts the reaper of one answer: closes `closer`'s connection at
/// [`UNREAD_ANSWER_TIMEOUT`] unless the returned sender is dropped first.
fn reaper(closer: Closer, what: String) -> tokio::sync::oneshot::Sender<()> {
    let (sending, sent) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        // the sender dropped (the answer sent or given up) ends the wait with an error
        if tokio::time::timeout(UNREAD_ANSWER_TIMEOUT, sent)
            .await
            .is_err()
        {
            tracing::warn!(
                call = %what,
                "closing the connection: the answer was not read within {UNREAD_ANSWER_TIMEOUT:?} (its reservations are freed with it)"
            );
            closer.close();
        }
    });
    sending
}

/// The body of [`watched`].
struct Answer {
    inner: Body,
    /// What is left of the data frame `inner` gave last.
    rest: Bytes,
    _held: super::admit::Held,
    /// Dropped with the answer: its reaper stands down.
    _sending: Option<tokio::sync::oneshot::Sender<()>>,
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if this.rest.is_empty() {
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.rest = data,
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                end => return Poll::Ready(end),
            }
        }
        let n = this.rest.len().min(PIECE);
        let piece = Bytes::copy_from_slice(&this.rest[..n]);
        this.rest.advance(n);
        if this.rest.is_empty() {
            // the frame's allocation goes now, not with the next frame
            this.rest = Bytes::new();
        }
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(rest));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

/// What a call is, for the reaper's log line: its method and caller.
pub(crate) fn describe(req: &http::Request<Body>) -> String {
    let method = req.uri().path();
    let ext = req.extensions();
    if let Some(p) = ext.get::<inplace_edge::tls::TlsPeer>() {
        let remote = p.remote.map(|a| a.to_string()).unwrap_or_default();
        return format!("{method} from {remote} {:?}", p.identities);
    }
    if let Some(cred) = ext
        .get::<inplace_edge::accept::LocalPeer>()
        .and_then(|p| p.uds.peer_cred)
    {
        return format!("{method} from uid {} on the local socket", cred.uid());
    }
    method.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::admit::Held;
    use http_body_util::BodyExt as _;

    /// An answer comes out in copied pieces of at most [`PIECE`] bytes, the same bytes,
    /// then the trailers; the reservations go when the body does.
    #[tokio::test]
    async fn an_answer_is_handed_on_in_pieces_and_releases_with_its_body() {
        let message = Bytes::from((0..40_000u32).map(|i| i as u8).collect::<Vec<u8>>());
        let stream = tokio_stream::iter([
            Ok::<_, Status>(Frame::data(message.clone())),
            Ok(Frame::trailers(http::HeaderMap::new())),
        ]);
        let inner = Body::new(http_body_util::StreamBody::new(stream));
        let budget = std::sync::Arc::new(tokio::sync::Semaphore::new(1));
        let held = Held::of(vec![budget.clone().try_acquire_owned().unwrap()]);
        let mut body = watched(inner, held, None, "test".into());
        let mut pieces = Vec::new();
        let mut trailers = false;
        while let Some(frame) = body.frame().await {
            match frame.unwrap().into_data() {
                Ok(d) => pieces.push(d),
                Err(_) => trailers = true,
            }
        }
        assert!(trailers);
        assert_eq!(
            pieces.iter().map(Bytes::len).collect::<Vec<_>>(),
            [PIECE, PIECE, 40_000 - 2 * PIECE]
        );
        assert_eq!(pieces.concat(), message);
        assert_eq!(budget.available_permits(), 0, "held while the body lives");
        drop(body);
        assert_eq!(budget.available_permits(), 1);
    }
}
