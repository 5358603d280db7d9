//! A fleet simulator for the fleet-scale bench: one process
//! holding N device connections, each speaking the agent's NATS protocol
//! exactly (its own user in `DEVICES`, the same subjects, bodies, order,
//! acknowledged status writes, heartbeat schedule and reconnect backoff),
//! from one event loop over non-blocking sockets (epoll), not a thread per
//! device.
//!
//! Two device protocols ([`Generation`]):
//! - **1** (agent 0.1.0, the baseline): an ephemeral push consumer per
//!   bucket (`fleet-desired`, `fleet-control`) created on the device-scoped
//!   API, read until pending 0, flow control answered, 3 missed idle
//!   heartbeats or a reconnect → a new consumer and snapshot;
//! - **2** (consumer-free): subscribe to the key's republished subject,
//!   then one Direct Get per key; changes applied only when newer
//!   ([`fleet_common::jetstream::KeyTracker`]); a gap, a reconnect or the
//!   jittered backstop → Direct Get again.
//!
//! Both: inbox `_INBOX.<dev>.<rand>.*`, device info published and acked
//! first, heartbeats every 30 s plus up to 3 s, a workloads report after
//! each snapshot and each desired change (the agent with Podman disabled).
//! Every device's timeline (connected, snapshot complete, each desired
//! value applied, lost sync, errors) is kept in a [`DeviceRecord`].
//!
//! One process holds as many devices as its open-file limit allows (a
//! 20,000 hard limit holds about 19,000). Past that, [`MultiSim`] splits
//! the fleet over `fleet-sim-worker` processes (the binary beside the test
//! binaries or the bench): each runs a [`Sim`] over a contiguous range of
//! the devices on the same servers (every device starting on the server,
//! source address and start time it would have in one process), and the
//! coordinator merges their records in device order on each call, the
//! times carried as CLOCK_MONOTONIC nanoseconds ([`clock`]). A worker that
//! exits is an error naming it with its stderr; a worker whose stdin
//! closes stops, so none outlives its coordinator.
//! [`scenario::Fleet::start_processes`] runs the shared steps on it.

pub mod admin;
pub mod bodies;
pub mod clock;
pub mod multi;
mod proto;
pub mod scenario;
mod sim;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use multi::MultiSim;
pub use proto::{Msg, Op};

/// Which device protocol the simulated devices speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Generation {
    /// Agent 0.1.0: a JetStream consumer per device and bucket.
    One,
    /// Consumer-free: republished subjects and Direct Get.
    Two,
}

impl Generation {
    pub fn label(self) -> &'static str {
        match self {
            Self::One => "gen 1 (consumer per device)",
            Self::Two => "gen 2 (republish + Direct Get)",
        }
    }
}

/// How the simulated devices authenticate.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SimAuth {
    /// A static user each: `<id>` / `password(<id>)` in `DEVICES`.
    #[default]
    Password,
    /// The agent's `enrollment` method through the auth callout
    /// (agent/src/enroll.rs): the device's own user nkey ([`device_key`])
    /// signing the server's nonce, its id as the user, `token` beside them.
    /// A device first asks to join as the agent does (one connection, its
    /// request on `fleetenroll.key.<KEY>`, the answer on its key's inbox;
    /// pending, slow-down or no answer: ask again after 5 s doubling to
    /// 5 min, at least what the answer asks) and, approved, connects as
    /// itself with the same key. Beside each request, the agent's second
    /// probe: a Direct Get of its own desired document, which answers only
    /// when the callout placed the connection in `DEVICES` (approved, its
    /// answer lost or never asked for).
    Enrollment { token: String },
}

/// Simulated device `id`'s own user nkey, the same in every process (a
/// bench can preauthorize it, or find its record).
pub fn device_key(id: &str) -> nkeys::KeyPair {
    use sha2::Digest;
    let raw: [u8; 32] = sha2::Sha256::digest(format!("fleet-sim device key {id}")).into();
    // A 32-byte seed is always a valid ed25519 key.
    match nkeys::KeyPair::new_from_raw(nkeys::KeyPairType::User, raw) {
        Ok(k) => k,
        Err(_) => nkeys::KeyPair::new_user(),
    }
}

