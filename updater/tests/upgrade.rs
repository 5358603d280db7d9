//! Upgrades through the real `fleet-updater` binary, its real socket, the
//! real HTTPS test server and real stand-in agents under the supervisor:
//! the happy path, idempotence and conflicts, refusals that change
//! nothing, concurrency, quarantine, and the `status` command.

mod support;

use fleet_common::contracts::{ErrorCode, JournalPhase, Response, UpgradePhase, UpgradeReason};
use fleet_common::validate::MaxBytes;
use fleet_harness::{Behavior, HttpsServer, TestCa};
use support::{attempt, Device, Run, SelfTest, StandIn};

fn setup(candidate: &StandIn) -> (TestCa, HttpsServer, Device) {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    server.route("/agent", Behavior::Bytes(candidate.script()));
    let device = Device::new(&ca, &StandIn::good("1.0"));
    (ca, server, device)
}

fn refused(
    r: Response<fleet_common::contracts::UpdaterReply>,
) -> fleet_common::contracts::ErrorBody {
    match r {
        Response::Err(e) => e,
        Response::Ok(ok) => panic!("expected a refusal, got {ok:?}"),
    }
}

#[test]
fn upgrade_commits_and_status_reports_every_phase() {
    let v2 = StandIn::good("2.0");
    let (_ca, server, device) = setup(&v2);
    let _updater = device.start_updater();
    device.assert_only_agent("1.0");
    assert_eq!(device.status(), None);

    let a = attempt(&server.url("/agent"), &v2);
    let answered = device.upgrade_ok(&a);
    // Answered after the probe, as the cutover begins.
    assert_eq!(answered.phase, UpgradePhase::Stopping);
    assert_eq!(answered.attempt_uuid, a.uuid);
    assert_eq!(answered.attempt_digest, a.digest());

    let done = device.wait_terminal();
    assert_eq!(
        (done.phase, done.reason),
        (UpgradePhase::Complete, Some(UpgradeReason::Ready))
    );
    device.assert_only_agent("2.0");
    let phases: Vec<UpgradePhase> = done.transitions.iter().map(|t| t.phase).collect();
    assert_eq!(
        phases,
        [
            UpgradePhase::Preparing,
            UpgradePhase::Stopping,
            UpgradePhase::Starting,
            UpgradePhase::Complete
        ]
    );
    assert!(done.drain_duration_ms.is_some());
    let invocation = done
        .invocation_id
        .as_ref()
        .expect("invocation id")
        .to_string();
    assert_eq!(
        done.journal_ref.as_ref().map(|j| j.to_string()),
        Some(format!(
            "_SYSTEMD_UNIT=fleet-agent.service _SYSTEMD_INVOCATION_ID={invocation}"
        ))
    );
    assert!(done.boot_id.is_some());
    assert_eq!(
        done.detail.as_ref().map(|d| d.as_str()),
        Some("fleet-agent-v2.0 is active")
    );

    // Old stopped (drained on SIGTERM) before new started; probe ran first.
    let events: Vec<String> = device
        .events()
        .iter()
        .map(|e| {
            e.rsplit_once(' ')
                .map_or(e.clone(), |(head, _pid)| head.to_owned())
        })
        .collect();
    assert_eq!(
        events,
        ["start 1.0", "self-test 2.0", "stop 1.0", "start 2.0"]
    );

    // The installed binary is the artifact, root-owned 0755.
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(device.binary("2.0")).expect("installed");
    assert_eq!(meta.mode() & 0o777, 0o755);
    assert_eq!(meta.uid(), 0);
    assert_eq!(
        std::fs::read(device.binary("2.0")).expect("read"),
        v2.script()
    );

    // The journal: readable JSON, committed, remembered.
    let journal = device.journal();
    let tx = journal.transaction.as_ref().expect("tx");
    assert_eq!(tx.phase, JournalPhase::Committed);
    assert_eq!(tx.previous_binary, device.binary("1.0"));
    assert_eq!(tx.target_binary, device.binary("2.0"));
    let journal_phases: Vec<JournalPhase> = tx.transitions.iter().map(|t| t.phase).collect();
    assert_eq!(
        journal_phases,
        [
            JournalPhase::Preparing,
            JournalPhase::Activating,
            JournalPhase::Committed
        ]
    );
    assert_eq!(
        journal.finished.last().map(|f| (f.uuid, f.phase)),
        Some((a.uuid, JournalPhase::Committed))
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(device.layout.journal())
        .expect("journal")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // `status` for a person and for scripts.
    let (ok, text, _) = device.status_cli(false);
    assert!(ok.success());
    assert!(
        text.starts_with("phase:        complete (ready)\ntarget:       2.0\n"),
        "{text}"
    );
    assert!(text.contains("  complete (ready)\n"), "{text}");
    let (ok, json, _) = device.status_cli(true);
    assert!(ok.success());
    let parsed: fleet_common::contracts::UpgradeStatus =
        serde_json::from_str(&json).expect("json status");
    assert_eq!(parsed.attempt_uuid, a.uuid);
    assert_eq!(parsed.phase, UpgradePhase::Complete);
}

#[test]
fn same_uuid_is_idempotent_and_other_content_conflicts() {
    let v2 = StandIn::good("2.0");
    let (_ca, server, device) = setup(&v2);
    let _updater = device.start_updater();
    let a = attempt(&server.url("/agent"), &v2);
    device.upgrade_ok(&a);
    let done = device.wait_terminal();
    assert_eq!(done.phase, UpgradePhase::Complete);
    let downloads = server.requests().len();

    // The same attempt again: its status, nothing redone.
    let again = device.upgrade_ok(&a);
    assert_eq!(
        (again.attempt_uuid, again.phase),
        (a.uuid, UpgradePhase::Complete)
    );
    assert_eq!(server.requests().len(), downloads);

    // The same UUID with other content: conflict, nothing changes.
    let mut other = a.clone();
    other.max_bytes = MaxBytes::new(a.max_bytes.get() - 1).expect("max");
    let e = refused(device.upgrade(&other));
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(
        e.message.as_str().contains(&format!(
            "attempt {} was seen before with digest {}",
            a.uuid,
            a.digest()
        )),
        "{e}"
    );

    // An older attempt, remembered in `finished`, is still recognised.
    let v3 = StandIn::good("3.0");
    server.route("/agent3", Behavior::Bytes(v3.script()));
    let b = attempt(&server.url("/agent3"), &v3);
    device.upgrade_ok(&b);
    assert_eq!(device.wait_terminal().phase, UpgradePhase::Complete);
    device.assert_only_agent("3.0");
    let old = device.upgrade_ok(&a);
    assert_eq!(
        (old.attempt_uuid, old.phase),
        (a.uuid, UpgradePhase::Complete)
    );
    assert_eq!(refused(device.upgrade(&other)).code, ErrorCode::Conflict);
    device.assert_only_agent("3.0");
}

#[test]
fn the_active_version_completes_without_a_cutover() {
    let v1 = StandIn::good("1.0");
    let (_ca, server, device) = setup(&v1);
    let _updater = device.start_updater();
    device.assert_only_agent("1.0");
    let before = device.running_agents();
    let status = device.upgrade_ok(&attempt(&server.url("/agent"), &v1));
    assert_eq!(
        (status.phase, status.reason),
        (UpgradePhase::Complete, Some(UpgradeReason::AlreadyActive))
    );
    assert_eq!(
        device.running_agents(),
        before,
        "the agent was not restarted"
    );
    assert!(server.requests().is_empty(), "nothing was downloaded");

    // The active file re-verified against another hash: failed, untouched.
    let mut lying = attempt(&server.url("/agent"), &v1);
    lying.sha256 = fleet_common::validate::Sha256Hex::of(b"something else");
    let status = device.upgrade_ok(&lying);
    assert_eq!(
        (status.phase, status.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Install))
    );
    assert!(
        status
            .error
            .as_ref()
            .expect("error")
            .as_str()
            .contains("it was not overwritten"),
        "{status:?}"
    );
    assert_eq!(
        std::fs::read(device.binary("1.0")).expect("read"),
        v1.script()
    );
    assert_eq!(device.running_agents(), before);
}

