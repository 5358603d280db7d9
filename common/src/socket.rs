//! The local socket protocol (`docs/design/protocol.md` "The local
//! sockets"): one JSON
//! request per connection, newline-terminated, one JSON response.
//!
//! The server reads every connection on one thread (`<name>-accept`), so a
//! slow or silent client costs a buffer, not a handler thread, and `status`
//! stays answerable while others abuse the socket (`status` remains
//! available during preparation and recovery: `docs/design/upgrade.md`
//! "Limits"). Per connection it:
//! 1. checks the peer's credentials (`SO_PEERCRED`, plus the supplementary
//!    groups of the peer process) against the [`PeerPolicy`] before reading
//!    anything, answering `forbidden` otherwise;
//! 2. keeps it among at most [`MAX_SOCKET_PENDING_CONNECTIONS`] connections
//!    still sending their request; a new one beyond that pushes out the
//!    oldest (`busy`), so held-open connections cannot lock newcomers out;
//! 3. reads at most [`MAX_SOCKET_MESSAGE_BYTES`] within
//!    [`SOCKET_REQUEST_READ_TIMEOUT`] (`too-large`, `timeout`) into a buffer
//!    that grows with the request and is freed with it. Every connection may
//!    buffer [`SOCKET_SMALL_REQUEST_BYTES`] (a `status` is far smaller);
//!    beyond that only a few at a time, oldest first, so that the large
//!    buffers together stay within [`MAX_SOCKET_BUFFERED_BYTES`] (200
//!    clients sending 1 MiB each cost 4 MiB, not 200);
//! 4. parses the request (`invalid` when malformed) and hands it, by its
//!    [`RequestClass`], to a handler thread: at most
//!    [`MAX_SOCKET_READ_ONLY_HANDLERS`] read-only and [`MAX_SOCKET_HANDLERS`]
//!    mutating ones at a time; one more of a class is answered `busy`, the
//!    other class is not affected. The handler's response is capped at the
//!    same size.
//!
//! The client connects, writes one line and reads one line, every step
//! bounded by the caller's deadline.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::contracts::{ErrorBody, ErrorCode, Response};
use crate::limits::{
    MAX_SOCKET_BUFFERED_BYTES, MAX_SOCKET_HANDLERS, MAX_SOCKET_MESSAGE_BYTES,
    MAX_SOCKET_PENDING_CONNECTIONS, MAX_SOCKET_READ_ONLY_HANDLERS, SOCKET_REQUEST_READ_TIMEOUT,
    SOCKET_SMALL_REQUEST_BYTES,
};
use crate::users;

/// How long the accept loop waits between shutdown checks.
const ACCEPT_POLL_INTERVAL: Duration = Duration::from_millis(200);
/// Bound on writing a response (or a refusal) to a slow or stuck client.
const RESPONSE_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The credentials of a connected peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, read from `/proc/<pid>/status`.
    pub groups: Vec<u32>,
}

/// Who may talk on a socket: any listed uid, or any process whose primary or
/// supplementary groups include a listed gid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerPolicy {
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
}

impl PeerPolicy {
    pub fn allows(&self, peer: &Peer) -> bool {
        self.uids.contains(&peer.uid)
            || self.gids.contains(&peer.gid)
            || peer.groups.iter().any(|g| self.gids.contains(g))
    }
}

/// A response line produced by a handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply(Vec<u8>);

impl<T: Serialize> From<Response<T>> for Reply {
    fn from(r: Response<T>) -> Self {
        Self(r.to_line())
    }
}

impl Reply {
    pub fn error(code: ErrorCode, message: impl AsRef<str>) -> Self {
        Response::<()>::Err(ErrorBody::new(code, message)).into()
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Which handler threads a request may use: a read-only request never
/// waits for, or is refused because of, mutating ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    /// Reads state only (`status`); answered quickly.
    ReadOnly,
    /// May change state, may take long.
    Mutating,
}

/// Answers one parsed request. Runs on its own thread per request; must
/// not block longer than the request's response bound.
pub trait Handler: Send + Sync + 'static {
    type Request: DeserializeOwned + Send;
    /// The request's class. Say `ReadOnly` only for a request that changes
    /// nothing and answers quickly.
    fn class(request: &Self::Request) -> RequestClass;
    fn handle(&self, request: Self::Request, peer: &Peer) -> Reply;
}

