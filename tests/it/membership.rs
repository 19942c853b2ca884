//! Cluster membership, enforced and elastic: a worker the ps tasks do not
//! list and a second process for a listed index are refused (exit 78);
//! workers join and leave a running run through an edit of
//! `cluster.worker`, async and sync, on both transports; bad edits change
//! nothing.

use crate::util::*;
use dtf::config::{Mode, Transport};
use dtf::transport::pb;
use std::time::Duration;

const RUN: Duration = Duration::from_secs(120);

/// Waits until ps 0's state satisfies `ok`; returns it.
async fn ps0(
    c: &Cluster,
    what: &str,
    ok: impl Fn(&pb::StateResponse) -> bool,
) -> pb::StateResponse {
    eventually(RUN, what, || async { c.state(0).await.filter(|s| ok(s)) }).await
}

/// Waits until ps 0 is initialized and past `step`.
async fn past(c: &Cluster, step: u64) -> pb::StateResponse {
    ps0(c, &format!("ps:0 past step {step}"), |s| {
        s.initialized && s.global_step > step
    })
    .await
}

/// Updates and gradients ps 0 aggregates over the next `steps` sync steps.
async fn aggregates(c: &Cluster, steps: u64) -> (u64, u64) {
    let a = past(c, 0).await;
    let b = ps0(c, "more sync updates", |s| {
        s.updates_applied >= a.updates_applied + steps
    })
    .await;
    (
        b.updates_applied - a.updates_applied,
        b.gradients_aggregated - a.gradients_aggregated,
    )
}

/// `name`'s exit status, waiting at most [`RUN`].
fn exit_code(c: &mut Cluster, name: &str) -> Option<i32> {
    tokio::task::block_in_place(|| c.wait(name, RUN)).code()
}

/// Moves `train.last_step` to [`room`](crate::util::room) steps past ps 0's step, waits for
/// every process to exit 0, and checks that the run ended exactly there:
/// one update per step (none lost, none applied twice) and the final
/// checkpoint at `last_step`.
async fn end_run(c: &mut Cluster, running: &[&str]) {
    let room = room(c).await;
    let now = past(c, 0).await.global_step;
    let last = now + room;
    c.cfg.train.last_step = last;
    c.write_config_by_rename();
    let end = ps0(c, "the run to complete", |s| s.complete).await;
    assert_eq!(end.global_step, last, "{end:?}");
    assert_eq!(
        end.pushes_applied.max(end.updates_applied),
        last,
        "one update per step: {end:?}"
    );
    for n in running {
        let code = exit_code(c, n);
        assert_eq!(code, Some(0), "{n}:\n{}", c.log(n));
    }
    assert!(
        checkpoint_steps(&c.cfg.checkpoint.dir).contains(&last),
        "final checkpoint at {last}: {:?}",
        checkpoint_steps(&c.cfg.checkpoint.dir)
    );
}

/// An unknown worker (a host whose file lists one more) and a second
/// process for worker 1: both refused, both exit 78 saying why; the run
/// goes on with the newer worker 1.
async fn refused(transport: Transport, mode: Mode) {
    let mut c = Cluster::new(1, 2, 1_000_000, mode);
    c.use_transport(transport);
    c.start_all();
    past(&c, 20).await;
    let mut other = c.cfg.clone();
    other.cluster.worker.push(free_addrs(1).remove(0));
    let other_path = c.dir.path().join("other.toml");
    std::fs::write(&other_path, other.to_toml()).unwrap();
    c.start_as("worker:2", "worker", 2, &other_path);
    assert_eq!(
        exit_code(&mut c, "worker:2"),
        Some(78),
        "{}",
        c.log("worker:2")
    );
    let log = c.log("worker:2");
    assert!(
        log.contains("worker 2 is not in cluster.worker of ps:0"),
        "{log}"
    );
    let s = past(&c, 0).await;
    assert!(s.membership_refusals >= 1, "{s:?}");
    let w2 = s
        .workers
        .iter()
        .find(|w| w.task == 2)
        .expect("worker 2 listed");
    assert!(!w2.member && w2.refused >= 1, "{w2:?}");
    assert!(c.log("ps:0").contains("Refused."), "{}", c.log("ps:0"));
    let status = tokio::task::block_in_place(|| c.dtf(&["status"]));
    let table = String::from_utf8_lossy(&status.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("worker:2"))
        .unwrap_or_else(|| panic!("no worker:2 row:\n{table}"));
    assert!(row.contains("NOT A MEMBER"), "{table}");

    // A second worker 1 (a unit started on two hosts): the newer one takes
    // the index over; the older is refused at its next push and exits 78.
    let path = c.config_path.clone();
    c.start_as("worker:1b", "worker", 1, &path);
    assert_eq!(
        exit_code(&mut c, "worker:1"),
        Some(78),
        "{}",
        c.log("worker:1")
    );
    let log = c.log("worker:1");
    assert!(
        log.contains("took over task index 1 of cluster.worker"),
        "{log}"
    );
    c.wait_log(
        "ps:0",
        "A new process took over the worker's task index",
        1,
        RUN,
    );
    // The newer one trains (in sync, no step completes without it).
    let at = past(&c, 0).await.global_step;
    past(&c, at + 20).await;
    assert!(
        c.child("worker:1b").try_wait().unwrap().is_none(),
        "{}",
        c.log("worker:1b")
    );
    c.assert_transport(transport);
}

