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
    poll_until, test_updater_path, workspace_version, AgentSettings, SystemdContainer,
};
use fleet_updater::{Fault, FaultAction, FaultPoint, FAULT_ENV};

use crate::fleet::Fleet;

pub const LINK: &str = "/usr/local/bin/fleet-agent";
pub const VERSIONS_DIR: &str = "/usr/lib/harmony-fleet";
pub const UPDATER: &str = "/usr/lib/harmony-fleet/fleet-updater";
pub const BOOTSTRAP: &str = "/usr/share/harmony-fleet/bootstrap/fleet-agent";
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
/// systemd's timeout is what fails a start. The others keep the seed's.
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
        let c = SystemdContainer::boot();
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

    /// Where the active link points.
    pub fn link(&self) -> String {
        self.c.exec_ok(&["readlink", LINK]).trim().to_owned()
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

    /// The executable of the agent unit's main process, when it has one.
    pub fn running_exe(&self) -> Option<String> {
        let pid = self.show(AGENT_UNIT, "MainPID");
        if pid == "0" || pid.is_empty() {
            return None;
        }
        let out = self.c.exec(&["readlink", &format!("/proc/{pid}/exe")]);
        out.success().then(|| out.stdout.trim().to_owned())
    }

    /// The version of the agent systemd runs (its main process is a
    /// versioned binary), when one runs.
    pub fn running_version(&self) -> Option<String> {
        self.running_exe().and_then(|e| Self::version_of(&e))
    }

    /// Every agent process in the device (`fleet-agent run`, real or
    /// stand-in), as `pid command line`. The pattern is assembled in the
    /// shell so that the shell's own command line does not match it.
    pub fn agent_processes(&self) -> Vec<String> {
        let out = self.c.sh("p=fleet-agent; for d in /proc/[0-9]*; do \
             c=$(tr '\\0' ' ' < $d/cmdline 2>/dev/null) || continue; \
             case \"$c\" in *\"/usr/local/bin/$p run\"*) echo \"${d#/proc/} $c\";; esac; done");
        out.lines().map(str::to_owned).collect()
    }

    /// The updater journal, when there is one.
    pub fn journal(&self) -> Option<Journal> {
        let out = self.c.exec(&["cat", JOURNAL]);
        if !out.success() {
            return None;
        }
        Some(serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
            panic!("{}: the journal is not valid: {e}: {}", self.id, out.stdout)
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
            if self.c.active_state(AGENT_UNIT) == "active"
                && self.running_version().as_deref() == Some(version)
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
        self.c.write_file(
            FAULT_DROPIN,
            format!("[Service]\nEnvironment={FAULT_ENV}={}\n", fault.env_value()).as_bytes(),
            0o644,
        );
        self.c.exec_ok(&["systemctl", "daemon-reload"]);
        self.c.exec_ok(&["systemctl", "restart", UPDATER_UNIT]);
        let env = self.show(UPDATER_UNIT, "Environment");
        assert!(env.contains(&fault.env_value()), "not armed: {env}");
    }

    /// Removes the fault drop-in: the next updater start runs clean.
    pub fn disarm(&self) {
        self.c.exec_ok(&["rm", "-f", FAULT_DROPIN]);
        self.c.exec_ok(&["systemctl", "daemon-reload"]);
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

    /// SIGKILL to the updater's `pid` (systemd restarts it).
    pub fn kill_updater(&self, pid: u32) {
        self.c.exec_ok(&["kill", "-KILL", &pid.to_string()]);
    }

    /// `fleet-updater status --json` in the device: the updater's status, or
    /// the journal's when it is not running.
    pub fn updater_status(&self) -> serde_json::Value {
        let out = self.c.exec_ok(&["fleet-updater", "status", "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}: {out}"))
    }
}
