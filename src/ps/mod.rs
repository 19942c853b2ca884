//! The parameter-server task: serves its shard over gRPC.
//!
//! [`serve`] is the entry point (an already-bound listener and a shutdown
//! token, so tests bind port 0). [`shard`] holds the update rules,
//! [`limits`] the bounds on connections and calls, [`tls`] the handshake.

mod grpc;
pub mod limits;
mod replica;
pub mod shard;
mod shm;
pub mod snapshot;
pub mod tls;
pub mod workers;

use crate::auth::Credentials;
use crate::config::{Config, Mode, Role, TaskId, Transport};
use crate::model::Mlp;
use crate::placement;
use crate::transport::call::{
    Complete, Initialize, Initialized, Pulled, Pulls, Push, Pushed, Tensor,
};
use crate::transport::pb::parameter_server_server::ParameterServerServer;
use crate::transport::ring::RingClient;
use crate::transport::{self, PsState, WorkerContact, proto as rpc, tcp};
use shard::{Pushed as Outcome, Rule, Shard};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Status};
use tracing::{info, warn};

/// How long a sync push or a `min_step` pull waits for the step to advance
/// before answering anyway; the caller then asks again. Bounded so no RPC
/// hangs on a dead peer.
const STEP_WAIT: Duration = Duration::from_secs(1);

/// How long a ps taken out of `cluster.ps` waits for the chief's word that
/// its re-shard checkpoint is written before it exits anyway.
const RESHARD_ORPHAN: Duration = Duration::from_secs(300);

/// How long a ps lingers after the run is complete, so that workers still
/// waiting on it hear so rather than finding it gone.
const COMPLETE_LINGER: Duration = Duration::from_secs(2);

