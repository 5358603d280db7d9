//! The result pages under `docs/bench/`: one markdown file per section
//! (`docs/bench/<section>.md`), so the repository carries the figures of
//! the last run and nobody copies them by hand.
//!
//! Each page holds its last run between two markers ([`BEGIN`], [`END`]):
//! the run header (machine, time), how long the section took in that run
//! and with which arguments, then the section's table with its notes
//! numbered from 1. A run rewrites only the pages of the sections it ran
//! (`--only scale` leaves `device.md` alone), and on each page only what
//! lies between the markers: the text around them (what the section
//! measures, dated remarks on earlier runs) is written by hand and kept.
//!
//! A page that exists without both markers is not overwritten: the run
//! says so and fails, so hand-written text is never lost.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// The line before a page's generated block.
pub const BEGIN: &str =
    "<!-- fleet-bench: the last run, written by `make bench`; edit outside these markers -->";
/// The line after it.
pub const END: &str = "<!-- fleet-bench: end of the last run -->";

/// The title and first paragraph of a page `make bench` creates (a page
/// that exists keeps its own).
fn preamble(section: &str) -> (&'static str, &'static str) {
    match section {
        "sizes" => (
            "Bench: binary sizes",
            "The stripped release daemons, as the amd64 package ships them.",
        ),
        "device" => (
            "Bench: one device",
            "One agent with 20 workloads and one idle updater: memory, idle CPU, desired-state put → container running.",
        ),
        "download" => (
            "Bench: download + verify",
            "A 100 MiB artifact over loopback HTTPS, against curl piped into a hash, and the updater's peak memory meanwhile.",
        ),
        "fleet" => (
            "Bench: fleet convergence",
            "Release agents (Podman disabled) on one nats-server converging on one change.",
        ),
        "rollout" => (
            "Bench: `fleetctl rollout`",
            "`fleetctl rollout` (at once and staged) over a large seeded fleet.",
        ),
        "cutover" => (
            "Bench: cutover",
            "The updater's cutover against `systemctl restart` of the same agent, in a booted Debian container.",
        ),
        "scale" => (
            "Bench: fleet scale",
            "Simulated fleets of both device protocols on a 3-node nats-server cluster.",
        ),
        "scale-leaf" => (
            "Bench: fleet scale on leaf nodes",
            "Simulated generation-2 devices on leaf nodes of a 3-node nats-server hub cluster.",
        ),
        "traffic" => (
            "Bench: idle traffic",
            "One idle device's bytes on the wire per 30 days (TLS, TCP/IPv4 headers), a desired change and an upgrade, against the released agent 0.2.0; what each interval knob costs (docs/operator/traffic.md).",
        ),
        "metrics" => (
            "Bench: the metrics exporter",
            "`fleetctl metrics serve` over 100,000 seeded devices: its first complete view, a scrape, its memory (docs/operator/metrics.md).",
        ),
        "enrollment" => (
            "Bench: enrollment",
            "N simulated devices enrolling at once through the auth callout under an auto-approve rule, beside N static users: time to approved, server memory per device, the reconnect storm after a server kill.",
        ),
        _ => ("Bench", "A section of `make bench`."),
    }
}

/// A page that cannot be written.
#[derive(Debug)]
pub enum PageError {
    /// The page exists but lacks its markers (or has them out of order).
    NoMarkers {
        path: PathBuf,
    },
    Io {
        path: PathBuf,
        source: io::Error,
    },
}

