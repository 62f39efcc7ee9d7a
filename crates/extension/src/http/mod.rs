//! The extension's HTTPS endpoint: mutual TLS from CAPI's managers, the client allowlist,
//! connection and request limits, and the metrics listener. [`route`] routes a request to
//! its hook ([`crate::hooks`]) within the hook's deadline.

pub(crate) mod route;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::budget::{DECODED_COPIES, MAX_BODY, MAX_PARSED_MIB, PARSED_BYTES_PER_VALUE};
use crate::config::{AllowedClient, Config};
use crate::extension::Extension;
use crate::metrics;
use inplace_edge::tls::{Acceptor, Reloading};

/// The server config for the HTTPS endpoint: `[cert, key, client_ca]`; a client
/// certificate signed by `server.client_ca` is required (CAPI's managers present theirs
/// when started with `--runtime-extension-client-cert-file` and
/// `--runtime-extension-client-key-file`), ALPN `http/1.1`.
pub(crate) fn tls_config(files: &[std::path::PathBuf]) -> anyhow::Result<rustls::ServerConfig> {
    inplace_edge::tls::mutual_tls_config("server", &files[0], &files[1], &files[2], b"http/1.1")
}

/// The `[[server.clients]]` allowlist of the config file `files[0]` (re-read when the
/// file changes; see [`Reloading`]).
pub(crate) fn allowlist(files: &[std::path::PathBuf]) -> anyhow::Result<Vec<AllowedClient>> {
    Ok(Config::load(&files[0])?.server.clients)
}

/// Longest a client may take to send its request headers (hyper's header read timeout,
/// also the idle time of a kept-alive connection between requests).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a client may take to send a request body.
pub(crate) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest life of one connection (CAPI's Runtime SDK client opens new ones as needed).
pub(crate) const MAX_CONNECTION_LIFE: Duration = Duration::from_secs(5 * 60);

/// What [`serve`] needs besides the extension: the TLS acceptor and the client allowlist,
/// both reloaded when their files change.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// TLS: server certificate and the CA of CAPI's client certificates.
    pub acceptor: Arc<Acceptor>,
    /// `[[server.clients]]`.
    pub clients: Arc<Reloading<Vec<AllowedClient>>>,
}

/// Serves HTTPS on `listener` until `shutdown` resolves.
///
/// Connections are accepted as the agent's ([`inplace_edge::tls::incoming`]): before its
/// TLS handshake a connection holds one of `server.handshake_budget` pending handshakes
/// (at most `server.handshakes_per_source` from one source, the oldest dropped for a
/// newer one; [`inplace_edge::handshakes`]), must send its ClientHello within
/// [`inplace_edge::tls::HELLO_TIMEOUT`] and finish within
/// [`inplace_edge::tls::HANDSHAKE_TIMEOUT`] with a client certificate from
/// `server.client_ca`. A certificate no `[[server.clients]]` entry matches is disconnected
/// before its request is read; one that does takes one of `server.max_connections` places
/// ([`inplace_edge::places`]; CAPI's managers are all admins). Requests are read and
/// answered at most `server.max_requests` at a time, with at most `server.max_request_mib`
/// of bodies and `server.max_parsed_mib` of parsed requests reserved ([`Budget`]).
pub(crate) async fn serve(
    ext: Arc<Extension>,
    listener: tokio::net::TcpListener,
    endpoint: Endpoint,
    shutdown: impl std::future::Future<Output = ()>,
) {
    use inplace_edge::accept::{Backoff, Gate, accept};
    use inplace_edge::handshakes::Handshakes;
    use inplace_edge::places;
    tokio::pin!(shutdown);
    let s = &ext.config.server;
    let handshakes = Handshakes::new(s.handshake_budget, s.handshakes_per_source);
    let places = places::Places::new(places::Limits {
        max_connections: s.max_connections,
        admin_connections: 0,
        connections_per_reader: 1,
        calls_per_reader: 1,
    });
    // descriptors: every pending handshake, every place and as many waiting for one
    let gate = Gate::new(s.handshake_budget + 2 * s.max_connections);
    let requests = Arc::new(Budget::new(
        s.max_requests,
        s.max_request_mib,
        s.max_parsed_mib,
    ));
    let mut backoff = Backoff::default();
    let endpoint = Arc::new(endpoint);
    tokio::spawn(ext.prune_pool());
    loop {
        let a = tokio::select! {
            _ = &mut shutdown => return,
            a = accept(&listener, &gate, &mut backoff, "server") => a,
        };
        let ticket = handshakes.admit(a.remote.ip());
        let (ext, endpoint, requests, places) = (
            ext.clone(),
            endpoint.clone(),
            requests.clone(),
            places.clone(),
        );
        tokio::spawn(async move {
            let _fd = a.permit;
            let peer = a.remote;
            let Some((tls, _place)) = admit(&endpoint, a.stream, peer, ticket, &places).await
            else {
                return;
            };
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(tls), hook_service(ext, requests));
            match tokio::time::timeout(MAX_CONNECTION_LIFE, conn).await {
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "connection ended with an error"),
                Err(_) => tracing::debug!(%peer, "connection closed after {MAX_CONNECTION_LIFE:?}"),
                Ok(Ok(())) => {}
            }
        });
    }
}

