//! [`Cluster`]: the client of every ps task that the worker, the chief,
//! `dtf local` and `dtf status` share. Per ps it takes shared memory
//! ([`super::ShmLink`]) when it can, gRPC over TCP ([`super::tcp`]) otherwise.

mod rows;
mod seed;
mod step;

use super::compress::ClientWire;
use super::proto as rpc;
use super::shm::{Area, kind};
use super::{
    CALL_TIMEOUT, ClusterError, Progress, PsCallError, PsState, ShmConn, ShmLink, Via, cluster_id,
    compress, local_port, lost, message_limit, runtime_dir, socket_path, tcp,
};
use crate::auth::{self, Credentials};
use crate::config::{Config, Transport};
use crate::model::VarSpec;
use crate::optimizer::{self, SlotSpec};
use crate::placement::Layout;
use crate::transport::pb;
use futures::future::try_join_all;
use ndarray::{ArrayD, ArrayViewD, ArrayViewMutD};
use prost::Message;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;
use tonic::Status;

/// Connections to every ps task, and where each variable lives.
#[derive(Clone)]
pub struct Cluster {
    /// One gRPC client per ps task.
    clients: Vec<tcp::Client>,
    /// Pushes and pulls on the same connections, without tonic's copies.
    direct: Vec<tcp::Direct>,
    /// The shared-memory way to each ps on this host (`None`: TCP only).
    shm: Vec<Option<Arc<ShmLink>>>,
    /// The transport each ps's latest call took ([`Via`] as a byte), for reports.
    via: Arc<Vec<AtomicU8>>,
    /// The model's variables, their parts (`model.partitioner`) and where
    /// each part lives: the callers speak whole variables, the ps parts.
    layout: Arc<Layout>,
    /// Every part as the ps tasks hold it, in part order (the variables
    /// themselves when none is split).
    specs: Vec<VarSpec>,
    /// The ps holding each part.
    owner: Vec<usize>,
    /// Part indices held by each ps.
    by_ps: Vec<Vec<usize>>,
    /// Incarnation each shard had at the last pull (0: unknown).
    incarnations: Vec<u64>,
    /// This process, to the ps tasks: random per [`Cluster::new`] (clones
    /// share it), never 0. A second process pushing as the same worker
    /// fences this one ([`crate::ps::workers`]).
    worker_incarnation: u64,
    /// The membership epoch each ps last answered with (0: none yet): the
    /// step tag's second half.
    epochs: Arc<Vec<AtomicU64>>,
    /// The optimizer's slots of every part, as the ps tasks name them.
    slot_specs: Vec<SlotSpec>,
    /// The optimizer's slots of every whole variable, in the order
    /// snapshots return them and [`Cluster::initialize`] takes them.
    model_slot_specs: Vec<SlotSpec>,
    /// For each part's slot, its whole variable's slot (`model_slot_specs`).
    slot_of: Vec<usize>,
    /// The ps whose copy of the non-slot scalars a snapshot keeps:
    /// TensorFlow's home for them (see [`optimizer::non_slot_owner`]).
    non_slot_ps: usize,
    /// [`Cluster::pull`] leaves a shared-memory shard's values in its region
    /// (the worker's [`Cluster::step`] reads them there) instead of copying
    /// them into the caller's arrays.
    in_place: bool,
    /// Where [`Cluster::pull`] last left each shard's values (in place).
    values_in: Vec<Via>,
    /// How tensors cross each TCP link (`cluster.compression`), and its state.
    wire: Arc<ClientWire>,
    /// gRPC message bytes sent to and received from each ps over TCP.
    bytes: Arc<Vec<[AtomicU64; 2]>>,
    /// The embedding tables' names, in the model's order.
    tables: Vec<String>,
}

/// What crossed one ps link, for reports (`/metrics`, `dtf status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The transport of the latest call.
    pub via: Via,
    /// `cluster.compression` on it: `none` over shared memory, always exact.
    pub compression: &'static str,
    /// gRPC message bytes sent over TCP.
    pub sent: u64,
    /// gRPC message bytes received over TCP.
    pub received: u64,
}

