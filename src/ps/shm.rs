//! The ps's shared-memory server ([`crate::transport::shm`] is the wire):
//! a Unix socket in the runtime directory, one task per connection, each
//! call handed to the same functions as the gRPC service.

use super::PsService;
use crate::auth::CheckToken;
use crate::config::Config;
use crate::transport::call::{Complete, Initialize, Push, TensorView};
use crate::transport::pb;
use crate::transport::proto as rpc;
use crate::transport::shm::{self, FrameError, Region, kind};
use prost::Message;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Code, Status};
use tracing::{debug, info, warn};

/// Shared-memory connections a ps serves at once: one per task on this
/// host is the need; each holds a region of three times the shard.
pub const MAX_CONNECTIONS: usize = 64;

/// A peer that does not read its answer for this long is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The bound socket, removed again when dropped.
pub struct Socket {
    /// The listener.
    listener: UnixListener,
    /// Its path, to remove at the end.
    path: PathBuf,
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the socket of ps `task` serving TCP `port`
/// ([`crate::transport::socket_path`]: named by its whole address and the
/// cluster) in the runtime directory (made 0700 if it does not exist), mode
/// 0600. A socket left by a ps that died is replaced: the TCP address is
/// ours, so its owner is gone.
///
/// Errors: the directory or the socket cannot be made; the ps then serves TCP only.
pub fn bind(config: &Config, task: usize, port: u16) -> std::io::Result<Socket> {
    let dir = crate::transport::runtime_dir(config);
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
    }
    check_runtime_dir(&dir)?;
    let path = crate::transport::socket_path(&dir, port, &config.cluster.ps, task);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(Socket { listener, path })
}

/// Refuses a runtime directory that another user could change: one owned
/// by someone other than this user or root, or writable by others (without
/// the sticky bit, anyone may rename the ps's socket away and put theirs
/// in its place). A pre-made 0777 directory of another user was once used
/// without a word.
///
/// Errors: a sentence naming the directory, its owner and its mode.
fn check_runtime_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(dir)?;
    let me = rustix::process::getuid().as_raw();
    let mode = m.mode() & 0o7777;
    let foreign = m.uid() != me && m.uid() != 0;
    let open = mode & 0o002 != 0 && mode & 0o1000 == 0;
    if !m.is_dir() || foreign || open {
        return Err(std::io::Error::other(format!(
            "runtime directory {} is owned by uid {} with mode {mode:04o}{}: another user \
             could replace the ps's socket; make it a directory of uid {me} not writable \
             by others (chmod 0700), or set cluster.runtime_dir",
            dir.display(),
            m.uid(),
            if m.is_dir() { "" } else { ", not a directory" },
        )));
    }
    Ok(())
}