/// The answer to one request, as hyper's HTTP/1.1 connection holds it: boxed. hyper keeps
/// a connection's in-flight service future in a box it allocates when the connection is
/// accepted, sized for the future whether or not a request is in flight. Unboxed, that
/// was the whole hook's state machine (43 KiB), held by every kept-alive idle connection:
/// at N = 1000 connections (a rollout of 1000 Machines, CAPI's managers keeping a
/// connection per caller) 42 of the extension's 99 MiB of heap at its peak (heaptrack).
/// Boxed, an idle connection holds a pointer; [`respond`] boxes the hook's state in turn
/// once its request has a place (`server.max_requests`), so the requests waiting for one
/// hold a small future, not a hook's.
pub(crate) type Answer = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>,
>;

/// The service of one HTTPS connection: each request [`respond`]ed to, boxed ([`Answer`]).
pub(crate) fn hook_service(
    ext: Arc<Extension>,
    requests: Arc<Budget>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send,
> + Send
+ use<> {
    hyper::service::service_fn(move |req: Request<Incoming>| -> Answer {
        let (ext, requests) = (ext.clone(), requests.clone());
        Box::pin(async move { Ok(respond(&ext, &requests, req).await) })
    })
}

/// The handshake, the allowlist and a place of one connection; None when refused
/// (counted and logged at a bounded rate, [`inplace_edge::refusals`]).
async fn admit(
    endpoint: &Endpoint,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    mut ticket: inplace_edge::handshakes::Ticket,
    places: &Arc<inplace_edge::places::Places>,
) -> Option<(
    tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    inplace_edge::places::Place,
)> {
    use inplace_edge::tls;
    let handshaken = tls::handshake(&endpoint.acceptor, stream, &mut ticket).await;
    drop(ticket);
    let (s, names) = handshaken.map_err(|r| r.report("server", peer)).ok()?;
    let clients = endpoint.clients.current();
    if !clients.iter().any(|c| names.matches(&c.identity, c.kind)) {
        let hint = names.cn_hint(clients.iter().map(|c| (c.identity.as_str(), c.kind)));
        tls::refuse_unlisted("server", "server.clients", peer, &names, &hint);
        return None;
    }
    match places.take(inplace_edge::places::Holder::Admin).await {
        Ok((place, _)) => Some((s, place)),
        Err(reason) => {
            tls::refuse_place("server", reason, peer, &names);
            None
        }
    }
}

/// Serves `GET /metrics` (plain HTTP; [`metrics`]) on `listener`, forever.
pub(crate) async fn serve_metrics(listener: tokio::net::TcpListener) {
    metrics::get().export_at_zero(
        crate::hooks::Hook::ALL
            .into_iter()
            .filter(|h| *h != crate::hooks::Hook::Discovery)
            .map(crate::hooks::Hook::label),
    );
    use inplace_edge::accept::{Backoff, Gate, accept};
    let gate = Gate::new(8);
    let mut backoff = Backoff::default();
    loop {
        let a = accept(&listener, &gate, &mut backoff, "metrics.listen").await;
        tokio::spawn(async move {
            let _place = a.permit;
            let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                let mut r = if req.uri().path() == "/metrics" {
                    let accept = req
                        .headers()
                        .get(hyper::header::ACCEPT)
                        .and_then(|v| v.to_str().ok());
                    let (body, content_type) =
                        inplace_edge::exposition::negotiate(metrics::get().encode(), accept);
                    let mut r = Response::new(Full::new(Bytes::from(body)));
                    r.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static(content_type),
                    );
                    r
                } else {
                    Response::new(Full::new(Bytes::from_static(b"see /metrics\n")))
                };
                if req.uri().path() != "/metrics" {
                    *r.status_mut() = StatusCode::NOT_FOUND;
                }
                Ok::<_, Infallible>(r)
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(a.stream), svc);
            let _ = tokio::time::timeout(Duration::from_secs(60), conn).await;
        });
    }
}

