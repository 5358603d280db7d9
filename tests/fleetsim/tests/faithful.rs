//! The simulator is faithful: the real agent (`target/debug/fleet-agent`,
//! Podman disabled) and one simulated device, each behind a recording TCP
//! proxy in front of the same nats-server, send the same subjects in the
//! same order for start-up, a desired change and a reconnect (a server
//! restart), and the same idle traffic: nothing but the heartbeat's
//! keep-alive and the client's PINGs, at the same intervals (short ones
//! here, the agent's `keepalive-secs` and `ping-secs`). The simulator speaks the generation the agent speaks, read
//! from the subjects the agent uses (consumer creates: generation 1;
//! Direct Gets: generation 2), so this holds before and after the agent
//! moves to generation 2.
//!
//! Compared per phase: the subjects of each channel in order (the inbox,
//! the status writes without the timer-driven heartbeats, the reads of
//! each key: its consumer's deliver subscription and create, or its
//! republished subscription and Direct Gets), device ids and random tokens
//! normalized; across channels, at start-up: the inbox first, device info
//! before any read, the desired state read before the upgrade intent.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_harness::{device_password, poll_until, target_dir, ChildGuard, NatsServer, NatsVersion};
use fleet_sim::admin::put_desired_all;
use fleet_sim::{Generation, Sim, SimConfig, StatusWrites};

const AGENT: &str = "faith-agent";
const SIMULATED: &str = "faith-sim";
const PHASE_TIMEOUT: Duration = Duration::from_secs(60);
/// A phase is over when no op but a heartbeat came for this long.
const QUIET: Duration = Duration::from_millis(2500);
/// The keep-alive and PING intervals of both, short so the idle phase is.
const KEEPALIVE_SECS: u64 = 3;
const PING_SECS: u64 = 1;
/// The idle phase compared.
const IDLE: Duration = Duration::from_secs(10);

type Ops = Arc<Mutex<Vec<(Instant, String)>>>;

