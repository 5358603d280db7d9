//! `fleet-agent`: reconciles Podman workloads from NATS JetStream KV,
//! reports status, forwards upgrade intents, honours change freeze.
//!
//! `main` parses the arguments, calls one mode (`run`, `--self-test` or
//! `node ...`) and maps its outcome to an exit code.

mod api;
mod config;
mod daemon;
mod desired;
mod disabled;
mod enroll;
mod freeze;
mod gate;
mod jitter;
mod lock;
mod nats;
mod node;
mod notify;
mod oauth;
mod podman;
mod probe;
mod prober;
#[cfg(test)]
mod prop_tests;
mod reconciler;
mod shutdown;
mod startup;
mod status;
mod sysinfo;
mod threads;
mod traffic;
mod upgrade;

use std::path::PathBuf;
use std::process::ExitCode;

use fleet_common::layout::Layout;
use fleet_common::signals::TerminationSignals;
use fleet_common::validate::Version;

/// The compiled agent version; `FLEET_AGENT_VERSION` at build time overrides
/// the package version (release builds and the two-version upgrade tests).
pub const VERSION: &str = match option_env!("FLEET_AGENT_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};

fn help() -> String {
    format!(
        "fleet-agent {VERSION}: reconciles Podman workloads from NATS JetStream KV

Usage:
  fleet-agent run [--config PATH]          run the agent (under systemd)
  fleet-agent --self-test [--config PATH]  probe mode: check config, Podman, NATS,
                                           buckets, keys, the updater socket and a
                                           complete snapshot; change nothing; print
                                           one JSON report (with the version) on stdout
  fleet-agent node freeze [--reason TEXT] [--json] [--config PATH]
                                           enter the change freeze: desired state is
                                           recorded, not applied; upgrades wait; missing
                                           containers are restored from local images
  fleet-agent node unfreeze [--json] [--config PATH]
                                           end it: a new snapshot is read and applied
  fleet-agent node status [--json] [--config PATH]
                                           the running agent's view, and whether a
                                           freeze would be accepted now
  fleet-agent --help | --version

PATH defaults to {config}. `node` talks to the running agent's socket
({socket}, under the config's root when --config is given); only root,
members of group fleet-control and the agent's own user may.

Config keys (JSON, unknown keys refused): device-id, nats.servers,
nats.auth.method (none | user-password: user, password-file | token:
token-file | creds: creds-file | tls-certificate | oauth2-client-credentials:
token-url, client-id, client-secret-file), nats.tls (ca-file,
client-cert-file, client-key-file), and optionally:
{defaults}

Exit codes:
   0  success (run: stopped on SIGTERM/SIGINT after draining)
   1  internal error
   2  usage error
  10  config            invalid or unreadable configuration
  11  podman            Podman not reachable
  12  nats-auth         NATS connection or credentials
  13  buckets           (probe) the fleet-control intent key does not answer a Direct Get
  14  device-keys       (probe) the intent read is not understood
  15  desired-read      (probe) the republished keys cannot be subscribed to, or the
                        fleet-workloads document cannot be read (Direct Get)
  16  updater-socket    (probe) the updater socket does not accept connections
  17  snapshot          no complete desired-state snapshot
  20  lock              another fleet-agent holds the lock (or the run or state
                        directory is unusable)
  21  device-info       (run) device info (or the recovered upgrade status) not
                        acknowledged by JetStream
  22  upgrade-target    (run) the updater is starting an upgrade target and this
                        binary is another version: no READY, so it rolls back
  23  agent-socket      (run) the agent socket cannot be bound
  24  unenrolled        (run, enrollment method) the fleet no longer approves this
                        device (decommissioned, rejected, pending again): the
                        workloads keep running; the next start waits for approval

Exit codes of `node`:
   0  done (or already so)
   1  the agent answered another error
   3  refused: the agent cannot freeze now; every reason and a retry hint
      are printed (reasons: no-snapshot, disconnected, draining,
      upgrade-in-progress, intent-pending, reconciler-busy,
      download-in-progress, not-persisted)
   4  forbidden: not root, fleet-control or the agent's user
   5  unreachable: no agent answers on the socket
  10  config            the config named by --config cannot be read
",
        config = Layout::production().agent_config().display(),
        socket = Layout::production().agent_socket().display(),
        defaults = config::DEFAULTS,
    )
}

/// The parsed command line.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    Run { config: PathBuf },
    SelfTest { config: PathBuf },
    Node(node::NodeArgs),
    Help,
    Version,
}

fn parse_args(args: &[String]) -> Result<Command, String> {
    if args.first().map(String::as_str) == Some("node") {
        if args.iter().any(|a| a == "--help" || a == "-h") {
            return Ok(Command::Help);
        }
        return node::parse(&args[1..]).map(Command::Node);
    }
    let mut mode: Option<&str> = None;
    let mut config: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--help" | "-h" => return Ok(Command::Help),
            "--version" | "-V" => return Ok(Command::Version),
            "run" | "--self-test" if mode.is_none() => mode = Some(a),
            "--config" if config.is_none() => match it.next() {
                Some(p) => config = Some(PathBuf::from(p)),
                None => return Err("--config needs a path".into()),
            },
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    let config = config.unwrap_or_else(|| Layout::production().agent_config());
    match mode {
        Some("run") => Ok(Command::Run { config }),
        Some(_) => Ok(Command::SelfTest { config }),
        None => Err("say `run` or `--self-test`".into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match parse_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fleet-agent: {e}; see fleet-agent --help");
            return ExitCode::from(2);
        }
    };
    if let Command::Node(a) = &command {
        // A short client: Ctrl-C ends it as usual.
        let out = node::run(a);
        print!("{}", out.stdout);
        eprint!("{}", out.stderr);
        return ExitCode::from(out.code);
    }
    // Before any thread exists, so every thread inherits the mask and only
    // the signal thread ever takes SIGTERM.
    let signals = match TerminationSignals::block() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fleet-agent: {e}");
            return ExitCode::from(1);
        }
    };
    match command {
        // Answered above, without blocking signals.
        Command::Node(_) => ExitCode::from(1),
        Command::Help => {
            print!("{}", help());
            ExitCode::SUCCESS
        }
        Command::Version => {
            println!("fleet-agent {VERSION}");
            ExitCode::SUCCESS
        }
        Command::SelfTest { config } => {
            fleet_common::logging::init("fleet-agent");
            let version = match Version::parse(VERSION) {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("fleet-agent: the compiled version is invalid: {e}");
                    return ExitCode::from(1);
                }
            };
            let outcome = probe::run(&config, version);
            match serde_json::to_string(&outcome.report) {
                Ok(line) => println!("{line}"),
                Err(e) => {
                    eprintln!("fleet-agent: encoding the report: {e}");
                    return ExitCode::from(1);
                }
            }
            ExitCode::from(outcome.exit_code)
        }
        Command::Run { config } => {
            fleet_common::logging::init("fleet-agent");
            match daemon::run(&config, signals, VERSION) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    log::error!("{e}");
                    ExitCode::from(e.exit_code())
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments() {
        let default = Layout::production().agent_config();
        assert_eq!(
            parse_args(&args(&["run"])),
            Ok(Command::Run {
                config: default.clone()
            })
        );
        assert_eq!(
            parse_args(&args(&["--self-test", "--config", "/x.json"])),
            Ok(Command::SelfTest {
                config: "/x.json".into()
            })
        );
        assert_eq!(
            parse_args(&args(&["--config", "/x.json", "run"])),
            Ok(Command::Run {
                config: "/x.json".into()
            })
        );
        assert_eq!(parse_args(&args(&["run", "--help"])), Ok(Command::Help));
        assert_eq!(
            parse_args(&args(&[])),
            Err("say `run` or `--self-test`".into())
        );
        assert_eq!(
            parse_args(&args(&["run", "run"])),
            Err("unexpected argument \"run\"".into())
        );
        assert_eq!(
            parse_args(&args(&["--config"])),
            Err("--config needs a path".into())
        );
        assert!(help().contains("17  snapshot"));
        assert!(help().contains("3  refused"));
        assert_eq!(
            parse_args(&args(&["node", "status", "--json"])),
            Ok(Command::Node(node::NodeArgs {
                command: node::NodeCommand::Status,
                json: true,
                config: None
            }))
        );
        assert_eq!(parse_args(&args(&["node", "--help"])), Ok(Command::Help));
        assert_eq!(
            parse_args(&args(&["run", "node"])),
            Err("unexpected argument \"node\"".into())
        );
    }
}
