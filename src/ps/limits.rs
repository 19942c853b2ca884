//! What keeps a ps serving its workers when a client, authenticated or not,
//! opens connections or sends requests faster than it can serve them
//! (issue 15): every bound the ps enforces, in one place.
//!
//! - Connections: at most [`MAX_CONNECTIONS`] (less when the descriptor limit
//!   is lower). Past it the oldest connection that has not yet made an
//!   authenticated call is closed to make room; when every connection is
//!   authenticated the new one is closed at once. Connections being closed
//!   to make room do not count against the cap (they are going), so a
//!   newcomer is never refused because the server has not yet got round to
//!   closing those it shed; while more than [`SHED_SLACK`] are still
//!   closing, the ps stops accepting until one has closed (the newcomer
//!   waits in the listen backlog) instead of refusing it. So a worker that
//!   connects during a flood is shed only if it idles longer than every
//!   connection that came before it.
//! - A connection that makes no authenticated call within
//!   [`UNAUTHENTICATED_IDLE`] is closed; HTTP/2 keepalive pings find dead peers.
//! - At most [`MAX_REQUESTS`] calls in progress, and response bytes reserved
//!   from a budget of [`RESPONSE_BUDGET`] shard snapshots; past either, the call
//!   gets `RESOURCE_EXHAUSTED` (the worker backs off and retries).
//! - Every refused call or connection, and every failed TLS handshake
//!   (the ps's `tls`), is logged with the peer's address, at most once per
//!   peer per [`REFUSAL_LOG_INTERVAL`].
//!
//! The bounds, the refusal log and the response budget are here; what
//! enforces them is the ps's `conn` (the registry of connections, shedding,
//! the token check that marks one authenticated), `listen` (the
//! accept loop) and `admission` (the calls in progress).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::warn;

/// Open connections a ps accepts: far above any real cluster (one per
/// worker, plus `dtf status`), far below what exhausts its memory.
pub const MAX_CONNECTIONS: usize = 1024;

/// Descriptors kept free of connections: checkpoints, logs, the metrics
/// endpoint, connections being closed.
const FD_RESERVE: usize = 64;

/// Connections the ps lets linger past [`MAX_CONNECTIONS`] while those it
/// shed are still closing; beyond it, it accepts no more until one closes.
pub(super) const SHED_SLACK: usize = 32;

/// How long a connection may stay open without an authenticated call. A
/// worker calls within milliseconds of connecting.
pub const UNAUTHENTICATED_IDLE: Duration = Duration::from_secs(10);

/// HTTP/2 keepalive: a ping after this long without frames…
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// …and the connection is closed when the ping is not answered within this.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Calls in progress at once, all connections together (a sync push waits up
/// to a second for its step, so a large sync cluster holds one per worker).
pub const MAX_REQUESTS: usize = 64;

/// Response bytes in flight, in shard snapshots: a pull or fused push-pull
/// reserves one (two with shadows) from when it arrives until its response
/// has been sent or dropped.
pub const RESPONSE_BUDGET: usize = 32;

/// A peer's refusals are logged at most once per this interval; the next
/// line counts those left out.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Peers the refusal log remembers; beyond, entries older than the interval
/// are forgotten (so a scan from many addresses cannot grow it without end).
const REFUSAL_LOG_PEERS: usize = 4096;

/// Refusal lines per [`REFUSAL_LOG_INTERVAL`], all peers together: a flood
/// from thousands of addresses (each new to the per-peer limit) once wrote
/// 7970 lines in seconds. The next line after a quiet interval counts those
/// left out (`suppressed_all`).
pub const REFUSAL_LOG_LINES: u64 = 20;

/// Logs refusals with the peer's address, rate-limited per peer address
/// and overall.
#[derive(Default)]
pub struct RefusalLog {
    /// Per peer IP (None: unknown): when its last line was written, and how
    /// many refusals were left out since.
    peers: Mutex<HashMap<Option<IpAddr>, (Instant, u64)>>,
    /// All peers together: the current interval's start, lines written in
    /// it, and refusals left out since the last line.
    all: Mutex<Option<(Instant, u64, u64)>>,
}

