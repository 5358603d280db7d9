//! Idle traffic of one device on the wire (docs/operator/traffic.md): the
//! release agent (glibc build of this workspace) and, as the baseline, the
//! released agent 0.2.0 (`target/test-agents/fleet-agent-0.2.0`), side by
//! side in the same window, each on its own nats-server 2.14 over TLS (the
//! harness CA, the generated fleet config) with its own Podman and three
//! running workloads, production settings (no `intervals` in the config).
//!
//! Counted from the kernel on the agent's own socket (`ss -ti`): TCP
//! payload each way (every NATS protocol byte inside its TLS records) plus
//! 52 B of IPv4/TCP header per segment, pure ACKs included; link-layer
//! framing not included. Per 30 days = the idle window scaled; for ours,
//! whose slow events (keep-alive hourly, check and traffic report every
//! 6 h, the server's hourly round-trip PING) rarely fall in a 10-minute
//! window, plus each of them at its measured cost (below) times its count in
//! 30 days. Then, on the
//! same connections: the bytes of one desired change (one workload's spec,
//! until it runs again), and of an agent upgrade without the artifact: the
//! intent delivered and answered (no updater here: the agent reports it
//! cannot forward it) plus the start-up of a new agent process on a new
//! connection (TLS handshake, info, snapshot reads, status), what the
//! upgraded agent costs when it comes up.
//!
//! The cost of each knob, in the same window: four more release agents
//! (no Podman) on one more TLS server, each with one interval short and the
//! others long, so that its traffic is that one event: a PING/PONG
//! (`ping-secs` 10), a keep-alive heartbeat (`keepalive-secs` 20), a
//! periodic check of both keys with the three-workload document
//! (`check-secs` 30), a traffic report (`traffic-secs` 20). Bytes per
//! event = its bytes over the window / the events; what each default and
//! alternative costs a month follows.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fleet_common::contracts::{AgentUpgradeAttempt, WorkloadsReport};
use fleet_common::nats_config::{
    kv_stream_config, stream_create_subject, ADMIN_USER, FLEET_BUCKETS,
};
use fleet_common::validate::{
    Arch, ArtifactUrl, AttemptUuid, DeviceId, MaxBytes, Sha256Hex, Version,
};
use fleet_harness::{
    device_password, fleet_server_config, poll_until, test_agent_path, ChildGuard, NatsVersion,
    Podman, TestCa, NATS_ADMIN_PASSWORD, RELEASED_AGENT_0_2_VERSION,
};
use tempfile::TempDir;

use crate::agent::AgentDevice;
use crate::bins::Build;
use crate::notify::Notify;
use crate::report::{Row, Verdict};

/// Workloads running on each device.
const WORKLOADS: usize = 3;
/// Start, converge, a change applied.
const CONVERGE: Duration = Duration::from_secs(180);
/// After converging, before the window: start-up writes done.
const SETTLE: Duration = Duration::from_secs(20);
/// After a change, before reading the counters again.
const AFTER_CHANGE: Duration = Duration::from_secs(10);
const SERVER_READY: Duration = Duration::from_secs(30);
const API_TIMEOUT: Duration = Duration::from_secs(5);
/// 30 days.
const MONTH: Duration = Duration::from_secs(30 * 86_400);
/// IPv4 + TCP header with timestamps, per segment.
const HEADER_BYTES: u64 = fleet_common::contracts::TCP_IPV4_HEADER_BYTES;
/// The target: 5 MiB a month on the wire.
const BUDGET_BYTES: f64 = 5.0 * 1024.0 * 1024.0;

/// The kernel's counters of one TCP connection.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    acked: u64,
    received: u64,
    segs_out: u64,
    segs_in: u64,
}

impl Counters {
    fn since(self, before: Counters) -> Counters {
        Counters {
            acked: self.acked.saturating_sub(before.acked),
            received: self.received.saturating_sub(before.received),
            segs_out: self.segs_out.saturating_sub(before.segs_out),
            segs_in: self.segs_in.saturating_sub(before.segs_in),
        }
    }

    fn payload(self) -> u64 {
        self.acked + self.received
    }

