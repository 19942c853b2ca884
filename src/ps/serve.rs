//! A ps task's life: the service built, its shard restored, the gRPC and
//! shared-memory servers and the background tasks started, and all of them
//! stopped in order. Every task is owned here (STYLE.md: mini-redis's
//! `DbDropGuard`): the loops by one [`JoinSet`], aborted together when the
//! server stops; the tasks that finish their work on `stop` (the shared-
//! memory server, the last snapshot) by another, waited for.

use super::{Ended, PsError, PsService, grpc, listen, replica, shm, snapshot, widths};
use crate::auth::Credentials;
use crate::config::{Config, Role, TaskId, Transport};
use crate::transport::ring::RingClient;
use crate::transport::{self, proto as rpc, tcp};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How long a ps taken out of `cluster.ps` waits for the chief's word that
/// its re-shard checkpoint is written before it exits anyway.
const RESHARD_ORPHAN: Duration = Duration::from_secs(300);

/// How long a ps lingers after the run is complete, so that workers still
/// waiting on it hear so rather than finding it gone.
const COMPLETE_LINGER: Duration = Duration::from_secs(2);

/// How long the server, once stopped, waits for its connections to close
/// before it drops them.
pub(super) const SERVER_DRAIN: Duration = Duration::from_secs(1);

/// Serves ps task `task` on `listener` until `shutdown` is cancelled or, with
/// `cluster.ps_exit_when_complete`, shortly after the run is complete.
///
/// Returns [`Ended::Reshard`] once the chief wrote the re-shard checkpoint.
/// A ps without the model's widths (`model.hidden`, the data not read)
/// first waits for the chief's ([`widths::learn`]).
///
/// Errors: [`PsError`] when the model is invalid or the server fails.
pub async fn serve(
    live: watch::Receiver<Arc<Config>>,
    task: usize,
    credentials: &Credentials,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<Ended, PsError> {
    let listener = Arc::new(listener);
    let needs_widths = live.borrow().model.layers.is_empty();
    let live = match needs_widths {
        false => live,
        true => {
            let learned =
                widths::learn(live, task, credentials, listener.clone(), shutdown.clone()).await?;
            match learned {
                Some(live) => live,
                None => return Ok(Ended::Stopped),
            }
        }
    };
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
    let router = grpc::router(&service, credentials, limit).await;

    let stop = shutdown.child_token();
    // Loops that run as long as the server: aborted together when it stops.
    let mut loops = JoinSet::new();
    // Tasks that end by themselves once `stop` is cancelled: waited for.
    let mut draining = JoinSet::new();
    {
        let (complete, stop, exit) = (
            service.completed(),
            stop.clone(),
            config.cluster.ps_exit_when_complete,
        );
        loops.spawn(async move {
            complete.cancelled().await;
            if exit {
                tokio::time::sleep(COMPLETE_LINGER).await;
                info!(ps = task, "Run complete; exiting.");
                stop.cancel();
            }
        });
    }
    // `cluster.worker` is live: the membership follows each reload;
    // `cluster.ps` too: a change re-shards.
    {
        let (service, mut live) = (service.clone(), live.clone());
        loops.spawn(async move {
            while live.changed().await.is_ok() {
                let cfg = live.borrow_and_update().clone();
                service.apply_members(cfg.cluster.worker.len());
                service.follow_ps(&cfg.cluster.ps);
            }
        });
    }
    {
        let (reshard, stop) = (service.inner.reshard.done.clone(), stop.clone());
        loops.spawn(async move {
            reshard.cancelled().await;
            stop.cancel();
        });
    }
    loops.spawn(orphaned(service.clone(), live.clone()));
    // Tables grow with the data: bounded by the cgroup's memory limit too,
    // leaving room for their next growth (an eighth of the rows, the
    // index doubling: a quarter of their bytes), for a checkpoint's read of
    // a page of rows and its encoding, and, with snapshots, for a
    // snapshot's copy of them, its encoding and the file's dirty pages.
    if !service.inner.tables.names().is_empty() {
        let room = service.inner.tables.room.clone();
        let snapshots = snapshot_secs > 0 && service.inner.snapshots.dir.is_some();
        let s = service.clone();
        let reserve = move || {
            let bytes = s.inner.tables.memory_bytes();
            let reads = 2 * crate::transport::PAGE_BYTES as u64;
            bytes / 4 + reads + if snapshots { 3 * bytes } else { 0 }
        };
        loops.spawn(super::memory::watch(room, task, reserve, stop.clone()));
    }
    if snapshot_secs > 0 && service.inner.snapshots.dir.is_some() {
        let every = Duration::from_secs(snapshot_secs);
        draining.spawn(snapshot::run(service.clone(), every, stop.clone()));
    }
    // The ring: this shard's snapshots go to the next ps; at every start
    // this ps first asks it for its copy (refusing Initialize, Pull and
    // Push until then).
    let ring = match &service.inner.ring.next {
        Some((_, addr)) => {
            match tcp::client(credentials, addr, limit, replica::CLIENT_TIMEOUT, "none") {
                Ok(client) => {
                    let client = RingClient::new(client);
                    // Asked at every start, not only on an empty disk: the
                    // neighbour's copy may be newer than what this ps
                    // restored of its own (issue 45).
                    service
                        .inner
                        .ring
                        .fetching
                        .store(true, std::sync::atomic::Ordering::Release);
                    loops.spawn(replica::fetch_own(
                        service.clone(),
                        live.borrow().clone(),
                        client.clone(),
                        stop.clone(),
                        restored,
                    ));
                    loops.spawn(replica::send(service.clone(), client.clone(), stop.clone()));
                    Some(client)
                }
                Err(e) => {
                    warn!(ps = task, address = %addr, error = %e, "No snapshot copies for the neighbour: cannot make its client.");
                    None
                }
            }
        }
        None => None,
    };
    if let Some(shm) = listener
        .local_addr()
        .ok()
        .and_then(|addr| serve_shm(&service, config, addr.port(), credentials, limit, &stop))
    {
        draining.spawn(shm);
    }
    let incoming = listen::incoming(
        listener,
        service.inner.edge.refusals.clone(),
        credentials.server_tls(),
    );
    let server = router.serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned());
    // The graceful stop waits for every connection to close: a frozen or
    // unreachable client's would hold it until HTTP/2 keepalive gives up
    // (30 s; issue 44's re-shard with a SIGSTOPped worker). What is in
    // flight ends within the bound; the connections left are then dropped.
    let drained = async {
        stop.cancelled().await;
        tokio::time::sleep(SERVER_DRAIN).await;
    };
    let result = tokio::select! {
        result = server => result,
        () = drained => {
            warn!(ps = task, waited_ms = SERVER_DRAIN.as_millis() as u64, "Clients still connected after the stop (frozen or unreachable?): their connections are dropped.");
            Ok(())
        }
    };
    loops.shutdown().await;
    stop.cancel();
    // The shared-memory server's end, and the last snapshot, of the state
    // as it stopped (each bounded).
    while draining.join_next().await.is_some() {}
    // ... and its hand-over to the neighbour (bounded; not when the run is
    // complete or the cluster re-shards, when the copy is of no use).
    if let Some(client) = &ring
        && !service.inner.complete.is_cancelled()
        && !service.inner.reshard.done.is_cancelled()
    {
        replica::send_last(&service, client).await;
    }
    if let Err(e) = &result {
        warn!(ps = task, error = %e, "Server stopped with an error.");
    }
    result?;
    Ok(match service.inner.reshard.done.is_cancelled() {
        true => Ended::Reshard,
        false => Ended::Stopped,
    })
}

