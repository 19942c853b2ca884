//! A ps's own snapshots (`[ps] snapshot_secs`): a killed ps comes back from
//! its snapshot, not the checkpoint; a damaged or foreign snapshot is
//! ignored; a snapshot that cannot be written costs nothing but the snapshot.

use crate::util::*;
use dtf::config::Mode;
use dtf::transport::pb;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(crate) const RUN: Duration = Duration::from_secs(120);

/// Waits until ps `i` answers a state that `want` accepts.
pub(crate) async fn wait_state(
    c: &Cluster,
    i: usize,
    what: &str,
    want: impl Fn(&pb::StateResponse) -> bool,
) -> pb::StateResponse {
    let ps = c.client(i, Some(TOKEN)).await;
    eventually(RUN, what, || {
        let mut ps = ps.clone();
        let want = &want;
        async move { ps_state(&mut ps).await.filter(|s| want(s)) }
    })
    .await
}

/// A run that only ends when the test says so, whose only checkpoint is
/// the one written at its start (step 0): a ps that comes back at a later
/// step did not come back from a checkpoint.
pub(crate) fn long_run(
    ps: usize,
    workers: usize,
    mode: Mode,
    transport: dtf::config::Transport,
) -> Cluster {
    let mut c = Cluster::new(ps, workers, 1_000_000, mode);
    c.cfg.checkpoint.save_secs = Some(3600);
    c.cfg.ps.snapshot_secs = 1;
    c.use_transport(transport);
    c
}

/// Ends the run at a live `last_step` a little past where it is, and
/// checks that every task exits 0.
pub(crate) async fn finish(c: &mut Cluster) -> pb::StateResponse {
    let room = room(c).await;
    let now = wait_state(c, 0, "a state", |s| s.initialized)
        .await
        .global_step;
    c.cfg.train.last_step = now + room;
    c.write_config_by_rename();
    let last = c.cfg.train.last_step;
    let s = wait_state(c, 0, "the run to complete", |s| s.complete).await;
    assert_eq!(s.global_step, last);
    tokio::task::block_in_place(|| c.wait_all_success(RUN));
    s
}

/// The snapshot files of ps `i`, newest first.
fn snapshots(c: &Cluster, i: usize) -> Vec<PathBuf> {
    let dir = Path::new(&c.cfg.ps.snapshot_dir).join(format!("ps-{i}"));
    shard_files(&dir).into_iter().map(|(_, p)| p).collect()
}

/// Kills ps `i` once it has a snapshot past step 100, restarts it, and
/// checks it restored that snapshot or a newer one (never the checkpoint of
/// step 0), and that training goes on from there.
async fn kill_and_restore(c: &mut Cluster, i: usize) -> pb::StateResponse {
    restart_and_restore(c, i, Disk::Kept).await
}

/// What a killed ps comes back to.
#[derive(PartialEq)]
enum Disk {
    /// Its own snapshot dir.
    Kept,
    /// An empty one (a replaced machine): its shard comes from its neighbour.
    Lost,
}

