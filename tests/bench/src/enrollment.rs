//! Enrollment: N simulated devices ([`fleet_sim`], [`SimAuth::Enrollment`])
//! enrolling at once through the real `fleet-auth-callout` (two instances
//! in one queue group) on a 3-node nats-server 2.14 cluster under an
//! auto-approve rule, beside the same N devices as static users on a
//! 3-node cluster of their own (the baseline). The devices list every
//! node and start spread over them.
//!
//! Per fleet: the nodes' RSS summed, before any device and with all N
//! connected and settled (the difference over N is memory per connected
//! device); the time from start until every device was approved
//! (enrollment only) and until every device had connected as itself and
//! read its keys. Then the reconnect storm: `kill -9` of node 0, so that
//! its third of the devices reconnects at once to the other two; with the
//! callout, one of its two instances is killed at the same moment. Every
//! moved device back is timed, and each reconnect's handshake (socket
//! opened → PONG after CONNECT, the callout's decision with its registry
//! read inside) gives p50/p99/max; the devices' failed attempts are
//! counted.

use std::time::{Duration, Instant};

use fleet_harness::{CalloutCluster, ClusterOptions, Idp, NatsCluster, NatsVersion};
use fleet_sim::{percentile, DeviceRecord, Generation, Sim, SimAuth, SimConfig};
use serde_json::json;

use crate::procfs;
use crate::report::{Row, Verdict};

/// The fleet's enrollment token in this bench.
const TOKEN: &str = "bench-enrollment-token";
/// The auto-approve rule (the simulated devices say `arch=x86_64`).
const RULE: &str = "arch=x86_64";
/// Until every device is approved, connected, back after the storm.
const PHASE_TIMEOUT: Duration = Duration::from_secs(900);
/// How far two runs' settled RSS per device differ here with nothing
/// changed (up to 4.4% between same-day runs of this section): the memory
/// target allows it.
const RSS_NOISE: f64 = 0.05;
/// After the last device connected, before memory is read.
const SETTLE: Duration = Duration::from_secs(10);
/// Approvals a minute the enrollment path must sustain (Choria's figure
/// for its provisioner on the same brokers: 1,000 servers a minute).
const TARGET_PER_MINUTE: f64 = 1000.0;

/// What one fleet measured.
#[derive(Debug, Default)]
struct Measured {
    rss_idle: u64,
    rss_settled: u64,
    /// Start → every device approved (enrollment only).
    all_approved: Option<Duration>,
    /// Approval times from start, sorted.
    approvals: Vec<Duration>,
    /// Enrollment requests sent in all.
    asks: u64,
    /// Start → every device connected as itself with its keys read.
    all_up: Option<Duration>,
    /// Server back → every device connected again.
    storm_back: Option<Duration>,
    /// The storm's reconnect handshakes, sorted.
    storm_handshakes: Vec<Duration>,
    /// Failed connection attempts and errors during the storm.
    storm_errors: u64,
    /// Devices on the killed node when it was killed.
    storm_moved: usize,
    /// Of those, not back within the timeout.
    storm_missing: usize,
    /// Times the callouts lost their NATS connection (before the storm).
    callout_losses: usize,
    failure: Option<String>,
}

pub fn enrollment_rows(n: usize) -> Vec<Row> {
    let want = (2 * n as u64 + 20_000).max(65_536);
    let nofile = fleet_sim::raise_nofile(want);
    if nofile < n as u64 + 1_000 {
        return vec![Row::todo(
            &format!("enrollment {n}: every figure"),
            "—",
            &format!("open-file limit {nofile}: run as root or raise `ulimit -Hn`"),
        )];
    }
    let ids: Vec<String> = (0..n).map(|i| format!("enr-{i:06}")).collect();
    eprintln!("bench: enrollment section, {n} static users (baseline)");
    let stat = measure_static(&ids);
    eprintln!("bench: enrollment section, {n} devices enrolling through the callout");
    let enr = measure_enrollment(&ids);
    rows(n, &stat, &enr)
}

fn sim_config(cluster: &NatsCluster, ids: &[String], auth: SimAuth) -> SimConfig {
    let mut cfg = SimConfig::new(
        cluster.client_addrs(),
        ids.to_vec(),
        fleet_harness::device_password,
        Generation::Two,
    );
    cfg.auth = auth;
    cfg
}

