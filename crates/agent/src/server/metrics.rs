//! Where the agent's metrics ([`crate::metrics`]) go: `GET /metrics` on `[metrics] listen`
//! (plain HTTP on loopback; HTTPS with the mutual TLS of `[api.tcp]` elsewhere) and the
//! node_exporter textfile `[metrics] textfile`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::apply::Agent;
use crate::metrics::NodeMetrics;

/// How often the textfile is refreshed (rewritten when its text changed).
pub(crate) const TEXTFILE_EVERY: Duration = Duration::from_secs(5);
/// The textfile is rewritten at least this often, changed or not: its mtime is the
/// agent's heartbeat for the `InplacedDown` alert (`deploy/alerts.yaml`).
pub(crate) const TEXTFILE_HEARTBEAT: Duration = Duration::from_secs(60);

/// The current metrics text: status and history read, gauges refreshed.
pub(crate) async fn collect(agent: &Arc<Agent>, metrics: &Arc<NodeMetrics>) -> String {
    let (a, m) = (agent.clone(), metrics.clone());
    tokio::task::spawn_blocking(move || {
        if let (Ok(status), Ok(history)) = (a.status(), a.list_operations()) {
            m.refresh(&status, &history);
        }
        m.encode()
    })
    .await
    .unwrap_or_default()
}

/// What the textfile's problem is about ([`Agent::set_problem`]).
const TEXTFILE_KEY: &str = "metrics.textfile";

