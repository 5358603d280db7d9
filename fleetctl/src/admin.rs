//! The operator's NATS connection (user `admin` in account `FLEET`) and
//! the commands that need nothing more: creating the buckets, writing and
//! deleting a device's desired workloads, reading a device's status.
//!
//! Every value is validated before it is written: a spec that the agent
//! would refuse is refused here, naming the field.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use fleet_common::contracts::{DeviceInfo, Heartbeat, WorkloadSpec, WorkloadsReport};
use fleet_common::durable;
use fleet_common::limits::{
    MAX_KV_VALUE_BYTES, NATS_CONNECT_ATTEMPT_TIMEOUT, NATS_REQUEST_TIMEOUT,
};
use fleet_common::nats_config::{
    kv_stream_config, stream_create_subject, ADMIN_USER, FLEET_BUCKETS,
};
use fleet_common::subjects::{desired_key, status_key, StatusKey, BUCKET_DESIRED, BUCKET_STATUS};
use fleet_common::validate::{DeviceId, WorkloadName};

/// Environment variables for the connection options.
pub const ENV_SERVER: &str = "FLEET_NATS_URL";
pub const ENV_PASSWORD_FILE: &str = "FLEET_NATS_PASSWORD_FILE";
const DEFAULT_SERVER: &str = "nats://127.0.0.1:4222";
const MAX_SECRET_BYTES: u64 = 16 * 1024;

/// How to reach NATS as the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnOptions {
    pub server: String,
    pub user: String,
    pub password_file: Option<PathBuf>,
}

impl ConnOptions {
    /// Defaults from the environment.
    pub fn from_env() -> Self {
        Self {
            server: std::env::var(ENV_SERVER).unwrap_or_else(|_| DEFAULT_SERVER.into()),
            user: ADMIN_USER.into(),
            password_file: std::env::var_os(ENV_PASSWORD_FILE).map(PathBuf::from),
        }
    }
}

/// A failed operator command.
#[derive(Debug)]
pub enum AdminError {
    Input(String),
    Connect { server: String, detail: String },
    Nats { what: String, detail: String },
}

impl AdminError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Input(_) => 3,
            Self::Connect { .. } => 4,
            Self::Nats { .. } => 5,
        }
    }
}

impl fmt::Display for AdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Input(m) => f.write_str(m),
            Self::Connect { server, detail } => write!(
                f,
                "connecting to NATS at {server}: {detail}; check --server, --user and --password-file"
            ),
            Self::Nats { what, detail } => write!(f, "{what}: {detail}"),
        }
    }
}

impl std::error::Error for AdminError {}

fn nats_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AdminError {
    let what = what.into();
    move |e| AdminError::Nats {
        what,
        detail: e.to_string(),
    }
}

/// Connects as the operator, bounded like the agent's attempts.
pub fn connect(o: &ConnOptions) -> Result<nats::Connection, AdminError> {
    let opts = match &o.password_file {
        Some(p) => {
            let bytes = durable::read_bounded(p, MAX_SECRET_BYTES)
                .map_err(|e| AdminError::Input(format!("--password-file: {e}")))?;
            let pw = String::from_utf8_lossy(&bytes)
                .trim_end_matches(['\n', '\r'])
                .to_owned();
            nats::Options::with_user_pass(&o.user, &pw)
        }
        None => nats::Options::new(),
    }
    .with_name("fleetctl")
    .reconnect_delay_callback(|_| Duration::ZERO)
    .max_reconnects(1);
    let server = o.server.clone();
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::spawn(move || {
        let _ = tx.send(opts.connect(server.as_str()));
    });
    match rx.recv_timeout(NATS_CONNECT_ATTEMPT_TIMEOUT) {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(AdminError::Connect {
            server: o.server.clone(),
            detail: e.to_string(),
        }),
        Err(_) => Err(AdminError::Connect {
            server: o.server.clone(),
            detail: format!(
                "no answer within {} s",
                NATS_CONNECT_ATTEMPT_TIMEOUT.as_secs()
            ),
        }),
    }
}

/// Creates the three buckets (idempotent: an identical stream is fine).
pub fn create_buckets(conn: &nats::Connection, replicas: u8) -> Result<Vec<String>, AdminError> {
    let mut done = Vec::new();
    for spec in &FLEET_BUCKETS {
        let body = kv_stream_config(spec, replicas).to_string();
        let reply = conn
            .request_timeout(
                &stream_create_subject(spec.bucket),
                body,
                NATS_REQUEST_TIMEOUT,
            )
            .map_err(nats_err(format!("creating bucket {}", spec.bucket)))?;
        let v: serde_json::Value = serde_json::from_slice(&reply.data).unwrap_or_default();
        if let Some(e) = v.get("error") {
            return Err(AdminError::Nats {
                what: format!("creating bucket {}", spec.bucket),
                detail: e["description"].as_str().unwrap_or("refused").to_owned(),
            });
        }
        done.push(spec.bucket.to_owned());
    }
    Ok(done)
}

fn ids(device: &str, workload: &str) -> Result<(DeviceId, WorkloadName), AdminError> {
    let d = DeviceId::parse(device).map_err(|e| AdminError::Input(e.to_string()))?;
    let w = WorkloadName::parse(workload).map_err(|e| AdminError::Input(e.to_string()))?;
    Ok((d, w))
}

fn kv(conn: &nats::Connection, bucket: &str) -> Result<nats::kv::Store, AdminError> {
    nats::jetstream::new(conn.clone())
        .key_value(bucket)
        .map_err(nats_err(format!(
            "opening bucket {bucket} (create it with `fleetctl buckets create`)"
        )))
}

