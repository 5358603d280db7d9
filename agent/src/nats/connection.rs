//! Connecting to NATS and keeping the connection.
//!
//! Steps of [`connect`]: with the `oauth2-client-credentials` method, get a
//! bearer token from the identity provider ([`crate::oauth`]); build the
//! client options from the config ([`super::options`]: auth, TLS, a small
//! reconnect buffer, the PING interval);
//! run one connection attempt on a helper thread and wait for it at most
//! [`NATS_CONNECT_ATTEMPT_TIMEOUT`] (the crate's own TCP connect and
//! handshake have no timeout); retry with a growing delay until the window
//! ends; refuse at once when the server rejects the credentials or the
//! identity provider refuses the client. Once connected, start the inbox
//! dispatcher.
//!
//! While running, the crate reconnects by itself. Every reconnect bumps
//! [`Nats::generation`], which tells the watchers ([`super::watch`]) to
//! subscribe again on the new connection and read their keys again: a
//! change republished while the link was down never arrived.
//!
//! With a bearer token the connection cannot live longer than the token:
//! the user the auth callout issues expires with it, the server then
//! closes the connection, and the crate's own reconnect presents the old
//! token again (its token is fixed when the connection is made; the crate
//! has no token callback). So the daemon's connection is a [`Link`] that
//! the renewer thread (`agent-nats-renew`, [`super::renew`]) replaces:
//!
//! 1. at the token's refresh time (a quarter of its life before expiry),
//!    it gets a fresh token and opens a new link with it;
//! 2. when the current link is lost for good (the crate gives up after
//!    [`BEARER_CRATE_RECONNECTS`] attempts per server: the token refused or
//!    expired, or the servers down), it opens a new link with the kept
//!    token while that is valid, else (and always after a refusal) a new one;
//! 3. it makes the new link current and bumps the generation, so every
//!    watcher starts over on it exactly as after a reconnect; requests in
//!    flight on the old link finish (at most [`RETIRE_WAIT`]) before it is
//!    closed.
//!
//! A failed token request or connection attempt is retried after a growing
//! delay (1 s doubling to 60 s, with jitter), forever; the current link
//! serves meanwhile while its token lasts. The token is never logged.

use std::fmt;
use std::io;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use fleet_common::limits::{NATS_CONNECT_ATTEMPT_TIMEOUT, NATS_REQUEST_TIMEOUT};
use fleet_common::validate::DeviceId;

use super::inbox::{Inbox, RequestError};
use super::options::{is_auth_message, options};
use super::renew::Renewer;
use crate::config::{NatsAuth, NatsConfig};
use crate::oauth::{AccessToken, TokenClient, TokenError, TokenSource};
use crate::shutdown::Shutdown;

/// First delay between connection attempts at start; doubles up to
/// [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_secs(1);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(15);
/// Bound on closing the connection.
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Stack of the short-lived thread running one connection attempt.
const CONNECT_THREAD_STACK_BYTES: usize = 256 * 1024;
/// Reconnect attempts per server the crate makes on a bearer-token link
/// before it closes it and leaves the next connection to the renewer. A
/// refused token fails each attempt at once, so the renewer takes over
/// within a second; a server that is down gets the same attempts from the
/// renewer, with a fresh token when needed.
pub const BEARER_CRATE_RECONNECTS: usize = 3;
/// Requests in flight on a replaced link finish within their own bound.
pub const RETIRE_WAIT: Duration = NATS_REQUEST_TIMEOUT;
/// How long closing waits for the renewer (it may be inside a bounded
/// token request or connection attempt; process exit ends it then).
const RENEWER_JOIN_TIMEOUT: Duration = Duration::from_millis(200);

/// What the client does when the connection drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconnect {
    /// The daemon: reconnect forever (with a bearer token: through the
    /// renewer, with fresh tokens).
    Forever,
    /// Probe mode: after a drop each server is tried once more, then the
    /// connection closes and the probe fails. (The crate counts the first
    /// connection as an attempt too, so this is its `max_reconnects(1)`.)
    Once,
}

/// What the renewer is woken for.
#[derive(Debug, Default)]
pub(super) struct Events {
    /// The highest link id whose connection closed (the crate stopped
    /// reconnecting); the current link is lost when it is its id.
    pub(super) lost: u64,
    /// The server refused or expired the current link's credentials.
    pub(super) refused: bool,
    /// [`Nats::close`]: stop.
    pub(super) stop: bool,
}

