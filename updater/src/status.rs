//! The public status of the current (or last) attempt, built from the
//! journal and the in-memory sub-steps, and its rendering for a person.
//!
//! | journal phase | public phase |
//! |---|---|
//! | `preparing` | `preparing` |
//! | `activating` | `stopping`, then `starting` (in-memory sub-step) |
//! | `committed` | `complete` |
//! | `rolling-back` | `rolling-back` |
//! | `failed` | `failed` |
//! | `rollback-failed` | `rollback-failed` |
//!
//! Only the journal on disk is read: a phase whose write failed is not
//! reported; the last recorded one is, with the error `not recorded:
//! <reason>`. So `complete` is only ever a `committed` on disk.
//!
//! [`status_line`] is the same state in a few words, for systemd's
//! `STATUS=`.

use std::fmt::Write;

use fleet_common::contracts::{
    FinishedAttempt, JournalPhase, StatusTransition, Transaction, Transitions, UpgradePhase,
    UpgradeReason, UpgradeStatus,
};
use fleet_common::validate::BoundedText;
use fleet_common::Timestamp;

use crate::state::{Published, Step};

/// Facts about this boot and unit, fixed at start.
#[derive(Debug, Clone)]
pub struct StatusInfo {
    pub unit: String,
    pub boot_id: Option<String>,
}

impl StatusInfo {
    pub fn new(unit: &str) -> Self {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
        Self {
            unit: unit.to_owned(),
            boot_id,
        }
    }
}

fn public_phase(phase: JournalPhase, step: Option<Step>) -> UpgradePhase {
    match phase {
        JournalPhase::Preparing => UpgradePhase::Preparing,
        JournalPhase::Activating => match step {
            Some(Step::Starting) => UpgradePhase::Starting,
            Some(Step::Stopping) | None => UpgradePhase::Stopping,
        },
        JournalPhase::Committed => UpgradePhase::Complete,
        JournalPhase::RollingBack => UpgradePhase::RollingBack,
        JournalPhase::Failed => UpgradePhase::Failed,
        JournalPhase::RollbackFailed => UpgradePhase::RollbackFailed,
    }
}

/// The status of the journal's transaction, `None` when there never was one.
pub fn current(p: &Published, info: &StatusInfo) -> Option<UpgradeStatus> {
    let tx = p.journal.transaction.as_ref()?;
    let live = (p.live.attempt == Some(tx.attempt.uuid)).then_some(&p.live);
    let step = live.and_then(|l| l.steps.last().map(|s| s.0));
    let phase = public_phase(tx.phase, step);

    // Journal transitions, with the in-memory `starting` sub-step merged in
    // by time.
    let mut timeline: Vec<(Timestamp, UpgradePhase, Option<UpgradeReason>)> = tx
        .transitions
        .iter()
        .map(|t| (t.at, public_phase(t.phase, None), t.reason))
        .collect();
    if let Some(l) = live {
        for (s, at) in &l.steps {
            if *s == Step::Starting {
                timeline.push((*at, UpgradePhase::Starting, None));
            }
        }
    }
    timeline.sort_by_key(|t| t.0);
    let mut transitions = Transitions::default();
    for (at, phase, reason) in &timeline {
        transitions.push(StatusTransition {
            phase: *phase,
            at: *at,
            reason: *reason,
        });
    }
    // The phase began at the first entry of the final run of equal phases.
    let run_start = timeline
        .iter()
        .rposition(|t| t.1 != phase)
        .map_or(0, |i| i + 1);
    let phase_changed_at = timeline
        .get(run_start)
        .or(timeline.last())
        .map_or(tx.started_at, |t| t.0);

    let invocation_id = live.and_then(|l| l.invocation_id.clone());
    let mut journal_ref = format!("_SYSTEMD_UNIT={}", info.unit);
    if let Some(id) = &invocation_id {
        let _ = write!(journal_ref, " _SYSTEMD_INVOCATION_ID={id}");
    }
    let error = match (&p.unsynced, tx.errors.last()) {
        (Some(u), _) => Some(format!("not recorded: {u}")),
        (None, Some(e)) => Some(format!("{}: {}", e.step, e.message)),
        (None, None) => None,
    };
    let detail = live
        .and_then(|l| l.detail.clone())
        .unwrap_or_else(|| default_detail(tx, phase, &info.unit));
    Some(UpgradeStatus {
        phase,
        attempt_uuid: tx.attempt.uuid,
        attempt_digest: tx.attempt_digest.clone(),
        target_version: tx.attempt.target_version.clone(),
        reason: tx.reason,
        detail: Some(BoundedText::truncate(detail)),
        error: error.map(BoundedText::truncate),
        attempt_started_at: tx.started_at,
        phase_changed_at,
        drain_duration_ms: tx
            .drain_duration_ms
            .or_else(|| live.and_then(|l| l.drain_ms)),
        boot_id: info.boot_id.as_deref().map(BoundedText::truncate),
        invocation_id: invocation_id.map(BoundedText::truncate),
        journal_ref: Some(BoundedText::truncate(journal_ref)),
        transitions,
    })
}

