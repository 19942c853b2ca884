//! Across hosts ([`crate::hosts`]): a ps on one network namespace, workers
//! on others, `transport = "auto"` (so TCP between them, as between real
//! hosts): training on each `cluster.compression`, mutual TLS, a ps
//! restarted on its own host, a worker host cut off and healed, a worker
//! host on a 10× slower link.

use crate::hosts::{Host, Hosts};
use crate::util::*;
use dtf::config::{Compression, Mode};
use std::time::Duration;

/// Floats of the tiny model (`[64, 16, 4]`): what one push carries.
const FLOATS: usize = 64 * 16 + 16 + 16 * 4 + 4;

/// A run that goes on until the test ends it ([`finish`]).
const OPEN_ENDED: u64 = 10_000_000;

/// Waits until the global step, asked from `from`, reaches `step`.
fn wait_step(c: &Cluster, from: &Host, step: u64, what: &str) -> u64 {
    until(Duration::from_secs(120), what, || {
        c.step_from(from).filter(|&s| s >= step)
    })
}

/// Ends an open-ended run `more` steps past the step seen from `from`
/// (`train.last_step` is live), waits for every task to exit 0, and
/// returns the final checkpoint's evaluation, checked to be a trained model.
fn finish(c: &mut Cluster, from: &Host, more: u64) -> dtf::eval::Evaluation {
    let now = c.step_from(from).expect("the global step");
    c.cfg.train.last_step = now + more;
    c.write_config_by_rename();
    c.wait_all_success(Duration::from_secs(180));
    let ev = dtf::eval::evaluate(&c.cfg.checkpoint.dir, &c.cfg.data.dir)
        .expect("the final checkpoint evaluates");
    assert!(
        ev.global_step >= now + more,
        "final step {} < {}",
        ev.global_step,
        now + more
    );
    // The tiny problem is separable: a working wire learns it; a broken
    // compression (a sign, a scale, values that drift from the ps's) does not.
    assert!(
        ev.accuracy > 0.9 && ev.ema_accuracy > 0.9 && ev.loss < 0.5,
        "trained model: accuracy {} / EMA {} / loss {}",
        ev.accuracy,
        ev.ema_accuracy,
        ev.loss
    );
    ev
}

/// A sample's value in Prometheus text: `name` with its labels, exactly.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Every worker that logged its connections reached the ps over TCP with `compression`.
fn assert_links(c: &Cluster, compression: &str) {
    for i in 0..c.cfg.cluster.worker.len() {
        let log = c.log(&format!("worker:{i}"));
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("Connected to ps."))
            .collect();
        assert!(!lines.is_empty(), "worker:{i} logged no connection:\n{log}");
        for l in lines {
            assert!(
                l.contains("transport=tcp")
                    && l.split_whitespace()
                        .any(|w| w == format!("compression={compression}")),
                "worker:{i}: {l}"
            );
        }
    }
}

/// Trains 1 ps (host 0) + 2 workers (host 1) with `compression`: over TCP
/// with that compression as the workers, `dtf status` and `/metrics` say;
/// the bytes a push sends are the compression's; the model learns.
fn trains_with(compression: Compression, name: &str, mode: Mode, tensor_bytes: usize) {
    let mut c = Cluster::new(1, 2, OPEN_ENDED, mode);
    let hosts = Hosts::new(2, c.dir.path());
    c.cfg.cluster.compression = compression;
    c.place(&hosts, &[0], &[1, 1]);
    let metrics = format!("{}:{}", hosts.host(1).addr, free_port_run(1));
    c.start_on(hosts.host(0), "ps", 0, &[]);
    c.start_on(
        hosts.host(1),
        "worker",
        0,
        &[("DTF_METRICS__LISTEN", metrics.as_str())],
    );
    c.start_on(hosts.host(1), "worker", 1, &[]);
    wait_step(&c, hosts.host(1), 400, "training across hosts");

    let status = c.status_from(hosts.host(1)).expect("dtf status");
    let ps = &status["tasks"][0];
    assert_eq!(
        (ps["transport"].as_str(), ps["compression"].as_str()),
        (Some("tcp"), Some(name)),
        "{status}"
    );
    let text = hosts
        .host(1)
        .enter(|| http_get(&metrics, "/metrics"))
        .expect("the chief's /metrics");
    let series = format!("dtf_ps_compression{{ps=\"0\",compression=\"{name}\"}}");
    assert_eq!(metric(&text, &series), Some(1.0), "{series} in:\n{text}");
    let sent = metric(&text, "dtf_ps_link_sent_bytes_total{ps=\"0\"}").expect("sent bytes");
    let received =
        metric(&text, "dtf_ps_link_received_bytes_total{ps=\"0\"}").expect("received bytes");
    let steps = metric(&text, "dtf_steps_total").expect("steps");
    // A push is the gradient as compressed plus at most 512 bytes of
    // names, shapes and fields.
    let per_push = sent / steps;
    assert!(
        per_push >= tensor_bytes as f64 && per_push <= (tensor_bytes + 512) as f64,
        "{name}: {per_push:.0} bytes sent per step, the gradient is {tensor_bytes}"
    );
    assert!(received > 0.0, "nothing received");
    finish(&mut c, hosts.host(1), 1500);
    assert_links(&c, name);
}

