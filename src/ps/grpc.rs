//! The ps's gRPC service: each call decoded, handed to the
//! transport-independent functions of [`PsService`], and its answer
//! encoded; `Push` and `Pull` answers leave as chunks ([`Direct`]).

use super::{PsService, admission, conn, limits};
use crate::auth::Credentials;
use crate::transport::call::{
    Complete, Cut, Initialize, Push, PushRows, TableRows, TableState, TensorView,
};
use crate::transport::pb;
use crate::transport::pb::parameter_server_server::{ParameterServer, ParameterServerServer};
use crate::transport::{proto as rpc, tcp};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::{Request, Response, Status};

impl PsService {
    /// `Pull` over gRPC: the answer with its tensors, and the response bytes
    /// it reserved (held until the answer is sent).
    async fn pull_answer(
        &self,
        req: Request<pb::PullRequest>,
    ) -> Result<(pb::PullResponse, limits::Reserved), Status> {
        let snapshots = {
            let r = req.get_ref();
            1 + u32::from(r.with_shadows) + u32::from(r.with_slots) * self.inner.edge.slots_per_var
        };
        let wire = &self.inner.edge.wire;
        wire.agree(req.metadata())?;
        let reserved = self.reserve(&req, snapshots)?;
        let req = req.into_inner();
        let ((variables, shadows, slots), answer) = self
            .pull_with(req.min_step, |s| {
                self.read(s, &req.names, req.with_shadows, req.with_slots)
            })
            .await?;
        // Out of the lock: the copies become the wire's tensors (moved, not
        // copied). A snapshot (a checkpoint's) is always exact.
        let variables = wire.pulled(rpc::to_pb(variables), req.with_shadows || req.with_slots);
        let answer = answer.into_pb((variables, rpc::to_pb(shadows), rpc::to_pb(slots)));
        Ok((answer, reserved))
    }

    /// `Push` over gRPC: the answer (with the values when the push pulls),
    /// and the response bytes it reserved.
    async fn push_answer(
        &self,
        req: Request<pb::PushRequest>,
    ) -> Result<(pb::PushResponse, Option<limits::Reserved>), Status> {
        let wire = &self.inner.edge.wire;
        wire.agree(req.metadata())?;
        // Reserved before anything is applied: a refused push changes nothing.
        let reserved = if req.get_ref().pull {
            Some(self.reserve(&req, 1)?)
        } else {
            None
        };
        let peer = conn::peer(req.extensions());
        let req = req.into_inner();
        // Compressed gradients are decoded to f32 here, at the edge; exact
        // ones are applied straight from the request's bytes.
        let decoded = wire.gradients(&req.gradients)?;
        let grads = match &decoded {
            None => req
                .gradients
                .iter()
                .map(rpc::view)
                .collect::<Result<Vec<_>, _>>()?,
            Some(values) => req
                .gradients
                .iter()
                .zip(values)
                .map(|(t, v)| TensorView {
                    name: &t.name,
                    shape: t.shape.iter().map(|&d| d as usize).collect(),
                    data: bytemuck::cast_slice(v),
                })
                .collect(),
        };
        let (variables, answer) = self
            .push_with(
                &Push::from(&req),
                &grads,
                |why| {
                    self.inner.edge.refusals.refused(peer, why);
                },
                |s| Ok(self.read(s, &[], false, false)?.0),
            )
            .await?;
        let (variables, replica) = match variables {
            Some(v) => wire.answer(req.worker, req.replica, rpc::to_pb(v)),
            None => (Vec::new(), 0),
        };
        Ok((answer.into_pb(variables, replica), reserved))
    }
}

