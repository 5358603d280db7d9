//! Fleet scale on leaf nodes (`--only scale-leaf`, not in the default
//! section list): N simulated generation-2 devices on K leaf nodes
//! (nats-server 2.14 without JetStream, the devices' users, bound to the
//! hub) of a 3-node hub cluster with R3 buckets, the devices split over
//! worker processes, device i starting on leaf i % K and moving to
//! another leaf at random when it loses its own (the agent's NATS client
//! shuffles its servers).
//!
//! Measured: RSS before any device and settled with N, over the hub nodes
//! and the leaves (summed: RSS per device; the hub nodes' Go live heap
//! too), each part's memory (hub nodes, leaves, the simulator's workers),
//! CPU settled over a window, the devices' JetStream API requests in it, a
//! fan-out of one change per device; `kill -9` of the leaf holding the
//! most devices (every device it held back with a complete snapshot on
//! the other leaves); then `kill -9` of the hub node with the most leaf
//! connections (the leaves relink to the other nodes; a device should
//! not lose sync) and a fan-out once every bucket has a leader again.
//! Before the kills, the release `fleetctl status --json` and `fleetctl
//! rollout` over the live fleet, timed; after them, with the killed leaf
//! and node back, a rolling restart of every leaf in lame-duck mode.
//!
//! With `--scale-leaf-callout`, the same on the callout layout
//! (docs/design/enrollment.md): the hub runs two `fleet-auth-callout`s
//! with enrollment and no identity provider, the leaves carry no device
//! users (their clients go to the hub's callouts), and every device is
//! preauthorized in `fleet-registry` with its own key and logs in with it
//! (`SimAuth::Enrollment`): each connection, the leaf kill's reconnects
//! included, is decided by a callout reading the registry.

use std::time::{Duration, Instant};

use fleet_harness::{CalloutCluster, ClusterOptions, Idp, NatsCluster, NatsLeaf, NatsVersion};
use fleet_sim::scenario::{device_ids, FanOut, Fleet, Recovery, Simulator};
use fleet_sim::{Generation, SimAuth};

use crate::procfs;
use crate::report::{Row, Verdict};
use crate::scale::{
    api_total, catch_up_bound, cpu_list, fleetctl_runs, gomemlimit_note, http_json, kib, mib_list,
    node_live, node_rss, recovery_cell, short, thousands, FleetctlRun, Processes,
    DEVICES_PER_PROCESS, FAN_OUT_TIMEOUT, LAME_DUCK, NODE_RESTART_TIMEOUT, RECOVERY_TIMEOUT,
    SETTLE, SNAPSHOT_TIMEOUT,
};

/// Bound on the buckets' new leaders after the hub node's kill.
const LEADERS_TIMEOUT: Duration = Duration::from_secs(60);
/// Most devices one leaf may hold, under the 20,000 open files a process
/// may have here (a leaf inherits the bench's limit), with room for its
/// links and files.
const DEVICES_PER_LEAF: usize = 19_000;

/// What one run measured.
#[derive(Debug, Default)]
struct Measured {
    hub_rss_before: Vec<u64>,
    hub_rss_settled: Vec<u64>,
    leaf_rss_before: Vec<u64>,
    leaf_rss_settled: Vec<u64>,
    hub_live_before: Vec<u64>,
    hub_live_settled: Vec<u64>,
    sim_rss: u64,
    /// The callouts' RSS settled (the callout layout only).
    callout_rss: Vec<u64>,
    /// From the first registry write to the last ack (the callout layout).
    preauthorized_in: Option<Duration>,
    hub_cpu: Vec<f64>,
    leaf_cpu: Vec<f64>,
    api_per_sec: f64,
    device_api_per_sec: f64,
    snapshots: fleet_sim::scenario::Spread,
    /// Devices per leaf with every snapshot read, and the errors of the
    /// start (most frequent last errors first).
    per_leaf_start: Vec<usize>,
    start_errors: (u64, Vec<(String, usize)>),
    fan_out: FanOut,
    per_leaf: Vec<usize>,
    victim_leaf: usize,
    leaf_recovery: Recovery,
    /// The affected devices' last errors after the leaf kill, most
    /// frequent first.
    leaf_errors: Vec<(String, usize)>,
    /// The surviving leaves' warnings and errors logged so far (start and
    /// the leaf kill), most frequent first.
    leaf_log: Vec<(String, usize)>,
    /// What the leaves and the other hub nodes logged from the hub node's
    /// kill to the end of the fan-out after it.
    node_log: Vec<(String, usize)>,
    victim_node: usize,
    node_leafs: Vec<u64>,
    /// From the hub node's kill to every bucket led again.
    leaders_after: Duration,
    /// Devices that lost sync, and errors counted, after the hub node's
    /// kill (until the fan-out after it was applied).
    node_lost_sync: usize,
    node_errors: u64,
    node_fan_out: Option<FanOut>,
    node_failure: Option<String>,
    status: Option<FleetctlRun>,
    rollout: Option<FleetctlRun>,
    /// The rolling lame-duck restart of the leaves, after the killed leaf
    /// and hub node were started again.
    rolling: Recovery,
    rolling_took: Duration,
    /// How long the killed hub node's replicas took to be current again.
    hub_catch_up: Option<Duration>,
    rolling_failure: Option<String>,
    failure: Option<String>,
}

