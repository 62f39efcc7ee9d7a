//! The gRPC service (`inplace.v1.NodeAgent`) over the agent, served on a Unix socket with
//! `grpc.health.v1` and server reflection (v1).
//!
//! Agent errors map to status codes as DESIGN §4 says: a bad spec is `INVALID_ARGUMENT`, an
//! apply that is not fully covered `FAILED_PRECONDITION`, a concurrent operation `ABORTED`,
//! an id reused with another spec `ALREADY_EXISTS`, an unknown operation `NOT_FOUND`.

pub(crate) mod admit;
pub(crate) mod answer;
pub(crate) mod metrics;
pub(crate) mod shares;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::apply::{Agent, AgentError, Lookup};
use inplace_edge::listener::Role;
use inplace_edge::{accept, calls, handshakes, refusals, tls};
use inplace_wire::limits;
use inplace_wire::pb;
use inplace_wire::pb::node_agent_server::{NodeAgent, NodeAgentServer};
use inplace_wire::phase::is_settled;

/// Longest status message the agent sends, bytes: gRPC carries it in the `grpc-message`
/// header, percent-encoded (up to three bytes per byte), and clients refuse a header
/// block over 16 KiB (grpc-core's hard limit; hyper's h2 client resets the stream), which
/// turned a refusal naming hundreds of uncovered items into an unreadable protocol error
/// instead of `FAILED_PRECONDITION`.
pub(crate) const MAX_STATUS_MESSAGE: usize = 4096;

/// `msg` cut to [`MAX_STATUS_MESSAGE`] bytes at a character boundary, saying where the
/// whole of it is.
fn bounded_message(msg: String) -> String {
    if msg.len() <= MAX_STATUS_MESSAGE {
        return msg;
    }
    let note = format!(
        " … (cut at {MAX_STATUS_MESSAGE} of {} bytes; `inplacectl coverage` of the same spec, or the operation's status, gives every reason)",
        msg.len()
    );
    let mut end = MAX_STATUS_MESSAGE - note.len();
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{note}", &msg[..end])
}

impl From<AgentError> for Status {
    fn from(e: AgentError) -> Status {
        let msg = bounded_message(e.to_string());
        match e {
            AgentError::InvalidSpec(_) | AgentError::InvalidRequest(_) => {
                Status::invalid_argument(msg)
            }
            AgentError::NotCovered(_) | AgentError::Precondition(_) => {
                Status::failed_precondition(msg)
            }
            AgentError::Busy(_) | AgentError::Aborted(_) => Status::aborted(msg),
            AgentError::PermissionDenied(_) => Status::permission_denied(msg),
            AgentError::AlreadyExists { .. } => Status::already_exists(msg),
            AgentError::NotFound(_) => Status::not_found(msg),
            AgentError::Internal(_) => Status::internal(msg),
            AgentError::Unavailable(_) => Status::unavailable(msg),
        }
    }
}

/// The host group of `api.socket_group` (name or gid), if configured and existing.
pub(crate) fn resolve_group(spec: &str) -> anyhow::Result<Option<u32>> {
    if spec.is_empty() {
        return Ok(None);
    }
    if let Ok(gid) = spec.parse::<u32>() {
        return Ok(Some(gid));
    }
    match nix::unistd::Group::from_name(spec)? {
        Some(g) => Ok(Some(g.gid.as_raw())),
        None => anyhow::bail!("api.socket_group: group {spec:?} does not exist on this host"),
    }
}

/// The tonic service.
#[derive(Debug, Clone)]
pub(crate) struct Service {
    agent: Arc<Agent>,
    reader_gid: Option<u32>,
    /// Coverage calls that may plan at once (`policy.max_concurrent_coverage`).
    planning: PlanningSlots,
    metrics: Arc<crate::metrics::NodeMetrics>,
}

impl Service {
    /// Wraps an agent; members of `reader_gid` are readers on the Unix socket; coverage
    /// latency goes to `metrics`.
    pub(crate) fn new(
        agent: Arc<Agent>,
        reader_gid: Option<u32>,
        metrics: Arc<crate::metrics::NodeMetrics>,
    ) -> Self {
        let slots = agent.config().policy.max_concurrent_coverage.max(1);
        Service {
            agent,
            reader_gid,
            planning: PlanningSlots::new(slots),
            metrics,
        }
    }

