//! The simulator and cluster are correct (the fast run `make test` keeps;
//! the figures are `make bench BENCH_ARGS="--only scale"`): a few hundred
//! simulated devices of each generation on a 3-node nats-server 2.14
//! cluster with R3 buckets each read a complete snapshot, get one desired
//! change each, and after `kill -9` of the node holding the most
//! connections every affected device is back with a complete snapshot.
//! The same checks with the devices split over two worker processes: the
//! merged records are every device's, in order, and each worker's devices
//! are connected from that worker.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fleet_harness::{ClusterOptions, NatsCluster, NatsVersion};
use fleet_sim::scenario::{device_ids, Fleet, Simulator};
use fleet_sim::Generation;

const PER_GENERATION: usize = 150;

/// Each test runs a 3-node cluster through a node kill and bounds the
/// recovery; side by side on a 2-core machine one's elections and
/// reconnects slow the other's (a device of the first test once missed
/// its bound so): one cluster at a time.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn simulated_fleets_snapshot_fan_out_and_recover_from_a_node_kill() {
    let _one = ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    fleet_sim::raise_nofile(8192);
    let gens = [Generation::Two, Generation::One];
    let ids: Vec<Vec<String>> = gens
        .iter()
        .map(|g| device_ids(*g, PER_GENERATION))
        .collect();
    let all: Vec<&str> = ids.iter().flatten().map(String::as_str).collect();
    let mut cluster = NatsCluster::start_fleet_with(
        NatsVersion::V2_14,
        &all,
        &ClusterOptions {
            monitoring: true,
            max_connections: None,
            ..ClusterOptions::default()
        },
    );
    let started = Instant::now();
    let mut fleets: Vec<Fleet> = gens
        .iter()
        .zip(ids)
        .map(|(g, ids)| Fleet::start(&cluster, *g, ids, |_| {}))
        .collect();
    for f in &fleets {
        let s = f
            .wait_snapshots(started, Duration::from_secs(90))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.n, PER_GENERATION);
    }
    let admin = cluster.admin();
    for f in &mut fleets {
        let fan_out = f
            .fan_out(&admin, "first", Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fan_out.each.n, PER_GENERATION, "{}", f.generation.label());
        assert!(fan_out.each.max <= fan_out.whole.max, "{fan_out:?}");
    }
    drop(admin);
    // Generation 2 reads without consumers: no JetStream API request
    // beyond its two Direct Gets per device so far.
    assert_eq!(fleets[0].api_requests(), 2 * PER_GENERATION as u64);
    let nodes = cluster.node_count();
    let mut per = vec![0; nodes];
    for f in &fleets {
        for (i, n) in f.per_node(nodes).into_iter().enumerate() {
            per[i] += n;
        }
    }
    let victim = (0..nodes).max_by_key(|i| per[*i]).unwrap_or(0);
    let killed_at = Instant::now();
    cluster.kill_node(victim);
    for f in &fleets {
        // Generation 1 backs off up to 30 s between consumer creates that
        // time out (10 s each) while the streams elect new leaders.
        let bound = match f.generation {
            Generation::One => Duration::from_secs(180),
            Generation::Two => Duration::from_secs(60),
        };
        let r = f.recovery(killed_at, bound);
        assert!(
            r.affected > 0,
            "{}: killing n{victim} (holding {} connections) affected no device",
            f.generation.label(),
            per[victim]
        );
        assert_eq!(
            r.never,
            0,
            "{}: {} of {} affected devices never recovered; first: {:?}",
            f.generation.label(),
            r.never,
            r.affected,
            r.first_never
        );
        eprintln!(
            "{}: {} affected, recovery p50/p99/max {}, errors {}",
            f.generation.label(),
            r.affected,
            r.spread.cell(),
            r.errors
        );
    }
    // A device picks its next server at random, as the agent's NATS client
    // does: the killed node's devices spread over both survivors.
    let mut after = vec![0; nodes];
    for f in &fleets {
        for (i, n) in f.per_node(nodes).into_iter().enumerate() {
            after[i] += n;
        }
    }
    assert_eq!(
        after[victim], 0,
        "devices per node after the kill: {after:?}"
    );
    for i in (0..nodes).filter(|i| *i != victim) {
        assert!(
            after[i] > per[i],
            "n{i} took none of n{victim}'s devices: per node before {per:?}, after {after:?}"
        );
    }
    // And the survivors serve a new change to everyone.
    cluster.wait_for_leaders(Duration::from_secs(60));
    let admin = cluster.admin();
    for f in &mut fleets {
        f.fan_out(&admin, "after-kill", Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Split at 152, not a multiple of the 3 nodes: records merged out of
/// order would show devices on other servers than the cluster says.
const SPLIT_DEVICES: usize = 304;

#[test]
fn a_fleet_split_over_two_processes_snapshots_fans_out_and_recovers_from_a_node_kill() {
    let _one = ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    fleet_sim::raise_nofile(8192);
    let ids = device_ids(Generation::Two, SPLIT_DEVICES);
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut cluster = NatsCluster::start_fleet_with(
        NatsVersion::V2_14,
        &refs,
        &ClusterOptions {
            monitoring: true,
            max_connections: None,
            ..ClusterOptions::default()
        },
    );
    let started = Instant::now();
    let mut fleet = Fleet::start_processes(&cluster, Generation::Two, ids.clone(), 2, |_| {});
    assert_eq!(fleet.sim.processes(), 2);
    let s = fleet
        .wait_snapshots(started, Duration::from_secs(90))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.n, SPLIT_DEVICES);
    // The merge: one record per device, in device order. Device i starts
    // on server i % nodes in whichever process holds it, and nothing has
    // moved it yet.
    let nodes = cluster.node_count();
    let recs = fleet
        .sim
        .records()
        .unwrap_or_else(|e| panic!("{e}"))
        .to_vec();
    assert_eq!(recs.len(), SPLIT_DEVICES);
    for (i, d) in recs.iter().enumerate() {
        assert_eq!(d.server, Some(i % nodes), "{}: {d:?}", ids[i]);
        assert_eq!(d.connects.len(), 1, "{}: {d:?}", ids[i]);
    }
    // Each worker's devices are connected from that worker: the cluster's
    // view of each device's client port (`/connz`) is a socket of the
    // worker holding it.
    let Simulator::Processes(multi) = &fleet.sim else {
        panic!("start_processes ran the fleet in this process");
    };
    let workers = multi.workers();
    assert_eq!(workers.len(), 2);
    let port_of = device_ports(&cluster);
    for (i, d) in recs.iter().enumerate() {
        let node = port_of.get(&ids[i]).map(|(n, _)| *n);
        assert_eq!(
            d.server, node,
            "{}: its record's server and /connz's",
            ids[i]
        );
    }
    for (pid, range) in &workers {
        assert!(!range.is_empty(), "worker {pid} holds no device");
        let ports = process_tcp_ports(*pid);
        for id in &ids[range.clone()] {
            let (_, port) = port_of
                .get(id)
                .unwrap_or_else(|| panic!("{id}: no connection in /connz"));
            assert!(
                ports.contains(port),
                "{id} (devices {range:?}) is connected from port {port}, not a socket of worker {pid}"
            );
        }
    }
    let admin = cluster.admin();
    let fan_out = fleet
        .fan_out(&admin, "first", Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fan_out.each.n, SPLIT_DEVICES);
    assert!(fan_out.each.max <= fan_out.whole.max, "{fan_out:?}");
    drop(admin);
    assert_eq!(fleet.api_requests(), 2 * SPLIT_DEVICES as u64);
    let per = fleet.per_node(nodes);
    assert_eq!(per.iter().sum::<usize>(), SPLIT_DEVICES, "{per:?}");
    let victim = (0..nodes).max_by_key(|i| per[*i]).unwrap_or(0);
    fleet.mark_errors();
    let killed_at = Instant::now();
    cluster.kill_node(victim);
    let r = fleet.recovery(killed_at, Duration::from_secs(60));
    assert!(
        r.affected >= per[victim],
        "killing n{victim} (holding {} connections) affected {} devices",
        per[victim],
        r.affected
    );
    assert_eq!(
        r.never, 0,
        "{} of {} affected devices never recovered; first: {:?}",
        r.never, r.affected, r.first_never
    );
    eprintln!(
        "2 processes: {} affected, recovery p50/p99/max {}, errors {}",
        r.affected,
        r.spread.cell(),
        r.errors
    );
    cluster.wait_for_leaders(Duration::from_secs(60));
    let admin = cluster.admin();
    fleet
        .fan_out(&admin, "after-kill", Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    drop(admin);
    let pids: Vec<u32> = workers.iter().map(|(p, _)| *p).collect();
    fleet.sim.stop().unwrap_or_else(|e| panic!("{e}"));
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "worker {pid} still exists after stop"
        );
    }
}

