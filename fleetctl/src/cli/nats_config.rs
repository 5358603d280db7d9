//! `fleetctl nats-config`: the nats-server config of the fleet layout.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use super::{Failure, Output};
use crate::nats_config::{self, Layout, NatsConfigError};
use fleet_common::nats_config::ClusterConfig;
use fleet_common::nkey::{NkeyKind, PublicNkey};
use fleet_common::subjects::DeviceProtocols;

const STATIC: &str = "Static layout (any server, 2.9.10 included): one user per device";
const CALLOUT: &str =
    "Auth callout layout (server 2.10+): devices are placed by fleet-auth-callout";
const CLUSTER: &str = "A node of a JetStream cluster";
const LEAF: &str = "Leaf nodes (docs/design/leafnodes.md)";

/// Write the nats-server config of the fleet layout
#[derive(Debug, Args)]
#[command(
    override_usage = "fleetctl nats-config --devices FILE --passwords-dir DIR --admin-password-file FILE [OPTIONS]
       fleetctl nats-config --auth-callout --issuer KEY --callout-password-file FILE
                            --admin-password-file FILE [OPTIONS]
       fleetctl nats-config --leaf-of HOST:PORT... --leaf-password-file FILE --server-name NAME
                            --devices FILE --passwords-dir DIR [OPTIONS]",
    long_about = "Write the nats-server config of the fleet layout: accounts FLEET \
and DEVICES, the operator's user admin, and either one password user per \
device (static layout) or the auth callout's user (auth callout layout); \
with --cluster a node of a JetStream cluster, with --leafnode-listen a hub \
for leaf nodes. --leaf-of writes a leaf node instead: no JetStream, its \
DEVICES and system accounts bound to the hub's, with the static layout's \
device users or, with --auth-callout, its clients handed to the hub's \
callout through its bound AUTH account. The config goes to stdout, or to --output atomically with mode 0600 (it \
holds passwords). Nothing is written when an argument or input file is \
invalid. Exit codes: 0 written, 2 usage, 1 any other failure."
)]
pub struct NatsConfig {
    /// One device ID per line; blank lines and # comments ignored
    #[arg(
        long,
        value_name = "FILE",
        help_heading = STATIC,
        required_unless_present = "auth_callout",
        conflicts_with = "auth_callout"
    )]
    devices: Option<PathBuf>,
    /// DIR/<device-id> holds the device's password; missing ones are
    /// generated and written there (mode 0600)
    #[arg(
        long,
        value_name = "DIR",
        help_heading = STATIC,
        required_unless_present = "auth_callout",
        conflicts_with = "auth_callout"
    )]
    passwords_dir: Option<PathBuf>,
    /// Hand every device to fleet-auth-callout
    #[arg(long, help_heading = CALLOUT, requires = "issuer")]
    auth_callout: bool,
    /// The callout's issuer public key (fleet-auth-callout public-key <seed>)
    #[arg(long, value_name = "KEY", help_heading = CALLOUT, requires = "auth_callout")]
    issuer: Option<String>,
    /// Password of the callout's NATS user auth-callout
    /// (not for a leaf node: it never holds the callout's password)
    #[arg(
        long,
        value_name = "FILE",
        help_heading = CALLOUT,
        requires = "auth_callout",
        conflicts_with = "leaf_of"
    )]
    callout_password_file: Option<PathBuf>,
    /// Password of the operator's user admin in account FLEET
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "leaf_of",
        conflicts_with = "leaf_of"
    )]
    admin_password_file: Option<PathBuf>,
    /// Name of the JetStream cluster this node belongs to
    #[arg(
        long,
        value_name = "NAME",
        help_heading = CLUSTER,
        value_parser = parse_server_name,
        requires_all = ["cluster_listen", "route", "server_name"]
    )]
    cluster: Option<String>,
    /// This node's route listen address
    #[arg(long, value_name = "ADDR:PORT", help_heading = CLUSTER, requires = "cluster")]
    cluster_listen: Option<SocketAddr>,
    /// A node's route address; repeat for every node of the cluster (a
    /// route to itself is ignored)
    #[arg(long, value_name = "ADDR:PORT", help_heading = CLUSTER, requires = "cluster")]
    route: Vec<SocketAddr>,
    /// Listen for leaf nodes here (with --leaf-password-file)
    #[arg(
        long,
        value_name = "ADDR:PORT",
        help_heading = LEAF,
        requires = "leaf_password_file",
        conflicts_with = "leaf_of"
    )]
    leafnode_listen: Option<SocketAddr>,
    /// Password of the hub's leaf users leaf-devices and leaf-system: the
    /// same file for the hub's nodes and every leaf
    #[arg(long, value_name = "FILE", help_heading = LEAF)]
    leaf_password_file: Option<PathBuf>,
    /// Write a leaf node of this hub node's leafnode listener instead;
    /// repeat for every node of the hub
    #[arg(
        long,
        value_name = "HOST:PORT",
        help_heading = LEAF,
        value_parser = parse_hub,
        requires_all = ["leaf_password_file", "server_name"],
        conflicts_with_all = ["cluster"]
    )]
    leaf_of: Vec<String>,
    /// Client listen address
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:4222")]
    listen: SocketAddr,
    /// JetStream store
    #[arg(long, value_name = "DIR", default_value = "/var/lib/nats/jetstream")]
    store_dir: PathBuf,
    /// server_name [default: none]
    #[arg(long, value_name = "NAME", value_parser = parse_server_name)]
    server_name: Option<String>,
    /// Write here (atomically, mode 0600) instead of stdout
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Serve only the current device protocol (Direct Get and republished
    /// keys); leave out what agent 0.1.0 needs (a consumer per device). Only
    /// once no device can run 0.1.0 (docs/operator/mixed-fleets.md)
    #[arg(long)]
    no_legacy_devices: bool,
}