/// The gRPC server of `service`: health, and the ps's service behind the
/// token check ([`limits::Guard`]) and the call bounds
/// ([`limits::Admission`]), with HTTP/2 sized for messages of `limit`
/// bytes. The caller serves it on its listener.
pub(super) async fn router(
    service: &PsService,
    credentials: &Credentials,
    limit: usize,
) -> tonic::transport::server::Router {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ParameterServerServer<PsService>>()
        .await;
    let svc = ParameterServerServer::new(service.clone())
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
    let refusals = service.inner.edge.refusals.clone();
    // The token is checked first: a call without it never takes a place.
    let svc = Direct::new(service.clone(), svc, limit);
    let svc = tonic::service::interceptor::InterceptedService::new(
        admission::Admission::new(svc, refusals.clone()),
        conn::Guard::new(credentials.check_token(), refusals),
    );
    credentials
        .server()
        .http2_keepalive_interval(Some(limits::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(limits::KEEPALIVE_TIMEOUT))
        .initial_stream_window_size(tcp::window(limit))
        .initial_connection_window_size(tcp::window(limit))
        .max_frame_size(tcp::frame(limit))
        .add_service(health)
        .add_service(svc)
}

/// The gRPC service: each call decoded, handed to the transport-independent
/// function above, and its answer encoded.
#[tonic::async_trait]
impl ParameterServer for PsService {
    async fn state(
        &self,
        _: Request<pb::StateRequest>,
    ) -> Result<Response<pb::StateResponse>, Status> {
        Ok(Response::new(self.state_now().into()))
    }

    async fn initialize(
        &self,
        req: Request<pb::InitializeRequest>,
    ) -> Result<Response<pb::InitializeResponse>, Status> {
        let req = req.into_inner();
        let answer = self.initialize_from(Initialize::try_from(&req)?)?;
        Ok(Response::new(answer.into()))
    }

    async fn pull(
        &self,
        req: Request<pb::PullRequest>,
    ) -> Result<Response<pb::PullResponse>, Status> {
        let (answer, reserved) = self.pull_answer(req).await?;
        let mut res = Response::new(answer);
        res.extensions_mut().insert(reserved);
        Ok(res)
    }

    async fn push(
        &self,
        req: Request<pb::PushRequest>,
    ) -> Result<Response<pb::PushResponse>, Status> {
        let (answer, reserved) = self.push_answer(req).await?;
        let mut res = Response::new(answer);
        if let Some(r) = reserved {
            res.extensions_mut().insert(r);
        }
        Ok(res)
    }

    async fn complete(
        &self,
        req: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        self.complete_run(Complete::from(req.get_ref()))?;
        Ok(Response::new(pb::CompleteResponse {}))
    }

    async fn replicate(
        &self,
        req: Request<pb::ReplicateRequest>,
    ) -> Result<Response<pb::ReplicateResponse>, Status> {
        let req = req.into_inner();
        let incarnation = self.keep_copy(req.task, req.snapshot).await?;
        Ok(Response::new(pb::ReplicateResponse { incarnation }))
    }

    async fn fetch_replica(
        &self,
        req: Request<pb::FetchReplicaRequest>,
    ) -> Result<Response<pb::FetchReplicaResponse>, Status> {
        let copy = self.fetch_copy(req.get_ref().task).await?;
        Ok(Response::new(copy.into()))
    }

    async fn pull_rows(
        &self,
        req: Request<pb::PullRowsRequest>,
    ) -> Result<Response<pb::PullRowsResponse>, Status> {
        Ok(Response::new(self.pull_rows_pb(req.get_ref())?))
    }

    async fn push_rows(
        &self,
        req: Request<pb::PushRowsRequest>,
    ) -> Result<Response<pb::PushRowsResponse>, Status> {
        Ok(Response::new(self.push_rows_pb(req.get_ref())?))
    }

    async fn read_rows(
        &self,
        req: Request<pb::ReadRowsRequest>,
    ) -> Result<Response<pb::ReadRowsResponse>, Status> {
        Ok(Response::new(self.read_rows_pb(req.get_ref())?))
    }

    async fn stage_rows(
        &self,
        req: Request<pb::StageRowsRequest>,
    ) -> Result<Response<pb::StageRowsResponse>, Status> {
        self.stage_rows_pb(req.get_ref())?;
        Ok(Response::new(pb::StageRowsResponse {}))
    }
}

impl PsService {
    /// `PullRows` from and to the wire's types (both transports: a batch's
    /// rows travel in the message on shared memory too).
    pub(super) fn pull_rows_pb(
        &self,
        req: &pb::PullRowsRequest,
    ) -> Result<pb::PullRowsResponse, Status> {
        let tables = req
            .tables
            .iter()
            .map(TableRows::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        let rows = self.pull_rows(&tables, req.shadows)?;
        Ok(pb::PullRowsResponse {
            tables: rows.iter().map(pb::TableRows::from).collect(),
            incarnation: self.inner.incarnation,
        })
    }

    /// `PushRows` from and to the wire's types (both transports).
    pub(super) fn push_rows_pb(
        &self,
        req: &pb::PushRowsRequest,
    ) -> Result<pb::PushRowsResponse, Status> {
        let grads = req
            .gradients
            .iter()
            .map(TableRows::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self.push_rows(PushRows::from(req), &grads)?.into())
    }

    /// `ReadRows` from and to the wire's types (both transports).
    pub(super) fn read_rows_pb(
        &self,
        req: &pb::ReadRowsRequest,
    ) -> Result<pb::ReadRowsResponse, Status> {
        let cut = Cut::of(req.chain, req.base);
        let page = self.read_rows(&req.table, req.start, req.max_rows, cut)?;
        Ok(pb::ReadRowsResponse::from(&page))
    }

    /// `StageRows` from the wire's types (both transports).
    pub(super) fn stage_rows_pb(&self, req: &pb::StageRowsRequest) -> Result<(), Status> {
        let rows = req
            .rows
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("StageRows without rows"))?;
        self.stage_rows(req.token, TableState::try_from(rows)?)
    }
}

/// The generated gRPC server, except that `Push` and `Pull` answers leave
/// as chunks ([`rpc::chunked`]): the snapshot's bytes go to the socket as
/// they are, where tonic's encoder would first copy the whole 1.6 MB message
/// into one buffer (docs/benchmarks.md, "Transports"). Requests are decoded
/// by tonic's own decoder with dtf's codec, so a bad request gets the same
/// status as before; a compressed one (none is accepted) goes to the
/// generated server, which refuses it as it always did.
#[derive(Clone)]
pub(super) struct Direct {
    /// The handlers.
    service: PsService,
    /// Every other call.
    inner: ParameterServerServer<PsService>,
    /// Largest message either way.
    limit: usize,
}

impl tonic::codegen::Service<http::Request<Body>> for Direct {
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        tonic::codegen::Service::<http::Request<Body>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let path = req.uri().path();
        if (path != tcp::PUSH_PATH && path != tcp::PULL_PATH)
            || req.headers().contains_key("grpc-encoding")
        {
            return self.inner.call(req);
        }
        let this = self.clone();
        Box::pin(async move { Ok(this.answer(req).await.unwrap_or_else(Status::into_http)) })
    }
}

