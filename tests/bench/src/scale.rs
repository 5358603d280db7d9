//! Fleet scale: N simulated devices ([`fleet_sim`]: one event
//! loop, each device its own NATS user speaking the agent's protocol) on a
//! local 3-node nats-server cluster (2.14; `--scale-nats 2.9` for Debian's)
//! with R3 buckets, generation 1
//! (agent 0.1.0: a consumer per device, the baseline) and generation 2
//! (republish + Direct Get) side by side in the same run, each on a fresh
//! cluster.
//!
//! Per generation and N: the cluster's RSS before any device and settled
//! with N (the slope is RSS per device), CPU settled over a window, the
//! JetStream API requests/s in that window (`/jsz` `api.total` deltas:
//! devices are the only clients), the status writes (heartbeats) in it; a
//! fan-out of one desired change per device (pipelined admin puts, like
//! fleetctl), p50/p99/max until each device applied it; `kill -9` of the
//! node with the most connections, then every device that lost sync (its
//! connection, or for generation 1 a consumer on the dead node) back with a
//! complete snapshot: p50/p99/max, errors, devices never recovered.
//!
//! Before the kill: the release `fleetctl status --json` and `fleetctl
//! rollout` against the live fleet (the simulated devices write the agent's
//! status values), timed. After it, the dead node started again, then a
//! rolling restart of the three nodes in lame-duck mode, one after the other
//! (each back with every bucket replica current before the next), and every
//! outage it caused until a complete snapshot again. Memory is also read from Go's own accounting (each
//! node's `/debug/pprof/heap?gc=1`: live heap after a collection, plus
//! goroutine stacks): what a device needs, where RSS also holds the
//! garbage the collector has not reclaimed yet.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use fleet_harness::{ClusterOptions, NatsCluster, NatsVersion, NATS_ADMIN_PASSWORD};
use fleet_sim::scenario::{device_ids, FanOut, Fleet, Recovery, Spread};
use fleet_sim::{Generation, SimConfig};

use crate::procfs;
use crate::report::{Row, Verdict};
use crate::rollout::{fleetctl_at, write_release};

/// Devices started per second (a fleet does not boot in one instant).
pub(crate) const START_RATE: u32 = 2_000;
/// Bound on every device's first snapshot.
pub(crate) const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(600);
/// After the snapshots, before measuring: the first heartbeats spread out.
pub(crate) const SETTLE: Duration = Duration::from_secs(35);
pub(crate) const FAN_OUT_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on the recovery after a node loss: nine times generation 2's
/// target (10 s). Generation 1 backs off up to 30 s between consumer
/// creates that time out after 10 s, so some of its devices are past this
/// bound and counted as not back (a longer one kept `make bench` well past
/// its 15 minutes for a figure that only grows).
pub(crate) const RECOVERY_TIMEOUT: Duration = Duration::from_secs(90);
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after a leader step-down every replica must be current
/// (a stalled catch-up resumed by the new leader).
const STEP_DOWN_BOUND: Duration = Duration::from_secs(180);

/// Lame-duck mode of each node in the rolling restart: `lame_duck_duration`
/// (the server's minimum; its default is 2 min, which only spreads the
/// reconnects thinner) and `lame_duck_grace_period` (the default).
pub(crate) const LAME_DUCK: (Duration, Duration) =
    (Duration::from_secs(30), Duration::from_secs(10));
/// Bound on each node's lame-duck exit and restart (and its catch-up,
/// up to 12,000 devices: [`catch_up_bound`]).
pub(crate) const NODE_RESTART_TIMEOUT: Duration = Duration::from_secs(120);

/// Bound on a restarted node's replicas being current again with `n`
/// devices: 10 ms a device, at least [`NODE_RESTART_TIMEOUT`] (at 36,000
/// on this machine's two shared cores 120 s was not enough; the time it
/// does take is a figure of the row).
pub(crate) fn catch_up_bound(n: usize) -> Duration {
    NODE_RESTART_TIMEOUT.max(Duration::from_millis(10 * n as u64))
}
/// At most this many simulated devices in one process under
/// [`Processes::Auto`] (the hard open-file limit here is 20,000 a process).
pub const DEVICES_PER_PROCESS: usize = 18_000;

/// How many processes hold the simulated devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Processes {
    /// The bench's own process up to [`DEVICES_PER_PROCESS`], past that
    /// ceil(N / it) `fleet-sim-worker` processes.
    Auto,
    /// This many worker processes at every N (1: the bench's own process).
    Fixed(usize),
}

impl Processes {
    /// The processes for `n` devices (1 = the bench's own).
    pub fn for_devices(self, n: usize) -> usize {
        match self {
            Processes::Auto => n.div_ceil(DEVICES_PER_PROCESS).max(1),
            Processes::Fixed(p) => p.clamp(1, n.max(1)),
        }
    }
}

/// The open-file limit the bench needs for `n` devices over `processes`:
/// in its own process one descriptor per device; with workers (each raises
/// its own) what the nodes, which inherit the bench's limit, hold: the
/// busiest about half the devices after a node is killed.
fn nofile_needed(n: usize, processes: usize) -> u64 {
    if processes == 1 {
        n as u64 + 1_000
    } else {
        n as u64 / 2 + 1_000
    }
}

