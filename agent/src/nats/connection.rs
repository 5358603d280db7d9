//! Connecting to NATS and keeping the connection.
//!
//! Steps of [`connect`]: with the `oauth2-client-credentials` method, get a
//! bearer token from the identity provider ([`crate::oauth`]); build the
//! client options from the config (auth, TLS, a small reconnect buffer);
//! run one connection attempt on a helper thread and wait for it at most
//! [`NATS_CONNECT_ATTEMPT_TIMEOUT`] (the crate's own TCP connect and
//! handshake have no timeout); retry with a growing delay until the window
//! ends; refuse at once when the server rejects the credentials or the
//! identity provider refuses the client. Once connected, start the inbox
//! dispatcher.
//!
//! While running, the crate reconnects by itself. Every reconnect bumps
//! [`Nats::generation`], which tells the consumers to start over: their
//! in-memory JetStream consumers may be gone with a restarted server.
//!
//! With a bearer token the connection cannot live longer than the token:
//! the user the auth callout issues expires with it, the server then
//! closes the connection, and the crate's own reconnect presents the old
//! token again (its token is fixed when the connection is made; the crate
//! has no token callback). So the daemon's connection is a [`Link`] that
//! the renewer thread (`agent-nats-renew`) replaces:
//!
//! 1. at the token's refresh time (a quarter of its life before expiry),
//!    it gets a fresh token and opens a new link with it;
//! 2. when the current link is lost for good (the crate gives up after
//!    [`BEARER_CRATE_RECONNECTS`] attempts per server: the token refused or
//!    expired, or the servers down), it opens a new link with the kept
//!    token while that is valid, else (and always after a refusal) a new one;
//! 3. it makes the new link current and bumps the generation, so every
//!    consumer starts over on it exactly as after a reconnect; requests in
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
use crate::config::{NatsAuth, NatsConfig};
use crate::oauth::{AccessToken, TokenClient, TokenError, TokenSource};
use crate::shutdown::Shutdown;

/// Bytes of publishes the client buffers while disconnected. The agent
/// waits for an ack on every write, so little needs buffering; the
/// crate's default (8 MiB) would be most of the memory budget.
const RECONNECT_BUFFER_BYTES: usize = 64 * 1024;
/// First delay between connection attempts at start; doubles up to
/// [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_secs(1);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(15);
/// The trust list given to the crate when TLS is not used: empty.
const NO_TLS_ROOTS: &str = "/dev/null";
/// First and longest delay between reconnect attempts to one server.
const RECONNECT_FIRST_DELAY: Duration = Duration::from_millis(100);
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(5);
/// Bound on closing the connection.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
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
/// First and longest delay between failed renewals (token or connection).
const RENEW_FIRST_DELAY: Duration = Duration::from_secs(1);
const RENEW_MAX_DELAY: Duration = Duration::from_secs(60);
/// How often a replaced link is checked for requests still in flight.
const RETIRE_POLL: Duration = Duration::from_millis(20);
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
struct Events {
    /// The highest link id whose connection closed (the crate stopped
    /// reconnecting); the current link is lost when it is its id.
    lost: u64,
    /// The server refused or expired the current link's credentials.
    refused: bool,
    /// [`Nats::close`]: stop.
    stop: bool,
}

/// Connection events, updated by the client's callbacks. Only the
/// callbacks of the current link count; a replaced link's are ignored.
#[derive(Debug, Default)]
pub struct ConnState {
    generation: AtomicU64,
    connected: AtomicBool,
    /// Set by [`Nats::close`]: the disconnect that follows is expected.
    closing: AtomicBool,
    /// When the connection was lost; `None` while connected.
    disconnected_at: Mutex<Option<Instant>>,
    /// The id of the current [`Link`] (0: none yet).
    current: AtomicU64,
    /// The id of the last link made.
    last_link: AtomicU64,
    last_server_error: Mutex<Option<String>>,
    events: Mutex<Events>,
    wake: Condvar,
}

