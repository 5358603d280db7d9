//! Simulated fleets on leaf nodes: a 3-node hub cluster with R3 buckets
//! and a leafnode listener, two leaves (no JetStream, the devices' users,
//! bound to the hub), and devices of both generations whose servers are
//! the two leaves (half start on each). Every device reads a complete
//! snapshot through its leaf, one desired change per device fans out
//! through the leaves, and after `kill -9` of the leaf holding the most
//! devices every device it held is on the other leaf with a complete
//! snapshot again, none lost; then another change fans out to everyone.
//! On nats-server 2.14 and, smaller, on 2.9.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use fleet_harness::{ClusterOptions, NatsCluster, NatsLeaf, NatsVersion};
use fleet_sim::scenario::{device_ids, Fleet};
use fleet_sim::Generation;

/// Generation 2 re-reads through the other leaf at once (its first
/// reconnect has no delay, and the hub is untouched): its bound.
const GEN2_RECOVERY: Duration = Duration::from_secs(10);
/// Generation 1 creates a new consumer per bucket through the other leaf;
/// the hub is untouched, so there is no election to wait for (measured:
/// well under a second, as generation 2). The bound leaves room for one
/// consumer create timing out (the 10 s request timeout) and its retry on
/// a loaded machine.
const GEN1_RECOVERY: Duration = Duration::from_secs(20);

/// Each test runs a hub cluster, two leaves and a leaf kill, and bounds
/// the recovery: one at a time, as in cluster.rs.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn fleets_on_two_leaves_of_a_2_14_hub_recover_from_a_leaf_kill() {
    run(NatsVersion::V2_14, 151);
}

#[test]
fn fleets_on_two_leaves_of_a_2_9_hub_recover_from_a_leaf_kill() {
    run(NatsVersion::V2_9, 61);
}

/// `per_generation` odd: the first leaf holds one device of each
/// generation more, and is the one killed.
fn run(v: NatsVersion, per_generation: usize) {
    let _one = ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    fleet_sim::raise_nofile(8192);
    let t0 = Instant::now();
    let gens = [Generation::Two, Generation::One];
    let ids: Vec<Vec<String>> = gens
        .iter()
        .map(|g| device_ids(*g, per_generation))
        .collect();
    let all: Vec<&str> = ids.iter().flatten().map(String::as_str).collect();
    let cluster = NatsCluster::start_fleet_with(
        v,
        &all,
        &ClusterOptions {
            leafnodes: true,
            max_connections: None,
            ..ClusterOptions::default()
        },
    );
    let hubs = cluster.leafnode_hubs();
    let mut leaves: Vec<NatsLeaf> = (1..=2)
        .map(|i| NatsLeaf::start(v, &format!("leaf-{i}"), &hubs, &all))
        .collect();
    let servers: Vec<_> = leaves.iter().map(NatsLeaf::client_addr).collect();
    eprintln!(
        "{v:?}: hub and 2 leaves up in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    let mut fleets: Vec<Fleet> = gens
        .iter()
        .zip(ids)
        .map(|(g, ids)| Fleet::start_on(servers.clone(), *g, ids, |_| {}))
        .collect();
    for f in &fleets {
        let s = f
            .wait_snapshots(started, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{v:?}: {e}"));
        assert_eq!(s.n, per_generation);
        eprintln!(
            "{v:?} {}: first snapshots p50/p99/max {}",
            f.generation.label(),
            s.cell()
        );
    }
    // Half of each fleet on each leaf (device i on leaf i % 2).
    for f in &fleets {
        let per = f.per_node(servers.len());
        assert_eq!(
            per,
            vec![per_generation.div_ceil(2), per_generation / 2],
            "{v:?} {}: devices per leaf",
            f.generation.label()
        );
    }
    let admin = cluster.admin();
    for f in &mut fleets {
        let fan_out = f
            .fan_out(&admin, "first", Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{v:?}: {e}"));
        assert_eq!(fan_out.each.n, per_generation, "{}", f.generation.label());
        eprintln!(
            "{v:?} {}: fan-out through the leaves p50/p99/max {}",
            f.generation.label(),
            fan_out.each.cell()
        );
    }
    drop(admin);
    // Generation 2 through a leaf still reads without consumers: its two
    // Direct Gets per device.
    assert_eq!(fleets[0].api_requests(), 2 * per_generation as u64);

    let per: Vec<Vec<usize>> = fleets.iter().map(|f| f.per_node(servers.len())).collect();
    let victim = (0..servers.len())
        .max_by_key(|i| per.iter().map(|p| p[*i]).sum::<usize>())
        .unwrap_or(0);
    assert_eq!(victim, 0, "{v:?}: devices per leaf {per:?}");
    for f in &mut fleets {
        f.mark_errors();
    }
    let killed_at = Instant::now();
    leaves[victim].kill();
    for (f, p) in fleets.iter().zip(&per) {
        let bound = match f.generation {
            Generation::One => GEN1_RECOVERY,
            Generation::Two => GEN2_RECOVERY,
        };
        let r = f.recovery_of_connections(killed_at, p[victim], bound);
        eprintln!(
            "{v:?} {}: leaf-{} killed holding {}: {} affected, recovery p50/p99/max {}, errors {}",
            f.generation.label(),
            victim + 1,
            p[victim],
            r.affected,
            r.spread.cell(),
            r.errors
        );
        assert_eq!(
            r.affected,
            p[victim],
            "{v:?} {}: the devices that lost sync are the killed leaf's",
            f.generation.label()
        );
        assert_eq!(
            r.never,
            0,
            "{v:?} {}: {} of {} affected devices not recovered within {bound:?}; first: {:?}",
            f.generation.label(),
            r.never,
            r.affected,
            r.first_never
        );
        assert!(
            r.spread.max <= bound,
            "{v:?} {}: recovery {}",
            f.generation.label(),
            r.spread.cell()
        );
        // Everyone is on the surviving leaf now.
        let now = f.per_node(servers.len());
        assert_eq!(now[victim], 0, "{v:?}: {now:?}");
        assert_eq!(now.iter().sum::<usize>(), per_generation, "{v:?}: {now:?}");
    }
    let admin = cluster.admin();
    for f in &mut fleets {
        let fan_out = f
            .fan_out(&admin, "after-leaf-kill", Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{v:?}: {e}"));
        eprintln!(
            "{v:?} {}: fan-out after the leaf kill p50/p99/max {}",
            f.generation.label(),
            fan_out.each.cell()
        );
    }
    drop(admin);
    for f in fleets {
        f.sim.stop().unwrap_or_else(|e| panic!("{v:?}: {e}"));
    }
    eprintln!("{v:?}: whole run {:.1} s", t0.elapsed().as_secs_f64());
}
