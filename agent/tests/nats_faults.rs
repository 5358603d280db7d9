//! NATS going away under a running agent: a server restart (in-memory
//! consumers gone), a consumer deleted by the server, and a cluster node
//! killed. Each time the agent makes a new consumer, reads a new snapshot,
//! applies changes again — and never restarts a healthy container.

mod common;

use std::time::Duration;

use common::*;
use fleet_harness::{poll_until, NatsCluster, NatsServer, NatsVersion, Podman};

fn restart_converges_without_restarting_healthy_containers(v: NatsVersion) {
    let podman = Podman::new();
    let mut nats = NatsServer::start_fleet(v, &["dev1"]);
    put_workload(&nats.admin(), "dev1", "web", &quick_sleeper(&podman, "v1"));
    let dev = Device::new("dev1", &Settings::new(vec![nats.url()]), Some(&podman));
    let agent = dev.start(Some(&podman));
    let web = wait_running(&podman, "fleet-web", "web running", |_| true);

    let from = agent.line_count();
    nats.restart();
    agent.wait_for_line_after(from, "NATS reconnected", CONVERGE);
    agent.wait_for_line_after(from, "snapshot complete", CONVERGE);

    // Changes made after the restart reach the agent through its new consumer.
    let admin = nats.admin();
    put_workload(&admin, "dev1", "api", &quick_sleeper(&podman, "api"));
    wait_running(
        &podman,
        "fleet-api",
        "api running after the restart",
        |_| true,
    );
    assert_eq!(
        container(&podman, "fleet-web"),
        Some(web),
        "the healthy container was restarted"
    );
    // Status writes go through again.
    let before: fleet_common::contracts::Heartbeat = poll_until("a heartbeat", CONVERGE, || {
        status(&admin, "dev1", "heartbeat")
    });
    poll_until("a newer heartbeat", CONVERGE, || {
        status::<fleet_common::contracts::Heartbeat>(&admin, "dev1", "heartbeat")
            .filter(|h| h.at > before.at)
    });
}

#[test]
fn restart_converges_without_restarting_healthy_containers_2_9() {
    restart_converges_without_restarting_healthy_containers(NatsVersion::V2_9);
}

#[test]
fn restart_converges_without_restarting_healthy_containers_2_14() {
    restart_converges_without_restarting_healthy_containers(NatsVersion::V2_14);
}

/// The server deletes the agent's consumer: idle heartbeats stop, and after
/// three missed ones the agent creates a new consumer.
fn a_lost_consumer_is_replaced_after_missed_heartbeats(v: NatsVersion) {
    let podman = Podman::new();
    let nats = NatsServer::start_fleet(v, &["dev1"]);
    let admin = nats.admin();
    let dev = Device::new("dev1", &Settings::new(vec![nats.url()]), Some(&podman));
    let agent = dev.start(Some(&podman));
    let created = agent.wait_for_line("consumer created", CONVERGE);
    let name = created
        .split("consumer=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the log names the consumer")
        .to_owned();
    let from = agent.line_count();
    let reply = admin
        .request_timeout(
            &format!("$JS.API.CONSUMER.DELETE.KV_fleet-desired.{name}"),
            "",
            Duration::from_secs(5),
        )
        .expect("delete the consumer");
    assert!(
        String::from_utf8_lossy(&reply.data).contains("\"success\":true"),
        "{}",
        String::from_utf8_lossy(&reply.data)
    );
    agent.wait_for_line_after(from, "not even a heartbeat", CONVERGE);
    agent.wait_for_line_after(from, "snapshot complete", CONVERGE);
    put_workload(&admin, "dev1", "web", &quick_sleeper(&podman, "v1"));
    wait_running(
        &podman,
        "fleet-web",
        "web running through the new consumer",
        |_| true,
    );
}

#[test]
fn a_lost_consumer_is_replaced_after_missed_heartbeats_2_9() {
    a_lost_consumer_is_replaced_after_missed_heartbeats(NatsVersion::V2_9);
}

#[test]
fn a_lost_consumer_is_replaced_after_missed_heartbeats_2_14() {
    a_lost_consumer_is_replaced_after_missed_heartbeats(NatsVersion::V2_14);
}

/// A 3-node cluster (R3 buckets): the node the agent is connected to is
/// killed; the agent fails over to another node and keeps converging.
fn cluster_node_killed(v: NatsVersion) {
    let podman = Podman::new();
    let mut cluster = NatsCluster::start_fleet(v, &["dev1"]);
    put_workload(
        &cluster.admin(),
        "dev1",
        "web",
        &quick_sleeper(&podman, "v1"),
    );
    let urls = cluster.urls();
    let ports: Vec<u16> = urls
        .iter()
        .map(|u| {
            u.rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .expect("port")
        })
        .collect();
    let dev = Device::new("dev1", &Settings::new(urls.clone()), Some(&podman));
    let agent = dev.start(Some(&podman));
    let web = wait_running(&podman, "fleet-web", "web running", |_| true);

    let node = poll_until("the agent's node", CONVERGE, || {
        let peers = tcp_peers(agent.pid());
        ports.iter().position(|p| peers.contains(p))
    });
    let from = agent.line_count();
    cluster.kill_node(node);
    cluster.wait_for_leaders(Duration::from_secs(60));
    agent.wait_for_line_after(from, "NATS reconnected", CONVERGE);
    let other = poll_until("a connection to another node", CONVERGE, || {
        let peers = tcp_peers(agent.pid());
        ports
            .iter()
            .position(|p| peers.contains(p))
            .filter(|i| *i != node)
    });
    assert_ne!(other, node);

    put_workload(
        &cluster.admin(),
        "dev1",
        "api",
        &quick_sleeper(&podman, "api"),
    );
    wait_running(
        &podman,
        "fleet-api",
        "api running after the failover",
        |_| true,
    );
    assert_eq!(
        container(&podman, "fleet-web"),
        Some(web),
        "the healthy container was restarted"
    );
}

#[test]
fn cluster_node_killed_2_9() {
    cluster_node_killed(NatsVersion::V2_9);
}

#[test]
fn cluster_node_killed_2_14() {
    cluster_node_killed(NatsVersion::V2_14);
}
