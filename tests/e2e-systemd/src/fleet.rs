//! The host's side, as an operator has it: a nats-server with the fleet's
//! two-account layout, an HTTPS server for artifacts (the test CA), the
//! real `fleetctl` as admin in `FLEET` (release files, `upgrade`,
//! `artifact push`), a `fleetctl watch` running from the start, and reads
//! of `fleet-status` as admin.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleet_common::contracts::{DeviceInfo, UpgradePhase, UpgradeReason, UpgradeStatus};
use fleet_common::subjects::{status_key, StatusKey, BUCKET_STATUS};
use fleet_common::validate::{Arch, AttemptUuid, DeviceId, Sha256Hex};
use fleet_harness::{
    bin_path, poll_until, Behavior, ChildGuard, HttpsServer, NatsServer, NatsVersion, Registry,
    TestCa, NATS_ADMIN_PASSWORD,
};
use tempfile::TempDir;

/// `fleetctl` itself (one CAS write, one push): quick, or broken.
const FLEETCTL_TIMEOUT: Duration = Duration::from_secs(60);
/// `fleetctl watch` subscribing.
const WATCH_START_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_OUTPUT: usize = 1024 * 1024;

/// A release file written for `fleetctl upgrade --release`.
#[derive(Debug, Clone)]
pub struct ReleaseFile {
    pub version: String,
    pub path: PathBuf,
    pub sha256: Sha256Hex,
}

/// The operator's side of one test. See the module doc.
#[derive(Debug)]
pub struct Fleet {
    pub nats: NatsServer,
    pub ca: TestCa,
    pub https: HttpsServer,
    work: TempDir,
    watch: Option<ChildGuard>,
}

impl Fleet {
    /// A fleet-layout nats-server for `devices`, an HTTPS server, and
    /// `fleetctl watch` following `fleet-status`.
    pub fn start(version: NatsVersion, devices: &[&str]) -> Fleet {
        let nats = NatsServer::start_fleet(version, devices);
        let ca = TestCa::new();
        let https = HttpsServer::start(&ca);
        let work = tempfile::Builder::new()
            .prefix("fleet-e2e-")
            .tempdir()
            .expect("a temp dir");
        std::fs::write(
            work.path().join("admin-password"),
            format!("{NATS_ADMIN_PASSWORD}\n"),
        )
        .expect("write the admin password");
        let mut fleet = Fleet {
            nats,
            ca,
            https,
            work,
            watch: None,
        };
        let watch = ChildGuard::spawn(fleet.fleetctl(&["watch"]), "fleetctl-watch");
        watch.wait_for_line("watching fleet-status", WATCH_START_TIMEOUT);
        fleet.watch = Some(watch);
        fleet
    }

