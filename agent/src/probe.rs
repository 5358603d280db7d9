//! Probe mode, `fleet-agent --self-test`: the candidate check the updater
//! runs before a cutover (seed 002, "Preparation and probe"). In order:
//!
//! | step | checks | exit code |
//! |---|---|---|
//! | `config` | the real configuration parses | 10 |
//! | `podman` | Podman answers (when enabled) | 11 |
//! | `nats-auth` | NATS accepts the device's credentials (with `oauth2-client-credentials`: a token of its own, fresh from the identity provider) | 12 |
//! | `buckets` | a device-scoped consumer opens on `fleet-control` | 13 |
//! | `device-keys` | the device's `fleet-control` keys read completely | 14 |
//! | `desired-consumer` | the filtered `fleet-desired` consumer is created | 15 |
//! | `updater-socket` | the updater socket accepts a connection | 16 |
//! | `snapshot` | a complete desired-state snapshot is consumed | 17 |
//!
//! It takes no lock, starts no loop, publishes no status or heartbeat and
//! mutates no workload: the live agent keeps running beside it. Creating
//! the two ephemeral consumers is its only JetStream management operation;
//! they vanish after the inactive threshold. The whole probe is bounded by
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
    MAX_KV_VALUE_BYTES, MAX_WORKLOADS_PER_DEVICE, NATS_CONNECT_WINDOW, PROBE_TIMEOUT,
};
use fleet_common::subjects::{BUCKET_CONTROL, BUCKET_DESIRED, INTENT_KEY};
use fleet_common::validate::{BoundedText, Version};

use crate::config::{Config, PodmanMode};
use crate::desired::{decode_value, DesiredEntry};
use crate::nats::{self, KvConsumer, Nats, Reconnect};
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
    DesiredConsumer,
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
        Step::DesiredConsumer,
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
            Self::DesiredConsumer => "desired-consumer",
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
            Self::DesiredConsumer => 15,
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
    control: Option<KvConsumer>,
    desired: Option<KvConsumer>,
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
                let n = nats::connect(
                    &c.nats,
                    &c.device_id,
                    Reconnect::Once,
                    NATS_CONNECT_WINDOW,
                    &Shutdown::new(),
                )
                .map_err(|e| e.to_string())?;
                let detail = format!("connected to {} as device {}", n.servers(), c.device_id);
                self.nats = Some(Arc::new(n));
                Ok(detail)
            }
            Step::Buckets => {
                let c = self.config.as_ref().ok_or_else(missing)?;
                let n = self.nats.as_ref().ok_or_else(missing)?;
                let consumer = KvConsumer::create(n, BUCKET_CONTROL, c.intervals.idle_heartbeat)
                    .map_err(|e| e.to_string())?;
                let detail = format!(
                    "{BUCKET_CONTROL}: device-scoped consumer created, {} keys pending",
                    consumer.initial_pending()
                );
                self.control = Some(consumer);
                Ok(detail)
            }
            Step::DeviceKeys => {
                let c = self.config.as_ref().ok_or_else(missing)?;
                let consumer = self.control.as_mut().ok_or_else(missing)?;
                let snap = consumer
                    .read_snapshot(MAX_WORKLOADS_PER_DEVICE, &mut || None)
                    .map_err(|e| e.to_string())?;
                let intent = match snap.keys.get(INTENT_KEY) {
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
                self.control = None;
                Ok(format!(
                    "{BUCKET_CONTROL}: {} keys read; {intent}",
                    snap.keys.len()
                ))
            }
            Step::DesiredConsumer => {
                let c = self.config.as_ref().ok_or_else(missing)?;
                let n = self.nats.as_ref().ok_or_else(missing)?;
                let consumer = KvConsumer::create(n, BUCKET_DESIRED, c.intervals.idle_heartbeat)
                    .map_err(|e| e.to_string())?;
                let detail = format!(
                    "{BUCKET_DESIRED}: filtered consumer created, {} keys pending",
                    consumer.initial_pending()
                );
                self.desired = Some(consumer);
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
                let consumer = self.desired.as_mut().ok_or_else(missing)?;
                let snap = consumer
                    .read_snapshot(MAX_WORKLOADS_PER_DEVICE, &mut || None)
                    .map_err(|e| e.to_string())?;
                let invalid = snap
                    .keys
                    .values()
                    .filter(|v| matches!(decode_value(v), DesiredEntry::Invalid { .. }))
                    .count();
                Ok(format!(
                    "{BUCKET_DESIRED}: complete snapshot of {} workloads ({invalid} invalid, {} over the limit)",
                    snap.keys.len(),
                    snap.dropped
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
