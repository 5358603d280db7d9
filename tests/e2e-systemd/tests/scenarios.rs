//! Agent upgrades under real systemd, one scenario per test, each on its
//! own device (a booted Debian 12 container with this build's package)
//! with its own nats-server on the host. Every upgrade is written with
//! `fleetctl upgrade` and forwarded by the agent in the device; every test
//! checks the updater journal, the active link, the agent systemd runs and
//! `<device>.upgrade` in NATS (and the phases `fleetctl watch` printed).
//!
//! | scenario | candidate | outcome |
//! |---|---|---|
//! | upgrade over HTTPS (nested Podman on) | the agent built as another version | `complete`, journal `committed`, the new version reports |
//! | upgrade from an OCI registry | the same, pushed with `fleetctl artifact push` | `complete` |
//! | probe fails | stand-in whose `--self-test` fails | `failed (probe)`, the running agent never stopped |
//! | never READY | stand-in that never sends `READY=1` | `TimeoutStartSec` → rollback → `failed (start-failed)` |
//! | crashes after READY | stand-in: READY, exit 1, then the real agent | `committed`, no rollback, systemd restarts it |
//! | NATS unreachable after the cutover | the real agent | its start times out → rollback → `failed`, the truth in NATS once it is back |
//! | corrupt journal | — | the updater refuses to start and says why; the agent keeps running; repaired by hand |
//! | `rollback-failed` | crashes, and the previous binary is removed | quarantine, refusals, `setup --repair`, then an upgrade completes |
//! | full disk mid-upgrade, power cycle | the real agent; `/var/lib/harmony-fleet` (a small tmpfs) filled while the updater is held before it starts it | the commit is not recorded and rolled back; after the power loss, on the still-full disk, the previous agent runs, the updater retries the journal without crash-looping and says `not recorded` (NATS too); once space is freed: `failed (interrupted)` on disk and in NATS, never `complete` |
//! | mixed fleet | the released agent 0.1.0 (a consumer per device), then this agent | 0.1.0 runs and follows `fleetctl workload` on today's server config; the upgrade from it completes and this agent reads the same desired state without a consumer |

use std::time::{Duration, Instant};

use fleet_common::contracts::{
    AgentUpgradeAttempt, ErrorCode, JournalPhase, Response, UpdaterReply, UpdaterRequest,
    UpgradePhase, UpgradeReason,
};
use fleet_common::validate::{
    Arch, ArtifactUrl, AttemptUuid, DeviceId, MaxBytes, Sha256Hex, Version,
};
use fleet_e2e_systemd::{
    assert_in_order, Device, Fleet, Run, SelfTest, StandIn, AGENT_START_TIMEOUT_SECS, AGENT_UNIT,
    BOOTSTRAP, CRASHED_ONCE_MARKER, JOURNAL, LINK, SETTLE, UPDATER_UNIT, UPGRADE_TEST_VERSION,
};
use fleet_harness::{
    poll_until, test_agent_path, BootOptions, NatsVersion, Registry, RELEASED_AGENT_VERSION,
    STATE_DIR,
};
use fleet_updater::FaultPoint;

fn next_agent() -> Vec<u8> {
    std::fs::read(test_agent_path(UPGRADE_TEST_VERSION)).expect("the test agent")
}

/// The device settled on `version` after attempt `uuid`: the journal,
/// the link, the one agent process, NATS. Returns the NATS status.
fn assert_settled(
    fleet: &Fleet,
    d: &Device,
    uuid: AttemptUuid,
    journal: (JournalPhase, UpgradeReason),
    version: &str,
) -> fleet_common::contracts::UpgradeStatus {
    let tx = d.wait_journal_terminal(uuid, SETTLE);
    assert_eq!(
        (tx.phase, tx.reason),
        (journal.0, Some(journal.1)),
        "{tx:#?}\n{}",
        d.c.journal(UPDATER_UNIT)
    );
    d.wait_agent(version, SETTLE);
    assert_eq!(d.link(), d.versioned(version));
    let status = fleet.wait_terminal(&d.id, uuid, SETTLE);
    let public = match journal.0 {
        JournalPhase::Committed => UpgradePhase::Complete,
        JournalPhase::Failed => UpgradePhase::Failed,
        _ => UpgradePhase::RollbackFailed,
    };
    assert_eq!(
        (status.phase, status.reason),
        (public, Some(journal.1)),
        "{status:#?}"
    );
    fleet.wait_reporting(&d.id, version, SETTLE);
    let agents = d.agent_processes();
    assert_eq!(agents.len(), 1, "one agent process: {agents:?}");
    status
}

