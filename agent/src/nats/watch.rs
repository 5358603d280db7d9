//! A thread that keeps one key of this device current, without a JetStream
//! consumer (`docs/design/protocol.md` "Generation 2: reads without a consumer"):
//! the device's desired-workloads document in `fleet-workloads`, or its
//! upgrade intent in `fleet-control`.
//!
//! Loop: wait until connected; subscribe to the key's republished subject
//! (`fleetkv.<bucket>.<device>.<key>`) first, then read the key with one
//! Direct Get ([`read_key`]) and hand over the complete snapshot. Then apply
//! each republished change that is newer than the value held
//! ([`KeyTracker`]); when the republish headers show a change that never
//! arrived (republish is at-most-once), apply the newer one and read again.
//! Read again, too, after every reconnect (a new subscription on the new
//! connection), when a resync is asked for (the end of a change freeze),
//! and on a jittered periodic check, the backstop that bounds how stale a
//! lost last change can leave the device. A read that fails is logged and
//! retried with a growing delay; a value that fails validation is logged
//! and the last good one kept: neither ever tears down a running workload.
//!
//! Noise: NATS checks the subject a client publishes to, never the reply
//! subject it names, so any client may have the server deliver answers onto
//! this device's republished subject. A message there without the
//! republish headers, or republishing another key, is no change: it is
//! counted and dropped (`Noise`), never read after and never logged one
//! by one; a summary with the count is logged at most every
//! [`NOISE_LOG_INTERVAL`].
//!
//! The value is handed over expanded into keys (`expand`): the document's
//! workloads, or the one intent key. The first read and every re-read after
//! a reconnect or resync hand over a [`WatchEvent::Snapshot`]; a change
//! hands over what differs from the keys held, as puts and deletes.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fleet_common::jetstream::{KeyTracker, KeyVersion, Verdict};
use fleet_common::process::{bounded_text, MAX_LOG_TEXT_BYTES};
use fleet_common::subjects::{kv_subject, republish_subject};

use super::connection::Nats;
use super::direct::{read_key, KeyRead};
use crate::jitter::Jitter;
use crate::shutdown::Shutdown;
use crate::threads;

/// Longest wait inside the loop before checking shutdown and the
/// connection generation.
const TICK: Duration = Duration::from_secs(1);
/// Delays between failed reads.
const FIRST_RETRY_DELAY: Duration = Duration::from_secs(1);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);
/// How long stopping waits for the thread.
const JOIN_TIMEOUT: Duration = Duration::from_secs(3);
/// At most one summary line of dropped noise per this long.
pub const NOISE_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Messages on the watched subject that are not republished changes of the
/// key: counted, summarised at most every [`NOISE_LOG_INTERVAL`].
#[derive(Debug, Default)]
struct Noise {
    /// Dropped since the last summary.
    unreported: u64,
    /// Dropped since the watcher started.
    total: u64,
    /// Why the last one was dropped.
    last_why: String,
    last_summary: Option<Instant>,
}

impl Noise {
    fn note(&mut self, why: String, now: Instant) -> Option<String> {
        self.unreported += 1;
        self.total += 1;
        self.last_why = why;
        self.summary(now)
    }

    /// The summary line when one is due (some unreported and none for an
    /// interval).
    fn summary(&mut self, now: Instant) -> Option<String> {
        if self.unreported == 0
            || self
                .last_summary
                .is_some_and(|t| now.duration_since(t) < NOISE_LOG_INTERVAL)
        {
            return None;
        }
        let line = format!(
            "dropped {} messages that are not republished changes of this key ({} since start; last: {}): another client names this device's subject as its reply subject",
            self.unreported, self.total, self.last_why
        );
        self.unreported = 0;
        self.last_summary = Some(now);
        Some(line)
    }
}

/// What one message on the watched subject was.
enum Change {
    /// Applied, or not newer than the value held.
    Done,
    /// The receiver is gone.
    Stop,
    /// Applied, but changes before it never arrived: read the key.
    Gap(String),
    /// Not a republished change of this key (see [`Noise`]).
    Noise(String),
}

