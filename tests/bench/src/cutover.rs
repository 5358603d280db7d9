//! The updater's cutover against `systemctl restart`, on a device: a booted
//! Debian 12 (the harness's systemd container) with our device package
//! built from the release binaries (`make bench` packages them), the agent
//! on the host's nats-server with rootless Podman nested.
//!
//! Cutover: an `upgrade` over the updater socket (as `fleet-agent`, as the
//! agent forwards it) to the other of two release agents — this build, and
//! the same built as [`NEXT_VERSION`] — alternately, so every run is a real
//! switch. Baseline, interleaved: `systemctl restart fleet-agent` of the
//! same agent. Both are read from systemd's own journal records of the
//! unit: "Stopping" (the old agent is asked to stop) to "Started" (the new
//! one sent READY=1), so both sides use one clock and the same end points.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleet_common::contracts::{
    AgentUpgradeAttempt, DeviceInfo, Response, UpdaterReply, UpdaterRequest, UpgradePhase,
};
use fleet_common::limits::SOCKET_STATUS_RESPONSE_TIMEOUT;
use fleet_common::validate::{
    Arch, ArtifactUrl, AttemptUuid, DeviceId, MaxBytes, Sha256Hex, Version,
};
use fleet_harness::{
    poll_until, workspace_version, AgentSettings, Behavior, HttpsServer, NatsServer, NatsVersion,
    SystemdContainer, TestCa,
};

use crate::bins::target_dir;
use crate::report::{Row, Verdict};

/// The version the second release agent is built as (`make bench`).
pub const NEXT_VERSION: &str = "0.3.0-bench";
const DEVICE: &str = "bench-sd";
const UNIT: &str = "fleet-agent.service";
/// The agent reaching NATS and READY in the container on a loaded machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Download, probe, cutover.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(300);
/// systemd's catalog ids: a unit is stopping / has started (READY=1 for
/// Type=notify).
const MSG_STOPPING: &str = "de5b426a63be47a7b6ac3eaac82e2f6f";
const MSG_STARTED: &str = "39f53479d3a045ac8e11786248231fbf";
/// ... has stopped (the old agent exited), and is starting.
const MSG_STOPPED: &str = "9d1aaa27d60140bd96365438aad20286";
const MSG_STARTING: &str = "7d4958e842da4a758f6c1cdc7b36dcc5";

/// What `make bench` built for this section.
fn inputs() -> Option<(PathBuf, PathBuf)> {
    let deb = target_dir()
        .join("bench/packages")
        .join(format!("harmony-fleet_{}_amd64.deb", workspace_version()));
    let next = target_dir()
        .join("bench-next")
        .join(crate::bins::SHIPPED_TARGET)
        .join("release/fleet-agent");
    (deb.is_file() && next.is_file()).then_some((deb, next))
}