/// Starts the simulated fleet in the bench's process or over `processes` workers.
fn start_fleet(
    cluster: &NatsCluster,
    generation: Generation,
    ids: Vec<String>,
    processes: usize,
    tune: impl FnOnce(&mut SimConfig),
) -> Fleet {
    if processes == 1 {
        Fleet::start(cluster, generation, ids, tune)
    } else {
        eprintln!(
            "bench: {} devices over {processes} fleet-sim-worker processes",
            ids.len()
        );
        Fleet::start_processes(cluster, generation, ids, processes, tune)
    }
}

/// The release `fleetctl rollout` rolls out (the simulated devices report
/// 0.1.0 or this workspace's version).
const ROLLOUT_VERSION: &str = "9.0.0";

/// What one generation measured at one N.
#[derive(Debug, Clone, Default)]
struct Measured {
    rss_before: Vec<u64>,
    rss_settled: Vec<u64>,
    cpu_settled: Vec<f64>,
    api_per_sec: f64,
    device_api_per_sec: f64,
    status_per_sec: f64,
    snapshots: Spread,
    fan_out: FanOut,
    victim: usize,
    victim_conns: usize,
    recovery: Recovery,
    /// Processes that held the simulated devices (1: the bench's own).
    processes: usize,
    /// Go's live heap (after a collection) plus goroutine stacks, per node.
    live_before: Vec<u64>,
    live_settled: Vec<u64>,
    status: Option<FleetctlRun>,
    rollout: Option<FleetctlRun>,
    rolling: Recovery,
    rolling_took: Duration,
    /// Each restarted node and how long its replicas took to be current
    /// again (the killed node first).
    catch_ups: Vec<(String, Duration)>,
    /// Catch-ups that stalled and were resumed by a leader step-down:
    /// which node's restart, the streams, how long after.
    step_downs: Vec<String>,
    /// The rolling restart could not be done (a node did not come back in
    /// time); every figure before it stands.
    rolling_failure: Option<String>,
    failure: Option<String>,
}

/// One timed fleetctl command against the fleet and what it showed.
#[derive(Debug, Clone, Default)]
pub(crate) struct FleetctlRun {
    pub(crate) took: Duration,
    /// What was checked in its output, for the note.
    pub(crate) summary: String,
    pub(crate) ok: bool,
}

impl Measured {
    fn rss_per_device(&self, n: usize) -> f64 {
        let before: u64 = self.rss_before.iter().sum();
        let after: u64 = self.rss_settled.iter().sum();
        after.saturating_sub(before) as f64 / n as f64
    }

    fn live_per_device(&self, n: usize) -> f64 {
        let before: u64 = self.live_before.iter().sum();
        let after: u64 = self.live_settled.iter().sum();
        after.saturating_sub(before) as f64 / n as f64
    }
}

/// The rows of every N (generation 2 as "ours", generation 1 as the
/// baseline unless `baseline` is false), then the slopes between
/// consecutive Ns.
pub fn scale_rows(
    ns: &[usize],
    window: Duration,
    version: NatsVersion,
    baseline: bool,
    processes: Processes,
) -> Vec<Row> {
    let mut out = Vec::new();
    let mut done: Vec<(usize, Option<Measured>, Measured)> = Vec::new();
    for &n in ns {
        let p = processes.for_devices(n);
        let want = (2 * n as u64 + 20_000).max(65_536);
        let nofile = fleet_sim::raise_nofile(want);
        if nofile < nofile_needed(n, p) {
            out.push(Row::todo(
                &format!("scale {n}: every figure"),
                "—",
                &format!("open-file limit {nofile} (could not raise it to {want}): run as root or raise `ulimit -Hn`"),
            ));
            continue;
        }
        let g1 = baseline.then(|| measure(Generation::One, n, p, window, version));
        let g2 = measure(Generation::Two, n, p, window, version);
        out.extend(rows(n, window, version, g1.as_ref(), &g2));
        // A slope needs generation 2 at both ends; generation 1's beside
        // it when it was measured at both.
        if g2.failure.is_none() {
            done.push((n, g1.filter(|g| g.failure.is_none()), g2));
        }
    }
    for pair in done.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        out.push(slope_row(a, b, version));
    }
    out
}

