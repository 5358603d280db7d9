//! The updater on one device, and the 100 MiB download.
//!
//! The release `fleet-updater` runs as in production (`--service-manager
//! systemctl`: no in-process supervisor thread) in a temp root with the
//! release agent installed and active, trusting the bench's test CA.
//!
//! Download + verify: an `upgrade` over the socket whose artifact is 100 MiB
//! of random bytes with its true SHA-256; the updater streams it to disk
//! while hashing, verifies, syncs, then its probe refuses the candidate (it
//! is not an executable), so no cutover follows. The figure is the
//! updater's own log line "downloaded and verified in N ms" (connect, TLS,
//! body, hash, write; the fsync after it is reported apart). Baselines, in
//! the same run and interleaved with it: `curl -s --cacert CA URL |
//! sha256sum` and `... | openssl dgst -sha256`, wall time from spawning
//! curl to both ends exiting, output checked. Best of N runs each, once
//! against the harness's rustls server and once against
//! `openssl s_server -WWW` (which shows the server's own share).

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fleet_common::contracts::{AgentUpgradeAttempt, Response, UpdaterReply, UpdaterRequest};
use fleet_common::limits::{
    MAX_ARTIFACT_BYTES, SOCKET_STATUS_RESPONSE_TIMEOUT, SOCKET_UPGRADE_RESPONSE_TIMEOUT,
};
use fleet_common::socket;
use fleet_common::validate::{
    Arch, ArtifactUrl, AttemptUuid, DeviceId, MaxBytes, Sha256Hex, Version,
};
use fleet_common::Layout;
use fleet_harness::{poll_until, require_tool, Behavior, ChildGuard, HttpsServer, TestCa};
use tempfile::TempDir;

use crate::bins::release_bin;
use crate::procfs;
use crate::report::{mib, Row, Verdict};

/// The artifact: the largest the fleet accepts.
pub const ARTIFACT_BYTES: u64 = MAX_ARTIFACT_BYTES;
/// Start-up and one download (generous on a loaded 2-core machine).
const SETTLE: Duration = Duration::from_secs(60);
/// How often curl's peak memory is sampled.
const HWM_POLL: Duration = Duration::from_millis(5);

/// A running updater in its temp root.
#[derive(Debug)]
pub struct UpdaterBench {
    /// Kept for its lifetime: the device's files.
    _root: TempDir,
    layout: Layout,
    guard: ChildGuard,
    attempts: u32,
}

