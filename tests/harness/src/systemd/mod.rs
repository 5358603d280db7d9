//! A booted Debian 12 with systemd as PID 1, in a privileged Podman
//! container on the host's network: the nearest thing to a device these
//! tests can get. Packages install in it, its units run under real systemd,
//! rootless Podman runs nested in it as `fleet-agent`, and it reaches the
//! host's loopback nats-server and HTTPS servers at 127.0.0.1.
//!
//! The image is built once per machine and cached: `debootstrap` of bookworm
//! (minbase with systemd, dbus, ca-certificates, the rootless Podman
//! stack, man-db and rpm) from the mirror apt uses here, a few files added,
//! `podman import`.
//! It lives in one shared Podman storage under [`cache_dir`] (not per test),
//! its tag carries a hash of the recipe (a changed recipe builds a new image)
//! and a file lock makes concurrent test processes build it once.
//!
//! Every container is labelled with its owning test process (pid and start
//! time); the first boot in a process removes containers whose owner is gone.
//! Drop removes the container.
//!
//! Power loss is [`SystemdContainer::power_cycle`]: SIGKILL to the container,
//! then a boot with the same disk. The container shares the host's kernel and
//! page cache, so writes that were not fsynced survive it: it proves
//! recovery from an interrupted process tree, not from lost page cache.
//!
//! A full disk is [`BootOptions::small_state_fs_kib`]: `/var/lib/harmony-fleet`
//! on a small tmpfs the harness mounts on the host (under `/run/fleet-test`)
//! and bind-mounts into the container, so it outlives a power cycle as a
//! disk does (a tmpfs inside the container would not). It is unmounted when
//! the container is dropped, and, like containers, when its owning test
//! process is gone.

mod image;
mod owner;
mod tmpfs;
mod util;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fleet_common::process::{run_bounded, Output};

use crate::podman::busybox_rootfs_tar;
use crate::poll_until;

use image::SharedPodman;
pub use image::{apt_mirror, cache_dir, SYSTEMD_IMAGE_REPO};
use owner::{owner_id, OWNER_LABEL};
use tmpfs::HostTmpfs;
use util::{lock, MAX_OUTPUT, PODMAN_TIMEOUT};

/// One command run in the container by [`SystemdContainer::exec`].
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(300);

/// systemd reaching `running` or `degraded` after `podman run` (< 2 s here).
const BOOT_TIMEOUT: Duration = Duration::from_secs(90);

/// A clean shutdown (`podman stop`, SIGRTMIN+3 to systemd).
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(90);

/// Where [`SystemdContainer::trust_artifact_ca`] puts the CA.
const ARTIFACT_CA: &str = "/etc/harmony-fleet/artifact-ca.pem";

/// Lines of a unit's journal shown in a panic message.
const JOURNAL_LINES_IN_PANIC: &str = "200";

/// The agent's side of a device in the container: who it is, its NATS
/// server (the host's loopback), and whether it runs rootless Podman
/// (nested Podman works in this container).
#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub device_id: String,
    pub nats_url: String,
    pub password: String,
    pub podman: bool,
}

impl AgentSettings {
    /// Device `id` of a fleet-layout [`crate::NatsServer`] (password
    /// `<id>-pw`), Podman enabled.
    pub fn for_fleet_server(id: &str, server: &crate::NatsServer) -> Self {
        Self {
            device_id: id.to_owned(),
            nats_url: server.url(),
            password: crate::device_password(id),
            podman: true,
        }
    }
}

/// Where [`SystemdContainer::configure_agent`] writes.
const AGENT_CONFIG: &str = "/etc/harmony-fleet/agent.json";

const NATS_PASSWORD_FILE: &str = "/etc/harmony-fleet/nats-password";