/// A failure to set up or serve the socket.
#[derive(Debug)]
pub enum SocketError {
    Bind { path: PathBuf, source: io::Error },
    StaleNotSocket { path: PathBuf },
    Permissions { path: PathBuf, source: io::Error },
    Spawn(io::Error),
}

impl fmt::Display for SocketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bind { path, source } => write!(
                f,
                "binding socket {}: {source}: check the run directory exists and is writable",
                path.display()
            ),
            Self::StaleNotSocket { path } => write!(
                f,
                "{} exists and is not a socket: remove it by hand, it is not ours",
                path.display()
            ),
            Self::Permissions { path, source } => write!(
                f,
                "setting owner and mode of socket {}: {source}",
                path.display()
            ),
            Self::Spawn(e) => write!(f, "starting the socket accept thread: {e}"),
        }
    }
}

impl std::error::Error for SocketError {}

/// A bound, not yet serving, socket.
#[derive(Debug)]
pub struct SocketServer {
    listener: UnixListener,
    path: PathBuf,
    policy: PeerPolicy,
    name: String,
}

/// The running accept loop.
#[derive(Debug)]
pub struct ServerHandle {
    join: Option<JoinHandle<()>>,
    shutdown: Arc<AtomicBool>,
    /// The listening socket, shut down at stop to end the accept loop's
    /// poll at once (`None` when it could not be duplicated: the loop then
    /// sees the flag within [`ACCEPT_POLL_INTERVAL`]).
    waker: Option<UnixListener>,
    path: PathBuf,
}