impl UpdaterBench {
    /// Installs the release agent as the active version and starts the
    /// updater `binary` trusting `ca`; waits until its socket answers.
    pub fn start(ca: &TestCa, binary: &Path) -> UpdaterBench {
        let root = tempfile::Builder::new()
            .prefix("fleet-bench-updater-")
            .tempdir()
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        // Traversable by `nobody` (the probe user), like / on a device.
        set_mode(root.path(), 0o755);
        let layout = Layout::with_root(root.path());
        let bin_dir = layout
            .active_agent_link()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| panic!("the active link has no parent"));
        for d in [
            layout.versions_dir(),
            layout.config_dir(),
            layout.agent_state_dir(),
            bin_dir,
        ] {
            std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
        }
        let current = layout.versioned_agent(&version(env!("CARGO_PKG_VERSION")));
        std::fs::copy(release_bin("fleet-agent"), &current)
            .unwrap_or_else(|e| panic!("installing the agent: {e}"));
        std::os::unix::fs::symlink(&current, layout.active_agent_link())
            .unwrap_or_else(|e| panic!("active link: {e}"));
        std::fs::write(layout.agent_config(), "{}\n")
            .unwrap_or_else(|e| panic!("agent config: {e}"));
        let config = root.path().join("updater-bench.json");
        std::fs::write(
            &config,
            serde_json::json!({"ca-file": ca.ca_path(), "probe-user": "nobody"}).to_string(),
        )
        .unwrap_or_else(|e| panic!("updater config: {e}"));
        let mut cmd = Command::new(binary);
        cmd.arg("run")
            .arg("--root")
            .arg(root.path())
            .arg("--config")
            .arg(&config)
            .args(["--service-manager", "systemctl"])
            .env_remove("FLEET_LOG")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("INVOCATION_ID")
            .env_remove("JOURNAL_STREAM");
        let guard = ChildGuard::spawn(cmd, "fleet-updater");
        guard.wait_for_line("recovery complete", SETTLE);
        let bench = UpdaterBench {
            _root: root,
            layout,
            guard,
            attempts: 0,
        };
        poll_until("the updater socket answers", SETTLE, || {
            socket::call::<_, UpdaterReply>(
                &bench.layout.updater_socket(),
                &UpdaterRequest::Status {},
                SOCKET_STATUS_RESPONSE_TIMEOUT,
            )
            .ok()
        });
        bench
    }

    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// One `upgrade` whose artifact is at `url`; returns the updater's
    /// download-and-verify time and its sync time.
    fn download(&mut self, url: &str, sha256: &Sha256Hex) -> (Duration, Duration) {
        self.attempts += 1;
        let target = version(&format!("bench-{}", self.attempts));
        let attempt = AgentUpgradeAttempt {
            arch: Arch::current().unwrap_or_else(|| panic!("unsupported architecture")),
            artifact_url: ArtifactUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}")),
            device_id: DeviceId::parse(crate::agent::DEVICE).unwrap_or_else(|e| panic!("{e}")),
            max_bytes: MaxBytes::new(ARTIFACT_BYTES).unwrap_or_else(|e| panic!("{e}")),
            sha256: sha256.clone(),
            target_version: target.clone(),
            uuid: AttemptUuid::new_random(),
        };
        let from = self.guard.line_count();
        let reply = socket::call::<_, UpdaterReply>(
            &self.layout.updater_socket(),
            &UpdaterRequest::Upgrade { attempt },
            SOCKET_UPGRADE_RESPONSE_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("upgrade request: {e}"));
        let line = self
            .guard
            .try_wait_for_line(from, "downloaded and verified in", SETTLE)
            .unwrap_or_else(|| {
                panic!(
                    "the updater did not install the artifact; reply {reply:?}; log:\n{}",
                    self.guard.log()
                )
            });
        if let Response::Err(e) = &reply {
            eprintln!("bench: the updater answered: {e}");
        }
        // Make room for the next run: 100 MiB each.
        let _ = std::fs::remove_file(self.layout.versioned_agent(&target));
        (
            ms_after(&line, "downloaded and verified in "),
            ms_after(&line, "synced to disk in "),
        )
    }
}

fn version(v: &str) -> Version {
    Version::parse(v).unwrap_or_else(|e| panic!("version {v}: {e}"))
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

/// The number of milliseconds after `label` in `line`.
fn ms_after(line: &str, label: &str) -> Duration {
    line.split(label)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .map(Duration::from_millis)
        .unwrap_or_else(|| panic!("no \"{label}<n> ms\" in {line:?}"))
}

/// The 100 MiB artifact on disk, with its digest.
#[derive(Debug)]
pub struct Artifact {
    pub dir: TempDir,
    pub path: PathBuf,
    pub sha256: Sha256Hex,
}

impl Artifact {
    pub fn random() -> Artifact {
        let dir = tempfile::Builder::new()
            .prefix("fleet-bench-artifact-")
            .tempdir()
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        let mut data = vec![0u8; ARTIFACT_BYTES as usize];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut data))
            .unwrap_or_else(|e| panic!("reading /dev/urandom: {e}"));
        let sha256 = Sha256Hex::of(&data);
        let path = dir.path().join("agent.bin");
        std::fs::write(&path, &data).unwrap_or_else(|e| panic!("writing the artifact: {e}"));
        Artifact { dir, path, sha256 }
    }
}