/// What one command in the container left.
#[derive(Debug, Clone)]
pub struct ExecOutput {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl ExecOutput {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// How [`SystemdContainer::boot_with`] sets up the device's disk.
#[derive(Debug, Clone, Default)]
pub struct BootOptions {
    /// `/var/lib/harmony-fleet` (the updater journal, the agent's state and
    /// home) on a tmpfs of this many KiB of the host, bind-mounted into the
    /// container: a small filesystem a test can fill, kept across
    /// [`SystemdContainer::power_cycle`]. Needs root (CAP_SYS_ADMIN).
    pub small_state_fs_kib: Option<u64>,
}

/// The device's state directory, the one [`BootOptions::small_state_fs_kib`] replaces.
pub const STATE_DIR: &str = "/var/lib/harmony-fleet";

/// A booted systemd container, removed on drop. See the module doc.
#[derive(Debug)]
pub struct SystemdContainer {
    name: String,
    /// Execs whose output arrived whole: their files in [`EXEC_DIR`] go
    /// with the next exec.
    exec_done: Mutex<Vec<String>>,
    /// Dropped after the container is removed (fields drop after `drop`).
    state_fs: Option<HostTmpfs>,
}

impl SystemdContainer {
    /// Boots a fresh container from the cached image (building it on first
    /// use on this machine) and waits until systemd reports `running` or
    /// `degraded`.
    pub fn boot() -> SystemdContainer {
        Self::boot_with(BootOptions::default())
    }

