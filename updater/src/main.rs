//! `fleet-updater`: the root daemon that replaces the agent binary through a
//! durable, crash-safe transaction with rollback.

use std::process::ExitCode;

const HELP: &str = "fleet-updater: replaces the fleet agent through a crash-safe transaction

Usage:
  fleet-updater run                   run the daemon (under systemd, as root)
  fleet-updater status [--json]       show the current or last transaction
  fleet-updater --help | --version
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version") | Some("-V") => {
            println!("fleet-updater {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some("--help") | Some("-h") | None => {
            print!("{HELP}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("fleet-updater: unknown command {other:?}; see fleet-updater --help");
            ExitCode::from(2)
        }
    }
}