#[test]
fn an_installed_binary_with_other_content_is_never_overwritten() {
    let v2 = StandIn::good("2.0");
    let (_ca, server, device) = setup(&v2);
    std::fs::write(device.binary("2.0"), b"#!/bin/sh\nexit 0\n").expect("plant");
    let _updater = device.start_updater();
    let status = device.upgrade_ok(&attempt(&server.url("/agent"), &v2));
    assert_eq!(
        (status.phase, status.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Install))
    );
    assert_eq!(
        std::fs::read(device.binary("2.0")).expect("read"),
        b"#!/bin/sh\nexit 0\n"
    );
    device.assert_only_agent("1.0");

    // An identical one is re-verified and used without a download.
    std::fs::write(device.binary("2.0"), v2.script()).expect("plant good");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(device.binary("2.0"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let status = device.upgrade_ok(&attempt(&server.url("/agent"), &v2));
    assert_eq!(status.phase, UpgradePhase::Stopping);
    assert_eq!(device.wait_terminal().phase, UpgradePhase::Complete);
    assert!(server.requests().is_empty());
    device.assert_only_agent("2.0");
}

#[test]
fn a_frozen_device_refuses_and_an_unreadable_freeze_counts_as_frozen() {
    let v2 = StandIn::good("2.0");
    let (_ca, server, device) = setup(&v2);
    let _updater = device.start_updater();
    let freeze = device.layout.freeze_state();
    std::fs::write(
        &freeze,
        r#"{"format":1,"config-state":{"state":"changefreeze","since":"2026-11-29T13:44:31.000Z","reason":"vehicle in motion","caller-uid":0},"written-at":"2026-11-29T13:44:31.000Z"}"#,
    )
    .expect("freeze");
    let e = refused(device.upgrade(&attempt(&server.url("/agent"), &v2)));
    assert_eq!(e.code, ErrorCode::Frozen);
    assert_eq!(e.message.as_str(), "the device is in a change freeze since 2026-11-29T13:44:31.000Z (vehicle in motion), asked by uid 0; the upgrade waits until whoever froze it unfreezes it");
    std::fs::write(&freeze, "{ not json").expect("corrupt");
    let e = refused(device.upgrade(&attempt(&server.url("/agent"), &v2)));
    assert_eq!(e.code, ErrorCode::Frozen);
    assert!(
        e.message.as_str().contains("treating the device as frozen"),
        "{e}"
    );
    assert!(server.requests().is_empty());
    assert!(
        !device.layout.journal().exists(),
        "no transaction was started"
    );
    device.assert_only_agent("1.0");

    std::fs::write(
        &freeze,
        r#"{"format":1,"config-state":{"state":"configured"},"written-at":"2026-11-29T13:50:00.000Z"}"#,
    )
    .expect("thaw");
    device.upgrade_ok(&attempt(&server.url("/agent"), &v2));
    assert_eq!(device.wait_terminal().phase, UpgradePhase::Complete);
}

#[test]
fn another_architecture_is_invalid_and_a_device_without_setup_is_refused() {
    let v2 = StandIn::good("2.0");
    let (_ca, server, device) = setup(&v2);
    let _updater = device.start_updater();
    let mut a = attempt(&server.url("/agent"), &v2);
    a.arch = match a.arch {
        fleet_common::validate::Arch::X86_64 => fleet_common::validate::Arch::Aarch64,
        _ => fleet_common::validate::Arch::X86_64,
    };
    let e = refused(device.upgrade(&a));
    assert_eq!(e.code, ErrorCode::Invalid);
    assert!(
        e.message.as_str().starts_with(&format!(
            "attempt {} is for {}, this device is",
            a.uuid, a.arch
        )),
        "{e}"
    );

    std::fs::remove_file(device.layout.active_agent_link()).expect("unlink");
    std::os::unix::fs::symlink("/bin/sh", device.layout.active_agent_link()).expect("link");
    let e = refused(device.upgrade(&attempt(&server.url("/agent"), &v2)));
    assert_eq!(e.code, ErrorCode::Refused);
    assert!(e.message.as_str().starts_with(&format!(
        "device not set up: the active link {} points at /bin/sh, not at a fleet-agent-v<version> in",
        device.layout.active_agent_link().display()
    )), "{e}");
    assert!(server.requests().is_empty());
    assert!(!device.layout.journal().exists());
}

#[test]
fn one_upgrade_at_a_time_and_status_answers_meanwhile() {
    let v2 = StandIn::good("2.0");
    let (_ca, server, device) = setup(&v2);
    server.route("/stall", Behavior::Stall);
    let _updater = device.start_updater();
    let slow = attempt(&server.url("/stall"), &v2);
    let socket = device.layout.updater_socket();
    let first = {
        let slow = slow.clone();
        std::thread::spawn(move || {
            fleet_common::socket::call::<_, fleet_common::contracts::UpdaterReply>(
                &socket,
                &fleet_common::contracts::UpdaterRequest::Upgrade { attempt: slow },
                fleet_common::limits::SOCKET_UPGRADE_RESPONSE_TIMEOUT,
            )
        })
    };
    fleet_harness::poll_until("the first attempt is preparing", support::SETTLE, || {
        device
            .status()
            .filter(|s| s.phase == UpgradePhase::Preparing)
    });
    // A second attempt is refused, not queued.
    let e = refused(device.upgrade(&attempt(&server.url("/agent"), &v2)));
    assert_eq!(e.code, ErrorCode::Busy);
    assert_eq!(e.retry_after_secs, Some(30));
    // The same attempt again is answered with its status.
    assert_eq!(device.upgrade_ok(&slow).phase, UpgradePhase::Preparing);
    // Status is answered within its bound while the download stalls.
    let (status, took) = support::timed(|| device.status());
    assert_eq!(status.map(|s| s.phase), Some(UpgradePhase::Preparing));
    assert!(
        took < fleet_common::limits::SOCKET_STATUS_RESPONSE_TIMEOUT,
        "{took:?}"
    );
    let answer = first.join().expect("thread").expect("answered");
    let Response::Ok(reply) = answer else {
        panic!("{answer:?}")
    };
    let s = reply.status.expect("status");
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Download))
    );
    device.assert_only_agent("1.0");
}