/// Kills ps `i` once its snapshot past step 100 is on disk (`Disk::Lost`:
/// kept by its neighbour), restarts it, and checks it restored that
/// snapshot or a newer one (never the checkpoint of step 0), and that
/// training goes on from there.
async fn restart_and_restore(c: &mut Cluster, i: usize, disk: Disk) -> pb::StateResponse {
    let before = wait_state(c, i, "a snapshot past step 100", |s| {
        let kept = match disk {
            Disk::Kept => s.snapshot_step,
            Disk::Lost => s.replica_step,
        };
        s.snapshot_age_seconds >= 0.0 && kept > 100
    })
    .await;
    c.kill(&format!("ps:{i}"));
    let before = pb::StateResponse {
        snapshot_step: match disk {
            Disk::Kept => before.snapshot_step,
            Disk::Lost => before.replica_step,
        },
        ..before
    };
    if disk == Disk::Lost {
        let dir = Path::new(&c.cfg.ps.snapshot_dir).join(format!("ps-{i}"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
    c.start("ps", i);
    let after = wait_state(c, i, "the restarted ps to serve", |s| {
        s.initialized && s.incarnation != before.incarnation
    })
    .await;
    assert!(
        after.restored && after.restored_step >= before.snapshot_step,
        "ps:{i} came back at step {} (restored: {}), but it had a snapshot of step {}; log:\n{}",
        after.restored_step,
        after.restored,
        before.snapshot_step,
        c.log(&format!("ps:{i}"))
    );
    c.wait_log(
        &format!("ps:{i}"),
        "Shard restored from its snapshot.",
        1,
        RUN,
    );
    // The cluster goes on from the restored step.
    let restored = after.restored_step;
    wait_state(c, i, "training past the restored step", |s| {
        s.global_step > restored + 100
    })
    .await;
    let chief = c.wait_log(
        "worker:0",
        "restored its shard from its own snapshot",
        1,
        RUN,
    );
    assert!(
        !chief.contains("Restored the model"),
        "the chief must not re-seed a ps that restored its snapshot:\n{chief}"
    );
    let line = chief
        .lines()
        .find(|l| l.contains("restored its shard from its own snapshot"))
        .unwrap();
    assert!(
        line.contains(&format!("ps={i}")) && line.contains("steps_lost="),
        "{line}"
    );
    after
}

crate::on_each_transport! {
async fn a_killed_ps_restores_its_snapshot_not_the_checkpoint(transport) {
    let mut c = long_run(1, 2, Mode::Async, transport);
    c.start_all();
    kill_and_restore(&mut c, 0).await;
    // dtf status shows the snapshot.
    let out = c.dtf(&["status", "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(j["tasks"][0]["snapshot_step"].as_u64().is_some_and(|s| s > 0), "{j}");
    assert!(j["tasks"][0]["snapshot_age_secs"].as_f64().is_some(), "{j}");
    let table = String::from_utf8(c.dtf(&["status"]).stdout).unwrap();
    assert!(table.contains("SNAPSHOT") && table.contains(" s ago"), "{table}");
    finish(&mut c).await;
    c.assert_transport(transport);
}
}

crate::on_each_transport! {
async fn one_of_two_ps_killed_restores_its_own_shard(transport) {
    let mut c = long_run(2, 2, Mode::Async, transport);
    c.start_all();
    let other = wait_state(&c, 0, "ps:0 training", |s| s.global_step > 0).await;
    kill_and_restore(&mut c, 1).await;
    // The other shard kept its process and its progress.
    let now = wait_state(&c, 0, "ps:0", |s| s.initialized).await;
    assert_eq!(now.incarnation, other.incarnation);
    assert!(!now.restored);
    finish(&mut c).await;
}
}

crate::on_each_transport! {
async fn a_ps_on_an_empty_disk_fetches_its_shard_from_its_neighbour(transport) {
    let mut c = long_run(2, 2, Mode::Async, transport);
    c.start_all();
    let other = wait_state(&c, 0, "ps:0 training", |s| s.global_step > 0).await;
    restart_and_restore(&mut c, 1, Disk::Lost).await;
    let log = c.log("ps:1");
    assert!(log.contains("Fetched this shard's copy from its neighbour."), "{log}");
    // The neighbour kept its process, its progress, and keeps the new copies.
    let now = wait_state(&c, 0, "ps:0", |s| s.initialized).await;
    assert_eq!(now.incarnation, other.incarnation);
    let copied = wait_state(&c, 1, "ps:1's copy kept again", |s| s.replica_step > s.restored_step).await;
    assert_eq!(copied.replica_failures, 0, "{copied:?}");
    // Its own copy of ps:1's neighbour (ps:0 keeps ps:1's, ps:1 keeps ps:0's).
    until(RUN, "ps:1 keeping ps:0's copy again", || {
        let dir = Path::new(&c.cfg.ps.snapshot_dir).join("ps-1/replica-ps-0");
        (std::fs::read_dir(dir).ok()?.count() > 0).then_some(())
    });
    finish(&mut c).await;
}
}

/// Kills both ps of a 2-ps run once each has a snapshot past step 100 and
/// its neighbour a copy of it, and empties ps:1's disk: ps:1 restarted
/// alone waits for ps:0, saying so in `State` and `dtf status`, and refuses
/// pulls with the reason.
async fn both_down_one_disk_lost(c: &mut Cluster) -> (u64, u64) {
    let zero = wait_state(c, 0, "ps:0 snapshotted", |s| s.snapshot_step > 100).await;
    let one = wait_state(c, 1, "ps:1's copy kept", |s| s.replica_step > 100).await;
    c.kill("ps:0");
    c.kill("ps:1");
    std::fs::remove_dir_all(Path::new(&c.cfg.ps.snapshot_dir).join("ps-1")).unwrap();
    c.start("ps", 1);
    c.wait_log(
        "ps:1",
        "Waiting for the neighbour that keeps this shard's copy.",
        1,
        RUN,
    );
    let mut ps = c.client(1, Some(TOKEN)).await;
    let s = ps.state(pb::StateRequest {}).await.unwrap().into_inner();
    assert!(s.fetching && !s.initialized, "{s:?}");
    let refused = ps.pull(pb::PullRequest::default()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("fetching its shard's copy from ps:0"),
        "{refused:?}"
    );
    let table = String::from_utf8(c.dtf(&["status"]).stdout).unwrap();
    assert!(
        table.contains("FETCHING ITS SHARD FROM ITS NEIGHBOUR"),
        "{table}"
    );
    (zero.snapshot_step, one.replica_step)
}

crate::on_each_transport! {
async fn an_empty_ps_waits_for_its_neighbour_and_then_fetches(transport) {
    let mut c = long_run(2, 2, Mode::Async, transport);
    c.start_all();
    let (zero, one) = both_down_one_disk_lost(&mut c).await;
    c.start("ps", 0);
    for (i, at_least) in [(0, zero), (1, one)] {
        let s = wait_state(&c, i, "the shard restored", |s| s.initialized).await;
        assert!(s.restored && s.restored_step >= at_least, "ps:{i}: {s:?}");
    }
    c.wait_log("ps:1", "Fetched this shard's copy from its neighbour.", 1, RUN);
    let chief = c.wait_log("worker:0", "restored its shard from its own snapshot", 2, RUN);
    assert!(!chief.contains("Restored the model"), "{chief}");
    finish(&mut c).await;
}
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_ps_whose_neighbour_stays_down_falls_back_to_the_checkpoint() {
    let mut c = long_run(2, 2, Mode::Async, dtf::config::Transport::Tcp);
    c.start_all();
    both_down_one_disk_lost(&mut c).await;
    // 60 s (`replica::NEIGHBOUR_WAIT`), then it serves without the copy.
    let log = c.wait_log(
        "ps:1",
        "The neighbour did not answer: serving without",
        1,
        RUN,
    );
    assert!(log.contains("waited_secs=60"), "{log}");
    c.start("ps", 0);
    // The chief seeds ps:1 from the checkpoint; ps:0 comes from its snapshot.
    let one = wait_state(&c, 1, "ps:1 seeded", |s| s.initialized).await;
    assert!(!one.restored, "{one:?}");
    let zero = wait_state(&c, 0, "ps:0 restored", |s| s.initialized).await;
    assert!(zero.restored, "{zero:?}");
    c.wait_log("worker:0", "Restored the model", 1, RUN);
    finish(&mut c).await;
}

/// The ring's calls, from a hostile or misconfigured client: refused with
/// the reason, nothing kept.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_ring_calls_are_refused_and_keep_nothing() {
    let mut c = long_run(2, 1, Mode::Async, dtf::config::Transport::Tcp);
    c.start("ps", 0);
    c.start("ps", 1);
    // ps:1 keeps ps:0's copies (ps:0 hands them to ps:1), no one else's.
    let mut ps1 = c.client(1, Some(TOKEN)).await;
    wait_state(&c, 1, "ps:1 serving", |s| !s.fetching).await;
    let replicate = |task: u32, snapshot: &'static [u8]| pb::ReplicateRequest {
        task,
        step: 5,
        snapshot: snapshot.into(),
    };
    let e = ps1.replicate(replicate(1, b"x")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("keeps the copies of ps:0"), "{e:?}");
    let e = ps1
        .replicate(replicate(0, b"not a snapshot"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = ps1
        .fetch_replica(pb::FetchReplicaRequest { task: 2 })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    // Nothing was kept: a fetch finds nothing.
    let held = ps1
        .fetch_replica(pb::FetchReplicaRequest { task: 0 })
        .await
        .unwrap();
    assert!(!held.into_inner().held);
    let kept = Path::new(&c.cfg.ps.snapshot_dir).join("ps-1/replica-ps-0");
    assert_eq!(std::fs::read_dir(&kept).map_or(0, |d| d.count()), 0);
    // Without the token, neither call is served.
    let mut anon = c.client(1, None).await;
    let e = anon.replicate(replicate(0, b"x")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = anon
        .fetch_replica(pb::FetchReplicaRequest { task: 0 })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
}

crate::on_each_transport! {
async fn a_killed_sync_ps_resumes_from_a_whole_step(transport) {
    let mut c = long_run(1, 2, Mode::Sync, transport);
    c.start_all();
    kill_and_restore(&mut c, 0).await;
    let s = finish(&mut c).await;
    // Every update since the restart averaged both replicas' gradients: no
    // half-summed step was applied, none twice.
    assert_eq!(s.gradients_aggregated, 2 * s.updates_applied, "{s:?}");
}
}

/// The chief's line for ps `i`'s restore: `(restored_step, resumed_at)`.
fn resumed(c: &Cluster, i: usize) -> (u64, u64) {
    let log = c.log("worker:0");
    let line = log
        .lines()
        .rfind(|l| {
            l.contains("restored its shard from its own snapshot")
                && l.contains(&format!("ps={i} "))
        })
        .unwrap_or_else(|| panic!("no restore of ps:{i} in the chief's log:\n{log}"));
    let field = |k: &str| -> u64 {
        let v = line
            .split(&format!("{k}="))
            .nth(1)
            .unwrap_or_else(|| panic!("{k} in {line}"));
        v.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("restored_step"), field("resumed_at"))
}

crate::on_each_transport! {
/// Sync with two ps: the killed ps 0 (the global step's) comes back from
/// its own snapshot at the step of the shard that kept running (partial
/// recovery): the global step does not go back to the checkpoint, and the
/// shards agree on the step again.
async fn a_killed_sync_ps_of_two_resumes_at_the_other_shards_step(transport) {
    let mut c = long_run(2, 2, Mode::Sync, transport);
    c.start_all();
    let other = wait_state(&c, 1, "ps:1 training", |s| s.global_step > 0).await;
    let before = wait_state(&c, 0, "ps:0 past step 100", |s| s.global_step > 100).await;
    kill_and_restore(&mut c, 0).await;
    let (restored, resumed_at) = resumed(&c, 0);
    // Not the checkpoint (step 0): the step ps:0 had reached, give or take
    // the one step the shards of a sync run may be apart.
    assert!(resumed_at + 1 >= before.global_step && resumed_at >= restored, "resumed at {resumed_at} from {restored}; ps:0 was at {} before the kill", before.global_step);
    let now = wait_state(&c, 1, "ps:1", |s| s.initialized).await;
    assert_eq!(now.incarnation, other.incarnation, "ps:1 kept its process");
    let last = finish(&mut c).await.global_step;
    // Both shards end at last_step: they count steps together again.
    assert_shard_ends_at(&c, 1, last);
    let log = c.log("worker:0");
    assert!(!log.contains("Restored the model"), "the chief must not go back to the checkpoint:\n{log}");
}
}

crate::on_each_transport! {
/// Sync with two ps and snapshots off: the killed ps 1 is seeded from the
/// checkpoint (step 0 here) at ps 0's step; ps 0 keeps its process and its
/// progress, and the global step does not go back.
async fn a_sync_shard_without_a_snapshot_is_seeded_at_the_other_shards_step(transport) {
    let mut c = long_run(2, 2, Mode::Sync, transport);
    c.cfg.ps.snapshot_secs = 0;
    c.write_config();
    c.start_all();
    let one = wait_state(&c, 1, "ps:1 past step 100", |s| s.global_step > 100).await;
    c.kill("ps:1");
    let zero = wait_state(&c, 0, "ps:0", |s| s.initialized).await;
    c.start("ps", 1);
    let after = wait_state(&c, 1, "the restarted ps:1 to serve", |s| {
        s.initialized && s.incarnation != one.incarnation
    })
    .await;
    assert!(!after.restored, "{after:?}");
    assert!(after.global_step + 1 >= zero.global_step, "ps:1 resumed at {}, ps:0 was at {}", after.global_step, zero.global_step);
    let log = c.wait_log("worker:0", "partial recovery", 1, RUN);
    let line = log.lines().find(|l| l.contains("partial recovery")).unwrap();
    assert!(line.contains("ps=[1]") && line.contains("checkpoint_step=0"), "{line}");
    let now = wait_state(&c, 0, "ps:0", |s| s.initialized).await;
    assert_eq!(now.incarnation, zero.incarnation, "ps:0 kept its process");
    assert!(now.global_step >= zero.global_step, "ps:0 went back: {} < {}", now.global_step, zero.global_step);
    let last = finish(&mut c).await.global_step;
    assert_shard_ends_at(&c, 1, last);
}
}

/// Sync with two ps, a lost disk: ps 1 gets its shard from ps 0's copy
/// and resumes at ps 0's step.
#[tokio::test(flavor = "multi_thread")]
async fn a_sync_ps_on_an_empty_disk_fetches_its_shard_from_its_neighbour() {
    let mut c = long_run(2, 2, Mode::Sync, dtf::config::Transport::Tcp);
    c.start_all();
    restart_and_restore(&mut c, 1, Disk::Lost).await;
    let log = c.log("ps:1");
    assert!(
        log.contains("Fetched this shard's copy from its neighbour."),
        "{log}"
    );
    let (restored, resumed_at) = resumed(&c, 1);
    assert!(resumed_at >= restored, "{resumed_at} < {restored}");
    let last = finish(&mut c).await.global_step;
    assert_shard_ends_at(&c, 1, last);
}

/// Ps `i` (exited) logged its shard's step at the run's end as `last`.
fn assert_shard_ends_at(c: &Cluster, i: usize, last: u64) {
    let log = c.log(&format!("ps:{i}"));
    let line = log
        .lines()
        .find(|l| l.contains("Run complete."))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.contains(&format!("shard_step={last}")),
        "ps:{i}'s shard did not end at {last}: {line}"
    );
}

/// Flips a byte of a tensor in `path` (its CRC no longer matches).
fn damage(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let n = bytes.len();
    bytes[n - 2] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
}

/// Rewrites the identity in `path`'s header as another task's, keeping the
/// length (the tensors and their CRCs stay valid).
fn make_foreign(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let needle = br#"\"task\":0"#;
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("no task in {}'s identity", path.display()));
    bytes[at + needle.len() - 1] = b'7';
    std::fs::write(path, bytes).unwrap();
}

crate::on_each_transport! {
async fn a_damaged_or_foreign_snapshot_is_ignored_and_the_checkpoint_used(transport) {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.cfg.checkpoint.save_secs = Some(3600);
    c.use_transport(transport);
    c.start_all();
    let before = wait_state(&c, 0, "two snapshots", |s| s.snapshot_step > 100).await;
    until(RUN, "two snapshot files", || (snapshots(&c, 0).len() == 2).then_some(()));
    c.kill("ps:0");
    let files = snapshots(&c, 0);
    damage(&files[0]);
    make_foreign(&files[1]);
    c.start("ps", 0);
    let log = c.wait_log("ps:0", "Snapshot ignored.", 2, RUN);
    assert!(log.contains("fails its checksum"), "{log}");
    assert!(log.contains("another run or shard"), "{log}");
    // The chief seeds it from the checkpoint (step 0), as without snapshots.
    let after = wait_state(&c, 0, "the restarted ps to be seeded", |s| {
        s.initialized && s.incarnation != before.incarnation
    })
    .await;
    assert!(!after.restored, "{after:?}");
    c.wait_log("worker:0", "Restored the model", 1, RUN);
    assert!(!c.log("worker:0").contains("from its own snapshot"));
    finish(&mut c).await;
}
}

/// How a test makes the snapshot directory unwritable.
enum Unwritable {
    /// A file where ps-0/ should be.
    FileInTheWay,
    /// A 4 KiB tmpfs (as root; else skipped, saying so).
    Full,
    /// Read-only: a read-only tmpfs as root, else mode 0500.
    ReadOnly,
}

/// Unmounts (lazily) what a test mounted, even when it fails.
struct Mounted(PathBuf);
impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

fn mount_tmpfs(dir: &Path, options: &str) -> Option<Mounted> {
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", options, "tmpfs"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    ok.then(|| Mounted(dir.to_path_buf()))
}

/// Training goes on past every failed snapshot: one ERROR, every failure
/// counted (in `State`, `/metrics` and `dtf status`), and snapshots resume
/// once the directory is writable again.
async fn unwritable(transport: dtf::config::Transport, how: Unwritable) {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.use_transport(transport);
    let state = PathBuf::from(&c.cfg.ps.snapshot_dir);
    std::fs::create_dir_all(&state).unwrap();
    let root = rustix::process::geteuid().is_root();
    let _mounted = match how {
        Unwritable::FileInTheWay => {
            std::fs::write(state.join("ps-0"), b"in the way").unwrap();
            None
        }
        Unwritable::Full if root => {
            Some(mount_tmpfs(&state, "size=4k,mode=0755").expect("mount a tmpfs as root"))
        }
        Unwritable::Full => {
            eprintln!("not root: cannot mount a small tmpfs; the full-disk case is not run");
            return;
        }
        Unwritable::ReadOnly if root => {
            Some(mount_tmpfs(&state, "ro,size=64k").expect("mount a tmpfs as root"))
        }
        Unwritable::ReadOnly => {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o500)).unwrap();
            None
        }
    };
    let metrics = free_addrs(1).remove(0);
    c.start_env("ps", 0, &[("DTF_METRICS__LISTEN", &metrics)]);
    c.start("worker", 0);
    let s = wait_state(&c, 0, "three failed snapshots", |s| {
        s.snapshot_failures >= 3
    })
    .await;
    assert!(s.global_step > 0, "training goes on: {s:?}");
    let log = c.log("ps:0");
    assert_eq!(
        log.matches("Snapshot not written").count(),
        1,
        "one ERROR for a run of failures:\n{log}"
    );
    assert!(log.contains("ERROR"), "{log}");
    let text = until(RUN, "/metrics", || http_get(&metrics, "/metrics"));
    let failures = text
        .lines()
        .find(|l| l.starts_with("dtf_snapshot_failures_total "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no dtf_snapshot_failures_total in:\n{text}"));
    assert!(failures >= 3.0, "{text}");
    let table = String::from_utf8(c.dtf(&["status"]).stdout).unwrap();
    assert!(table.contains("failed)"), "{table}");
    // Writable again: snapshots resume, said once.
    drop(_mounted);
    match how {
        Unwritable::FileInTheWay => std::fs::remove_file(state.join("ps-0")).unwrap(),
        Unwritable::ReadOnly if !root => {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o750)).unwrap();
        }
        _ => {}
    }
    c.wait_log("ps:0", "Snapshots written again.", 1, RUN);
    wait_state(&c, 0, "a snapshot", |s| s.snapshot_step > 0).await;
    assert!(!snapshots(&c, 0).is_empty());
    finish(&mut c).await;
}

crate::on_each_transport! {
async fn a_file_where_the_snapshot_dir_should_be_costs_only_snapshots(transport) {
    unwritable(transport, Unwritable::FileInTheWay).await;
}
}

crate::on_each_transport! {
async fn a_full_snapshot_disk_costs_only_snapshots(transport) {
    unwritable(transport, Unwritable::Full).await;
}
}

crate::on_each_transport! {
async fn a_read_only_snapshot_dir_costs_only_snapshots(transport) {
    unwritable(transport, Unwritable::ReadOnly).await;
}
}

/// The state directory outlives runs: a ps on a host that cannot see
/// `checkpoint.dir` restores the last run's snapshot when a new run starts.
/// It holds it aside; a worker started before the chief waits (it does not
/// take the old step, at `last_step`, for the end of this run); the chief,
/// whose run the snapshot is not, seeds the shard afresh.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_run_does_not_continue_the_last_runs_snapshot() {
    let mut c = Cluster::new(1, 2, 2000, Mode::Sync);
    c.cfg.ps.snapshot_secs = 1;
    c.write_config();
    // The ps's host has no checkpoint.dir (another host's).
    let elsewhere = tempfile::tempdir().unwrap();
    let absent = elsewhere.path().join("absent");
    let env = [("DTF_CHECKPOINT__DIR", absent.as_os_str())];
    c.start_with_env("ps", 0, &env);
    c.start("worker", 0);
    c.start("worker", 1);
    tokio::task::block_in_place(|| c.wait_all_success(RUN));
    assert!(
        !snapshots(&c, 0).is_empty(),
        "the first run left a snapshot"
    );
    // A new run: a new, empty checkpoint directory, the same state
    // directory, the same last_step as the snapshot's step.
    let fresh = tempfile::tempdir().unwrap();
    c.cfg.checkpoint.dir = fresh.path().join("ckpt");
    c.write_config();
    c.start_with_env("ps", 0, &env);
    c.wait_log("ps:0", "Shard restored from its snapshot.", 1, RUN);
    let s = wait_state(&c, 0, "the ps to serve", |_| true).await;
    assert!(s.restored && !s.initialized && s.run != 0, "{s:?}");
    c.start("worker", 1);
    c.wait_log(
        "worker:1",
        "Waiting for the chief to initialize the model.",
        1,
        RUN,
    );
    c.start("worker", 0);
    tokio::task::block_in_place(|| c.wait_all_success(RUN));
    let chief = c.log("worker:0");
    assert!(chief.contains("is of another run"), "{chief}");
    let steps = checkpoint_steps(&c.cfg.checkpoint.dir);
    assert_eq!(
        steps.first(),
        Some(&0),
        "the new run starts at step 0: {steps:?}"
    );
    assert_eq!(steps.last(), Some(&2000), "{steps:?}");
    // The new run's checkpoints carry its run id, not the old snapshot's.
    let specs = dtf::model::Mlp::new(&c.cfg.model.layers)
        .unwrap()
        .variables();
    let (_, ckpt) = dtf::checkpoint::restore_latest(&c.cfg.checkpoint.dir, &specs)
        .unwrap()
        .unwrap();
    assert!(
        ckpt.run != 0 && ckpt.run != s.run,
        "{} vs {}",
        ckpt.run,
        s.run
    );
}