impl tonic::server::NamedService for Direct {
    const NAME: &'static str =
        <ParameterServerServer<PsService> as tonic::server::NamedService>::NAME;
}

impl Direct {
    /// `inner` with `service` answering its pushes and pulls.
    pub(super) fn new(
        service: PsService,
        inner: ParameterServerServer<PsService>,
        limit: usize,
    ) -> Self {
        Self {
            service,
            inner,
            limit,
        }
    }

    /// A push's or pull's answer, or the status to send instead.
    async fn answer(&self, req: http::Request<Body>) -> Result<http::Response<Body>, Status> {
        let (chunks, len, reserved) = if req.uri().path() == tcp::PUSH_PATH {
            let req = self.request::<pb::PushRequest>(req).await?;
            let (answer, reserved) = self.service.push_answer(req).await?;
            let (chunks, len) = rpc::chunked(answer);
            (chunks, len, reserved)
        } else {
            let req = self.request::<pb::PullRequest>(req).await?;
            let (answer, reserved) = self.service.pull_answer(req).await?;
            let (chunks, len) = rpc::chunked(answer);
            (chunks, len, Some(reserved))
        };
        tcp::check_encoded(len, self.limit)?;
        let mut res = http::Response::new(Body::new(tcp::Chunks::new(chunks)));
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        if let Some(r) = reserved {
            res.extensions_mut().insert(r);
        }
        Ok(res)
    }

    /// The call's message, decoded as tonic's unary server does.
    async fn request<T>(&self, req: http::Request<Body>) -> Result<Request<T>, Status>
    where
        T: prost::Message + Default + Send + 'static,
    {
        let (parts, body) = req.into_parts();
        let decoder = tonic::codec::Codec::decoder(&mut rpc::Codec::<T, T>::default());
        let mut stream =
            tonic::codec::Streaming::new_request(decoder, body, None, Some(self.limit));
        let message = stream
            .message()
            .await?
            .ok_or_else(|| Status::internal("Missing request message."))?;
        // Read to the end as tonic does (a broken body is an error); no
        // handler reads request trailers, so they are not kept.
        stream.trailers().await?;
        Ok(Request::from_http(http::Request::from_parts(
            parts, message,
        )))
    }
}
