//! Stand-in agents for the fleet bench at N = 500 and 1000, where N real `inplaced`
//! processes (each with its own sysroot copy, state directory and coverage planning) do
//! not fit on the bench machine's two cores.
//!
//! What is real, at the boundary the extension sees: the agent's gRPC API
//! (`inplace_wire::pb::node_agent_server`, the same wire types), served over mutual TLS by
//! the agent's own server-side TLS (`inplace_edge::tls::incoming`: handshake budget, client
//! certificate verified against the extension's CA, the `[[api.tcp.clients]]` allowlist,
//! connection places), each stand-in on its own loopback address `127.0.0.x:port` with its
//! own server certificate for that IP, so the extension's pool keys, TLS server names and
//! node checks differ per Machine as with real nodes. The answers are a real agent's:
//! one `inplaced` on the `ubuntu-2404-grub` fixture is asked once ([`Recorded::from_agent`])
//! for its status, its coverage of the Machine's spec, and the operation and status of a
//! real apply of that spec, with the apply's duration; each stand-in replays them with its
//! own node name, and runs its operations through the same phases for that duration
//! (`Apply` answers at once, the operation succeeds after it; a second `Apply` while one
//! runs is `ABORTED`, the same id again returns the operation, as the agent does).
//!
//! What is not: the node's work (planning coverage, writing files) costs nothing here, so
//! the fleet figures measure the extension and the network, not N nodes' CPU.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inplace_edge::listener::{ClientEntry, Role, TcpConfig};
use inplace_edge::tls::Acceptor;
use inplace_wire::pb;
use inplace_wire::pb::node_agent_server::{NodeAgent, NodeAgentServer};
use tonic::{Request, Response, Status};

/// A real agent's answers, replayed by every stand-in.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    /// `GetStatus` before the apply.
    pub before: pb::NodeStatus,
    /// `GetStatus` after the apply (its applied spec hash, Kubernetes version).
    pub after: pb::NodeStatus,
    /// The coverage of the Machine's spec.
    pub coverage: pb::CoverageReport,
    /// The operation of the apply, as it ended.
    pub done: pb::Operation,
    /// Time from `Apply` to the operation's end.
    pub apply_time: Duration,
}

