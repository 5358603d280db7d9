//! Fleet scale (issue 15): N simulated devices ([`fleet_sim`]: one event
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

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use fleet_harness::{ClusterOptions, NatsCluster, NatsVersion};
use fleet_sim::scenario::{device_ids, Fleet, Recovery, Spread};
use fleet_sim::Generation;

use crate::procfs;
use crate::report::{Row, Verdict};

/// Devices started per second (a fleet does not boot in one instant).
const START_RATE: u32 = 2_000;
/// Bound on every device's first snapshot.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(600);
/// After the snapshots, before measuring: the first heartbeats spread out.
const SETTLE: Duration = Duration::from_secs(35);
const FAN_OUT_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on the recovery after a node loss: nine times generation 2's
/// target (10 s). Generation 1 backs off up to 30 s between consumer
/// creates that time out after 10 s, so some of its devices are past this
/// bound and counted as not back (a longer one kept `make bench` well past
/// its 15 minutes for a figure that only grows).
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(90);
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

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
    fan_out: Spread,
    puts_acked: Duration,
    victim: usize,
    victim_conns: usize,
    recovery: Recovery,
    failure: Option<String>,
}

impl Measured {
    fn rss_per_device(&self, n: usize) -> f64 {
        let before: u64 = self.rss_before.iter().sum();
        let after: u64 = self.rss_settled.iter().sum();
        after.saturating_sub(before) as f64 / n as f64
    }
}

/// The rows of every N (generation 2 as "ours", generation 1 as the
/// baseline), then the slopes between consecutive Ns.
pub fn scale_rows(ns: &[usize], window: Duration, version: NatsVersion) -> Vec<Row> {
    let mut out = Vec::new();
    let mut done: Vec<(usize, Measured, Measured)> = Vec::new();
    for &n in ns {
        let want = (2 * n as u64 + 20_000).max(65_536);
        let nofile = fleet_sim::raise_nofile(want);
        if nofile < n as u64 + 1_000 {
            out.push(Row::todo(
                &format!("scale {n}: every figure"),
                "—",
                &format!("open-file limit {nofile} (could not raise it to {want}): run as root or raise `ulimit -Hn`"),
            ));
            continue;
        }
        let g1 = measure(Generation::One, n, window, version);
        let g2 = measure(Generation::Two, n, window, version);
        out.extend(rows(n, window, version, &g1, &g2));
        if g1.failure.is_none() && g2.failure.is_none() {
            done.push((n, g1, g2));
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
    a: &(usize, Measured, Measured),
    b: &(usize, Measured, Measured),
    version: NatsVersion,
) -> Row {
    let dn = (b.0 - a.0) as f64;
    let rss = |m: &Measured| m.rss_settled.iter().sum::<u64>() as f64;
    let cpu = |m: &Measured| m.cpu_settled.iter().sum::<f64>();
    let per = |x: &Measured, y: &Measured| (rss(y) - rss(x)) / dn;
    let (r2, r1) = (per(&a.2, &b.2), per(&a.1, &b.1));
    let cpu2 = (cpu(&b.2) - cpu(&a.2)) / dn;
    let cpu1 = (cpu(&b.1) - cpu(&a.1)) / dn;
    let writes = b.2.status_per_sec - a.2.status_per_sec;
    let per_write = if writes > 0.0 {
        (cpu(&b.2) - cpu(&a.2)) / 100.0 / writes * 1e6
    } else {
        0.0
    };
    Row::new(format!(
        "scale slope {} → {}: server RSS per device (3 nodes{})",
        thousands(a.0),
        thousands(b.0),
        match version {
            NatsVersion::V2_14 => "",
            NatsVersion::V2_9 => ", nats-server 2.9",
        }
    ))
    .ours(kib(r2))
    .baseline(format!("{} (gen 1)", kib(r1)))
    .ratio(format!("{:.2}×", r2 / r1.max(1.0)))
    .target("≤ 100 KiB", Verdict::from_ok(r2 <= 100.0 * 1024.0))
    .note(format!(
        "(RSS settled at {} − at {}) / {} devices, the three nodes summed: what each further device costs, the fixed part cancelled. CPU settled per device: gen 2 {:.4} %, gen 1 {:.4} % of one core; gen 2's steady state is its heartbeats, so one acknowledged R3 status write costs the cluster about {:.0} µs of CPU here ({:.0} more writes/s).",
        thousands(b.0),
        thousands(a.0),
        thousands(b.0 - a.0),
        cpu2,
        cpu1,
        per_write,
        writes
    ))
}

fn measure(generation: Generation, n: usize, window: Duration, version: NatsVersion) -> Measured {
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
        },
    );
    let nodes = cluster.node_count();
    let mut m = Measured {
        rss_before: (0..nodes).map(|i| node_rss(&cluster, i)).collect(),
        ..Measured::default()
    };
    let started = Instant::now();
    let mut fleet = Fleet::start(&cluster, generation, ids, |c| c.start_rate = START_RATE);
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
    // Fan-out.
    let admin = cluster.admin();
    match fleet.fan_out(&admin, "scale-1", FAN_OUT_TIMEOUT) {
        Ok((s, acked)) => {
            m.fan_out = s;
            m.puts_acked = acked;
        }
        Err(e) => {
            m.failure = Some(e);
            return m;
        }
    }
    drop(admin);
    // Node loss.
    let per = fleet.per_node(nodes);
    m.victim = (0..nodes).max_by_key(|i| per[*i]).unwrap_or(0);
    m.victim_conns = per[m.victim];
    let at = Instant::now();
    cluster.kill_node(m.victim);
    m.recovery = fleet.recovery(at, RECOVERY_TIMEOUT);
    drop(fleet);
    m
}

