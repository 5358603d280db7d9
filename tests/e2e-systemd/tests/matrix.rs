//! The crash matrix under real systemd: at every fault point of the
//! updater, an upgrade written with `fleetctl upgrade` is interrupted twice
//! — the updater killed with SIGKILL (systemd restarts it), and the whole
//! device killed and booted again (power loss) — and after recovery the
//! seed's table must hold: the journal phase and reason, the active link,
//! exactly one agent process and it the one the table names, and the same
//! outcome in `<device>.upgrade` in NATS, published by that agent.
//!
//! How a point is hit: the fault-injection updater armed with
//! `FLEET_UPDATER_FAULT=<point>:stop` (a drop-in) stops itself there
//! (SIGSTOP). The test reads the durable phase it left, removes the
//! drop-in (so systemd's restart runs clean), then sends SIGKILL to it or
//! kills the container. A stop rather than an abort: the power loss must
//! happen at the point itself, before systemd would restart an aborted
//! updater, and the kill is a real SIGKILL.
//!
//! Three devices (containers) work through the rows at once; a row leaves
//! its device settled (one agent, a terminal journal), so the next row
//! upgrades from whatever runs to the other real agent or to a stand-in.
//! A failed row is recorded, and its device replaced by a fresh one. The
//! table goes to `target/e2e/matrix.md`; `make test` prints it last.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

use fleet_common::contracts::{JournalPhase, UpgradePhase};
use fleet_e2e_systemd::matrix::{self, Candidate, Expect, Mode, Outcome, Row};
use fleet_e2e_systemd::{
    phase_text, Device, Fleet, ReleaseFile, Run, SelfTest, StandIn, BOOTSTRAP, LINK, SETTLE,
    UPGRADE_TEST_VERSION,
};
use fleet_harness::{poll_until, test_agent_path, NatsVersion};
use fleet_updater::FaultPoint;

/// Devices working at once (2 cores: three containers keep them busy
/// without starving the agents' start bounds).
const WORKERS: usize = 3;

/// The releases every device uses.
#[derive(Debug)]
struct Releases {
    bootstrap: ReleaseFile,
    next: ReleaseFile,
    crash: ReleaseFile,
    crash_slow: ReleaseFile,
    probe_fails: ReleaseFile,
}

/// One device of the matrix with its own fleet (nats-server, HTTPS).
#[derive(Debug)]
struct Worker {
    fleet: Fleet,
    device: Device,
    releases: Releases,
}

fn stand_in_release(fleet: &Fleet, s: &StandIn) -> ReleaseFile {
    fleet.release_https(&s.version, s.script())
}

impl Worker {
    fn new(n: usize) -> Worker {
        let id = format!("matrix{n}");
        let fleet = Fleet::start(NatsVersion::V2_14, &[&id]);
        let device = Device::install(&fleet, &id, false);
        let bootstrap_bytes = device.read_bytes(&device.versioned(&device.bootstrap));
        let releases = Releases {
            bootstrap: fleet.release_https(&device.bootstrap, bootstrap_bytes),
            next: fleet.release_https(
                UPGRADE_TEST_VERSION,
                std::fs::read(test_agent_path(UPGRADE_TEST_VERSION)).expect("the test agent"),
            ),
            crash: stand_in_release(
                &fleet,
                &StandIn::new(
                    "0.3.0-crash-before-ready",
                    SelfTest::Pass,
                    Run::CrashBeforeReady { delay_ms: 0 },
                ),
            ),
            // Slow enough for the previous binary to be removed after the
            // switch, before the rollback starts it.
            crash_slow: stand_in_release(
                &fleet,
                &StandIn::new(
                    "0.3.0-crash-slowly",
                    SelfTest::Pass,
                    Run::CrashBeforeReady { delay_ms: 2000 },
                ),
            ),
            probe_fails: stand_in_release(
                &fleet,
                &StandIn::new("0.3.0-probe-fails", SelfTest::Fail, Run::NeverReady),
            ),
        };
        Worker {
            fleet,
            device,
            releases,
        }
    }

