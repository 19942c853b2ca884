//! The functions every call runs, on either transport: the adapters
//! (`grpc.rs`, `shm.rs`) turn a request into dtf's types
//! ([`crate::transport::call`]), call one of these, and put the answer on
//! their wire. Tensors are copied out of the shard under its lock; whatever
//! the wire needs beyond that copy is done after the lock is released.

use super::{PsService, conn, limits, shard};
use crate::transport::call::{
    Complete, Initialize, Initialized, Pulled, Pulls, Push, Pushed, Tensor, TensorView,
};
use crate::transport::{self, PsState, proto as rpc};
use shard::{Pushed as Outcome, Shard};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tonic::{Request, Status};
use tracing::{info, warn};

/// How long a sync push or a `min_step` pull waits for the step to advance
/// before answering anyway; the caller then asks again. Bounded so no RPC
/// hangs on a dead peer.
const STEP_WAIT: Duration = Duration::from_secs(1);

/// The shard's throughput, for `State`: examples pushed over a window of
/// about two seconds.
pub(super) struct Rate {
    /// (window start, examples since then, the last window's rate).
    window: Mutex<(Instant, u64, f64)>,
    /// Examples per push (`train.batch_size`).
    pub(super) batch_size: u64,
}

impl Rate {
    /// No examples yet; each push counts `batch_size`.
    pub(super) fn new(batch_size: u64) -> Self {
        Self {
            window: Mutex::new((Instant::now(), 0, 0.0)),
            batch_size,
        }
    }

    /// Counts one push's examples.
    fn count(&self) {
        let mut r = self.window.lock().unwrap_or_else(|e| e.into_inner());
        r.1 += self.batch_size;
        let elapsed = r.0.elapsed().as_secs_f64();
        if elapsed >= 2.0 {
            r.2 = r.1 as f64 / elapsed;
            *r = (Instant::now(), 0, r.2);
        }
    }

    /// Examples per second over the last window.
    fn now(&self) -> f64 {
        self.window.lock().unwrap_or_else(|e| e.into_inner()).2
    }
}

impl PsService {
    /// Reserves response bytes for `snapshots` snapshots of the shard,
    /// logging a refusal with the caller's address.
    ///
    /// Errors: `RESOURCE_EXHAUSTED` when [`limits::RESPONSE_BUDGET`] is spent.
    pub(super) fn reserve<T>(
        &self,
        req: &Request<T>,
        snapshots: u32,
    ) -> Result<limits::Reserved, Status> {
        self.inner.edge.budget.reserve(snapshots).inspect_err(|e| {
            let peer = conn::peer(req.extensions());
            self.inner.edge.refusals.refused(peer, e.message());
        })
    }