/// Validates the spec in `file` (`-`: stdin) and puts it; returns the
/// revision and the spec hash.
pub fn apply(
    conn: &nats::Connection,
    device: &str,
    workload: &str,
    file: &Path,
) -> Result<(u64, String), AdminError> {
    let (d, w) = ids(device, workload)?;
    let bytes = if file == Path::new("-") {
        let mut b = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(std::io::stdin(), MAX_KV_VALUE_BYTES as u64 + 1),
            &mut b,
        )
        .map_err(|e| AdminError::Input(format!("reading the spec from stdin: {e}")))?;
        b
    } else {
        durable::read_bounded(file, MAX_KV_VALUE_BYTES as u64)
            .map_err(|e| AdminError::Input(e.to_string()))?
    };
    let spec = WorkloadSpec::from_json(&bytes)
        .map_err(|e| AdminError::Input(format!("{}: {e}", file.display())))?;
    let canonical = serde_json::to_vec(&spec).map_err(|e| AdminError::Input(e.to_string()))?;
    let key = desired_key(&d, &w);
    let rev = kv(conn, BUCKET_DESIRED)?
        .put(&key, canonical)
        .map_err(nats_err(format!("writing {BUCKET_DESIRED} {key}")))?;
    Ok((rev, spec.spec_hash().as_str().to_owned()))
}

/// Deletes a desired workload (the agent removes its container).
pub fn delete(conn: &nats::Connection, device: &str, workload: &str) -> Result<(), AdminError> {
    let (d, w) = ids(device, workload)?;
    let key = desired_key(&d, &w);
    kv(conn, BUCKET_DESIRED)?
        .delete(&key)
        .map_err(nats_err(format!("deleting {BUCKET_DESIRED} {key}")))
}

/// A device's status as text, from its `fleet-status` keys.
pub fn device_status(conn: &nats::Connection, device: &str) -> Result<String, AdminError> {
    let d = DeviceId::parse(device).map_err(|e| AdminError::Input(e.to_string()))?;
    let store = kv(conn, BUCKET_STATUS)?;
    let get = |key: StatusKey| -> Result<Option<Vec<u8>>, AdminError> {
        let k = status_key(&d, key);
        store
            .get(&k)
            .map_err(nats_err(format!("reading {BUCKET_STATUS} {k}")))
    };
    let mut out = String::new();
    match get(StatusKey::Info)?.and_then(|b| serde_json::from_slice::<DeviceInfo>(&b).ok()) {
        Some(i) => out.push_str(&format!(
            "device {}: agent {} ({}), {}, kernel {}, podman {}, {}\n",
            i.device_id,
            i.agent_version,
            i.arch,
            i.os,
            i.kernel,
            i.podman_version.as_ref().map_or("disabled", |v| v.as_str()),
            i.config_state.state.name()
        )),
        None => out.push_str(&format!("device {d}: no device info yet\n")),
    }
    if let Some(h) =
        get(StatusKey::Heartbeat)?.and_then(|b| serde_json::from_slice::<Heartbeat>(&b).ok())
    {
        out.push_str(&format!("heartbeat {} (up {} s)", h.at, h.uptime_secs));
        if let Some(s) = h.stopping {
            out.push_str(&format!(
                ", stopped at {} after draining {} ms",
                s.at, s.drain_duration_ms
            ));
        }
        out.push('\n');
    }
    match get(StatusKey::Workloads)?
        .and_then(|b| serde_json::from_slice::<WorkloadsReport>(&b).ok())
    {
        Some(r) => {
            let (running, total) = r.ready();
            out.push_str(&format!(
                "workloads: {running}/{total} running (observed {})\n",
                r.observed_at
            ));
            for (name, w) in &r.workloads {
                let state = serde_json::to_value(w.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                out.push_str(&format!(
                    "  {name}: {state}, image {}, container {}, restarts {}{}\n",
                    w.image,
                    w.container_id.as_deref().unwrap_or("-"),
                    w.restarts,
                    w.last_error
                        .as_ref()
                        .map(|e| format!(", last error: {e}"))
                        .unwrap_or_default()
                ));
            }
        }
        None => out.push_str("workloads: none reported yet\n"),
    }
    Ok(out)
}

const HELP: &str = "fleetctl buckets|workload|device: the operator's NATS commands

Usage:
  fleetctl buckets create [--replicas N] [CONNECTION]
  fleetctl workload apply DEVICE WORKLOAD SPEC.json [CONNECTION]   (SPEC.json - reads stdin)
  fleetctl workload delete DEVICE WORKLOAD [CONNECTION]
  fleetctl device status DEVICE [CONNECTION]

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
    let c = connect(conn)?;
    let out = match command {
        Command::BucketsCreate { replicas } => {
            let b = create_buckets(&c, replicas)?;
            format!("buckets ready: {}\n", b.join(", "))
        }
        Command::Apply {
            device,
            workload,
            spec,
        } => {
            let (rev, hash) = apply(&c, &device, &workload, &spec)?;
            format!("applied {device}.{workload} (revision {rev}, spec hash {hash})\n")
        }
        Command::Delete { device, workload } => {
            delete(&c, &device, &workload)?;
            format!("deleted {device}.{workload}\n")
        }
        Command::Status { device } => device_status(&c, &device)?,
        Command::Help | Command::Version => String::new(),
    };
    Ok(out)
}

/// `fleetctl buckets|workload|device ...` (`args` from the command word on).
pub fn main(args: &[String]) -> ExitCode {
    let mut conn = ConnOptions::from_env();
    let command = match parse(args, &mut conn) {
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
mod cli_tests {
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