/// The rows of one run of `n` devices on `leaves` leaves.
pub fn leaf_rows(
    n: usize,
    leaves: usize,
    rate: u32,
    window: Duration,
    processes: Processes,
    callout: bool,
) -> Vec<Row> {
    let label = format!(
        "scale-leaf {} on {leaves} leaves{}",
        thousands(n),
        if callout { " (callout)" } else { "" }
    );
    if leaves < 2 {
        return vec![Row::todo(
            &format!("{label}: every figure"),
            "—",
            "a leaf kill needs a second leaf to move to: --leaves 2 or more",
        )];
    }
    // After a leaf's kill the others share its devices; a tenth more for
    // the spread of a random choice and of the start.
    let busiest = busiest_after_leaf_kill(n, leaves);
    if busiest > DEVICES_PER_LEAF {
        return vec![Row::todo(
            &format!("{label}: every figure"),
            "—",
            &format!(
                "after a leaf kill one leaf would hold {busiest} devices, past {DEVICES_PER_LEAF} (the open-file limit of a process): more --leaves"
            ),
        )];
    }
    let p = match processes {
        Processes::Auto => n.div_ceil(DEVICES_PER_PROCESS).max(2),
        Processes::Fixed(p) => p.clamp(1, n.max(1)),
    };
    let want = (busiest as u64 + 1_000).max(20_000);
    let nofile = fleet_sim::raise_nofile(want);
    if nofile < busiest as u64 + 1_000 {
        return vec![Row::todo(
            &format!("{label}: every figure"),
            "—",
            &format!("open-file limit {nofile} (could not raise it to {want})"),
        )];
    }
    let m = measure(n, leaves, rate, p, window, callout);
    rows(&label, n, leaves, rate, p, window, &m)
}

/// The devices the busiest surviving leaf may hold after a leaf's kill:
/// its own share and a (K − 1)th of the dead leaf's, a tenth more for the
/// random spread.
fn busiest_after_leaf_kill(n: usize, leaves: usize) -> usize {
    let share = n.div_ceil(leaves);
    let taken = share.div_ceil(leaves.saturating_sub(1).max(1));
    (share + taken) * 11 / 10
}

/// The enrollment token of the callout layout's devices.
const ENROLLMENT_TOKEN: &str = "fleet-bench-scale-leaf-token";
/// Callout instances of the callout layout (one queue group).
const CALLOUTS: usize = 2;