    /// A fresh device in place of one a failed row left in an unknown state.
    fn replace_device(&mut self) {
        let id = self.device.id.clone();
        self.device = Device::install(&self.fleet, &id, false);
    }
}

/// Runs one row: the attempt, the fault, the kill, then the checks; what
/// failed is in the outcome's `error` (a timeout panics; the caller catches it).
fn run_row(w: &Worker, point: FaultPoint, mode: Mode) -> Outcome {
    let started = Instant::now();
    let (candidate, expect) = matrix::plan(point);
    let d = &w.device;
    let previous = d.running_version().expect("an agent runs before the row");
    let release = match candidate {
        Candidate::Good if previous == d.bootstrap => &w.releases.next,
        Candidate::Good => &w.releases.bootstrap,
        Candidate::CrashBeforeReady => &w.releases.crash,
        Candidate::ProbeFails => &w.releases.probe_fails,
        Candidate::RollbackFails => &w.releases.crash_slow,
    };
    let previous_bin = d.versioned(&previous);
    let target_bin = d.versioned(&release.version);
    d.arm(point);
    let mut outcome = Outcome::default();
    let uuid = std::thread::scope(|s| {
        // The previous binary removed once the link is on the target (the
        // old agent is stopped by then): the rollback cannot start it.
        let remover = (candidate == Candidate::RollbackFails).then(|| {
            s.spawn(|| {
                d.c.exec_with_timeout(
                    &[
                        "sh",
                        "-c",
                        &format!(
                            "until [ \"$(readlink {LINK})\" = {target_bin} ]; do sleep 0.01; done; rm -f {previous_bin}"
                        ),
                    ],
                    SETTLE,
                )
            })
        });
        let uuid = w.fleet.upgrade(&d.id, release);
        let pid = d.wait_stopped_at_fault(point, SETTLE);
        if let Some(r) = remover {
            let out = r.join().expect("the remover thread");
            assert!(out.success(), "removing {previous_bin}: {out:?}");
        }
        outcome.at_fault = d.journal_phase();
        d.disarm();
        match mode {
            // systemd restarts it (Restart=always), clean.
            Mode::UpdaterKilled => d.kill_updater(pid, SETTLE),
            Mode::PowerLoss => {
                // /run is a tmpfs: a marker there is gone after a real boot.
                let marker = d.c.host_path("/run/e2e-before-power-loss");
                std::fs::write(&marker, b"").expect("the marker");
                d.c.power_cycle();
                assert!(
                    !d.c.host_path("/run/e2e-before-power-loss").exists(),
                    "the device did not boot again"
                );
            }
        }
        uuid
    });

    // The journal, as recovery leaves it.
    let tx = d.wait_journal_terminal(uuid, SETTLE);
    outcome.after = Some((tx.phase, tx.reason));
    let link = d.link();
    // Each device's previous version depends on the rows it ran before.
    outcome.link = if link == previous_bin {
        format!("previous ({previous})")
    } else if link == target_bin {
        format!("target ({})", release.version)
    } else {
        link.clone()
    };
    let mut errors = Vec::new();
    if (tx.phase, tx.reason) != (expect.journal(), Some(expect.reason())) {
        errors.push(format!(
            "journal {} ({:?}), the table says {} ({})",
            tx.phase,
            tx.reason,
            expect.journal(),
            expect.reason()
        ));
    }
    if let Some(p) = outcome.at_fault {
        if !tx.transitions.iter().any(|t| t.phase == p) {
            errors.push(format!("the journal's transitions lost {p}"));
        }
    }
    let (want_link, want_running) = match expect {
        Expect::Committed => (&target_bin, Some(release.version.as_str())),
        Expect::Failed(_) => (&previous_bin, Some(previous.as_str())),
        // Restored, dangling: nothing can run.
        Expect::RollbackFailed => (&previous_bin, None),
    };
    if &link != want_link {
        errors.push(format!("the link names {link}, not {want_link}"));
    }

    match want_running {
        Some(version) => {
            d.wait_agent(version, SETTLE);
            let status = w.fleet.wait_terminal(&d.id, uuid, SETTLE);
            outcome.nats = phase_text(status.phase, status.reason);
            if (status.phase, status.reason) != (expect.public(), Some(expect.reason())) {
                errors.push(format!("NATS says {}", outcome.nats));
            }
            w.fleet.wait_reporting(&d.id, version, SETTLE);
        }
        None => {
            // No agent can run to tell NATS: it still shows what the old
            // agent said last (never an end it could not know). The
            // updater itself says it.
            let last = w.fleet.upgrade_status(&d.id);
            outcome.nats = last.as_ref().map_or_else(
                || "none".to_owned(),
                |s| format!("{} (no agent runs)", phase_text(s.phase, s.reason)),
            );
            if last
                .as_ref()
                .is_some_and(|s| s.attempt_uuid == uuid && s.phase.is_terminal())
            {
                errors.push(format!("NATS shows an end no agent published: {last:?}"));
            }
            let status = d.updater_status();
            if status["phase"] != "rollback-failed" {
                errors.push(format!("fleet-updater status: {status}"));
            }
        }
    }
    let agents = d.agent_processes();
    let running = d.running_version();
    outcome.running = running.clone().unwrap_or_else(|| "none".to_owned());
    let want_agents = usize::from(want_running.is_some());
    if agents.len() != want_agents {
        outcome.running = format!("{} ×{}", outcome.running, agents.len());
        errors.push(format!("{} agent processes: {agents:?}", agents.len()));
    }
    if running.as_deref() != want_running {
        errors.push(format!("runs {running:?}, the table says {want_running:?}"));
    }

    if expect == Expect::RollbackFailed {
        repair(w, uuid, &mut outcome, &mut errors);
    }
    outcome.secs = started.elapsed().as_secs_f64();
    if !errors.is_empty() {
        outcome.error = Some(errors.join("; "));
    }
    outcome
}