/// A ps taken out of the list that never hears the chief's word (its
/// reload came after it, the chief is gone) must not wait for ever: after
/// [`RESHARD_ORPHAN`] it ends as if the word had come.
async fn orphaned(service: PsService, live: watch::Receiver<Arc<Config>>) {
    let task = service.inner.task;
    let mut since: Option<Instant> = None;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let listed = live.borrow().cluster.ps.get(task) == service.inner.reshard.ps.get(task);
        let waiting = service.inner.reshard.is_on() && !listed;
        match (waiting, since) {
            (false, _) => since = None,
            (true, None) => since = Some(Instant::now()),
            (true, Some(t)) if t.elapsed() >= RESHARD_ORPHAN => {
                warn!(
                    ps = task,
                    waited_secs = RESHARD_ORPHAN.as_secs(),
                    "No longer in cluster.ps, and no word from the chief that its re-shard checkpoint is written: exiting."
                );
                service.inner.reshard.done.cancel();
                return;
            }
            (true, Some(_)) => {}
        }
    }
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
) -> Option<impl Future<Output = ()> + Send + 'static> {
    if config.cluster.transport != Transport::Auto {
        return None;
    }
    match shm::bind(config, service.inner.task, port) {
        Ok(socket) => Some(shm::serve(
            service.clone(),
            socket,
            credentials.check_token(),
            limit,
            stop.clone(),
        )),
        Err(e) => {
            warn!(ps = service.inner.task, error = %e, dir = %transport::runtime_dir(config).display(), "Cannot serve shared memory (cluster.runtime_dir); serving TCP only.");
            None
        }
    }
}