#[test]
fn a_failed_rollback_quarantines_until_root_repair() {
    let v2 = StandIn::with("2.0", SelfTest::Pass, Run::Crash);
    let (_ca, server, device) = setup(&v2);
    let updater = device.start_updater();
    device.assert_only_agent("1.0");
    std::fs::write(device.layout.agent_state_dir().join("fail-start-1.0"), "").expect("marker");
    let a = attempt(&server.url("/agent"), &v2);
    device.upgrade_ok(&a);
    let s = device.wait_terminal();
    assert_eq!(
        (s.phase, s.reason),
        (
            UpgradePhase::RollbackFailed,
            Some(UpgradeReason::RollbackFailed)
        )
    );
    assert!(
        s.error.as_ref().expect("error").as_str().starts_with(
            "start-previous: start fleet-agent.service: the agent exited with exit code 1"
        ),
        "{s:?}"
    );
    assert_eq!(device.active(), device.binary("1.0"));

    let v3 = StandIn::good("3.0");
    let e = refused(device.upgrade(&attempt(&server.url("/agent"), &v3)));
    assert_eq!(e.code, ErrorCode::Quarantined);
    // The same attempt too: every upgrade is refused.
    assert_eq!(refused(device.upgrade(&a)).code, ErrorCode::Quarantined);
    // And after a restart.
    drop(updater);
    support::poll_agents_gone(&device);
    let _again = device.start_updater();
    assert_eq!(
        device.status().map(|s| s.phase),
        Some(UpgradePhase::RollbackFailed)
    );
    assert_eq!(
        refused(device.upgrade(&attempt(&server.url("/agent"), &v3))).code,
        ErrorCode::Quarantined
    );
    let journal = device.journal();
    let steps: Vec<&str> = journal
        .transaction
        .as_ref()
        .expect("tx")
        .errors
        .iter()
        .map(|e| e.step.as_str())
        .collect();
    assert_eq!(steps, ["start-target", "start-previous"]);
}