fn json_response(status: StatusCode, v: &Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(
        serde_json::to_vec(v).unwrap_or_default(),
    )));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// What a parsed request of `body` bytes reserves, bytes: [`PARSED_BYTES_PER_VALUE`] per
/// JSON value, the body's strings once more (a string is one value), and
/// [`DECODED_COPIES`] of what its files decode to (bounded before anything is inflated,
/// [`crate::budget::Counted::decoded`], and at most what one bootstrap config may decode
/// to).
pub(crate) fn parsed_cost(c: crate::budget::Counted, body: usize) -> u64 {
    let decoded = c
        .decoded
        .min(crate::capi::translate::MAX_DECODED_CONFIG_BYTES);
    (c.values as u64)
        .saturating_mul(PARSED_BYTES_PER_VALUE as u64)
        .saturating_add(body as u64)
        .saturating_add(DECODED_COPIES * decoded)
}

/// What requests may hold at once: places (`server.max_requests`), body bytes in KiB
/// (`server.max_request_mib`) and parsed bytes in KiB (`server.max_parsed_mib`). A
/// request takes a place and its body's bytes before the body is read, then, before it
/// is parsed, the bytes its JSON values will take. The two byte budgets are taken in that
/// order and only the second is waited for while the first is held, so a request that
/// holds parsed bytes holds all it needs: no request waits on one that waits on it.
pub(crate) struct Budget {
    places: Arc<tokio::sync::Semaphore>,
    kib: Arc<tokio::sync::Semaphore>,
    max_kib: u32,
    parsed_kib: Arc<tokio::sync::Semaphore>,
    max_parsed_kib: u32,
}

/// What one request holds until it is answered.
pub(crate) struct Reserved {
    _place: tokio::sync::OwnedSemaphorePermit,
    _kib: tokio::sync::OwnedSemaphorePermit,
    parsed: Option<tokio::sync::OwnedSemaphorePermit>,
}

fn kib_of(mib: usize) -> u32 {
    u32::try_from(mib << 10).unwrap_or(u32::MAX)
}

impl Budget {
    /// A budget of `places` requests (at least 1), `mib` MiB of bodies (at least one
    /// [`MAX_BODY`]) and `parsed_mib` MiB of parsed requests (at least [`MAX_PARSED_MIB`]).
    pub(crate) fn new(places: usize, mib: usize, parsed_mib: usize) -> Budget {
        let max_kib = kib_of(mib.max(MAX_BODY >> 20));
        let max_parsed_kib = kib_of(parsed_mib.max(MAX_PARSED_MIB));
        Budget {
            places: Arc::new(tokio::sync::Semaphore::new(places.max(1))),
            kib: Arc::new(tokio::sync::Semaphore::new(max_kib as usize)),
            max_kib,
            parsed_kib: Arc::new(tokio::sync::Semaphore::new(max_parsed_kib as usize)),
            max_parsed_kib,
        }
    }

    /// Waits for `bytes` of parsed request ([`parsed_cost`], at most the whole parsed
    /// budget), held by `reserved` until it is dropped; false when the budget is closed.
    pub(crate) async fn reserve_parsed(&self, reserved: &mut Reserved, bytes: u64) -> bool {
        let kib = u32::try_from(bytes.div_ceil(1024).max(1))
            .unwrap_or(u32::MAX)
            .min(self.max_parsed_kib);
        match self.parsed_kib.clone().acquire_many_owned(kib).await {
            Ok(p) => {
                reserved.parsed = Some(p);
                true
            }
            Err(_) => false,
        }
    }

    /// Waits for a place and for `body` bytes (rounded up to KiB, at most [`MAX_BODY`]);
    /// `None` when the budget is closed.
    pub(crate) async fn reserve(&self, body: usize) -> Option<Reserved> {
        let kib = u32::try_from(body.min(MAX_BODY).div_ceil(1024).max(1))
            .unwrap_or(u32::MAX)
            .min(self.max_kib);
        let place = self.places.clone().acquire_owned().await.ok()?;
        let kib = self.kib.clone().acquire_many_owned(kib).await.ok()?;
        Some(Reserved {
            _place: place,
            _kib: kib,
            parsed: None,
        })
    }
}

