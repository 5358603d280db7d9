//! `fleetctl rollout` over a large fleet: one fleet-layout nats-server
//! (Debian's 2.9), N devices' `<device>.info` seeded as admin (agent 0.9.0,
//! x86_64, configured, no intent yet), then the release `fleetctl rollout`
//! of a 1.0.0 release, timed from spawn to exit, its summary checked (every
//! device written).
//!
//! Baseline, same run: the seeding itself, N plain admin KV puts published
//! back to back and acknowledged (`rollout` reads N keys and writes N
//! compare-and-set puts, so it cannot beat that floor by much).
//!
//! Then a staged rollout of another release over N devices seeded the same
//! way on a server of their own (`--batches 1%,100% --success-threshold 0% --batch-timeout 2s`): the
//! seeded devices never answer, so each batch waits out its 2 s; what is
//! left is the staged rollout's bookkeeping (state in NATS, batches,
//! intents by compare-and-set, the status of every device followed).
//!
//! Last, a staged workload rollout over N devices whose simulated agents
//! report the new spec healthy as soon as it is written: its wall time.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fleet_harness::{NatsServer, NatsVersion, NATS_ADMIN_PASSWORD};

use crate::bins::release_bin;
use crate::fleet::pipelined_puts;
use crate::report::{Row, Verdict};

/// The version every seeded device runs, and the release rolled out.
const FROM_VERSION: &str = "0.9.0";
const TO_VERSION: &str = "1.0.0";
/// A rollout of 10,000 devices that has not ended by then is broken.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(300);

/// The staged rollout's batches and how long each waits for answers.
const STAGED_BATCHES: &str = "1%,100%";
const STAGED_BATCH_TIMEOUT: Duration = Duration::from_secs(2);
const STAGED_VERSION: &str = "1.1.0";

/// `<device>.heartbeat` of a seeded device (a live device for the staged
/// rollout's disruption accounting).
fn heartbeat() -> Vec<u8> {
    serde_json::json!({
        "at": fleet_common::Timestamp::now(),
        "uptime-secs": 100,
        "agent-version": FROM_VERSION,
        "config-state": {"state": "configured", "waiting-changes": 0, "intent-waiting": false}
    })
    .to_string()
    .into_bytes()
}

/// A release file of `version`.
pub(crate) fn write_release(path: &std::path::Path, version: &str) {
    std::fs::write(
        path,
        serde_json::json!({
            "version": version,
            "artifacts": {"x86_64": {
                "artifact-url": format!("https://releases.example.com/fleet-agent/{version}/x86_64"),
                "sha256": "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef",
                "max-bytes": 20971520
            }}
        })
        .to_string(),
    )
    .unwrap_or_else(|e| panic!("writing the release: {e}"));
}

/// Runs `fleetctl ARGS` against `server` as admin; its output and how long
/// it took.
fn fleetctl(
    server: &NatsServer,
    password: &std::path::Path,
    args: &[&str],
) -> (std::process::Output, Duration) {
    fleetctl_at(&[server.url()], password, args)
}

/// [`fleetctl`] against the servers at `urls` (a cluster: every node).
pub(crate) fn fleetctl_at(
    urls: &[String],
    password: &std::path::Path,
    args: &[&str],
) -> (std::process::Output, Duration) {
    let started = Instant::now();
    let mut cmd = Command::new(release_bin("fleetctl"));
    cmd.args(args);
    for url in urls {
        cmd.args(["--server", url]);
    }
    let child = cmd
        .arg("--password-file")
        .arg(password)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning fleetctl {args:?}: {e}"));
    let pid = child.id();
    let out = wait_output(child, ROLLOUT_TIMEOUT).unwrap_or_else(|| {
        panic!("fleetctl {args:?} (pid {pid}) still running after {ROLLOUT_TIMEOUT:?}")
    });
    (out, started.elapsed())
}

/// Seeds `n` devices' info (timed: the baseline) and heartbeats.
fn seed(admin: &nats::Connection, n: usize) -> Duration {
    let puts: Vec<(String, Vec<u8>)> = (1..=n)
        .map(|i| {
            let id = format!("dev-{i:05}");
            (format!("$KV.fleet-status.{id}.info"), info(&id))
        })
        .collect();
    let ((_, seeded), _) = pipelined_puts(admin, &puts);
    let beats: Vec<(String, Vec<u8>)> = (1..=n)
        .map(|i| {
            (
                format!("$KV.fleet-status.dev-{i:05}.heartbeat"),
                heartbeat(),
            )
        })
        .collect();
    pipelined_puts(admin, &beats);
    seeded
}

