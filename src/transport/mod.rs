//! The wire between tasks, in one place: the generated types ([`pb`]), their
//! conversion to domain types ([`proto`]), the message limit, the two
//! transports ([`tcp`]: gRPC between hosts; [`shm`]: shared memory on one
//! host) and [`Cluster`], the client of every ps task that the worker, the
//! chief, `dtf local` and `dtf status` share.
//!
//! A [`Cluster`] picks the transport per ps (`cluster.transport = "auto"`):
//! shared memory when the ps's address is on this host and its socket
//! answers and accepts this task, gRPC over TCP otherwise. Callers do not
//! see which, except through [`Cluster::transports`], for reports. The
//! semantics are the same on both: the ps serves both with the same
//! functions (`PsService::push_with` and its siblings).

pub mod call;
mod cluster;
pub mod compress;
pub mod proto;
pub mod ring;
pub mod shm;
mod state;
pub mod tcp;

/// Generated from `proto/dtf/v1/ps.proto`: the wire's own types. Outside
/// `transport/` only the ps's two adapters (`ps/grpc.rs`, `ps/shm.rs`) and
/// the tests' hostile clients use them; [`proto`] converts them.
pub mod pb {
    tonic::include_proto!("dtf.v1");
}

pub use cluster::{Cluster, Link, Snapshot};
pub use state::{PsState, TableCount, WorkerContact};

use crate::auth;
use crate::config::Config;
use ndarray::ArrayViewMutD;
use prost::Message;
use proto as rpc;
use shm::{Area, Region, kind};
use std::fmt;
use std::net::{ToSocketAddrs, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::UnixStream;
use tonic::{Code, Status};
use tracing::{info, warn};

/// Deadline of every call to a ps.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a shared-memory connection and its handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest message a task may need to send or receive for this model: every
/// variable of the model, its shadow and its optimizer slots (the chief's
/// snapshot), its embedding tables' rows ([`TABLE_BYTES`]), plus room for
/// framing. Derived, so a big model never fails on
/// gRPC's 4 MiB default.
pub fn message_limit(config: &Config) -> usize {
    let floats: usize = config
        .model
        .layers
        .windows(2)
        .map(|w| w[0] * w[1] + w[1])
        .sum();
    let copies = 2 + config.train.optimizer().slot_names().len();
    let tables = if crate::placement::tables(config).is_empty() {
        0
    } else {
        TABLE_BYTES
    };
    copies * 4 * floats + (1 << 20) + tables
}

/// The most bytes of embedding rows (ids, values, shadows, slots) one
/// message carries: those of the ps's snapshot file its ring neighbour
/// takes (the chief's reads and seeding go a page at a time,
/// [`PAGE_BYTES`]). Rows are made as ids arrive, so no config gives their
/// size; 1 GiB a ps (some 5 million rows of 16 floats with Adagrad) keeps
/// a message well below protobuf's 2 GiB. A larger snapshot stays on its
/// ps's own disk, and the ps says so once (ring copies in pages would
/// lift it).
pub const TABLE_BYTES: usize = 1 << 30;

/// The most bytes of embedding rows one page carries: the chief reads a
/// ps's tables ([`cluster::Cluster::snapshot`]) and seeds them
/// ([`cluster::Cluster::initialize`]) a page at a time, and a ps copies a
/// table for its snapshot a page at a time under the table's lock
/// (`ps::PsService::read_rows`), so no message and no lock grows with the
/// table.
pub const PAGE_BYTES: usize = 32 << 20;

/// The shipped units' runtime directory (`RuntimeDirectory=dtf`).
const UNITS_RUNTIME_DIR: &str = "/run/dtf";

/// Where the ps tasks of this host put their shared-memory sockets:
/// `cluster.runtime_dir`, else systemd's `$RUNTIME_DIRECTORY` (the units'
/// `RuntimeDirectory=dtf`), else /run/dtf when it exists (so an operator's
/// `dtf status` finds the units' sockets), else `$XDG_RUNTIME_DIR/dtf`, else
/// `/tmp/dtf-<uid>`.
pub fn runtime_dir(config: &Config) -> PathBuf {
    if !config.cluster.runtime_dir.is_empty() {
        return PathBuf::from(&config.cluster.runtime_dir);
    }
    if let Some(dirs) = std::env::var_os("RUNTIME_DIRECTORY")
        && let Some(first) = dirs.to_string_lossy().split(':').find(|d| !d.is_empty())
    {
        return PathBuf::from(first);
    }
    if Path::new(UNITS_RUNTIME_DIR).is_dir() {
        return PathBuf::from(UNITS_RUNTIME_DIR);
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Path::new(&dir).join("dtf");
    }
    std::env::temp_dir().join(format!("dtf-{}", rustix::process::getuid().as_raw()))
}

/// The socket of ps `task` of the cluster whose ps addresses are `ps`,
/// listening on TCP `port`: `ps-<port>-<16 hex digits>.sock`, the digits a
/// fingerprint of the ps's whole address and of the cluster. A port alone
/// is not unique on a host (127.0.0.1:24001 and 127.0.0.2:24001 are two
/// ps, and two clusters once shared a socket that way); the fingerprint
/// keeps the name short, as a Unix socket path must be (108 bytes).
pub fn socket_path(dir: &Path, port: u16, ps: &[String], task: usize) -> PathBuf {
    let addr = ps.get(task).map_or("", String::as_str);
    let name = fnv1a(format!("{addr}\n{}", cluster_id(ps)).as_bytes());
    dir.join(format!("ps-{port}-{name:016x}.sock"))
}

/// The cluster's identity as its ps tasks report it (`State.cluster`): a
/// fingerprint of `cluster.ps`, the ps addresses in order.
pub fn cluster_id(ps: &[String]) -> String {
    format!("{:016x}", fnv1a(ps.join("\n").as_bytes()))
}

/// FNV-1a, 64 bits: a name, not a defence (the socket's mode and the
/// token are that).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The port of `addr` when it is an address of this host (loopback, or one
/// a socket can bind: an interface's), else `None`.
pub fn local_port(addr: &str) -> Option<u16> {
    let a = addr.to_socket_addrs().ok()?.next()?;
    (a.ip().is_loopback() || UdpSocket::bind((a.ip(), 0)).is_ok()).then_some(a.port())
}

/// Which wire a call to a ps took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// gRPC over TCP.
    Tcp,
    /// Shared memory (a ps on this host).
    Shm,
}

