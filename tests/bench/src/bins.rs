//! The release binaries under measurement, and their sizes.
//!
//! The bench runs from `<target>/release/fleet-bench` (`make bench` builds
//! `--release --workspace --bins`), so the daemons are its siblings: the
//! workspace release profile (opt-level "s", sha2/cpufeatures/ring at 3,
//! LTO, one codegen unit, `strip = true`, `panic = "abort"`).
//!
//! The device daemons measured against their targets are the static musl
//! builds the amd64 package ships (`<target>/x86_64-unknown-linux-musl/
//! release`, [`Build::Shipped`]); the glibc builds beside them are the
//! baseline ([`Build::Glibc`]).
//!
//! A further size baseline is the glibc binary built at opt-level 3 (everything
//! else equal) by `make bench-profiles` into `<target>/bench-o3/`: it says
//! what the size-oriented profile buys, which no other program can (a
//! C tool's size says nothing about ours). It is built only on request
//! (a second LTO build takes minutes on 2 cores).

use std::path::{Path, PathBuf};

use crate::report::{mib, Row, Verdict};

/// `<target>/release`, where this bench and the daemons were built.
pub fn release_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let dir = exe
        .parent()
        .unwrap_or_else(|| panic!("{} has no parent", exe.display()))
        .to_path_buf();
    if dir.file_name().is_none_or(|n| n != "release") {
        panic!(
            "fleet-bench runs from {}: measure release builds: run `make bench` (cargo build --release --workspace --bins)",
            dir.display()
        );
    }
    dir
}

/// `<target>`.
pub fn target_dir() -> PathBuf {
    release_dir()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| panic!("the release dir has no parent"))
}

/// A release binary of the workspace; panics naming the build command.
pub fn release_bin(name: &str) -> PathBuf {
    let p = release_dir().join(name);
    if !p.is_file() {
        panic!(
            "missing {}: run `make bench` (cargo build --release --workspace --bins)",
            p.display()
        );
    }
    p
}

/// The Rust target of the amd64 device package's daemons (the Makefile's
/// `DEVICE_TRIPLE_amd64`): static musl.
pub const SHIPPED_TARGET: &str = "x86_64-unknown-linux-musl";

/// Which build of the device daemons a figure measures: the one the amd64
/// package ships (static musl, `make release-device ARCH=amd64`, which
/// `make bench` runs) against the glibc build of the same profile, in the
/// same run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    Shipped,
    Glibc,
}

impl Build {
    /// Shipped first: its rows carry the targets.
    pub fn all() -> [Build; 2] {
        [Build::Shipped, Build::Glibc]
    }

    /// The daemon `name` of this build; panics naming the build command.
    pub fn bin(self, name: &str) -> PathBuf {
        match self {
            Build::Glibc => release_bin(name),
            Build::Shipped => {
                let p = target_dir().join(SHIPPED_TARGET).join("release").join(name);
                if !p.is_file() {
                    panic!(
                        "missing {}: run `make bench` (it runs make release-device ARCH=amd64)",
                        p.display()
                    );
                }
                p
            }
        }
    }

    /// For a row's figure and note.
    pub fn label(self) -> &'static str {
        match self {
            Build::Shipped => "static musl build, as shipped",
            Build::Glibc => "glibc build",
        }
    }

    /// `row` as measured on this build: the shipped build's keeps its
    /// target; the glibc build's is context (named so, target in
    /// brackets, no verdict).
    pub fn row(self, row: Row) -> Row {
        match self {
            Build::Shipped => row,
            Build::Glibc => {
                let target = match row.verdict {
                    // Already context: its target text says so.
                    Verdict::Info | Verdict::Todo => row.target.clone(),
                    Verdict::Pass | Verdict::Fail => format!("— ({})", row.target),
                };
                let mut row = row.target(target, Verdict::Info);
                row.figure = format!("{}, {}", row.figure, self.label());
                row
            }
        }
    }
}

fn size(p: &Path) -> Option<u64> {
    std::fs::metadata(p).ok().map(|m| m.len())
}

/// Whether `path` has a symbol table (`strip = true` should leave none).
fn has_symtab(path: &Path) -> bool {
    // ELF64 little-endian section headers: e_shoff at 0x28, e_shentsize at
    // 0x3a, e_shnum at 0x3c; a section of type SHT_SYMTAB (2) means symbols.
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    let u16_at = |o: usize| {
        bytes
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u64_at = |o: usize| {
        bytes
            .get(o..o + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
    };
    if bytes.get(..5) != Some(b"\x7fELF\x02") {
        return false;
    }
    let (Some(shoff), Some(entsize), Some(num)) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c)) else {
        return false;
    };
    (0..usize::from(num)).any(|i| {
        let at = shoff as usize + i * usize::from(entsize) + 4;
        bytes
            .get(at..at + 4)
            .is_some_and(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]) == 2)
    })
}

/// The size rows: agent ≤ 4 MiB, updater ≤ 3 MiB, of the shipped build,
/// beside the glibc build (and the opt-level 3 one, when built).
pub fn size_rows() -> Vec<Row> {
    let o3_dir = target_dir().join("bench-o3/release");
    [("fleet-agent", 4u64), ("fleet-updater", 3u64)]
        .into_iter()
        .map(|(name, limit_mib)| {
            let path = Build::Shipped.bin(name);
            let glibc = Build::Glibc.bin(name);
            for p in [&path, &glibc] {
                assert!(
                    !has_symtab(p),
                    "{} has a symbol table: the release profile must strip",
                    p.display()
                );
            }
            let ours = size(&path).unwrap_or(0);
            let base = size(&glibc).unwrap_or(0);
            let limit = limit_mib * 1024 * 1024;
            let o3 = match size(&o3_dir.join(name)) {
                Some(o3) => format!("the glibc build at opt-level 3: {}", mib(o3)),
                None => "opt-level 3 baseline: `make bench-profiles`".to_owned(),
            };
            Row::new(format!("stripped binary: {name}"))
                .ours(mib(ours))
                .baseline(format!("{} (glibc build)", mib(base)))
                .ratio(format!("{:.2}×", ours as f64 / base.max(1) as f64))
                .target(
                    format!("≤ {limit_mib} MiB"),
                    Verdict::from_ok(ours <= limit),
                )
                .note(format!(
                    "The {SHIPPED_TARGET} build the amd64 package ships (static: musl's libc inside) against the dynamic glibc build of the same profile; {o3}."
                ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_glibc_builds_rows_are_context_and_the_shipped_keep_their_target() {
        let row = || Row::new("updater RSS, idle").target("≤ 2 MiB", Verdict::Fail);
        let shipped = Build::Shipped.row(row());
        assert_eq!(shipped.verdict, Verdict::Fail);
        assert_eq!(shipped.target, "≤ 2 MiB");
        let glibc = Build::Glibc.row(row());
        assert_eq!(glibc.verdict, Verdict::Info);
        assert_eq!(glibc.target, "— (≤ 2 MiB)");
        assert_eq!(glibc.figure, "updater RSS, idle, glibc build");
        let info = Build::Glibc.row(Row::new("x").target("— (20 workloads)", Verdict::Info));
        assert_eq!(info.target, "— (20 workloads)");
    }
}
