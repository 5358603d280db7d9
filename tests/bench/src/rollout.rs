//! `fleetctl rollout` over a large fleet: one fleet-layout nats-server
//! (Debian's 2.9), N devices' `<device>.info` seeded as admin (agent 0.9.0,
//! x86_64, configured, no intent yet), then the release `fleetctl rollout`
//! of a 1.0.0 release, timed from spawn to exit, its summary checked (every
//! device written).
//!
//! Baseline, same run: the seeding itself, N plain admin KV puts published
//! back to back and acknowledged (`rollout` reads N keys and writes N
//! compare-and-set puts, so it cannot beat that floor by much).

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
    let puts: Vec<(String, Vec<u8>)> = (1..=n)
        .map(|i| {
            let id = format!("dev-{i:05}");
            (format!("$KV.fleet-status.{id}.info"), info(&id))
        })
        .collect();
    let ((_, seeded), _) = pipelined_puts(&admin, &puts);

    let release = dir.path().join("release.json");
    let password = dir.path().join("admin-password");
    std::fs::write(
        &release,
        serde_json::json!({
            "version": TO_VERSION,
            "artifacts": {"x86_64": {
                "artifact-url": "https://releases.example.com/fleet-agent/1.0.0/x86_64",
                "sha256": "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef",
                "max-bytes": 20971520
            }}
        })
        .to_string(),
    )
    .unwrap_or_else(|e| panic!("writing the release: {e}"));
    std::fs::write(&password, format!("{NATS_ADMIN_PASSWORD}\n"))
        .unwrap_or_else(|e| panic!("writing the password file: {e}"));

    let started = Instant::now();
    let child = Command::new(release_bin("fleetctl"))
        .arg("rollout")
        .arg("--release")
        .arg(&release)
        .args(["--server", &server.url(), "--password-file"])
        .arg(&password)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning fleetctl rollout: {e}"));
    let pid = child.id();
    let out = wait_output(child, ROLLOUT_TIMEOUT).unwrap_or_else(|| {
        panic!("fleetctl rollout (pid {pid}) still running after {ROLLOUT_TIMEOUT:?}")
    });
    let took = started.elapsed();
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
        ))]
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
