//! The harness's nats-servers: plain, fleet layout (device isolation as
//! `docs/design/security.md` promises it), restart, and a 3-node cluster losing
//! a node, on both supported server versions.

use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use fleet_harness::{
    fleet_server_config, poll_until, ChildGuard, NatsCluster, NatsServer, NatsVersion,
};

const WAIT: Duration = Duration::from_secs(5);

/// A device connection whose server-side errors (permission violations
/// arrive as `-ERR` lines, reported only to the error callback) land in a
/// channel.
fn device_with_errors(server: &NatsServer, id: &str) -> (nats::Connection, mpsc::Receiver<String>) {
    let (tx, rx) = mpsc::channel();
    let conn = server
        .device_options(id)
        .error_callback(move |e| {
            let _ = tx.send(e.to_string());
        })
        .connect(server.url())
        .expect("device connects");
    (conn, rx)
}

/// Options without the crate's random 0..1 s delay before connecting.
fn user(name: &str, password: &str) -> nats::Options {
    nats::Options::with_user_pass(name, password).reconnect_delay_callback(|_| Duration::ZERO)
}

/// Publishes `value` to the device's status key with a JetStream ack on its
/// own inbox, returns the ack.
fn put_status(conn: &nats::Connection, device: &str, key: &str, value: &[u8]) -> serde_json::Value {
    try_put_status(conn, device, key, value, WAIT).expect("JetStream ack on the device inbox")
}

fn try_put_status(
    conn: &nats::Connection,
    device: &str,
    key: &str,
    value: &[u8],
    wait: Duration,
) -> Option<serde_json::Value> {
    let inbox = format!("_INBOX.{device}.{key}");
    let sub = conn.subscribe(&inbox).expect("subscribe own inbox");
    conn.publish_with_reply_or_headers(
        &format!("$KV.fleet-status.{device}.{key}"),
        Some(&inbox),
        None,
        value,
    )
    .expect("publish");
    let ack = sub.next_timeout(wait).ok()?;
    if ack.data.is_empty() {
        // A status message: 503 "no responders" while the stream has no
        // leader (a cluster failing over).
        return None;
    }
    Some(serde_json::from_slice(&ack.data).expect("ack is JSON"))
}

fn plain_server_keeps_data_across_restart(v: NatsVersion) {
    let mut server = NatsServer::start(v);
    let port = server.port();
    assert!(server.url().ends_with(&format!(":{port}")));
    let js = nats::jetstream::new(server.admin());
    let kv = js
        .create_key_value(&nats::kv::Config {
            bucket: "plain".to_owned(),
            ..Default::default()
        })
        .expect("create bucket");
    kv.put("k", b"before").expect("put");
    drop(kv);
    drop(js);

    server.restart();
    assert_eq!(server.port(), port, "restart keeps the port");
    let js = nats::jetstream::new(server.admin());
    let kv = js.key_value("plain").expect("bucket survives restart");
    assert_eq!(kv.get("k").expect("get"), Some(b"before".to_vec()));

    server.kill();
    server.restart();
    let js = nats::jetstream::new(server.admin());
    let kv = js.key_value("plain").expect("bucket survives SIGKILL");
    assert_eq!(kv.get("k").expect("get"), Some(b"before".to_vec()));
}

#[test]
fn plain_server_keeps_data_across_restart_2_9() {
    plain_server_keeps_data_across_restart(NatsVersion::V2_9);
}

#[test]
fn plain_server_keeps_data_across_restart_2_14() {
    plain_server_keeps_data_across_restart(NatsVersion::V2_14);
}

