//! The agent's persisted change freeze, as the updater sees it: an upgrade
//! is refused while the device is frozen. A freeze file that cannot be read
//! or understood counts as frozen — refusing an upgrade is always safe.

use fleet_common::contracts::{ConfigState, FreezeFile};
use fleet_common::durable::read_bounded;
use fleet_common::Layout;

/// A freeze file larger than this was not written by the agent.
const MAX_FREEZE_FILE_BYTES: u64 = 64 * 1024;

/// `Err` with the reason when upgrades must wait.
pub fn check(layout: &Layout) -> Result<(), String> {
    let path = layout.freeze_state();
    let bytes = match read_bounded(&path, MAX_FREEZE_FILE_BYTES) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => {
            return Err(format!(
                "the freeze state cannot be read ({e}); treating the device as frozen: fix the file's permissions or let the agent rewrite it (freeze, then unfreeze)"
            ))
        }
    };
    let file: FreezeFile = serde_json::from_slice(&bytes).map_err(|e| {
        format!(
            "the freeze state {} is corrupt ({e}); treating the device as frozen: let the agent rewrite it (freeze, then unfreeze)",
            path.display()
        )
    })?;
    if file.format != FreezeFile::FORMAT {
        return Err(format!(
            "the freeze state {} has format {}, which this updater does not know; treating the device as frozen",
            path.display(),
            file.format
        ));
    }
    match file.config_state {
        ConfigState::Configured => Ok(()),
        ConfigState::Changefreeze(f) => {
            let reason = f.reason.map(|r| format!(" ({r})")).unwrap_or_default();
            Err(format!(
                "the device is in a change freeze since {}{reason}, asked by uid {}; the upgrade waits until whoever froze it unfreezes it",
                f.since, f.caller_uid
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_common::contracts::Freeze;
    use fleet_common::validate::BoundedText;
    use fleet_common::Timestamp;

    fn write(layout: &Layout, text: &str) {
        std::fs::create_dir_all(layout.agent_state_dir()).expect("mkdir");
        std::fs::write(layout.freeze_state(), text).expect("write");
    }

    #[test]
    fn frozen_configured_missing_and_corrupt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::with_root(dir.path());
        assert_eq!(check(&layout), Ok(()));
        let frozen = FreezeFile {
            format: FreezeFile::FORMAT,
            config_state: ConfigState::Changefreeze(Freeze {
                since: Timestamp::from_unix_millis(0),
                reason: Some(BoundedText::truncate("vehicle in motion")),
                caller_uid: 1000,
            }),
            written_at: Timestamp::from_unix_millis(0),
        };
        write(&layout, &serde_json::to_string(&frozen).expect("json"));
        assert_eq!(
            check(&layout),
            Err("the device is in a change freeze since 1970-01-01T00:00:00.000Z (vehicle in motion), asked by uid 1000; the upgrade waits until whoever froze it unfreezes it".to_owned())
        );
        let thawed = FreezeFile {
            config_state: ConfigState::Configured,
            ..frozen
        };
        write(&layout, &serde_json::to_string(&thawed).expect("json"));
        assert_eq!(check(&layout), Ok(()));
        write(&layout, "{\"format\":1");
        let e = check(&layout).expect_err("corrupt");
        assert!(
            e.contains("is corrupt") && e.contains("treating the device as frozen"),
            "{e}"
        );
        write(
            &layout,
            &serde_json::to_string(&thawed)
                .expect("json")
                .replace("\"format\":1", "\"format\":7"),
        );
        let e = check(&layout).expect_err("unknown format");
        assert!(e.contains("has format 7"), "{e}");
    }
}
