//! fleetctl's command line: one clap definition of every command, from
//! which `--help`, the man pages and the bash completion come.
//!
//! Each command group is one file here: a clap type (its arguments, typed
//! and validated as they are parsed) and a `run` that calls the module
//! that owns the logic. [`Command`] lists the groups; [`main`] parses,
//! dispatches, prints what the command returned and maps its failure to
//! the exit code ([`Failure::exit_code`]).
//!
//! Adding a command: a variant of [`Command`] (or of its group's
//! subcommand enum) and its `run`; a NATS command flattens
//! [`ConnFlags`](crate::connect::ConnFlags) and connects with it.

mod artifact;
mod buckets;
mod device;
mod generate;
mod metrics;
mod nats_config;
mod presence;
mod rollout;
mod status;
mod upgrade;
mod watch;
mod workload;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use crate::error::{CtlError, EXIT_CODES};
use crate::selector::Selector;

/// The whole command line.
#[derive(Debug, Parser)]
#[command(
    name = "fleetctl",
    version,
    about = "operate a Harmony fleet",
    long_about = "fleetctl: operate a Harmony fleet

Writes the nats-server config, publishes agent releases, and, over NATS, \
writes devices' desired workloads, labels and agent upgrades, rolls \
releases out over the fleet and shows its status. Each command has its \
own help: fleetctl COMMAND --help.",
    after_help = EXIT_CODES,
    disable_help_subcommand = true,
    max_term_width = 100
)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

/// The command groups.
#[derive(Debug, Subcommand)]
enum Command {
    NatsConfig(nats_config::NatsConfig),
    Artifact(artifact::Artifact),
    Buckets(buckets::Buckets),
    Workload(workload::Workload),
    Device(device::Device),
    Upgrade(upgrade::Upgrade),
    Rollout(rollout::Rollout),
    Status(status::Status),
    Watch(watch::Watch),
    Metrics(metrics::Metrics),
    Presence(presence::Presence),
    #[command(hide = true)]
    Generate(generate::Generate),
}

impl Command {
    fn run(self) -> Result<Output, Failure> {
        match self {
            Self::NatsConfig(c) => c.run(),
            Self::Artifact(c) => c.run(),
            Self::Buckets(c) => c.run(),
            Self::Workload(c) => c.run(),
            Self::Device(c) => c.run(),
            Self::Upgrade(c) => c.run(),
            Self::Rollout(c) => c.run(),
            Self::Status(c) => c.run(),
            Self::Watch(c) => c.run(),
            Self::Metrics(c) => c.run(),
            Self::Presence(c) => c.run(),
            Self::Generate(c) => c.run(),
        }
    }
}

/// `-l SELECTOR`, as every command that selects devices takes it.
#[derive(Debug, Clone, clap::Args)]
pub struct Select {
    /// The devices matching SELECTOR
    #[arg(
        short = 'l',
        long = "selector",
        value_name = "SELECTOR",
        value_parser = parse_selector,
        long_help = SELECTOR_HELP
    )]
    selector: Option<Selector>,
}

const SELECTOR_HELP: &str = "The devices matching SELECTOR (as Kubernetes): \
site=berlin,tier!=canary,env in (prod,stage),env notin (lab),legacy,!legacy. \
Keys are labels (fleetctl device label) or device facts: device, arch, \
agent-version, os, config-state, frozen.";

fn parse_selector(s: &str) -> Result<Selector, String> {
    Selector::parse(s).map_err(|e| e.to_string())
}

/// A label key (`--group-by`).
fn parse_label_key(s: &str) -> Result<String, String> {
    if fleet_common::contracts::is_label_key(s) {
        Ok(s.to_owned())
    } else {
        Err(format!("{s:?} is not a label key"))
    }
}

/// What a command that ran prints and exits with.
#[derive(Debug)]
pub struct Output {
    stdout: String,
    stderr: String,
    code: u8,
}

impl Output {
    fn text(stdout: String) -> Self {
        Self {
            stdout,
            stderr: String::new(),
            code: 0,
        }
    }
}

/// Why a command did not run to its end.
#[derive(Debug)]
pub enum Failure {
    /// The command line is wrong (exit 2); clap's error says how.
    Usage(clap::Error),
    /// A NATS command failed (exit 3 to 7: [`CtlError::exit_code`]).
    Ctl(CtlError),
    /// A command outside NATS failed (exit 1); the text names the command.
    Other(String),
}

impl From<CtlError> for Failure {
    fn from(e: CtlError) -> Self {
        Self::Ctl(e)
    }
}

