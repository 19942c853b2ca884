//! The ring's calls between ps tasks, in dtf's own types: `Replicate` (a
//! snapshot handed to the neighbour), `FetchReplica` (a starting ps asks
//! for its copy back) and the neighbour's incarnation (does it still hold
//! the copy it took?). The ps's `replica` speaks these; only this file
//! and the ps's gRPC adapter see the wire's messages.

use super::pb;
use super::tcp::Client;
use bytes::Bytes;
use tonic::Status;

/// A snapshot copy as the neighbour keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Replica {
    /// The step the snapshot holds (read from inside the file, not its name).
    pub step: u64,
    /// The snapshot file's bytes.
    pub snapshot: Bytes,
}

/// The client of a ps's neighbour on the ring (gRPC: the neighbour is
/// another host as often as not).
#[derive(Clone)]
pub struct RingClient(Client);

impl RingClient {
    /// Calls the neighbour through `client` (made with the cluster's token).
    pub fn new(client: Client) -> Self {
        Self(client)
    }

    /// The neighbour's process incarnation.
    ///
    /// Errors: the call's status.
    pub async fn incarnation(&self) -> Result<u64, Status> {
        let state = self.0.clone().state(pb::StateRequest {}).await?;
        Ok(state.into_inner().incarnation)
    }

    /// Hands shard `task`'s snapshot of `step` to the neighbour. Returns
    /// the incarnation of the process that took it.
    ///
    /// Errors: the call's status (`RESOURCE_EXHAUSTED` while it still
    /// writes the copy before).
    pub async fn replicate(&self, task: usize, step: u64, snapshot: Bytes) -> Result<u64, Status> {
        let req = pb::ReplicateRequest {
            task: task as u32,
            step,
            snapshot,
        };
        Ok(self
            .0
            .clone()
            .replicate(req)
            .await?
            .into_inner()
            .incarnation)
    }

    /// The newest copy the neighbour keeps of shard `task`; `None` when it
    /// keeps none.
    ///
    /// Errors: the call's status.
    pub async fn fetch(&self, task: usize) -> Result<Option<Replica>, Status> {
        let req = pb::FetchReplicaRequest { task: task as u32 };
        let answer = self.0.clone().fetch_replica(req).await?.into_inner();
        Ok(answer.held.then_some(Replica {
            step: answer.step,
            snapshot: answer.snapshot,
        }))
    }
}

impl From<Option<Replica>> for pb::FetchReplicaResponse {
    fn from(copy: Option<Replica>) -> Self {
        match copy {
            Some(r) => Self {
                held: true,
                step: r.step,
                snapshot: r.snapshot,
            },
            None => Self::default(),
        }
    }
}
