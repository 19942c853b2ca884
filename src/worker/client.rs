//! The worker's view of the ps tasks: one gRPC client per ps, the placement,
//! and whole-model pull/push that talk to every shard in parallel.

use crate::auth::{self, AddToken, Credentials};
use crate::config::Config;
use crate::model::VarSpec;
use crate::optimizer::{self, SlotSpec};
use crate::pb::parameter_server_client::ParameterServerClient;
use crate::{pb, placement, rpc};
use futures::future::try_join_all;
use ndarray::ArrayD;
use std::time::Duration;
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Deadline of every call to a ps.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

type Client = ParameterServerClient<InterceptedService<Channel, AddToken>>;

/// A failed call to one ps task.
#[derive(Debug, thiserror::Error)]
#[error("ps:{ps}: {}", rpc::explain(status))]
pub struct PsCallError {
    /// Which ps task.
    pub ps: usize,
    /// What it (or the transport) said.
    pub status: Status,
}

impl PsCallError {
    /// The ps is down, unreachable or busy (`RESOURCE_EXHAUSTED`: over one
    /// of its limits, `ps::limits`): wait and try again.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self.status.code(),
            Code::Unavailable
                | Code::ResourceExhausted
                | Code::Unknown
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Aborted
        )
    }
    /// The ps lost or changed its state (restart, restore): pull again (the chief re-seeds).
    pub fn needs_pull(&self) -> bool {
        self.status.code() == Code::FailedPrecondition
    }
}

/// What a pull or push learned besides the values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// Each shard's step; `steps[0]` is the global step.
    pub steps: Vec<u64>,
    /// Any shard says the run is complete.
    pub complete: bool,
}

impl Progress {
    pub fn global_step(&self) -> u64 {
        self.steps[0]
    }
}