impl Failure {
    /// A usage error found after parsing, shown with the usage of the
    /// subcommand at `path` (command words after `fleetctl`).
    fn usage(path: &[&str], message: impl std::fmt::Display) -> Self {
        let mut root = Cli::command();
        root.build();
        let mut cmd = &mut root;
        for word in path {
            cmd = cmd
                .find_subcommand_mut(word)
                .expect("INVARIANT: callers name subcommands that exist");
        }
        Self::Usage(cmd.error(clap::error::ErrorKind::ValueValidation, message))
    }

    /// The exit code, listed in `fleetctl --help` ([`EXIT_CODES`]).
    fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(e) => u8::try_from(e.exit_code()).unwrap_or(2),
            Self::Ctl(e) => e.exit_code(),
            Self::Other(_) => 1,
        }
    }

    fn print(&self) {
        match self {
            // clap prints help and version on stdout, errors on stderr.
            Self::Usage(e) => {
                let _ = e.print();
            }
            Self::Ctl(e) => eprintln!("fleetctl: {e}"),
            Self::Other(m) => eprintln!("{m}"),
        }
    }
}

/// Parses `args` (without the program name) as fleetctl's command line.
#[cfg(test)]
pub fn parse<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(std::iter::once("fleetctl".into()).chain(args.into_iter().map(Into::into)))
}

/// Runs a parsed command line: what it printed is printed, its exit code
/// returned.
fn run(cli: Cli) -> Result<Output, Failure> {
    match cli.command {
        Some(c) => c.run(),
        // Bare `fleetctl`: the help, as --help gives it.
        None => Ok(Output::text(Cli::command().render_long_help().to_string())),
    }
}

