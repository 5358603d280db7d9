//! The renewer thread (`agent-nats-renew`) of bearer-token connections:
//! replaces the current link at its token's refresh time, when it is lost
//! for good, or when the server refuses its token, and retires the old one
//! (see [`super::connection`] for the whole life of a link).

use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fleet_common::limits::NATS_CONNECT_ATTEMPT_TIMEOUT;

use super::link::{close_bounded, open_link, Link, LinkError, Shared, CLOSE_TIMEOUT, RETIRE_WAIT};
use super::options::with_jitter;

/// First and longest delay between failed renewals (token or connection).
const RENEW_FIRST_DELAY: Duration = Duration::from_secs(1);
const RENEW_MAX_DELAY: Duration = Duration::from_secs(60);
/// How often a replaced link is checked for requests still in flight.
const RETIRE_POLL: Duration = Duration::from_millis(20);

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
pub(super) struct Renewer {
    shared: Arc<Shared>,
    /// The last renewal that failed, and when to try it again.
    failed: Option<(Renewal, Instant)>,
    delay: Duration,
}

impl Renewer {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            failed: None,
            delay: RENEW_FIRST_DELAY,
        }
    }

    pub(super) fn run(mut self) {
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
        log::info!(link = id, reconnect = g; "NATS connection renewed ({}); the watchers subscribe again and read their keys", why.describe());
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
