//! `fleetctl upgrade DEVICE --release FILE [--retry]`: one device's
//! upgrade intent, written by compare-and-set with a new attempt UUID; and
//! [`plan`], the rule `upgrade` and `rollout` share for whether a device
//! gets a new attempt.
//!
//! The rule, in order: a device that never reported its info (so its
//! version and architecture are unknown) or whose updater is in
//! `rollback-failed` gets nothing (but see below); nor one that already runs the release;
//! `rollout` skips a frozen device (`upgrade` writes it anyway, and the
//! agent holds it until the unfreeze); a release without the device's
//! architecture gets nothing; when the current intent already carries this
//! very release (same version, artifact, sha256 and byte limit), nothing is
//! written while its attempt is under way, and a failed one is issued
//! again only with `--retry` (`docs/design/upgrade.md` "Intent": an
//! unchanged release that failed is not retried automatically). Otherwise a
//! new attempt is written.
//!
//! `rollback-failed` ends with a root repair on the device, which no one
//! reports to NATS: the status stays `rollback-failed` until the next
//! attempt. So `upgrade DEVICE --retry` — the operator naming the repaired
//! device and asking again — writes one; `rollout` never does. On a device
//! that is still quarantined the updater refuses it (`quarantined`), which
//! changes nothing.

use std::fmt;
use std::path::Path;

use fleet_common::contracts::{AgentUpgradeAttempt, Release, UpgradePhase, UpgradeReason};
use fleet_common::durable;
use fleet_common::limits::MAX_KV_VALUE_BYTES;
use fleet_common::subjects::{intent_key, BUCKET_CONTROL};
use fleet_common::validate::{Arch, AttemptUuid, DeviceId, Version};

use crate::error::CtlError;
use crate::fleet::{self, DeviceView, Keys, Scope};
use crate::js::{self, CasOutcome, CasWrite};

/// Whose rule: one device asked for by name, or the whole fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Device,
    Fleet,
}

/// Why a device gets no new attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    NoInfo,
    RollbackFailed {
        uuid: AttemptUuid,
    },
    Frozen,
    NoArtifact {
        arch: Arch,
    },
    UnderWay {
        uuid: AttemptUuid,
        phase: Option<UpgradePhase>,
    },
    Failed {
        uuid: AttemptUuid,
        reason: Option<UpgradeReason>,
    },
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoInfo => f.write_str("no device info: the device has never reported, so its version and architecture are unknown; start its agent first"),
            Self::RollbackFailed { uuid } => write!(f, "rollback-failed after attempt {uuid}: its updater refuses every attempt until root repair on the device; once it is repaired, fleetctl upgrade with --retry issues the next attempt"),
            Self::Frozen => f.write_str("frozen (changefreeze): the agent holds upgrades while frozen; roll out again after the unfreeze, or use fleetctl upgrade to queue it"),
            Self::NoArtifact { arch } => write!(f, "the release has no {arch} artifact: add one to the release file"),
            Self::UnderWay { uuid, phase } => match phase {
                Some(p) => write!(f, "attempt {uuid} of this release already issued ({p})"),
                None => write!(f, "attempt {uuid} of this release already issued (not picked up yet)"),
            },
            Self::Failed { uuid, reason } => {
                write!(f, "attempt {uuid} of this release failed")?;
                if let Some(r) = reason {
                    write!(f, " ({r})")?;
                }
                f.write_str(": re-run with --retry to issue it again")
            }
        }
    }
}

/// What a device gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Write(AgentUpgradeAttempt),
    UpToDate(Version),
    Skip(Skip),
}