/// RSS and CPU per device between two Ns (the fixed part cancels out),
/// and the CPU per heartbeat write that follows.
fn slope_row(
    a: &(usize, Option<Measured>, Measured),
    b: &(usize, Option<Measured>, Measured),
    version: NatsVersion,
) -> Row {
    let dn = (b.0 - a.0) as f64;
    let rss = |m: &Measured| m.rss_settled.iter().sum::<u64>() as f64;
    let live = |m: &Measured| m.live_settled.iter().sum::<u64>() as f64;
    let cpu = |m: &Measured| m.cpu_settled.iter().sum::<f64>();
    let r2 = (rss(&b.2) - rss(&a.2)) / dn;
    let l2 = (live(&b.2) - live(&a.2)) / dn;
    let cpu2 = (cpu(&b.2) - cpu(&a.2)) / dn;
    let g1 = match (&a.1, &b.1) {
        (Some(x), Some(y)) => Some(((rss(y) - rss(x)) / dn, (cpu(y) - cpu(x)) / dn)),
        _ => None,
    };
    let writes = b.2.status_per_sec - a.2.status_per_sec;
    let per_write = if writes > 0.0 {
        (cpu(&b.2) - cpu(&a.2)) / 100.0 / writes * 1e6
    } else {
        0.0
    };
    let row = Row::new(format!(
        "scale slope {} → {}: server RSS per device (3 nodes{})",
        thousands(a.0),
        thousands(b.0),
        match version {
            NatsVersion::V2_14 => "",
            NatsVersion::V2_9 => ", nats-server 2.9",
        }
    ))
    .ours(kib(r2));
    let row = match g1 {
        Some((r1, _)) => row
            .baseline(format!("{} (gen 1)", kib(r1)))
            .ratio(format!("{:.2}×", r2 / r1.max(1.0))),
        None => row.baseline(NOT_RUN).ratio("—"),
    };
    row.target("≤ 100 KiB", Verdict::from_ok(r2 <= 100.0 * 1024.0))
        .note(format!(
            "(RSS settled at {} − at {}) / {} devices, the three nodes summed: what each further device costs, the fixed part cancelled; Go's live heap after a collection plus goroutine stacks grew {} per device (gen 2). CPU settled per device: gen 2 {:.4} %{} of one core; gen 2's steady state is its heartbeats, so one acknowledged R3 status write costs the cluster about {:.0} µs of CPU here ({:.0} more writes/s).",
            thousands(b.0),
            thousands(a.0),
            thousands(b.0 - a.0),
            kib(l2),
            cpu2,
            g1.map(|(_, c)| format!(", gen 1 {c:.4} %")).unwrap_or_default(),
            per_write,
            writes
        ))
}

/// The baseline cell when `--scale-gen 2` left generation 1 out.
const NOT_RUN: &str = "— (gen 1 not run)";

fn measure(
    generation: Generation,
    n: usize,
    processes: usize,
    window: Duration,
    version: NatsVersion,
) -> Measured {
    eprintln!(
        "bench: scale {n}, {}, nats-server {version:?}",
        generation.label()
    );
    let ids = device_ids(generation, n);
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut cluster = NatsCluster::start_fleet_with(
        version,
        &refs,
        &ClusterOptions {
            monitoring: true,
            max_connections: Some(n + 10_000),
            profiling: true,
            lame_duck: Some(LAME_DUCK),
            ..ClusterOptions::default()
        },
    );
    let nodes = cluster.node_count();
    let mut m = Measured {
        rss_before: (0..nodes).map(|i| node_rss(&cluster, i)).collect(),
        live_before: (0..nodes).map(|i| node_live(&cluster, i)).collect(),
        processes,
        ..Measured::default()
    };
    let started = Instant::now();
    let mut fleet = start_fleet(&cluster, generation, ids, processes, |c| {
        c.start_rate = START_RATE
    });
    match fleet.wait_snapshots(started, SNAPSHOT_TIMEOUT) {
        Ok(s) => m.snapshots = s,
        Err(e) => {
            m.failure = Some(e);
            return m;
        }
    }
    std::thread::sleep(SETTLE);
    // Steady state: CPU, API requests and status writes over the window.
    let pids: Vec<u32> = (0..nodes).filter_map(|i| cluster.node_pid(i)).collect();
    let cpu0: Vec<_> = pids.iter().map(|p| procfs::cpu(*p)).collect();
    let api0 = api_total(&cluster);
    let dev_api0 = fleet.api_requests();
    let (puts0, _) = fleet.status_puts();
    std::thread::sleep(window);
    let secs = window.as_secs_f64();
    m.cpu_settled = pids
        .iter()
        .zip(cpu0)
        .map(|(p, c0)| {
            let c = procfs::cpu(*p).since(c0);
            (c.own + c.children).as_secs_f64() / secs * 100.0
        })
        .collect();
    m.api_per_sec = api_total(&cluster).saturating_sub(api0) as f64 / secs;
    m.device_api_per_sec = fleet.api_requests().saturating_sub(dev_api0) as f64 / secs;
    m.status_per_sec = fleet.status_puts().0.saturating_sub(puts0) as f64 / secs;
    m.rss_settled = (0..nodes).map(|i| node_rss(&cluster, i)).collect();
    m.live_settled = (0..nodes).map(|i| node_live(&cluster, i)).collect();
    // Fan-out.
    let admin = cluster.admin();
    match fleet.fan_out(&admin, "scale-1", FAN_OUT_TIMEOUT) {
        Ok(f) => m.fan_out = f,
        Err(e) => {
            m.failure = Some(e);
            return m;
        }
    }
    drop(admin);
    // The operator's commands against the whole fleet.
    let (status, rollout) = fleetctl_runs(&cluster, n);
    m.status = Some(status);
    m.rollout = Some(rollout);
    // Node loss.
    fleet.mark_errors();
    let per = fleet.per_node(nodes);
    m.victim = (0..nodes).max_by_key(|i| per[*i]).unwrap_or(0);
    m.victim_conns = per[m.victim];
    let at = Instant::now();
    cluster.kill_node(m.victim);
    m.recovery = fleet.recovery(at, RECOVERY_TIMEOUT);
    // The dead node back (no lame duck: it is not running), then a rolling
    // restart, lame-duck mode, one node after the other.
    match cluster.restart_node_lame_duck_within(m.victim, NODE_RESTART_TIMEOUT, catch_up_bound(n)) {
        Ok(took) => m.catch_ups.push((format!("killed n{}", m.victim), took)),
        Err(e) => {
            m.rolling_failure = Some(format!("restarting the killed node: {e}"));
            return m;
        }
    }
    fleet.mark_errors();
    let from = Instant::now();
    for i in 0..nodes {
        eprintln!("bench: scale {n}: lame-duck restart of n{i}");
        match cluster.restart_node_lame_duck_within(i, NODE_RESTART_TIMEOUT, catch_up_bound(n)) {
            Ok(took) => m.catch_ups.push((format!("n{i}"), took)),
            // A replica left behind: does a new leader resume its catch-up?
            Err(e) if e.contains("replicas not all current") => {
                eprintln!(
                    "bench: scale {n}: n{i} not caught up ({e}); stepping down the lagging leaders"
                );
                match cluster.step_down_lagging_leaders(STEP_DOWN_BOUND) {
                    Ok((streams, took)) => m.step_downs.push(format!(
                        "after n{i}'s restart {} stepped down, every replica current {:.0} s later",
                        streams.join(", "),
                        took.as_secs_f64()
                    )),
                    Err(e2) => {
                        m.rolling_failure = Some(format!("{e}; {e2}"));
                        return m;
                    }
                }
            }
            Err(e) => {
                m.rolling_failure = Some(e);
                return m;
            }
        }
    }
    let until = Instant::now();
    m.rolling_took = until - from;
    m.rolling = fleet.outages(from, until, RECOVERY_TIMEOUT);
    drop(fleet);
    m
}

