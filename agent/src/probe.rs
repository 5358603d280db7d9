//! Probe mode, `fleet-agent --self-test`: the candidate check the updater runs
//! before a cutover (`docs/design/upgrade.md` "Preparation and probe"). In
//! order:
//!
//! | step | checks | exit code |
//! |---|---|---|
//! | `config` | the real configuration parses | 10 |
//! | `podman` | Podman answers (when enabled) | 11 |
//! | `nats-auth` | NATS accepts the device's credentials (with `oauth2-client-credentials`: a token of its own, fresh from the identity provider) | 12 |
//! | `buckets` | the device's `fleet-control` intent key answers a Direct Get | 13 |
//! | `device-keys` | the intent read is understood (what the agent would do with it) | 14 |
//! | `desired-read` | the device may subscribe to its republished keys, and its `fleet-workloads` document answers a Direct Get | 15 |
//! | `updater-socket` | the updater socket accepts a connection | 16 |
//! | `snapshot` | the document is a complete desired state (workloads counted, invalid ones named) | 17 |
//!
//! The reads are the agent's own read path (generation 2: no consumer;
//! this replaces the upgrade design's "creates a filtered desired-state
//! consumer", a decided deviation in `docs/design/upgrade.md` "What binds
//! us", whose purpose — authenticate, reach the keys, read a complete
//! snapshot — stays). It takes no lock, starts no loop, publishes no status
//! or heartbeat, creates nothing on the server and mutates no workload: the
//! live agent keeps running beside it. The whole probe is bounded by
//! [`PROBE_TIMEOUT`]; a step still running then fails as timed out. The
//! report ([`SelfTestReport`]) is one JSON line on stdout, carrying the
//! compiled version and one check per step run (the last one failed when
//! the exit code is not 0), each with how long it took.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_common::contracts::{AgentUpgradeAttempt, Bounded, SelfTestCheck, SelfTestReport};
use fleet_common::limits::{
    MAX_KV_VALUE_BYTES, NATS_CONNECT_WINDOW, NATS_REQUEST_TIMEOUT, PROBE_TIMEOUT,
};
use fleet_common::subjects::{
    device_read_keys, republish_subject, BUCKET_CONTROL, BUCKET_WORKLOADS, DESIRED_DOC_KEY,
    INTENT_KEY,
};
use fleet_common::validate::{BoundedText, Version};

use crate::config::{Config, PodmanMode};
use crate::desired::{decode_value, expand_document, DesiredEntry};
use crate::nats::{self, read_key, KeyRead, Nats, Reconnect};
use crate::podman::Podman;
use crate::shutdown::Shutdown;
use crate::threads;

/// The steps, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Config,
    Podman,
    NatsAuth,
    Buckets,
    DeviceKeys,
    DesiredRead,
    UpdaterSocket,
    Snapshot,
}

impl Step {
    pub const ALL: [Step; 8] = [
        Step::Config,
        Step::Podman,
        Step::NatsAuth,
        Step::Buckets,
        Step::DeviceKeys,
        Step::DesiredRead,
        Step::UpdaterSocket,
        Step::Snapshot,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::Podman => "podman",
            Self::NatsAuth => "nats-auth",
            Self::Buckets => "buckets",
            Self::DeviceKeys => "device-keys",
            Self::DesiredRead => "desired-read",
            Self::UpdaterSocket => "updater-socket",
            Self::Snapshot => "snapshot",
        }
    }

    /// The process exit code when this step fails.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Config => 10,
            Self::Podman => 11,
            Self::NatsAuth => 12,
            Self::Buckets => 13,
            Self::DeviceKeys => 14,
            Self::DesiredRead => 15,
            Self::UpdaterSocket => 16,
            Self::Snapshot => 17,
        }
    }
}

/// One finished step, as the worker reports it.
#[derive(Debug)]
struct Done {
    step: Step,
    result: Result<String, String>,
    took: Duration,
}

/// The probe's outcome: the report and the exit code naming the failed step.
#[derive(Debug)]
pub struct Outcome {
    pub report: SelfTestReport,
    pub exit_code: u8,
}

/// Runs the probe with the config at `config_path`, within [`PROBE_TIMEOUT`].
pub fn run(config_path: &Path, version: Version) -> Outcome {
    run_within(config_path, version, PROBE_TIMEOUT)
}