#[test]
fn an_upgrade_over_https_completes_and_the_new_agent_reports() {
    let fleet = Fleet::start(NatsVersion::V2_14, &["https1"]);
    // Nested rootless Podman on, as on a device.
    let d = Device::install(&fleet, "https1", true);
    let info = fleet.wait_reporting(&d.id, &d.bootstrap, SETTLE);
    assert!(info.podman_version.is_some(), "{info:?}");
    let before = d.show(AGENT_UNIT, "InvocationID");
    let release = fleet.release_https(UPGRADE_TEST_VERSION, next_agent());

    let started = Instant::now();
    let uuid = fleet.upgrade(&d.id, &release);
    let status = assert_settled(
        &fleet,
        &d,
        uuid,
        (JournalPhase::Committed, UpgradeReason::Ready),
        UPGRADE_TEST_VERSION,
    );
    eprintln!(
        "https: fleetctl upgrade → complete, reporting in {:.1?}",
        started.elapsed()
    );
    assert_eq!(status.target_version.as_str(), UPGRADE_TEST_VERSION);
    assert!(status.drain_duration_ms.is_some(), "{status:#?}");
    assert_ne!(d.show(AGENT_UNIT, "InvocationID"), before);
    let seen = fleet.wait_phase_seen(&d.id, uuid, "complete (ready)", SETTLE);
    assert_in_order(
        &seen,
        &[
            "preparing (accepted)",
            "stopping (updater)",
            "starting",
            "complete (ready)",
        ],
    );
    // The new agent reached Podman too.
    let info = fleet.wait_reporting(&d.id, UPGRADE_TEST_VERSION, SETTLE);
    assert!(info.podman_version.is_some(), "{info:?}");
    // The artifact came from the host's HTTPS server, once.
    let fetched = fleet
        .https
        .requests()
        .iter()
        .filter(|r| {
            r.path
                .ends_with(&format!("{UPGRADE_TEST_VERSION}/fleet-agent"))
        })
        .count();
    assert_eq!(fetched, 1);
}

#[test]
fn an_upgrade_from_an_oci_registry_completes() {
    let fleet = Fleet::start(NatsVersion::V2_9, &["oci1"]);
    let registry = Registry::start(&fleet.ca);
    let d = Device::install(&fleet, "oci1", false);
    let release = fleet.release_oci(
        &registry,
        UPGRADE_TEST_VERSION,
        &test_agent_path(UPGRADE_TEST_VERSION),
    );
    let uuid = fleet.upgrade(&d.id, &release);
    assert_settled(
        &fleet,
        &d,
        uuid,
        (JournalPhase::Committed, UpgradeReason::Ready),
        UPGRADE_TEST_VERSION,
    );
    // The attempt names the registry, pinned to the manifest digest.
    let tx = d
        .journal()
        .and_then(|j| j.transaction)
        .expect("a transaction");
    assert!(
        tx.attempt
            .artifact_url
            .to_string()
            .starts_with(&format!("oci://{}/fleet/agent@sha256:", registry.host())),
        "{}",
        tx.attempt.artifact_url
    );
    let log = registry.log();
    assert!(log.contains("/v2/fleet/agent/blobs/sha256:"), "{log}");
}

#[test]
fn a_candidate_that_fails_its_probe_never_stops_the_running_agent() {
    let fleet = Fleet::start(NatsVersion::V2_14, &["probe1"]);
    let d = Device::install(&fleet, "probe1", false);
    let pid = d.show(AGENT_UNIT, "MainPID");
    let invocation = d.show(AGENT_UNIT, "InvocationID");
    let stand_in = StandIn::new("0.3.0-probe-fails", SelfTest::Fail, Run::NeverReady);
    let release = fleet.release_https(&stand_in.version, stand_in.script());
    let uuid = fleet.upgrade(&d.id, &release);
    let status = assert_settled(
        &fleet,
        &d,
        uuid,
        (JournalPhase::Failed, UpgradeReason::Probe),
        &d.bootstrap,
    );
    let error = status.error.expect("an error").to_string();
    assert!(
        error.contains("candidate self-test failed with exit code 15")
            && error.contains("desired-read: end-to-end stand-in: fails its probe on purpose"),
        "{error}"
    );
    // The same run of the same process: never stopped.
    assert_eq!(d.show(AGENT_UNIT, "MainPID"), pid);
    assert_eq!(d.show(AGENT_UNIT, "InvocationID"), invocation);
    let seen = fleet.wait_phase_seen(&d.id, uuid, "failed (probe)", SETTLE);
    assert_in_order(&seen, &["preparing (accepted)", "failed (probe)"]);
    assert!(!seen.iter().any(|p| p.starts_with("stopping")), "{seen:?}");
    // Installed, and kept (unused versions go only when a write finds the
    // disk full).
    d.c.exec_ok(&["test", "-x", &d.versioned(&stand_in.version)]);
}