/// The root repair of a quarantined device (REPAIR.md): the package's
/// agent installed again and selected; it runs and reports, and the
/// quarantine is lifted.
fn repair(
    w: &Worker,
    uuid: fleet_common::validate::AttemptUuid,
    outcome: &mut Outcome,
    errors: &mut Vec<String>,
) {
    let d = &w.device;
    let out = d.c.exec_with_timeout(
        &[
            "fleet-updater",
            "setup",
            "--repair",
            "--agent-binary",
            BOOTSTRAP,
        ],
        SETTLE,
    );
    if !out.success() || !out.stdout.contains("quarantine lifted") {
        errors.push(format!("setup --repair: {out:?}"));
        return;
    }
    d.wait_agent(&d.bootstrap, SETTLE);
    w.fleet.wait_reporting(&d.id, &d.bootstrap, SETTLE);
    let after = poll_until("NATS after the repair", SETTLE, || {
        w.fleet
            .upgrade_status(&d.id)
            .filter(|s| s.attempt_uuid == uuid && s.phase.is_terminal())
    });
    outcome.nats = format!(
        "{}; after repair: {}",
        outcome.nats,
        phase_text(after.phase, after.reason)
    );
    if after.phase != UpgradePhase::RollbackFailed {
        errors.push(format!("NATS after the repair: {after:?}"));
    }
    if d.journal_phase().is_some() {
        errors.push("the repair left a transaction in the journal".to_owned());
    }
}

/// One cell of the matrix to fill.
type Job = (FaultPoint, Mode);

