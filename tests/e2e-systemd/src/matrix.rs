//! The fault matrix: for every fault point of the updater, which candidate
//! reaches it and what the recovery table (`docs/design/upgrade.md`) prescribes
//! ([`plan`], one `match`, so a new point cannot be left out), the outcomes the
//! test saw after the updater was SIGKILLed there and after the device lost
//! power there ([`Outcome`]), and the table `make test` prints last
//! ([`render`], written to [`path`]).

use std::fmt::Write as _;
use std::path::PathBuf;

use fleet_common::contracts::{JournalPhase, UpgradePhase, UpgradeReason};
use fleet_updater::FaultPoint;

/// The candidate an attempt of a row upgrades to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Candidate {
    /// The other real agent (the package's or the `make test-agents` one).
    Good,
    /// A stand-in that exits 1 before `READY=1`: the rollback path.
    CrashBeforeReady,
    /// A stand-in whose `--self-test` fails: `failed` after preparation.
    ProbeFails,
    /// Crashes before `READY=1`, and the previous binary is removed during
    /// the cutover: the rollback cannot start it.
    RollbackFails,
}

impl Candidate {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Good => "real agent",
            Self::CrashBeforeReady => "crashes before READY",
            Self::ProbeFails => "fails its probe",
            Self::RollbackFails => "crashes; previous removed",
        }
    }
}

/// What the recovery table prescribes once the device has settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// `failed` for `reason`; the previous agent runs, and says so in NATS.
    Failed(UpgradeReason),
    /// `committed` / `complete (ready)`; the target runs.
    Committed,
    /// `rollback-failed`; no agent can run until root repair.
    RollbackFailed,
}

impl Expect {
    pub fn journal(self) -> JournalPhase {
        match self {
            Self::Failed(_) => JournalPhase::Failed,
            Self::Committed => JournalPhase::Committed,
            Self::RollbackFailed => JournalPhase::RollbackFailed,
        }
    }

    pub fn reason(self) -> UpgradeReason {
        match self {
            Self::Failed(r) => r,
            Self::Committed => UpgradeReason::Ready,
            Self::RollbackFailed => UpgradeReason::RollbackFailed,
        }
    }

    pub fn public(self) -> UpgradePhase {
        match self {
            Self::Failed(_) => UpgradePhase::Failed,
            Self::Committed => UpgradePhase::Complete,
            Self::RollbackFailed => UpgradePhase::RollbackFailed,
        }
    }
}

/// The candidate that reaches `point` and the outcome the recovery
/// table gives for a crash there.
pub fn plan(point: FaultPoint) -> (Candidate, Expect) {
    use FaultPoint as P;
    const INTERRUPTED: Expect = Expect::Failed(UpgradeReason::Interrupted);
    const START_FAILED: Expect = Expect::Failed(UpgradeReason::StartFailed);
    match point {
        // | preparing | restore the previous link, record failed, start the previous service |
        P::AfterWritePreparing => (Candidate::Good, INTERRUPTED),
        // | activating | record rolling-back, restore the previous link, stop, then start the previous service |
        P::AfterWriteActivating
        | P::BeforeStopPrevious
        | P::AfterStopPrevious
        | P::BeforeSwitchToTarget
        | P::AfterSwitchToTarget
        | P::BeforeStartTarget
        // Ready, but not committed yet: rolled back.
        | P::AfterStartTarget => (Candidate::Good, INTERRUPTED),
        // | committed | keep the target |
        P::AfterWriteCommitted => (Candidate::Good, Expect::Committed),
        // | rolling-back | restore the previous link and repeat stop/start |
        P::AfterWriteRollingBack
        | P::BeforeRestorePrevious
        | P::AfterRestorePrevious
        | P::BeforeStopForRollback
        | P::AfterStopForRollback
        | P::BeforeStartPrevious
        | P::AfterStartPrevious => (Candidate::CrashBeforeReady, START_FAILED),
        // | failed | keep the previous target; no automatic retry |
        P::AfterWriteFailed => (Candidate::ProbeFails, Expect::Failed(UpgradeReason::Probe)),
        // | rollback-failed | refuse every new attempt until direct root repair |
        P::AfterWriteRollbackFailed => (Candidate::RollbackFails, Expect::RollbackFailed),
    }
}

/// How the updater was interrupted at the point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `kill -9` of the (stopped) updater; systemd restarts it.
    UpdaterKilled,
    /// `podman kill -s KILL` of the whole device, then a boot.
    PowerLoss,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UpdaterKilled => "updater SIGKILL",
            Self::PowerLoss => "power loss",
        }
    }
}

