//! The Podman driver: every call is the `podman` CLI with JSON output, run
//! through [`run_bounded`] with a timeout (pulls: the pull timeout), with
//! the configured global arguments and `CONTAINERS_CONF`.
//!
//! Managed containers are named `fleet-<workload>` and carry four labels:
//! [`LABEL_MANAGED_BY`], [`LABEL_DEVICE`], [`LABEL_WORKLOAD`] and
//! [`LABEL_SPEC_HASH`]. [`Podman::list_managed`] returns only containers
//! carrying both our managed-by label and this device's label; nothing else
//! is ever passed to a mutating call.

use std::collections::BTreeMap;
use std::fmt;
use std::process::Command;
use std::time::Duration;

use fleet_common::contracts::{ImageRef, PullPolicy, RestartPolicy, WorkloadSpec};
use fleet_common::process::{
    bounded_text, describe_status, run_bounded_split, Output, ProcessError, MAX_DIAGNOSTIC_BYTES,
};
use fleet_common::validate::{DeviceId, WorkloadName};
use serde::Deserialize;

use crate::config::PodmanSettings;

pub const LABEL_MANAGED_BY: &str = "io.harmony.fleet.managed-by";
pub const LABEL_DEVICE: &str = "io.harmony.fleet.device";
pub const LABEL_WORKLOAD: &str = "io.harmony.fleet.workload";
pub const LABEL_SPEC_HASH: &str = "io.harmony.fleet.spec-hash";
/// The value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "fleet-agent";
/// Container name prefix.
pub const NAME_PREFIX: &str = "fleet-";

/// Stdout kept from one podman call; more is refused whole, never parsed
/// cut. `ps` of 20 managed containers (one port, one env, Podman 4.3.1)
/// printed 22,716 bytes, ~1.1 KiB each, so [`MAX_WORKLOADS_PER_DEVICE`] of
/// them fit with room for bigger specs (`ps` lists only this device's).
/// Small so that a burst of output costs little memory: the buffer is at
/// most this, and freed after the call.
///
/// [`MAX_WORKLOADS_PER_DEVICE`]: fleet_common::limits::MAX_WORKLOADS_PER_DEVICE
pub const MAX_STDOUT_BYTES: usize = 512 * 1024;
/// Stderr kept from one podman call: the last bytes, where the cause is.
pub const MAX_STDERR_BYTES: usize = 16 * 1024;
/// Seconds podman waits after SIGTERM before SIGKILL when removing a
/// container (podman's own default).
pub const STOP_TIMEOUT_SECS: u32 = 10;

/// The container name of a workload.
pub fn container_name(w: &WorkloadName) -> String {
    format!("{NAME_PREFIX}{w}")
}

/// The name of a `start-first` workload's new container while the old one
/// (named [`container_name`]) still runs: the spec hash's first 12 digits
/// appended. Labels, never names, say which spec a container runs.
pub fn container_name_beside(w: &WorkloadName, spec_hash: &str) -> String {
    let short: String = spec_hash.chars().take(12).collect();
    format!("{NAME_PREFIX}{w}-{short}")
}

/// A podman call that failed.
#[derive(Debug)]
pub enum PodmanError {
    Run {
        what: String,
        source: ProcessError,
    },
    Failed {
        what: String,
        status: String,
        stderr: String,
    },
    Parse {
        what: String,
        detail: String,
    },
    /// Still running after `after` (the caller stopped waiting; the call
    /// goes on, bounded by the command timeout).
    Silent {
        what: String,
        after: Duration,
    },
}

impl fmt::Display for PodmanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Run { what, source } => write!(f, "podman {what}: {source}"),
            Self::Failed {
                what,
                status,
                stderr,
            } => write!(f, "podman {what} failed ({status}): {stderr}"),
            Self::Parse { what, detail } => {
                write!(f, "podman {what} printed unexpected output: {detail}")
            }
            Self::Silent { what, after } => write!(
                f,
                "podman {what} has not answered within {} s: check Podman (`podman ps` as the agent's user) and its storage",
                after.as_secs()
            ),
        }
    }
}

impl std::error::Error for PodmanError {}

/// The state of a live container, as podman reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveState {
    Running,
    /// Paused by someone: left alone, counted as up.
    Paused,
    /// Exited, created but never started, stopped: to be restored.
    Down(String),
}

/// A container carrying our managed-by and device labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveContainer {
    pub id: String,
    pub name: String,
    pub state: LiveState,
    pub image: String,
    /// The workload label, when it is a valid workload name.
    pub workload: Option<WorkloadName>,
    pub spec_hash: Option<String>,
    /// Unix seconds; 0 when never started.
    pub started_at: i64,
    /// The container's main process as the host sees it; 0 when none.
    pub pid: u32,
}