    /// Waits for a planning slot (released when the returned permit drops).
    async fn planning_slot(&self, role: Role) -> Result<PlanningSlot, Status> {
        self.planning.acquire(role).await
    }

    /// The caller's role from the Unix socket's peer credentials (`SO_PEERCRED`): uid 0
    /// (or the agent's own uid) is admin; a member of `api.socket_group` (primary or
    /// supplementary, per the host's group database) is a reader; anyone else is refused.
    pub(crate) fn role_of<T>(&self, req: &Request<T>) -> Result<Role, Status> {
        role_in(req.extensions(), self.reader_gid)
    }

    /// Refuses `show_content` (DESIGN §6, §7: secret content is never echoed back) unless
    /// the caller is an admin on the local Unix socket; a remote caller, admin or not,
    /// gets `PERMISSION_DENIED` naming the rule.
    fn authorize_content<T>(
        &self,
        req: &Request<T>,
        diff: Option<&pb::DiffOptions>,
    ) -> Result<(), Status> {
        if !diff.is_some_and(|d| d.show_content) {
            return Ok(());
        }
        if req.extensions().get::<tls::TlsPeer>().is_some() {
            return Err(Status::permission_denied(
                "show_content is refused on the remote API: the content of files items and drop-ins may be secret and is shown only to root on the node's local socket; ask without show_content to see their SHA-256 and size",
            ));
        }
        if self.role_of(req)? < Role::Admin {
            return Err(Status::permission_denied(
                "show_content needs the admin role on the local socket (root): the content of files items and drop-ins may be secret; ask without show_content to see their SHA-256 and size",
            ));
        }
        Ok(())
    }

    /// Checks the caller's role against `need`, and returns how its errors are shown
    /// ([`Shown`]).
    fn authorize<T>(&self, req: &Request<T>, need: Role) -> Result<Shown, Status> {
        let role = self.role_of(req)?;
        if role < need {
            return Err(Status::permission_denied(
                "this call changes the node and needs the admin role (root); readers may only read",
            ));
        }
        Ok(Shown {
            role,
            node_root: is_node_root(req),
            state_dir: self.agent.state_path().display().to_string(),
        })
    }
}

/// The planning slots of `policy.max_concurrent_coverage`, with one kept from readers:
/// a reader's call takes a reader place (one fewer than the slots, at least one) and then
/// a slot, an admin's call a slot alone, so readers together never hold every slot and an
/// admin's `Apply` or coverage waits only for other admins and one reader's plan at most
/// (issue 23 §6: a reader never takes an admin's place).
#[derive(Debug, Clone)]
struct PlanningSlots {
    all: Arc<tokio::sync::Semaphore>,
    readers: Arc<tokio::sync::Semaphore>,
}

/// A held planning slot (and reader place); released when dropped.
#[derive(Debug)]
struct PlanningSlot {
    _slot: tokio::sync::OwnedSemaphorePermit,
    _reader: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl PlanningSlots {
    fn new(slots: usize) -> PlanningSlots {
        let slots = slots.max(1);
        PlanningSlots {
            all: Arc::new(tokio::sync::Semaphore::new(slots)),
            readers: Arc::new(tokio::sync::Semaphore::new((slots - 1).max(1))),
        }
    }

    async fn acquire(&self, role: Role) -> Result<PlanningSlot, Status> {
        let stopping = |_| Status::unavailable("the agent is stopping");
        let reader = match role {
            Role::Reader => Some(
                self.readers
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(stopping)?,
            ),
            Role::Admin => None,
        };
        Ok(PlanningSlot {
            _slot: self.all.clone().acquire_owned().await.map_err(stopping)?,
            _reader: reader,
        })
    }
}

/// The caller's role from a request's extensions (the connection's [`tls::TlsPeer`] or
/// Unix peer credentials); see [`Service::role_of`]. Also used before a request's body is
/// read ([`admit`]).
pub(crate) fn role_in(
    ext: &tonic::codegen::http::Extensions,
    reader_gid: Option<u32>,
) -> Result<Role, Status> {
    if let Some(peer) = ext.get::<tls::TlsPeer>() {
        return peer.role.ok_or_else(|| {
            Status::permission_denied(format!(
                "client certificate identities {:?} are not on the allowlist (api.tcp.clients)",
                peer.identities
            ))
        });
    }
    let Some(info) = ext.get::<accept::LocalPeer>().map(|p| &p.uds) else {
        return Err(Status::permission_denied(
            "unknown transport: no peer identity",
        ));
    };
    let Some(cred) = info.peer_cred else {
        return Err(Status::permission_denied(
            "the socket gave no peer credentials",
        ));
    };
    let uid = cred.uid();
    if uid == 0 || uid == rustix::process::geteuid().as_raw() {
        return Ok(Role::Admin);
    }
    if let Some(g) = reader_gid {
        if cred.gid() == g {
            return Ok(Role::Reader);
        }
        let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.name);
        let members = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(g))
            .ok()
            .flatten()
            .map(|g| g.mem)
            .unwrap_or_default();
        if name.is_some_and(|n| members.contains(&n)) {
            return Ok(Role::Reader);
        }
    }
    Err(Status::permission_denied(format!(
        "uid {uid} may not use this API: it is for root and members of api.socket_group"
    )))
}