crate::on_each_transport! {
async fn unknown_and_duplicate_workers_are_refused_async(transport) {
    refused(transport, Mode::Async).await;
}
}

crate::on_each_transport! {
async fn unknown_and_duplicate_workers_are_refused_sync(transport) {
    refused(transport, Mode::Sync).await;
}
}

/// Worker 1 is added to a running one-worker run: no task restarts, the
/// run does not wait for it before it starts, it trains once started (in
/// sync, every step then averages both), and the run ends exactly at
/// `last_step`.
async fn joins(transport: Transport, mode: Mode) {
    let mut c = Cluster::new(1, 1, 1_000_000, mode);
    c.use_transport(transport);
    c.start_all();
    past(&c, 20).await;
    c.cfg.cluster.worker.push(free_addrs(1).remove(0));
    c.write_config_by_rename();
    c.wait_log("ps:0", "Membership changed.", 1, RUN);
    c.wait_log("worker:0", "Configuration reloaded.", 1, RUN);
    let s = ps0(&c, "two members", |s| s.members == 2).await;
    assert_eq!(s.membership_epoch, 2, "{s:?}");
    // Listed but not started: no step waits for it.
    past(&c, s.global_step + 20).await;
    c.start("worker", 1);
    c.wait_log("ps:0", "Worker joined.", 1, RUN);
    ps0(&c, "worker 1 trains", |s| {
        s.workers
            .iter()
            .any(|w| w.task == 1 && w.member && w.refused == 0)
    })
    .await;
    if mode == Mode::Sync {
        let (updates, gradients) = aggregates(&c, 20).await;
        assert_eq!(gradients, 2 * updates, "each step averages both workers");
    }
    end_run(&mut c, &["worker:0", "worker:1", "ps:0"]).await;
    let log = c.log("worker:1");
    assert!(!log.contains("(0 steps computed here)"), "{log}");
    assert!(log.contains("Finished at global step"), "{log}");
    c.assert_transport(transport);
}

crate::on_each_transport! {
async fn a_worker_joins_a_running_run_async(transport) {
    joins(transport, Mode::Async).await;
}
}

crate::on_each_transport! {
async fn a_worker_joins_a_running_run_sync(transport) {
    joins(transport, Mode::Sync).await;
}
}

/// Removes worker 2 (the last) from `cluster.worker` and checks that it
/// exits 0 saying it left.
fn remove_worker_2(c: &mut Cluster) {
    c.cfg.cluster.worker.pop();
    c.write_config_by_rename();
    assert_eq!(exit_code(c, "worker:2"), Some(0), "{}", c.log("worker:2"));
    let log = c.log("worker:2");
    assert!(
        log.contains("Left the cluster (removed from cluster.worker)"),
        "{log}"
    );
}