/// `<device>.info` of a seeded device.
fn info(id: &str) -> Vec<u8> {
    serde_json::json!({
        "device-id": id,
        "agent-version": FROM_VERSION,
        "arch": "x86_64",
        "os": "Debian GNU/Linux 12 (bookworm)",
        "kernel": "6.1.0-28-amd64",
        "podman-version": "4.3.1",
        "boot-id": "8c2f1a3e-4b5d-46f7-a8b9-c0d1e2f3a4b5",
        "config-state": {"state": "configured", "waiting-changes": 0, "intent-waiting": false},
        "agent-started-at": "2026-11-29T13:44:31.000Z",
        "updated-at": "2026-11-29T13:44:32.000Z"
    })
    .to_string()
    .into_bytes()
}

pub fn rollout_rows(n: usize) -> Vec<Row> {
    let server = NatsServer::start_fleet(NatsVersion::V2_9, &[]);
    let admin = server.admin();
    let dir = tempfile::Builder::new()
        .prefix("fleet-bench-rollout-")
        .tempdir()
        .unwrap_or_else(|e| panic!("tempdir: {e}"));
    let seeded = seed(&admin, n);

    let release = dir.path().join("release.json");
    let password = dir.path().join("admin-password");
    write_release(&release, TO_VERSION);
    std::fs::write(&password, format!("{NATS_ADMIN_PASSWORD}\n"))
        .unwrap_or_else(|e| panic!("writing the password file: {e}"));
    let release_arg = release.to_str().expect("a temp path is UTF-8");
    let (out, took) = fleetctl(&server, &password, &["rollout", "--release", release_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = out.stdout.iter().filter(|b| **b == b'\n').count();
    assert!(
        out.status.success() && stderr.contains(&format!("{n} written")) && lines == n,
        "fleetctl rollout over {n} devices did not write every intent ({}, {lines} lines):\n{stderr}",
        out.status
    );
    let ratio = took.as_secs_f64() / seeded.as_secs_f64();
    vec![Row::new(format!("`fleetctl rollout` over {n} devices"))
        .ours(format!("{:.2} s", took.as_secs_f64()))
        .baseline(format!("{:.2} s ({n} plain admin KV puts)", seeded.as_secs_f64()))
        .ratio(format!("{ratio:.1}×"))
        .target(
            "≤ 10 s (10,000 devices)",
            if n >= 10_000 {
                Verdict::from_ok(took <= Duration::from_secs(10))
            } else {
                Verdict::Info
            },
        )
        .note(format!(
            "Release fleetctl against one nats-server 2.9 on loopback: reads every device's info, upgrade status and intent, plans, writes {n} compare-and-set intents pipelined, prints one line per device; wall time from spawn to exit, summary checked. Baseline: the {n} `info` puts that seeded the fleet, pipelined."
        )),
        staged_row(&password, &dir, n),
        workload_row(&password, &dir, n)]
}

/// Answers for `n` simulated devices: each `<device>.desired` written
/// gets `<device>.health` saying its `web` spec is healthy, published at
/// once (what a fleet of healthy agents reports). Stops when `stop` is set.
fn health_simulator(
    admin: nats::Connection,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    let sub = admin
        .subscribe("$KV.fleet-workloads.*.desired")
        .unwrap_or_else(|e| panic!("subscribing to the documents: {e}"));
    let _ = admin.flush();
    std::thread::spawn(move || {
        let mut answered = 0usize;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok(m) = sub.next_timeout(Duration::from_millis(100)) else {
                continue;
            };
            let Some(device) = m.subject.split('.').nth(2) else {
                continue;
            };
            let Some(hash) = serde_json::from_slice::<serde_json::Value>(&m.data)
                .ok()
                .and_then(|d| {
                    fleet_common::contracts::WorkloadSpec::from_json(
                        d["workloads"]["web"].to_string().as_bytes(),
                    )
                    .ok()
                })
                .map(|s| s.spec_hash())
            else {
                continue;
            };
            let now = fleet_common::Timestamp::now();
            let report = serde_json::json!({
                "workloads": {"web": {"health": "healthy", "spec-hash": hash, "since": now}},
                "observed-at": now,
            });
            let _ = admin.publish(
                &format!("$KV.fleet-status.{device}.health"),
                report.to_string(),
            );
            answered += 1;
        }
        let _ = admin.flush();
        answered
    })
}

/// A staged workload rollout over `n` devices seeded afresh on a server of
/// its own, each answering healthy as soon as its document is written: its
/// wall time is the bookkeeping (reading every document and report each
/// tick, the state with each device's previous spec, a compare-and-set
/// document per device).
fn workload_row(password: &std::path::Path, dir: &tempfile::TempDir, n: usize) -> Row {
    let own = NatsServer::start_fleet(NatsVersion::V2_9, &[]);
    let seeded = seed(&own.admin(), n);
    let spec = dir.path().join("web.json");
    std::fs::write(
        &spec,
        r#"{"image":"registry.example.com/web:1.5","health":{"healthy-after-secs":5}}"#,
    )
    .unwrap_or_else(|e| panic!("writing the spec: {e}"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sim = health_simulator(own.admin(), std::sync::Arc::clone(&stop));
    let (out, took) = fleetctl(
        &own,
        password,
        &[
            "workload",
            "rollout",
            "web",
            spec.to_str().expect("a temp path is UTF-8"),
            "--batches",
            STAGED_BATCHES,
            "--batch-timeout",
            "5m",
        ],
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered = sim.join().unwrap_or(0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && stdout.contains(": complete")
            && stdout.matches(": wrote web spec ").count() == n,
        "the workload rollout over {n} devices did not complete ({}, {answered} answered):\n{}\n{}",
        out.status,
        stdout.lines().rev().take(20).collect::<Vec<_>>().join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    Row::new(format!("staged workload rollout over {n} devices"))
        .ours(format!("{:.2} s", took.as_secs_f64()))
        .baseline(format!("{:.2} s ({n} plain admin KV puts)", seeded.as_secs_f64()))
        .ratio(format!("{:.1}×", took.as_secs_f64() / seeded.as_secs_f64()))
        .target("—", Verdict::Info)
        .note(format!(
            "`fleetctl workload rollout web web.json --batches {STAGED_BATCHES}` over {n} simulated devices on a server of their own, each reporting `web` healthy on the new spec as soon as its document is written: every document written by compare-and-set in its batch, each device's previous spec kept in the rollout's state, every document and health report read each tick; wall time from spawn to exit."
        ))
}

/// A staged rollout of [`STAGED_VERSION`] over `n` devices seeded afresh
/// on a server of its own: its wall time less the batches' timeouts
/// (nobody answers) is its bookkeeping.
fn staged_row(password: &std::path::Path, dir: &tempfile::TempDir, n: usize) -> Row {
    let own = NatsServer::start_fleet(NatsVersion::V2_9, &[]);
    let seeded = seed(&own.admin(), n);
    let server = &own;
    let release = dir.path().join("release-staged.json");
    write_release(&release, STAGED_VERSION);
    let timeout = format!("{}s", STAGED_BATCH_TIMEOUT.as_secs());
    let (out, took) = fleetctl(
        server,
        password,
        &[
            "rollout",
            "--release",
            release.to_str().expect("a temp path is UTF-8"),
            "--batches",
            STAGED_BATCHES,
            "--success-threshold",
            "0%",
            "--batch-timeout",
            &timeout,
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let batches = STAGED_BATCHES.split(',').count();
    assert!(
        out.status.success()
            && stdout.contains(&format!("batch {batches}/{batches} ended"))
            && stdout.matches(": issued attempt ").count() == n,
        "the staged rollout over {n} devices did not issue every intent ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let waited = STAGED_BATCH_TIMEOUT * u32::try_from(batches).unwrap_or(u32::MAX);
    let bookkeeping = took.saturating_sub(waited);
    Row::new(format!("staged rollout over {n} devices, bookkeeping"))
        .ours(format!(
            "{:.2} s ({:.2} s less {} × {} s batch timeouts)",
            bookkeeping.as_secs_f64(),
            took.as_secs_f64(),
            batches,
            STAGED_BATCH_TIMEOUT.as_secs()
        ))
        .baseline(format!("{:.2} s ({n} plain admin KV puts)", seeded.as_secs_f64()))
        .ratio(format!(
            "{:.1}×",
            bookkeeping.as_secs_f64() / seeded.as_secs_f64()
        ))
        .target("—", Verdict::Info)
        .note(format!(
            "`fleetctl rollout --batches {STAGED_BATCHES} --success-threshold 0% --batch-timeout {timeout}` of {STAGED_VERSION} over {n} devices seeded the same way on a server of their own, which never answer: every intent issued by compare-and-set in its batch, the rollout's state kept in NATS, each batch waited out; the figure is the wall time less the batches' timeouts."
        ))
}

/// Waits for `child` to exit within `timeout`, reading its output on two
/// threads (a full pipe would stall it); `None` (the child killed) on
/// timeout.
fn wait_output(mut child: std::process::Child, timeout: Duration) -> Option<std::process::Output> {
    use std::io::Read;
    let mut stdout = child.stdout.take()?;
    let mut stderr = child.stderr.take()?;
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stderr.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    Some(std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}
