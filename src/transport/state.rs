//! A ps task's state as dtf's own types: what `State` answers, read by the
//! worker, the chief, `dtf status` and the ps's `/metrics`. The wire's
//! `StateResponse` becomes a [`PsState`] here and nowhere else.

use super::pb;
use std::time::Duration;

/// One ps task's state and counters at a moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PsState {
    /// The ps task's index.
    pub task: u32,
    /// Random per process start: a change means the ps restarted.
    pub incarnation: u64,
    /// The cluster's identity (`transport::cluster_id`): tells another
    /// cluster's ps at the same address.
    pub cluster: String,
    /// The chief has seeded (or the ps adopted) the shard.
    pub initialized: bool,
    /// The shard's step.
    pub global_step: u64,
    /// The chief declared the run complete.
    pub complete: bool,
    /// The variables this shard holds (parts: `model.partitioner`), in model order.
    pub variables: Vec<String>,
    /// Their f32 values, slots and shadows excluded.
    pub parameters: u64,
    /// Optimizer passes applied.
    pub updates_applied: u64,
    /// Gradients summed into sync steps.
    pub gradients_aggregated: u64,
    /// Pushes dropped as stale (sync).
    pub stale_gradients: u64,
    /// Pushes applied.
    pub pushes_applied: u64,
    /// The latest push's loss.
    pub last_loss: f32,
    /// Examples per second over the last few seconds.
    pub examples_per_sec: f64,
    /// Every worker as this ps knows it from its pushes.
    pub workers: Vec<WorkerContact>,
    /// Shared-memory connections open now.
    pub shm_connections: u32,
    /// `cluster.compression` as this ps applies it.
    pub compression: String,
    /// The membership's epoch: each change of `cluster.worker` adds one.
    pub membership_epoch: u64,
    /// Pushes refused by the membership.
    pub membership_refusals: u64,
    /// Entries of `cluster.worker` now.
    pub members: u32,
    /// The step of its newest snapshot (0: none yet).
    pub snapshot_step: u64,
    /// Seconds since that snapshot (-1: none).
    pub snapshot_age_seconds: f64,
    /// Snapshots that failed since start.
    pub snapshot_failures: u64,
    /// Seconds the latest snapshot took to write.
    pub snapshot_seconds: f64,
    /// Bytes of the latest snapshot.
    pub snapshot_bytes: u64,
    /// Seconds the latest snapshot's copy under the lock took.
    pub snapshot_copy_seconds: f64,
    /// The ps started from a snapshot of its own.
    pub restored: bool,
    /// The step of that snapshot.
    pub restored_step: u64,
    /// The run the shard (or its snapshot held aside) belongs to (0: none).
    pub run: u64,
    /// `cluster.ps` changed: pushes wait for the chief's re-shard checkpoint.
    pub resharding: bool,
    /// The step of the newest snapshot the neighbour took from this ps.
    pub replica_step: u64,
    /// Snapshots this ps could not hand to its neighbour since it started.
    pub replica_failures: u64,
    /// Fetching its shard's copy from its neighbour: not initialized, and
    /// `Initialize`, `Pull` and `Push` refused until then.
    pub fetching: bool,
    /// Started with `model.hidden` and no widths: it waits for the chief's
    /// (`Initialize`'s `layers`) before it holds a shard.
    pub needs_widths: bool,
    /// Its embedding tables' rows and admission and eviction counts.
    pub tables: Vec<TableCount>,
    /// Near its cgroup's memory limit: its tables create no rows.
    pub memory_full: bool,
    /// The latest snapshot is the Nth delta after a whole one (0: whole).
    pub snapshot_delta: u32,
    /// The deltas applied on the whole snapshot restored at start.
    pub restored_deltas: u32,
}

/// One embedding table on one ps (`model.tables`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableCount {
    /// The table's name.
    pub table: String,
    /// Rows held now.
    pub rows: u64,
    /// Rows evicted (`steps_to_live`, `max_rows`) since the ps started.
    pub evicted: u64,
    /// Gradient rows refused (not admitted, or no room) since it started.
    pub refused: u64,
}

impl From<pb::TableCount> for TableCount {
    fn from(t: pb::TableCount) -> Self {
        Self {
            table: t.table,
            rows: t.rows,
            evicted: t.evicted,
            refused: t.refused,
        }
    }
}

impl From<TableCount> for pb::TableCount {
    fn from(t: TableCount) -> Self {
        Self {
            table: t.table,
            rows: t.rows,
            evicted: t.evicted,
            refused: t.refused,
        }
    }
}