#[test]
fn a_candidate_that_never_sends_ready_is_rolled_back_after_the_start_timeout() {
    let fleet = Fleet::start(NatsVersion::V2_14, &["never1"]);
    let d = Device::install(&fleet, "never1", false);
    let stand_in = StandIn::new("0.3.0-never-ready", SelfTest::Pass, Run::NeverReady);
    let release = fleet.release_https(&stand_in.version, stand_in.script());
    let started = Instant::now();
    let uuid = fleet.upgrade(&d.id, &release);
    let status = assert_settled(
        &fleet,
        &d,
        uuid,
        (JournalPhase::Failed, UpgradeReason::StartFailed),
        &d.bootstrap,
    );
    let took = started.elapsed();
    eprintln!("never ready: fleetctl upgrade → failed, previous reporting in {took:.1?}");
    assert!(
        took >= Duration::from_secs(AGENT_START_TIMEOUT_SECS),
        "{took:?}"
    );
    let error = status.error.expect("an error").to_string();
    assert!(error.contains("systemctl start failed"), "{error}");
    // systemd's own timeout ended the candidate.
    let journal = d.c.journal(AGENT_UNIT);
    assert!(journal.contains("start operation timed out"), "{journal}");
    let seen = fleet.wait_phase_seen(&d.id, uuid, "failed (start-failed)", SETTLE);
    assert_in_order(
        &seen,
        &[
            "preparing (accepted)",
            "stopping (updater)",
            "rolling-back (start-failed)",
            "failed (start-failed)",
        ],
    );
}

#[test]
fn a_candidate_that_crashes_after_ready_is_committed_and_restarted_by_systemd() {
    let fleet = Fleet::start(NatsVersion::V2_14, &["crash1"]);
    let d = Device::install(&fleet, "crash1", false);
    // After its one crash, the stand-in runs the real agent of the same
    // version in its place (exec), so the device reports again.
    let real = "/opt/e2e/fleet-agent-real";
    d.c.exec_ok(&["mkdir", "-p", "/opt/e2e"]);
    d.c.copy_in(&test_agent_path(UPGRADE_TEST_VERSION), real);
    d.c.exec_ok(&["chmod", "0755", real]);
    let stand_in = StandIn::new(
        UPGRADE_TEST_VERSION,
        SelfTest::Pass,
        Run::CrashOnceAfterReady {
            real: real.to_owned(),
        },
    );
    let release = fleet.release_https(&stand_in.version, stand_in.script());
    let restarts: u32 = d.show(AGENT_UNIT, "NRestarts").parse().expect("NRestarts");

    let uuid = fleet.upgrade(&d.id, &release);
    let tx = d.wait_journal_terminal(uuid, SETTLE);
    assert_eq!(
        (tx.phase, tx.reason),
        (JournalPhase::Committed, Some(UpgradeReason::Ready)),
        "{tx:#?}"
    );
    // It crashed after READY: systemd restarted it (Restart=on-failure).
    poll_until("systemd to restart the crashed agent", SETTLE, || {
        let n: u32 = d.show(AGENT_UNIT, "NRestarts").parse().ok()?;
        (n > restarts).then_some(())
    });
    d.c.exec_ok(&["test", "-e", CRASHED_ONCE_MARKER]);
    let journal = d.c.journal(AGENT_UNIT);
    assert!(journal.contains("READY sent; crashing"), "{journal}");
    assert!(journal.contains("status=1/FAILURE"), "{journal}");
    poll_until("the restarted agent to be active", SETTLE, || {
        (d.c.active_state(AGENT_UNIT) == "active" && d.running_exe().as_deref() == Some(real))
            .then_some(())
    });
    // Committed stays committed: no rollback, the link on the target.
    let tx = d
        .journal()
        .and_then(|j| j.transaction)
        .expect("a transaction");
    assert_eq!(tx.phase, JournalPhase::Committed);
    assert!(
        !tx.transitions
            .iter()
            .any(|t| t.phase == JournalPhase::RollingBack),
        "{tx:#?}"
    );
    assert_eq!(d.link(), d.versioned(UPGRADE_TEST_VERSION));
    // The restarted agent tells NATS.
    let status = fleet.wait_terminal(&d.id, uuid, SETTLE);
    assert_eq!(
        (status.phase, status.reason),
        (UpgradePhase::Complete, Some(UpgradeReason::Ready))
    );
    fleet.wait_reporting(&d.id, UPGRADE_TEST_VERSION, SETTLE);
    assert_eq!(d.agent_processes().len(), 1, "{:?}", d.agent_processes());
}

