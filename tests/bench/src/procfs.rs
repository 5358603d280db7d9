//! What the kernel says about a process: resident memory (`VmRSS`, and its
//! peak `VmHWM`) from `/proc/<pid>/status`, and CPU time (its own and its
//! reaped children's) from `/proc/<pid>/stat`.

use std::time::Duration;

/// `/proc/<pid>/stat` times are in USER_HZ, which Linux fixes at 100 for
/// user space on every architecture the fleet ships (x86_64, aarch64, armv7).
const USER_HZ: u64 = 100;

/// A `kB` field of `/proc/<pid>/status`, in bytes; `None` once the process
/// is gone.
fn status_field(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status_field(&text, field)
}

fn parse_status_field(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// Resident set size now, bytes.
pub fn rss(pid: u32) -> u64 {
    status_field(pid, "VmRSS").unwrap_or_else(|| panic!("no VmRSS for pid {pid}: it exited"))
}

/// Peak resident set size over the process's life, bytes.
pub fn hwm(pid: u32) -> u64 {
    status_field(pid, "VmHWM").unwrap_or_else(|| panic!("no VmHWM for pid {pid}: it exited"))
}

/// What the resident set is made of: (anonymous, file-backed) bytes. The
/// file-backed part is the mapped binary and shared libraries, resident
/// wholesale once in the page cache (large folios), shared with every other
/// process mapping them.
pub fn rss_parts(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    (
        parse_status_field(&text, "RssAnon").unwrap_or(0),
        parse_status_field(&text, "RssFile").unwrap_or(0),
    )
}

/// `VmHWM` while the process lives, `None` after.
pub fn try_hwm(pid: u32) -> Option<u64> {
    status_field(pid, "VmHWM")
}

/// CPU time of a process: its own (user + system) and that of its waited-for
/// children (`cutime + cstime`: every podman call the agent made and reaped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTime {
    pub own: Duration,
    pub children: Duration,
}

impl CpuTime {
    pub fn since(self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            own: self.own.saturating_sub(earlier.own),
            children: self.children.saturating_sub(earlier.children),
        }
    }
}

pub fn cpu(pid: u32) -> CpuTime {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/stat: {e}: the process exited"));
    parse_stat(&text).unwrap_or_else(|| panic!("/proc/{pid}/stat unreadable: {text}"))
}

fn parse_stat(text: &str) -> Option<CpuTime> {
    // The command name may contain spaces and parentheses: fields start
    // after the last ')'. There, index 0 is field 3 (state); utime is
    // field 14, stime 15, cutime 16, cstime 17.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(1)
        .take(14)
        .map(|v| v.parse::<i64>().map(|n| n.max(0) as u64))
        .collect::<Result<_, _>>()
        .ok()?;
    let ticks = |n: u64| Duration::from_millis(n * 1000 / USER_HZ);
    Some(CpuTime {
        own: ticks(*f.get(10)? + *f.get(11)?),
        children: ticks(*f.get(12)? + *f.get(13)?),
    })
}

/// CPU time of the threads alive now, from the scheduler (nanoseconds,
/// `/proc/<pid>/task/*/schedstat`): finer than the 10 ms ticks of
/// `/proc/<pid>/stat`, but a thread that exits takes its time with it.
pub fn threads_cpu(pid: u32) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map(Duration::from_nanos)
        .sum()
}

/// Pids whose command line is exactly `argv`.
pub fn pids_with_cmdline(argv: &[&str]) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline
            .strip_suffix(&[0])
            .unwrap_or(&cmdline)
            .split(|b| *b == 0)
            .collect();
        if args.len() == argv.len() && args.iter().zip(argv).all(|(a, b)| *a == b.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

/// Pids whose executable's name is `name` (from `/proc/<pid>/comm`).
pub fn pids_named(name: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read_to_string(entry.path().join("comm")).is_ok_and(|c| c.trim() == name) {
            out.push(pid);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_stat_fields_are_read() {
        let status = "Name:\tfleet-agent\nVmHWM:\t    5120 kB\nVmRSS:\t    4400 kB\n";
        assert_eq!(parse_status_field(status, "VmRSS"), Some(4400 * 1024));
        assert_eq!(parse_status_field(status, "VmHWM"), Some(5120 * 1024));
        assert_eq!(parse_status_field(status, "VmSwap"), None);
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 20 5 20 0 4 0 1 2 3";
        let t = parse_stat(stat).expect("parsed");
        assert_eq!(t.own, Duration::from_millis(100));
        assert_eq!(t.children, Duration::from_millis(250));
    }

    #[test]
    fn processes_are_found_by_their_exact_command_line() {
        let me = std::process::id();
        // The peak read after the resident size: other tests' threads in
        // this process may grow it between two reads.
        let resident = rss(me);
        assert!(resident > 0);
        assert!(hwm(me) >= resident);
        let _ = cpu(me);
        let mut child = std::process::Command::new("sleep")
            .arg("4242.125")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let found = fleet_harness::poll_until("sleep 4242.125", Duration::from_secs(5), || {
            let p = pids_with_cmdline(&["sleep", "4242.125"]);
            (!p.is_empty()).then_some(p)
        });
        assert_eq!(found, vec![pid]);
        assert!(pids_with_cmdline(&["sleep"]).iter().all(|p| *p != pid));
        assert!(pids_named("sleep").contains(&pid));
        let _ = child.kill();
        let _ = child.wait();
    }
}
