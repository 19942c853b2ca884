//! gRPC over TCP (tonic): the transport between hosts, and to every ps with
//! `cluster.transport = "tcp"`. The HTTP/2 settings both ends share.

use crate::auth::{AddToken, ClientError, Credentials};
use crate::pb::parameter_server_client::ParameterServerClient;
use std::time::Duration;
use tonic::codegen::{InterceptedService, http};
use tonic::transport::Channel;

/// HTTP/2 frame size both ends accept: a whole push or pull in one DATA
/// frame (not 100 of the default 16 KiB), so the receiver decodes it where
/// it was read ([`super::proto::CheckedDecoder`]) instead of joining frames.
/// No larger than the window, which bounds a frame anyway; HTTP/2 allows
/// 16 KiB to 16 MiB − 1.
pub fn frame(limit: usize) -> u32 {
    window(limit).clamp(1 << 14, (1 << 24) - 1)
}

/// HTTP/2 flow-control window for a model's messages: a whole push or pull in
/// flight without waiting for WINDOW_UPDATEs (the default is 64 KiB).
pub fn window(limit: usize) -> u32 {
    u32::try_from(limit).unwrap_or(u32::MAX).min((1 << 31) - 1)
}

/// A gRPC client of one ps, with the token and the compression on every call.
pub type Client = ParameterServerClient<InterceptedService<Channel, Stamp>>;

/// What every TCP call carries: the token, and this task's
/// `cluster.compression` ([`super::compress::HEADER`]), so that a ps of
/// another setting refuses the call instead of misreading its tensors.
#[derive(Clone)]
pub struct Stamp {
    /// `authorization: Bearer …`.
    token: AddToken,
    /// The compression's name.
    compression: &'static str,
}

impl tonic::service::Interceptor for Stamp {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let mut req = self.token.call(req)?;
        req.metadata_mut().insert(
            super::compress::HEADER,
            tonic::metadata::MetadataValue::from_static(self.compression),
        );
        Ok(req)
    }
}

/// A lazily connected client of the ps at `addr` (a ps that is not up yet is
/// retried per call), every call bounded by `timeout`, messages by `limit`,
/// stamped with `compression` (a [`super::compress::name`]).
///
/// Errors: an address that is not a valid URI authority, or a token a header cannot carry.
pub fn client(
    credentials: &Credentials,
    addr: &str,
    limit: usize,
    timeout: Duration,
    compression: &'static str,
) -> Result<Client, ClientError> {
    let auth = Stamp {
        token: credentials.add_token()?,
        compression,
    };
    let ep = credentials
        .endpoint(addr)?
        .connect_timeout(Duration::from_secs(2))
        .timeout(timeout)
        .tcp_nodelay(true)
        .initial_stream_window_size(window(limit))
        .initial_connection_window_size(window(limit))
        .max_frame_size(frame(limit));
    Ok(
        ParameterServerClient::with_interceptor(ep.connect_lazy(), auth)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit),
    )
}

/// A unary gRPC answer's body from [`super::proto::chunked`]'s chunks, then
/// the `grpc-status: 0` trailers tonic's encoder would send.
pub struct Chunks {
    /// Data still to send.
    data: std::vec::IntoIter<bytes::Bytes>,
    /// The trailers were sent.
    done: bool,
}

impl Chunks {
    pub fn new(chunks: Vec<bytes::Bytes>) -> Self {
        Self {
            data: chunks.into_iter(),
            done: false,
        }
    }
}

impl http_body::Body for Chunks {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        if let Some(chunk) = self.data.next() {
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(chunk))));
        }
        if self.done {
            return std::task::Poll::Ready(None);
        }
        self.done = true;
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        std::task::Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}