impl Recorded {
    /// Asks the agent on `socket` (a fresh `ubuntu-2404-grub` node) about `spec` and
    /// applies it; without the Kubernetes version when the node reports none, as the
    /// extension does.
    pub(crate) async fn from_agent(socket: &std::path::Path, mut spec: pb::NodeSpec) -> Recorded {
        let mut c = inplace_edge::client::connect(socket).await.unwrap();
        let before = c
            .get_status(pb::GetStatusRequest {})
            .await
            .unwrap()
            .into_inner();
        if before.kubernetes_version.is_empty() {
            spec.kubernetes = None;
        }
        let coverage = c
            .get_coverage(pb::GetCoverageRequest {
                desired: Some(spec.clone()),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let t = Instant::now();
        let op = c
            .apply(pb::ApplyRequest {
                desired: Some(spec),
                operation_id: "bench-record".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let done = loop {
            let o = c
                .get_operation(pb::GetOperationRequest { id: op.id.clone() })
                .await
                .unwrap()
                .into_inner();
            if inplace_wire::phase::is_terminal(o.phase) {
                break o;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let apply_time = t.elapsed();
        assert_eq!(done.phase, pb::Phase::Succeeded as i32, "{done:?}");
        let after = c
            .get_status(pb::GetStatusRequest {})
            .await
            .unwrap()
            .into_inner();
        Recorded {
            before,
            after,
            coverage,
            done,
            apply_time,
        }
    }
}

/// One node's state: its operations, newest first, and whether the newest runs.
#[derive(Debug, Default)]
struct State {
    ops: Vec<pb::Operation>,
    applied: bool,
}

/// A stand-in agent named `node` (its `facts.node_name`).
#[derive(Debug, Clone)]
pub(crate) struct StandIn {
    node: String,
    rec: Arc<Recorded>,
    state: Arc<Mutex<State>>,
}

impl StandIn {
    fn status(&self, st: &State) -> pb::NodeStatus {
        let mut s = if st.applied {
            self.rec.after.clone()
        } else {
            self.rec.before.clone()
        };
        if let Some(f) = s.facts.as_mut() {
            f.node_name = self.node.clone();
        }
        s.current_operation = st
            .ops
            .first()
            .filter(|o| !inplace_wire::phase::is_terminal(o.phase))
            .cloned();
        s
    }

    fn op(&self, id: &str) -> Result<pb::Operation, Status> {
        let st = self.state.lock().unwrap();
        st.ops
            .iter()
            .find(|o| o.id == id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("no operation {id:?}")))
    }
}

#[tonic::async_trait]
impl NodeAgent for StandIn {
    async fn get_coverage(
        &self,
        _: Request<pb::GetCoverageRequest>,
    ) -> Result<Response<pb::CoverageReport>, Status> {
        Ok(Response::new(self.rec.coverage.clone()))
    }

    async fn apply(&self, r: Request<pb::ApplyRequest>) -> Result<Response<pb::Operation>, Status> {
        let id = r.into_inner().operation_id;
        let op = {
            let mut st = self.state.lock().unwrap();
            if let Some(o) = st.ops.iter().find(|o| o.id == id) {
                return Ok(Response::new(o.clone()));
            }
            if let Some(o) = st
                .ops
                .first()
                .filter(|o| !inplace_wire::phase::is_terminal(o.phase))
            {
                return Err(Status::aborted(format!("operation {:?} is running", o.id)));
            }
            let op = pb::Operation {
                id: id.clone(),
                phase: pb::Phase::Acting as i32,
                actions: Vec::new(),
                ..self.rec.done.clone()
            };
            st.ops.insert(0, op.clone());
            op
        };
        let (state, done, t) = (
            self.state.clone(),
            self.rec.done.clone(),
            self.rec.apply_time,
        );
        tokio::spawn(async move {
            tokio::time::sleep(t).await;
            let mut st = state.lock().unwrap();
            if let Some(o) = st.ops.iter_mut().find(|o| o.id == id) {
                *o = pb::Operation { id, ..done };
            }
            st.applied = true;
        });
        Ok(Response::new(op))
    }

    async fn get_operation(
        &self,
        r: Request<pb::GetOperationRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        self.op(&r.into_inner().id).map(Response::new)
    }

    type WatchOperationStream =
        tonic::codegen::tokio_stream::wrappers::ReceiverStream<Result<pb::OperationEvent, Status>>;

    async fn watch_operation(
        &self,
        r: Request<pb::WatchOperationRequest>,
    ) -> Result<Response<Self::WatchOperationStream>, Status> {
        let id = r.into_inner().id;
        let first = self.op(&id)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let me = self.clone();
        tokio::spawn(async move {
            let mut last = first;
            if tx
                .send(Ok(pb::OperationEvent {
                    operation: Some(last.clone()),
                }))
                .await
                .is_err()
            {
                return;
            }
            while !inplace_wire::phase::is_terminal(last.phase) {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let Ok(o) = me.op(&id) else { return };
                if o.phase != last.phase
                    && tx
                        .send(Ok(pb::OperationEvent {
                            operation: Some(o.clone()),
                        }))
                        .await
                        .is_err()
                {
                    return;
                }
                last = o;
            }
        });
        Ok(Response::new(
            tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
    }

    async fn list_operations(
        &self,
        _: Request<pb::ListOperationsRequest>,
    ) -> Result<Response<pb::ListOperationsResponse>, Status> {
        let operations = self.state.lock().unwrap().ops.clone();
        Ok(Response::new(pb::ListOperationsResponse { operations }))
    }

    async fn reboot(
        &self,
        _: Request<pb::RebootRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        Err(Status::failed_precondition(
            "no operation waits for a reboot",
        ))
    }

    async fn confirm(
        &self,
        _: Request<pb::ConfirmRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        Err(Status::failed_precondition(
            "no operation waits for confirmation",
        ))
    }

    async fn get_status(
        &self,
        _: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::NodeStatus>, Status> {
        let st = self.state.lock().unwrap();
        Ok(Response::new(self.status(&st)))
    }

    async fn inspect(
        &self,
        r: Request<pb::InspectRequest>,
    ) -> Result<Response<pb::InspectResponse>, Status> {
        let r = r.into_inner();
        let st = self.state.lock().unwrap();
        let status = self.status(&st);
        let busy = status.current_operation.is_some();
        let (coverage, coverage_error) = match &r.desired {
            None => (None, None),
            Some(_) if busy && r.skip_coverage_when_busy => (
                None,
                Some(pb::InspectError {
                    code: tonic::Code::Aborted as i32,
                    message: "an operation is running on the node".into(),
                }),
            ),
            Some(_) => (Some(self.rec.coverage.clone()), None),
        };
        Ok(Response::new(pb::InspectResponse {
            preservation: status.preservation.clone(),
            operations: if r.operations {
                st.ops.clone()
            } else {
                Vec::new()
            },
            status: r.status.then_some(status),
            coverage,
            coverage_error,
        }))
    }
}

/// The PKI files of the stand-ins: the extension's client CA (`clients_ca`, PEM file) and
/// one server certificate per loopback IP (cert, key files), made on first use.
pub(crate) struct Certs<'a> {
    pub dir: &'a std::path::Path,
    pub agent_ca: &'a super::common::pki::Ca,
    pub clients_ca: String,
    pub by_ip: HashMap<std::net::IpAddr, (String, String)>,
}

impl Certs<'_> {
    fn for_ip(&mut self, ip: std::net::IpAddr) -> (String, String) {
        use super::common::pki::{leaf, write};
        let (dir, ca) = (self.dir, self.agent_ca);
        self.by_ip
            .entry(ip)
            .or_insert_with(|| {
                let (c, k) = leaf(
                    ca,
                    &format!("node {ip}"),
                    vec![rcgen::SanType::IpAddress(ip)],
                );
                (
                    write(dir, &format!("standin-{ip}.crt"), &c),
                    write(dir, &format!("standin-{ip}.key"), &k),
                )
            })
            .clone()
    }
}

/// The loopback IP of stand-in `i`: 127.0.0.2 to 127.0.0.251, then again (with another
/// port).
pub(crate) fn ip_of(i: usize) -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2 + (i % 250) as u8))
}

/// Starts stand-in `i` named `node` on its own loopback address, serving mutual TLS with
/// the agent's listener rules and allowing the extension's client identity as admin, on
/// the current runtime until `stop` turns true; returns its address.
pub(crate) async fn start(
    i: usize,
    node: &str,
    rec: Arc<Recorded>,
    certs: &mut Certs<'_>,
    extension_identity: &str,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> SocketAddr {
    let ip = ip_of(i);
    let (cert, key) = certs.for_ip(ip);
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = TcpConfig {
        listen: addr.to_string(),
        cert,
        key,
        client_ca: certs.clients_ca.clone(),
        clients: vec![ClientEntry {
            identity: extension_identity.to_string(),
            kind: None,
            role: Role::Admin,
        }],
        ..TcpConfig::default()
    };
    let files = vec![
        cfg.cert.clone().into(),
        cfg.key.clone().into(),
        cfg.client_ca.clone().into(),
    ];
    let acceptor = Acceptor::with_builder(files, |f| {
        inplace_edge::tls::server_config(&f[0], &f[1], &f[2])
    })
    .unwrap();
    let incoming = inplace_edge::tls::incoming(listener, cfg, Some(Arc::new(acceptor)));
    let svc = StandIn {
        node: node.to_string(),
        rec,
        state: Arc::default(),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(NodeAgentServer::new(svc))
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop.wait_for(|s| *s).await;
            }),
    );
    addr
}
