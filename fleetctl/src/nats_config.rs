//! `fleetctl nats-config`: writes the nats-server config of the fleet layout.
//!
//! Two layouts, one per server generation:
//!
//! - static (default; every server, Debian's 2.9.10 included): accounts
//!   `FLEET` and `DEVICES`, one password user per device listed in the
//!   devices file, each with exactly the per-device permissions. A device's
//!   password is read from `<passwords-dir>/<device-id>`; a missing one is
//!   generated (192 random bits, hex) and written there with mode 0600, so a
//!   re-run with more devices keeps the existing passwords.
//! - `--auth-callout` (2.10 and later): no device users; every device is
//!   handed to `fleet-auth-callout`, whose issuer public key and NATS user
//!   password are given here.
//!
//! Steps: parse and validate every argument and input file, then write the
//! config (stdout, or `--output` atomically with mode 0600: it holds
//! passwords). Nothing is written when anything is invalid, except the
//! generated password files of the static layout, which are written before
//! the config that uses them.

use std::collections::HashSet;
use std::fmt;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use fleet_common::durable::{read_bounded, write_atomic};
use fleet_common::nats_config::{
    callout_server_config, static_server_config, CalloutServerConfig, StaticServerConfig,
};
use fleet_common::nkey::{NkeyError, NkeyKind, PublicNkey};
use fleet_common::subjects::DeviceProtocols;
use fleet_common::validate::{DeviceId, ValidationError};

const HELP: &str = "fleetctl nats-config: write the nats-server config of the fleet layout

Usage:
  fleetctl nats-config --devices <file> --passwords-dir <dir> --admin-password-file <file> [common]
  fleetctl nats-config --auth-callout --issuer <account public key> --callout-password-file <file>
                       --admin-password-file <file> [common]

Static layout (any server, 2.9.10 included): one user per device.
  --devices <file>          one device ID per line; blank lines and # comments ignored
  --passwords-dir <dir>     <dir>/<device-id> holds the device's password; missing ones are
                            generated and written there (mode 0600)
Auth callout layout (server 2.10+): devices are placed by fleet-auth-callout.
  --auth-callout
  --issuer <A...>           the callout's issuer public key (fleet-auth-callout public-key <seed>)
  --callout-password-file <file>
                            password of the callout's NATS user auth-callout
Common:
  --admin-password-file <file>
                            password of the operator's user admin in account FLEET
  --listen <addr:port>      client listen address (default 127.0.0.1:4222)
  --store-dir <dir>         JetStream store (default /var/lib/nats/jetstream)
  --server-name <name>      server_name (default none)
  --output <file>           write here (atomically, mode 0600) instead of stdout
  --no-legacy-devices       serve only the current device protocol (Direct Get and
                            republished keys); leave out what agent 0.1.0 needs (a consumer
                            per device). Only once no device can run 0.1.0 (README \"Mixed fleets\")
";

const DEFAULT_LISTEN: &str = "127.0.0.1:4222";
const DEFAULT_STORE_DIR: &str = "/var/lib/nats/jetstream";
/// Largest devices file read.
const MAX_DEVICES_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// Largest password file read.
const MAX_PASSWORD_FILE_BYTES: u64 = 4096;
/// Random bytes in a generated password.
const PASSWORD_BYTES: usize = 24;
/// Mode of every file holding a password.
const SECRET_MODE: u32 = 0o600;

/// Why no config was written.
#[derive(Debug)]
pub enum NatsConfigError {
    Usage(String),
    Read {
        path: PathBuf,
        detail: String,
    },
    DeviceLine {
        path: PathBuf,
        line: usize,
        error: ValidationError,
    },
    DuplicateDevice {
        path: PathBuf,
        line: usize,
        device: String,
    },
    NoDevices {
        path: PathBuf,
    },
    EmptyPassword {
        path: PathBuf,
    },
    Issuer(NkeyError),
    Random(std::io::Error),
    Write {
        path: PathBuf,
        detail: String,
    },
}

impl fmt::Display for NatsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Usage(why) => write!(f, "{why}; see fleetctl nats-config --help"),
            Self::Read { path, detail } => write!(f, "cannot read {}: {detail}", path.display()),
            Self::DeviceLine { path, line, error } => {
                write!(f, "{}:{line}: {error}", path.display())
            }
            Self::DuplicateDevice { path, line, device } => write!(
                f,
                "{}:{line}: device {device} is listed twice; list each device once",
                path.display()
            ),
            Self::NoDevices { path } => write!(
                f,
                "{} lists no device: put one device ID per line",
                path.display()
            ),
            Self::EmptyPassword { path } => write!(
                f,
                "password file {} is empty: put the password in it, or delete it to have one generated",
                path.display()
            ),
            Self::Issuer(e) => write!(
                f,
                "--issuer: {e}; print the callout's key with fleet-auth-callout public-key <seed-file>"
            ),
            Self::Random(e) => write!(f, "cannot read /dev/urandom for a password: {e}"),
            Self::Write { path, detail } => {
                write!(f, "cannot write {}: {detail}", path.display())
            }
        }
    }
}