impl SocketServer {
    /// Binds `path` (replacing a stale socket left by a previous run), sets
    /// its mode and, when given, its group.
    pub fn bind(
        name: &str,
        path: &Path,
        mode: u32,
        group: Option<u32>,
        policy: PeerPolicy,
    ) -> Result<Self, SocketError> {
        match std::fs::symlink_metadata(path) {
            Ok(meta) => {
                use std::os::unix::fs::FileTypeExt;
                if !meta.file_type().is_socket() {
                    return Err(SocketError::StaleNotSocket {
                        path: path.to_owned(),
                    });
                }
                std::fs::remove_file(path).map_err(|source| SocketError::Bind {
                    path: path.to_owned(),
                    source,
                })?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(SocketError::Bind {
                    path: path.to_owned(),
                    source,
                })
            }
        }
        let listener = UnixListener::bind(path).map_err(|source| SocketError::Bind {
            path: path.to_owned(),
            source,
        })?;
        let perm = |source| SocketError::Permissions {
            path: path.to_owned(),
            source,
        };
        if let Some(gid) = group {
            std::os::unix::fs::chown(path, None, Some(gid)).map_err(perm)?;
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(perm)?;
        listener
            .set_nonblocking(true)
            .map_err(|source| SocketError::Bind {
                path: path.to_owned(),
                source,
            })?;
        Ok(Self {
            listener,
            path: path.to_owned(),
            policy,
            name: name.to_owned(),
        })
    }

    /// Starts the accept loop on a thread named `<name>-accept`.
    pub fn spawn<H: Handler>(self, handler: Arc<H>) -> Result<ServerHandle, SocketError> {
        let shutdown = Arc::new(AtomicBool::new(false));
        let path = self.path.clone();
        let waker = self.listener.try_clone().ok();
        let flag = Arc::clone(&shutdown);
        let join = std::thread::Builder::new()
            .name(format!("{}-accept", self.name))
            .spawn(move || self.accept_loop(handler, &flag))
            .map_err(SocketError::Spawn)?;
        Ok(ServerHandle {
            join: Some(join),
            shutdown,
            waker,
            path,
        })
    }

    fn accept_loop<H: Handler>(self, handler: Arc<H>, shutdown: &AtomicBool) {
        let mut reader = Reader {
            name: self.name,
            policy: self.policy,
            pending: VecDeque::new(),
            large: 0,
            read_only: Arc::new(AtomicUsize::new(0)),
            mutating: Arc::new(AtomicUsize::new(0)),
        };
        let mut chunk = [0u8; READ_CHUNK_BYTES];
        while !shutdown.load(Ordering::Relaxed) {
            let ready = reader.poll(&self.listener);
            // Highest index first: taking a connection out shifts only
            // those after it, already read. Accepting comes after, as it
            // may push out the oldest (index 0).
            for i in ready.connections.into_iter().rev() {
                reader.read_from(i, &mut chunk, &handler);
            }
            if ready.listener {
                reader.accept_all(&self.listener);
            }
            reader.expire(Instant::now());
        }
    }
}

/// Connections accepted between two reads of the pending ones.
const MAX_ACCEPTS_PER_POLL: usize = 64;
/// Bytes read from a connection at once.
const READ_CHUNK_BYTES: usize = 4096;
/// Connections that may buffer past the small size at once: together at
/// most [`MAX_SOCKET_BUFFERED_BYTES`].
const MAX_SOCKET_LARGE_READS: usize = MAX_SOCKET_BUFFERED_BYTES / MAX_SOCKET_MESSAGE_BYTES;

/// A connection still sending its request.
struct Pending {
    stream: UnixStream,
    peer: Peer,
    /// What arrived so far; grows with the request, freed with it.
    buf: Vec<u8>,
    /// Holds one of the [`MAX_SOCKET_LARGE_READS`] places for a request
    /// past [`SOCKET_SMALL_REQUEST_BYTES`].
    large: bool,
    deadline: Instant,
}

/// What `poll` found ready.
struct Ready {
    listener: bool,
    /// Indexes into `pending`, ascending.
    connections: Vec<usize>,
}

/// The state of the accept thread: the connections being read and the
/// handler counts per class.
struct Reader {
    name: String,
    policy: PeerPolicy,
    pending: VecDeque<Pending>,
    /// Pending connections allowed to buffer past the small size.
    large: usize,
    read_only: Arc<AtomicUsize>,
    mutating: Arc<AtomicUsize>,
}

impl Reader {
    /// Whether `p` may be read now: always up to the small-request size,
    /// beyond it once it holds one of the large-request places.
    fn may_read(p: &Pending) -> bool {
        p.buf.len() < SOCKET_SMALL_REQUEST_BYTES || p.large
    }

    /// Waits until the listener or a readable connection is ready, at most
    /// until the nearest deadline or [`ACCEPT_POLL_INTERVAL`].
    fn poll(&self, listener: &UnixListener) -> Ready {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let now = Instant::now();
        let mut wait = ACCEPT_POLL_INTERVAL;
        let mut fds = Vec::with_capacity(self.pending.len() + 1);
        let mut which = Vec::with_capacity(self.pending.len());
        fds.push(PollFd::new(listener, PollFlags::IN));
        for (i, p) in self.pending.iter().enumerate() {
            wait = wait.min(p.deadline.saturating_duration_since(now));
            if Self::may_read(p) {
                fds.push(PollFd::new(&p.stream, PollFlags::IN));
                which.push(i);
            }
        }
        let ts = Timespec {
            tv_sec: wait.as_secs() as _,
            tv_nsec: wait.subsec_nanos() as _,
        };
        if poll(&mut fds, Some(&ts)).is_err() {
            return Ready {
                listener: false,
                connections: Vec::new(),
            };
        }
        let listener_ready = !fds[0].revents().is_empty();
        let connections = fds[1..]
            .iter()
            .zip(which)
            .filter(|(fd, _)| !fd.revents().is_empty())
            .map(|(_, i)| i)
            .collect();
        Ready {
            listener: listener_ready,
            connections,
        }
    }