fn run_within(config_path: &Path, version: Version, limit: Duration) -> Outcome {
    let deadline = Instant::now() + limit;
    let (tx, rx) = mpsc::channel::<Done>();
    let path = config_path.to_owned();
    let worker = threads::spawn("agent-probe", move || steps(&path, &tx));
    let mut report = SelfTestReport {
        version,
        checks: Bounded::default(),
    };
    if let Err(e) = worker {
        return fail(
            report,
            Step::Config,
            format!("starting the probe thread: {e}"),
            Duration::ZERO,
        );
    }
    let mut started = Instant::now();
    for step in Step::ALL {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(done) => {
                debug_assert_eq!(done.step, step);
                started = Instant::now();
                match done.result {
                    Ok(detail) => report.checks.push(check(step, true, &detail, done.took)),
                    Err(e) => return fail(report, step, e, done.took),
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return fail(
                    report,
                    step,
                    format!("timed out: the probe is bounded to {} s", limit.as_secs()),
                    started.elapsed(),
                );
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return fail(
                    report,
                    step,
                    "the probe thread ended early".into(),
                    started.elapsed(),
                );
            }
        }
    }
    Outcome {
        report,
        exit_code: 0,
    }
}

fn check(step: Step, ok: bool, detail: &str, took: Duration) -> SelfTestCheck {
    SelfTestCheck {
        name: BoundedText::truncate(step.name()),
        ok,
        detail: Some(BoundedText::truncate(format!(
            "{detail} ({} ms)",
            took.as_millis()
        ))),
    }
}

fn fail(mut report: SelfTestReport, step: Step, error: String, took: Duration) -> Outcome {
    report.checks.push(check(step, false, &error, took));
    Outcome {
        report,
        exit_code: step.exit_code(),
    }
}

/// Runs the steps in order on the worker thread, reporting each; stops at
/// the first failure (or when nobody listens any more).
fn steps(config_path: &Path, tx: &mpsc::Sender<Done>) {
    let mut ctx = Ctx::default();
    for step in Step::ALL {
        let start = Instant::now();
        let result = ctx.step(step, config_path);
        let failed = result.is_err();
        if tx
            .send(Done {
                step,
                result,
                took: start.elapsed(),
            })
            .is_err()
            || failed
        {
            break;
        }
    }
    if let Some(n) = ctx.nats.take() {
        n.close();
    }
}

/// What earlier steps produced for later ones.
#[derive(Default)]
struct Ctx {
    config: Option<Config>,
    nats: Option<Arc<Nats>>,
    control: Option<KeyRead>,
    desired: Option<KeyRead>,
}

