//! A thread that keeps one bucket's view of this device current: a
//! complete snapshot of the device's keys, then deltas. Generic over the
//! bucket (`fleet-desired` now, `fleet-control` for upgrade intents).
//!
//! Loop: wait until connected; create a consumer ([`KvConsumer::create`]),
//! retrying with a growing delay; read until the pending count reaches 0
//! (or the create response says nothing is pending: a device with no keys)
//! and hand over the snapshot; then hand over each change. Start over with
//! a new consumer and a new snapshot after a reconnect, a gap in the
//! sequence, three missed heartbeats or a [`WatchStatus::request_resync`]
//! (the end of a change freeze). Stop when shutdown is requested or the
//! receiver of the events is gone.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::connection::Nats;
use super::consumer::{KvConsumer, KvOp};
use crate::shutdown::Shutdown;
use crate::threads;

/// Longest wait inside the loop before checking shutdown and the
/// connection generation.
const TICK: Duration = Duration::from_secs(1);
/// Delays between failed consumer creations.
const FIRST_RETRY_DELAY: Duration = Duration::from_secs(1);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);
/// How long stopping waits for the thread.
const JOIN_TIMEOUT: Duration = Duration::from_secs(3);

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
    /// The current consumer has handed over its complete snapshot.
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

    /// Whether the current consumer has handed over a complete snapshot
    /// (false at start and while a new consumer reads one).
    pub fn in_sync(&self) -> bool {
        self.lock().in_sync
    }

    /// Asks the watcher to replace its consumer and read a new complete
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
    pub nats: Arc<Nats>,
    pub idle_heartbeat: Duration,
    /// Keys kept per snapshot at most; more are dropped with an error.
    pub max_keys: usize,
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
    /// The consumer's wait is ended at once, not waited out.
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
    /// handle kept on it, so the consumer's own drop unsubscribes it.
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
                log::debug!("unsubscribing a watcher's consumer: {e}");
            }
        }
    }
}

/// Why one consumer's run ended.
enum Ended {
    Stop,
    Restart(String),
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

    fn run(
        &self,
        status: &WatchStatus,
        waiting: &Waiting,
        sink: &mut dyn FnMut(WatchEvent) -> bool,
    ) {
        let bucket = self.bucket;
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
            // A new consumer reads a new snapshot: a resync asked for
            // until now is served by it.
            status.resync.store(false, Ordering::SeqCst);
            let consumer = match KvConsumer::create(&self.nats, bucket, self.idle_heartbeat) {
                Ok(c) => c,
                Err(e) => {
                    log::warn!(bucket = bucket; "{e}; retrying in {} s", delay.as_secs());
                    status.record_error(e.to_string());
                    if self.shutdown.sleep(delay) {
                        return;
                    }
                    delay = (delay * 2).min(MAX_RETRY_DELAY);
                    continue;
                }
            };
            delay = FIRST_RETRY_DELAY;
            if !waiting.set(consumer.interrupter()) {
                return;
            }
            log::info!(bucket = bucket, consumer = consumer.name(); "consumer created, {} keys pending", consumer.initial_pending());
            let ended = self.follow(consumer, generation, status, sink);
            waiting.clear();
            match ended {
                Ended::Stop => return,
                Ended::Restart(why) => {
                    log::warn!(bucket = bucket; "{why}; creating a new consumer and reading a new snapshot");
                    status.record_error(why);
                }
            }
        }
    }

    /// Reads the snapshot, then deltas, until the consumer must be replaced.
    fn follow(
        &self,
        mut consumer: KvConsumer,
        generation: u64,
        status: &WatchStatus,
        sink: &mut dyn FnMut(WatchEvent) -> bool,
    ) -> Ended {
        let bucket = self.bucket;
        let mut stop = || {
            if self.shutdown.is_requested() {
                Some("shutdown".to_owned())
            } else if self.nats.generation() != generation {
                Some("NATS reconnected".to_owned())
            } else if status.resync.swap(false, Ordering::SeqCst) {
                Some("a new snapshot was asked for".to_owned())
            } else {
                None
            }
        };
        let snap = match consumer.read_snapshot(self.max_keys, &mut stop) {
            Ok(s) => s,
            Err(_) if self.shutdown.is_requested() => return Ended::Stop,
            Err(e) => return Ended::Restart(e.to_string()),
        };
        if snap.dropped > 0 {
            log::error!(bucket = bucket; "the snapshot has more than {} keys; {} were ignored", self.max_keys, snap.dropped);
        }
        let n = snap.keys.len();
        if !sink(WatchEvent::Snapshot(snap.keys)) {
            return Ended::Stop;
        }
        status.record_snapshot(n);
        log::info!(bucket = bucket; "snapshot complete: {n} keys");
        let tick = self.idle_heartbeat.min(TICK);
        loop {
            if let Some(why) = stop() {
                return if self.shutdown.is_requested() {
                    Ended::Stop
                } else {
                    Ended::Restart(why)
                };
            }
            let entry = match consumer.next(tick) {
                Ok(Some(e)) => e,
                Ok(None) => continue,
                Err(_) if self.shutdown.is_requested() => return Ended::Stop,
                Err(e) => return Ended::Restart(e.to_string()),
            };
            let event = match entry.op {
                KvOp::Put(v) => WatchEvent::Put(entry.key, v),
                KvOp::Delete => WatchEvent::Delete(entry.key),
            };
            if !sink(event) {
                return Ended::Stop;
            }
        }
    }
}
