//! The shared-memory transport's own guarantees: who may use it, and that a
//! broken peer ends only its own connection. (The fault, sync and auth
//! tests run on both transports: `on_each_transport!`.)

use crate::util::*;
use dtf::config::Mode;
use dtf::transport::{self, Via, shm};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;
use tonic::Code;

/// Starts ps 0 of a one-ps cluster and waits for its socket.
fn ps_socket() -> (Cluster, PathBuf) {
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    c.start("ps", 0);
    let port: u16 = c.cfg.cluster.ps[0]
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let path = transport::socket_path(
        std::path::Path::new(&c.cfg.cluster.runtime_dir),
        port,
        &c.cfg.cluster.ps,
        0,
    );
    until(Duration::from_secs(10), "the ps's socket", || {
        path.exists().then_some(())
    });
    (c, path)
}

/// The ps's `shm_connections`, asked over TCP.
async fn shm_connections(c: &Cluster) -> u32 {
    let mut ps = c.client(0, Some(TOKEN)).await;
    ps.state(dtf::transport::pb::StateRequest {})
        .await
        .unwrap()
        .into_inner()
        .shm_connections
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cluster_token_is_required_on_shared_memory_too() {
    let (c, _) = ps_socket();
    let wrong = ps_client(&c, "not-the-token");
    let err = wrong.states().await.unwrap_err();
    // Refused on the socket, the client tries TCP, which refuses it too.
    assert_eq!(err.status.code(), Code::Unauthenticated, "{err}");
    assert_eq!(wrong.transports(), vec![Via::Tcp]);
    c.wait_log("ps:0", "shared memory", 1, Duration::from_secs(10));
    let log = c.log("ps:0");
    assert!(log.contains("wrong cluster token"), "{log}");
    assert_eq!(shm_connections(&c).await, 0);

    let right = ps_client(&c, TOKEN);
    let states = right.states().await.unwrap();
    assert_eq!(states[0].shm_connections, 1);
    assert_eq!(right.transports(), vec![Via::Shm]);
    // dtf status says so, per ps.
    let out = c.dtf(&["status", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ps = &json["tasks"][0];
    assert_eq!(ps["transport"], "shm", "{json}");
    assert!(ps["shm_connections"].as_u64().unwrap() >= 1, "{json}");
}

#[tokio::test(flavor = "multi_thread")]
async fn another_user_is_refused_even_with_the_token() {
    use std::os::unix::fs::PermissionsExt;
    let (c, path) = ps_socket();
    // Open the door as far as the file system goes, so that only the ps's
    // credential check stands between `nobody` and the shard.
    let open = |p: &std::path::Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    open(path.parent().unwrap(), 0o755);
    open(&path, 0o666);
    let home = tempfile::tempdir().unwrap();
    open(home.path(), 0o755);
    let token = home.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    open(&token, 0o600);
    std::os::unix::fs::chown(&token, Some(65534), Some(65534)).unwrap();
    let mut cfg = c.cfg.clone();
    cfg.security.token_file = token;
    let config = home.path().join("dtf.toml");
    std::fs::write(&config, cfg.to_toml()).unwrap();
    open(&config, 0o644);
    let out = output_within(
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(bin("dtf"))
            .args(["status", "--json", "--config"])
            .arg(&config),
        Duration::from_secs(60),
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    // It still reaches the ps, over TCP with the token, never its memory.
    assert_eq!(json["tasks"][0]["transport"], "tcp", "{json}");
    assert_eq!(json["tasks"][0]["reachable"], true, "{json}");
    let log = c.wait_log("ps:0", "uid 65534", 1, Duration::from_secs(10));
    assert!(log.contains("not the ps's user"), "{log}");
    assert_eq!(shm_connections(&c).await, 0);
}

/// A raw connection past the handshake (this test runs as the ps's user).
fn authenticated(path: &std::path::Path) -> UnixStream {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let bearer = format!("Bearer {TOKEN}");
    let mut hello = ((bearer.len() + 1) as u32).to_le_bytes().to_vec();
    hello.push(shm::kind::HELLO);
    hello.extend_from_slice(bearer.as_bytes());
    s.write_all(&hello).unwrap();
    let mut head = [0u8; 5];
    s.read_exact(&mut head).unwrap();
    assert_eq!(head[4], shm::kind::OK);
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn a_truncated_or_oversized_frame_ends_only_that_connection() {
    let (c, path) = ps_socket();
    let good = ps_client(&c, TOKEN);
    good.states().await.unwrap();
    assert_eq!(good.transports(), vec![Via::Shm]);

    // A push frame that promises 1000 bytes and stops after 3.
    let mut s = authenticated(&path);
    s.write_all(&[0xe8, 0x03, 0, 0, shm::kind::PUSH, 1, 2, 3])
        .unwrap();
    drop(s);
    // A frame far over the model's message limit: refused before any allocation.
    let mut s = authenticated(&path);
    s.write_all(&[0xff, 0xff, 0xff, 0x7f, shm::kind::PUSH])
        .unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    c.wait_log(
        "ps:0",
        "Shared-memory connection dropped.",
        1,
        Duration::from_secs(10),
    );
    // A client that says nothing at all is dropped after the hello deadline;
    // meanwhile the others are served.
    let _silent = UnixStream::connect(&path).unwrap();

    // The ps, and the good connection, carry on; the broken ones are closed
    // (the truncated one when the ps reads its end, which may come later).
    eventually(
        Duration::from_secs(10),
        "the broken connections closed",
        || async {
            let states = good.states().await.unwrap();
            (states[0].shm_connections == 1).then_some(())
        },
    )
    .await;
    assert_eq!(good.transports(), vec![Via::Shm]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_abandoned_halfway_leaves_no_answer_for_the_next() {
    // A step is abandoned when one ps fails: the calls to the others are
    // dropped with their request sent and their answer unread.
    let (c, _) = ps_socket();
    let mut client = ps_client(&c, TOKEN);
    let values = dtf::model::Mlp::new(&c.cfg.model.layers)
        .unwrap()
        .init(c.cfg.train.seed);
    client
        .initialize(&[0], &values, None, None, &[], 5, false, 1)
        .await
        .unwrap();
    assert_eq!(client.transports(), vec![Via::Shm]);
    let mut params = values.clone();
    // The ps holds a pull for a step it has not reached (up to a second);
    // the caller gives up first.
    let waiting = client.pull(&mut params, Some(&[1_000]));
    assert!(
        tokio::time::timeout(Duration::from_millis(200), waiting)
            .await
            .is_err(),
        "the pull for step 1000 answered at once"
    );
    // The next calls get their own answers, on shared memory again.
    let states = client.states().await.unwrap();
    assert_eq!(states[0].global_step, 5);
    let progress = client.pull(&mut params, None).await.unwrap();
    assert_eq!(progress.global_step(), 5);
    assert_eq!(params, values);
    assert_eq!(client.transports(), vec![Via::Shm]);
}

/// The worker's step on shared memory (`transport::Cluster::step`) reads the
/// values in the region and writes its gradient straight into it: the same
/// loss and gradient as the copying path from the same values, applied by
/// the ps. A region replaced by a ps restart is never computed from: the
/// step stops before `compute` and asks for a pull, and training goes on.
#[tokio::test(flavor = "multi_thread")]
async fn an_in_place_step_matches_the_copying_path_and_survives_a_new_region() {
    use dtf::model::Mlp;
    use ndarray::{Array2, ArrayD};
    let (mut c, path) = ps_socket();
    let mlp = Mlp::new(&c.cfg.model.layers).unwrap();
    let values = mlp.init(c.cfg.train.seed);
    let x = Array2::from_shape_fn((4, mlp.inputs()), |(i, j)| ((i * 7 + j) % 5) as f32 / 5.0);
    let y: Vec<u8> = (0..4).map(|i| (i % mlp.classes()) as u8).collect();
    let (want_loss, want_grads) = mlp.loss_and_grads(&values, x.view(), &y, 0.0);

    let mut w = ps_client(&c, TOKEN);
    w.values_in_place();
    let zeros: Vec<ArrayD<f32>> = values.iter().map(|v| ArrayD::zeros(v.shape())).collect();
    let (mut params, mut grads) = (zeros.clone(), zeros.clone());
    macro_rules! step {
        ($tags:expr) => {
            in_place_step(&mut w, &mlp, x.view(), &y, &mut params, &mut grads, $tags).await
        };
    }
    assert_eq!(
        w.initialize(&[0], &values, None, None, &[], 0, false, 1)
            .await
            .unwrap(),
        vec![0]
    );
    // Nothing pulled in place yet: nothing is computed.
    let (loss, r, seen) = step!(&[0]);
    assert!(loss.is_none() && seen.is_none());
    assert!(r.unwrap_err().needs_pull());
    let p = w.pull(&mut params, None).await.unwrap();
    assert_eq!(w.transports(), vec![Via::Shm]);
    assert_eq!(
        params, zeros,
        "an in-place pull copies nothing into the caller's arrays"
    );

    let (loss, r, seen) = step!(&p.steps);
    let (saw, wrote) = seen.unwrap();
    assert_eq!(saw, values, "the step computes from the values the ps left");
    assert_eq!(
        wrote, want_grads,
        "the gradient in the region is the copying path's"
    );
    assert_eq!(loss, Some(want_loss));
    assert_eq!(r.unwrap().global_step(), 1);
    assert_eq!(
        (&params, &grads),
        (&zeros, &zeros),
        "nothing copied on shared memory"
    );
    // The ps applied that gradient (SGD): a copying client sees values − lr · g.
    let mut copy = ps_client(&c, TOKEN);
    let mut got = zeros.clone();
    copy.pull(&mut got, None).await.unwrap();
    for ((g, v), d) in got.iter().zip(&values).zip(&want_grads) {
        let want = v - &(d * LR);
        assert!(
            g.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-6),
            "{g} vs {want}"
        );
    }
    // The next step starts from exactly those values, in place.
    let (_, r, seen) = step!(&[1]);
    assert_eq!(seen.unwrap().0, got);
    assert_eq!(r.unwrap().global_step(), 2);

    // A ps restart: the old connection fails the step's push (no crash), the
    // next connection brings a new region, which is never computed from
    // before an in-place pull fills it.
    c.kill("ps:0");
    std::fs::remove_file(&path).ok();
    // Without its snapshots: the new ps waits to be initialized.
    std::fs::remove_dir_all(c.dir.path().join("state")).ok();
    c.start("ps", 0);
    until(Duration::from_secs(10), "the restarted ps's socket", || {
        path.exists().then_some(())
    });
    let (_, r, _) = step!(&[2]);
    let e = r.unwrap_err();
    assert!(e.is_unavailable() || e.needs_pull(), "{e}");
    eventually(
        Duration::from_secs(10),
        "the restarted ps to take the values",
        || async {
            w.initialize(&[0], &values, None, None, &[], 0, false, 1)
                .await
                .ok()
        },
    )
    .await;
    let (loss, r, seen) = step!(&[0]);
    assert!(
        loss.is_none() && seen.is_none(),
        "computed from a new region"
    );
    assert!(r.unwrap_err().needs_pull());
    let p = w.pull(&mut params, None).await.unwrap();
    assert_eq!(w.transports(), vec![Via::Shm]);
    let (loss, r, seen) = step!(&p.steps);
    assert_eq!(seen.unwrap().0, values);
    assert_eq!(loss, Some(want_loss));
    assert_eq!(r.unwrap().global_step(), 1);

    // A snapshot (a checkpoint's) writes newer values into the region: the
    // next step pulls before it computes, so its tags describe its values.
    w.snapshot().await.unwrap();
    let (loss, r, _) = step!(&[1]);
    assert!(loss.is_none() && r.unwrap_err().needs_pull());
}

const LR: f32 = 0.1;

/// The values a step saw and the gradients it wrote, copied out.
type Seen = (Vec<ndarray::ArrayD<f32>>, Vec<ndarray::ArrayD<f32>>);

/// One `Cluster::step` of `mlp` on batch (`x`, `y`): its loss, its
/// progress, and what it saw and wrote (`None`: nothing computed).
async fn in_place_step(
    w: &mut transport::Cluster,
    mlp: &dtf::model::Mlp,
    x: ndarray::ArrayView2<'_, f32>,
    y: &[u8],
    params: &mut [ndarray::ArrayD<f32>],
    grads: &mut [ndarray::ArrayD<f32>],
    tags: &[u64],
) -> (
    Option<f32>,
    Result<transport::Progress, transport::PsCallError>,
    Option<Seen>,
) {
    let mut seen = None;
    let (loss, r) = w
        .step(
            params,
            grads,
            |pv, gv| {
                let mut ws = dtf::model::Workspace::default();
                let l = mlp.loss_and_grads_into(pv, x, y, 0.0, &mut ws, gv);
                seen = Some((
                    pv.iter().map(|v| v.to_owned()).collect(),
                    gv.iter().map(|g| g.to_owned()).collect(),
                ));
                l
            },
            LR,
            tags,
            0,
        )
        .await;
    (loss, r, seen)
}

/// Issue 25: two clusters on one host, same token, ps at 127.0.0.1:P and
/// 127.0.0.2:P, one runtime directory. Their sockets were both
/// `ps-P.sock`: the ps started last took the name, and the other
/// cluster's chief trained it. Now each client reaches its own cluster's ps.
#[tokio::test(flavor = "multi_thread")]
async fn two_clusters_with_the_same_port_on_one_host_never_share_a_ps() {
    let mut a = Cluster::new(1, 1, 100, Mode::Async);
    let mut b = Cluster::new(1, 1, 100, Mode::Async);
    let port = a.cfg.cluster.ps[0].rsplit(':').next().unwrap().to_owned();
    b.cfg.cluster.ps = vec![format!("127.0.0.2:{port}")];
    b.cfg.cluster.runtime_dir = a.cfg.cluster.runtime_dir.clone();
    b.write_config();
    a.start("ps", 0);
    let dir = std::path::Path::new(&a.cfg.cluster.runtime_dir).to_owned();
    let sockets = |n: usize| {
        until(Duration::from_secs(10), "the ps sockets", || {
            let found = std::fs::read_dir(&dir).map_or(0, |d| d.count());
            (found >= n).then_some(())
        })
    };
    sockets(1);
    b.start("ps", 0);
    sockets(2);
    // Cluster B's ps is up (over TCP) before A's client connects.
    b.client(0, Some(TOKEN)).await;
    let client = ps_client(&a, TOKEN);
    let states = client.states().await.unwrap();
    assert_eq!(client.transports(), vec![Via::Shm]);
    assert_eq!(
        states[0].cluster,
        transport::cluster_id(&a.cfg.cluster.ps),
        "A's client reached another cluster's ps"
    );
    // Over TCP: A's ps has the shared-memory connection, B's none.
    assert_eq!(shm_connections(&a).await, 1);
    assert_eq!(shm_connections(&b).await, 0);
}

/// Issue 25: a runtime directory others may write was used without a word.
/// Now the ps names its owner and mode, makes no socket there, and serves
/// TCP, which the worker uses.
#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_dir_others_can_write_is_refused_naming_owner_and_mode() {
    use std::os::unix::fs::PermissionsExt;
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    let dir = std::path::PathBuf::from(&c.cfg.cluster.runtime_dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    c.start("ps", 0);
    let log = c.wait_log("ps:0", "runtime directory", 1, Duration::from_secs(10));
    assert!(log.contains("with mode 0777"), "{log}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let client = ps_client(&c, TOKEN);
    client.states().await.unwrap();
    assert_eq!(client.transports(), vec![Via::Tcp]);
}
