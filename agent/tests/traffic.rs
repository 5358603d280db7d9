//! What an agent sends, on a real nats-server (2.9 and 2.14) with the fleet
//! layout and a monitoring port: its traffic counters (`<device>.traffic`)
//! agree with the server's own socket of the connection (`ss -ti`, the
//! kernel's counters on the server's side) and bound the server's view of
//! the NATS messages (`/connz`); an idle agent writes nothing but its
//! keep-alive, and a change is written at once; noise that another device
//! has the server deliver onto this device's republished subject is
//! counted and dropped, costing no reads and no log line per message,
//! while real changes still arrive at once.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{monitor_json, status, tcp_local_ports, Device, Settings, CONVERGE};
use fleet_common::contracts::{Heartbeat, TrafficReport, WorkloadsReport};
use fleet_harness::{
    fleet_server_config, poll_until, ChildGuard, NatsServer, NatsVersion, NATS_ADMIN_PASSWORD,
};

/// A workload spec (the agents here run no Podman: they report it).
const SPEC: &str = r#"{"image":"docker.io/library/busybox:1.36","command":["sleep","1000"]}"#;

/// A fleet-layout server for `devices` with a monitoring port.
fn monitored_server(v: NatsVersion, devices: &[&str]) -> (NatsServer, SocketAddr) {
    let monitor = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free monitoring port");
    let passwords: Vec<String> = devices
        .iter()
        .map(|d| fleet_harness::device_password(d))
        .collect();
    let creds: Vec<(&str, &str)> = devices
        .iter()
        .zip(&passwords)
        .map(|(d, p)| (*d, p.as_str()))
        .collect();
    let server = NatsServer::start_with_config(v, |port, store| {
        let mut text = fleet_server_config(&creds, NATS_ADMIN_PASSWORD, port, store);
        text.push_str(&format!("\nhttp: \"{monitor}\"\n"));
        text
    });
    (server, monitor)
}

/// A Podman-less agent of `id` on `server` with `settings` changed by `f`.
fn agent(server: &NatsServer, id: &str, f: impl FnOnce(&mut Settings)) -> (Device, ChildGuard) {
    let mut settings = Settings::new(vec![server.url()]);
    settings.podman = false;
    f(&mut settings);
    let dev = Device::new(id, &settings, None);
    let mut child = dev.spawn(None);
    dev.wait_ready(&mut child);
    (dev, child)
}

/// The kernel's counters of the server's side of one connection.
#[derive(Debug, Default, Clone, Copy)]
struct ServerSocket {
    bytes_acked: u64,
    bytes_received: u64,
    segs_out: u64,
    segs_in: u64,
}

/// `ss -tin` of the server's socket from `server_port` to `peer_port`.
fn server_socket(server_port: u16, peer_port: u16) -> ServerSocket {
    let out = Command::new("ss")
        .args(["-tinH", "state", "established"])
        .arg(format!(
            "( sport = :{server_port} and dport = :{peer_port} )"
        ))
        .output()
        .expect("ss runs (Debian package iproute2)");
    assert!(out.status.success(), "ss: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> u64 {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    ServerSocket {
        bytes_acked: field("bytes_acked:"),
        bytes_received: field("bytes_received:"),
        segs_out: field("segs_out:"),
        segs_in: field("segs_in:"),
    }
}

fn traffic(admin: &nats::Connection, id: &str) -> Option<TrafficReport> {
    status(admin, id, "traffic")
}

/// The next traffic report after `after` (its observed-at).
fn next_report(admin: &nats::Connection, id: &str, after: &TrafficReport) -> TrafficReport {
    poll_until("the next traffic report", CONVERGE, || {
        traffic(admin, id).filter(|r| r.observed_at > after.observed_at)
    })
}

/// The agent's connection in `/connz`.
fn connz_of(monitor: SocketAddr, name: &str) -> serde_json::Value {
    let all = monitor_json(monitor, "/connz?limit=1024");
    all["connections"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name).cloned())
        .unwrap_or_else(|| panic!("no connection named {name} in {all}"))
}

