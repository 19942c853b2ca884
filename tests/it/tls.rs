//! Mutual TLS (`[security] tls_cert`, `tls_key`, `tls_ca`): a cluster trains
//! over it and `dtf status` reads it; a ps with TLS answers no plaintext
//! client and no client without a certificate from the cluster's CA, and a
//! client that does not trust the CA refuses the ps. Bad TLS files exit 78
//! naming the key. The ps logs every failed handshake with the peer and why,
//! and a client that never handshakes holds up no one.

use crate::config_errors::{assert_config_error, ps, worker_check};
use crate::util::*;
use dtf::auth::AddToken;
use dtf::config::Mode;
use dtf::transport::pb;
use dtf::transport::pb::parameter_server_client::ParameterServerClient;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use std::ffi::OsStr;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A certificate authority of its own.
fn authority(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// PEM files of a host certificate for 127.0.0.1, localhost and the
/// first hosts of `crate::hosts` that `ca` signed: `(cert, key)` in `dir`,
/// the key readable by its owner only.
fn host_files(ca: &CertifiedIssuer<'_, KeyPair>, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().unwrap();
    let mut names = vec!["127.0.0.1".to_string(), "localhost".into()];
    names.extend((0..8).map(crate::hosts::address));
    let params = CertificateParams::new(names).unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    let (cert_path, key_path) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (cert_path, key_path)
}

/// Turns TLS on for `c` with a new CA; returns it.
pub fn enable_tls(c: &mut Cluster) -> CertifiedIssuer<'static, KeyPair> {
    let ca = authority("dtf test CA");
    let dir = c.dir.path().join("tls");
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = host_files(&ca, &dir, "host");
    let ca_path = dir.join("ca.crt");
    std::fs::write(&ca_path, ca.pem()).unwrap();
    c.cfg.security.tls_cert = Some(cert);
    c.cfg.security.tls_key = Some(key);
    c.cfg.security.tls_ca = Some(ca_path);
    c.write_config();
    ca
}

/// A ps of `c` serving mutual TLS: its CA, a member's certificate and key,
/// its address.
struct TlsPs {
    ca: CertifiedIssuer<'static, KeyPair>,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    addr: String,
}

/// Starts ps 0 of `c` with TLS on and waits until a member's call is
/// answered (that first answer is returned with it).
async fn start_tls_ps(c: &mut Cluster) -> (TlsPs, pb::StateResponse) {
    let ca = enable_tls(c);
    let (cert, key) = (
        c.cfg.security.tls_cert.clone().unwrap(),
        c.cfg.security.tls_key.clone().unwrap(),
    );
    let addr = c.cfg.cluster.ps[0].clone();
    c.start("ps", 0);
    let first = eventually(Duration::from_secs(20), "the ps over TLS", || async {
        tls_client(&addr, &ca, Some((&cert, &key)), TOKEN)
            .await
            .ok()
    })
    .await;
    (
        TlsPs {
            ca,
            cert,
            key,
            addr,
        },
        first,
    )
}

/// A client of `addr` over TLS trusting `trust`, presenting `identity`, with the cluster token.
async fn tls_client(
    addr: &str,
    trust: &CertifiedIssuer<'_, KeyPair>,
    identity: Option<(&Path, &Path)>,
    token: &str,
) -> Result<pb::StateResponse, tonic::Status> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(trust.pem()));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(cert).unwrap(),
            std::fs::read(key).unwrap(),
        ));
    }
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e:?}")))?;
    ParameterServerClient::with_interceptor(channel, AddToken::new(token).unwrap())
        .state(pb::StateRequest {})
        .await
        .map(|r| r.into_inner())
}

