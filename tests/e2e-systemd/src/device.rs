//! The device: the harness's booted Debian 12 container with this build's
//! package installed, the updater replaced by its fault-injection build
//! (`make test-agents`), shortened bounds, the host's artifact CA trusted,
//! and the agent configured for the host's nats-server and started (READY).
//!
//! What the tests read of it: the active link, the agent systemd runs (its
//! main PID's executable), every agent process, the updater journal, unit
//! properties, and the unit journals.

use std::time::{Duration, Instant};

use fleet_common::contracts::{Journal, JournalPhase};
use fleet_harness::{
    poll_until, test_updater_path, workspace_version, AgentSettings, BootOptions, SystemdContainer,
};
use fleet_updater::{Fault, FaultAction, FaultPoint, FAULT_ENV};

use crate::fleet::Fleet;

pub const LINK: &str = "/usr/local/bin/fleet-agent";
pub const VERSIONS_DIR: &str = "/usr/lib/harmony-fleet";
pub const UPDATER: &str = "/usr/lib/harmony-fleet/fleet-updater";
pub const BOOTSTRAP: &str = "/usr/lib/harmony-fleet/bootstrap/fleet-agent";
pub const JOURNAL: &str = "/var/lib/harmony-fleet/updater/journal.json";
pub const AGENT_UNIT: &str = "fleet-agent.service";
pub const UPDATER_UNIT: &str = "fleet-updater.service";

/// systemd's start limit of the agent in these tests (the unit says
/// `TimeoutStartSec=4min`): a candidate that never sends `READY=1` fails
/// in this. The real agent is READY within a few seconds here, also with
/// three devices at work at once on 2 cores.
pub const AGENT_START_TIMEOUT_SECS: u64 = 20;
/// The updater's bounds (`FLEET_UPDATER_TEST_BOUNDS`, ms): its start bound
/// 5 s above systemd's, as in production (4 min 15 s around 4 min), so
/// systemd's timeout is what fails a start. The others keep the binding
/// ones (`docs/design/limits.md`).
pub const UPDATER_TEST_BOUNDS: &str = "start=25000";
/// The agent's `RestartSec` (5 s in the unit).
pub const AGENT_RESTART_SEC: &str = "1s";
/// The updater's `RestartSec` (2 s in the unit): each SIGKILL row waits it.
pub const UPDATER_RESTART_SEC: &str = "500ms";

const BOUNDS_DROPIN: &str = "/etc/systemd/system/fleet-updater.service.d/90-e2e-bounds.conf";
const AGENT_DROPIN: &str = "/etc/systemd/system/fleet-agent.service.d/90-e2e-bounds.conf";
const FAULT_DROPIN: &str = "/etc/systemd/system/fleet-updater.service.d/95-e2e-fault.conf";

/// The agent starting, reaching NATS and READY (generous: 2 cores, three
/// devices and their agents at once).
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// An upgrade or a recovery settling (download, probe, cutover; a start
/// timeout and a rollback).
pub const SETTLE: Duration = Duration::from_secs(120);

/// One device in its container.
#[derive(Debug)]
pub struct Device {
    pub c: SystemdContainer,
    pub id: String,
    /// The package's (bootstrap) agent version.
    pub bootstrap: String,
}

impl Device {
    /// Boots a container and makes it a device of `fleet` (see the module
    /// doc); returns once its agent runs and reports in NATS.
    pub fn install(fleet: &Fleet, id: &str, podman: bool) -> Device {
        Self::install_with(fleet, id, podman, BootOptions::default())
    }