/// Worker 2 is removed from a running run (while it pushes, and while the
/// chief checkpoints every second): it finishes its step, says it left, and
/// exits 0; the others go on (in sync, every step then averages the two
/// left) to exactly `last_step`.
async fn leaves(transport: Transport, mode: Mode) {
    let mut c = Cluster::new(1, 3, 1_000_000, mode);
    c.use_transport(transport);
    c.start_all();
    past(&c, 50).await;
    remove_worker_2(&mut c);
    let s = ps0(&c, "two members", |s| s.members == 2).await;
    assert_eq!(s.membership_epoch, 2, "{s:?}");
    if mode == Mode::Sync {
        let (updates, gradients) = aggregates(&c, 20).await;
        assert_eq!(gradients, 2 * updates, "each step averages the two left");
    }
    end_run(&mut c, &["worker:0", "worker:1", "ps:0"]).await;
}

crate::on_each_transport! {
async fn a_worker_leaves_a_running_run_async(transport) {
    leaves(transport, Mode::Async).await;
}
}

crate::on_each_transport! {
async fn a_worker_leaves_a_running_run_sync(transport) {
    leaves(transport, Mode::Sync).await;
}
}

crate::on_each_transport! {
/// Worker 2 removed while the chief writes a checkpoint at every step (so
/// the removal lands during one): it leaves cleanly, every checkpoint
/// written meanwhile verifies, and the run ends exactly at `last_step`.
async fn a_worker_leaves_while_the_chief_checkpoints(transport) {
    let mut c = Cluster::new(1, 3, 1_000_000, Mode::Async);
    c.use_transport(transport);
    c.cfg.checkpoint.save_secs = None;
    c.cfg.checkpoint.save_steps = 1;
    c.write_config();
    c.start_all();
    past(&c, 50).await;
    until(RUN, "the chief checkpointing", || {
        (checkpoint_steps(&c.cfg.checkpoint.dir).len() >= 3).then_some(())
    });
    remove_worker_2(&mut c);
    ps0(&c, "two members", |s| s.members == 2).await;
    let specs = dtf::model::Mlp::new(&c.cfg.model.layers).unwrap().variables();
    for step in checkpoint_steps(&c.cfg.checkpoint.dir) {
        let path = c
            .cfg
            .checkpoint
            .dir
            .join(format!("model.ckpt-{step}.safetensors"));
        // One may be deleted (max_to_keep) between the listing and the read.
        if let Err(e) = dtf::checkpoint::load(&path, Some(&specs))
            && path.exists()
        {
            panic!("{}: {e}", path.display());
        }
    }
    // Back to a checkpoint a second for the rest of the run.
    c.cfg.checkpoint.save_steps = 0;
    c.cfg.checkpoint.save_secs = Some(1);
    c.write_config_by_rename();
    end_run(&mut c, &["worker:0", "worker:1", "ps:0"]).await;
}
}

crate::on_each_transport! {
/// Worker 1 added, removed and added again within a second: the cluster
/// settles on the last edit, and worker 1 then joins and trains.
async fn a_flapping_worker_list_settles_on_the_last_edit(transport) {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Sync);
    c.use_transport(transport);
    c.start_all();
    past(&c, 20).await;
    let extra = free_addrs(1).remove(0);
    for add in [true, false, true] {
        if add {
            c.cfg.cluster.worker.push(extra.clone());
        } else {
            c.cfg.cluster.worker.pop();
        }
        c.write_config_by_rename();
        // The edits' pace is the scenario (a flapping automation), not a wait.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let s = ps0(&c, "two members", |s| s.members == 2).await;
    assert!(s.membership_epoch >= 2, "{s:?}");
    past(&c, s.global_step + 20).await;
    c.start("worker", 1);
    c.wait_log("ps:0", "Worker joined.", 1, RUN);
    let (updates, gradients) = aggregates(&c, 20).await;
    assert_eq!(gradients, 2 * updates, "each step averages both workers");
    end_run(&mut c, &["worker:0", "worker:1", "ps:0"]).await;
}
}