/// Connection events, updated by the client's callbacks. Only the
/// callbacks of the current link count; a replaced link's are ignored.
#[derive(Debug, Default)]
pub struct ConnState {
    pub(super) generation: AtomicU64,
    pub(super) connected: AtomicBool,
    /// Set by [`Nats::close`]: the disconnect that follows is expected.
    pub(super) closing: AtomicBool,
    /// When the connection was lost; `None` while connected.
    disconnected_at: Mutex<Option<Instant>>,
    /// The id of the current [`Link`] (0: none yet).
    pub(super) current: AtomicU64,
    /// The id of the last link made.
    last_link: AtomicU64,
    last_server_error: Mutex<Option<String>>,
    events: Mutex<Events>,
    pub(super) wake: Condvar,
}

impl ConnState {
    pub(super) fn set_error(&self, e: String) {
        *self
            .last_server_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    /// Records the connection going up or down; the time of loss is kept
    /// from the first disconnect until the connection is back.
    pub(super) fn set_connected(&self, up: bool) {
        let was_up = self.connected.swap(up, Ordering::SeqCst);
        let mut at = self
            .disconnected_at
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if up {
            *at = None;
        } else if was_up || at.is_none() {
            *at = Some(Instant::now());
        }
    }

    /// The last asynchronous error the server sent (a permissions
    /// violation, for instance), taken.
    pub fn take_server_error(&self) -> Option<String> {
        self.last_server_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    pub(super) fn is_current(&self, link: u64) -> bool {
        self.current.load(Ordering::SeqCst) == link
    }

    fn next_link_id(&self) -> u64 {
        self.last_link.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub(super) fn events(&self) -> MutexGuard<'_, Events> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn signal(&self, f: impl FnOnce(&mut Events)) {
        f(&mut self.events());
        self.wake.notify_all();
    }
}

/// One connection and the inbox on it.
pub(super) struct Link {
    pub(super) id: u64,
    /// Never dropped while it may still be running: dropping the crate's
    /// last handle leaves its thread reconnecting while no server answers
    /// (its reconnect loop does not check for close). [`Nats::close`] and
    /// the renewer close it with a bound instead, and process exit
    /// releases the socket.
    pub(super) conn: ManuallyDrop<nats::Connection>,
    pub(super) inbox: Inbox,
    /// When to replace it with one on a fresh token (bearer tokens only).
    pub(super) renew_at: Option<Instant>,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("id", &self.id)
            .field("renew_at", &self.renew_at)
            .finish_non_exhaustive()
    }
}

/// The NATS client's PINGs (`intervals.ping-secs`,
/// `intervals.ping-max-outstanding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pings {
    /// A PING after this long without a word from the server, and between
    /// unanswered ones.
    pub interval: Duration,
    /// Unanswered PINGs before the connection is taken as dead.
    pub max_out: u8,
}

/// What every link of one agent is made from.
pub(super) struct Params {
    pub(super) cfg: NatsConfig,
    pub(super) device: DeviceId,
    pub(super) mode: Reconnect,
    pub(super) pings: Pings,
    /// The identity provider's tokens (`oauth2-client-credentials` only).
    pub(super) tokens: Option<TokenSource>,
    pub(super) servers: String,
}

/// What the agent's threads and the renewer share.
pub(super) struct Shared {
    pub(super) params: Params,
    pub(super) state: Arc<ConnState>,
    pub(super) link: RwLock<Arc<Link>>,
}

impl Shared {
    pub(super) fn link(&self) -> Arc<Link> {
        Arc::clone(&self.link.read().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The connection every thread of the agent shares.
pub struct Nats {
    shared: Arc<Shared>,
    renewer: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for Nats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.shared.params;
        f.debug_struct("Nats")
            .field("device", &p.device)
            .field("servers", &p.servers)
            .field("auth", &p.cfg.auth.method())
            .field("link", &self.shared.link())
            .finish_non_exhaustive()
    }
}

impl Nats {
    pub fn device(&self) -> &DeviceId {
        &self.shared.params.device
    }

    /// The configured servers, for messages.
    pub fn servers(&self) -> &str {
        &self.shared.params.servers
    }

    /// Bumped at every reconnect and every new link.
    pub fn generation(&self) -> u64 {
        self.shared.state.generation.load(Ordering::SeqCst)
    }

    /// The last asynchronous error the server sent (a permissions
    /// violation on a subscription, for instance), taken.
    pub fn take_server_error(&self) -> Option<String> {
        self.shared.state.take_server_error()
    }

    pub fn is_connected(&self) -> bool {
        self.shared.state.connected.load(Ordering::SeqCst)
    }

    /// How long the connection has been lost; `None` while connected.
    pub fn disconnected_for(&self) -> Option<Duration> {
        if self.is_connected() {
            return None;
        }
        let at = *self
            .shared
            .state
            .disconnected_at
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Some(at.map_or(Duration::ZERO, |t| t.elapsed()))
    }

    /// Publishes `payload` to `subject` with a reply on our inbox and waits
    /// for the first reply.
    pub fn request(
        &self,
        subject: &str,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<nats::Message, RequestError> {
        // INVARIANT: the link is held until the reply (or the timeout), so
        // a replaced link is closed only once its requests are done.
        let link = self.shared.link();
        match link.inbox.request(&link.conn, subject, payload, timeout) {
            Err(RequestError::Timeout { subject, .. }) if !self.is_connected() => {
                Err(RequestError::Disconnected { subject })
            }
            Err(RequestError::Timeout { subject, after, .. }) => Err(RequestError::Timeout {
                subject,
                after,
                server_error: self.shared.state.take_server_error(),
            }),
            other => other,
        }
    }

    /// Subscribes on the current link (a new link bumps the generation, so
    /// the subscriber starts over).
    pub fn subscribe(&self, subject: &str) -> io::Result<nats::Subscription> {
        self.shared.link().conn.subscribe(subject)
    }

    /// Waits up to `timeout` until the server has seen everything
    /// published so far. (The crate's own timeout covers only the write;
    /// its wait for the answer is unbounded while reconnecting.)
    pub fn flush(&self, timeout: Duration) -> io::Result<()> {
        let link = self.shared.link();
        crate::threads::call_within("agent-nats-flush", timeout, move || {
            link.conn.flush_timeout(timeout)
        })
        .unwrap_or_else(|| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {} ms", timeout.as_millis()),
            ))
        })
    }

