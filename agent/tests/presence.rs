//! Presence from the cluster, on a real 3-node cluster (nats-server 2.9 and
//! 2.14) with the generated fleet layout, real agents (this build and the
//! released 0.2.0) and the real `fleetctl`: a connected agent is online
//! (with its server and RTT), a killed one offline since its last status
//! write, a 0.2.0 agent is shown as any other, and a node that is down makes
//! the devices it alone could tell about `unknown`, never `offline`
//! (docs/design/presence.md).

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Device, Settings, CONVERGE};
use fleet_harness::{bin_path, poll_until, ChildGuard, NatsCluster, NatsVersion};

/// The 3-node clusters of this file, one at a time (a 2-core machine runs
/// two of them and their agents too slowly for fleetctl's reads).
static CLUSTERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// How long a node's death takes to show: each round of presence waits
/// `PRESENCE_TIMEOUT` (2 s) at most, plus fleetctl's connection fail-over.
const SHOWN: Duration = Duration::from_secs(120);

/// `fleetctl status --json` over the cluster, as rows by device; None
/// while fleetctl cannot read the buckets (a node just died: the meta
/// leader's election), with what it said.
fn status(cluster: &NatsCluster, pw: &std::path::Path) -> Option<serde_json::Value> {
    match try_fleetctl(cluster, pw, &["status", "--json"]) {
        Ok(out) => Some(
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}:\n{out}")),
        ),
        Err(e) => {
            eprintln!("{e}");
            None
        }
    }
}

/// `fleetctl ARGS` over the cluster, retried while it cannot read the
/// buckets (as [`status`]).
fn fleetctl(cluster: &NatsCluster, pw: &std::path::Path, args: &[&str]) -> String {
    poll_until(&format!("fleetctl {args:?}"), SHOWN, || {
        try_fleetctl(cluster, pw, args)
            .map_err(|e| eprintln!("{e}"))
            .ok()
    })
}