    /// [`boot`](Self::boot) with `options` (a small state filesystem).
    pub fn boot_with(options: BootOptions) -> SystemdContainer {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let podman = SharedPodman::get();
        let state_fs = options.small_state_fs_kib.map(HostTmpfs::mount);
        let volume = state_fs
            .as_ref()
            .map(|fs| format!("{}:{STATE_DIR}", fs.dir.display()));
        let name = format!(
            "fleet-sd-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let owner = owner_id();
        let label = format!("{OWNER_LABEL}={owner}");
        let mut args = vec![
            "run",
            "-d",
            "--name",
            &name,
            "--label",
            &label,
            "--privileged",
            "--systemd=always",
            "--network",
            "host",
            "--hostname",
            "fleet-device",
        ];
        if let Some(v) = &volume {
            args.extend(["--volume", v.as_str()]);
        }
        args.extend([podman.image.as_str(), "/sbin/init"]);
        podman.run(&args);
        let c = SystemdContainer {
            name,
            exec_done: Mutex::new(Vec::new()),
            state_fs,
        };
        c.wait_booted();
        c
    }

    /// Whether a container named `name` exists in the shared storage.
    pub fn exists(name: &str) -> bool {
        let mut cmd = SharedPodman::get().command();
        cmd.args(["container", "exists", name]);
        run_bounded(&mut cmd, PODMAN_TIMEOUT, MAX_OUTPUT)
            .unwrap_or_else(|e| panic!("podman container exists {name}: {e}"))
            .success()
    }

    /// The container's name in the shared Podman storage.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host directory that is the container's [`STATE_DIR`], when it
    /// boots with [`BootOptions::small_state_fs_kib`].
    pub fn state_fs_host_dir(&self) -> Option<&Path> {
        self.state_fs.as_ref().map(|fs| fs.dir.as_path())
    }

    /// Runs `args` in the container (as root), bounded by [`EXEC_TIMEOUT`].
    pub fn exec(&self, args: &[&str]) -> ExecOutput {
        self.exec_with_timeout(args, EXEC_TIMEOUT)
    }

    /// [`exec`](Self::exec) with its own bound; panics on timeout.
    ///
    /// `podman exec` now and then returns without all of the command's
    /// output (an attach race: a `readlink` that exited 0 came back empty).
    /// So the command writes into files in the container, [`EXEC_SCRIPT`]
    /// prints them with a trailer, and output without its trailer is read
    /// again from the files instead of being taken for what the command
    /// said.
    pub fn exec_with_timeout(&self, args: &[&str], timeout: Duration) -> ExecOutput {
        let (id, out) = self.exec_run(args, timeout);
        if let Some(whole) = exec_trailed(&out, &id) {
            lock(&self.exec_done).push(id);
            return whole;
        }
        for _ in 0..EXEC_READ_BACK_ATTEMPTS {
            if let Some(whole) = exec_trailed(&self.exec_replay(&id), &id) {
                lock(&self.exec_done).push(id);
                return whole;
            }
        }
        eprintln!(
            "{}: exec {args:?}: the output came back without its end and could not be read \
             again from {EXEC_DIR}/{id}.*: taking it as it came",
            self.name
        );
        exec_output(out)
    }

    /// Runs `args` through [`EXEC_SCRIPT`]; returns the exec's id and what
    /// `podman exec` returned.
    fn exec_run(&self, args: &[&str], timeout: Duration) -> (String, Output) {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let id = format!(
            "{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let done = std::mem::take(&mut *lock(&self.exec_done)).join(" ");
        let out = self.exec_script("run", &id, &done, args, timeout);
        (id, out)
    }

    /// Prints again what the exec `id` left in [`EXEC_DIR`].
    fn exec_replay(&self, id: &str) -> Output {
        self.exec_script("replay", id, "", &[], PODMAN_TIMEOUT)
    }

    /// [`EXEC_SCRIPT`] in `mode` for the exec `id`, removing the files of
    /// the execs `done` (space-separated ids) first.
    fn exec_script(
        &self,
        mode: &str,
        id: &str,
        done: &str,
        args: &[&str],
        timeout: Duration,
    ) -> Output {
        let mut wrapped = vec![
            "sh",
            "-c",
            EXEC_SCRIPT,
            "sh",
            EXEC_DIR,
            EXEC_TRAILER,
            mode,
            id,
            done,
        ];
        wrapped.extend_from_slice(args);
        self.exec_raw(&wrapped, timeout)
    }

    /// One `podman exec`, as is.
    fn exec_raw(&self, args: &[&str], timeout: Duration) -> Output {
        let mut cmd = SharedPodman::get().command();
        cmd.args(["exec", &self.name]).args(args);
        run_bounded(&mut cmd, timeout, MAX_OUTPUT)
            .unwrap_or_else(|e| panic!("{}: exec {args:?}: {e}", self.name))
    }

    /// Runs `args`; panics with its output unless it exits 0; returns stdout.
    pub fn exec_ok(&self, args: &[&str]) -> String {
        let out = self.exec(args);
        if !out.success() {
            panic!(
                "{}: {args:?} exited {:?}\nstdout:\n{}\nstderr:\n{}",
                self.name, out.code, out.stdout, out.stderr
            );
        }
        out.stdout
    }

    /// `sh -c script`, which must exit 0; returns stdout.
    pub fn sh(&self, script: &str) -> String {
        self.exec_ok(&["sh", "-c", script])
    }

    /// Copies the host file or directory `host` to `dest` in the container.
    pub fn copy_in(&self, host: &Path, dest: &str) {
        SharedPodman::get().run(&[
            "cp",
            &host.to_string_lossy(),
            &format!("{}:{dest}", self.name),
        ]);
    }

    /// Writes `content` to `dest` (parents created) with `mode`, owned
    /// root:root.
    pub fn write_file(&self, dest: &str, content: &[u8], mode: u32) {
        let tmp = tempfile::NamedTempFile::new()
            .unwrap_or_else(|e| panic!("cannot create a temp file: {e}"));
        std::fs::write(tmp.path(), content)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.path().display()));
        let parent = Path::new(dest)
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".to_owned());
        self.exec_ok(&["mkdir", "-p", &parent]);
        self.copy_in(tmp.path(), dest);
        self.exec_ok(&["chown", "root:root", dest]);
        self.exec_ok(&["chmod", &format!("{mode:o}"), dest]);
    }

    /// Reads `path` in the container.
    pub fn read_file(&self, path: &str) -> String {
        self.exec_ok(&["cat", path])
    }

    /// Copies the package in and installs it with `dpkg -i`; returns what
    /// dpkg (and the maintainer scripts) printed. Panics when dpkg fails.
    pub fn install_deb(&self, deb: &Path) -> String {
        let name = deb
            .file_name()
            .unwrap_or_else(|| panic!("{} has no file name", deb.display()))
            .to_string_lossy()
            .into_owned();
        let dest = format!("/tmp/{name}");
        self.copy_in(deb, &dest);
        let out = self.exec(&["dpkg", "-i", &dest]);
        let text = format!("{}{}", out.stdout, out.stderr);
        if !out.success() {
            panic!(
                "{}: dpkg -i {name} failed ({:?}):\n{text}\nupdater journal:\n{}",
                self.name,
                out.code,
                self.journal("fleet-updater.service")
            );
        }
        text
    }