/// The rule of the module documentation for device `d`; `uuid` names the
/// new attempt.
pub fn plan(d: &DeviceView, release: &Release, retry: bool, mode: Mode, uuid: AttemptUuid) -> Plan {
    let Some(info) = &d.info else {
        return Plan::Skip(Skip::NoInfo);
    };
    if let Some(s) = d
        .upgrade
        .as_ref()
        .filter(|s| s.phase == UpgradePhase::RollbackFailed)
    {
        // Only the operator naming the (repaired) device, asking again.
        if !(mode == Mode::Device && retry) {
            return Plan::Skip(Skip::RollbackFailed {
                uuid: s.attempt_uuid,
            });
        }
    }
    if info.agent_version == release.version {
        return Plan::UpToDate(info.agent_version.clone());
    }
    if mode == Mode::Fleet && info.config_state.state.is_frozen() {
        return Plan::Skip(Skip::Frozen);
    }
    let Some(attempt) = release.attempt(&d.id, info.arch, uuid) else {
        return Plan::Skip(Skip::NoArtifact { arch: info.arch });
    };
    if let Some(current) = d
        .intent
        .attempt
        .as_ref()
        .filter(|a| a.device_id == d.id && release.is_release_of(a))
    {
        let status = d
            .upgrade
            .as_ref()
            .filter(|s| s.attempt_uuid == current.uuid && s.attempt_digest == current.digest());
        match status.map(|s| (s.phase, s.reason)) {
            Some((UpgradePhase::Failed, reason)) if !retry => {
                return Plan::Skip(Skip::Failed {
                    uuid: current.uuid,
                    reason,
                })
            }
            Some((phase, _)) if phase.is_terminal() && retry => {}
            other => {
                return Plan::Skip(Skip::UnderWay {
                    uuid: current.uuid,
                    phase: other.map(|(p, _)| p),
                })
            }
        }
    }
    Plan::Write(attempt)
}

/// Reads and validates a release file.
pub fn read_release(path: &Path) -> Result<Release, CtlError> {
    let bytes = durable::read_bounded(path, MAX_KV_VALUE_BYTES as u64)
        .map_err(|e| CtlError::Input(format!("--release: {e}")))?;
    Release::from_json(&bytes)
        .map_err(|e| CtlError::Input(format!("--release {}: {e}", path.display())))
}

/// The CAS write of `attempt` over the intent last seen at `seq`.
pub fn cas_write(attempt: &AgentUpgradeAttempt, seq: u64) -> CasWrite {
    CasWrite {
        key: intent_key(&attempt.device_id),
        value: attempt.canonical_json(),
        expected_seq: seq,
    }
}

/// The line of a written attempt.
pub fn written_line(a: &AgentUpgradeAttempt, seq: u64) -> String {
    format!(
        "{}: wrote attempt {} ({} for {}, revision {seq})",
        a.device_id, a.uuid, a.target_version, a.arch
    )
}

