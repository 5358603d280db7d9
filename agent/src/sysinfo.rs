//! What the device is: architecture, OS, kernel, boot id — read from the
//! running system (not the layout root: these describe the machine).

use std::fs;

use fleet_common::contracts::{ConfigStateReport, DeviceInfo};
use fleet_common::validate::{Arch, BoundedText, DeviceId, Version};
use fleet_common::Timestamp;

/// `PRETTY_NAME` of os-release, or "Linux".
pub fn os_pretty_name() -> String {
    for path in ["/etc/os-release", "/usr/lib/os-release"] {
        if let Ok(text) = fs::read_to_string(path) {
            if let Some(v) = pretty_name(&text) {
                return v;
            }
        }
    }
    "Linux".to_owned()
}

fn pretty_name(os_release: &str) -> Option<String> {
    os_release.lines().find_map(|l| {
        let v = l.strip_prefix("PRETTY_NAME=")?;
        Some(v.trim().trim_matches('"').trim_matches('\'').to_owned())
    })
}

/// The kernel release (`uname -r`).
pub fn kernel() -> String {
    rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned()
}

/// The boot id, or "unknown" outside Linux's procfs.
pub fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The device information published at `<device>.info`.
pub fn device_info(
    device: &DeviceId,
    agent_version: &Version,
    arch: Arch,
    podman_version: Option<&str>,
    config_state: ConfigStateReport,
    started_at: Timestamp,
) -> DeviceInfo {
    DeviceInfo {
        device_id: device.clone(),
        agent_version: agent_version.clone(),
        arch,
        os: BoundedText::truncate(os_pretty_name()),
        kernel: BoundedText::truncate(kernel()),
        podman_version: podman_version.map(BoundedText::truncate),
        boot_id: BoundedText::truncate(boot_id()),
        config_state,
        agent_started_at: started_at,
        updated_at: Timestamp::now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretty_name_is_unquoted() {
        assert_eq!(
            pretty_name("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n")
                .as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(pretty_name("NAME=x\n"), None);
        assert!(!kernel().is_empty());
        assert_eq!(boot_id().len(), 36, "a UUID");
    }
}
