//! gRPC over TCP (tonic): the transport between hosts, and to every ps with
//! `cluster.transport = "tcp"`. The HTTP/2 settings both ends share.

use super::proto::{WithTensors, chunked};
use crate::auth::{AddToken, ClientError, Credentials};
use crate::transport::pb;
use crate::transport::pb::parameter_server_client::ParameterServerClient;
use bytes::{Buf, Bytes};
use std::time::Duration;
use tonic::Status;
use tonic::codegen::{InterceptedService, Service, http};
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

/// gRPC paths of the calls whose tensors go as chunks both ways: answers
/// by the ps's `Direct` service, requests and answers by [`Direct`] here.
pub const PUSH_PATH: &str = "/dtf.v1.ParameterServer/Push";
pub const PULL_PATH: &str = "/dtf.v1.ParameterServer/Pull";

/// The channel to one ps with the token and the compression stamped on
/// every call.
type Stamped = InterceptedService<Channel, Stamp>;

/// A gRPC client of one ps, with the token and the compression on every call.
pub type Client = ParameterServerClient<Stamped>;

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
    Ok(clients(credentials, addr, limit, timeout, compression)?.0)
}

/// [`client`], and a [`Direct`] on the same connection.
///
/// Errors: as [`client`].
pub fn clients(
    credentials: &Credentials,
    addr: &str,
    limit: usize,
    timeout: Duration,
    compression: &'static str,
) -> Result<(Client, Direct), ClientError> {
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
    let channel = InterceptedService::new(ep.connect_lazy(), auth);
    let client = ParameterServerClient::new(channel.clone())
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
    Ok((
        client,
        Direct {
            channel,
            limit,
            timeout,
        },
    ))
}

/// Pushes and pulls of a worker without tonic's copies of their tensors:
/// the request's tensors go to the socket as chunks ([`super::proto::chunked`],
/// as the ps's answers do), and the answer is decoded from the HTTP/2 DATA
/// frames it arrived in (a dtf ps sends each tensor's bytes as a frame of
/// its own, [`frame`] large enough for it), its tensors slices of them.
/// tonic's client copies a request into
/// one buffer before sending it and moves an answer once more while
/// decoding it: two copies of the model per step, 5 % of a worker's CPU
/// at 10 Gbit/s (docs/benchmarks.md, "Across hosts"). Statuses, limits and
/// errors are tonic's own: the same codes and words as a [`Client`] call.
#[derive(Clone)]
pub struct Direct {
    /// The same connection as the [`Client`]'s.
    channel: Stamped,
    /// Largest message either way.
    limit: usize,
    /// Bound of a whole call, its answer's body included (the channel's
    /// own timeout ends when the answer's headers arrive).
    timeout: Duration,
}

impl Direct {
    /// A fused push-and-pull.
    pub async fn push(&self, req: pb::PushRequest) -> Result<pb::PushResponse, Status> {
        self.unary(PUSH_PATH, req).await
    }

    /// A pull.
    pub async fn pull(&self, req: pb::PullRequest) -> Result<pb::PullResponse, Status> {
        self.unary(PULL_PATH, req).await
    }