/// Edits of `cluster.worker` that cannot work are refused on every task,
/// naming the keys, and the running membership stays: removing a worker
/// that `train.replicas_to_aggregate` needs, a duplicate address, an empty
/// list, another chief, a changed entry in the middle; an empty ps list, or
/// one that names a worker's address.
#[tokio::test(flavor = "multi_thread")]
async fn bad_membership_edits_change_nothing() {
    let mut c = Cluster::new(1, 3, 1_000_000, Mode::Sync);
    c.cfg.train.replicas_to_aggregate = Some(3);
    c.write_config();
    c.start_all();
    past(&c, 10).await;
    let good = c.cfg.cluster.worker.clone();
    let fresh = free_addrs(1).remove(0);
    let edits: [(Vec<String>, &[&str]); 5] = [
        (
            good[..2].to_vec(),
            &["train.replicas_to_aggregate", "cluster.worker"],
        ),
        (
            vec![good[0].clone(), good[1].clone(), good[1].clone()],
            &["duplicate address"],
        ),
        (vec![], &["worker 0 is the chief"]),
        (
            vec![fresh.clone(), good[1].clone(), good[2].clone()],
            &["worker 0, the chief, cannot be removed"],
        ),
        (
            vec![good[0].clone(), fresh, good[2].clone()],
            &["entry 1 changed"],
        ),
    ];
    let names = ["ps:0", "worker:0", "worker:1", "worker:2"];
    for (k, (workers, says)) in edits.into_iter().enumerate() {
        c.cfg.cluster.worker = workers;
        c.write_config_by_rename();
        for n in names {
            let log = c.wait_log(n, "Reload rejected", k + 1, RUN);
            let line = log
                .lines()
                .filter(|l| l.contains("Reload rejected"))
                .nth(k)
                .unwrap_or_default();
            for s in says {
                assert!(line.contains(s), "{n}, edit {k}: {line}");
            }
        }
    }
    // The ps list likewise: emptied, or naming a worker's address.
    c.cfg.cluster.worker = good.clone();
    let ps = c.cfg.cluster.ps.clone();
    let ps_edits = [
        (vec![], "is empty"),
        (vec![ps[0].clone(), good[1].clone()], "duplicate address"),
    ];
    for (k, (list, says)) in ps_edits.into_iter().enumerate() {
        c.cfg.cluster.ps = list;
        c.write_config_by_rename();
        for n in names {
            let log = c.wait_log(n, "Reload rejected", 6 + k, RUN);
            let line = log
                .lines()
                .filter(|l| l.contains("Reload rejected"))
                .nth(5 + k)
                .unwrap_or_default();
            assert!(
                line.contains("cluster.ps") && line.contains(says),
                "{n}: {line}"
            );
        }
    }
    c.cfg.cluster.ps = ps;
    c.write_config_by_rename();
    let s = past(&c, 0).await;
    assert!(!s.resharding, "{s:?}");
    assert_eq!((s.members, s.membership_epoch), (3, 1), "{s:?}");
    // Still training, all three.
    let (updates, gradients) = aggregates(&c, 10).await;
    assert_eq!(gradients, 3 * updates);
    for n in names {
        assert!(
            c.child(n).try_wait().unwrap().is_none(),
            "{n}:\n{}",
            c.log(n)
        );
    }
}

/// ps `i`'s variables, waiting until it is initialized past `step`.
async fn shard_past(c: &Cluster, i: usize, step: u64) -> Vec<String> {
    eventually(
        RUN,
        &format!("ps:{i} initialized past step {step}"),
        || async {
            c.state(i)
                .await
                .filter(|s| s.initialized && s.global_step > step)
        },
    )
    .await
    .variables
}

