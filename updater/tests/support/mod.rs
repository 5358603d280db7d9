//! Shared pieces of the updater's integration tests: stand-in agents, a
//! device in a temp root, the real `fleet-updater` binary under the
//! in-process supervisor, and what can be observed of them (journal, status,
//! the active link, running agent processes, the stand-ins' event log).
//!
//! Stand-in agents are small Python programs (`/usr/bin/python3`, Debian
//! package `python3`) served over HTTPS like a real artifact. They
//! implement the agent's CLI contract: `--self-test --config PATH` prints a
//! `SelfTestReport`; `run --config PATH` takes an exclusive lock, sends
//! `READY=1` to `$NOTIFY_SOCKET` and drains on SIGTERM. Each one logs
//! `start|stop|self-test|crash|OVERLAP <version> <pid>` to
//! `<root>/var/lib/harmony-fleet/agent/stand-in-events.log`; `OVERLAP` means
//! an agent found another still holding the lock — two agents at once.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use fleet_common::contracts::{
    AgentUpgradeAttempt, ErrorCode, Journal, JournalPhase, Response, UpdaterReply, UpdaterRequest,
    UpgradePhase, UpgradeReason, UpgradeStatus,
};
use fleet_common::socket;
use fleet_common::validate::{
    Arch, ArtifactUrl, AttemptUuid, DeviceId, MaxBytes, Sha256Hex, Version,
};
use fleet_common::Layout;
use fleet_harness::poll_until;
use fleet_harness::ChildGuard;
use fleet_harness::{HttpsServer, TestCa};

/// Shortened bounds for the updater under test (ms): a candidate that
/// never becomes ready fails in seconds, not 4 min 15 s.
pub const TEST_BOUNDS: &str =
    "https-connect=5000,https-request=4000,probe=15000,stop=10000,start=6000";
/// How long recovery or an upgrade may take on a loaded 2-core machine.
pub const SETTLE: Duration = Duration::from_secs(60);

/// The fault-injection build is required (the Makefile's test run enables it).
pub fn require_test_build() {
    #[cfg(not(feature = "fault-injection"))]
    panic!(
        "these tests need the test build of the updater: cargo test -p fleet-updater --features fault-injection (make test does)"
    );
}

fn require_python() {
    assert!(
        Path::new("/usr/bin/python3").exists(),
        "missing /usr/bin/python3: install the Debian package python3 (make deps)"
    );
}

/// What a stand-in's `--self-test` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelfTest {
    Pass,
    /// Exits 3 with a failed check.
    Fail,
    /// Exits 0 reporting another version.
    Lie,
    /// Never returns.
    Hang,
}

/// What a stand-in's `run` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    Ready,
    /// Runs without ever sending READY=1.
    NeverReady,
    /// Exits 1 at once.
    Crash,
}

/// A stand-in agent of one version.
#[derive(Debug, Clone)]
pub struct StandIn {
    pub version: String,
    pub self_test: SelfTest,
    pub run: Run,
}

impl StandIn {
    pub fn good(version: &str) -> Self {
        Self {
            version: version.to_owned(),
            self_test: SelfTest::Pass,
            run: Run::Ready,
        }
    }

    pub fn with(version: &str, self_test: SelfTest, run: Run) -> Self {
        Self {
            version: version.to_owned(),
            self_test,
            run,
        }
    }

    pub fn script(&self) -> Vec<u8> {
        let self_test = match self.self_test {
            SelfTest::Pass => "pass",
            SelfTest::Fail => "fail",
            SelfTest::Lie => "lie",
            SelfTest::Hang => "hang",
        };
        let run = match self.run {
            Run::Ready => "ready",
            Run::NeverReady => "never-ready",
            Run::Crash => "crash",
        };
        STAND_IN
            .replace("@VERSION@", &self.version)
            .replace("@SELF_TEST@", self_test)
            .replace("@RUN@", run)
            .into_bytes()
    }