async fn respond(
    ext: &Extension,
    requests: &Arc<Budget>,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    // the last hook in flight gives freed memory back when it ends (crate::memory)
    let _busy = ext.activity.busy();
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    // The clock starts when the request arrives, before the body is read.
    let started = std::time::Instant::now();
    let budget = ext.deadline(req.uri().query());
    // A place and the body's bytes before the body is read: bodies wait in the socket,
    // not in memory. A declared length over the limit is refused unread.
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(n) = declared.filter(|n| *n > MAX_BODY as u64) {
        return json_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            &serde_json::json!({"status": "Failure", "message": format!("request body: Content-Length {n} is over the limit of {MAX_BODY} bytes")}),
        );
    }
    let body_bytes = declared.map_or(MAX_BODY, |n| n as usize);
    let Some(mut slot) = requests.reserve(body_bytes).await else {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({"status": "Failure", "message": "stopping"}),
        );
    };
    let body = tokio::time::timeout(
        BODY_READ_TIMEOUT,
        Limited::new(req.into_body(), MAX_BODY).collect(),
    )
    .await;
    let (status, v) = match body {
        Ok(Ok(b)) => {
            let b = b.to_bytes();
            // the parsed form's bytes before it is parsed (a body over the value limit
            // is refused unparsed by the route, so it needs none)
            let counted = crate::budget::check(&b, crate::budget::MAX_JSON_VALUES);
            if let Ok(c) = counted
                && !requests
                    .reserve_parsed(&mut slot, parsed_cost(c, b.len()))
                    .await
            {
                return json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &serde_json::json!({"status": "Failure", "message": "stopping"}),
                );
            }
            let deadline = budget.saturating_sub(started.elapsed());
            let values = counted.map(|c| c.values);
            // boxed: the hook's state (tens of KiB) exists only once the request holds
            // a place, not in every request waiting for one ([`Answer`])
            Box::pin(ext.handle(&method, &path, deadline, &b, &values)).await
        }
        Ok(Err(e)) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            serde_json::json!({"status": "Failure", "message": format!("request body: {e} (limit {MAX_BODY} bytes)")}),
        ),
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            serde_json::json!({"status": "Failure", "message": format!("request body not sent within {BODY_READ_TIMEOUT:?}")}),
        ),
    };
    json_response(status, &v)
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    /// What hyper allocates per connection for its in-flight request, whether one is in
    /// flight or not, is the service's future ([`Answer`]): a pointer, not the hook.
    #[test]
    fn an_idle_connection_holds_no_hook_state() {
        fn in_flight<F, S>(_: F) -> usize
        where
            F: FnOnce(Arc<Extension>, Arc<Budget>) -> S,
            S: hyper::service::Service<Request<Incoming>>,
        {
            size_of::<Option<S::Future>>()
        }
        fn returned<F, Fut>(_: F) -> usize
        where
            F: FnOnce(&'static Extension, &'static Arc<Budget>, Request<Incoming>) -> Fut,
        {
            size_of::<Fut>()
        }
        fn handled<F, Fut>(_: F) -> usize
        where
            F: FnOnce(
                &'static Extension,
                &'static str,
                &'static str,
                Duration,
                &'static [u8],
                &'static Result<usize, String>,
            ) -> Fut,
        {
            size_of::<Fut>()
        }
        let hook = handled(Extension::handle);
        assert!(hook > 8192, "a hook's state is {hook} bytes");
        let per_connection = in_flight(hook_service);
        assert!(
            per_connection <= 16,
            "an idle connection holds {per_connection} bytes for its request ({hook} for a hook's state)"
        );
        // a request waiting for a place (server.max_requests) holds no hook state either
        let waiting = returned(respond);
        assert!(
            waiting <= 2048,
            "a request waiting for a place holds {waiting} bytes ({hook} for a hook's state)"
        );
    }

    /// Many small requests hold places at once; one body of the largest size takes a
    /// whole minimal budget, so the next request waits for its bytes, not for a place.
    #[tokio::test]
    async fn places_and_bytes_bound_requests_apart() {
        let b = Budget::new(64, 16, MAX_PARSED_MIB);
        let mut small = Vec::new();
        for _ in 0..32 {
            small.push(b.reserve(40 << 10).await.expect("small request"));
        }
        assert_eq!(b.places.available_permits(), 32);
        assert_eq!(b.kib.available_permits(), (16 << 10) - 32 * 40);
        drop(small);
        let big = b.reserve(MAX_BODY + 1).await.expect("largest body");
        assert_eq!(b.kib.available_permits(), 0);
        let waiting = tokio::time::timeout(Duration::from_millis(50), b.reserve(1)).await;
        assert!(
            waiting.is_err(),
            "a request reserved bytes the budget did not have"
        );
        drop(big);
        assert!(b.reserve(1).await.is_some());
        // a budget below one largest body is raised to it, else no such body could pass
        assert_eq!(Budget::new(1, 1, 1).max_kib as usize, MAX_BODY >> 10);
        assert_eq!(
            Budget::new(1, 1, 1).max_parsed_kib as usize,
            MAX_PARSED_MIB << 10
        );
    }
}
