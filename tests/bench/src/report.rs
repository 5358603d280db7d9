//! The result table: one row per figure (ours, the baseline measured in the
//! same run, their ratio or delta, the target of `docs/development/bench.md`
//! "Targets", a verdict), notes numbered under it, rendered as markdown.

use std::fmt::Write as _;

/// Whether a figure meets its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    /// Measured, but the figure has no target of its own (context).
    Info,
    /// Not measured in this run; the note says why.
    Todo,
}

impl Verdict {
    pub fn from_ok(ok: bool) -> Verdict {
        if ok {
            Verdict::Pass
        } else {
            Verdict::Fail
        }
    }

    fn cell(&self) -> &'static str {
        match self {
            Verdict::Pass => "yes",
            Verdict::Fail => "**NO**",
            Verdict::Info => "—",
            Verdict::Todo => "TODO",
        }
    }
}

/// One figure.
#[derive(Debug, Clone)]
pub struct Row {
    pub figure: String,
    pub ours: String,
    pub baseline: String,
    pub ratio: String,
    pub target: String,
    pub verdict: Verdict,
    pub note: Option<String>,
}

impl Row {
    pub fn new(figure: impl Into<String>) -> Row {
        Row {
            figure: figure.into(),
            ours: String::new(),
            baseline: String::new(),
            ratio: String::new(),
            target: String::new(),
            verdict: Verdict::Info,
            note: None,
        }
    }

    pub fn ours(mut self, v: impl Into<String>) -> Row {
        self.ours = v.into();
        self
    }

    pub fn baseline(mut self, v: impl Into<String>) -> Row {
        self.baseline = v.into();
        self
    }

    pub fn ratio(mut self, v: impl Into<String>) -> Row {
        self.ratio = v.into();
        self
    }

    pub fn target(mut self, v: impl Into<String>, verdict: Verdict) -> Row {
        self.target = v.into();
        self.verdict = verdict;
        self
    }

    pub fn note(mut self, v: impl Into<String>) -> Row {
        self.note = Some(v.into());
        self
    }

    /// A figure this run could not measure.
    pub fn todo(figure: &str, target: &str, why: &str) -> Row {
        Row::new(figure)
            .ours("—")
            .baseline("—")
            .ratio("—")
            .target(target, Verdict::Todo)
            .note(why)
    }
}

/// Every row of a run, in order, and a description of the machine.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Row>,
}

impl Table {
    pub fn push(&mut self, row: Row) {
        eprintln!(
            "bench: {} = {} (baseline {}; {}; target {} → {})",
            row.figure,
            row.ours,
            row.baseline,
            row.ratio,
            row.target,
            row.verdict.cell()
        );
        self.rows.push(row);
    }

    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// The rows of `tables`, in order, as one table (nothing logged again).
    pub fn joined<'a>(tables: impl IntoIterator<Item = &'a Table>) -> Table {
        Table {
            rows: tables
                .into_iter()
                .flat_map(|t| t.rows.iter().cloned())
                .collect(),
        }
    }

    /// The markdown table, then its notes.
    pub fn render(&self, header: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{header}\n");
        out.push_str("| figure | ours | baseline (same run) | ratio / delta | target | ok? |\n");
        out.push_str("|---|---|---|---|---|---|\n");
        let mut notes = Vec::new();
        for row in &self.rows {
            let figure = match &row.note {
                Some(n) => {
                    notes.push(n.clone());
                    format!("{} [{}]", row.figure, notes.len())
                }
                None => row.figure.clone(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                escape(&figure),
                escape(&row.ours),
                escape(&row.baseline),
                escape(&row.ratio),
                escape(&row.target),
                row.verdict.cell()
            );
        }
        if !notes.is_empty() {
            out.push('\n');
            for (i, n) in notes.iter().enumerate() {
                let _ = writeln!(out, "{}. {}", i + 1, n);
            }
        }
        out
    }
}

/// A table cell: pipes escaped, newlines flattened.
fn escape(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Bytes as MiB with two decimals.
pub fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_render_with_numbered_notes_and_escaped_pipes() {
        let mut t = Table::default();
        t.push(
            Row::new("a")
                .ours("1")
                .baseline("curl | sha256sum")
                .ratio("1.0×")
                .target("≥ 0.8×", Verdict::Pass),
        );
        t.push(Row::todo("b", "≤ 5 s", "needs x"));
        let md = t.render("## run");
        assert!(
            md.contains("| a | 1 | curl \\| sha256sum | 1.0× | ≥ 0.8× | yes |"),
            "{md}"
        );
        assert!(md.contains("| b [1] | — | — | — | ≤ 5 s | TODO |"), "{md}");
        assert!(md.ends_with("1. needs x\n"), "{md}");
    }
}