fn node_rss(cluster: &NatsCluster, i: usize) -> u64 {
    cluster.node_pid(i).map_or(0, procfs::rss)
}

/// The sum over the live nodes of `/jsz` `api.total` (each node counts the
/// API requests it handled).
fn api_total(cluster: &NatsCluster) -> u64 {
    (0..cluster.node_count())
        .filter(|i| cluster.node_pid(*i).is_some())
        .filter_map(|i| cluster.monitor_addr(i))
        .filter_map(|a| http_json(a, "/jsz").ok())
        .map(|v| v["api"]["total"].as_u64().unwrap_or(0))
        .sum()
}

/// GET of a monitoring endpoint (HTTP/1.0, the body read to EOF).
fn http_json(addr: SocketAddr, path: &str) -> Result<serde_json::Value, String> {
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
    serde_json::from_slice(body).map_err(|e| e.to_string())
}

fn kib(b: f64) -> String {
    format!("{:.0} KiB", b / 1024.0)
}

fn mib_list(v: &[u64]) -> String {
    v.iter()
        .map(|b| format!("{:.0}", *b as f64 / 1048576.0))
        .collect::<Vec<_>>()
        .join(" / ")
        + " MiB"
}

fn cpu_list(v: &[f64]) -> String {
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
    g1: &Measured,
    g2: &Measured,
) -> Vec<Row> {
    let label = match version {
        NatsVersion::V2_14 => format!("scale {}", thousands(n)),
        NatsVersion::V2_9 => format!("scale {} (nats-server 2.9)", thousands(n)),
    };
    if let Some(e) = g2.failure.as_ref().or(g1.failure.as_ref()) {
        return vec![Row::todo(
            &format!("{label}: every figure"),
            "—",
            &format!("the run failed: {e}"),
        )];
    }
    let per2 = g2.rss_per_device(n);
    let per1 = g1.rss_per_device(n);
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}×", a / b)
        } else {
            "—".to_owned()
        }
    };
    let rec = |r: &Recovery| {
        format!(
            "{} affected, {}, {} never, {} errors",
            thousands(r.affected),
            r.spread.cell(),
            r.never,
            r.errors
        )
    };
    vec![
        Row::new(format!("{label}: server RSS per device (3 nodes, slope)"))
            .ours(kib(per2))
            .baseline(format!("{} (gen 1)", kib(per1)))
            .ratio(ratio(per2, per1))
            .target("≤ 100 KiB", Verdict::from_ok(per2 <= 100.0 * 1024.0))
            .note(format!(
                "Sum of the three nodes' RSS settled with {n} devices minus before any device, over N. Per node before → settled: gen 2 {} → {}; gen 1 {} → {}. Devices start at {START_RATE}/s; first snapshots p50/p99/max gen 2 {}, gen 1 {} from the first start.",
                mib_list(&g2.rss_before),
                mib_list(&g2.rss_settled),
                mib_list(&g1.rss_before),
                mib_list(&g1.rss_settled),
                g2.snapshots.cell(),
                g1.snapshots.cell()
            )),
        Row::new(format!("{label}: server CPU settled (n0 / n1 / n2)"))
            .ours(cpu_list(&g2.cpu_settled))
            .baseline(format!("{} (gen 1)", cpu_list(&g1.cpu_settled)))
            .ratio(ratio(
                g2.cpu_settled.iter().sum(),
                g1.cpu_settled.iter().sum(),
            ))
            .target("—", Verdict::Info)
            .note(format!(
                "utime+stime of each node over {} s of steady state (heartbeats only), % of one core. Heartbeat cost: {:.0} status writes/s (R3, acked) for gen 2; the whole cluster then spends {:.0} µs of CPU per write (gen 1: {:.0} writes/s, the consumers' idle heartbeats on top).",
                window.as_secs(),
                g2.status_per_sec,
                per_write_us(g2),
                g1.status_per_sec
            )),
        Row::new(format!("{label}: JetStream API requests/s, steady state"))
            .ours(format!("{:.1}", g2.api_per_sec))
            .baseline(format!("{:.1} (gen 1)", g1.api_per_sec))
            .ratio("—")
            .target("0 from devices", Verdict::from_ok(g2.device_api_per_sec == 0.0))
            .note(format!(
                "`/jsz` `api.total` deltas summed over the nodes over the window (devices are the only clients); the devices themselves sent {:.1}/s (gen 2, backstop re-reads every 300 s ± 20% included) and {:.1}/s (gen 1: consumer re-creates).",
                g2.device_api_per_sec, g1.device_api_per_sec
            )),
        Row::new(format!("{label}: fan-out, one change per device, p50 / p99 / max"))
            .ours(g2.fan_out.cell())
            .baseline(format!("{} (gen 1)", g1.fan_out.cell()))
            .ratio(format!(
                "{:.2}× (p99)",
                g2.fan_out.p99.as_secs_f64() / g1.fan_out.p99.as_secs_f64().max(1e-9)
            ))
            .target("p99 < 1 s", Verdict::from_ok(g2.fan_out.p99 < Duration::from_secs(1)))
            .note(format!(
                "From the first of the {n} pipelined admin puts (fleetctl's way, 1,024 in flight; gen 2 by compare-and-set) to each device applying its value; the puts were acknowledged in {:.2} s (gen 2) and {:.2} s (gen 1).",
                g2.puts_acked.as_secs_f64(),
                g1.puts_acked.as_secs_f64()
            )),
        Row::new(format!("{label}: `kill -9` of a node, recovery p50 / p99 / max"))
            .ours(rec(&g2.recovery))
            .baseline(format!("{} (gen 1)", rec(&g1.recovery)))
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
                "The node with the most connections (gen 2: n{} with {}; gen 1: n{} with {}) SIGKILLed; affected = devices that lost sync after it (their connection, or a generation-1 consumer living on the dead node); recovered = a complete snapshot again (both keys read). Bound {} s.{}",
                g2.victim,
                g2.victim_conns,
                g1.victim,
                g1.victim_conns,
                RECOVERY_TIMEOUT.as_secs(),
                g1.recovery
                    .first_never
                    .as_ref()
                    .map(|s| format!(" First gen-1 device never back: {s}."))
                    .unwrap_or_default()
            )),
    ]
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

fn thousands(n: usize) -> String {
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