fn fleet_layout_isolates_devices(v: NatsVersion) {
    let server = NatsServer::start_fleet(v, &["devA", "devB"]);
    let js = nats::jetstream::new(server.admin());

    // The three buckets open with the crate's KV helpers; only fleet-status
    // refuses rollups.
    for (bucket, rollup) in [
        ("fleet-desired", true),
        ("fleet-control", true),
        ("fleet-status", false),
    ] {
        js.key_value(bucket).expect("bucket opens as KV");
        let info = js.stream_info(format!("KV_{bucket}")).expect("stream info");
        assert_eq!(info.config.allow_rollup, rollup, "{bucket}");
        assert!(info.config.deny_delete, "{bucket}");
    }
    let desired = js.key_value("fleet-desired").expect("open");
    desired.put("devA.web", b"spec").expect("admin puts");
    assert_eq!(
        desired.get("devA.web").expect("get"),
        Some(b"spec".to_vec())
    );

    // A device writes its own status key with an ack on its own inbox.
    let (a, a_errors) = device_with_errors(&server, "devA");
    let ack = put_status(&a, "devA", "x", b"from-a");
    assert_eq!(ack["stream"], "KV_fleet-status", "ack: {ack}");
    assert!(ack.get("error").is_none(), "ack: {ack}");
    let status = js.key_value("fleet-status").expect("open");
    assert_eq!(status.get("devA.x").expect("get"), Some(b"from-a".to_vec()));

    // A rollup (which would purge every device's status) is refused.
    let inbox = "_INBOX.devA.rollup";
    let sub = a.subscribe(inbox).expect("subscribe");
    let mut headers = nats::header::HeaderMap::new();
    headers.insert("Nats-Rollup", "sub");
    a.publish_with_reply_or_headers(
        "$KV.fleet-status.devA.y",
        Some(inbox),
        Some(&headers),
        b"rollup",
    )
    .expect("publish");
    let ack: serde_json::Value =
        serde_json::from_slice(&sub.next_timeout(WAIT).expect("ack").data).expect("JSON");
    assert!(ack.get("error").is_some(), "rollup accepted: {ack}");
    assert_eq!(status.get("devA.y").expect("get"), None);

    // devA cannot write devB's key: the server answers -ERR, nothing lands.
    a.publish_with_reply_or_headers(
        "$KV.fleet-status.devB.x",
        Some("_INBOX.devA.z"),
        None,
        b"forged",
    )
    .expect("publish is buffered");
    let err = a_errors.recv_timeout(WAIT).expect("permission error");
    assert!(
        err.contains("Permissions Violation for Publish") && err.contains("devB"),
        "{err}"
    );

    // devA cannot listen on devB's inbox: the subscribe is refused with
    // -ERR, and devB's ack is not delivered to it.
    let spy = a.subscribe("_INBOX.devB.>").expect("subscribe is buffered");
    let err = a_errors.recv_timeout(WAIT).expect("permission error");
    assert!(
        err.contains("Permissions Violation for Subscription") && err.contains("_INBOX.devB.>"),
        "{err}"
    );
    let (b, _b_errors) = device_with_errors(&server, "devB");
    let ack = put_status(&b, "devB", "x", b"from-b");
    assert!(ack.get("error").is_none(), "ack: {ack}");
    // devB's ack was sent before the server answers devA's PING: a
    // delivery to the spy would already be queued.
    a.flush_timeout(WAIT).expect("flush");
    assert!(spy.try_next().is_none(), "devA received devB's ack");
    assert_eq!(status.get("devB.x").expect("get"), Some(b"from-b".to_vec()));
    assert_eq!(status.get("devB.x").expect("get"), Some(b"from-b".to_vec()));
    assert!(a_errors.try_recv().is_err(), "no further errors");
}

#[test]
fn fleet_layout_isolates_devices_2_9() {
    fleet_layout_isolates_devices(NatsVersion::V2_9);
}

#[test]
fn fleet_layout_isolates_devices_2_14() {
    fleet_layout_isolates_devices(NatsVersion::V2_14);
}

fn fleet_restart_keeps_data_and_port(v: NatsVersion) {
    let mut server = NatsServer::start_fleet(v, &["dev1"]);
    let port = server.port();
    let js = nats::jetstream::new(server.admin());
    js.key_value("fleet-control")
        .expect("open")
        .put("dev1.agent-upgrade-intent", b"attempt")
        .expect("put");
    server.stop();
    assert!(server.log().is_empty(), "stopped");
    server.restart();
    assert_eq!(server.port(), port);
    let js = nats::jetstream::new(server.admin());
    assert_eq!(
        js.key_value("fleet-control")
            .expect("open")
            .get("dev1.agent-upgrade-intent")
            .expect("get"),
        Some(b"attempt".to_vec())
    );
    let info = js.stream_info("KV_fleet-status").expect("info");
    assert!(!info.config.allow_rollup, "config survives restart");
    let ack = put_status(&server.device("dev1"), "dev1", "heartbeat", b"beat");
    assert!(ack.get("error").is_none(), "ack: {ack}");
}