/// What a simulation runs.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Client addresses of the servers (a device starts on
    /// `servers[i % len]` and, when it loses it, moves to another one
    /// picked at random, as the agent's NATS client does).
    pub servers: Vec<SocketAddr>,
    /// Device ids; each logs in as `<id>` / `password(<id>)`.
    pub devices: Vec<String>,
    pub password: fn(&str) -> String,
    /// How each device authenticates ([`SimAuth`]; `password` is used by
    /// [`SimAuth::Password`] only).
    pub auth: SimAuth,
    pub generation: Generation,
    /// When the heartbeat is written ([`StatusWrites`]).
    pub status: StatusWrites,
    /// The client's PING after this long without a word from the server
    /// (agent 0.3.0: `intervals.ping-secs`, 200 s; the `nats` crate before:
    /// 2 minutes).
    pub ping: Duration,
    /// Generation 1: the consumers' idle heartbeat (the agent: 5 s).
    pub idle_heartbeat: Duration,
    /// Generation 2: the periodic re-read backstop (agent 0.3.0: 6 h ± 20%,
    /// 0.2.0: 300 s).
    pub backstop: Duration,
    /// Bound on one request (the agent: `NATS_REQUEST_TIMEOUT`, 10 s).
    pub request_timeout: Duration,
    /// Devices started per second at the beginning (a fleet does not boot
    /// in one instant; 0 = all at once).
    pub start_rate: u32,
    /// Connections per local source address (127.0.0.1, .2, ...): each
    /// address has ~28k ephemeral ports, and `bind` searches them for a
    /// free one, which takes about a millisecond when most are taken
    /// (20,000 a source address held a 100,000-device start back for
    /// minutes, devices timing out their authentication while the loop
    /// bound); 4,000 keeps the search short, 250 addresses 1,000,000
    /// devices.
    pub per_source_address: usize,
    /// Keep every subject each device sends on (the faithfulness test).
    pub trace: bool,
    /// The index of the first of `devices` in the whole fleet (0 unless a
    /// worker process of a fleet split over processes, [`MultiSim`], holds
    /// a range of it): a device's first server, source address and start
    /// time follow from its index in the whole fleet, as they would in one
    /// process.
    pub first_index: usize,
}

impl SimConfig {
    /// The agent's defaults for `devices` on `servers`.
    pub fn new(
        servers: Vec<SocketAddr>,
        devices: Vec<String>,
        password: fn(&str) -> String,
        generation: Generation,
    ) -> SimConfig {
        SimConfig {
            servers,
            devices,
            password,
            auth: SimAuth::Password,
            generation,
            status: match generation {
                Generation::One => StatusWrites::Every(fleet_common::limits::HEARTBEAT_INTERVAL),
                Generation::Two => {
                    StatusWrites::KeepAlive(fleet_common::limits::KEEPALIVE_INTERVAL)
                }
            },
            ping: match generation {
                Generation::One => LEGACY_PING_INTERVAL,
                Generation::Two => fleet_common::limits::NATS_PING_INTERVAL,
            },
            idle_heartbeat: Duration::from_secs(5),
            backstop: match generation {
                Generation::One => LEGACY_CHECK_INTERVAL,
                Generation::Two => fleet_common::limits::CHECK_INTERVAL,
            },
            request_timeout: fleet_common::limits::NATS_REQUEST_TIMEOUT,
            start_rate: 0,
            per_source_address: 4_000,
            trace: false,
            first_index: 0,
        }
    }
}

/// The client PING interval of the `nats` crate as released (agents
/// before 0.3.0).
pub const LEGACY_PING_INTERVAL: Duration = Duration::from_secs(120);
/// Agent 0.2.0's periodic check.
pub const LEGACY_CHECK_INTERVAL: Duration = Duration::from_secs(300);

/// When a simulated device writes its heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StatusWrites {
    /// Agents before 0.3.0: at start and every period, plus up to a tenth
    /// (at most 3 s).
    Every(Duration),
    /// Agent 0.3.0 on: at start and, nothing changing, every keep-alive
    /// period plus up to a tenth.
    KeepAlive(Duration),
}

impl SimConfig {
    /// Generation 2 as agent 0.2.0 speaks it: a heartbeat every 30 s, a
    /// check every 300 s, the crate's 2-minute PING (the baseline of the
    /// status-on-change protocol).
    pub fn speak_agent_0_2(&mut self) {
        self.status = StatusWrites::Every(fleet_common::limits::HEARTBEAT_INTERVAL);
        self.ping = LEGACY_PING_INTERVAL;
        self.backstop = LEGACY_CHECK_INTERVAL;
    }
}