impl fmt::Display for Via {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Via::Tcp => "tcp",
            Via::Shm => "shm",
        })
    }
}

/// A ps address or the token cannot make a client ([`Cluster::new`]).
#[derive(Debug, thiserror::Error)]
#[error("cluster.ps: {0}")]
pub struct ClusterError(#[source] pub auth::ClientError);

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
    /// The ps takes no pushes while the cluster re-shards (`cluster.ps`
    /// changed; [`RESHARDING`] in its answer).
    pub fn is_resharding(&self) -> bool {
        self.status.code() == Code::Unavailable && self.status.message().contains(RESHARDING)
    }
}

/// What a ps's refusal of a push says while the cluster re-shards.
pub const RESHARDING: &str = "is re-sharding (cluster.ps changed)";

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

    /// The step the run has reached, for its end: async, the global step;
    /// sync, the lowest shard's. Sync shards may stand one step apart (a
    /// worker that pulled between two shards' updates of a step pushes to
    /// each the step it read there), and a shard behind still waits for
    /// every worker's gradient: no worker may end before it has taken its
    /// last step too.
    pub fn reached(&self, sync: bool) -> u64 {
        match sync {
            true => self.steps.iter().copied().min().unwrap_or(0),
            false => self.global_step(),
        }
    }

    /// What the shards' answers said: each one's `(step, complete)`.
    fn of(answers: impl ExactSizeIterator<Item = (u64, bool)>) -> Self {
        let mut progress = Self {
            steps: Vec::with_capacity(answers.len()),
            complete: false,
        };
        for (step, complete) in answers {
            progress.steps.push(step);
            progress.complete |= complete;
        }
        progress
    }
}

/// One open shared-memory connection.
struct ShmConn {
    /// The control socket.
    stream: UnixStream,
    /// The region the ps passed.
    region: Region,
    /// The values area holds what the last in-place pull or step of this
    /// connection returned ([`Cluster::values_in_place`]): false on a new
    /// connection, and after any call that wrote other values there (a
    /// snapshot, a copying pull or push), so a step never computes from
    /// values its progress does not describe.
    values_valid: bool,
}

/// The shared-memory way to one ps: where its socket is, what it must hold,
/// and the connection (opened on first use, again after a failure).
struct ShmLink {
    /// Which ps task.
    ps: usize,
    /// Its socket.
    path: PathBuf,
    /// The cluster's identity ([`cluster_id`]): the ps must report it.
    cluster: String,
    /// `Bearer <token>`.
    bearer: Vec<u8>,
    /// The shard's variable names, in order: the hello must list these.
    names: Vec<String>,
    /// Each variable's byte range in an area.
    layout: Vec<std::ops::Range<usize>>,
    /// Bytes of an area: the shard's size.
    area: usize,
    /// Largest answer frame.
    limit: usize,
    /// Deadline of a call.
    timeout: Duration,
    /// The connection; one call at a time uses the region.
    conn: tokio::sync::Mutex<Option<ShmConn>>,
    /// A failed handshake was logged (once: then TCP serves quietly).
    warned: AtomicBool,
    /// A connection was open before: the next one is a reconnect, logged.
    opened: AtomicBool,
}

/// A connection that failed: the call ends `UNAVAILABLE`; the caller retries
/// and the next call connects again (a restarted ps, say).
fn lost(ps: usize, what: impl fmt::Display) -> Status {
    Status::unavailable(format!("ps:{ps} shared-memory connection lost: {what}"))
}