    fn wire(self) -> u64 {
        self.payload() + (self.segs_out + self.segs_in) * HEADER_BYTES
    }
}

/// A TLS fleet-layout server and its admin connection.
struct TlsServer {
    _child: ChildGuard,
    port: u16,
    admin: nats::Connection,
    _dir: TempDir,
}

impl TlsServer {
    fn start(ca: &TestCa, devices: &[&str]) -> TlsServer {
        let (cert, key) = ca.leaf_files(&["127.0.0.1", "localhost"]);
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap_or_else(|e| panic!("free port: {e}"))
            .port();
        let passwords: Vec<(String, String)> = devices
            .iter()
            .map(|d| ((*d).to_owned(), device_password(d)))
            .collect();
        let creds: Vec<(&str, &str)> = passwords
            .iter()
            .map(|(d, p)| (d.as_str(), p.as_str()))
            .collect();
        let mut conf =
            fleet_server_config(&creds, NATS_ADMIN_PASSWORD, port, &dir.path().join("store"));
        conf.push_str(&format!(
            "\ntls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\n",
            cert.display(),
            key.display()
        ));
        let path = dir.path().join("nats.conf");
        std::fs::write(&path, conf).unwrap_or_else(|e| panic!("nats.conf: {e}"));
        let mut cmd = Command::new(NatsVersion::V2_14.binary());
        cmd.arg("-c").arg(&path);
        let child = ChildGuard::spawn(cmd, "nats-tls");
        child.wait_for_line("Server is ready", SERVER_READY);
        let admin = nats::Options::with_user_pass(ADMIN_USER, NATS_ADMIN_PASSWORD)
            .add_root_certificate(ca.ca_path())
            .connect(format!("tls://127.0.0.1:{port}").as_str())
            .unwrap_or_else(|e| panic!("admin over TLS: {e}"));
        for spec in &FLEET_BUCKETS {
            admin
                .request_timeout(
                    &stream_create_subject(spec.bucket),
                    kv_stream_config(spec, 1).to_string(),
                    API_TIMEOUT,
                )
                .unwrap_or_else(|e| panic!("create bucket {}: {e}", spec.bucket));
        }
        TlsServer {
            _child: child,
            port,
            admin,
            _dir: dir,
        }
    }
}

/// One device: its server, Podman, config and running agent.
struct Side {
    label: &'static str,
    binary: PathBuf,
    server: TlsServer,
    podman: Podman,
    device: AgentDevice,
    notify: Notify,
    agent: Option<ChildGuard>,
}

impl Side {
    fn start(label: &'static str, binary: PathBuf, ca: &TestCa) -> Side {
        let server = TlsServer::start(ca, &[crate::agent::DEVICE]);
        let podman = Podman::new();
        let url = format!("tls://127.0.0.1:{}", server.port);
        let device = AgentDevice::new(crate::agent::DEVICE, &url, Some(&podman));
        let mut cfg: serde_json::Value = serde_json::from_slice(
            &std::fs::read(&device.config).unwrap_or_else(|e| panic!("config: {e}")),
        )
        .unwrap_or_else(|e| panic!("config: {e}"));
        cfg["nats"]["tls"] = serde_json::json!({"ca-file": ca.ca_path()});
        std::fs::write(&device.config, cfg.to_string()).unwrap_or_else(|e| panic!("config: {e}"));
        let notify = Notify::bind(&device.root.path().join("notify.sock"));
        let mut side = Side {
            label,
            binary,
            server,
            podman,
            device,
            notify,
            agent: None,
        };
        side.spawn(1);
        side
    }

    /// Starts the agent and waits for its `n`-th `READY=1`.
    fn spawn(&mut self, n: usize) {
        let cmd = self
            .device
            .command_of(&self.binary, &self.notify, Some(&self.podman));
        let agent = ChildGuard::spawn(cmd, self.label);
        if !self.notify.wait_ready(n, CONVERGE) {
            panic!(
                "{}: not ready within {CONVERGE:?}; log:\n{}",
                self.label,
                agent.log()
            );
        }
        self.agent = Some(agent);
    }