#[test]
fn fleet_restart_keeps_data_and_port_2_9() {
    fleet_restart_keeps_data_and_port(NatsVersion::V2_9);
}

#[test]
fn fleet_restart_keeps_data_and_port_2_14() {
    fleet_restart_keeps_data_and_port(NatsVersion::V2_14);
}

fn cluster_survives_losing_a_node(v: NatsVersion) {
    let mut cluster = NatsCluster::start_fleet(v, &["dev1"]);
    assert_eq!(cluster.urls().len(), 3);
    let js = nats::jetstream::new(cluster.admin());
    let info = js.stream_info("KV_fleet-desired").expect("info");
    assert_eq!(info.config.num_replicas, 3);
    js.key_value("fleet-desired")
        .expect("open")
        .put("dev1.web", b"spec")
        .expect("put");
    let ack = put_status(&cluster.device("dev1"), "dev1", "info", b"i");
    assert!(ack.get("error").is_none(), "ack: {ack}");
    drop(js);

    cluster.kill_node(0);
    // Through the two live nodes, once every stream led by n0 has elected
    // a new leader.
    let started = std::time::Instant::now();
    cluster.wait_for_leaders(Duration::from_secs(30));
    eprintln!(
        "{v:?}: stream leaders after a node loss in {:?}",
        started.elapsed()
    );
    let admin = cluster.admin();
    let js = nats::jetstream::new(admin);
    let got = poll_until(
        "a read through the surviving nodes",
        Duration::from_secs(30),
        || js.key_value("fleet-desired").ok()?.get("dev1.web").ok(),
    );
    assert_eq!(got, Some(b"spec".to_vec()));
    let kv = js.key_value("fleet-desired").expect("open");
    poll_until(
        "a write with two of three nodes",
        Duration::from_secs(30),
        || kv.put("dev1.web", b"spec2").ok(),
    );
    let device = cluster.device("dev1");
    let ack = poll_until(
        "a device write with two of three nodes",
        Duration::from_secs(30),
        || {
            // A publish to a stream without a leader may get no answer at all.
            try_put_status(&device, "dev1", "info", b"i2", Duration::from_millis(500))
                .filter(|a| a.get("error").is_none())
        },
    );
    assert_eq!(ack["stream"], "KV_fleet-status");
    assert_eq!(
        js.key_value("fleet-status")
            .expect("open")
            .get("dev1.info")
            .expect("get"),
        Some(b"i2".to_vec())
    );
}

#[test]
fn cluster_survives_losing_a_node_2_9() {
    cluster_survives_losing_a_node(NatsVersion::V2_9);
}

#[test]
fn cluster_survives_losing_a_node_2_14() {
    cluster_survives_losing_a_node(NatsVersion::V2_14);
}

/// A password with characters the config syntax treats specially is quoted
/// so the server sees it unchanged.
#[test]
fn generated_config_quotes_passwords() {
    let dir = tempfile::tempdir().expect("tempdir");
    let password = "p\"w\\x$y\tz";
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let config = dir.path().join("nats.conf");
    std::fs::write(
        &config,
        fleet_server_config(
            &[("dev1", password)],
            "adm\"in",
            port,
            &dir.path().join("store"),
        ),
    )
    .expect("write config");
    let mut cmd = Command::new(NatsVersion::V2_9.binary());
    cmd.arg("-c").arg(&config);
    let server = ChildGuard::spawn(cmd, "nats-quoting");
    server.wait_for_line("Server is ready", Duration::from_secs(20));
    let url = format!("nats://127.0.0.1:{port}");
    user("dev1", password)
        .connect(&url)
        .expect("device password as written");
    user("admin", "adm\"in")
        .connect(&url)
        .expect("admin password as written");
    assert!(user("dev1", "p\"w\\x").connect(&url).is_err());
}
