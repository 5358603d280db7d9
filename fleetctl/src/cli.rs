//! The NATS commands of fleetctl: parsing their arguments (connection
//! flags anywhere, [`crate::connect`]) and running them.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::connect::{self, ConnFlags, Reconnect};
use crate::error::{CtlError, EXIT_CODES};
use crate::labels::{parse_change, LabelChange};
use crate::selector::Selector;
use crate::staged::{self, parse_batches, parse_duration, parse_percent, Display, Policy};
use crate::{admin, group, labels, rollout, status, upgrade, watch, workload};
use fleet_common::contracts::{is_label_key, is_rollout_id, RolloutPhase};

/// `--batch-timeout` when not given.
const DEFAULT_BATCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

fn rollout_id(id: &str) -> Result<String, String> {
    if is_rollout_id(id) {
        Ok(id.to_owned())
    } else {
        Err(format!(
            "{id:?} is not a rollout id (as printed when it started, e.g. r-1a2b3c4d; fleetctl rollout ls)"
        ))
    }
}

fn group_output(g: group::GroupOutcome) -> Output {
    Output {
        stdout: g.lines,
        stderr: g.summary,
        code: if g.failed > 0 { 5 } else { 0 },
    }
}

fn rollout_output(r: rollout::Rollout) -> Output {
    Output {
        stdout: r.lines,
        stderr: r.summary,
        code: if r.lost > 0 {
            7
        } else if r.failed > 0 {
            5
        } else {
            0
        },
    }
}

fn staged_output(e: staged::Ended) -> Output {
    Output {
        stdout: String::new(),
        stderr: String::new(),
        code: match e.0 {
            RolloutPhase::Complete | RolloutPhase::Running => 0,
            RolloutPhase::Halted => 8,
            RolloutPhase::Aborted => 9,
        },
    }
}

pub const HELP: &str = "fleetctl: the operator's NATS commands

Usage:
  fleetctl buckets create [--replicas N] [--recreate]
  fleetctl workload apply DEVICE WORKLOAD SPEC.json   (SPEC.json - reads stdin)
  fleetctl workload apply -l SELECTOR WORKLOAD SPEC.json [--dry-run]
  fleetctl workload rm DEVICE WORKLOAD | rm -l SELECTOR WORKLOAD
  fleetctl workload ls DEVICE | ls -l SELECTOR
  fleetctl device status DEVICE
  fleetctl device label DEVICE key=value ... [key-]
  fleetctl device ls [-l SELECTOR] [--json]
  fleetctl upgrade DEVICE --release RELEASE.json [--retry]
  fleetctl upgrade -l SELECTOR --release RELEASE.json [--retry]
  fleetctl rollout --release RELEASE.json [--retry] [-l SELECTOR]
  fleetctl rollout --release RELEASE.json [-l SELECTOR] --batches 1,5%,25%,100%
      [--success-threshold 95%] [--batch-timeout 30m]
      [--max-unavailable N [--group-by LABEL]] [--json]
  fleetctl rollout status|resume|abort ID [--json]
  fleetctl rollout ls
  fleetctl status [-l SELECTOR] [--group-by LABEL] [--json]
  fleetctl watch [--heartbeats] [-l SELECTOR]

SELECTOR (as Kubernetes): site=berlin,tier!=canary,env in (prod,stage),
env notin (lab),legacy,!legacy. Keys are labels (fleetctl device label)
or device facts: device, arch, agent-version, os, config-state, frozen.

upgrade writes DEVICE's upgrade intent with a new attempt (compare-and-set:
of two writers racing, one wins and the other is told). rollout does it for
every device whose agent version differs, skipping frozen devices, devices
in rollback-failed and attempts of this release under way, one line per
device. A release whose attempt failed on a device is issued again only
with --retry. A device in rollback-failed gets a new attempt only from
upgrade with --retry, once it has been repaired on the device (REPAIR.md).