    /// Accepts the waiting connections, at most [`MAX_ACCEPTS_PER_POLL`]
    /// (so a flood of connects cannot keep the thread from reading): each
    /// is refused when its peer is not allowed, else pending (pushing out
    /// the oldest when full).
    fn accept_all(&mut self, listener: &UnixListener) {
        for _ in 0..MAX_ACCEPTS_PER_POLL {
            let stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::warn!("{}: accept failed: {e}", self.name);
                    return;
                }
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let peer = match peer_of(&stream) {
                Ok(p) => p,
                Err(e) => {
                    refuse(
                        stream,
                        ErrorCode::Forbidden,
                        format!("cannot read peer credentials: {e}"),
                    );
                    continue;
                }
            };
            if !self.policy.allows(&peer) {
                log::warn!(
                    "refused a local client: uid {} gid {} is not allowed on this socket",
                    peer.uid,
                    peer.gid
                );
                refuse(
                    stream,
                    ErrorCode::Forbidden,
                    format!(
                        "uid {} with gid {} is not allowed here: run as root or as a member of the socket's group",
                        peer.uid, peer.gid
                    ),
                );
                continue;
            }
            if self.pending.len() >= MAX_SOCKET_PENDING_CONNECTIONS {
                if let Some(oldest) = self.take(0) {
                    refuse(
                        oldest.stream,
                        ErrorCode::Busy,
                        format!(
                            "{MAX_SOCKET_PENDING_CONNECTIONS} clients are still sending their requests and yours is the oldest: send the request at once after connecting, then retry"
                        ),
                    );
                }
            }
            self.pending.push_back(Pending {
                stream,
                peer,
                buf: Vec::new(),
                large: false,
                deadline: Instant::now() + SOCKET_REQUEST_READ_TIMEOUT,
            });
        }
    }

    /// Removes pending connection `i`, releasing its share of the buffers.
    fn take(&mut self, i: usize) -> Option<Pending> {
        let p = self.pending.remove(i)?;
        if p.large {
            self.large -= 1;
            // The place goes to the oldest connection waiting for one.
            if let Some(next) = self
                .pending
                .iter_mut()
                .find(|q| !q.large && q.buf.len() >= SOCKET_SMALL_REQUEST_BYTES)
            {
                next.large = true;
                self.large += 1;
            }
        }
        Some(p)
    }

    /// Reads what connection `i` has sent; a complete request goes to a
    /// handler, a broken or oversize one is answered and closed.
    fn read_from<H: Handler>(&mut self, i: usize, chunk: &mut [u8], handler: &Arc<H>) {
        let large_free = self.large < MAX_SOCKET_LARGE_READS;
        let Some(p) = self.pending.get_mut(i) else {
            return;
        };
        let was_large = p.large;
        let outcome = loop {
            match p.stream.read(chunk) {
                Ok(0) if p.buf.is_empty() => break Some(Err(None)),
                Ok(0) => break Some(Ok(())),
                Ok(n) => {
                    if let Some(at) = chunk[..n].iter().position(|&b| b == b'\n') {
                        if p.buf.len() + at + 1 > MAX_SOCKET_MESSAGE_BYTES {
                            break Some(Err(Some(ReadError::TooLarge)));
                        }
                        p.buf.extend_from_slice(&chunk[..at]);
                        break Some(Ok(()));
                    }
                    if p.buf.len() + n >= MAX_SOCKET_MESSAGE_BYTES {
                        break Some(Err(Some(ReadError::TooLarge)));
                    }
                    p.buf.extend_from_slice(&chunk[..n]);
                    if p.buf.len() >= SOCKET_SMALL_REQUEST_BYTES && !p.large {
                        if !large_free {
                            // Waits for a place (see `take`).
                            break None;
                        }
                        p.large = true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => break Some(Err(Some(ReadError::Io(e)))),
            }
        };
        if p.large && !was_large {
            self.large += 1;
        }
        let Some(outcome) = outcome else {
            return;
        };
        let Some(p) = self.take(i) else {
            return;
        };
        match outcome {
            Ok(()) => self.dispatch(p, handler),
            Err(Some(ReadError::TooLarge)) => refuse(
                p.stream,
                ErrorCode::TooLarge,
                format!("request is larger than {MAX_SOCKET_MESSAGE_BYTES} bytes"),
            ),
            Err(_) => {}
        }
    }

    /// Answers connections whose request did not arrive in time.
    fn expire(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].deadline > now {
                i += 1;
                continue;
            }
            if let Some(p) = self.take(i) {
                refuse(
                    p.stream,
                    ErrorCode::Timeout,
                    format!(
                        "no complete request line within {} s: send one JSON object and a newline",
                        SOCKET_REQUEST_READ_TIMEOUT.as_secs()
                    ),
                );
            }
        }
    }

