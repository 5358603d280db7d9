//! `fleet-updater`: parses the command line, runs one command, maps its
//! error to an exit code (1: failure, 2: usage).

use std::process::ExitCode;

use fleet_updater::cli::{self, Command};

fn main() -> ExitCode {
    let command = match cli::parse(std::env::args_os().skip(1)) {
        Ok(c) => c,
        Err(usage) => {
            eprintln!("fleet-updater: {usage}; see fleet-updater --help");
            return ExitCode::from(2);
        }
    };
    match command {
        Command::Help => {
            print!("{}", cli::HELP);
            ExitCode::SUCCESS
        }
        Command::Version => {
            println!("fleet-updater {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Status { root, json } => match cli::status(root, json) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("fleet-updater: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Setup(args) => match fleet_updater::setup::run(&args) {
            Ok(done) => {
                for line in done {
                    println!("fleet-updater setup: {line}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("fleet-updater setup: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Run(args) => {
            fleet_common::logging::init("fleet-updater");
            match fleet_updater::run(args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    log::error!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