    /// Copies the current values (and shadows, and slots) out under the
    /// lock: a consistent snapshot, put on the wire after the lock is
    /// released.
    pub(super) fn read(
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
                _ = rx.wait_for(|&s| s >= min_step || self.inner.reshard.is_on()) => {}
                _ = done.cancelled() => {}
            }
        })
        .await;
    }

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
        let rate = self.inner.rate.now();
        let membership = self.membership();
        let workers = membership.report(Instant::now());
        PsState {
            task: self.inner.task as u32,
            incarnation: self.inner.incarnation,
            cluster: self.inner.cluster.clone(),
            initialized: s.is_initialized(),
            global_step: s.step(),
            complete: s.is_complete(),
            variables: s.specs().iter().map(|v| v.name.clone()).collect(),
            parameters: s
                .specs()
                .iter()
                .map(|v| v.shape.iter().product::<usize>() as u64)
                .sum(),
            updates_applied: c.updates_applied,
            gradients_aggregated: c.gradients_aggregated,
            stale_gradients: c.stale_gradients,
            pushes_applied: c.pushes_applied,
            last_loss: s.last_loss(),
            examples_per_sec: rate,
            shm_connections: self.inner.edge.shm_connections.load(Ordering::Relaxed),
            compression: transport::compress::name(self.inner.edge.wire.compression()).to_owned(),
            workers,
            membership_epoch: membership.epoch(),
            membership_refusals: membership.refusals(),
            members: u32::try_from(membership.members()).unwrap_or(u32::MAX),
            resharding: self.inner.reshard.stopped(),
            replica_step,
            replica_failures,
            fetching,
            needs_widths: self.needs_widths(),
            memory_full: self.inner.tables.room.is_full(),
            tables: self
                .inner
                .tables
                .counts()
                .into_iter()
                .map(|(table, rows, c)| transport::TableCount {
                    table,
                    rows,
                    evicted: c.evicted,
                    refused: c.refused,
                })
                .collect(),
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
            snapshot_delta: st.chain.map_or(0, |c| c.seq),
            restored_deltas: st.restored_deltas,
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
        if !req.layers.is_empty() {
            return self.take_widths(&req.layers);
        }
        self.serving()?;
        if i64::try_from(req.global_step).is_err() {
            return Err(shard::ShardError::StepRange(req.global_step).into());
        }
        // Taken whatever comes next: staged rows never outlive the call.
        let tables = self.take_staged(req.staged)?;
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
        // The rows with the values, checked first: a malformed table
        // changes nothing. Only when the values are taken.
        if !s.is_initialized() || req.force {
            self.replace_tables(tables, req.global_step)?;
        }
        let applied = s.initialize(values, shadows, slots, req.global_step, req.force);
        if applied {
            s.set_run(req.run);
            drop(s);
            self.inner.snapshots.seeded();
            // New values: what the workers hold is no base for changes.
            self.inner.edge.wire.forget();
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
        if s.is_initialized() {
            return false;
        }
        // The snapshot's rows were checked when it was read.
        if let Err(e) = self.replace_tables(r.tables, step) {
            warn!(ps = self.inner.task, error = %e, "The snapshot's table rows do not load; the chief seeds the shard instead.");
            return false;
        }
        if !s.initialize(r.values, Some(r.shadows), Some(r.slots), step, false) {
            return false;
        }
        s.set_run(run);
        drop((s, pending));
        self.inner.edge.wire.forget();
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
            if self.inner.reshard.is_on() {
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
    /// process fenced off its index ([`super::workers::Refusal`]), for a stale
    /// incarnation, and the shard's refusals ([`shard::ShardError`]);
    /// nothing changed.
    pub async fn push_with<T>(
        &self,
        req: &Push,
        grads: &[TensorView<'_>],
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
            if self.inner.reshard.is_on() {
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
                crate::metrics::global().computed_here();
                self.inner.step_tx.send_replace(s.step());
                Some(outcome)
            }
        };
        if outcome.is_some_and(|o| o != Outcome::AtLastStep) {
            self.inner.rate.count();
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
    /// Errors: `FAILED_PRECONDITION` ([`super::workers::Refusal`]).
    fn admit(&self, req: &Push, refused: impl FnOnce(&str)) -> Result<(), Status> {
        let admitted = self.membership().admit(
            req.worker,
            req.worker_incarnation,
            req.step,
            self.inner.rate.batch_size,
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
            if self.inner.members.follows {
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

    /// `Complete` on either transport: the chief declares the run complete,
    /// or (`reshard`) that it wrote the re-shard checkpoint.
    ///
    /// Errors: `FAILED_PRECONDITION` for a re-shard when this task's
    /// `cluster.ps` did not change (its file is not edited yet).
    pub fn complete_run(&self, req: Complete) -> Result<(), Status> {
        if req.reshard {
            if !self.inner.reshard.is_on() {
                return Err(Status::failed_precondition(format!(
                    "ps:{}: its cluster.ps has not changed (edit its dtf.toml too, or send it SIGHUP)",
                    self.inner.task
                )));
            }
            if !self.inner.reshard.done.is_cancelled() {
                info!(
                    ps = self.inner.task,
                    step = req.global_step,
                    "The chief wrote the re-shard checkpoint."
                );
            }
            self.inner
                .reshard
                .checkpointed
                .store(req.checkpointed, std::sync::atomic::Ordering::Release);
            self.inner.reshard.done.cancel();
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

/// `views` checked as the shard's variables ([`Shard::arrange_bytes`]),
/// copied out in model order.
fn arranged(shard: &Shard, views: &[TensorView<'_>]) -> Result<Vec<ndarray::ArrayD<f32>>, Status> {
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
