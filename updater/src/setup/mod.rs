//! `fleet-updater setup`: device setup, idempotent. The package's postinst
//! (and rpm `%post`) runs it on every install and upgrade; a person runs it
//! again as the root repair of `rollback-failed` (REPAIR.md).
//!
//! ```text
//! fleet-updater setup --agent-binary PATH [--config PATH] [--enrollment-token PATH]
//!                     [--units-from DIR]
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
//!    0640; with `--enrollment-token PATH`: the fleet's enrollment token (one
//!    line) as `/etc/harmony-fleet/enrollment-token`, root:fleet-agent 0640,
//!    the path the `enrollment` method's `token-file` names
//!    (docs/design/enrollment.md);
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
//!
//! | module | holds |
//! |---|---|
//! | this one | the arguments, the order of the steps, the repair and the quarantine |
//! | `install` | the agent binary by version, the agent config, the active link |
//! | `system` | units, users and directories, subordinate ids, drop-ins, systemd and tool runs |
//! | `error` | [`SetupError`] |

mod error;
mod install;
mod system;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleet_common::contracts::{FinishedAttempt, Journal, JournalPhase, Transaction};
use fleet_common::durable;
use fleet_common::layout::{AGENT_GROUP, AGENT_UNIT, AGENT_USER, UPDATER_UNIT};
use fleet_common::time::Timestamp;
use fleet_common::validate::Version;
use fleet_common::Layout;

use crate::config::{Bounds, UpdaterConfig};
use crate::journal::JournalStore;
use crate::service::{ManagerKind, ServiceError, ServiceManager, Supervisor, Systemctl};

pub use error::SetupError;
use install::{
    agent_version, ensure_link, install_config, install_enrollment_token, install_versioned,
};
use system::{
    ensure_subids, install_units_from, lookup_user, systemctl, systemctl_bounded, systemd_version,
    sysusers_and_tmpfiles, tool, units_present, write_dropins, Host,
};

/// The updater's own start: recovery then READY=1, within systemd's default.
const UPDATER_START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a running updater has to answer whether it runs.
const SOCKET_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The parsed `setup` command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupArgs {
    pub agent_binary: Option<PathBuf>,
    pub select: Option<Version>,
    pub config: Option<PathBuf>,
    /// The fleet's enrollment token to install.
    pub enrollment_token: Option<PathBuf>,
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
        enrollment_token: None,
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
            "--enrollment-token" => {
                parsed.enrollment_token = Some(value("--enrollment-token")?.into())
            }
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

    if let Some(token) = &args.enrollment_token {
        install_enrollment_token(token, &layout)?;
        done.push(format!(
            "enrollment token {} installed as {}",
            token.display(),
            layout.enrollment_token().display()
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

#[cfg(test)]
mod tests {
    use super::install::parse_version_line;
    use super::system::{parse_systemd_version, subid_plan, BACKOFF_DROPIN, PODMAN_DROPIN};
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
    fn the_enrollment_token_is_one_line_and_private_to_the_agent_group() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::with_root(dir.path());
        let src = dir.path().join("token");
        for bad in ["", "\n", "a\nb\n"] {
            std::fs::write(&src, bad).expect("write");
            let e = install_enrollment_token(&src, &layout).expect_err(bad);
            assert!(e.to_string().contains("on one line"), "{e}");
            assert!(!layout.enrollment_token().exists());
        }
        std::fs::write(&src, "batch-7\n").expect("write");
        install_enrollment_token(&src, &layout).expect("good");
        assert_eq!(
            std::fs::read_to_string(layout.enrollment_token()).expect("read"),
            "batch-7\n"
        );
        let m = std::fs::metadata(layout.enrollment_token()).expect("meta");
        assert_eq!(m.permissions().mode() & 0o777, 0o640);
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
