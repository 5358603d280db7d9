//! `fleet-updater setup`: device setup, idempotent. The package's postinst
//! (and rpm `%post`) runs it on every install and upgrade; a person runs it
//! again as the root repair of `rollback-failed` (REPAIR.md).
//!
//! ```text
//! fleet-updater setup --agent-binary PATH [--config PATH] [--units-from DIR]
//!                     [--repair] [--select VERSION]
//!                     [--root DIR] [--service-manager systemctl|supervisor]
//! ```
//!
//! Steps, in order (each leaves the device usable if the next fails):
//!
//! 1. the journal: corrupt → refused (REPAIR.md); a non-terminal transaction
//!    (`preparing`, `activating`, `rolling-back`) → refused, nothing changed;
//!    `rollback-failed` → with `--repair` this run is the repair (step 9),
//!    without it (a package install) every step but the link and the
//!    quarantine runs, and setup says how to repair; `--repair` on a device
//!    that is not quarantined is refused;
//! 2. with `--units-from DIR` (a checkout's `packaging/`): the units,
//!    sysusers.d and tmpfiles.d files into `/etc` (a package already put
//!    them in `/usr/lib`);
//! 3. users and groups (`systemd-sysusers`), directories
//!    (`systemd-tmpfiles --create`): the updater socket's group and the run
//!    directory's ownership come from these;
//! 4. subordinate uid/gid ranges for the agent user when it has none;
//! 5. the agent binary installed as `fleet-agent-v<version>`, the version
//!    being what `PATH --version` prints (`fleet-agent <version>`), run as the
//!    agent user; identical bytes are left alone;
//! 6. with `--config PATH`: the agent config (a JSON object; the agent
//!    checks the rest) as `/etc/harmony-fleet/agent.json`, root:fleet-agent
//!    0640;
//! 7. the agent's drop-ins: its user manager for rootless Podman
//!    (`user@<uid>.service`, `XDG_RUNTIME_DIR`), restart backoff where
//!    systemd is 254 or newer;
//! 8. the active link, only when absent or dangling: a link to a working
//!    agent (one the updater installed later, say) is never moved;
//! 9. systemd: daemon-reload, enable both units, lingering. In a repair
//!    (REPAIR.md):
//!    stop the updater, stop the agent, select the agent (`--select VERSION`,
//!    else the one of `--agent-binary`), start it and wait for `READY=1`;
//!    only then is the quarantine lifted (the quarantined journal is kept
//!    beside it as `journal.json.repaired-<time>`, the attempt stays in
//!    `finished`, so its UUID is still refused with other content); the
//!    updater is restarted either way (starting the agent pulls it in early,
//!    with the old journal). Otherwise: restart the updater,
//!    and start the agent when its config exists.
//!
//! `--root DIR` prefixes every path (tests, image builds). Without a running
//! systemd (a root prefix, a chroot) the units are enabled offline
//! (`systemctl --root`) when they are installed under the root, nothing is
//! started, a repair needs `--service-manager supervisor` (tests), and users
//! and directories are created only when their sysusers.d/tmpfiles.d files
//! are under the root.

use std::ffi::OsString;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleet_common::contracts::{FinishedAttempt, Journal, JournalPhase, Transaction};
use fleet_common::durable::{self, AtomicFile, DurableError};
use fleet_common::layout::{AGENT_GROUP, AGENT_UNIT, AGENT_USER, UPDATER_UNIT};
use fleet_common::process::{run_bounded, ProcessError};
use fleet_common::time::Timestamp;
use fleet_common::validate::Version;
use fleet_common::Layout;
use sha2::{Digest, Sha256};

use crate::config::{Bounds, UpdaterConfig};
use crate::journal::{JournalLoadError, JournalStore};
use crate::runas::RunAs;
use crate::service::{ManagerKind, ServiceError, ServiceManager, Supervisor, Systemctl};

/// The file name of our sysusers.d and tmpfiles.d files.
const CONF_NAME: &str = "harmony-fleet.conf";
/// Drop-in naming the agent user's manager.
const PODMAN_DROPIN: &str = "50-rootless-podman.conf";
/// Drop-in with restart backoff (systemd 254+).
const BACKOFF_DROPIN: &str = "60-restart-backoff.conf";
/// The first systemd with `RestartSteps=` and `RestartMaxDelaySec=`.
const FIRST_SYSTEMD_WITH_BACKOFF: u32 = 254;
/// Subordinate ids given to the agent user, above every range in use.
const SUBID_COUNT: u64 = 65_536;
const SUBID_FLOOR: u64 = 100_000;
/// `--version` of an agent binary: it prints one line at once.
const VERSION_TIMEOUT: Duration = Duration::from_secs(30);
/// sysusers, tmpfiles, daemon-reload, enable, loginctl: local and quick.
const TOOL_TIMEOUT: Duration = Duration::from_secs(60);
/// The updater's own start: recovery then READY=1, within systemd's default.
const UPDATER_START_TIMEOUT: Duration = Duration::from_secs(90);
/// A config file larger than this is not one a person wrote.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;
/// Output kept from one tool call.
const MAX_TOOL_OUTPUT: usize = 64 * 1024;
/// How long a running updater has to answer whether it runs.
const SOCKET_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The parsed `setup` command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupArgs {
    pub agent_binary: Option<PathBuf>,
    pub select: Option<Version>,
    pub config: Option<PathBuf>,
    pub units_from: Option<PathBuf>,
    pub root: Option<PathBuf>,
    pub manager: ManagerKind,
    /// Repair `rollback-failed` (never implied: a package install must not
    /// lift a quarantine nobody looked at).
    pub repair: bool,
}