fn parse_server_name(name: &str) -> Result<String, String> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(name.to_owned())
    } else {
        Err(format!("{name:?}: use letters, digits, '-', '_' and '.'"))
    }
}

/// `host:port` of a hub's leafnode listener: a DNS name or an IPv4
/// address, or an IPv6 address in brackets; a port from 1.
fn parse_hub(hub: &str) -> Result<String, String> {
    let bad =
        || format!("{hub:?}: give HOST:PORT, for example hub1.example:7422 or [fd00::1]:7422");
    let (host, port) = hub.rsplit_once(':').ok_or_else(bad)?;
    if !port.parse::<u16>().is_ok_and(|p| p > 0) {
        return Err(bad());
    }
    let ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    };
    if ok {
        Ok(hub.to_owned())
    } else {
        Err(bad())
    }
}

impl NatsConfig {
    /// The validated arguments. The issuer key is checked here, after
    /// parsing, so that a bad key keeps its exit code 1 and its hint.
    fn args(self) -> Result<nats_config::Args, NatsConfigError> {
        let layout = match (self.auth_callout, self.issuer, self.callout_password_file) {
            (true, Some(issuer), callout_password_file) => {
                if callout_password_file.is_none() && self.leaf_of.is_empty() {
                    return Err(NatsConfigError::CalloutPasswordMissing);
                }
                Layout::AuthCallout {
                    issuer: PublicNkey::parse_kind(&issuer, NkeyKind::Account)
                        .map_err(NatsConfigError::Issuer)?,
                    callout_password_file,
                }
            }
            (false, Some(_), _) | (false, _, Some(_)) => {
                return Err(NatsConfigError::CalloutArgumentAlone)
            }
            // clap requires the devices file and passwords dir without
            // --auth-callout, the issuer with it.
            _ => Layout::Static {
                devices: self.devices.unwrap_or_default(),
                passwords_dir: self.passwords_dir.unwrap_or_default(),
            },
        };
        let role = if self.leaf_of.is_empty() {
            nats_config::Role::Server {
                // clap requires it unless --leaf-of.
                admin_password_file: self.admin_password_file.unwrap_or_default(),
                cluster: match (self.cluster, self.cluster_listen) {
                    (Some(name), Some(listen)) => Some(ClusterConfig {
                        name,
                        listen,
                        routes: self.route,
                    }),
                    _ => None,
                },
                leafnodes: match (self.leafnode_listen, self.leaf_password_file) {
                    (Some(listen), Some(file)) => Some((listen, file)),
                    (None, Some(_)) => return Err(NatsConfigError::LeafPasswordAlone),
                    _ => None,
                },
            }
        } else {
            nats_config::Role::Leaf {
                hubs: self.leaf_of,
                leaf_password_file: self.leaf_password_file.unwrap_or_default(),
            }
        };
        Ok(nats_config::Args {
            layout,
            role,
            listen: self.listen,
            store_dir: self.store_dir,
            server_name: self.server_name,
            output: self.output,
            protocols: if self.no_legacy_devices {
                DeviceProtocols::Current
            } else {
                DeviceProtocols::WithLegacy
            },
        })
    }

