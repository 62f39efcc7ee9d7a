//! Calls in flight per reader identity: a tower layer over the gRPC service that holds
//! each reader to `calls_per_reader` (the other half of [`crate::places`], which caps
//! connections).

type HttpRequest = tonic::codegen::http::Request<tonic::body::Body>;
type HttpResponse = tonic::codegen::http::Response<tonic::body::Body>;

/// A tower layer that holds each reader identity to `calls_per_reader` calls in flight
/// (the semaphore in [`crate::tls::TlsPeer::calls`]); a call over it is answered
/// `RESOURCE_EXHAUSTED` naming the key at once. A call holds its place until its
/// response body (a stream's last message) is sent or dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReaderCallsLayer;

impl<S> tower::Layer<S> for ReaderCallsLayer {
    type Service = ReaderCalls<S>;
    fn layer(&self, inner: S) -> ReaderCalls<S> {
        ReaderCalls { inner }
    }
}

/// The service of [`ReaderCallsLayer`].
#[derive(Debug, Clone)]
pub struct ReaderCalls<S> {
    inner: S,
}

impl<S> tower::Service<HttpRequest> for ReaderCalls<S>
where
    S: tower::Service<HttpRequest, Response = HttpResponse>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = HttpResponse;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<HttpResponse, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: HttpRequest) -> Self::Future {
        let calls = req
            .extensions()
            .get::<crate::tls::TlsPeer>()
            .and_then(|p| p.calls.clone());
        let Some(calls) = calls else {
            return Box::pin(self.inner.call(req));
        };
        let Ok(permit) = calls.try_acquire_owned() else {
            let s = tonic::Status::resource_exhausted(
                "this reader identity has as many calls in flight as it may (api.tcp.calls_per_reader); retry when one ends",
            );
            return Box::pin(std::future::ready(Ok(s.into_http())));
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            use http_body_util::BodyExt;
            let resp = fut.await?;
            Ok(resp.map(move |b| {
                tonic::body::Body::new(b.map_frame(move |f| {
                    let _held = &permit;
                    f
                }))
            }))
        })
    }
}

/// The [`Closer`] of the connection a request came on, from the connection info tonic put
/// in its extensions; None for a transport without one.
pub fn closer_in(ext: &tonic::codegen::http::Extensions) -> Option<crate::closer::Closer> {
    ext.get::<crate::tls::TlsPeer>()
        .map(|p| p.closer.clone())
        .or_else(|| {
            ext.get::<crate::accept::LocalPeer>()
                .map(|p| p.closer.clone())
        })
}