/// Parses the arguments after `setup`; `Err` is a usage message.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<SetupArgs, String> {
    let mut args = args.into_iter();
    let mut parsed = SetupArgs {
        agent_binary: None,
        select: None,
        config: None,
        units_from: None,
        root: None,
        manager: ManagerKind::Systemctl,
        repair: false,
    };
    while let Some(arg) = args.next() {
        let arg = arg.to_string_lossy().into_owned();
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--agent-binary" => parsed.agent_binary = Some(value("--agent-binary")?.into()),
            "--config" => parsed.config = Some(value("--config")?.into()),
            "--units-from" => parsed.units_from = Some(value("--units-from")?.into()),
            "--root" => parsed.root = Some(value("--root")?.into()),
            "--repair" => parsed.repair = true,
            "--select" => {
                let v = value("--select")?;
                let v = v.to_string_lossy();
                parsed.select =
                    Some(Version::parse(&v).map_err(|e| format!("--select {v:?}: {e}"))?);
            }
            "--service-manager" => {
                let v = value("--service-manager")?;
                parsed.manager = ManagerKind::parse(&v.to_string_lossy()).ok_or_else(|| {
                    format!("--service-manager {v:?}: use systemctl or supervisor")
                })?;
            }
            _ => return Err(format!("unknown option {arg:?} for setup")),
        }
    }
    if parsed.agent_binary.is_none() && parsed.select.is_none() {
        return Err("setup needs --agent-binary PATH (or, to repair, --select VERSION)".into());
    }
    Ok(parsed)
}

/// Why setup stopped. Everything before the failed step is done (and is
/// idempotent); nothing after it is.
#[derive(Debug)]
pub enum SetupError {
    Journal(JournalLoadError),
    TransactionActive {
        phase: JournalPhase,
        path: PathBuf,
    },
    UpdaterRunning {
        socket: PathBuf,
    },
    Tool {
        what: String,
        message: String,
    },
    Copy {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
    Durable(DurableError),
    AgentVersion {
        binary: PathBuf,
        why: String,
    },
    NotInstalled {
        path: PathBuf,
    },
    NotALink {
        path: PathBuf,
    },
    Config {
        path: PathBuf,
        why: String,
    },
    UnknownUser {
        name: String,
        passwd: PathBuf,
    },
    SubIds {
        path: PathBuf,
        why: String,
    },
    NeedsSystemd,
    NothingToRepair {
        path: PathBuf,
    },
    Repair {
        agent: PathBuf,
        source: ServiceError,
    },
    UpdaterStart(String),
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Journal(e) => write!(
                f,
                "{e}; setup changes nothing on a device whose journal cannot be read: follow REPAIR.md (/usr/share/doc/harmony-fleet/REPAIR.md)"
            ),
            Self::TransactionActive { phase, path } => write!(
                f,
                "an agent upgrade is in progress (phase {phase} in {}): device setup during a transaction is unsupported; wait until `fleet-updater status` shows it finished, then run setup again",
                path.display()
            ),
            Self::UpdaterRunning { socket } => write!(
                f,
                "an updater answers on {}: stop it before a repair under --root",
                socket.display()
            ),
            Self::Tool { what, message } => write!(f, "{what} failed: {message}"),
            Self::Copy { from, to, source } => write!(
                f,
                "copying {} to {}: {source}",
                from.display(),
                to.display()
            ),
            Self::Durable(e) => write!(f, "{e}"),
            Self::AgentVersion { binary, why } => write!(
                f,
                "{} is not a usable agent binary: {why}; give the fleet-agent binary of a release",
                binary.display()
            ),
            Self::NotInstalled { path } => write!(
                f,
                "{} is not installed: pick a version listed in its directory, or give --agent-binary",
                path.display()
            ),
            Self::NotALink { path } => write!(
                f,
                "{} exists and is not a symlink: the updater can only switch a symlink; move it away and run setup again",
                path.display()
            ),
            Self::Config { path, why } => write!(
                f,
                "agent config {}: {why}; give a JSON object (see fleet-agent --help)",
                path.display()
            ),
            Self::UnknownUser { name, passwd } => write!(
                f,
                "user {name} is not in {}: systemd-sysusers did not create it; check /usr/lib/sysusers.d/{CONF_NAME}",
                passwd.display()
            ),
            Self::SubIds { path, why } => write!(f, "{}: {why}", path.display()),
            Self::NeedsSystemd => write!(
                f,
                "the updater is in rollback-failed and a repair stops and starts the agent: run setup on the device with systemd running (tests: --service-manager supervisor)"
            ),
            Self::NothingToRepair { path } => write!(
                f,
                "--repair: the updater is not in rollback-failed ({}): nothing to repair; run setup without --repair",
                path.display()
            ),
            Self::Repair { agent, source } => write!(
                f,
                "repair: {} did not start ({source}); the updater stays in rollback-failed: see journalctl -u {AGENT_UNIT}, then select another agent with --select VERSION or --agent-binary",
                agent.display()
            ),
            Self::UpdaterStart(message) => write!(
                f,
                "{UPDATER_UNIT} did not start: {message}; see journalctl -u {UPDATER_UNIT}"
            ),
        }
    }
}