fn counters_agree_with_the_servers_socket(v: NatsVersion) {
    let (server, monitor) = monitored_server(v, &["dev1"]);
    let admin = server.admin();
    let (_dev, agent) = agent(&server, "dev1", |s| s.traffic_secs = 2);
    let ports = tcp_local_ports(agent.pid(), server.port());
    assert_eq!(ports.len(), 1, "one NATS connection: {ports:?}");
    let first = poll_until("a traffic report with traffic", CONVERGE, || {
        traffic(&admin, "dev1").filter(|r| r.total.bytes_sent > 0)
    });
    // The server's socket read between two reports lies between them: the
    // counters only grow, and each report is read just before it is sent.
    let before = next_report(&admin, "dev1", &first);
    let s = server_socket(server.port(), ports[0]);
    let conn = connz_of(monitor, "fleet-agent dev1");
    let after = next_report(&admin, "dev1", &before);
    eprintln!(
        "traffic {v:?}: before {before:?}\nserver socket {s:?}\nafter {after:?}\nconnz {conn}"
    );
    // The agent's acknowledged bytes count its SYN as one.
    let sent = s.bytes_received + 1;
    assert!(
        before.total.bytes_sent <= sent && sent <= after.total.bytes_sent,
        "sent: agent {} .. {}, server received {}",
        before.total.bytes_sent,
        after.total.bytes_sent,
        s.bytes_received
    );
    // The server's acknowledged bytes count its SYN as one.
    let received = s.bytes_acked.saturating_sub(1);
    assert!(
        before.total.bytes_received <= received && received <= after.total.bytes_received,
        "received: agent {} .. {}, server acknowledged {}",
        before.total.bytes_received,
        after.total.bytes_received,
        s.bytes_acked
    );
    assert!(
        before.total.segments_sent <= s.segs_in && s.segs_in <= after.total.segments_sent,
        "segments sent: agent {} .. {}, server in {}",
        before.total.segments_sent,
        after.total.segments_sent,
        s.segs_in
    );
    assert!(
        before.total.segments_received <= s.segs_out && s.segs_out <= after.total.segments_received,
        "segments received: agent {} .. {}, server out {}",
        before.total.segments_received,
        after.total.segments_received,
        s.segs_out
    );
    // The server's NATS view counts message payloads only: the TCP payload
    // carries them plus the protocol's framing (subjects, reply subjects,
    // headers, CONNECT/INFO, PING/PONG).
    let payload_in = conn["in_bytes"].as_u64().expect("in_bytes");
    let payload_out = conn["out_bytes"].as_u64().expect("out_bytes");
    assert!(payload_in > 0 && payload_out > 0, "{conn}");
    assert!(payload_in < after.total.bytes_sent, "{conn}");
    assert!(payload_out < after.total.bytes_received, "{conn}");
    eprintln!(
        "framing: sent {} B of TCP payload for {payload_in} B of message payload in {} messages; received {} B for {payload_out} B in {} messages",
        s.bytes_received, conn["in_msgs"], s.bytes_acked, conn["out_msgs"]
    );
    assert_eq!(after.total.reconnects, 0);
    assert_eq!(after.today.counters.bytes_sent, after.total.bytes_sent);
}

#[test]
fn traffic_counters_agree_with_the_servers_socket_2_9() {
    counters_agree_with_the_servers_socket(NatsVersion::V2_9);
}

#[test]
fn traffic_counters_agree_with_the_servers_socket_2_14() {
    counters_agree_with_the_servers_socket(NatsVersion::V2_14);
}

/// The last sequence of the status stream: one more per write.
fn status_writes(admin: &nats::Connection) -> u64 {
    let js = nats::jetstream::new(admin.clone());
    js.stream_info("KV_fleet-status")
        .expect("status stream info")
        .state
        .last_seq
}

