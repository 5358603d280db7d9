//! The release binaries under measurement, and their sizes.
//!
//! The bench runs from `<target>/release/fleet-bench` (`make bench` builds
//! `--release --workspace --bins`), so the daemons are its siblings: the
//! workspace release profile (opt-level "s", sha2/cpufeatures/ring at 3,
//! LTO, one codegen unit, `strip = true`, `panic = "abort"`).
//!
//! The size baseline is the same binary built at opt-level 3 (everything
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
    if !dir.file_name().is_some_and(|n| n == "release") {
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

/// The target triple of the static build `make bench-profiles` makes.
pub const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";

/// `name` from the static musl build of `make bench-profiles`, if made.
pub fn musl_bin(name: &str) -> Option<PathBuf> {
    let p = target_dir()
        .join("bench-musl")
        .join(MUSL_TARGET)
        .join("release")
        .join(name);
    p.is_file().then_some(p)
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

/// The size rows: agent ≤ 4 MiB, updater ≤ 3 MiB.
pub fn size_rows() -> Vec<Row> {
    let o3_dir = target_dir().join("bench-o3/release");
    [("fleet-agent", 4u64), ("fleet-updater", 3u64)]
        .into_iter()
        .map(|(name, limit_mib)| {
            let path = release_bin(name);
            let ours = size(&path).unwrap_or(0);
            assert!(
                !has_symtab(&path),
                "{} has a symbol table: the release profile must strip",
                path.display()
            );
            let limit = limit_mib * 1024 * 1024;
            let row = Row::new(format!("stripped binary: {name}"))
                .ours(mib(ours))
                .target(
                    format!("≤ {limit_mib} MiB"),
                    Verdict::from_ok(ours <= limit),
                );
            match size(&o3_dir.join(name)) {
                Some(o3) => row
                    .baseline(format!("{} at opt-level 3", mib(o3)))
                    .ratio(format!("{:.2}×", ours as f64 / o3 as f64)),
                None => row
                    .baseline("— (opt-level 3 build: `make bench-profiles`)")
                    .ratio("—"),
            }
        })
        .collect()
}