    /// Parses a complete request and starts its handler thread, within its
    /// class's limit.
    fn dispatch<H: Handler>(&self, p: Pending, handler: &Arc<H>) {
        let Pending {
            stream, peer, buf, ..
        } = p;
        let request = match serde_json::from_slice::<H::Request>(&buf) {
            Ok(r) => r,
            Err(e) => {
                return refuse(
                    stream,
                    ErrorCode::Invalid,
                    format!("malformed request: {e}"),
                )
            }
        };
        drop(buf);
        let (active, limit, what) = match H::class(&request) {
            RequestClass::ReadOnly => (&self.read_only, MAX_SOCKET_READ_ONLY_HANDLERS, "read-only"),
            RequestClass::Mutating => (&self.mutating, MAX_SOCKET_HANDLERS, "mutating"),
        };
        // INVARIANT: only this thread increments, so the check and the
        // increment cannot race past the limit.
        if active.load(Ordering::SeqCst) >= limit {
            return refuse(
                stream,
                ErrorCode::Busy,
                format!(
                    "{limit} {what} requests are already being handled: retry in a few seconds"
                ),
            );
        }
        if stream.set_nonblocking(false).is_err() {
            return;
        }
        active.fetch_add(1, Ordering::SeqCst);
        let guard = ActiveGuard(Arc::clone(active));
        let handler = Arc::clone(handler);
        let spawned = std::thread::Builder::new()
            .name(format!("{}-conn", self.name))
            .spawn(move || {
                let _guard = guard;
                respond(stream, handler.handle(request, &peer));
            });
        if let Err(e) = spawned {
            log::warn!("{}: cannot start a handler thread: {e}", self.name);
        }
    }
}