fn measure(
    n: usize,
    k: usize,
    rate: u32,
    processes: usize,
    window: Duration,
    callout: bool,
) -> Measured {
    eprintln!(
        "bench: scale-leaf {n} devices, {k} leaves, {processes} simulator processes{}",
        if callout { ", callout layout" } else { "" }
    );
    let v = NatsVersion::V2_14;
    let ids = device_ids(Generation::Two, n);
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    // The devices log in at the leaves, which check their users (or hand
    // them to the hub's callouts); the hub sees only the leaves' links, so
    // it carries no device users (each costs a node ~14 KiB before
    // anything connects: docs/bench/scale.md).
    let options = ClusterOptions {
        monitoring: true,
        max_connections: Some(n + 10_000),
        profiling: true,
        leafnodes: true,
        ..ClusterOptions::default()
    };
    let token_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let (mut static_hub, mut callout_hub, _idp) = if callout {
        let idp = Idp::start();
        let token = token_dir.path().join("enrollment-token");
        write_private(&token, &format!("{ENROLLMENT_TOKEN}\n"));
        // Enrollment alone: no identity provider in the callouts' config.
        let mut extra = serde_json::json!({ "enrollment": { "token_files": [token] } });
        for key in ["issuer", "audience", "jwks_url", "https_ca_file"] {
            extra[key] = serde_json::Value::Null;
        }
        let hub = CalloutCluster::start(&idp, extra, CALLOUTS, options);
        (None, Some(hub), Some(idp))
    } else {
        (
            Some(NatsCluster::start_fleet_with(v, &[], &options)),
            None,
            None,
        )
    };
    let callout_pids: Vec<u32> = callout_hub
        .as_ref()
        .map(|h| h.callouts.iter().map(|c| c.pid()).collect())
        .unwrap_or_default();
    let issuer = callout_hub.as_ref().map(|h| h.issuer.clone());
    let cluster: &mut NatsCluster = match (&mut static_hub, &mut callout_hub) {
        (Some(c), _) => c,
        (None, Some(h)) => &mut h.cluster,
        (None, None) => unreachable!("one of the two hubs is started"),
    };
    let hubs = cluster.leafnode_hubs();
    let mut leaves: Vec<NatsLeaf> = (1..=k)
        .map(|i| {
            let name = format!("leaf-{i}");
            match &issuer {
                Some(issuer) => NatsLeaf::start_callout_on(&name, &hubs, issuer, Some(LAME_DUCK)),
                None => NatsLeaf::start_with_lame_duck(v, &name, &hubs, &refs, LAME_DUCK),
            }
        })
        .collect();
    let nodes = cluster.node_count();
    let leaf_rss = |leaves: &[NatsLeaf]| -> Vec<u64> {
        leaves
            .iter()
            .map(|l| l.pid().map_or(0, procfs::rss))
            .collect()
    };
    let mut m = Measured {
        hub_rss_before: (0..nodes).map(|i| node_rss(cluster, i)).collect(),
        hub_live_before: (0..nodes).map(|i| node_live(cluster, i)).collect(),
        leaf_rss_before: leaf_rss(&leaves),
        ..Measured::default()
    };
    if callout {
        let at = Instant::now();
        let admin = cluster.admin();
        if let Err(e) = fleet_sim::admin::preauthorize_all(&admin, &ids) {
            m.failure = Some(format!("preauthorizing the devices: {e}"));
            return m;
        }
        m.preauthorized_in = Some(at.elapsed());
    }
    let servers = leaves.iter().map(NatsLeaf::client_addr).collect();
    let started = Instant::now();
    let mut fleet = Fleet::start_processes_on(servers, Generation::Two, ids, processes, |c| {
        c.start_rate = rate;
        if callout {
            c.auth = SimAuth::Enrollment {
                token: ENROLLMENT_TOKEN.to_owned(),
            };
        }
    });
    match fleet.wait_snapshots(started, SNAPSHOT_TIMEOUT) {
        Ok(s) => m.snapshots = s,
        Err(e) => {
            m.failure = Some(e);
            return m;
        }
    }
    m.per_leaf_start = fleet.per_node(k);
    m.start_errors = (fleet.errors_after_mark(), fleet.last_errors_after_mark());
    std::thread::sleep(SETTLE);
    // Steady state.
    let hub_pids: Vec<u32> = (0..nodes).filter_map(|i| cluster.node_pid(i)).collect();
    let leaf_pids: Vec<u32> = leaves.iter().filter_map(NatsLeaf::pid).collect();
    let hub0: Vec<_> = hub_pids.iter().map(|p| procfs::cpu(*p)).collect();
    let leaf0: Vec<_> = leaf_pids.iter().map(|p| procfs::cpu(*p)).collect();
    let api0 = api_total(cluster);
    let dev_api0 = fleet.api_requests();
    std::thread::sleep(window);
    let secs = window.as_secs_f64();
    let pct = |pids: &[u32], before: Vec<procfs::CpuTime>| -> Vec<f64> {
        pids.iter()
            .zip(before)
            .map(|(p, c0)| {
                let c = procfs::cpu(*p).since(c0);
                (c.own + c.children).as_secs_f64() / secs * 100.0
            })
            .collect()
    };
    m.hub_cpu = pct(&hub_pids, hub0);
    m.leaf_cpu = pct(&leaf_pids, leaf0);
    m.api_per_sec = api_total(cluster).saturating_sub(api0) as f64 / secs;
    m.device_api_per_sec = fleet.api_requests().saturating_sub(dev_api0) as f64 / secs;
    m.hub_rss_settled = (0..nodes).map(|i| node_rss(cluster, i)).collect();
    m.hub_live_settled = (0..nodes).map(|i| node_live(cluster, i)).collect();
    m.leaf_rss_settled = leaf_rss(&leaves);
    m.callout_rss = callout_pids.iter().map(|p| procfs::rss(*p)).collect();
    m.sim_rss = match &fleet.sim {
        Simulator::Processes(multi) => multi.workers().iter().map(|(p, _)| procfs::rss(*p)).sum(),
        Simulator::One(_) => procfs::rss(std::process::id()),
    };
    // Fan-out through the leaves.
    let admin = cluster.admin();
    match fleet.fan_out(&admin, "scale-leaf-1", FAN_OUT_TIMEOUT) {
        Ok(f) => m.fan_out = f,
        Err(e) => {
            m.failure = Some(e);
            return m;
        }
    }
    drop(admin);
    // The operator's commands over the live fleet, through the hub.
    let (status, rollout) = fleetctl_runs(cluster, n);
    m.status = Some(status);
    m.rollout = Some(rollout);
    // A leaf's loss.
    m.per_leaf = fleet.per_node(k);
    m.victim_leaf = (0..k).max_by_key(|i| m.per_leaf[*i]).unwrap_or(0);
    fleet.mark_errors();
    let at = Instant::now();
    leaves[m.victim_leaf].kill();
    m.leaf_recovery =
        fleet.recovery_of_connections(at, m.per_leaf[m.victim_leaf], RECOVERY_TIMEOUT);
    m.leaf_errors = fleet.last_errors_after_mark();
    m.leaf_log = log_warnings(leaves.iter().map(NatsLeaf::log));
    // A hub JetStream node's loss: the one most leaf connections reach.
    m.node_leafs = (0..nodes)
        .map(|i| {
            cluster
                .monitor_addr(i)
                .and_then(|a| http_json(a, "/leafz").ok())
                .and_then(|v| v["leafnodes"].as_u64())
                .unwrap_or(0)
        })
        .collect();
    m.victim_node = (0..nodes).max_by_key(|i| m.node_leafs[*i]).unwrap_or(0);
    fleet.mark_errors();
    let at = Instant::now();
    let lost_before = lost_sync_since(&fleet, at);
    let logs_before = node_kill_logs(cluster, &leaves, m.victim_node);
    cluster.kill_node(m.victim_node);
    // Panics naming the stream when a bucket has no leader in time.
    cluster.wait_for_leaders(LEADERS_TIMEOUT);
    m.leaders_after = at.elapsed();
    let admin = cluster.admin();
    match fleet.fan_out(&admin, "scale-leaf-2", FAN_OUT_TIMEOUT) {
        Ok(f) => m.node_fan_out = Some(f),
        Err(e) => {
            eprintln!("bench: scale-leaf {n}: the fan-out after the hub node's kill: {e}");
            m.node_failure = Some(e);
        }
    }
    drop(admin);
    m.node_lost_sync = lost_sync_since(&fleet, at).saturating_sub(lost_before);
    m.node_errors = fleet.errors_after_mark();
    m.node_log = log_warnings(
        node_kill_logs(cluster, &leaves, m.victim_node)
            .into_iter()
            .zip(logs_before)
            .map(|(now, before)| now.get(before.len()..).unwrap_or_default().to_owned()),
    );
    // The killed leaf and hub node back, then every leaf restarted in
    // lame-duck mode, one after the other.
    if let Err(e) = leaves[m.victim_leaf].restart_lame_duck(NODE_RESTART_TIMEOUT) {
        m.rolling_failure = Some(format!("restarting the killed leaf: {e}"));
        return m;
    }
    match cluster.restart_node_lame_duck_within(
        m.victim_node,
        NODE_RESTART_TIMEOUT,
        catch_up_bound(n),
    ) {
        Ok(took) => m.hub_catch_up = Some(took),
        Err(e) => {
            m.rolling_failure = Some(format!("restarting the killed hub node: {e}"));
            return m;
        }
    }
    fleet.mark_errors();
    let from = Instant::now();
    for leaf in &mut leaves {
        eprintln!(
            "bench: scale-leaf {n}: lame-duck restart of {}",
            leaf.name()
        );
        if let Err(e) = leaf.restart_lame_duck(NODE_RESTART_TIMEOUT) {
            m.rolling_failure = Some(e);
            return m;
        }
    }
    let until = Instant::now();
    m.rolling_took = until - from;
    m.rolling = fleet.outages(from, until, RECOVERY_TIMEOUT);
    drop(fleet);
    m
}

