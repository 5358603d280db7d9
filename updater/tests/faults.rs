//! The crash matrix: the updater is killed (`abort`, armed with
//! `FLEET_UPDATER_FAULT`) at every named point — after every journal
//! write, before and after every symlink switch and service call — then
//! restarted without the fault. After recovery the recovery table
//! (`docs/design/upgrade.md` "Recovery") must hold:
//! the journal phase and public status it prescribes, exactly one of the
//! previous or target agent active and running (the supervised agent dies
//! with its updater, and no orphan is left), and never two agents at once.
//!
//! | scenario | candidate | where the points lie |
//! |---|---|---|
//! | `Good` | v2 becomes ready | preparation, cutover, commit |
//! | `StartFails` | v2 crashes at start | the rollback path |
//! | `ProbeFails` | v2 fails its self-test | `failed` after preparation |
//! | `RollbackFails` | v2 crashes, v1 cannot start either | `rollback-failed` |

mod support;

use fleet_common::contracts::{JournalPhase, Response, UpgradePhase, UpgradeReason};
use fleet_harness::{Behavior, HttpsServer, TestCa};
use fleet_updater::FaultPoint;
use support::{attempt, Device, Run, SelfTest, StandIn};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Good,
    StartFails,
    ProbeFails,
    RollbackFails,
}

/// What the table prescribes after recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Expect {
    phase: JournalPhase,
    public: UpgradePhase,
    reason: UpgradeReason,
    /// The version active and running; `None` when nothing can run.
    running: Option<&'static str>,
}

const FAILED_INTERRUPTED: Expect = Expect {
    phase: JournalPhase::Failed,
    public: UpgradePhase::Failed,
    reason: UpgradeReason::Interrupted,
    running: Some("1.0"),
};

fn candidate(s: Scenario) -> StandIn {
    match s {
        Scenario::Good => StandIn::good("2.0"),
        Scenario::StartFails | Scenario::RollbackFails => {
            StandIn::with("2.0", SelfTest::Pass, Run::Crash)
        }
        Scenario::ProbeFails => StandIn::with("2.0", SelfTest::Fail, Run::Ready),
    }
}

/// Kills the updater at `point` during an upgrade in `scenario`, restarts
/// it, and checks the outcome against `expect`.
fn crash_and_recover(point: FaultPoint, scenario: Scenario, expect: Expect) {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    let v2 = candidate(scenario);
    server.route("/agent", Behavior::Bytes(v2.script()));
    let device = Device::new(&ca, &StandIn::good("1.0"));
    let a = attempt(&server.url("/agent"), &v2);

    let mut first = device.start_updater_with_fault(point);
    device.assert_only_agent("1.0");
    if scenario == Scenario::RollbackFails {
        std::fs::write(device.layout.agent_state_dir().join("fail-start-1.0"), "").expect("marker");
    }
    // The answer may never come: the updater may die while preparing.
    let request = {
        let attempt = a.clone();
        let socket = device.layout.updater_socket();
        std::thread::spawn(move || {
            fleet_common::socket::call::<_, fleet_common::contracts::UpdaterReply>(
                &socket,
                &fleet_common::contracts::UpdaterRequest::Upgrade { attempt },
                fleet_common::limits::SOCKET_UPGRADE_RESPONSE_TIMEOUT,
            )
        })
    };
    first.wait_aborted();
    let _ = request.join();
    // The supervised agent died with its updater: no orphan is left.
    support::poll_agents_gone(&device);

    let _second = device.start_updater();
    let status = device.wait_terminal();
    let journal = device.journal();
    let tx = journal.transaction.as_ref().expect("a transaction");
    assert_eq!(tx.attempt.uuid, a.uuid);
    assert_eq!(
        (tx.phase, status.phase, status.reason),
        (expect.phase, expect.public, Some(expect.reason)),
        "after {point}: journal {:#?}",
        journal
    );
    assert_eq!(status.attempt_uuid, a.uuid);
    match expect.running {
        Some(version) => device.assert_only_agent(version),
        None => {
            assert_eq!(
                device.active(),
                device.binary("1.0"),
                "the previous link is restored"
            );
            assert!(device.running_agents().is_empty());
            device.assert_no_overlap();
            // Quarantined: even a fresh attempt is refused, and stays so.
            let fresh = attempt(&server.url("/agent"), &StandIn::good("3.0"));
            match device.upgrade(&fresh) {
                Response::Err(e) => {
                    assert_eq!(e.code, fleet_common::contracts::ErrorCode::Quarantined)
                }
                Response::Ok(r) => panic!("a rollback-failed updater accepted an attempt: {r:?}"),
            }
        }
    }
    eprintln!(
        "{point} ({scenario:?}): events {:?}; journal {:?}",
        device.events(),
        tx.transitions
            .iter()
            .map(|t| (t.phase, t.reason))
            .collect::<Vec<_>>()
    );
    // The journal is one durable record a person can follow.
    assert!(tx.transitions.iter().any(|t| t.phase == expect.phase));
    assert_eq!(journal.finished.last().map(|f| f.uuid), Some(a.uuid));
}