/// Turns a key's value (`None`: absent) into the keys handed over, or says
/// why the value is refused (the last good keys are then kept).
pub type Expand = fn(Option<Vec<u8>>) -> Result<BTreeMap<String, Vec<u8>>, String>;

/// What the watcher hands over, as raw keys and values (the receiver
/// validates them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// Every key of the device, complete: keys absent here are absent.
    Snapshot(BTreeMap<String, Vec<u8>>),
    Put(String, Vec<u8>),
    Delete(String),
}

#[derive(Debug, Default)]
struct Progress {
    snapshots: u64,
    last_keys: usize,
    last_error: Option<String>,
    /// The value read since the last (re)connect has been handed over.
    in_sync: bool,
}

/// What others may ask of a running watcher.
#[derive(Debug, Default)]
pub struct WatchStatus {
    progress: Mutex<Progress>,
    changed: Condvar,
    resync: AtomicBool,
}

impl WatchStatus {
    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record_snapshot(&self, keys: usize) {
        let mut p = self.lock();
        p.snapshots += 1;
        p.last_keys = keys;
        p.last_error = None;
        p.in_sync = true;
        self.changed.notify_all();
    }

    fn record_error(&self, e: String) {
        let mut p = self.lock();
        p.last_error = Some(e);
        p.in_sync = false;
        self.changed.notify_all();
    }

    /// Whether a complete snapshot was handed over since the last (re)connect
    /// (false at start and while a new one is read).
    pub fn in_sync(&self) -> bool {
        self.lock().in_sync
    }

    /// Asks the watcher to read the key again and hand over a complete
    /// snapshot, as after a reconnect.
    pub fn request_resync(&self) {
        self.resync.store(true, Ordering::SeqCst);
    }