#[test]
fn a_cluster_trains_over_mutual_tls_and_dtf_status_reads_it() {
    let mut c = Cluster::new(1, 2, 200, Mode::Async);
    enable_tls(&mut c);
    c.start("ps", 0);
    // The ps is up when `dtf status` (over TLS) reaches it.
    let status = until(
        Duration::from_secs(20),
        "dtf status over TLS to reach the ps",
        || {
            let out = c.dtf(&["status", "--json"]);
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        },
    );
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["tasks"][0]["reachable"], true, "{status}");

    c.start("worker", 0);
    c.start("worker", 1);
    c.wait_all_success(Duration::from_secs(120));
    let ev = dtf::eval::evaluate(&c.cfg.checkpoint.dir, &c.cfg.data.dir).unwrap();
    assert!(
        (200..=201).contains(&ev.global_step),
        "final step {}",
        ev.global_step
    );
    assert!(ev.ema_accuracy > 0.9, "EMA accuracy {}", ev.ema_accuracy);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tls_ps_accepts_only_clients_the_cluster_ca_signed() {
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    let (
        TlsPs {
            ca,
            cert,
            key,
            addr,
        },
        good,
    ) = start_tls_ps(&mut c).await;
    assert!(!good.initialized);

    // Over TLS the token is still checked.
    let e = tls_client(&addr, &ca, Some((&cert, &key)), "wrong")
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");

    // Plaintext, with the right token: no answer from the service.
    let plain = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await;
    if let Ok(channel) = plain {
        let answer =
            ParameterServerClient::with_interceptor(channel, AddToken::new(TOKEN).unwrap())
                .state(pb::StateRequest {})
                .await;
        assert!(answer.is_err(), "a plaintext client got {answer:?}");
    }

    // No client certificate, or one from another CA: refused.
    // The same call with the cluster's certificate succeeded above (the
    // control); without one it must fail. How depends on when rustls's alert
    // arrives (Unknown, Cancelled or a broken pipe), so only that it fails is
    // asserted: any error, never an answer.
    let refused = |r: &Result<pb::StateResponse, tonic::Status>| r.is_err();
    let answer = tls_client(&addr, &ca, None, TOKEN).await;
    assert!(refused(&answer), "no client certificate got {answer:?}");
    let stranger = authority("another CA");
    let other = c.dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let (s_cert, s_key) = host_files(&stranger, &other, "stranger");
    let answer = tls_client(&addr, &ca, Some((&s_cert, &s_key)), TOKEN).await;
    assert!(
        refused(&answer),
        "a certificate of another CA got {answer:?}"
    );

    // A client that trusts another CA does not accept the ps.
    let answer = tls_client(&addr, &stranger, Some((&cert, &key)), TOKEN).await;
    assert!(
        refused(&answer),
        "a ps the client cannot verify answered {answer:?}"
    );

    // The ps survived all that, unchanged.
    let after = tls_client(&addr, &ca, Some((&cert, &key)), TOKEN)
        .await
        .unwrap();
    assert_eq!(after.incarnation, good.incarnation);
    assert!(!after.initialized);
}

/// `dtf-ps` and `dtf-worker check-config` both exit 78 naming every one of `names`.
fn assert_rejected(c: &Cluster, what: &str, names: &[&str]) {
    assert_config_error(
        &format!("{what}, dtf-ps"),
        &ps(&c.config_path, 0, &[]),
        names,
    );
    let check = worker_check(&c.config_path, Some(0), &[]);
    assert_config_error(&format!("{what}, dtf-worker check-config"), &check, names);
}

#[test]
fn tls_file_problems_exit_78_naming_the_key() {
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    let ca = enable_tls(&mut c);
    let sec = c.cfg.security.clone();
    let (cert, key, ca_path) = (
        sec.tls_cert.clone().unwrap(),
        sec.tls_key.clone().unwrap(),
        sec.tls_ca.clone().unwrap(),
    );
    let name = |p: &Path| p.display().to_string();

    // Only some of the three keys.
    c.cfg.security.tls_key = None;
    c.write_config();
    assert_rejected(&c, "no tls_key", &["security.tls_key", "security.tls_cert"]);
    c.cfg.security = sec.clone();
    c.write_config();

    // A key others may read.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_rejected(&c, "key 0644", &["security.tls_key", &name(&key), "0644"]);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();

    // Not PEM.
    let good_cert = std::fs::read(&cert).unwrap();
    std::fs::write(&cert, "not a certificate\n").unwrap();
    assert_rejected(&c, "cert not PEM", &["security.tls_cert", &name(&cert)]);
    std::fs::write(&cert, &good_cert).unwrap();
    let good_key = std::fs::read(&key).unwrap();
    std::fs::write(&key, &good_cert).unwrap();
    assert_rejected(
        &c,
        "key is a certificate",
        &["security.tls_key", &name(&key)],
    );

    // A key that is not the certificate's.
    let (_, other_key) = host_files(&ca, c.dir.path(), "other");
    std::fs::write(&key, std::fs::read(other_key).unwrap()).unwrap();
    assert_rejected(
        &c,
        "key of another certificate",
        &["security.tls_key", &name(&key)],
    );
    std::fs::write(&key, &good_key).unwrap();

    // A missing CA file.
    std::fs::remove_file(&ca_path).unwrap();
    assert_rejected(&c, "no CA file", &["security.tls_ca", &name(&ca_path)]);
}