impl fmt::Display for PageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoMarkers { path } => write!(
                f,
                "{} has no generated block (the lines {BEGIN:?} and {END:?}, in that order); it was left as it is: put the markers back around the last run, or remove the page to have it made anew",
                path.display()
            ),
            Self::Io { path, source } => write!(f, "writing {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for PageError {}

/// The path of a section's page in `dir`.
pub fn path(dir: &Path, section: &str) -> PathBuf {
    dir.join(format!("{section}.md"))
}

/// The page text with `block` as its last run: `existing` with what lies
/// between its markers replaced, or a new page when there is none. `None`
/// when `existing` lacks its markers.
pub fn splice(existing: Option<&str>, section: &str, block: &str) -> Option<String> {
    let block = block.trim_end_matches('\n');
    let Some(text) = existing else {
        let (title, about) = preamble(section);
        return Some(format!(
            "# {title}\n\n{about} How each figure is taken: [the bench](../development/bench.md).\n\n{BEGIN}\n\n{block}\n\n{END}\n"
        ));
    };
    let begin = text.find(BEGIN)?;
    let after_begin = begin + BEGIN.len();
    let end = after_begin + text[after_begin..].find(END)?;
    Some(format!(
        "{}\n\n{block}\n\n{}",
        &text[..after_begin],
        &text[end..]
    ))
}

/// Writes `block` as the last run on the page of `section` in `dir`
/// (created when missing), replacing the file whole (temp file, rename).
pub fn write(dir: &Path, section: &str, block: &str) -> Result<PathBuf, PageError> {
    let path = path(dir, section);
    let io_err = |source| PageError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io_err)?;
    let existing = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err(e)),
    };
    let text = splice(existing.as_deref(), section, block)
        .ok_or_else(|| PageError::NoMarkers { path: path.clone() })?;
    let temp = dir.join(format!(".{section}.md.tmp.{}", std::process::id()));
    std::fs::write(&temp, text).map_err(io_err)?;
    std::fs::rename(&temp, &path).map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        io_err(e)
    })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_page_has_a_title_a_link_to_the_method_and_the_block_between_markers() {
        let page = splice(None, "scale", "Run of X.\n\n| a |\n").expect("new page");
        assert!(page.starts_with("# Bench: fleet scale\n\n"), "{page}");
        assert!(page.contains("(../development/bench.md)"), "{page}");
        assert!(
            page.ends_with(&format!("{BEGIN}\n\nRun of X.\n\n| a |\n\n{END}\n")),
            "{page}"
        );
    }

    #[test]
    fn a_run_replaces_only_what_lies_between_the_markers() {
        let old = format!(
            "# Mine\n\nHand-written intro.\n\n{BEGIN}\n\nRun of old.\n\n| old |\n\n{END}\n\n## Earlier runs\n\nKept.\n"
        );
        let page = splice(Some(&old), "device", "Run of new.\n\n| new |").expect("markers");
        assert_eq!(
            page,
            format!(
                "# Mine\n\nHand-written intro.\n\n{BEGIN}\n\nRun of new.\n\n| new |\n\n{END}\n\n## Earlier runs\n\nKept.\n"
            )
        );
        // The same run again changes nothing.
        assert_eq!(
            splice(Some(&page), "device", "Run of new.\n\n| new |"),
            Some(page.clone())
        );
    }

    #[test]
    fn a_page_without_its_markers_is_refused_not_overwritten() {
        assert_eq!(splice(Some("# Notes\n"), "sizes", "x"), None);
        let reversed = format!("{END}\n{BEGIN}\n");
        assert_eq!(splice(Some(&reversed), "sizes", "x"), None);

        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("sizes.md"), "# Notes\n").expect("write");
        let e = write(dir.path(), "sizes", "x").expect_err("no markers");
        assert!(matches!(e, PageError::NoMarkers { .. }), "{e}");
        assert!(e.to_string().contains("it was left as it is"), "{e}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("sizes.md")).expect("read"),
            "# Notes\n"
        );
    }

    #[test]
    fn writing_one_section_leaves_the_other_pages_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pages = dir.path().join("docs/bench");
        write(&pages, "device", "Run of 1.").expect("device");
        write(&pages, "scale", "Run of 1.").expect("scale");
        let device = std::fs::read_to_string(path(&pages, "device")).expect("read");
        write(&pages, "scale", "Run of 2.").expect("scale again");
        assert_eq!(
            std::fs::read_to_string(path(&pages, "device")).expect("read"),
            device
        );
        let scale = std::fs::read_to_string(path(&pages, "scale")).expect("read");
        assert!(
            scale.contains("Run of 2.") && !scale.contains("Run of 1."),
            "{scale}"
        );
        let names: Vec<String> = std::fs::read_dir(&pages)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "no temp file is left: {names:?}");
    }
}
