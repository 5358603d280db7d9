//! `fleetctl metrics serve`: the operator-side Prometheus exporter.
//!
//! Steps: bind the listen address, connect to NATS (reconnecting for
//! ever), start the thread `metrics-follow` that keeps the [`view`], and
//! answer `GET /metrics` on the calling thread ([`http`]) with the page
//! [`render`] writes from the view as it stands.
//!
//! Why one consumer of its own rather than periodic reads: a read of the
//! whole `fleet-status` bucket replays every key (six a device, 600,000
//! at 100,000 devices) each period, while since agent 0.3.0 a device
//! writes a key only when it changes (and hourly). The consumer replays
//! the last value of each key once (`last_per_subject`), then brings
//! only changes; on a lost consumer (a NATS node gone, a reconnect) a
//! new one starts at the next stream sequence, so nothing is missed or
//! applied twice. The labels (`fleet-operator` `labels.*`) are followed
//! the same way; rollouts, a handful of keys, are listed every
//! [`ROLLOUT_PERIOD`] through [`crate::staged::list`].
//!
//! While NATS does not answer, scrapes answer from the last view with
//! `harmony_fleet_exporter_view_stale 1`.

mod http;
mod render;
mod view;

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fleet_common::subjects::{BUCKET_OPERATOR, BUCKET_STATUS, LABELS_PREFIX};
use fleet_common::Timestamp;

use crate::error::CtlError;
use crate::js::{self, Follow, Followed, KvEntry};

pub use render::Bounds;
use render::ViewStatus;
use view::{Presence, View};

/// How often the rollouts are listed again.
const ROLLOUT_PERIOD: Duration = Duration::from_secs(10);
/// Longest wait for a change of one followed bucket before looking at
/// the other: keeps both consumers and the rollout listing going.
const FOLLOW_WAIT: Duration = Duration::from_millis(100);
/// Changes applied from one consumer before turning to the other.
const FOLLOW_BATCH: usize = 10_000;
/// Pause before making a consumer again after it could not be made.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// A device's connection as the exporter reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connection {
    Online,
    /// The cluster's presence: connected to no server.
    Offline,
    /// Connected (or no presence) but its heartbeat is older than its
    /// agent's bound.
    Stale,
    /// Its last heartbeat said the agent was stopping.
    Stopped,
    /// No heartbeat seen.
    Unknown,
}

impl Connection {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Offline => "offline",
            Self::Stale => "stale",
            Self::Stopped => "stopped",
            Self::Unknown => "unknown",
        }
    }
}

/// The exporter's one judgement of whether a device is connected. The
/// cluster's presence first, when it gives one (docs/design/presence.md):
/// not connected anywhere is `offline`, a server that did not answer
/// leaves `unknown`. Connected, or without presence, the heartbeat rule
/// of fleetctl by agent version (`stale_after`, from
/// [`crate::fleet::stale_after`]: 90 s before 0.3.0, the hourly
/// keep-alive's bound since) still says `stopped` (its last heartbeat
/// was its run's last) and `stale` (connected but silent: a frozen
/// process, a wedged agent). Every series that depends on the
/// connection calls this function and nothing else.
pub fn connection_state(
    heartbeat: Option<(Timestamp, bool)>,
    stale_after: Duration,
    presence: Option<Presence>,
    now: Timestamp,
) -> Connection {
    match (presence, heartbeat) {
        (Some(Presence::Offline { .. }), _) => Connection::Offline,
        (Some(Presence::Unknown), None) | (None, None) => Connection::Unknown,
        (Some(Presence::Online), None) => Connection::Online,
        (Some(Presence::Unknown), Some((at, false))) if now.since(at) > stale_after => {
            Connection::Unknown
        }
        (_, Some((_, true))) => Connection::Stopped,
        (_, Some((at, false))) if now.since(at) > stale_after => Connection::Stale,
        (_, Some(_)) => Connection::Online,
    }
}

/// What `metrics serve` was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    pub listen: SocketAddr,
    pub group_by: Vec<String>,
    pub bounds: Bounds,
}

/// The view and what is known of it, shared by the two threads.
struct State {
    view: View,
    /// The consumer of each bucket is working (both, and the last
    /// rollout listing succeeded: the view is current).
    status_live: bool,
    labels_live: bool,
    rollouts_live: bool,
    heard: Instant,
    started: Instant,
    first_view: Option<Duration>,
}

