//! [`Cluster::step`]: the worker's step, computing straight from and into
//! the shared regions of the ps tasks it reaches through shared memory.

use super::{Cluster, call};
use crate::transport::pb;
use crate::transport::shm::kind;
use crate::transport::{Progress, PsCallError, ShmConn, ShmLink, Via};
use ndarray::{ArrayD, ArrayViewD, ArrayViewMutD};
use std::sync::atomic::Ordering;
use tonic::Status;

/// A ps's shared-memory connection, locked for a step (`None`: over TCP).
type Lease<'a> = Option<(&'a ShmLink, tokio::sync::MutexGuard<'a, Option<ShmConn>>)>;

impl Cluster {
    /// The worker's step: `compute` turns the parameters into gradients
    /// (returning the loss), which go to every shard tagged with `steps`, and
    /// the new values come back (fused push-and-pull: one round trip per
    /// step), with no copy for a shard reached through shared memory: `compute` reads that shard's values straight from its
    /// region (where the last in-place pull or step left them) and writes
    /// its gradients straight into the region's gradient area, which the ps
    /// applies from and overwrites with the new values. Shards over TCP use
    /// `params` and `grads`; so does every shard without
    /// [`Cluster::values_in_place`] (then every shard copies its gradient
    /// out of `grads` and its values into `params`).
    ///
    /// Every shared-memory connection stays locked from before `compute`
    /// until its push is answered, so no other call (a checkpoint's
    /// snapshot) and no reconnect replaces the values or the region under
    /// the step; a region that is new since the last pull (a ps restart) or
    /// a snapshot in between ends the step before `compute`.
    ///
    /// Returns the loss (`None`: nothing was computed, because a shard's
    /// values are not where the step reads them; the caller pulls again)
    /// and the push's progress or error.
    pub async fn step<F>(
        &mut self,
        params: &mut [ArrayD<f32>],
        grads: &mut [ArrayD<f32>],
        compute: F,
        learning_rate: f32,
        steps: &[u64],
        worker: u32,
    ) -> (Option<f32>, Result<Progress, PsCallError>)
    where
        F: FnOnce(&[ArrayViewD<f32>], &mut [ArrayViewMutD<f32>]) -> f32,
    {
        if !self.in_place {
            // Copying: the caller's arrays on every transport.
            let loss = {
                let pv: Vec<ArrayViewD<f32>> = params.iter().map(|p| p.view()).collect();
                let mut gv: Vec<ArrayViewMutD<f32>> =
                    grads.iter_mut().map(|g| g.view_mut()).collect();
                compute(&pv, &mut gv)
            };
            // No connection held: every shard copies its gradient out and
            // its values in (`push_one`), over shared memory or TCP.
            let none = (0..self.num_ps()).map(|_| None).collect();
            let pushed = self
                .push_leased(none, grads, params, learning_rate, steps, worker, loss)
                .await;
            return (Some(loss), pushed);
        }
        let held = match self.leases().await {
            Ok(held) => held,
            Err(e) => return (None, Err(e)),
        };
        let (loss, held) = match self.compute_in_place(held, params, grads, compute) {
            Ok(r) => r,
            Err(e) => return (None, Err(e)),
        };
        let pushed = self
            .push_leased(held, grads, params, learning_rate, steps, worker, loss)
            .await;
        (Some(loss), pushed)
    }