fn measure_static(ids: &[String]) -> Measured {
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut cluster =
        NatsCluster::start_fleet_with(NatsVersion::V2_14, &refs, &ClusterOptions::default());
    let mut m = Measured {
        rss_idle: cluster_rss(&cluster),
        ..Measured::default()
    };
    let t0 = Instant::now();
    let sim = match Sim::start(sim_config(&cluster, ids, SimAuth::Password)) {
        Ok(s) => s,
        Err(e) => {
            m.failure = Some(format!("simulator: {e}"));
            return m;
        }
    };
    if !wait(&sim, "every static user connected", all_read) {
        m.failure = Some(stuck(&sim, ids, "connected"));
        return m;
    }
    m.all_up = Some(t0.elapsed());
    std::thread::sleep(SETTLE);
    m.rss_settled = cluster_rss(&cluster);
    storm(&sim, &mut m, || cluster.kill_node(KILLED));
    m
}

/// The node the storm kills.
const KILLED: usize = 0;

/// Every running node's RSS, summed.
fn cluster_rss(cluster: &NatsCluster) -> u64 {
    (0..cluster.node_count())
        .filter_map(|i| cluster.node_pid(i))
        .map(procfs::rss)
        .sum()
}

fn measure_enrollment(ids: &[String]) -> Measured {
    use std::os::unix::fs::PermissionsExt;
    let idp = Idp::start();
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            return Measured {
                failure: Some(format!("tempdir: {e}")),
                ..Measured::default()
            }
        }
    };
    let token = dir.path().join("enrollment-token");
    let written = std::fs::write(&token, format!("{TOKEN}\n"))
        .and_then(|()| std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)));
    if let Err(e) = written {
        return Measured {
            failure: Some(format!("writing the token: {e}")),
            ..Measured::default()
        };
    }
    let mut fleet = CalloutCluster::start(
        &idp,
        json!({"enrollment": {"token_files": [token], "auto_approve": RULE}}),
        2,
        ClusterOptions::default(),
    );
    let mut m = Measured {
        rss_idle: cluster_rss(&fleet.cluster),
        ..Measured::default()
    };
    let auth = SimAuth::Enrollment {
        token: TOKEN.to_owned(),
    };
    let t0 = Instant::now();
    let sim = match Sim::start(sim_config(&fleet.cluster, ids, auth)) {
        Ok(s) => s,
        Err(e) => {
            m.failure = Some(format!("simulator: {e}"));
            return m;
        }
    };
    if !wait(&sim, "every device approved", |recs| {
        recs.iter().all(|r| r.approved.is_some())
    }) {
        m.failure = Some(stuck(&sim, ids, "approved"));
        return m;
    }
    m.all_approved = Some(t0.elapsed());
    let mut approvals: Vec<Duration> = sim
        .records()
        .iter()
        .filter_map(|r| r.approved.map(|t| t.saturating_duration_since(t0)))
        .collect();
    approvals.sort();
    m.approvals = approvals;
    m.asks = sim.records().iter().map(|r| r.enroll_asks).sum();
    if !wait(&sim, "every device connected as itself", all_read) {
        m.failure = Some(stuck(&sim, ids, "connected as itself"));
        return m;
    }
    m.all_up = Some(t0.elapsed());
    std::thread::sleep(SETTLE);
    m.rss_settled = cluster_rss(&fleet.cluster);
    let lost = |log: String| log.matches("NATS connection lost").count();
    m.callout_losses = fleet.callouts.iter().map(|c| lost(c.log())).sum();
    storm(&sim, &mut m, || {
        fleet.cluster.kill_node(KILLED);
        // One of the two callouts dies with the node: its share of the
        // first requests goes unanswered and those devices retry.
        let mut c = fleet.callouts.remove(0);
        c.kill();
    });
    m
}

/// [`Sim::wait_until`] up to [`PHASE_TIMEOUT`], saying every 15 s how
/// far the fleet is.
fn wait(sim: &Sim, what: &str, done: impl Fn(&[DeviceRecord]) -> bool) -> bool {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    while Instant::now() < deadline {
        if sim.wait_until(Duration::from_secs(15), &done) {
            return true;
        }
        let recs = sim.records();
        eprintln!(
            "bench: enrollment: waiting until {what}: {} approved, {} read their keys, {} connected now, {} errors (last: {})",
            recs.iter().filter(|r| r.approved.is_some()).count(),
            recs.iter().filter(|r| !r.snapshots.is_empty()).count(),
            recs.iter().filter(|r| r.server.is_some()).count(),
            recs.iter().map(|r| r.errors).sum::<u64>(),
            recs.iter()
                .filter_map(|r| r.last_error.as_deref())
                .next_back()
                .unwrap_or("none")
        );
        if !sim.is_running() {
            return false;
        }
    }
    false
}