impl ConnState {
    fn set_error(&self, e: String) {
        *self
            .last_server_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    /// Records the connection going up or down; the time of loss is kept
    /// from the first disconnect until the connection is back.
    fn set_connected(&self, up: bool) {
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

    fn is_current(&self, link: u64) -> bool {
        self.current.load(Ordering::SeqCst) == link
    }

    fn next_link_id(&self) -> u64 {
        self.last_link.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn events(&self) -> MutexGuard<'_, Events> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn signal(&self, f: impl FnOnce(&mut Events)) {
        f(&mut self.events());
        self.wake.notify_all();
    }
}

/// One connection and the inbox on it.
struct Link {
    id: u64,
    /// Never dropped while it may still be running: dropping the crate's
    /// last handle leaves its thread reconnecting while no server answers
    /// (its reconnect loop does not check for close). [`Nats::close`] and
    /// the renewer close it with a bound instead, and process exit
    /// releases the socket.
    conn: ManuallyDrop<nats::Connection>,
    inbox: Inbox,
    /// When to replace it with one on a fresh token (bearer tokens only).
    renew_at: Option<Instant>,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("id", &self.id)
            .field("renew_at", &self.renew_at)
            .finish_non_exhaustive()
    }
}

/// What every link of one agent is made from.
struct Params {
    cfg: NatsConfig,
    device: DeviceId,
    mode: Reconnect,
    /// The identity provider's tokens (`oauth2-client-credentials` only).
    tokens: Option<TokenSource>,
    servers: String,
}

/// What the agent's threads and the renewer share.
struct Shared {
    params: Params,
    state: Arc<ConnState>,
    link: RwLock<Arc<Link>>,
}

impl Shared {
    fn link(&self) -> Arc<Link> {
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

/// The client options of link `link`; `token` is the bearer token of the
/// `oauth2-client-credentials` method.
fn options(
    p: &Params,
    state: &Arc<ConnState>,
    token: Option<&AccessToken>,
    link: u64,
) -> nats::Options {
    let cfg = &p.cfg;
    let o = match (&cfg.auth, token) {
        (NatsAuth::UserPassword { user, password }, _) => {
            nats::Options::with_user_pass(user, password.expose())
        }
        (NatsAuth::Token(t), _) => nats::Options::with_token(t.expose()),
        (NatsAuth::Creds(path), _) => nats::Options::with_credentials(path),
        (NatsAuth::OAuth2(_), Some(t)) => nats::Options::with_token(t.token.expose()),
        // `OAuth2` without a token is not reached: every link of that
        // method is made with one (and the server would refuse none).
        (NatsAuth::None | NatsAuth::TlsCertificate | NatsAuth::OAuth2(_), _) => {
            nats::Options::new()
        }
    };
    // A bearer-token link gives up after a few reconnects and the renewer
    // makes the next one (see the module documentation).
    let renewed = matches!(cfg.auth, NatsAuth::OAuth2(_)) && p.mode == Reconnect::Forever;
    let mut o = o
        .with_name(&format!("fleet-agent {}", p.device))
        .no_echo()
        .reconnect_buffer_size(RECONNECT_BUFFER_BYTES)
        .max_reconnects(match p.mode {
            Reconnect::Forever if renewed => Some(BEARER_CRATE_RECONNECTS),
            Reconnect::Forever => None,
            Reconnect::Once => Some(1),
        });
    let tls_urls = cfg.servers.iter().any(|s| s.starts_with("tls://"));
    if cfg.tls.is_none() && !tls_urls {
        // No TLS at all: an empty trust list, so the crate does not parse
        // every system CA (about 150) into memory at each connection.
        o = o.add_root_certificate(NO_TLS_ROOTS);
    }
    if let Some(tls) = &cfg.tls {
        o = o.tls_required(true);
        if let Some(ca) = &tls.ca_file {
            o = o.add_root_certificate(ca);
        }
        if let Some(c) = &tls.client_cert {
            o = o.client_cert(&c.cert_file, &c.key_file);
        }
    }
    let s = Arc::clone(state);
    let o = o.disconnect_callback(move || {
        if !s.is_current(link) {
            return;
        }
        s.set_connected(false);
        if !s.closing.load(Ordering::SeqCst) {
            log::warn!("NATS connection lost; reconnecting");
        }
    });
    let s = Arc::clone(state);
    let o = o.reconnect_callback(move || {
        if !s.is_current(link) {
            return;
        }
        s.set_connected(true);
        let g = s.generation.fetch_add(1, Ordering::SeqCst) + 1;
        log::info!(reconnect = g; "NATS reconnected; consumers start over");
    });
    let s = Arc::clone(state);
    let o = o.error_callback(move |e| {
        let e = e.to_string();
        if !s.is_current(link) {
            log::debug!("NATS server error on a replaced connection: {e}");
            return;
        }
        log::warn!("NATS server error: {e}");
        if is_auth_message(&e) {
            s.signal(|ev| ev.refused = true);
        }
        s.set_error(e);
    });
    let s = Arc::clone(state);
    o.close_callback(move || {
        if s.closing.load(Ordering::SeqCst) {
            log::debug!("NATS connection closed");
            return;
        }
        // Recorded for links not yet current too: the renewer checks the
        // link it just made.
        s.signal(|ev| ev.lost = ev.lost.max(link));
        if s.is_current(link) {
            s.set_connected(false);
            if renewed {
                log::warn!("NATS connection closed after {BEARER_CRATE_RECONNECTS} reconnect attempts per server; connecting anew");
            }
        }
    })
    .reconnect_delay_callback(reconnect_delay)
}

/// Delay before a connection attempt to a server that already failed
/// `attempts` times in a row: none for the first (the crate's default
/// sleeps up to 1 s even then), then 100 ms doubling to 5 s, plus up to a
/// quarter more at random so a fleet does not reconnect in step.
pub fn reconnect_delay(attempts: usize) -> Duration {
    if attempts == 0 {
        return Duration::ZERO;
    }
    let doublings = u32::try_from(attempts - 1).unwrap_or(u32::MAX).min(6);
    let base = (RECONNECT_FIRST_DELAY * 2u32.pow(doublings)).min(RECONNECT_MAX_DELAY);
    with_jitter(base)
}

/// `base` plus up to a quarter more, at random.
fn with_jitter(base: Duration) -> Duration {
    let quarter = u64::try_from(base.as_millis() / 4).unwrap_or(0);
    let jitter = uuid::Uuid::new_v4().as_u64_pair().0 % quarter.saturating_add(1);
    base + Duration::from_millis(jitter)
}

fn is_auth_message(m: &str) -> bool {
    let m = m.to_ascii_lowercase();
    m.contains("authorization violation")
        || m.contains("authentication")
        || m.contains("user authentication expired")
}

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
enum LinkError {
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
fn open_link(
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
fn close_bounded(conn: nats::Connection) -> bool {
    crate::threads::call_within("agent-nats-close", CLOSE_TIMEOUT, move || conn.close()).is_some()
}

/// Connects within `window`, each attempt bounded to 15 s; see the module
/// documentation.
pub fn connect(
    cfg: &NatsConfig,
    device: &DeviceId,
    mode: Reconnect,
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

/// Why the renewer makes a new link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    /// The current link's token is due for renewal; the link still serves.
    Due,
    /// The current link closed (the crate stopped reconnecting).
    Lost,
    /// The server refused or expired the current link's token.
    Refused,
}

/// The thread that replaces bearer-token links; see the module
/// documentation.
struct Renewer {
    shared: Arc<Shared>,
    /// The last renewal that failed, and when to try it again.
    failed: Option<(Renewal, Instant)>,
    delay: Duration,
}

impl Renewer {
    fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            failed: None,
            delay: RENEW_FIRST_DELAY,
        }
    }

    fn run(mut self) {
        while let Some(why) = self.wait() {
            match self.renew(why) {
                Ok(()) => {
                    self.failed = None;
                    self.delay = RENEW_FIRST_DELAY;
                }
                Err(e) => {
                    if self.failed.is_some_and(|(kind, _)| kind != why) {
                        self.delay = RENEW_FIRST_DELAY;
                    }
                    let wait = with_jitter(self.delay);
                    log::warn!(
                        "renewing the NATS connection ({}): {e}; retrying in {} ms",
                        why.describe(),
                        wait.as_millis()
                    );
                    self.failed = Some((why, Instant::now() + wait));
                    self.delay = (self.delay * 2).min(RENEW_MAX_DELAY);
                }
            }
        }
    }

    /// Waits until a renewal is due; `None` when closing. A renewal that
    /// failed is tried again after its delay; another one (the link lost
    /// while a due renewal waits) at once.
    fn wait(&self) -> Option<Renewal> {
        let state = &self.shared.state;
        let mut ev = state.events();
        loop {
            if ev.stop {
                return None;
            }
            let link = self.shared.link();
            let now = Instant::now();
            let why = if ev.refused {
                Some(Renewal::Refused)
            } else if ev.lost >= link.id {
                Some(Renewal::Lost)
            } else if link.renew_at.is_some_and(|at| now >= at) {
                Some(Renewal::Due)
            } else {
                None
            };
            let retry_at = self
                .failed
                .filter(|(kind, at)| Some(*kind) == why && now < *at)
                .map(|(_, at)| at);
            let until = match (why, retry_at) {
                (Some(why), None) => return Some(why),
                (_, Some(at)) => at,
                (None, None) => link.renew_at.unwrap_or(now + RENEW_MAX_DELAY),
            };
            ev = state
                .wake
                .wait_timeout(ev, until.saturating_duration_since(now))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Gets a token, opens a link with it, makes it current and retires the
    /// old one.
    fn renew(&self, why: Renewal) -> Result<(), LinkError> {
        let p = &self.shared.params;
        let state = &self.shared.state;
        let Some(tokens) = &p.tokens else {
            return Ok(());
        };
        let now = Instant::now();
        let token = match why {
            Renewal::Refused => {
                tokens.invalidate();
                tokens.fresh(now)
            }
            // A renewal that fails leaves the current link serving.
            Renewal::Due => tokens.fresh(now),
            // The link is gone: the kept token while it is valid.
            Renewal::Lost => tokens.token(now),
        }
        .map_err(LinkError::Token)?;
        let link = match open_link(p, state, Some(token), NATS_CONNECT_ATTEMPT_TIMEOUT) {
            Ok(l) => l,
            Err(LinkError::Auth(e)) => {
                // The next try asks for a new token.
                tokens.invalidate();
                return Err(LinkError::Auth(e));
            }
            Err(e) => return Err(e),
        };
        let id = link.id;
        let (old, old_connected) = {
            let mut slot = self.shared.link.write().unwrap_or_else(|p| p.into_inner());
            if state.closing.load(Ordering::SeqCst) {
                drop(slot);
                link.inbox.stop();
                close_bounded(ManuallyDrop::into_inner(link.conn));
                return Ok(());
            }
            state.current.store(id, Ordering::SeqCst);
            let was = state.connected.load(Ordering::SeqCst);
            state.set_connected(true);
            (std::mem::replace(&mut *slot, Arc::new(link)), was)
        };
        state.signal(|ev| ev.refused = false);
        let g = state.generation.fetch_add(1, Ordering::SeqCst) + 1;
        log::info!(link = id, reconnect = g; "NATS connection renewed ({}); consumers start over", why.describe());
        // A refused link is going down even if no callback said so yet.
        retire(old, old_connected && why == Renewal::Due);
        Ok(())
    }
}

impl Renewal {
    fn describe(self) -> &'static str {
        match self {
            Self::Due => "token due for renewal",
            Self::Lost => "connection closed",
            Self::Refused => "token refused by the server",
        }
    }
}

/// Lets requests in flight on a replaced link finish (at most
/// [`RETIRE_WAIT`]), stops its inbox and ends it: a connected link is
/// closed (quick); one that is down is dropped, because closing waits for
/// a reconnect that will not come. A dropped link's thread ends once the
/// crate's few reconnect attempts fail.
fn retire(old: Arc<Link>, connected: bool) {
    let deadline = Instant::now() + RETIRE_WAIT;
    let mut old = old;
    let link = loop {
        match Arc::try_unwrap(old) {
            Ok(link) => break link,
            Err(still) if Instant::now() >= deadline => {
                log::warn!(
                    "requests on the replaced NATS connection still pending after {} s; ending it",
                    RETIRE_WAIT.as_secs()
                );
                still.inbox.stop();
                if connected {
                    close_bounded(nats::Connection::clone(&still.conn));
                }
                return;
            }
            Err(still) => {
                old = still;
                thread::sleep(RETIRE_POLL);
            }
        }
    };
    link.inbox.stop();
    let id = link.id;
    let conn = ManuallyDrop::into_inner(link.conn);
    if !connected {
        drop(conn);
        log::debug!(link = id; "replaced NATS connection dropped");
    } else if close_bounded(conn) {
        log::debug!(link = id; "replaced NATS connection closed");
    } else {
        log::warn!(
            "the replaced NATS connection did not close within {} s; leaving it",
            CLOSE_TIMEOUT.as_secs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_delays_grow_to_five_seconds_with_jitter() {
        assert_eq!(reconnect_delay(0), Duration::ZERO);
        let first = reconnect_delay(1);
        assert!(
            first >= Duration::from_millis(100) && first <= Duration::from_millis(125),
            "{first:?}"
        );
        let late = reconnect_delay(50);
        assert!(
            late >= Duration::from_secs(5) && late <= Duration::from_millis(6250),
            "{late:?}"
        );
    }
}
