//! What one agent's connection is made of and what its links report: the
//! [`Params`] every link is built from, the [`Reconnect`] mode and
//! [`Pings`], and the [`ConnState`] the client's callbacks keep current
//! and the renewer waits on. Plain data, below the options, the links and
//! the renewer that use it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fleet_common::validate::DeviceId;

use crate::config::NatsConfig;
use crate::oauth::TokenSource;

/// Reconnect attempts per server the crate makes on a bearer-token link
/// before it closes it and leaves the next connection to the renewer. A
/// refused token fails each attempt at once, so the renewer takes over
/// within a second; a server that is down gets the same attempts from the
/// renewer, with a fresh token when needed.
pub const BEARER_CRATE_RECONNECTS: usize = 3;
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
    /// The server denied a subscription or publish (a permissions
    /// violation) since [`super::Nats::wait_denied`] last looked.
    pub(super) denied: bool,
    /// [`super::Nats::close`]: stop.
    pub(super) stop: bool,
}

/// Connection events, updated by the client's callbacks. Only the
/// callbacks of the current link count; a replaced link's are ignored.
#[derive(Debug, Default)]
pub struct ConnState {
    pub(super) generation: AtomicU64,
    pub(super) connected: AtomicBool,
    /// Set by [`super::Nats::close`]: the disconnect that follows is expected.
    pub(super) closing: AtomicBool,
    /// When the connection was lost; `None` while connected.
    pub(super) disconnected_at: Mutex<Option<Instant>>,
    /// The id of the current [`super::link::Link`] (0: none yet).
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

    pub(super) fn next_link_id(&self) -> u64 {
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