impl RefusalLog {
    /// Records a refusal of `peer` for `reason`, logging it unless this peer's
    /// last line is more recent than [`REFUSAL_LOG_INTERVAL`] or
    /// [`REFUSAL_LOG_LINES`] were written this interval. Returns whether
    /// it wrote a line.
    pub fn refused(&self, peer: Option<SocketAddr>, reason: &str) -> bool {
        let now = Instant::now();
        let suppressed = {
            let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            if peers.len() >= REFUSAL_LOG_PEERS {
                peers.retain(|_, (last, _)| now.duration_since(*last) < REFUSAL_LOG_INTERVAL);
            }
            match peers.get_mut(&peer.map(|p| p.ip())) {
                Some((last, left_out)) if now.duration_since(*last) < REFUSAL_LOG_INTERVAL => {
                    *left_out += 1;
                    return false;
                }
                Some((last, left_out)) => {
                    *last = now;
                    std::mem::take(left_out)
                }
                None => {
                    if peers.len() >= REFUSAL_LOG_PEERS {
                        // Every remembered peer is recent: a flood from
                        // many addresses. Log, but remember no more.
                        0
                    } else {
                        peers.insert(peer.map(|p| p.ip()), (now, 0));
                        0
                    }
                }
            }
        };
        let suppressed_all = {
            let mut all = self.all.lock().unwrap_or_else(|e| e.into_inner());
            let (start, lines, left_out) = all.get_or_insert((now, 0, 0));
            if now.duration_since(*start) >= REFUSAL_LOG_INTERVAL {
                (*start, *lines) = (now, 0);
            }
            if *lines >= REFUSAL_LOG_LINES {
                *left_out += 1;
                return false;
            }
            *lines += 1;
            std::mem::take(left_out)
        };
        let peer = peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string());
        warn!(peer = %peer, reason = %reason, suppressed, suppressed_all, "Refused.");
        true
    }
}

/// Raises the soft descriptor limit to the hard one (the units set
/// `LimitNOFILE=`; elsewhere the soft default of 1024 would be the first
/// bound hit) and returns the connections that fit under it.
pub(super) fn connection_cap() -> usize {
    cap_for(crate::files::raise_nofile_limit())
}

/// The connections a ps accepts under a soft descriptor limit of `nofile`:
/// [`MAX_CONNECTIONS`], less what the descriptors it keeps for itself and
/// for connections being closed need. (Public so tests size their floods by it.)
pub fn cap_for(nofile: u64) -> usize {
    let soft = usize::try_from(nofile).unwrap_or(usize::MAX);
    MAX_CONNECTIONS.min(soft.saturating_sub(FD_RESERVE + SHED_SLACK).max(1))
}

/// Response bytes a call reserved ([`Budget`]), handed from the handler to
/// [`super::admission::Admission`] in the response's extensions, released with the body.
#[derive(Clone)]
pub struct Reserved {
    /// Returned to the budget when the last clone is dropped.
    _permit: Arc<OwnedSemaphorePermit>,
}

/// The response budget of one ps: [`RESPONSE_BUDGET`] snapshots of its
/// shard, in KiB (a semaphore counts in u32).
pub struct Budget {
    /// KiB available.
    kib: Arc<Semaphore>,
    /// KiB of one snapshot of the shard's values.
    snapshot_kib: u32,
}

impl Budget {
    /// A budget for a shard of `shard_bytes` bytes of values.
    pub fn new(shard_bytes: usize) -> Self {
        let snapshot_kib = u32::try_from(shard_bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        let total = (snapshot_kib as usize)
            .saturating_mul(RESPONSE_BUDGET)
            .min(Semaphore::MAX_PERMITS);
        Self {
            kib: Arc::new(Semaphore::new(total)),
            snapshot_kib,
        }
    }

    /// Reserves `snapshots` snapshots' worth of response bytes.
    ///
    /// Errors: `RESOURCE_EXHAUSTED` when the budget is spent.
    pub fn reserve(&self, snapshots: u32) -> Result<Reserved, tonic::Status> {
        let kib = self.snapshot_kib.saturating_mul(snapshots);
        match self.kib.clone().try_acquire_many_owned(kib) {
            Ok(p) => Ok(Reserved {
                _permit: Arc::new(p),
            }),
            Err(_) => Err(crate::transport::proto::status(
                tonic::Code::ResourceExhausted,
                format!(
                    "ps busy: {RESPONSE_BUDGET} snapshots of the shard already in flight; retry later"
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refuses_past_its_snapshots_and_frees_on_drop() {
        let b = Budget::new(4096);
        let held: Vec<_> = (0..RESPONSE_BUDGET)
            .map(|_| b.reserve(1).unwrap())
            .collect();
        let err = b.reserve(1).err().unwrap();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        drop(held);
        assert!(b.reserve(2).is_ok());
    }

    #[test]
    fn refusals_are_counted_per_peer() {
        let log = RefusalLog::default();
        let a: SocketAddr = "10.0.0.1:5".parse().unwrap();
        for _ in 0..5 {
            log.refused(Some(a), "wrong token");
        }
        let peers = log.peers.lock().unwrap();
        assert_eq!(peers.get(&Some(a.ip())).map(|e| e.1), Some(4));
    }

    /// Issue 25: 8000 connections from distinct 127.x addresses wrote 7970
    /// lines in seconds; the log is bounded overall too.
    #[test]
    fn refusals_from_many_addresses_are_rate_limited_overall() {
        let log = RefusalLog::default();
        let written = (0..8000u32)
            .filter(|i| {
                let [_, b, c, d] = i.to_be_bytes();
                let peer = SocketAddr::from(([127, b, c, d], 5));
                log.refused(Some(peer), "too many connections")
            })
            .count();
        assert_eq!(written as u64, REFUSAL_LOG_LINES);
        assert_eq!(log.all.lock().unwrap().unwrap().2, 8000 - REFUSAL_LOG_LINES);
    }
}