#[test]
fn an_idle_agent_writes_only_its_keepalive_and_a_change_at_once() {
    let server = NatsServer::start_fleet(NatsVersion::V2_14, &["dev1"]);
    let admin = server.admin();
    // The config state is looked at every 30 s: a change written sooner was
    // not found by looking.
    let (dev, _agent) = agent(&server, "dev1", |s| {
        s.heartbeat_secs = 30;
        s.keepalive_secs = 4;
    });
    poll_until("the first heartbeat", CONVERGE, || {
        status::<Heartbeat>(&admin, "dev1", "heartbeat")
    });
    // Let the start-up writes settle, then count the writes over a window.
    std::thread::sleep(Duration::from_secs(2));
    let window = Duration::from_secs(13);
    let start = status_writes(&admin);
    std::thread::sleep(window);
    let writes = status_writes(&admin) - start;
    // 13 s at one keep-alive every 4 s (+ up to a tenth): 3, or 2 when the
    // window fell just so; nothing else.
    assert!(
        (2..=4).contains(&writes),
        "{writes} status writes in {window:?} (a keep-alive every 4 s)"
    );
    // A freeze is written at once, info and heartbeat.
    let before = status_writes(&admin);
    let asked = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_fleet-agent"))
        .args(["node", "freeze", "--reason", "traffic test", "--config"])
        .arg(&dev.config)
        .env_remove("NOTIFY_SOCKET")
        .output()
        .expect("fleet-agent node freeze runs");
    assert!(out.status.success(), "{out:?}");
    let hb = poll_until("a frozen heartbeat", Duration::from_secs(10), || {
        status::<Heartbeat>(&admin, "dev1", "heartbeat")
            .filter(|h| h.config_state.state.is_frozen())
    });
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "the freeze took {took:?} to reach NATS"
    );
    assert!(hb.stopping.is_none());
    assert!(status_writes(&admin) - before >= 2, "info and heartbeat");
}

/// An agent configured for a server config from before the agent's PING
/// settings (the server pings every 2 minutes, its default) works as ever.
#[test]
fn the_agent_works_with_a_server_config_that_predates_it() {
    let server = NatsServer::start_with_config(NatsVersion::V2_9, |port, store| {
        let pw = fleet_harness::device_password("dev1");
        fleet_server_config(&[("dev1", &pw)], NATS_ADMIN_PASSWORD, port, store)
            .lines()
            .filter(|l| !l.starts_with("ping_"))
            .collect::<Vec<_>>()
            .join("\n")
    });
    let admin = server.admin();
    let (_dev, _agent) = agent(&server, "dev1", |s| s.traffic_secs = 1);
    poll_until("a traffic report", CONVERGE, || traffic(&admin, "dev1"));
    common::put_workload(&admin, "dev1", "web", SPEC);
    poll_until("the change reported", CONVERGE, || {
        status::<WorkloadsReport>(&admin, "dev1", "workloads")
            .filter(|r| r.workloads.keys().any(|k| k.as_str() == "web"))
    });
}

/// The victim's published messages so far (status writes and Direct Gets).
fn published_by(monitor: SocketAddr, name: &str) -> u64 {
    connz_of(monitor, name)["in_msgs"]
        .as_u64()
        .expect("in_msgs")
}

