//! A misbehaving Podman. The real agent, a real nats-server and
//! an isolated Podman behind `tests/harness/fixtures/podman-faults.sh`,
//! which forwards every call but hangs, fails or floods on cue. Asserted:
//! the workloads report and the heartbeat say Podman is unreachable while
//! it is, heartbeats keep their schedule through a hang, a failed run keeps
//! its own error, log lines stay bounded, memory stays near idle after a
//! flood, and a hung Podman call does not outlive the agent.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use fleet_common::contracts::{Heartbeat, WorkloadState, WorkloadStatus, WorkloadsReport};
use fleet_harness::{poll_until, ChildGuard, NatsServer, NatsVersion, Podman};
use rustix::process::Signal;
use tempfile::TempDir;

/// The agent's Podman command timeout here: a hung call is killed after it.
const COMMAND_TIMEOUT_SECS: u64 = 8;
/// What the agent may write in one log line (prefix included): outside
/// text is cut at 4 KiB (`MAX_LOG_TEXT_BYTES`), a diagnostic at 640 bytes.
const MAX_LOG_LINE_BYTES: usize = 4096;

/// The wrapper and its control directory.
struct Faults {
    dir: TempDir,
    binary: PathBuf,
}

impl Faults {
    fn new(podman: &Podman) -> Faults {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix("fleet-podman-faults-")
            .tempdir()
            .expect("tempdir");
        let binary = dir.path().join("podman");
        let script = format!(
            "#!/bin/sh\nREAL='{}'\nCTL='{}'\n{}",
            podman.binary().display(),
            dir.path().display(),
            include_str!("../../tests/harness/fixtures/podman-faults.sh")
        );
        std::fs::write(&binary, script).expect("write wrapper");
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755))
            .expect("chmod wrapper");
        Faults { dir, binary }
    }

    /// From now on, `podman <sub>` does `mode`.
    fn set(&self, sub: &str, mode: &str) {
        let tmp = self.dir.path().join(format!(".{sub}.tmp"));
        std::fs::write(&tmp, format!("{mode}\n")).expect("write control file");
        std::fs::rename(&tmp, self.dir.path().join(sub)).expect("rename control file");
    }

    /// `podman <sub>` is forwarded again.
    fn clear(&self, sub: &str) {
        let _ = std::fs::remove_file(self.dir.path().join(sub));
        let _ = std::fs::remove_file(self.dir.path().join(format!("{sub}.pid")));
    }

    /// The pid of the last hung `podman <sub>`.
    fn hung_pid(&self, sub: &str) -> Option<u32> {
        std::fs::read_to_string(self.dir.path().join(format!("{sub}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// How many calls of `podman <sub>` did `mode`.
    fn calls(&self, sub: &str, mode: &str) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("calls.log")).unwrap_or_default();
        let want = format!("{sub} {mode}");
        log.lines().filter(|l| *l == want).count()
    }
}

/// Device `dev1` whose agent runs Podman through the wrapper.
fn device(nats: &NatsServer, podman: &Podman, faults: &Faults) -> Device {
    let dev = Device::new("dev1", &Settings::new(vec![nats.url()]), Some(podman));
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&dev.config).expect("read config")).expect("json");
    config["podman"]["binary"] = serde_json::json!(faults.binary);
    config["podman"]["command-timeout-secs"] = serde_json::json!(COMMAND_TIMEOUT_SECS);
    std::fs::write(
        &dev.config,
        serde_json::to_vec_pretty(&config).expect("json"),
    )
    .expect("write config");
    dev
}

fn report(admin: &nats::Connection) -> Option<WorkloadsReport> {
    status(admin, "dev1", "workloads")
}

fn heartbeat(admin: &nats::Connection) -> Option<Heartbeat> {
    status(admin, "dev1", "heartbeat")
}

fn workload<'a>(r: &'a WorkloadsReport, w: &str) -> Option<&'a WorkloadStatus> {
    r.workloads
        .iter()
        .find(|(k, _)| k.as_str() == w)
        .map(|(_, s)| s)
}

fn wait_report(
    admin: &nats::Connection,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&WorkloadsReport) -> bool,
) -> WorkloadsReport {
    poll_until(what, timeout, || report(admin).filter(|r| pred(r)))
}