    pub fn run(self) -> Result<Output, Failure> {
        self.args()
            .and_then(|args| nats_config::run(&args))
            .map_err(|e| Failure::Other(format!("fleetctl nats-config: {e}")))?;
        Ok(Output::text(String::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Command};
    use super::*;

    const ISSUER: &str = "ACODERUVFFAWZQDSS6SBIACUA5O6SXF7HJ3YTYXBALHZP3P7R4BUO4J2";

    fn args(a: &[&str]) -> Result<nats_config::Args, String> {
        match parse(std::iter::once("nats-config").chain(a.iter().copied())) {
            Ok(cli) => match cli.command {
                Some(Command::NatsConfig(c)) => c.args().map_err(|e| e.to_string()),
                other => panic!("{a:?}: {other:?}"),
            },
            Err(e) => Err(e.to_string()),
        }
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
        assert_eq!(a.listen, "127.0.0.1:4222".parse().expect("addr"));
        assert_eq!(a.store_dir, PathBuf::from("/var/lib/nats/jetstream"));
        assert_eq!(a.protocols, DeviceProtocols::WithLegacy);
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
            "--no-legacy-devices",
        ])
        .expect("callout");
        assert!(matches!(a.layout, Layout::AuthCallout { .. }));
        assert_eq!(a.listen, "0.0.0.0:4222".parse().expect("addr"));
        assert_eq!(a.protocols, DeviceProtocols::Current);
    }

    #[test]
    fn cluster_hub_and_leaf_arguments_parse() {
        let a = args(&[
            "--devices",
            "d",
            "--passwords-dir",
            "p",
            "--admin-password-file",
            "a",
            "--server-name",
            "n1",
            "--cluster",
            "fleet",
            "--cluster-listen",
            "0.0.0.0:6222",
            "--route",
            "10.0.0.1:6222",
            "--route",
            "10.0.0.2:6222",
            "--leafnode-listen",
            "0.0.0.0:7422",
            "--leaf-password-file",
            "l",
        ])
        .expect("a hub node of a cluster");
        match a.role {
            nats_config::Role::Server {
                cluster: Some(c),
                leafnodes: Some((listen, file)),
                ..
            } => {
                assert_eq!(c.name, "fleet");
                assert_eq!(c.routes.len(), 2);
                assert_eq!(listen, "0.0.0.0:7422".parse().expect("addr"));
                assert_eq!(file, PathBuf::from("l"));
            }
            other => panic!("{other:?}"),
        }
        let a = args(&[
            "--leaf-of",
            "hub1.example:7422",
            "--leaf-of",
            "[fd00::1]:7422",
            "--leaf-password-file",
            "l",
            "--server-name",
            "leaf-1",
            "--devices",
            "d",
            "--passwords-dir",
            "p",
        ])
        .expect("a leaf");
        assert_eq!(
            a.role,
            nats_config::Role::Leaf {
                hubs: vec!["hub1.example:7422".to_owned(), "[fd00::1]:7422".to_owned()],
                leaf_password_file: "l".into(),
            }
        );
    }

    #[test]
    fn a_leaf_of_the_callout_layout_needs_no_callout_password() {
        let leaf = [
            "--leaf-of",
            "h:7422",
            "--leaf-password-file",
            "l",
            "--server-name",
            "leaf-1",
            "--auth-callout",
            "--issuer",
            ISSUER,
        ];
        let a = args(&leaf).expect("a callout leaf");
        assert!(matches!(
            a.layout,
            Layout::AuthCallout {
                callout_password_file: None,
                ..
            }
        ));
        assert!(matches!(a.role, nats_config::Role::Leaf { .. }));
        let e =
            args(&[&leaf[..], &["--callout-password-file", "c"]].concat()).expect_err("refused");
        assert!(e.contains("cannot be used with"), "{e}");
    }

