//! The path layout of a device (`docs/design/architecture.md` "Paths on a
//! device"). Every managed
//! path derives from one root prefix — `/` in production, a temp dir in tests —
//! fixed when a daemon starts and never chosen by a caller.

use std::path::{Path, PathBuf};

use crate::validate::Version;

/// The systemd unit of the agent.
pub const AGENT_UNIT: &str = "fleet-agent.service";
/// The systemd unit of the updater.
pub const UPDATER_UNIT: &str = "fleet-updater.service";
/// The user the agent (and every probe) runs as.
pub const AGENT_USER: &str = "fleet-agent";
/// The group allowed on the updater socket.
pub const AGENT_GROUP: &str = "fleet-agent";
/// The group allowed to freeze and unfreeze through the agent socket.
pub const CONTROL_GROUP: &str = "fleet-control";
/// File-name prefix of installed agent versions.
pub const VERSIONED_AGENT_PREFIX: &str = "fleet-agent-v";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// The production layout, rooted at `/`.
    pub fn production() -> Self {
        Self {
            root: PathBuf::from("/"),
        }
    }

    /// A layout under `root` (tests, image builds).
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn at(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// `/etc/harmony-fleet`
    pub fn config_dir(&self) -> PathBuf {
        self.at("etc/harmony-fleet")
    }
    /// `/etc/harmony-fleet/agent.json`
    pub fn agent_config(&self) -> PathBuf {
        self.at("etc/harmony-fleet/agent.json")
    }
    /// `/etc/harmony-fleet/enrollment-token`: the fleet's enrollment token
    /// (`nats.auth.method: enrollment`), root:fleet-agent 0640.
    pub fn enrollment_token(&self) -> PathBuf {
        self.at("etc/harmony-fleet/enrollment-token")
    }
    /// `/etc/harmony-fleet/updater.json`
    pub fn updater_config(&self) -> PathBuf {
        self.at("etc/harmony-fleet/updater.json")
    }
    /// `/usr/lib/harmony-fleet`: installed agent versions and the updater.
    pub fn versions_dir(&self) -> PathBuf {
        self.at("usr/lib/harmony-fleet")
    }
    /// `/usr/lib/harmony-fleet/fleet-agent-v<version>`
    pub fn versioned_agent(&self, version: &Version) -> PathBuf {
        self.versions_dir()
            .join(format!("{VERSIONED_AGENT_PREFIX}{version}"))
    }
    /// The version of a path inside [`Self::versions_dir`] named
    /// `fleet-agent-v<version>`; `None` for any other path.
    pub fn version_of(&self, path: &Path) -> Option<Version> {
        if path.parent() != Some(self.versions_dir().as_path()) {
            return None;
        }
        let name = path.file_name()?.to_str()?;
        Version::parse(name.strip_prefix(VERSIONED_AGENT_PREFIX)?).ok()
    }
    /// `/usr/local/bin/fleet-agent`: the active symlink.
    pub fn active_agent_link(&self) -> PathBuf {
        self.at("usr/local/bin/fleet-agent")
    }
    /// `/usr/lib/harmony-fleet/fleet-updater`
    pub fn updater_binary(&self) -> PathBuf {
        self.versions_dir().join("fleet-updater")
    }
    /// `/var/lib/harmony-fleet/updater`
    pub fn updater_state_dir(&self) -> PathBuf {
        self.at("var/lib/harmony-fleet/updater")
    }
    /// `/var/lib/harmony-fleet/updater/journal.json`
    pub fn journal(&self) -> PathBuf {
        self.updater_state_dir().join("journal.json")
    }
    /// `/var/lib/harmony-fleet/updater/attempts.json`: the uuid → digest
    /// binding of every attempt the updater started.
    pub fn updater_bindings(&self) -> PathBuf {
        self.updater_state_dir().join("attempts.json")
    }
    /// `/var/lib/harmony-fleet/agent`
    pub fn agent_state_dir(&self) -> PathBuf {
        self.at("var/lib/harmony-fleet/agent")
    }
    /// `/var/lib/harmony-fleet/agent/freeze.json`: the persisted config state.
    pub fn freeze_state(&self) -> PathBuf {
        self.agent_state_dir().join("freeze.json")
    }
    /// `/var/lib/harmony-fleet/agent/applied.json`: the last applied specs.
    pub fn applied_specs(&self) -> PathBuf {
        self.agent_state_dir().join("applied.json")
    }
    /// `/var/lib/harmony-fleet/agent/workload-health.json`: every applied
    /// spec (those using fields agent 0.2.0 does not read included), the
    /// last healthy spec of each workload and the spec that failed
    /// (`WorkloadHealthState`). `applied.json` beside it keeps only the
    /// specs every agent reads, so a downgraded agent still reads it.
    pub fn workload_health_state(&self) -> PathBuf {
        self.agent_state_dir().join("workload-health.json")
    }
    /// `/var/lib/harmony-fleet/agent/attempts.json`: attempts seen (uuid → digest, outcome).
    pub fn seen_attempts(&self) -> PathBuf {
        self.agent_state_dir().join("attempts.json")
    }
    /// `/run/harmony-fleet`
    pub fn run_dir(&self) -> PathBuf {
        self.at("run/harmony-fleet")
    }
    /// `/run/harmony-fleet/updater.sock`
    pub fn updater_socket(&self) -> PathBuf {
        self.run_dir().join("updater.sock")
    }
    /// `/run/harmony-fleet/agent.sock`
    pub fn agent_socket(&self) -> PathBuf {
        self.run_dir().join("agent.sock")
    }
    /// `/run/harmony-fleet/agent.lock`: held by the one agent that mutates.
    pub fn agent_lock(&self) -> PathBuf {
        self.run_dir().join("agent.lock")
    }
    /// `/etc/systemd/system`: where device setup installs units.
    pub fn unit_dir(&self) -> PathBuf {
        self.at("etc/systemd/system")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn production_paths_match_design() {
        let l = Layout::production();
        let v = Version::parse("1.2.3").expect("valid");
        assert_eq!(l.agent_config(), Path::new("/etc/harmony-fleet/agent.json"));
        assert_eq!(
            l.versioned_agent(&v),
            Path::new("/usr/lib/harmony-fleet/fleet-agent-v1.2.3")
        );
        assert_eq!(
            l.active_agent_link(),
            Path::new("/usr/local/bin/fleet-agent")
        );
        assert_eq!(
            l.updater_binary(),
            Path::new("/usr/lib/harmony-fleet/fleet-updater")
        );
        assert_eq!(
            l.journal(),
            Path::new("/var/lib/harmony-fleet/updater/journal.json")
        );
        assert_eq!(
            l.agent_state_dir(),
            Path::new("/var/lib/harmony-fleet/agent")
        );
        assert_eq!(
            l.updater_socket(),
            Path::new("/run/harmony-fleet/updater.sock")
        );
        assert_eq!(l.agent_socket(), Path::new("/run/harmony-fleet/agent.sock"));
    }

    #[test]
    fn test_root_prefixes_everything_and_version_of_is_strict() {
        let l = Layout::with_root("/tmp/t1");
        let v = Version::parse("2.0").expect("valid");
        let p = l.versioned_agent(&v);
        assert_eq!(
            p,
            Path::new("/tmp/t1/usr/lib/harmony-fleet/fleet-agent-v2.0")
        );
        assert_eq!(l.version_of(&p), Some(v));
        assert_eq!(
            l.version_of(Path::new("/tmp/t1/usr/lib/harmony-fleet/fleet-updater")),
            None
        );
        assert_eq!(
            l.version_of(Path::new("/usr/lib/harmony-fleet/fleet-agent-v2.0")),
            None
        );
        assert_eq!(
            l.version_of(Path::new("/tmp/t1/usr/lib/harmony-fleet/fleet-agent-v..")),
            None
        );
    }
}