    /// [`install`](Self::install) on a container booted with `options`
    /// (a small `/var/lib/harmony-fleet`): the package is installed onto it.
    pub fn install_with(fleet: &Fleet, id: &str, podman: bool, options: BootOptions) -> Device {
        let c = SystemdContainer::boot_with(options);
        c.install_device();
        // The fault-injection updater, renamed into place (the package's
        // runs: its file is busy).
        c.copy_in(
            &test_updater_path(),
            "/usr/lib/harmony-fleet/.fleet-updater.e2e",
        );
        c.exec_ok(&["chmod", "0755", "/usr/lib/harmony-fleet/.fleet-updater.e2e"]);
        c.exec_ok(&[
            "mv",
            "-f",
            "/usr/lib/harmony-fleet/.fleet-updater.e2e",
            UPDATER,
        ]);
        c.write_file(
            BOUNDS_DROPIN,
            format!(
                "# End-to-end tests: shortened bounds (tests/e2e-systemd).\n[Service]\n\
                 Environment={}={UPDATER_TEST_BOUNDS}\nRestartSec={UPDATER_RESTART_SEC}\n",
                fleet_updater::TEST_BOUNDS_ENV
            )
            .as_bytes(),
            0o644,
        );
        c.write_file(
            AGENT_DROPIN,
            format!(
                "# End-to-end tests: shortened bounds (tests/e2e-systemd).\n[Service]\n\
                 TimeoutStartSec={AGENT_START_TIMEOUT_SECS}s\nRestartSec={AGENT_RESTART_SEC}\n"
            )
            .as_bytes(),
            0o644,
        );
        c.exec_ok(&["systemctl", "daemon-reload"]);
        c.trust_artifact_ca(&fleet.ca.ca_pem());
        c.exec_ok(&["systemctl", "restart", UPDATER_UNIT]);
        let mut settings = AgentSettings::for_fleet_server(id, &fleet.nats);
        settings.podman = podman;
        c.configure_agent(&settings);
        let d = Device {
            c,
            id: id.to_owned(),
            bootstrap: workspace_version(),
        };
        let start =
            d.c.exec_with_timeout(&["systemctl", "start", AGENT_UNIT], READY_TIMEOUT);
        assert!(
            start.success(),
            "{}: the agent did not start: {start:?}\n{}",
            d.id,
            d.c.journal(AGENT_UNIT)
        );
        assert_eq!(
            d.running_version().as_deref(),
            Some(d.bootstrap.as_str()),
            "the package's agent runs"
        );
        fleet.wait_reporting(id, &d.bootstrap, READY_TIMEOUT);
        d
    }

    /// `systemctl show -p PROPERTY --value UNIT`.
    pub fn show(&self, unit: &str, property: &str) -> String {
        self.c
            .exec_ok(&["systemctl", "show", "-p", property, "--value", unit])
            .trim()
            .to_owned()
    }

    /// Where the active link points (read through the device's root from
    /// the host: no `podman exec`).
    pub fn link(&self) -> String {
        let p = self.c.host_path(LINK);
        std::fs::read_link(&p)
            .unwrap_or_else(|e| panic!("{}: readlink {LINK}: {e}", self.id))
            .to_string_lossy()
            .into_owned()
    }

    /// `/usr/lib/harmony-fleet/fleet-agent-v<version>`.
    pub fn versioned(&self, version: &str) -> String {
        format!("{VERSIONS_DIR}/fleet-agent-v{version}")
    }

    /// The version whose versioned binary `path` is.
    pub fn version_of(path: &str) -> Option<String> {
        path.strip_prefix(VERSIONS_DIR)?
            .strip_prefix("/fleet-agent-v")
            .map(str::to_owned)
    }

    /// The agent unit's `ActiveState` and the executable of its main
    /// process, when it has one: one `podman exec`.
    pub fn agent_state(&self) -> (String, Option<String>) {
        let out = self.c.sh(&format!(
            "systemctl show -p ActiveState --value {AGENT_UNIT}; \
             pid=$(systemctl show -p MainPID --value {AGENT_UNIT}); \
             if [ \"$pid\" != 0 ]; then readlink /proc/$pid/exe || true; fi"
        ));
        let mut lines = out.lines();
        let state = lines.next().unwrap_or_default().trim().to_owned();
        let exe = lines
            .next()
            .map(|l| l.trim().to_owned())
            .filter(|l| !l.is_empty());
        (state, exe)
    }

    /// The executable of the agent unit's main process, when it has one.
    pub fn running_exe(&self) -> Option<String> {
        self.agent_state().1
    }