#[test]
fn nats_unreachable_right_after_the_cutover_rolls_back_and_nats_then_tells_the_truth() {
    let mut fleet = Fleet::start(NatsVersion::V2_14, &["natsdown1"]);
    let d = Device::install(&fleet, "natsdown1", false);
    let release = fleet.release_https(UPGRADE_TEST_VERSION, next_agent());
    // The updater pauses right before it starts the new agent (probe
    // passed, old agent stopped, link switched): NATS goes down there.
    d.arm(FaultPoint::BeforeStartTarget);
    let uuid = fleet.upgrade(&d.id, &release);
    let pid = d.wait_stopped_at_fault(FaultPoint::BeforeStartTarget, SETTLE);
    d.disarm();
    assert_eq!(d.link(), d.versioned(UPGRADE_TEST_VERSION));
    fleet.nats.stop();
    let down = Instant::now();
    d.c.exec_ok(&["kill", "-CONT", &pid.to_string()]);

    // The new agent cannot get ready: systemd's start timeout, then the
    // rollback. NATS comes back once the rollback has begun, for the
    // previous agent.
    poll_until("the rollback to begin", SETTLE, || {
        (d.journal_phase() == Some(JournalPhase::RollingBack)).then_some(())
    });
    let waited = down.elapsed();
    fleet.nats.restart();
    assert!(
        waited >= Duration::from_secs(AGENT_START_TIMEOUT_SECS),
        "rolled back after {waited:?}"
    );
    let journal = d.c.journal(AGENT_UNIT);
    assert!(journal.contains("start operation timed out"), "{journal}");

    let status = assert_settled(
        &fleet,
        &d,
        uuid,
        (JournalPhase::Failed, UpgradeReason::StartFailed),
        &d.bootstrap,
    );
    assert!(status.error.is_some(), "{status:#?}");
    let seen = fleet.wait_phase_seen(&d.id, uuid, "failed (start-failed)", SETTLE);
    assert_in_order(
        &seen,
        &[
            "preparing (accepted)",
            "stopping (updater)",
            "rolling-back (start-failed)",
            "failed (start-failed)",
        ],
    );
}

/// Size of the small `/var/lib/harmony-fleet` of the full-disk scenario:
/// the journal and the agent's state (a few KiB) fit with room to spare,
/// and filling it takes no time.
const SMALL_STATE_FS_KIB: u64 = 4096;

/// `text` says a phase is not recorded for want of space.
fn says_not_recorded(text: &str) -> bool {
    text.contains("not recorded: ") && text.contains("No space left on device")
}

