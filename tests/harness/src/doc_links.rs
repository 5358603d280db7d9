//! The repository's own documents link only to what exists: every relative
//! link in every `*.md` file of the workspace names a file or directory
//! that is there, and a `#fragment` names a heading of the markdown file
//! it points at (GitHub's anchors: lower case, punctuation dropped, spaces
//! as hyphens, `-1`, `-2` for repeats). Links to other sites are not
//! followed. Code blocks and code spans are not links.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Directories never searched for documents.
const SKIPPED_DIRS: [&str; 4] = ["target", ".git", ".deps", "node_modules"];

/// Every `*.md` file under `root`, sorted.
pub fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !SKIPPED_DIRS.contains(&name.as_ref()) {
                    dirs.push(path);
                }
            } else if name.ends_with(".md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The text of `md` with fenced code blocks and code spans blanked out,
/// so that what they show is not taken for links or headings.
fn prose(md: &str) -> String {
    let mut out = String::with_capacity(md.len());
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if fenced {
            out.push('\n');
            continue;
        }
        let mut in_span = false;
        for c in line.chars() {
            if c == '`' {
                in_span = !in_span;
                out.push(' ');
            } else {
                out.push(if in_span { ' ' } else { c });
            }
        }
        out.push('\n');
    }
    out
}

/// The destinations of the inline links `[text](dest)` in `md`.
pub fn link_targets(md: &str) -> Vec<String> {
    let text = prose(md);
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        let dest = rest[..end].trim();
        // `[a](b "title")`: the destination is the first word.
        let dest = dest.split_whitespace().next().unwrap_or("");
        if !dest.is_empty() && !dest.contains('\n') {
            out.push(dest.to_owned());
        }
        rest = &rest[end..];
    }
    out
}

/// GitHub's anchor of a heading's text.
pub fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor the headings of `md` make, repeats numbered as GitHub does.
pub fn anchors(md: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    let mut headings = Vec::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            headings.push(line[hashes..].replace('`', ""));
        }
    }
    for h in headings {
        let base = anchor(&h);
        let mut a = base.clone();
        let mut n = 0;
        while seen.contains(&a) {
            n += 1;
            a = format!("{base}-{n}");
        }
        seen.insert(a);
    }
    seen
}

/// What is wrong with the relative links of the markdown file `file`, one
/// line each (empty when all resolve).
pub fn broken_links(file: &Path) -> Vec<String> {
    let Ok(md) = std::fs::read_to_string(file) else {
        return vec![format!("{}: cannot be read", file.display())];
    };
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut out = Vec::new();
    for dest in link_targets(&md) {
        if dest.contains("://") || dest.starts_with("mailto:") {
            continue;
        }
        let (path, fragment) = match dest.split_once('#') {
            Some((p, f)) => (p, Some(f)),
            None => (dest.as_str(), None),
        };
        let target = if path.is_empty() {
            file.to_path_buf()
        } else {
            dir.join(path)
        };
        if !target.exists() {
            out.push(format!(
                "{}: link to {dest}: {} does not exist",
                file.display(),
                target.display()
            ));
            continue;
        }
        let Some(fragment) = fragment else { continue };
        if target.extension().is_some_and(|e| e == "md") {
            let text = std::fs::read_to_string(&target).unwrap_or_default();
            if !anchors(&text).contains(fragment) {
                out.push(format!(
                    "{}: link to {dest}: {} has no heading with the anchor #{fragment}",
                    file.display(),
                    target.display()
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_relative_link_in_the_repository_documents_resolves() {
        let root = crate::workspace_root();
        let files = markdown_files(&root);
        assert!(
            files.iter().any(|f| f.ends_with("README.md")) && files.len() > 10,
            "the documents were not found under {}: {files:?}",
            root.display()
        );
        let broken: Vec<String> = files.iter().flat_map(|f| broken_links(f)).collect();
        assert!(
            broken.is_empty(),
            "{} broken links (fix the link or the heading):\n{}",
            broken.len(),
            broken.join("\n")
        );
    }

    #[test]
    fn links_are_found_outside_code_only() {
        let md = "See [a](a.md#x) and [b](../b/ \"title\").\n`[c](c.md)`\n```\n[d](d.md)\n```\n[e](https://example.com)\n";
        assert_eq!(link_targets(md), ["a.md#x", "../b/", "https://example.com"]);
    }

    #[test]
    fn anchors_follow_github() {
        assert_eq!(
            anchor("Generation 2: reads without a consumer"),
            "generation-2-reads-without-a-consumer"
        );
        assert_eq!(anchor("fleetctl's connection"), "fleetctls-connection");
        assert_eq!(anchor("Stop, switch, start"), "stop-switch-start");
        assert_eq!(anchor("put → running"), "put--running");
        let a = anchors("# T\n## `nats` crate\n## Notes\n## Notes\n```\n## not\n```\n");
        for want in ["t", "nats-crate", "notes", "notes-1"] {
            assert!(a.contains(want), "{want} in {a:?}");
        }
        assert!(!a.contains("not"), "{a:?}");
    }

    #[test]
    fn a_missing_file_or_heading_is_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("b.md"), "# Here\n").expect("write");
        let a = dir.path().join("a.md");
        std::fs::write(
            &a,
            "[ok](b.md#here) [gone](c.md) [bad](b.md#there) [self](#top)\n# Top\n",
        )
        .expect("write");
        let broken = broken_links(&a);
        assert_eq!(broken.len(), 2, "{broken:?}");
        assert!(broken[0].contains("c.md does not exist"), "{broken:?}");
        assert!(
            broken[1].contains("has no heading with the anchor #there"),
            "{broken:?}"
        );
    }
}