impl ShmLink {
    /// Opens the connection: the ps's credentials, the token, the region.
    ///
    /// Errors: a reason to use TCP instead; `None` inside when the ps is
    /// simply not there (no socket, or nobody listening), which is not worth
    /// a line in the log.
    async fn connect(&self) -> Result<ShmConn, Option<String>> {
        let quiet = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => None,
            _ => Some(e.to_string()),
        };
        let mut stream = UnixStream::connect(&self.path).await.map_err(quiet)?;
        let cred = stream.peer_cred().map_err(|e| Some(e.to_string()))?;
        if !shm::trusted_uid(cred.uid()) {
            return Err(Some(format!(
                "{} belongs to uid {}, not this task's user",
                self.path.display(),
                cred.uid()
            )));
        }
        let io = |e: shm::FrameError| Some(e.to_string());
        shm::write_frame(&mut stream, kind::HELLO, &self.bearer)
            .await
            .map_err(|e| Some(e.to_string()))?;
        let (k, body) = shm::read_frame(&mut stream, shm::HELLO_LIMIT)
            .await
            .map_err(io)?;
        if k != kind::OK {
            let status = shm::answer::<pb::StateResponse>(k, &body)
                .err()
                .unwrap_or_else(|| Status::internal("bad hello"));
            return Err(Some(format!("refused: {}", status.message())));
        }
        let (area, state) = shm::parse_hello(&body).map_err(|s| Some(s.message().to_owned()))?;
        if state.task as usize != self.ps
            || state.cluster != self.cluster
            || state.variables != self.names
            || area != self.area
        {
            return Err(Some(format!(
                "the socket serves ps:{} of cluster {:?} with {:?} ({area} bytes), not this \
                 cluster's ps:{} (cluster {:?}) with {:?}",
                state.task, state.cluster, state.variables, self.ps, self.cluster, self.names
            )));
        }
        let fd = shm::recv_fd(&stream)
            .await
            .map_err(|e| Some(e.to_string()))?;
        let region = Region::open(fd, area).map_err(|e| Some(e.to_string()))?;
        Ok(ShmConn {
            stream,
            region,
            values_valid: false,
        })
    }

    /// Locks the connection, opening it if needed; `None`: use TCP for this call.
    async fn ready(&self) -> Option<tokio::sync::MutexGuard<'_, Option<ShmConn>>> {
        let mut conn = self.conn.lock().await;
        if conn.is_none() {
            match tokio::time::timeout(CONNECT_TIMEOUT, self.connect()).await {
                Ok(Ok(c)) => {
                    self.warned.store(false, Ordering::Relaxed);
                    if self.opened.swap(true, Ordering::Relaxed) {
                        // The first connection is reported by the worker
                        // ("Connected to ps."); a new one means the ps
                        // restarted or the connection broke.
                        info!(ps = self.ps, transport = %Via::Shm, "Reconnected to ps.");
                    }
                    *conn = Some(c);
                }
                Ok(Err(reason)) => {
                    if let Some(reason) = reason
                        && !self.warned.swap(true, Ordering::Relaxed)
                    {
                        warn!(ps = self.ps, socket = %self.path.display(), reason, "Shared memory unavailable; using TCP.");
                    }
                    return None;
                }
                Err(_) => return None,
            }
        }
        Some(conn)
    }

    /// One call on an open connection: `req` out, the answer in. A broken
    /// connection is closed (the next call opens a new one).
    ///
    /// Cancel-safe: the connection is out of `slot` while the call runs, so
    /// a call dropped halfway (its step abandoned because another ps failed)
    /// closes it instead of leaving an unread answer for the next call.
    ///
    /// Errors: the ps's status, or `UNAVAILABLE` for a lost connection.
    async fn call<M: Message + Default>(
        &self,
        slot: &mut Option<ShmConn>,
        k: u8,
        req: &impl Message,
    ) -> Result<M, Status> {
        let mut conn = slot.take().ok_or_else(|| lost(self.ps, "not open"))?;
        let exchange = async {
            shm::write_message(&mut conn.stream, k, req)
                .await
                .map_err(|e| lost(self.ps, e))?;
            shm::read_frame(&mut conn.stream, self.limit)
                .await
                .map_err(|e| lost(self.ps, e))
        };
        let reply = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "ps:{} did not answer within {:?}",
                self.ps, self.timeout
            ))),
        };
        let (k, body) = reply?;
        *slot = Some(conn);
        shm::answer(k, &body)
    }

    /// Copies an area into the shard's arrays (shard order).
    fn read_area(&self, region: &Region, area: Area, out: &mut [ArrayViewMutD<'_, f32>]) {
        let src = region.area(area);
        for (dst, range) in out.iter_mut().zip(&self.layout) {
            let dst = dst
                .as_slice_mut()
                .expect("arrays built by dtf are contiguous");
            bytemuck::cast_slice_mut::<f32, u8>(dst).copy_from_slice(&src[range.clone()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_limit_has_room_for_the_optimizers_slots() {
        let mut config = Config::default();
        config.model.layers = vec![784, 500, 10];
        let floats = 784 * 500 + 500 + 500 * 10 + 10;
        // Values and shadows.
        assert_eq!(message_limit(&config), 2 * 4 * floats + (1 << 20));
        // Adam's snapshot also carries two slots per variable.
        config.train.optimizer = crate::config::OptimizerKind::Adam;
        assert_eq!(message_limit(&config), 4 * 4 * floats + (1 << 20));
    }

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
