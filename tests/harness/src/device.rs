//! A device's root as device setup would make it, in a temp dir: the
//! installed agent `fleet-agent-v<version>` in the versions directory, the
//! active link to it, `agent.json`, and the state and run directories;
//! and the builds the upgrade tests run besides the normal ones
//! (`make test-agents`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use fleet_common::validate::Version;
use fleet_common::Layout;
use tempfile::TempDir;

/// The version the second agent build of `make test-agents` is compiled
/// as (the Makefile's `UPGRADE_TEST_VERSION`).
pub const UPGRADE_TEST_VERSION: &str = "0.3.0-upgrade-test";
/// The released agent devices in the field run (generation-1 protocol),
/// built from the commit that shipped it by `make test-agents` (the
/// Makefile's `RELEASED_AGENT_VERSION`).
pub const RELEASED_AGENT_VERSION: &str = "0.1.0";
/// The released agent of the generation-2 protocol (one desired document
/// read by Direct Get, a heartbeat write every 30 s, specs without health
/// probes), built from the commit that shipped it by `make test-agents`
/// (the Makefile's `RELEASED_AGENT_0_2_VERSION`).
pub const RELEASED_AGENT_0_2_VERSION: &str = "0.2.0";

fn test_build(name: &str) -> PathBuf {
    let path = crate::target_dir().join("test-agents").join(name);
    if !path.is_file() {
        panic!(
            "missing {}: run make test-agents (it builds the agent as a second version and the updater with fault injection)",
            path.display()
        );
    }
    path
}

/// The agent built as `version` by `make test-agents`
/// (`target/test-agents/fleet-agent-<version>`); panics naming the make
/// target when it is missing.
pub fn test_agent_path(version: &str) -> PathBuf {
    test_build(&format!("fleet-agent-{version}"))
}

/// The updater built with the `fault-injection` feature (fault points,
/// `FLEET_UPDATER_TEST_BOUNDS`) by `make test-agents`.
pub fn test_updater_path() -> PathBuf {
    test_build("fleet-updater")
}

/// A device root; removed on drop.
#[derive(Debug)]
pub struct DeviceRoot {
    dir: TempDir,
    pub layout: Layout,
}

/// Sets up a device root with `agent` installed as version `version` and
/// active, and `agent.json` from `config(root)` (the root is only known
/// here, and the config names it).
pub fn device_root(
    agent: &Path,
    version: &str,
    config: impl FnOnce(&Path) -> serde_json::Value,
) -> DeviceRoot {
    let dir = tempfile::Builder::new()
        .prefix("fleet-device-")
        .tempdir()
        .expect("tempdir");
    // Traversable by the agent's user, like / on a device.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod root");
    let layout = Layout::with_root(dir.path());
    for d in [
        layout.versions_dir(),
        layout.config_dir(),
        layout.agent_state_dir(),
        layout.updater_state_dir(),
        layout.run_dir(),
        layout
            .active_agent_link()
            .parent()
            .expect("the link has a directory")
            .to_owned(),
    ] {
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
    }
    let installed = layout.versioned_agent(&Version::parse(version).expect("a valid version"));
    std::fs::copy(agent, &installed)
        .unwrap_or_else(|e| panic!("installing {}: {e}", agent.display()));
    std::fs::set_permissions(&installed, std::fs::Permissions::from_mode(0o755))
        .expect("chmod agent");
    std::os::unix::fs::symlink(&installed, layout.active_agent_link()).expect("active link");
    let text = serde_json::to_vec_pretty(&config(dir.path())).expect("agent config JSON");
    std::fs::write(layout.agent_config(), text).expect("agent config");
    DeviceRoot { dir, layout }
}

impl DeviceRoot {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Where the active link points now.
    pub fn active(&self) -> PathBuf {
        std::fs::read_link(self.layout.active_agent_link()).expect("active link")
    }
}
