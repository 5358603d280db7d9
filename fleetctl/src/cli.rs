//! The NATS commands of fleetctl: parsing their arguments (connection
//! flags anywhere, [`crate::connect`]) and running them.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::connect::{self, ConnFlags, Reconnect};
use crate::error::{CtlError, EXIT_CODES};
use crate::{admin, rollout, status, upgrade, watch, workload};

pub const HELP: &str = "fleetctl: the operator's NATS commands

Usage:
  fleetctl buckets create [--replicas N] [--recreate]
  fleetctl workload apply DEVICE WORKLOAD SPEC.json   (SPEC.json - reads stdin)
  fleetctl workload rm DEVICE WORKLOAD
  fleetctl workload ls DEVICE
  fleetctl device status DEVICE
  fleetctl upgrade DEVICE --release RELEASE.json [--retry]
  fleetctl rollout --release RELEASE.json [--retry]
  fleetctl status [--json]
  fleetctl watch [--heartbeats]

upgrade writes DEVICE's upgrade intent with a new attempt (compare-and-set:
of two writers racing, one wins and the other is told). rollout does it for
every device whose agent version differs, skipping frozen devices, devices
in rollback-failed and attempts of this release under way, one line per
device. A release whose attempt failed on a device is issued again only
with --retry. A device in rollback-failed gets a new attempt only from
upgrade with --retry, once it has been repaired on the device (REPAIR.md).

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
    },
    Status {
        json: bool,
    },
    Watch {
        heartbeats: bool,
    },
}

/// Options of one command, taken out of its words.
struct Opts {
    words: Vec<String>,
    release: Option<PathBuf>,
    retry: bool,
    json: bool,
    heartbeats: bool,
    replicas: Option<String>,
    recreate: bool,
}

fn opts(args: Vec<String>) -> Result<Opts, String> {
    let mut o = Opts {
        words: Vec::new(),
        release: None,
        retry: false,
        json: false,
        heartbeats: false,
        replicas: None,
        recreate: false,
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--release" => {
                o.release = Some(it.next().ok_or("--release needs a file")?.into());
            }
            "--replicas" => o.replicas = Some(it.next().ok_or("--replicas needs a number")?),
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
            "--release --retry",
            Command::Rollout {
                release: release()?,
                retry: o.retry,
            },
        )?,
        ["status"] => unused("--json", Command::Status { json: o.json })?,
        ["watch"] => unused(
            "--heartbeats",
            Command::Watch {
                heartbeats: o.heartbeats,
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
        Command::Rollout { release, retry } => {
            let r = rollout::run(&c, &release, retry)?;
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
        Command::Status { json } => Output::text(status::run(&c, json)?),
        Command::Watch { heartbeats } => {
            watch::run(&c, heartbeats)?;
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
                retry: false
            })
        );
        assert_eq!(p(&["status", "--json"]), Ok(Command::Status { json: true }));
        assert_eq!(
            p(&["watch", "--heartbeats"]),
            Ok(Command::Watch { heartbeats: true })
        );
        assert_eq!(
            p(&["buckets", "create", "--replicas", "3"]),
            Ok(Command::BucketsCreate {
                replicas: 3,
                recreate: false
            })
        );
        assert_eq!(p(&["upgrade", "--help"]), Ok(Command::Help));
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
        ] {
            assert_eq!(p(a).as_ref().map_err(String::as_str), Err(says), "{a:?}");
        }
    }
}
