//! fleetctl's bash completion: the harmony-fleetctl package ships it where
//! bash-completion looks (`/usr/share/bash-completion/completions/fleetctl`,
//! loaded on demand); it is what the shipped binary generates from its clap
//! definition, and it completes the commands `fleetctl --help` names and
//! the options each command's help lists.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use fleet_harness::require_tool;
use fleet_packaging_tests::{deb, extract_deb, run, Arch, Role};

const BASH_COMPLETION: &str = "/usr/share/bash-completion/bash_completion";

/// The completions bash-completion gives for `words` (the last one being
/// completed), loading fleetctl's from the package tree under `root` the
/// way an interactive shell does (`__load_completion`, which searches
/// `$XDG_DATA_DIRS/bash-completion/completions`).
fn complete(root: &Path, words: &[&str]) -> BTreeSet<String> {
    let bash = require_tool("bash", "bash");
    assert!(
        Path::new(BASH_COMPLETION).is_file(),
        "missing {BASH_COMPLETION}: install the Debian package bash-completion (make deps)"
    );
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let script = format!(
        r#"set -e
source {BASH_COMPLETION}
__load_completion fleetctl
complete -p fleetctl >&2
COMP_WORDS=({words})
COMP_CWORD={cword}
COMP_LINE="${{COMP_WORDS[*]}}"
COMP_POINT=${{#COMP_LINE}}
_fleetctl fleetctl "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\n' "${{COMPREPLY[@]}}"
"#,
        words = quoted.join(" "),
        cword = words.len() - 1,
    );
    let out = run(Command::new(bash)
        .arg("-c")
        .arg(script)
        .env("XDG_DATA_DIRS", root.join("usr/share"))
        .env("BASH_COMPLETION_USER_DIR", root.join("nothing")));
    out.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn set(words: &[&str]) -> BTreeSet<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

/// The commands a `--help` lists under "Commands:" ("  NAME  what it does").
fn help_commands(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn fleetctl_completes_the_commands_its_help_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    extract_deb(&deb(Role::Fleetctl, Arch::Amd64), dir.path());
    let shipped = dir
        .path()
        .join("usr/share/bash-completion/completions/fleetctl");
    assert!(
        shipped.is_file(),
        "the package has no {}",
        shipped.display()
    );
    let fleetctl = dir.path().join("usr/bin/fleetctl");

    // The shipped script is what the shipped binary generates.
    let generated = tempfile::tempdir().expect("tempdir");
    run(Command::new(&fleetctl)
        .args(["generate", "completion"])
        .arg(generated.path()));
    assert_eq!(
        std::fs::read(&shipped).expect("read"),
        std::fs::read(generated.path().join("fleetctl.bash")).expect("read"),
        "the shipped completion differs from `fleetctl generate completion` (regenerate: make man)"
    );

    let help = run(Command::new(&fleetctl).arg("--help"));
    let commands = help_commands(&help);
    assert!(
        commands.len() >= 9,
        "too few commands in help: {commands:?}"
    );
    let mut want = commands.clone();
    want.extend(["-h", "--help", "-V", "--version"].map(str::to_owned));
    assert_eq!(complete(dir.path(), &["fleetctl", ""]), want);

    assert_eq!(
        complete(dir.path(), &["fleetctl", "wo"]),
        set(&["workload"])
    );
    for (group, subcommands) in [
        ("workload", &["apply", "rm", "delete", "ls", "rollout"][..]),
        ("device", &["status", "label", "ls"][..]),
        ("buckets", &["create"][..]),
        ("rollout", &["status", "resume", "abort", "ls", "undo"][..]),
        ("presence", &["record"][..]),
        ("metrics", &["serve"][..]),
    ] {
        let offered = complete(dir.path(), &["fleetctl", group, ""]);
        let group_help = run(Command::new(&fleetctl).args([group, "--help"]));
        for c in subcommands {
            assert!(
                offered.contains(*c),
                "fleetctl {group}: {c} not in {offered:?}"
            );
            assert!(
                group_help
                    .split(|ch: char| !ch.is_ascii_alphanumeric() && ch != '-')
                    .any(|w| w == *c),
                "fleetctl {group} --help does not name {c}"
            );
        }
    }
    assert_eq!(
        complete(dir.path(), &["fleetctl", "artifact", "p"]),
        set(&["push"])
    );
    assert_eq!(
        complete(dir.path(), &["fleetctl", "rollout", "--rel"]),
        set(&["--release"])
    );
    // Options: exactly those `fleetctl status --help` lists.
    let status = complete(dir.path(), &["fleetctl", "status", "--"]);
    let status_help = run(Command::new(&fleetctl).args(["status", "--help"]));
    let listed: BTreeSet<String> = status_help
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| {
            w.starts_with("--")
                && w.len() > 2
                && w[2..].chars().all(|c| c.is_ascii_lowercase() || c == '-')
        })
        .map(str::to_owned)
        .collect();
    assert_eq!(
        status, listed,
        "completion of fleetctl status -- against its help"
    );
    assert!(
        status.contains("--json") && status.contains("--server"),
        "{status:?}"
    );
}
