//! Workload health end to end: the real agent, a real nats-server and an
//! isolated Podman. Specs use 1 s intervals so that deadlines pass in
//! seconds; the health report (`<device>.health`), the workload report,
//! the containers and the agent's state files are read back.

mod common;

use std::time::{Duration, Instant};

use common::*;
use fleet_common::contracts::{
    AppliedSpecs, HealthReport, HealthState, Heartbeat, RevertReason, WorkloadHealth,
    WorkloadHealthState, WorkloadState, WorkloadsReport,
};
use fleet_harness::{poll_until, NatsServer, NatsVersion, Podman};
use serde_json::json;

/// A container that stops on SIGTERM at once.
const SLEEPER: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

fn spec(podman: &Podman, shell: &str, extra: serde_json::Value) -> String {
    let mut v = json!({
        "image": podman.busybox_image(),
        "command": ["sh", "-c", shell],
    });
    if let (Some(obj), Some(more)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in more {
            obj.insert(k.clone(), x.clone());
        }
    }
    v.to_string()
}

/// busybox httpd on container port 8080 serving `/` (200), published on
/// `port`; the shell stays PID 1 so SIGTERM stops it at once.
fn web_server(podman: &Podman, port: u16, probe_path: &str, tag: &str) -> String {
    spec(
        podman,
        &format!("echo ok > /tmp/index.html; httpd -p 8080 -h /tmp; {SLEEPER}"),
        json!({
            "env": {"TAG": tag},
            "ports": [{"host": port, "container": 8080}],
            "health": {"probe": {"kind": "http", "port": port, "path": probe_path},
                       "interval-secs": 1, "timeout-secs": 1, "retries": 2},
        }),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn health_of(admin: &nats::Connection, w: &str) -> Option<WorkloadHealth> {
    status::<HealthReport>(admin, "dev1", "health")
        .and_then(|r| r.workloads.into_iter().find(|(k, _)| k.as_str() == w))
        .map(|(_, h)| h)
}

fn wait_health(
    admin: &nats::Connection,
    w: &str,
    what: &str,
    pred: impl Fn(&WorkloadHealth) -> bool,
) -> WorkloadHealth {
    poll_until(what, CONVERGE, || health_of(admin, w).filter(|h| pred(h)))
}

fn wait_healthy(admin: &nats::Connection, w: &str, hash: &str) -> WorkloadHealth {
    wait_health(admin, w, &format!("{w} healthy on {hash}"), |h| {
        h.health == HealthState::Healthy && h.spec_hash.as_str() == hash
    })
}

fn wait_workload(
    admin: &nats::Connection,
    w: &str,
    what: &str,
    pred: impl Fn(&fleet_common::contracts::WorkloadStatus) -> bool,
) -> fleet_common::contracts::WorkloadStatus {
    poll_until(what, CONVERGE, || {
        status::<WorkloadsReport>(admin, "dev1", "workloads")
            .and_then(|r| r.workloads.into_iter().find(|(k, _)| k.as_str() == w))
            .map(|(_, s)| s)
            .filter(|s| pred(s))
    })
}

fn health_file(dev: &Device) -> WorkloadHealthState {
    let raw = std::fs::read(dev.path("var/lib/harmony-fleet/agent/workload-health.json"))
        .expect("workload-health.json");
    serde_json::from_slice(&raw).expect("workload-health.json parses")
}

fn failed_on_disk(dev: &Device, w: &str) -> Option<String> {
    let raw = std::fs::read(dev.path("var/lib/harmony-fleet/agent/workload-health.json")).ok()?;
    let state: WorkloadHealthState = serde_json::from_slice(&raw).ok()?;
    state
        .workloads
        .into_iter()
        .find(|(k, _)| k.as_str() == w)
        .and_then(|(_, r)| r.failed)
        .map(|f| f.spec_hash.as_str().to_owned())
}

fn with_hash(podman: &Podman, hash: &str) -> Vec<Seen> {
    containers(podman)
        .into_iter()
        .filter(|c| c.spec_hash.as_deref() == Some(hash))
        .collect()
}

/// For `period`, checks every 250 ms that `holds` (watching a state stay,
/// past deadlines that would change it if the feature broke).
fn stays(period: Duration, what: &str, holds: impl Fn() -> bool) {
    let until = Instant::now() + period;
    while Instant::now() < until {
        assert!(holds(), "{what} no longer holds");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The agent under test; its log is printed when the test fails.
struct Agent(fleet_harness::ChildGuard);

impl std::ops::Deref for Agent {
    type Target = fleet_harness::ChildGuard;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Agent {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- {} log ---\n{}", self.0.name(), self.0.log());
        }
    }
}

fn run_agent(dev: &Device, podman: &Podman) -> Agent {
    Agent(dev.start(Some(podman)))
}

fn start(v: NatsVersion) -> (Podman, NatsServer, nats::Connection, Device) {
    let podman = Podman::new();
    podman.busybox_image();
    let nats = NatsServer::start_fleet(v, &["dev1"]);
    let admin = nats.admin();
    let dev = Device::new("dev1", &Settings::new(vec![nats.url()]), Some(&podman));
    (podman, nats, admin, dev)
}

#[test]
fn a_spec_whose_container_exits_at_once_is_reverted_to_the_last_healthy_one_and_not_retried() {
    let (podman, _nats, admin, dev) = start(NatsVersion::V2_14);
    let v1 = spec(
        &podman,
        SLEEPER,
        json!({"env": {"TAG": "v1"}, "health": {"healthy-after-secs": 1}}),
    );
    let (h1, v2) = (
        hash_of(&v1),
        spec(
            &podman,
            "exit 1",
            json!({"env": {"TAG": "v2"}, "health": {"healthy-after-secs": 1}}),
        ),
    );
    let h2 = hash_of(&v2);
    put_workload(&admin, "dev1", "web", &v1);
    let _agent = run_agent(&dev, &podman);
    wait_healthy(&admin, "web", &h1);

    put_workload(&admin, "dev1", "web", &v2);
    let h = wait_health(&admin, "web", "web reverted", |h| h.reverted.is_some());
    let r = h.reverted.clone().expect("reverted");
    assert_eq!(r.failed_spec_hash.as_str(), h2, "{h:?}");
    assert_eq!(r.restored_spec_hash.as_str(), h1);
    assert!(
        matches!(
            r.reason,
            RevertReason::CrashLoop | RevertReason::StartFailed
        ),
        "{r:?}"
    );
    assert_eq!(
        h.spec_hash.as_str(),
        h1,
        "the health is the restored spec's"
    );
    // Judged by its restarts, or at its deadline (2 × healthy-after + 2).
    let why = r.detail.clone().expect("why").as_str().to_owned();
    assert!(
        why == "its container restarted 3 times before it was ever healthy"
            || why.starts_with("not healthy within 4 s: "),
        "{why}"
    );
    wait_running(&podman, "fleet-web", "the last healthy spec runs", |c| {
        c.spec_hash.as_deref() == Some(h1.as_str())
    });
    let w = wait_workload(&admin, "web", "web running v1, saying why", |s| {
        s.state == WorkloadState::Running && s.spec_hash.as_str() == h1
    });
    let err = w.last_error.expect("a note").as_str().to_owned();
    assert!(err.starts_with("reverted: desired spec "), "{err}");
    assert!(err.contains("not tried again"), "{err}");
    assert_eq!(failed_on_disk(&dev, "web").as_deref(), Some(h2.as_str()));

    // Not retried: past several deadlines, no container of v2 appears.
    stays(Duration::from_secs(6), "v2 not retried", || {
        with_hash(&podman, &h2).is_empty()
    });
    let h = wait_healthy(&admin, "web", &h1);
    assert_eq!(
        h.reverted.map(|r| r.failed_spec_hash.as_str().to_owned()),
        Some(h2.clone())
    );
    // A new desired spec is tried (and the failure forgotten).
    let v3 = spec(
        &podman,
        SLEEPER,
        json!({"env": {"TAG": "v3"}, "health": {"healthy-after-secs": 1}}),
    );
    put_workload(&admin, "dev1", "web", &v3);
    let h = wait_healthy(&admin, "web", &hash_of(&v3));
    assert_eq!(h.reverted, None);
    assert_eq!(failed_on_disk(&dev, "web"), None);
}

#[test]
fn a_spec_whose_http_probe_fails_is_reverted() {
    let (podman, _nats, admin, dev) = start(NatsVersion::V2_9);
    let port = free_port();
    let v1 = web_server(&podman, port, "/", "v1");
    let v2 = web_server(&podman, port, "/missing", "v2");
    let (h1, h2) = (hash_of(&v1), hash_of(&v2));
    put_workload(&admin, "dev1", "web", &v1);
    let _agent = run_agent(&dev, &podman);
    let h = wait_healthy(&admin, "web", &h1);
    let probe = h.last_probe.expect("probed");
    assert!(probe.ok);
    assert_eq!(
        probe.detail.map(|d| d.as_str().to_owned()).as_deref(),
        Some("HTTP 200: HTTP/1.1 200 OK")
    );

    put_workload(&admin, "dev1", "web", &v2);
    let h = wait_health(&admin, "web", "web reverted", |h| h.reverted.is_some());
    let r = h.reverted.expect("reverted");
    assert_eq!(
        (
            r.failed_spec_hash.as_str(),
            r.restored_spec_hash.as_str(),
            r.reason
        ),
        (h2.as_str(), h1.as_str(), RevertReason::ProbeFailed)
    );
    let detail = r.detail.expect("why").as_str().to_owned();
    assert!(detail.contains("HTTP 404"), "{detail}");
    wait_running(&podman, "fleet-web", "v1 serves again", |c| {
        c.spec_hash.as_deref() == Some(h1.as_str())
    });
    wait_healthy(&admin, "web", &h1);
    assert!(with_hash(&podman, &h2).is_empty());
}

#[test]
fn good_specs_become_healthy_with_exec_http_and_tcp_probes_and_without_one() {
    let (podman, _nats, admin, dev) = start(NatsVersion::V2_14);
    let (p_http, p_tcp) = (free_port(), free_port());
    let exec = spec(
        &podman,
        SLEEPER,
        // `podman exec` takes ~0.2 s idle, more on a loaded machine.
        json!({"health": {"probe": {"kind": "exec", "command": ["sh", "-c", "echo fine"]},
                          "interval-secs": 2, "timeout-secs": 2}}),
    );
    let http = web_server(&podman, p_http, "/index.html", "http");
    let tcp = spec(
        &podman,
        &format!("httpd -p 8080 -h /tmp; {SLEEPER}"),
        json!({"ports": [{"host": p_tcp, "container": 8080}],
               "health": {"probe": {"kind": "tcp", "port": p_tcp}, "interval-secs": 1, "timeout-secs": 1}}),
    );
    let plain = spec(
        &podman,
        SLEEPER,
        json!({"health": {"healthy-after-secs": 2}}),
    );
    for (w, s) in [
        ("exec", &exec),
        ("http", &http),
        ("tcp", &tcp),
        ("plain", &plain),
    ] {
        put_workload(&admin, "dev1", w, s);
    }
    let _agent = run_agent(&dev, &podman);
    let e = wait_healthy(&admin, "exec", &hash_of(&exec));
    assert_eq!(
        e.last_probe
            .and_then(|p| p.detail)
            .map(|d| d.as_str().to_owned())
            .as_deref(),
        Some("exit code 0: fine")
    );
    wait_healthy(&admin, "http", &hash_of(&http));
    let t = wait_healthy(&admin, "tcp", &hash_of(&tcp));
    assert!(t.last_probe.is_some_and(|p| p.ok));
    let p = wait_healthy(&admin, "plain", &hash_of(&plain));
    assert_eq!(p.last_probe, None, "no probe");
    assert_eq!(p.restarts_last_hour, 0);
    // The workload report keeps the 0.2 vocabulary.
    for w in ["exec", "http", "tcp", "plain"] {
        wait_workload(&admin, w, "running", |s| s.state == WorkloadState::Running);
    }
    // The first healthy spec of each is kept as the one to go back to.
    let file = health_file(&dev);
    assert_eq!(file.workloads.len(), 4, "{file:?}");
    assert!(file.workloads.values().all(|r| r.last_healthy.is_some()));
}

#[test]
fn a_hanging_probe_is_killed_at_its_timeout_while_heartbeats_reports_and_mutations_go_on() {
    let (podman, _nats, admin, dev) = start(NatsVersion::V2_14);
    let hang = spec(
        &podman,
        SLEEPER,
        json!({"health": {"probe": {"kind": "exec", "command": ["sleep", "3600"]},
                          "interval-secs": 2, "timeout-secs": 1, "retries": 5}}),
    );
    put_workload(&admin, "dev1", "hang", &hang);
    let mut agent = run_agent(&dev, &podman);
    let h = wait_health(&admin, "hang", "a probe timed out", |h| {
        h.last_probe.as_ref().is_some_and(|p| !p.ok)
    });
    let p = h.last_probe.expect("probe");
    assert_eq!(
        p.detail.map(|d| d.as_str().to_owned()).as_deref(),
        Some("timed out after 1 s and was killed")
    );
    assert!(p.took_ms < 4000, "killed at its deadline: {} ms", p.took_ms);
    // Heartbeats keep coming while probes hang.
    let first: Heartbeat = status(&admin, "dev1", "heartbeat").expect("heartbeat");
    poll_until("a later heartbeat", CONVERGE, || {
        status::<Heartbeat>(&admin, "dev1", "heartbeat")
            .filter(|b| b.at.since(first.at) >= Duration::from_secs(3))
    });
    // Another workload's mutation proceeds.
    put_workload(&admin, "dev1", "other", &quick_sleeper(&podman, "x"));
    wait_running(&podman, "fleet-other", "another workload created", |_| true);
    wait_workload(&admin, "other", "reported", |s| {
        s.state == WorkloadState::Running
    });
    // Later probes keep timing out at their deadline and count: five in
    // a row fail the new workload (never healthy: left stopped).
    let s = wait_workload(&admin, "hang", "hang left stopped", |s| {
        s.state == WorkloadState::BackOff
    });
    let err = s.last_error.expect("why").as_str().to_owned();
    assert!(
        err.contains("probe-failed: its probe failed 5 times in a row: timed out after 1 s"),
        "{err}"
    );
    // SIGTERM: the drain does not wait for a probe.
    let stopping = Instant::now();
    agent.signal(rustix::process::Signal::TERM);
    let exit = agent.wait_exit(Duration::from_secs(20));
    assert!(exit.success(), "{exit}: {}", agent.log());
    assert!(
        stopping.elapsed() < Duration::from_secs(15),
        "stopped in {:?}",
        stopping.elapsed()
    );
}

#[test]
fn a_probe_flooding_output_stays_bounded_and_escaped() {
    let (podman, _nats, admin, dev) = start(NatsVersion::V2_14);
    let flood = spec(
        &podman,
        SLEEPER,
        json!({"health": {"probe": {"kind": "exec",
                                    "command": ["sh", "-c", "cat /bin/busybox /bin/busybox; exit 3"]},
                          "interval-secs": 10, "timeout-secs": 10, "retries": 10}}),
    );
    put_workload(&admin, "dev1", "flood", &flood);
    let agent = run_agent(&dev, &podman);
    let h = wait_health(&admin, "flood", "a flooding probe answered", |h| {
        h.last_probe.as_ref().is_some_and(|p| p.detail.is_some())
    });
    let p = h.last_probe.expect("probe");
    let detail = p.detail.expect("detail").as_str().to_owned();
    assert!(!p.ok);
    assert!(detail.starts_with("exit code 3: "), "{detail}");
    assert!(detail.contains("bytes of output not kept"), "{detail}");
    assert!(detail.len() <= 1024, "{} bytes", detail.len());
    assert!(!detail.chars().any(char::is_control), "escaped: {detail:?}");
    // The log line says as little.
    assert!(
        agent.log().lines().all(|l| l.len() < 16 * 1024),
        "a log line grew with the flood"
    );
}

#[test]
fn a_revert_survives_an_agent_sigkill_in_the_middle() {
    let (podman, _nats, admin, dev) = start(NatsVersion::V2_14);
    let v1 = spec(
        &podman,
        SLEEPER,
        json!({"env": {"TAG": "v1"}, "health": {"healthy-after-secs": 1}}),
    );
    let h1 = hash_of(&v1);
    put_workload(&admin, "dev1", "web", &v1);
    let mut agent = run_agent(&dev, &podman);
    wait_healthy(&admin, "web", &h1);

    // 1. Killed as soon as the failure is on disk (somewhere between
    //    writing it and running v1 again).
    let v2 = spec(
        &podman,
        "exit 1",
        json!({"env": {"TAG": "v2"}, "health": {"healthy-after-secs": 1}}),
    );
    let h2 = hash_of(&v2);
    put_workload(&admin, "dev1", "web", &v2);
    poll_until("the failure on disk", CONVERGE, || {
        (failed_on_disk(&dev, "web").as_deref() == Some(h2.as_str())).then_some(())
    });
    agent.kill();
    let file = health_file(&dev);
    let record = file.workloads.values().next().expect("web's record");
    assert_eq!(
        record
            .last_healthy
            .as_ref()
            .map(|s| s.spec_hash().as_str().to_owned()),
        Some(h1.clone()),
        "the disk says which spec runs: the last healthy one"
    );
    let mut agent = run_agent(&dev, &podman);
    wait_running(&podman, "fleet-web", "v1 after the restart", |c| {
        c.spec_hash.as_deref() == Some(h1.as_str())
    });
    let h = wait_health(&admin, "web", "reverted after the restart", |h| {
        h.reverted.is_some() && h.spec_hash.as_str() == h1
    });
    assert_eq!(
        h.reverted.map(|r| r.failed_spec_hash.as_str().to_owned()),
        Some(h2.clone())
    );
    assert!(with_hash(&podman, &h2).is_empty());
    wait_healthy(&admin, "web", &h1);

    // 2. Killed after the failure was written and the new container
    //    removed, before the old one was started again.
    let v3 = spec(
        &podman,
        "exit 1",
        json!({"env": {"TAG": "v3"}, "health": {"healthy-after-secs": 1}}),
    );
    let h3 = hash_of(&v3);
    put_workload(&admin, "dev1", "web", &v3);
    poll_until("v3's failure on disk", CONVERGE, || {
        (failed_on_disk(&dev, "web").as_deref() == Some(h3.as_str())).then_some(())
    });
    agent.kill();
    for c in containers(&podman) {
        podman.remove_container(&c.id);
    }
    let _agent = run_agent(&dev, &podman);
    wait_running(&podman, "fleet-web", "v1 created after the restart", |c| {
        c.spec_hash.as_deref() == Some(h1.as_str())
    });
    let h = wait_healthy(&admin, "web", &h1);
    assert_eq!(
        h.reverted.map(|r| r.failed_spec_hash.as_str().to_owned()),
        Some(h3.clone())
    );
    assert!(with_hash(&podman, &h3).is_empty());
}

#[test]
fn a_new_workload_that_never_becomes_healthy_is_left_stopped_in_back_off() {
    let (podman, _nats, admin, dev) = start(NatsVersion::V2_14);
    let cam = spec(
        &podman,
        "exit 1",
        json!({"health": {"healthy-after-secs": 1}}),
    );
    let hc = hash_of(&cam);
    put_workload(&admin, "dev1", "cam", &cam);
    put_workload(&admin, "dev1", "web", &quick_sleeper(&podman, "v1"));
    let _agent = run_agent(&dev, &podman);
    let s = wait_workload(&admin, "cam", "cam left stopped", |s| {
        s.state == WorkloadState::BackOff && s.container_id.is_none()
    });
    assert_eq!(s.spec_hash.as_str(), hc);
    let err = s.last_error.expect("why").as_str().to_owned();
    assert!(err.starts_with("left stopped: desired spec "), "{err}");
    let h = wait_health(&admin, "cam", "cam unhealthy", |h| {
        h.health == HealthState::Unhealthy
    });
    assert_eq!((h.spec_hash.as_str(), h.reverted), (hc.as_str(), None));
    wait_gone(&podman, "fleet-cam");
    stays(Duration::from_secs(5), "cam stays stopped", || {
        with_hash(&podman, &hc).is_empty()
    });
    // The other workload was not held up.
    wait_running(&podman, "fleet-web", "web runs", |_| true);
}

/// `fleet-agent node <args> --json` as root: the exit code.
fn node(dev: &Device, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_fleet-agent"))
        .arg("node")
        .args(args)
        .arg("--json")
        .arg("--config")
        .arg(&dev.config)
        .env_remove("NOTIFY_SOCKET")
        .output()
        .expect("fleet-agent node runs")
}

#[test]
fn during_a_freeze_nothing_is_reverted_and_at_the_unfreeze_the_failed_spec_is() {
    let (podman, _nats, admin, dev) = start(NatsVersion::V2_14);
    let port = free_port();
    let v1 = web_server(&podman, port, "/", "v1");
    let mut v2: serde_json::Value =
        serde_json::from_str(&web_server(&podman, port, "/missing", "v2")).expect("json");
    // Failures are not counted for 6 s: room to freeze during the trial.
    v2["health"]["start-period-secs"] = json!(6);
    let v2 = v2.to_string();
    let (h1, h2) = (hash_of(&v1), hash_of(&v2));
    put_workload(&admin, "dev1", "web", &v1);
    let _agent = run_agent(&dev, &podman);
    wait_healthy(&admin, "web", &h1);
    put_workload(&admin, "dev1", "web", &v2);
    let trial = wait_running(&podman, "fleet-web", "v2 on trial", |c| {
        c.spec_hash.as_deref() == Some(h2.as_str())
    });
    let out = poll_until("frozen", CONVERGE, || {
        let out = node(&dev, &["freeze", "--reason", "test"]);
        out.status.success().then_some(out)
    });
    assert!(out.status.success(), "{out:?}");
    // Its deadline (6 + 2 + 1 s) passes frozen: v2 stays, unhealthy.
    wait_health(&admin, "web", "v2 unhealthy while frozen", |h| {
        h.health == HealthState::Unhealthy && h.spec_hash.as_str() == h2
    });
    stays(
        Duration::from_secs(4),
        "nothing reverted while frozen",
        || {
            health_of(&admin, "web").is_some_and(|h| h.reverted.is_none())
                && crate::common::container(&podman, "fleet-web")
                    .is_some_and(|c| c.id == trial.id && c.state == "running")
        },
    );
    assert_eq!(failed_on_disk(&dev, "web"), None, "not judged while frozen");
    let out = node(&dev, &["unfreeze"]);
    assert!(out.status.success(), "{out:?}");
    let h = wait_health(&admin, "web", "reverted at the unfreeze", |h| {
        h.reverted.is_some()
    });
    assert_eq!(
        h.reverted.map(|r| r.failed_spec_hash.as_str().to_owned()),
        Some(h2)
    );
    wait_running(&podman, "fleet-web", "v1 again", |c| {
        c.spec_hash.as_deref() == Some(h1.as_str())
    });
}

fn start_first(podman: &Podman, ready_at_start: bool, probe: &[&str], tag: &str) -> String {
    let shell = if ready_at_start {
        format!("echo > /tmp/ready; {SLEEPER}")
    } else {
        SLEEPER.to_owned()
    };
    spec(
        podman,
        &shell,
        json!({"env": {"TAG": tag}, "update-strategy": "start-first",
               "health": {"probe": {"kind": "exec", "command": probe},
                          "interval-secs": 2, "timeout-secs": 2, "retries": 10}}),
    )
}

#[test]
fn start_first_keeps_the_old_container_until_the_new_one_is_healthy_and_a_failing_one_leaves_it_untouched(
) {
    let (podman, _nats, admin, dev) = start(NatsVersion::V2_14);
    let ready = ["cat", "/tmp/ready"];
    let v1 = start_first(&podman, true, &ready, "v1");
    let v2 = start_first(&podman, false, &ready, "v2");
    let (h1, h2) = (hash_of(&v1), hash_of(&v2));
    put_workload(&admin, "dev1", "web", &v1);
    let mut agent = run_agent(&dev, &podman);
    wait_healthy(&admin, "web", &h1);
    let old = wait_running(&podman, "fleet-web", "v1", |_| true);

    put_workload(&admin, "dev1", "web", &v2);
    let new = poll_until("v2 beside v1", CONVERGE, || {
        with_hash(&podman, &h2)
            .into_iter()
            .find(|c| c.state == "running")
    });
    assert_eq!(new.name, format!("fleet-web-{}", &h2[..12]));
    // A crash with both running: the next start keeps both until v2 is healthy.
    agent.kill();
    let _agent = run_agent(&dev, &podman);
    wait_health(&admin, "web", "v2 starting", |h| {
        h.spec_hash.as_str() == h2 && h.health == HealthState::Starting
    });
    stays(Duration::from_secs(3), "the old one serves", || {
        crate::common::container(&podman, "fleet-web")
            .is_some_and(|c| c.id == old.id && c.state == "running")
    });
    podman.run(&["exec", &new.id, "sh", "-c", "echo > /tmp/ready"]);
    wait_healthy(&admin, "web", &h2);
    wait_gone(&podman, "fleet-web");
    let kept = crate::common::container(&podman, &new.name).expect("v2 runs");
    assert_eq!(
        (kept.id.as_str(), kept.state.as_str()),
        (new.id.as_str(), "running")
    );

    // A failing start-first spec: only its own container goes.
    let v3 = start_first(&podman, false, &["false"], "v3");
    let mut v3: serde_json::Value = serde_json::from_str(&v3).expect("json");
    v3["health"]["retries"] = json!(2);
    let v3 = v3.to_string();
    let h3 = hash_of(&v3);
    put_workload(&admin, "dev1", "web", &v3);
    let h = wait_health(&admin, "web", "v3 reverted", |h| h.reverted.is_some());
    assert_eq!(
        h.reverted.map(|r| (
            r.failed_spec_hash.as_str().to_owned(),
            r.restored_spec_hash.as_str().to_owned()
        )),
        Some((h3.clone(), h2.clone()))
    );
    poll_until("v3's container removed", CONVERGE, || {
        with_hash(&podman, &h3).is_empty().then_some(())
    });
    let after = crate::common::container(&podman, &new.name).expect("v2 runs");
    assert_eq!(after, kept, "v2's container untouched");
}

#[test]
fn an_agent_0_2_0_reads_every_file_this_agent_leaves() {
    let released = fleet_harness::test_agent_path(fleet_harness::RELEASED_AGENT_0_2_VERSION);
    let (podman, _nats, admin, dev) = start(NatsVersion::V2_14);
    let plain = quick_sleeper(&podman, "plain");
    let checked = spec(
        &podman,
        SLEEPER,
        json!({"health": {"healthy-after-secs": 1}}),
    );
    put_workload(&admin, "dev1", "plain", &plain);
    put_workload(&admin, "dev1", "checked", &checked);
    let mut agent = run_agent(&dev, &podman);
    wait_healthy(&admin, "checked", &hash_of(&checked));
    wait_healthy(&admin, "plain", &hash_of(&plain));
    agent.signal(rustix::process::Signal::TERM);
    assert!(agent.wait_exit(CONVERGE).success(), "{}", agent.log());
    let before = containers(&podman);
    let applied: AppliedSpecs = serde_json::from_slice(
        &std::fs::read(dev.path("var/lib/harmony-fleet/agent/applied.json")).expect("applied.json"),
    )
    .expect("the 0.2 shape");
    assert_eq!(
        applied
            .workloads
            .keys()
            .map(|k| k.as_str())
            .collect::<Vec<_>>(),
        vec!["plain"],
        "only specs every agent reads"
    );

    // The released 0.2.0 agent on the same state: reads applied.json,
    // refuses the spec with `health` as invalid and keeps its container.
    dev.keep_only_0_2_intervals();
    let mut old = fleet_harness::ChildGuard::spawn(
        dev.command_of(&released, &["run"], Some(&podman)),
        "agent-0.2.0",
    );
    dev.wait_ready(&mut old);
    wait_workload(&admin, "checked", "invalid to 0.2.0", |s| {
        s.state == WorkloadState::Invalid
    });
    // It applies a change (and so writes applied.json).
    let plain2 = quick_sleeper(&podman, "plain2");
    put_workload(&admin, "dev1", "plain", &plain2);
    wait_running(&podman, "fleet-plain", "0.2.0 applied plain2", |c| {
        c.spec_hash.as_deref() == Some(hash_of(&plain2).as_str())
    });
    assert!(
        !old.log().contains("ignoring"),
        "0.2.0 read every file:\n{}",
        old.log()
    );
    old.signal(rustix::process::Signal::TERM);
    assert!(old.wait_exit(CONVERGE).success(), "{}", old.log());

    // Back on this agent: what 0.2.0 applied counts; nothing is recreated.
    let _agent = run_agent(&dev, &podman);
    wait_healthy(&admin, "plain", &hash_of(&plain2));
    wait_healthy(&admin, "checked", &hash_of(&checked));
    let checked_before = before
        .iter()
        .find(|c| c.name == "fleet-checked")
        .expect("checked ran");
    let checked_now = crate::common::container(&podman, "fleet-checked").expect("checked runs");
    assert_eq!(checked_now.id, checked_before.id, "never recreated");
}

#[test]
fn a_spec_with_a_bad_health_check_is_reported_invalid_and_the_running_container_kept() {
    let (podman, _nats, admin, dev) = start(NatsVersion::V2_9);
    let v1 = spec(
        &podman,
        SLEEPER,
        json!({"health": {"healthy-after-secs": 1}}),
    );
    let h1 = hash_of(&v1);
    put_workload(&admin, "dev1", "web", &v1);
    let _agent = run_agent(&dev, &podman);
    wait_healthy(&admin, "web", &h1);
    let running = wait_running(&podman, "fleet-web", "v1", |_| true);
    let bad = spec(
        &podman,
        SLEEPER,
        json!({"env": {"TAG": "bad"}, "health": {"interval-secs": 0}}),
    );
    put_workload(&admin, "dev1", "web", &bad);
    let s = wait_workload(&admin, "web", "web invalid", |s| {
        s.state == WorkloadState::Invalid
    });
    let err = s.last_error.expect("why").as_str().to_owned();
    assert!(err.contains("interval-secs is 1 to 3600"), "{err}");
    stays(Duration::from_secs(3), "v1 keeps running", || {
        crate::common::container(&podman, "fleet-web")
            .is_some_and(|c| c.id == running.id && c.state == "running")
    });
    let h = wait_healthy(&admin, "web", &h1);
    assert_eq!(h.reverted, None, "an invalid spec is not a failed one");
}