fn noise_is_counted_and_dropped(v: NatsVersion) {
    let (server, monitor) = monitored_server(v, &["dev1", "dev2"]);
    let admin = server.admin();
    let (_dev, agent) = agent(&server, "dev1", |s| {
        s.keepalive_secs = 3600;
    });
    poll_until("the first heartbeat", CONVERGE, || {
        status::<Heartbeat>(&admin, "dev1", "heartbeat")
    });
    std::thread::sleep(Duration::from_secs(2));
    // The attacker: device dev2's own connection, with its own permissions,
    // sends its own Direct Gets and status writes with the victim's
    // republished subject as the reply.
    let attacker = server.device("dev2");
    let victim_subject = "fleetkv.fleet-workloads.dev1.desired";
    let published = published_by(monitor, "fleet-agent dev1");
    let lines = agent.log().lines().count();
    let noise_for = Duration::from_secs(8);
    let started = Instant::now();
    let mut sent = 0u64;
    let mut changed_at: Option<Instant> = None;
    while started.elapsed() < noise_for {
        let tick = Instant::now();
        for i in 0..100 {
            let subject = if i % 2 == 0 {
                "fleetapi.DIRECT.GET.KV_fleet-workloads.$KV.fleet-workloads.dev2.desired"
            } else {
                "$KV.fleet-status.dev2.noise"
            };
            attacker
                .publish_request(subject, victim_subject, b"{}")
                .expect("attacker publish");
            sent += 1;
        }
        attacker.flush().expect("attacker flush");
        // A real change in the middle of the noise.
        if changed_at.is_none() && started.elapsed() > noise_for / 2 {
            common::put_workload(&admin, "dev1", "web", SPEC);
            changed_at = Some(Instant::now());
        }
        // 100 every 100 ms: 1,000 a second.
        std::thread::sleep(Duration::from_millis(100).saturating_sub(tick.elapsed()));
    }
    let changed_at = changed_at.expect("the change was written");
    let seen = poll_until("the change reported", CONVERGE, || {
        status::<WorkloadsReport>(&admin, "dev1", "workloads")
            .filter(|r| r.workloads.keys().any(|k| k.as_str() == "web"))
            .map(|_| Instant::now())
    });
    let extra_published = published_by(monitor, "fleet-agent dev1") - published;
    let log = agent.log();
    let new_lines: Vec<&str> = log.lines().skip(lines).collect();
    eprintln!(
        "noise {v:?}: {sent} messages sent; the victim published {extra_published} messages and logged {} lines:\n{}",
        new_lines.len(),
        new_lines.join("\n")
    );
    assert!(sent >= 6000, "only {sent} noise messages sent");
    // The change came through the noise at once.
    assert!(
        seen - changed_at < Duration::from_secs(5),
        "the change took {:?}",
        seen - changed_at
    );
    // No reads: the only messages the victim published are the change's
    // status writes (workloads, and the heartbeat or info at most).
    assert!(
        extra_published <= 3,
        "the victim published {extra_published} messages under noise"
    );
    // At most one summary line for the noise, and a handful for the change.
    let noise_lines = new_lines
        .iter()
        .filter(|l| l.contains("not republished changes"))
        .count();
    assert!(noise_lines <= 1, "{noise_lines} noise lines");
    assert!(new_lines.len() <= 6, "{} log lines", new_lines.len());
}

#[test]
fn noise_on_a_devices_subject_is_counted_and_dropped_2_9() {
    noise_is_counted_and_dropped(NatsVersion::V2_9);
}

#[test]
fn noise_on_a_devices_subject_is_counted_and_dropped_2_14() {
    noise_is_counted_and_dropped(NatsVersion::V2_14);
}

/// The released agent 0.2.0, against the generated server config of this
/// release (the servers now PING every 240 s), still writes its heartbeat
/// at its own interval: what it sends is unchanged.
#[test]
fn a_released_0_2_agent_keeps_its_heartbeat_against_the_new_server_config() {
    let binary = fleet_harness::test_agent_path(fleet_harness::RELEASED_AGENT_0_2_VERSION);
    assert!(
        binary.is_file(),
        "{} is missing: run `make test-agents`",
        binary.display()
    );
    let server = NatsServer::start_fleet(NatsVersion::V2_14, &["dev1"]);
    let admin = server.admin();
    let mut settings = Settings::new(vec![server.url()]);
    settings.podman = false;
    let dev = Device::new("dev1", &settings, None);
    // A 0.2 config: the keys 0.2 knows, nothing newer.
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&dev.config).expect("read")).expect("json");
    cfg["intervals"] =
        serde_json::json!({"heartbeat-secs": 1, "resync-secs": 2, "check-secs": 3600});
    std::fs::write(&dev.config, cfg.to_string()).expect("write");
    let cmd = dev.command(&["run"], None);
    let cmd = {
        let mut c = Command::new(&binary);
        c.args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    };
    let mut agent = ChildGuard::spawn(cmd, "agent-0.2.0");
    dev.wait_ready(&mut agent);
    let first = poll_until("a 0.2 heartbeat", CONVERGE, || {
        status::<Heartbeat>(&admin, "dev1", "heartbeat")
    });
    assert_eq!(first.agent_version.as_str(), "0.2.0");
    std::thread::sleep(Duration::from_secs(2));
    let start = status_writes(&admin);
    std::thread::sleep(Duration::from_secs(5));
    let writes = status_writes(&admin) - start;
    assert!(
        writes >= 4,
        "{writes} heartbeats in 5 s at heartbeat-secs 1"
    );
    assert!(
        traffic(&admin, "dev1").is_none(),
        "0.2.0 writes no traffic report"
    );
}