    /// Installs this build's device package ([`crate::device_deb`]).
    pub fn install_device(&self) -> String {
        self.install_deb(&crate::device_deb())
    }

    /// Writes the agent's config for `agent` (and its NATS password file,
    /// root:fleet-agent 0640, like the config): run after the package is
    /// installed (the group must exist). Does not start the agent.
    pub fn configure_agent(&self, agent: &AgentSettings) {
        self.write_file(NATS_PASSWORD_FILE, agent.password.as_bytes(), 0o640);
        self.exec_ok(&["chgrp", "fleet-agent", NATS_PASSWORD_FILE]);
        let config = serde_json::json!({
            "device-id": agent.device_id,
            "nats": {
                "servers": [agent.nats_url],
                "auth": {
                    "method": "user-password",
                    "user": agent.device_id,
                    "password-file": NATS_PASSWORD_FILE,
                },
            },
            "podman": {"enabled": agent.podman},
        });
        let text = serde_json::to_string_pretty(&config).unwrap_or_default();
        self.write_file(AGENT_CONFIG, text.as_bytes(), 0o640);
        self.exec_ok(&["chgrp", "fleet-agent", AGENT_CONFIG]);
    }

    /// The unit's `ActiveState` (`active`, `activating`, `failed`, ...).
    pub fn active_state(&self, unit: &str) -> String {
        self.exec(&["systemctl", "show", "-p", "ActiveState", "--value", unit])
            .stdout
            .trim()
            .to_owned()
    }

