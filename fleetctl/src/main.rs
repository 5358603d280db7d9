//! `fleetctl`: the operator's CLI for a Harmony fleet.

mod admin;
mod artifact;
mod nats_config;

use std::process::ExitCode;

const HELP: &str = "fleetctl: operate a Harmony fleet

Usage:
  fleetctl nats-config ...   write the nats-server config (see fleetctl nats-config --help)
  fleetctl artifact push ... publish an agent release (see fleetctl artifact --help)
  fleetctl buckets create    create the KV buckets           (see fleetctl buckets --help)
  fleetctl workload apply|delete ...  a device's desired workloads
  fleetctl device status DEVICE       a device's status read back from NATS
  fleetctl --help | --version
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
        Some("nats-config") => nats_config::main(&args[1..]),
        Some("artifact") => artifact::main(&args[1..]),
        Some("buckets") | Some("workload") | Some("device") => admin::main(&args),
        Some(other) => {
            eprintln!("fleetctl: unknown command {other:?}; see fleetctl --help");
            ExitCode::from(2)
        }
    }
}
