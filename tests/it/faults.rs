//! Recovery from SIGKILL of any task at any moment.

use crate::util::*;
use dtf::config::Mode;
use dtf::transport::pb;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::time::Duration;

const FASHION: &str = "/usr/share/datasets/fashion-mnist";
const LAST: u64 = 3000;

/// The reference model and hyperparameters on Fashion-MNIST, checkpointing every second.
fn reference_cluster(transport: dtf::config::Transport) -> Cluster {
    assert!(
        PathBuf::from(FASHION).is_dir(),
        "{FASHION} is missing: apt-get install dataset-fashion-mnist"
    );
    let mut c = Cluster::new(1, 2, LAST, Mode::Async);
    let defaults = dtf::config::Config::default();
    c.cfg.train = dtf::config::TrainConfig {
        last_step: LAST,
        ..defaults.train
    };
    c.cfg.model = defaults.model;
    c.cfg.data.dir = FASHION.into();
    c.cfg.checkpoint.save_secs = Some(1);
    c.use_transport(transport);
    c
}

async fn global_step(ps: &mut PsClient) -> Option<pb::StateResponse> {
    let s = ps.state(pb::StateRequest {}).await.ok()?.into_inner();
    s.initialized.then_some(s)
}

/// The step of the newest checkpoint on disk that verifies.
fn newest_checkpoint(c: &Cluster) -> u64 {
    let specs = dtf::model::Mlp::new(&c.cfg.model.layers)
        .unwrap()
        .variables();
    dtf::checkpoint::restore_latest(&c.cfg.checkpoint.dir, &specs)
        .unwrap()
        .map_or(0, |(_, ck)| ck.global_step)
}

crate::on_each_transport! {
async fn sigkill_of_every_role_at_random_moments_still_reaches_last_step(transport) {
    // The uninterrupted run, for comparison.
    let mut reference = reference_cluster(transport);
    reference.start_all();
    tokio::task::block_in_place(|| reference.wait_all_success(Duration::from_secs(300)));
    let expected =
        dtf::eval::evaluate(&reference.cfg.checkpoint.dir, &reference.cfg.data.dir).unwrap();

    let mut c = reference_cluster(transport);
    c.start_all();
    let mut ps = c.client(0, Some(TOKEN)).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let victims = ["ps:0", "worker:0", "worker:1"];
    let mut kills = 0;
    let mut step = 0;
    while kills < 12 {
        // A random moment: some tens to a few hundred steps on.
        let target = step + rng.random_range(40..200);
        let s = eventually(Duration::from_secs(120), "training to progress", || {
            let mut ps = ps.clone();
            async move {
                global_step(&mut ps)
                    .await
                    .filter(|s| s.global_step >= target)
            }
        })
        .await;
        if s.global_step > LAST - 300 {
            break;
        }
        let victim = victims[kills % victims.len()];
        // A timed checkpoint past the initial one, so that a restore from it
        // is told apart from a fresh start.
        let saved = tokio::task::block_in_place(|| {
            until(Duration::from_secs(60), "a checkpoint past step 0", || {
                let n = newest_checkpoint(&c);
                (n > 0).then_some(n)
            })
        });
        let restores = c.log("worker:0").matches("Restored the model").count();
        c.kill(victim);
        let (role, index) = victim.split_once(':').unwrap();
        c.start(role, index.parse().unwrap());
        kills += 1;
        let resumed = eventually(
            Duration::from_secs(60),
            "the cluster to serve again",
            || {
                let mut ps = ps.clone();
                async move { global_step(&mut ps).await }
            },
        )
        .await;
        if victim == "ps:0" {
            assert_ne!(
                resumed.incarnation, s.incarnation,
                "the restarted ps has a new incarnation"
            );
            if resumed.restored {
                // It restored its own snapshot, which it takes only when
                // newer than the newest checkpoint.
                assert!(
                    resumed.restored_step > saved && resumed.global_step >= resumed.restored_step,
                    "after killing ps:0: restored its snapshot of step {}, resumed at {}, but checkpoint {saved} existed",
                    resumed.restored_step,
                    resumed.global_step
                );
            } else {
                // The chief re-seeded it from a checkpoint no older than the
                // newest one before the kill.
                let log = c.wait_log(
                    "worker:0",
                    "Restored the model",
                    restores + 1,
                    Duration::from_secs(60),
                );
                let restored: u64 = log
                    .lines()
                    .rfind(|l| l.contains("Restored the model"))
                    .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("step=")))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("no step= in the chief's restore line:\n{log}"));
                assert!(
                    restored >= saved && resumed.global_step >= restored,
                    "after killing ps:0: restored step {restored}, resumed at {}, but checkpoint {saved} existed",
                    resumed.global_step
                );
            }
        } else {
            // A worker's death costs the ps nothing: same process, no step lost.
            assert!(
                resumed.incarnation == s.incarnation && resumed.global_step >= s.global_step,
                "after killing {victim}: ps at step {} (incarnation {}), was at {} ({})",
                resumed.global_step,
                resumed.incarnation,
                s.global_step,
                s.incarnation
            );
        }
        step = resumed.global_step;
        ps = c.client(0, Some(TOKEN)).await;
    }
    assert!(kills >= 10, "only {kills} kills before the end of the run");
    tokio::task::block_in_place(|| c.wait_all_success(Duration::from_secs(300)));
    let got = dtf::eval::evaluate(&c.cfg.checkpoint.dir, &c.cfg.data.dir).unwrap();
    assert_eq!(got.global_step, LAST, "final step {}", got.global_step);
    assert!(
        (got.ema_accuracy - expected.ema_accuracy).abs() <= 0.015,
        "EMA accuracy {} after {kills} kills vs {} uninterrupted",
        got.ema_accuracy,
        expected.ema_accuracy
    );
    c.assert_transport(transport);
}
}

/// A worker that misses the end of the run (stopped while it came) finds
/// the ps tasks gone when it resumes: it reads the final checkpoint and
/// ends too, rather than waiting for them for ever (a partition test once
/// left a worker so after it healed a moment before the run's end).
#[test]
fn a_worker_that_missed_the_end_of_the_run_finds_the_final_checkpoint_and_exits() {
    // Long enough for worker 1 to be stopped while it trains (the tiny
    // model makes thousands of steps a second).
    const LAST: u64 = 20_000;
    let mut c = Cluster::new(1, 2, LAST, Mode::Async);
    c.start_all();
    c.wait_log("worker:1", "Training.", 1, Duration::from_secs(120));
    c.signal("worker:1", libc::SIGSTOP);
    for task in ["worker:0", "ps:0"] {
        let s = c.wait(task, Duration::from_secs(180));
        assert!(s.success(), "{task} exited with {s}; log:\n{}", c.log(task));
    }
    assert!(checkpoint_steps(&c.cfg.checkpoint.dir).last() >= Some(&LAST));
    c.signal("worker:1", libc::SIGCONT);
    let s = c.wait("worker:1", Duration::from_secs(60));
    assert!(
        s.success(),
        "worker:1 exited with {s}; log:\n{}",
        c.log("worker:1")
    );
    let log = c.log("worker:1");
    assert!(
        log.contains("the final checkpoint is written: the run is complete"),
        "{log}"
    );
}
