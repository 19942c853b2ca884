//! The bound on calls in progress: [`Admission`] admits at most
//! [`MAX_REQUESTS`] at once, each holding its place and its reserved
//! response bytes ([`Reserved`]) until its response has been sent.

use super::conn::peer;
use super::limits::{MAX_REQUESTS, RefusalLog, Reserved};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

/// Admits at most [`MAX_REQUESTS`] calls at once to the service it wraps;
/// each holds its place (and its [`Reserved`] response bytes) until its
/// response body has been sent or dropped.
#[derive(Clone)]
pub struct Admission<S> {
    /// The gRPC service.
    inner: S,
    /// Places for calls in progress.
    requests: Arc<Semaphore>,
    /// Where refusals go.
    log: Arc<RefusalLog>,
}

impl<S> Admission<S> {
    pub fn new(inner: S, log: Arc<RefusalLog>) -> Self {
        Self {
            inner,
            requests: Arc::new(Semaphore::new(MAX_REQUESTS)),
            log,
        }
    }
}

impl<S: NamedService> NamedService for Admission<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Admission<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let Ok(place) = self.requests.clone().try_acquire_owned() else {
            let reason = format!("{MAX_REQUESTS} calls already in progress");
            self.log.refused(peer(req.extensions()), &reason);
            let status = crate::transport::proto::status(
                tonic::Code::ResourceExhausted,
                format!("ps busy: {reason}; retry later"),
            );
            return Box::pin(std::future::ready(Ok(status.into_http())));
        };
        // The generated server is always ready: a clone may take the call.
        let mut inner = self.inner.clone();
        std::mem::swap(&mut inner, &mut self.inner);
        Box::pin(async move {
            let res = inner.call(req).await?;
            let (mut parts, body) = res.into_parts();
            let reserved = parts.extensions.remove::<Reserved>();
            let body = Body::new(Held {
                body,
                _held: (place, reserved),
            });
            Ok(http::Response::from_parts(parts, body))
        })
    }
}

/// A response body that keeps its call's place and reserved bytes until it
/// is dropped: sent, or abandoned by a peer that went away.
struct Held {
    /// The response.
    body: Body,
    /// Released on drop.
    _held: (OwnedSemaphorePermit, Option<Reserved>),
}

impl tonic::codegen::Body for Held {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        tonic::codegen::Body::is_end_stream(&self.body)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        tonic::codegen::Body::size_hint(&self.body)
    }
}