/// Rewrites the node path `path` (under `--root`, [`crate::metrics::write_textfile`])
/// whenever the metrics text changes, until `stop` turns true. A write that fails (its
/// directory missing, or writable by another user than root) is a problem in
/// `NodeStatus.problems` about `metrics.textfile`, cleared by the next write that succeeds.
pub(crate) async fn textfile(
    agent: Arc<Agent>,
    metrics: Arc<NodeMetrics>,
    path: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut last = String::new();
    let mut written = std::time::Instant::now();
    loop {
        // node_exporter's textfile collector reads the text format 0.0.4, not OpenMetrics
        let text = inplace_edge::exposition::text_format(&collect(&agent, &metrics).await);
        // Rewritten when it changed, and at least every TEXTFILE_HEARTBEAT, so the file's
        // mtime (node_textfile_mtime_seconds) tells whether the agent is alive.
        if text != last || written.elapsed() >= TEXTFILE_HEARTBEAT {
            let (a, p, t) = (agent.clone(), path.clone(), text.clone());
            let wrote = tokio::task::spawn_blocking(move || {
                crate::metrics::write_textfile(a.root(), &p, &t)
            })
            .await;
            match wrote {
                Ok(Ok(())) => {
                    agent.set_problem(TEXTFILE_KEY, None);
                    last = text;
                    written = std::time::Instant::now();
                }
                Ok(Err(e)) => agent.set_problem(
                    TEXTFILE_KEY,
                    Some(format!("metrics.textfile {path} not written: {e}")),
                ),
                Err(_) => {}
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(TEXTFILE_EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// The scrape's answer: OpenMetrics or the text format 0.0.4, as `accept` asks
/// ([`inplace_edge::exposition::negotiate`]).
fn metrics_response(text: String, accept: Option<&str>) -> Response<Full<Bytes>> {
    let (body, content_type) = inplace_edge::exposition::negotiate(text, accept);
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

/// Serves `GET /metrics` on `listen` until `stop`: plain HTTP on a loopback address,
/// otherwise HTTPS requiring a client certificate that `[[api.tcp.clients]]` allows
/// (any role). Errors name the config key.
pub(crate) async fn serve(
    agent: Arc<Agent>,
    metrics: Arc<NodeMetrics>,
    listen: &str,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let addr: std::net::SocketAddr = listen
        .parse()
        .with_context(|| format!("metrics.listen {listen:?} is not an address:port"))?;
    let tcp = agent.config().api.tcp.clone();
    let acceptor = if addr.ip().is_loopback() {
        None
    } else {
        if !tls_usable(&agent, addr, &tcp)? {
            return Ok(());
        }
        Some(Arc::new(super::tls::Acceptor::for_metrics(&tcp)?))
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("metrics.listen: binding {addr}"))?;
    tracing::info!(address = %addr, tls = acceptor.is_some(), "serving metrics");
    // as the API (inplace_edge::handshakes): 16 pending handshakes, 4 per source, then
    // 8 places for scrapers on the allowlist (descriptors: the handshakes, the places and
    // as many refused at once); on loopback 8 places before accept
    let handshakes = super::handshakes::Handshakes::new(16, 4);
    let gate = super::accept::Gate::new(if acceptor.is_some() { 16 + 2 * 8 } else { 8 });
    let mut backoff = super::accept::Backoff::default();
    let scrape = Scrape {
        agent,
        metrics,
        acceptor,
        tcp,
        places: Arc::new(tokio::sync::Semaphore::new(8)),
    };
    loop {
        let a = tokio::select! {
            a = super::accept::accept(&listener, &gate, &mut backoff, "metrics.listen") => a,
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        let ticket = scrape
            .acceptor
            .as_ref()
            .map(|_| handshakes.admit(a.remote.ip()));
        tokio::spawn(scrape.clone().connection(a, ticket));
    }
}

/// Whether metrics off loopback can be served over the mutual TLS of `[api.tcp]`: an
/// error when it is not set; false (with a problem in `NodeStatus.problems` about
/// `metrics.listen`) when one of its files could be written by another user than root.
fn tls_usable(
    agent: &Agent,
    addr: std::net::SocketAddr,
    tcp: &inplace_edge::listener::TcpConfig,
) -> anyhow::Result<bool> {
    if tcp.cert.is_empty() || tcp.key.is_empty() || tcp.client_ca.is_empty() {
        anyhow::bail!(
            "metrics.listen {addr} is not a loopback address: metrics off loopback are served over the mutual TLS of [api.tcp]; set api.tcp.cert, key and client_ca (or listen on 127.0.0.1)"
        );
    }
    if let Some(p) = inplace_node::trust::first_untrusted(&super::tls_files("api.tcp", tcp)) {
        agent.set_problem(
            "metrics.listen",
            Some(format!("metrics.listen {addr} not served: {p}")),
        );
        return Ok(false);
    }
    Ok(true)
}

/// What every metrics connection shares.
#[derive(Clone)]
struct Scrape {
    agent: Arc<Agent>,
    metrics: Arc<NodeMetrics>,
    /// None on loopback (plain HTTP).
    acceptor: Option<Arc<super::tls::Acceptor>>,
    tcp: inplace_edge::listener::TcpConfig,
    /// Places for scrapers on the allowlist.
    places: Arc<tokio::sync::Semaphore>,
}

impl Scrape {
    /// Serves one connection for at most a minute: plain HTTP on loopback; else the TLS
    /// handshake (under `ticket`), the client checked against `[[api.tcp.clients]]` and a
    /// place taken, each refusal logged.
    async fn connection(
        self,
        a: super::accept::Accepted,
        ticket: Option<super::handshakes::Ticket>,
    ) {
        let _place = a.permit;
        let (agent, metrics) = (self.agent.clone(), self.metrics.clone());
        let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let (agent, metrics) = (agent.clone(), metrics.clone());
            async move {
                if req.uri().path() != "/metrics" {
                    let mut r = Response::new(Full::new(Bytes::from_static(b"see /metrics\n")));
                    *r.status_mut() = StatusCode::NOT_FOUND;
                    return Ok::<_, Infallible>(r);
                }
                let accept = req
                    .headers()
                    .get(hyper::header::ACCEPT)
                    .and_then(|v| v.to_str().ok());
                Ok(metrics_response(collect(&agent, &metrics).await, accept))
            }
        });
        let http = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10))
            .clone();
        let life = Duration::from_secs(60);
        let (Some(acc), Some(mut ticket)) = (self.acceptor, ticket) else {
            let _ = tokio::time::timeout(life, http.serve_connection(TokioIo::new(a.stream), svc))
                .await;
            return;
        };
        let handshaken = super::tls::handshake(&acc, a.stream, &mut ticket).await;
        drop(ticket);
        let Ok((s, names)) = handshaken.map_err(|r| r.report("metrics.listen", a.remote)) else {
            return;
        };
        let tcp = &self.tcp;
        if super::tls::role_for(tcp, &names).is_none() {
            let hint = super::tls::agent_hint(tcp, &names);
            super::tls::refuse_unlisted(
                "metrics.listen",
                "api.tcp.clients",
                a.remote,
                &names,
                &hint,
            );
            return;
        }
        let Ok(_scraper) = self.places.try_acquire_owned() else {
            let why = super::refusals::Reason::ConnectionCap;
            super::tls::refuse_place("metrics.listen", why, a.remote, &names);
            return;
        };
        let _ = tokio::time::timeout(life, http.serve_connection(TokioIo::new(s), svc)).await;
    }
}