    pub fn sha256(&self) -> Sha256Hex {
        Sha256Hex::of(&self.script())
    }
}

const STAND_IN: &str = r#"#!/usr/bin/python3
# fleet-agent stand-in @VERSION@ (self-test: @SELF_TEST@, run: @RUN@)
import fcntl, json, os, signal, socket, sys, time
VERSION, SELF_TEST, RUN = "@VERSION@", "@SELF_TEST@", "@RUN@"
args = sys.argv[1:]
config = args[args.index("--config") + 1]
root = os.path.dirname(os.path.dirname(os.path.dirname(config)))
state = os.path.join(root, "var/lib/harmony-fleet/agent")
pid = str(os.getpid())
def event(*words):
    with open(os.path.join(state, "stand-in-events.log"), "a") as f:
        f.write(" ".join(words) + "\n")
def notify(msg):
    addr = os.environ.get("NOTIFY_SOCKET")
    if addr:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.sendto(msg.encode(), addr)
        s.close()
if "--self-test" in args:
    event("self-test", VERSION, pid)
    if SELF_TEST == "hang":
        time.sleep(3600)
    if SELF_TEST == "lie":
        print(json.dumps({"version": VERSION + "-other"}))
        sys.exit(0)
    if SELF_TEST == "fail":
        print(json.dumps({"version": VERSION, "checks": [{"name": "nats", "ok": False, "detail": "stand-in told to fail"}]}))
        print("stand-in self-test failure", file=sys.stderr)
        sys.exit(3)
    print(json.dumps({"version": VERSION, "checks": [{"name": "config", "ok": True}]}))
    sys.exit(0)