/// The steady state alone, agent 0.3's protocol against 0.2's (generation
/// 2 both: a heartbeat write every 30 s, the 5-minute check, the crate's
/// 2-minute PING), each on a fresh cluster: the cluster's CPU per device.
pub fn steady_rows(
    ns: &[usize],
    window: Duration,
    version: NatsVersion,
    processes: Processes,
) -> Vec<Row> {
    let mut out = Vec::new();
    for &n in ns {
        let p = processes.for_devices(n);
        let want = (2 * n as u64 + 20_000).max(65_536);
        let nofile = fleet_sim::raise_nofile(want);
        if nofile < nofile_needed(n, p) {
            out.push(Row::todo(
                &format!("scale {n}: steady state"),
                "—",
                &format!("open-file limit {nofile} (could not raise it to {want})"),
            ));
            continue;
        }
        let old = steady(n, p, window, version, true);
        let new = steady(n, p, window, version, false);
        out.push(steady_row(n, window, version, &new, &old));
    }
    out
}

/// One steady-state figure: cluster CPU (% of one core, the nodes summed),
/// status writes and JetStream API requests per second over the window.
#[derive(Debug, Default)]
struct Steady {
    cpu: f64,
    status_per_sec: f64,
    api_per_sec: f64,
    failure: Option<String>,
}

fn steady(
    n: usize,
    processes: usize,
    window: Duration,
    version: NatsVersion,
    agent_0_2: bool,
) -> Steady {
    let label = if agent_0_2 {
        "0.2 protocol"
    } else {
        "0.3 protocol"
    };
    eprintln!("bench: scale {n} steady state, {label}, nats-server {version:?}");
    let ids = device_ids(Generation::Two, n);
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let cluster = NatsCluster::start_fleet_with(
        version,
        &refs,
        &ClusterOptions {
            monitoring: true,
            max_connections: Some(n + 10_000),
            profiling: false,
            lame_duck: None,
            ..ClusterOptions::default()
        },
    );
    let nodes = cluster.node_count();
    let started = Instant::now();
    let fleet = start_fleet(&cluster, Generation::Two, ids, processes, |c| {
        c.start_rate = START_RATE;
        if agent_0_2 {
            c.speak_agent_0_2();
        }
    });
    if let Err(e) = fleet.wait_snapshots(started, SNAPSHOT_TIMEOUT) {
        return Steady {
            failure: Some(e),
            ..Steady::default()
        };
    }
    std::thread::sleep(SETTLE);
    let pids: Vec<u32> = (0..nodes).filter_map(|i| cluster.node_pid(i)).collect();
    let cpu0: Vec<_> = pids.iter().map(|p| procfs::cpu(*p)).collect();
    let api0 = api_total(&cluster);
    let (puts0, _) = fleet.status_puts();
    std::thread::sleep(window);
    let secs = window.as_secs_f64();
    let cpu = pids
        .iter()
        .zip(cpu0)
        .map(|(p, c0)| {
            let c = procfs::cpu(*p).since(c0);
            (c.own + c.children).as_secs_f64() / secs * 100.0
        })
        .sum();
    let s = Steady {
        cpu,
        status_per_sec: fleet.status_puts().0.saturating_sub(puts0) as f64 / secs,
        api_per_sec: api_total(&cluster).saturating_sub(api0) as f64 / secs,
        failure: None,
    };
    drop(fleet);
    s
}

