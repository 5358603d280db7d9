//! Connecting to NATS and keeping track of the connection.
//!
//! Steps of [`connect`]: build the client options from the config (auth,
//! TLS, a small reconnect buffer, unlimited reconnects for the daemon);
//! run one connection attempt on a helper thread and wait for it at most
//! [`NATS_CONNECT_ATTEMPT_TIMEOUT`] (the crate's own TCP connect and
//! handshake have no timeout); retry with a growing delay until the window
//! ends; refuse at once when the server rejects the credentials. Once
//! connected, start the inbox dispatcher.
//!
//! While running, the crate reconnects by itself. Every reconnect bumps
//! [`Nats::generation`], which tells the consumers to start over: their
//! in-memory JetStream consumers may be gone with a restarted server.

use std::fmt;
use std::io;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fleet_common::limits::NATS_CONNECT_ATTEMPT_TIMEOUT;
use fleet_common::validate::DeviceId;

use super::inbox::{Inbox, RequestError};
use crate::config::{NatsAuth, NatsConfig};
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

/// What the client does when the connection drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconnect {
    /// The daemon: reconnect forever.
    Forever,
    /// Probe mode: after a drop each server is tried once more, then the
    /// connection closes and the probe fails. (The crate counts the first
    /// connection as an attempt too, so this is its `max_reconnects(1)`.)
    Once,
}

/// Connection events, updated by the client's callbacks.
#[derive(Debug, Default)]
pub struct ConnState {
    generation: AtomicU64,
    connected: AtomicBool,
    /// Set by [`Nats::close`]: the disconnect that follows is expected.
    closing: AtomicBool,
    /// When the connection was lost; `None` while connected.
    disconnected_at: Mutex<Option<Instant>>,
    last_server_error: Mutex<Option<String>>,
}

impl ConnState {
    fn set_error(&self, e: String) {
        *self
            .last_server_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    fn set_disconnected(&self, at: Option<Instant>) {
        *self
            .disconnected_at
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = at;
    }

    /// The last asynchronous error the server sent (a permissions
    /// violation, for instance), taken.
    pub fn take_server_error(&self) -> Option<String> {
        self.last_server_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// The connection every thread of the agent shares.
#[derive(Debug)]
pub struct Nats {
    /// Never dropped: dropping the crate's last handle joins its
    /// connection thread, which never ends while no server answers (its
    /// reconnect loop does not check for close). [`Nats::close`] closes it
    /// with a bound instead, and process exit releases the socket.
    conn: ManuallyDrop<nats::Connection>,
    device: DeviceId,
    state: Arc<ConnState>,
    inbox: Inbox,
    servers: String,
}

impl Nats {
    pub fn device(&self) -> &DeviceId {
        &self.device
    }

    /// The configured servers, for messages.
    pub fn servers(&self) -> &str {
        &self.servers
    }

    /// Bumped at every reconnect.
    pub fn generation(&self) -> u64 {
        self.state.generation.load(Ordering::SeqCst)
    }

    pub fn is_connected(&self) -> bool {
        self.state.connected.load(Ordering::SeqCst)
    }

    /// How long the connection has been lost; `None` while connected.
    pub fn disconnected_for(&self) -> Option<Duration> {
        if self.is_connected() {
            return None;
        }
        let at = *self
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
        match self.inbox.request(&self.conn, subject, payload, timeout) {
            Err(RequestError::Timeout { subject, .. }) if !self.is_connected() => {
                Err(RequestError::Disconnected { subject })
            }
            Err(RequestError::Timeout { subject, after, .. }) => Err(RequestError::Timeout {
                subject,
                after,
                server_error: self.state.take_server_error(),
            }),
            other => other,
        }
    }

    /// Publishes without a reply (flow-control answers).
    pub fn publish(&self, subject: &str, payload: &[u8]) -> io::Result<()> {
        self.conn.publish(subject, payload)
    }

    pub fn subscribe(&self, subject: &str) -> io::Result<nats::Subscription> {
        self.conn.subscribe(subject)
    }

    /// Waits up to `timeout` until the server has seen everything
    /// published so far. (The crate's own timeout covers only the write;
    /// its wait for the answer is unbounded while reconnecting.)
    pub fn flush(&self, timeout: Duration) -> io::Result<()> {
        let conn = nats::Connection::clone(&self.conn);
        crate::threads::call_within("agent-nats-flush", timeout, move || {
            conn.flush_timeout(timeout)
        })
        .unwrap_or_else(|| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {} ms", timeout.as_millis()),
            ))
        })
    }

