//! `fleetctl`: the operator's CLI for a Harmony fleet.

mod admin;

use std::path::PathBuf;
use std::process::ExitCode;

use admin::{AdminError, ConnOptions};

const HELP: &str = "fleetctl: operate a Harmony fleet

Usage:
  fleetctl [CONNECTION] buckets create [--replicas N]
  fleetctl [CONNECTION] workload apply DEVICE WORKLOAD SPEC.json   (- reads stdin)
  fleetctl [CONNECTION] workload delete DEVICE WORKLOAD
  fleetctl [CONNECTION] device status DEVICE
  fleetctl --help | --version

CONNECTION (as the operator, user admin in account FLEET):
  --server URL           default $FLEET_NATS_URL or nats://127.0.0.1:4222
  --user NAME            default admin
  --password-file PATH   default $FLEET_NATS_PASSWORD_FILE

A workload spec is validated before it is written; unknown fields are refused.

Exit codes: 0 done, 2 usage, 3 invalid input, 4 NATS connection, 5 NATS request.
";

/// What to do.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    Help,
    Version,
    BucketsCreate {
        replicas: u8,
    },
    Apply {
        device: String,
        workload: String,
        spec: PathBuf,
    },
    Delete {
        device: String,
        workload: String,
    },
    Status {
        device: String,
    },
}

fn parse(args: &[String], conn: &mut ConnOptions) -> Result<Command, String> {
    let mut rest: Vec<&str> = Vec::new();
    let mut it = args.iter().map(String::as_str);
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .map(str::to_owned)
                .ok_or(format!("{name} needs a value"))
        };
        match a {
            "--help" | "-h" => return Ok(Command::Help),
            "--version" | "-V" => return Ok(Command::Version),
            "--server" => conn.server = value(a)?,
            "--user" => conn.user = value(a)?,
            "--password-file" => conn.password_file = Some(PathBuf::from(value(a)?)),
            other => rest.push(other),
        }
    }
    match rest.as_slice() {
        [] => Ok(Command::Help),
        ["buckets", "create"] => Ok(Command::BucketsCreate { replicas: 1 }),
        ["buckets", "create", "--replicas", n] => match n.parse::<u8>() {
            Ok(r @ 1..=5) => Ok(Command::BucketsCreate { replicas: r }),
            _ => Err(format!("--replicas {n:?}: use 1 to 5")),
        },
        ["workload", "apply", d, w, spec] => Ok(Command::Apply {
            device: (*d).into(),
            workload: (*w).into(),
            spec: PathBuf::from(spec),
        }),
        ["workload", "delete", d, w] => Ok(Command::Delete {
            device: (*d).into(),
            workload: (*w).into(),
        }),
        ["device", "status", d] => Ok(Command::Status {
            device: (*d).into(),
        }),
        other => Err(format!("unknown command {:?}", other.join(" "))),
    }
}

fn run(command: Command, conn: &ConnOptions) -> Result<String, AdminError> {
    let c = admin::connect(conn)?;
    let out = match command {
        Command::BucketsCreate { replicas } => {
            let b = admin::create_buckets(&c, replicas)?;
            format!("buckets ready: {}\n", b.join(", "))
        }
        Command::Apply {
            device,
            workload,
            spec,
        } => {
            let (rev, hash) = admin::apply(&c, &device, &workload, &spec)?;
            format!("applied {device}.{workload} (revision {rev}, spec hash {hash})\n")
        }
        Command::Delete { device, workload } => {
            admin::delete(&c, &device, &workload)?;
            format!("deleted {device}.{workload}\n")
        }
        Command::Status { device } => admin::device_status(&c, &device)?,
        Command::Help | Command::Version => String::new(),
    };
    Ok(out)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut conn = ConnOptions::from_env();
    let command = match parse(&args, &mut conn) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fleetctl: {e}; see fleetctl --help");
            return ExitCode::from(2);
        }
    };
    match command {
        Command::Help => {
            print!("{HELP}");
            ExitCode::SUCCESS
        }
        Command::Version => {
            println!("fleetctl {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        command => match run(command, &conn) {
            Ok(out) => {
                print!("{out}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("fleetctl: {e}");
                ExitCode::from(e.exit_code())
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> (Result<Command, String>, ConnOptions) {
        let mut c = ConnOptions {
            server: "nats://x:1".into(),
            user: "admin".into(),
            password_file: None,
        };
        let args: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        (parse(&args, &mut c), c)
    }

    #[test]
    fn commands_and_connection_options() {
        let (c, o) = p(&[
            "--server",
            "nats://h:4222",
            "--password-file",
            "/pw",
            "workload",
            "apply",
            "dev1",
            "web",
            "web.json",
        ]);
        assert_eq!(
            c,
            Ok(Command::Apply {
                device: "dev1".into(),
                workload: "web".into(),
                spec: "web.json".into()
            })
        );
        assert_eq!(o.server, "nats://h:4222");
        assert_eq!(o.password_file, Some(PathBuf::from("/pw")));
        assert_eq!(
            p(&["buckets", "create", "--replicas", "3"]).0,
            Ok(Command::BucketsCreate { replicas: 3 })
        );
        assert!(p(&["buckets", "create", "--replicas", "9"]).0.is_err());
        assert_eq!(
            p(&["device", "status", "dev1"]).0,
            Ok(Command::Status {
                device: "dev1".into()
            })
        );
        assert_eq!(
            p(&["workload", "rm"]).0,
            Err("unknown command \"workload rm\"".into())
        );
        assert_eq!(p(&["--server"]).0, Err("--server needs a value".into()));
    }
}
