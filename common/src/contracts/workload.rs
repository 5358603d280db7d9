//! Workloads: the desired `WorkloadSpec` an operator puts in a device's
//! document at `fleet-workloads` `<device>.desired` (and, for agents 0.1.0,
//! at `fleet-desired` `<device>.<workload>`), and the observed state a
//! device reports at `fleet-status` `<device>.workloads`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::contracts::health::{HealthCheck, UpdateStrategy};
use crate::contracts::spec_error::SpecError;
use crate::contracts::PodmanUnreachable;
use crate::time::Timestamp;
use crate::validate::{BoundedText, Sha256Hex, Version, WorkloadName};

/// A container image reference as Podman takes it
/// (`registry/repo:tag`, `repo@sha256:...`, `localhost/name:tag`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ImageRef(String);

impl ImageRef {
    pub const MAX_CHARS: usize = 512;
    pub fn parse(v: &str) -> Result<Self, SpecError> {
        let ok = !v.is_empty()
            && v.len() <= Self::MAX_CHARS
            && !v.starts_with('-')
            && v.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/' | b':' | b'@')
            });
        if ok {
            Ok(Self(v.to_owned()))
        } else {
            Err(SpecError::Image(v.chars().take(80).collect()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for ImageRef {
    type Error = SpecError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<ImageRef> for String {
    fn from(v: ImageRef) -> String {
        v.0
    }
}

/// What Podman does when the container's process exits. The reconciler also
/// restores containers that are missing or exited whatever the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    #[default]
    Always,
    OnFailure,
    No,
}

/// When the image is pulled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PullPolicy {
    /// Pull only when the image is not in local storage.
    #[default]
    Missing,
    /// Pull on every (re)creation.
    Always,
    /// Never pull: the image must already be local.
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

/// A published port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct PortMapping {
    pub host: u16,
    pub container: u16,
    #[serde(default)]
    pub protocol: Protocol,
}

/// A mount: a named volume or an absolute host path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct VolumeMount {
    pub source: String,
    pub target: String,
    #[serde(default)]
    pub read_only: bool,
}

/// The desired state of one workload: one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct WorkloadSpec {
    pub image: ImageRef,
    /// Replaces the image's command when not empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortMapping>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    #[serde(default)]
    pub restart: RestartPolicy,
    #[serde(default)]
    pub pull: PullPolicy,
    /// Memory limit in bytes (`podman --memory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// How the agent decides the container serves (agent 0.3.0 and later:
    /// [`SPEC_FIELDS_SINCE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthCheck>,
    /// How a changed spec replaces the running container (agent 0.3.0 and
    /// later).
    #[serde(default, skip_serializing_if = "UpdateStrategy::is_default")]
    pub update_strategy: UpdateStrategy,
}

/// The optional spec fields not every agent in the field reads, each with
/// the first agent version that does. An older agent refuses a spec that
/// carries one as invalid (every version reads specs with
/// `deny_unknown_fields`) and keeps its running container, so fleetctl
/// never writes such a spec to an older device
/// ([`WorkloadSpec::needs_agent`]). A field is added here when it is added
/// to [`WorkloadSpec`]; it leaves only when no supported agent predates it.
pub const SPEC_FIELDS_SINCE: &[(&str, &str)] = &[("health", "0.3.0"), ("update-strategy", "0.3.0")];

impl WorkloadSpec {
    pub const MAX_ARGS: usize = 64;
    pub const MAX_ENV: usize = 128;
    pub const MAX_PORTS: usize = 32;
    pub const MAX_VOLUMES: usize = 32;
    pub const MAX_ARG_CHARS: usize = 4096;

    /// Parses and validates a KV value. Every refusal names the field.
    pub fn from_json(bytes: &[u8]) -> Result<Self, SpecParseError> {
        let spec: Self = serde_json::from_slice(bytes).map_err(SpecParseError::Json)?;
        spec.validate().map_err(SpecParseError::Spec)?;
        Ok(spec)
    }