A rollout with --batches is staged: batch after batch (each entry the
number or percentage of the devices reached by its end), the next batch
only when the success rate of the last one meets --success-threshold
(default 100%); below it the rollout halts and says which devices failed
and why. A batch ends when each device is complete, failed or frozen, or
after --batch-timeout (default 30m). --max-unavailable N: never more than
N devices (of one --group-by label value) upgrading or without a fresh
heartbeat at once. Its state lives in NATS: status, resume and abort work
from any operator's machine; a resumed rollout issues nothing twice.
Frozen devices are skipped and reported, and issued once unfrozen.

RELEASE.json:
  {\"version\": \"1.4.0\", \"artifacts\": {\"x86_64\": {\"artifact-url\": \"https://...\",
   \"sha256\": \"<64 hex>\", \"max-bytes\": <bytes>}, \"aarch64\": {...}}}
";

/// A parsed NATS command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Help,
    BucketsCreate {
        replicas: u8,
        /// Recreate (keeping every key's last value) a bucket the server
        /// cannot update in place.
        recreate: bool,
    },
    Apply {
        device: String,
        workload: String,
        spec: PathBuf,
    },
    Rm {
        device: String,
        workload: String,
    },
    Ls {
        device: String,
    },
    DeviceStatus {
        device: String,
    },
    Upgrade {
        device: String,
        release: PathBuf,
        retry: bool,
    },
    Rollout {
        release: PathBuf,
        retry: bool,
        selector: Option<Selector>,
    },
    UpgradeGroup {
        selector: Selector,
        release: PathBuf,
        retry: bool,
    },
    Staged {
        release: PathBuf,
        selector: Option<Selector>,
        policy: Policy,
        json: bool,
    },
    RolloutStatus {
        id: String,
        json: bool,
    },
    RolloutResume {
        id: String,
        json: bool,
    },
    RolloutAbort {
        id: String,
    },
    RolloutLs,
    DeviceLabel {
        device: String,
        changes: Vec<LabelChange>,
    },
    DeviceLs {
        selector: Option<Selector>,
        json: bool,
    },
    GroupApply {
        selector: Selector,
        workload: String,
        spec: PathBuf,
        dry_run: bool,
    },
    GroupRm {
        selector: Selector,
        workload: String,
    },
    GroupLs {
        selector: Selector,
    },
    Status {
        json: bool,
        selector: Option<Selector>,
        group_by: Option<String>,
    },
    Watch {
        heartbeats: bool,
        selector: Option<Selector>,
    },
}

/// Options of one command, taken out of its words.
#[derive(Default)]
struct Opts {
    words: Vec<String>,
    release: Option<PathBuf>,
    retry: bool,
    json: bool,
    heartbeats: bool,
    replicas: Option<String>,
    recreate: bool,
    selector: Option<String>,
    dry_run: bool,
    group_by: Option<String>,
    batches: Option<String>,
    threshold: Option<String>,
    timeout: Option<String>,
    max_unavailable: Option<String>,
}

fn opts(args: Vec<String>) -> Result<Opts, String> {
    let mut o = Opts::default();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--release" => {
                o.release = Some(it.next().ok_or("--release needs a file")?.into());
            }
            "--replicas" => o.replicas = Some(it.next().ok_or("--replicas needs a number")?),
            "-l" | "--selector" => {
                o.selector = Some(it.next().ok_or("-l needs a selector")?);
            }
            "--group-by" => o.group_by = Some(it.next().ok_or("--group-by needs a label")?),
            "--batches" => o.batches = Some(it.next().ok_or("--batches needs a list")?),
            "--success-threshold" => {
                o.threshold = Some(it.next().ok_or("--success-threshold needs a percentage")?)
            }
            "--batch-timeout" => {
                o.timeout = Some(it.next().ok_or("--batch-timeout needs a duration")?)
            }
            "--max-unavailable" => {
                o.max_unavailable = Some(it.next().ok_or("--max-unavailable needs a number")?)
            }
            "--dry-run" => o.dry_run = true,
            "--retry" => o.retry = true,
            "--json" => o.json = true,
            "--heartbeats" => o.heartbeats = true,
            "--recreate" => o.recreate = true,
            "--help" | "-h" => o.words = vec!["--help".into()],
            s if s.starts_with("--") => return Err(format!("unknown option {s:?}")),
            _ => o.words.push(a),
        }
    }
    Ok(o)
}