impl std::error::Error for SetupError {}

impl From<DurableError> for SetupError {
    fn from(e: DurableError) -> Self {
        Self::Durable(e)
    }
}

/// How setup reaches systemd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Host {
    /// Root `/` with systemd running: every step, systemd included.
    Live,
    /// A root prefix, or no systemd: files only.
    Offline,
}

/// What the journal and `--repair` allow.
#[derive(Debug)]
enum Mode {
    Normal,
    /// `rollback-failed` without `--repair` (a package install, say):
    /// everything but the link and the quarantine, which wait for a person.
    Quarantined,
    /// `rollback-failed` with `--repair`: this run is the root repair.
    Repair(Box<Transaction>),
}

/// Runs setup; returns what it did, one line per step, for the terminal.
pub fn run(args: &SetupArgs) -> Result<Vec<String>, SetupError> {
    let layout = args
        .root
        .as_ref()
        .map_or_else(Layout::production, Layout::with_root);
    let host = if layout.root() == Path::new("/") && Path::new("/run/systemd/system").is_dir() {
        Host::Live
    } else {
        Host::Offline
    };
    let mut done = Vec::new();

    // 1. The journal decides whether setup may run at all.
    let (store, _) = JournalStore::load(&layout).map_err(SetupError::Journal)?;
    let mode = match store.transaction() {
        None => Mode::Normal,
        Some(tx) => match tx.phase {
            JournalPhase::Committed | JournalPhase::Failed => Mode::Normal,
            JournalPhase::RollbackFailed if args.repair => Mode::Repair(Box::new(tx.clone())),
            JournalPhase::RollbackFailed => Mode::Quarantined,
            phase @ (JournalPhase::Preparing
            | JournalPhase::Activating
            | JournalPhase::RollingBack) => {
                return Err(SetupError::TransactionActive {
                    phase,
                    path: store.path().to_owned(),
                })
            }
        },
    };
    if args.repair && !matches!(mode, Mode::Repair(_)) {
        return Err(SetupError::NothingToRepair {
            path: store.path().to_owned(),
        });
    }
    if matches!(mode, Mode::Repair(_)) {
        if host == Host::Offline && args.manager == ManagerKind::Systemctl {
            return Err(SetupError::NeedsSystemd);
        }
        if host == Host::Offline && updater_answers(&layout) {
            return Err(SetupError::UpdaterRunning {
                socket: layout.updater_socket(),
            });
        }
    }

    // 2. Unit, sysusers and tmpfiles files from a checkout.
    if let Some(dir) = &args.units_from {
        install_units_from(dir, &layout)?;
        done.push(format!(
            "units, sysusers.d and tmpfiles.d from {}",
            dir.display()
        ));
    }

    // 3. Users, groups, directories.
    if let Some(line) = sysusers_and_tmpfiles(&layout, host)? {
        done.push(line);
    }
    let agent = lookup_user(&layout, AGENT_USER);

    // 4. Subordinate ids.
    if let Some((uid, _)) = agent {
        for file in ["etc/subuid", "etc/subgid"] {
            if let Some(line) = ensure_subids(&layout.root().join(file), AGENT_USER, uid)? {
                done.push(line);
            }
        }
    }

    // 5. The agent binary as a versioned binary.
    let installed = match &args.agent_binary {
        Some(binary) => {
            let version = agent_version(binary, host)?;
            let target = layout.versioned_agent(&version);
            if install_versioned(binary, &target)? {
                done.push(format!("installed agent {version} as {}", target.display()));
            }
            Some(target)
        }
        None => None,
    };

    // 6. The agent config.
    if let Some(config) = &args.config {
        install_config(config, &layout)?;
        done.push(format!(
            "agent config {} installed as {}",
            config.display(),
            layout.agent_config().display()
        ));
    }

    // 7. The agent's drop-ins.
    if let Some((uid, _)) = agent {
        write_dropins(&layout, uid, systemd_version())?;
    }

    // 8. The active link (a repair selects in step 9).
    let selected = match &args.select {
        Some(v) => {
            let path = layout.versioned_agent(v);
            if !path.is_file() {
                return Err(SetupError::NotInstalled { path });
            }
            path
        }
        None => installed.clone().ok_or_else(|| SetupError::AgentVersion {
            binary: PathBuf::from("(none)"),
            why: "no --agent-binary given".to_owned(),
        })?,
    };
    match mode {
        Mode::Normal => done.push(ensure_link(&layout, &selected)?),
        Mode::Quarantined => done.push(
            "the updater is quarantined (rollback-failed): the active link and the quarantine are left for a person; follow REPAIR.md, then run `fleet-updater setup --repair --agent-binary PATH` (or `--select VERSION`)".to_owned(),
        ),
        Mode::Repair(_) => {}
    }

    // 9. systemd.
    if host == Host::Live {
        systemctl(&["daemon-reload"])?;
        systemctl(&["enable", UPDATER_UNIT, AGENT_UNIT])?;
        if tool("loginctl", &["enable-linger", AGENT_USER]).is_err() {
            // The tmpfiles linger flag starts the user manager at boot.
            if let Some((uid, _)) = agent {
                let _ = systemctl(&["start", &format!("user@{uid}.service")]);
            }
        }
        done.push(format!("{UPDATER_UNIT} and {AGENT_UNIT} enabled"));
    } else if units_present(&layout) {
        // An image build or a root prefix: systemctl enables offline.
        let root_arg = format!("--root={}", layout.root().display());
        systemctl(&[&root_arg, "enable", UPDATER_UNIT, AGENT_UNIT])?;
        done.push(format!(
            "{UPDATER_UNIT} and {AGENT_UNIT} enabled (offline: they start at the next boot)"
        ));
    }
    match mode {
        Mode::Repair(tx) => {
            done.extend(repair(&layout, host, args.manager, &store, &tx, &selected)?);
        }
        Mode::Normal | Mode::Quarantined if host == Host::Live => {
            systemctl_bounded(&["restart", UPDATER_UNIT], UPDATER_START_TIMEOUT)
                .map_err(SetupError::UpdaterStart)?;
            done.push(format!("{UPDATER_UNIT} restarted"));
            if layout.agent_config().is_file() {
                // Not waiting for READY: the agent may need minutes to reach NATS.
                systemctl(&["start", "--no-block", AGENT_UNIT])?;
                done.push(format!("{AGENT_UNIT} started"));
            } else {
                done.push(format!(
                    "{AGENT_UNIT} is enabled and waits for its config: write {} (root:{AGENT_GROUP}, 0640), then run `systemctl start {AGENT_UNIT}`",
                    layout.agent_config().display()
                ));
            }
        }
        Mode::Normal | Mode::Quarantined => {}
    }
    Ok(done)
}