    /// One unary call, as tonic's `Grpc::unary` makes it, bounded as a whole
    /// by the call timeout (expiry: `CANCELLED`, as the channel's own).
    async fn unary<Q: WithTensors, A: prost::Message + Default>(
        &self,
        path: &'static str,
        req: Q,
    ) -> Result<A, Status> {
        let (chunks, len) = chunked(req);
        check_encoded(len, self.limit)?;
        let req = http::Request::builder()
            .method(http::Method::POST)
            .uri(http::Uri::from_static(path))
            .version(http::Version::HTTP_2)
            .header(http::header::TE, "trailers")
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .body(tonic::body::Body::new(Chunks::request(chunks)))
            .expect("a static path and headers make a valid request");
        let mut channel = self.channel.clone();
        let call = async {
            std::future::poll_fn(|cx| channel.poll_ready(cx))
                .await
                .map_err(|e| Status::from_error(e.into()))?;
            let res = channel
                .call(req)
                .await
                .map_err(|e| Status::from_error(e.into()))?;
            answer(res, self.limit).await
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or_else(|_| Err(Status::cancelled("Timeout expired")))
    }
}

/// tonic's own check and words (`max_encoding_message_size`) for a message
/// of `len` bytes sent as [`chunked`]'s chunks; the gRPC prefix holds no
/// more than `u32::MAX`.
///
/// Errors: `OUT_OF_RANGE` when it is larger.
pub fn check_encoded(len: usize, limit: usize) -> Result<(), Status> {
    if len > limit || u32::try_from(len).is_err() {
        return Err(Status::out_of_range(format!(
            "Error, encoded message length too large: found {len} bytes, the limit is: {limit} bytes"
        )));
    }
    Ok(())
}

/// The message of a unary answer of at most `limit` bytes, or its status,
/// with tonic's codes (a worker retries the codes of a ps that is away,
/// `UNKNOWN` and `UNAVAILABLE`, and stops on the others). The tensors'
/// bytes stay in the frames they came in: each is its own DATA frame from a
/// dtf ps ([`super::proto::chunked`]), which prost's `bytes` fields slice.
async fn answer<B, A>(res: http::Response<B>, limit: usize) -> Result<A, Status>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    A: prost::Message + Default,
{
    use http_body_util::BodyExt;
    let (head, body) = res.into_parts();
    // A status alone (trailers-only): the call failed before an answer.
    if let Some(status) = Status::from_header_map(&head.headers) {
        return Err(match status.code() {
            tonic::Code::Ok => Status::internal("Missing response message."),
            _ => status,
        });
    }
    if head.status != http::StatusCode::OK {
        return Err(from_http(head.status));
    }
    // The 5-byte prefix, then at most a message.
    let body = http_body_util::Limited::new(body, limit.saturating_add(5));
    let all = body.collect().await.map_err(|e| {
        if e.is::<http_body_util::LengthLimitError>() {
            Status::out_of_range(format!(
                "Error, decoded message length too large: the limit is: {limit} bytes"
            ))
        } else {
            Status::from_error(e)
        }
    })?;
    match all.trailers().and_then(Status::from_header_map) {
        Some(s) if s.code() == tonic::Code::Ok => {}
        Some(s) => return Err(s),
        // tonic's words and code: a stream reset without an error ends so.
        None => return Err(Status::unknown("missing grpc-status trailer")),
    }
    let mut data = all.aggregate();
    if data.remaining() < 5 {
        return Err(Status::internal("Unexpected EOF decoding stream."));
    }
    let compressed = data.get_u8();
    let len = data.get_u32() as usize;
    if compressed != 0 {
        return Err(Status::internal(
            "protocol error: received a compressed message, none was asked for",
        ));
    }
    if len > data.remaining() {
        return Err(Status::internal("Unexpected EOF decoding stream."));
    }
    if len < data.remaining() {
        return Err(Status::internal(format!(
            "protocol error: {} bytes after a unary answer's message",
            data.remaining() - len
        )));
    }
    A::decode(data).map_err(|e| {
        super::proto::status(
            tonic::Code::InvalidArgument,
            format_args!("malformed protobuf message: {e}"),
        )
    })
}

/// The status of an answer that is not HTTP 200 and carries none: tonic's
/// mapping (the gRPC spec's, from HTTP to gRPC status codes).
fn from_http(status: http::StatusCode) -> Status {
    use tonic::Code;
    let code = match status {
        http::StatusCode::BAD_REQUEST => Code::Internal,
        http::StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        http::StatusCode::FORBIDDEN => Code::PermissionDenied,
        http::StatusCode::NOT_FOUND => Code::Unimplemented,
        http::StatusCode::TOO_MANY_REQUESTS
        | http::StatusCode::BAD_GATEWAY
        | http::StatusCode::SERVICE_UNAVAILABLE
        | http::StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(
        code,
        format!(
            "grpc-status header missing, mapped from HTTP status code {}",
            status.as_u16()
        ),
    )
}

/// A unary gRPC body from [`super::proto::chunked`]'s chunks: an answer's
/// ends with the `grpc-status: 0` trailers tonic's encoder would send.
pub struct Chunks {
    /// Data still to send.
    data: std::vec::IntoIter<bytes::Bytes>,
    /// The trailers were sent, or none are to be.
    done: bool,
}

impl Chunks {
    /// An answer's body: the chunks, then `grpc-status: 0`.
    pub fn new(chunks: Vec<bytes::Bytes>) -> Self {
        Self {
            data: chunks.into_iter(),
            done: false,
        }
    }

    /// A request's body: the chunks alone (a gRPC client half-closes with
    /// its last DATA frame).
    pub fn request(chunks: Vec<bytes::Bytes>) -> Self {
        Self {
            data: chunks.into_iter(),
            done: true,
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
        self.done && self.data.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Frame;
    use http_body_util::{BodyExt, StreamBody};
    use prost::Message;

    type Frames = Vec<Result<Frame<Bytes>, Status>>;
    type Answer = http::Response<
        StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Status>>>>,
    >;

    /// An answer as a ps sends it: each chunk its own DATA frame, then
    /// `trailers`.
    fn res(chunks: Vec<Bytes>, trailers: Option<http::HeaderMap>) -> Answer {
        let mut frames: Frames = chunks.into_iter().map(|c| Ok(Frame::data(c))).collect();
        frames.extend(trailers.map(|t| Ok(Frame::trailers(t))));
        http::Response::new(StreamBody::new(futures::stream::iter(frames)))
    }

    fn ok() -> Option<http::HeaderMap> {
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", http::HeaderValue::from_static("0"));
        Some(t)
    }

    fn push_answer() -> pb::PushResponse {
        pb::PushResponse {
            variables: vec![pb::Tensor {
                name: "w".into(),
                shape: vec![3],
                dtype: pb::DataType::F32 as i32,
                data: Bytes::from(vec![7u8; 12]),
            }],
            global_step: 42,
            ..Default::default()
        }
    }

    async fn decode<B>(res: http::Response<B>, limit: usize) -> Result<pb::PushResponse, Status>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        answer(res, limit).await
    }

    #[tokio::test]
    async fn the_ps_s_chunked_answer_decodes_in_place() {
        let (chunks, len) = chunked(push_answer());
        let data = chunks.iter().find(|c| c[..] == [7u8; 12]).unwrap().clone();
        let got = decode(res(chunks, ok()), len).await.unwrap();
        assert_eq!(got, push_answer());
        // The tensor's bytes are its frame's, not a copy.
        assert_eq!(got.variables[0].data.as_ptr(), data.as_ptr());
    }

    #[tokio::test]
    async fn a_request_is_the_message_in_chunks_and_ends_without_trailers() {
        let req = pb::PushRequest {
            gradients: push_answer().variables,
            learning_rate: 0.5,
            step: 9,
            pull: true,
            ..Default::default()
        };
        let (chunks, len) = chunked(req.clone());
        let body = Chunks::request(chunks).collect().await.unwrap();
        assert!(body.trailers().is_none());
        let all = body.to_bytes();
        assert_eq!((all[0], &all[1..5]), (0, &(len as u32).to_be_bytes()[..]));
        assert_eq!(all.len(), 5 + len);
        assert_eq!(pb::PushRequest::decode(all.slice(5..)).unwrap(), req);
        let (chunks, _) = chunked(pb::PullRequest::default());
        let body = Chunks::request(chunks).collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], &[0, 0, 0, 0, 0]);
    }

    #[tokio::test]
    async fn a_hostile_or_broken_answer_is_a_clear_status_with_tonic_s_code() {
        let (chunks, len) = chunked(push_answer());
        // Larger than the limit; an endless one is cut off too.
        let e = decode(res(chunks.clone(), ok()), len - 1)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
        let endless = futures::stream::repeat_with(|| {
            Ok::<_, Status>(Frame::data(Bytes::from_static(&[0; 1024])))
        });
        let e = decode(http::Response::new(StreamBody::new(endless)), 1 << 20)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
        // No grpc-status at the end (a stream reset without an error):
        // UNKNOWN, as tonic says, which a worker retries.
        let e = decode(res(chunks.clone(), None), len).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unknown, "{e}");
        // A failure in the trailers is the call's status.
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", http::HeaderValue::from_static("9"));
        t.insert("grpc-message", http::HeaderValue::from_static("pull again"));
        let e = decode(res(chunks.clone(), Some(t)), len).await.unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (tonic::Code::FailedPrecondition, "pull again")
        );
        // Trailers-only: the status in the headers.
        let mut r = res(vec![], None);
        r.headers_mut()
            .insert("grpc-status", http::HeaderValue::from_static("16"));
        let e = decode(r, len).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
        // Cut short, padded, compressed, not protobuf.
        let all: Bytes = chunks.concat().into();
        let cut = decode(res(vec![all.slice(..all.len() - 1)], ok()), len).await;
        assert_eq!(cut.unwrap_err().code(), tonic::Code::Internal);
        let padded = decode(
            res(vec![all.clone(), Bytes::from_static(b"x")], ok()),
            len + 1,
        )
        .await;
        assert_eq!(padded.unwrap_err().code(), tonic::Code::Internal);
        let mut zipped = all.to_vec();
        zipped[0] = 1;
        let zipped = decode(res(vec![zipped.into()], ok()), len).await;
        assert_eq!(zipped.unwrap_err().code(), tonic::Code::Internal);
        let garbage = Bytes::from_static(&[0, 0, 0, 0, 3, 0xff, 0xff, 0xff]);
        let e = decode(res(vec![garbage], ok()), len).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        // Not gRPC at all: tonic's mapping of the HTTP status.
        for (http, code) in [
            (http::StatusCode::BAD_GATEWAY, tonic::Code::Unavailable),
            (http::StatusCode::UNAUTHORIZED, tonic::Code::Unauthenticated),
            (http::StatusCode::NOT_FOUND, tonic::Code::Unimplemented),
            (http::StatusCode::IM_A_TEAPOT, tonic::Code::Unknown),
        ] {
            let mut r = res(vec![], None);
            *r.status_mut() = http;
            assert_eq!(decode(r, len).await.unwrap_err().code(), code, "{http}");
        }
    }
}