impl Ctx {
    fn step(&mut self, step: Step, config_path: &Path) -> Result<String, String> {
        let missing = || "an earlier step did not run".to_owned();
        match step {
            Step::Config => {
                let c = Config::load(config_path).map_err(|e| e.to_string())?;
                let detail = format!(
                    "device {}, {} NATS server(s), auth {}",
                    c.device_id,
                    c.nats.servers.len(),
                    c.nats.auth.method()
                );
                self.config = Some(c);
                Ok(detail)
            }
            Step::Podman => match &self.config.as_ref().ok_or_else(missing)?.podman {
                PodmanMode::Disabled => Ok("disabled in the config; not checked".into()),
                PodmanMode::Enabled(s) => Podman::new(s.clone())
                    .version()
                    .map(|v| format!("podman {v}"))
                    .map_err(|e| e.to_string()),
            },
            Step::NatsAuth => {
                let c = self.config.as_ref().ok_or_else(missing)?;
                let mut cfg = c.nats.clone();
                crate::enroll::use_identity(&mut cfg, &c.layout().agent_state_dir())
                    .map_err(|e| e.to_string())?;
                let n = nats::connect(
                    &cfg,
                    &c.device_id,
                    Reconnect::Once,
                    nats::Pings {
                        interval: c.intervals.ping,
                        max_out: c.intervals.max_pings_out,
                    },
                    NATS_CONNECT_WINDOW,
                    &Shutdown::new(),
                )
                .map_err(|e| e.to_string())?;
                let detail = format!("connected to {} as device {}", n.servers(), c.device_id);
                self.nats = Some(Arc::new(n));
                Ok(detail)
            }
            Step::Buckets => {
                let n = self.nats.as_ref().ok_or_else(missing)?;
                let read = read_key(n, BUCKET_CONTROL, INTENT_KEY).map_err(|e| e.to_string())?;
                let detail = format!(
                    "{BUCKET_CONTROL}: Direct Get of {}.{INTENT_KEY} answered (sequence {})",
                    n.device(),
                    read.seq
                );
                self.control = Some(read);
                Ok(detail)
            }
            Step::DeviceKeys => {
                let c = self.config.as_ref().ok_or_else(missing)?;
                let read = self.control.take().ok_or_else(missing)?;
                let intent = match &read.value {
                    None => "no upgrade intent".to_owned(),
                    Some(v) if v.len() > MAX_KV_VALUE_BYTES => {
                        "an upgrade intent too large to read (the agent would reject it)".into()
                    }
                    Some(v) => match serde_json::from_slice::<AgentUpgradeAttempt>(v) {
                        Ok(a) if a.device_id == c.device_id => {
                            format!("upgrade intent {} to {}", a.uuid, a.target_version)
                        }
                        Ok(a) => format!(
                            "an upgrade intent for another device ({}); the agent would reject it",
                            a.device_id
                        ),
                        Err(e) => {
                            format!("an invalid upgrade intent ({e}); the agent would reject it")
                        }
                    },
                };
                Ok(format!("{BUCKET_CONTROL}: {intent}"))
            }
            Step::DesiredRead => {
                let n = self.nats.as_ref().ok_or_else(missing)?;
                // The agent subscribes to its republished keys before
                // reading them: a candidate that may not is refused here.
                let mut subs = Vec::new();
                for (bucket, key) in device_read_keys(n.device()) {
                    let subject = republish_subject(bucket, &key);
                    let sub = n
                        .subscribe(&subject)
                        .map_err(|e| format!("subscribing to {subject}: {e}"))?;
                    subs.push(sub);
                }
                n.flush(NATS_REQUEST_TIMEOUT)
                    .map_err(|e| format!("flushing the subscriptions: {e}"))?;
                let read =
                    read_key(n, BUCKET_WORKLOADS, DESIRED_DOC_KEY).map_err(|e| e.to_string())?;
                if let Some(e) = n.take_server_error() {
                    return Err(format!(
                        "the server refused a subscription to this device's republished keys: {e}"
                    ));
                }
                drop(subs);
                let detail = format!(
                    "{BUCKET_WORKLOADS}: subscribed to the republished keys; Direct Get of {}.{DESIRED_DOC_KEY} answered (sequence {})",
                    n.device(),
                    read.seq
                );
                self.desired = Some(read);
                Ok(detail)
            }
            Step::UpdaterSocket => {
                let c = self.config.as_ref().ok_or_else(missing)?;
                let path: PathBuf = c.layout().updater_socket();
                UnixStream::connect(&path)
                    .map(|_| format!("{} accepts connections", path.display()))
                    .map_err(|e| {
                        format!(
                            "connecting to {}: {e}; check fleet-updater is running and this user is in its socket group",
                            path.display()
                        )
                    })
            }
            Step::Snapshot => {
                let read = self.desired.take().ok_or_else(missing)?;
                let seq = read.seq;
                let workloads = expand_document(read.value)?;
                let invalid = workloads
                    .values()
                    .filter(|v| matches!(decode_value(v), DesiredEntry::Invalid { .. }))
                    .count();
                Ok(format!(
                    "{BUCKET_WORKLOADS}: complete desired state at sequence {seq}: {} workloads ({invalid} invalid)",
                    workloads.len()
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct_and_a_bad_config_fails_the_first_step() {
        let mut codes: Vec<u8> = Step::ALL.iter().map(|s| s.exit_code()).collect();
        codes.dedup();
        assert_eq!(codes.len(), Step::ALL.len());
        let v = Version::parse("9.9.9").expect("version");
        let out = run_within(
            Path::new("/nonexistent/agent.json"),
            v.clone(),
            Duration::from_secs(10),
        );
        assert_eq!(out.exit_code, 10);
        assert_eq!(out.report.version, v);
        assert_eq!(out.report.checks.len(), 1);
        let failures = out.report.failures();
        assert_eq!(failures.len(), 1);
        assert!(
            failures[0].starts_with("config: reading config /nonexistent/agent.json"),
            "{failures:?}"
        );
    }
}