pub fn cutover_rows(runs: usize) -> Vec<Row> {
    let Some((deb, next_bin)) = inputs() else {
        return vec![Row::todo(
            "cutover (old agent stopped → new READY)",
            "≤ 1.1× `systemctl restart`",
            "Not built: run `make bench` (it packages the release binaries into target/bench/packages and builds the second agent version into target/bench-next).",
        )];
    };
    let current = workspace_version();
    let nats = NatsServer::start_fleet(NatsVersion::V2_14, &[DEVICE]);
    let ca = TestCa::new();
    let https = HttpsServer::start(&ca);
    let c = SystemdContainer::boot();
    c.install_deb(&deb);
    c.trust_artifact_ca(&ca.ca_pem());
    c.configure_agent(&AgentSettings::for_fleet_server(DEVICE, &nats));
    let start = c.exec_with_timeout(&["systemctl", "start", UNIT], READY_TIMEOUT);
    assert!(start.success(), "{start:?}\n{}", c.journal(UNIT));
    c.wait_active("fleet-updater.service", READY_TIMEOUT);

    // The two artifacts: this build as installed, and the next version.
    let installed = format!("/usr/lib/harmony-fleet/fleet-agent-v{current}");
    let this = std::fs::read(c.host_path(&installed))
        .unwrap_or_else(|e| panic!("reading the installed agent {installed}: {e}"));
    let next =
        std::fs::read(&next_bin).unwrap_or_else(|e| panic!("reading {}: {e}", next_bin.display()));
    https.route("/agent-this", Behavior::Bytes(this.clone()));
    https.route("/agent-next", Behavior::Bytes(next.clone()));
    let targets = [
        (NEXT_VERSION, https.url("/agent-next"), next),
        (current.as_str(), https.url("/agent-this"), this),
    ];

    let status = nats::jetstream::new(nats.admin())
        .key_value("fleet-status")
        .unwrap_or_else(|e| panic!("bucket fleet-status: {e}"));
    let mut cutovers: Vec<Phases> = Vec::new();
    let mut restarts: Vec<Phases> = Vec::new();
    for i in 0..runs {
        let mark = now_us();
        let out = c.exec_with_timeout(&["systemctl", "restart", UNIT], READY_TIMEOUT);
        assert!(
            out.success(),
            "systemctl restart: {out:?}\n{}",
            c.journal(UNIT)
        );
        restarts.push(stop_to_started(&c, mark));

        let (version, url, bytes) = &targets[i % 2];
        let mark = now_us();
        upgrade(&c, &status, version, url, bytes);
        cutovers.push(stop_to_started(&c, mark));
    }
    let phase =
        |v: &[Phases], f: fn(&Phases) -> Duration| median(&v.iter().map(f).collect::<Vec<_>>());
    let (cut, restart) = (phase(&cutovers, |p| p.total), phase(&restarts, |p| p.total));
    let ratio = cut.as_secs_f64() / restart.as_secs_f64();
    let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1e3);
    let all = |v: &[Phases]| v.iter().map(|p| ms(p.total)).collect::<Vec<_>>().join(", ");
    let split = |v: &[Phases]| {
        format!(
            "stop {} + between jobs {} + start {} ms",
            ms(phase(v, |p| p.stop)),
            ms(phase(v, |p| p.gap)),
            ms(phase(v, |p| p.start))
        )
    };
    vec![Row::new("cutover (old agent stopped → new READY)")
        .ours(format!("{} ms", ms(cut)))
        .baseline(format!("{} ms (`systemctl restart`)", ms(restart)))
        .ratio(format!("{ratio:.2}×"))
        .target("≤ 1.1× `systemctl restart`", Verdict::from_ok(ratio <= 1.1))
        .note(format!(
            "Booted Debian 12 container, our .deb from the release binaries, agent with rootless Podman on the host's nats-server. Median of {runs} interleaved runs, from systemd's journal records of {UNIT} (\"Stopping\" → \"Started\", i.e. READY=1). Cutovers (the updater switching between {current} and {NEXT_VERSION}): {} ms, medians {}; restarts: {} ms, medians {}.",
            all(&cutovers),
            split(&cutovers),
            all(&restarts),
            split(&restarts)
        ))]
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// One upgrade to `version` over the socket, as the agent forwards it,
/// waited for until complete.
///
/// The cutover starts when the `upgrade` is answered. It is waited for from
/// the host, in NATS (the new agent publishes its version before READY),
/// not by asking the updater in the container: each such request is a
/// `podman exec`, ~100 ms of CPU on a 2-core machine, which would slow the
/// very stop and start being measured (`systemctl restart`, the baseline,
/// runs with nothing beside it).
fn upgrade(c: &SystemdContainer, status: &nats::kv::Store, version: &str, url: &str, bytes: &[u8]) {
    let attempt = AgentUpgradeAttempt {
        arch: Arch::current().unwrap_or_else(|| panic!("unsupported architecture")),
        artifact_url: ArtifactUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}")),
        device_id: DeviceId::parse(DEVICE).unwrap_or_else(|e| panic!("{e}")),
        max_bytes: MaxBytes::new(bytes.len() as u64).unwrap_or_else(|e| panic!("{e}")),
        sha256: Sha256Hex::of(bytes),
        target_version: Version::parse(version).unwrap_or_else(|e| panic!("{e}")),
        uuid: AttemptUuid::new_random(),
    };
    let request = |r: &UpdaterRequest, timeout| -> Response<UpdaterReply> {
        let line = c.socket_request(
            "fleet-agent",
            "/run/harmony-fleet/updater.sock",
            &serde_json::to_string(r).unwrap_or_else(|e| panic!("{e}")),
            timeout,
        );
        Response::from_slice(line.as_bytes()).unwrap_or_else(|e| panic!("answer {line:?}: {e}"))
    };
    let answer = request(
        &UpdaterRequest::Upgrade {
            attempt: attempt.clone(),
        },
        UPGRADE_TIMEOUT,
    );
    assert!(
        matches!(answer, Response::Ok(_)),
        "upgrade to {version} refused: {answer:?}\n{}",
        c.journal("fleet-updater.service")
    );
    poll_until(
        &format!("the agent reporting {version} in NATS"),
        UPGRADE_TIMEOUT,
        || {
            status
                .get(&format!("{DEVICE}.info"))
                .ok()
                .flatten()
                .and_then(|raw| serde_json::from_slice::<DeviceInfo>(&raw).ok())
                .filter(|i| i.agent_version.as_str() == version)
        },
    );
    let phase = poll_until("the upgrade ends", UPGRADE_TIMEOUT, || {
        match request(&UpdaterRequest::Status {}, SOCKET_STATUS_RESPONSE_TIMEOUT) {
            Response::Ok(UpdaterReply { status: Some(s) })
                if s.attempt_uuid == attempt.uuid && s.phase.is_terminal() =>
            {
                Some(s.phase)
            }
            _ => None,
        }
    });
    assert_eq!(
        phase,
        UpgradePhase::Complete,
        "upgrade to {version}\nupdater:\n{}\nagent:\n{}",
        c.journal("fleet-updater.service"),
        c.journal(UNIT)
    );
    c.wait_active(UNIT, READY_TIMEOUT);
}

