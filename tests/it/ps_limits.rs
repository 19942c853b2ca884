//! A ps under hostile load keeps serving its workers, and refuses what would
//! break it (issue 15): connection and call limits, refused updates that
//! would make the shard non-finite, bounded and correctly coded errors.

use crate::util::*;
use dtf::config::Mode;
use dtf::ps::limits;
use dtf::transport::pb;
use dtf::transport::proto as rpc;
use ndarray::ArrayD;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

fn push(values: &[(String, ArrayD<f32>)], g: f32, learning_rate: f32) -> pb::PushRequest {
    pb::PushRequest {
        gradients: values
            .iter()
            .map(|(n, a)| rpc::encode(n, &ArrayD::from_elem(a.shape(), g)))
            .collect(),
        learning_rate,
        step: 7,
        worker: 0,
        pull: true,
        incarnation: 0,
        loss: 1.0,
        ..Default::default()
    }
}

/// Reads until the ps closes the connection; false past `deadline`.
async fn closed_by_peer(mut s: tokio::net::TcpStream, deadline: Instant) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline.into(), s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_cannot_starve_authenticated_calls_and_are_closed() {
    // The ps inherits this process's limit (raised to the hard one), as
    // under `dtf local`; a fresh shell's 1024 must do.
    let nofile = dtf::files::raise_nofile_limit();
    let (c, _, _) = live_ps(Mode::Async).await;
    let addr = c.cfg.cluster.ps[0].clone();
    // More than the cap: before the limits, the ps ran out of descriptors.
    // As many as this process's own descriptors allow, beside its others.
    let cap = limits::cap_for(nofile);
    let n = (cap + 100).min(nofile as usize - 64);
    assert!(
        n > cap,
        "{nofile} descriptors leave no room to flood a cap of {cap}"
    );
    let mut idle = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        idle.push(s);
    }
    let opened = Instant::now();
    // A worker connecting now is served at once.
    let state = tokio::time::timeout(Duration::from_secs(5), async {
        let mut ps = c.client(0, Some(TOKEN)).await;
        ps.state(pb::StateRequest {}).await
    })
    .await
    .expect("State within its deadline")
    .expect("State succeeds");
    assert!(state.into_inner().initialized);
    // Every idle connection is closed: the oldest to make room, the rest
    // when they have idled too long.
    let deadline = opened + limits::UNAUTHENTICATED_IDLE + Duration::from_secs(10);
    let closed = futures::future::join_all(idle.into_iter().map(|s| closed_by_peer(s, deadline)));
    let closed = closed.await;
    let open = closed.iter().filter(|c| !**c).count();
    assert_eq!(open, 0, "{open} of {n} idle connections still open");
    // And the ps still serves.
    let mut ps = c.client(0, Some(TOKEN)).await;
    ps.state(pb::StateRequest {}).await.expect("State after");
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_pulls_beyond_the_limits_get_resource_exhausted() {
    let (mut c, mut ps, _) = live_ps(Mode::Async).await;
    // Pulls that wait (a second) for a step that never comes hold their
    // response bytes all that time: far more than the budget at once.
    let n = 4 * limits::RESPONSE_BUDGET;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(c.client(0, Some(TOKEN)).await);
    }
    let calls = (0..n).map(|i| {
        let mut client = clients[i % clients.len()].clone();
        async move {
            client
                .pull(pb::PullRequest {
                    min_step: 1_000_000,
                    ..Default::default()
                })
                .await
        }
    });
    let results = futures::future::join_all(calls).await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    for e in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("ps busy"), "{e:?}");
    }
    assert!(ok >= 1, "no pull was served");
    assert!(
        ok <= limits::RESPONSE_BUDGET,
        "{ok} pulls served at once, more than the budget"
    );
    // The ps is up and serves, and said whom it refused.
    ps.pull(pb::PullRequest::default())
        .await
        .expect("a pull after");
    ps.state(pb::StateRequest {}).await.expect("State after");
    // Which limit refuses first (calls in progress or snapshots in flight)
    // depends on timing, and the log says the reason once per peer per 10 s:
    // wait for the refusal, whichever it was.
    let log = c.wait_log(
        "ps:0",
        "Refused. peer=127.0.0.1:",
        1,
        Duration::from_secs(5),
    );
    assert!(
        log.contains("calls already in progress") || log.contains("in flight"),
        "the refusal names the limit:\n{log}"
    );
    assert!(c.child("ps:0").try_wait().unwrap().is_none(), "ps exited");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_token_is_logged_with_the_peer_once_per_interval() {
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    c.start("ps", 0);
    let mut bad = c.client(0, Some("wrong")).await;
    for _ in 0..5 {
        let e = bad.state(pb::StateRequest {}).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated);
    }
    let log = c.wait_log("ps:0", "wrong cluster token", 1, Duration::from_secs(5));
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("Refused")).collect();
    assert_eq!(lines.len(), 1, "rate-limited to one line:\n{log}");
    assert!(lines[0].contains("peer=127.0.0.1:"), "{}", lines[0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_overflowing_learning_rate_is_refused_and_changes_nothing() {
    let (_c, mut ps, values) = live_ps(Mode::Async).await;
    let before = snapshot(&mut ps).await;
    // Finite, but 3e38 × 4 overflows every weight to -inf.
    let err = ps.push(push(&values, 4.0, 3e38)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    for needle in [
        "learning rate 3e38",
        "overflows layer1/weights",
        "unchanged",
    ] {
        assert!(err.message().contains(needle), "{:?}", err.message());
    }
    for lr in [0.0, -0.1, f32::NAN, f32::INFINITY] {
        let err = ps.push(push(&values, 4.0, lr)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "lr {lr}: {err:?}");
        assert!(err.message().contains("learning rate"), "{err:?}");
    }
    // Bit for bit: values, shadows and step.
    assert!(
        snapshot(&mut ps).await == before,
        "a refused push changed the shard"
    );
    let ok = ps.push(push(&values, 4.0, 0.1)).await.unwrap().into_inner();
    assert_eq!(ok.global_step, 8);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_step_a_checkpoint_cannot_hold_is_refused() {
    let (_c, mut ps, values) = live_ps(Mode::Async).await;
    let err = ps
        .initialize(pb::InitializeRequest {
            variables: values.iter().map(|(n, a)| rpc::encode(n, a)).collect(),
            shadows: vec![],
            global_step: u64::MAX,
            force: true,
            slots: vec![],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("global step"), "{err:?}");
    assert_eq!(snapshot(&mut ps).await.0, 7);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_about_a_huge_shape_stays_readable() {
    let (_c, mut ps, values) = live_ps(Mode::Async).await;
    let mut req = push(&values, 0.5, 0.1);
    // One element, 100,000 dimensions: echoed whole, the message would
    // not fit in a header.
    req.gradients[0].shape = vec![1; 100_000];
    req.gradients[0].data = req.gradients[0].data.slice(..4);
    let err = ps.push(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().len() <= rpc::MAX_STATUS_MESSAGE, "{err:?}");
    assert!(err.message().contains("100000 dims"), "{err:?}");
}

/// Sends whatever bytes it is given as the request message.
#[derive(Default)]
struct Raw;

struct RawEncoder;
struct RawDecoder;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = ();
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawDecoder {
    type Item = ();
    type Error = tonic::Status;
    fn decode(&mut self, _: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        Ok(Some(()))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_does_not_parse_is_invalid_argument() {
    let (c, _, _) = live_ps(Mode::Async).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", c.cfg.cluster.ps[0]))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(vec![0xff; 16]);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/dtf.v1.ParameterServer/Push");
    let err = grpc.unary(req, path, Raw).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("malformed"), "{err:?}");
}
