//! `fleetctl`: the operator's CLI for a Harmony fleet.

use std::process::ExitCode;

mod artifact;

const HELP: &str = "fleetctl: operate a Harmony fleet

Usage:
  fleetctl --help | --version
  fleetctl artifact push <oci-reference> <binary> [--ca-file <pem>]
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version") | Some("-V") => {
            println!("fleetctl {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some("--help") | Some("-h") | None => {
            print!("{HELP}");
            ExitCode::SUCCESS
        }
        Some("artifact") => artifact::main(&args[1..]),
        Some(other) => {
            eprintln!("fleetctl: unknown command {other:?}; see fleetctl --help");
            ExitCode::from(2)
        }
    }
}