#[test]
fn a_disk_filled_mid_upgrade_and_a_power_cycle_end_on_the_previous_agent_and_the_truth_in_nats() {
    let fleet = Fleet::start(NatsVersion::V2_14, &["fulldisk1"]);
    let d = Device::install_with(
        &fleet,
        "fulldisk1",
        false,
        BootOptions {
            small_state_fs_kib: Some(SMALL_STATE_FS_KIB),
        },
    );
    // The journal and the agent's state are on the small filesystem.
    let df = d.c.exec_ok(&[
        "df",
        "--output=target,size",
        "/var/lib/harmony-fleet/updater",
        "/var/lib/harmony-fleet/agent",
    ]);
    assert_eq!(
        df.lines()
            .skip(1)
            .filter(|l| l.starts_with(STATE_DIR))
            .count(),
        2,
        "{df}"
    );
    // And the package's tmpfiles.d gave them their owners on it.
    assert_eq!(
        d.c.exec_ok(&[
            "stat",
            "-c",
            "%U %a",
            "/var/lib/harmony-fleet/updater",
            "/var/lib/harmony-fleet/agent",
        ]),
        "root 700\nfleet-agent 750\n"
    );
    let previous = d.versioned(&d.bootstrap);
    let release = fleet.release_https(UPGRADE_TEST_VERSION, next_agent());

    // Held right before it starts the new agent: journal `activating`,
    // the link on the target, the old agent stopped. The disk fills there.
    d.arm(FaultPoint::BeforeStartTarget);
    let uuid = fleet.upgrade(&d.id, &release);
    let pid = d.wait_stopped_at_fault(FaultPoint::BeforeStartTarget, SETTLE);
    d.disarm();
    assert_eq!(d.link(), d.versioned(UPGRADE_TEST_VERSION));
    assert_eq!(d.journal_phase(), Some(JournalPhase::Activating));
    let on_disk = d.read_bytes(JOURNAL);
    let filler = format!("{STATE_DIR}/e2e-filler");
    let fill =
        d.c.exec(&["dd", "if=/dev/zero", &format!("of={filler}"), "bs=64k"]);
    assert!(
        !fill.success() && fill.stderr.contains("No space left on device"),
        "{fill:?}"
    );
    let avail = d.c.exec_ok(&["df", "--output=avail", "-B1", STATE_DIR]);
    assert_eq!(avail.lines().nth(1).map(str::trim), Some("0"), "{avail}");

    // The new agent starts, but `committed` cannot be written: rolled
    // back, the rollback's phases not recorded either; the updater keeps
    // writing again and says why.
    d.c.exec_ok(&["kill", "-CONT", &pid.to_string()]);
    poll_until(
        "the updater to retry its journal on the full disk",
        SETTLE,
        || {
            let log = d.c.journal(UPDATER_UNIT);
            log.contains("is not recorded (").then_some(())
        },
    );
    assert_eq!(
        d.read_bytes(JOURNAL),
        on_disk,
        "the journal changed on a full disk"
    );
    let status = d.updater_status();
    assert_eq!(status["phase"], "stopping", "{status:#}");
    assert!(
        says_not_recorded(status["error"].as_str().unwrap_or_default()),
        "{status:#}"
    );

    // Power loss with the disk still full.
    let restarts_before = d.show(UPDATER_UNIT, "NRestarts");
    let marker = d.c.host_path("/run/e2e-before-power-loss");
    std::fs::write(&marker, b"").expect("the marker");
    d.c.power_cycle();
    assert!(
        !d.c.host_path("/run/e2e-before-power-loss").exists(),
        "the device did not boot again"
    );
    assert!(
        d.c.host_path(&filler).exists(),
        "the small disk did not outlive the power cycle"
    );
    assert_eq!(d.read_bytes(JOURNAL), on_disk);

    // Still full: the previous agent is selected and runs, alone; the
    // updater stays up, retrying with backoff (two tries: up for 3 s and
    // more), never restarted by systemd.
    d.c.wait_active(UPDATER_UNIT, SETTLE);
    let updater = d.show(UPDATER_UNIT, "MainPID");
    poll_until(
        &format!("updater {updater} to retry twice after the boot"),
        SETTLE,
        || {
            let log = d.c.exec_ok(&[
                "journalctl",
                "--no-pager",
                "-o",
                "cat",
                &format!("_PID={updater}"),
            ]);
            (log.matches("is not recorded (").count() >= 2).then_some(())
        },
    );
    assert_eq!(d.c.active_state(UPDATER_UNIT), "active");
    assert_eq!(d.show(UPDATER_UNIT, "MainPID"), updater);
    assert_eq!(
        d.show(UPDATER_UNIT, "NRestarts"),
        "0",
        "was {restarts_before} before the power loss"
    );
    assert_eq!(d.link(), previous);
    d.wait_agent(&d.bootstrap, SETTLE);
    let agents = d.agent_processes();
    assert_eq!(agents.len(), 1, "one agent process: {agents:?}");
    assert_eq!(d.journal_phase(), Some(JournalPhase::Activating));
    let status = d.updater_status();
    assert_eq!(status["phase"], "stopping", "{status:#}");
    assert!(
        says_not_recorded(status["error"].as_str().unwrap_or_default()),
        "{status:#}"
    );
    let log = d.c.journal(UPDATER_UNIT);
    assert!(log.contains("journal phase at start: activating"), "{log}");
    // NATS says the same: the attempt is not over, and why.
    let nats = fleet.wait_upgrade(&d.id, uuid, "not recorded", SETTLE, |s| {
        s.error
            .as_ref()
            .is_some_and(|e| says_not_recorded(e.as_ref()))
    });
    assert_eq!(nats.phase, UpgradePhase::Stopping, "{nats:#?}");
    fleet.wait_reporting(&d.id, &d.bootstrap, SETTLE);

    // Space freed: the journal is written within the backoff, the
    // attempt ends as the recovery table says, and NATS follows.
    d.c.exec_ok(&["rm", "-f", &filler]);
    let freed = Instant::now();
    let status = assert_settled(
        &fleet,
        &d,
        uuid,
        (JournalPhase::Failed, UpgradeReason::Interrupted),
        &d.bootstrap,
    );
    eprintln!(
        "full disk: journal and NATS settled {:.1?} after space was freed",
        freed.elapsed()
    );
    assert!(status.error.is_some_and(|e| !says_not_recorded(e.as_ref())));
    let tx = d
        .journal()
        .and_then(|j| j.transaction)
        .expect("a transaction");
    assert!(
        !tx.transitions
            .iter()
            .any(|t| t.phase == JournalPhase::Committed),
        "{tx:#?}"
    );
    // The journal itself keeps that it was written late, and why.
    assert!(
        tx.errors.iter().any(|e| e.step.as_str() == "journal"
            && e.message.as_str().contains("No space left on device")),
        "{tx:#?}"
    );
    let log = d.c.journal(UPDATER_UNIT);
    assert!(log.contains("recorded after"), "{log}");
    assert_eq!(
        d.c.exec_ok(&["systemctl", "is-active", AGENT_UNIT]).trim(),
        "active"
    );
    // Nothing ever told NATS the upgrade completed.
    let seen = fleet.wait_phase_seen(&d.id, uuid, "failed (interrupted)", SETTLE);
    assert!(!seen.iter().any(|p| p.starts_with("complete")), "{seen:?}");
}