/// Each connected device's node and client port, from every live node's `/connz`.
fn device_ports(cluster: &NatsCluster) -> HashMap<String, (usize, u16)> {
    let mut out = HashMap::new();
    for i in 0..cluster.node_count() {
        let Some(addr) = cluster.monitor_addr(i) else {
            continue;
        };
        let body = http_get(addr, "/connz?auth=true&limit=100000");
        let v: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("n{i} /connz is not JSON ({e}): {body}"));
        for c in v["connections"].as_array().into_iter().flatten() {
            if let (Some(user), Some(port)) = (c["authorized_user"].as_str(), c["port"].as_u64()) {
                out.insert(user.to_owned(), (i, u16::try_from(port).expect("a port")));
            }
        }
    }
    out
}

/// The local ports of the TCP sockets process `pid` holds (its
/// `/proc/<pid>/fd` socket inodes looked up in `/proc/net/tcp`).
fn process_tcp_ports(pid: u32) -> HashSet<u16> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/fd: {e}"))
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let tcp = std::fs::read_to_string("/proc/net/tcp").expect("reading /proc/net/tcp");
    tcp.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = f.get(1)?.rsplit(':').next()?;
            inodes
                .contains(*f.get(9)?)
                .then(|| u16::from_str_radix(port, 16).ok())?
        })
        .collect()
}

/// GET of a monitoring endpoint (HTTP/1.0, the body read to EOF).
fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")
        .unwrap_or_else(|e| panic!("GET {addr}{path}: {e}"));
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .unwrap_or_else(|e| panic!("reading {addr}{path}: {e}"));
    let p = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP body from {addr}{path}"));
    String::from_utf8_lossy(&buf[p + 4..]).into_owned()
}
