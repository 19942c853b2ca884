//! Synchronous training (SyncReplicasOptimizer semantics) without its hangs.

use crate::util::*;
use dtf::config::Mode;
use dtf::transport::pb;
use std::time::{Duration, Instant};

const RUN: Duration = Duration::from_secs(180);

/// Waits until ps `i` reports an initialized step of at least `step`.
async fn reach(c: &Cluster, i: usize, step: u64) -> pb::StateResponse {
    let ps = c.client(i, Some(TOKEN)).await;
    eventually(RUN, &format!("ps:{i} to reach step {step}"), || {
        let mut ps = ps.clone();
        async move {
            ps_state(&mut ps)
                .await
                .filter(|s| s.initialized && s.global_step >= step)
        }
    })
    .await
}

/// Waits for the run to complete, then for every process to exit 0 within a
/// few seconds of it.
async fn finish(c: &mut Cluster) -> Vec<pb::StateResponse> {
    let mut clients = Vec::new();
    for i in 0..c.cfg.cluster.ps.len() {
        clients.push(c.client(i, Some(TOKEN)).await);
    }
    // A ps exits shortly after the run completes: watch every ps at once,
    // keeping each one's first complete state.
    let mut seen: Vec<Option<pb::StateResponse>> = vec![None; clients.len()];
    let end = Instant::now() + RUN;
    loop {
        for (slot, ps) in seen.iter_mut().zip(&mut clients) {
            if slot.is_none() {
                *slot = ps_state(ps).await.filter(|s| s.complete);
            }
        }
        if seen.iter().all(Option::is_some) {
            break;
        }
        assert!(Instant::now() < end, "the run to complete: {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let states: Vec<_> = seen.into_iter().flatten().collect();
    let done = Instant::now();
    tokio::task::block_in_place(|| c.wait_all_success(Duration::from_secs(15)));
    assert!(
        done.elapsed() < Duration::from_secs(15),
        "tasks took {:?} to exit after completion",
        done.elapsed()
    );
    states
}

crate::on_each_transport! {
async fn two_ps_three_workers_end_exactly_at_last_step_with_full_aggregates(transport) {
    let mut c = Cluster::new(2, 3, 120, Mode::Sync);
    c.use_transport(transport);
    c.start_all();
    for s in finish(&mut c).await {
        assert_eq!(s.global_step, 120, "ps:{}", s.task);
        assert_eq!(s.updates_applied, 120, "ps:{}", s.task);
        assert_eq!(
            s.gradients_aggregated,
            3 * 120,
            "ps:{}: every update averages 3 gradients",
            s.task
        );
    }
    let ev = dtf::eval::evaluate(&c.cfg.checkpoint.dir, &c.cfg.data.dir).unwrap();
    assert_eq!(ev.global_step, 120);
    assert!(ev.ema_accuracy > 0.9, "EMA accuracy {}", ev.ema_accuracy);
    c.assert_transport(transport);
}
}

crate::on_each_transport! {
async fn a_dead_worker_does_not_stop_training_when_a_backup_exists(transport) {
    // Far away: each backup polls for the chief's initialization on its own
    // schedule, and on shared memory the tiny model does thousands of steps a
    // second, so a short run could end before the third racer joins. The run
    // is ended by a live last_step once the backup is dead.
    let mut c = Cluster::new(1, 3, 1_000_000, Mode::Sync);
    c.cfg.train.replicas_to_aggregate = Some(2);
    c.cfg.train.total_num_replicas = Some(3);
    c.use_transport(transport);
    c.start_all();
    let ps = c.client(0, Some(TOKEN)).await;
    // Once all three push, the third gradient of a step comes after its
    // update: dropped as stale, never applied.
    eventually(RUN, "a late third gradient dropped as stale", || {
        let mut ps = ps.clone();
        async move { ps_state(&mut ps).await.filter(|s| s.stale_gradients > 0) }
    })
    .await;
    c.kill("worker:2");
    c.procs.retain(|(n, _)| n != "worker:2");
    // The two left still make steps without it.
    let before = reach(&c, 0, 0).await.global_step;
    reach(&c, 0, before + 100).await;
    let room = room(&c).await;
    let last = reach(&c, 0, 0).await.global_step + room;
    c.cfg.train.last_step = last;
    c.write_config_by_rename();
    for n in ["ps:0", "worker:0", "worker:1"] {
        c.wait_log(n, "Configuration reloaded.", 1, RUN);
    }
    let s = finish(&mut c).await.remove(0);
    assert_eq!(s.global_step, last);
    assert_eq!(
        s.gradients_aggregated,
        2 * s.updates_applied,
        "every update averages exactly 2 gradients"
    );
    assert!(
        s.stale_gradients > 0,
        "the backup's late gradients are counted as stale: {s:?}"
    );
    c.assert_transport(transport);
}
}

crate::on_each_transport! {
async fn killing_the_chief_and_then_the_ps_mid_run_still_completes(transport) {
    // Far away: on shared memory the tiny model does thousands of steps a
    // second, so the run is ended by a live last_step once the faults are done.
    let mut c = Cluster::new(1, 2, 1_000_000, Mode::Sync);
    c.use_transport(transport);
    c.start_all();
    reach(&c, 0, 60).await;
    c.kill("worker:0");
    // Without the chief the other worker cannot complete a step (no backups):
    // it must wait, not fail, and say why in its log.
    let log = c.wait_log(
        "worker:1",
        "Waiting for the other replicas' gradients.",
        1,
        RUN,
    );
    let line = log
        .lines()
        .find(|l| l.contains("Waiting for the other replicas"))
        .unwrap_or_default();
    assert!(line.contains("replicas_to_aggregate=2"), "{line}");
    assert!(
        c.child("worker:1").try_wait().unwrap().is_none(),
        "worker:1 must wait, not exit:\n{log}"
    );
    // The run stands still without the chief: train past where it stopped,
    // so the restarted chief is connected to this ps when it is killed.
    let stuck = reach(&c, 0, 0).await.global_step;
    c.start("worker", 0);
    reach(&c, 0, stuck + 60).await;
    c.kill("ps:0");
    c.start("ps", 0);
    // The workers found the new ps on the same transport as before.
    let s = reach(&c, 0, 180).await;
    if transport == dtf::config::Transport::Auto {
        for w in ["worker:0", "worker:1"] {
            let log = c.wait_log(w, "Reconnected to ps.", 1, RUN);
            let line = log.lines().find(|l| l.contains("Reconnected to ps.")).unwrap_or_default();
            assert!(line.contains("transport=shm"), "{w}: {line}");
        }
    } else {
        assert_eq!(s.shm_connections, 0, "{s:?}");
    }
    let room = room(&c).await;
    let last = reach(&c, 0, 0).await.global_step + room;
    c.cfg.train.last_step = last;
    c.write_config_by_rename();
    for n in ["ps:0", "worker:0", "worker:1"] {
        c.wait_log(n, "Configuration reloaded.", 1, RUN);
    }
    let now = reach(&c, 0, 0).await.global_step;
    assert!(now < last, "step {now} already past {last} when the reload landed");
    let s = finish(&mut c).await.remove(0);
    assert_eq!(s.global_step, last);
    assert_eq!(s.gradients_aggregated, 2 * s.updates_applied);
    let chief = c.log("worker:0");
    // The restarted ps restored its own snapshot, or (when the snapshot was
    // no newer than the newest checkpoint) the chief re-seeded it.
    assert!(
        chief.contains("Restored the model") || chief.contains("restored its shard from its own snapshot"),
        "the restarted ps resumes from its snapshot or a checkpoint:\n{chief}"
    );
    // Both workers lost the ps mid-run and reconnected to the new one.
    c.assert_transport(transport);
}
}

crate::on_each_transport! {
/// Found by chaos seed 4: a worker that pulled between two shards' updates
/// of a step read them one step apart, and from then on pushed each shard
/// the step it had read there. When the first shard reached `last_step` it
/// ended, though the second still waited for its gradient of the step
/// before: every other task waited for ever. Here a stand-in for worker 1
/// pushes its first gradient to ps:0 alone (as a worker stopped between
/// its two pushes would), so the real worker 1 starts with the shards one
/// step apart; the run must still end at `last_step` on both shards.
async fn a_worker_that_read_the_shards_a_step_apart_does_not_end_the_run_early(transport) {
    let mut c = Cluster::new(2, 2, 40, Mode::Sync);
    c.use_transport(transport);
    c.start("ps", 0);
    c.start("ps", 1);
    c.start("worker", 0);
    let mut ps0 = c.client(0, Some(TOKEN)).await;
    let ps1 = c.client(1, Some(TOKEN)).await;
    // The chief's gradient of step 0 is in on both shards.
    for ps in [&ps0, &ps1] {
        eventually(RUN, "the chief's first gradient on each shard", || {
            let mut ps = ps.clone();
            async move {
                ps_state(&mut ps)
                    .await
                    .filter(|s| s.initialized && s.workers.iter().any(|w| w.task == 0))
            }
        })
        .await;
    }
    let shard = ps_state(&mut ps0).await.unwrap();
    assert_eq!(shard.global_step, 0, "{shard:?}");
    let specs = dtf::model::Mlp::new(&c.cfg.model.layers).unwrap().variables();
    let gradients = shard
        .variables
        .iter()
        .map(|name| {
            let spec = specs.iter().find(|s| &s.name == name).unwrap();
            dtf::transport::proto::encode(name, &ndarray::ArrayD::<f32>::zeros(spec.shape.clone()))
        })
        .collect();
    let pushed = ps0
        .push(pb::PushRequest {
            gradients,
            learning_rate: 0.1,
            step: 0,
            worker: 1,
            worker_incarnation: 1,
            loss: 1.0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pushed.global_step, 1, "ps:0 applied step 0: {pushed:?}");
    assert_eq!(reach(&c, 1, 0).await.global_step, 0, "ps:1 still waits");
    // Worker 1's first pull reads the shards at steps 1 and 0.
    c.start("worker", 1);
    for s in finish(&mut c).await {
        assert_eq!(s.global_step, 40, "ps:{}", s.task);
        assert_eq!(s.gradients_aggregated, 2 * 40, "ps:{}", s.task);
    }
}
}