#[test]
fn trains_across_hosts_uncompressed() {
    trains_with(Compression::None, "none", Mode::Async, 4 * FLOATS);
}

#[test]
fn trains_across_hosts_with_bf16() {
    trains_with(Compression::Bf16, "bf16", Mode::Async, 2 * FLOATS);
}

#[test]
fn trains_across_hosts_with_onebit() {
    // Per tensor: 8 bytes of scales per 256 values and one bit per value.
    let onebit: usize = [64 * 16, 16, 16 * 4, 4]
        .iter()
        .map(|&n: &usize| 8 * n.div_ceil(256) + n.div_ceil(8))
        .sum();
    trains_with(Compression::Onebit, "onebit", Mode::Async, onebit);
}

#[test]
fn trains_across_hosts_with_onebit_in_sync_mode() {
    let mut c = Cluster::new(1, 2, 1500, Mode::Sync);
    let hosts = Hosts::new(2, c.dir.path());
    c.cfg.cluster.compression = Compression::Onebit;
    c.place(&hosts, &[0], &[1, 1]);
    c.start_on(hosts.host(0), "ps", 0, &[]);
    c.start_on(hosts.host(1), "worker", 0, &[]);
    c.start_on(hosts.host(1), "worker", 1, &[]);
    c.wait_all_success(Duration::from_secs(180));
    let ev = dtf::eval::evaluate(&c.cfg.checkpoint.dir, &c.cfg.data.dir).unwrap();
    assert!(
        ev.global_step >= 1500 && ev.accuracy > 0.9 && ev.ema_accuracy > 0.9,
        "sync onebit: step {} accuracy {} / EMA {}",
        ev.global_step,
        ev.accuracy,
        ev.ema_accuracy
    );
    assert_links(&c, "onebit");
}

#[test]
fn a_compression_mismatch_stops_the_worker_naming_the_key() {
    let mut c = Cluster::new(1, 1, 500, Mode::Async);
    c.cfg.cluster.compression = Compression::Bf16;
    c.use_transport(dtf::config::Transport::Tcp);
    c.start("ps", 0);
    c.start_env("worker", 0, &[("DTF_CLUSTER__COMPRESSION", "none")]);
    let exit = c.wait("worker:0", Duration::from_secs(60));
    let log = c.log("worker:0");
    assert!(!exit.success(), "the worker must not train; log:\n{log}");
    assert!(
        log.contains("cluster.compression") && log.contains("bf16"),
        "the error names the key and the values; log:\n{log}"
    );
}

#[test]
fn mutual_tls_across_hosts_with_onebit() {
    // Open-ended until both workers are connected: a fixed 800 steps could
    // end (the tiny model on a loaded machine) before worker 1's next poll
    // for the chief's initialization, and it would never connect.
    let mut c = Cluster::new(1, 2, OPEN_ENDED, Mode::Async);
    let hosts = Hosts::new(2, c.dir.path());
    crate::tls::enable_tls(&mut c);
    c.cfg.cluster.compression = Compression::Onebit;
    c.place(&hosts, &[0], &[1, 1]);
    c.start_on(hosts.host(0), "ps", 0, &[]);
    c.start_on(hosts.host(1), "worker", 0, &[]);
    c.start_on(hosts.host(1), "worker", 1, &[]);
    for w in ["worker:0", "worker:1"] {
        c.wait_log(w, "Connected to ps.", 1, Duration::from_secs(120));
    }
    let ev = finish(&mut c, hosts.host(1), 800);
    assert!(ev.global_step >= 800 && ev.ema_accuracy > 0.9, "{ev:?}");
    assert_links(&c, "onebit");
    let ps = c.log("ps:0");
    assert!(!ps.contains("handshake"), "no failed handshake: {ps}");
}

