//! Command-line parsing and the `status` command.
//!
//! ```text
//! fleet-updater run [--root DIR] [--config PATH] [--service-manager systemctl|supervisor]
//! fleet-updater status [--json] [--root DIR]
//! ```

use std::ffi::OsString;
use std::path::PathBuf;

use fleet_common::contracts::{Response, UpdaterReply, UpdaterRequest, UpgradeStatus};
use fleet_common::limits::SOCKET_STATUS_RESPONSE_TIMEOUT;
use fleet_common::{socket, Layout};

use crate::daemon::RunArgs;
use crate::journal::JournalStore;
use crate::published::{Live, Published};
use crate::service::ManagerKind;
use crate::status::{self, StatusInfo};

pub const HELP: &str = "fleet-updater: replaces the fleet agent through a crash-safe transaction

Usage:
  fleet-updater run [--root DIR] [--config PATH] [--service-manager systemctl|supervisor]
                                      run the daemon (under systemd, as root)
  fleet-updater status [--json] [--root DIR]
                                      show the current or last upgrade
  fleet-updater setup --agent-binary PATH [--config PATH] [--units-from DIR] [--root DIR]
                                      device setup (idempotent; the package runs it)
  fleet-updater setup --repair (--agent-binary PATH | --select VERSION)
                                      the root repair of rollback-failed (REPAIR.md)
  fleet-updater --help | --version

Options:
  --root DIR              prefix of every device path (default /; tests use a temp dir)
  --config PATH           updater config (default /etc/harmony-fleet/updater.json, optional)
  --service-manager M     systemctl (default) or supervisor (in-process, for tests)
  --json                  print the status as JSON for scripts
";

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Run(RunArgs),
    Status { root: Option<PathBuf>, json: bool },
    Setup(crate::setup::SetupArgs),
    Help,
    Version,
}

/// Parses the arguments after the program name; `Err` is a usage message.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, String> {
    let mut args = args.into_iter();
    let Some(first) = args.next() else {
        return Ok(Command::Help);
    };
    let first = first.to_string_lossy().into_owned();
    let mut root = None;
    let mut config = None;
    let mut manager = ManagerKind::Systemctl;
    let mut json = false;
    let is_run = match first.as_str() {
        "--help" | "-h" | "help" => return Ok(Command::Help),
        "--version" | "-V" => return Ok(Command::Version),
        "run" => true,
        "status" => false,
        "setup" => return crate::setup::parse(args).map(Command::Setup),
        other => return Err(format!("unknown command {other:?}")),
    };
    while let Some(arg) = args.next() {
        let arg = arg.to_string_lossy().into_owned();
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match (arg.as_str(), is_run) {
            ("--root", _) => root = Some(PathBuf::from(value("--root")?)),
            ("--config", true) => config = Some(PathBuf::from(value("--config")?)),
            ("--service-manager", true) => {
                let v = value("--service-manager")?;
                manager = ManagerKind::parse(&v.to_string_lossy()).ok_or_else(|| {
                    format!("--service-manager {v:?}: use systemctl or supervisor")
                })?;
            }
            ("--json", false) => json = true,
            _ => return Err(format!("unknown option {arg:?} for {first}")),
        }
    }
    Ok(if is_run {
        Command::Run(RunArgs {
            root,
            config,
            manager,
        })
    } else {
        Command::Status { root, json }
    })
}

/// `fleet-updater status`: asks the running updater; when none runs, reads
/// the journal itself (root only) and says so.
pub fn status(root: Option<PathBuf>, json: bool) -> Result<String, String> {
    let layout = root.map_or_else(Layout::production, Layout::with_root);
    let path = layout.updater_socket();
    let (status, note) = match socket::call::<_, UpdaterReply>(
        &path,
        &UpdaterRequest::Status {},
        SOCKET_STATUS_RESPONSE_TIMEOUT,
    ) {
        Ok(Response::Ok(reply)) => (reply.status, None),
        Ok(Response::Err(e)) => return Err(format!("the updater refused: {e}")),
        Err(e) if e.is_unreachable() => {
            let (store, _) = JournalStore::load(&layout).map_err(|e| e.to_string())?;
            let published = Published {
                journal: store.journal().clone(),
                unsynced: None,
                live: Live::default(),
            };
            let info = StatusInfo::new(fleet_common::layout::AGENT_UNIT);
            (
                status::current(&published, &info),
                Some(format!(
                    "(the updater is not running; read from {})",
                    store.path().display()
                )),
            )
        }
        Err(e) => return Err(e.to_string()),
    };
    if let Some(note) = note {
        eprintln!("{note}");
    }
    Ok(if json {
        render_json(status.as_ref())
    } else {
        status::render(status.as_ref())
    })
}

fn render_json(status: Option<&UpgradeStatus>) -> String {
    let mut s = serde_json::to_string_pretty(&status).unwrap_or_else(|_| "null".to_owned());
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, String> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(p(&[]), Ok(Command::Help));
        assert_eq!(
            p(&[
                "run",
                "--root",
                "/t",
                "--service-manager",
                "supervisor",
                "--config",
                "/c.json"
            ]),
            Ok(Command::Run(RunArgs {
                root: Some("/t".into()),
                config: Some("/c.json".into()),
                manager: ManagerKind::Supervisor
            }))
        );
        assert_eq!(
            p(&["run"]),
            Ok(Command::Run(RunArgs {
                root: None,
                config: None,
                manager: ManagerKind::Systemctl
            }))
        );
        assert_eq!(
            p(&["status", "--json"]),
            Ok(Command::Status {
                root: None,
                json: true
            })
        );
        assert_eq!(
            p(&["frobnicate"]),
            Err("unknown command \"frobnicate\"".into())
        );
        assert_eq!(
            p(&["status", "--config", "x"]),
            Err("unknown option \"--config\" for status".into())
        );
        assert_eq!(p(&["run", "--root"]), Err("--root needs a value".into()));
        assert_eq!(
            p(&["run", "--service-manager", "init"]),
            Err("--service-manager \"init\": use systemctl or supervisor".into())
        );
    }
}