/// Parses a command line (from the command word on).
pub fn parse(args: &[String]) -> Result<(Command, ConnFlags), String> {
    let (flags, rest) = ConnFlags::extract(args)?;
    let o = opts(rest)?;
    let w: Vec<&str> = o.words.iter().map(String::as_str).collect();
    let unused = |what: &str, cmd: Command| -> Result<Command, String> {
        let stray = [
            (o.release.is_some(), "--release"),
            (o.retry, "--retry"),
            (o.json, "--json"),
            (o.heartbeats, "--heartbeats"),
            (o.replicas.is_some(), "--replicas"),
            (o.recreate, "--recreate"),
            (o.selector.is_some(), "-l"),
            (o.dry_run, "--dry-run"),
            (o.group_by.is_some(), "--group-by"),
            (o.batches.is_some(), "--batches"),
            (o.threshold.is_some(), "--success-threshold"),
            (o.timeout.is_some(), "--batch-timeout"),
            (o.max_unavailable.is_some(), "--max-unavailable"),
        ]
        .into_iter()
        .find(|(given, name)| *given && !what.split(' ').any(|a| a == *name));
        match stray {
            Some((_, name)) => Err(format!("{name} does not apply here")),
            None => Ok(cmd),
        }
    };
    let release = || {
        o.release
            .clone()
            .ok_or_else(|| "give the release with --release RELEASE.json".to_owned())
    };
    let selector = || -> Result<Option<Selector>, String> {
        o.selector
            .as_deref()
            .map(Selector::parse)
            .transpose()
            .map_err(|e| e.to_string())
    };
    let group_by = || -> Result<Option<String>, String> {
        match &o.group_by {
            Some(l) if !is_label_key(l) => Err(format!("--group-by {l:?} is not a label key")),
            other => Ok(other.clone()),
        }
    };
    let cmd = match w.as_slice() {
        [] | ["--help"] | [_, "--help"] | [_, _, "--help"] => return Ok((Command::Help, flags)),
        ["buckets", "create"] => {
            let replicas = match &o.replicas {
                None => 1,
                Some(n) => match n.parse::<u8>() {
                    Ok(r @ 1..=5) => r,
                    _ => return Err(format!("--replicas {n:?}: use 1 to 5")),
                },
            };
            unused(
                "--replicas --recreate",
                Command::BucketsCreate {
                    replicas,
                    recreate: o.recreate,
                },
            )?
        }
        ["workload", "apply", wl, spec] if o.selector.is_some() => unused(
            "-l --dry-run",
            Command::GroupApply {
                selector: selector()?.unwrap_or_default(),
                workload: (*wl).into(),
                spec: PathBuf::from(spec),
                dry_run: o.dry_run,
            },
        )?,
        ["workload", "rm" | "delete", wl] if o.selector.is_some() => unused(
            "-l",
            Command::GroupRm {
                selector: selector()?.unwrap_or_default(),
                workload: (*wl).into(),
            },
        )?,
        ["workload", "ls"] if o.selector.is_some() => unused(
            "-l",
            Command::GroupLs {
                selector: selector()?.unwrap_or_default(),
            },
        )?,
        ["device", "label", d, changes @ ..] if !changes.is_empty() => unused(
            "",
            Command::DeviceLabel {
                device: (*d).into(),
                changes: changes
                    .iter()
                    .map(|c| parse_change(c))
                    .collect::<Result<_, _>>()?,
            },
        )?,
        ["device", "label", ..] => {
            return Err("give labels to set (key=value) or remove (key-)".into())
        }
        ["device", "ls"] => unused(
            "-l --json",
            Command::DeviceLs {
                selector: selector()?,
                json: o.json,
            },
        )?,
        ["upgrade"] if o.selector.is_some() => unused(
            "--release --retry -l",
            Command::UpgradeGroup {
                selector: selector()?.unwrap_or_default(),
                release: release()?,
                retry: o.retry,
            },
        )?,
        ["rollout", "status", id] => unused(
            "--json",
            Command::RolloutStatus {
                id: rollout_id(id)?,
                json: o.json,
            },
        )?,
        ["rollout", "resume", id] => unused(
            "--json",
            Command::RolloutResume {
                id: rollout_id(id)?,
                json: o.json,
            },
        )?,
        ["rollout", "abort", id] => unused(
            "",
            Command::RolloutAbort {
                id: rollout_id(id)?,
            },
        )?,
        ["rollout", "ls"] => unused("", Command::RolloutLs)?,
        ["rollout"] if o.batches.is_some() => {
            if o.retry {
                return Err("--retry does not apply to a staged rollout".into());
            }
            if o.group_by.is_some() && o.max_unavailable.is_none() {
                return Err("--group-by applies with --max-unavailable N".into());
            }
            let policy = Policy {
                batches: parse_batches(o.batches.as_deref().unwrap_or_default())?,
                success_threshold_pct: o.threshold.as_deref().map_or(Ok(100), parse_percent)?,
                batch_timeout: o
                    .timeout
                    .as_deref()
                    .map_or(Ok(DEFAULT_BATCH_TIMEOUT), |t| {
                        parse_duration(t).map_err(|e| format!("--batch-timeout {e}"))
                    })?,
                max_unavailable: o
                    .max_unavailable
                    .as_deref()
                    .map(|n| {
                        n.parse::<u32>()
                            .ok()
                            .filter(|n| *n >= 1)
                            .ok_or_else(|| format!("--max-unavailable {n:?}: give 1 or more"))
                    })
                    .transpose()?,
                group_by: group_by()?,
            };
            unused(
                "--release -l --batches --success-threshold --batch-timeout --max-unavailable --group-by --json",
                Command::Staged {
                    release: release()?,
                    selector: selector()?,
                    policy,
                    json: o.json,
                },
            )?
        }
        ["workload", "apply", d, wl, spec] => unused(
            "",
            Command::Apply {
                device: (*d).into(),
                workload: (*wl).into(),
                spec: PathBuf::from(spec),
            },
        )?,
        ["workload", "rm" | "delete", d, wl] => unused(
            "",
            Command::Rm {
                device: (*d).into(),
                workload: (*wl).into(),
            },
        )?,
        ["workload", "ls", d] => unused(
            "",
            Command::Ls {
                device: (*d).into(),
            },
        )?,
        ["device", "status", d] => unused(
            "",
            Command::DeviceStatus {
                device: (*d).into(),
            },
        )?,
        ["upgrade", d] => unused(
            "--release --retry",
            Command::Upgrade {
                device: (*d).into(),
                release: release()?,
                retry: o.retry,
            },
        )?,
        ["rollout"] => unused(
            "--release --retry -l",
            Command::Rollout {
                release: release()?,
                retry: o.retry,
                selector: selector()?,
            },
        )?,
        ["status"] => unused(
            "--json -l --group-by",
            Command::Status {
                json: o.json,
                selector: selector()?,
                group_by: group_by()?,
            },
        )?,
        ["watch"] => unused(
            "--heartbeats -l",
            Command::Watch {
                heartbeats: o.heartbeats,
                selector: selector()?,
            },
        )?,
        other => return Err(format!("unknown command {:?}", other.join(" "))),
    };
    Ok((cmd, flags))
}

