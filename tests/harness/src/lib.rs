//! `fleet-harness`: real parts for every test — nats-server (single, fleet
//! layout, 3-node cluster, leaf nodes bound to either; Debian 2.9 and 2.14;
//! 2.14 with the real `fleet-auth-callout`), an isolated Podman, an HTTPS server with a test
//! CA, an identity provider on it (JWKS and OAuth2 token endpoint), Debian's
//! Prometheus and Alertmanager (with a webhook receiver), an OCI
//! registry (Debian's docker-registry) with a token-auth front, a booted
//! Debian 12 systemd container, a network namespace behind a link that can
//! be cut silently, and child processes that are killed and
//! reaped when a test ends, whatever way it ends.
//!
//! Everything a test starts lives in a guard whose `Drop` stops it and removes
//! its temp dirs. Ports are random, nothing is global but `OnceLock` caches,
//! so tests run in parallel threads.

mod builds;
mod callout;
pub mod desired;
mod device;
#[cfg(test)]
mod doc_links;
pub mod fuzz;
mod https;
mod idp;
mod isolation;
mod leaf;
mod nats;
mod netns;
mod podman;
mod proc;
mod prometheus;
mod registry;
mod systemd;

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

pub use builds::{device_deb, packages_dir, target_dir, workspace_version};
pub use callout::{CalloutCluster, CalloutNats, CALLOUT_PASSWORD};
pub use device::{
    device_root, test_agent_path, test_updater_path, DeviceRoot, RELEASED_AGENT_0_2_VERSION,
    RELEASED_AGENT_VERSION, UPGRADE_TEST_VERSION,
};
pub use https::{
    Behavior, HttpServer, HttpsServer, Request, ResponseSpec, TestCa, DEFAULT_LEAF_NAMES,
};
pub use idp::{
    claims, ec_jwk, ec_key, es256, now_secs, rs256, signing_input, Idp, IdpKeys, EC_KID,
    IDP_AUDIENCE, IDP_ISSUER, JWKS_PATH, RSA_KID, RSA_TEST_KEY_JWK, RSA_TEST_KEY_PEM, TOKEN_PATH,
};
pub use isolation::{admin_get, assert_device_isolation, DeviceClient};
pub use leaf::NatsLeaf;
pub use nats::{
    create_buckets, device_password, fleet_server_config, set_lobby_places, without_presence,
    CalloutLayout, ClusterOptions, NatsCluster, NatsServer, NatsVersion, LEAF_PASSWORD,
    NATS_ADMIN_PASSWORD,
};
pub use netns::NetNs;
pub use podman::{Podman, BUSYBOX_IMAGE};
pub use proc::ChildGuard;
pub use prometheus::{promtool, promtool_ok, Alertmanager, Prometheus, WebhookReceiver};
pub use registry::{FrontAuth, Registry, RegistryFront, FRONT_SERVICE};
pub use systemd::{
    apt_mirror, cache_dir, AgentSettings, BootOptions, ExecOutput, SystemdContainer, EXEC_TIMEOUT,
    STATE_DIR, SYSTEMD_IMAGE_REPO,
};

/// How often [`poll_until`] checks its condition.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The workspace root (the harness lives at `<root>/tests/harness`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .expect("the harness manifest dir is <workspace>/tests/harness")
        .to_path_buf()
}

/// The path of `tool` (a command looked up in `PATH` and the sbin dirs, or an
/// absolute path). Panics "missing <tool>: install the Debian package
/// <package> (make deps)".
pub fn require_tool(tool: &str, package: &str) -> PathBuf {
    find_tool(tool).unwrap_or_else(|| {
        panic!("missing {tool}: install the Debian package {package} (make deps)")
    })
}

/// `tool` if it exists: an absolute path as is, else the first executable in
/// `PATH`, `/usr/sbin`, `/sbin` (Debian puts nats-server in /usr/sbin, which
/// is not in every user's PATH).
pub(crate) fn find_tool(tool: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if tool.contains('/') {
        let p = PathBuf::from(tool);
        return executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(tool))
        .find(|p| executable(p))
}

/// The target dir of this build: the test binary runs from
/// `<target>/debug/deps/`, so its grandparent is `<target>/debug`.
pub(crate) fn profile_dir() -> PathBuf {
    if let Ok(exe) = std::env::current_exe() {
        if let Some(deps) = exe.parent() {
            if deps.file_name().is_some_and(|n| n == "deps") {
                if let Some(profile) = deps.parent() {
                    return profile.to_path_buf();
                }
            }
            // A binary of the workspace itself (the bench, a simulator
            // worker): the binaries of its own profile.
            if deps
                .parent()
                .is_some_and(|t| t.join("CACHEDIR.TAG").is_file())
            {
                return deps.to_path_buf();
            }
        }
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| {
            if t.is_absolute() {
                t
            } else {
                workspace_root().join(t)
            }
        })
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("debug")
}

/// Path of a workspace binary built by `cargo build --workspace --bins`
/// (`target/debug/<name>`); panics when it is missing.
pub fn bin_path(name: &str) -> PathBuf {
    let path = profile_dir().join(name);
    if !path.is_file() {
        panic!(
            "missing binary {}: run `make build` (cargo build --workspace --bins)",
            path.display()
        );
    }
    path
}

/// Polls `f` every 20 ms until it returns `Some` or `timeout` passes; panics
/// with `what` on timeout.
pub fn poll_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        thread::sleep(POLL_INTERVAL);
    }
}