    /// Stops the renewer, the inbox dispatcher and the connection, waiting
    /// at most [`CLOSE_TIMEOUT`] for the connection (closing blocks while
    /// reconnecting).
    pub fn close(&self) {
        let state = &self.shared.state;
        state.closing.store(true, Ordering::SeqCst);
        state.signal(|e| e.stop = true);
        let renewer = self
            .renewer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = renewer {
            crate::threads::join_within(h, RENEWER_JOIN_TIMEOUT, "agent-nats-renew");
        }
        // INVARIANT: `closing` is set before the link is read, and the
        // renewer makes a link current only while it is unset, under the
        // write lock: this is the last link.
        let link = self.shared.link();
        link.inbox.stop();
        if !close_bounded(nats::Connection::clone(&link.conn)) {
            log::warn!(
                "the NATS connection did not close within {} s; leaving it to process exit",
                CLOSE_TIMEOUT.as_secs()
            );
        }
    }
}

/// Connecting failed.
#[derive(Debug)]
pub enum NatsError {
    /// The server refused the credentials: retrying cannot help.
    Auth { servers: String, message: String },
    /// The identity provider refused the client, or its CAs do not load.
    Token(TokenError),
    /// No attempt succeeded within the window.
    Window {
        servers: String,
        window: Duration,
        attempts: u32,
        last: String,
    },
    /// Shutdown was requested while connecting.
    Interrupted,
    /// The renewer thread did not start.
    Renewer(io::Error),
}

impl fmt::Display for NatsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auth { servers, message } => write!(
                f,
                "NATS at {servers} refused the agent's credentials ({message}); check nats.auth in the config and the server's user for this device"
            ),
            Self::Token(e) => write!(f, "no bearer token for NATS: {e}"),
            Self::Window {
                servers,
                window,
                attempts,
                last,
            } => write!(
                f,
                "could not connect to NATS at {servers} in {} s ({attempts} attempts, each bounded to {} s); last error: {last}; check the network and nats.servers",
                window.as_secs(),
                NATS_CONNECT_ATTEMPT_TIMEOUT.as_secs()
            ),
            Self::Interrupted => write!(f, "shutdown requested while connecting to NATS"),
            Self::Renewer(e) => write!(f, "starting thread agent-nats-renew: {e}"),
        }
    }
}

impl std::error::Error for NatsError {}

/// One connection attempt for link `link`, bounded by `timeout`. An attempt
/// that outlives its bound is abandoned: its thread ends when the crate
/// gives up, and a late connection is dropped (closed) because nobody
/// receives it.
fn attempt(
    p: &Params,
    state: &Arc<ConnState>,
    token: Option<&AccessToken>,
    link: u64,
    timeout: Duration,
) -> io::Result<nats::Connection> {
    let opts = options(p, state, token, link);
    let servers = p.cfg.servers.join(",");
    let (tx, rx) = mpsc::sync_channel(1);
    thread::Builder::new()
        .name("agent-nats-connect".into())
        .stack_size(CONNECT_THREAD_STACK_BYTES)
        .spawn(move || {
            let _ = tx.send(opts.connect(servers.as_str()));
        })?;
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {} s", timeout.as_secs()),
        )),
    }
}