/// Connections to every ps task, and where each variable lives.
#[derive(Clone)]
pub struct Cluster {
    /// One client per ps task.
    clients: Vec<Client>,
    /// The model's variables in order.
    specs: Vec<VarSpec>,
    /// Variable indices held by each ps.
    by_ps: Vec<Vec<usize>>,
    /// Incarnation each shard had at the last pull (0: unknown).
    incarnations: Vec<u64>,
    /// The optimizer's slots of every variable, in the order snapshots
    /// return them and [`Cluster::initialize`] takes them.
    slot_specs: Vec<SlotSpec>,
    /// The ps whose copy of the non-slot scalars a snapshot keeps:
    /// TensorFlow's home for them (see [`optimizer::non_slot_owner`]).
    non_slot_ps: usize,
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
    ) -> Result<Self, String> {
        let limit = crate::ps::message_limit(config);
        rpc::keep_freed_buffers();
        let auth = credentials.add_token()?;
        let clients = config
            .cluster
            .ps
            .iter()
            .map(|addr| {
                let ep = credentials
                    .endpoint(addr)
                    .map_err(|e| format!("cluster.ps: {e}"))?
                    .connect_timeout(Duration::from_secs(2))
                    // A hung ps must not hang its workers: every call has a
                    // deadline (far above the ps's own bounded waits).
                    .timeout(CALL_TIMEOUT)
                    .tcp_nodelay(true)
                    .initial_stream_window_size(crate::ps::window(limit))
                    .initial_connection_window_size(crate::ps::window(limit))
                    .max_frame_size(crate::ps::FRAME);
                Ok(
                    ParameterServerClient::with_interceptor(ep.connect_lazy(), auth.clone())
                        .max_decoding_message_size(limit)
                        .max_encoding_message_size(limit),
                )
            })
            .collect::<Result<Vec<_>, String>>()?;
        let owner = placement::assign(&specs, clients.len(), config.cluster.placement);
        let mut by_ps = vec![Vec::new(); clients.len()];
        for (i, &p) in owner.iter().enumerate() {
            by_ps[p].push(i);
        }
        let incarnations = vec![0; clients.len()];
        let slot_specs = config.train.optimizer().slot_specs(&specs);
        let non_slot_ps = optimizer::non_slot_owner(&specs).map_or(0, |i| owner[i]);
        Ok(Self {
            clients,
            specs,
            by_ps,
            incarnations,
            slot_specs,
            non_slot_ps,
        })
    }

    pub fn num_ps(&self) -> usize {
        self.clients.len()
    }

    pub fn specs(&self) -> &[VarSpec] {
        &self.specs
    }

    /// Variable indices held by ps `ps`.
    pub fn shard(&self, ps: usize) -> &[usize] {
        &self.by_ps[ps]
    }

    /// Every ps task's state, or the error of the first that did not answer.
    pub async fn states(&self) -> Result<Vec<pb::StateResponse>, PsCallError> {
        try_join_all(self.clients.iter().enumerate().map(|(ps, c)| {
            let mut c = c.clone();
            async move {
                c.state(pb::StateRequest {})
                    .await
                    .map(|r| r.into_inner())
                    .map_err(call(ps))
            }
        }))
        .await
    }

    fn index(&self, ps: usize, name: &str) -> Result<usize, PsCallError> {
        self.by_ps[ps]
            .iter()
            .copied()
            .find(|&i| self.specs[i].name == name)
            .ok_or_else(|| PsCallError {
                ps,
                status: Status::internal(format!(
                    "ps:{ps} sent variable {name:?} it does not hold"
                )),
            })
    }

    fn store(
        &self,
        ps: usize,
        tensors: &[pb::Tensor],
        out: &mut [ArrayD<f32>],
    ) -> Result<(), PsCallError> {
        for t in tensors {
            let i = self.index(ps, &t.name)?;
            rpc::decode_into(t, &mut out[i]).map_err(|e| PsCallError {
                ps,
                status: e.into(),
            })?;
        }
        Ok(())
    }

    /// Pulls every variable into `params` (model order). With `min_steps`, each
    /// shard first waits (bounded) until its step reaches the given value.
    pub async fn pull(
        &mut self,
        params: &mut [ArrayD<f32>],
        min_steps: Option<&[u64]>,
    ) -> Result<Progress, PsCallError> {
        let replies = try_join_all(self.clients.iter().enumerate().map(|(ps, c)| {
            let mut c = c.clone();
            let min_step = min_steps.map_or(0, |m| m[ps]);
            async move {
                c.pull(pb::PullRequest {
                    names: vec![],
                    with_shadows: false,
                    min_step,
                    with_slots: false,
                })
                .await
                .map(|r| r.into_inner())
                .map_err(call(ps))
            }
        }))
        .await?;
        let mut progress = Progress {
            steps: Vec::with_capacity(replies.len()),
            complete: false,
        };
        for (ps, r) in replies.into_iter().enumerate() {
            self.store(ps, &r.variables, params)?;
            self.incarnations[ps] = r.incarnation;
            progress.steps.push(r.global_step);
            progress.complete |= r.complete;
        }
        Ok(progress)
    }

    /// Pushes `grads` (model order) to every shard, each tagged with the step
    /// its parameters were read at, and stores the values each shard returns
    /// (fused push-and-pull: one round trip per step).
    pub async fn push_pull(
        &mut self,
        grads: &[ArrayD<f32>],
        params: &mut [ArrayD<f32>],
        learning_rate: f32,
        steps: &[u64],
        worker: u32,
        loss: f32,
    ) -> Result<Progress, PsCallError> {
        let requests: Vec<pb::PushRequest> = (0..self.clients.len())
            .map(|ps| pb::PushRequest {
                gradients: self.by_ps[ps]
                    .iter()
                    .map(|&i| rpc::encode(&self.specs[i].name, &grads[i]))
                    .collect(),
                learning_rate,
                step: steps[ps],
                worker,
                pull: true,
                incarnation: self.incarnations[ps],
                loss,
            })
            .collect();
        let replies = try_join_all(self.clients.iter().zip(requests).enumerate().map(
            |(ps, (c, req))| {
                let mut c = c.clone();
                async move { c.push(req).await.map(|r| r.into_inner()).map_err(call(ps)) }
            },
        ))
        .await?;
        let mut progress = Progress {
            steps: Vec::with_capacity(replies.len()),
            complete: false,
        };
        for (ps, r) in replies.into_iter().enumerate() {
            self.store(ps, &r.variables, params)?;
            progress.steps.push(r.global_step);
            progress.complete |= r.complete;
        }
        Ok(progress)
    }

    /// Initializes the shards of the ps tasks in `only` from `values` (model
    /// order), optional `shadows` and optional `slots` ([`Snapshot::slots`]
    /// order; `None`: fresh), at `step`. Returns the shards that took it.
    pub async fn initialize(
        &self,
        only: &[usize],
        values: &[ArrayD<f32>],
        shadows: Option<&[ArrayD<f32>]>,
        slots: Option<&[ArrayD<f32>]>,
        step: u64,
        force: bool,
    ) -> Result<Vec<usize>, PsCallError> {
        let replies = try_join_all(only.iter().map(|&ps| {
            let mut c = self.clients[ps].clone();
            let enc = |src: &[ArrayD<f32>]| {
                self.by_ps[ps]
                    .iter()
                    .map(|&i| rpc::encode(&self.specs[i].name, &src[i]))
                    .collect()
            };
            // A shard's slots, and every shard's copy of the non-slot scalars.
            let slots = slots
                .map(|slots| {
                    self.slot_specs
                        .iter()
                        .zip(slots)
                        .filter(|(spec, _)| spec.var.is_none_or(|i| self.by_ps[ps].contains(&i)))
                        .map(|(spec, a)| rpc::encode(&spec.name, a))
                        .collect()
                })
                .unwrap_or_default();
            let req = pb::InitializeRequest {
                variables: enc(values),
                shadows: shadows.map(enc).unwrap_or_default(),
                global_step: step,
                force,
                slots,
            };
            async move {
                c.initialize(req)
                    .await
                    .map(|r| (ps, r.into_inner().applied))
                    .map_err(call(ps))
            }
        }))
        .await?;
        Ok(replies
            .into_iter()
            .filter(|(_, applied)| *applied)
            .map(|(ps, _)| ps)
            .collect())
    }

    /// Every variable, its EMA shadow and its slots, and the global step: a
    /// consistent snapshot per shard, for checkpoints and evaluation.
    pub async fn snapshot(&self) -> Result<Snapshot, PsCallError> {
        let replies = try_join_all(self.clients.iter().enumerate().map(|(ps, c)| {
            let mut c = c.clone();
            async move {
                c.pull(pb::PullRequest {
                    names: vec![],
                    with_shadows: true,
                    min_step: 0,
                    with_slots: true,
                })
                .await
                .map(|r| r.into_inner())
                .map_err(call(ps))
            }
        }))
        .await?;
        let mut values: Vec<ArrayD<f32>> = self
            .specs
            .iter()
            .map(|s| ArrayD::zeros(s.shape.as_slice()))
            .collect();
        let mut shadows = values.clone();
        let mut slots: Vec<ArrayD<f32>> = self
            .slot_specs
            .iter()
            .map(|s| ArrayD::zeros(s.shape.as_slice()))
            .collect();
        let mut got = vec![false; slots.len()];
        let mut step = 0;
        for (ps, r) in replies.into_iter().enumerate() {
            self.store(ps, &r.variables, &mut values)?;
            self.store(ps, &r.shadows, &mut shadows)?;
            for t in &r.slots {
                let bad = |why: &str| PsCallError {
                    ps,
                    status: Status::internal(format!("ps:{ps} sent slot {:?}: {why}", t.name)),
                };
                let j = self
                    .slot_specs
                    .iter()
                    .position(|s| s.name == t.name)
                    .ok_or_else(|| bad("not a slot of this optimizer"))?;
                match self.slot_specs[j].var {
                    Some(i) if !self.by_ps[ps].contains(&i) => {
                        return Err(bad("its variable is not on that ps"));
                    }
                    // Every shard keeps a copy; the checkpoint takes TensorFlow's.
                    None if ps != self.non_slot_ps => continue,
                    _ => {}
                }
                rpc::decode_into(t, &mut slots[j]).map_err(|e| PsCallError {
                    ps,
                    status: e.into(),
                })?;
                got[j] = true;
            }
            if ps == 0 {
                step = r.global_step;
            }
        }
        if let Some(j) = got.iter().position(|g| !g) {
            return Err(PsCallError {
                ps: self.slot_specs[j].var.map_or(self.non_slot_ps, |i| {
                    (0..self.by_ps.len())
                        .find(|&p| self.by_ps[p].contains(&i))
                        .unwrap_or(0)
                }),
                status: Status::internal(format!(
                    "slot {:?} missing from the snapshot",
                    self.slot_specs[j].name
                )),
            });
        }
        Ok(Snapshot {
            step,
            values,
            shadows,
            slots,
        })
    }

    /// Tells every ps the run is complete (best effort per task).
    pub async fn complete(&self, step: u64) -> Result<(), PsCallError> {
        try_join_all(self.clients.iter().enumerate().map(|(ps, c)| {
            let mut c = c.clone();
            async move {
                c.complete(pb::CompleteRequest { global_step: step })
                    .await
                    .map(|_| ())
                    .map_err(call(ps))
            }
        }))
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_ps_is_retried_and_a_refusal_is_not() {
        let err = |code| PsCallError {
            ps: 0,
            status: Status::new(code, "x"),
        };
        // ps::limits answers RESOURCE_EXHAUSTED past a limit: back off, retry.
        assert!(err(Code::ResourceExhausted).is_unavailable());
        assert!(err(Code::Unavailable).is_unavailable());
        assert!(!err(Code::InvalidArgument).is_unavailable());
        assert!(!err(Code::Unauthenticated).is_unavailable());
    }
}