impl std::error::Error for NatsConfigError {}

/// Which layout, with what only it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    Static {
        devices: PathBuf,
        passwords_dir: PathBuf,
    },
    AuthCallout {
        issuer: PublicNkey,
        callout_password_file: PathBuf,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Args {
    layout: Layout,
    admin_password_file: PathBuf,
    listen: SocketAddr,
    store_dir: PathBuf,
    server_name: Option<String>,
    output: Option<PathBuf>,
    protocols: DeviceProtocols,
}

fn parse_args(args: &[String]) -> Result<Args, NatsConfigError> {
    let usage = |s: String| NatsConfigError::Usage(s);
    let mut callout = false;
    let mut protocols = DeviceProtocols::WithLegacy;
    let mut values: std::collections::HashMap<&str, String> = std::collections::HashMap::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--auth-callout" => callout = true,
            "--no-legacy-devices" => protocols = DeviceProtocols::Current,
            flag @ ("--devices"
            | "--passwords-dir"
            | "--admin-password-file"
            | "--issuer"
            | "--callout-password-file"
            | "--listen"
            | "--store-dir"
            | "--server-name"
            | "--output") => {
                let v = it
                    .next()
                    .ok_or_else(|| usage(format!("{flag} needs a value")))?;
                if values.insert(flag, v.clone()).is_some() {
                    return Err(usage(format!("{flag} given twice")));
                }
            }
            other => return Err(usage(format!("unknown argument {other:?}"))),
        }
    }
    fn need(
        values: &mut std::collections::HashMap<&str, String>,
        flag: &str,
    ) -> Result<String, NatsConfigError> {
        values
            .remove(flag)
            .ok_or_else(|| NatsConfigError::Usage(format!("{flag} is required")))
    }
    let admin_password_file = PathBuf::from(need(&mut values, "--admin-password-file")?);
    let layout = if callout {
        let issuer = PublicNkey::parse_kind(&need(&mut values, "--issuer")?, NkeyKind::Account)
            .map_err(NatsConfigError::Issuer)?;
        let callout_password_file = PathBuf::from(need(&mut values, "--callout-password-file")?);
        for flag in ["--devices", "--passwords-dir"] {
            if values.contains_key(flag) {
                return Err(usage(format!(
                    "{flag} is for the static layout, not --auth-callout"
                )));
            }
        }
        Layout::AuthCallout {
            issuer,
            callout_password_file,
        }
    } else {
        for flag in ["--issuer", "--callout-password-file"] {
            if values.contains_key(flag) {
                return Err(usage(format!("{flag} needs --auth-callout")));
            }
        }
        Layout::Static {
            devices: PathBuf::from(need(&mut values, "--devices")?),
            passwords_dir: PathBuf::from(need(&mut values, "--passwords-dir")?),
        }
    };
    let mut take = |flag: &str| values.remove(flag);
    let listen_text = take("--listen").unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
    let listen = listen_text
        .parse()
        .map_err(|_| usage(format!("--listen {listen_text:?} is not an addr:port")))?;
    let store_dir =
        PathBuf::from(take("--store-dir").unwrap_or_else(|| DEFAULT_STORE_DIR.to_owned()));
    let server_name = take("--server-name");
    if let Some(name) = &server_name {
        let ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !ok {
            return Err(usage(format!(
                "--server-name {name:?}: use letters, digits, '-', '_' and '.'"
            )));
        }
    }
    Ok(Args {
        layout,
        admin_password_file,
        listen,
        store_dir,
        server_name,
        output: take("--output").map(PathBuf::from),
        protocols,
    })
}

