//! ChildGuard and the small helpers: output is captured and waited on, the
//! whole process group dies with the guard, and missing tools and binaries
//! panic with instructions.

use std::process::Command;
use std::time::{Duration, Instant};

use fleet_harness::{bin_path, poll_until, require_tool, workspace_root, ChildGuard};
use rustix::process::{test_kill_process, Pid, Signal};

const WAIT: Duration = Duration::from_secs(10);

fn sh(script: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script]);
    cmd
}

/// Running, and not a zombie waiting to be reaped.
fn alive(pid: i32) -> bool {
    let raw = Pid::from_raw(pid).expect("positive pid");
    test_kill_process(raw).is_ok() && !is_zombie(pid)
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[test]
fn lines_from_stdout_and_stderr_are_captured_and_waited_for() {
    let mut child = ChildGuard::spawn(
        sh("echo one; echo two >&2; sleep 0.2; echo 'ready on port 42'; exec sleep 600"),
        "talker",
    );
    let line = child.wait_for_line("ready on", WAIT);
    assert_eq!(line, "ready on port 42");
    let log = child.log();
    assert!(log.contains("one") && log.contains("two"), "{log}");
    assert_eq!(child.line_count(), 3);
    assert!(child
        .try_wait_for_line(3, "never", Duration::from_millis(50))
        .is_none());
    assert!(child.try_wait().is_none(), "still running");
    child.signal(Signal::TERM);
    let status = child.wait_exit(WAIT);
    assert!(!status.success());
}

#[test]
fn waiting_for_a_line_panics_with_the_log_when_the_child_exits() {
    let child = ChildGuard::spawn(sh("echo bye; exit 3"), "quitter");
    let started = Instant::now();
    let err = std::panic::catch_unwind(|| child.wait_for_line("never printed", WAIT))
        .expect_err("panics");
    let msg = err.downcast_ref::<String>().expect("message");
    assert!(msg.contains("quitter") && msg.contains("bye"), "{msg}");
    assert!(started.elapsed() < WAIT, "did not wait out the timeout");
}

#[test]
fn drop_kills_the_whole_process_group() {
    let child = ChildGuard::spawn(sh("sleep 600 & echo grandchild $!; wait"), "parent");
    let line = child.wait_for_line("grandchild", WAIT);
    let grandchild: i32 = line
        .rsplit(' ')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("pid");
    assert!(alive(grandchild));
    let pid = child.pid() as i32;
    drop(child);
    assert!(!alive(pid), "the child is reaped");
    poll_until("the grandchild is gone", WAIT, || {
        (!alive(grandchild)).then_some(())
    });
}

#[test]
fn kill_reaps_and_is_idempotent() {
    let mut child = ChildGuard::spawn(sh("exec sleep 600"), "sleeper");
    child.kill();
    let status = child.try_wait().expect("reaped");
    assert!(!status.success());
    child.kill();
    child.signal(Signal::TERM); // a no-op once reaped
}

#[test]
fn poll_until_returns_the_value_or_panics_naming_what() {
    let mut n = 0;
    let got = poll_until("three calls", WAIT, || {
        n += 1;
        (n == 3).then_some(n * 10)
    });
    assert_eq!(got, 30);
    let err = std::panic::catch_unwind(|| {
        poll_until::<()>("the impossible", Duration::from_millis(60), || None)
    })
    .expect_err("panics");
    let msg = err.downcast_ref::<String>().expect("message");
    assert!(msg.contains("the impossible"), "{msg}");
}

#[test]
fn missing_tools_and_binaries_panic_with_instructions() {
    assert!(require_tool("sh", "dash").is_absolute());
    assert_eq!(
        require_tool("/bin/busybox", "busybox-static"),
        std::path::PathBuf::from("/bin/busybox")
    );
    let err = std::panic::catch_unwind(|| require_tool("no-such-tool-xyz", "pkg-xyz"))
        .expect_err("panics");
    let msg = err.downcast_ref::<String>().expect("message");
    assert_eq!(
        msg,
        "missing no-such-tool-xyz: install the Debian package pkg-xyz (make deps)"
    );
    let err = std::panic::catch_unwind(|| bin_path("no-such-binary-xyz")).expect_err("panics");
    let msg = err.downcast_ref::<String>().expect("message");
    assert!(
        msg.contains("run `make build` (cargo build --workspace --bins)"),
        "{msg}"
    );
    assert!(workspace_root().join("Cargo.toml").is_file());
    assert!(workspace_root().join("tests/harness").is_dir());
}