/// One device's timeline.
#[derive(Debug, Clone, Default)]
pub struct DeviceRecord {
    /// Each time the server accepted its CONNECT (PONG received).
    pub connects: Vec<Instant>,
    /// Each time an accepted connection was lost.
    pub disconnects: Vec<Instant>,
    /// Each time its view stopped being known complete: a lost connection,
    /// or (generation 1) a consumer replaced (stale, gap, ended).
    pub lost_sync: Vec<Instant>,
    /// Each time its view became complete again (every key read).
    pub snapshots: Vec<Instant>,
    /// Each desired value applied (snapshot or change): stream sequence.
    pub applied: Vec<(Instant, u64)>,
    /// JetStream API requests sent (consumer creates, Direct Gets).
    pub api_requests: u64,
    pub status_puts: u64,
    pub status_acked: u64,
    /// Failed requests, refused creates, server `-ERR`s.
    pub errors: u64,
    pub last_error: Option<String>,
    /// The server index it is connected to now.
    pub server: Option<usize>,
    /// Each connection the server accepted (enrollment ones included):
    /// from opening the socket to the PONG after CONNECT, which with the
    /// auth callout is the callout's decision plus two round trips.
    pub handshakes: Vec<Duration>,
    /// [`SimAuth::Enrollment`]: requests to join sent.
    pub enroll_asks: u64,
    /// [`SimAuth::Enrollment`]: when the enrollment answer said approved.
    pub approved: Option<Instant>,
    /// With [`SimConfig::trace`]: `SUB <subject>`, `UNSUB <subject>`,
    /// `PUB <subject>` in the order sent.
    pub trace: Vec<String>,
}

impl DeviceRecord {
    /// The first complete snapshot at or after `t`.
    pub fn snapshot_after(&self, t: Instant) -> Option<Instant> {
        self.snapshots.iter().copied().find(|s| *s >= t)
    }

    /// When a desired value of sequence `seq` or newer was applied.
    pub fn applied_at_least(&self, seq: u64) -> Option<Instant> {
        self.applied
            .iter()
            .find(|(_, s)| *s >= seq)
            .map(|(t, _)| *t)
    }
}

/// A running simulation; stopped (every connection closed) on drop.
#[derive(Debug)]
pub struct Sim {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), String>>>,
    records: Arc<Mutex<Vec<DeviceRecord>>>,
}

impl Sim {
    /// Starts the event loop thread `fleet-sim`.
    pub fn start(cfg: SimConfig) -> io::Result<Sim> {
        let stop = Arc::new(AtomicBool::new(false));
        let records = Arc::new(Mutex::new(vec![DeviceRecord::default(); cfg.devices.len()]));
        let mut l = sim::Loop::new(cfg, Arc::clone(&records))?;
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("fleet-sim".into())
            .spawn(move || l.run(&s))?;
        Ok(Sim {
            stop,
            thread: Some(thread),
            records,
        })
    }

    /// The records, locked (the loop waits while they are held: keep it short).
    pub fn records(&self) -> MutexGuard<'_, Vec<DeviceRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the event loop still runs (it ends on [`stop`](Self::stop)
    /// or when it fails).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Polls `done` on the records every 100 ms until it holds or
    /// `timeout` passes; returns whether it held.
    pub fn wait_until(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&[DeviceRecord]) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if done(&self.records()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the loop and closes every connection; the loop's error, if it failed.
    pub fn stop(mut self) -> Result<(), String> {
        self.halt()
    }

    fn halt(&mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::SeqCst);
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err("the fleet-sim thread panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// Raises this process's open-file limit (soft and, as root, hard) to at
/// least `want`; children started later inherit it. Returns the soft limit now.
pub fn raise_nofile(want: u64) -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let cur = getrlimit(Resource::Nofile);
    let hard = cur.maximum.unwrap_or(u64::MAX);
    if hard < want {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(want),
                maximum: Some(want),
            },
        );
    }
    let cur = getrlimit(Resource::Nofile);
    let hard = cur.maximum.unwrap_or(u64::MAX);
    let soft = want.min(hard);
    if cur.current.is_some_and(|c| c < soft) {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(soft),
                maximum: cur.maximum,
            },
        );
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The agent's reconnect delay (agent/src/nats/options.rs
/// `reconnect_delay`): none before the first attempt, then 100 ms doubling
/// to 5 s, plus up to a quarter more at random (`r` in 0..=u64::MAX).
pub fn reconnect_delay(attempts: usize, r: u64) -> Duration {
    if attempts == 0 {
        return Duration::ZERO;
    }
    let doublings = u32::try_from(attempts - 1).unwrap_or(u32::MAX).min(6);
    let base = (Duration::from_millis(100) * 2u32.pow(doublings)).min(Duration::from_secs(5));
    let quarter = u64::try_from(base.as_millis() / 4).unwrap_or(0);
    base + Duration::from_millis(r % quarter.saturating_add(1))
}

/// Percentiles of a set of durations (nearest rank).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
