//! Shared memory between tasks on one host: the wire of `cluster.transport =
//! "auto"` when a ps runs on the caller's own host.
//!
//! The ps listens on a Unix socket, `ps-<port>-<fingerprint>.sock` in the
//! runtime directory ([`super::runtime_dir`], [`super::socket_path`]). A client connects, checks the ps's credentials
//! (`SO_PEERCRED`: this uid or root, so a process that took the socket's name
//! cannot collect the token), and sends a hello frame with the cluster token.
//! The ps checks the client's credentials (same uid or root) and the token in
//! constant time, then creates a sealed memfd [`Region`] for this connection
//! (gradients, values, shadows; each the size of the shard) and passes it
//! with `SCM_RIGHTS`. From then on a push is: the client writes its gradient
//! into the region, sends a small control frame (the existing `PushRequest`
//! with no tensors), the ps applies the gradient from the region under the
//! shard lock and writes the new values into the region's values area (a
//! consistent snapshot), and answers with a small frame (`PushResponse`
//! without tensors, or a status code and message).
//!
//! Frames are `u32` little-endian length (of what follows), one kind byte,
//! then a prost message. Every length read is bounded before it is
//! allocated; a truncated frame or a vanished peer ends that connection
//! only. Nobody outside the ps and its authenticated client holds the
//! region's descriptor: the memfd has no name in any file system.

use crate::transport::pb;
use prost::Message;
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tonic::{Code, Status};

/// Frame kinds: a request names its call; an answer is [`kind::OK`] or
/// [`kind::ERROR`].
pub mod kind {
    /// Client → ps: `Bearer <token>`.
    pub const HELLO: u8 = 1;
    /// `StateRequest`.
    pub const STATE: u8 = 2;
    /// `InitializeRequest` (tensors inline: rare, and not on the step path).
    pub const INITIALIZE: u8 = 3;
    /// `PullRequest`; the values (and shadows) come back in the region.
    pub const PULL: u8 = 4;
    /// `PushRequest` without tensors; the gradient is in the region.
    pub const PUSH: u8 = 5;
    /// `CompleteRequest`.
    pub const COMPLETE: u8 = 6;
    /// `PullRowsRequest`; the rows come back in the answer message (a
    /// batch's rows are few and vary in number: no fixed area fits them).
    pub const PULL_ROWS: u8 = 7;
    /// `PushRowsRequest`, its gradient rows in the message.
    pub const PUSH_ROWS: u8 = 8;
    /// `ReadRowsRequest`: a page of a table's rows in the answer message.
    pub const READ_ROWS: u8 = 9;
    /// `StageRowsRequest`, its rows in the message.
    pub const STAGE_ROWS: u8 = 10;
    /// The call's answer message.
    pub const OK: u8 = 0x80;
    /// `i32` status code (little-endian), then a UTF-8 message.
    pub const ERROR: u8 = 0xff;
}

/// Largest hello (and hello answer) either side reads: a token and a
/// `StateResponse` with the shard's names, far below this.
pub const HELLO_LIMIT: usize = 64 << 10;

/// The region's three areas, each the shard's variables back to back in
/// shard order (little-endian f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    /// Written by the client, read by the ps on a push.
    Gradients = 0,
    /// Written by the ps on a push with pull, or a pull.
    Values = 1,
    /// Written by the ps on a pull with shadows.
    Shadows = 2,
}

/// A connection's shared memory: a sealed memfd mapped read-write.
///
/// The peer maps the same pages and may write to them at any moment. The
/// bytes are plain data (every bit pattern is some f32), and the ps checks
/// what it computed from them (`Shard::apply` refuses a non-finite result),
/// so a misbehaving peer can spoil its own step, never the ps's memory.
pub struct Region {
    /// Start of the mapping.
    ptr: NonNull<u8>,
    /// Bytes mapped: three areas of `area` bytes (at least one page).
    len: usize,
    /// Bytes of each area: the shard's size.
    area: usize,
    /// The memfd: kept to pass it on (the ps) and for the mapping's life.
    fd: OwnedFd,
}