/// The jobs of the matrix: every point in both modes, in a queue the
/// devices share; the two `rollback-failed` rows run last, one on each of
/// two devices (each ends with a root repair).
fn jobs() -> (VecDeque<Job>, Vec<Vec<Job>>) {
    let mut queue = VecDeque::new();
    let mut last = vec![Vec::new(); WORKERS];
    for p in FaultPoint::ALL {
        for (i, mode) in [Mode::UpdaterKilled, Mode::PowerLoss]
            .into_iter()
            .enumerate()
        {
            if matrix::plan(p).1 == Expect::RollbackFailed {
                last[i % WORKERS].push((p, mode));
            } else {
                queue.push_back((p, mode));
            }
        }
    }
    (queue, last)
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "unknown panic".to_owned())
}

#[test]
fn every_fault_point_recovers_under_systemd_after_a_sigkill_and_after_a_power_loss() {
    let started = Instant::now();
    let (queue, last) = jobs();
    let queue = Mutex::new(queue);
    let results: Mutex<Vec<(Job, Outcome)>> = Mutex::new(Vec::new());
    let setup_secs: Mutex<Vec<f64>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for (n, pinned) in last.into_iter().enumerate() {
            let (queue, results, setup_secs) = (&queue, &results, &setup_secs);
            std::thread::Builder::new()
                .name(format!("matrix-{n}"))
                .spawn_scoped(s, move || {
                    let t = Instant::now();
                    let mut w = Worker::new(n + 1);
                    setup_secs
                        .lock()
                        .expect("lock")
                        .push(t.elapsed().as_secs_f64());
                    let mut pinned = pinned.into_iter();
                    loop {
                        let next = queue.lock().expect("lock").pop_front();
                        let Some((point, mode)) = next.or_else(|| pinned.next()) else {
                            break;
                        };
                        let t = Instant::now();
                        let outcome =
                            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                run_row(&w, point, mode)
                            })) {
                                Ok(o) => o,
                                Err(p) => Outcome {
                                    secs: t.elapsed().as_secs_f64(),
                                    error: Some(panic_text(p)),
                                    ..Outcome::default()
                                },
                            };
                        eprintln!(
                            "matrix: {} ({}) on {}: {:.1} s{}",
                            point,
                            mode.as_str(),
                            w.device.id,
                            outcome.secs,
                            outcome
                                .error
                                .as_deref()
                                .map(|e| format!(": FAILED: {e}"))
                                .unwrap_or_default()
                        );
                        let failed = outcome.error.is_some();
                        results.lock().expect("lock").push(((point, mode), outcome));
                        if failed {
                            w.replace_device();
                        }
                    }
                })
                .expect("spawn a matrix worker");
        }
    });

    let results = results.into_inner().expect("lock");
    let rows: Vec<Row> = FaultPoint::ALL
        .into_iter()
        .map(|point| {
            let (candidate, expect) = matrix::plan(point);
            let find = |mode| {
                results
                    .iter()
                    .find(|(job, _)| *job == (point, mode))
                    .map(|(_, o)| o.clone())
            };
            Row {
                point,
                candidate,
                expect,
                killed: find(Mode::UpdaterKilled),
                power: find(Mode::PowerLoss),
            }
        })
        .collect();
    let setup = setup_secs.into_inner().expect("lock");
    let footer = format!(
        "{} rows on {WORKERS} devices in {:.0} s (booting and installing the devices: {}).",
        results.len(),
        started.elapsed().as_secs_f64(),
        setup
            .iter()
            .map(|s| format!("{s:.0} s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let table = matrix::render(&rows, &footer);
    let path = matrix::path();
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("create target/e2e");
    std::fs::write(&path, &table).expect("write the matrix");
    eprintln!("{table}");
    let failed: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("FAILED: "))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    // Every durable phase the points leave was seen at a kill.
    for p in [
        JournalPhase::Preparing,
        JournalPhase::Activating,
        JournalPhase::Committed,
        JournalPhase::RollingBack,
        JournalPhase::Failed,
        JournalPhase::RollbackFailed,
    ] {
        assert!(
            rows.iter()
                .any(|r| r.killed.as_ref().and_then(|o| o.at_fault) == Some(p)),
            "no row was killed in {p}"
        );
    }
}