/// Every heartbeat the agent writes, with when it arrived.
struct Beats {
    seen: Arc<Mutex<Vec<Instant>>>,
    stop: Arc<AtomicBool>,
}

impl Beats {
    fn record(admin: &nats::Connection) -> Beats {
        let sub = admin
            .subscribe("$KV.fleet-status.dev1.heartbeat")
            .expect("subscribe to heartbeats");
        let seen: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let stop: Arc<AtomicBool> = Arc::default();
        let (s, st) = (Arc::clone(&seen), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("test-beats".into())
            .spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    if sub.next_timeout(Duration::from_millis(200)).is_ok() {
                        s.lock().expect("lock").push(Instant::now());
                    }
                }
            })
            .expect("spawn beat recorder");
        Beats { seen, stop }
    }

    /// Arrival times after `from`.
    fn since(&self, from: Instant) -> Vec<Instant> {
        self.seen
            .lock()
            .expect("lock")
            .iter()
            .copied()
            .filter(|t| *t >= from)
            .collect()
    }
}

impl Drop for Beats {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `VmHWM` or `VmRSS` of `pid` in KiB.
fn vm_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Every line the agent logged is bounded and free of terminal escapes.
fn assert_log_bounded(agent: &ChildGuard) {
    for line in agent.lines() {
        assert!(
            line.len() <= MAX_LOG_LINE_BYTES,
            "a log line of {} bytes: {}…",
            line.len(),
            line.chars().take(200).collect::<String>()
        );
        assert!(!line.contains('\u{1b}'), "a raw escape in the log: {line}");
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

/// Podman hangs for a while, then fails, then recovers: the report and the
/// heartbeat say so while it lasts, no heartbeat is missed (the version
/// refresh hangs too), the failure's stderr is bounded and escaped, and a
/// `ps` hung when the agent stops is killed with it.
#[test]
fn a_hung_podman_is_reported_and_heartbeats_keep_their_schedule() {
    let podman = Podman::new();
    let nats = NatsServer::start_fleet(NatsVersion::V2_9, &["dev1"]);
    let admin = nats.admin();
    let faults = Faults::new(&podman);
    put_workload(&admin, "dev1", "web", &quick_sleeper(&podman, "web"));
    let dev = device(&nats, &podman, &faults);
    let mut agent = dev.start(Some(&podman));
    wait_report(&admin, "web running", CONVERGE, |r| {
        workload(r, "web").is_some_and(|s| s.state == WorkloadState::Running)
    });
    let beats = Beats::record(&admin);

    // `ps` and `version` hang. A change makes the next pass read live
    // state: api is created from the list kept while idle, then `ps` hangs.
    faults.set("ps", "hang");
    faults.set("version", "hang");
    let hung_at = Instant::now();
    put_workload(&admin, "dev1", "api", &quick_sleeper(&podman, "api"));
    poll_until("ps hung", CONVERGE, || faults.hung_pid("ps"));
    let ps_hung = Instant::now();
    let r = wait_report(
        &admin,
        "Podman unreachable in the report",
        Duration::from_secs(30),
        |r| {
            r.podman_unreachable.is_some()
                && workload(r, "web").is_some_and(|s| s.state == WorkloadState::Unknown)
        },
    );
    // Silent for the resync interval (2 s here, at least 5 s), plus a
    // publish: before the ps is killed, and well within one production
    // resync interval (30 s).
    let reported_after = ps_hung.elapsed();
    assert!(
        reported_after < Duration::from_secs(COMMAND_TIMEOUT_SECS),
        "reported {reported_after:?} after ps hung"
    );
    let down = r.podman_unreachable.clone().expect("unreachable");
    assert!(
        down.error.as_str().contains("podman ps has not answered"),
        "{down:?}"
    );
    assert_eq!(workload(&r, "web").expect("web").container_id, None);
    // A workload put while Podman hangs waits, saying why.
    put_workload(&admin, "dev1", "db", &quick_sleeper(&podman, "db"));
    let r = wait_report(&admin, "db waiting", CONVERGE, |r| {
        workload(r, "db").is_some_and(|s| s.state == WorkloadState::Pending)
    });
    let db = workload(&r, "db").expect("db");
    assert!(
        db.waiting
            .as_ref()
            .is_some_and(|w| w.as_str().starts_with("Podman unreachable: podman ps")),
        "{db:?}"
    );
    poll_until("an unhealthy heartbeat", CONVERGE, || {
        heartbeat(&admin).filter(|h| h.podman_unreachable.is_some())
    });

    // The version refresh (every 20 heartbeats: 20 s here) hangs too, and
    // is killed at the command timeout; heartbeats go on meanwhile.
    poll_until("the version refresh hung", CONVERGE, || {
        faults.hung_pid("version")
    });
    agent.wait_for_line("re-reading the Podman version", CONVERGE);
    // A ps hung past the command timeout is an error like any other.
    let r = wait_report(&admin, "the ps timeout reported", CONVERGE, |r| {
        r.podman_unreachable
            .as_ref()
            .is_some_and(|d| d.error.as_str().contains("was killed"))
    });
    assert_eq!(
        r.podman_unreachable.as_ref().map(|d| d.since),
        Some(down.since),
        "unreachable since the first failure"
    );
    let now = Instant::now();
    let hang = now - hung_at;
    let mut seen = vec![hung_at];
    seen.extend(beats.since(hung_at));
    seen.push(now);
    let gaps: Vec<Duration> = seen.windows(2).map(|w| w[1] - w[0]).collect();
    let worst = gaps.iter().max().copied().unwrap_or_default();
    // 1 s interval plus up to 0.1 s jitter, plus a loaded CI machine.
    assert!(
        worst < Duration::from_millis(2500),
        "a heartbeat gap of {worst:?} during a {hang:?} hang: {gaps:?}"
    );

    // Podman fails, with a long line of stderr full of escapes.
    faults.set("ps", "fail");
    let r = wait_report(&admin, "the failure reported", CONVERGE, |r| {
        r.podman_unreachable
            .as_ref()
            .is_some_and(|d| d.error.as_str().contains("storage is corrupt"))
    });
    let error = r.podman_unreachable.expect("unreachable").error;
    assert!(!error.as_str().contains('\u{1b}'), "{error:?}");
    assert!(error.as_str().contains("\\u{1b}[31m"), "{error:?}");
    assert!(error.as_str().contains("more bytes cut]"), "{error:?}");
    assert!(error.as_str().chars().count() <= 1024);

    // Podman recovers: so does the report, and the change that waited.
    faults.clear("ps");
    faults.clear("version");
    wait_report(&admin, "recovered", CONVERGE, |r| {
        r.podman_unreachable.is_none()
            && ["web", "api", "db"].iter().all(|w| {
                workload(r, w)
                    .is_some_and(|s| s.state == WorkloadState::Running && s.waiting.is_none())
            })
    });
    poll_until("a healthy heartbeat", CONVERGE, || {
        heartbeat(&admin).filter(|h| h.podman_unreachable.is_none())
    });
    assert_log_bounded(&agent);

    // A ps hung when the agent stops does not outlive it.
    faults.set("ps", "hang");
    put_workload(&admin, "dev1", "cam", &quick_sleeper(&podman, "cam"));
    let pid = poll_until("a hung ps", CONVERGE, || faults.hung_pid("ps"));
    assert!(alive(pid));
    let stopping = Instant::now();
    agent.signal(Signal::TERM);
    let status = agent.wait_exit(CONVERGE);
    assert!(status.success(), "{status}:\n{}", agent.log());
    assert!(
        stopping.elapsed() < Duration::from_secs(COMMAND_TIMEOUT_SECS),
        "the stop waited for the hung ps: {:?}",
        stopping.elapsed()
    );
    poll_until("the hung ps killed", Duration::from_secs(5), || {
        (!alive(pid)).then_some(())
    });
    assert!(agent.log().contains("killed 1 Podman calls still running"));
    drop(beats);
}

/// A failing `run` whose image probe then hangs: the report keeps the
/// run's error (the cause), not the probe's timeout.
#[test]
fn a_failed_run_keeps_its_error_when_the_image_probe_hangs() {
    let podman = Podman::new();
    let nats = NatsServer::start_fleet(NatsVersion::V2_14, &["dev1"]);
    let admin = nats.admin();
    let faults = Faults::new(&podman);
    faults.set("run", "fail");
    faults.set("image", "hang");
    put_workload(&admin, "dev1", "web", &quick_sleeper(&podman, "web"));
    let dev = device(&nats, &podman, &faults);
    let agent = dev.start(Some(&podman));
    let r = wait_report(&admin, "web backing off", CONVERGE, |r| {
        workload(r, "web").is_some_and(|s| s.state == WorkloadState::BackOff)
    });
    let web = workload(&r, "web").expect("web");
    let error = web.last_error.as_ref().expect("an error").as_str();
    assert!(
        error.starts_with(
            "podman run fleet-web failed (exit code 125): Error: \\u{1b}[31mstorage is corrupt"
        ),
        "{error}"
    );
    assert!(error.contains("more bytes cut]"), "{error}");
    assert!(faults.calls("image", "hang") >= 1);
    agent.wait_for_line("after a failed run, looking for the image", CONVERGE);
    assert_eq!(r.podman_unreachable, None, "ps answers: {r:?}");
    assert_log_bounded(&agent);
}

/// 50 MB of output from `ps`, on stdout then on stderr, several times:
/// refused with its size, and the agent's peak memory stays within 2 MiB
/// of what it was idle.
#[test]
fn a_flood_of_podman_output_leaves_memory_near_idle() {
    const FLOOD: u64 = 50_000_000;
    let podman = Podman::new();
    let nats = NatsServer::start_fleet(NatsVersion::V2_9, &["dev1"]);
    let admin = nats.admin();
    let faults = Faults::new(&podman);
    put_workload(&admin, "dev1", "web", &quick_sleeper(&podman, "web"));
    let dev = device(&nats, &podman, &faults);
    let agent = dev.start(Some(&podman));
    wait_report(&admin, "web running", CONVERGE, |r| {
        workload(r, "web").is_some_and(|s| s.state == WorkloadState::Running)
    });
    // Idle: a few resync intervals with nothing to do.
    let settle = Instant::now();
    poll_until("idle", Duration::from_secs(10), || {
        (settle.elapsed() > Duration::from_secs(3 * RESYNC_SECS)).then_some(())
    });
    let idle_hwm = vm_kib(agent.pid(), "VmHWM");
    let idle_rss = vm_kib(agent.pid(), "VmRSS");

    faults.set("ps", &format!("flood-stdout {FLOOD}"));
    // A desired change makes the next pass read live state.
    put_workload(&admin, "dev1", "api", &quick_sleeper(&podman, "api"));
    let r = wait_report(&admin, "the stdout flood refused", CONVERGE, |r| {
        r.podman_unreachable
            .as_ref()
            .is_some_and(|d| d.error.as_str().contains("more than the 524288 read"))
    });
    let error = r.podman_unreachable.expect("unreachable").error;
    assert!(
        error.as_str().starts_with(&format!(
            "podman ps printed unexpected output: {} bytes",
            FLOOD + 5
        )),
        "{error:?}"
    );
    poll_until("three stdout floods", CONVERGE, || {
        (faults.calls("ps", "flood-stdout") >= 3).then_some(())
    });
    faults.set("ps", &format!("flood-stderr {FLOOD}"));
    wait_report(&admin, "the stderr flood cut", CONVERGE, |r| {
        r.podman_unreachable.as_ref().is_some_and(|d| {
            d.error.as_str().contains("xxxx… [") && d.error.as_str().contains("more bytes cut]")
        })
    });
    poll_until("three stderr floods", CONVERGE, || {
        (faults.calls("ps", "flood-stderr") >= 3).then_some(())
    });
    let hwm = vm_kib(agent.pid(), "VmHWM");
    let rss = vm_kib(agent.pid(), "VmRSS");
    eprintln!(
        "agent memory: idle VmHWM {idle_hwm} KiB VmRSS {idle_rss} KiB; after 6 floods of {FLOOD} bytes VmHWM {hwm} KiB VmRSS {rss} KiB"
    );
    assert!(
        hwm <= idle_hwm + 2048,
        "VmHWM went from {idle_hwm} KiB idle to {hwm} KiB after the floods"
    );
    faults.clear("ps");
    wait_report(&admin, "recovered", CONVERGE, |r| {
        r.podman_unreachable.is_none()
            && workload(r, "api").is_some_and(|s| s.state == WorkloadState::Running)
    });
    assert_log_bounded(&agent);
}
