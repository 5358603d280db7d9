//! `fleetctl nats-config`: the nats-server config of the fleet layout.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use super::{Failure, Output};
use crate::nats_config::{self, Layout, NatsConfigError};
use fleet_common::nkey::{NkeyKind, PublicNkey};
use fleet_common::subjects::DeviceProtocols;

const STATIC: &str = "Static layout (any server, 2.9.10 included): one user per device";
const CALLOUT: &str =
    "Auth callout layout (server 2.10+): devices are placed by fleet-auth-callout";

/// Write the nats-server config of the fleet layout
#[derive(Debug, Args)]
#[command(
    override_usage = "fleetctl nats-config --devices FILE --passwords-dir DIR --admin-password-file FILE [OPTIONS]
       fleetctl nats-config --auth-callout --issuer KEY --callout-password-file FILE
                            --admin-password-file FILE [OPTIONS]",
    long_about = "Write the nats-server config of the fleet layout: accounts FLEET \
and DEVICES, the operator's user admin, and either one password user per \
device (static layout) or the auth callout's user (auth callout layout). \
The config goes to stdout, or to --output atomically with mode 0600 (it \
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
    #[arg(long, help_heading = CALLOUT, requires_all = ["issuer", "callout_password_file"])]
    auth_callout: bool,
    /// The callout's issuer public key (fleet-auth-callout public-key <seed>)
    #[arg(long, value_name = "KEY", help_heading = CALLOUT, requires = "auth_callout")]
    issuer: Option<String>,
    /// Password of the callout's NATS user auth-callout
    #[arg(long, value_name = "FILE", help_heading = CALLOUT, requires = "auth_callout")]
    callout_password_file: Option<PathBuf>,
    /// Password of the operator's user admin in account FLEET
    #[arg(long, value_name = "FILE", required = true)]
    admin_password_file: PathBuf,
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

impl NatsConfig {
    /// The validated arguments. The issuer key is checked here, after
    /// parsing, so that a bad key keeps its exit code 1 and its hint.
    fn args(self) -> Result<nats_config::Args, NatsConfigError> {
        let layout = match (self.auth_callout, self.issuer, self.callout_password_file) {
            (true, Some(issuer), Some(callout_password_file)) => Layout::AuthCallout {
                issuer: PublicNkey::parse_kind(&issuer, NkeyKind::Account)
                    .map_err(NatsConfigError::Issuer)?,
                callout_password_file,
            },
            // clap requires the devices file and passwords dir without
            // --auth-callout, the issuer and callout password with it.
            _ => Layout::Static {
                devices: self.devices.unwrap_or_default(),
                passwords_dir: self.passwords_dir.unwrap_or_default(),
            },
        };
        Ok(nats_config::Args {
            layout,
            admin_password_file: self.admin_password_file,
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