fn try_fleetctl(
    cluster: &NatsCluster,
    pw: &std::path::Path,
    args: &[&str],
) -> Result<String, String> {
    let mut cmd = Command::new(bin_path("fleetctl"));
    cmd.args(args);
    for url in cluster.live_urls().split(',') {
        cmd.args(["--server", url]);
    }
    let out = cmd
        .arg("--password-file")
        .arg(pw)
        .env_remove("FLEET_NATS_URL")
        .env_remove("FLEET_NATS_PASSWORD_FILE")
        .output()
        .expect("run fleetctl");
    if !out.status.success() {
        return Err(format!(
            "fleetctl {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn row<'a>(rows: &'a serde_json::Value, device: &str) -> Option<&'a serde_json::Value> {
    rows.as_array()?.iter().find(|r| r["device"] == device)
}

fn connection_of(rows: &serde_json::Value, device: &str) -> Option<String> {
    row(rows, device)?["connection"].as_str().map(str::to_owned)
}

/// A 0.2.0 agent of `dev` (its config without the keys 0.3 added).
fn released_0_2(dev: &Device) -> ChildGuard {
    let binary = fleet_harness::test_agent_path(fleet_harness::RELEASED_AGENT_0_2_VERSION);
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&dev.config).expect("read")).expect("json");
    cfg["intervals"] =
        serde_json::json!({"heartbeat-secs": 1, "resync-secs": 2, "check-secs": 3600});
    std::fs::write(&dev.config, cfg.to_string()).expect("write");
    let mut agent = ChildGuard::spawn(dev.command_of(&binary, &["run"], None), "agent-0.2.0");
    dev.wait_ready(&mut agent);
    agent
}

fn presence_on_a_cluster(v: NatsVersion) {
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = NatsCluster::start_fleet(v, &["dev-a", "dev-b", "dev-c"]);
    let urls = cluster.urls();
    let work = tempfile::tempdir().expect("tempdir");
    let pw = work.path().join("admin-password");
    std::fs::write(&pw, format!("{}\n", fleet_harness::NATS_ADMIN_PASSWORD)).expect("pw");
    // Each device on one node only, so that which server holds it is known.
    let device = |id: &str, node: usize| {
        let mut s = Settings::new(vec![urls[node].clone()]);
        s.podman = false;
        Device::new(id, &s, None)
    };
    let a = device("dev-a", 0);
    let _agent_a = a.start(None);
    let b = device("dev-b", 1);
    let _agent_b = released_0_2(&b);
    let c = device("dev-c", 2);
    let mut agent_c = c.start(None);

    let rows = poll_until("every device online", CONVERGE, || {
        let rows = status(&cluster, &pw)?;
        ["dev-a", "dev-b", "dev-c"]
            .iter()
            .all(|d| connection_of(&rows, d).as_deref() == Some("online"))
            .then_some(rows)
    });
    for (d, server) in [("dev-a", "n0"), ("dev-b", "n1"), ("dev-c", "n2")] {
        let r = row(&rows, d).expect("row");
        assert_eq!(r["connected"]["server"], server, "{r}");
        assert!(r["connected"]["rtt"].is_string(), "{r}");
        assert!(r["connected"]["since"].is_string(), "{r}");
    }
    assert_eq!(row(&rows, "dev-b").expect("row")["agent-version"], "0.2.0");
    let table = fleetctl(&cluster, &pw, &["status"]);
    assert!(table.starts_with("DEVICE"), "{table}");
    assert!(table.contains("CONNECTION"), "{table}");
    let detail = fleetctl(&cluster, &pw, &["device", "status", "dev-b"]);
    assert!(
        detail.contains("connection: online to server n1 since "),
        "{detail}"
    );

    // A killed agent: its kernel closes the socket, the server drops it.
    agent_c.kill();
    let rows = poll_until("dev-c offline", SHOWN, || {
        let rows = status(&cluster, &pw)?;
        (connection_of(&rows, "dev-c").as_deref() == Some("offline")).then_some(rows)
    });
    let r = row(&rows, "dev-c").expect("row");
    assert!(r["offline-since"].is_string(), "{r}");
    assert_eq!(connection_of(&rows, "dev-a").as_deref(), Some("online"));
    let detail = fleetctl(&cluster, &pw, &["device", "status", "dev-c"]);
    assert!(detail.contains("connection: offline since "), "{detail}");

    // A node down: what only it could tell (dev-c, last on it) is unknown,
    // never offline; dev-a, on a live node, stays online.
    cluster.kill_node(2);
    cluster.wait_for_leaders(SHOWN);
    let rows = poll_until("dev-c unknown with n2 down", SHOWN, || {
        let rows = status(&cluster, &pw)?;
        (connection_of(&rows, "dev-c").as_deref() == Some("unknown")).then_some(rows)
    });
    assert_eq!(connection_of(&rows, "dev-a").as_deref(), Some("online"));
    let r = row(&rows, "dev-c").expect("row");
    assert_eq!(r["connection-unknown"], "server n2 did not answer", "{r}");
    let table = fleetctl(&cluster, &pw, &["status"]);
    assert!(
        table.contains("connection unknown: server n2 did not answer"),
        "{table}"
    );
}

#[test]
fn presence_on_a_3_node_cluster_2_9() {
    presence_on_a_cluster(NatsVersion::V2_9);
}

#[test]
fn presence_on_a_3_node_cluster_2_14() {
    presence_on_a_cluster(NatsVersion::V2_14);
}

/// A server config that predates presence: fleetctl says the cluster gives
/// none, at once, and judges by heartbeat (a 0.3 agent's fresh heartbeat:
/// not stale).
#[test]
fn a_server_config_without_presence_falls_back_to_heartbeats() {
    let password = fleet_harness::device_password("dev-a");
    let server = fleet_harness::NatsServer::start_with_config(NatsVersion::V2_14, |port, store| {
        fleet_harness::without_presence(&fleet_harness::fleet_server_config(
            &[("dev-a", password.as_str())],
            fleet_harness::NATS_ADMIN_PASSWORD,
            port,
            store,
        ))
    });
    let work = tempfile::tempdir().expect("tempdir");
    let pw = work.path().join("admin-password");
    std::fs::write(&pw, format!("{}\n", fleet_harness::NATS_ADMIN_PASSWORD)).expect("pw");
    let mut s = Settings::new(vec![server.url()]);
    s.podman = false;
    let a = Device::new("dev-a", &s, None);
    let _agent = a.start(None);
    let run = |args: &[&str]| {
        let out = Command::new(bin_path("fleetctl"))
            .args(args)
            .args(["--server", &server.url(), "--password-file"])
            .arg(&pw)
            .env_remove("FLEET_NATS_URL")
            .env_remove("FLEET_NATS_PASSWORD_FILE")
            .output()
            .expect("run fleetctl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    poll_until("dev-a's heartbeat", CONVERGE, || {
        run(&["status"]).contains("dev-a").then_some(())
    });
    let started = std::time::Instant::now();
    let rows: serde_json::Value = serde_json::from_str(&run(&["status", "--json"])).expect("json");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no presence is known at once, not after a wait: {:?}",
        started.elapsed()
    );
    let r = row(&rows, "dev-a").expect("row");
    assert!(r["connection"].is_null(), "{r}");
    assert_eq!(r["stopped"], false);
    let detail = run(&["device", "status", "dev-a"]);
    assert!(
        detail.contains("connection: - (the cluster gives no presence: judged by heartbeat)"),
        "{detail}"
    );
    let summary = run(&["status", "--group-by", "site"]);
    assert!(summary.contains("0 stale heartbeats"), "{summary}");
}