if args[:1] == ["run"]:
    lock = open(os.path.join(state, "stand-in.lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        event("OVERLAP", VERSION, pid)
        sys.exit(70)
    if RUN == "crash" or os.path.exists(os.path.join(state, "fail-start-" + VERSION)):
        event("crash", VERSION, pid)
        sys.exit(1)
    event("start", VERSION, pid)
    def term(signum, frame):
        event("stop", VERSION, pid)
        notify("STOPPING=1")
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    if RUN == "ready":
        notify("READY=1\nSTATUS=stand-in " + VERSION + " running")
    while True:
        time.sleep(3600)
sys.exit(2)
"#;

/// An attempt for `stand_in` at `url`.
pub fn attempt(url: &str, stand_in: &StandIn) -> AgentUpgradeAttempt {
    AgentUpgradeAttempt {
        arch: Arch::current().expect("a supported architecture"),
        artifact_url: ArtifactUrl::parse(url).expect("test url"),
        device_id: DeviceId::parse("test-device").expect("device"),
        max_bytes: MaxBytes::new(1024 * 1024).expect("max"),
        sha256: stand_in.sha256(),
        target_version: Version::parse(&stand_in.version).expect("version"),
        uuid: AttemptUuid::new_random(),
    }
}

/// A device: a temp root with an installed, active stand-in.
#[derive(Debug)]
pub struct Device {
    pub dir: tempfile::TempDir,
    pub layout: Layout,
    pub config: PathBuf,
}

impl Device {
    /// `initial` installed and active; the updater trusts `ca`; candidates
    /// and the agent run as `nobody` (the tests run as root).
    pub fn new(ca: &TestCa, initial: &StandIn) -> Self {
        require_test_build();
        require_python();
        let dir = tempfile::tempdir().expect("tempdir");
        // Traversable by `nobody`, like / is on a device.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod root");
        let layout = Layout::with_root(dir.path());
        for d in [
            layout.versions_dir(),
            layout.config_dir(),
            layout.agent_state_dir(),
            layout
                .active_agent_link()
                .parent()
                .expect("bin dir")
                .to_owned(),
        ] {
            std::fs::create_dir_all(&d).expect("mkdir");
        }
        // The agent's state directory belongs to the agent's user on a device.
        std::fs::set_permissions(
            layout.agent_state_dir(),
            std::fs::Permissions::from_mode(0o777),
        )
        .expect("chmod state");
        std::fs::write(layout.agent_config(), "{}\n").expect("agent config");
        let bin = layout.versioned_agent(&Version::parse(&initial.version).expect("v"));
        std::fs::write(&bin, initial.script()).expect("install");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::os::unix::fs::symlink(&bin, layout.active_agent_link()).expect("link");
        let config = dir.path().join("updater-test.json");
        std::fs::write(
            &config,
            serde_json::json!({
                "ca-file": ca.ca_path(),
                "probe-user": "nobody",
            })
            .to_string(),
        )
        .expect("updater config");
        Self {
            dir,
            layout,
            config,
        }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The real binary with `--root`, `--config` and the supervisor.
    pub fn updater_command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet-updater"));
        cmd.arg("run")
            .arg("--root")
            .arg(self.root())
            .arg("--config")
            .arg(&self.config)
            .args(["--service-manager", "supervisor"])
            .env(fleet_updater::TEST_BOUNDS_ENV, TEST_BOUNDS)
            .env_remove(fleet_updater::FAULT_ENV)
            .env_remove("NOTIFY_SOCKET");
        cmd
    }

    /// Starts the updater and waits until its socket answers.
    pub fn start_updater(&self) -> Updater {
        self.spawn_updater(None)
    }

    /// Starts the updater armed to abort at `point`.
    pub fn start_updater_with_fault(&self, point: fleet_updater::FaultPoint) -> Updater {
        self.spawn_updater(Some(point))
    }

    /// Starts the updater armed at `point` without waiting for anything
    /// (it may abort during recovery).
    pub fn launch_updater_with_fault(&self, point: fleet_updater::FaultPoint) -> Updater {
        let mut cmd = self.updater_command();
        cmd.env(fleet_updater::FAULT_ENV, point.as_str());
        Updater {
            guard: ChildGuard::spawn(cmd, "fleet-updater"),
        }
    }

    fn spawn_updater(&self, fault: Option<fleet_updater::FaultPoint>) -> Updater {
        let mut cmd = self.updater_command();
        if let Some(p) = fault {
            cmd.env(fleet_updater::FAULT_ENV, p.as_str());
        }
        let guard = ChildGuard::spawn(cmd, "fleet-updater");
        // Recovery (or, with nothing to recover, the supervisor's boot start
        // of the agent) holds the mutator until this line: an `upgrade`
        // before it is answered `busy`.
        guard.wait_for_line("recovery complete", SETTLE);
        let updater = Updater { guard };
        poll_until("the updater socket answers", SETTLE, || {
            self.try_status().ok()
        });
        updater
    }

    /// `status` over the socket.
    pub fn try_status(&self) -> Result<Option<UpgradeStatus>, String> {
        match socket::call::<_, UpdaterReply>(
            &self.layout.updater_socket(),
            &UpdaterRequest::Status {},
            fleet_common::limits::SOCKET_STATUS_RESPONSE_TIMEOUT,
        ) {
            Ok(Response::Ok(r)) => Ok(r.status),
            Ok(Response::Err(e)) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    pub fn status(&self) -> Option<UpgradeStatus> {
        self.try_status().expect("status answered")
    }

    /// `upgrade` over the socket, waiting for its answer.
    pub fn upgrade(&self, attempt: &AgentUpgradeAttempt) -> Response<UpdaterReply> {
        socket::call(
            &self.layout.updater_socket(),
            &UpdaterRequest::Upgrade {
                attempt: attempt.clone(),
            },
            fleet_common::limits::SOCKET_UPGRADE_RESPONSE_TIMEOUT,
        )
        .expect("upgrade answered")
    }

    /// An accepted upgrade's status (panics on a refusal). `busy` is asked
    /// again: the recovery thread logs "recovery complete" just before it
    /// lets go of the journal, and the attempt before a test's own may
    /// still be settling.
    pub fn upgrade_ok(&self, attempt: &AgentUpgradeAttempt) -> UpgradeStatus {
        poll_until("the upgrade accepted, not busy", SETTLE, || {
            match self.upgrade(attempt) {
                Response::Ok(r) => Some(r.status.expect("a status")),
                Response::Err(e) if e.code == fleet_common::contracts::ErrorCode::Busy => None,
                Response::Err(e) => panic!("upgrade refused: {e}"),
            }
        })
    }

    /// Waits until the status is terminal and the supervisor settled.
    pub fn wait_terminal(&self) -> UpgradeStatus {
        poll_until("a terminal upgrade phase", SETTLE, || {
            self.try_status()
                .ok()
                .flatten()
                .filter(|s| s.phase.is_terminal())
        })
    }

    pub fn journal(&self) -> Journal {
        let text = std::fs::read_to_string(self.layout.journal()).expect("journal");
        serde_json::from_str(&text).expect("the journal is valid JSON")
    }

    pub fn active(&self) -> PathBuf {
        std::fs::read_link(self.layout.active_agent_link()).expect("active link")
    }

    pub fn binary(&self, version: &str) -> PathBuf {
        self.layout
            .versioned_agent(&Version::parse(version).expect("version"))
    }

    pub fn events(&self) -> Vec<String> {
        std::fs::read_to_string(self.layout.agent_state_dir().join("stand-in-events.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Processes of this device's agents (`run`), found by their command
    /// line, which names this device's root.
    pub fn running_agents(&self) -> Vec<u32> {
        let root = self.root().to_string_lossy().into_owned();
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let is_agent = args
                .iter()
                .any(|a| a.starts_with(&root) && a.contains("fleet-agent"))
                && args.iter().any(|a| a == "run");
            // A zombie has an empty cmdline and is not counted.
            if is_agent {
                pids.push(pid);
            }
        }
        pids
    }

    /// Exactly one agent runs, it is `version`, and the active link points
    /// at `version`; no two agents ever overlapped.
    pub fn assert_only_agent(&self, version: &str) {
        let pid = poll_until(
            &format!("exactly one running agent, of version {version}"),
            SETTLE,
            || {
                let running = self.running_agents();
                let last_start = self
                    .events()
                    .iter()
                    .rev()
                    .find(|e| e.starts_with("start "))
                    .cloned();
                match (running.as_slice(), last_start) {
                    ([pid], Some(e)) if e == format!("start {version} {pid}") => Some(*pid),
                    _ => None,
                }
            },
        );
        assert_eq!(self.active(), self.binary(version), "active link");
        self.assert_no_overlap();
        // Still exactly one a moment later (no late second start).
        assert_eq!(
            self.running_agents(),
            vec![pid],
            "events: {:?}",
            self.events()
        );
    }

    pub fn assert_no_overlap(&self) {
        let events = self.events();
        assert!(
            !events.iter().any(|e| e.starts_with("OVERLAP")),
            "two agents ran at once: {events:?}"
        );
    }

    /// Sends raw bytes on the socket and returns the answer line.
    pub fn raw(&self, bytes: &[u8]) -> String {
        use std::io::{Read, Write};
        let mut s =
            std::os::unix::net::UnixStream::connect(self.layout.updater_socket()).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let _ = s.write_all(bytes);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// `fleet-updater status [--json]` output and exit status.
    pub fn status_cli(&self, json: bool) -> (ExitStatus, String, String) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet-updater"));
        cmd.arg("status").arg("--root").arg(self.root());
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("status runs");
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// The running updater; killed (with its process group) on drop.
#[derive(Debug)]
pub struct Updater {
    pub guard: ChildGuard,
}

impl Updater {
    /// Waits for the armed fault to abort the process.
    pub fn wait_aborted(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        let status = self.guard.wait_exit(SETTLE);
        assert_eq!(
            status.signal(),
            Some(6),
            "the updater should have aborted at its fault point; it ended with {status:?}; log:\n{}",
            self.guard.log()
        );
    }

    pub fn log(&self) -> String {
        self.guard.log()
    }
}

/// Time taken by `f`.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}

/// Waits until no agent of `device` runs (they die with their updater).
pub fn poll_agents_gone(device: &Device) {
    poll_until(
        "no agent process left after the updater died",
        SETTLE,
        || device.running_agents().is_empty().then_some(()),
    );
}

/// A device on 1.0 with its updater running, and an HTTPS server for
/// artifacts; the assertions of a refusal that changed nothing.
pub struct Bench {
    pub ca: TestCa,
    pub server: HttpsServer,
    pub device: Device,
    pub updater: Updater,
    pub agent_pid: u32,
}

/// A device on 1.0 with its updater running, and a server.
pub fn bench() -> Bench {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    let device = Device::new(&ca, &StandIn::good("1.0"));
    let updater = device.start_updater();
    device.assert_only_agent("1.0");
    let agent_pid = device.running_agents()[0];
    Bench {
        ca,
        server,
        device,
        updater,
        agent_pid,
    }
}

impl Bench {
    /// Nothing changed on the device: same agent process, same link, no
    /// candidate or temp file installed.
    pub fn assert_untouched(&self) {
        self.device.assert_only_agent("1.0");
        assert_eq!(
            self.device.running_agents(),
            vec![self.agent_pid],
            "the agent was restarted"
        );
        let leftovers: Vec<String> = std::fs::read_dir(self.device.layout.versions_dir())
            .expect("versions dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "fleet-agent-v1.0")
            .collect();
        assert!(
            leftovers.is_empty(),
            "left in the versions dir: {leftovers:?}"
        );
    }

    /// The attempt failed for `reason` with an error containing `says`,
    /// the journal agrees, and nothing changed.
    pub fn assert_failed(
        &self,
        a: &fleet_common::contracts::AgentUpgradeAttempt,
        reason: UpgradeReason,
        says: &str,
    ) {
        let s = self.device.upgrade_ok(a);
        assert_eq!(
            (s.phase, s.reason),
            (UpgradePhase::Failed, Some(reason)),
            "{s:#?}"
        );
        let error = s.error.as_ref().expect("an error").to_string();
        eprintln!("{:?}: {error}", reason);
        assert!(error.contains(says), "error {error:?} should say {says:?}");
        let journal = self.device.journal();
        let tx = journal.transaction.as_ref().expect("tx");
        assert_eq!(
            (tx.attempt.uuid, tx.phase, tx.reason),
            (a.uuid, JournalPhase::Failed, Some(reason))
        );
        let phases: Vec<JournalPhase> = tx.transitions.iter().map(|t| t.phase).collect();
        assert_eq!(phases, [JournalPhase::Preparing, JournalPhase::Failed]);
        self.assert_untouched();
    }

    /// The request was refused with `code` and a message containing
    /// `says`; no transaction was started.
    pub fn assert_refused(&self, answer: &str, code: ErrorCode, says: &str) {
        let v: serde_json::Value =
            serde_json::from_str(answer.trim()).unwrap_or_else(|e| panic!("{answer:?}: {e}"));
        assert_eq!(v["ok"], false, "{answer}");
        assert_eq!(v["error"]["code"], code.as_str(), "{answer}");
        let message = v["error"]["message"].as_str().expect("message");
        assert!(message.contains(says), "{message:?} should say {says:?}");
        assert!(
            !self.device.layout.journal().exists(),
            "a transaction was started"
        );
        self.assert_untouched();
    }

    pub fn upgrade_json(&self, attempt: serde_json::Value) -> String {
        let mut line = serde_json::json!({"request": "upgrade", "attempt": attempt}).to_string();
        line.push('\n');
        self.device.raw(line.as_bytes())
    }
}