/// A baseline pipeline: `curl -s --cacert CA URL | <hasher>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hasher {
    Sha256sum,
    OpensslDgst,
}

impl Hasher {
    fn label(self) -> &'static str {
        match self {
            Hasher::Sha256sum => "curl | sha256sum",
            Hasher::OpensslDgst => "curl | openssl dgst -sha256",
        }
    }

    fn command(self) -> Command {
        match self {
            Hasher::Sha256sum => Command::new(require_tool("sha256sum", "coreutils")),
            Hasher::OpensslDgst => {
                let mut c = Command::new(require_tool("openssl", "openssl"));
                c.args(["dgst", "-sha256"]);
                c
            }
        }
    }
}

/// Runs one baseline pipeline; returns its wall time and curl's peak RSS.
fn pipeline(hasher: Hasher, ca: &Path, url: &str, sha256: &Sha256Hex) -> (Duration, u64) {
    let curl = require_tool("curl", "curl");
    let started = Instant::now();
    let mut c = Command::new(curl)
        .args(["-s", "--cacert"])
        .arg(ca)
        .arg(url)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning curl: {e}"));
    let out = c
        .stdout
        .take()
        .unwrap_or_else(|| panic!("curl has no stdout"));
    let h = hasher
        .command()
        .stdin(Stdio::from(out))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {}: {e}", hasher.label()));
    let pid = c.id();
    let mut peak = 0;
    loop {
        match c.try_wait() {
            Ok(Some(status)) => {
                assert!(status.success(), "curl {url} failed: {status}");
                break;
            }
            Ok(None) => {
                peak = peak.max(procfs::try_hwm(pid).unwrap_or(0));
                std::thread::sleep(HWM_POLL);
            }
            Err(e) => panic!("waiting for curl: {e}"),
        }
    }
    let out = h
        .wait_with_output()
        .unwrap_or_else(|e| panic!("waiting for {}: {e}", hasher.label()));
    let elapsed = started.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(sha256.as_str()),
        "{} printed {text:?}, not {sha256}",
        hasher.label()
    );
    (elapsed, peak)
}

/// `openssl s_server -WWW` serving `dir` with a leaf from `ca`.
fn openssl_server(ca: &TestCa, dir: &Path) -> (ChildGuard, u16) {
    let openssl = require_tool("openssl", "openssl");
    let (cert, key) = ca.leaf_files(&[]);
    for _ in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("picking a port: {e}"));
        let mut cmd = Command::new(&openssl);
        cmd.current_dir(dir)
            .args(["s_server", "-quiet", "-WWW", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(&cert)
            .arg("-key")
            .arg(&key);
        let guard = ChildGuard::spawn(cmd, "openssl-s_server");
        let up = poll_until("openssl s_server listens", SETTLE, || {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(true);
            }
            guard.log().contains("in use").then_some(false)
        });
        if up {
            return (guard, port);
        }
    }
    panic!("openssl s_server: every picked port was taken");
}

/// Best (shortest) of `v`.
fn best(v: &[Duration]) -> Duration {
    v.iter().copied().min().unwrap_or_default()
}

fn mb_s(d: Duration) -> f64 {
    ARTIFACT_BYTES as f64 / d.as_secs_f64() / 1e6
}