/// `fleetctl upgrade`.
pub fn run(
    conn: &nats::Connection,
    device: &str,
    release: &Path,
    retry: bool,
) -> Result<String, CtlError> {
    let d = DeviceId::parse(device).map_err(|e| CtlError::Input(e.to_string()))?;
    let release = read_release(release)?;
    let views = fleet::read(conn, &Scope::Device(d.clone()), Keys::Upgrade)?;
    let view = views
        .get(&d)
        .cloned()
        .unwrap_or_else(|| DeviceView::new(d.clone()));
    match plan(
        &view,
        &release,
        retry,
        Mode::Device,
        AttemptUuid::new_random(),
    ) {
        Plan::UpToDate(v) => Ok(format!("{d}: up to date (runs {v}); nothing written\n")),
        Plan::Skip(s @ Skip::UnderWay { .. }) => Ok(format!("{d}: {s}; nothing written\n")),
        Plan::Skip(s) => Err(CtlError::Refused(format!("{d}: {s}; nothing written"))),
        Plan::Write(attempt) => {
            let outcome = js::cas_put_all(
                conn,
                BUCKET_CONTROL,
                &[cas_write(&attempt, view.intent.seq)],
            )?
            .pop()
            .unwrap_or_else(|| CasOutcome::Failed("no outcome".into()));
            match outcome {
                CasOutcome::Written { seq } => {
                    let mut line = written_line(&attempt, seq);
                    if view
                        .info
                        .as_ref()
                        .is_some_and(|i| i.config_state.state.is_frozen())
                    {
                        line.push_str("; the device is frozen: its agent forwards it after the unfreeze");
                    }
                    line.push('\n');
                    Ok(line)
                }
                CasOutcome::Conflict(why) => Err(CtlError::Conflict(format!(
                    "{d}: lost the race: another writer changed the intent since it was read ({why}); nothing written: run fleetctl upgrade again to see the attempt that won"
                ))),
                CasOutcome::Failed(why) => Err(CtlError::Nats {
                    what: format!("writing {BUCKET_CONTROL} {}", intent_key(&d)),
                    detail: why,
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Intent;
    use fleet_common::contracts::{
        ConfigState, ConfigStateReport, DeviceInfo, Freeze, UpgradeStatus,
    };
    use fleet_common::validate::{ArtifactUrl, BoundedText, MaxBytes, Sha256Hex};
    use fleet_common::Timestamp;

    fn release() -> Release {
        Release::from_json(
            br#"{"version":"2.0","artifacts":{"x86_64":{"artifact-url":"https://r.example.com/a","sha256":"5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef","max-bytes":1000}}}"#,
        )
        .expect("release")
    }

    fn device(version: &str, arch: Arch, frozen: bool) -> DeviceView {
        let id = DeviceId::parse("dev1").expect("id");
        let mut d = DeviceView::new(id.clone());
        d.info = Some(DeviceInfo {
            device_id: id,
            agent_version: Version::parse(version).expect("v"),
            arch,
            os: BoundedText::truncate("Debian"),
            kernel: BoundedText::truncate("6.1"),
            podman_version: None,
            boot_id: BoundedText::truncate("b"),
            config_state: ConfigStateReport {
                state: if frozen {
                    ConfigState::Changefreeze(Freeze {
                        since: Timestamp::from_unix_millis(0),
                        reason: None,
                        caller_uid: 0,
                    })
                } else {
                    ConfigState::Configured
                },
                waiting_changes: 0,
                intent_waiting: false,
            },
            agent_started_at: Timestamp::from_unix_millis(0),
            updated_at: Timestamp::from_unix_millis(0),
        });
        d
    }

    fn with_attempt(
        mut d: DeviceView,
        a: &AgentUpgradeAttempt,
        phase: Option<(UpgradePhase, Option<UpgradeReason>)>,
    ) -> DeviceView {
        d.intent = Intent {
            seq: 7,
            attempt: Some(a.clone()),
            present: true,
        };
        d.upgrade = phase.map(|(p, r)| {
            UpgradeStatus::begin(
                a.uuid,
                a.digest(),
                a.target_version.clone(),
                p,
                r,
                Timestamp::from_unix_millis(0),
            )
        });
        d
    }

    fn new_uuid() -> AttemptUuid {
        AttemptUuid::new_random()
    }

    #[test]
    fn a_device_on_another_version_gets_the_release_for_its_arch() {
        let uuid = new_uuid();
        match plan(
            &device("1.0", Arch::X86_64, false),
            &release(),
            false,
            Mode::Fleet,
            uuid,
        ) {
            Plan::Write(a) => {
                assert_eq!(a.uuid, uuid);
                assert_eq!(a.device_id.as_str(), "dev1");
                assert_eq!((a.arch, a.target_version.as_str()), (Arch::X86_64, "2.0"));
                assert!(release().is_release_of(&a));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn skip_rules() {
        let r = release();
        let u = new_uuid();
        let mut unknown = device("1.0", Arch::X86_64, false);
        unknown.info = None;
        assert_eq!(
            plan(&unknown, &r, false, Mode::Fleet, u),
            Plan::Skip(Skip::NoInfo)
        );
        assert_eq!(
            plan(
                &device("2.0", Arch::X86_64, false),
                &r,
                false,
                Mode::Fleet,
                u
            ),
            Plan::UpToDate(Version::parse("2.0").expect("v"))
        );
        assert_eq!(
            plan(
                &device("1.0", Arch::X86_64, true),
                &r,
                false,
                Mode::Fleet,
                u
            ),
            Plan::Skip(Skip::Frozen)
        );
        assert!(
            matches!(
                plan(
                    &device("1.0", Arch::X86_64, true),
                    &r,
                    false,
                    Mode::Device,
                    u
                ),
                Plan::Write(_)
            ),
            "upgrade of one frozen device queues it"
        );
        assert_eq!(
            plan(
                &device("1.0", Arch::Aarch64, false),
                &r,
                false,
                Mode::Fleet,
                u
            ),
            Plan::Skip(Skip::NoArtifact {
                arch: Arch::Aarch64
            })
        );
        // rollback-failed, whatever attempt it was.
        let old = AgentUpgradeAttempt {
            arch: Arch::X86_64,
            artifact_url: ArtifactUrl::parse("https://r.example.com/old").expect("url"),
            device_id: DeviceId::parse("dev1").expect("id"),
            max_bytes: MaxBytes::new(5).expect("m"),
            sha256: Sha256Hex::of(b"old"),
            target_version: Version::parse("1.5").expect("v"),
            uuid: new_uuid(),
        };
        let quarantined = with_attempt(
            device("1.0", Arch::X86_64, false),
            &old,
            Some((
                UpgradePhase::RollbackFailed,
                Some(UpgradeReason::RollbackFailed),
            )),
        );
        assert_eq!(
            plan(&quarantined, &r, true, Mode::Fleet, u),
            Plan::Skip(Skip::RollbackFailed { uuid: old.uuid })
        );
        assert_eq!(
            plan(&quarantined, &r, false, Mode::Device, u),
            Plan::Skip(Skip::RollbackFailed { uuid: old.uuid })
        );
        // After the root repair (NATS still says rollback-failed): the
        // operator names the device and asks again.
        assert!(matches!(
            plan(&quarantined, &r, true, Mode::Device, u),
            Plan::Write(a) if a.uuid == u
        ));
        // The very release that ended in rollback-failed, too.
        let same = release()
            .attempt(
                &DeviceId::parse("dev1").expect("id"),
                Arch::X86_64,
                new_uuid(),
            )
            .expect("x86_64");
        let quarantined_same = with_attempt(
            device("1.0", Arch::X86_64, false),
            &same,
            Some((
                UpgradePhase::RollbackFailed,
                Some(UpgradeReason::RollbackFailed),
            )),
        );
        assert!(matches!(
            plan(&quarantined_same, &r, true, Mode::Device, u),
            Plan::Write(a) if a.uuid == u
        ));
        // Another release that failed does not block this one.
        let other_failed = with_attempt(
            device("1.0", Arch::X86_64, false),
            &old,
            Some((UpgradePhase::Failed, Some(UpgradeReason::Probe))),
        );
        assert!(matches!(
            plan(&other_failed, &r, false, Mode::Fleet, u),
            Plan::Write(_)
        ));
    }

    #[test]
    fn an_unchanged_release_that_failed_needs_retry_and_one_under_way_is_left_alone() {
        let r = release();
        let id = DeviceId::parse("dev1").expect("id");
        let current = r.attempt(&id, Arch::X86_64, new_uuid()).expect("attempt");
        let failed = with_attempt(
            device("1.0", Arch::X86_64, false),
            &current,
            Some((UpgradePhase::Failed, Some(UpgradeReason::StartFailed))),
        );
        let u = new_uuid();
        let skip = plan(&failed, &r, false, Mode::Device, u);
        assert_eq!(
            skip,
            Plan::Skip(Skip::Failed {
                uuid: current.uuid,
                reason: Some(UpgradeReason::StartFailed)
            })
        );
        if let Plan::Skip(s) = skip {
            assert_eq!(
                s.to_string(),
                format!("attempt {} of this release failed (start-failed): re-run with --retry to issue it again", current.uuid)
            );
        }
        match plan(&failed, &r, true, Mode::Device, u) {
            Plan::Write(a) => assert_eq!(a.uuid, u, "--retry issues a new attempt"),
            other => panic!("{other:?}"),
        }
        for phase in [UpgradePhase::Preparing, UpgradePhase::Starting] {
            let busy = with_attempt(
                device("1.0", Arch::X86_64, false),
                &current,
                Some((phase, None)),
            );
            assert_eq!(
                plan(&busy, &r, true, Mode::Fleet, u),
                Plan::Skip(Skip::UnderWay {
                    uuid: current.uuid,
                    phase: Some(phase)
                })
            );
        }
        let unseen = with_attempt(device("1.0", Arch::X86_64, false), &current, None);
        assert_eq!(
            plan(&unseen, &r, false, Mode::Fleet, u),
            Plan::Skip(Skip::UnderWay {
                uuid: current.uuid,
                phase: None
            })
        );
        // Changed metadata (another sha256) is another release: written.
        let mut changed = current.clone();
        changed.sha256 = Sha256Hex::of(b"rebuilt");
        let changed = with_attempt(
            device("1.0", Arch::X86_64, false),
            &changed,
            Some((UpgradePhase::Failed, Some(UpgradeReason::Checksum))),
        );
        assert!(matches!(
            plan(&changed, &r, false, Mode::Fleet, u),
            Plan::Write(_)
        ));
    }
}
