//! Admission of `inplace.v1.NodeAgent` calls before their message is read: the caller's
//! role first, then the message's bytes, then the memory its planning will take.
//!
//! A 3.2 MB spec of 199 000 sysctls (in the limits: `policy.max_spec_elements` 200 000)
//! peaked the agent at 288 MiB, four at once at 862-936 MiB, over the unit's
//! `MemoryMax=768M`; and a caller who may not make a call had its message decoded before
//! the handler refused it. This layer sits in front of the generated service (a tower
//! layer on the gRPC servers, where the connection's peer identity is already known) and,
//! for each call:
//!
//! 1. checks the caller's role ([`super::role_in`]): `Apply`, `Reboot` and `Confirm` need the admin
//!    role, the others the reader role; a refused caller gets `PERMISSION_DENIED` and not
//!    a byte of its message is read;
//! 2. reads the gRPC frame header (5 bytes: compression flag, length) and reserves the
//!    message's length from [`RECEIVING_MIB`] before the rest is read (a message over
//!    the size limit is refused unread with `RESOURCE_EXHAUSTED`), so messages wait in the
//!    socket, not in memory; the message must arrive within [`MESSAGE_READ_TIMEOUT`];
//! 3. for the calls that carry a NodeSpec (`GetCoverage`, `Apply`, `Inspect`), counts
//!    its fields on the raw bytes ([`super::limits::count`], refusing over the limits
//!    with `INVALID_ARGUMENT`) and reserves what decoding, planning and answering it will
//!    take ([`planning_cost`]) from `policy.max_planning_mib`, waiting while the agent is
//!    full; a spec costlier than the whole budget takes all of it (it runs alone).
//!
//! Each reservation is first taken from the caller's share of that budget (half of it,
//! [`super::shares`]), so one caller's calls wait for each other, not in the budgets'
//! queues ahead of other callers.
//!
//! Both reservations of a call carrying a spec are held until its answer is sent, and a
//! connection whose answer is not read within [`super::answer::UNREAD_ANSWER_TIMEOUT`]
//! is closed, which frees the answer and them ([`super::answer`]); the message bytes of
//! another call are held until it is answered. Reservations are taken in that order and
//! a call waiting for planning memory never holds planning memory, so no call waits on
//! one that waits on it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes, BytesMut};
use http_body_util::BodyExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;

use super::shares::{Callers, Shares};
use inplace_edge::listener::Role;
use inplace_wire::limits::{self, Counts, WireLimits};

/// Agent memory one field of a NodeSpec takes from decoding to the answer, bytes:
/// measured 1.33 KiB per sysctl (a 199 000-sysctl spec peaked at 288 MiB over 23 MiB
/// idle: the decoded request, the spec model, the plan, the report of one change per
/// field and its 42 MB encoding), rounded up.
pub(crate) const PLANNING_BYTES_PER_FIELD: u64 = 1536;

/// Agent memory per byte of the message: the raw message, the decoded request, the spec
/// model and the plan each hold the file contents (measured: a spec of 1000 files of
/// 63 KiB, 62 MiB, peaked 317 MiB over idle).
pub(crate) const PLANNING_BYTES_PER_BYTE: u64 = 5;

/// Message bytes being received at once, MiB (one largest message, `policy.max_spec_bytes`
/// 64 MiB plus 1 MiB, fits).
pub(crate) const RECEIVING_MIB: u64 = 65;

/// Longest a caller may take to send its request message (the bytes it reserved are held
/// meanwhile).
pub(crate) const MESSAGE_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What planning a spec of `counts` in a message of `len` bytes reserves, bytes.
pub(crate) fn planning_cost(counts: Counts, len: usize) -> u64 {
    (counts.elements as u64)
        .saturating_mul(PLANNING_BYTES_PER_FIELD)
        .saturating_add((len as u64).saturating_mul(PLANNING_BYTES_PER_BYTE))
}