#[test]
fn a_corrupt_journal_stops_the_updater_which_says_why_and_the_agent_keeps_running() {
    let fleet = Fleet::start(NatsVersion::V2_9, &["corrupt1"]);
    let d = Device::install(&fleet, "corrupt1", false);
    let agent = d.show(AGENT_UNIT, "MainPID");
    let restarts: u32 = d
        .show(UPDATER_UNIT, "NRestarts")
        .parse()
        .expect("NRestarts");

    d.c.write_file(
        JOURNAL,
        b"{\"format\": 1, \"transaction\": \x00garbage",
        0o600,
    );
    let restart = d.c.exec(&["systemctl", "restart", UPDATER_UNIT]);
    assert!(!restart.success(), "{restart:?}");
    // It keeps failing (Restart=always), and says why every time.
    poll_until("systemd to retry the updater", SETTLE, || {
        let n: u32 = d.show(UPDATER_UNIT, "NRestarts").parse().ok()?;
        (n > restarts).then_some(())
    });
    assert_ne!(d.c.active_state(UPDATER_UNIT), "active");
    let said = d.c.journal(UPDATER_UNIT);
    assert!(
        said.contains(&format!("the updater journal {JOURNAL} is corrupt"))
            && said.contains("move the journal aside and restart the updater"),
        "{said}"
    );
    // The agent is not the updater's: it runs on, the same process.
    assert_eq!(d.c.active_state(AGENT_UNIT), "active");
    assert_eq!(d.show(AGENT_UNIT, "MainPID"), agent);
    // Setup refuses to touch it; status says why.
    let setup =
        d.c.exec(&["fleet-updater", "setup", "--agent-binary", BOOTSTRAP]);
    assert_eq!(setup.code, Some(1), "{setup:?}");
    assert!(setup.stderr.contains("is corrupt"), "{setup:?}");
    let status = d.c.exec(&["fleet-updater", "status"]);
    assert!(
        !status.success() && status.stderr.contains("is corrupt"),
        "{status:?}"
    );

    // REPAIR.md, "By hand": the link names a good agent, the agent is
    // active; the journal moved aside; the updater starts.
    assert_eq!(d.link(), d.versioned(&d.bootstrap));
    d.c.sh(&format!(
        "mv {JOURNAL} {JOURNAL}.repaired-$(date -u +%Y%m%dT%H%M%SZ)"
    ));
    d.c.wait_active(UPDATER_UNIT, SETTLE);
    assert_eq!(
        d.c.exec_ok(&["fleet-updater", "status"]),
        "no upgrade has run on this device\n"
    );
    d.c.sh(&format!("ls {JOURNAL}.repaired-*"));
    // And upgrades work again.
    let release = fleet.release_https(UPGRADE_TEST_VERSION, next_agent());
    let uuid = fleet.upgrade(&d.id, &release);
    assert_settled(
        &fleet,
        &d,
        uuid,
        (JournalPhase::Committed, UpgradeReason::Ready),
        UPGRADE_TEST_VERSION,
    );
}