/// A TCP proxy to `upstream` recording every SUB, UNSUB and PUB subject a
/// client sends (a new `CONNECT` marks each connection).
fn proxy(upstream: u16) -> (u16, Ops) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let port = listener.local_addr().expect("addr").port();
    let ops: Ops = Arc::default();
    let o = Arc::clone(&ops);
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let deadline = Instant::now() + Duration::from_secs(30);
            let server = loop {
                match TcpStream::connect(("127.0.0.1", upstream)) {
                    Ok(s) => break Some(s),
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Err(_) => break None,
                }
            };
            let Some(server) = server else { continue };
            o.lock()
                .expect("lock")
                .push((Instant::now(), "CONNECT".into()));
            let (c2, s2) = (
                client.try_clone().expect("clone"),
                server.try_clone().expect("clone"),
            );
            let rec = Arc::clone(&o);
            std::thread::spawn(move || pump_recording(client, server, &rec));
            std::thread::spawn(move || pump(s2, c2));
        }
    });
    (port, ops)
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16384];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// Client → server, parsing the ops on the way.
fn pump_recording(mut from: TcpStream, mut to: TcpStream, ops: &Ops) {
    let mut buf = [0u8; 16384];
    let mut pending: Vec<u8> = Vec::new();
    let mut sids: HashMap<String, String> = HashMap::new();
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
        pending.extend_from_slice(&buf[..n]);
        while let Some(eol) = pending.windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&pending[..eol]).into_owned();
            let w: Vec<&str> = line.split_ascii_whitespace().collect();
            let op = w
                .first()
                .map(|s| s.to_ascii_uppercase())
                .unwrap_or_default();
            let body = match op.as_str() {
                "PUB" | "HPUB" => w.last().and_then(|s| s.parse::<usize>().ok()).unwrap_or(0) + 2,
                _ => 0,
            };
            if pending.len() < eol + 2 + body {
                break;
            }
            let rec = match (op.as_str(), w.len()) {
                ("PUB" | "HPUB", _) => Some(format!("PUB {}", w[1])),
                ("SUB", 3 | 4) => {
                    sids.insert(w[w.len() - 1].to_owned(), w[1].to_owned());
                    Some(format!("SUB {}", w[1]))
                }
                ("PING", 1) => Some("PING".to_owned()),
                ("UNSUB", 2 | 3) => Some(format!(
                    "UNSUB {}",
                    sids.get(w[1])
                        .cloned()
                        .unwrap_or_else(|| format!("sid {}", w[1]))
                )),
                _ => None,
            };
            if let Some(r) = rec {
                ops.lock().expect("lock").push((Instant::now(), r));
            }
            pending.drain(..eol + 2 + body);
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// One op normalized, and the channel it belongs to.
fn normalize(op: &str, device: &str, names: &HashMap<String, String>) -> (String, String) {
    let (verb, subject) = op.split_once(' ').unwrap_or((op, ""));
    let tokens: Vec<&str> = subject.split('.').collect();
    let hex = |t: &str| t.len() == 32 && t.chars().all(|c| c.is_ascii_hexdigit());
    let norm: Vec<String> = tokens
        .iter()
        .map(|t| {
            if *t == device {
                "<dev>".to_owned()
            } else if hex(t) {
                "<rand>".to_owned()
            } else {
                (*t).to_owned()
            }
        })
        .collect();
    let norm = format!("{verb} {}", norm.join("."));
    let bucket_of = |s: &str| {
        [
            "fleet-desired",
            "fleet-workloads",
            "fleet-control",
            "fleet-status",
        ]
        .into_iter()
        .find(|b| s.contains(b))
    };
    let channel = if subject.starts_with("_INBOX.") {
        "inbox".to_owned()
    } else if subject.starts_with("deliver.") {
        let name = tokens.last().copied().unwrap_or("");
        format!("read {}", names.get(name).map_or("?", String::as_str))
    } else {
        match bucket_of(subject) {
            Some("fleet-status") => "status".to_owned(),
            Some("fleet-desired" | "fleet-workloads") => "read desired".to_owned(),
            Some(_) => "read control".to_owned(),
            None => "other".to_owned(),
        }
    };
    (channel, norm)
}

/// The consumer name → which read, from the creates in `ops`.
fn consumer_names(ops: &[(Instant, String)]) -> HashMap<String, String> {
    let mut m = HashMap::new();
    for (_, op) in ops {
        if let Some(rest) = op.strip_prefix("PUB fleetapi.CONSUMER.CREATE.KV_") {
            let t: Vec<&str> = rest.split('.').collect();
            if t.len() > 1 {
                let which = if t[0] == "fleet-control" {
                    "control"
                } else {
                    "desired"
                };
                m.insert(t[1].to_owned(), which.to_owned());
            }
        }
    }
    m
}

/// Per channel, the normalized ops of `range`, heartbeats and flow-control
/// answers left out (timer- and load-driven).
fn channels(
    ops: &[(Instant, String)],
    range: std::ops::Range<usize>,
    device: &str,
) -> (Vec<String>, HashMap<String, Vec<String>>) {
    let names = consumer_names(ops);
    let mut order = Vec::new();
    let mut by: HashMap<String, Vec<String>> = HashMap::new();
    for (_, op) in &ops[range] {
        if op == "CONNECT"
            || op == "PING"
            || op.contains(".heartbeat")
            || op.starts_with("PUB $JS.FC.")
        {
            continue;
        }
        let (ch, n) = normalize(op, device, &names);
        if !order.contains(&ch) {
            order.push(ch.clone());
        }
        by.entry(ch).or_default().push(n);
    }
    (order, by)
}

fn snapshot(ops: &Ops) -> Vec<(Instant, String)> {
    ops.lock().expect("lock").clone()
}

