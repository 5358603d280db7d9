//! What setup installs: the agent binary by its version (step 5), the agent
//! config (step 6) and the active link (step 8).

use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use fleet_common::durable::{self, AtomicFile};
use fleet_common::layout::{AGENT_GROUP, AGENT_USER};
use fleet_common::process::{run_bounded, ProcessError};
use fleet_common::validate::Version;
use fleet_common::Layout;
use sha2::{Digest, Sha256};

use super::error::SetupError;
use super::system::{lookup_group, Host, MAX_TOOL_OUTPUT};
use crate::runas::RunAs;

/// `--version` of an agent binary: it prints one line at once.
pub(super) const VERSION_TIMEOUT: Duration = Duration::from_secs(30);
/// A config file larger than this is not one a person wrote.
pub(super) const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// The version `binary --version` prints as `fleet-agent <version>`; run as
/// the agent user on a live device.
pub(super) fn agent_version(binary: &Path, host: Host) -> Result<Version, SetupError> {
    let bad = |why: String| SetupError::AgentVersion {
        binary: binary.to_owned(),
        why,
    };
    let mut cmd = match host {
        Host::Live => RunAs::resolve(AGENT_USER)
            .map_err(|e| bad(e.to_string()))?
            .command(binary),
        Host::Offline => Command::new(binary),
    };
    cmd.arg("--version");
    let out = run_bounded(&mut cmd, VERSION_TIMEOUT, MAX_TOOL_OUTPUT)
        .map_err(|e: ProcessError| bad(e.to_string()))?;
    if !out.success() {
        return Err(bad(format!("--version failed: {}", out.diagnostic())));
    }
    parse_version_line(&String::from_utf8_lossy(&out.stdout)).map_err(bad)
}

/// `fleet-agent <version>\n` → the version.
pub(super) fn parse_version_line(text: &str) -> Result<Version, String> {
    let line = text.trim_end_matches('\n');
    let v = line
        .strip_prefix("fleet-agent ")
        .filter(|v| !v.contains('\n'))
        .ok_or_else(|| format!("--version printed {line:?}, not `fleet-agent <version>`"))?;
    Version::parse(v).map_err(|e| format!("--version printed an invalid version: {e}"))
}

/// Installs `binary` at `target` (0755, temp file, fsync, rename, directory
/// fsync) unless it holds the same bytes; true when it wrote.
pub(super) fn install_versioned(binary: &Path, target: &Path) -> Result<bool, SetupError> {
    let copy_err = |source| SetupError::Copy {
        from: binary.to_owned(),
        to: target.to_owned(),
        source,
    };
    let new = file_sha256(binary).map_err(copy_err)?;
    if target.is_file() && file_sha256(target).map_err(copy_err)? == new {
        return Ok(false);
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(copy_err)?;
    }
    let mut out = AtomicFile::create(target, 0o755)?;
    let mut input = std::fs::File::open(binary).map_err(copy_err)?;
    let mut buf = vec![0u8; 128 * 1024];
    loop {
        let n = input.read(&mut buf).map_err(copy_err)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
    }
    out.commit()?;
    Ok(true)
}

pub(super) fn file_sha256(path: &Path) -> std::io::Result<[u8; 32]> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 128 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finalize().into());
        }
        h.update(&buf[..n]);
    }
}

/// Checks `config` (≤ 64 KiB, one JSON object) and installs it as the
/// agent config, root:fleet-agent 0640.
pub(super) fn install_config(config: &Path, layout: &Layout) -> Result<(), SetupError> {
    let bad = |why: String| SetupError::Config {
        path: config.to_owned(),
        why,
    };
    let bytes = durable::read_bounded(config, MAX_CONFIG_BYTES).map_err(|e| bad(e.to_string()))?;
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(_)) => {}
        Ok(_) => return Err(bad("not a JSON object".to_owned())),
        Err(e) => return Err(bad(format!("not JSON: {e}"))),
    }
    let target = layout.agent_config();
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| bad(e.to_string()))?;
    }
    durable::write_atomic(&target, &bytes, 0o640)?;
    if let Some(gid) = lookup_group(layout, AGENT_GROUP) {
        rustix::fs::chown(
            &target,
            Some(rustix::fs::Uid::ROOT),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(|e| bad(format!("cannot give it group {AGENT_GROUP}: {e}")))?;
    }
    Ok(())
}

/// Largest enrollment token file read.
const MAX_TOKEN_BYTES: u64 = 4096;

/// Checks `token` (one line, ≤ 4 KiB) and installs it as the fleet's
/// enrollment token ([`Layout::enrollment_token`]), root:fleet-agent 0640.
pub(super) fn install_enrollment_token(token: &Path, layout: &Layout) -> Result<(), SetupError> {
    let bad = |why: String| SetupError::EnrollmentToken {
        path: token.to_owned(),
        why,
    };
    let bytes = durable::read_bounded(token, MAX_TOKEN_BYTES).map_err(|e| bad(e.to_string()))?;
    let text = std::str::from_utf8(&bytes).map_err(|_| bad("not UTF-8".to_owned()))?;
    let line = text.trim_end_matches(['\n', '\r']);
    if line.is_empty() || line.contains(['\n', '\r', '\0']) {
        return Err(bad(
            "must hold the enrollment token on one line, nothing else".to_owned(),
        ));
    }
    let target = layout.enrollment_token();
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| bad(e.to_string()))?;
    }
    durable::write_atomic(&target, format!("{line}\n").as_bytes(), 0o640)?;
    if let Some(gid) = lookup_group(layout, AGENT_GROUP) {
        rustix::fs::chown(
            &target,
            Some(rustix::fs::Uid::ROOT),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(|e| bad(format!("cannot give it group {AGENT_GROUP}: {e}")))?;
    }
    Ok(())
}

/// Step 8: the link to `target` when absent or dangling; a link to an
/// existing file is kept.
pub(super) fn ensure_link(layout: &Layout, target: &Path) -> Result<String, SetupError> {
    let link = layout.active_agent_link();
    match std::fs::symlink_metadata(&link) {
        Ok(m) if m.file_type().is_symlink() => {
            if link.exists() {
                let current = std::fs::read_link(&link).unwrap_or_default();
                return Ok(format!(
                    "active agent kept: {} -> {}",
                    link.display(),
                    current.display()
                ));
            }
        }
        Ok(_) => return Err(SetupError::NotALink { path: link }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = link.parent() {
                std::fs::create_dir_all(parent).map_err(|source| SetupError::Copy {
                    from: target.to_owned(),
                    to: link.clone(),
                    source,
                })?;
            }
        }
        Err(source) => {
            return Err(SetupError::Copy {
                from: target.to_owned(),
                to: link,
                source,
            })
        }
    }
    durable::switch_symlink(&link, target)?;
    Ok(format!(
        "active agent: {} -> {}",
        link.display(),
        target.display()
    ))
}