#[test]
fn a_tls_mismatch_is_explained_and_the_worker_waits() {
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    enable_tls(&mut c);
    // The file leaves TLS off; the environment turns it on for one task.
    let sec = std::mem::take(&mut c.cfg.security);
    c.cfg.security.token_file = sec.token_file.clone();
    c.write_config();
    let tls_env = [
        ("DTF_SECURITY__TLS_CERT", sec.tls_cert.unwrap()),
        ("DTF_SECURITY__TLS_KEY", sec.tls_key.unwrap()),
        ("DTF_SECURITY__TLS_CA", sec.tls_ca.unwrap()),
    ];
    let tls_env: Vec<(&str, &OsStr)> = tls_env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    // TLS is for paths that cross a network: on one host the shared-memory
    // transport would carry the run whatever TLS says, so this is TCP's test.
    c.use_transport(dtf::config::Transport::Tcp);

    // TLS on the ps only.
    c.start_with_env("ps", 0, &tls_env);
    c.start("worker", 0);
    c.wait_log("worker:0", "it may require TLS", 1, Duration::from_secs(30));
    assert!(
        c.child("worker:0").try_wait().unwrap().is_none(),
        "the worker should wait for the ps, not exit:\n{}",
        c.log("worker:0")
    );
    // dtf status fails, and says why, whichever way the connection broke.
    for _ in 0..5 {
        let status = c.dtf(&["status"]);
        let text = String::from_utf8_lossy(&status.stdout);
        assert!(
            !status.status.success() && text.contains("TLS, which is not set here"),
            "dtf status without TLS against a TLS ps:\n{text}"
        );
    }
    c.kill("worker:0");
    c.kill("ps:0");

    // TLS on the worker only.
    c.start("ps", 0);
    c.start_with_env("worker", 0, &tls_env);
    c.wait_log(
        "worker:0",
        "the ps does not speak TLS",
        1,
        Duration::from_secs(30),
    );
    assert!(
        c.child("worker:0").try_wait().unwrap().is_none(),
        "the worker should wait for the ps, not exit:\n{}",
        c.log("worker:0")
    );
}

/// A socket bound to `ip` (any of 127.0.0.0/8 reaches a ps on 127.0.0.1),
/// and its address: the peer the ps will name. The ps logs one refusal per
/// peer address per 10 s, so each case below comes from an address of its own.
fn socket_from(ip: &str) -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    let local = socket.local_addr().unwrap();
    (socket, local)
}

/// A client of the ps at `addr` with the cluster token, on one connection
/// from `ip`: over TLS with `tls`, plaintext without.
type OneConnection = ParameterServerClient<InterceptedService<Channel, AddToken>>;

/// A client of the ps at `addr` from `ip`, over TLS with `tls` or plaintext
/// without, that never reconnects (a call after its connection closed
/// fails); returns the client's address too.
async fn client_from(
    ip: &str,
    addr: &str,
    tls: Option<ClientTlsConfig>,
) -> (SocketAddr, Result<OneConnection, tonic::Status>) {
    let (socket, local) = socket_from(ip);
    let target: SocketAddr = addr.parse().unwrap();
    // The one socket whose address is known; a reconnection gets an error.
    let socket = Arc::new(Mutex::new(Some(socket)));
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let socket = socket.lock().unwrap().take();
        async move {
            let socket = socket.ok_or_else(|| std::io::Error::other("one connection only"))?;
            let stream = socket.connect(target).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(10));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).unwrap();
    }
    let client = endpoint
        .connect_with_connector(connector)
        .await
        .map(|channel| {
            ParameterServerClient::with_interceptor(channel, AddToken::new(TOKEN).unwrap())
        })
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e:?}")));
    (local, client)
}

/// A gRPC `State` call to the ps at `addr` from `ip` ([`client_from`]);
/// returns the client's address and the answer.
async fn state_from(
    ip: &str,
    addr: &str,
    tls: Option<ClientTlsConfig>,
) -> (SocketAddr, Result<pb::StateResponse, tonic::Status>) {
    let (local, client) = client_from(ip, addr, tls).await;
    let answer = match client {
        Ok(mut client) => client
            .state(pb::StateRequest {})
            .await
            .map(|r| r.into_inner()),
        Err(e) => Err(e),
    };
    (local, answer)
}