    /// Stops the inbox dispatcher and closes the connection, waiting at
    /// most [`CLOSE_TIMEOUT`] (closing blocks while reconnecting).
    pub fn close(&self) {
        self.state.closing.store(true, Ordering::SeqCst);
        self.inbox.stop();
        let conn = nats::Connection::clone(&self.conn);
        if crate::threads::call_within("agent-nats-close", CLOSE_TIMEOUT, move || conn.close())
            .is_none()
        {
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
    /// No attempt succeeded within the window.
    Window {
        servers: String,
        window: Duration,
        attempts: u32,
        last: String,
    },
    /// Shutdown was requested while connecting.
    Interrupted,
    /// Connected, but subscribing to the inbox failed.
    Inbox(io::Error),
}

impl fmt::Display for NatsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auth { servers, message } => write!(
                f,
                "NATS at {servers} refused the agent's credentials ({message}); check nats.auth in the config and the server's user for this device"
            ),
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
            Self::Inbox(e) => write!(f, "subscribing to the device inbox: {e}"),
        }
    }
}

impl std::error::Error for NatsError {}

fn options(
    cfg: &NatsConfig,
    device: &DeviceId,
    state: &Arc<ConnState>,
    mode: Reconnect,
) -> nats::Options {
    let o = match &cfg.auth {
        NatsAuth::None | NatsAuth::TlsCertificate => nats::Options::new(),
        NatsAuth::UserPassword { user, password } => {
            nats::Options::with_user_pass(user, password.expose())
        }
        NatsAuth::Token(t) => nats::Options::with_token(t.expose()),
        NatsAuth::Creds(path) => nats::Options::with_credentials(path),
    };
    let mut o = o
        .with_name(&format!("fleet-agent {device}"))
        .no_echo()
        .reconnect_buffer_size(RECONNECT_BUFFER_BYTES)
        .max_reconnects(match mode {
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
        s.set_disconnected(Some(Instant::now()));
        s.connected.store(false, Ordering::SeqCst);
        if !s.closing.load(Ordering::SeqCst) {
            log::warn!("NATS connection lost; reconnecting");
        }
    });
    let s = Arc::clone(state);
    let o = o.reconnect_callback(move || {
        s.set_disconnected(None);
        s.connected.store(true, Ordering::SeqCst);
        let g = s.generation.fetch_add(1, Ordering::SeqCst) + 1;
        log::info!(reconnect = g; "NATS reconnected; consumers start over");
    });
    let s = Arc::clone(state);
    let o = o.error_callback(move |e| {
        log::warn!("NATS server error: {e}");
        s.set_error(e.to_string());
    });
    o.close_callback(|| log::debug!("NATS connection closed"))
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
    let quarter = u64::try_from(base.as_millis() / 4).unwrap_or(0);
    let jitter = uuid::Uuid::new_v4().as_u64_pair().0 % quarter.saturating_add(1);
    base + Duration::from_millis(jitter)
}

fn is_auth_error(e: &io::Error) -> bool {
    let m = e.to_string().to_ascii_lowercase();
    m.contains("authorization violation")
        || m.contains("authentication")
        || m.contains("user authentication expired")
}

/// One connection attempt, bounded by `timeout`. An attempt that outlives
/// its bound is abandoned: its thread ends when the crate gives up, and a
/// late connection is dropped (closed) because nobody receives it.
fn attempt(
    cfg: &NatsConfig,
    device: &DeviceId,
    state: &Arc<ConnState>,
    mode: Reconnect,
    timeout: Duration,
) -> io::Result<nats::Connection> {
    let opts = options(cfg, device, state, mode);
    let servers = cfg.servers.join(",");
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

/// Connects within `window`, each attempt bounded to 15 s; see the module
/// documentation.
pub fn connect(
    cfg: &NatsConfig,
    device: &DeviceId,
    mode: Reconnect,
    window: Duration,
    shutdown: &Shutdown,
) -> Result<Nats, NatsError> {
    let servers = cfg.servers.join(", ");
    let deadline = Instant::now() + window;
    let mut delay = FIRST_RETRY_DELAY;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let state = Arc::new(ConnState::default());
        let left = deadline.saturating_duration_since(Instant::now());
        let bound = NATS_CONNECT_ATTEMPT_TIMEOUT.min(left.max(Duration::from_secs(1)));
        match attempt(cfg, device, &state, mode, bound) {
            Ok(conn) => {
                state.connected.store(true, Ordering::SeqCst);
                let inbox = Inbox::start(&conn, device).map_err(NatsError::Inbox)?;
                log::info!(device = device.as_str(), attempt = attempts; "connected to NATS at {servers}");
                return Ok(Nats {
                    conn: ManuallyDrop::new(conn),
                    device: device.clone(),
                    state,
                    inbox,
                    servers,
                });
            }
            Err(e) if is_auth_error(&e) => {
                return Err(NatsError::Auth {
                    servers,
                    message: e.to_string(),
                });
            }
            Err(e) => {
                log::warn!(attempt = attempts; "connecting to NATS at {servers}: {e}");
                if Instant::now() + delay >= deadline {
                    return Err(NatsError::Window {
                        servers,
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
