//! The ring copy of each shard's snapshots: a lost disk or host costs no
//! more than a killed process.
//!
//! With two or more ps tasks ([`Ring::new`]), ps `i` hands every
//! snapshot it writes to ps `(i+1) mod n`, which checks it (the identity of
//! shard `i` under its own config, every CRC) and keeps it beside its own:
//! `<its snapshot dir>/replica-ps-<i>/`, written like its own snapshots
//! (temp file, fsync, rename; two generations). A ps that starts with no
//! valid snapshot of its own (a replaced machine at the same address)
//! fetches that copy from `(i+1) mod n` before it serves: until then its
//! `State` says `fetching` (the chief waits rather than seeding it) and
//! `Initialize`, `Pull` and `Push` are refused `UNAVAILABLE`, saying why. A neighbour that does not
//! answer is waited for up to [`NEIGHBOUR_WAIT`]; then the ps serves without
//! it and the chief seeds the shard from the newest checkpoint.
//!
//! Both calls carry the cluster's token like every other call; a copy is
//! bounded by the size a snapshot of that shard can have before it is read.

use super::PsService;
use super::snapshot::{self, SnapshotError};
use crate::checkpoint::container::crc32;
use crate::config::Config;
use crate::model::Mlp;
use crate::transport::ring::{Replica, RingClient};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{error, info, warn};

/// How long a ps that starts with no snapshot of its own waits for its
/// neighbour's copy before it serves without it (the chief then seeds the
/// shard from the newest checkpoint).
pub const NEIGHBOUR_WAIT: Duration = Duration::from_secs(60);

/// How long a ps that starts with a snapshot of its own waits for its
/// neighbour's copy (which may be newer) before it serves with its own.
pub const NEIGHBOUR_WAIT_HELD: Duration = Duration::from_secs(10);

/// Bound on a call that carries no snapshot, and the fixed part of one
/// that does ([`transfer_timeout`]).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The slowest rate a copy is given time for: 10 MB/s (a tenth of a
/// 1 Gbit/s link), so a large shard's copy is not cut off by a fixed bound.
const FLOOR_BYTES_PER_SEC: u64 = 10_000_000;

/// How long a call carrying `bytes` of snapshot may take.
fn transfer_timeout(bytes: u64) -> Duration {
    CALL_TIMEOUT + Duration::from_secs(bytes / FLOOR_BYTES_PER_SEC)
}

/// The clients' own per-call bound (the ring's calls set theirs with
/// `tokio::time::timeout`, sized to what they carry).
pub(super) const CLIENT_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// How long a stopping ps gives the hand-over of its last snapshot.
const FINAL_HAND_OVER: Duration = Duration::from_secs(5);

/// An idle shard's newest snapshot is handed over again this often, so a
/// neighbour that restarted on an empty disk holds it again.
const RESEND_IDLE: Duration = Duration::from_secs(30);

/// Between asks of a neighbour that does not answer (a refused connection
/// costs nothing; a fresh cluster's ps tasks start at about the same time).
const RETRY: Duration = Duration::from_millis(250);

/// How often a wait for the neighbour says so.
const WAIT_LOG_EVERY: Duration = Duration::from_secs(10);

/// A ps task's place on the ring.
pub(super) struct Ring {
    /// This task's index.
    task: usize,
    /// `(i+1) mod n` and its address: keeps this shard's copies, and is
    /// asked for them at a start on an empty disk.
    pub next: Option<(usize, String)>,
    /// The copies this task keeps, of `(i-1) mod n`.
    keeps: Option<Kept>,
    /// The largest snapshot of this task's own shard (a fetch's time bound).
    own_bound: u64,
    /// The newest snapshot to hand over: (step, file bytes).
    outbox: watch::Sender<Option<(u64, bytes::Bytes)>>,
    /// Writes of kept copies, one at a time (the write owns the guard, so a
    /// caller that gives up does not let a second one start beside it); the
    /// file written last (kept beside the next, in case it is damaged) and
    /// its bytes' CRC-32 (a shard's rows move without its step: a copy of
    /// the same step may hold newer rows).
    written: std::sync::Arc<tokio::sync::Mutex<Option<(PathBuf, String)>>>,
    /// Reads for `FetchReplica`, one at a time (each holds a whole copy).
    reading: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// For `State` and `/metrics`.
    stats: Mutex<Stats>,
    /// Set while this task fetches its own copy at start.
    pub fetching: std::sync::atomic::AtomicBool,
    /// The latest kept copy could not be written (a full disk): the WARN
    /// is logged once per run of failures, and an INFO when one is again.
    keep_failing: std::sync::atomic::AtomicBool,
    /// This shard's snapshots outgrew a ring copy (said once).
    too_large: std::sync::atomic::AtomicBool,
}