fn steady_row(n: usize, window: Duration, version: NatsVersion, new: &Steady, old: &Steady) -> Row {
    let row = Row::new(format!(
        "scale {}: cluster CPU per device in steady state, agent 0.3's protocol against 0.2's (nats-server {})",
        thousands(n),
        match version {
            NatsVersion::V2_14 => "2.14",
            NatsVersion::V2_9 => "2.9",
        }
    ));
    if let Some(e) = new.failure.as_ref().or(old.failure.as_ref()) {
        return Row::todo(
            &row.figure,
            "≤ 0.2×",
            &format!("a fleet did not come up: {e}"),
        );
    }
    let per = |s: &Steady| s.cpu * 10.0 / n as f64; // % of a core → ms/s per device
    let ratio = new.cpu / old.cpu.max(1e-9);
    row.ours(format!("{:.4} ms/s", per(new)))
        .baseline(format!("{:.4} ms/s", per(old)))
        .ratio(format!("{ratio:.2}×"))
        .target("≤ 0.2× (a fifth)", Verdict::from_ok(ratio <= 0.2))
        .note(format!(
            "utime+stime of the three nodes over {} s after every device's snapshot and {} s more, per device (ms of CPU per second). 0.3: {:.1} % of one core, {:.1} status writes/s, {:.1} JetStream API requests/s; 0.2: {:.1} %, {:.1} writes/s, {:.1} requests/s (a heartbeat every 30 s, the check every 300 s, PINGs every 2 min; 0.3: a keep-alive an hour, the check every 6 h, PINGs every 200 s). The simulator speaks each (tests/fleetsim/tests/faithful.rs).",
            window.as_secs(),
            SETTLE.as_secs(),
            new.cpu,
            new.status_per_sec,
            new.api_per_sec,
            old.cpu,
            old.status_per_sec,
            old.api_per_sec
        ))
}

pub(crate) fn node_rss(cluster: &NatsCluster, i: usize) -> u64 {
    cluster.node_pid(i).map_or(0, procfs::rss)
}

