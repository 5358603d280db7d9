//! Small helpers of the systemd containers: checked tool runs, output
//! tails, files written or failed loudly, the shared bounds.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use fleet_common::process::Output;

/// One podman call of the harness (run, cp, kill, rm).
pub(super) const PODMAN_TIMEOUT: Duration = Duration::from_secs(120);

/// Output kept from one command.
pub(super) const MAX_OUTPUT: usize = 16 * 1024 * 1024;

/// Locks `m`; a panic while holding it leaves plain data: still usable.
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn check(what: &str, out: Result<Output, fleet_common::process::ProcessError>) {
    match out {
        Ok(o) if o.success() => {}
        Ok(o) => panic!(
            "{what} failed ({}):\n{}\n{}",
            fleet_common::process::describe_status(o.status),
            tail(&o.stdout),
            tail(&o.stderr)
        ),
        Err(e) => panic!("{what}: {e}"),
    }
}

/// The last 4 KiB of `b`.
pub(super) fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let start = s.len().saturating_sub(4096);
    let start = (start..s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(s.len());
    s[start..].to_owned()
}

pub(super) fn toml_string(p: &Path) -> String {
    format!("{:?}", p.to_string_lossy())
}

pub(super) fn create_dir_all(p: &Path) {
    std::fs::create_dir_all(p).unwrap_or_else(|e| panic!("cannot create {}: {e}", p.display()));
}

pub(super) fn write_file(path: &Path, bytes: &[u8]) {
    if let Some(parent) = path.parent() {
        create_dir_all(parent);
    }
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

pub(super) fn write_atomic(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    write_file(&tmp, bytes);
    std::fs::rename(&tmp, path)
        .unwrap_or_else(|e| panic!("cannot rename {} to {}: {e}", tmp.display(), path.display()));
}

pub(super) fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("cannot chmod {}: {e}", path.display()));
}