/// Whose copies a ps keeps, and how they must look.
struct Kept {
    /// The ps before it on the ring.
    task: usize,
    /// That shard's snapshot identity ([`snapshot::identity`]).
    identity: String,
    /// The largest file a snapshot of that shard can be.
    bound: u64,
    /// `<own dir>/replica-ps-<task>`.
    dir: PathBuf,
}

#[derive(Debug, Default)]
struct Stats {
    /// The step of the newest copy the neighbour took.
    sent: u64,
    /// Its bytes' CRC-32: the rows of a step move without it.
    sent_crc: String,
    /// The incarnation of the neighbour that took it.
    taken_by: Option<u64>,
    /// Hand-overs that failed since start.
    failures: u64,
    /// The latest one failed (an ERROR is logged once per run of failures).
    failing: bool,
}

impl Ring {
    /// Ps `task`'s ring under `config`: none with one ps task, or with
    /// snapshots off or without a snapshot dir (`own`).
    ///
    /// Errors: [`crate::model::ModelError`] for a bad `model.layers`.
    pub(super) fn new(
        config: &Config,
        task: usize,
        own: Option<&Path>,
    ) -> Result<Self, crate::model::ModelError> {
        let n = config.cluster.ps.len();
        // Without widths (a ps waiting for the chief's) there is no shard to copy.
        let on = n >= 2
            && config.ps.snapshot_secs > 0
            && own.is_some()
            && !config.model.layers.is_empty();
        let variables = match on {
            true => Mlp::new(&config.model.layers)?.variables(),
            false => Vec::new(),
        };
        let specs = |t: usize| crate::placement::shard(config, &variables, t);
        let optimizer = config.train.optimizer();
        // A ring copy travels in one message: its rows are bounded so.
        let rows = snapshot::rows_bound(!crate::placement::tables(config).is_empty(), true);
        let (next, keeps) = match (on, own) {
            (true, Some(own)) => {
                let prev = (task + n - 1) % n;
                let next = (task + 1) % n;
                let kept = Kept {
                    task: prev,
                    identity: snapshot::identity(config, prev, &specs(prev)),
                    bound: snapshot::size_bound(&specs(prev), &optimizer, rows),
                    dir: own.join(format!("replica-ps-{prev}")),
                };
                // What a writer killed mid-copy left (only this task writes there).
                snapshot::remove_temps(&kept.dir);
                (Some((next, config.cluster.ps[next].clone())), Some(kept))
            }
            _ => (None, None),
        };
        Ok(Self {
            task,
            next,
            keeps,
            own_bound: snapshot::size_bound(&specs(task), &optimizer, rows),
            outbox: watch::channel(None).0,
            written: Default::default(),
            reading: Default::default(),
            stats: Mutex::new(Stats::default()),
            fetching: std::sync::atomic::AtomicBool::new(false),
            keep_failing: std::sync::atomic::AtomicBool::new(false),
            too_large: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// A snapshot was written: the sender hands it to the neighbour (the
    /// newest only, when it is behind).
    pub(super) fn offer(&self, step: u64, bytes: Vec<u8>) {
        if self.next.is_some() && bytes.len() as u64 > self.own_bound {
            // Its neighbour would refuse it: said once, kept on this disk.
            if !self
                .too_large
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                warn!(
                    ps = self.task,
                    bytes = bytes.len(),
                    bound = self.own_bound,
                    "This shard's snapshot is larger than a ring copy may be (its tables' rows \
                     pass transport::TABLE_BYTES): it is kept on this ps's own disk only."
                );
            }
            return;
        }
        if self.next.is_some() {
            self.outbox.send_replace(Some((step, bytes.into())));
        }
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// (the step of the newest copy the neighbour took, failed hand-overs).
    pub(super) fn report(&self) -> (u64, u64) {
        let s = self.stats();
        (s.sent, s.failures)
    }

    /// Refuses a call about shard `task` unless this ps keeps its copies.
    fn kept(&self, task: u32) -> Result<&Kept, Status> {
        match &self.keeps {
            Some(k) if k.task as u64 == u64::from(task) => Ok(k),
            Some(k) => Err(Status::failed_precondition(format!(
                "ps:{} keeps the copies of ps:{}, not of ps:{task}: cluster.ps differs between them",
                self.task, k.task
            ))),
            None => Err(Status::failed_precondition(format!(
                "ps:{} keeps no copies (one ps task, or snapshots off)",
                self.task
            ))),
        }
    }
}

impl PsService {
    /// `Replicate`: the previous ps's snapshot, checked and kept. Returns
    /// this process's incarnation.
    ///
    /// Errors: `FAILED_PRECONDITION` for a shard this ps does not keep,
    /// `INVALID_ARGUMENT` for a file too large, damaged or of another
    /// shard, `RESOURCE_EXHAUSTED` while the previous copy is still being
    /// written, `UNAVAILABLE` when it cannot be written (the error is logged).
    pub(super) async fn keep_copy(&self, task: u32, bytes: bytes::Bytes) -> Result<u64, Status> {
        let ring = &self.inner.ring;
        self.ring_ready()?;
        let kept = ring.kept(task)?;
        if bytes.len() as u64 > kept.bound {
            return Err(Status::invalid_argument(format!(
                "a snapshot of ps:{}'s shard is at most {} bytes, not {}",
                kept.task,
                kept.bound,
                bytes.len()
            )));
        }
        let Ok(mut written) = ring.written.clone().try_lock_owned() else {
            return Err(Status::resource_exhausted(format!(
                "ps:{} is still writing the previous copy",
                ring.task
            )));
        };
        let (dir, identity) = (kept.dir.clone(), kept.identity.clone());
        // The write owns the lock: it runs to its end even when the caller
        // has given up, and no other starts beside it. A copy it already
        // holds (an idle shard's, handed over again) is not written twice.
        let result = tokio::task::spawn_blocking(move || {
            let step = snapshot::verify(&dir, &bytes, &identity)?.step;
            let crc = crc32(&bytes);
            let held = written
                .as_ref()
                .is_some_and(|(p, c)| *p == snapshot::path(&dir, step) && *c == crc);
            if !held {
                let before = written.as_ref().map(|(p, _)| p.as_path());
                *written = Some((snapshot::write(&dir, step, &bytes, before, &[])?, crc));
            }
            Ok(())
        })
        .await
        .map_err(|e| Status::internal(format!("the writing task failed: {e}")))?;
        let failing = |now: bool| {
            ring.keep_failing
                .swap(now, std::sync::atomic::Ordering::AcqRel)
        };
        match result {
            Ok(()) => {
                if failing(false) {
                    info!(
                        ps = ring.task,
                        of = kept.task,
                        "Keeping the neighbour's snapshots again."
                    );
                }
                Ok(self.inner.incarnation)
            }
            Err(e @ SnapshotError::Invalid { .. }) => Err(Status::invalid_argument(e.to_string())),
            Err(e) => {
                // Once per run of failures: the neighbour hands a copy over
                // every snapshot (about once a second).
                if !failing(true) {
                    warn!(ps = ring.task, of = kept.task, error = %e, "Cannot keep the neighbour's snapshot; further failures are not logged until a copy is kept again.");
                }
                Err(Status::unavailable(format!(
                    "ps:{} cannot keep the copy: {e}",
                    ring.task
                )))
            }
        }
    }

    /// `FetchReplica`: the newest valid copy this ps keeps of shard
    /// `task`; `None` when it keeps none.
    ///
    /// Errors: `FAILED_PRECONDITION` for a shard this ps does not keep.
    pub(super) async fn fetch_copy(&self, task: u32) -> Result<Option<Replica>, Status> {
        let ring = &self.inner.ring;
        self.ring_ready()?;
        let kept = ring.kept(task)?;
        let Ok(reading) = ring.reading.clone().try_lock_owned() else {
            return Err(Status::resource_exhausted(format!(
                "ps:{} is already reading a copy for another call",
                ring.task
            )));
        };
        let (dir, identity, bound, task) = (
            kept.dir.clone(),
            kept.identity.clone(),
            kept.bound,
            self.inner.task,
        );
        // Every copy is checked, and the one holding the highest step is
        // handed over, whatever its name says (issue 45).
        let found = tokio::task::spawn_blocking(move || {
            let _reading = reading;
            let mut best: Option<(u64, Vec<u8>)> = None;
            for (_, path) in snapshot::list(&dir) {
                let read = snapshot::of_this_shard(&path, &identity)
                    .and_then(|()| snapshot::read_regular(&path, bound))
                    .and_then(|bytes| {
                        let step = snapshot::verify(&path, &bytes, &identity)?.step;
                        Ok((step, bytes))
                    });
                match read {
                    Ok(copy) if best.as_ref().is_none_or(|b| copy.0 > b.0) => best = Some(copy),
                    Ok(_) => {}
                    Err(e) => warn!(ps = task, error = %e, "Neighbour's copy skipped."),
                }
            }
            best
        })
        .await
        .map_err(|e| Status::internal(format!("the reading task failed: {e}")))?;
        Ok(found.map(|(step, bytes)| Replica {
            step,
            snapshot: bytes.into(),
        }))
    }

    /// While this ps fetches its copy at start, the answer to `Initialize`,
    /// `Pull` and `Push` (`State` says `fetching`).
    pub(super) fn serving(&self) -> Result<(), Status> {
        self.widths_known()?;
        let ring = &self.inner.ring;
        if !ring.fetching.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let next = ring.next.as_ref().map_or(0, |n| n.0);
        Err(Status::unavailable(format!(
            "ps:{} started with no snapshot of its own and is fetching its shard's copy from \
             ps:{next}; it serves once it has it, or after {} s without an answer",
            self.inner.task,
            NEIGHBOUR_WAIT.as_secs()
        )))
    }
}

/// Hands each new snapshot to the neighbour until `stop`; while the shard
/// is idle, checks every [`RESEND_IDLE`] that the neighbour that took the
/// newest is still the same process, and hands it over again if not. A
/// failed hand-over is counted, logged at ERROR once until one succeeds;
/// training goes on.
pub(super) async fn send(service: PsService, client: RingClient, stop: CancellationToken) {
    let ring = &service.inner.ring;
    let mut rx = ring.outbox.subscribe();
    loop {
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(RESEND_IDLE) => {}
            _ = stop.cancelled() => return,
        }
        let Some((step, bytes)) = rx.borrow_and_update().clone() else {
            continue;
        };
        let taken_by = {
            let s = ring.stats();
            (s.sent == step && s.sent_crc == crc32(&bytes))
                .then_some(s.taken_by)
                .flatten()
        };
        if let Some(holder) = taken_by {
            let incarnation = client.incarnation();
            if let Ok(Ok(now)) = tokio::time::timeout(CALL_TIMEOUT, incarnation).await
                && now == holder
            {
                continue;
            }
        }
        if let Err(why) = hand_over(ring, &client, step, bytes, transfer_timeout).await {
            let (next, addr) = ring.next.as_ref().expect("a ring with a neighbour");
            fail(&mut ring.stats(), ring.task, *next, addr, &why);
        }
    }
}

/// A stopping ps's last snapshot (written after [`send`] stopped), handed
/// over within [`FINAL_HAND_OVER`] when the neighbour does not have it. Not
/// counted as a failure when it cannot be (the neighbour may be stopping
/// too).
pub(super) async fn send_last(service: &PsService, client: &RingClient) {
    let ring = &service.inner.ring;
    let Some((step, bytes)) = ring.outbox.borrow().clone() else {
        return;
    };
    {
        let s = ring.stats();
        if s.sent == step && s.sent_crc == crc32(&bytes) {
            return;
        }
    }
    if let Err(why) = hand_over(ring, client, step, bytes, |_| FINAL_HAND_OVER).await {
        info!(ps = ring.task, step, error = %why, "The last snapshot was not handed to the neighbour (it keeps the one before).");
    }
}

/// One hand-over, bounded by `bound` of its size: recorded when the
/// neighbour took it, or skipped when it is still writing the one before.
///
/// Errors: why it failed.
async fn hand_over(
    ring: &Ring,
    client: &RingClient,
    step: u64,
    bytes: bytes::Bytes,
    bound: impl Fn(u64) -> Duration,
) -> Result<(), String> {
    let Some((next, _)) = &ring.next else {
        return Ok(());
    };
    let limit = bound(bytes.len() as u64);
    let crc = crc32(&bytes);
    let result = tokio::time::timeout(limit, client.replicate(ring.task, step, bytes)).await;
    let mut stats = ring.stats();
    match result {
        Ok(Ok(incarnation)) => {
            if stats.failing {
                info!(
                    ps = ring.task,
                    neighbour = next,
                    step,
                    "The neighbour keeps this shard's snapshots again."
                );
            }
            stats.failing = false;
            stats.sent = step;
            stats.sent_crc = crc;
            stats.taken_by = Some(incarnation);
            Ok(())
        }
        // Still writing the one before: this one is skipped, the next goes.
        Ok(Err(status)) if status.code() == tonic::Code::ResourceExhausted => Ok(()),
        Ok(Err(status)) => Err(status.to_string()),
        Err(_) => Err(format!("no answer within {} s", limit.as_secs())),
    }
}

fn fail(stats: &mut Stats, task: usize, next: usize, addr: &str, why: &str) {
    stats.failures += 1;
    if !stats.failing {
        error!(
            ps = task,
            neighbour = next,
            address = addr,
            error = why,
            "The neighbour does not keep this shard's snapshot; training goes on, and a lost disk of this ps would go back to the newest checkpoint."
        );
    }
    stats.failing = true;
}

/// At every start: asks the neighbour for this shard's copy, writes it
/// beside this ps's own snapshots and restores the newest of them
/// ([`snapshot::restore`]): a state directory put back from an older copy
/// must not win over the newer state the ring keeps (issue 45). Waits for
/// a neighbour that does not answer up to [`NEIGHBOUR_WAIT`] with no
/// snapshot of its own, [`NEIGHBOUR_WAIT_HELD`] with one, saying so. Then
/// this ps serves (`fetching` was set by the caller, and is cleared here,
/// whatever happened).
pub(super) async fn fetch_own(
    service: PsService,
    config: std::sync::Arc<Config>,
    client: RingClient,
    stop: CancellationToken,
    own: snapshot::Restore,
) {
    let ring = &service.inner.ring;
    let task = ring.task;
    let Some((next, addr)) = ring.next.clone() else {
        return;
    };
    let wait = if own == snapshot::Restore::Nothing {
        info!(
            ps = task,
            neighbour = next,
            "No snapshot of its own (a new or emptied disk): fetching this shard's copy from its neighbour before serving."
        );
        NEIGHBOUR_WAIT
    } else {
        info!(
            ps = task,
            neighbour = next,
            "Asking the neighbour for its copy of this shard before serving: the newer of its copy and this ps's own snapshot is restored."
        );
        NEIGHBOUR_WAIT_HELD
    };
    let started = Instant::now();
    let mut logged: Option<Instant> = None;
    loop {
        let limit = transfer_timeout(ring.own_bound);
        let why = match tokio::time::timeout(limit, client.fetch(task)).await {
            Ok(Ok(answer)) => {
                take(&service, &config, answer, next).await;
                break;
            }
            Ok(Err(status)) if refusal(status.code()) => {
                warn!(ps = task, neighbour = next, address = %addr, error = %status, "The neighbour refused to hand over this shard's copy; serving without it (the chief seeds the shard from the newest checkpoint).");
                break;
            }
            Ok(Err(status)) => status.to_string(),
            Err(_) => format!("no answer within {} s", limit.as_secs()),
        };
        if started.elapsed() >= wait {
            warn!(ps = task, neighbour = next, address = %addr, waited_secs = wait.as_secs(), error = %why, "The neighbour did not answer: serving without this shard's copy (with its own snapshot, if it has one; else the chief seeds the shard from the newest checkpoint).");
            break;
        }
        if logged.is_none_or(|t| t.elapsed() >= WAIT_LOG_EVERY) {
            logged = Some(Instant::now());
            warn!(ps = task, neighbour = next, address = %addr, error = %why, waited_secs = started.elapsed().as_secs(), limit_secs = wait.as_secs(), "Waiting for the neighbour that keeps this shard's copy.");
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = stop.cancelled() => break,
        }
    }
    ring.fetching
        .store(false, std::sync::atomic::Ordering::Release);
}

/// A refusal that asking again will not change (a different list or
/// token, an older dtf); anything else (down, busy, a timeout, a reset
/// connection) is asked again until [`NEIGHBOUR_WAIT`].
fn refusal(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        FailedPrecondition | Unauthenticated | PermissionDenied | Unimplemented | InvalidArgument
    )
}

/// The neighbour's answer: its copy checked as this shard's (identity,
/// CRCs), written beside this ps's own snapshots under the step it holds,
/// then the newest of them restored ([`snapshot::restore`]). A copy newer
/// than what this ps restored of its own is a fault worth a WARN: its own
/// state directory was older than it should be (put back from a copy, or
/// its writes failed).
async fn take(
    service: &PsService,
    config: &std::sync::Arc<Config>,
    answer: Option<Replica>,
    next: usize,
) {
    let task = service.inner.task;
    let Some(answer) = answer else {
        info!(
            ps = task,
            neighbour = next,
            "The neighbour keeps no copy of this shard (a new cluster, or its disk is new too)."
        );
        return;
    };
    let Some(dir) = service.inner.snapshots.dir.clone() else {
        return;
    };
    let own = service.inner.snapshots.pending().as_ref().map(|r| r.step);
    let (service, config) = (service.clone(), config.clone());
    let done = tokio::task::spawn_blocking(move || {
        let identity = &service.inner.snapshots.identity;
        let step = snapshot::verify(&dir, &answer.snapshot, identity)?.step;
        if own.is_some_and(|own| own >= step) {
            info!(
                ps = task,
                neighbour = next,
                own_step = own,
                copy_step = step,
                "This ps's own snapshot is as new as the neighbour's copy: keeping it."
            );
            return Ok(None);
        }
        snapshot::write_beside(&dir, step, &answer.snapshot)?;
        info!(
            ps = task,
            neighbour = next,
            step,
            "Fetched this shard's copy from its neighbour."
        );
        let restored = snapshot::restore(&service, &config);
        let now = service.inner.snapshots.pending().as_ref().map(|r| r.step);
        Ok::<_, SnapshotError>(Some((restored, step, now)))
    })
    .await;
    match done {
        Ok(Ok(None)) => {}
        Ok(Ok(Some((snapshot::Restore::Held, copy, now)))) => {
            if let (Some(own), Some(now)) = (own, now)
                && now > own
            {
                warn!(
                    ps = task,
                    own_step = own,
                    restored_step = now,
                    steps_behind = now - own,
                    neighbour = next,
                    copy_step = copy,
                    "This ps's own snapshot was older than its neighbour's copy (its state directory was put back from an older copy, or its writes failed): restored the neighbour's."
                );
            }
        }
        Ok(Ok(Some(_))) => info!(
            ps = task,
            "The neighbour's copy was not restored (see above): waiting for the chief."
        ),
        Ok(Err(e)) => {
            error!(ps = task, error = %e, "Cannot write the neighbour's copy: waiting for the chief.")
        }
        Err(e) => {
            error!(ps = task, error = %e, "The restoring task failed: waiting for the chief.")
        }
    }
}