/// What one row saw after recovery.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The durable phase when the process was killed.
    pub at_fault: Option<JournalPhase>,
    /// The journal's phase and reason after recovery.
    pub after: Option<(JournalPhase, Option<UpgradeReason>)>,
    /// `previous`, `target`, or the path the link names.
    pub link: String,
    /// The version of the agent systemd runs (`none`), and `×N` when N
    /// agent processes exist instead of one.
    pub running: String,
    /// `<device>.upgrade` in NATS for the attempt, `phase (reason)`.
    pub nats: String,
    /// From arming the fault to the checked outcome.
    pub secs: f64,
    /// The assertions that failed, when any.
    pub error: Option<String>,
}

impl Outcome {
    fn journal_cell(&self) -> String {
        let before = self
            .at_fault
            .map_or_else(|| "?".to_owned(), |p| p.to_string());
        let after = match self.after {
            Some((p, Some(r))) => format!("{p} ({r})"),
            Some((p, None)) => p.to_string(),
            None => "?".to_owned(),
        };
        format!("{before} → {after}")
    }
}

/// One fault point: its plan and both outcomes.
#[derive(Debug, Clone)]
pub struct Row {
    pub point: FaultPoint,
    pub candidate: Candidate,
    pub expect: Expect,
    pub killed: Option<Outcome>,
    pub power: Option<Outcome>,
}

/// `<target>/e2e/matrix.md`.
pub fn path() -> PathBuf {
    fleet_harness::target_dir().join("e2e").join("matrix.md")
}

/// The table (Markdown), then one line per failed cell.
pub fn render(rows: &[Row], footer: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Fault matrix under systemd (tests/e2e-systemd): the updater stopped at each fault point, then killed \
         (SIGKILL; systemd restarts it) or the whole device killed and booted again (power loss). \
         Journal: phase at the kill → after recovery; link: the active link (the device's previous agent or the attempt's \
         target, with its version: a device's previous version is what its earlier rows left); agent: the \
         version systemd runs (the only agent process); NATS: <device>.upgrade for the attempt."
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| fault point | candidate | SIGKILL: journal | link | agent | NATS | s | power loss: journal | link | agent | NATS | s |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---:|---|---|---|---|---:|");
    let mut failures = Vec::new();
    for r in rows {
        let _ = write!(s, "| {} | {} |", r.point, r.candidate.as_str());
        for (mode, o) in [
            (Mode::UpdaterKilled, &r.killed),
            (Mode::PowerLoss, &r.power),
        ] {
            match o {
                Some(o) => {
                    let mark = if o.error.is_some() { " **FAIL**" } else { "" };
                    let _ = write!(
                        s,
                        " {}{mark} | {} | {} | {} | {:.1} |",
                        o.journal_cell(),
                        o.link,
                        o.running,
                        o.nats,
                        o.secs
                    );
                    if let Some(e) = &o.error {
                        failures.push(format!("{} ({}): {e}", r.point, mode.as_str()));
                    }
                }
                None => {
                    let _ = write!(s, " not run | | | | |");
                    failures.push(format!("{} ({}): not run", r.point, mode.as_str()));
                }
            }
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s);
    if !footer.is_empty() {
        let _ = writeln!(s, "{footer}");
    }
    for f in &failures {
        let _ = writeln!(s, "FAILED: {f}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_has_a_plan_that_the_seed_prescribes() {
        for p in FaultPoint::ALL {
            let (candidate, expect) = plan(p);
            // Only the commit itself keeps the target; only a rollback that
            // cannot start the previous agent quarantines.
            assert_eq!(
                expect == Expect::Committed,
                p == FaultPoint::AfterWriteCommitted,
                "{p}"
            );
            assert_eq!(
                candidate == Candidate::RollbackFails,
                expect == Expect::RollbackFailed,
                "{p}"
            );
        }
    }

    #[test]
    fn the_table_marks_failures_and_missing_cells() {
        let ok = Outcome {
            at_fault: Some(JournalPhase::Activating),
            after: Some((JournalPhase::Failed, Some(UpgradeReason::Interrupted))),
            link: "previous".into(),
            running: "0.1.0".into(),
            nats: "failed (interrupted)".into(),
            secs: 4.3,
            error: None,
        };
        let bad = Outcome {
            error: Some("two agents".into()),
            ..ok.clone()
        };
        let rows = [Row {
            point: FaultPoint::BeforeStopPrevious,
            candidate: Candidate::Good,
            expect: Expect::Failed(UpgradeReason::Interrupted),
            killed: Some(ok),
            power: Some(bad),
        }];
        let text = render(&rows, "took 1 s");
        assert!(text.contains(
            "| before-stop-previous | real agent | activating → failed (interrupted) | previous | 0.1.0 | failed (interrupted) | 4.3 | activating → failed (interrupted) **FAIL** |"
        ), "{text}");
        assert!(
            text.contains("took 1 s\nFAILED: before-stop-previous (power loss): two agents\n"),
            "{text}"
        );
        let missing = render(
            &[Row {
                killed: None,
                power: None,
                ..rows[0].clone()
            }],
            "",
        );
        assert!(missing.contains("FAILED: before-stop-previous (updater SIGKILL): not run"));
    }
}