/// Step 9 of a repair: the updater stopped, the agent stopped, `selected`
/// linked and started; the quarantine lifted only when it is ready.
fn repair(
    layout: &Layout,
    host: Host,
    manager: ManagerKind,
    store: &JournalStore,
    tx: &Transaction,
    selected: &Path,
) -> Result<Vec<String>, SetupError> {
    let bounds = Bounds::from_env().map_err(|why| SetupError::Tool {
        what: "reading the test bounds".to_owned(),
        message: why,
    })?;
    let config =
        UpdaterConfig::load(&layout.updater_config(), false).map_err(|e| SetupError::Tool {
            what: "reading the updater config".to_owned(),
            message: e.to_string(),
        })?;
    let mut done = vec![format!(
        "repairing rollback-failed (attempt {}, previous agent {})",
        tx.attempt.uuid,
        tx.previous_binary.display()
    )];
    let updater = Systemctl::new(UPDATER_UNIT);
    if host == Host::Live {
        updater
            .stop(bounds.stop)
            .map_err(|e| SetupError::UpdaterStart(e.to_string()))?;
    }
    let service: Box<dyn ServiceManager> = match manager {
        ManagerKind::Systemctl => Box::new(Systemctl::new(&config.agent_unit)),
        ManagerKind::Supervisor => Box::new(
            Supervisor::spawn(layout, &config.probe_user, &config.agent_unit).map_err(|e| {
                SetupError::Tool {
                    what: "starting the supervisor".to_owned(),
                    message: e.to_string(),
                }
            })?,
        ),
    };
    let started = service
        .stop(bounds.stop)
        .and_then(|_| {
            durable::switch_symlink(&layout.active_agent_link(), selected).map_err(|e| {
                ServiceError {
                    action: "select",
                    unit: service.unit().to_owned(),
                    message: e.to_string(),
                }
            })
        })
        .and_then(|()| service.start(bounds.start));
    let outcome = match started {
        Ok(()) => {
            done.push(format!(
                "{} selected and ready under {}",
                selected.display(),
                service.unit()
            ));
            let kept = lift_quarantine(store)?;
            done.push(format!(
                "quarantine lifted; the quarantined journal is kept as {}",
                kept.display()
            ));
            Ok(())
        }
        Err(source) => Err(SetupError::Repair {
            agent: selected.to_owned(),
            source,
        }),
    };
    if host == Host::Live {
        // Quarantined or not, the updater runs again: status stays readable.
        // A restart, not a start: starting the agent pulled the updater in
        // (the agent unit wants it), and that one read the journal before
        // the quarantine was lifted.
        systemctl_bounded(&["restart", UPDATER_UNIT], UPDATER_START_TIMEOUT)
            .map_err(SetupError::UpdaterStart)?;
        done.push(format!("{UPDATER_UNIT} restarted"));
    }
    outcome.map(|()| done)
}

/// Keeps the quarantined journal beside it, then writes it without the
/// transaction; the attempt stays in `finished` (its UUID keeps its
/// digest). Returns the kept copy.
fn lift_quarantine(store: &JournalStore) -> Result<PathBuf, SetupError> {
    let path = store.path();
    let now = Timestamp::now();
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".repaired-{now}"));
    let kept = PathBuf::from(name);
    let mut next: Journal = store.journal().clone();
    write_journal(&kept, &next)?;
    if let Some(tx) = next.transaction.take() {
        if !next.finished.iter().any(|f| f.uuid == tx.attempt.uuid) {
            let at = tx.transitions.last().map(|t| t.at).unwrap_or(tx.started_at);
            next.finished.push(FinishedAttempt {
                uuid: tx.attempt.uuid,
                digest: tx.attempt_digest.clone(),
                target_version: tx.attempt.target_version.clone(),
                phase: tx.phase,
                finished_at: at,
            });
        }
    }
    write_journal(path, &next)?;
    Ok(kept)
}