impl ServerHandle {
    /// Stops accepting, removes the socket file and joins the accept loop.
    /// Handlers in flight finish on their own threads.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.shutdown.store(true, Ordering::Relaxed);
        if let Some(w) = self.waker.take() {
            // A shut-down listener polls readable (Linux): the loop wakes,
            // sees the flag and ends.
            let _ = rustix::net::shutdown(&w, rustix::net::Shutdown::Both);
        }
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

struct ActiveGuard(Arc<AtomicUsize>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Writes a refusal and closes, without waiting: it runs on the accept
/// thread, and a refusal is far smaller than an empty socket buffer (a
/// client whose buffer is full of unread data gets none).
fn refuse(mut stream: UnixStream, code: ErrorCode, message: impl AsRef<str>) {
    let _ = stream.set_nonblocking(true);
    let _ = stream.write_all(Reply::error(code, message).as_bytes());
}

/// Reads the peer's credentials and its supplementary groups.
pub fn peer_of(stream: &UnixStream) -> io::Result<Peer> {
    let cred = rustix::net::sockopt::socket_peercred(stream)?;
    let pid = cred.pid.as_raw_nonzero().get();
    Ok(Peer {
        pid,
        uid: cred.uid.as_raw(),
        gid: cred.gid.as_raw(),
        groups: users::supplementary_groups(pid).unwrap_or_default(),
    })
}

/// Writes a handler's reply (capped at the message size), bounded in time.
fn respond(mut stream: UnixStream, reply: Reply) {
    let reply = if reply.0.len() > MAX_SOCKET_MESSAGE_BYTES {
        Reply::error(
            ErrorCode::Internal,
            format!("the response exceeds {MAX_SOCKET_MESSAGE_BYTES} bytes"),
        )
    } else {
        reply
    };
    let _ = stream.set_write_timeout(Some(RESPONSE_WRITE_TIMEOUT));
    let _ = stream.write_all(reply.as_bytes());
}

#[derive(Debug)]
enum ReadError {
    TooLarge,
    Timeout,
    Io(io::Error),
}

/// Reads up to the first newline (or EOF), at most
/// [`MAX_SOCKET_MESSAGE_BYTES`] including the newline, before `deadline`.
fn read_line(stream: &mut UnixStream, deadline: Instant) -> Result<Vec<u8>, ReadError> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadError::Timeout);
        }
        stream.set_read_timeout(Some(left)).map_err(ReadError::Io)?;
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ReadError::Timeout)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadError::Io(e)),
        };
        if n == 0 {
            return if buf.is_empty() {
                Err(ReadError::Io(io::Error::from(io::ErrorKind::UnexpectedEof)))
            } else {
                Ok(buf)
            };
        }
        if let Some(i) = chunk[..n].iter().position(|&b| b == b'\n') {
            if buf.len() + i + 1 > MAX_SOCKET_MESSAGE_BYTES {
                return Err(ReadError::TooLarge);
            }
            buf.extend_from_slice(&chunk[..i]);
            return Ok(buf);
        }
        if buf.len() + n >= MAX_SOCKET_MESSAGE_BYTES {
            return Err(ReadError::TooLarge);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A failed call to a local socket.
#[derive(Debug)]
pub enum ClientError {
    Connect {
        path: PathBuf,
        source: io::Error,
    },
    Io {
        path: PathBuf,
        source: io::Error,
    },
    Timeout {
        path: PathBuf,
        after: Duration,
    },
    TooLarge {
        path: PathBuf,
    },
    Malformed {
        path: PathBuf,
        source: serde_json::Error,
    },
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connect { path, source } => write!(f, "connecting to {}: {source}: is the daemon running, and are you root or in the socket's group?", path.display()),
            Self::Io { path, source } => write!(f, "talking to {}: {source}", path.display()),
            Self::Timeout { path, after } => write!(f, "no answer from {} within {} s", path.display(), after.as_secs()),
            Self::TooLarge { path } => write!(f, "the answer from {} exceeds {MAX_SOCKET_MESSAGE_BYTES} bytes", path.display()),
            Self::Malformed { path, source } => write!(f, "the answer from {} is not valid: {source}", path.display()),
        }
    }
}

impl std::error::Error for ClientError {}

impl ClientError {
    /// Whether the daemon is simply not there (no socket, or nobody listening).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Connect { source, .. }
            if matches!(source.kind(), io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused))
    }
}

/// Sends `request` to the socket at `path` and waits for its response, all
/// within `timeout`.
pub fn call<Req: Serialize, T: DeserializeOwned>(
    path: &Path,
    request: &Req,
    timeout: Duration,
) -> Result<Response<T>, ClientError> {
    let deadline = Instant::now() + timeout;
    let io_err = |source| ClientError::Io {
        path: path.to_owned(),
        source,
    };
    let mut stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
        path: path.to_owned(),
        source,
    })?;
    let mut line = serde_json::to_vec(request).map_err(|source| ClientError::Malformed {
        path: path.to_owned(),
        source,
    })?;
    line.push(b'\n');
    stream.set_write_timeout(Some(timeout)).map_err(io_err)?;
    // A server that refuses before reading (busy, forbidden) writes its
    // answer and closes: the write then fails (EPIPE) while the answer is
    // already waiting to be read. Read it; report the write error only when
    // there is no answer.
    let write_error = stream.write_all(&line).err();
    match (read_line(&mut stream, deadline), write_error) {
        (Ok(bytes), _) => Response::from_slice(&bytes).map_err(|source| ClientError::Malformed {
            path: path.to_owned(),
            source,
        }),
        (Err(_), Some(source)) => Err(io_err(source)),
        (Err(ReadError::Timeout), None) => Err(ClientError::Timeout {
            path: path.to_owned(),
            after: timeout,
        }),
        (Err(ReadError::TooLarge), None) => Err(ClientError::TooLarge {
            path: path.to_owned(),
        }),
        (Err(ReadError::Io(source)), None) => Err(io_err(source)),
    }
}