/// Why one try at a link failed.
pub(super) enum LinkError {
    /// No token from the identity provider.
    Token(TokenError),
    /// The server refused the credentials.
    Auth(io::Error),
    Other(io::Error),
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Token(e) => write!(f, "{e}"),
            Self::Auth(e) | Self::Other(e) => write!(f, "{e}"),
        }
    }
}

/// Connects a new link with `token` (when the method uses one) within
/// `timeout` and starts its inbox.
pub(super) fn open_link(
    p: &Params,
    state: &Arc<ConnState>,
    token: Option<AccessToken>,
    timeout: Duration,
) -> Result<Link, LinkError> {
    let id = state.next_link_id();
    let conn = attempt(p, state, token.as_ref(), id, timeout).map_err(|e| {
        if is_auth_message(&e.to_string()) {
            LinkError::Auth(e)
        } else {
            LinkError::Other(e)
        }
    })?;
    let inbox = match Inbox::start(&conn, &p.device) {
        Ok(i) => i,
        Err(e) => {
            close_bounded(conn);
            return Err(LinkError::Other(io::Error::new(
                e.kind(),
                format!("subscribing to the device inbox: {e}"),
            )));
        }
    };
    Ok(Link {
        id,
        conn: ManuallyDrop::new(conn),
        inbox,
        renew_at: token.map(|t| t.refresh_at),
    })
}

/// Closes `conn` on a helper thread within [`CLOSE_TIMEOUT`]; false when it
/// did not close (it is then left to process exit).
pub(super) fn close_bounded(conn: nats::Connection) -> bool {
    crate::threads::call_within("agent-nats-close", CLOSE_TIMEOUT, move || conn.close()).is_some()
}

/// Connects within `window`, each attempt bounded to 15 s; see the module
/// documentation.
pub fn connect(
    cfg: &NatsConfig,
    device: &DeviceId,
    mode: Reconnect,
    pings: Pings,
    window: Duration,
    shutdown: &Shutdown,
) -> Result<Nats, NatsError> {
    let tokens = match &cfg.auth {
        NatsAuth::OAuth2(c) => Some(TokenSource::new(
            TokenClient::new(c.clone()).map_err(NatsError::Token)?,
        )),
        _ => None,
    };
    let p = Params {
        cfg: cfg.clone(),
        device: device.clone(),
        mode,
        pings,
        tokens,
        servers: cfg.servers.join(", "),
    };
    // INVARIANT: an abandoned attempt's late connection has a link id that
    // never becomes current, so its callbacks change nothing.
    let state = Arc::new(ConnState::default());
    let deadline = Instant::now() + window;
    let mut delay = FIRST_RETRY_DELAY;
    let mut attempts = 0u32;
    let link = loop {
        attempts += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        let bound = NATS_CONNECT_ATTEMPT_TIMEOUT.min(left.max(Duration::from_secs(1)));
        let token = match &p.tokens {
            Some(t) => t.token(Instant::now()).map(Some).map_err(LinkError::Token),
            None => Ok(None),
        };
        match token.and_then(|t| open_link(&p, &state, t, bound)) {
            Ok(link) => break link,
            Err(LinkError::Auth(e)) => {
                return Err(NatsError::Auth {
                    servers: p.servers,
                    message: e.to_string(),
                });
            }
            Err(LinkError::Token(e)) if e.is_permanent() => return Err(NatsError::Token(e)),
            Err(e) => {
                log::warn!(attempt = attempts; "connecting to NATS at {}: {e}", p.servers);
                if Instant::now() + delay >= deadline {
                    return Err(NatsError::Window {
                        servers: p.servers,
                        window,
                        attempts,
                        last: e.to_string(),
                    });
                }
                if shutdown.sleep(delay) {
                    return Err(NatsError::Interrupted);
                }
                delay = (delay * 2).min(MAX_RETRY_DELAY);
            }
        }
    };
    state.current.store(link.id, Ordering::SeqCst);
    state.set_connected(true);
    log::info!(device = device.as_str(), attempt = attempts; "connected to NATS at {}", p.servers);
    let renewed = p.tokens.is_some() && mode == Reconnect::Forever;
    let nats = Nats {
        shared: Arc::new(Shared {
            params: p,
            state,
            link: RwLock::new(Arc::new(link)),
        }),
        renewer: Mutex::new(None),
    };
    if renewed {
        let shared = Arc::clone(&nats.shared);
        match crate::threads::spawn("agent-nats-renew", move || Renewer::new(shared).run()) {
            Ok(h) => *nats.renewer.lock().unwrap_or_else(|p| p.into_inner()) = Some(h),
            Err(e) => {
                nats.close();
                return Err(NatsError::Renewer(e));
            }
        }
    }
    Ok(nats)
}