/// One stop-and-start of the unit, from the journal's own timestamps.
#[derive(Debug, Clone, Copy)]
struct Phases {
    /// "Stopping" → "Started": the figure.
    total: Duration,
    /// "Stopping" → "Stopped": the old agent's drain and exit.
    stop: Duration,
    /// "Stopped" → "Starting": between the two jobs.
    gap: Duration,
    /// "Starting" → "Started": the new agent's start to READY=1.
    start: Duration,
}

/// From the unit's first "Stopping" at or after `mark` (µs since the epoch)
/// to the "Started" after it, with the phases in between ("Starting"
/// missing: the start phase is counted from "Stopped").
fn stop_to_started(c: &SystemdContainer, mark: u64) -> Phases {
    poll_until(
        "systemd's Stopping and Started records",
        READY_TIMEOUT,
        || {
            let out = c.exec(&[
                "journalctl",
                "--no-pager",
                "-o",
                "json",
                "-u",
                UNIT,
                "--since",
                &format!("@{}", mark / 1_000_000),
            ]);
            let mut stopping = None;
            let mut stopped = None;
            let mut starting = None;
            for line in out.stdout.lines() {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                    continue;
                };
                let at: u64 = v["__REALTIME_TIMESTAMP"]
                    .as_str()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                if at < mark {
                    continue;
                }
                match (v["MESSAGE_ID"].as_str(), stopping) {
                    (Some(MSG_STOPPING), None) => stopping = Some(at),
                    (Some(MSG_STOPPED), Some(_)) => stopped = stopped.or(Some(at)),
                    (Some(MSG_STARTING), Some(_)) => starting = starting.or(Some(at)),
                    (Some(MSG_STARTED), Some(s)) => {
                        let stopped = stopped.unwrap_or(s);
                        let starting = starting.unwrap_or(stopped);
                        let us = Duration::from_micros;
                        return Some(Phases {
                            total: us(at - s),
                            stop: us(stopped.saturating_sub(s)),
                            gap: us(starting.saturating_sub(stopped)),
                            start: us(at.saturating_sub(starting)),
                        });
                    }
                    _ => {}
                }
            }
            None
        },
    )
}

fn median(v: &[Duration]) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    s.get(s.len() / 2).copied().unwrap_or_default()
}
