//! The parameter-server task: serves its shard over gRPC and shared memory.
//!
//! [`serve`] is the entry point (an already-bound listener and a shutdown
//! token, so tests bind port 0; `serve.rs`). [`PsService`] holds the state
//! by concern: the shard ([`shard`]), the functions every call runs on
//! either transport (`calls.rs`), what a reload changes — the membership
//! and the placement (`follow.rs`) —, the snapshots ([`snapshot`]) and the
//! ring's copies (`replica.rs`). The two adapters, `grpc.rs` and `shm.rs`,
//! are the only files here that see the wire's types. [`limits`] bounds
//! connections and calls, [`tls`] is the handshake.

mod admission;
mod calls;
pub mod conn;
mod follow;
mod grpc;
pub mod limits;
mod listen;
pub mod memory;
mod replica;
mod rows;
mod serve;
pub mod shard;
mod shm;
pub mod snapshot;
pub mod table;
pub mod tls;
mod widths;
pub mod workers;

pub use serve::serve;

use crate::config::{Config, Mode};
use crate::model::Mlp;
use crate::placement;
use crate::transport;
use shard::{Rule, Shard};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Errors that stop a ps task.
#[derive(Debug, thiserror::Error)]
pub enum PsError {
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error(transparent)]
    Table(#[from] table::TableError),
}

/// What the service shares between requests, by concern: each part is
/// owned by the file that uses it.
struct Inner {
    /// This task's index.
    task: usize,
    /// Random per process start: lets the chief see a restart.
    incarnation: u64,
    /// The cluster's identity ([`transport::cluster_id`]), for `State`.
    cluster: String,
    /// The live configuration (`train.last_step` bounds every push).
    config: watch::Receiver<Arc<Config>>,
    /// The shard, behind one lock: a push is atomic for the shard.
    shard: Mutex<Shard>,
    /// The shard's step, for waiters.
    step_tx: watch::Sender<u64>,
    /// Set when the chief declares the run complete.
    complete: CancellationToken,
    /// Examples per second, for `State` (`calls.rs`).
    rate: calls::Rate,
    /// The transports' bounds and state (`grpc.rs`, `shm.rs`).
    edge: Edge,
    /// Who may push, and whether sync steps follow them (`follow.rs`).
    members: follow::Members,
    /// `cluster.ps` and the re-shard it starts when it changes (`follow.rs`).
    reshard: follow::Reshard,
    /// This shard's snapshots ([`snapshot`]): where, and how they went.
    snapshots: snapshot::Snapshotting,
    /// Its place on the ring of snapshot copies (`replica.rs`).
    ring: replica::Ring,
    /// The embedding tables' rows this task owns, each behind its own
    /// lock (`rows.rs`).
    tables: rows::Tables,
    /// Whether it waits for the chief's widths (`widths.rs`).
    widths: widths::Widths,
}

/// What the two transports' adapters keep between calls.
struct Edge {
    /// Response bytes pulls may have in flight.
    budget: limits::Budget,
    /// Refused calls, logged per peer.
    refusals: Arc<limits::RefusalLog>,
    /// Open shared-memory connections (`shm.rs`), for `State` and metrics.
    shm_connections: AtomicU32,
    /// Slots per variable of the optimizer (for the response budget).
    slots_per_var: u32,
    /// How tensors cross this ps's TCP links, and (onebit) what each
    /// worker holds: the gRPC adapter's (`grpc.rs`).
    wire: transport::compress::PsWire,
}

/// How [`serve`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Stopped (a signal, or the run complete).
    Stopped,
    /// The cluster re-shards (`cluster.ps` changed): the chief wrote its
    /// checkpoint; this task starts again under the new list, or exits if
    /// it is no longer in it.
    Reshard,
}

/// The gRPC service of one ps task.
#[derive(Clone)]
pub struct PsService {
    inner: Arc<Inner>,
}

impl PsService {
    /// Builds the shard of ps task `task` as `config` places the model;
    /// reloads of `config` move `train.last_step`. Without widths
    /// (`model.layers` empty: `model.hidden`, the data not read), a service
    /// with no shard that waits for the chief's (`widths.rs`).
    ///
    /// Errors: [`PsError::Model`] for a bad `model.layers`.
    pub fn new(config: watch::Receiver<Arc<Config>>, task: usize) -> Result<Self, PsError> {
        let live = config;
        let config: Arc<Config> = live.borrow().clone();
        let widths = widths::Widths::new(&config);
        let specs = match config.model.layers.is_empty() {
            true => Vec::new(),
            false => placement::shard(&config, &Mlp::new(&config.model.layers)?.variables(), task),
        };
        let rule = match config.train.mode {
            Mode::Async => Rule::Async,
            Mode::Sync => Rule::Sync {
                replicas: config.replicas_to_aggregate(),
                total: config.total_num_replicas(),
            },
        };
        let shard_bytes = specs
            .iter()
            .map(|s| 4 * s.shape.iter().product::<usize>())
            .sum();
        let optimizer = config.train.optimizer();
        let snapshots = snapshot::Snapshotting::new(&config, task, &specs);
        let ring = replica::Ring::new(&config, task, snapshots.dir.as_deref())?;
        // Changes are kept only where the snapshot loop cuts them.
        let incremental = snapshots.dir.is_some() && config.ps.snapshot_secs > 0;
        let tables = rows::Tables::new(&config, incremental)?;
        let shard = Shard::new(
            task,
            specs,
            rule,
            config.train.moving_average_decay,
            optimizer,
        );
        Ok(Self {
            inner: Arc::new(Inner {
                task,
                incarnation: rand::random::<u64>() >> 1,
                cluster: transport::cluster_id(&config.cluster.ps),
                config: live,
                shard: Mutex::new(shard),
                step_tx: watch::channel(0).0,
                complete: CancellationToken::new(),
                rate: calls::Rate::new(config.train.batch_size as u64),
                edge: Edge {
                    budget: limits::Budget::new(shard_bytes),
                    refusals: Arc::new(limits::RefusalLog::default()),
                    shm_connections: AtomicU32::new(0),
                    slots_per_var: optimizer.slot_names().len() as u32,
                    wire: transport::compress::PsWire::new(
                        config.cluster.compression,
                        config.cluster.worker.len(),
                    ),
                },
                members: follow::Members::new(&config, task),
                reshard: follow::Reshard::new(&config),
                snapshots,
                ring,
                tables,
                widths,
            }),
        })
    }

    /// The token cancelled when the run is complete.
    pub fn completed(&self) -> CancellationToken {
        self.inner.complete.clone()
    }

    /// The membership ([`workers`]), locked. Never held while taking the
    /// shard's lock (the other way round is how they nest).
    fn membership(&self) -> MutexGuard<'_, workers::Membership> {
        self.inner
            .members
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> MutexGuard<'_, Shard> {
        // A panic while holding the lock would be a bug in Shard; the state it
        // left is still the best there is, so keep serving it.
        self.inner.shard.lock().unwrap_or_else(|e| e.into_inner())
    }
}