/// The status of an attempt remembered only in `finished`.
pub fn finished(f: &FinishedAttempt) -> UpgradeStatus {
    let mut s = UpgradeStatus::begin(
        f.uuid,
        f.digest.clone(),
        f.target_version.clone(),
        public_phase(f.phase, None),
        None,
        f.finished_at,
    );
    s.detail = Some(BoundedText::truncate(
        "an earlier attempt; the journal keeps only its outcome",
    ));
    s
}

fn file_name(p: &std::path::Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn default_detail(tx: &Transaction, phase: UpgradePhase, unit: &str) -> String {
    let target = file_name(&tx.target_binary);
    let previous = file_name(&tx.previous_binary);
    match phase {
        UpgradePhase::Preparing => format!("preparing {target}"),
        UpgradePhase::Stopping => format!("stopping {unit} ({previous})"),
        UpgradePhase::Starting => format!("starting {unit} on {target}"),
        UpgradePhase::Complete if tx.reason == Some(UpgradeReason::AlreadyActive) => {
            format!("{target} was already active")
        }
        UpgradePhase::Complete => format!("{target} is active"),
        UpgradePhase::RollingBack => format!("restoring {previous} and restarting {unit}"),
        UpgradePhase::Failed => {
            format!("{previous} kept active; no automatic retry of this attempt")
        }
        UpgradePhase::RollbackFailed => format!(
            "rollback to {previous} failed: every new attempt is refused until root repair (updater/REPAIR.md)"
        ),
    }
}

/// The updater's state in words, for `systemctl status fleet-updater`
/// (`STATUS=`): what it is doing now, or the last result when idle.
pub fn status_line(p: &Published) -> String {
    let Some(tx) = p.journal.transaction.as_ref() else {
        return "idle; no upgrade has run on this device".to_owned();
    };
    let live = (p.live.attempt == Some(tx.attempt.uuid)).then_some(&p.live);
    let step = live.and_then(|l| l.steps.last().map(|s| s.0));
    let version = &tx.attempt.target_version;
    let previous = file_name(&tx.previous_binary);
    let reason = tx.reason.map(|r| format!(" ({r})")).unwrap_or_default();
    let mut line = match tx.phase {
        JournalPhase::Preparing => format!("preparing {version}"),
        JournalPhase::Activating => match step {
            Some(Step::Starting) => format!("activating {version}: starting the new agent"),
            Some(Step::Stopping) | None => {
                format!("activating {version}: stopping the previous agent")
            }
        },
        JournalPhase::RollingBack => format!("rolling back from {version} to {previous}{reason}"),
        JournalPhase::Committed => format!("idle; last upgrade: {version} complete{reason}"),
        JournalPhase::Failed => {
            format!("idle; last upgrade: {version} failed{reason}, {previous} kept")
        }
        JournalPhase::RollbackFailed => format!(
            "quarantined: rollback from {version} to {previous} failed; root repair needed (see REPAIR.md)"
        ),
    };
    if let Some(u) = &p.unsynced {
        let _ = write!(line, "; not recorded: {u}");
    }
    line
}

/// `fleet-updater status` for a person.
pub fn render(status: Option<&UpgradeStatus>) -> String {
    let Some(s) = status else {
        return "no upgrade has run on this device\n".to_owned();
    };
    let mut out = String::new();
    let reason = s.reason.map(|r| format!(" ({r})")).unwrap_or_default();
    let _ = writeln!(out, "phase:        {}{reason}", s.phase);
    let _ = writeln!(out, "target:       {}", s.target_version);
    let _ = writeln!(out, "attempt:      {}", s.attempt_uuid);
    let _ = writeln!(out, "digest:       {}", s.attempt_digest);
    let _ = writeln!(out, "started:      {}", s.attempt_started_at);
    let _ = writeln!(out, "phase since:  {}", s.phase_changed_at);
    if let Some(d) = &s.detail {
        let _ = writeln!(out, "detail:       {d}");
    }
    if let Some(e) = &s.error {
        let _ = writeln!(out, "error:        {e}");
    }
    if let Some(d) = s.drain_duration_ms {
        let _ = writeln!(out, "drain:        {d} ms");
    }
    if let Some(b) = &s.boot_id {
        let _ = writeln!(out, "boot:         {b}");
    }
    if let Some(i) = &s.invocation_id {
        let _ = writeln!(out, "invocation:   {i}");
    }
    if let Some(j) = &s.journal_ref {
        let _ = writeln!(out, "logs:         journalctl {j}");
    }
    let _ = writeln!(out, "transitions:");
    for t in s.transitions.iter() {
        let reason = t.reason.map(|r| format!(" ({r})")).unwrap_or_default();
        let _ = writeln!(out, "  {}  {}{reason}", t.at, t.phase);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Live;
    use fleet_common::contracts::{AgentUpgradeAttempt, Bounded, Journal};
    use fleet_common::validate::*;

    fn published(phase_path: &[(JournalPhase, Option<UpgradeReason>)]) -> Published {
        let a = AgentUpgradeAttempt {
            arch: Arch::X86_64,
            artifact_url: ArtifactUrl::parse("https://h/a").expect("url"),
            device_id: DeviceId::parse("d").expect("d"),
            max_bytes: MaxBytes::new(1).expect("m"),
            sha256: Sha256Hex::of(b""),
            target_version: Version::parse("2.0").expect("v"),
            uuid: AttemptUuid::new_random(),
        };
        let mut tx = Transaction {
            phase: JournalPhase::Preparing,
            reason: None,
            attempt_digest: a.digest(),
            previous_binary: "/usr/lib/harmony-fleet/fleet-agent-v1.0".into(),
            target_binary: "/usr/lib/harmony-fleet/fleet-agent-v2.0".into(),
            attempt: a,
            started_at: Timestamp::from_unix_millis(1_000),
            drain_duration_ms: None,
            errors: Bounded::default(),
            transitions: Transitions::default(),
        };
        for (i, (p, r)) in phase_path.iter().enumerate() {
            tx.enter(
                *p,
                *r,
                Timestamp::from_unix_millis(1_000 + 1_000 * i as u64),
            );
        }
        Published {
            journal: Journal {
                transaction: Some(tx),
                ..Journal::default()
            },
            unsynced: None,
            live: Live::default(),
        }
    }

    fn info() -> StatusInfo {
        StatusInfo {
            unit: "fleet-agent.service".into(),
            boot_id: Some("b00t".into()),
        }
    }

    #[test]
    fn every_journal_phase_maps_to_its_public_phase() {
        use JournalPhase as J;
        use UpgradePhase as U;
        for (j, u) in [
            (J::Preparing, U::Preparing),
            (J::Activating, U::Stopping),
            (J::Committed, U::Complete),
            (J::RollingBack, U::RollingBack),
            (J::Failed, U::Failed),
            (J::RollbackFailed, U::RollbackFailed),
        ] {
            let s =
                current(&published(&[(J::Preparing, None), (j, None)]), &info()).expect("status");
            assert_eq!(s.phase, u, "{j}");
        }
        assert!(current(
            &Published {
                journal: Journal::default(),
                unsynced: None,
                live: Live::default()
            },
            &info()
        )
        .is_none());
    }

    #[test]
    fn the_starting_sub_step_is_public_and_timed() {
        let mut p = published(&[
            (JournalPhase::Preparing, Some(UpgradeReason::Accepted)),
            (JournalPhase::Activating, None),
        ]);
        let uuid = p.journal.transaction.as_ref().expect("tx").attempt.uuid;
        p.live = Live {
            attempt: Some(uuid),
            steps: vec![
                (Step::Stopping, Timestamp::from_unix_millis(2_000)),
                (Step::Starting, Timestamp::from_unix_millis(2_500)),
            ],
            invocation_id: Some("abc123".into()),
            drain_ms: Some(400),
            ..Live::default()
        };
        let s = current(&p, &info()).expect("status");
        assert_eq!(s.phase, UpgradePhase::Starting);
        assert_eq!(s.phase_changed_at, Timestamp::from_unix_millis(2_500));
        assert_eq!(s.drain_duration_ms, Some(400));
        let phases: Vec<UpgradePhase> = s.transitions.iter().map(|t| t.phase).collect();
        assert_eq!(
            phases,
            [
                UpgradePhase::Preparing,
                UpgradePhase::Stopping,
                UpgradePhase::Starting
            ]
        );
        assert_eq!(
            s.journal_ref.as_ref().map(|j| j.as_str()),
            Some("_SYSTEMD_UNIT=fleet-agent.service _SYSTEMD_INVOCATION_ID=abc123")
        );
        assert_eq!(
            s.detail.as_ref().map(|d| d.as_str()),
            Some("starting fleet-agent.service on fleet-agent-v2.0")
        );
        let text = render(Some(&s));
        assert!(
            text.starts_with("phase:        starting\ntarget:       2.0\n"),
            "{text}"
        );
        assert!(text.contains("logs:         journalctl _SYSTEMD_UNIT=fleet-agent.service _SYSTEMD_INVOCATION_ID=abc123\n"));
    }

    #[test]
    fn the_status_line_says_what_happens_in_words() {
        use JournalPhase as J;
        use UpgradeReason as R;
        let idle = Published {
            journal: Journal::default(),
            unsynced: None,
            live: Live::default(),
        };
        assert_eq!(
            status_line(&idle),
            "idle; no upgrade has run on this device"
        );
        type Path<'a> = &'a [(J, Option<R>)];
        let cases: [(Path, &str); 6] = [
            (&[(J::Preparing, Some(R::Accepted))], "preparing 2.0"),
            (
                &[(J::Preparing, None), (J::Activating, None)],
                "activating 2.0: stopping the previous agent",
            ),
            (
                &[(J::Activating, None), (J::RollingBack, Some(R::Interrupted))],
                "rolling back from 2.0 to fleet-agent-v1.0 (interrupted)",
            ),
            (
                &[(J::Activating, None), (J::Committed, Some(R::Ready))],
                "idle; last upgrade: 2.0 complete (ready)",
            ),
            (
                &[(J::RollingBack, None), (J::Failed, Some(R::Interrupted))],
                "idle; last upgrade: 2.0 failed (interrupted), fleet-agent-v1.0 kept",
            ),
            (
                &[(J::RollbackFailed, Some(R::RollbackFailed))],
                "quarantined: rollback from 2.0 to fleet-agent-v1.0 failed; root repair needed (see REPAIR.md)",
            ),
        ];
        for (path, want) in cases {
            let mut p = published(path);
            p.journal.transaction.as_mut().expect("tx").reason = path.last().and_then(|l| l.1);
            assert_eq!(status_line(&p), want);
            assert!(!status_line(&p).contains('{'), "no debug text");
        }
        let mut p = published(&[(J::Preparing, None), (J::Activating, None)]);
        p.live.attempt = Some(p.journal.transaction.as_ref().expect("tx").attempt.uuid);
        p.live.steps = vec![(Step::Starting, Timestamp::from_unix_millis(5_000))];
        p.unsynced = Some("recording phase committed in the journal: writing /j: No space left on device (os error 28): check free space".into());
        assert_eq!(
            status_line(&p),
            "activating 2.0: starting the new agent; not recorded: recording phase committed in the journal: writing /j: No space left on device (os error 28): check free space"
        );
        let s = current(&p, &info()).expect("status");
        assert_eq!(
            s.phase,
            UpgradePhase::Starting,
            "the phase on disk, not committed"
        );
        assert_eq!(
            s.error.as_ref().map(|e| e.as_str()),
            Some("not recorded: recording phase committed in the journal: writing /j: No space left on device (os error 28): check free space")
        );
    }

    #[test]
    fn failure_shows_the_last_error_and_what_was_kept() {
        let mut p = published(&[(JournalPhase::Preparing, None)]);
        if let Some(tx) = p.journal.transaction.as_mut() {
            tx.record_error(
                "download",
                "the server answered HTTP 404",
                Timestamp::from_unix_millis(1_500),
            );
            tx.enter(
                JournalPhase::Failed,
                Some(UpgradeReason::Download),
                Timestamp::from_unix_millis(1_600),
            );
        }
        let s = current(&p, &info()).expect("status");
        assert_eq!(s.reason, Some(UpgradeReason::Download));
        assert_eq!(
            s.error.as_ref().map(|e| e.as_str()),
            Some("download: the server answered HTTP 404")
        );
        assert_eq!(
            s.detail.as_ref().map(|e| e.as_str()),
            Some("fleet-agent-v1.0 kept active; no automatic retry of this attempt")
        );
        assert_eq!(s.phase_changed_at, Timestamp::from_unix_millis(1_600));
    }
}