/// Serves `socket` until `stop`; returns when every connection has ended.
pub async fn serve(
    service: PsService,
    socket: Socket,
    check: CheckToken,
    limit: usize,
    stop: CancellationToken,
) {
    info!(ps = service.inner.task, socket = %socket.path.display(), "Serving shared memory.");
    let tracker = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = tokio::select! {
            r = socket.listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of descriptors, say: wait rather than spin.
                    warn!(error = %e, "Shared-memory accept failed.");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            service.inner.edge.refusals.refused(
                None,
                &format!("shared memory: too many connections (limit {MAX_CONNECTIONS})"),
            );
            continue;
        };
        let (service, check, stop) = (service.clone(), check.clone(), stop.clone());
        tracker.spawn(async move {
            connection(&service, stream, &check, limit, stop).await;
            drop(permit);
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// Counts an open connection in `State` for as long as it lives.
struct Open<'a>(&'a PsService);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0
            .inner
            .edge
            .shm_connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// One client: the handshake, then calls until it goes away or `stop`.
async fn connection(
    service: &PsService,
    mut stream: UnixStream,
    check: &CheckToken,
    limit: usize,
    stop: CancellationToken,
) {
    let task = service.inner.task;
    let Some(pid) = admit(service, &mut stream, check).await else {
        return;
    };
    let (layout, area) = shard_layout(service);
    let mut region = match Region::create(area) {
        Ok(r) => r,
        Err(e) => {
            warn!(ps = task, error = %e, "Cannot make a shared region; the client uses TCP.");
            let _ = shm::write_status(&mut stream, &Status::unavailable(e.to_string())).await;
            return;
        }
    };
    let hello = shm::hello_body(area, &service.state_now().into());
    if shm::write_frame(&mut stream, kind::OK, &hello)
        .await
        .is_err()
        || shm::send_fd(&stream, region.fd()).await.is_err()
    {
        return;
    }
    service
        .inner
        .edge
        .shm_connections
        .fetch_add(1, Ordering::Relaxed);
    let _open = Open(service);
    debug!(ps = task, pid, "Shared-memory connection.");
    serve_calls(
        service,
        &mut stream,
        pid,
        (&layout, &mut region),
        limit,
        stop,
    )
    .await;
}

/// The peer's credentials and its hello: `Some(pid)` when it is this ps's
/// user (or root) and presents the cluster token within the deadline; else
/// the refusal is logged and answered.
async fn admit(service: &PsService, stream: &mut UnixStream, check: &CheckToken) -> Option<i32> {
    let (uid, pid) = match stream.peer_cred() {
        Ok(c) => (c.uid(), c.pid().unwrap_or(0)),
        Err(e) => {
            debug!(error = %e, "Shared-memory peer without credentials.");
            return None;
        }
    };
    let refuse = |reason: &str| {
        service.inner.edge.refusals.refused(
            None,
            &format!("shared memory, pid {pid} uid {uid}: {reason}"),
        );
        None
    };
    if !shm::trusted_uid(uid) {
        let _ = shm::write_status(
            stream,
            &Status::permission_denied("shared memory is only for the ps's own user"),
        )
        .await;
        return refuse("not the ps's user or root");
    }
    let hello = tokio::time::timeout(
        super::limits::UNAUTHENTICATED_IDLE,
        shm::read_frame(stream, shm::HELLO_LIMIT),
    )
    .await;
    match hello {
        Ok(Ok((kind::HELLO, token))) if check.matches(&token) => Some(pid),
        Ok(Ok((kind::HELLO, _))) => {
            let _ = shm::write_status(
                stream,
                &Status::unauthenticated(
                    "wrong cluster token (compare security.token_file on both hosts)",
                ),
            )
            .await;
            refuse("wrong cluster token")
        }
        Ok(Ok((k, _))) => refuse(&format!("frame kind {k:#x} before the hello")),
        Ok(Err(e)) => refuse(&format!("no hello: {e}")),
        Err(_) => refuse("no hello in time"),
    }
}

/// Each variable of the shard: its name, shape and byte range in an area;
/// and the area's size.
fn shard_layout(service: &PsService) -> (Layout, usize) {
    let s = service.lock();
    let mut layout = Vec::new();
    let mut at = 0;
    for spec in s.specs() {
        let n = 4 * spec.shape.iter().product::<usize>();
        layout.push((spec.name.clone(), spec.shape.clone(), at..at + n));
        at += n;
    }
    (layout, at)
}

/// A variable's name, shape and byte range in an area of the region.
type Layout = Vec<(String, Vec<usize>, std::ops::Range<usize>)>;

/// Answers the connection's calls, one at a time, until it closes, breaks
/// or the ps stops.
async fn serve_calls(
    service: &PsService,
    stream: &mut UnixStream,
    pid: i32,
    (layout, region): (&Layout, &mut Region),
    limit: usize,
    stop: CancellationToken,
) {
    let task = service.inner.task;
    loop {
        let frame = tokio::select! {
            f = shm::read_frame(stream, limit) => f,
            _ = stop.cancelled() => return,
        };
        let (k, body) = match frame {
            Ok(f) => f,
            // A task that exits closes its socket, or resets it when our answer to its
            // last call was still unread: either is the normal end of a connection.
            Err(FrameError::Io(e)) if peer_left(&e) => {
                debug!(ps = task, pid, error = %e, "Shared-memory connection closed.");
                return;
            }
            Err(e) => {
                warn!(ps = task, pid, error = %e, "Shared-memory connection dropped.");
                return;
            }
        };
        let answer = call(service, (layout, region), pid, k, &body).await;
        let write = async {
            match answer {
                Ok(body) => shm::write_frame(stream, kind::OK, &body).await,
                Err(s) => shm::write_status(stream, &s).await,
            }
        };
        if !matches!(tokio::time::timeout(WRITE_TIMEOUT, write).await, Ok(Ok(()))) {
            debug!(ps = task, pid, "Shared-memory peer gone before its answer.");
            return;
        }
    }
}

/// How a read ends when the task at the other end exited (not a fault of the connection).
fn peer_left(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
    matches!(e.kind(), UnexpectedEof | ConnectionReset | BrokenPipe)
}

/// A request message, or `INVALID_ARGUMENT` as gRPC's codec says it.
fn decode<M: Message + Default>(body: &[u8]) -> Result<M, Status> {
    M::decode(body).map_err(|e| {
        rpc::status(
            Code::InvalidArgument,
            format_args!("malformed protobuf message: {e}"),
        )
    })
}

/// The shard's values (or shadows) into an area, under the shard lock.
fn write_area(
    arrays: &[ndarray::ArrayD<f32>],
    layout: &[(String, Vec<usize>, std::ops::Range<usize>)],
    out: &mut [u8],
) {
    for (a, (_, _, range)) in arrays.iter().zip(layout) {
        let a = a.as_slice().expect("arrays built by dtf are contiguous");
        out[range.clone()].copy_from_slice(bytemuck::cast_slice(a));
    }
}

/// One call: the same functions as the gRPC service, tensors in the region.
async fn call(
    service: &PsService,
    (layout, region): (&Layout, &mut Region),
    pid: i32,
    k: u8,
    body: &[u8],
) -> Result<Vec<u8>, Status> {
    match k {
        kind::STATE => Ok(pb::StateResponse::from(service.state_now()).encode_to_vec()),
        kind::INITIALIZE => {
            let req: pb::InitializeRequest = decode(body)?;
            let answer = service.initialize_from(Initialize::try_from(&req)?)?;
            Ok(pb::InitializeResponse::from(answer).encode_to_vec())
        }
        kind::PULL => {
            let req: pb::PullRequest = decode(body)?;
            if !req.names.is_empty() {
                return Err(Status::invalid_argument(
                    "a shared-memory pull reads the whole shard (names must be empty)",
                ));
            }
            let (_, values, shadows) = region.split();
            let (slots, answer) = service
                .pull_with(req.min_step, |s| {
                    write_area(s.values()?, layout, values);
                    if req.with_shadows {
                        write_area(s.shadows()?, layout, shadows);
                    }
                    // The optimizer's slots (the chief's snapshot, once per
                    // checkpoint) have no area: they travel in the message.
                    if req.with_slots {
                        Ok(service.read(s, &[], false, true)?.2)
                    } else {
                        Ok(Vec::new())
                    }
                })
                .await?;
            let answer = answer.into_pb((Vec::new(), Vec::new(), rpc::to_pb(slots)));
            Ok(answer.encode_to_vec())
        }
        kind::PUSH => {
            let req: pb::PushRequest = decode(body)?;
            if !req.gradients.is_empty() {
                return Err(Status::invalid_argument(
                    "on shared memory the gradients are in the region, not the message",
                ));
            }
            let (grads, values, _) = region.split();
            // Applied straight from the region: the bytes the worker wrote.
            let views: Vec<TensorView<'_>> = layout
                .iter()
                .map(|(name, shape, range)| TensorView {
                    name,
                    shape: shape.clone(),
                    data: &grads[range.clone()],
                })
                .collect();
            let (_, answer) = service
                .push_with(
                    &Push::from(&req),
                    &views,
                    |why| {
                        let why = format!("shared memory, pid {pid}: {why}");
                        service.inner.edge.refusals.refused(None, &why);
                    },
                    |s| {
                        write_area(s.values()?, layout, values);
                        Ok(())
                    },
                )
                .await?;
            Ok(answer.into_pb(Vec::new(), 0).encode_to_vec())
        }
        kind::PULL_ROWS => Ok(service.pull_rows_pb(&decode(body)?)?.encode_to_vec()),
        kind::PUSH_ROWS => Ok(service.push_rows_pb(&decode(body)?)?.encode_to_vec()),
        kind::READ_ROWS => Ok(service.read_rows_pb(&decode(body)?)?.encode_to_vec()),
        kind::STAGE_ROWS => {
            service.stage_rows_pb(&decode(body)?)?;
            Ok(pb::StageRowsResponse {}.encode_to_vec())
        }
        kind::COMPLETE => {
            let req: pb::CompleteRequest = decode(body)?;
            service.complete_run(Complete::from(&req))?;
            Ok(pb::CompleteResponse {}.encode_to_vec())
        }
        k => Err(Status::invalid_argument(format!(
            "unknown shared-memory frame kind {k:#x}"
        ))),
    }
}