fn all_read(recs: &[DeviceRecord]) -> bool {
    recs.iter().all(|r| !r.snapshots.is_empty())
}

/// Why a phase did not finish: how many devices are stuck, and the first
/// few with their last error.
fn stuck(sim: &Sim, ids: &[String], what: &str) -> String {
    let recs = sim.records();
    let behind: Vec<String> = recs
        .iter()
        .zip(ids)
        .filter(|(r, _)| r.snapshots.is_empty() && (what != "approved" || r.approved.is_none()))
        .map(|(r, id)| format!("{id}: {}", r.last_error.as_deref().unwrap_or("no error")))
        .collect();
    format!(
        "{} of {} devices not {what} within {} s (first: {})",
        behind.len(),
        ids.len(),
        PHASE_TIMEOUT.as_secs(),
        behind
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ")
    )
}

/// Runs `kill`, then waits until every device that was on the killed
/// node connected again.
fn storm(sim: &Sim, m: &mut Measured, kill: impl FnOnce()) {
    let (moved, connects, handshakes, errors): (Vec<usize>, Vec<usize>, Vec<usize>, u64) = {
        let recs = sim.records();
        (
            (0..recs.len())
                .filter(|i| recs[*i].server == Some(KILLED))
                .collect(),
            recs.iter().map(|r| r.connects.len()).collect(),
            recs.iter().map(|r| r.handshakes.len()).collect(),
            recs.iter().map(|r| r.errors).sum(),
        )
    };
    m.storm_moved = moved.len();
    kill();
    let t0 = Instant::now();
    let back = |recs: &[DeviceRecord]| moved.iter().all(|i| recs[*i].connects.len() > connects[*i]);
    if wait(sim, "every device of the killed node back", back) {
        m.storm_back = Some(t0.elapsed());
    }
    let recs = sim.records();
    m.storm_missing = moved
        .iter()
        .filter(|i| recs[**i].connects.len() <= connects[**i])
        .count();
    let mut hs: Vec<Duration> = recs
        .iter()
        .zip(&handshakes)
        .flat_map(|(r, h)| r.handshakes.iter().skip(*h).copied())
        .collect();
    hs.sort();
    m.storm_handshakes = hs;
    m.storm_errors = recs.iter().map(|r| r.errors).sum::<u64>() - errors;
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "—".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// The nodes' whole RSS with the fleet connected, over N: what the
/// fleet costs the cluster, the static users' config included.
fn per_device_kib(m: &Measured, n: usize) -> f64 {
    m.rss_settled as f64 / 1024.0 / n as f64
}

/// What connecting added, over N.
fn connected_kib(m: &Measured, n: usize) -> f64 {
    m.rss_settled.saturating_sub(m.rss_idle) as f64 / 1024.0 / n as f64
}

fn rows(n: usize, stat: &Measured, enr: &Measured) -> Vec<Row> {
    let mut out = Vec::new();
    for (label, m) in [("static users", stat), ("enrollment", enr)] {
        if let Some(f) = &m.failure {
            out.push(Row::todo(
                &format!("enrollment {n}: {label}"),
                "—",
                &format!("not measured: {f}"),
            ));
        }
    }
    if enr.failure.is_none() || enr.all_approved.is_some() {
        let per_minute = enr
            .all_approved
            .map(|d| n as f64 * 60.0 / d.as_secs_f64().max(0.001));
        out.push(
            Row::new(format!(
                "{n} devices enrolling at once under an auto-approve rule: start → all approved"
            ))
            .ours(secs(enr.all_approved))
            .baseline("—")
            .ratio(per_minute.map_or_else(|| "—".to_owned(), |r| format!("{r:.0}/min")))
            .target(
                format!("≥ {TARGET_PER_MINUTE:.0}/min"),
                Verdict::from_ok(per_minute.is_some_and(|r| r >= TARGET_PER_MINUTE)),
            )
            .note(format!(
                "each device: its own key, one request on `fleetenroll.key.<KEY>` and the Direct Get probe through the callout (2 instances), approved by `{RULE}`; per-device approval p50 {}, p99 {} from start; requests sent {} ({:.2} per device); the callouts lost their NATS connection {} times",
                secs(Some(percentile(&enr.approvals, 50.0))),
                secs(Some(percentile(&enr.approvals, 99.0))),
                enr.asks,
                enr.asks as f64 / n as f64,
                enr.callout_losses
            )),
        );
    }
    out.push(
        Row::new(format!(
            "{n} devices: start → all connected as themselves, keys read"
        ))
        .ours(secs(enr.all_up))
        .baseline(secs(stat.all_up))
        .ratio(ratio(
            enr.all_up.map(|d| d.as_secs_f64()),
            stat.all_up.map(|d| d.as_secs_f64()),
        ))
        .note("ours: enrolling first (two connections each, both through the callout); baseline: static users, one connection"),
    );
    let (pe, ps) = (per_device_kib(enr, n), per_device_kib(stat, n));
    let measured = enr.rss_settled > 0 && stat.rss_settled > 0;
    out.push(
        Row::new(format!(
            "cluster RSS (3 nodes summed) with {n} devices connected, per device"
        ))
            .ours(kib_or_dash(enr, pe))
            .baseline(kib_or_dash(stat, ps))
            .ratio(ratio(
                (enr.rss_settled > 0).then_some(pe),
                (stat.rss_settled > 0).then_some(ps),
            ))
            .target(
                format!("≤ static users (+{:.0}% noise)", RSS_NOISE * 100.0),
                if measured {
                    Verdict::from_ok(pe <= ps * (1.0 + RSS_NOISE))
                } else {
                    Verdict::Todo
                },
            )
            .note(format!(
                "settled RSS of the 3 nodes / N: {} MiB against {} MiB; before any device connected {} MiB (no user per device) against {} MiB (one user each in every node's config); what connecting added, per device: {:.1} KiB against {:.1} KiB",
                mib1(enr.rss_settled),
                mib1(stat.rss_settled),
                mib1(enr.rss_idle),
                mib1(stat.rss_idle),
                connected_kib(enr, n),
                connected_kib(stat, n)
            )),
    );
    let p99 = |m: &Measured| percentile(&m.storm_handshakes, 99.0);
    out.push(
        Row::new(format!(
            "reconnect storm, {n} devices on 3 nodes, one node killed: handshake p99"
        ))
        .ours(storm_p99(enr))
        .baseline(storm_p99(stat))
        .ratio(ratio(
            (!enr.storm_handshakes.is_empty()).then(|| p99(enr).as_secs_f64()),
            (!stat.storm_handshakes.is_empty()).then(|| p99(stat).as_secs_f64()),
        ))
        .note(format!(
            "{} devices on the killed node (static {}) reconnecting to the other two; socket → PONG of each reconnect (the callout's decision and registry read inside): p50 {} / max {} (static {} / {}); all back in {} (static {}); failed attempts {} (static {}); not back {} (static {}); one of the two callouts killed with the node",
            enr.storm_moved,
            stat.storm_moved,
            ms(percentile(&enr.storm_handshakes, 50.0)),
            ms(enr.storm_handshakes.last().copied().unwrap_or_default()),
            ms(percentile(&stat.storm_handshakes, 50.0)),
            ms(stat.storm_handshakes.last().copied().unwrap_or_default()),
            secs(enr.storm_back),
            secs(stat.storm_back),
            enr.storm_errors,
            stat.storm_errors,
            enr.storm_missing,
            stat.storm_missing
        )),
    );
    out
}

/// `kib` when the fleet's memory was read, else a dash.
fn kib_or_dash(m: &Measured, kib: f64) -> String {
    if m.rss_settled > 0 {
        format!("{kib:.1} KiB")
    } else {
        "—".to_owned()
    }
}

/// The storm's handshake p99, or a dash when the storm did not run.
fn storm_p99(m: &Measured) -> String {
    if m.storm_handshakes.is_empty() {
        "—".to_owned()
    } else {
        ms(percentile(&m.storm_handshakes, 99.0))
    }
}

fn mib1(b: u64) -> String {
    format!("{:.1}", b as f64 / 1024.0 / 1024.0)
}

fn ratio(ours: Option<f64>, base: Option<f64>) -> String {
    match (ours, base) {
        (Some(o), Some(b)) if b > 0.0 => format!("{:.2}×", o / b),
        _ => "—".to_owned(),
    }
}