    /// Waits until a first snapshot is complete; returns its key count, or
    /// the last error when `timeout` passes or `shutdown` is requested first.
    pub fn wait_first_snapshot(&self, timeout: Duration) -> Result<usize, Option<String>> {
        let deadline = Instant::now() + timeout;
        let mut p = self.lock();
        loop {
            if p.snapshots > 0 {
                return Ok(p.last_keys);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(p.last_error.clone());
            }
            p = self
                .changed
                .wait_timeout(p, (deadline - now).min(TICK))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// The configuration of one watcher.
#[derive(Debug)]
pub struct Watcher {
    pub bucket: &'static str,
    /// The key below `<device>.` (`desired`, `agent-upgrade-intent`).
    pub key: &'static str,
    pub expand: Expand,
    pub nats: Arc<Nats>,
    /// The periodic backstop read, jittered by a fifth either way.
    pub check: Duration,
    pub shutdown: Arc<Shutdown>,
}

/// A running watcher.
#[derive(Debug)]
pub struct WatchHandle {
    thread: JoinHandle<()>,
    name: String,
    pub status: Arc<WatchStatus>,
    waiting: Arc<Waiting>,
}

impl WatchHandle {
    /// Joins the thread (shutdown must have been requested).
    pub fn join(self) {
        self.join_within(JOIN_TIMEOUT);
    }

    /// [`join`](Self::join) within `timeout` (a caller with its own deadline).
    /// The subscription's wait is ended at once, not waited out.
    pub fn join_within(self, timeout: Duration) {
        self.waiting.close();
        threads::join_within(self.thread, timeout, &self.name);
    }
}

/// The subscription the watcher thread waits on, so that the join can end
/// the wait: a drain then takes milliseconds, not up to a [`TICK`].
#[derive(Debug, Default)]
struct Waiting(Mutex<WaitSlot>);

#[derive(Debug, Default)]
struct WaitSlot {
    closed: bool,
    sub: Option<nats::Subscription>,
}

impl Waiting {
    /// The watcher waits on `sub` from now on; false once closed (stop).
    fn set(&self, sub: nats::Subscription) -> bool {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if slot.closed {
            return false;
        }
        slot.sub = Some(sub);
        true
    }

    /// The watcher no longer waits on the last subscription: drops the
    /// handle kept on it, so the watcher's own drop unsubscribes it.
    fn clear(&self) {
        let sub = self.0.lock().unwrap_or_else(|p| p.into_inner()).sub.take();
        drop(sub);
    }

    /// Ends the current wait and every later one.
    fn close(&self) {
        let sub = {
            let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
            slot.closed = true;
            slot.sub.take()
        };
        if let Some(sub) = sub {
            // Dropping the delivery channel's sender ends `next_timeout`.
            if let Err(e) = sub.unsubscribe() {
                log::debug!("unsubscribing a watcher's subscription: {e}");
            }
        }
    }
}

/// Why following one subscription ended.
enum Ended {
    Stop,
    Restart(String),
}

/// Where a value came from: a snapshot read (handed over whole) or a change
/// (handed over as what differs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Snapshot,
    Change,
}

/// The state of the key held between reads.
#[derive(Debug, Default)]
struct Held {
    tracker: KeyTracker,
    keys: BTreeMap<String, Vec<u8>>,
}

impl Watcher {
    /// Starts the thread `name`; `sink` gets every event and returns false
    /// when nobody listens any more.
    pub fn spawn(
        self,
        name: &str,
        mut sink: impl FnMut(WatchEvent) -> bool + Send + 'static,
    ) -> io::Result<WatchHandle> {
        let status = Arc::new(WatchStatus::default());
        let waiting = Arc::new(Waiting::default());
        let (st, w) = (Arc::clone(&status), Arc::clone(&waiting));
        let thread = threads::spawn(name, move || self.run(&st, &w, &mut sink))?;
        Ok(WatchHandle {
            thread,
            name: name.to_owned(),
            status,
            waiting,
        })
    }

    fn full_key(&self) -> String {
        format!("{}.{}", self.nats.device(), self.key)
    }

    fn run(
        &self,
        status: &WatchStatus,
        waiting: &Waiting,
        sink: &mut dyn FnMut(WatchEvent) -> bool,
    ) {
        let bucket = self.bucket;
        let subject = republish_subject(bucket, &self.full_key());
        let mut held = Held::default();
        let mut delay = FIRST_RETRY_DELAY;
        loop {
            if self.shutdown.is_requested() {
                return;
            }
            if !self.nats.is_connected() {
                if self.shutdown.sleep(TICK) {
                    return;
                }
                continue;
            }
            let generation = self.nats.generation();
            // The read below serves a resync asked for until now.
            status.resync.store(false, Ordering::SeqCst);
            // Subscribe before reading: a change committed after the read
            // is then republished to us.
            let sub = match self.nats.subscribe(&subject) {
                Ok(s) => s,
                Err(e) => {
                    let why = format!("subscribing to {subject}: {e}");
                    log::warn!(bucket = bucket; "{why}; retrying in {} s", delay.as_secs());
                    status.record_error(why);
                    if self.shutdown.sleep(delay) {
                        return;
                    }
                    delay = (delay * 2).min(MAX_RETRY_DELAY);
                    continue;
                }
            };
            if !waiting.set(sub.clone()) {
                return;
            }
            let ended = match self.read_and_hand_over(&mut held, Origin::Snapshot, status, sink) {
                Ok(true) => {
                    delay = FIRST_RETRY_DELAY;
                    self.follow(&sub, generation, &mut held, status, sink)
                }
                Ok(false) => Ended::Stop,
                Err(why) => {
                    waiting.clear();
                    log::warn!(bucket = bucket, key = self.key; "{why}; reading again in {} s", delay.as_secs());
                    status.record_error(why);
                    if self.shutdown.sleep(delay) {
                        return;
                    }
                    delay = (delay * 2).min(MAX_RETRY_DELAY);
                    continue;
                }
            };
            waiting.clear();
            drop(sub);
            match ended {
                Ended::Stop => return,
                Ended::Restart(why) => {
                    log::info!(bucket = bucket, key = self.key; "{why}; subscribing again and reading the key");
                    status.record_error(why);
                }
            }
        }
    }

    /// Reads the key and hands it over: a snapshot whole (always, so a
    /// resync or reconnect re-establishes sync), a change as what differs
    /// (only when newer). `Ok(false)` when the receiver is gone.
    fn read_and_hand_over(
        &self,
        held: &mut Held,
        origin: Origin,
        status: &WatchStatus,
        sink: &mut dyn FnMut(WatchEvent) -> bool,
    ) -> Result<bool, String> {
        let KeyRead { seq, value } =
            read_key(&self.nats, self.bucket, self.key).map_err(|e| e.to_string())?;
        let newer = held.tracker.on_read(seq);
        if newer {
            let keys = (self.expand)(value).map_err(|e| {
                format!(
                    "{} {} at sequence {seq} is refused: {}",
                    self.bucket,
                    self.full_key(),
                    bounded_text(e.as_bytes(), MAX_LOG_TEXT_BYTES)
                )
            })?;
            if origin == Origin::Change {
                let ok = hand_over_changes(&held.keys, &keys, sink);
                held.keys = keys;
                return Ok(ok);
            }
            held.keys = keys;
        } else if origin == Origin::Change {
            return Ok(true);
        }
        if !sink(WatchEvent::Snapshot(held.keys.clone())) {
            return Ok(false);
        }
        status.record_snapshot(held.keys.len());
        log::info!(bucket = self.bucket, key = self.key, seq = held.tracker.held(); "snapshot complete: {} keys", held.keys.len());
        Ok(true)
    }

    /// Applies republished changes until the subscription must be replaced.
    fn follow(
        &self,
        sub: &nats::Subscription,
        generation: u64,
        held: &mut Held,
        status: &WatchStatus,
        sink: &mut dyn FnMut(WatchEvent) -> bool,
    ) -> Ended {
        let bucket = self.bucket;
        let mut jitter = Jitter::new();
        let mut next_check = Instant::now() + jitter.around(self.check);
        let mut check_delay = FIRST_RETRY_DELAY;
        let mut noise = Noise::default();
        loop {
            if self.shutdown.is_requested() {
                return Ended::Stop;
            }
            if let Some(line) = noise.summary(Instant::now()) {
                log::warn!(bucket = bucket, key = self.key; "{line}");
            }
            if self.nats.generation() != generation {
                return Ended::Restart("NATS reconnected".to_owned());
            }
            let resync = status.resync.swap(false, Ordering::SeqCst);
            if resync {
                log::info!(bucket = bucket, key = self.key; "a new snapshot was asked for; reading the key again");
            }
            let now = Instant::now();
            if resync || now >= next_check {
                let origin = if resync {
                    Origin::Snapshot
                } else {
                    Origin::Change
                };
                match self.read_and_hand_over(held, origin, status, sink) {
                    Ok(true) => {
                        check_delay = FIRST_RETRY_DELAY;
                        next_check = Instant::now() + jitter.around(self.check);
                    }
                    Ok(false) => return Ended::Stop,
                    Err(why) if resync => return Ended::Restart(why),
                    Err(why) => {
                        log::warn!(bucket = bucket, key = self.key; "periodic check: {why}; trying again in {} s", check_delay.as_secs());
                        next_check = Instant::now() + check_delay;
                        check_delay = (check_delay * 2).min(MAX_RETRY_DELAY);
                    }
                }
                continue;
            }
            let wait = next_check.saturating_duration_since(now).min(TICK);
            let m = match sub.next_timeout(wait) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => continue,
                Err(_) if self.shutdown.is_requested() => return Ended::Stop,
                Err(_) => {
                    return Ended::Restart(format!(
                        "the subscription to {} closed",
                        republish_subject(bucket, &self.full_key())
                    ))
                }
            };
            match self.on_change(m, held, sink) {
                Change::Done => {}
                Change::Stop => return Ended::Stop,
                Change::Gap(why) => {
                    // Read again now: the next loop turn does the check.
                    log::warn!(bucket = bucket, key = self.key; "{why}; reading the key again");
                    next_check = Instant::now();
                }
                Change::Noise(why) => {
                    if let Some(line) = noise.note(why, Instant::now()) {
                        log::warn!(bucket = bucket, key = self.key; "{line}");
                    }
                }
            }
        }
    }

    /// One message on the watched subject.
    fn on_change(
        &self,
        m: nats::Message,
        held: &mut Held,
        sink: &mut dyn FnMut(WatchEvent) -> bool,
    ) -> Change {
        let bucket = self.bucket;
        let expected = kv_subject(bucket, &self.full_key());
        let headers = m.headers.as_ref();
        let version = match KeyVersion::from_headers(|name| {
            headers.and_then(|h| h.get(name)).map(String::as_str)
        }) {
            Ok(v) => v,
            Err(e) => return Change::Noise(format!("no republish headers ({e})")),
        };
        if version.subject != expected {
            return Change::Noise(format!(
                "a change of {}, not of {expected}",
                bounded_text(version.subject.as_bytes(), MAX_LOG_TEXT_BYTES)
            ));
        }
        let verdict = held.tracker.on_change(&version);
        if verdict == Verdict::Stale {
            log::debug!(bucket = bucket, key = self.key; "ignoring sequence {}: not newer than {}", version.seq, held.tracker.held());
            return Change::Done;
        }
        let value = (!version.deleted).then_some(m.data);
        let ok = match (self.expand)(value) {
            Ok(keys) => {
                let ok = hand_over_changes(&held.keys, &keys, sink);
                held.keys = keys;
                ok
            }
            Err(e) => {
                let e = bounded_text(e.as_bytes(), MAX_LOG_TEXT_BYTES);
                log::error!(bucket = bucket, key = self.key; "{expected} at sequence {} is refused: {e}; keeping the last good value until a valid one is written", version.seq);
                true
            }
        };
        match verdict {
            _ if !ok => Change::Stop,
            Verdict::ApplyAfterGap { missed_after } => Change::Gap(format!(
                "changes after sequence {missed_after} were not republished to this device (the newest, {}, was applied)",
                version.seq
            )),
            _ => Change::Done,
        }
    }
}

/// Hands over what differs between `old` and `new` as puts and deletes;
/// false when the receiver is gone.
fn hand_over_changes(
    old: &BTreeMap<String, Vec<u8>>,
    new: &BTreeMap<String, Vec<u8>>,
    sink: &mut dyn FnMut(WatchEvent) -> bool,
) -> bool {
    for (k, v) in new {
        if old.get(k) != Some(v) && !sink(WatchEvent::Put(k.clone(), v.clone())) {
            return false;
        }
    }
    for k in old.keys() {
        if !new.contains_key(k) && !sink(WatchEvent::Delete(k.clone())) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_is_summarised_at_most_once_an_interval() {
        let mut n = Noise::default();
        let t0 = Instant::now();
        let first = n
            .note("no republish headers".into(), t0)
            .expect("first summary");
        assert!(first.starts_with("dropped 1 messages"), "{first}");
        let mut lines = 0;
        for i in 1..=1000u64 {
            let at = t0 + Duration::from_millis(i * 59);
            if n.note(format!("n{i}"), at).is_some() {
                lines += 1;
            }
        }
        // 59 s of noise at 17/s: no line before the interval ends.
        assert_eq!(lines, 0);
        let later = n
            .summary(t0 + NOISE_LOG_INTERVAL)
            .expect("a summary an interval later");
        assert!(later.starts_with("dropped 1000 messages"), "{later}");
        assert!(later.contains("1001 since start"), "{later}");
        assert!(later.contains("last: n1000"), "{later}");
        assert_eq!(n.summary(t0 + NOISE_LOG_INTERVAL * 3), None);
    }

    #[test]
    fn a_change_is_handed_over_as_what_differs() {
        let old = BTreeMap::from([
            ("a".to_owned(), b"1".to_vec()),
            ("b".to_owned(), b"2".to_vec()),
        ]);
        let new = BTreeMap::from([
            ("a".to_owned(), b"1".to_vec()),
            ("b".to_owned(), b"3".to_vec()),
            ("c".to_owned(), b"4".to_vec()),
        ]);
        let mut got = Vec::new();
        assert!(hand_over_changes(&old, &new, &mut |e| {
            got.push(e);
            true
        }));
        assert_eq!(
            got,
            vec![
                WatchEvent::Put("b".into(), b"3".to_vec()),
                WatchEvent::Put("c".into(), b"4".to_vec()),
            ]
        );
        got.clear();
        assert!(hand_over_changes(&new, &BTreeMap::new(), &mut |e| {
            got.push(e);
            true
        }));
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|e| matches!(e, WatchEvent::Delete(_))));
    }
}