    /// Waits until `unit` is `active` (for `Type=notify`: READY=1 was sent).
    /// Panics with its status and journal after `timeout`.
    pub fn wait_active(&self, unit: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.active_state(unit) == "active" {
                return;
            }
            if Instant::now() >= deadline {
                let status = self.exec(&["systemctl", "status", "--no-pager", "-l", unit]);
                panic!(
                    "{}: {unit} not active within {timeout:?}\n{}\njournal:\n{}",
                    self.name,
                    status.stdout,
                    self.journal(unit)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The unit's journal of this boot (the last 200 lines).
    pub fn journal(&self, unit: &str) -> String {
        let out = self.exec(&[
            "journalctl",
            "-b",
            "--no-pager",
            "-o",
            "short-precise",
            "-n",
            JOURNAL_LINES_IN_PANIC,
            "-u",
            unit,
        ]);
        out.stdout
    }

    /// Adds `pem` to the system trust store (update-ca-certificates).
    pub fn trust_ca(&self, name: &str, pem: &str) {
        self.write_file(
            &format!("/usr/local/share/ca-certificates/{name}.crt"),
            pem.as_bytes(),
            0o644,
        );
        self.exec_ok(&["update-ca-certificates"]);
    }

    /// Makes the installed updater trust `ca_pem` for artifact HTTPS (and
    /// OCI registries over TLS): `/etc/harmony-fleet/artifact-ca.pem` and
    /// `updater.json` naming it, then a restart of the updater when it runs.
    pub fn trust_artifact_ca(&self, ca_pem: &str) {
        self.write_file(ARTIFACT_CA, ca_pem.as_bytes(), 0o644);
        self.write_file(
            "/etc/harmony-fleet/updater.json",
            format!("{{\"ca-file\": \"{ARTIFACT_CA}\"}}\n").as_bytes(),
            0o644,
        );
        self.exec_ok(&["systemctl", "try-restart", "fleet-updater.service"]);
    }

    /// Imports the harness's busybox image into `user`'s rootless Podman
    /// storage (the user must exist, with subordinate ids and a running
    /// user manager); returns the image name.
    pub fn import_busybox_as(&self, user: &str) -> String {
        let tmp = tempfile::NamedTempFile::new()
            .unwrap_or_else(|e| panic!("cannot create a temp file: {e}"));
        std::fs::write(tmp.path(), busybox_rootfs_tar())
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.path().display()));
        self.copy_in(tmp.path(), "/tmp/busybox-rootfs.tar");
        self.exec_ok(&["chmod", "0644", "/tmp/busybox-rootfs.tar"]);
        let args = self.as_user_args(
            user,
            &[
                "podman",
                "import",
                "--quiet",
                "/tmp/busybox-rootfs.tar",
                crate::BUSYBOX_IMAGE,
            ],
        );
        self.exec_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        crate::BUSYBOX_IMAGE.to_owned()
    }

    /// `args` run as `user` in a transient system service of the container
    /// with the user's runtime dir (as the agent runs): for
    /// [`exec`](Self::exec).
    pub fn as_user_args(&self, user: &str, args: &[&str]) -> Vec<String> {
        let uid = self.exec_ok(&["id", "-u", user]).trim().to_owned();
        let mut v: Vec<String> = [
            "systemd-run",
            "--quiet",
            "--wait",
            "--pipe",
            "--collect",
            "-p",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        v.push(format!("User={user}"));
        v.push("-E".to_owned());
        v.push(format!("XDG_RUNTIME_DIR=/run/user/{uid}"));
        v.extend(args.iter().map(|s| (*s).to_owned()));
        v
    }

    /// SIGKILL to the whole container: systemd and everything under it die
    /// at once. The container stays, stopped, with its disk; see
    /// [`start`](Self::start).
    pub fn kill(&self) {
        let podman = SharedPodman::get();
        podman.run(&["kill", "-s", "KILL", &self.name]);
        poll_until(
            &format!("{} to stop after SIGKILL", self.name),
            PODMAN_TIMEOUT,
            || (self.state() != "running").then_some(()),
        );
    }

    /// Boots the (stopped) container again with the same disk, and waits
    /// for systemd.
    pub fn start(&self) {
        SharedPodman::get().run(&["start", &self.name]);
        self.wait_booted();
    }

    /// Power loss and power back: [`kill`](Self::kill), then
    /// [`start`](Self::start).
    pub fn power_cycle(&self) {
        self.kill();
        self.start();
    }

    /// A clean reboot: systemd stops every unit (their stop timeouts
    /// apply), then the container boots again.
    pub fn restart(&self) {
        SharedPodman::get()
            .try_run(
                &[
                    "stop",
                    "-t",
                    &SHUTDOWN_TIMEOUT.as_secs().to_string(),
                    &self.name,
                ],
                SHUTDOWN_TIMEOUT + PODMAN_TIMEOUT,
            )
            .unwrap_or_else(|e| panic!("podman stop {}: {e}", self.name));
        self.start();
    }

    /// Sends one request line to the local socket at `path` in the
    /// container, as `user` with its groups (the sockets admit by peer
    /// credentials, and a peer outside the container's PID namespace has
    /// none they can read), and returns the response line.
    pub fn socket_request(
        &self,
        user: &str,
        path: &str,
        request: &str,
        timeout: Duration,
    ) -> String {
        // socat: stdin to the socket; after stdin's end, up to `timeout`
        // for the answer (an upgrade is answered after its probe).
        let script = format!(
            "printf '%s\\n' \"$1\" | exec setpriv --reuid={user} --regid={user} --init-groups \
             socat -t {secs} - UNIX-CONNECT:{path}",
            secs = timeout.as_secs().max(1)
        );
        let out = self.exec_with_timeout(
            &["sh", "-c", &script, "sh", request],
            timeout + Duration::from_secs(10),
        );
        if !out.success() {
            panic!("{}: request to {path} as {user} failed: {out:?}", self.name);
        }
        out.stdout
    }

    /// `path` of the running container as the host reaches it, through
    /// `/proc/<its PID 1>/root`: a test can, say, connect to the updater
    /// socket in the container's /run (as root, whom the updater admits).
    pub fn host_path(&self, path: &str) -> PathBuf {
        let pid = SharedPodman::get()
            .run(&["inspect", "--format", "{{.State.Pid}}", &self.name])
            .trim()
            .to_owned();
        assert!(
            pid.parse::<u32>().is_ok_and(|p| p > 0),
            "{}: no PID 1 ({pid:?}): is it running?",
            self.name
        );
        PathBuf::from(format!("/proc/{pid}/root")).join(path.trim_start_matches('/'))
    }

    /// Podman's state of the container (`running`, `exited`, ...).
    pub fn state(&self) -> String {
        SharedPodman::get()
            .run(&["inspect", "--format", "{{.State.Status}}", &self.name])
            .trim()
            .to_owned()
    }

    fn wait_booted(&self) {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < deadline {
            // Until systemd's bus is up, systemctl fails to connect; then
            // --wait blocks until start-up finished.
            let left = deadline.saturating_duration_since(Instant::now());
            let out = self.exec_with_timeout(&["systemctl", "is-system-running", "--wait"], left);
            last = format!("{}{}", out.stdout, out.stderr).trim().to_owned();
            match out.stdout.trim() {
                "running" | "degraded" => return,
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        let failed = self.exec(&["systemctl", "--failed", "--no-pager"]);
        panic!(
            "{}: systemd did not finish booting within {BOOT_TIMEOUT:?} (last: {last:?})\n{}",
            self.name, failed.stdout
        );
    }
}

impl Drop for SystemdContainer {
    fn drop(&mut self) {
        if let Err(e) =
            SharedPodman::get().try_run(&["rm", "-f", "-t", "0", &self.name], PODMAN_TIMEOUT)
        {
            eprintln!("harness: cannot remove {}: {e}", self.name);
        }
    }
}

/// Where a command run by [`SystemdContainer::exec`] writes its output.
const EXEC_DIR: &str = "/run/fleet-test-exec";
/// Ends stdout and stderr of a command run by [`SystemdContainer::exec`]:
/// `\n<trailer> <id> <exit code>\n` and `\n<trailer> <id>\n`.
const EXEC_TRAILER: &str = "fleet-test-exec-end";
/// How often output that came back without its trailer is read again.
const EXEC_READ_BACK_ATTEMPTS: usize = 3;
/// `sh -c EXEC_SCRIPT sh <dir> <trailer> run|replay <id> <ids done>
/// [command...]`: `run` removes the files of the execs done and runs the
/// command into files; both then print the files, each followed by its
/// trailer, and exit with the command's code.
const EXEC_SCRIPT: &str = r#"d=$1; t=$2; mode=$3; id=$4; old=$5; shift 5
if [ "$mode" = run ]; then
  mkdir -p "$d" || exit 125
  for o in $old; do rm -f "$d/$o.out" "$d/$o.err" "$d/$o.rc"; done
  "$@" >"$d/$id.out" 2>"$d/$id.err" </dev/null
  echo "$?" >"$d/$id.rc"
fi
rc=$(cat "$d/$id.rc") || exit 125
cat "$d/$id.out"; printf '\n%s %s %s\n' "$t" "$id" "$rc"
cat "$d/$id.err" >&2; printf '\n%s %s\n' "$t" "$id" >&2
exit "$rc""#;

/// The command's output if both streams end with their trailer for `id`.
fn exec_trailed(out: &Output, id: &str) -> Option<ExecOutput> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (stdout, code) = stdout
        .strip_suffix('\n')?
        .rsplit_once(&format!("\n{EXEC_TRAILER} {id} "))
        .filter(|(_, code)| !code.contains('\n'))?;
    let code: i32 = code.parse().ok()?;
    let stderr = stderr.strip_suffix(&format!("\n{EXEC_TRAILER} {id}\n"))?;
    Some(ExecOutput {
        code: Some(code),
        stdout: stdout.to_owned(),
        stderr: stderr.to_owned(),
    })
}

fn exec_output(out: Output) -> ExecOutput {
    ExecOutput {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::image::{mirrors_in_deb822, mirrors_in_list};
    use super::owner::owner_alive;
    use super::tmpfs::STATE_FS_DIR;
    use super::util::create_dir_all;
    use super::*;

    #[test]
    fn mirrors_are_read_from_deb822_and_one_line_sources() {
        let deb822 = "Types: deb\n# comment\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n\
                      Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n";
        assert_eq!(
            mirrors_in_deb822(deb822),
            vec!["http://deb.debian.org/debian"]
        );
        let list = "deb [arch=amd64] http://mirror.example/debian bookworm main\n\
                    deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n";
        assert_eq!(mirrors_in_list(list), vec!["http://mirror.example/debian"]);
    }

    #[test]
    fn a_small_state_fs_is_small_and_unmounted_on_drop_as_is_an_orphan() {
        let fs = HostTmpfs::mount(64);
        let dir = fs.dir.clone();
        assert!(crate::podman::mounts_under(&dir).contains(&dir));
        let full = std::fs::write(dir.join("filler"), vec![0u8; 128 * 1024])
            .expect_err("128 KiB do not fit in 64");
        assert_eq!(full.raw_os_error(), Some(28), "{full}");
        drop(fs);
        assert!(!dir.exists());
        assert!(!crate::podman::mounts_under(&dir).contains(&dir));

        // Left by a test process that is gone (its owner never was).
        let orphan = Path::new(STATE_FS_DIR).join(format!("0-0-{}", std::process::id()));
        create_dir_all(&orphan);
        rustix::mount::mount(
            "fleet-state",
            &orphan,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            None,
        )
        .expect("mount");
        HostTmpfs::remove_orphans();
        assert!(!orphan.exists());
        assert!(!crate::podman::mounts_under(&orphan).contains(&orphan));
    }

    fn output(stdout: &str, stderr: &str) -> Output {
        use std::os::unix::process::ExitStatusExt;
        Output {
            status: std::process::ExitStatus::from_raw(0),
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
            stdout_cut: 0,
            stderr_cut: 0,
        }
    }

    #[test]
    fn exec_output_counts_only_with_both_trailers_of_its_own_id() {
        let whole = output(
            "a\nb\nfleet-test-exec-end 7-1 3\n",
            "warn\n\nfleet-test-exec-end 7-1\n",
        );
        let got = exec_trailed(&whole, "7-1").expect("whole");
        assert_eq!(
            (got.code, got.stdout.as_str(), got.stderr.as_str()),
            (Some(3), "a\nb", "warn\n")
        );
        for lost in [
            output("", ""),
            output("a\nb", "warn\n\nfleet-test-exec-end 7-1\n"),
            output("a\nb\nfleet-test-exec-end 7-1 3\n", "warn\n"),
            output(
                "a\nb\nfleet-test-exec-end 7-1 3",
                "\nfleet-test-exec-end 7-1\n",
            ),
            output(
                "a\nb\nfleet-test-exec-end 7-2 3\n",
                "\nfleet-test-exec-end 7-1\n",
            ),
        ] {
            assert!(exec_trailed(&lost, "7-1").is_none(), "{lost:?}");
        }
    }

    #[test]
    fn exec_output_is_exact_and_can_be_read_again_until_the_next_exec() {
        let c = SystemdContainer::boot();
        let out = c.exec(&[
            "sh",
            "-c",
            "printf 'no newline'; printf 'why\\n' >&2; exit 3",
        ]);
        assert_eq!(
            (out.code, out.stdout.as_str(), out.stderr.as_str()),
            (Some(3), "no newline", "why\n")
        );
        let big = c.exec_ok(&["sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' x"]);
        assert_eq!(big.len(), 1_000_000);
        assert!(big.bytes().all(|b| b == b'x'));

        // What a lost output is read back from, and when it goes.
        let (id, _) = c.exec_run(&["echo", "kept"], EXEC_TIMEOUT);
        let again = exec_trailed(&c.exec_replay(&id), &id).expect("read again");
        assert_eq!((again.code, again.stdout.as_str()), (Some(0), "kept\n"));
        lock(&c.exec_done).push(id.clone());
        c.exec_ok(&["true"]);
        let files = c.exec_ok(&["ls", EXEC_DIR]);
        assert!(!files.contains(&format!("{id}.")), "{files}");
    }

    #[test]
    fn this_process_owns_and_a_gone_one_does_not() {
        assert!(owner_alive(&owner_id()));
        assert!(!owner_alive("0:0"));
        assert!(!owner_alive("garbage"));
        let pid = std::process::id();
        assert!(
            !owner_alive(&format!("{pid}:1")),
            "a reused pid has another start time"
        );
    }
}
