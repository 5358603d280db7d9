//! Which test process owns a container or a host tmpfs (pid and start
//! time), so leftovers of a process that is gone can be removed.

/// Label naming the test process that owns a container: `<pid>:<start time>`.
pub(super) const OWNER_LABEL: &str = "fleet-test.owner";

/// This process as `<pid>:<start time in clock ticks since boot>` (a pid
/// alone may be reused).
pub(super) fn owner_id() -> String {
    let pid = std::process::id();
    format!("{pid}:{}", start_time(pid).unwrap_or_default())
}

pub(super) fn owner_alive(owner: &str) -> bool {
    let Some((pid, start)) = owner.split_once(':') else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    start_time(pid).is_some_and(|s| s == start)
}

/// Field 22 of /proc/<pid>/stat (after the parenthesised command name).
pub(super) fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19).map(str::to_owned)
}