    /// Checks what serde cannot: sizes, names, paths.
    pub fn validate(&self) -> Result<(), SpecError> {
        let too_many = |what, max| SpecError::TooMany { what, max };
        if self.command.len() > Self::MAX_ARGS {
            return Err(too_many("command arguments", Self::MAX_ARGS));
        }
        for arg in &self.command {
            check_arg("command argument", arg)?;
        }
        if self.env.len() > Self::MAX_ENV {
            return Err(too_many("environment variables", Self::MAX_ENV));
        }
        for (k, v) in &self.env {
            let ok = k
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && k.len() <= 256
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !ok {
                return Err(SpecError::EnvName(k.chars().take(80).collect()));
            }
            check_arg("environment value", v)?;
        }
        if self.ports.len() > Self::MAX_PORTS {
            return Err(too_many("ports", Self::MAX_PORTS));
        }
        for p in &self.ports {
            if p.host == 0 || p.container == 0 {
                return Err(SpecError::Port {
                    why: "ports are 1 to 65535",
                });
            }
        }
        if self.volumes.len() > Self::MAX_VOLUMES {
            return Err(too_many("volumes", Self::MAX_VOLUMES));
        }
        for v in &self.volumes {
            let named = v
                .source
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                && v.source.len() <= 128
                && v.source.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
                });
            if !(named || safe_abs_path(&v.source)) || !safe_abs_path(&v.target) {
                return Err(SpecError::Volume(format!("{}:{}", v.source, v.target)));
            }
        }
        if self.memory_bytes == Some(0) {
            return Err(SpecError::Arg {
                what: "memory-bytes",
                why: "use a positive number of bytes or leave it out",
            });
        }
        if let Some(h) = &self.health {
            let tcp: Vec<u16> = self
                .ports
                .iter()
                .filter(|p| p.protocol == Protocol::Tcp)
                .map(|p| p.host)
                .collect();
            h.validate(&tcp)?;
        }
        if self.update_strategy == UpdateStrategy::StartFirst && !self.ports.is_empty() {
            return Err(SpecError::Strategy {
                why: "start-first runs the new container beside the old one, so it is only for workloads without host ports; use stop-first",
            });
        }
        Ok(())
    }

    /// The optional fields this spec uses that not every agent reads, with
    /// the first agent version that reads each ([`SPEC_FIELDS_SINCE`]).
    pub fn versioned_fields(&self) -> Vec<(&'static str, &'static str)> {
        SPEC_FIELDS_SINCE
            .iter()
            .copied()
            .filter(|(field, _)| match *field {
                "health" => self.health.is_some(),
                "update-strategy" => !self.update_strategy.is_default(),
                _ => false,
            })
            .collect()
    }

    /// Whether an agent of `version` reads this spec; otherwise the first
    /// field it would refuse and the version that field needs. A version
    /// that does not read as `MAJOR.MINOR.PATCH...` is taken as too old.
    pub fn needs_agent(&self, version: &Version) -> Result<(), (&'static str, &'static str)> {
        for (field, since) in self.versioned_fields() {
            if !version.is_at_least(since) {
                return Err((field, since));
            }
        }
        Ok(())
    }

    /// SHA-256 over the canonical JSON (fields in declaration order, maps
    /// sorted): equal specs hash equal, so a changed hash means "replace".
    pub fn spec_hash(&self) -> Sha256Hex {
        // INVARIANT: strings, numbers and maps with string keys always serialize.
        Sha256Hex::of(&serde_json::to_vec(self).unwrap_or_default())
    }
}

fn check_arg(what: &'static str, v: &str) -> Result<(), SpecError> {
    if v.chars().count() > WorkloadSpec::MAX_ARG_CHARS {
        return Err(SpecError::Arg {
            what,
            why: "longer than 4096 characters",
        });
    }
    if v.contains('\0') {
        return Err(SpecError::Arg {
            what,
            why: "contains a NUL character",
        });
    }
    Ok(())
}

fn safe_abs_path(p: &str) -> bool {
    p.starts_with('/')
        && p.len() <= 1024
        && !p.contains('\0')
        && !p.contains(':')
        && !p.contains(',')
        && p.split('/').all(|c| c != "..")
}

/// A KV value that is not a valid `WorkloadSpec`.
#[derive(Debug)]
pub enum SpecParseError {
    Json(serde_json::Error),
    Spec(SpecError),
}