/// Waits for the ps's "Refused." line naming `peer`, and asserts its reason
/// says `reason`.
fn assert_refused(c: &Cluster, peer: SocketAddr, reason: &str) {
    let needle = format!("Refused. peer={peer} ");
    let log = c.wait_log("ps:0", &needle, 1, Duration::from_secs(20));
    let line = log.lines().find(|l| l.contains(&needle)).unwrap();
    eprintln!("{line}");
    assert!(
        line.contains(&format!("reason=TLS handshake failed: {reason}")),
        "the refusal of {peer} should say {reason:?}:\n{line}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tls_ps_logs_each_failed_handshake_with_the_peer_and_why() {
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    let (
        TlsPs {
            ca,
            cert,
            key,
            addr,
        },
        good,
    ) = start_tls_ps(&mut c).await;
    let trusting = || ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca.pem()));

    // A gRPC client without TLS.
    let (peer, answer) = state_from("127.0.0.2", &addr, None).await;
    assert!(answer.is_err(), "a plaintext client got {answer:?}");
    assert_refused(&c, peer, "not TLS: a plaintext HTTP/2 (gRPC) client");

    // A certificate from another CA.
    let stranger = authority("another CA");
    let other = c.dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let (s_cert, s_key) = host_files(&stranger, &other, "stranger");
    let identity = Identity::from_pem(
        std::fs::read(&s_cert).unwrap(),
        std::fs::read(&s_key).unwrap(),
    );
    let (peer, answer) = state_from("127.0.0.3", &addr, Some(trusting().identity(identity))).await;
    assert!(
        answer.is_err(),
        "a certificate of another CA got {answer:?}"
    );
    assert_refused(&c, peer, "client certificate not signed by the cluster CA");

    // No client certificate.
    let (peer, answer) = state_from("127.0.0.4", &addr, Some(trusting())).await;
    assert!(answer.is_err(), "no client certificate got {answer:?}");
    assert_refused(&c, peer, "no client certificate");

    // A client that trusts another CA, and so not the ps.
    let identity = Identity::from_pem(std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap());
    let distrusting = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(stranger.pem()))
        .identity(identity);
    let (peer, answer) = state_from("127.0.0.8", &addr, Some(distrusting)).await;
    assert!(
        answer.is_err(),
        "a client that cannot verify the ps got {answer:?}"
    );
    assert_refused(&c, peer, "the client rejected the ps's certificate");

    // Bytes that are not TLS at all.
    let (socket, peer) = socket_from("127.0.0.5");
    let mut garbage = socket.connect(addr.parse().unwrap()).await.unwrap();
    garbage.write_all(b"\x00\x01garbage\r\n").await.unwrap();
    assert_refused(&c, peer, "not TLS: the client's first bytes");

    // A cluster member is served as before.
    let after = tls_client(&addr, &ca, Some((&cert, &key)), TOKEN)
        .await
        .unwrap();
    assert_eq!(after.incarnation, good.incarnation);
    assert!(c.child("ps:0").try_wait().unwrap().is_none(), "ps exited");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_never_starts_its_handshake_holds_up_no_one() {
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    let (
        TlsPs {
            ca,
            cert,
            key,
            addr,
        },
        _,
    ) = start_tls_ps(&mut c).await;
    // A cluster member on one connection, answered once: from then on the
    // connection is authenticated and outlives the 10 s given to others.
    let identity = Identity::from_pem(std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap());
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .identity(identity);
    let (_, member) = client_from("127.0.0.7", &addr, Some(tls)).await;
    let mut member = member.unwrap();
    member.state(pb::StateRequest {}).await.unwrap();

    // Connected, and silent.
    let (socket, peer) = socket_from("127.0.0.6");
    let mut idle = socket.connect(addr.parse().unwrap()).await.unwrap();
    // A new client connects, handshakes and is answered while it is open:
    // well within the 10 s the ps gives the silent one.
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        tls_client(&addr, &ca, Some((&cert, &key)), TOKEN),
    )
    .await;
    assert!(
        matches!(answer, Ok(Ok(_))),
        "a good client behind a silent one got {answer:?}"
    );
    // The silent one is closed at the deadline, and logged.
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(30), idle.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "the ps should close a connection that never handshakes: {read:?}"
    );
    assert_refused(&c, peer, "handshake not done within 10 s of connecting");
    // The member's connection, older than the silent one, is still open.
    member
        .state(pb::StateRequest {})
        .await
        .expect("an authenticated TLS connection stays open");
}

/// Issue 25: `check-config` said "valid" for an expired `tls_cert` and for
/// one `tls_ca` did not sign; the worker then waited forever. Now both are
/// refused at start, as a handshake would refuse them.
#[test]
fn an_expired_or_foreign_certificate_is_refused_at_start() {
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    let ca = enable_tls(&mut c);
    let cert = c.cfg.security.tls_cert.clone().unwrap();
    let key = c.cfg.security.tls_key.clone().unwrap();
    let key_pair = KeyPair::from_pem(&std::fs::read_to_string(&key).unwrap()).unwrap();
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2001, 1, 1);
    params.not_after = rcgen::date_time_ymd(2002, 1, 1);
    std::fs::write(&cert, params.signed_by(&key_pair, &ca).unwrap().pem()).unwrap();
    assert_rejected(&c, "expired", &["security.tls_cert", "certificate expired"]);
    let other = authority("another CA");
    let params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    std::fs::write(&cert, params.signed_by(&key_pair, &other).unwrap().pem()).unwrap();
    assert_rejected(
        &c,
        "another CA's",
        &["security.tls_cert", "a handshake would refuse it"],
    );
}