/// The ps list grows from 1 to 2 and shrinks back mid-run: each time the
/// chief checkpoints the old ps tasks once they stop taking pushes, every
/// task starts again (the same process) under the new list, and the chief
/// seeds the new placement from that checkpoint — no step lost. The ps
/// dropped from the list exits 0; the run ends at `last_step` with a
/// final checkpoint that evaluates.
async fn reshards(transport: Transport, mode: Mode) {
    let mut c = Cluster::new(1, 2, 1_000_000, mode);
    // A small minimum part (`model.partitioner = "min_size"`, the default):
    // layer1/weights (64 x 16 floats, 4096 bytes) is whole on 1 ps, and the
    // re-shard to 2 re-partitions it in two; the shrink back joins it.
    c.cfg.model.min_shard_bytes = 1024;
    c.use_transport(transport);
    c.start_all();
    past(&c, 50).await;
    // Both started under the first list (a worker slow to start would read
    // the edited file at its start, and have nothing to start again for).
    for n in ["worker:0", "worker:1"] {
        c.wait_log(n, "Training.", 1, RUN);
    }
    let all = c.state(0).await.unwrap().variables;
    assert_eq!(all.len(), 4, "{all:?}");
    let pids: Vec<u32> = ["ps:0", "worker:0", "worker:1"]
        .iter()
        .map(|n| c.child(n).id())
        .collect();

    c.cfg.cluster.ps.push(free_addrs(1).remove(0));
    c.write_config_by_rename();
    c.start("ps", 1);
    let saved = logged_step(&c, "worker:0", "Re-shard checkpoint done", 1);
    let restored = logged_step(&c, "worker:0", "Restored the model from the newest", 1);
    assert_eq!(
        restored, saved,
        "the new placement starts where the old one stopped"
    );
    let (a, b) = (
        shard_past(&c, 0, saved).await,
        shard_past(&c, 1, saved).await,
    );
    assert_eq!(
        a,
        ["layer1/weights/part_0", "layer1/biases", "layer2/biases"],
        "{b:?}"
    );
    assert_eq!(b, ["layer1/weights/part_1", "layer2/weights"], "{a:?}");
    for n in ["ps:0", "worker:0", "worker:1"] {
        c.wait_log(n, "Starting again under the new cluster.ps.", 1, RUN);
    }
    past(&c, saved + 50).await;
    // A reload signal just after the start again is a reload, not the end.
    c.signal("ps:0", libc::SIGHUP);
    let now = past(&c, 0).await.global_step;
    past(&c, now + 50).await;
    assert!(
        c.child("ps:0").try_wait().unwrap().is_none(),
        "{}",
        c.log("ps:0")
    );

    c.cfg.cluster.ps.pop();
    c.write_config_by_rename();
    assert_eq!(exit_code(&mut c, "ps:1"), Some(0), "{}", c.log("ps:1"));
    assert!(
        c.log("ps:1").contains("No longer in cluster.ps"),
        "{}",
        c.log("ps:1")
    );
    let saved = logged_step(&c, "worker:0", "Re-shard checkpoint done", 2);
    let restored = logged_step(&c, "worker:0", "Restored the model from the newest", 2);
    assert_eq!(restored, saved);
    assert_eq!(shard_past(&c, 0, saved).await, all);
    // The same processes throughout: each started again in place.
    let now: Vec<u32> = ["ps:0", "worker:0", "worker:1"]
        .iter()
        .map(|n| c.child(n).id())
        .collect();
    assert_eq!(now, pids);

    past(&c, saved + 50).await;
    let room = room(&c).await;
    let last = past(&c, 0).await.global_step + room;
    c.cfg.train.last_step = last;
    c.write_config_by_rename();
    let end = ps0(&c, "the run to complete", |s| s.complete).await;
    assert_eq!(end.global_step, last, "{end:?}");
    for n in ["worker:0", "worker:1", "ps:0"] {
        assert_eq!(exit_code(&mut c, n), Some(0), "{n}:\n{}", c.log(n));
    }
    let ev = dtf::eval::evaluate(&c.cfg.checkpoint.dir, &c.cfg.data.dir).unwrap();
    assert_eq!(ev.global_step, last);
    assert!(ev.ema_accuracy > 0.9, "EMA accuracy {}", ev.ema_accuracy);
    c.assert_transport(transport);
}

crate::on_each_transport! {
async fn the_ps_list_grows_and_shrinks_back_async(transport) {
    reshards(transport, Mode::Async).await;
}
}

crate::on_each_transport! {
async fn the_ps_list_grows_and_shrinks_back_sync(transport) {
    reshards(transport, Mode::Sync).await;
}
}