/// Errors that stop a ps task.
#[derive(Debug, thiserror::Error)]
pub enum PsError {
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// What the service shares between requests.
struct Inner {
    /// This task's index.
    task: usize,
    /// Random per process start: lets the chief see a restart.
    incarnation: u64,
    /// The cluster's identity ([`transport::cluster_id`]), for `State`.
    cluster: String,
    /// The shard, behind one lock: a push is atomic for the shard.
    shard: Mutex<Shard>,
    /// The shard's step, for waiters.
    step_tx: watch::Sender<u64>,
    /// Set when the chief declares the run complete.
    complete: CancellationToken,
    /// Throughput estimate: (window start, examples since then, last rate).
    rate: Mutex<(Instant, u64, f64)>,
    /// Examples per push (`train.batch_size`), for the rate.
    batch_size: u64,
    /// Response bytes pulls may have in flight.
    budget: limits::Budget,
    /// Refused calls, logged per peer.
    refusals: Arc<limits::RefusalLog>,
    /// Open shared-memory connections ([`shm`]), for `State` and metrics.
    shm_connections: AtomicU32,
    /// Slots per variable of the optimizer (for the response budget).
    slots_per_var: u32,
    /// The live configuration (`train.last_step` bounds every push).
    config: watch::Receiver<Arc<Config>>,
    /// The membership: who may push, which process holds each index, the
    /// epoch; and every worker's latest push, for `State` (`dtf status`).
    workers: Mutex<workers::Membership>,
    /// Sync with `train.replicas_to_aggregate` unset: a step aggregates the
    /// current members ([`workers::Membership::sync_target`]).
    follows_members: bool,
    /// How tensors cross this ps's TCP links, and (onebit) what each
    /// worker holds: the gRPC edge's, [`grpc`].
    wire: transport::compress::PsWire,
    /// This shard's snapshots ([`snapshot`]): where, and how they went.
    snapshots: snapshot::Snapshotting,
    /// Its place on the ring of snapshot copies ([`replica`]).
    ring: replica::Ring,
    /// `cluster.ps` as this process started with it: its placement.
    ps: Vec<String>,
    /// A reload changed `cluster.ps`: the cluster re-shards, and pushes
    /// are refused until the chief's re-shard checkpoint.
    resharding: AtomicBool,
    /// Cancelled once the chief has written that checkpoint: [`serve`]
    /// returns [`Ended::Reshard`].
    reshard: CancellationToken,
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
    /// reloads of `config` move `train.last_step`.
    ///
    /// Errors: [`PsError::Model`] for a bad `model.layers`.
    pub fn new(config: watch::Receiver<Arc<Config>>, task: usize) -> Result<Self, PsError> {
        let live = config;
        let config: Arc<Config> = live.borrow().clone();
        let mlp = Mlp::new(&config.model.layers)?;
        let specs = placement::shard(
            &mlp.variables(),
            config.cluster.ps.len(),
            config.cluster.placement,
            task,
        );
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
                shard: Mutex::new(shard),
                step_tx: watch::channel(0).0,
                complete: CancellationToken::new(),
                rate: Mutex::new((Instant::now(), 0, 0.0)),
                batch_size: config.train.batch_size as u64,
                budget: limits::Budget::new(shard_bytes),
                refusals: Arc::new(limits::RefusalLog::default()),
                shm_connections: AtomicU32::new(0),
                slots_per_var: optimizer.slot_names().len() as u32,
                config: live,
                workers: Mutex::new(workers::Membership::new(task, config.cluster.worker.len())),
                follows_members: config.train.mode == Mode::Sync
                    && config.train.replicas_to_aggregate.is_none(),
                wire: transport::compress::PsWire::new(
                    config.cluster.compression,
                    config.cluster.worker.len(),
                ),
                snapshots,
                ring,
                ps: config.cluster.ps.clone(),
                resharding: AtomicBool::new(false),
                reshard: CancellationToken::new(),
            }),
        })
    }

    /// The token cancelled when the run is complete.
    pub fn completed(&self) -> CancellationToken {
        self.inner.complete.clone()
    }

    /// Reserves response bytes for `snapshots` snapshots of the shard,
    /// logging a refusal with the caller's address.
    ///
    /// Errors: `RESOURCE_EXHAUSTED` when [`limits::RESPONSE_BUDGET`] is spent.
    fn reserve<T>(&self, req: &Request<T>, snapshots: u32) -> Result<limits::Reserved, Status> {
        self.inner.budget.reserve(snapshots).inspect_err(|e| {
            let peer = limits::peer(req.extensions());
            self.inner.refusals.refused(peer, e.message());
        })
    }

    /// The membership ([`workers`]), locked. Never held while taking the
    /// shard's lock (the other way round is how they nest).
    fn membership(&self) -> MutexGuard<'_, workers::Membership> {
        self.inner.workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `cluster.worker` has `members` entries now (a reload): the
    /// membership follows, with a new epoch, and a sync run without
    /// `train.replicas_to_aggregate` aggregates over the new members from
    /// this step on (completing the step now when its gradients are in).
    pub fn apply_members(&self, members: usize) {
        let change = self.membership().set_members(members);
        let Some(change) = change else {
            return;
        };
        info!(
            ps = self.inner.task,
            epoch = change.epoch,
            members,
            added = ?change.added,
            removed = ?change.removed,
            "Membership changed."
        );
        if self.inner.follows_members {
            self.set_sync_target();
        }
    }

    /// Sync: a step aggregates the membership's target from now on, from
    /// workers `0..members`; a step this completes is announced to waiters.
    /// Both are read under the shard's lock, so a reload and a joiner's
    /// first push racing each other leave the newest target in place.
    fn set_sync_target(&self) {
        let mut s = self.lock();
        let (replicas, total) = {
            let m = self.membership();
            (m.sync_target(), m.members())
        };
        s.set_last_step(self.inner.config.borrow().train.last_step);
        match s.set_sync(replicas, total) {
            Ok(true) => {
                info!(
                    ps = self.inner.task,
                    step = s.step(),
                    replicas,
                    "Step completed with the members left."
                );
                self.inner.step_tx.send_replace(s.step());
            }
            Ok(false) => {}
            Err(e) => {
                warn!(ps = self.inner.task, error = %e, "The step's update failed; its replicas push anew.");
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shard> {
        // A panic while holding the lock would be a bug in Shard; the state it
        // left is still the best there is, so keep serving it.
        self.inner.shard.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Copies the current values (and shadows, and slots) out under the
    /// lock: a consistent snapshot, put on the wire after the lock is
    /// released.
    fn read(
        &self,
        shard: &Shard,
        names: &[String],
        with_shadows: bool,
        with_slots: bool,
    ) -> Result<Pulls, Status> {
        let values = shard.values()?;
        let pick = |i: usize| names.is_empty() || names.contains(&shard.specs()[i].name);
        for n in names {
            if !shard.specs().iter().any(|s| &s.name == n) {
                return Err(shard::ShardError::UnknownVariable {
                    ps: self.inner.task,
                    name: n.clone(),
                    held: shard.specs().iter().map(|s| s.name.clone()).collect(),
                }
                .into());
            }
        }
        let vars = (0..values.len())
            .filter(|&i| pick(i))
            .map(|i| Tensor::copy(&shard.specs()[i].name, &values[i]))
            .collect();
        let shadows = if with_shadows {
            let sh = shard.shadows()?;
            (0..sh.len())
                .filter(|&i| pick(i))
                .map(|i| Tensor::copy(&shard.specs()[i].name, &sh[i]))
                .collect()
        } else {
            Vec::new()
        };
        let slots = if with_slots {
            let slots = shard.slots()?;
            let specs = shard.optimizer().slot_specs(shard.specs());
            specs
                .iter()
                .filter(|spec| spec.var.is_none_or(pick))
                .map(|spec| match spec.var {
                    Some(i) => Tensor::copy(&spec.name, &slots.per_var[i][spec.index]),
                    None => Tensor::copy(
                        &spec.name,
                        &ndarray::ArrayD::from_elem(
                            ndarray::IxDyn(&[]),
                            slots.non_slots[spec.index],
                        ),
                    ),
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok((vars, shadows, slots))
    }

    /// Waits (at most [`STEP_WAIT`]) until the step is at least `min_step`, the run is
    /// complete, or the cluster re-shards.
    async fn wait_for_step(&self, min_step: u64) {
        let mut rx = self.inner.step_tx.subscribe();
        let done = self.inner.complete.clone();
        let _ = tokio::time::timeout(STEP_WAIT, async {
            tokio::select! {
                // A re-shard stops the steps: no use waiting for one.
                _ = rx.wait_for(|&s| s >= min_step || self.inner.resharding.load(Ordering::Relaxed)) => {}
                _ = done.cancelled() => {}
            }
        })
        .await;
    }

    fn count_examples(&self, examples: u64) {
        let mut r = self.inner.rate.lock().unwrap_or_else(|e| e.into_inner());
        r.1 += examples;
        let elapsed = r.0.elapsed().as_secs_f64();
        if elapsed >= 2.0 {
            r.2 = r.1 as f64 / elapsed;
            *r = (Instant::now(), 0, r.2);
        }
    }
}

/// `views` checked as the shard's variables ([`Shard::arrange_bytes`]),
/// copied out in model order.
fn arranged(
    shard: &Shard,
    views: &[rpc::TensorView<'_>],
) -> Result<Vec<ndarray::ArrayD<f32>>, Status> {
    let bytes = shard.arrange_bytes(views.iter().map(|v| (v.name, v.shape.as_slice(), v.data)))?;
    Ok(bytes
        .into_iter()
        .zip(shard.specs())
        .map(|(b, spec)| {
            ndarray::ArrayD::from_shape_vec(spec.shape.as_slice(), bytemuck::pod_collect_to_vec(b))
                .expect("arrange_bytes checked the shape")
        })
        .collect())
}

impl PsService {
    /// This task's state and counters: what `State` answers on either
    /// transport, and the plain accessor the metrics read.
    pub fn state_now(&self) -> PsState {
        // First: once it is false, what the fetch restored is in the
        // snapshot fields read next (never "not fetching, nothing held").
        let fetching = self.inner.ring.fetching.load(Ordering::Acquire);
        let snap = self.snapshot_state();
        let (replica_step, replica_failures) = self.inner.ring.report();
        let s = self.lock();
        let c = s.counters();
        let rate = self.inner.rate.lock().unwrap_or_else(|e| e.into_inner()).2;
        let membership = self.membership();
        let workers = membership
            .report(Instant::now())
            .into_iter()
            .map(|w| WorkerContact {
                task: w.worker,
                step: w.step,
                since: w.since,
                examples_per_sec: w.examples_per_sec,
                member: w.member,
                incarnation: w.incarnation,
                refused: w.refused,
            })
            .collect();
        PsState {
            task: self.inner.task as u32,
            incarnation: self.inner.incarnation,
            cluster: self.inner.cluster.clone(),
            initialized: s.is_initialized(),
            global_step: s.step(),
            complete: s.is_complete(),
            variables: s.specs().iter().map(|v| v.name.clone()).collect(),
            updates_applied: c.updates_applied,
            gradients_aggregated: c.gradients_aggregated,
            stale_gradients: c.stale_gradients,
            pushes_applied: c.pushes_applied,
            last_loss: s.last_loss(),
            examples_per_sec: rate,
            shm_connections: self.inner.shm_connections.load(Ordering::Relaxed),
            compression: transport::compress::name(self.inner.wire.compression()).to_owned(),
            workers,
            membership_epoch: membership.epoch(),
            membership_refusals: membership.refusals(),
            members: u32::try_from(membership.members()).unwrap_or(u32::MAX),
            resharding: self.inner.resharding.load(Ordering::Relaxed),
            replica_step,
            replica_failures,
            fetching,
            run: if s.is_initialized() {
                s.run()
            } else {
                snap.run
            },
            ..snap
        }
    }

    /// The snapshot fields of `State` (the rest default).
    fn snapshot_state(&self) -> PsState {
        // One lock at a time: `adopt` and `seeded` take these too.
        let run = self.inner.snapshots.pending().as_ref().map_or(0, |r| r.run);
        let st = self.inner.snapshots.stats();
        let (step, age) = st
            .last
            .map_or((0, -1.0), |(s, at)| (s, at.elapsed().as_secs_f64()));
        PsState {
            snapshot_step: step,
            snapshot_age_seconds: age,
            snapshot_failures: st.failures,
            snapshot_seconds: st.write_secs,
            snapshot_bytes: st.bytes,
            snapshot_copy_seconds: st.copy_secs,
            restored: st.restored.is_some(),
            restored_step: st.restored.unwrap_or(0),
            run,
            ..Default::default()
        }
    }

    /// `Initialize` on either transport: the chief's tensors, or with
    /// `adopt` the snapshot held aside ([`PsService::adopt`]).
    ///
    /// Errors: `INVALID_ARGUMENT` for a step out of range or tensors that are
    /// not the shard's variables.
    pub fn initialize_from(&self, req: Initialize<'_>) -> Result<Initialized, Status> {
        self.serving()?;
        if i64::try_from(req.global_step).is_err() {
            return Err(shard::ShardError::StepRange(req.global_step).into());
        }
        if req.adopt {
            let held = match req.snapshot_step {
                0 => req.global_step,
                s => s,
            };
            return Ok(Initialized {
                applied: self.adopt(req.run, held, req.global_step),
                incarnation: self.inner.incarnation,
            });
        }
        let mut s = self.lock();
        let values = arranged(&s, &req.variables)?;
        let shadows = if req.shadows.is_empty() {
            None
        } else {
            Some(arranged(&s, &req.shadows)?)
        };
        // No slots: fresh ones (a new run, or a checkpoint of another optimizer).
        let slots = if req.slots.is_empty() {
            None
        } else {
            Some(
                s.arrange_slots(
                    req.slots
                        .iter()
                        .map(|v| (v.name, v.shape.as_slice(), v.data)),
                )?,
            )
        };
        let applied = s.initialize(values, shadows, slots, req.global_step, req.force);
        if applied {
            s.set_run(req.run);
            drop(s);
            self.inner.snapshots.seeded();
            // New values: what the workers hold is no base for changes.
            self.inner.wire.forget();
            info!(
                ps = self.inner.task,
                step = req.global_step,
                run = req.run,
                "Shard initialized."
            );
            self.inner.step_tx.send_replace(req.global_step);
        }
        Ok(Initialized {
            applied,
            incarnation: self.inner.incarnation,
        })
    }

    /// The chief says the snapshot held aside since start is of its run:
    /// the shard takes it, and counts on from `step` (its snapshot's own
    /// step, or in sync mode the step of the shards that kept running).
    /// Returns false, changing nothing, unless that snapshot is of `run`
    /// (known, not 0) and of step `held`, `step` is not below it, and the
    /// shard is still uninitialized.
    fn adopt(&self, run: u64, held: u64, step: u64) -> bool {
        let mut pending = self.inner.snapshots.pending();
        let mut s = self.lock();
        let Some(r) =
            pending.take_if(|r| run != 0 && r.run == run && r.step == held && step >= held)
        else {
            return false;
        };
        if !s.initialize(r.values, Some(r.shadows), Some(r.slots), step, false) {
            return false;
        }
        s.set_run(run);
        drop((s, pending));
        self.inner.wire.forget();
        info!(
            ps = self.inner.task,
            step,
            snapshot_step = held,
            run,
            "Shard initialized from its snapshot: the chief adopted it."
        );
        self.inner.step_tx.send_replace(step);
        true
    }

    /// `Pull` on either transport: waits (bounded) for `min_step`, then
    /// `read`s the shard under its lock (a consistent snapshot). The answer
    /// carries no tensors: `read` put them where its transport wants them.
    ///
    /// Errors: whatever `read` returns (`FAILED_PRECONDITION` before the
    /// chief initialized the shard).
    pub async fn pull_with<T>(
        &self,
        min_step: u64,
        read: impl FnOnce(&Shard) -> Result<T, Status>,
    ) -> Result<(T, Pulled), Status> {
        self.serving()?;
        if min_step > 0 {
            self.wait_for_step(min_step).await;
            // No step comes while the cluster re-shards: the caller backs
            // off rather than asking again at once.
            if self.inner.resharding.load(Ordering::Relaxed) {
                return Err(self.resharding_status());
            }
        }
        let s = self.lock();
        let values = read(&s)?;
        Ok((
            values,
            Pulled {
                global_step: s.step(),
                incarnation: self.inner.incarnation,
                complete: s.is_complete(),
                membership_epoch: self.membership().epoch(),
                run: s.run(),
            },
        ))
    }

    /// `Push` on either transport: `grads` (views of the request's or the
    /// shared region's bytes, checked here) applied or aggregated under the
    /// shard lock; with `req.pull`, `read` then takes the values under the
    /// lock. `req.gradients` is not read.
    ///
    /// A push refused by the membership is passed to `refused` (which logs
    /// it with the peer, rate-limited).
    ///
    /// Errors: `FAILED_PRECONDITION` for a worker not in `cluster.worker` or a
    /// process fenced off its index ([`workers::Refusal`]), for a stale
    /// incarnation, and the shard's refusals ([`shard::ShardError`]);
    /// nothing changed.
    pub async fn push_with<T>(
        &self,
        req: &Push,
        grads: &[rpc::TensorView<'_>],
        refused: impl FnOnce(&str),
        read: impl FnOnce(&Shard) -> Result<T, Status>,
    ) -> Result<(Option<T>, Pushed), Status> {
        self.serving()?;
        // Any authenticated push is contact, let in or not.
        self.admit(req, refused)?;
        if req.incarnation != 0 && req.incarnation != self.inner.incarnation {
            return Err(rpc::status(
                tonic::Code::FailedPrecondition,
                format_args!(
                    "ps:{} restarted since the parameters were pulled (incarnation {} ≠ {}): pull again",
                    self.inner.task, req.incarnation, self.inner.incarnation
                ),
            ));
        }
        let outcome = {
            let mut s = self.lock();
            // Under the shard lock: a push that got past it before the flag
            // was set is applied before the chief's snapshot can read.
            if self.inner.resharding.load(Ordering::Relaxed) {
                return Err(self.resharding_status());
            }
            if s.is_complete() {
                None
            } else {
                s.set_last_step(self.inner.config.borrow().train.last_step);
                let grads = s.arrange_gradients(
                    grads.iter().map(|v| (v.name, v.shape.as_slice(), v.data)),
                )?;
                let outcome =
                    s.push_bytes(&grads, req.learning_rate, req.step, req.worker, req.loss)?;
                self.inner.step_tx.send_replace(s.step());
                Some(outcome)
            }
        };
        if outcome.is_some_and(|o| o != Outcome::AtLastStep) {
            self.count_examples(self.inner.batch_size);
        }
        if outcome == Some(Outcome::Pending) && req.pull {
            self.wait_for_step(req.step + 1).await;
        }
        let s = self.lock();
        let values = if req.pull { Some(read(&s)?) } else { None };
        Ok((
            values,
            Pushed {
                global_step: s.step(),
                incarnation: self.inner.incarnation,
                complete: s.is_complete(),
                stale: outcome == Some(Outcome::Stale),
                membership_epoch: self.membership().epoch(),
            },
        ))
    }

    /// The membership's word on a push: refused (logged through `refused`,
    /// counted), or let in — fencing the index's previous process, or
    /// counting a joined worker in the sync target.
    ///
    /// Errors: `FAILED_PRECONDITION` ([`workers::Refusal`]).
    fn admit(&self, req: &Push, refused: impl FnOnce(&str)) -> Result<(), Status> {
        let admitted = self.membership().admit(
            req.worker,
            req.worker_incarnation,
            req.step,
            self.inner.batch_size,
            Instant::now(),
        );
        let admitted = admitted.map_err(|r| {
            refused(&r.to_string());
            Status::from(r)
        })?;
        if let Some(old) = admitted.fenced {
            warn!(
                ps = self.inner.task,
                worker = req.worker,
                fenced = %format!("{old:x}"),
                holder = %format!("{:x}", req.worker_incarnation),
                "A new process took over the worker's task index; the old one is refused from now on."
            );
        }
        if admitted.joined {
            if self.inner.follows_members {
                self.set_sync_target();
            }
            info!(
                ps = self.inner.task,
                worker = req.worker,
                step = req.step,
                "Worker joined."
            );
        }
        Ok(())
    }

    /// The answer to a push, and to a pull that waits for a step, while
    /// the cluster re-shards ([`transport::RESHARDING`]).
    fn resharding_status(&self) -> Status {
        Status::unavailable(format!(
            "ps:{} {}: no steps until the chief's checkpoint; then every task starts again \
             under the new placement",
            self.inner.task,
            transport::RESHARDING
        ))
    }

    /// Follows a reload's `cluster.ps`: changed from the one this process
    /// started with, the cluster re-shards (pushes refused from now on);
    /// back as it was before the chief's checkpoint, nothing happens.
    fn follow_ps(&self, ps: &[String]) {
        let changed = ps != self.inner.ps.as_slice();
        if !changed && self.inner.reshard.is_cancelled() {
            // Told already: the pushes it would take now would be lost.
            return;
        }
        if self.inner.resharding.swap(changed, Ordering::Relaxed) != changed {
            // Wakes the calls waiting for a step (`wait_for_step`).
            self.inner.step_tx.send_modify(|_| ());
            match changed {
                true => {
                    info!(ps = self.inner.task, old = ?self.inner.ps, new = ?ps, "cluster.ps changed: the cluster re-shards. Pushes wait for the chief's checkpoint; then this task starts again under the new placement.")
                }
                false => info!(
                    ps = self.inner.task,
                    "cluster.ps is back as this task started with it: no re-shard; taking pushes again."
                ),
            }
        }
    }

    /// `Complete` on either transport: the chief declares the run complete,
    /// or (`reshard`) that it wrote the re-shard checkpoint.
    ///
    /// Errors: `FAILED_PRECONDITION` for a re-shard when this task's
    /// `cluster.ps` did not change (its file is not edited yet).
    pub fn complete_run(&self, req: Complete) -> Result<(), Status> {
        if req.reshard {
            if !self.inner.resharding.load(Ordering::Relaxed) {
                return Err(Status::failed_precondition(format!(
                    "ps:{}: its cluster.ps has not changed (edit its dtf.toml too, or send it SIGHUP)",
                    self.inner.task
                )));
            }
            if !self.inner.reshard.is_cancelled() {
                info!(
                    ps = self.inner.task,
                    step = req.global_step,
                    "The chief wrote the re-shard checkpoint."
                );
            }
            self.inner.reshard.cancel();
            return Ok(());
        }
        let step = req.global_step;
        let shard_step = {
            let mut s = self.lock();
            s.set_complete();
            s.step()
        };
        if !self.inner.complete.is_cancelled() {
            info!(ps = self.inner.task, step, shard_step, "Run complete.");
        }
        self.inner.complete.cancel();
        Ok(())
    }
}

/// Serves ps task `task` on `listener` until `shutdown` is cancelled or, with
/// `cluster.ps_exit_when_complete`, shortly after the run is complete.
///
/// Returns [`Ended::Reshard`] once the chief wrote the re-shard checkpoint.
///
/// Errors: [`PsError`] when the model is invalid or the server fails.
pub async fn serve(
    live: watch::Receiver<Arc<Config>>,
    task: usize,
    credentials: &Credentials,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<Ended, PsError> {
    let service = PsService::new(live.clone(), task)?;
    let (snapshot_secs, restored) = {
        let config = live.borrow().clone();
        (
            config.ps.snapshot_secs,
            snapshot::restore(&service, &config),
        )
    };
    {
        let service = service.clone();
        crate::metrics::observe_ps(move || service.state_now());
    }
    let config: Arc<Config> = live.borrow().clone();
    let config = &*config;
    rpc::keep_freed_buffers();
    let limit = transport::message_limit(config);
    let id = TaskId {
        role: Role::Ps,
        index: task,
    };
    {
        let s = service.lock();
        let names: Vec<&str> = s.specs().iter().map(|v| v.name.as_str()).collect();
        info!(task = %id, variables = ?names, "Serving shard.");
    }
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ParameterServerServer<PsService>>()
        .await;
    let svc = ParameterServerServer::new(service.clone())
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
    let refusals = service.inner.refusals.clone();
    // The token is checked first: a call without it never takes a place.
    let svc = grpc::Direct::new(service.clone(), svc, limit);
    let svc = tonic::service::interceptor::InterceptedService::new(
        limits::Admission::new(svc, refusals.clone()),
        limits::Guard::new(credentials.check_token(), refusals.clone()),
    );

    let stop = shutdown.child_token();
    let linger = {
        let (complete, stop, exit) = (
            service.completed(),
            stop.clone(),
            config.cluster.ps_exit_when_complete,
        );
        tokio::spawn(async move {
            complete.cancelled().await;
            if exit {
                tokio::time::sleep(COMPLETE_LINGER).await;
                info!(ps = task, "Run complete; exiting.");
                stop.cancel();
            }
        })
    };
    // `cluster.worker` is live: the membership follows each reload;
    // `cluster.ps` too: a change re-shards.
    let members = {
        let (service, mut live) = (service.clone(), live.clone());
        tokio::spawn(async move {
            while live.changed().await.is_ok() {
                let cfg = live.borrow_and_update().clone();
                service.apply_members(cfg.cluster.worker.len());
                service.follow_ps(&cfg.cluster.ps);
            }
        })
    };
    let resharded = {
        let (reshard, stop) = (service.inner.reshard.clone(), stop.clone());
        tokio::spawn(async move {
            reshard.cancelled().await;
            stop.cancel();
        })
    };
    // A ps taken out of the list that never hears the chief's word (its
    // reload came after it, the chief is gone) must not wait for ever.
    let orphaned = {
        let (service, live) = (service.clone(), live.clone());
        tokio::spawn(async move {
            let mut since: Option<Instant> = None;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let listed = live.borrow().cluster.ps.get(task) == service.inner.ps.get(task);
                let waiting = service.inner.resharding.load(Ordering::Relaxed) && !listed;
                match (waiting, since) {
                    (false, _) => since = None,
                    (true, None) => since = Some(Instant::now()),
                    (true, Some(t)) if t.elapsed() >= RESHARD_ORPHAN => {
                        warn!(
                            ps = task,
                            waited_secs = RESHARD_ORPHAN.as_secs(),
                            "No longer in cluster.ps, and no word from the chief that its re-shard checkpoint is written: exiting."
                        );
                        service.inner.reshard.cancel();
                        return;
                    }
                    (true, Some(_)) => {}
                }
            }
        })
    };
    let snapshots = (snapshot_secs > 0 && service.inner.snapshots.dir.is_some()).then(|| {
        let every = Duration::from_secs(snapshot_secs);
        tokio::spawn(snapshot::run(service.clone(), every, stop.clone()))
    });
    // The ring: this shard's snapshots go to the next ps; with none of its
    // own, this ps first fetches its copy from there (refusing Initialize,
    // Pull and Push until then).
    let ring = match &service.inner.ring.next {
        Some((_, addr)) => {
            match tcp::client(credentials, addr, limit, replica::CLIENT_TIMEOUT, "none") {
                Ok(client) => {
                    let client = RingClient::new(client);
                    // Asked at every start, not only on an empty disk: the
                    // neighbour's copy may be newer than what this ps
                    // restored of its own (issue 45).
                    service.inner.ring.fetching.store(true, Ordering::Release);
                    tokio::spawn(replica::fetch_own(
                        service.clone(),
                        live.borrow().clone(),
                        client.clone(),
                        stop.clone(),
                        restored,
                    ));
                    let sender =
                        tokio::spawn(replica::send(service.clone(), client.clone(), stop.clone()));
                    Some((sender, client))
                }
                Err(e) => {
                    warn!(ps = task, address = %addr, error = %e, "No snapshot copies for the neighbour: cannot make its client.");
                    None
                }
            }
        }
        None => None,
    };
    let shm = listener
        .local_addr()
        .ok()
        .and_then(|addr| serve_shm(&service, config, addr.port(), credentials, limit, &stop));
    let incoming = limits::incoming(listener, refusals, credentials.server_tls());
    let result = credentials
        .server()
        .http2_keepalive_interval(Some(limits::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(limits::KEEPALIVE_TIMEOUT))
        .initial_stream_window_size(tcp::window(limit))
        .initial_connection_window_size(tcp::window(limit))
        .max_frame_size(tcp::frame(limit))
        .add_service(health)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned())
        .await;
    linger.abort();
    members.abort();
    if let Some((sender, _)) = &ring {
        sender.abort();
    }
    resharded.abort();
    orphaned.abort();
    stop.cancel();
    if let Some(shm) = shm {
        let _ = shm.await;
    }
    // The last snapshot, of the state as it stopped (bounded).
    if let Some(snapshots) = snapshots {
        let _ = snapshots.await;
    }
    // ... and its hand-over to the neighbour (bounded; not when the run is
    // complete or the cluster re-shards, when the copy is of no use).
    if let Some((_, client)) = &ring
        && !service.inner.complete.is_cancelled()
        && !service.inner.reshard.is_cancelled()
    {
        replica::send_last(&service, client).await;
    }
    if let Err(e) = &result {
        warn!(ps = task, error = %e, "Server stopped with an error.");
    }
    result?;
    Ok(match service.inner.reshard.is_cancelled() {
        true => Ended::Reshard,
        false => Ended::Stopped,
    })
}

/// Tasks on this host reach the ps through shared memory too (unless
/// `cluster.transport = "tcp"`): the server of its socket, for `port`, until
/// `stop`. A socket that cannot be made leaves TCP alone, with a warning.
fn serve_shm(
    service: &PsService,
    config: &Config,
    port: u16,
    credentials: &Credentials,
    limit: usize,
    stop: &CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    if config.cluster.transport != Transport::Auto {
        return None;
    }
    match shm::bind(config, service.inner.task, port) {
        Ok(socket) => Some(tokio::spawn(shm::serve(
            service.clone(),
            socket,
            credentials.check_token(),
            limit,
            stop.clone(),
        ))),
        Err(e) => {
            warn!(ps = service.inner.task, error = %e, dir = %transport::runtime_dir(config).display(), "Cannot serve shared memory (cluster.runtime_dir); serving TCP only.");
            None
        }
    }
}
