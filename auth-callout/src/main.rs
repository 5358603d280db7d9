//! `fleet-auth-callout`: argument parsing and exit codes; the service is
//! `fleet_auth_callout::run`.

use std::path::PathBuf;
use std::process::ExitCode;

use fleet_auth_callout::{keygen, AccountSigner, Config, DEFAULT_CONFIG_PATH};

const HELP: &str = "fleet-auth-callout: NATS auth callout of a Harmony fleet

Answers nats-server's authorization requests (auth_callout, server 2.10+):
verifies the identity provider's bearer JWT (RS256/ES256, keys from its JWKS),
reads the device ID claim, and places the client in account DEVICES with
exactly that device's permissions; with enrollment, also admits devices by
their own approved nkey and lets new ones ask to join. Anything else is
refused, with the reason logged.

Usage:
  fleet-auth-callout [--config <file>]    run (default config: /etc/harmony-fleet/auth-callout.json)
  fleet-auth-callout keygen <seed-file>   write a new issuer account seed (mode 0600)
                                          and print its public key (auth_callout.issuer)
  fleet-auth-callout public-key <seed-file>
                                          print the public key of a seed file
  fleet-auth-callout --help | --version

Config (JSON, unknown keys refused; issuer, audience and jwks_url: all three,
or none for enrolled devices only):
  issuer                 identity provider issuer URL (https://), compared exactly to iss
  audience               required member of aud (Zitadel: the project ID)
  jwks_url               the provider's JWKS (https://)
  device_claim           claim holding the device ID (default device_id)
  clock_skew_secs        tolerated clock difference, 0..300 (default 60)
  jwks_min_refetch_secs  least time between JWKS fetches, 1..3600 (default 30)
  jwks_max_age_secs      refetch a key set this old, 60..86400 (default 3600)
  https_ca_file          PEM CA file for the provider (default: built-in web PKI roots)
  nats_url               nats:// or tls:// URL(s) of the server
  nats_user              the callout's user in account AUTH (default auth-callout)
  nats_password_file     its password, mode 0600
  nats_ca_file           PEM CA file for a tls:// server
  issuer_seed_file       the issuer account seed (SA...), mode 0600
  enrollment             {token_files, auto_approve, bearer_requires_approval}:
                         devices joining with their own key (see the README)

Logs go to the journal under systemd, to stderr otherwise (FLEET_LOG=debug for more).
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let strs: Vec<&str> = args.iter().map(String::as_str).collect();
    match strs.as_slice() {
        ["--help"] | ["-h"] => {
            print!("{HELP}");
            ExitCode::SUCCESS
        }
        ["--version"] | ["-V"] => {
            println!("fleet-auth-callout {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        ["keygen", path] => match keygen(&PathBuf::from(path)) {
            Ok(public) => {
                println!("{public}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        ["public-key", path] => match AccountSigner::load(&PathBuf::from(path)) {
            Ok(s) => {
                println!("{}", s.public_key());
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        [] => serve(PathBuf::from(DEFAULT_CONFIG_PATH)),
        ["--config", path] => serve(PathBuf::from(path)),
        _ => {
            eprintln!(
                "fleet-auth-callout: unexpected arguments {args:?}; see fleet-auth-callout --help"
            );
            ExitCode::from(2)
        }
    }
}

fn serve(config: PathBuf) -> ExitCode {
    fleet_common::logging::init("fleet-auth-callout");
    let config = match Config::load(&config) {
        Ok(c) => c,
        Err(e) => {
            log::error!("{e}");
            return ExitCode::from(1);
        }
    };
    match fleet_auth_callout::run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e}");
            ExitCode::from(1)
        }
    }
}

/// A failed one-shot command (no logger: straight to stderr).
fn fail(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("fleet-auth-callout: {e}");
    ExitCode::from(1)
}