/// A ps whose file is edited late (another host's copy): the chief waits
/// 10 s for it to stop taking pushes, checkpoints anyway and says so; the
/// ps is not told (its list has not changed), and the chief, started
/// again under the new list, waits for it, saying why. Once its file is
/// edited, the ps stops taking pushes, `dtf status` shows it re-sharding
/// (the chief held stopped meanwhile), and the chief tells it again: it
/// starts again under the new placement and the run goes on to its end.
#[tokio::test(flavor = "multi_thread")]
async fn a_ps_whose_file_is_edited_late_still_moves_to_the_new_placement() {
    let mut c = Cluster::new(1, 2, 1_000_000, Mode::Async);
    c.use_transport(Transport::Tcp);
    let own = c.dir.path().join("ps-0.toml");
    std::fs::write(&own, c.cfg.to_toml()).unwrap();
    c.start_as("ps:0", "ps", 0, &own);
    c.start("worker", 0);
    c.start("worker", 1);
    past(&c, 50).await;

    c.cfg.cluster.ps.push(free_addrs(1).remove(0));
    c.write_config_by_rename();
    c.start("ps", 1);
    let log = c.wait_log("worker:0", "still take pushes", 1, RUN);
    assert!(log.contains("checkpointing anyway"), "{log}");
    c.wait_log("worker:0", "These ps tasks do not re-shard", 1, RUN);
    c.wait_log(
        "worker:0",
        "Waiting for ps tasks that hold another placement",
        1,
        RUN,
    );

    c.signal("worker:0", libc::SIGSTOP);
    std::fs::write(&own, c.cfg.to_toml()).unwrap();
    c.wait_log("ps:0", "cluster.ps changed: the cluster re-shards", 1, RUN);
    let status = tokio::task::block_in_place(|| c.dtf(&["status"]));
    let table = String::from_utf8_lossy(&status.stdout).into_owned();
    c.signal("worker:0", libc::SIGCONT);
    let row = table
        .lines()
        .find(|l| l.starts_with("ps:0"))
        .unwrap_or_else(|| panic!("no ps:0 row:\n{table}"));
    assert!(row.contains("RE-SHARDING"), "{table}");
    assert!(table.contains("re-sharding   ps:0"), "{table}");

    c.wait_log("ps:0", "Starting again under the new cluster.ps.", 1, RUN);
    let (a, b) = (shard_past(&c, 0, 50).await, shard_past(&c, 1, 50).await);
    assert_eq!((a.len(), b.len()), (2, 2), "{a:?} {b:?}");
    let now = past(&c, 0).await.global_step;
    past(&c, now + 50).await;
    let room = room(&c).await;
    let now = past(&c, 0).await.global_step + room;
    c.cfg.train.last_step = now;
    c.write_config_by_rename();
    std::fs::write(&own, c.cfg.to_toml()).unwrap();
    for n in ["worker:0", "worker:1", "ps:0", "ps:1"] {
        assert_eq!(exit_code(&mut c, n), Some(0), "{n}:\n{}", c.log(n));
    }
    assert!(checkpoint_steps(&c.cfg.checkpoint.dir).contains(&now));
}

/// Issue 44: a re-shard with one worker frozen (SIGSTOP) once paused the
/// whole cluster 29 s: after the chief's word each ps waited in the
/// server's graceful stop for the frozen worker's HTTP/2 connection to
/// close (keepalive). The drain is bounded now: the ps starts again under
/// the new list within about a second of the re-shard checkpoint, and the
/// frozen worker, once continued, follows it.
#[tokio::test(flavor = "multi_thread")]
async fn a_reshard_does_not_wait_for_a_frozen_worker() {
    let mut c = Cluster::new(1, 2, 1_000_000, Mode::Async);
    c.use_transport(Transport::Tcp);
    c.start_all();
    past(&c, 50).await;
    for n in ["worker:0", "worker:1"] {
        c.wait_log(n, "Training.", 1, RUN);
    }
    c.signal("worker:1", libc::SIGSTOP);
    c.cfg.cluster.ps.push(free_addrs(1).remove(0));
    c.write_config_by_rename();
    c.start("ps", 1);
    c.wait_log("worker:0", "Re-shard checkpoint done", 1, RUN);
    // Well inside the 30 s the drain took, with room for a loaded machine
    // (a failure here leaves worker:1 stopped: the cluster's drop kills it).
    c.wait_log(
        "ps:0",
        "Starting again under the new cluster.ps.",
        1,
        Duration::from_secs(10),
    );
    c.signal("worker:1", libc::SIGCONT);
    c.wait_log("ps:0", "their connections are dropped", 1, RUN);
    let (a, b) = (shard_past(&c, 0, 50).await, shard_past(&c, 1, 50).await);
    assert_eq!(a.len() + b.len(), 4, "{a:?} {b:?}");
    c.wait_log(
        "worker:1",
        "Starting again under the new cluster.ps.",
        1,
        RUN,
    );
    let now = past(&c, 0).await.global_step;
    past(&c, now + 50).await;
}