    /// `fleetctl ARGS` as admin against this fleet's server.
    pub fn fleetctl(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin_path("fleetctl"));
        c.args(args)
            .args(["--server", &self.nats.url(), "--password-file"])
            .arg(self.work.path().join("admin-password"))
            .env_remove("FLEET_NATS_URL")
            .env_remove("FLEET_NATS_PASSWORD_FILE");
        c
    }

    /// Runs `fleetctl ARGS`; (exit code, stdout, stderr).
    pub fn run_fleetctl(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = fleet_common::process::run_bounded(
            &mut self.fleetctl(args),
            FLEETCTL_TIMEOUT,
            MAX_OUTPUT,
        )
        .unwrap_or_else(|e| panic!("fleetctl {args:?}: {e}"));
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Serves `bytes` over HTTPS at `/releases/<version>/fleet-agent` and
    /// writes the release file pointing at it.
    pub fn release_https(&self, version: &str, bytes: Vec<u8>) -> ReleaseFile {
        let path = format!("/releases/{version}/fleet-agent");
        let sha = Sha256Hex::of(&bytes);
        let size = bytes.len();
        self.https.route(&path, Behavior::Bytes(bytes));
        self.write_release(
            version,
            serde_json::json!({
                "artifact-url": self.https.url(&path),
                "sha256": sha,
                "max-bytes": size,
            }),
        )
    }

    /// Publishes `binary` to `registry` with `fleetctl artifact push` and
    /// writes the release file from the entry it prints (pinned to the
    /// manifest digest).
    pub fn release_oci(&self, registry: &Registry, version: &str, binary: &Path) -> ReleaseFile {
        let reference = registry.reference("fleet/agent", version);
        let ca = self.ca.ca_path();
        let out = fleet_common::process::run_bounded(
            Command::new(bin_path("fleetctl"))
                .args(["artifact", "push", &reference])
                .arg(binary)
                .arg("--ca-file")
                .arg(&ca),
            FLEETCTL_TIMEOUT,
            MAX_OUTPUT,
        )
        .expect("fleetctl artifact push runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.success(),
            "fleetctl artifact push {reference}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let entry = stdout
            .lines()
            .find_map(|l| l.strip_prefix("release entry: "))
            .unwrap_or_else(|| panic!("no release entry in {stdout:?}"));
        let entry: serde_json::Value = serde_json::from_str(entry).expect("the entry is JSON");
        assert!(
            entry["artifact-url"]
                .as_str()
                .is_some_and(|u| u.starts_with("oci://") && u.contains("@sha256:")),
            "{entry}"
        );
        self.write_release(version, entry)
    }

    fn write_release(&self, version: &str, entry: serde_json::Value) -> ReleaseFile {
        let sha = Sha256Hex::parse(entry["sha256"].as_str().expect("sha256")).expect("sha256");
        let arch = Arch::current().expect("a supported architecture");
        let release = serde_json::json!({
            "version": version,
            "artifacts": { arch.as_str(): entry },
        });
        let path = self.work.path().join(format!("release-{version}.json"));
        std::fs::write(&path, release.to_string()).expect("write the release");
        ReleaseFile {
            version: version.to_owned(),
            path,
            sha256: sha,
        }
    }

    /// `fleetctl upgrade DEVICE --release R --retry`: the attempt written
    /// (`--retry`: the same failed release is issued again, as the rows of
    /// the matrix do).
    pub fn upgrade(&self, device: &str, release: &ReleaseFile) -> AttemptUuid {
        let path = release.path.to_string_lossy().into_owned();
        let (code, out, err) =
            self.run_fleetctl(&["upgrade", device, "--release", &path, "--retry"]);
        let written = out
            .trim()
            .strip_prefix(&format!("{device}: wrote attempt "))
            .and_then(|rest| rest.split(' ').next())
            .and_then(|u| AttemptUuid::parse(u).ok());
        written.unwrap_or_else(|| {
            panic!(
                "fleetctl upgrade {device} to {} wrote nothing ({code:?}): {out}{err}",
                release.version
            )
        })
    }

    fn status<T: serde::de::DeserializeOwned>(&self, device: &str, key: StatusKey) -> Option<T> {
        let id = DeviceId::parse(device).expect("device id");
        // A fresh connection per read: the server may have been restarted.
        let admin = self.nats.admin();
        let store = nats::jetstream::new(admin).key_value(BUCKET_STATUS).ok()?;
        let raw = store.get(&status_key(&id, key)).ok()??;
        Some(serde_json::from_slice(&raw).unwrap_or_else(|e| {
            panic!(
                "{device} {key:?} in NATS is not valid: {e}: {}",
                String::from_utf8_lossy(&raw)
            )
        }))
    }

    /// `<device>.upgrade` in `fleet-status`.
    pub fn upgrade_status(&self, device: &str) -> Option<UpgradeStatus> {
        self.status(device, StatusKey::Upgrade)
    }

    /// `<device>.info` in `fleet-status`.
    pub fn info(&self, device: &str) -> Option<DeviceInfo> {
        self.status(device, StatusKey::Info)
    }

    /// Waits until `<device>.upgrade` shows attempt `uuid` in a phase
    /// `want` accepts.
    pub fn wait_upgrade(
        &self,
        device: &str,
        uuid: AttemptUuid,
        what: &str,
        timeout: Duration,
        want: impl Fn(&UpgradeStatus) -> bool,
    ) -> UpgradeStatus {
        poll_until(
            &format!("{device}.upgrade {what} for attempt {uuid}"),
            timeout,
            || {
                self.upgrade_status(device)
                    .filter(|s| s.attempt_uuid == uuid && want(s))
            },
        )
    }

    /// Waits until `<device>.upgrade` shows attempt `uuid` terminal.
    pub fn wait_terminal(
        &self,
        device: &str,
        uuid: AttemptUuid,
        timeout: Duration,
    ) -> UpgradeStatus {
        self.wait_upgrade(device, uuid, "terminal", timeout, |s| s.phase.is_terminal())
    }

    /// Waits until `<device>.info` says agent `version` runs.
    pub fn wait_reporting(&self, device: &str, version: &str, timeout: Duration) -> DeviceInfo {
        poll_until(
            &format!("{device} reporting agent {version} in NATS"),
            timeout,
            || {
                self.info(device)
                    .filter(|i| i.agent_version.as_str() == version)
            },
        )
    }

    /// The upgrade statuses `fleetctl watch` printed for `device` and
    /// attempt `uuid`, as `phase (reason)` strings, in order.
    pub fn phases_seen(&self, device: &str, uuid: AttemptUuid) -> Vec<String> {
        let Some(watch) = &self.watch else {
            return Vec::new();
        };
        watch
            .lines()
            .iter()
            .filter_map(|l| {
                let rest = l.split_once(&format!(" {device} upgrade: "))?.1;
                rest.contains(&format!(", attempt {uuid}"))
                    .then(|| rest.split(" to ").next().unwrap_or_default().to_owned())
            })
            .collect()
    }

    /// Waits until `fleetctl watch` printed `last` for the attempt; returns
    /// every phase it printed for it.
    pub fn wait_phase_seen(
        &self,
        device: &str,
        uuid: AttemptUuid,
        last: &str,
        timeout: Duration,
    ) -> Vec<String> {
        poll_until(
            &format!("fleetctl watch to print {last} for {device} attempt {uuid}"),
            timeout,
            || {
                let seen = self.phases_seen(device, uuid);
                seen.iter().any(|p| p == last).then_some(seen)
            },
        )
    }

    /// The whole `fleetctl watch` output so far (for failure messages).
    pub fn watch_log(&self) -> String {
        self.watch.as_ref().map(ChildGuard::log).unwrap_or_default()
    }
}

/// `phase (reason)` as `fleetctl watch` prints it, and as the matrix shows.
pub fn phase_text(phase: UpgradePhase, reason: Option<UpgradeReason>) -> String {
    match reason {
        Some(r) => format!("{phase} ({r})"),
        None => phase.to_string(),
    }
}

/// `want` appears in `seen` in this order (others may come between).
pub fn assert_in_order(seen: &[String], want: &[&str]) {
    let mut it = seen.iter();
    for w in want {
        assert!(
            it.any(|s| s == w),
            "expected {want:?} in this order within {seen:?}"
        );
    }
}