// SAFETY: the mapping is owned by the Region (unmapped on drop) and only
// reached through &self / &mut self, like a Vec<u8>.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

/// The mapping's length for a shard of `area` bytes: `mmap` refuses 0.
fn mapped_len(area: usize) -> Option<usize> {
    area.checked_mul(3).map(|n| n.max(4096))
}

impl Region {
    /// A new region for a shard of `area` bytes (the ps's side): memfd,
    /// sized, sealed against shrinking (a peer that truncated it would make
    /// the ps's next access a SIGBUS) and growing, and mapped.
    ///
    /// Errors: the kernel refuses the memfd, its size or the mapping.
    pub fn create(area: usize) -> io::Result<Self> {
        let len = mapped_len(area).ok_or_else(|| io::Error::other("shard too large"))?;
        let fd =
            rustix::fs::memfd_create("dtf-shard", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        Self::map(fd, len, area)
    }

    /// Maps a region received from a ps (the client's side), after checking
    /// that it is `area` bytes per area and sealed against shrinking, so
    /// that no access can fault.
    ///
    /// Errors: `InvalidData` when the size or the seals are not as expected.
    pub fn open(fd: OwnedFd, area: usize) -> io::Result<Self> {
        let len = mapped_len(area).ok_or_else(|| io::Error::other("shard too large"))?;
        let size = rustix::fs::fstat(&fd)?.st_size;
        let seals = rustix::fs::fcntl_get_seals(&fd)?;
        if u64::try_from(size).ok() != Some(len as u64)
            || !seals.contains(SealFlags::SHRINK | SealFlags::SEAL)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "shared region of {size} bytes, seals {seals:?}; expected {len} bytes sealed against shrinking"
                ),
            ));
        }
        Self::map(fd, len, area)
    }

    fn map(fd: OwnedFd, len: usize, area: usize) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of a memfd whose size is `len` and
        // cannot shrink (sealed); no Rust object aliases it yet.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap"))?;
        Ok(Self { ptr, len, area, fd })
    }

    /// The descriptor to pass to the peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Bytes per area: the shard's size.
    pub fn area_len(&self) -> usize {
        self.area
    }

    /// One area, to read.
    pub fn area(&self, a: Area) -> &[u8] {
        // SAFETY: within the mapping (3 · area ≤ len), which lives as long as self.
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr().add(a as usize * self.area), self.area)
        }
    }

    /// One area, to write.
    pub fn area_mut(&mut self, a: Area) -> &mut [u8] {
        // SAFETY: as `area`; &mut self excludes every other slice of ours.
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(a as usize * self.area), self.area)
        }
    }

    /// The gradient area to read and the values and shadows areas to
    /// write, at once (disjoint).
    pub fn split(&mut self) -> (&[u8], &mut [u8], &mut [u8]) {
        let n = self.area;
        // SAFETY: three disjoint ranges of the mapping.
        unsafe {
            let base = self.ptr.as_ptr();
            (
                std::slice::from_raw_parts(base, n),
                std::slice::from_raw_parts_mut(base.add(n), n),
                std::slice::from_raw_parts_mut(base.add(2 * n), n),
            )
        }
    }
}

