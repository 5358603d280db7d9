//! Simulated devices enrolling through the real auth callout and
//! nats-server 2.14: each asks to join with its own key and the
//! enrollment token, an auto-approve rule approves it, it connects as
//! itself and reads its keys; a device the rule does not cover stays
//! pending and reads nothing; the server restarted, every approved device
//! is admitted again through the callout (its record checked anew); on a
//! 3-node cluster with two callouts, a node killed together with one
//! callout, every device on it is admitted again through the survivor.

use std::time::Duration;

use fleet_common::contracts::{DeviceRecord as RegistryRecord, RecordState};
use fleet_common::subjects::BUCKET_REGISTRY;
use fleet_harness::{admin_get, poll_until, CalloutCluster, CalloutNats, ClusterOptions, Idp};
use fleet_sim::{device_key, Generation, Sim, SimAuth, SimConfig};
use serde_json::json;

const TOKEN: &str = "batch-2026-token";
const DEVICES: usize = 120;

/// One test at a time: each runs servers, callouts and 120 devices, and
/// side by side on a loaded machine an attempt can outwait its answer.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The callouts' config: the token file (written 0600 in `dir`) and the
/// auto-approve `rule`.
fn callout_config(dir: &std::path::Path, rule: &str) -> serde_json::Value {
    use std::os::unix::fs::PermissionsExt;
    let token = dir.join("enrollment-token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("write");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    json!({"enrollment": {"token_files": [token], "auto_approve": rule}})
}

/// The first few devices without their keys: id, last error, requests.
fn behind(sim: &Sim, ids: &[String]) -> Vec<(String, Option<String>, u64)> {
    sim.records()
        .iter()
        .zip(ids)
        .filter(|(r, _)| r.snapshots.is_empty())
        .map(|(r, id)| (id.clone(), r.last_error.clone(), r.enroll_asks))
        .take(5)
        .collect()
}

/// Generation-2 devices `ids` enrolling with [`TOKEN`] on `servers`.
fn enrolling_sim(servers: Vec<std::net::SocketAddr>, ids: &[String]) -> Sim {
    let mut cfg = SimConfig::new(
        servers,
        ids.to_vec(),
        fleet_harness::device_password,
        Generation::Two,
    );
    cfg.auth = SimAuth::Enrollment {
        token: TOKEN.to_owned(),
    };
    Sim::start(cfg).expect("sim")
}

#[test]
fn simulated_devices_enroll_by_the_rule_connect_as_themselves_and_come_back_after_a_restart() {
    let _serial = serial();
    let idp = Idp::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut nats = CalloutNats::start(&idp, callout_config(dir.path(), "arch=x86_64"));
    let _second = nats.start_callout();

    let ids: Vec<String> = (0..DEVICES).map(|i| format!("sim-enroll-{i:04}")).collect();
    let sim = enrolling_sim(vec![nats.client_addr()], &ids);
    let all_up = |recs: &[fleet_sim::DeviceRecord]| {
        recs.iter()
            .all(|r| r.approved.is_some() && !r.snapshots.is_empty())
    };
    assert!(
        sim.wait_until(Duration::from_secs(90), all_up),
        "not every device enrolled and read its keys: {:?}\n{}",
        behind(&sim, &ids),
        nats.logs()
    );
    {
        let recs = sim.records();
        // One request each (approved at once), then the device's own
        // connection: two handshakes at least.
        assert!(recs.iter().all(|r| r.enroll_asks == 1), "asked again");
        assert!(recs.iter().all(|r| r.handshakes.len() >= 2));
        assert!(recs.iter().all(|r| r.status_acked >= 1), "status written");
    }
    // The registry holds each device approved with its own key.
    let admin = nats.server.admin();
    for id in [&ids[0], &ids[DEVICES - 1]] {
        let body = admin_get(&admin, BUCKET_REGISTRY, id).expect("record");
        let rec: RegistryRecord = serde_json::from_slice(&body).expect("record json");
        assert_eq!(rec.state, RecordState::Approved, "{id}");
        assert_eq!(
            rec.public_key.as_deref(),
            Some(device_key(id).public_key().as_str())
        );
    }

    // Every device admitted again after the server restarts: the callout
    // checks each reconnect against the registry.
    let before: Vec<usize> = sim.records().iter().map(|r| r.connects.len()).collect();
    nats.server.restart();
    assert!(
        sim.wait_until(Duration::from_secs(90), |recs| recs
            .iter()
            .zip(&before)
            .all(|(r, b)| r.connects.len() > *b && r.server.is_some())),
        "not every device came back\n{}",
        nats.logs()
    );
    sim.stop().expect("sim loop");
}

#[test]
fn a_simulated_device_outside_the_rule_stays_pending_and_reads_nothing() {
    let _serial = serial();
    let idp = Idp::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let nats = CalloutNats::start(&idp, callout_config(dir.path(), "arch=riscv64"));
    let ids = vec!["sim-lobby-1".to_owned()];
    let sim = enrolling_sim(vec![nats.client_addr()], &ids);
    assert!(
        sim.wait_until(Duration::from_secs(30), |recs| recs[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("Pending"))),
        "no pending answer: {:?}\n{}",
        sim.records()[0].last_error,
        nats.logs()
    );
    let admin = nats.server.admin();
    let body = admin_get(&admin, BUCKET_REGISTRY, &ids[0]).expect("record");
    let rec: RegistryRecord = serde_json::from_slice(&body).expect("record json");
    assert_eq!(rec.state, RecordState::Pending);
    let recs = sim.records();
    assert!(recs[0].approved.is_none());
    assert!(recs[0].connects.is_empty(), "connected as itself");
    assert!(recs[0].snapshots.is_empty() && recs[0].status_puts == 0);
}

#[test]
fn on_a_cluster_devices_enroll_and_come_back_through_the_surviving_callout_after_a_node_kill() {
    let _serial = serial();
    let idp = Idp::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fleet = CalloutCluster::start(
        &idp,
        callout_config(dir.path(), "arch=x86_64"),
        2,
        ClusterOptions::default(),
    );
    let ids: Vec<String> = (0..DEVICES)
        .map(|i| format!("sim-cluster-{i:04}"))
        .collect();
    let sim = enrolling_sim(fleet.cluster.client_addrs(), &ids);
    assert!(
        sim.wait_until(Duration::from_secs(120), |recs| recs
            .iter()
            .all(|r| r.approved.is_some() && !r.snapshots.is_empty())),
        "not every device enrolled on the cluster: {:?}\n{}",
        behind(&sim, &ids),
        fleet.logs()
    );
    let recs = sim.records();
    let on_first: Vec<usize> = (0..DEVICES)
        .filter(|i| recs[*i].server == Some(0))
        .collect();
    assert!(
        on_first.len() >= DEVICES / 10,
        "the devices did not spread over the nodes: {} on node 0",
        on_first.len()
    );
    let before: Vec<usize> = recs.iter().map(|r| r.connects.len()).collect();
    drop(recs);

    // The node and one callout go at once: node 0's devices reconnect to
    // the other two nodes, and only the surviving callout can admit them.
    fleet.cluster.kill_node(0);
    drop(fleet.callouts.remove(0));
    assert!(
        sim.wait_until(Duration::from_secs(120), |recs| on_first.iter().all(|i| {
            let r = &recs[*i];
            r.connects.len() > before[*i] && matches!(r.server, Some(s) if s != 0)
        })),
        "not every device of the killed node came back: {:?}\n{}",
        on_first
            .iter()
            .map(|i| (&ids[*i], sim.records()[*i].last_error.clone()))
            .filter(|(_, e)| e.is_some())
            .take(5)
            .collect::<Vec<_>>(),
        fleet.logs()
    );
    // None enrolled again: each came back with its stored credential.
    assert!(
        sim.records().iter().all(|r| r.enroll_asks == 1),
        "asked again"
    );
    let admin = fleet.cluster.admin();
    // The bucket may still be electing a leader in place of node 0's.
    let body = poll_until(
        "the registry record after the node kill",
        Duration::from_secs(30),
        || {
            let kv = nats::jetstream::new(admin.clone())
                .key_value(BUCKET_REGISTRY)
                .ok()?;
            kv.get(&ids[on_first[0]]).ok()?
        },
    );
    let rec: RegistryRecord = serde_json::from_slice(&body).expect("record json");
    assert_eq!(rec.state, RecordState::Approved);
    sim.stop().expect("sim loop");
}