macro_rules! matrix {
    ($($name:ident: $point:ident, $scenario:ident => $expect:expr;)*) => {$(
        #[test]
        fn $name() {
            crash_and_recover(FaultPoint::$point, Scenario::$scenario, $expect);
        }
    )*};
}

matrix! {
    // | preparing | restore the previous link, record failed, start the previous service |
    after_write_preparing: AfterWritePreparing, Good => FAILED_INTERRUPTED;
    // | activating | record rolling-back, restore the previous link, stop, then start the previous service |
    after_write_activating: AfterWriteActivating, Good => FAILED_INTERRUPTED;
    before_stop_previous: BeforeStopPrevious, Good => FAILED_INTERRUPTED;
    after_stop_previous: AfterStopPrevious, Good => FAILED_INTERRUPTED;
    before_switch_to_target: BeforeSwitchToTarget, Good => FAILED_INTERRUPTED;
    after_switch_to_target: AfterSwitchToTarget, Good => FAILED_INTERRUPTED;
    before_start_target: BeforeStartTarget, Good => FAILED_INTERRUPTED;
    // Ready, but not yet committed: the recovery table rolls it back.
    after_start_target_ready: AfterStartTarget, Good => FAILED_INTERRUPTED;
    after_start_target_failed: AfterStartTarget, StartFails => FAILED_INTERRUPTED;
    // | committed | keep the target |
    after_write_committed: AfterWriteCommitted, Good => Expect {
        phase: JournalPhase::Committed,
        public: UpgradePhase::Complete,
        reason: UpgradeReason::Ready,
        running: Some("2.0"),
    };
    // | rolling-back | restore the previous link and repeat stop/start |
    after_write_rolling_back: AfterWriteRollingBack, StartFails => FAILED_START;
    before_restore_previous: BeforeRestorePrevious, StartFails => FAILED_START;
    after_restore_previous: AfterRestorePrevious, StartFails => FAILED_START;
    before_stop_for_rollback: BeforeStopForRollback, StartFails => FAILED_START;
    after_stop_for_rollback: AfterStopForRollback, StartFails => FAILED_START;
    before_start_previous: BeforeStartPrevious, StartFails => FAILED_START;
    after_start_previous: AfterStartPrevious, StartFails => FAILED_START;
    // | failed | keep the previous target; no automatic retry |
    after_write_failed_rollback: AfterWriteFailed, StartFails => FAILED_START;
    after_write_failed_probe: AfterWriteFailed, ProbeFails => Expect {
        phase: JournalPhase::Failed,
        public: UpgradePhase::Failed,
        reason: UpgradeReason::Probe,
        running: Some("1.0"),
    };
    // | rollback-failed | refuse every new attempt until direct root repair |
    after_write_rollback_failed: AfterWriteRollbackFailed, RollbackFails => Expect {
        phase: JournalPhase::RollbackFailed,
        public: UpgradePhase::RollbackFailed,
        reason: UpgradeReason::RollbackFailed,
        running: None,
    };
}

const FAILED_START: Expect = Expect {
    phase: JournalPhase::Failed,
    public: UpgradePhase::Failed,
    reason: UpgradeReason::StartFailed,
    running: Some("1.0"),
};

/// Every point is covered by the matrix above.
#[test]
fn the_matrix_covers_every_fault_point() {
    let source = include_str!("faults.rs");
    for p in FaultPoint::ALL {
        let variant = format!("{p:?}");
        assert!(
            source.contains(&format!(": {variant},")),
            "fault point {p} has no crash test"
        );
    }
}

