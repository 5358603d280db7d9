//! fleetctl's bash completion: the harmony-fleetctl package ships it where
//! bash-completion looks (`/usr/share/bash-completion/completions/fleetctl`,
//! loaded on demand), and it completes the commands `fleetctl --help` names.

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

    // The commands of `fleetctl --help`: "  fleetctl COMMAND ...".
    let help = run(Command::new(dir.path().join("usr/bin/fleetctl")).arg("--help"));
    let commands: BTreeSet<String> = help
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("fleetctl "))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter(|c| !c.starts_with('-'))
        .map(str::to_owned)
        .collect();
    assert!(
        commands.len() >= 9,
        "too few commands in help: {commands:?}"
    );
    let mut want = commands.clone();
    want.extend(["--help".to_owned(), "--version".to_owned()]);
    assert_eq!(complete(dir.path(), &["fleetctl", ""]), want);

    assert_eq!(
        complete(dir.path(), &["fleetctl", "wo"]),
        set(&["workload"])
    );
    assert_eq!(
        complete(dir.path(), &["fleetctl", "workload", ""]),
        set(&["apply", "ls", "rm"])
    );
    assert_eq!(
        complete(dir.path(), &["fleetctl", "device", ""]),
        set(&["status"])
    );
    assert_eq!(
        complete(dir.path(), &["fleetctl", "buckets", ""]),
        set(&["create"])
    );
    assert_eq!(
        complete(dir.path(), &["fleetctl", "artifact", "p"]),
        set(&["push"])
    );
    // Options: those `fleetctl status --help` lists (and --help).
    let status = complete(dir.path(), &["fleetctl", "status", "--"]);
    let status_help =
        run(Command::new(dir.path().join("usr/bin/fleetctl")).args(["status", "--help"]));
    for opt in status.iter().filter(|o| *o != "--help") {
        assert!(
            status_help.contains(opt.as_str()),
            "completion offers {opt}, which `fleetctl status --help` does not name"
        );
    }
    assert!(
        status.contains("--json") && status.contains("--server"),
        "{status:?}"
    );
}
