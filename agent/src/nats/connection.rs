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
//! has no token callback). So the daemon's connection is a link
//! ([`super::link`]) that
//! the renewer thread (`agent-nats-renew`, [`super::renew`]) replaces:
//!
//! 1. at the token's refresh time (a quarter of its life before expiry),
//!    it gets a fresh token and opens a new link with it;
//! 2. when the current link is lost for good (the crate gives up after
//!    [`super::state::BEARER_CRATE_RECONNECTS`] attempts per server: the token refused or
//!    expired, or the servers down), it opens a new link with the kept
//!    token while that is valid, else (and always after a refusal) a new one;
//! 3. it makes the new link current and bumps the generation, so every
//!    watcher starts over on it exactly as after a reconnect; requests in
//!    flight on the old link finish (at most [`super::link::RETIRE_WAIT`]) before it is
//!    closed.
//!
//! A failed token request or connection attempt is retried after a growing
//! delay (1 s doubling to 60 s, with jitter), forever; the current link
//! serves meanwhile while its token lasts. The token is never logged.

use std::fmt;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fleet_common::limits::NATS_CONNECT_ATTEMPT_TIMEOUT;
use fleet_common::validate::DeviceId;

use super::inbox::RequestError;
use super::link::{close_bounded, open_link, LinkError, Shared, CLOSE_TIMEOUT};
use super::renew::Renewer;
use super::state::{ConnState, Params, Pings, Reconnect};
use crate::config::{NatsAuth, NatsConfig};
use crate::oauth::{TokenClient, TokenError, TokenSource};
use crate::shutdown::Shutdown;

/// First delay between connection attempts at start; doubles up to
/// [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_secs(1);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(15);
/// How long closing waits for the renewer (it may be inside a bounded
/// token request or connection attempt; process exit ends it then).
const RENEWER_JOIN_TIMEOUT: Duration = Duration::from_millis(200);

/// What [`Nats::wait_denied`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// The server denied something.
    Denied,
    /// Nothing denied within the wait.
    Quiet,
    /// The connection is being closed.
    Closing,
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

    /// Waits up to `timeout` for the server to deny this device a
    /// subscription or publish (a permissions violation) since the last
    /// call (the mark is then cleared).
    pub fn wait_denied(&self, timeout: Duration) -> Denial {
        let state = &self.shared.state;
        let deadline = Instant::now() + timeout;
        let mut ev = state.events();
        loop {
            if ev.stop {
                return Denial::Closing;
            }
            if ev.denied {
                ev.denied = false;
                return Denial::Denied;
            }
            let now = Instant::now();
            if now >= deadline {
                return Denial::Quiet;
            }
            ev = state
                .wake
                .wait_timeout(ev, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
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