impl Region {
    /// The client's side of a step: the gradient area to write and the
    /// values area to read, at once (disjoint), so the model computes from
    /// the values the ps left and writes its gradient where the ps reads it.
    ///
    /// Both slices start page-aligned plus a multiple of the area size (a
    /// multiple of 4: f32s), so they cast to `f32` without copying.
    ///
    /// The ps writes the values area (and reads the gradient area) only
    /// while it serves a call on this region's connection, and a client makes
    /// one call at a time, holding the connection's lock across the step
    /// (`Cluster::step`): while these slices live, no call is in flight and
    /// the ps does not touch the pages. A ps that broke that protocol could
    /// only spoil this client's step (every bit pattern is an f32), not its
    /// memory safety beyond what a data race on plain floats means: the
    /// pages are never unmapped or resized under the slices (the mapping is
    /// ours and the memfd is sealed).
    pub fn client_split(&mut self) -> (&mut [u8], &[u8]) {
        let n = self.area;
        // SAFETY: two disjoint ranges of the mapping, which lives as long as
        // self; &mut self excludes every other slice of ours.
        unsafe {
            let base = self.ptr.as_ptr();
            (
                std::slice::from_raw_parts_mut(base, n),
                std::slice::from_raw_parts(base.add(n), n),
            )
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no slice of it
        // outlives self.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A frame that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The socket failed or the peer went away (mid-frame included).
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    /// A length above what this side accepts: the connection is dropped
    /// before anything is allocated for it.
    #[error("frame of {len} bytes is over the limit of {limit}")]
    TooLong { len: usize, limit: usize },
    /// A frame with no kind byte.
    #[error("empty frame")]
    Empty,
}

/// Writes one frame (one `write` for the small ones).
///
/// Errors: the socket's.
pub async fn write_frame(s: &mut UnixStream, kind: u8, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len() + 1).map_err(|_| io::Error::other("frame too long"))?;
    let mut buf = Vec::with_capacity(5 + body.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.push(kind);
    buf.extend_from_slice(body);
    s.write_all(&buf).await
}

/// Writes `msg` as one frame of `kind`.
///
/// Errors: the socket's.
pub async fn write_message(s: &mut UnixStream, kind: u8, msg: &impl Message) -> io::Result<()> {
    write_frame(s, kind, &msg.encode_to_vec()).await
}

/// Writes a status as an [`kind::ERROR`] frame.
///
/// Errors: the socket's.
pub async fn write_status(s: &mut UnixStream, status: &Status) -> io::Result<()> {
    let mut body = (status.code() as i32).to_le_bytes().to_vec();
    body.extend_from_slice(status.message().as_bytes());
    write_frame(s, kind::ERROR, &body).await
}

/// Reads one frame whose body is at most `limit` bytes: `(kind, body)`.
///
/// Errors: [`FrameError`]; the caller ends the connection.
pub async fn read_frame(s: &mut UnixStream, limit: usize) -> Result<(u8, Vec<u8>), FrameError> {
    let mut head = [0u8; 5];
    s.read_exact(&mut head).await?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if len == 0 {
        return Err(FrameError::Empty);
    }
    if len - 1 > limit {
        return Err(FrameError::TooLong {
            len: len - 1,
            limit,
        });
    }
    let mut body = vec![0u8; len - 1];
    s.read_exact(&mut body).await?;
    Ok((head[4], body))
}

/// An answer frame as the call's result: the message, or the status the ps sent.
///
/// Errors: the ps's status, or `INTERNAL` for an answer that does not parse.
pub fn answer<M: Message + Default>(kind: u8, body: &[u8]) -> Result<M, Status> {
    match kind {
        kind::OK => M::decode(body)
            .map_err(|e| Status::internal(format!("malformed shared-memory answer: {e}"))),
        kind::ERROR if body.len() >= 4 => {
            let code = i32::from_le_bytes([body[0], body[1], body[2], body[3]]);
            Err(Status::new(
                Code::from_i32(code),
                String::from_utf8_lossy(&body[4..]).into_owned(),
            ))
        }
        k => Err(Status::internal(format!(
            "unexpected shared-memory answer kind {k:#x}"
        ))),
    }
}

/// Sends `fd` with one byte, as `SCM_RIGHTS` (the ps's side of the handshake).
///
/// Errors: the socket's.
pub async fn send_fd(s: &UnixStream, fd: BorrowedFd<'_>) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let fds = [fd];
    s.async_io(Interest::WRITABLE, || {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        control.push(SendAncillaryMessage::ScmRights(&fds));
        let n = rustix::net::sendmsg(
            s,
            &[io::IoSlice::new(&[0])],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        if n == 1 {
            Ok(())
        } else {
            Err(io::ErrorKind::WriteZero.into())
        }
    })
    .await
}

/// Receives the descriptor [`send_fd`] sent (the client's side).
///
/// Errors: the socket's, or `InvalidData` when the byte came without one.
pub async fn recv_fd(s: &UnixStream) -> io::Result<OwnedFd> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    s.async_io(Interest::READABLE, || {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut byte = [0u8; 1];
        let got = rustix::net::recvmsg(
            s,
            &mut [io::IoSliceMut::new(&mut byte)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        if got.bytes == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(mut fds) = msg
                && let Some(fd) = fds.next()
            {
                return Ok(fd);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the ps sent no shared region",
        ))
    })
    .await
}

/// Whether a peer with `uid` may use a ps's shared memory (or serve it):
/// this process's user or root, the only ones who could read its memory anyway.
pub fn trusted_uid(uid: u32) -> bool {
    uid == 0 || uid == rustix::process::getuid().as_raw()
}

/// The hello answer: the region's area size, then the ps's `State`, so the
/// client can check it reached the task and shard it expects.
pub fn hello_body(area: usize, state: &pb::StateResponse) -> Vec<u8> {
    let mut body = (area as u64).to_le_bytes().to_vec();
    state.encode(&mut body).expect("a Vec grows as needed");
    body
}

/// Parses [`hello_body`].
///
/// Errors: `INTERNAL` when it does not parse.
pub fn parse_hello(body: &[u8]) -> Result<(usize, pb::StateResponse), Status> {
    let bad = |e: String| Status::internal(format!("malformed shared-memory hello: {e}"));
    let (n, rest) = body
        .split_first_chunk::<8>()
        .ok_or_else(|| bad("short".into()))?;
    let area = usize::try_from(u64::from_le_bytes(*n)).map_err(|e| bad(e.to_string()))?;
    let state = pb::StateResponse::decode(rest).map_err(|e| bad(e.to_string()))?;
    Ok((area, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_are_bounded() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        write_frame(&mut a, kind::STATE, b"xyz").await.unwrap();
        assert_eq!(
            read_frame(&mut b, 16).await.unwrap(),
            (kind::STATE, b"xyz".to_vec())
        );
        write_frame(&mut a, kind::STATE, &[0; 100]).await.unwrap();
        assert!(matches!(
            read_frame(&mut b, 16).await,
            Err(FrameError::TooLong { len: 100, .. })
        ));
        // A truncated frame: the length promises more than ever comes.
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&[10, 0, 0, 0, kind::PUSH, 1]).await.unwrap();
        drop(a);
        assert!(matches!(
            read_frame(&mut b, 16).await,
            Err(FrameError::Io(_))
        ));
        let s = Status::failed_precondition("pull again");
        let (mut a, mut b) = UnixStream::pair().unwrap();
        write_status(&mut a, &s).await.unwrap();
        let (k, body) = read_frame(&mut b, 64).await.unwrap();
        let e = answer::<pb::StateResponse>(k, &body).unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (Code::FailedPrecondition, "pull again")
        );
    }

    #[tokio::test]
    async fn a_region_passes_over_the_socket_and_is_shared() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut mine = Region::create(8).unwrap();
        send_fd(&a, mine.fd()).await.unwrap();
        let fd = recv_fd(&b).await.unwrap();
        // A region of another size is refused.
        let other = rustix::io::dup(&fd).unwrap();
        assert!(Region::open(other, 8192).is_err());
        let mut theirs = Region::open(fd, 8).unwrap();
        theirs.area_mut(Area::Gradients)[..4].copy_from_slice(&1.5f32.to_le_bytes());
        assert_eq!(&mine.area(Area::Gradients)[..4], &1.5f32.to_le_bytes());
        mine.area_mut(Area::Values)[4..].copy_from_slice(&[7; 4]);
        assert_eq!(&theirs.area(Area::Values)[4..], &[7; 4]);
        // Sealed: the peer cannot shrink it under the ps.
        assert!(rustix::fs::ftruncate(theirs.fd(), 0).is_err());
    }

    #[test]
    fn hello_round_trips() {
        let st = pb::StateResponse {
            task: 3,
            variables: vec!["w".into()],
            ..Default::default()
        };
        let (area, got) = parse_hello(&hello_body(40, &st)).unwrap();
        assert_eq!((area, got), (40, st));
        assert!(parse_hello(&[1, 2]).is_err());
    }
}