fn write_journal(path: &Path, journal: &Journal) -> Result<(), SetupError> {
    let mut bytes = serde_json::to_vec_pretty(journal).map_err(|e| SetupError::Tool {
        what: "encoding the journal".to_owned(),
        message: e.to_string(),
    })?;
    bytes.push(b'\n');
    Ok(durable::write_atomic(path, &bytes, 0o600)?)
}

/// Whether an updater answers on the layout's socket.
fn updater_answers(layout: &Layout) -> bool {
    use fleet_common::contracts::{UpdaterReply, UpdaterRequest};
    fleet_common::socket::call::<_, UpdaterReply>(
        &layout.updater_socket(),
        &UpdaterRequest::Status {},
        SOCKET_PROBE_TIMEOUT,
    )
    .is_ok()
}

/// Copies `DIR/systemd/*.service`, `DIR/sysusers.d/harmony-fleet.conf` and
/// `DIR/tmpfiles.d/harmony-fleet.conf` into the root's `/etc`.
fn install_units_from(dir: &Path, layout: &Layout) -> Result<(), SetupError> {
    let etc = layout.root().join("etc");
    let mut files = vec![
        (
            dir.join("sysusers.d").join(CONF_NAME),
            etc.join("sysusers.d").join(CONF_NAME),
        ),
        (
            dir.join("tmpfiles.d").join(CONF_NAME),
            etc.join("tmpfiles.d").join(CONF_NAME),
        ),
    ];
    for unit in [AGENT_UNIT, UPDATER_UNIT] {
        files.push((dir.join("systemd").join(unit), layout.unit_dir().join(unit)));
    }
    for (from, to) in files {
        let bytes = std::fs::read(&from).map_err(|source| SetupError::Copy {
            from: from.clone(),
            to: to.clone(),
            source,
        })?;
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|source| SetupError::Copy {
                from: from.clone(),
                to: to.clone(),
                source,
            })?;
        }
        durable::write_atomic(&to, &bytes, 0o644)?;
    }
    Ok(())
}

/// `systemd-sysusers` and `systemd-tmpfiles --create` for our conf (looked
/// up in the root's sysusers.d/tmpfiles.d directories). Under a root
/// prefix, skipped when the root has no such file.
fn sysusers_and_tmpfiles(layout: &Layout, host: Host) -> Result<Option<String>, SetupError> {
    let found = |kind: &str| {
        ["etc", "run", "usr/lib"]
            .iter()
            .any(|d| layout.root().join(d).join(kind).join(CONF_NAME).is_file())
    };
    if host == Host::Offline && !(found("sysusers.d") && found("tmpfiles.d")) {
        return Ok(None);
    }
    let root_arg = format!("--root={}", layout.root().display());
    let mut sysusers = vec![CONF_NAME];
    let mut tmpfiles = vec!["--create", CONF_NAME];
    if layout.root() != Path::new("/") {
        sysusers.insert(0, &root_arg);
        tmpfiles.insert(0, &root_arg);
    }
    tool("systemd-sysusers", &sysusers)?;
    tool("systemd-tmpfiles", &tmpfiles)?;
    Ok(Some(format!(
        "users ({AGENT_USER}, groups {AGENT_GROUP}, fleet-control) and directories"
    )))
}

/// Whether both units are installed under the layout's root.
fn units_present(layout: &Layout) -> bool {
    [AGENT_UNIT, UPDATER_UNIT].iter().all(|unit| {
        [
            "etc/systemd/system",
            "usr/lib/systemd/system",
            "lib/systemd/system",
        ]
        .iter()
        .any(|d| layout.root().join(d).join(unit).is_file())
    })
}

/// `name`'s uid and gid in the root's `/etc/passwd`.
fn lookup_user(layout: &Layout, name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string(layout.root().join("etc/passwd")).ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 4 && f[0] == name).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

/// `name`'s gid in the root's `/etc/group`.
fn lookup_group(layout: &Layout, name: &str) -> Option<u32> {
    let group = std::fs::read_to_string(layout.root().join("etc/group")).ok()?;
    group.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 3 && f[0] == name).then(|| f[2].parse().ok())?
    })
}

/// Adds `user:<start>:65536` to the subid `file` unless `user` (by name or
/// uid) has a range; `start` is above every range of the file. Returns what
/// it did.
fn ensure_subids(file: &Path, user: &str, uid: u32) -> Result<Option<String>, SetupError> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            return Err(SetupError::SubIds {
                path: file.to_owned(),
                why: e.to_string(),
            })
        }
    };
    let (has, next) = subid_plan(&text, user, uid);
    if has {
        return Ok(None);
    }
    let mut new = text.clone();
    if !new.is_empty() && !new.ends_with('\n') {
        new.push('\n');
    }
    new.push_str(&format!("{user}:{next}:{SUBID_COUNT}\n"));
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent).map_err(|e| SetupError::SubIds {
            path: file.to_owned(),
            why: e.to_string(),
        })?;
    }
    durable::write_atomic(file, new.as_bytes(), 0o644)?;
    Ok(Some(format!(
        "{user} got subordinate ids {next}-{} in {}",
        next + SUBID_COUNT - 1,
        file.display()
    )))
}

/// Whether `user` has a range in `text`, and the first id above every
/// range (at least 100000).
fn subid_plan(text: &str, user: &str, uid: u32) -> (bool, u64) {
    let uid = uid.to_string();
    let mut has = false;
    let mut next = SUBID_FLOOR;
    for line in text.lines() {
        let f: Vec<&str> = line.trim().split(':').collect();
        if f.len() != 3 {
            continue;
        }
        if f[0] == user || f[0] == uid {
            has = true;
        }
        if let (Ok(start), Ok(count)) = (f[1].parse::<u64>(), f[2].parse::<u64>()) {
            next = next.max(start.saturating_add(count));
        }
    }
    (has, next)
}