    fn pid(&self) -> u32 {
        self.agent.as_ref().map_or(0, ChildGuard::pid)
    }

    fn put(&self, workload: &str, command: &[&str]) {
        let spec = serde_json::json!({"image": self.podman.busybox_image(), "command": command});
        fleet_harness::desired::edit_document(&self.server.admin, &self.device.id, |w| {
            w.insert(workload.to_owned(), spec.clone());
        });
    }

    fn report(&self) -> Option<WorkloadsReport> {
        let kv = nats::jetstream::new(self.server.admin.clone())
            .key_value("fleet-status")
            .ok()?;
        let raw = kv.get(&format!("{}.workloads", self.device.id)).ok()??;
        serde_json::from_slice(&raw).ok()
    }

    /// Waits until every workload runs, reported after `after`.
    fn wait_running(&self, after: fleet_common::Timestamp) {
        poll_until(
            &format!("{}: {WORKLOADS} workloads reported running", self.label),
            CONVERGE,
            || {
                self.report()
                    .filter(|r| r.observed_at > after && r.ready().0 >= WORKLOADS)
                    .map(drop)
            },
        );
    }

    /// The counters of the agent's connection to its server.
    fn counters(&self) -> Counters {
        let local = local_port(self.pid(), self.server.port).unwrap_or_else(|| {
            panic!("{}: no connection to port {}", self.label, self.server.port)
        });
        socket_counters(local, self.server.port)
    }

    fn write_intent(&self) {
        let attempt = AgentUpgradeAttempt {
            arch: Arch::current().unwrap_or(Arch::X86_64),
            artifact_url: ArtifactUrl::parse("https://releases.example.com/agent-9.0.0")
                .unwrap_or_else(|e| panic!("{e}")),
            device_id: DeviceId::parse(&self.device.id).unwrap_or_else(|e| panic!("{e}")),
            max_bytes: MaxBytes::new(4 * 1024 * 1024).unwrap_or_else(|e| panic!("{e}")),
            sha256: Sha256Hex::of(b"agent 9.0.0"),
            target_version: Version::parse("9.0.0").unwrap_or_else(|e| panic!("{e}")),
            uuid: AttemptUuid::new_random(),
        };
        let kv = nats::jetstream::new(self.server.admin.clone())
            .key_value("fleet-control")
            .unwrap_or_else(|e| panic!("bucket fleet-control: {e}"));
        kv.put(
            &format!("{}.agent-upgrade-intent", self.device.id),
            serde_json::to_vec(&attempt).unwrap_or_default(),
        )
        .unwrap_or_else(|e| panic!("put intent: {e}"));
    }

    fn stop(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.signal(rustix::process::Signal::TERM);
            a.wait_exit(CONVERGE);
        }
    }
}

/// The local port of `pid`'s established TCP connection to `remote_port`.
fn local_port(pid: u32, remote_port: u16) -> Option<u16> {
    let mut inodes = Vec::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        if let Ok(t) = std::fs::read_link(fd.path()) {
            let t = t.to_string_lossy().into_owned();
            if let Some(i) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                inodes.push(i.to_owned());
            }
        }
    }
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).ok()?;
    let port = |c: &str| {
        c.rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    table.lines().skip(1).find_map(|l| {
        let c: Vec<&str> = l.split_whitespace().collect();
        (c.len() > 9
            && c[3] == "01"
            && inodes.iter().any(|i| i == c[9])
            && port(c[2]) == Some(remote_port))
        .then(|| port(c[1]))
        .flatten()
    })
}