#[test]
fn status_reads_the_journal_when_the_updater_is_down() {
    let v2 = StandIn::with("2.0", SelfTest::Fail, Run::Ready);
    let (_ca, server, device) = setup(&v2);
    let (ok, text, _) = device.status_cli(false);
    assert!(ok.success());
    assert_eq!(text, "no upgrade has run on this device\n");
    let updater = device.start_updater();
    let s = device.upgrade_ok(&attempt(&server.url("/agent"), &v2));
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Probe))
    );
    drop(updater);
    let (ok, text, note) = device.status_cli(false);
    assert!(ok.success());
    assert!(text.starts_with("phase:        failed (probe)\n"), "{text}");
    assert!(text.contains("error:        probe: candidate self-test failed with exit code 3; failed checks: nats: stand-in told to fail; last output: stand-in self-test failure\n"), "{text}");
    assert!(
        note.contains("the updater is not running; read from"),
        "{note}"
    );
}

/// The UUID binding outlives the journal's window of
/// finished attempts. An attempt fails, 70 others finish after it (more than
/// `MAX_REMEMBERED_ATTEMPTS`), then its UUID comes back with other content
/// (a v4.0 that would install and probe fine): refused as a conflict, nothing
/// downloaded or installed, also after a restart of the updater.
#[test]
fn a_uuid_stays_bound_after_70_later_attempts() {
    let v4 = StandIn::good("4.0");
    let (_ca, server, device) = setup(&v4);
    server.route("/gone", Behavior::Status(404));
    let updater = device.start_updater();
    let gone = |version: &str| attempt(&server.url("/gone"), &StandIn::good(version));
    let first = gone("2.0");
    assert_eq!(device.upgrade_ok(&first).phase, UpgradePhase::Failed);
    for n in 0..70 {
        let a = gone(&format!("3.{n}"));
        assert_eq!(
            device.upgrade_ok(&a).phase,
            UpgradePhase::Failed,
            "attempt {n}"
        );
    }
    assert!(
        device
            .journal()
            .finished
            .iter()
            .all(|f| f.uuid != first.uuid),
        "the journal's window no longer holds the first attempt"
    );
    let mut reused = attempt(&server.url("/agent"), &v4);
    reused.uuid = first.uuid;
    let downloads = server.requests().len();
    let check = || {
        let e = refused(device.upgrade(&reused));
        assert_eq!(e.code, ErrorCode::Conflict, "{e}");
        assert!(
            e.message.as_str().contains(&format!(
                "attempt {} was seen before with digest {}",
                first.uuid,
                first.digest()
            )),
            "{e}"
        );
        // The same content again is not run twice either.
        assert_eq!(refused(device.upgrade(&first)).code, ErrorCode::Conflict);
        assert_eq!(server.requests().len(), downloads, "nothing downloaded");
        assert!(!device.binary("4.0").exists(), "nothing installed");
        device.assert_only_agent("1.0");
    };
    check();
    drop(updater);
    let _updater = device.start_updater();
    check();
}