#[test]
fn rollback_failed_quarantines_until_setup_repair_brings_the_device_back() {
    let fleet = Fleet::start(NatsVersion::V2_14, &["quarantine1"]);
    let d = Device::install(&fleet, "quarantine1", false);
    let previous = d.versioned(&d.bootstrap);
    let stand_in = StandIn::new(
        "0.3.0-crash-slowly",
        SelfTest::Pass,
        Run::CrashBeforeReady { delay_ms: 2000 },
    );
    let target = d.versioned(&stand_in.version);
    let release = fleet.release_https(&stand_in.version, stand_in.script());

    // The previous binary removed during the cutover (after the switch,
    // while the candidate starts): the rollback cannot start it.
    let uuid = std::thread::scope(|s| {
        let remover = s.spawn(|| {
            d.c.exec_with_timeout(
                &[
                    "sh",
                    "-c",
                    &format!(
                        "until [ \"$(readlink {LINK})\" = {target} ]; do sleep 0.01; done; rm -f {previous}"
                    ),
                ],
                SETTLE,
            )
        });
        let uuid = fleet.upgrade(&d.id, &release);
        let out = remover.join().expect("the remover");
        assert!(out.success(), "{out:?}");
        uuid
    });
    let tx = d.wait_journal_terminal(uuid, SETTLE);
    assert_eq!(
        (tx.phase, tx.reason),
        (
            JournalPhase::RollbackFailed,
            Some(UpgradeReason::RollbackFailed)
        ),
        "{tx:#?}"
    );
    assert!(
        tx.errors
            .iter()
            .any(|e| e.step.as_str() == "start-previous"),
        "{tx:#?}"
    );
    // Restored, but nothing can run.
    assert_eq!(d.link(), previous);
    assert_eq!(d.running_exe(), None);
    assert!(d.agent_processes().is_empty(), "{:?}", d.agent_processes());
    assert_eq!(d.updater_status()["phase"], "rollback-failed");

    // Quarantined: a fresh attempt is refused, by the updater itself.
    let fresh = AgentUpgradeAttempt {
        arch: Arch::current().expect("arch"),
        artifact_url: ArtifactUrl::parse(&fleet.https.url("/releases/none")).expect("url"),
        device_id: DeviceId::parse(&d.id).expect("id"),
        max_bytes: MaxBytes::new(1024).expect("max"),
        sha256: Sha256Hex::of(b"none"),
        target_version: Version::parse("0.4.0").expect("version"),
        uuid: AttemptUuid::new_random(),
    };
    let answer = d.c.socket_request(
        "fleet-agent",
        "/run/harmony-fleet/updater.sock",
        &serde_json::to_string(&UpdaterRequest::Upgrade { attempt: fresh }).expect("json"),
        Duration::from_secs(30),
    );
    match Response::<UpdaterReply>::from_slice(answer.as_bytes()).expect("an answer") {
        Response::Err(e) => assert_eq!(e.code, ErrorCode::Quarantined, "{e:?}"),
        Response::Ok(r) => panic!("a quarantined updater accepted an attempt: {r:?}"),
    }

    // The root repair (REPAIR.md): the package's agent, installed again
    // and selected; the quarantine is lifted once it runs.
    let repaired = d.c.exec_with_timeout(
        &[
            "fleet-updater",
            "setup",
            "--repair",
            "--agent-binary",
            BOOTSTRAP,
        ],
        SETTLE,
    );
    assert!(
        repaired.success() && repaired.stdout.contains("quarantine lifted"),
        "{repaired:?}\n{}",
        d.c.journal(AGENT_UNIT)
    );
    d.wait_agent(&d.bootstrap, SETTLE);
    assert_eq!(d.link(), previous);
    fleet.wait_reporting(&d.id, &d.bootstrap, SETTLE);
    assert_eq!(d.journal_phase(), None, "the quarantine is lifted");
    // NATS said what happened to the attempt.
    let status = fleet.wait_terminal(&d.id, uuid, SETTLE);
    assert_eq!(status.phase, UpgradePhase::RollbackFailed, "{status:#?}");

    // NATS does not learn of the repair: the fleet keeps its hands off the
    // device (rollout and a plain upgrade skip it) until the operator names
    // it and asks again (--retry); then a new upgrade completes.
    let release = fleet.release_https(UPGRADE_TEST_VERSION, next_agent());
    let path = release.path.to_string_lossy().into_owned();
    let (code, out, err) = fleet.run_fleetctl(&["upgrade", &d.id, "--release", &path]);
    assert_eq!(code, Some(6), "{out}{err}");
    assert!(
        err.contains("rollback-failed after attempt")
            && err.contains(
                "once it is repaired, fleetctl upgrade with --retry issues the next attempt"
            ),
        "{err}"
    );
    let (code, out, err) = fleet.run_fleetctl(&["rollout", "--release", &path]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(&format!("{}: skipped: rollback-failed", d.id)),
        "{out}"
    );
    let uuid = fleet.upgrade(&d.id, &release);
    assert_settled(
        &fleet,
        &d,
        uuid,
        (JournalPhase::Committed, UpgradeReason::Ready),
        UPGRADE_TEST_VERSION,
    );
}