/// True for a caller on the Unix socket who is root on the node (or the agent's own
/// user): the only callers whose error messages may name the agent's own paths.
fn is_node_root<T>(req: &Request<T>) -> bool {
    if req.extensions().get::<tls::TlsPeer>().is_some() {
        return false;
    }
    req.extensions()
        .get::<accept::LocalPeer>()
        .and_then(|p| p.uds.peer_cred)
        .is_some_and(|c| c.uid() == 0 || c.uid() == rustix::process::geteuid().as_raw())
}

/// How errors are shown to one caller: as they are to root on the node; to anyone else
/// (a reader on the socket, a remote mTLS client) with the state directory's path
/// replaced by `<state directory>`, the full message going to the agent's log.
#[derive(Debug, Clone)]
struct Shown {
    /// The caller's role.
    role: Role,
    node_root: bool,
    state_dir: String,
}

impl Shown {
    fn status(&self, s: Status) -> Status {
        if self.node_root || self.state_dir.is_empty() || !s.message().contains(&self.state_dir) {
            return s;
        }
        tracing::warn!(error = %s.message(), "error answered without the state directory's path");
        Status::new(
            s.code(),
            s.message().replace(&self.state_dir, "<state directory>"),
        )
    }

    fn result<T>(&self, r: Result<T, Status>) -> Result<T, Status> {
        r.map_err(|s| self.status(s))
    }

    /// `t` with the state directory's path replaced, for a caller who is not root on
    /// the node (answers carry the problems and operation messages the agent also logs).
    fn text(&self, t: &mut String) {
        if !self.node_root && !self.state_dir.is_empty() && t.contains(&self.state_dir) {
            *t = t.replace(&self.state_dir, "<state directory>");
        }
    }

    /// An operation as this caller sees it (its message and actions).
    fn operation(&self, mut op: pb::Operation) -> pb::Operation {
        self.text(&mut op.message);
        op.actions.iter_mut().for_each(|a| self.text(a));
        op
    }