    #[test]
    fn bad_cluster_and_leaf_arguments_are_refused() {
        let err = |l: &[&str]| args(l).expect_err("refused");
        let leaf = [
            "--leaf-password-file",
            "l",
            "--server-name",
            "leaf-1",
            "--devices",
            "d",
            "--passwords-dir",
            "p",
        ];
        for bad in ["hub", "hub:0", "hub:x", "a b:1", "[nope]:1", ":7422"] {
            let e = err(&[&["--leaf-of", bad][..], &leaf[..]].concat());
            assert!(e.contains("give HOST:PORT"), "{bad}: {e}");
        }
        let e = err(&[
            "--leaf-of",
            "h:1",
            "--leaf-password-file",
            "l",
            "--devices",
            "d",
            "--passwords-dir",
            "p",
        ]);
        assert!(e.contains("--server-name"), "{e}");
        let e = err(&[
            &["--leaf-of", "h:1", "--admin-password-file", "a"][..],
            &leaf[..],
        ]
        .concat());
        assert!(e.contains("cannot be used with"), "{e}");
        let stat = [
            "--devices",
            "d",
            "--passwords-dir",
            "p",
            "--admin-password-file",
            "a",
        ];
        let e = err(&[&stat[..], &["--leaf-password-file", "l"]].concat());
        assert!(
            e.contains("--leaf-password-file is for --leafnode-listen"),
            "{e}"
        );
        let e = err(&[&stat[..], &["--leafnode-listen", "0.0.0.0:7422"]].concat());
        assert!(e.contains("--leaf-password-file"), "{e}");
        let e = err(&[&stat[..], &["--cluster", "fleet", "--server-name", "n1"]].concat());
        assert!(e.contains("--cluster-listen"), "{e}");
    }

    #[test]
    fn bad_arguments_are_refused_with_what_to_do() {
        let err = |l: &[&str]| args(l).expect_err("refused");
        let static_layout = ["--devices", "d", "--passwords-dir", "p"];
        assert!(err(&static_layout).contains(
            "the following required arguments were not provided:\n  --admin-password-file <FILE>"
        ));
        assert_eq!(
            err(&["--auth-callout", "--issuer", "UABC", "--callout-password-file", "c", "--admin-password-file", "a"]),
            "--issuer: invalid nkey public key: 4 characters, expected 56; copy the whole key without spaces or quotes; print the callout's key with fleet-auth-callout public-key <seed-file>"
        );
        assert!(err(&[
            "--auth-callout",
            "--issuer",
            ISSUER,
            "--admin-password-file",
            "a"
        ])
        .contains("--callout-password-file <FILE>"));
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
        .contains("--auth-callout"));
        assert!(err(&[
            "--auth-callout",
            "--devices",
            "d",
            "--issuer",
            ISSUER,
            "--callout-password-file",
            "c",
            "--admin-password-file",
            "a"
        ])
        .contains("the argument '--auth-callout' cannot be used with '--devices <FILE>'"));
        assert!(err(&["--bogus"]).contains("unexpected argument '--bogus' found"));
        assert!(err(&["--devices"]).contains("a value is required for '--devices <FILE>'"));
        let twice = [
            &static_layout[..],
            &["--devices", "e", "--admin-password-file", "a"],
        ]
        .concat();
        assert!(
            err(&twice).contains("the argument '--devices <FILE>' cannot be used multiple times")
        );
        let listen = [
            &static_layout[..],
            &["--admin-password-file", "a", "--listen", "x"],
        ]
        .concat();
        assert!(err(&listen).contains("invalid value 'x' for '--listen <ADDR:PORT>'"));
        let name = [
            &static_layout[..],
            &["--admin-password-file", "a", "--server-name", "a b"],
        ]
        .concat();
        assert!(err(&name).contains("\"a b\": use letters, digits, '-', '_' and '.'"));
    }
}