    /// Every ps's shared-memory connection, locked (`None` for a ps over
    /// TCP), provided each shard's values are where the step reads them:
    /// in the region for shared memory (`values_valid`), in the caller's
    /// arrays for TCP, as the last pull left them.
    ///
    /// One lock at a time, in ps order; every other caller holds at most
    /// one, so this cannot deadlock.
    ///
    /// Errors: `FAILED_PRECONDITION` (pull again) naming the first shard
    /// whose values moved.
    async fn leases(&self) -> Result<Vec<Lease<'_>>, PsCallError> {
        let mut held = Vec::with_capacity(self.num_ps());
        for ps in 0..self.num_ps() {
            let lease = self.shm(ps).await;
            let (here, valid) = match &lease {
                Some((_, conn)) => (Via::Shm, conn.as_ref().is_some_and(|c| c.values_valid)),
                None => {
                    self.took(ps, Via::Tcp);
                    (Via::Tcp, true)
                }
            };
            if here != self.values_in[ps] || !valid {
                let status = Status::failed_precondition(format!(
                    "ps:{ps}: its values are not where the step reads them (a new shared region, a snapshot or a change of transport since the last pull); pull again"
                ));
                return Err(PsCallError { ps, status });
            }
            held.push(lease);
        }
        Ok(held)
    }

    /// `compute` over views of the leased regions' values and gradient
    /// areas, and of `params` and `grads` for the shards over TCP: the loss,
    /// and the leases back.
    ///
    /// Errors: `INTERNAL` from [`Cluster::region_views`].
    fn compute_in_place<'a, F>(
        &self,
        mut held: Vec<Lease<'a>>,
        params: &[ArrayD<f32>],
        grads: &mut [ArrayD<f32>],
        compute: F,
    ) -> Result<(f32, Vec<Lease<'a>>), PsCallError>
    where
        F: FnOnce(&[ArrayViewD<f32>], &mut [ArrayViewMutD<f32>]) -> f32,
    {
        let n = self.specs.len();
        let mut pv: Vec<Option<ArrayViewD<f32>>> = (0..n).map(|_| None).collect();
        let mut gv: Vec<Option<ArrayViewMutD<f32>>> = (0..n).map(|_| None).collect();
        for (ps, lease) in held.iter_mut().enumerate() {
            let Some(c) = lease.as_mut().and_then(|(_, conn)| conn.as_mut()) else {
                continue;
            };
            let (g, v) = c.region.client_split();
            self.region_views(ps, g, v, &mut pv, &mut gv)
                .map_err(|status| PsCallError { ps, status })?;
        }
        let pviews: Vec<ArrayViewD<f32>> = pv
            .into_iter()
            .zip(params.iter())
            .map(|(v, p)| v.unwrap_or_else(|| p.view()))
            .collect();
        let mut gviews: Vec<ArrayViewMutD<f32>> = gv
            .into_iter()
            .zip(grads.iter_mut())
            .map(|(v, g)| v.unwrap_or_else(|| g.view_mut()))
            .collect();
        let loss = compute(&pviews, &mut gviews);
        Ok((loss, held))
    }

    /// The step's push to every shard, tagged with `steps`: in place on a
    /// leased connection (the gradient is already in its region, the new
    /// values stay there), otherwise copying (`push_one`: the gradient from
    /// `grads`, the values into `params`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn push_leased(
        &self,
        held: Vec<Lease<'_>>,
        grads: &[ArrayD<f32>],
        params: &mut [ArrayD<f32>],
        learning_rate: f32,
        steps: &[u64],
        worker: u32,
        loss: f32,
    ) -> Result<Progress, PsCallError> {
        // Each part's gradient, a view of its variable's: no copy.
        let grads = &self.layout.views(grads);
        let pushes =
            held.into_iter()
                .zip(self.slots(params))
                .enumerate()
                .map(|(ps, (lease, mut out))| {
                    let req = pb::PushRequest {
                        gradients: Vec::new(),
                        learning_rate,
                        step: steps[ps],
                        worker,
                        pull: true,
                        incarnation: self.incarnations[ps],
                        loss,
                        replica: 0,
                        worker_incarnation: self.worker_incarnation,
                        membership_epoch: self.epochs[ps].load(Ordering::Relaxed),
                    };
                    async move {
                        let Some((link, mut conn)) = lease else {
                            let r = self.push_one(ps, req, grads, &mut out).await;
                            if let Ok(r) = &r {
                                self.heard_epoch(ps, r.membership_epoch);
                            }
                            return r.map_err(call(ps));
                        };
                        let r = link
                            .call::<pb::PushResponse>(&mut conn, kind::PUSH, &req)
                            .await;
                        if let Some(c) = conn.as_mut() {
                            // The ps wrote the new values on success, nothing on
                            // a refusal; either way the next step's values must
                            // come from a call whose progress the worker holds.
                            c.values_valid = r.is_ok();
                        }
                        if let Ok(r) = &r {
                            self.heard_epoch(ps, r.membership_epoch);
                        }
                        r.map_err(call(ps))
                    }
                });
        // Every shard's push runs to its end: one shard's refusal must not
        // cancel another's. A sync gradient already in on one shard
        // (`ALREADY_EXISTS`, a retry) once ended the step while the push to
        // another, still connecting to its restarted ps, was dropped: the
        // worker then waited for a step that lacked its gradient, and every
        // other worker with it (chaos seed 4).
        let answers = super::settle(futures::future::join_all(pushes).await)?;
        Ok(Progress::of(
            answers.into_iter().map(|r| (r.global_step, r.complete)),
        ))
    }

    /// Views of ps `ps`'s variables over its region: the values to read
    /// (`values`) and the gradients to write (`grads`), each variable at its
    /// range of the area, filled into the model-order `pv` and `gv`.
    ///
    /// Errors: `INTERNAL` when an area is not f32-aligned or not the
    /// shard's size (the region is checked when it is opened, so a bug).
    fn region_views<'a>(
        &self,
        ps: usize,
        grads: &'a mut [u8],
        values: &'a [u8],
        pv: &mut [Option<ArrayViewD<'a, f32>>],
        gv: &mut [Option<ArrayViewMutD<'a, f32>>],
    ) -> Result<(), Status> {
        let bad = |e: String| Status::internal(format!("ps:{ps} shared region: {e}"));
        let mut g: &'a mut [f32] =
            bytemuck::try_cast_slice_mut(grads).map_err(|e| bad(e.to_string()))?;
        let mut v: &'a [f32] = bytemuck::try_cast_slice(values).map_err(|e| bad(e.to_string()))?;
        for &i in &self.by_ps[ps] {
            let shape = self.specs[i].shape.as_slice();
            let len: usize = shape.iter().product();
            if g.len() < len || v.len() < len {
                return Err(bad(format!("shorter than {}", self.specs[i].name)));
            }
            let (gi, g_rest) = std::mem::take(&mut g).split_at_mut(len);
            let (vi, v_rest) = v.split_at(len);
            (g, v) = (g_rest, v_rest);
            gv[i] = Some(ArrayViewMutD::from_shape(shape, gi).map_err(|e| bad(e.to_string()))?);
            pv[i] = Some(ArrayViewD::from_shape(shape, vi).map_err(|e| bad(e.to_string()))?);
        }
        Ok(())
    }
}