/// A worker as a ps knows it from the pushes it receives.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerContact {
    /// Worker task index.
    pub task: u32,
    /// The step of its latest push.
    pub step: u64,
    /// Since its latest push, by the ps's clock.
    pub since: Duration,
    /// Examples per second it pushed over the last few seconds.
    pub examples_per_sec: f64,
    /// In this ps's `cluster.worker` (false: its pushes are refused).
    pub member: bool,
    /// The process that holds the index now (0: none yet).
    pub incarnation: u64,
    /// Its pushes refused since start.
    pub refused: u64,
}

impl From<pb::WorkerContact> for WorkerContact {
    fn from(w: pb::WorkerContact) -> Self {
        Self {
            task: w.task,
            step: w.step,
            // A hostile or confused ps may send anything: NaN and negative
            // ages read as "just now", absurd ones saturate.
            since: Duration::try_from_secs_f64(w.seconds_ago.max(0.0)).unwrap_or(Duration::MAX),
            examples_per_sec: w.examples_per_sec,
            member: w.member,
            incarnation: w.incarnation,
            refused: w.refused,
        }
    }
}

impl From<WorkerContact> for pb::WorkerContact {
    fn from(w: WorkerContact) -> Self {
        Self {
            task: w.task,
            step: w.step,
            seconds_ago: w.since.as_secs_f64(),
            examples_per_sec: w.examples_per_sec,
            member: w.member,
            incarnation: w.incarnation,
            refused: w.refused,
        }
    }
}

/// Moves every field between the two structs, which have the same names:
/// one list, so a field added to one and not the other fails to compile.
macro_rules! convert_state {
    ($from:ty => $to:ty) => {
        impl From<$from> for $to {
            fn from(s: $from) -> Self {
                Self {
                    task: s.task,
                    incarnation: s.incarnation,
                    cluster: s.cluster,
                    initialized: s.initialized,
                    global_step: s.global_step,
                    complete: s.complete,
                    variables: s.variables,
                    updates_applied: s.updates_applied,
                    gradients_aggregated: s.gradients_aggregated,
                    stale_gradients: s.stale_gradients,
                    pushes_applied: s.pushes_applied,
                    last_loss: s.last_loss,
                    examples_per_sec: s.examples_per_sec,
                    workers: s.workers.into_iter().map(Into::into).collect(),
                    shm_connections: s.shm_connections,
                    compression: s.compression,
                    membership_epoch: s.membership_epoch,
                    membership_refusals: s.membership_refusals,
                    members: s.members,
                    snapshot_step: s.snapshot_step,
                    snapshot_age_seconds: s.snapshot_age_seconds,
                    snapshot_failures: s.snapshot_failures,
                    snapshot_seconds: s.snapshot_seconds,
                    snapshot_bytes: s.snapshot_bytes,
                    snapshot_copy_seconds: s.snapshot_copy_seconds,
                    restored: s.restored,
                    restored_step: s.restored_step,
                    run: s.run,
                    resharding: s.resharding,
                    replica_step: s.replica_step,
                    replica_failures: s.replica_failures,
                    fetching: s.fetching,
                    parameters: s.parameters,
                    needs_widths: s.needs_widths,
                    tables: s.tables.into_iter().map(Into::into).collect(),
                    memory_full: s.memory_full,
                    snapshot_delta: s.snapshot_delta,
                    restored_deltas: s.restored_deltas,
                }
            }
        }
    };
}
convert_state!(pb::StateResponse => PsState);
convert_state!(PsState => pb::StateResponse);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_crosses_the_wire_unchanged() {
        let state = PsState {
            task: 2,
            incarnation: 7,
            cluster: "c".into(),
            global_step: 41,
            variables: vec!["layer1/weights".into()],
            workers: vec![WorkerContact {
                task: 1,
                step: 40,
                since: Duration::from_millis(250),
                member: true,
                ..Default::default()
            }],
            snapshot_age_seconds: -1.0,
            fetching: true,
            needs_widths: true,
            memory_full: true,
            snapshot_delta: 3,
            restored_deltas: 2,
            tables: vec![TableCount {
                table: "deep/embeddings".into(),
                rows: 5,
                evicted: 2,
                refused: 1,
            }],
            ..Default::default()
        };
        let back = PsState::from(pb::StateResponse::from(state.clone()));
        assert_eq!(back, state);
    }

    #[test]
    fn a_nonsense_age_from_the_wire_is_read_safely() {
        for (secs, want) in [
            (f64::NAN, Duration::ZERO),
            (-3.0, Duration::ZERO),
            (f64::INFINITY, Duration::MAX),
        ] {
            let w = WorkerContact::from(pb::WorkerContact {
                seconds_ago: secs,
                ..Default::default()
            });
            assert_eq!(w.since, want, "{secs}");
        }
    }
}