/// Go's live heap right after a collection plus goroutine stacks, from
/// node `i`'s `/debug/pprof/heap?debug=1&gc=1` (its `runtime.MemStats`
/// lines `HeapAlloc` and `Stack`); 0 when unreadable.
pub(crate) fn node_live(cluster: &NatsCluster, i: usize) -> u64 {
    let Some(addr) = cluster.profile_addr(i) else {
        return 0;
    };
    let Ok(text) = http_get(addr, "/debug/pprof/heap?debug=1&gc=1") else {
        return 0;
    };
    let stat = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("# {name} = ")))
            .and_then(|v| v.split(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    stat("HeapAlloc") + stat("Stack")
}

/// The devices of `fleetctl status --json` rows not online, by state,
/// with why presence was unknown (each reason once, at most three): empty
/// when every device is online.
fn not_online(rows: &[serde_json::Value]) -> String {
    let mut by_state: std::collections::BTreeMap<String, usize> = Default::default();
    let mut why: std::collections::BTreeMap<String, usize> = Default::default();
    for r in rows.iter().filter(|r| r["connection"] != "online") {
        let state = r["connection"].as_str().unwrap_or("none").to_owned();
        *by_state.entry(state).or_default() += 1;
        if let Some(w) = r["connection-unknown"].as_str() {
            *why.entry(w.to_owned()).or_default() += 1;
        }
    }
    if by_state.is_empty() {
        return String::new();
    }
    let states: Vec<String> = by_state.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let mut out = format!("; not online: {}", states.join(", "));
    if !why.is_empty() {
        let reasons: Vec<String> = why
            .iter()
            .take(3)
            .map(|(w, n)| format!("{n} × \"{w}\""))
            .collect();
        out.push_str(&format!(" (unknown: {})", reasons.join("; ")));
    }
    out
}

/// The release `fleetctl status --json` and `fleetctl rollout` against
/// every node of `cluster`, with `n` devices live.
pub(crate) fn fleetctl_runs(cluster: &NatsCluster, n: usize) -> (FleetctlRun, FleetctlRun) {
    let dir = tempfile::Builder::new()
        .prefix("fleet-bench-scale-")
        .tempdir()
        .unwrap_or_else(|e| panic!("tempdir: {e}"));
    let password = dir.path().join("admin-password");
    std::fs::write(&password, format!("{NATS_ADMIN_PASSWORD}\n"))
        .unwrap_or_else(|e| panic!("writing the password file: {e}"));
    let urls = cluster.urls();
    let (out, took) = fleetctl_at(&urls, &password, &["status", "--json"]);
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    // Presence from the cluster: agents from 0.3 write their heartbeat
    // hourly, so its age says nothing of a device being there.
    let online = rows.iter().filter(|r| r["connection"] == "online").count();
    let unreadable = rows
        .iter()
        .filter(|r| r["unreadable"].as_array().is_some_and(|u| !u.is_empty()))
        .count();
    let status = FleetctlRun {
        took,
        summary: format!(
            "{} devices listed, {online} online (presence from the servers){}, {unreadable} with an unreadable value",
            rows.len(),
            not_online(&rows)
        ),
        ok: out.status.success() && rows.len() == n && online == n && unreadable == 0,
    };
    let release = dir.path().join("release.json");
    write_release(&release, ROLLOUT_VERSION);
    let release_arg = release.to_string_lossy().into_owned();
    let (out, took) = fleetctl_at(&urls, &password, &["rollout", "--release", &release_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = out.stdout.iter().filter(|b| **b == b'\n').count();
    let written = stderr.contains(&format!("{n} written"));
    let rollout = FleetctlRun {
        took,
        summary: format!(
            "exit {}, {lines} lines, {}",
            out.status.code().unwrap_or(-1),
            if written {
                format!("{n} intents written")
            } else {
                format!("not every intent written: {}", stderr.trim())
            }
        ),
        ok: out.status.success() && written && lines == n,
    };
    (status, rollout)
}

/// The sum over the live nodes of `/jsz` `api.total` (each node counts the
/// API requests it handled).
pub(crate) fn api_total(cluster: &NatsCluster) -> u64 {
    (0..cluster.node_count())
        .filter(|i| cluster.node_pid(*i).is_some())
        .filter_map(|i| cluster.monitor_addr(i))
        .filter_map(|a| http_json(a, "/jsz").ok())
        .map(|v| v["api"]["total"].as_u64().unwrap_or(0))
        .sum()
}

/// GET of a monitoring endpoint, its body as JSON.
pub(crate) fn http_json(addr: SocketAddr, path: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(&http_get(addr, path)?).map_err(|e| e.to_string())
}

/// GET of a monitoring or profiling endpoint (HTTP/1.0, the body read to EOF).
fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(HTTP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| e.to_string())?;
    let body = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| &buf[p + 4..])
        .ok_or("no HTTP body")?;
    Ok(String::from_utf8_lossy(body).into_owned())
}

pub(crate) fn kib(b: f64) -> String {
    format!("{:.0} KiB", b / 1024.0)
}

pub(crate) fn mib_list(v: &[u64]) -> String {
    v.iter()
        .map(|b| format!("{:.0}", *b as f64 / 1048576.0))
        .collect::<Vec<_>>()
        .join(" / ")
        + " MiB"
}

pub(crate) fn cpu_list(v: &[f64]) -> String {
    v.iter()
        .map(|c| format!("{c:.1}"))
        .collect::<Vec<_>>()
        .join(" / ")
        + " %"
}

fn rows(
    n: usize,
    window: Duration,
    version: NatsVersion,
    g1: Option<&Measured>,
    g2: &Measured,
) -> Vec<Row> {
    let label = match version {
        NatsVersion::V2_14 => format!("scale {}", thousands(n)),
        NatsVersion::V2_9 => format!("scale {} (nats-server 2.9)", thousands(n)),
    };
    if let Some(e) = &g2.failure {
        return vec![Row::todo(
            &format!("{label}: every figure"),
            "—",
            &format!("the run failed: {e}"),
        )];
    }
    // Generation 1 failing (it does past ~15,000 here) leaves the baseline
    // cells saying so; generation 2's figures stand.
    let base = |f: &dyn Fn(&Measured) -> String| match g1 {
        None => NOT_RUN.to_owned(),
        Some(g) => match &g.failure {
            Some(e) => format!("— (gen 1 failed: {})", short(e)),
            None => format!("{} (gen 1)", f(g)),
        },
    };
    let g1ok = g1.filter(|g| g.failure.is_none());
    let ratio = |f: &dyn Fn(&Measured) -> f64| match g1ok {
        Some(g) if f(g) > 0.0 => format!("{:.2}×", f(g2) / f(g)),
        _ => "—".to_owned(),
    };
    let rec = recovery_cell;
    let g1_note = |f: &dyn Fn(&Measured) -> String| g1ok.map(f).unwrap_or_default();
    let per2 = g2.rss_per_device(n);
    let live2 = g2.live_per_device(n);
    let fleetctl_cell = |r: &Option<FleetctlRun>| {
        r.as_ref().map_or("—".to_owned(), |r| {
            format!("{:.2} s", r.took.as_secs_f64())
        })
    };
    let fleetctl_secs = |r: &Option<FleetctlRun>| r.as_ref().map_or(0.0, |r| r.took.as_secs_f64());
    let fleetctl_ok = |r: &Option<FleetctlRun>| r.as_ref().is_some_and(|r| r.ok);
    let fleetctl_summary =
        |r: &Option<FleetctlRun>| r.as_ref().map_or(String::new(), |r| r.summary.clone());
    vec![
        Row::new(format!("{label}: server RSS per device (3 nodes, slope)"))
            .ours(kib(per2))
            .baseline(base(&|g| kib(g.rss_per_device(n))))
            .ratio(ratio(&|g| g.rss_per_device(n)))
            .target("≤ 100 KiB", Verdict::from_ok(per2 <= 100.0 * 1024.0))
            .note(format!(
                "Sum of the three nodes' RSS settled with {n} devices minus before any device, over N{}. Go's own accounting (live heap after a forced collection plus goroutine stacks, `/debug/pprof/heap?gc=1`) grew {} per device: what a device needs; the rest of RSS is garbage the collector had not reclaimed yet (GOGC 100 lets the heap reach twice the live set){}. Per node before → settled: gen 2 {} → {}{}. Devices start at {START_RATE}/s; first snapshots p50/p99/max gen 2 {}{} from the first start{}.",
                gomemlimit_note(),
                kib(live2),
                g1_note(&|g| format!("; gen 1: {}", kib(g.live_per_device(n)))),
                mib_list(&g2.rss_before),
                mib_list(&g2.rss_settled),
                g1_note(&|g| format!("; gen 1 {} → {}", mib_list(&g.rss_before), mib_list(&g.rss_settled))),
                g2.snapshots.cell(),
                g1_note(&|g| format!(", gen 1 {}", g.snapshots.cell())),
                if g2.processes > 1 {
                    format!("; the devices simulated in {} worker processes", g2.processes)
                } else {
                    String::new()
                },
            )),
        Row::new(format!("{label}: server CPU settled (n0 / n1 / n2)"))
            .ours(cpu_list(&g2.cpu_settled))
            .baseline(base(&|g| cpu_list(&g.cpu_settled)))
            .ratio(ratio(&|g| g.cpu_settled.iter().sum()))
            .target("—", Verdict::Info)
            .note(format!(
                "utime+stime of each node over {} s of steady state (heartbeats only), % of one core. Heartbeat cost: {:.0} status writes/s (R3, acked) for gen 2; the whole cluster then spends {:.0} µs of CPU per write{}.",
                window.as_secs(),
                g2.status_per_sec,
                per_write_us(g2),
                g1_note(&|g| format!(" (gen 1: {:.0} writes/s, the consumers' idle heartbeats on top)", g.status_per_sec)),
            )),
        Row::new(format!("{label}: JetStream API requests/s, steady state"))
            .ours(format!("{:.1}", g2.api_per_sec))
            .baseline(base(&|g| format!("{:.1}", g.api_per_sec)))
            .ratio("—")
            .target("0 from devices", Verdict::from_ok(g2.device_api_per_sec == 0.0))
            .note(format!(
                "`/jsz` `api.total` deltas summed over the nodes over the window (devices are the only clients); the devices themselves sent {:.1}/s (gen 2, backstop re-reads every 300 s ± 20% included){}.",
                g2.device_api_per_sec,
                g1_note(&|g| format!(" and {:.1}/s (gen 1: consumer re-creates)", g.device_api_per_sec)),
            )),
        Row::new(format!("{label}: fan-out, one change per device, p50 / p99 / max"))
            .ours(g2.fan_out.each.cell())
            .baseline(base(&|g| g.fan_out.each.cell()))
            .ratio(match g1ok {
                Some(g) => format!(
                    "{:.2}× (p99)",
                    g2.fan_out.each.p99.as_secs_f64() / g.fan_out.each.p99.as_secs_f64().max(1e-9)
                ),
                None => "—".to_owned(),
            })
            .target("p99 < 1 s", Verdict::from_ok(g2.fan_out.each.p99 < Duration::from_secs(1)))
            .note(format!(
                "{n} pipelined admin puts (fleetctl's way, 1,024 in flight; gen 2 by compare-and-set), one per device; per device from its own put being sent to the device applying the value. The whole fleet, from the first put: gen 2 {}{}; the puts alone were acknowledged in {:.2} s (gen 2){}.",
                g2.fan_out.whole.cell(),
                g1_note(&|g| format!(", gen 1 {}", g.fan_out.whole.cell())),
                g2.fan_out.acked.as_secs_f64(),
                g1_note(&|g| format!(" and {:.2} s (gen 1)", g.fan_out.acked.as_secs_f64())),
            )),
        Row::new(format!("{label}: `fleetctl status --json` over the live fleet"))
            .ours(fleetctl_cell(&g2.status))
            .baseline(base(&|g| fleetctl_cell(&g.status)))
            .ratio(ratio(&|g| fleetctl_secs(&g.status)))
            .target("every device listed, online", Verdict::from_ok(fleetctl_ok(&g2.status)))
            .note(format!(
                "The release fleetctl against the three nodes, spawn to exit, while the {n} devices heartbeat: gen 2: {}{}.",
                fleetctl_summary(&g2.status),
                g1_note(&|g| format!("; gen 1: {}", fleetctl_summary(&g.status))),
            )),
        Row::new(format!("{label}: `fleetctl rollout` over the live fleet"))
            .ours(fleetctl_cell(&g2.rollout))
            .baseline(base(&|g| fleetctl_cell(&g.rollout)))
            .ratio(ratio(&|g| fleetctl_secs(&g.rollout)))
            .target("every intent written", Verdict::from_ok(fleetctl_ok(&g2.rollout)))
            .note(format!(
                "`fleetctl rollout --release` of {ROLLOUT_VERSION} to every device (reads each device's info, upgrade status and intent, writes {n} compare-and-set intents pipelined), spawn to exit: gen 2: {}{}.",
                fleetctl_summary(&g2.rollout),
                g1_note(&|g| format!("; gen 1: {}", fleetctl_summary(&g.rollout))),
            )),
        Row::new(format!("{label}: rolling restart (lame duck), outages p50 / p99 / max"))
            .ours(rolling_cell(g2))
            .baseline(base(&rolling_cell))
            .ratio("—")
            .target(
                "every outage ≤ 10 s, none lost",
                Verdict::from_ok(
                    g2.rolling_failure.is_none()
                        && g2.rolling.never == 0
                        && g2.rolling.spread.max <= Duration::from_secs(10)
                        && g2.rolling.affected > 0,
                ),
            )
            .note(format!(
                "After the killed node was started again: n0, n1, n2 each put in lame-duck mode (SIGUSR2; `lame_duck_duration` {} s, grace {} s: no new clients, its clients closed over the duration), restarted with the same store, and every bucket replica current again before the next (bound {} s; gen 2 took: {}); the whole took {:.0} s (gen 2){}. Affected = devices that lost sync during it (some more than once, as their next node also restarts); the spread is over every outage, from the loss to a complete snapshot again. Bound {} s after the last node.{}{}",
                LAME_DUCK.0.as_secs(),
                LAME_DUCK.1.as_secs(),
                catch_up_bound(n).as_secs(),
                catch_up_list(&g2.catch_ups),
                g2.rolling_took.as_secs_f64(),
                g1_note(&|g| if g.rolling_failure.is_none() {
                    format!(", {:.0} s (gen 1)", g.rolling_took.as_secs_f64())
                } else {
                    String::new()
                }),
                RECOVERY_TIMEOUT.as_secs(),
                g2.rolling
                    .first_never
                    .as_ref()
                    .map(|s| format!(" First gen-2 device not back: {s}."))
                    .unwrap_or_default(),
                g2.rolling_failure
                    .as_ref()
                    .map(|e| format!(" Not done (gen 2): {e}."))
                    .unwrap_or_default(),
            ) + &if g2.step_downs.is_empty() {
                String::new()
            } else {
                format!(
                    " A replica stayed behind (gen 2) and a step-down of its stream's leader resumed it: {}.",
                    g2.step_downs.join("; ")
                )
            }),
        Row::new(format!("{label}: `kill -9` of a node, recovery p50 / p99 / max"))
            .ours(rec(&g2.recovery))
            .baseline(base(&|g| rec(&g.recovery)))
            .ratio("—")
            .target(
                "every affected device back ≤ 10 s, none lost",
                Verdict::from_ok(
                    g2.recovery.never == 0
                        && g2.recovery.spread.max <= Duration::from_secs(10)
                        && g2.recovery.affected > 0,
                ),
            )
            .note(format!(
                "The node with the most connections (gen 2: n{} with {}{}) SIGKILLed; affected = devices that lost sync after it (their connection, or a generation-1 consumer living on the dead node); recovered = a complete snapshot again (both keys read). Bound {} s.{}",
                g2.victim,
                g2.victim_conns,
                g1_note(&|g| format!("; gen 1: n{} with {}", g.victim, g.victim_conns)),
                RECOVERY_TIMEOUT.as_secs(),
                g1_note(&|g| g
                    .recovery
                    .first_never
                    .as_ref()
                    .map(|s| format!(" First gen-1 device never back: {s}."))
                    .unwrap_or_default()),
            )),
    ]
}

/// The nodes inherit the bench's environment: a `GOMEMLIMIT` there caps
/// each node's Go memory (the collector runs more often instead of the
/// node growing), which the RSS figures must say.
pub(crate) fn gomemlimit_note() -> String {
    match std::env::var("GOMEMLIMIT") {
        Ok(v) if !v.is_empty() => format!(
            " (each node run with GOMEMLIMIT={v}: the collector keeps its memory near that)"
        ),
        _ => String::new(),
    }
}

/// `killed n1 34 s, n0 12 s, ...`: each restarted node's catch-up.
pub(crate) fn catch_up_list(v: &[(String, Duration)]) -> String {
    if v.is_empty() {
        return "none restarted".to_owned();
    }
    v.iter()
        .map(|(node, took)| format!("{node} {:.0} s", took.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rolling restart's cell: its outages, or why it was not done.
fn rolling_cell(m: &Measured) -> String {
    match &m.rolling_failure {
        Some(e) => format!("not done: {}", short(e)),
        None => recovery_cell(&m.rolling),
    }
}

/// `3,334 affected, 1.66 / 2.95 / 2.95 s, 0 never, 0 errors`.
pub(crate) fn recovery_cell(r: &Recovery) -> String {
    format!(
        "{} affected, {}, {} never, {} errors",
        thousands(r.affected),
        r.spread.cell(),
        r.never,
        r.errors
    )
}

/// The first line of an error, at most 120 characters, for a table cell.
pub(crate) fn short(e: &str) -> String {
    let line = e.lines().next().unwrap_or("");
    if line.chars().count() > 120 {
        line.chars().take(119).collect::<String>() + "…"
    } else {
        line.to_owned()
    }
}

/// Cluster CPU per status write in the window, µs.
fn per_write_us(m: &Measured) -> f64 {
    let cpu: f64 = m.cpu_settled.iter().sum::<f64>() / 100.0; // cores
    if m.status_per_sec > 0.0 {
        cpu / m.status_per_sec * 1e6
    } else {
        0.0
    }
}

pub(crate) fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_splits_past_18000_devices_a_process() {
        assert_eq!(Processes::Auto.for_devices(1_000), 1);
        assert_eq!(Processes::Auto.for_devices(18_000), 1);
        assert_eq!(Processes::Auto.for_devices(18_001), 2);
        assert_eq!(Processes::Auto.for_devices(100_000), 6);
        assert_eq!(Processes::Fixed(4).for_devices(10_000), 4);
        assert_eq!(Processes::Fixed(4).for_devices(2), 2);
    }

    #[test]
    fn catch_up_is_bounded_by_the_fleet_size() {
        assert_eq!(catch_up_bound(10_000), NODE_RESTART_TIMEOUT);
        assert_eq!(catch_up_bound(36_000), Duration::from_secs(360));
        assert_eq!(
            catch_up_list(&[("killed n1".to_owned(), Duration::from_millis(33_600))]),
            "killed n1 34 s"
        );
    }

    #[test]
    fn devices_not_online_are_counted_by_state_with_the_reasons() {
        let rows = vec![
            serde_json::json!({"connection": "online"}),
            serde_json::json!({"connection": "unknown", "connection-unknown": "server leaf-3 did not answer"}),
            serde_json::json!({"connection": "unknown", "connection-unknown": "server leaf-3 did not answer"}),
            serde_json::json!({"connection": "offline"}),
        ];
        assert_eq!(
            not_online(&rows),
            "; not online: 1 offline, 2 unknown (unknown: 2 × \"server leaf-3 did not answer\")"
        );
        assert_eq!(not_online(&rows[..1]), "");
    }
}