    /// The version of the agent systemd runs (its main process is a
    /// versioned binary), when one runs.
    pub fn running_version(&self) -> Option<String> {
        self.running_exe().and_then(|e| Self::version_of(&e))
    }

    /// Every agent process in the device (`/usr/local/bin/fleet-agent run`,
    /// real or stand-in), as `pid command line`, read from the device's
    /// own /proc (its PID namespace) through its root.
    pub fn agent_processes(&self) -> Vec<String> {
        let proc_dir = self.c.host_path("/proc");
        let entries = std::fs::read_dir(&proc_dir)
            .unwrap_or_else(|e| panic!("{}: {}: {e}", self.id, proc_dir.display()));
        let mut found = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            // Gone meanwhile: not running.
            let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            if cmdline.contains(&format!("{LINK} run")) {
                found.push(format!("{name} {}", cmdline.trim_end()));
            }
        }
        found.sort();
        found
    }

    /// The updater journal, when there is one (read from the host).
    pub fn journal(&self) -> Option<Journal> {
        let bytes = match std::fs::read(self.c.host_path(JOURNAL)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("{}: reading {JOURNAL}: {e}", self.id),
        };
        Some(serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "{}: the journal is not valid: {e}: {}",
                self.id,
                String::from_utf8_lossy(&bytes)
            )
        }))
    }

    /// The journal's transaction phase, when there is a transaction.
    pub fn journal_phase(&self) -> Option<JournalPhase> {
        self.journal()?.transaction.map(|t| t.phase)
    }

    /// The bytes of a file in the device (read through its /proc root).
    pub fn read_bytes(&self, path: &str) -> Vec<u8> {
        let p = self.c.host_path(path);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: cannot read {path}: {e}", self.id))
    }

    /// Waits until the agent unit is active running `version`, and returns
    /// its main PID.
    pub fn wait_agent(&self, version: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let (state, exe) = self.agent_state();
            if state == "active"
                && exe.as_deref().and_then(Self::version_of).as_deref() == Some(version)
            {
                return self.show(AGENT_UNIT, "MainPID");
            }
            if Instant::now() >= deadline {
                panic!(
                    "{}: agent {version} not active within {timeout:?} (runs {:?})\nagent:\n{}\nupdater:\n{}",
                    self.id,
                    self.running_exe(),
                    self.c.journal(AGENT_UNIT),
                    self.c.journal(UPDATER_UNIT)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until the journal's transaction is attempt `uuid` in a
    /// terminal phase (`committed`, `failed`, `rollback-failed`).
    pub fn wait_journal_terminal(
        &self,
        uuid: fleet_common::validate::AttemptUuid,
        timeout: Duration,
    ) -> fleet_common::contracts::Transaction {
        poll_until(
            &format!("{}: the journal to end attempt {uuid}", self.id),
            timeout,
            || {
                self.journal()?.transaction.filter(|t| {
                    t.attempt.uuid == uuid
                        && matches!(
                            t.phase,
                            JournalPhase::Committed
                                | JournalPhase::Failed
                                | JournalPhase::RollbackFailed
                        )
                })
            },
        )
    }

    /// Arms `point` (`<point>:stop`) with a drop-in and restarts the
    /// updater with it.
    pub fn arm(&self, point: FaultPoint) {
        let fault = Fault {
            point,
            action: FaultAction::Stop,
        };
        self.write_host(
            FAULT_DROPIN,
            format!("[Service]\nEnvironment={FAULT_ENV}={}\n", fault.env_value()).as_bytes(),
        );
        let env = self.c.sh(&format!(
            "systemctl daemon-reload && systemctl restart {UPDATER_UNIT} && \
             systemctl show -p Environment --value {UPDATER_UNIT}"
        ));
        assert!(env.contains(&fault.env_value()), "not armed: {env}");
    }

    /// Removes the fault drop-in: the next updater start runs clean.
    pub fn disarm(&self) {
        let p = self.c.host_path(FAULT_DROPIN);
        std::fs::remove_file(&p)
            .unwrap_or_else(|e| panic!("{}: removing {FAULT_DROPIN}: {e}", self.id));
        self.c.exec_ok(&["systemctl", "daemon-reload"]);
    }

    /// Writes a root-owned 0644 file in the device through its root from
    /// the host (the container is rootful: root is root there); its
    /// directory exists. No `podman exec`.
    fn write_host(&self, path: &str, content: &[u8]) {
        use std::os::unix::fs::PermissionsExt;
        let p = self.c.host_path(path);
        std::fs::write(&p, content).unwrap_or_else(|e| panic!("{}: writing {path}: {e}", self.id));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644))
            .unwrap_or_else(|e| panic!("{}: chmod {path}: {e}", self.id));
    }

    /// Waits until the updater stopped itself at its armed point (state
    /// `T`); returns its PID. One shell loop in the device, so the wait
    /// costs no `podman exec` per check.
    pub fn wait_stopped_at_fault(&self, point: FaultPoint, timeout: Duration) -> u32 {
        let script = format!(
            "end=$(( $(date +%s) + {secs} )); \
             while [ \"$(date +%s)\" -lt \"$end\" ]; do \
               pid=$(systemctl show -p MainPID --value {UPDATER_UNIT}); \
               if [ \"$pid\" != 0 ] && [ \"$(cut -d' ' -f3 /proc/$pid/stat 2>/dev/null)\" = T ]; then echo \"$pid\"; exit 0; fi; \
               sleep 0.05; \
             done; exit 1",
            secs = timeout.as_secs()
        );
        let out = self
            .c
            .exec_with_timeout(&["sh", "-c", &script], timeout + Duration::from_secs(30));
        let pid = out
            .stdout
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|_| out.success());
        let pid = pid.unwrap_or_else(|| {
            panic!(
                "{}: the updater did not stop at {point} within {timeout:?}\nupdater:\n{}\nagent:\n{}",
                self.id,
                self.c.journal(UPDATER_UNIT),
                self.c.journal(AGENT_UNIT)
            )
        });
        // What that very process logged (journald may take a moment).
        let needle = format!("fault injection: stopping at {point}");
        poll_until(
            &format!("{}: updater {pid} to log {needle:?}", self.id),
            Duration::from_secs(10),
            || {
                self.c
                    .exec_ok(&[
                        "journalctl",
                        "--no-pager",
                        "-o",
                        "cat",
                        &format!("_PID={pid}"),
                    ])
                    .contains(&needle)
                    .then_some(())
            },
        );
        pid
    }

    /// SIGKILL to the updater's `pid`, then waits until systemd has
    /// restarted it (`NRestarts` up, another PID, active again). One shell
    /// loop in the device.
    pub fn kill_updater(&self, pid: u32, timeout: Duration) {
        let script = format!(
            "show() {{ systemctl show -p \"$1\" --value {UPDATER_UNIT}; }}; \
             before=$(show NRestarts); kill -KILL {pid} || exit 2; \
             end=$(( $(date +%s) + {secs} )); \
             while [ \"$(date +%s)\" -lt \"$end\" ]; do \
               if [ \"$(show NRestarts)\" -gt \"$before\" ] && [ \"$(show MainPID)\" != {pid} ] \
                  && [ \"$(show ActiveState)\" = active ]; then exit 0; fi; \
               sleep 0.05; \
             done; exit 1",
            secs = timeout.as_secs()
        );
        let out = self
            .c
            .exec_with_timeout(&["sh", "-c", &script], timeout + Duration::from_secs(30));
        assert!(
            out.success(),
            "{}: the killed updater was not restarted by systemd within {timeout:?} ({out:?})\n{}",
            self.id,
            self.c.journal(UPDATER_UNIT)
        );
    }

    /// `fleet-updater status --json` in the device: the updater's status, or
    /// the journal's when it is not running.
    pub fn updater_status(&self) -> serde_json::Value {
        let out = self.c.exec_ok(&["fleet-updater", "status", "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}: {out}"))
    }
}