/// One server, no cluster: it is the one expected (the status stream's
/// leader), so fleetctl does not wait out the bound for others.
#[test]
fn a_single_server_gives_presence_without_waiting_out_the_bound() {
    let server = fleet_harness::NatsServer::start_fleet(NatsVersion::V2_9, &["dev-a"]);
    let work = tempfile::tempdir().expect("tempdir");
    let pw = work.path().join("admin-password");
    std::fs::write(&pw, format!("{}\n", fleet_harness::NATS_ADMIN_PASSWORD)).expect("pw");
    let mut s = Settings::new(vec![server.url()]);
    s.podman = false;
    let a = Device::new("dev-a", &s, None);
    let _agent = a.start(None);
    let run = || {
        let started = std::time::Instant::now();
        let out = Command::new(bin_path("fleetctl"))
            .args([
                "status",
                "--json",
                "--server",
                &server.url(),
                "--password-file",
            ])
            .arg(&pw)
            .env_remove("FLEET_NATS_URL")
            .env_remove("FLEET_NATS_PASSWORD_FILE")
            .output()
            .expect("run fleetctl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        (rows, started.elapsed())
    };
    let (_, took) = poll_until("dev-a online", CONVERGE, || {
        let (rows, took) = run();
        (connection_of(&rows, "dev-a").as_deref() == Some("online")).then_some((rows, took))
    });
    assert!(
        took < Duration::from_secs(2),
        "status took {took:?}: it waited for a server it did not know"
    );
}

/// A bare NATS client of device `id` on `addr`: CONNECT as its static user
/// and PING, answered PONG. The socket stays open while it lives.
fn bare_device(addr: std::net::SocketAddr, id: &str) -> std::net::TcpStream {
    use std::io::{BufRead, BufReader, Write};
    let s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| {
        panic!("connecting device {id} to {addr}: {e} (raise `ulimit -n`: the test holds thousands of sockets)")
    });
    s.set_read_timeout(Some(CONVERGE)).expect("timeout");
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let mut line = String::new();
    r.read_line(&mut line).expect("INFO");
    let connect = serde_json::json!({
        "user": id, "pass": fleet_harness::device_password(id),
        "verbose": false, "pedantic": false, "name": format!("bare {id}"),
    });
    (&s).write_all(format!("CONNECT {connect}\r\nPING\r\n").as_bytes())
        .expect("CONNECT");
    line.clear();
    r.read_line(&mut line).expect("PONG");
    assert_eq!(line.trim_end(), "PONG", "device {id} was not accepted");
    s
}