/// Writes `text` to `path`, mode 0600 (the callout refuses a token file
/// others may read).
fn write_private(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// `3 × "connecting to …", 1 × "…"`: the three most frequent.
fn error_list(v: &[(String, usize)]) -> String {
    if v.is_empty() {
        return "none".to_owned();
    }
    v.iter()
        .take(3)
        .map(|(e, c)| format!("{c} × {e:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `[WRN]`, `[ERR]` and slow-consumer lines of some nats-server logs, each without
/// its time stamp, client id and address (digits folded to `N`), counted.
fn log_warnings(logs: impl Iterator<Item = String>) -> Vec<(String, usize)> {
    let mut tally: std::collections::BTreeMap<String, usize> = Default::default();
    for log in logs {
        for line in log.lines() {
            let Some(at) = line
                .find("[WRN]")
                .or_else(|| line.find("[ERR]"))
                .or_else(|| line.find("Slow Consumer").and_then(|_| line.find("[INF]")))
            else {
                continue;
            };
            let mut folded = String::new();
            for c in line[at..].chars() {
                if c.is_ascii_digit() {
                    if !folded.ends_with('N') {
                        folded.push('N');
                    }
                } else {
                    folded.push(c);
                }
            }
            *tally.entry(folded).or_default() += 1;
        }
    }
    let mut v: Vec<(String, usize)> = tally.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// The logs a hub node's loss shows in: every leaf's and the other hub
/// nodes', in that order.
fn node_kill_logs(cluster: &NatsCluster, leaves: &[NatsLeaf], victim: usize) -> Vec<String> {
    leaves
        .iter()
        .map(NatsLeaf::log)
        .chain(
            (0..cluster.node_count())
                .filter(|i| *i != victim)
                .map(|i| cluster.node_log(i)),
        )
        .collect()
}

/// Devices that lost sync at or after `at`.
fn lost_sync_since(fleet: &Fleet, at: Instant) -> usize {
    fleet
        .sim
        .records()
        .map(|r| {
            r.iter()
                .filter(|d| d.lost_sync.iter().any(|t| *t >= at))
                .count()
        })
        .unwrap_or(0)
}

fn sum(v: &[u64]) -> u64 {
    v.iter().sum()
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / 1048576.0)
}

/// The callout layout's own figures, for the memory row's note.
fn callout_note(m: &Measured) -> String {
    if m.callout_rss.is_empty() {
        return String::new();
    }
    format!(
        " Callout layout: the {} fleet-auth-callout instances {} (not in the parts above); the {} devices' approved records written in {:.1} s before the start.",
        m.callout_rss.len(),
        mib_list(&m.callout_rss),
        thousands(m.per_leaf_start.iter().sum()),
        m.preauthorized_in.unwrap_or_default().as_secs_f64(),
    )
}

fn rows(
    label: &str,
    n: usize,
    k: usize,
    rate: u32,
    processes: usize,
    window: Duration,
    m: &Measured,
) -> Vec<Row> {
    if let Some(e) = &m.failure {
        return vec![Row::todo(
            &format!("{label}: every figure"),
            "—",
            &format!("the run failed: {e}"),
        )];
    }
    let grew = |before: &[u64], after: &[u64]| sum(after).saturating_sub(sum(before));
    let hub_grew = grew(&m.hub_rss_before, &m.hub_rss_settled);
    let leaf_grew = grew(&m.leaf_rss_before, &m.leaf_rss_settled);
    let per = (hub_grew + leaf_grew) as f64 / n as f64;
    let live = grew(&m.hub_live_before, &m.hub_live_settled) as f64 / n as f64;
    let r = &m.leaf_recovery;
    let leaf_ok = r.never == 0
        && r.affected == m.per_leaf.get(m.victim_leaf).copied().unwrap_or(0)
        && r.spread.max <= Duration::from_secs(10);
    let mut out = vec![
        Row::new(format!("{label}: RSS per device (3 hub nodes + {k} leaves)"))
            .ours(kib(per))
            .baseline("—")
            .ratio("—")
            .target("≤ 100 KiB", Verdict::from_ok(per <= 100.0 * 1024.0))
            .note(format!(
                "RSS settled with {n} devices minus before any device, summed over the hub nodes ({} per device) and the leaves ({} per device){}, over N. The hub nodes' Go live heap after a collection plus stacks grew {} per device (the leaves serve no profiling port). Hub per node before → settled {} → {}; leaves {} → {}. Devices start at {rate}/s; first snapshots p50/p99/max {} from the first start, devices per leaf then {:?} (device i starts on leaf i % {k}, a failed attempt moves it to another at random), {} errors counted in the start ({}); simulated in {processes} worker processes.",
                kib(hub_grew as f64 / n as f64),
                kib(leaf_grew as f64 / n as f64),
                gomemlimit_note(),
                kib(live),
                mib_list(&m.hub_rss_before),
                mib_list(&m.hub_rss_settled),
                mib_list(&m.leaf_rss_before),
                mib_list(&m.leaf_rss_settled),
                m.snapshots.cell(),
                m.per_leaf_start,
                m.start_errors.0,
                error_list(&m.start_errors.1),
            )),
        Row::new(format!("{label}: memory by part (hub nodes / leaves / simulator)"))
            .ours(format!(
                "{} / {} / {}",
                mib(sum(&m.hub_rss_settled)),
                mib(sum(&m.leaf_rss_settled)),
                mib(m.sim_rss)
            ))
            .baseline("—")
            .ratio("—")
            .target("—", Verdict::Info)
            .note(format!(
                "RSS in steady state: the 3 hub nodes summed, the {k} leaves summed, the {processes} fleet-sim-worker processes summed ({} per simulated device).{}",
                kib(m.sim_rss as f64 / n as f64),
                callout_note(m),
            )),
        Row::new(format!("{label}: CPU settled (hub n0 / n1 / n2; leaves)"))
            .ours(format!("{}; {}", cpu_list(&m.hub_cpu), cpu_list(&m.leaf_cpu)))
            .baseline("—")
            .ratio("—")
            .target("—", Verdict::Info)
            .note(format!(
                "utime+stime over {} s of steady state, after every snapshot and {} s more, % of one core.",
                window.as_secs(),
                SETTLE.as_secs()
            )),
        Row::new(format!("{label}: JetStream API requests/s, steady state"))
            .ours(format!("{:.1}", m.api_per_sec))
            .baseline("—")
            .ratio("—")
            .target("0 from devices", Verdict::from_ok(m.device_api_per_sec == 0.0))
            .note(format!(
                "`/jsz` `api.total` deltas summed over the hub nodes over the window; the devices themselves sent {:.1}/s.",
                m.device_api_per_sec
            )),
        Row::new(format!("{label}: fan-out through the leaves, one change per device, p50 / p99 / max"))
            .ours(m.fan_out.each.cell())
            .baseline("—")
            .ratio("—")
            .target("p99 < 1 s", Verdict::from_ok(m.fan_out.each.p99 < Duration::from_secs(1)))
            .note(format!(
                "{n} pipelined admin puts (compare-and-set) to the hub, one per device; per device from its own put being sent to the device applying the republished value through its leaf. The whole fleet from the first put: {}; the puts were acknowledged in {:.2} s.",
                m.fan_out.whole.cell(),
                m.fan_out.acked.as_secs_f64()
            )),
        Row::new(format!("{label}: `kill -9` of a leaf, recovery p50 / p99 / max"))
            .ours(recovery_cell(r))
            .baseline("—")
            .ratio("—")
            .target("every device of the leaf back ≤ 10 s, none lost", Verdict::from_ok(leaf_ok))
            .note(format!(
                "leaf-{} (devices per leaf {:?}) SIGKILLed; its devices reconnect to the other leaves (each to one at random, as the agent's NATS client does; on a failed attempt another, the agent's backoff between) and read both keys again (Direct Get through it); recovered = a complete snapshot again, timed from the kill. Bound {} s. The devices' last errors: {}. The surviving leaves logged (start and kill): {}.{}",
                m.victim_leaf + 1,
                m.per_leaf,
                RECOVERY_TIMEOUT.as_secs(),
                error_list(&m.leaf_errors),
                error_list(&m.leaf_log),
                r.first_never
                    .as_ref()
                    .map(|s| format!(" First device not back: {s}."))
                    .unwrap_or_default()
            )),
    ];
    let node = Row::new(format!(
        "{label}: `kill -9` of a hub JetStream node: devices that lost sync; fan-out after it"
    ));
    out.push(match (&m.node_failure, &m.node_fan_out) {
        (None, Some(f)) => node
            .ours(format!(
                "{} lost sync, {} errors; {}",
                m.node_lost_sync,
                m.node_errors,
                f.each.cell()
            ))
            .baseline("—")
            .ratio("—")
            .target(
                "no device loses sync",
                Verdict::from_ok(m.node_lost_sync == 0),
            )
            .note(format!(
                "After the leaf kill: n{} (leaf connections per node {:?}) SIGKILLed; the leaves relink to the other nodes, the devices' connections stay. Every bucket had a leader again {:.1} s after the kill; then one change per device, p50/p99/max from each put to the device applying it (the whole fleet {}). Lost sync and errors count from the kill to that fan-out's end. The leaves and the other hub nodes logged over it: {}.",
                m.victim_node,
                m.node_leafs,
                m.leaders_after.as_secs_f64(),
                f.whole.cell(),
                error_list(&m.node_log)
            )),
        (e, _) => Row::todo(
            &node.figure,
            "no device loses sync",
            &format!(
                "not done: {}. The leaves and the other hub nodes logged from the kill: {}.",
                short(e.as_deref().unwrap_or("no fan-out after the kill")),
                error_list(&m.node_log)
            ),
        ),
    });
    for (what, run, target) in [
        (
            "`fleetctl status --json`",
            &m.status,
            "every device listed, online",
        ),
        ("`fleetctl rollout`", &m.rollout, "every intent written"),
    ] {
        let row = Row::new(format!("{label}: {what} over the live fleet"));
        out.push(match run {
            Some(r) => row
                .ours(format!("{:.2} s", r.took.as_secs_f64()))
                .baseline("—")
                .ratio("—")
                .target(target, Verdict::from_ok(r.ok))
                .note(format!(
                    "The release fleetctl against the hub's three nodes, spawn to exit, after the fan-out and before the leaf kill: {}.",
                    r.summary
                )),
            None => Row::todo(&row.figure, target, "not run: an earlier step failed"),
        });
    }
    let rolling_ok = m.rolling_failure.is_none()
        && m.rolling.never == 0
        && m.rolling.affected > 0
        && m.rolling.spread.max <= Duration::from_secs(10);
    out.push(
        Row::new(format!("{label}: rolling restart of the {k} leaves (lame duck), outages p50 / p99 / max"))
            .ours(match &m.rolling_failure {
                Some(e) => format!("not done: {}", short(e)),
                None => recovery_cell(&m.rolling),
            })
            .baseline("—")
            .ratio("—")
            .target("every outage ≤ 10 s, none lost", Verdict::from_ok(rolling_ok))
            .note(format!(
                "After the killed leaf and hub node were started again: each leaf in turn put in lame-duck mode (SIGUSR2; `lame_duck_duration` {} s, grace {} s: no new clients, its clients closed over the duration) and started again with its links up before the next; its devices reconnect to the other leaves at random. The killed hub node's replicas were current again {} after its start (bound {} s). The whole took {:.0} s. Affected = devices that lost sync during it (some more than once, as the leaf they moved to restarts later); the spread is over every outage, from the loss to a complete snapshot again. Bound {} s after the last leaf.{}{}",
                LAME_DUCK.0.as_secs(),
                LAME_DUCK.1.as_secs(),
                m.hub_catch_up
                    .map_or("—".to_owned(), |d| format!("{:.0} s", d.as_secs_f64())),
                catch_up_bound(n).as_secs(),
                m.rolling_took.as_secs_f64(),
                RECOVERY_TIMEOUT.as_secs(),
                m.rolling
                    .first_never
                    .as_ref()
                    .map(|s| format!(" First device not back: {s}."))
                    .unwrap_or_default(),
                m.rolling_failure
                    .as_ref()
                    .map(|e| format!(" Not done: {e}."))
                    .unwrap_or_default(),
            )),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_leafs_devices_are_shared_by_the_others() {
        // 100,000 on 6 leaves: 16,667 each, and a fifth of a dead one's.
        assert_eq!(busiest_after_leaf_kill(100_000, 6), 22_001);
        assert!(busiest_after_leaf_kill(100_000, 7) <= DEVICES_PER_LEAF);
        // Two leaves: the survivor takes everything.
        assert_eq!(busiest_after_leaf_kill(6_000, 2), 6_600);
    }
}