/// A mixed fleet under systemd: the device goes to the released agent 0.1.0
/// (generation 1: a consumer per device) through the updater, which runs
/// and follows `fleetctl workload` on today's server config (Debian's
/// nats-server 2.9) and buckets; then it upgrades from 0.1.0 to this
/// agent's protocol, which reads the same desired state without a consumer.
#[test]
fn a_device_on_the_released_agent_is_served_and_upgrades() {
    let fleet = Fleet::start(NatsVersion::V2_9, &["mixed1"]);
    let d = Device::install(&fleet, "mixed1", false);
    fleet.wait_reporting(&d.id, &d.bootstrap, SETTLE);
    let released = std::fs::read(test_agent_path(RELEASED_AGENT_VERSION)).expect("agent 0.1.0");
    let release = fleet.release_https(RELEASED_AGENT_VERSION, released);
    let uuid = fleet.upgrade(&d.id, &release);
    assert_settled(
        &fleet,
        &d,
        uuid,
        (JournalPhase::Committed, UpgradeReason::Ready),
        RELEASED_AGENT_VERSION,
    );
    let spec = std::env::temp_dir().join(format!("mixed1-{}.json", std::process::id()));
    std::fs::write(&spec, r#"{"image":"localhost/fleet-test/sleeper:1"}"#).expect("write");
    let apply = |name: &str| {
        let (code, out, err) = fleet.run_fleetctl(&[
            "workload",
            "apply",
            &d.id,
            name,
            spec.to_str().expect("utf8"),
        ]);
        assert_eq!(code, Some(0), "{out}{err}");
    };
    let reported = |names: &[&str]| {
        poll_until(&format!("{names:?} reported by {}", d.id), SETTLE, || {
            let (_, out, _) = fleet.run_fleetctl(&["workload", "ls", &d.id]);
            let listed: Vec<&str> = out
                .lines()
                .filter(|l| l.contains("pending"))
                .filter_map(|l| l.split(':').next())
                .collect();
            (listed == names).then_some(())
        })
    };
    apply("web");
    reported(&["web"]);

    let release = fleet.release_https(UPGRADE_TEST_VERSION, next_agent());
    let uuid = fleet.upgrade(&d.id, &release);
    assert_settled(
        &fleet,
        &d,
        uuid,
        (JournalPhase::Committed, UpgradeReason::Ready),
        UPGRADE_TEST_VERSION,
    );
    apply("api");
    reported(&["api", "web"]);
    let _ = std::fs::remove_file(&spec);
}
