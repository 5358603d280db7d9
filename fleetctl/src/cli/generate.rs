//! `fleetctl generate man|completion DIR` (hidden): the man pages and the
//! bash completion, from the same clap definition that parses the command
//! line, so they cannot say anything else. `make man` (scripts/man.sh)
//! runs it; the packages ship what it wrote.

use std::path::{Path, PathBuf};

use clap::{Args, CommandFactory, Subcommand};

use super::{Cli, Failure, Output};
use fleet_common::durable::write_atomic;

/// Mode of the files written: the packages install them 0644.
const FILE_MODE: u32 = 0o644;
/// The manual the pages belong to.
const MANUAL: &str = "Harmony fleet";

/// Write fleetctl's man pages or bash completion
#[derive(Debug, Args)]
pub struct Generate {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// One page per command: fleetctl.1, fleetctl-workload.1,
    /// fleetctl-workload-apply.1, ...
    Man {
        /// Where the pages go
        dir: PathBuf,
        /// The date the pages carry (YYYY-MM-DD; scripts/man.sh gives the
        /// last commit's)
        #[arg(long)]
        date: Option<String>,
    },
    /// The bash completion, as DIR/fleetctl.bash
    Completion {
        /// Where the file goes
        dir: PathBuf,
    },
}

/// The man pages: (file name, roff text), fleetctl's first, then each
/// visible command's, depth first.
pub fn man_pages(date: Option<&str>) -> Result<Vec<(String, Vec<u8>)>, std::io::Error> {
    fn walk(
        cmd: &clap::Command,
        date: Option<&str>,
        out: &mut Vec<(String, Vec<u8>)>,
    ) -> Result<(), std::io::Error> {
        let mut man = clap_mangen::Man::new(cmd.clone())
            .manual(MANUAL)
            .source(format!("harmony-fleet {}", env!("CARGO_PKG_VERSION")));
        if let Some(d) = date {
            man = man.date(d);
        }
        let mut page = Vec::new();
        man.render(&mut page)?;
        out.push((man.get_filename(), page));
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, date, out)?;
        }
        Ok(())
    }
    let mut root = Cli::command();
    root.build();
    let mut out = Vec::new();
    walk(&root, date, &mut out)?;
    Ok(out)
}

/// The bash completion script, of the visible commands (clap_complete
/// would offer hidden ones too).
pub fn bash_completion() -> Vec<u8> {
    let root = Cli::command();
    let visible = root.get_subcommands().filter(|s| !s.is_hide_set()).cloned();
    let mut shown = clap::Command::new("fleetctl")
        .version(env!("CARGO_PKG_VERSION"))
        .disable_help_subcommand(true)
        .subcommands(visible);
    let mut out = Vec::new();
    clap_complete::generate(clap_complete::Shell::Bash, &mut shown, "fleetctl", &mut out);
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), Failure> {
    let path = dir.join(name);
    write_atomic(&path, bytes, FILE_MODE).map_err(|e| {
        Failure::Other(format!(
            "fleetctl generate: writing {}: {e}",
            path.display()
        ))
    })
}

impl Generate {
    pub fn run(self) -> Result<Output, Failure> {
        match self.what {
            What::Man { dir, date } => {
                let pages = man_pages(date.as_deref()).map_err(|e| {
                    Failure::Other(format!("fleetctl generate: rendering the man pages: {e}"))
                })?;
                for (name, page) in &pages {
                    write(&dir, name, page)?;
                }
            }
            What::Completion { dir } => write(&dir, "fleetctl.bash", &bash_completion())?,
        }
        Ok(Output::text(String::new()))
    }
}