/// Waits until `done(ops)` and then no op but a heartbeat for [`QUIET`];
/// returns the op count then.
fn settle(
    what: &str,
    ops: &Ops,
    from: usize,
    done: impl Fn(&[(Instant, String)]) -> bool,
) -> usize {
    poll_until(what, PHASE_TIMEOUT, || {
        let o = snapshot(ops);
        let tail = &o[from.min(o.len())..];
        let last = tail
            .iter()
            .rev()
            .find(|(_, op)| !op.contains(".heartbeat") && op != "PING")
            .map(|(t, _)| *t);
        (done(tail) && last.is_none_or(|t| t.elapsed() >= QUIET)).then_some(o.len())
    })
}

/// `target/debug/fleet-agent`, or `$FLEET_SIM_AGENT`.
fn agent_binary() -> PathBuf {
    let bin = std::env::var_os("FLEET_SIM_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("debug/fleet-agent"));
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p fleet-agent` (make build)",
        bin.display()
    );
    bin
}

fn start_agent(port: u16) -> (ChildGuard, tempfile::TempDir) {
    let root = tempfile::Builder::new()
        .prefix("fleet-faithful-")
        .tempdir()
        .expect("tempdir");
    let pw = root.path().join("nats-password");
    std::fs::write(&pw, format!("{}\n", device_password(AGENT))).expect("password");
    let config = serde_json::json!({
        "device-id": AGENT,
        "nats": {
            "servers": [format!("nats://127.0.0.1:{port}")],
            "auth": {"method": "user-password", "user": AGENT, "password-file": pw},
        },
        "podman": {"enabled": false},
        "intervals": {"heartbeat-secs": 30, "resync-secs": 30, "idle-heartbeat-secs": 5,
                      "keepalive-secs": KEEPALIVE_SECS, "ping-secs": PING_SECS},
        "root": root.path(),
    });
    let path = root.path().join("agent.json");
    std::fs::write(&path, config.to_string()).expect("config");
    let mut cmd = Command::new(agent_binary());
    cmd.args(["run", "--config"])
        .arg(&path)
        .env("FLEET_LOG", "debug")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("INVOCATION_ID")
        .env_remove("JOURNAL_STREAM");
    (ChildGuard::spawn(cmd, "faithful-agent"), root)
}

fn reads(ops: &[(Instant, String)], bucket_hint: &str) -> usize {
    ops.iter()
        .filter(|(_, o)| {
            (o.contains("fleetapi.CONSUMER.CREATE") || o.contains("fleetapi.DIRECT.GET"))
                && o.contains(bucket_hint)
        })
        .count()
}

fn status(ops: &[(Instant, String)], key: &str) -> usize {
    ops.iter()
        .filter(|(_, o)| o.starts_with("PUB $KV.fleet-status.") && o.ends_with(key))
        .count()
}

#[test]
fn the_simulator_sends_what_the_agent_sends() {
    let mut nats = NatsServer::start_fleet(NatsVersion::V2_14, &[AGENT, SIMULATED]);
    let (agent_port, agent_ops) = proxy(nats.port());
    let (sim_port, sim_ops) = proxy(nats.port());
    let (_agent, _root) = start_agent(agent_port);
    // Start-up; the generation is what the agent used.
    let a1 = settle("the agent's start-up", &agent_ops, 0, |o| {
        reads(o, "fleet-control") > 0 && status(o, ".workloads") > 0
    });
    let ops = snapshot(&agent_ops);
    let generation = if reads(&ops, "CONSUMER.CREATE") > 0 {
        Generation::One
    } else {
        Generation::Two
    };
    let mut cfg = SimConfig::new(
        vec![std::net::SocketAddr::from(([127, 0, 0, 1], sim_port))],
        vec![SIMULATED.to_owned()],
        device_password,
        generation,
    );
    cfg.idle_heartbeat = Duration::from_secs(5);
    cfg.status = StatusWrites::KeepAlive(Duration::from_secs(KEEPALIVE_SECS));
    cfg.ping = Duration::from_secs(PING_SECS);
    let sim = Sim::start(cfg).expect("simulator");
    let s1 = settle("the simulator's start-up", &sim_ops, 0, |o| {
        reads(o, "fleet-control") > 0 && status(o, ".workloads") > 0
    });
    // A desired change to each.
    let admin = nats.admin();
    for dev in [AGENT, SIMULATED] {
        put_desired_all(&admin, generation, &[dev.to_owned()], &[0], "change")
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let a2 = settle("the agent applying the change", &agent_ops, a1, |o| {
        status(o, ".workloads") > 0
    });
    let s2 = settle("the simulator applying the change", &sim_ops, s1, |o| {
        status(o, ".workloads") > 0
    });
    drop(admin);
    // A reconnect: the server restarts on the same port.
    nats.restart();
    let a3 = settle("the agent's reconnect", &agent_ops, a2, |o| {
        reads(o, "fleet-desired") + reads(o, "fleet-workloads") > 0 && reads(o, "fleet-control") > 0
    });
    let s3 = settle("the simulator's reconnect", &sim_ops, s2, |o| {
        reads(o, "fleet-desired") + reads(o, "fleet-workloads") > 0 && reads(o, "fleet-control") > 0
    });
    assert!(
        sim.records()[0].snapshots.len() >= 2,
        "the simulated device read a new snapshot after the reconnect"
    );
    let agent = snapshot(&agent_ops);
    let simulated = snapshot(&sim_ops);
    for (phase, ar, sr) in [
        ("start-up", 0..a1, 0..s1),
        ("desired change", a1..a2, s1..s2),
        ("reconnect", a2..a3, s2..s3),
    ] {
        let (a_order, a) = channels(&agent, ar, AGENT);
        let (s_order, s) = channels(&simulated, sr, SIMULATED);
        let mut keys: Vec<&String> = a.keys().chain(s.keys()).collect();
        keys.sort();
        keys.dedup();
        for ch in keys {
            assert_eq!(
                s.get(ch),
                a.get(ch),
                "{generation:?}, {phase}, channel {ch}: the simulator (left) and the agent (right) differ"
            );
        }
        if phase == "start-up" {
            assert_eq!(
                s_order, a_order,
                "{generation:?}, start-up: channels first used in a different order"
            );
            assert_eq!(a_order.first().map(String::as_str), Some("inbox"));
        }
    }
    // Idle: each sends its keep-alive and its PINGs, nothing else.
    std::thread::sleep(IDLE);
    let agent = snapshot(&agent_ops);
    let simulated = snapshot(&sim_ops);
    let idle = |ops: &[(Instant, String)], from: usize| {
        let tail = &ops[from..];
        let count = |f: &dyn Fn(&str) -> bool| tail.iter().filter(|(_, o)| f(o)).count();
        (
            count(&|o| o.contains(".heartbeat")),
            count(&|o| o == "PING"),
            count(&|o| o.starts_with("PUB") && !o.contains(".heartbeat")),
        )
    };
    let (a_beats, a_pings, a_other) = idle(&agent, a3);
    let (s_beats, s_pings, s_other) = idle(&simulated, s3);
    eprintln!(
        "idle {IDLE:?}: agent {a_beats} keep-alives, {a_pings} PINGs, {a_other} other writes; simulator {s_beats}, {s_pings}, {s_other}"
    );
    assert_eq!(
        (a_other, s_other),
        (0, 0),
        "idle: nothing but keep-alives and PINGs"
    );
    let expected_beats = IDLE.as_secs() / KEEPALIVE_SECS;
    for (who, beats, pings) in [("agent", a_beats, a_pings), ("simulator", s_beats, s_pings)] {
        assert!(
            beats as u64 + 1 >= expected_beats && beats as u64 <= expected_beats + 1,
            "{who}: {beats} keep-alives in {IDLE:?} (one every {KEEPALIVE_SECS} s)"
        );
        // A PING a second while nothing else comes from the server (a
        // keep-alive's ack counts as a word from it).
        assert!(
            pings as u64 >= IDLE.as_secs() / 2 && pings as u64 <= IDLE.as_secs() + 1,
            "{who}: {pings} PINGs in {IDLE:?} (one after {PING_SECS} s of silence)"
        );
    }
    eprintln!(
        "faithful to the agent's {generation:?}: {} agent ops compared",
        a3
    );
}