/// Thousands of devices on a 3-node cluster, more than a page per server:
/// presence pages through each server and finds every one, in bounded time.
#[test]
fn presence_pages_through_thousands_of_connections() {
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    const DEVICES: usize = 3_600; // 1,200 a server: two pages each
    let ids: Vec<String> = (0..DEVICES).map(|i| format!("bulk-{i:05}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let cluster = NatsCluster::start_fleet(NatsVersion::V2_14, &refs);
    let addrs = cluster.client_addrs();
    let admin = cluster.admin();
    let status_kv = nats::jetstream::new(admin.clone())
        .key_value("fleet-status")
        .expect("fleet-status");
    let now = fleet_common::Timestamp::now();
    let _sockets: Vec<std::net::TcpStream> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            // fleetctl lists devices that wrote a key: a heartbeat each.
            let beat = fleet_common::contracts::Heartbeat {
                at: now,
                uptime_secs: 1,
                agent_version: fleet_common::validate::Version::parse("0.3.0").expect("v"),
                config_state: fleet_common::contracts::ConfigStateReport {
                    state: fleet_common::contracts::ConfigState::Configured,
                    waiting_changes: 0,
                    intent_waiting: false,
                },
                stopping: None,
                podman_unreachable: None,
            };
            status_kv
                .put(
                    &format!("{id}.heartbeat"),
                    serde_json::to_vec(&beat).expect("json"),
                )
                .expect("put heartbeat");
            bare_device(addrs[i % addrs.len()], id)
        })
        .collect();
    let work = tempfile::tempdir().expect("tempdir");
    let pw = work.path().join("admin-password");
    std::fs::write(&pw, format!("{}\n", fleet_harness::NATS_ADMIN_PASSWORD)).expect("pw");
    let started = std::time::Instant::now();
    let rows = status(&cluster, &pw).expect("fleetctl status");
    let took = started.elapsed();
    let rows = rows.as_array().expect("rows");
    assert_eq!(rows.len(), DEVICES);
    let online = rows.iter().filter(|r| r["connection"] == "online").count();
    let not: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["connection"] != "online")
        .take(3)
        .collect();
    assert_eq!(online, DEVICES, "not online: {not:?}");
    let mut per_server: std::collections::BTreeMap<String, usize> = Default::default();
    for r in rows {
        *per_server
            .entry(r["connected"]["server"].as_str().unwrap_or("-").to_owned())
            .or_default() += 1;
    }
    assert_eq!(
        per_server.values().copied().collect::<Vec<_>>(),
        vec![DEVICES / 3; 3],
        "{per_server:?}"
    );
    eprintln!("fleetctl status --json over {DEVICES} connected devices: {took:?}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

/// The recorder keeps a killed device's disconnect time in `fleet-operator`
/// (replicated): after a node restart, another fleetctl shows it offline
/// since that time, not since its older last status write.
#[test]
fn last_seen_is_recorded_and_survives_a_node_restart() {
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = NatsCluster::start_fleet(NatsVersion::V2_14, &["dev-a"]);
    let urls = cluster.urls();
    let work = tempfile::tempdir().expect("tempdir");
    let pw = work.path().join("admin-password");
    std::fs::write(&pw, format!("{}\n", fleet_harness::NATS_ADMIN_PASSWORD)).expect("pw");
    let mut rec = Command::new(bin_path("fleetctl"));
    rec.args(["presence", "record", "--batch-secs", "1"]);
    for url in &urls {
        rec.args(["--server", url]);
    }
    rec.arg("--password-file")
        .arg(&pw)
        .env_remove("FLEET_NATS_URL")
        .env_remove("FLEET_NATS_PASSWORD_FILE");
    let recorder = ChildGuard::spawn(rec, "fleetctl-presence-record");
    recorder.wait_for_line("recording last-seen", CONVERGE);

    let mut s = Settings::new(vec![urls[1].clone()]);
    s.podman = false;
    // A slow keep-alive: its last status write is well before it goes.
    s.keepalive_secs = 3600;
    let a = Device::new("dev-a", &s, None);
    let mut agent = a.start(None);
    poll_until("dev-a online", CONVERGE, || {
        (connection_of(&status(&cluster, &pw)?, "dev-a").as_deref() == Some("online")).then_some(())
    });
    // Its last status write and its stop must differ to tell which is shown.
    let admin = cluster.admin();
    let beat: fleet_common::contracts::Heartbeat =
        poll_until("dev-a's heartbeat", CONVERGE, || {
            common::status(&admin, "dev-a", "heartbeat")
        });
    poll_until("a second past dev-a's heartbeat", CONVERGE, || {
        (fleet_common::Timestamp::now().since(beat.at) > Duration::from_secs(1)).then_some(())
    });
    agent.kill();
    let operator = nats::jetstream::new(cluster.admin())
        .key_value("fleet-operator")
        .expect("fleet-operator");
    let seen: fleet_common::presence::LastSeen =
        poll_until("dev-a's last-seen recorded", CONVERGE, || {
            operator
                .get("presence.dev-a")
                .ok()
                .flatten()
                .and_then(|b| serde_json::from_slice(&b).ok())
        });
    assert_eq!(seen.server, "n1");

    cluster.kill_node(0);
    cluster
        .restart_node_lame_duck(0, SHOWN)
        .expect("node n0 back, replicas current");
    let rows = poll_until("dev-a offline after the restart", SHOWN, || {
        let rows = status(&cluster, &pw)?;
        (connection_of(&rows, "dev-a").as_deref() == Some("offline")).then_some(rows)
    });
    let r = row(&rows, "dev-a").expect("row");
    assert_eq!(r["offline-since"], seen.at.to_string(), "{r}");
    assert_ne!(r["offline-since"], r["heartbeat-at"], "{r}");
}

/// A device admitted by the auth callout (2.14): its connection's user is
/// the key the callout issued; presence names it by the JWT's name, the
/// device id the callout put there.
#[test]
fn a_device_admitted_by_the_callout_is_named_by_its_issued_user() {
    use fleet_harness::{claims, rs256, CalloutNats, Idp, RSA_KID};
    let idp = Idp::start();
    let nats = CalloutNats::start(&idp, serde_json::json!({}));
    let _dev = nats.device(
        "dev-a",
        &rs256(&idp.keys.rsa, RSA_KID, &claims("dev-a", 600)),
    );
    let work = tempfile::tempdir().expect("tempdir");
    let pw = work.path().join("admin-password");
    std::fs::write(&pw, format!("{}\n", fleet_harness::NATS_ADMIN_PASSWORD)).expect("pw");
    // dev-a wrote no key: give it one so that status lists it.
    let admin = nats.server.admin();
    nats::jetstream::new(admin)
        .key_value("fleet-operator")
        .expect("fleet-operator")
        .put("labels.dev-a", br#"{"labels":{"site":"x"}}"#)
        .expect("label");
    let out = Command::new(bin_path("fleetctl"))
        .args([
            "device",
            "status",
            "dev-a",
            "--server",
            &nats.server.url(),
            "--password-file",
        ])
        .arg(&pw)
        .env_remove("FLEET_NATS_URL")
        .env_remove("FLEET_NATS_PASSWORD_FILE")
        .output()
        .expect("run fleetctl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("connection: online to server "),
        "{text}\n{}",
        nats.logs()
    );
}

/// A link cut without a FIN or a reset (every packet dropped in the
/// device's network namespace, as a dead cellular link), on a 3-node
/// cluster: presence says `online` until the server's pings go unanswered,
/// then `offline`; the agent's own pings find the link dead, and once the
/// link works again it connects again and is `online` on a new connection. The server's and
/// the agent's ping intervals are 2 s here instead of 240 s and 200 s
/// (docs/operator/traffic.md), so that the bound is seconds, not minutes.
/// `fleetctl watch` prints each connection opened and closed, with the
/// server's reason.
#[test]
fn a_link_cut_without_a_fin_is_offline_once_the_pings_fail_and_the_agent_comes_back() {
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    let ns = fleet_harness::NetNs::new();
    let cluster = NatsCluster::start_fleet_with(
        NatsVersion::V2_9,
        &["dev-a"],
        &fleet_harness::ClusterOptions {
            listen_any: true,
            ping_interval: Some(Duration::from_secs(2)),
            ..Default::default()
        },
    );
    let work = tempfile::tempdir().expect("tempdir");
    let pw = work.path().join("admin-password");
    std::fs::write(&pw, format!("{}\n", fleet_harness::NATS_ADMIN_PASSWORD)).expect("pw");
    let status = || poll_until("a status read", SHOWN, || status(&cluster, &pw));
    let mut watch = Command::new(bin_path("fleetctl"));
    watch.arg("watch");
    for url in cluster.urls() {
        watch.args(["--server", &url]);
    }
    watch
        .arg("--password-file")
        .arg(&pw)
        .env_remove("FLEET_NATS_URL")
        .env_remove("FLEET_NATS_PASSWORD_FILE");
    let watch = ChildGuard::spawn(watch, "fleetctl-watch");
    watch.wait_for_line("watching fleet-status and device connections", CONVERGE);
    // The device lists every node, at the host's end of its link.
    let servers = cluster
        .client_addrs()
        .iter()
        .map(|a| format!("nats://{}:{}", ns.host_addr(), a.port()))
        .collect();
    let mut s = Settings::new(servers);
    s.podman = false;
    s.ping_secs = 2;
    let a = Device::new("dev-a", &s, None);
    let mut agent = ChildGuard::spawn(ns.command(&a.command(&["run"], None)), "agent-dev-a");
    a.wait_ready(&mut agent);
    let first = poll_until("dev-a online", CONVERGE, || {
        let rows = status();
        (connection_of(&rows, "dev-a").as_deref() == Some("online"))
            .then(|| row(&rows, "dev-a").expect("row")["connected"].clone())
    });
    assert_eq!(
        first["server"].as_str().map(|s| s.is_empty()),
        Some(false),
        "{first}"
    );

    watch.wait_for_line(" dev-a connection: online to ", CONVERGE);

    ns.cut();
    let cut = std::time::Instant::now();
    let from = watch.line_count();
    // Nothing reached the server: it still holds the connection for a
    // while, then closes it when its pings go unanswered.
    poll_until(
        "dev-a offline after the cut",
        Duration::from_secs(60),
        || (connection_of(&status(), "dev-a").as_deref() == Some("offline")).then_some(()),
    );
    let shown = cut.elapsed();
    eprintln!("a silent link cut was shown offline after {shown:?}");
    assert!(
        shown >= Duration::from_secs(2),
        "offline after {shown:?}: before the server's first ping could go unanswered"
    );
    assert!(
        agent.try_wait().is_none(),
        "the agent lives on: {}",
        agent.log()
    );
    // What the server said when it gave up on the connection.
    let closed = watch.wait_for_line_after(from, " dev-a connection: offline from ", CONVERGE);
    assert!(closed.ends_with("(Stale Connection)"), "{closed}");
    let from = watch.line_count();

    ns.restore();
    let restored = std::time::Instant::now();
    let again = poll_until("dev-a online again", Duration::from_secs(120), || {
        let rows = status();
        (connection_of(&rows, "dev-a").as_deref() == Some("online"))
            .then(|| row(&rows, "dev-a").expect("row")["connected"].clone())
    });
    assert_ne!(
        again["since"], first["since"],
        "a new connection: {first} then {again}"
    );
    eprintln!(
        "online again {:?} after the link came back",
        restored.elapsed()
    );
    watch.wait_for_line_after(from, " dev-a connection: online to ", CONVERGE);
}