/// The download rows: throughput against each server, and the updater's
/// and curl's peak memory.
/// `updater` is the shipped (static musl) build; `glibc`, the glibc build
/// of the updater, is measured in the same interleaving and reported beside
/// (no target of its own).
pub fn download_rows(
    updater: &mut UpdaterBench,
    glibc: &mut UpdaterBench,
    ca: &TestCa,
    artifact: &Artifact,
    runs: usize,
) -> Vec<Row> {
    let https = HttpsServer::start(ca);
    https.route("/agent.bin", Behavior::File(artifact.path.clone()));
    let (_s_server, port) = openssl_server(ca, artifact.dir.path());
    let servers = [
        ("harness rustls server", https.url("/agent.bin")),
        (
            "openssl s_server -WWW",
            format!("https://127.0.0.1:{port}/agent.bin"),
        ),
    ];
    let idle_hwm = procfs::hwm(updater.pid());
    let mut rows = Vec::new();
    let mut curl_peak = 0;
    let mut syncs = Vec::new();
    for (server, url) in &servers {
        let mut ours = Vec::new();
        let mut sums = Vec::new();
        let mut dgsts = Vec::new();
        let mut glibc_runs = Vec::new();
        for _ in 0..runs {
            let (fetch, sync) = updater.download(url, &artifact.sha256);
            ours.push(fetch);
            syncs.push(sync);
            glibc_runs.push(glibc.download(url, &artifact.sha256).0);
            let (t, peak) = pipeline(Hasher::Sha256sum, &ca.ca_path(), url, &artifact.sha256);
            sums.push(t);
            curl_peak = curl_peak.max(peak);
            let (t, peak) = pipeline(Hasher::OpensslDgst, &ca.ca_path(), url, &artifact.sha256);
            dgsts.push(t);
            curl_peak = curl_peak.max(peak);
        }
        let (ours_b, sum_b, dgst_b) = (best(&ours), best(&sums), best(&dgsts));
        let (base, base_label) = if sum_b <= dgst_b {
            (sum_b, Hasher::Sha256sum.label())
        } else {
            (dgst_b, Hasher::OpensslDgst.label())
        };
        let ratio = base.as_secs_f64() / ours_b.as_secs_f64();
        let secs = |v: &[Duration]| {
            v.iter()
                .map(|d| format!("{:.2}", d.as_secs_f64()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        rows.push(
            Row::new(format!("download + verify 100 MiB, {server}"))
                .ours(format!("{:.2} s ({:.0} MB/s)", ours_b.as_secs_f64(), mb_s(ours_b)))
                .baseline(format!(
                    "{:.2} s ({:.0} MB/s, {base_label})",
                    base.as_secs_f64(),
                    mb_s(base)
                ))
                .ratio(format!("{ratio:.2}× the faster"))
                .target("≥ 1.0× the faster", Verdict::from_ok(ratio >= 1.0))
                .note(format!(
                    "Best of {runs}, interleaved, loopback HTTPS from the {server}. Updater (download, hash, write to its temp file): {} s. curl | sha256sum: {} s. curl | openssl dgst -sha256: {} s. The updater also writes the file; the fsync after it ({} ms at best) is not counted.",
                    secs(&ours),
                    secs(&sums),
                    secs(&dgsts),
                    best(&syncs).as_millis()
                )),
        );
        let m = best(&glibc_runs);
        rows.push(
            Row::new(format!("download + verify 100 MiB, {server}, glibc build"))
                .ours(format!("{:.2} s ({:.0} MB/s)", m.as_secs_f64(), mb_s(m)))
                .baseline(format!(
                    "{:.2} s ({:.0} MB/s, {base_label})",
                    base.as_secs_f64(),
                    mb_s(base)
                ))
                .ratio(format!(
                    "{:.2}× the faster",
                    base.as_secs_f64() / m.as_secs_f64()
                ))
                .target("— (≥ 1.0× the faster)", Verdict::Info),
        );
    }
    let peak = procfs::hwm(updater.pid());
    rows.push(
        Row::new("updater RSS, peak during a 100 MiB download")
            .ours(mib(peak))
            .baseline(format!("{} (curl, same downloads)", mib(curl_peak)))
            .ratio(format!("{:.2}×", peak as f64 / curl_peak.max(1) as f64))
            .target("≤ 5 MiB", Verdict::from_ok(peak <= 5 * 1024 * 1024))
            .note(format!(
                "VmHWM of the updater after {} downloads (lifetime peak; {} before the first). curl's is its VmHWM sampled every {} ms until it exits.",
                runs * servers.len(),
                mib(idle_hwm),
                HWM_POLL.as_millis()
            )),
    );
    rows
}