/// The role a method of `inplace.v1.NodeAgent` needs, and whether its request carries a
/// NodeSpec; `None` for other services (health, reflection).
fn method(path: &str) -> Option<(Role, bool)> {
    let m = path.strip_prefix("/inplace.v1.NodeAgent/")?;
    Some(match m {
        "Apply" => (Role::Admin, true),
        "Reboot" | "Confirm" => (Role::Admin, false),
        "GetCoverage" | "Inspect" => (Role::Reader, true),
        _ => (Role::Reader, false),
    })
}

/// The budgets and settings of one agent (shared by its servers).
#[derive(Debug)]
pub(crate) struct Gate {
    reader_gid: Option<u32>,
    max_message: usize,
    limits: WireLimits,
    receiving: Arc<Semaphore>,
    max_receiving_kib: u32,
    planning: Arc<Semaphore>,
    max_planning_kib: u32,
    callers: Callers,
}

/// What an admitted call holds until it is answered (a call carrying a spec: until its
/// answer is sent): its parts of the budgets and of its caller's shares.
#[derive(Debug)]
pub(crate) struct Held {
    _permits: Vec<OwnedSemaphorePermit>,
    /// Kept while its permits are: the caller's next calls find the same shares.
    _caller: Arc<Shares>,
}

#[cfg(test)]
impl Held {
    /// `permits`, held for a caller of their own (for tests of what keeps a [`Held`]).
    pub(crate) fn of(permits: Vec<OwnedSemaphorePermit>) -> Held {
        Held {
            _permits: permits,
            _caller: Callers::new(1, 1).of(&http::Extensions::new()),
        }
    }
}

fn kib(bytes: u64, max: u32) -> u32 {
    u32::try_from(bytes.div_ceil(1024).max(1))
        .unwrap_or(u32::MAX)
        .min(max)
}

impl Gate {
    /// A gate for messages up to `max_message` bytes, specs within `limits`, planning
    /// memory `planning_mib` (`policy.max_planning_mib`), readers of `reader_gid`.
    pub(crate) fn new(
        reader_gid: Option<u32>,
        max_message: usize,
        limits: WireLimits,
        planning_mib: u64,
    ) -> Gate {
        let max_receiving_kib = kib((RECEIVING_MIB << 20).max(max_message as u64), u32::MAX);
        let max_planning_kib = kib(planning_mib.max(1) << 20, u32::MAX);
        Gate {
            reader_gid,
            max_message,
            limits,
            receiving: Arc::new(Semaphore::new(max_receiving_kib as usize)),
            max_receiving_kib,
            planning: Arc::new(Semaphore::new(max_planning_kib as usize)),
            max_planning_kib,
            callers: Callers::new(max_receiving_kib, max_planning_kib),
        }
    }

