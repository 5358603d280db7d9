//! One link: a connection of the `nats` crate and the device inbox on it,
//! opened within a bound ([`open_link`]) and closed within one
//! ([`close_bounded`]); and [`Shared`], the current link with what every
//! link is made from, which the agent's threads and the renewer share.

use std::fmt;
use std::io;
use std::mem::ManuallyDrop;
use std::sync::mpsc;
use std::sync::{Arc, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use fleet_common::limits::NATS_REQUEST_TIMEOUT;

use super::inbox::Inbox;
use super::options::{is_auth_message, options};
use super::state::{ConnState, Params};
use crate::oauth::{AccessToken, TokenError};

/// Bound on closing the connection.
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Stack of the short-lived thread running one connection attempt.
const CONNECT_THREAD_STACK_BYTES: usize = 256 * 1024;
/// Requests in flight on a replaced link finish within their own bound.
pub const RETIRE_WAIT: Duration = NATS_REQUEST_TIMEOUT;

/// One connection and the inbox on it.
pub(super) struct Link {
    pub(super) id: u64,
    /// Never dropped while it may still be running: dropping the crate's
    /// last handle leaves its thread reconnecting while no server answers
    /// (its reconnect loop does not check for close). [`super::Nats::close`] and
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