/// The state of the whole model at one moment, shard by shard: what a
/// checkpoint holds.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// ps 0's step: the global step.
    pub step: u64,
    /// Every variable, model order.
    pub values: Vec<ArrayD<f32>>,
    /// Their EMA shadows, same order.
    pub shadows: Vec<ArrayD<f32>>,
    /// The optimizer's slots, in [`crate::optimizer::Optimizer::slot_specs`] order.
    pub slots: Vec<ArrayD<f32>>,
    /// The run the state belongs to (ps 0's; [`crate::checkpoint::Checkpoint::run`]).
    pub run: u64,
    /// Each ps task's own step when read ([`crate::checkpoint::Checkpoint::shard_steps`]).
    pub shard_steps: Vec<u64>,
    /// Every embedding table whole (every ps's rows merged, sorted by id),
    /// in the model's order ([`crate::checkpoint::Checkpoint::tables`]);
    /// a delta's: the rows changed since its chain's base.
    pub tables: Vec<(String, crate::model::table::Rows)>,
    /// How the tables were read: whole, as a chain's base, or as a delta.
    pub cut: crate::transport::call::Cut,
    /// A delta's ids dropped since its chain's base, per table in
    /// `tables`' order; empty otherwise.
    pub removed: Vec<Vec<u64>>,
}