    /// Checks, reads and reserves for one call (see the module doc): the request with
    /// its message read, and what it holds; or the status to answer.
    async fn admit(
        &self,
        req: http::Request<Body>,
        need: Role,
        spec: bool,
    ) -> Result<(http::Request<Body>, Held), Status> {
        if super::role_in(req.extensions(), self.reader_gid)? < need {
            return Err(Status::permission_denied(
                "this call changes the node and needs the admin role (root); readers may only read",
            ));
        }
        let caller = self.callers.of(req.extensions());
        let (parts, mut body) = req.into_parts();
        let mut buf = BytesMut::new();
        let mut held = Vec::with_capacity(4);
        let mut want = 5usize;
        let until = tokio::time::Instant::now() + MESSAGE_READ_TIMEOUT;
        while buf.len() < want {
            let Ok(frame) = tokio::time::timeout_at(until, body.frame()).await else {
                return Err(Status::deadline_exceeded(format!(
                    "the request message was not sent within {MESSAGE_READ_TIMEOUT:?}"
                )));
            };
            let Some(frame) = frame else {
                break;
            };
            let frame =
                frame.map_err(|e| Status::cancelled(format!("reading the request: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            if want == 5 && buf.len() >= 5 {
                let len = (&buf[1..5]).get_u32() as usize;
                if len > self.max_message {
                    return Err(Status::resource_exhausted(format!(
                        "message of {len} bytes, over the limit of {} (policy.max_spec_bytes + 1 MiB)",
                        self.max_message
                    )));
                }
                let k = kib(len as u64 + 5, self.max_receiving_kib);
                held.push(caller.receiving(k).await?);
                held.push(acquire(&self.receiving, k).await?);
                want = 5 + len;
            }
        }
        if spec && buf.len() >= 5 && buf[0] == 0 {
            let message = &buf[5..buf.len().min(want)];
            let counts = limits::count(message);
            limits::check(counts, self.limits)?;
            let cost = kib(planning_cost(counts, message.len()), self.max_planning_kib);
            held.push(caller.planning(cost).await?);
            held.push(acquire(&self.planning, cost).await?);
        }
        let body = Body::new(http_body_util::Full::new(Bytes::from(buf)));
        let held = Held {
            _permits: held,
            _caller: caller,
        };
        Ok((http::Request::from_parts(parts, body), held))
    }
}

async fn acquire(s: &Arc<Semaphore>, kib: u32) -> Result<OwnedSemaphorePermit, Status> {
    s.clone()
        .acquire_many_owned(kib)
        .await
        .map_err(|_| Status::unavailable("the agent is stopping"))
}

/// The tower layer of [`Admit`].
#[derive(Debug, Clone)]
pub(crate) struct AdmitLayer(pub Arc<Gate>);

impl<S> tower::Layer<S> for AdmitLayer {
    type Service = Admit<S>;
    fn layer(&self, inner: S) -> Admit<S> {
        Admit {
            inner,
            gate: self.0.clone(),
        }
    }
}

/// Admits each `inplace.v1.NodeAgent` call through a [`Gate`] before `S` reads it.
#[derive(Debug, Clone)]
pub(crate) struct Admit<S> {
    inner: S,
    gate: Arc<Gate>,
}

type Boxed<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S> tower::Service<http::Request<Body>> for Admit<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Boxed<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let Some((need, spec)) = method(req.uri().path()) else {
            return Box::pin(self.inner.call(req));
        };
        // the service that was made ready is the one called
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let gate = self.gate.clone();
        Box::pin(async move {
            match gate.admit(req, need, spec).await {
                // a spec's reservation is held until the answer is sent (the report's
                // encoding is made as the response body is polled), its connection
                // closed if that takes too long (super::answer); another call's until
                // it is answered (a WatchOperation stream holds nothing)
                Ok((req, held)) if spec => {
                    let closer = inplace_edge::calls::closer_in(req.extensions());
                    let what = super::answer::describe(&req);
                    let answer = inner.call(req).await?;
                    Ok(answer.map(|b| super::answer::watched(b, held, closer, what)))
                }
                Ok((req, held)) => {
                    let r = inner.call(req).await;
                    drop(held);
                    r
                }
                Err(s) => Ok(s.into_http()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_and_their_roles() {
        assert_eq!(
            method("/inplace.v1.NodeAgent/Apply"),
            Some((Role::Admin, true))
        );
        assert_eq!(
            method("/inplace.v1.NodeAgent/Reboot"),
            Some((Role::Admin, false))
        );
        assert_eq!(
            method("/inplace.v1.NodeAgent/Confirm"),
            Some((Role::Admin, false))
        );
        assert_eq!(
            method("/inplace.v1.NodeAgent/GetCoverage"),
            Some((Role::Reader, true))
        );
        assert_eq!(
            method("/inplace.v1.NodeAgent/GetStatus"),
            Some((Role::Reader, false))
        );
        assert_eq!(method("/grpc.health.v1.Health/Check"), None);
    }

    #[test]
    fn the_largest_spec_costs_less_than_the_default_budget_allows_twice() {
        let c = Counts {
            files: 0,
            elements: 199_000,
            ..Counts::default()
        };
        let cost = planning_cost(c, 3_200_000);
        assert!(cost > 280 << 20 && cost < 384 << 20, "{}", cost >> 20);
    }
}