/// The device IDs of a devices file, in order.
fn read_devices(path: &Path) -> Result<Vec<DeviceId>, NatsConfigError> {
    let bytes = read_bounded(path, MAX_DEVICES_FILE_BYTES).map_err(|e| NatsConfigError::Read {
        path: path.to_owned(),
        detail: e.to_string(),
    })?;
    let text = String::from_utf8(bytes).map_err(|_| NatsConfigError::Read {
        path: path.to_owned(),
        detail: "not UTF-8".to_owned(),
    })?;
    let mut seen = HashSet::new();
    let mut devices = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let id = DeviceId::parse(line).map_err(|error| NatsConfigError::DeviceLine {
            path: path.to_owned(),
            line: i + 1,
            error,
        })?;
        if !seen.insert(id.clone()) {
            return Err(NatsConfigError::DuplicateDevice {
                path: path.to_owned(),
                line: i + 1,
                device: id.to_string(),
            });
        }
        devices.push(id);
    }
    if devices.is_empty() {
        return Err(NatsConfigError::NoDevices {
            path: path.to_owned(),
        });
    }
    Ok(devices)
}

/// A password file's content, surrounding whitespace dropped.
fn read_password(path: &Path) -> Result<String, NatsConfigError> {
    let bytes = read_bounded(path, MAX_PASSWORD_FILE_BYTES).map_err(|e| NatsConfigError::Read {
        path: path.to_owned(),
        detail: e.to_string(),
    })?;
    let text = String::from_utf8(bytes).map_err(|_| NatsConfigError::Read {
        path: path.to_owned(),
        detail: "not UTF-8".to_owned(),
    })?;
    let password = text.trim();
    if password.is_empty() {
        return Err(NatsConfigError::EmptyPassword {
            path: path.to_owned(),
        });
    }
    Ok(password.to_owned())
}

fn generate_password() -> Result<String, NatsConfigError> {
    let mut raw = [0u8; PASSWORD_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut raw))
        .map_err(NatsConfigError::Random)?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// Each device's password: read, or generated and written (mode 0600).
fn device_passwords(
    devices: Vec<DeviceId>,
    dir: &Path,
) -> Result<Vec<(DeviceId, String)>, NatsConfigError> {
    let mut out = Vec::with_capacity(devices.len());
    for id in devices {
        let path = dir.join(id.as_str());
        let password = if path.exists() {
            read_password(&path)?
        } else {
            let p = generate_password()?;
            write_atomic(&path, format!("{p}\n").as_bytes(), SECRET_MODE).map_err(|e| {
                NatsConfigError::Write {
                    path: path.clone(),
                    detail: e.to_string(),
                }
            })?;
            p
        };
        out.push((id, password));
    }
    Ok(out)
}

/// The config text for `args`.
fn config_text(args: &Args) -> Result<String, NatsConfigError> {
    let admin_password = read_password(&args.admin_password_file)?;
    Ok(match &args.layout {
        Layout::Static {
            devices,
            passwords_dir,
        } => {
            let ids = read_devices(devices)?;
            static_server_config(&StaticServerConfig {
                listen: args.listen,
                server_name: args.server_name.clone(),
                store_dir: args.store_dir.clone(),
                admin_password,
                devices: device_passwords(ids, passwords_dir)?,
                cluster: None,
                protocols: args.protocols,
            })
        }
        Layout::AuthCallout {
            issuer,
            callout_password_file,
        } => callout_server_config(&CalloutServerConfig {
            listen: args.listen,
            server_name: args.server_name.clone(),
            store_dir: args.store_dir.clone(),
            admin_password,
            callout_password: read_password(callout_password_file)?,
            issuer: issuer.clone(),
            cluster: None,
            protocols: args.protocols,
        }),
    })
}

/// `fleetctl nats-config <args>`: exit 0 when written, 2 on a usage error,
/// 1 on any other.
pub fn main(args: &[String]) -> std::process::ExitCode {
    if matches!(args, [h] if h == "--help" || h == "-h") {
        print!("{HELP}");
        return std::process::ExitCode::SUCCESS;
    }
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleetctl nats-config: {e}");
            let usage = matches!(e, NatsConfigError::Usage(_));
            std::process::ExitCode::from(if usage { 2 } else { 1 })
        }
    }
}