fn run(command: Command, flags: ConnFlags) -> Result<Output, CtlError> {
    let options = flags.resolve()?;
    let mode = match command {
        Command::Watch { .. } => Reconnect::Forever,
        _ => Reconnect::Once,
    };
    let c = connect::connect(&options, mode)?;
    let out = match command {
        Command::Help => Output::text(String::new()),
        Command::BucketsCreate { replicas, recreate } => {
            let mut out = String::new();
            for (bucket, outcome) in admin::create_buckets(&c, replicas, recreate)? {
                out.push_str(&match outcome {
                    admin::BucketOutcome::Ready => format!("{bucket}: ready\n"),
                    admin::BucketOutcome::Updated => {
                        format!("{bucket}: updated in place to this release's config\n")
                    }
                    admin::BucketOutcome::Recreated { keys } => format!(
                        "{bucket}: recreated with this release's config, {keys} keys copied\n"
                    ),
                });
            }
            Output::text(out)
        }
        Command::Apply {
            device,
            workload,
            spec,
        } => {
            let (rev, hash) = workload::apply(&c, &device, &workload, &spec)?;
            Output::text(format!(
                "applied {device}.{workload} (revision {rev}, spec hash {hash})\n"
            ))
        }
        Command::Rm { device, workload } => {
            workload::rm(&c, &device, &workload)?;
            Output::text(format!("deleted {device}.{workload}\n"))
        }
        Command::Ls { device } => Output::text(workload::ls(&c, &device)?),
        Command::DeviceStatus { device } => Output::text(status::device(&c, &device)?),
        Command::Upgrade {
            device,
            release,
            retry,
        } => Output::text(upgrade::run(&c, &device, &release, retry)?),
        Command::Rollout {
            release,
            retry,
            selector,
        } => rollout_output(rollout::run(&c, &release, retry, selector.as_ref())?),
        Command::UpgradeGroup {
            selector,
            release,
            retry,
        } => rollout_output(rollout::run(&c, &release, retry, Some(&selector))?),
        Command::Staged {
            release,
            selector,
            policy,
            json,
        } => staged_output(staged::start(
            &c,
            &release,
            selector.as_ref(),
            &policy,
            Display::pick(json),
        )?),
        Command::RolloutStatus { id, json } => Output::text(staged::status(&c, &id, json)?),
        Command::RolloutResume { id, json } => {
            staged_output(staged::resume(&c, &id, Display::pick(json))?)
        }
        Command::RolloutAbort { id } => Output::text(staged::abort(&c, &id)?),
        Command::RolloutLs => Output::text(staged::ls(&c)?),
        Command::DeviceLabel { device, changes } => {
            Output::text(labels::label(&c, &device, &changes)?)
        }
        Command::DeviceLs { selector, json } => {
            Output::text(labels::ls(&c, selector.as_ref(), json)?)
        }
        Command::GroupApply {
            selector,
            workload,
            spec,
            dry_run,
        } => group_output(group::apply(&c, &selector, &workload, &spec, dry_run)?),
        Command::GroupRm { selector, workload } => {
            group_output(group::rm(&c, &selector, &workload)?)
        }
        Command::GroupLs { selector } => Output::text(group::ls(&c, &selector)?),
        Command::Status {
            json,
            selector,
            group_by,
        } => Output::text(status::run(
            &c,
            json,
            selector.as_ref(),
            group_by.as_deref(),
        )?),
        Command::Watch {
            heartbeats,
            selector,
        } => {
            watch::run(&c, heartbeats, selector.as_ref())?;
            Output::text(String::new())
        }
    };
    Ok(out)
}