impl State {
    fn view_status(&self) -> ViewStatus {
        ViewStatus {
            stale: !(self.status_live && self.labels_live && self.rollouts_live),
            age: self.heard.elapsed(),
            complete: self.first_view.is_some(),
            first_view: self.first_view,
        }
    }
}

type Shared = Arc<Mutex<State>>;

fn lock(s: &Shared) -> MutexGuard<'_, State> {
    // A panic in the other thread leaves the view as it was: still worth serving.
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Serves until the process is stopped (SIGTERM, Ctrl-C: nothing to
/// save); returns only when the listen address cannot be bound or NATS
/// cannot be reached at the start.
pub fn serve(conn: nats::Connection, opts: &Options) -> Result<(), CtlError> {
    let listener = TcpListener::bind(opts.listen).map_err(|e| {
        CtlError::Input(format!(
            "listening on {}: {e}; choose another --listen address",
            opts.listen
        ))
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| CtlError::Input(format!("listening on {}: {e}", opts.listen)))?;
    let now = Instant::now();
    let shared: Shared = Arc::new(Mutex::new(State {
        view: View::new(opts.group_by.clone()),
        status_live: false,
        labels_live: false,
        rollouts_live: false,
        heard: now,
        started: now,
        first_view: None,
    }));
    let follower = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("metrics-follow".into())
        .spawn(move || follow(&conn, &follower))
        .map_err(|e| CtlError::Input(format!("starting the thread metrics-follow: {e}")))?;
    eprintln!("fleetctl metrics: serving http://{addr}/metrics");
    let bounds = opts.bounds;
    http::serve(&listener, &|| {
        let s = lock(&shared);
        render::render(&s.view, s.view_status(), bounds, Timestamp::now())
    });
    Err(CtlError::Input(format!(
        "the listener on {addr} stopped accepting connections"
    )))
}

/// One followed bucket: its consumer (when it works) and where to go on.
struct FollowedBucket {
    bucket: &'static str,
    filter: String,
    follow: Option<Follow>,
    /// The next stream sequence to apply (`None`: nothing applied yet).
    next_seq: Option<u64>,
    /// The consumer's replay of the last values has ended once.
    caught_up: bool,
}

impl FollowedBucket {
    fn new(bucket: &'static str, filter: String) -> Self {
        Self {
            bucket,
            filter,
            follow: None,
            next_seq: None,
            caught_up: false,
        }
    }

    /// Makes the consumer when there is none; false when it cannot.
    fn ensure(&mut self, conn: &nats::Connection) -> bool {
        if self.follow.is_some() {
            return true;
        }
        let made = match self.next_seq {
            None => js::follow_from_last(conn, self.bucket, &self.filter),
            Some(seq) => js::follow(conn, self.bucket, &self.filter, Some(seq)),
        };
        match made {
            Ok(f) => {
                self.follow = Some(f);
                true
            }
            Err(e) => {
                log::warn!("metrics: following {}: {e}; retrying", self.bucket);
                false
            }
        }
    }

    /// Applies what arrives until a quiet wait or [`FOLLOW_BATCH`];
    /// false when the consumer was lost.
    fn drain(&mut self, shared: &Shared, apply: fn(&mut View, &KvEntry)) -> bool {
        let Some(f) = self.follow.as_mut() else {
            return false;
        };
        for _ in 0..FOLLOW_BATCH {
            match f.next(FOLLOW_WAIT) {
                Followed::Entry(e) => {
                    self.next_seq = Some(e.seq + 1);
                    let mut s = lock(shared);
                    apply(&mut s.view, &e);
                    s.heard = Instant::now();
                    if f.caught_up() {
                        self.caught_up = true;
                    }
                }
                Followed::Quiet => {
                    if f.caught_up() {
                        self.caught_up = true;
                    }
                    let heard = f.heard();
                    let mut s = lock(shared);
                    s.heard = s.heard.max(heard);
                    return true;
                }
                Followed::Lost => {
                    log::warn!("metrics: the consumer of {} went silent", self.bucket);
                    self.follow = None;
                    return false;
                }
            }
        }
        true
    }
}

/// The thread `metrics-follow`: keeps the view until the process ends.
fn follow(conn: &nats::Connection, shared: &Shared) {
    let mut status = FollowedBucket::new(BUCKET_STATUS, format!("$KV.{BUCKET_STATUS}.>"));
    let mut labels = FollowedBucket::new(
        BUCKET_OPERATOR,
        format!("$KV.{BUCKET_OPERATOR}.{LABELS_PREFIX}.*"),
    );
    let mut rollouts_at: Option<Instant> = None;
    loop {
        let status_ok = status.ensure(conn) && status.drain(shared, View::apply_status);
        let labels_ok = labels.ensure(conn) && labels.drain(shared, View::apply_label);
        {
            let mut s = lock(shared);
            s.status_live = status_ok;
            s.labels_live = labels_ok;
            // Complete: every key replayed once, and the rollouts listed (a
            // scrape seeing it complete sees no stale marker of the start).
            if s.first_view.is_none() && status.caught_up && labels.caught_up && s.rollouts_live {
                let t = s.started.elapsed();
                s.first_view = Some(t);
                let n = s.view.devices.len();
                drop(s);
                eprintln!(
                    "fleetctl metrics: first complete view of {n} devices after {:.1} s",
                    t.as_secs_f64()
                );
            }
        }
        if rollouts_at.is_none_or(|t| t.elapsed() >= ROLLOUT_PERIOD) {
            rollouts_at = Some(Instant::now());
            let listed = crate::staged::list(conn);
            let mut s = lock(shared);
            match listed {
                Ok(list) => {
                    let mut states = Vec::new();
                    let mut unreadable = 0;
                    for (_, r) in list {
                        match r {
                            Ok(st) => states.push(st),
                            Err(_) => unreadable += 1,
                        }
                    }
                    s.view.set_rollouts(states, unreadable);
                    s.rollouts_live = true;
                }
                Err(e) => {
                    log::warn!("metrics: listing rollouts: {e}");
                    s.rollouts_live = false;
                }
            }
            // Presence on the same period: one paged read of every
            // server (fleetctl/src/presence.rs), outside the lock.
            let query = s.view.presence_query();
            drop(s);
            let read = crate::presence::connections(conn, &query);
            let mut s = lock(shared);
            match read {
                Ok(p) => s.view.set_presence(p.as_ref()),
                Err(e) => {
                    log::warn!("metrics: reading presence: {e}");
                    s.view.set_presence(None);
                }
            }
        }
        if !status_ok || !labels_ok {
            std::thread::sleep(RETRY_DELAY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::STALE_HEARTBEAT;

    #[test]
    fn a_device_is_judged_by_its_last_heartbeat() {
        let now = Timestamp::from_unix_millis(1_000_000_000);
        let at = |ago: Duration| {
            Some((
                Timestamp::from_unix_millis(1_000_000_000 - ago.as_millis() as u64),
                false,
            ))
        };
        assert_eq!(
            connection_state(None, STALE_HEARTBEAT, None, now),
            Connection::Unknown
        );
        assert_eq!(
            connection_state(at(Duration::from_secs(5)), STALE_HEARTBEAT, None, now),
            Connection::Online
        );
        assert_eq!(
            connection_state(
                at(STALE_HEARTBEAT + Duration::from_secs(1)),
                STALE_HEARTBEAT,
                None,
                now
            ),
            Connection::Stale
        );
        assert_eq!(
            connection_state(Some((now, true)), STALE_HEARTBEAT, None, now),
            Connection::Stopped
        );
    }

    #[test]
    fn the_clusters_presence_comes_first_and_the_heartbeat_rule_after() {
        let now = Timestamp::from_unix_millis(1_000_000_000);
        let fresh = Some((now, false));
        let old = Some((Timestamp::from_unix_millis(1_000), false));
        let offline = Some(Presence::Offline { last_seen: None });
        // Connected nowhere: offline, however fresh its last heartbeat.
        assert_eq!(
            connection_state(fresh, STALE_HEARTBEAT, offline, now),
            Connection::Offline
        );
        assert_eq!(
            connection_state(None, STALE_HEARTBEAT, offline, now),
            Connection::Offline
        );
        // Connected: online, unless its heartbeat is past its bound (a
        // frozen process keeps its connection) or said stopping.
        let online = Some(Presence::Online);
        assert_eq!(
            connection_state(fresh, STALE_HEARTBEAT, online, now),
            Connection::Online
        );
        assert_eq!(
            connection_state(None, STALE_HEARTBEAT, online, now),
            Connection::Online
        );
        assert_eq!(
            connection_state(old, STALE_HEARTBEAT, online, now),
            Connection::Stale
        );
        // A server did not answer: unknown, never offline; a fresh
        // heartbeat still says online.
        let unknown = Some(Presence::Unknown);
        assert_eq!(
            connection_state(old, STALE_HEARTBEAT, unknown, now),
            Connection::Unknown
        );
        assert_eq!(
            connection_state(fresh, STALE_HEARTBEAT, unknown, now),
            Connection::Online
        );
    }
}