/// A crash during recovery itself is recovered by the next start.
#[test]
fn a_crash_during_recovery_is_recovered_by_the_next_start() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    let v2 = StandIn::with("2.0", SelfTest::Pass, Run::Crash);
    server.route("/agent", Behavior::Bytes(v2.script()));
    let device = Device::new(&ca, &StandIn::good("1.0"));
    let a = attempt(&server.url("/agent"), &v2);

    let mut first = device.start_updater_with_fault(FaultPoint::AfterWriteActivating);
    device.assert_only_agent("1.0");
    let socket = device.layout.updater_socket();
    let req = a.clone();
    let t = std::thread::spawn(move || {
        fleet_common::socket::call::<_, fleet_common::contracts::UpdaterReply>(
            &socket,
            &fleet_common::contracts::UpdaterRequest::Upgrade { attempt: req },
            fleet_common::limits::SOCKET_UPGRADE_RESPONSE_TIMEOUT,
        )
    });
    first.wait_aborted();
    let _ = t.join();
    // Recovery records rolling-back, restores the link, and dies before
    // starting the previous agent.
    let mut second = device.launch_updater_with_fault(FaultPoint::BeforeStartPrevious);
    second.wait_aborted();
    assert_eq!(
        device.journal().transaction.expect("tx").phase,
        JournalPhase::RollingBack
    );
    assert_eq!(device.active(), device.binary("1.0"));
    support::poll_agents_gone(&device);

    let _third = device.start_updater();
    let status = device.wait_terminal();
    assert_eq!(
        (status.phase, status.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Interrupted))
    );
    device.assert_only_agent("1.0");
    let journal = device.journal();
    let errors: Vec<&str> = journal
        .transaction
        .as_ref()
        .expect("tx")
        .errors
        .iter()
        .map(|e| e.step.as_str())
        .collect();
    // One record per interrupted start: the cutover, then the rollback.
    assert_eq!(errors, ["recovery", "recovery"], "{journal:#?}");
    let messages: Vec<&str> = journal
        .transaction
        .as_ref()
        .expect("tx")
        .errors
        .iter()
        .map(|e| e.message.as_str())
        .collect();
    assert_eq!(
        messages[1],
        "the updater restarted while rolling back; repeating the rollback"
    );
}

/// `<point>:stop` freezes the updater at its point (SIGSTOP), the journal
/// and the link on disk as the point left them, until it is killed; a
/// SIGKILL then is the crash, and the next start recovers. (The systemd
/// matrix uses this to kill the updater, or the whole machine, there.)
#[test]
fn a_stop_fault_freezes_the_updater_at_its_point_until_it_is_killed() {
    use fleet_updater::{Fault, FaultAction, FAULT_ENV};
    use rustix::process::Signal;
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    let v2 = StandIn::good("2.0");
    server.route("/agent", Behavior::Bytes(v2.script()));
    let device = Device::new(&ca, &StandIn::good("1.0"));
    let a = attempt(&server.url("/agent"), &v2);

    let fault = Fault {
        point: FaultPoint::AfterSwitchToTarget,
        action: FaultAction::Stop,
    };
    let mut cmd = device.updater_command();
    cmd.env(FAULT_ENV, fault.env_value());
    let mut first = fleet_harness::ChildGuard::spawn(cmd, "fleet-updater");
    first.wait_for_line("recovery complete", support::SETTLE);
    let socket = device.layout.updater_socket();
    let req = a.clone();
    let t = std::thread::spawn(move || {
        fleet_common::socket::call::<_, fleet_common::contracts::UpdaterReply>(
            &socket,
            &fleet_common::contracts::UpdaterRequest::Upgrade { attempt: req },
            fleet_common::limits::SOCKET_UPGRADE_RESPONSE_TIMEOUT,
        )
    });
    let stat = format!("/proc/{}/stat", first.pid());
    fleet_harness::poll_until(
        "the updater stopped at its fault point",
        support::SETTLE,
        || {
            let s = std::fs::read_to_string(&stat).ok()?;
            let state = s[s.rfind(')')? + 1..].split_whitespace().next()?.to_owned();
            (state == "T").then_some(())
        },
    );
    first.wait_for_line(
        "fault injection: stopping at after-switch-to-target",
        support::SETTLE,
    );
    // Frozen where the point is: activating, the link on the target.
    assert_eq!(
        device.journal().transaction.expect("tx").phase,
        JournalPhase::Activating
    );
    assert_eq!(device.active(), device.binary("2.0"));
    assert!(first.try_wait().is_none(), "stopped, not dead");

    first.signal(Signal::KILL);
    {
        use std::os::unix::process::ExitStatusExt;
        let status = first.wait_exit(support::SETTLE);
        assert_eq!(status.signal(), Some(9), "{}", first.log());
    }
    let _ = t.join();
    support::poll_agents_gone(&device);
    let _second = device.start_updater();
    let status = device.wait_terminal();
    assert_eq!(
        (status.phase, status.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Interrupted))
    );
    device.assert_only_agent("1.0");
}