/// The version `binary --version` prints as `fleet-agent <version>`; run as
/// the agent user on a live device.
fn agent_version(binary: &Path, host: Host) -> Result<Version, SetupError> {
    let bad = |why: String| SetupError::AgentVersion {
        binary: binary.to_owned(),
        why,
    };
    let mut cmd = match host {
        Host::Live => RunAs::resolve(AGENT_USER)
            .map_err(|e| bad(e.to_string()))?
            .command(binary),
        Host::Offline => Command::new(binary),
    };
    cmd.arg("--version");
    let out = run_bounded(&mut cmd, VERSION_TIMEOUT, MAX_TOOL_OUTPUT)
        .map_err(|e: ProcessError| bad(e.to_string()))?;
    if !out.success() {
        return Err(bad(format!("--version failed: {}", out.diagnostic())));
    }
    parse_version_line(&String::from_utf8_lossy(&out.stdout)).map_err(bad)
}

/// `fleet-agent <version>\n` → the version.
fn parse_version_line(text: &str) -> Result<Version, String> {
    let line = text.trim_end_matches('\n');
    let v = line
        .strip_prefix("fleet-agent ")
        .filter(|v| !v.contains('\n'))
        .ok_or_else(|| format!("--version printed {line:?}, not `fleet-agent <version>`"))?;
    Version::parse(v).map_err(|e| format!("--version printed an invalid version: {e}"))
}

/// Installs `binary` at `target` (0755, temp file, fsync, rename, directory
/// fsync) unless it holds the same bytes; true when it wrote.
fn install_versioned(binary: &Path, target: &Path) -> Result<bool, SetupError> {
    let copy_err = |source| SetupError::Copy {
        from: binary.to_owned(),
        to: target.to_owned(),
        source,
    };
    let new = file_sha256(binary).map_err(copy_err)?;
    if target.is_file() && file_sha256(target).map_err(copy_err)? == new {
        return Ok(false);
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(copy_err)?;
    }
    let mut out = AtomicFile::create(target, 0o755)?;
    let mut input = std::fs::File::open(binary).map_err(copy_err)?;
    let mut buf = vec![0u8; 128 * 1024];
    loop {
        let n = input.read(&mut buf).map_err(copy_err)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
    }
    out.commit()?;
    Ok(true)
}

fn file_sha256(path: &Path) -> std::io::Result<[u8; 32]> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 128 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finalize().into());
        }
        h.update(&buf[..n]);
    }
}

/// Checks `config` (≤ 64 KiB, one JSON object) and installs it as the
/// agent config, root:fleet-agent 0640.
fn install_config(config: &Path, layout: &Layout) -> Result<(), SetupError> {
    let bad = |why: String| SetupError::Config {
        path: config.to_owned(),
        why,
    };
    let bytes = durable::read_bounded(config, MAX_CONFIG_BYTES).map_err(|e| bad(e.to_string()))?;
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(_)) => {}
        Ok(_) => return Err(bad("not a JSON object".to_owned())),
        Err(e) => return Err(bad(format!("not JSON: {e}"))),
    }
    let target = layout.agent_config();
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| bad(e.to_string()))?;
    }
    durable::write_atomic(&target, &bytes, 0o640)?;
    if let Some(gid) = lookup_group(layout, AGENT_GROUP) {
        rustix::fs::chown(
            &target,
            Some(rustix::fs::Uid::ROOT),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(|e| bad(format!("cannot give it group {AGENT_GROUP}: {e}")))?;
    }
    Ok(())
}

/// The agent's drop-ins (step 7).
fn write_dropins(layout: &Layout, uid: u32, systemd: Option<u32>) -> Result<(), SetupError> {
    let dir = layout.unit_dir().join(format!("{AGENT_UNIT}.d"));
    std::fs::create_dir_all(&dir).map_err(|source| SetupError::Copy {
        from: PathBuf::from("(drop-in)"),
        to: dir.clone(),
        source,
    })?;
    durable::write_atomic(
        &dir.join(PODMAN_DROPIN),
        podman_dropin(uid).as_bytes(),
        0o644,
    )?;
    let backoff = dir.join(BACKOFF_DROPIN);
    match systemd {
        Some(v) if v >= FIRST_SYSTEMD_WITH_BACKOFF => {
            durable::write_atomic(&backoff, backoff_dropin(v).as_bytes(), 0o644)?;
        }
        _ => match std::fs::remove_file(&backoff) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(SetupError::Copy {
                    from: PathBuf::from("(drop-in)"),
                    to: backoff,
                    source,
                })
            }
        },
    }
    Ok(())
}

fn podman_dropin(uid: u32) -> String {
    format!(
        "# Written by fleet-updater setup: the lingering user manager of {AGENT_USER}\n\
         # (uid {uid}) holds rootless Podman's containers, so they outlive {AGENT_UNIT}.\n\
         [Unit]\n\
         Wants=user@{uid}.service\n\
         After=user@{uid}.service\n\
         \n\
         [Service]\n\
         Environment=XDG_RUNTIME_DIR=/run/user/{uid}\n"
    )
}