impl fmt::Display for SpecParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Json(e) => write!(
                f,
                "workload spec is not valid JSON of the expected shape: {e}"
            ),
            Self::Spec(e) => write!(f, "workload spec refused: {e}"),
        }
    }
}

impl std::error::Error for SpecParseError {}

/// Observed state of one workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadState {
    /// Desired but not yet created (queued, or pulling).
    Pending,
    Running,
    /// The container exited and is waiting to be restored.
    Exited,
    /// The last attempt failed; the next is delayed by a back-off.
    BackOff,
    /// The spec in NATS is invalid; the last applied one keeps running if any.
    Invalid,
    /// Not known now: Podman does not answer (the report says since when
    /// and why). The container may well run; nobody can tell.
    Unknown,
}

impl WorkloadState {
    /// The state's name, as the reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::BackOff => "back-off",
            Self::Invalid => "invalid",
            Self::Unknown => "unknown",
        }
    }
}

/// What a device reports for one workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct WorkloadStatus {
    pub state: WorkloadState,
    pub image: ImageRef,
    pub spec_hash: Sha256Hex,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// Times the reconciler restored or recreated the container.
    pub restarts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<BoundedText>,
    pub since: Timestamp,
    /// Why the desired spec is not being applied now (Podman unreachable):
    /// the change waits for that, not for a back-off or a pull.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<BoundedText>,
}

/// The value of `fleet-status` `<device>.workloads`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct WorkloadsReport {
    pub workloads: BTreeMap<WorkloadName, WorkloadStatus>,
    pub observed_at: Timestamp,
    /// Set while Podman does not answer; the workloads then say what is
    /// known (`unknown`, or `pending` with what they wait for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub podman_unreachable: Option<PodmanUnreachable>,
}

impl WorkloadsReport {
    /// Workloads running out of all desired.
    pub fn ready(&self) -> (usize, usize) {
        let running = self
            .workloads
            .values()
            .filter(|w| w.state == WorkloadState::Running)
            .count();
        (running, self.workloads.len())
    }
}

/// A device's desired workloads (generation 2): the whole of
/// `fleet-workloads` `<device>.desired`, one document so that one Direct Get
/// reads a complete snapshot. fleetctl writes it by compare-and-set in this
/// canonical form; the agent reads it with [`DesiredWorkloadsRaw`] so that
/// one bad spec does not hide the others.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct DesiredWorkloads {
    pub workloads: BTreeMap<WorkloadName, WorkloadSpec>,
}

/// [`DesiredWorkloads`] as the agent first parses it: the document's shape
/// checked, each spec kept as its raw JSON to be validated on its own (an
/// invalid spec is reported as such; the others apply).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct DesiredWorkloadsRaw {
    pub workloads: BTreeMap<String, Box<serde_json::value::RawValue>>,
}

impl DesiredWorkloadsRaw {
    /// Parses a document of at most `MAX_DESIRED_DOC_BYTES`.
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        use crate::limits::MAX_DESIRED_DOC_BYTES;
        if bytes.len() > MAX_DESIRED_DOC_BYTES {
            return Err(format!(
                "the desired-workloads document is {} bytes, more than the limit of {MAX_DESIRED_DOC_BYTES}",
                bytes.len()
            ));
        }
        serde_json::from_slice(bytes).map_err(|e| {
            format!("the desired-workloads document is not JSON of the expected shape: {e}")
        })
    }
}

/// The agent's record of the specs it last applied (`applied.json` in its
/// state directory), written after every successful mutation. It survives
/// restarts and rollbacks, so every agent version must keep reading it; a
/// change freeze restores missing containers from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct AppliedSpecs {
    pub format: u32,
    pub workloads: BTreeMap<WorkloadName, WorkloadSpec>,
    pub written_at: Timestamp,
}

impl AppliedSpecs {
    pub const FORMAT: u32 = 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_states_name_is_its_wire_spelling() {
        for s in [
            WorkloadState::Pending,
            WorkloadState::Running,
            WorkloadState::Exited,
            WorkloadState::BackOff,
            WorkloadState::Invalid,
            WorkloadState::Unknown,
        ] {
            assert_eq!(
                serde_json::to_string(&s).expect("serialize"),
                format!("\"{}\"", s.name())
            );
        }
    }
}