/// `ss -tin` of the connection from `local` to `remote` (the client's side).
fn socket_counters(local: u16, remote: u16) -> Counters {
    let out = Command::new("ss")
        .args(["-tinH", "state", "established"])
        .arg(format!("( sport = :{local} and dport = :{remote} )"))
        .output()
        .unwrap_or_else(|e| panic!("ss (Debian package iproute2): {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Counters {
        acked: field("bytes_acked:"),
        received: field("bytes_received:"),
        segs_out: field("segs_out:"),
        segs_in: field("segs_in:"),
    }
}

fn mib(b: f64) -> String {
    format!("{:.2} MiB", b / 1048576.0)
}

fn kib(b: u64) -> String {
    format!("{:.1} KiB", b as f64 / 1024.0)
}

/// What one side measured.
#[derive(Debug, Default)]
struct Measured {
    idle: Counters,
    change: Counters,
    intent: Counters,
    start_up: Counters,
}

fn per_month(c: Counters, window: Duration) -> f64 {
    c.wire() as f64 * MONTH.as_secs_f64() / window.as_secs_f64()
}

fn binary_ok(p: &Path) -> Result<(), String> {
    if p.is_file() {
        Ok(())
    } else {
        Err(format!(
            "missing {}: run `make test-agents` / `make bench`",
            p.display()
        ))
    }
}

/// One knob's agent: an interval short, the others long.
struct Knob {
    name: &'static str,
    key: &'static str,
    short_secs: u64,
    default_secs: u64,
    /// Alternatives shown in the note, seconds.
    others: &'static [u64],
    device: AgentDevice,
    agent: ChildGuard,
    _notify: Notify,
}

/// The knobs measured and their short intervals.
const KNOBS: [(&str, &str, u64, u64, &[u64]); 4] = [
    ("PING/PONG", "ping-secs", 10, 200, &[120, 300, 600]),
    (
        "keep-alive heartbeat",
        "keepalive-secs",
        20,
        3600,
        &[600, 21_600, 86_400],
    ),
    (
        "periodic check (both keys)",
        "check-secs",
        30,
        21_600,
        &[300, 3600, 86_400],
    ),
    (
        "traffic report",
        "traffic-secs",
        20,
        21_600,
        &[3600, 86_400],
    ),
];

fn knob_agents(ca: &TestCa, binary: &Path) -> (TlsServer, Vec<Knob>) {
    let ids: Vec<String> = (0..KNOBS.len()).map(|i| format!("knob-{i}")).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let server = TlsServer::start(ca, &id_refs);
    let url = format!("tls://127.0.0.1:{}", server.port);
    let mut knobs = Vec::new();
    for (i, (name, key, short_secs, default_secs, others)) in KNOBS.into_iter().enumerate() {
        let device = AgentDevice::new(&ids[i], &url, None);
        let mut cfg: serde_json::Value = serde_json::from_slice(
            &std::fs::read(&device.config).unwrap_or_else(|e| panic!("config: {e}")),
        )
        .unwrap_or_else(|e| panic!("config: {e}"));
        cfg["nats"]["tls"] = serde_json::json!({"ca-file": ca.ca_path()});
        let mut intervals = serde_json::json!({
            "ping-secs": 3600, "keepalive-secs": 604_800, "check-secs": 604_800,
            "traffic-secs": 604_800,
        });
        intervals[key] = serde_json::json!(short_secs);
        cfg["intervals"] = intervals;
        std::fs::write(&device.config, cfg.to_string()).unwrap_or_else(|e| panic!("config: {e}"));
        // The check reads a document of three workloads, as on the devices.
        for w in 0..WORKLOADS {
            let spec = serde_json::json!({"image": "docker.io/library/busybox:1.36", "command": ["sleep", "3000000"]});
            fleet_harness::desired::edit_document(&server.admin, &device.id, |d| {
                d.insert(format!("w{w}"), spec.clone());
            });
        }
        let notify = Notify::bind(&device.root.path().join("notify.sock"));
        let agent = ChildGuard::spawn(device.command_of(binary, &notify, None), name);
        if !notify.wait_ready(1, CONVERGE) {
            panic!(
                "{name}: not ready within {CONVERGE:?}; log:\n{}",
                agent.log()
            );
        }
        knobs.push(Knob {
            name,
            key,
            short_secs,
            default_secs,
            others,
            device,
            agent,
            _notify: notify,
        });
    }
    (server, knobs)
}

impl Knob {
    fn counters(&self, server_port: u16) -> Counters {
        let local = local_port(self.agent.pid(), server_port)
            .unwrap_or_else(|| panic!("{}: no connection", self.name));
        socket_counters(local, server_port)
    }
}

fn knob_row(k: &Knob, c: Counters, window: Duration) -> Row {
    let events = (window.as_secs_f64() / k.short_secs as f64)
        .floor()
        .max(1.0);
    let per_event = per_event(k, c, window);
    let month = |secs: u64| per_event * MONTH.as_secs_f64() / secs as f64;
    let others: Vec<String> = k
        .others
        .iter()
        .map(|s| format!("{s} s: {}", mib(month(*s))))
        .collect();
    Row::new(format!("{} (`intervals.{}`), per 30 days at the default {} s", k.name, k.key, k.default_secs))
        .ours(mib(month(k.default_secs)))
        .note(format!(
            "{:.0} B on the wire per event ({} at {} s over {} s, {}: {} B sent, {} B received, {} + {} segments). Other intervals: {}.",
            per_event,
            k.device.id,
            k.short_secs,
            window.as_secs(),
            events,
            c.acked,
            c.received,
            c.segs_out,
            c.segs_in,
            others.join(", ")
        ))
}

/// The traffic rows: idle per 30 days, a desired change, an upgrade.
pub fn traffic_rows(window: Duration) -> Vec<Row> {
    let ours_bin = Build::Glibc.bin("fleet-agent");
    let base_bin = test_agent_path(RELEASED_AGENT_0_2_VERSION);
    if let Err(e) = binary_ok(&ours_bin).and(binary_ok(&base_bin)) {
        return vec![Row::todo(
            "idle traffic on the wire, per 30 days",
            "≤ 5 MiB",
            &e,
        )];
    }
    let ca = TestCa::new();
    let (knob_server, knobs) = knob_agents(&ca, &ours_bin);
    let mut sides = [
        Side::start("fleet-agent 0.3", ours_bin, &ca),
        Side::start("fleet-agent 0.2.0", base_bin, &ca),
    ];
    let t0 = fleet_common::Timestamp::from_unix_millis(0);
    for (s, w) in sides
        .iter()
        .flat_map(|s| (0..WORKLOADS).map(move |w| (s, w)))
    {
        s.put(&format!("w{w}"), &["sleep", "3000000"]);
    }
    for s in &sides {
        s.wait_running(t0);
    }
    std::thread::sleep(SETTLE);
    // Idle, both at once.
    let before: Vec<Counters> = sides.iter().map(Side::counters).collect();
    let knobs_before: Vec<Counters> = knobs.iter().map(|k| k.counters(knob_server.port)).collect();
    let started = Instant::now();
    std::thread::sleep(window);
    let took = started.elapsed();
    let knob_counts: Vec<Counters> = knobs
        .iter()
        .zip(&knobs_before)
        .map(|(k, b)| k.counters(knob_server.port).since(*b))
        .collect();
    let knob_rows: Vec<Row> = knobs
        .iter()
        .zip(&knob_counts)
        .map(|(k, c)| knob_row(k, *c, took))
        .collect();
    let slow = slow_events(&knobs, &knob_counts, took);
    drop(knobs);
    let mut m: Vec<Measured> = sides
        .iter()
        .zip(&before)
        .map(|(s, b)| Measured {
            idle: s.counters().since(*b),
            ..Measured::default()
        })
        .collect();
    // One desired change, until it runs.
    for (s, m) in sides.iter().zip(m.iter_mut()) {
        let before = s.counters();
        let at = fleet_common::Timestamp::now();
        s.put("w0", &["sleep", "3000001"]);
        s.wait_running(at);
        std::thread::sleep(AFTER_CHANGE);
        m.change = s.counters().since(before);
    }
    // An upgrade without the artifact: the intent answered, then a new
    // agent process on a new connection.
    for (i, s) in sides.iter_mut().enumerate() {
        let before = s.counters();
        s.write_intent();
        std::thread::sleep(AFTER_CHANGE);
        m[i].intent = s.counters().since(before);
        s.stop();
        s.spawn(2);
        std::thread::sleep(AFTER_CHANGE);
        m[i].start_up = s.counters();
    }
    let mut out = rows(&m[0], &m[1], took, &slow);
    out.extend(knob_rows);
    out
}

/// Bytes on the wire per event of each knob.
fn per_event(k: &Knob, c: Counters, window: Duration) -> f64 {
    let events = (window.as_secs_f64() / k.short_secs as f64)
        .floor()
        .max(1.0);
    c.wire() as f64 / events
}

/// What an idle device's slow events add in 30 days, at their defaults,
/// beyond the PINGs a window shows: each knob but the PING at its measured
/// cost and default interval, and the server's own hourly round-trip PING
/// at a PING's cost.
#[derive(Debug, Default)]
struct Slow {
    month: f64,
    detail: String,
}

fn slow_events(knobs: &[Knob], counts: &[Counters], window: Duration) -> Slow {
    let mut month = 0.0;
    let mut parts = Vec::new();
    for (k, c) in knobs.iter().zip(counts) {
        let e = per_event(k, *c, window);
        let (what, every) = if k.key == "ping-secs" {
            ("the server's hourly round-trip PING", 3600)
        } else {
            (k.name, k.default_secs)
        };
        let m = e * MONTH.as_secs_f64() / every as f64;
        month += m;
        parts.push(format!("{what} {}", mib(m)));
    }
    Slow {
        month,
        detail: parts.join(", "),
    }
}

fn rows(ours: &Measured, base: &Measured, window: Duration, slow: &Slow) -> Vec<Row> {
    let measured = per_month(ours.idle, window);
    let (o, b) = (measured + slow.month, per_month(base.idle, window));
    let detail = |c: Counters| {
        format!(
            "{} B sent, {} B received, {} + {} segments",
            c.acked, c.received, c.segs_out, c.segs_in
        )
    };
    let upgrade = |m: &Measured| m.intent.wire() + m.start_up.wire();
    vec![
        Row::new("idle traffic of one device on the wire, per 30 days (TLS, IPv4/TCP headers)")
            .ours(mib(o))
            .baseline(mib(b))
            .ratio(format!("{:.2}×", o / b.max(1.0)))
            .target("≤ 5 MiB", Verdict::from_ok(o <= BUDGET_BYTES))
            .note(format!(
                "Release agent (glibc build) against the released 0.2.0, side by side over the same {} s idle window, each on its own nats-server 2.14 over TLS (harness CA, generated config: server PINGs every 240 s), 3 busybox workloads under Podman, production settings. From the kernel (ss -ti, the agent's socket): TCP payload both ways plus 52 B a segment. Ours: {} in the window ({} a month), plus its slow events at their measured costs ({}); 0.2.0: {} (its heartbeat every 30 s, check every 300 s and PINGs every 2 min all fall in the window). A silent link is detected by the agent within 3 × 200 s and closed by its server within about 4 × 240 s (docs/operator/traffic.md).",
                window.as_secs(),
                detail(ours.idle),
                mib(measured),
                slow.detail,
                detail(base.idle)
            )),
        Row::new("one desired change on the wire (one workload's spec, until it runs)")
            .ours(kib(ours.change.wire()))
            .baseline(kib(base.change.wire()))
            .ratio(format!("{:.2}×", ours.change.wire() as f64 / base.change.wire().max(1) as f64))
            .note(format!(
                "The republished document, the reconciler's workloads reports, and what else the agent sent in the {} s after it ran. Ours: {}; 0.2.0: {}.",
                AFTER_CHANGE.as_secs(),
                detail(ours.change),
                detail(base.change)
            )),
        Row::new("one agent upgrade on the wire, without the artifact")
            .ours(kib(upgrade(ours)))
            .baseline(kib(upgrade(base)))
            .ratio(format!("{:.2}×", upgrade(ours) as f64 / upgrade(base).max(1) as f64))
            .note(format!(
                "The intent delivered and answered (no updater here: the agent reports it cannot forward it; ours {}, 0.2.0 {}) plus a new agent process's start-up on a new connection, {} s (TLS handshake, CONNECT, info, snapshot reads, status; ours {}, 0.2.0 {}). Not included: the updater's few phase writes.",
                kib(ours.intent.wire()),
                kib(base.intent.wire()),
                AFTER_CHANGE.as_secs(),
                kib(ours.start_up.wire()),
                kib(base.start_up.wire())
            )),
    ]
}
