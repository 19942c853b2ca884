//! Whole clusters of real processes: async and sync runs to `last_step`.

use crate::util::*;
use dtf::config::Mode;
use dtf::transport::pb;
use std::time::Duration;

const RUN: Duration = Duration::from_secs(120);

/// Reads the newest checkpoint's step and evaluates it.
fn final_eval(c: &Cluster) -> dtf::eval::Evaluation {
    dtf::eval::evaluate(&c.cfg.checkpoint.dir, &c.cfg.data.dir).expect("final checkpoint evaluates")
}

#[test]
fn async_run_reaches_last_step_and_every_task_exits_0() {
    let mut c = Cluster::new(1, 2, 300, Mode::Async);
    c.start_all();
    c.wait_all_success(RUN);
    let ev = final_eval(&c);
    assert!(
        (300..=301).contains(&ev.global_step),
        "final step {}",
        ev.global_step
    );
    assert!(
        ev.ema_accuracy > 0.9,
        "EMA accuracy {} on a separable problem",
        ev.ema_accuracy
    );
    let chief = c.log("worker:0");
    assert!(chief.contains("Final evaluation"), "chief log:\n{chief}");
    assert!(
        chief.contains("/job:ps/task:0"),
        "placement is logged:\n{chief}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn variables_spread_over_two_ps_and_three_workers_finish() {
    let mut c = Cluster::new(2, 3, 200, Mode::Async);
    c.start("ps", 0);
    c.start("ps", 1);
    let mut held = Vec::new();
    for i in 0..2 {
        let s = c
            .client(i, Some(TOKEN))
            .await
            .state(pb::StateRequest {})
            .await
            .unwrap()
            .into_inner();
        held.push(s.variables);
    }
    assert_eq!(held[0], vec!["layer1/weights", "layer2/weights"]);
    assert_eq!(held[1], vec!["layer1/biases", "layer2/biases"]);
    for i in 0..3 {
        c.start("worker", i);
    }
    tokio::task::block_in_place(|| c.wait_all_success(RUN));
    let ev = final_eval(&c);
    assert!(
        (200..=202).contains(&ev.global_step),
        "final step {}",
        ev.global_step
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_run_averages_exactly_replicas_per_update_and_ends_at_last_step() {
    let mut c = Cluster::new(1, 2, 150, Mode::Sync);
    c.start_all();
    let mut ps = c.client(0, Some(TOKEN)).await;
    // Watch the ps until it completes: its counters are the evidence.
    let state = eventually(RUN, "the sync run to complete", || {
        let mut ps = ps.clone();
        async move {
            let s = ps.state(pb::StateRequest {}).await.ok()?.into_inner();
            s.complete.then_some(s)
        }
    })
    .await;
    assert_eq!(state.global_step, 150);
    assert_eq!(state.updates_applied, 150);
    assert_eq!(state.gradients_aggregated, 2 * 150);
    let _ = ps.state(pb::StateRequest {}).await;
    tokio::task::block_in_place(|| c.wait_all_success(RUN));
    assert_eq!(final_eval(&c).global_step, 150);
}

/// A model whose every message is over gRPC's 4 MiB default (64·20000 +
/// 20000·4 weights: 5.5 MB a pull or a push) trains and checkpoints: the
/// limit is derived from the model (`ps::message_limit`), not the default.
#[test]
fn a_model_over_grpc_default_message_size_trains() {
    let mut c = Cluster::new(1, 1, 20, Mode::Async);
    c.cfg.model.layers = vec![64, 20_000, CLASSES];
    c.write_config();
    c.start_all();
    c.wait_all_success(RUN);
    let ev = final_eval(&c);
    assert_eq!(ev.global_step, 20);
    let file = std::fs::metadata(c.cfg.checkpoint.dir.join("model.ckpt-20.safetensors")).unwrap();
    assert!(file.len() > 4 << 20, "checkpoint of {} bytes", file.len());
}
