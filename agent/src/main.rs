//! `fleet-agent`: reconciles Podman workloads from NATS JetStream KV,
//! reports status, forwards upgrade intents, honours change freeze.

use std::process::ExitCode;

/// The compiled agent version; `FLEET_AGENT_VERSION` at build time overrides
/// the package version (release builds and the two-version upgrade tests).
pub const VERSION: &str = match option_env!("FLEET_AGENT_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};

const HELP: &str = "fleet-agent: reconciles Podman workloads from NATS JetStream KV

Usage:
  fleet-agent run [--config PATH]     run the agent (under systemd)
  fleet-agent --self-test [--config PATH]
                                      probe mode: check config, Podman, NATS and
                                      the updater socket; change nothing
  fleet-agent --help | --version
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version") | Some("-V") => {
            println!("fleet-agent {VERSION}");
            ExitCode::SUCCESS
        }
        Some("--help") | Some("-h") | None => {
            print!("{HELP}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("fleet-agent: unknown command {other:?}; see fleet-agent --help");
            ExitCode::from(2)
        }
    }
}
