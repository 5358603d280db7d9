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
//! Either layout can be a node of a JetStream cluster (`--cluster`,
//! `--cluster-listen`, `--route`) and listen for leaf nodes
//! (`--leafnode-listen` with `--leaf-password-file`). `--leaf-of` writes a
//! leaf node instead (docs/design/leafnodes.md): no JetStream, bound to the
//! hub's leafnode listeners, with the static layout's device users or
//! (`--auth-callout`) its clients handed to the hub's callout.
//!
//! Steps: validate every input file (the arguments come validated from
//! `cli::nats_config`), then write the
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
    callout_server_config, leaf_server_config, static_server_config, CalloutServerConfig,
    ClusterConfig, LeafCallout, LeafServerConfig, LeafnodeListener, StaticServerConfig,
};
use fleet_common::nkey::{NkeyError, NkeyKind, NkeySeed, PublicNkey};
use fleet_common::subjects::DeviceProtocols;
use fleet_common::validate::{DeviceId, ValidationError};

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
    /// `--auth-callout` for a JetStream server without the callout's password.
    CalloutPasswordMissing,
    /// `--issuer` or `--callout-password-file` without `--auth-callout`.
    CalloutArgumentAlone,
    /// `--leaf-password-file` with neither a listener nor `--leaf-of`.
    LeafPasswordAlone,
    Random(std::io::Error),
    Write {
        path: PathBuf,
        detail: String,
    },
}

impl fmt::Display for NatsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
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
            Self::CalloutArgumentAlone => write!(
                f,
                "--issuer and --callout-password-file are for --auth-callout: add it, or leave them out for the static layout"
            ),
            Self::CalloutPasswordMissing => write!(
                f,
                "--auth-callout needs --callout-password-file <FILE> (the password of the callout's NATS user) unless it writes a leaf (--leaf-of)"
            ),
            Self::LeafPasswordAlone => write!(
                f,
                "--leaf-password-file is for --leafnode-listen (a hub) or --leaf-of (a leaf): give one of them"
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
pub enum Layout {
    Static {
        devices: PathBuf,
        passwords_dir: PathBuf,
    },
    AuthCallout {
        issuer: PublicNkey,
        /// The callout user's password (a JetStream server's; a leaf
        /// never holds it).
        callout_password_file: Option<PathBuf>,
    },
}

/// What the server is: a JetStream server (optionally a cluster node and
/// a hub for leaf nodes), or a leaf node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Server {
        admin_password_file: PathBuf,
        cluster: Option<ClusterConfig>,
        /// The leafnode listener and the file of its users' password.
        leafnodes: Option<(SocketAddr, PathBuf)>,
    },
    /// A leaf node of the hubs (`host:port` each), connecting with the
    /// password in the file. Static layout only.
    Leaf {
        hubs: Vec<String>,
        leaf_password_file: PathBuf,
    },
}

/// What to write, and where: the validated arguments of `fleetctl
/// nats-config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    pub layout: Layout,
    pub role: Role,
    pub listen: SocketAddr,
    pub store_dir: PathBuf,
    pub server_name: Option<String>,
    pub output: Option<PathBuf>,
    pub protocols: DeviceProtocols,
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
    let (admin_password_file, cluster, leafnodes) = match &args.role {
        Role::Leaf {
            hubs,
            leaf_password_file,
        } => return leaf_config_text(args, hubs, leaf_password_file),
        Role::Server {
            admin_password_file,
            cluster,
            leafnodes,
        } => (admin_password_file, cluster, leafnodes),
    };
    let admin_password = read_password(admin_password_file)?;
    let leafnodes = match leafnodes {
        Some((listen, file)) => Some(LeafnodeListener {
            listen: *listen,
            password: read_password(file)?,
        }),
        None => None,
    };
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
                cluster: cluster.clone(),
                leafnodes,
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
            callout_password: read_password(
                callout_password_file
                    .as_deref()
                    .ok_or(NatsConfigError::CalloutPasswordMissing)?,
            )?,
            issuer: issuer.clone(),
            // A fresh key whose seed is dropped here: nothing can log in as it.
            nonce_key: NkeySeed::generate(NkeyKind::User)
                .map_err(NatsConfigError::Issuer)?
                .public_key(),
            cluster: cluster.clone(),
            leafnodes,
            protocols: args.protocols,
        }),
    })
}

/// A leaf node's config: the static layout's device users (the same
/// passwords as the hub's), or the callout's issuer and a random password
/// for the leaf's own callout user (which nothing logs in as); no
/// JetStream.
fn leaf_config_text(
    args: &Args,
    hubs: &[String],
    leaf_password_file: &Path,
) -> Result<String, NatsConfigError> {
    let leaf_password = read_password(leaf_password_file)?;
    let (devices, callout) = match &args.layout {
        Layout::Static {
            devices,
            passwords_dir,
        } => (
            device_passwords(read_devices(devices)?, passwords_dir)?,
            None,
        ),
        Layout::AuthCallout { issuer, .. } => (
            Vec::new(),
            Some(LeafCallout {
                issuer: issuer.clone(),
                local_password: generate_password()?,
                // As the hub's: a fresh key whose seed is dropped here.
                nonce_key: NkeySeed::generate(NkeyKind::User)
                    .map_err(NatsConfigError::Issuer)?
                    .public_key(),
            }),
        ),
    };
    Ok(leaf_server_config(&LeafServerConfig {
        listen: args.listen,
        server_name: args.server_name.clone().unwrap_or_default(),
        hubs: hubs.to_vec(),
        leaf_password,
        devices,
        callout,
        protocols: args.protocols,
    }))
}

/// Writes the config for `args`.
pub fn run(args: &Args) -> Result<(), NatsConfigError> {
    let text = config_text(args)?;
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