/// `fleetctl ...`.
pub fn main() -> ExitCode {
    let outcome = Cli::try_parse().map_err(Failure::Usage).and_then(run);
    match outcome {
        Ok(out) => {
            print!("{}", out.stdout);
            eprint!("{}", out.stderr);
            ExitCode::from(out.code)
        }
        Err(f) => {
            f.print();
            ExitCode::from(f.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parsed command, in its Debug form (the clap types are private
    /// to their files); a usage error as clap words it.
    fn p(a: &[&str]) -> Result<String, String> {
        parse(a.iter().copied())
            .map(|c| format!("{:?}", c.command))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn every_command_parses_with_its_options() {
        for (a, has) in [
            (
                &[
                    "workload",
                    "apply",
                    "dev1",
                    "web",
                    "web.json",
                    "--server",
                    "nats://h:1",
                ][..],
                &[
                    "Apply",
                    "\"dev1\", \"web\", \"web.json\"",
                    "servers: [\"nats://h:1\"]",
                ][..],
            ),
            (
                &["workload", "--server", "nats://h:1", "ls", "dev1"][..],
                &["Ls", "device: Some(\"dev1\")", "servers: [\"nats://h:1\"]"][..],
            ),
            (
                &["workload", "delete", "dev1", "web"][..],
                &["Rm", "[\"dev1\", \"web\"]"][..],
            ),
            (&["workload", "apply", "d", "w", "-"][..], &["\"-\""][..]),
            (
                &["upgrade", "dev1", "--release", "r.json", "--retry"][..],
                &[
                    "device: Some(\"dev1\")",
                    "release: \"r.json\"",
                    "retry: true",
                ][..],
            ),
            (&["status", "--json"][..], &["Status", "json: true"][..]),
            (
                &["watch", "--heartbeats"][..],
                &["Watch", "heartbeats: true"][..],
            ),
            (
                &["buckets", "create", "--replicas", "3"][..],
                &["replicas: 3", "recreate: false"][..],
            ),
            (
                &["device", "label", "dev1", "site=berlin", "tier-"][..],
                &["Set(\"site\", \"berlin\")", "Remove(\"tier\")"][..],
            ),
            (
                &[
                    "rollout",
                    "--release",
                    "r.json",
                    "-l",
                    "env in (prod)",
                    "--batches",
                    "1,100%",
                    "--success-threshold",
                    "95%",
                    "--batch-timeout",
                    "5m",
                    "--max-unavailable",
                    "2",
                    "--group-by",
                    "site",
                ][..],
                &[
                    "Batches([\"1\", \"100%\"])",
                    "success_threshold: 95",
                    "batch_timeout: 300s",
                    "max_unavailable: Some(2)",
                    "group_by: Some(\"site\")",
                ][..],
            ),
            (
                &["rollout", "--release", "r.json", "--batches", "100%"][..],
                &[
                    "success_threshold: 100",
                    "batch_timeout: 1800s",
                    "json: false",
                ][..],
            ),
            (
                &["rollout", "abort", "r-1a2b"][..],
                &["Abort { id: \"r-1a2b\" }"][..],
            ),
            (
                &["rollout", "status", "r-1a2b", "--json"][..],
                &["Status { id: \"r-1a2b\", json: true }"][..],
            ),
            (
                &["status", "-l", "site", "--group-by", "site"][..],
                &["group_by: Some(\"site\")"][..],
            ),
            (
                &[
                    "workload",
                    "rollout",
                    "-l",
                    "ring=a",
                    "web",
                    "web.json",
                    "--batches",
                    "1,100%",
                    "--batch-timeout",
                    "90s",
                    "--dry-run",
                ][..],
                &[
                    "workload: \"web\"",
                    "Batches([\"1\", \"100%\"])",
                    "success_threshold: 100",
                    "batch_timeout: 90s",
                    "dry_run: true",
                ][..],
            ),
            (
                &["rollout", "undo", "r-1a2b"][..],
                &["Undo { id: \"r-1a2b\" }"][..],
            ),
            (
                &["device", "pending", "--json"][..],
                &["Pending { json: true }"][..],
            ),
            (
                &["device", "registry", "-l", "state=approved"][..],
                &["Registry", "state=approved", "json: false"][..],
            ),
            (
                &["device", "approve", "dev-a", "dev-b"][..],
                &[
                    "Approve",
                    "DeviceId(\"dev-a\"), DeviceId(\"dev-b\")",
                    "id_only: false",
                ][..],
            ),
            (
                &["device", "approve", "-l", "arch=arm64"][..],
                &["Approve", "devices: []", "arch=arm64"][..],
            ),
            (
                &["device", "approve", "--id-only", "dev-a"][..],
                &["id_only: true"][..],
            ),
            (
                &["device", "reject", "dev-a", "--reason", "unknown serial"][..],
                &["Reject", "Reason(\"unknown serial\")"][..],
            ),
            (
                &["device", "preauthorize", "--file", "f.jsonl"][..],
                &["Preauthorize { file: \"f.jsonl\" }"][..],
            ),
            (&["device", "revoke", "dev-a"][..], &["Revoke"][..]),
            (
                &["device", "decommission", "dev-a"][..],
                &["Decommission", "wait: 120s", "force: false"][..],
            ),
            (
                &["device", "decommission", "dev-a", "--force"][..],
                &["force: true"][..],
            ),
        ] {
            let got = p(a).unwrap_or_else(|e| panic!("{a:?}: {e}"));
            for h in has {
                assert!(got.contains(h), "{a:?}: {h} not in {got}");
            }
        }
    }

    #[test]
    fn bad_command_lines_are_usage_errors_that_say_why() {
        for (a, says) in [
            (&["upgrade", "dev1"][..], "the following required arguments were not provided:\n  --release <RELEASE.json>"),
            (&["status", "--retry"][..], "unexpected argument '--retry' found"),
            (&["rollout", "--release", "r", "--json"][..], "required arguments were not provided:\n  --batches <LIST>"),
            (&["buckets", "create", "--replicas", "9"][..], "9 is not in 1..=5"),
            (&["workload", "mv"][..], "unrecognized subcommand 'mv'"),
            (&["status", "--colour"][..], "unexpected argument '--colour' found"),
            (&["status", "--server"][..], "a value is required for '--server <URL>'"),
            (
                &["device", "ls", "-l", "env in (prod"][..],
                "selector \"env in (prod\": '(' without ')'; use key=value, key!=value, key in (a,b), key notin (a,b), key or !key, separated by commas",
            ),
            (
                &["device", "label", "dev1", "arch=arm"][..],
                "label key \"arch\" is the name of a device fact (device, arch, agent-version, os, config-state, frozen): pick another key",
            ),
            (&["device", "label", "dev1"][..], "<CHANGE>..."),
            (
                &["rollout", "--release", "r", "--batches", "1,50%"][..],
                "--batches \"1,50%\": end with 100% so that every selected device is covered",
            ),
            (
                &["rollout", "--release", "r", "--batches", "100%", "--group-by", "site"][..],
                "required arguments were not provided:\n  --max-unavailable <N>",
            ),
            (
                &["rollout", "--release", "r", "--batches", "100%", "--retry"][..],
                "'--batches <LIST>' cannot be used with '--retry'",
            ),
            (&["workload", "ls", "-l", "a", "--dry-run"][..], "unexpected argument '--dry-run' found"),
            (&["workload", "apply", "d", "w", "s", "--dry-run"][..], "required arguments were not provided:\n  --selector <SELECTOR>"),
            (&["workload", "ls", "-l", "a", "dev1"][..], "cannot be used with"),
            (&["workload", "rollout", "web", "w.json"][..], "required arguments were not provided:\n  --batches <LIST>"),
            (
                &["workload", "rollout", "web", "w.json", "--batches", "100%", "--group-by", "site"][..],
                "required arguments were not provided:\n  --max-unavailable <N>",
            ),
            (&["rollout", "undo", "R.1"][..], "\"R.1\" is not a rollout id"),
            (&["rollout", "status", "R.1"][..], "\"R.1\" is not a rollout id (as printed when it started, e.g. r-1a2b3c4d; fleetctl rollout ls)"),
            (&["status", "--group-by", "a b"][..], "\"a b\" is not a label key"),
            (&["device", "enroll"][..], "unrecognized subcommand 'enroll'"),
            (&["device", "approve"][..], "required arguments were not provided:\n  <DEVICE>..."),
            (&["device", "approve", "dev-a", "-l", "arch=arm64"][..], "cannot be used with"),
            (&["device", "approve", "--id-only", "-l", "arch=arm64"][..], "cannot be used with"),
            (&["device", "approve", "dev.a"][..], "invalid device id \"dev.a\""),
            (&["device", "reject"][..], "required arguments were not provided:\n  <DEVICE>..."),
            (
                &["device", "reject", "dev-a", "--reason", &"x".repeat(257)][..],
                "the reason has 257 characters, more than the 256 a record keeps",
            ),
            (&["device", "reject", "dev-a", "--reason", "a\nb"][..], "control characters"),
            (&["device", "preauthorize"][..], "required arguments were not provided:\n  --file <FILE>"),
            (&["device", "revoke"][..], "required arguments were not provided:\n  <DEVICE>..."),
            (&["device", "decommission", "dev-a", "--wait", "soon"][..], "give a duration such as 90s"),
            (&["device", "decommission", "dev-a", "--wait", "1m", "--force"][..], "cannot be used with"),
            (&["device", "decommission", "dev-a", "dev-b"][..], "unexpected argument 'dev-b' found"),
            (&["bogus", "--help"][..], "unrecognized subcommand 'bogus'"),
            (&["help"][..], "unrecognized subcommand 'help'"),
        ] {
            let e = parse(a.iter().copied()).expect_err(&format!("{a:?} parsed"));
            assert_eq!(e.exit_code(), 2, "{a:?}");
            let text = e.to_string();
            assert!(text.contains(says), "{a:?}: {text}");
        }
    }

    /// Positional counts are checked after parsing: the error names both
    /// forms.
    #[test]
    fn workload_arguments_are_counted_for_the_form_given() {
        let failure = |a: &[&str]| match parse(a.iter().copied()).expect("parses").command {
            Some(c) => match c.run() {
                Err(Failure::Usage(e)) => (e.exit_code(), e.to_string()),
                other => panic!("{a:?}: {other:?}"),
            },
            None => panic!("{a:?}: no command"),
        };
        let (code, text) = failure(&["workload", "apply", "d", "web"]);
        assert_eq!(code, 2);
        assert!(
            text.contains("give DEVICE WORKLOAD SPEC.json, or -l SELECTOR WORKLOAD SPEC.json"),
            "{text}"
        );
        assert!(text.contains("Usage: fleetctl workload apply"), "{text}");
        let (_, text) = failure(&["workload", "apply", "-l", "a", "d", "web", "s.json"]);
        assert!(text.contains("with -l, give WORKLOAD SPEC.json"), "{text}");
        let (_, text) = failure(&["workload", "rm", "-l", "a", "d", "w"][..]);
        assert!(text.contains("with -l, give WORKLOAD"), "{text}");
        let (_, text) = failure(&["workload", "rm", "d"][..]);
        assert!(
            text.contains("give DEVICE WORKLOAD, or -l SELECTOR WORKLOAD"),
            "{text}"
        );
    }

    #[test]
    fn help_and_version_exit_zero_per_command() {
        for a in [
            &["--help"][..],
            &["--version"][..],
            &["rollout", "--help"][..],
            &["workload", "apply", "--help"][..],
            &["nats-config", "--help"][..],
            &["artifact", "push", "--help"][..],
            &["rollout", "status", "-h"][..],
            &["workload", "rollout", "--help"][..],
            &["rollout", "undo", "--help"][..],
        ] {
            let e = parse(a.iter().copied()).expect_err("help is an early exit");
            assert_eq!(e.exit_code(), 0, "{a:?}");
        }
        let e = parse(["workload", "apply", "--help"]).expect_err("help");
        let text = e.to_string();
        assert!(
            text.contains("-l SELECTOR WORKLOAD SPEC.json [--dry-run]"),
            "{text}"
        );
        assert!(text.contains("--server <URL>"), "{text}");
        assert!(!text.contains("--batches"), "{text}");
    }

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