/// Every shard's answer to one call that went to all of them: the answers,
/// or the first failure — one other than `ALREADY_EXISTS` first (a sync
/// retry whose part one ps had already must not hide a real failure).
fn settle<T>(results: Vec<Result<T, PsCallError>>) -> Result<Vec<T>, PsCallError> {
    let mut answers = Vec::with_capacity(results.len());
    let (mut failed, mut already) = (None, None);
    for r in results {
        match r {
            Ok(r) => answers.push(r),
            Err(e) if e.status.code() == tonic::Code::AlreadyExists => {
                already.get_or_insert(e);
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    match failed.or(already) {
        Some(e) => Err(e),
        None => Ok(answers),
    }
}

fn call(ps: usize) -> impl Fn(Status) -> PsCallError {
    move |status| PsCallError {
        ps,
        status: auth::explain_tls_mismatch(status),
    }
}

impl Cluster {
    /// Lazily connected clients (a ps that is not up yet is retried per call).
    ///
    /// Errors: an address that is not a valid URI authority, or a token a header cannot carry.
    pub fn new(
        config: &Config,
        specs: Vec<VarSpec>,
        credentials: &Credentials,
    ) -> Result<Self, ClusterError> {
        Self::with_timeout(config, specs, credentials, CALL_TIMEOUT)
    }

    /// [`Cluster::new`] with every call bounded by `timeout` (`dtf status`: short).
    ///
    /// Errors: as [`Cluster::new`].
    pub fn with_timeout(
        config: &Config,
        specs: Vec<VarSpec>,
        credentials: &Credentials,
        timeout: Duration,
    ) -> Result<Self, ClusterError> {
        let limit = message_limit(config);
        let compression = config.cluster.compression;
        rpc::keep_freed_buffers();
        let (clients, direct): (Vec<_>, Vec<_>) = config
            .cluster
            .ps
            .iter()
            .map(|addr| {
                tcp::clients(
                    credentials,
                    addr,
                    limit,
                    timeout,
                    compress::name(compression),
                )
                .map_err(ClusterError)
            })
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .unzip();
        let layout = Layout::new(config, specs);
        let specs = layout.part_specs();
        let owner = layout.owner().to_vec();
        let mut by_ps = vec![Vec::new(); clients.len()];
        for (i, &p) in owner.iter().enumerate() {
            by_ps[p].push(i);
        }
        let dir = runtime_dir(config);
        let shm = config
            .cluster
            .ps
            .iter()
            .enumerate()
            .map(|(ps, addr)| {
                let port =
                    local_port(addr).filter(|_| config.cluster.transport == Transport::Auto)?;
                let mut layout = Vec::new();
                let mut at = 0;
                for &i in &by_ps[ps] {
                    let n = 4 * specs[i].shape.iter().product::<usize>();
                    layout.push(at..at + n);
                    at += n;
                }
                Some(Arc::new(ShmLink {
                    ps,
                    path: socket_path(&dir, port, &config.cluster.ps, ps),
                    cluster: cluster_id(&config.cluster.ps),
                    bearer: credentials.bearer(),
                    names: by_ps[ps].iter().map(|&i| specs[i].name.clone()).collect(),
                    layout,
                    area: at,
                    limit,
                    timeout,
                    conn: tokio::sync::Mutex::new(None),
                    warned: AtomicBool::new(false),
                    opened: AtomicBool::new(false),
                }))
            })
            .collect();
        let incarnations = vec![0; clients.len()];
        let epochs = Arc::new((0..clients.len()).map(|_| AtomicU64::new(0)).collect());
        let values_in = vec![Via::Tcp; clients.len()];
        let via = Arc::new((0..clients.len()).map(|_| AtomicU8::new(0)).collect());
        let optimizer = config.train.optimizer();
        let slot_specs = optimizer.slot_specs(&specs);
        let model_slot_specs = optimizer.slot_specs(layout.vars());
        let slot_of = slot_specs
            .iter()
            .map(|s| {
                let var = s.var.map(|p| layout.parts()[p].var);
                model_slot_specs
                    .iter()
                    .position(|m| m.var == var && m.index == s.index)
                    .expect("the same optimizer names a slot per part and per variable")
            })
            .collect();
        let non_slot_ps = optimizer::non_slot_owner(&specs).map_or(0, |i| owner[i]);
        let sizes: Vec<Vec<usize>> = by_ps
            .iter()
            .map(|vars| {
                vars.iter()
                    .map(|&i| specs[i].shape.iter().product())
                    .collect()
            })
            .collect();
        let wire = Arc::new(ClientWire::new(compression, &sizes));
        let bytes = Arc::new((0..clients.len()).map(|_| Default::default()).collect());
        Ok(Self {
            clients,
            direct,
            shm,
            via,
            layout: Arc::new(layout),
            specs,
            owner,
            by_ps,
            incarnations,
            worker_incarnation: rand::random::<u64>() | 1,
            epochs,
            slot_specs,
            model_slot_specs,
            slot_of,
            non_slot_ps,
            in_place: false,
            values_in,
            wire,
            bytes,
            tables: crate::placement::tables(config)
                .into_iter()
                .map(|t| t.name)
                .collect(),
        })
    }

    /// From now on [`Cluster::pull`] leaves the values of a shard reached
    /// through shared memory in its region, where [`Cluster::step`] reads
    /// them: the worker's step loop, which then copies no values at all.
    ///
    /// Not when a variable is split: the step computes on whole variables,
    /// and a split one's parts lie in several regions, so every shard then
    /// copies its values out of its region and its gradients into it.
    pub fn values_in_place(&mut self) {
        self.in_place = self.layout.whole();
    }

    pub fn num_ps(&self) -> usize {
        self.clients.len()
    }

    /// The model's variables, whole.
    pub fn specs(&self) -> &[VarSpec] {
        self.layout.vars()
    }

    /// The model's variables, their parts and where each part lives.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Each shard's incarnation at its last pull (0: not pulled yet): a
    /// change is a restart of that ps.
    pub fn incarnations(&self) -> &[u64] {
        &self.incarnations
    }

    /// The variables (parts) ps `ps` holds, as it names them, in order.
    pub fn shard(&self, ps: usize) -> impl Iterator<Item = &VarSpec> {
        self.by_ps[ps].iter().map(|&i| &self.specs[i])
    }

    /// The transport each ps's latest call took.
    pub fn transports(&self) -> Vec<Via> {
        self.via
            .iter()
            .map(|v| match v.load(Ordering::Relaxed) {
                1 => Via::Shm,
                _ => Via::Tcp,
            })
            .collect()
    }

    /// Each ps link: its transport, compression and bytes.
    pub fn links(&self) -> Vec<Link> {
        self.transports()
            .into_iter()
            .zip(self.bytes.iter())
            .map(|(via, [sent, received])| Link {
                via,
                compression: match via {
                    Via::Shm => compress::name(crate::config::Compression::None),
                    Via::Tcp => self.wire.header(),
                },
                sent: sent.load(Ordering::Relaxed),
                received: received.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Counts a TCP call's message bytes to and from `ps`.
    fn count(&self, ps: usize, sent: usize, received: usize) {
        let [s, r] = &self.bytes[ps];
        s.fetch_add(sent as u64, Ordering::Relaxed);
        r.fetch_add(received as u64, Ordering::Relaxed);
    }

    /// The membership epoch each ps last answered with (0: none yet).
    pub fn epochs(&self) -> Vec<u64> {
        self.epochs
            .iter()
            .map(|e| e.load(Ordering::Relaxed))
            .collect()
    }

    /// Copies the epochs each ps last answered with into `seen`; whether any
    /// changed from a known one (0: not known yet).
    pub fn epochs_changed(&self, seen: &mut [u64]) -> bool {
        let mut changed = false;
        for (seen, now) in seen.iter_mut().zip(self.epochs.iter()) {
            let now = now.load(Ordering::Relaxed);
            changed |= *seen != 0 && *seen != now;
            *seen = now;
        }
        changed
    }

    /// Remembers the membership epoch `ps` answered with.
    fn heard_epoch(&self, ps: usize, epoch: u64) {
        self.epochs[ps].store(epoch, Ordering::Relaxed);
    }

    fn took(&self, ps: usize, via: Via) {
        self.via[ps].store(u8::from(via == Via::Shm), Ordering::Relaxed);
    }

    /// The shared-memory connection to `ps`, locked and open, when there is one.
    async fn shm(
        &self,
        ps: usize,
    ) -> Option<(&ShmLink, tokio::sync::MutexGuard<'_, Option<ShmConn>>)> {
        let link = self.shm[ps].as_deref()?;
        let conn = link.ready().await?;
        self.took(ps, Via::Shm);
        Some((link, conn))
    }

    /// `params` (model order, whole variables) as views of each ps's parts
    /// (shard order): no copy.
    fn slots<'a>(&self, params: &'a mut [ArrayD<f32>]) -> Vec<Vec<ArrayViewMutD<'a, f32>>> {
        let mut out: Vec<Vec<_>> = (0..self.num_ps()).map(|_| Vec::new()).collect();
        for (p, &ps) in self.layout.views_mut(params).into_iter().zip(&self.owner) {
            out[ps].push(p);
        }
        out
    }

    /// Decodes the tensors of a gRPC answer into the shard's arrays: values,
    /// or (`changes`: a onebit push's answer) changes added to them.
    fn store(
        &self,
        ps: usize,
        tensors: &[pb::Tensor],
        out: &mut [ArrayViewMutD<'_, f32>],
        changes: bool,
    ) -> Result<(), Status> {
        for t in tensors {
            let i = self.by_ps[ps]
                .iter()
                .position(|&i| self.specs[i].name == t.name)
                .ok_or_else(|| {
                    Status::internal(format!(
                        "ps:{ps} sent variable {:?} it does not hold",
                        t.name
                    ))
                })?;
            self.wire.store(t, &mut out[i], changes)?;
        }
        Ok(())
    }

    /// One ps's `State`.
    async fn state_of(&self, ps: usize) -> Result<PsState, Status> {
        if let Some((link, mut conn)) = self.shm(ps).await {
            return link
                .call::<pb::StateResponse>(&mut conn, kind::STATE, &pb::StateRequest {})
                .await
                .map(PsState::from);
        }
        self.took(ps, Via::Tcp);
        let mut c = self.clients[ps].clone();
        Ok(c.state(pb::StateRequest {}).await?.into_inner().into())
    }

    /// Every ps task's state, or the error of the first that did not answer.
    pub async fn states(&self) -> Result<Vec<PsState>, PsCallError> {
        try_join_all(
            (0..self.num_ps()).map(|ps| async move { self.state_of(ps).await.map_err(call(ps)) }),
        )
        .await
    }

    /// Each ps's state or why it did not answer (`dtf status`).
    pub async fn each_state(&self) -> Vec<Result<PsState, Status>> {
        futures::future::join_all((0..self.num_ps()).map(|ps| self.state_of(ps))).await
    }

    /// One ps's pull into its arrays (and shadows). With `with_slots` (a
    /// snapshot) the optimizer's slots come back as tensors in the answer.
    async fn pull_one(
        &self,
        ps: usize,
        min_step: u64,
        values: &mut [ArrayViewMutD<'_, f32>],
        shadows: Option<&mut [ArrayViewMutD<'_, f32>]>,
        with_slots: bool,
        in_place: bool,
    ) -> Result<(pb::PullResponse, Via), Status> {
        let req = pb::PullRequest {
            names: vec![],
            with_shadows: shadows.is_some(),
            min_step,
            with_slots,
        };
        if let Some((link, mut conn)) = self.shm(ps).await {
            // Values from shared memory: no TCP answer names what the arrays hold.
            self.wire.take_replica(ps);
            let r: pb::PullResponse = link.call(&mut conn, kind::PULL, &req).await?;
            let c = conn.as_mut().ok_or_else(|| lost(ps, "closed"))?;
            // Only a plain pull may stay in place: a snapshot's values are
            // newer than the step the worker's progress names.
            c.values_valid = in_place && shadows.is_none() && !with_slots;
            if !c.values_valid {
                link.read_area(&c.region, Area::Values, values);
            }
            if let Some(sh) = shadows {
                link.read_area(&c.region, Area::Shadows, sh);
            }
            return Ok((r, Via::Shm));
        }
        self.took(ps, Via::Tcp);
        if shadows.is_none() && !with_slots {
            // The caller's arrays take other values: no onebit answer names them.
            self.wire.take_replica(ps);
        }
        let sent = req.encoded_len();
        let r = self.direct[ps].pull(req).await?;
        self.count(ps, sent, r.encoded_len());
        self.store(ps, &r.variables, values, false)?;
        if let Some(sh) = shadows {
            self.store(ps, &r.shadows, sh, false)?;
        }
        Ok((r, Via::Tcp))
    }

    /// Pulls every variable into `params` (model order). With `min_steps`, each
    /// shard first waits (bounded) until its step reaches the given value.
    pub async fn pull(
        &mut self,
        params: &mut [ArrayD<f32>],
        min_steps: Option<&[u64]>,
    ) -> Result<Progress, PsCallError> {
        let slots = self.slots(params);
        let this = &*self;
        let replies = try_join_all(slots.into_iter().enumerate().map(|(ps, mut out)| {
            let min_step = min_steps.map_or(0, |m| m[ps]);
            async move {
                this.pull_one(ps, min_step, &mut out, None, false, this.in_place)
                    .await
                    .map_err(call(ps))
            }
        }))
        .await?;
        let replies: Vec<pb::PullResponse> = replies
            .into_iter()
            .enumerate()
            .map(|(ps, (r, via))| {
                self.incarnations[ps] = r.incarnation;
                self.heard_epoch(ps, r.membership_epoch);
                self.values_in[ps] = via;
                r
            })
            .collect();
        Ok(Progress::of(
            replies.iter().map(|r| (r.global_step, r.complete)),
        ))
    }

    /// One ps's fused push-and-pull: `req` carries no tensors; the shard's
    /// gradients (`grads`: every part, part order) go with it and its values
    /// come back into `out`.
    async fn push_one(
        &self,
        ps: usize,
        mut req: pb::PushRequest,
        grads: &[ArrayViewD<'_, f32>],
        out: &mut [ArrayViewMutD<'_, f32>],
    ) -> Result<pb::PushResponse, Status> {
        if let Some((link, mut conn)) = self.shm(ps).await {
            self.wire.take_replica(ps);
            {
                let c = conn.as_mut().ok_or_else(|| lost(ps, "closed"))?;
                let dst = c.region.area_mut(Area::Gradients);
                for (&i, range) in self.by_ps[ps].iter().zip(&link.layout) {
                    let g = grads[i]
                        .as_slice()
                        .expect("arrays built by dtf are contiguous");
                    dst[range.clone()].copy_from_slice(bytemuck::cast_slice(g));
                }
            }
            let r: pb::PushResponse = link.call(&mut conn, kind::PUSH, &req).await?;
            if req.pull {
                let c = conn.as_mut().ok_or_else(|| lost(ps, "closed"))?;
                c.values_valid = false;
                link.read_area(&c.region, Area::Values, out);
            }
            return Ok(r);
        }
        self.took(ps, Via::Tcp);
        req.gradients = self.wire.gradients(
            ps,
            self.by_ps[ps]
                .iter()
                .map(|&i| (self.specs[i].name.as_str(), &grads[i])),
        );
        // Until this answer is stored, the arrays hold nothing it names.
        req.replica = self.wire.take_replica(ps);
        let changes = req.replica != 0;
        let sent = req.encoded_len();
        let r = self.direct[ps].push(req).await?;
        self.count(ps, sent, r.encoded_len());
        self.store(ps, &r.variables, out, changes)?;
        self.wire.set_replica(ps, r.replica);
        Ok(r)
    }
}