/// Writes the config for `args`.
pub fn run(args: &[String]) -> Result<(), NatsConfigError> {
    let args = parse_args(args)?;
    let text = config_text(&args)?;
    match &args.output {
        Some(path) => {
            write_atomic(path, text.as_bytes(), SECRET_MODE).map_err(|e| NatsConfigError::Write {
                path: path.clone(),
                detail: e.to_string(),
            })
        }
        None => std::io::stdout()
            .lock()
            .write_all(text.as_bytes())
            .map_err(|e| NatsConfigError::Write {
                path: PathBuf::from("<stdout>"),
                detail: e.to_string(),
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISSUER: &str = "ACODERUVFFAWZQDSS6SBIACUA5O6SXF7HJ3YTYXBALHZP3P7R4BUO4J2";

    fn args(list: &[&str]) -> Result<Args, NatsConfigError> {
        let owned: Vec<String> = list.iter().map(|s| (*s).to_owned()).collect();
        parse_args(&owned)
    }

    #[test]
    fn static_and_callout_arguments_parse() {
        let a = args(&[
            "--devices",
            "d",
            "--passwords-dir",
            "p",
            "--admin-password-file",
            "a",
        ])
        .expect("static");
        assert_eq!(
            a.layout,
            Layout::Static {
                devices: "d".into(),
                passwords_dir: "p".into()
            }
        );
        assert_eq!(a.listen, DEFAULT_LISTEN.parse().expect("addr"));
        assert_eq!(a.store_dir, PathBuf::from(DEFAULT_STORE_DIR));
        let a = args(&[
            "--auth-callout",
            "--issuer",
            ISSUER,
            "--callout-password-file",
            "c",
            "--admin-password-file",
            "a",
            "--listen",
            "0.0.0.0:4222",
        ])
        .expect("callout");
        assert!(matches!(a.layout, Layout::AuthCallout { .. }));
        assert_eq!(a.listen, "0.0.0.0:4222".parse().expect("addr"));
    }

    #[test]
    fn bad_arguments_are_refused_with_what_to_do() {
        let err = |l: &[&str]| args(l).expect_err("refused").to_string();
        assert_eq!(
            err(&["--devices", "d", "--passwords-dir", "p"]),
            "--admin-password-file is required; see fleetctl nats-config --help"
        );
        assert_eq!(
            err(&["--auth-callout", "--issuer", "UABC", "--admin-password-file", "a"]),
            "--issuer: invalid nkey public key: 4 characters, expected 56; copy the whole key without spaces or quotes; print the callout's key with fleet-auth-callout public-key <seed-file>"
        );
        assert!(err(&[
            "--issuer",
            ISSUER,
            "--devices",
            "d",
            "--passwords-dir",
            "p",
            "--admin-password-file",
            "a"
        ])
        .starts_with("--issuer needs --auth-callout"));
        assert!(err(&["--bogus"]).starts_with("unknown argument \"--bogus\""));
        assert!(err(&["--devices"]).starts_with("--devices needs a value"));
        assert!(err(&[
            "--devices",
            "d",
            "--devices",
            "e",
            "--passwords-dir",
            "p",
            "--admin-password-file",
            "a"
        ])
        .starts_with("--devices given twice"));
        assert!(err(&[
            "--devices",
            "d",
            "--passwords-dir",
            "p",
            "--admin-password-file",
            "a",
            "--listen",
            "x"
        ])
        .starts_with("--listen \"x\" is not an addr:port"));
    }

    #[test]
    fn devices_file_is_validated_line_by_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("devices");
        std::fs::write(&path, "# fleet\ndev-1\n\n  dev_2  \n").expect("write");
        let ids = read_devices(&path).expect("valid");
        assert_eq!(
            ids.iter().map(DeviceId::as_str).collect::<Vec<_>>(),
            ["dev-1", "dev_2"]
        );
        std::fs::write(&path, "dev-1\ndev.2\n").expect("write");
        assert_eq!(
            read_devices(&path).expect_err("dot").to_string(),
            format!(
                "{}:2: invalid device id \"dev.2\": use 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-'",
                path.display()
            )
        );
        std::fs::write(&path, "dev-1\ndev-1\n").expect("write");
        assert!(matches!(
            read_devices(&path),
            Err(NatsConfigError::DuplicateDevice { line: 2, .. })
        ));
        std::fs::write(&path, "# none\n").expect("write");
        assert!(matches!(
            read_devices(&path),
            Err(NatsConfigError::NoDevices { .. })
        ));
    }

    #[test]
    fn passwords_are_generated_once_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let ids = vec![DeviceId::parse("dev-1").expect("valid")];
        let first = device_passwords(ids.clone(), dir.path()).expect("generated");
        let p = &first[0].1;
        assert_eq!(p.len(), PASSWORD_BYTES * 2);
        assert!(p.bytes().all(|b| b.is_ascii_hexdigit()));
        let mode = std::fs::metadata(dir.path().join("dev-1"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(device_passwords(ids, dir.path()).expect("kept"), first);
    }
}