impl LiveContainer {
    pub fn short_id(&self) -> String {
        self.id.chars().take(12).collect()
    }

    /// The main process of a running or paused container, identified.
    pub fn main_process(&self) -> Option<ProcessIdentity> {
        match self.state {
            LiveState::Running | LiveState::Paused if self.pid > 0 => ProcessIdentity::of(self.pid),
            _ => None,
        }
    }
}

/// A process, told apart from a later one that reuses its pid by its start
/// time (clock ticks after boot, field 22 of `/proc/<pid>/stat`). Checking
/// one is a read of procfs, where asking Podman costs a process start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessIdentity {
    pid: u32,
    start_ticks: u64,
}

impl ProcessIdentity {
    pub fn of(pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let start_ticks = parse_start_ticks(&stat)?;
        Some(Self { pid, start_ticks })
    }

    /// The same process still exists (a zombie counts as gone).
    pub fn is_alive(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .filter(|stat| process_state(stat) != Some('Z'))
            .and_then(|stat| parse_start_ticks(&stat))
            == Some(self.start_ticks)
    }
}

/// Fields of `/proc/<pid>/stat` after the command name, which may contain
/// spaces and parentheses: index 0 is field 3 (state).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(
        stat.get(stat.rfind(')')? + 1..)?
            .split_whitespace()
            .collect(),
    )
}

fn process_state(stat: &str) -> Option<char> {
    stat_fields(stat)?.first()?.chars().next()
}

fn parse_start_ticks(stat: &str) -> Option<u64> {
    stat_fields(stat)?.get(19)?.parse().ok()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct PsEntry {
    id: String,
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    state: String,
    #[serde(default)]
    image: String,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    started_at: i64,
    #[serde(default)]
    pid: i64,
}

/// Characters of a container name kept from `ps` (ours are
/// `fleet-<workload>`); a longer one is cut, for log lines.
const MAX_NAME_BYTES: usize = 128;

/// A container id as Podman prints it: 1 to 64 hex digits. Ids are passed
/// to `start` and `rm`, so anything else (an option, a name of another
/// container) is refused.
fn is_container_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Keeps the entries of `ps --format json` that carry our managed-by label
/// and `device`'s label; everything else is not ours to touch. An entry of
/// ours whose id is not a container id makes the whole output suspect: an
/// error, so that nothing is changed on its word.
pub fn parse_ps(json: &[u8], device: &DeviceId) -> Result<Vec<LiveContainer>, String> {
    let entries: Vec<PsEntry> = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for e in entries {
        let labels = e.labels.unwrap_or_default();
        if labels.get(LABEL_MANAGED_BY).map(String::as_str) != Some(MANAGED_BY)
            || labels.get(LABEL_DEVICE).map(String::as_str) != Some(device.as_str())
        {
            continue;
        }
        if !is_container_id(&e.id) {
            return Err(format!(
                "a container labelled for this device has the id {:?}, not a container id",
                bounded_text(e.id.as_bytes(), 80)
            ));
        }
        let state = match e.state.as_str() {
            "running" => LiveState::Running,
            "paused" => LiveState::Paused,
            other => LiveState::Down(other.to_owned()),
        };
        out.push(LiveContainer {
            name: e
                .names
                .into_iter()
                .next()
                .map(|n| bounded_text(n.as_bytes(), MAX_NAME_BYTES))
                .unwrap_or_default(),
            id: e.id,
            state,
            image: e.image,
            workload: labels
                .get(LABEL_WORKLOAD)
                .and_then(|w| WorkloadName::parse(w).ok()),
            spec_hash: labels.get(LABEL_SPEC_HASH).cloned(),
            started_at: e.started_at,
            pid: u32::try_from(e.pid).unwrap_or(0),
        });
    }
    Ok(out)
}

/// The arguments of `podman run` for one workload (after global args).
pub fn run_args(
    device: &DeviceId,
    workload: &WorkloadName,
    spec: &WorkloadSpec,
    name: &str,
) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "run".into(),
        "--detach".into(),
        "--pull=never".into(),
        format!("--name={name}"),
        format!("--label={LABEL_MANAGED_BY}={MANAGED_BY}"),
        format!("--label={LABEL_DEVICE}={device}"),
        format!("--label={LABEL_WORKLOAD}={workload}"),
        format!("--label={LABEL_SPEC_HASH}={}", spec.spec_hash()),
        format!(
            "--restart={}",
            match spec.restart {
                RestartPolicy::Always => "always",
                RestartPolicy::OnFailure => "on-failure",
                RestartPolicy::No => "no",
            }
        ),
    ];
    for (k, v) in &spec.env {
        a.push(format!("--env={k}={v}"));
    }
    for p in &spec.ports {
        let proto = match p.protocol {
            fleet_common::contracts::Protocol::Tcp => "tcp",
            fleet_common::contracts::Protocol::Udp => "udp",
        };
        a.push(format!("--publish={}:{}/{proto}", p.host, p.container));
    }
    for v in &spec.volumes {
        let ro = if v.read_only { ":ro" } else { "" };
        a.push(format!("--volume={}:{}{ro}", v.source, v.target));
    }
    if let Some(m) = spec.memory_bytes {
        a.push(format!("--memory={m}"));
    }
    // Everything after the image is the container's command, never options.
    a.push(spec.image.as_str().to_owned());
    a.extend(spec.command.iter().cloned());
    a
}