fn backoff_dropin(systemd: u32) -> String {
    format!(
        "# Written by fleet-updater setup (systemd {systemd}): back off a failing agent,\n\
         # 5 s doubling up to 5 min.\n\
         [Service]\n\
         RestartSteps=6\n\
         RestartMaxDelaySec=5min\n"
    )
}

/// The major version `systemctl --version` reports.
fn systemd_version() -> Option<u32> {
    let mut cmd = Command::new("systemctl");
    cmd.arg("--version");
    let out = run_bounded(&mut cmd, TOOL_TIMEOUT, MAX_TOOL_OUTPUT).ok()?;
    parse_systemd_version(&String::from_utf8_lossy(&out.stdout))
}

fn parse_systemd_version(text: &str) -> Option<u32> {
    text.lines()
        .next()?
        .strip_prefix("systemd ")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Step 8: the link to `target` when absent or dangling; a link to an
/// existing file is kept.
fn ensure_link(layout: &Layout, target: &Path) -> Result<String, SetupError> {
    let link = layout.active_agent_link();
    match std::fs::symlink_metadata(&link) {
        Ok(m) if m.file_type().is_symlink() => {
            if link.exists() {
                let current = std::fs::read_link(&link).unwrap_or_default();
                return Ok(format!(
                    "active agent kept: {} -> {}",
                    link.display(),
                    current.display()
                ));
            }
        }
        Ok(_) => return Err(SetupError::NotALink { path: link }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = link.parent() {
                std::fs::create_dir_all(parent).map_err(|source| SetupError::Copy {
                    from: target.to_owned(),
                    to: link.clone(),
                    source,
                })?;
            }
        }
        Err(source) => {
            return Err(SetupError::Copy {
                from: target.to_owned(),
                to: link,
                source,
            })
        }
    }
    durable::switch_symlink(&link, target)?;
    Ok(format!(
        "active agent: {} -> {}",
        link.display(),
        target.display()
    ))
}

fn systemctl(args: &[&str]) -> Result<(), SetupError> {
    tool("systemctl", args)
}

fn systemctl_bounded(args: &[&str], bound: Duration) -> Result<(), String> {
    let mut cmd = Command::new("systemctl");
    cmd.args(args);
    let out = run_bounded(&mut cmd, bound, MAX_TOOL_OUTPUT).map_err(|e| e.to_string())?;
    if out.success() {
        Ok(())
    } else {
        Err(out.diagnostic())
    }
}

/// Runs `program args`, bounded; its stderr is the error.
fn tool(program: &str, args: &[&str]) -> Result<(), SetupError> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let what = format!("{program} {}", args.join(" "));
    let out =
        run_bounded(&mut cmd, TOOL_TIMEOUT, MAX_TOOL_OUTPUT).map_err(|e| SetupError::Tool {
            what: what.clone(),
            message: e.to_string(),
        })?;
    if out.success() {
        Ok(())
    } else {
        Err(SetupError::Tool {
            what,
            message: out.diagnostic(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<SetupArgs, String> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn parses_every_option_and_refuses_the_rest() {
        let a = p(&[
            "--agent-binary",
            "/b",
            "--select",
            "1.2.3",
            "--config",
            "/c.json",
            "--units-from",
            "/u",
            "--root",
            "/r",
            "--service-manager",
            "supervisor",
            "--repair",
        ])
        .expect("valid");
        assert!(a.repair);
        assert_eq!(a.agent_binary.as_deref(), Some(Path::new("/b")));
        assert_eq!(a.select, Some(Version::parse("1.2.3").expect("v")));
        assert_eq!(a.config.as_deref(), Some(Path::new("/c.json")));
        assert_eq!(a.units_from.as_deref(), Some(Path::new("/u")));
        assert_eq!(a.root.as_deref(), Some(Path::new("/r")));
        assert_eq!(a.manager, ManagerKind::Supervisor);
        assert_eq!(
            p(&[]),
            Err("setup needs --agent-binary PATH (or, to repair, --select VERSION)".into())
        );
        assert_eq!(
            p(&["--agent-binary"]),
            Err("--agent-binary needs a value".into())
        );
        assert_eq!(
            p(&["--agent-binary", "/b", "--json"]),
            Err("unknown option \"--json\" for setup".into())
        );
        let e = p(&["--select", "../x"]).expect_err("a path is no version");
        assert!(e.starts_with("--select \"../x\": "), "{e}");
    }

    #[test]
    fn version_lines_are_strict() {
        assert_eq!(
            parse_version_line("fleet-agent 1.4.0\n"),
            Ok(Version::parse("1.4.0").expect("v"))
        );
        for bad in [
            "fleet-updater 1.4.0\n",
            "fleet-agent\n",
            "fleet-agent 1.4.0\nmore\n",
            "fleet-agent ../../etc\n",
            "",
        ] {
            assert!(parse_version_line(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            parse_version_line("hello\n"),
            Err("--version printed \"hello\", not `fleet-agent <version>`".into())
        );
    }

    #[test]
    fn subids_go_above_every_range_and_are_given_once() {
        assert_eq!(subid_plan("", "fleet-agent", 995), (false, 100_000));
        let text = "alice:100000:65536\nbob:165536:65536\n";
        assert_eq!(subid_plan(text, "fleet-agent", 995), (false, 231_072));
        assert_eq!(
            subid_plan("fleet-agent:300000:65536\n", "fleet-agent", 995),
            (true, 365_536)
        );
        assert!(subid_plan("995:500000:10\n", "fleet-agent", 995).0);
        // Garbage lines are skipped, not trusted.
        assert_eq!(
            subid_plan("x:y:z\n#c\n", "fleet-agent", 995),
            (false, 100_000)
        );

        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("subuid");
        std::fs::write(&file, "alice:100000:65536").expect("write");
        let did = ensure_subids(&file, "fleet-agent", 995).expect("ok");
        assert_eq!(
            did.as_deref(),
            Some(
                format!(
                    "fleet-agent got subordinate ids 165536-231071 in {}",
                    file.display()
                )
                .as_str()
            )
        );
        assert_eq!(
            std::fs::read_to_string(&file).expect("read"),
            "alice:100000:65536\nfleet-agent:165536:65536\n"
        );
        assert_eq!(ensure_subids(&file, "fleet-agent", 995).expect("ok"), None);
    }

    #[test]
    fn systemd_versions_decide_the_backoff_dropin() {
        assert_eq!(
            parse_systemd_version("systemd 252 (252.39-1~deb12u2)\n+PAM +AUDIT\n"),
            Some(252)
        );
        assert_eq!(parse_systemd_version("systemd 256.5\n"), None);
        assert_eq!(parse_systemd_version("nonsense"), None);
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::with_root(dir.path());
        let backoff = layout
            .unit_dir()
            .join("fleet-agent.service.d")
            .join(BACKOFF_DROPIN);
        write_dropins(&layout, 995, Some(256)).expect("write");
        assert!(std::fs::read_to_string(&backoff)
            .expect("backoff")
            .contains("RestartSteps=6"));
        write_dropins(&layout, 995, Some(252)).expect("write");
        assert!(!backoff.exists(), "252 would warn about unknown keys");
        let podman = std::fs::read_to_string(
            layout
                .unit_dir()
                .join("fleet-agent.service.d")
                .join(PODMAN_DROPIN),
        )
        .expect("podman drop-in");
        assert!(podman.contains("After=user@995.service\n"), "{podman}");
        assert!(
            podman.contains("XDG_RUNTIME_DIR=/run/user/995\n"),
            "{podman}"
        );
    }

    #[test]
    fn the_link_is_created_when_absent_or_dangling_and_kept_otherwise() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::with_root(dir.path());
        std::fs::create_dir_all(layout.versions_dir()).expect("mkdir");
        let v1 = layout.versioned_agent(&Version::parse("1.0").expect("v"));
        let v2 = layout.versioned_agent(&Version::parse("2.0").expect("v"));
        std::fs::write(&v1, "1").expect("v1");
        std::fs::write(&v2, "2").expect("v2");
        let link = layout.active_agent_link();

        let said = ensure_link(&layout, &v1).expect("absent");
        assert!(said.starts_with("active agent: "), "{said}");
        assert_eq!(std::fs::read_link(&link).expect("link"), v1);
        // Valid: kept, even though another version is offered.
        let said = ensure_link(&layout, &v2).expect("valid");
        assert!(said.starts_with("active agent kept: "), "{said}");
        assert_eq!(std::fs::read_link(&link).expect("link"), v1);
        // Dangling: replaced.
        std::fs::remove_file(&v1).expect("rm");
        ensure_link(&layout, &v2).expect("dangling");
        assert_eq!(std::fs::read_link(&link).expect("link"), v2);
        // A regular file is not ours to replace.
        std::fs::remove_file(&link).expect("rm link");
        std::fs::write(&link, "a binary").expect("file");
        let e = ensure_link(&layout, &v2).expect_err("a file");
        assert!(matches!(e, SetupError::NotALink { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "{} exists and is not a symlink: the updater can only switch a symlink; move it away and run setup again",
                link.display()
            )
        );
    }

    #[test]
    fn identical_bytes_are_not_rewritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("agent");
        let dst = dir.path().join("v/fleet-agent-v1");
        std::fs::write(&src, "#!/bin/sh\n").expect("write");
        assert!(install_versioned(&src, &dst).expect("first"));
        assert!(!install_versioned(&src, &dst).expect("again"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&dst).expect("meta").permissions().mode() & 0o777,
            0o755
        );
        std::fs::write(&src, "#!/bin/sh\necho rebuilt\n").expect("write");
        assert!(install_versioned(&src, &dst).expect("changed"));
        assert_eq!(
            std::fs::read(&dst).expect("read"),
            b"#!/bin/sh\necho rebuilt\n"
        );
    }

    #[test]
    fn configs_must_be_json_objects() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::with_root(dir.path());
        let src = dir.path().join("agent.json");
        for (text, why) in [
            ("[1]", "not a JSON object"),
            (
                "{",
                "not JSON: EOF while parsing an object at line 1 column 1",
            ),
        ] {
            std::fs::write(&src, text).expect("write");
            let e = install_config(&src, &layout).expect_err(text);
            assert_eq!(
                e.to_string(),
                format!(
                    "agent config {}: {why}; give a JSON object (see fleet-agent --help)",
                    src.display()
                )
            );
        }
        assert!(
            !layout.agent_config().exists(),
            "a bad config was installed"
        );
        std::fs::write(&src, "{\"device-id\":\"d1\"}").expect("write");
        install_config(&src, &layout).expect("good");
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::metadata(layout.agent_config()).expect("installed");
        assert_eq!(m.permissions().mode() & 0o777, 0o640);
    }
}
