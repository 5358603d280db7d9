//! The simulator and cluster are correct (the fast run `make test` keeps;
//! the figures are `make bench BENCH_ARGS="--only scale"`): a few hundred
//! simulated devices of each generation on a 3-node nats-server 2.14
//! cluster with R3 buckets each read a complete snapshot, get one desired
//! change each, and after `kill -9` of the node holding the most
//! connections every affected device is back with a complete snapshot.

use std::time::{Duration, Instant};

use fleet_harness::{ClusterOptions, NatsCluster, NatsVersion};
use fleet_sim::scenario::{device_ids, Fleet};
use fleet_sim::Generation;

const PER_GENERATION: usize = 150;

#[test]
fn simulated_fleets_snapshot_fan_out_and_recover_from_a_node_kill() {
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
    // And the survivors serve a new change to everyone.
    cluster.wait_for_leaders(Duration::from_secs(60));
    let admin = cluster.admin();
    for f in &mut fleets {
        f.fan_out(&admin, "after-kill", Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