/// The podman CLI as configured.
#[derive(Debug, Clone)]
pub struct Podman {
    settings: PodmanSettings,
}

impl Podman {
    pub fn new(settings: PodmanSettings) -> Self {
        Self { settings }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.settings.binary);
        c.args(&self.settings.global_args);
        if let Some(conf) = &self.settings.containers_conf {
            c.env("CONTAINERS_CONF", conf);
        }
        c
    }

    /// Runs `podman <args>` with output bounded ([`MAX_STDOUT_BYTES`],
    /// [`MAX_STDERR_BYTES`]); `what` names the call in errors.
    fn invoke(&self, what: &str, args: &[&str], timeout: Duration) -> Result<Output, PodmanError> {
        let mut c = self.command();
        c.args(args);
        run_bounded_split(&mut c, timeout, MAX_STDOUT_BYTES, MAX_STDERR_BYTES).map_err(|source| {
            PodmanError::Run {
                what: what.to_owned(),
                source,
            }
        })
    }

    /// Runs `podman <args>`, which must succeed; returns its whole stdout.
    fn call(&self, what: &str, args: &[&str], timeout: Duration) -> Result<Vec<u8>, PodmanError> {
        let out = self.invoke(what, args, timeout)?;
        if !out.success() {
            return Err(PodmanError::Failed {
                what: what.to_owned(),
                status: describe_status(out.status),
                stderr: out.diagnostic(),
            });
        }
        if out.stdout_cut > 0 {
            return Err(PodmanError::Parse {
                what: what.to_owned(),
                detail: format!(
                    "{} bytes, more than the {MAX_STDOUT_BYTES} read; not used",
                    out.stdout.len() as u64 + out.stdout_cut
                ),
            });
        }
        Ok(out.stdout)
    }

    /// `podman version`: the client version; proves podman runs.
    pub fn version(&self) -> Result<String, PodmanError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Client {
            version: String,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct V {
            client: Client,
        }
        let out = self.call(
            "version",
            &["version", "--format", "json"],
            self.settings.command_timeout,
        )?;
        let v: V = serde_json::from_slice(&out).map_err(|e| PodmanError::Parse {
            what: "version".into(),
            detail: bounded_text(e.to_string().as_bytes(), MAX_DIAGNOSTIC_BYTES),
        })?;
        Ok(v.client.version)
    }

    /// Every container of this device managed by the agent.
    pub fn list_managed(&self, device: &DeviceId) -> Result<Vec<LiveContainer>, PodmanError> {
        // Both labels (podman ANDs label filters); parse_ps checks again.
        let managed = format!("label={LABEL_MANAGED_BY}={MANAGED_BY}");
        let mine = format!("label={LABEL_DEVICE}={device}");
        let out = self.call(
            "ps",
            &[
                "ps", "--all", "--filter", &managed, "--filter", &mine, "--format", "json",
            ],
            self.settings.command_timeout,
        )?;
        parse_ps(&out, device).map_err(|detail| PodmanError::Parse {
            what: "ps".into(),
            detail: bounded_text(detail.as_bytes(), MAX_DIAGNOSTIC_BYTES),
        })
    }

    /// Whether `image` is in local storage.
    pub fn image_exists(&self, image: &ImageRef) -> Result<bool, PodmanError> {
        let out = self.invoke(
            "image exists",
            &["image", "exists", image.as_str()],
            self.settings.command_timeout,
        )?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(PodmanError::Failed {
                what: format!("image exists {image}"),
                status: describe_status(out.status),
                stderr: out.diagnostic(),
            }),
        }
    }

    /// Whether the pull policy calls for a pull of `image` now; an error
    /// when it is not local and the policy forbids pulling.
    pub fn needs_pull(&self, image: &ImageRef, policy: PullPolicy) -> Result<bool, PodmanError> {
        match policy {
            PullPolicy::Always => Ok(true),
            PullPolicy::Missing => Ok(!self.image_exists(image)?),
            PullPolicy::Never => {
                if self.image_exists(image)? {
                    Ok(false)
                } else {
                    Err(PodmanError::Failed {
                        what: format!("image {image}"),
                        status: "not local".into(),
                        stderr: "the spec says pull: never and the image is not in local storage"
                            .into(),
                    })
                }
            }
        }
    }

    /// Pulls `image`, bounded by the pull timeout.
    pub fn pull(&self, image: &ImageRef) -> Result<(), PodmanError> {
        self.call(
            &format!("pull {image}"),
            &["pull", "--quiet", image.as_str()],
            self.settings.pull_timeout,
        )
        .map(drop)
    }

    /// Creates and starts the workload's container named `name`; returns
    /// its id.
    pub fn run(
        &self,
        device: &DeviceId,
        workload: &WorkloadName,
        spec: &WorkloadSpec,
        name: &str,
    ) -> Result<String, PodmanError> {
        let args = run_args(device, workload, spec, name);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.call(&format!("run {name}"), &args, self.settings.command_timeout)?;
        Ok(String::from_utf8_lossy(&out).trim().to_owned())
    }

    /// `podman exec <id> <command>` for a health probe: killed (its process
    /// group) at `timeout`, at most `max_output` bytes of each of stdout
    /// and stderr kept. The caller reads the exit status.
    pub fn exec_probe(
        &self,
        container_id: &str,
        command: &[String],
        timeout: Duration,
        max_output: usize,
    ) -> Result<Output, ProcessError> {
        let mut c = self.command();
        // The id is one podman printed (parse_ps checks it is hex); the
        // command follows it, never read as options.
        c.arg("exec").arg(container_id).args(command);
        run_bounded_split(&mut c, timeout, max_output, max_output)
    }

    /// Starts an existing (exited) container.
    pub fn start(&self, c: &LiveContainer) -> Result<(), PodmanError> {
        self.call(
            &format!("start {}", c.name),
            &["start", &c.id],
            self.settings.command_timeout,
        )
        .map(drop)
    }

    /// Stops (SIGTERM, then SIGKILL after [`STOP_TIMEOUT_SECS`]) and removes
    /// a container.
    pub fn remove(&self, c: &LiveContainer) -> Result<(), PodmanError> {
        let t = STOP_TIMEOUT_SECS.to_string();
        self.call(
            &format!("rm {}", c.name),
            &["rm", "--force", "--time", &t, &c.id],
            self.settings.command_timeout + Duration::from_secs(u64::from(STOP_TIMEOUT_SECS)),
        )
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> DeviceId {
        DeviceId::parse("dev1").expect("device")
    }

    #[test]
    fn ps_keeps_only_this_devices_managed_containers() {
        let json = br#"[
          {"Id":"aaaaaaaaaaaaaaaa","Names":["fleet-web"],"State":"running","Image":"localhost/web:1",
           "Labels":{"io.harmony.fleet.managed-by":"fleet-agent","io.harmony.fleet.device":"dev1",
                     "io.harmony.fleet.workload":"web","io.harmony.fleet.spec-hash":"abc"},"StartedAt":1795960941,"Pid":4242,
           "Command":["x"],"Exited":false},
          {"Id":"bbbb","Names":["fleet-db"],"State":"exited","Image":"db",
           "Labels":{"io.harmony.fleet.managed-by":"fleet-agent","io.harmony.fleet.device":"dev2",
                     "io.harmony.fleet.workload":"db"}},
          {"Id":"cccc","Names":["mine"],"State":"running","Image":"x","Labels":null},
          {"Id":"dddd","Names":["fleet-x"],"State":"exited","Image":"x",
           "Labels":{"io.harmony.fleet.device":"dev1","io.harmony.fleet.workload":"x"}},
          {"Id":"eeee","Names":["fleet-Bad"],"State":"created","Image":"x",
           "Labels":{"io.harmony.fleet.managed-by":"fleet-agent","io.harmony.fleet.device":"dev1",
                     "io.harmony.fleet.workload":"Bad"}}
        ]"#;
        let live = parse_ps(json, &dev()).expect("parse");
        assert_eq!(live.len(), 2, "{live:?}");
        assert_eq!(live[0].name, "fleet-web");
        assert_eq!(live[0].state, LiveState::Running);
        assert_eq!(live[0].workload.as_ref().map(|w| w.as_str()), Some("web"));
        assert_eq!(live[0].spec_hash.as_deref(), Some("abc"));
        assert_eq!(live[0].short_id(), "aaaaaaaaaaaa");
        assert_eq!(live[0].pid, 4242);
        assert_eq!(live[1].pid, 0);
        assert_eq!(live[1].state, LiveState::Down("created".into()));
        assert_eq!(
            live[1].workload, None,
            "an invalid workload label is no workload"
        );
        assert!(parse_ps(b"[]", &dev()).expect("empty").is_empty());
        // Ours with an id that is an option, or a long escaped name.
        let lying = br#"[{"Id":"--all","Names":["fleet-web"],"State":"exited",
           "Labels":{"io.harmony.fleet.managed-by":"fleet-agent","io.harmony.fleet.device":"dev1"}}]"#;
        assert_eq!(
            parse_ps(lying, &dev()).expect_err("refused"),
            r#"a container labelled for this device has the id "--all", not a container id"#
        );
        let long = format!(
            r#"[{{"Id":"abc123","Names":["fleet-\u001b{}"],"State":"running",
               "Labels":{{"io.harmony.fleet.managed-by":"fleet-agent","io.harmony.fleet.device":"dev1"}}}}]"#,
            "x".repeat(1000)
        );
        let live = parse_ps(long.as_bytes(), &dev()).expect("parsed");
        assert_eq!(
            live[0].name,
            format!("fleet-\\u{{1b}}{}… [884 more bytes cut]", "x".repeat(116))
        );
        assert!(parse_ps(b"{", &dev()).is_err());
    }

    #[test]
    fn a_process_is_known_by_its_pid_and_start_time() {
        let stat = "4242 (sleep (x) y) S 1 4242 4242 0 -1 4194560 95 0 0 0 0 0 0 0 20 0 1 0 123456 2400000 200";
        assert_eq!(parse_start_ticks(stat), Some(123456));
        assert_eq!(process_state(stat), Some('S'));
        assert_eq!(parse_start_ticks("4242 (x) S 1"), None);
        let me = ProcessIdentity::of(std::process::id()).expect("this process");
        assert!(me.is_alive());
        let reused = ProcessIdentity {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        assert!(!reused.is_alive(), "another process with the same pid");
        let mut child = std::process::Command::new("true").spawn().expect("true");
        let pid = child.id();
        let gone = ProcessIdentity::of(pid);
        child.wait().expect("reaped");
        if let Some(gone) = gone {
            assert!(!gone.is_alive());
        }
        let running = LiveContainer {
            id: "a".into(),
            name: "fleet-web".into(),
            state: LiveState::Running,
            image: "img".into(),
            workload: None,
            spec_hash: None,
            started_at: 0,
            pid: std::process::id(),
        };
        assert_eq!(running.main_process(), Some(me));
        let exited = LiveContainer {
            state: LiveState::Down("exited".into()),
            ..running.clone()
        };
        assert_eq!(exited.main_process(), None);
        let no_pid = LiveContainer { pid: 0, ..running };
        assert_eq!(no_pid.main_process(), None);
    }

    #[test]
    fn run_arguments_put_the_command_after_the_image() {
        let spec = WorkloadSpec::from_json(
            br#"{"image":"localhost/web:1","command":["--not-an-option","x"],"env":{"A":"1"},
                 "ports":[{"host":8080,"container":80}],"volumes":[{"source":"data","target":"/d","read-only":true}],
                 "restart":"on-failure","memory-bytes":1048576}"#,
        )
        .expect("spec");
        let w = WorkloadName::parse("web").expect("name");
        let a = run_args(&dev(), &w, &spec, &container_name(&w));
        let hash = spec.spec_hash();
        assert_eq!(
            a,
            vec![
                "run".to_owned(),
                "--detach".into(),
                "--pull=never".into(),
                "--name=fleet-web".into(),
                "--label=io.harmony.fleet.managed-by=fleet-agent".into(),
                "--label=io.harmony.fleet.device=dev1".into(),
                "--label=io.harmony.fleet.workload=web".into(),
                format!("--label=io.harmony.fleet.spec-hash={hash}"),
                "--restart=on-failure".into(),
                "--env=A=1".into(),
                "--publish=8080:80/tcp".into(),
                "--volume=data:/d:ro".into(),
                "--memory=1048576".into(),
                "localhost/web:1".into(),
                "--not-an-option".into(),
                "x".into(),
            ]
        );
    }
}
