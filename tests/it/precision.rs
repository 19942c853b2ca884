//! `train.precision = "mixed_bfloat16"` end to end: real ps and worker
//! processes train the tiny model with bf16 GEMMs over each transport, the
//! policy is in the checkpoints and the workers' logs and metrics, and
//! `DTF_KERNEL` picks the tier a worker runs; every computing thread
//! flushes denormals unless `train.flush_denormals = false`.

use crate::util::*;
use dtf::config::Mode;
use dtf::kernel::{Precision, Tier};
use std::time::Duration;

const RUN: Duration = Duration::from_secs(180);

/// The best tier this machine runs: what a worker without `DTF_KERNEL` logs.
fn best() -> &'static str {
    Tier::best().name()
}

crate::on_each_transport! {
    async fn mixed_bfloat16_trains_and_says_so(transport) {
        let mut c = Cluster::new(1, 2, 300, Mode::Async);
        c.cfg.train.precision = Precision::MixedBfloat16;
        c.use_transport(transport);
        c.start_all();
        tokio::task::block_in_place(|| c.wait_all_success(RUN));
        c.assert_transport(transport);
        for w in ["worker:0", "worker:1"] {
            let log = c.log(w);
            let line = log
                .lines()
                .find(|l| l.contains("Precision policy."))
                .unwrap_or_else(|| panic!("{w} did not log its precision:\n{log}"));
            assert!(line.contains("precision=\"mixed_bfloat16\"") || line.contains("precision=mixed_bfloat16"), "{line}");
            assert!(line.contains(&format!("kernel={}", best())) || line.contains(&format!("kernel=\"{}\"", best())), "{line}");
        }
        // The checkpoint is f32 as always, and says which policy trained it.
        let specs = dtf::model::Mlp::new(&c.cfg.model.layers).unwrap().variables();
        let (path, ck) = dtf::checkpoint::restore_latest(&c.cfg.checkpoint.dir, &specs)
            .unwrap()
            .expect("a final checkpoint");
        assert_eq!(ck.global_step, 300);
        let meta = dtf::checkpoint::read_metadata(&path).unwrap();
        let hyper: serde_json::Value = serde_json::from_str(&meta["hyperparameters"]).unwrap();
        assert_eq!(hyper["precision"], "mixed_bfloat16", "{hyper}");
        let acc = dtf::eval::evaluate(&c.cfg.checkpoint.dir, &c.cfg.data.dir).unwrap();
        assert!(acc.accuracy > 0.8, "mixed_bfloat16 did not learn: {acc:?}");
    }
}

/// `DTF_KERNEL` forces a lower tier in a real worker, which shows it in its
/// log and in `/metrics` as `dtf_kernel{precision,tier}`; the portable
/// tier trains too.
#[test]
fn dtf_kernel_forces_the_portable_tier_in_a_worker() {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.cfg.train.precision = Precision::MixedBfloat16;
    c.write_config();
    let addr = free_addrs(1).remove(0);
    c.start("ps", 0);
    c.start_env(
        "worker",
        0,
        &[("DTF_METRICS__LISTEN", &addr), ("DTF_KERNEL", "portable")],
    );
    let want = "dtf_kernel{precision=\"mixed_bfloat16\",tier=\"portable\"} 1";
    until(RUN, "the worker's dtf_kernel metric", || {
        http_get(&addr, "/metrics").filter(|m| m.contains(want))
    });
    let step_of = || {
        http_get(&addr, "/metrics").and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("dtf_global_step "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
    };
    until(RUN, "the portable tier to train 100 steps", || {
        step_of().filter(|&s| s >= 100.0)
    });
    let log = c.log("worker:0");
    assert!(log.contains("Kernel tier chosen."), "{log}");
    assert!(log.contains("portable"), "{log}");
}

/// Starts a ps, a worker and an evaluator with `train.flush_denormals =
/// flush` and returns what each one's `dtf_denormals_flushed` says once it
/// has computed (an update, a step, an evaluation): the MXCSR of the very
/// thread that computed.
fn denormals_flushed_by_each_task(flush: bool) -> Vec<(&'static str, f64)> {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.cfg.train.flush_denormals = flush;
    c.write_config();
    // Something for the evaluator to score at once.
    write_checkpoint(&c.cfg, 100);
    let addrs = free_addrs(3);
    let roles = ["ps", "worker", "evaluator"];
    for (role, addr) in roles.into_iter().zip(&addrs) {
        c.start_env(role, 0, &[("DTF_METRICS__LISTEN", addr)]);
    }
    let flushed = |addr: &str| {
        http_get(addr, "/metrics").and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("dtf_denormals_flushed "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
    };
    roles
        .into_iter()
        .zip(&addrs)
        .map(|(role, addr)| {
            let what = format!("the {role} to compute and say whether it flushed");
            (
                role,
                until(RUN, &what, || flushed(addr).filter(|&v| v >= 0.0)),
            )
        })
        .collect()
}

/// TensorFlow's compute threads run under `ScopedFlushDenormal`; dtf's
/// do too: the ps's update threads, the worker's step and the evaluator's
/// scoring all have FTZ and DAZ set.
#[test]
fn every_computing_thread_flushes_denormals_by_default() {
    let got = denormals_flushed_by_each_task(true);
    assert_eq!(got, [("ps", 1.0), ("worker", 1.0), ("evaluator", 1.0)]);
}

/// `train.flush_denormals = false` keeps IEEE subnormals in every one of them.
#[test]
fn flush_denormals_false_keeps_subnormals_everywhere() {
    let got = denormals_flushed_by_each_task(false);
    assert_eq!(got, [("ps", 0.0), ("worker", 0.0), ("evaluator", 0.0)]);
}