#[test]
fn a_ps_restarted_on_its_host_is_reseeded_and_training_resumes() {
    let mut c = Cluster::new(1, 2, OPEN_ENDED, Mode::Async);
    let hosts = Hosts::new(2, c.dir.path());
    c.cfg.cluster.compression = Compression::Onebit;
    c.place(&hosts, &[0], &[1, 1]);
    c.start_on(hosts.host(0), "ps", 0, &[]);
    c.start_on(hosts.host(1), "worker", 0, &[]);
    c.start_on(hosts.host(1), "worker", 1, &[]);
    wait_step(&c, hosts.host(1), 300, "training");
    until(Duration::from_secs(60), "a checkpoint", || {
        checkpoint_steps(&c.cfg.checkpoint.dir).last().copied()
    });
    let before =
        c.status_from(hosts.host(1)).expect("dtf status")["tasks"][0]["incarnation"].clone();
    c.kill("ps:0");
    c.start_on(hosts.host(0), "ps", 0, &[]);
    c.wait_log("worker:0", "Restored the model", 1, Duration::from_secs(60));
    // The new ps (a new incarnation) trains on: the workers dropped what
    // they held of the old one and took exact values again.
    let after = until(Duration::from_secs(60), "the restarted ps", || {
        let s = c.status_from(hosts.host(1))?;
        let ps = &s["tasks"][0];
        (ps["incarnation"] != before && ps["initialized"] == true)
            .then(|| ps["global_step"].as_u64())
            .flatten()
    });
    wait_step(&c, hosts.host(1), after + 300, "training after the restart");
    finish(&mut c, hosts.host(1), 500);
}

/// A worker's latest contact as the ps tasks saw it: (step, seconds ago).
fn contact(c: &Cluster, from: &Host, worker: usize) -> Option<(u64, f64)> {
    let s = c.status_from(from)?;
    let t = s["tasks"]
        .as_array()?
        .iter()
        .find(|t| t["task"] == format!("worker:{worker}"))?;
    Some((t["global_step"].as_u64()?, t["last_contact_secs"].as_f64()?))
}

#[test]
fn a_worker_host_cut_off_and_healed_rejoins() {
    let mut c = Cluster::new(1, 2, OPEN_ENDED, Mode::Async);
    let hosts = Hosts::new(3, c.dir.path());
    c.place(&hosts, &[0], &[1, 2]);
    c.start_on(hosts.host(0), "ps", 0, &[]);
    c.start_on(hosts.host(1), "worker", 0, &[]);
    c.start_on(hosts.host(2), "worker", 1, &[]);
    let ps_host = hosts.host(0);
    until(Duration::from_secs(120), "worker 1 to push", || {
        contact(&c, ps_host, 1).filter(|&(s, _)| s >= 100)
    });
    hosts.cut(2);
    let at_cut = c.step_from(ps_host).unwrap();
    // The others go on without it...
    wait_step(&c, ps_host, at_cut + 500, "training without host 2");
    let (last, _) = contact(&c, ps_host, 1).unwrap();
    // ...and it keeps waiting for the ps rather than giving up.
    let exited = c.child("worker:1").try_wait().unwrap();
    assert!(exited.is_none(), "worker:1 gave up: {}", c.log("worker:1"));
    hosts.heal(2);
    until(
        Duration::from_secs(90),
        "worker 1 to push after the heal",
        || contact(&c, ps_host, 1).filter(|&(s, ago)| s > last + 50 && ago < 5.0),
    );
    finish(&mut c, ps_host, 500);
}

#[test]
fn a_worker_on_a_10x_slower_link_holds_no_one_up() {
    let mut c = Cluster::new(1, 2, OPEN_ENDED, Mode::Async);
    let hosts = Hosts::shaped(
        &[Some("100mbit"), Some("100mbit"), Some("10mbit")],
        c.dir.path(),
    );
    c.cfg.cluster.compression = Compression::Bf16;
    c.place(&hosts, &[0], &[1, 2]);
    c.start_on(hosts.host(0), "ps", 0, &[]);
    c.start_on(hosts.host(1), "worker", 0, &[]);
    c.start_on(hosts.host(2), "worker", 1, &[]);
    let ps_host = hosts.host(0);
    wait_step(&c, ps_host, 1000, "training with one slow link");
    // Both contribute: the slow one's pushes arrive too.
    until(Duration::from_secs(60), "the slow worker's pushes", || {
        contact(&c, ps_host, 1).filter(|&(s, _)| s >= 100)
    });
    finish(&mut c, ps_host, 1000);
}