    /// A node status as this caller sees it (problems, the current operation).
    fn node_status(&self, mut st: pb::NodeStatus) -> pb::NodeStatus {
        st.problems.iter_mut().for_each(|p| self.text(p));
        st.current_operation = st.current_operation.map(|o| self.operation(o));
        st
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(|| {
        let r = f();
        crate::allocator::release_thread_cache();
        r
    })
    .await
    .map_err(|e| Status::internal(format!("worker: {e}")))?
    .map_err(Status::from)
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::OperationEvent, Status>> + Send>>;

#[tonic::async_trait]
impl NodeAgent for Service {
    async fn get_coverage(
        &self,
        req: Request<pb::GetCoverageRequest>,
    ) -> Result<Response<pb::CoverageReport>, Status> {
        let shown = self.authorize(&req, Role::Reader)?;
        self.authorize_content(&req, req.get_ref().diff.as_ref())?;
        let a = self.agent.clone();
        let r = req.into_inner();
        let desired = r.desired.unwrap_or_default();
        let policy =
            pb::RebootPolicy::try_from(r.reboot_policy).unwrap_or(pb::RebootPolicy::Unspecified);
        let _slot = self.planning_slot(shown.role).await?;
        let t = std::time::Instant::now();
        // a kept answer here, without the hand-over to a blocking thread (two thread
        // switches cost as much as the answer's looks); a computation there
        let r = match a.kept_coverage(&desired, policy, r.diff.as_ref()) {
            Lookup::Kept(report) => Ok((*report, true)),
            Lookup::Compute(key) => {
                blocking(move || {
                    a.coverage_computed_keeping(key, &desired, policy, r.diff.as_ref())
                        .map(|c| (c, false))
                })
                .await
            }
        };
        self.metrics
            .observe_coverage(t.elapsed().as_secs_f64(), r.as_ref().ok().map(|c| c.1));
        let r = r.map(|(report, _)| report);
        shown.result(r).map(Response::new)
    }

    async fn apply(
        &self,
        req: Request<pb::ApplyRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        let shown = self.authorize(&req, Role::Admin)?;
        self.authorize_content(&req, req.get_ref().diff.as_ref())?;
        let a = self.agent.clone();
        let r = req.into_inner();
        let _slot = self.planning_slot(shown.role).await?;
        // planned on the operation thread that runs it (one thread woken, not two)
        let (tx, rx) = tokio::sync::oneshot::channel();
        let answer = match a.apply_from_caller_then(r, move |op| drop(tx.send(op))) {
            Err(e) => Err(Status::from(e)),
            Ok(()) => match rx.await {
                Ok(op) => op.map_err(Status::from),
                Err(_) => Err(Status::internal(
                    "the operation thread ended before answering",
                )),
            },
        };
        shown
            .result(answer)
            .map(|op| Response::new(shown.operation(op)))
    }

    async fn get_operation(
        &self,
        req: Request<pb::GetOperationRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        let shown = self.authorize(&req, Role::Reader)?;
        let a = self.agent.clone();
        let id = req.into_inner().id;
        shown
            .result(blocking(move || a.get_operation(&id)).await)
            .map(|op| Response::new(shown.operation(op)))
    }

    type WatchOperationStream = EventStream;

    async fn watch_operation(
        &self,
        req: Request<pb::WatchOperationRequest>,
    ) -> Result<Response<Self::WatchOperationStream>, Status> {
        let shown = self.authorize(&req, Role::Reader)?;
        let id = req.into_inner().id;
        let (events, rx) = shown.result(self.agent.watch(&id).map_err(Status::from))?;
        let (tx, out) = tokio::sync::mpsc::channel(16);
        let agent = self.agent.clone();
        tokio::spawn(async move {
            let mut last_phase = 0;
            for op in events {
                last_phase = op.phase;
                if tx
                    .send(Ok(pb::OperationEvent {
                        operation: Some(shown.operation(op)),
                    }))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            let Some(mut rx) = rx else { return };
            while !is_settled(last_phase) {
                let op = match rx.recv().await {
                    Ok(op) => op,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        match agent.get_operation(&id) {
                            Ok(op) => op,
                            Err(_) => break,
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                };
                last_phase = op.phase;
                if tx
                    .send(Ok(pb::OperationEvent {
                        operation: Some(shown.operation(op)),
                    }))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }

    async fn list_operations(
        &self,
        req: Request<pb::ListOperationsRequest>,
    ) -> Result<Response<pb::ListOperationsResponse>, Status> {
        let shown = self.authorize(&req, Role::Reader)?;
        let a = self.agent.clone();
        shown
            .result(blocking(move || a.list_operations()).await)
            .map(|ops| {
                let operations = ops.into_iter().map(|o| shown.operation(o)).collect();
                Response::new(pb::ListOperationsResponse { operations })
            })
    }

    async fn reboot(
        &self,
        req: Request<pb::RebootRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        let shown = self.authorize(&req, Role::Admin)?;
        let a = self.agent.clone();
        let id = req.into_inner().operation_id;
        shown
            .result(blocking(move || a.reboot(&id)).await)
            .map(|op| Response::new(shown.operation(op)))
    }

    /// Confirms a timed try; the same authorization as `Apply` (admin).
    async fn confirm(
        &self,
        req: Request<pb::ConfirmRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        let shown = self.authorize(&req, Role::Admin)?;
        let a = self.agent.clone();
        let id = req.into_inner().operation_id;
        shown
            .result(blocking(move || a.confirm(&id)).await)
            .map(|op| Response::new(shown.operation(op)))
    }

    async fn get_status(
        &self,
        req: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::NodeStatus>, Status> {
        let shown = self.authorize(&req, Role::Reader)?;
        let a = self.agent.clone();
        shown
            .result(blocking(move || a.status()).await)
            .map(|st| Response::new(shown.node_status(st)))
    }

    async fn inspect(
        &self,
        req: Request<pb::InspectRequest>,
    ) -> Result<Response<pb::InspectResponse>, Status> {
        let shown = self.authorize(&req, Role::Reader)?;
        let r = req.into_inner();
        let a = self.agent.clone();
        let (want_ops, want_status) = (r.operations, r.status);
        // History first, then the status, as a caller of ListOperations then GetStatus.
        let listed = blocking(move || {
            let ops = if want_ops {
                a.list_operations()?
            } else {
                vec![]
            };
            let st = if want_status { Some(a.status()?) } else { None };
            Ok((ops, st))
        })
        .await;
        let (operations, status) = shown.result(listed)?;
        let operations = operations.into_iter().map(|o| shown.operation(o)).collect();
        let status = status.map(|st| shown.node_status(st));
        let mut out = pb::InspectResponse {
            status,
            operations,
            preservation: Some(self.agent.preservation()),
            ..Default::default()
        };
        let Some(desired) = r.desired else {
            return Ok(Response::new(out));
        };
        let as_error = |s: Status| {
            let s = shown.status(s);
            pb::InspectError {
                code: s.code() as i32,
                message: s.message().to_string(),
            }
        };
        if r.skip_coverage_when_busy && self.agent.is_busy() {
            out.coverage_error = Some(as_error(Status::aborted(
                "an operation is running on the node; coverage left out (skip_coverage_when_busy)",
            )));
            return Ok(Response::new(out));
        }
        let policy =
            pb::RebootPolicy::try_from(r.reboot_policy).unwrap_or(pb::RebootPolicy::Unspecified);
        let _slot = self.planning_slot(shown.role).await?;
        let a = self.agent.clone();
        let t = std::time::Instant::now();
        let cov = match a.kept_coverage(&desired, policy, None) {
            Lookup::Kept(report) => Ok((*report, true)),
            Lookup::Compute(key) => {
                blocking(move || {
                    a.coverage_computed_keeping(key, &desired, policy, None)
                        .map(|c| (c, false))
                })
                .await
            }
        };
        self.metrics
            .observe_coverage(t.elapsed().as_secs_f64(), cov.as_ref().ok().map(|c| c.1));
        match cov {
            Ok((c, _)) => out.coverage = Some(c),
            Err(s) => out.coverage_error = Some(as_error(s)),
        }
        Ok(Response::new(out))
    }
}

/// Concurrent calls on one connection (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`): the
/// extension makes a few calls per hook, `inplacectl` one.
pub(crate) const MAX_STREAMS_PER_CONNECTION: u32 = 16;
/// Longest life of a connection; then it is closed gracefully (GOAWAY) and clients
/// reconnect. Bounds connections held open by idle or forgotten clients.
pub(crate) const MAX_CONNECTION_AGE: std::time::Duration = std::time::Duration::from_secs(30 * 60);
/// Grace after [`MAX_CONNECTION_AGE`] for calls in flight (a WatchOperation stream
/// resumes on a new connection).
pub(crate) const MAX_CONNECTION_AGE_GRACE: std::time::Duration =
    std::time::Duration::from_secs(5 * 60);
/// HTTP/2 keepalive: a PING every 30 s, and a peer that does not answer within 10 s is
/// disconnected.
pub(crate) const KEEPALIVE: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_secs(30),
    std::time::Duration::from_secs(10),
);

type HttpResponse = tonic::codegen::http::Response<tonic::body::Body>;
type SizeLayer = tower::layer::util::Stack<
    admit::AdmitLayer,
    tower::layer::util::Stack<
        tower::util::MapResponseLayer<fn(HttpResponse) -> HttpResponse>,
        tower::layer::util::Identity,
    >,
>;
type Layers = tower::layer::util::Stack<calls::ReaderCallsLayer, SizeLayer>;

/// A tonic server with the per-connection limits above, over-size messages answered
/// `RESOURCE_EXHAUSTED` ([`limits::resource_exhausted_for_size`]), every call admitted by
/// `gate` before its message is read ([`admit`]), and each reader identity's calls in
/// flight capped ([`calls::ReaderCallsLayer`]).
fn grpc_server(gate: &Arc<admit::Gate>) -> tonic::transport::Server<Layers> {
    tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .max_connection_age(MAX_CONNECTION_AGE)
        .max_connection_age_grace(MAX_CONNECTION_AGE_GRACE)
        .http2_keepalive_interval(Some(KEEPALIVE.0))
        .http2_keepalive_timeout(Some(KEEPALIVE.1))
        .layer(tower::util::MapResponseLayer::new(
            limits::resource_exhausted_for_size as fn(_) -> _,
        ))
        .layer(admit::AdmitLayer(gate.clone()))
        .layer(calls::ReaderCallsLayer)
}

/// Serves the API, health and reflection on the Unix socket `socket` (replacing a stale
/// socket file, creating its directory; mode 0600, or 0660 with `api.socket_group`) and, when
/// `api.tcp.listen` is set, on TCP with mutual TLS; calls `ready` once every listener is
/// bound, and stops when `stop` turns true.
pub(crate) async fn serve(
    agent: Arc<Agent>,
    metrics: Arc<crate::metrics::NodeMetrics>,
    socket: &Path,
    ready: impl FnOnce(),
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    use anyhow::Context;
    start_metrics(&agent, &metrics, &stop).await?;
    // TCP first: once the local socket accepts, every listener is bound (the tests and
    // inplacectl wait for the socket)
    let tcp = bind_tcp(&agent).await?;
    let (listener, reader_gid) = bind_socket(&agent, socket)?;
    let policy = &agent.config().policy;
    let max_message = policy.max_spec_bytes as usize + (1 << 20);
    let wire = limits::WireLimits {
        max_files: policy.max_files,
        max_elements: policy.max_spec_elements,
    };
    limits::install(wire);
    let gate = Arc::new(admit::Gate::new(
        reader_gid,
        max_message,
        wire,
        policy.max_planning_mib,
    ));
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<NodeAgentServer<Service>>().await;
    // reflection v1, and v1alpha for clients that only know it (grpcio-reflection's
    // ProtoReflectionDescriptorDatabase, older grpcurl)
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    let reflection_alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("building the reflection service (v1alpha)")?;
    let api = NodeAgentServer::new(Service::new(agent, reader_gid, metrics))
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    tracing::info!(socket = %socket.display(), "serving");
    ready();
    let unix = grpc_server(&gate)
        .add_service(health.clone())
        .add_service(reflection.clone())
        .add_service(reflection_alpha.clone())
        .add_service(api.clone())
        .serve_with_incoming_shutdown(accept::unix_incoming(listener), stopped(stop.clone()));
    match tcp {
        None => unix.await.context("serving gRPC")?,
        Some(incoming) => {
            let remote = grpc_server(&gate)
                .add_service(health)
                .add_service(reflection)
                .add_service(reflection_alpha)
                .add_service(api)
                .serve_with_incoming_shutdown(incoming, stopped(stop));
            let (a, b) = tokio::join!(unix, remote);
            a.context("serving gRPC on the socket")?;
            b.context("serving gRPC on TCP")?;
        }
    }
    let _ = std::fs::remove_file(socket);
    Ok(())
}

/// Starts the metrics outputs `[metrics]` configures; a listener that fails at once (bad
/// address, port in use, no TLS off loopback) fails the start.
async fn start_metrics(
    agent: &Arc<Agent>,
    metrics: &Arc<crate::metrics::NodeMetrics>,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mc = agent.config().metrics.clone();
    if !mc.textfile.is_empty() {
        tokio::spawn(metrics::textfile(
            agent.clone(),
            metrics.clone(),
            mc.textfile.clone(),
            stop.clone(),
        ));
    }
    if !mc.listen.is_empty() {
        let (a, m, s, l) = (
            agent.clone(),
            metrics.clone(),
            stop.clone(),
            mc.listen.clone(),
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let r = metrics::serve(a, m, &l, s).await;
            if let Err(e) = &r {
                tracing::error!(error = %format!("{e:#}"), "metrics listener");
            }
            let _ = tx.send(r);
        });
        // a listener that fails at once (bad address, port in use) fails the start
        if let Ok(Ok(Err(e))) =
            tokio::time::timeout(std::time::Duration::from_millis(200), rx).await
        {
            return Err(e);
        }
    }
    Ok(())
}

/// Binds the local socket (replacing a stale one, refusing a live one) with its mode and
/// group; returns the listener and the readers' gid.
fn bind_socket(
    agent: &Arc<Agent>,
    socket: &Path,
) -> anyhow::Result<(tokio::net::UnixListener, Option<u32>)> {
    use anyhow::Context;
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_dir() => {
            anyhow::bail!("{} is a directory, not a socket path", socket.display())
        }
        Ok(_) => {
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                anyhow::bail!(
                    "{} is in use by a running server; stop it or choose another --socket",
                    socket.display()
                );
            }
            std::fs::remove_file(socket)
                .with_context(|| format!("removing stale {}", socket.display()))?
        }
        Err(_) => {}
    }
    let listener = tokio::net::UnixListener::bind(socket)
        .with_context(|| format!("binding {}", socket.display()))?;
    let reader_gid = resolve_group(&agent.config().api.socket_group)?;
    let mode = if reader_gid.is_some() { 0o660 } else { 0o600 };
    if let Some(g) = reader_gid {
        std::os::unix::fs::chown(socket, None, Some(g))
            .with_context(|| format!("chgrp {g} {}", socket.display()))?;
    }
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", socket.display()))?;

    Ok((listener, reader_gid))
}

/// Binds `api.tcp.listen` (mutual TLS, or plain on loopback with `insecure_loopback`), if set.
async fn bind_tcp(
    agent: &Arc<Agent>,
) -> anyhow::Result<Option<tokio_stream::wrappers::ReceiverStream<std::io::Result<tls::Conn>>>> {
    use anyhow::Context;
    let tcp_cfg = agent.config().api.tcp.clone();
    let tcp = if tcp_cfg.listen.is_empty() {
        None
    } else {
        let addr: std::net::SocketAddr = tcp_cfg.listen.parse().with_context(|| {
            format!("api.tcp.listen {:?} is not an address:port", tcp_cfg.listen)
        })?;
        let acceptor = if tcp_cfg.insecure_loopback {
            if !addr.ip().is_loopback() {
                anyhow::bail!(
                    "api.tcp.insecure_loopback is only allowed on a loopback address, not {addr}; configure cert, key and client_ca for mutual TLS"
                );
            }
            None
        } else {
            if tcp_cfg.cert.is_empty() || tcp_cfg.key.is_empty() || tcp_cfg.client_ca.is_empty() {
                anyhow::bail!(
                    "api.tcp.listen needs cert, key and client_ca: the remote API is mutual TLS only"
                );
            }
            // a key or certificate another user could write is not used: no remote API,
            // the local socket keeps serving
            if let Some(p) = inplace_node::trust::first_untrusted(&tls_files("api.tcp", &tcp_cfg)) {
                agent.set_problem(
                    "api.tcp.listen",
                    Some(format!("api.tcp.listen {addr} not served: {p}")),
                );
                return Ok(None);
            }
            Some(Arc::new(tls::Acceptor::new(&tcp_cfg)?))
        };
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        tracing::info!(address = %l.local_addr().map(|a| a.to_string()).unwrap_or_default(), mtls = acceptor.is_some(), "serving TCP");
        Some(tls::incoming(l, tcp_cfg, acceptor))
    };

    Ok(tcp)
}

/// The `(key, path)` of the certificate, key and client CA files of `[api.tcp]`, for
/// [`inplace_node::trust::first_untrusted`].
pub(crate) fn tls_files<'a>(
    section: &str,
    tcp: &'a inplace_edge::listener::TcpConfig,
) -> Vec<(String, &'a str)> {
    [
        ("cert", &tcp.cert),
        ("key", &tcp.key),
        ("client_ca", &tcp.client_ca),
    ]
    .into_iter()
    .map(|(k, p)| (format!("{section}.{k}"), p.as_str()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::{PlanningSlots, Role};
    use std::time::Duration;

    /// Readers holding every place they may take leave a slot for an admin; a further
    /// reader waits (here: never gets one while they hold theirs).
    #[tokio::test]
    async fn readers_never_hold_every_planning_slot() {
        let slots = PlanningSlots::new(4);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(slots.acquire(Role::Reader).await.unwrap());
        }
        let wait = Duration::from_millis(50);
        assert!(
            tokio::time::timeout(wait, slots.acquire(Role::Reader))
                .await
                .is_err(),
            "a fourth reader got a slot"
        );
        let admin = tokio::time::timeout(wait, slots.acquire(Role::Admin)).await;
        assert!(admin.is_ok(), "the admin waited behind readers");
        // with one slot there is nothing to keep: readers and admins share it
        let one = PlanningSlots::new(1);
        drop(one.acquire(Role::Reader).await.unwrap());
        drop(one.acquire(Role::Admin).await.unwrap());
    }
}