/// The PINGs bound how long a silent peer goes unseen, both ways (short
/// intervals here; docs/operator/traffic.md gives the production bounds):
/// a stopped agent (its kernel still ACKs, its NATS client says nothing) is
/// closed by its server within (ping_max + 2) × ping_interval, and the
/// agent, its PINGs unanswered, takes the link as dead within
/// (ping-max-outstanding + 1) × ping-secs and reconnects.
#[test]
fn a_silent_agent_is_closed_by_its_server_within_the_ping_bound() {
    let server = NatsServer::start_with_config(NatsVersion::V2_14, |port, store| {
        let pw = fleet_harness::device_password("dev1");
        fleet_server_config(&[("dev1", &pw)], NATS_ADMIN_PASSWORD, port, store)
            .replace("ping_interval: \"240s\"", "ping_interval: \"2s\"")
    });
    let (_dev, agent) = agent(&server, "dev1", |s| s.keepalive_secs = 3600);
    let connected = || !tcp_local_ports(agent.pid(), server.port()).is_empty();
    assert!(connected());
    // The agent stops answering: the server's PINGs go unanswered.
    agent.signal(rustix::process::Signal::STOP);
    let stopped = Instant::now();
    let peer_closed = poll_until("the server closing the silent client", CONVERGE, || {
        (!server_has_client(&server, agent.pid())).then(Instant::now)
    });
    agent.signal(rustix::process::Signal::CONT);
    let took = peer_closed - stopped;
    eprintln!("the server closed the stopped agent after {took:?}");
    // Two unanswered PINGs at 2 s, the third fire closes: at most 4 × 2 s
    // after the agent's last word, and it may have spoken just before.
    assert!(took <= Duration::from_secs(10), "closed after {took:?}");
    assert!(
        took >= Duration::from_secs(3),
        "closed after {took:?}: too soon for two PINGs"
    );
    // The agent reconnects by itself.
    poll_until("the agent reconnected", CONVERGE, || {
        connected().then_some(())
    });
}

/// Whether the server still has a TCP connection from `pid` (the server's
/// side: ESTABLISHED or closing, seen from the client's table).
fn server_has_client(server: &NatsServer, pid: u32) -> bool {
    let ports = tcp_local_ports(pid, server.port());
    ports
        .iter()
        .any(|p| server_socket_exists(server.port(), *p))
}

fn server_socket_exists(server_port: u16, peer_port: u16) -> bool {
    let out = Command::new("ss")
        .args(["-tnH", "state", "established"])
        .arg(format!(
            "( sport = :{server_port} and dport = :{peer_port} )"
        ))
        .output()
        .expect("ss runs (Debian package iproute2)");
    !String::from_utf8_lossy(&out.stdout).trim().is_empty()
}

#[test]
fn a_silent_server_is_seen_by_the_agent_within_its_ping_bound() {
    let server = NatsServer::start_fleet(NatsVersion::V2_14, &["dev1"]);
    let (_dev, agent) = agent(&server, "dev1", |s| {
        s.keepalive_secs = 3600;
        s.ping_secs = 1;
    });
    let server_pid = listening_pid(server.port());
    let from = agent.line_count();
    // The server stops answering; its kernel still ACKs.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(server_pid).expect("pid"),
        rustix::process::Signal::STOP,
    )
    .expect("SIGSTOP the server");
    let stopped = Instant::now();
    let line = agent.try_wait_for_line(from, "NATS connection lost", Duration::from_secs(20));
    let took = stopped.elapsed();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(server_pid).expect("pid"),
        rustix::process::Signal::CONT,
    )
    .expect("SIGCONT the server");
    assert!(
        line.is_some(),
        "the agent never saw the link die:\n{}",
        agent.log()
    );
    eprintln!("the agent took the silent link as dead after {took:?}");
    // (2 + 1) × 1 s after the server's last word, which came at most 1 s
    // before the stop.
    assert!(took <= Duration::from_secs(5), "after {took:?}");
    assert!(
        took >= Duration::from_secs(1),
        "after {took:?}: too soon for two PINGs"
    );
}

/// The pid of the process listening on loopback `port`.
fn listening_pid(port: u16) -> i32 {
    let out = Command::new("ss")
        .args(["-tlnpH"])
        .arg(format!("( sport = :{port} )"))
        .output()
        .expect("ss runs (Debian package iproute2)");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("pid=")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no listener on {port}: {text}"))
}