/// What a successful run prints and exits with.
struct Output {
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

/// `fleetctl <nats command> ...`.
pub fn main(args: &[String]) -> ExitCode {
    let (command, flags) = match parse(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fleetctl: {e}; see fleetctl --help");
            return ExitCode::from(2);
        }
    };
    if command == Command::Help {
        print!("{HELP}\n{}\n{EXIT_CODES}", connect::HELP);
        return ExitCode::SUCCESS;
    }
    match run(command, flags) {
        Ok(out) => {
            print!("{}", out.stdout);
            eprint!("{}", out.stderr);
            ExitCode::from(out.code)
        }
        Err(e) => {
            eprintln!("fleetctl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> Result<Command, String> {
        let args: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        parse(&args).map(|(c, _)| c)
    }

    #[test]
    fn every_command_parses_and_stray_options_are_refused() {
        assert_eq!(
            p(&[
                "--server",
                "nats://h:1",
                "workload",
                "apply",
                "dev1",
                "web",
                "web.json"
            ]),
            Ok(Command::Apply {
                device: "dev1".into(),
                workload: "web".into(),
                spec: "web.json".into()
            })
        );
        assert_eq!(
            p(&["workload", "delete", "dev1", "web"]),
            p(&["workload", "rm", "dev1", "web"])
        );
        assert_eq!(
            p(&["workload", "ls", "dev1"]),
            Ok(Command::Ls {
                device: "dev1".into()
            })
        );
        assert_eq!(
            p(&["upgrade", "dev1", "--release", "r.json", "--retry"]),
            Ok(Command::Upgrade {
                device: "dev1".into(),
                release: "r.json".into(),
                retry: true
            })
        );
        assert_eq!(
            p(&["rollout", "--release", "r.json"]),
            Ok(Command::Rollout {
                release: "r.json".into(),
                retry: false,
                selector: None,
            })
        );
        assert_eq!(
            p(&["status", "--json"]),
            Ok(Command::Status {
                json: true,
                selector: None,
                group_by: None
            })
        );
        assert_eq!(
            p(&["watch", "--heartbeats"]),
            Ok(Command::Watch {
                heartbeats: true,
                selector: None
            })
        );
        assert_eq!(
            p(&["buckets", "create", "--replicas", "3"]),
            Ok(Command::BucketsCreate {
                replicas: 3,
                recreate: false
            })
        );
        assert_eq!(p(&["upgrade", "--help"]), Ok(Command::Help));
        let sel = |s: &str| Selector::parse(s).expect("selector");
        assert_eq!(
            p(&[
                "workload",
                "apply",
                "-l",
                "site=berlin",
                "web",
                "w.json",
                "--dry-run"
            ]),
            Ok(Command::GroupApply {
                selector: sel("site=berlin"),
                workload: "web".into(),
                spec: "w.json".into(),
                dry_run: true
            })
        );
        assert_eq!(
            p(&["device", "label", "dev1", "site=berlin", "tier-"]),
            Ok(Command::DeviceLabel {
                device: "dev1".into(),
                changes: vec![
                    LabelChange::Set("site".into(), "berlin".into()),
                    LabelChange::Remove("tier".into())
                ]
            })
        );
        assert_eq!(
            p(&[
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
                "site"
            ]),
            Ok(Command::Staged {
                release: "r.json".into(),
                selector: Some(sel("env in (prod)")),
                policy: Policy {
                    batches: vec!["1".into(), "100%".into()],
                    success_threshold_pct: 95,
                    batch_timeout: std::time::Duration::from_secs(300),
                    max_unavailable: Some(2),
                    group_by: Some("site".into())
                },
                json: false
            })
        );
        assert_eq!(
            p(&["status", "-l", "site", "--group-by", "site"]),
            Ok(Command::Status {
                json: false,
                selector: Some(sel("site")),
                group_by: Some("site".into())
            })
        );
        assert_eq!(
            p(&["rollout", "abort", "r-1a2b"]),
            Ok(Command::RolloutAbort {
                id: "r-1a2b".into()
            })
        );
        for (a, says) in [
            (
                &["upgrade", "dev1"][..],
                "give the release with --release RELEASE.json",
            ),
            (&["status", "--retry"][..], "--retry does not apply here"),
            (
                &["rollout", "--release", "r", "--json"][..],
                "--json does not apply here",
            ),
            (
                &["buckets", "create", "--replicas", "9"][..],
                "--replicas \"9\": use 1 to 5",
            ),
            (&["workload", "mv"][..], "unknown command \"workload mv\""),
            (&["status", "--colour"][..], "unknown option \"--colour\""),
            (&["--server"][..], "--server needs a value"),
            (
                &["device", "ls", "-l", "env in (prod"][..],
                "selector \"env in (prod\": '(' without ')'; use key=value, key!=value, key in (a,b), key notin (a,b), key or !key, separated by commas",
            ),
            (
                &["device", "label", "dev1", "arch=arm"][..],
                "label key \"arch\" is the name of a device fact (device, arch, agent-version, os, config-state, frozen): pick another key",
            ),
            (
                &["rollout", "--release", "r", "--batches", "1,50%"][..],
                "--batches \"1,50%\": end with 100% so that every selected device is covered",
            ),
            (
                &["rollout", "--release", "r", "--batches", "100%", "--group-by", "site"][..],
                "--group-by applies with --max-unavailable N",
            ),
            (
                &["workload", "ls", "-l", "a", "--dry-run"][..],
                "--dry-run does not apply here",
            ),
            (&["rollout", "status", "R.1"][..], "\"R.1\" is not a rollout id (as printed when it started, e.g. r-1a2b3c4d; fleetctl rollout ls)"),
        ] {
            assert_eq!(p(a).as_ref().map_err(String::as_str), Err(says), "{a:?}");
        }
    }
}
