//! Child processes with a bound on everything: run time, captured output,
//! and the whole process group killed on timeout.
//!
//! Steps of [`run_bounded`]: spawn the child in its own process group with
//! stdin closed; read stdout and stderr on their own threads (so a chatty
//! child cannot deadlock on a full pipe), keeping at most `max_output` bytes
//! of each; wait on a third thread; on timeout, SIGKILL the group and reap.

use std::fmt;
use std::io::{self, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// After the child exits or is killed, how long to wait for its output pipes
/// to close (a daemonized grandchild may hold them open).
const PIPE_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long to wait for the kernel to reap a killed child.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// What a finished child left.
#[derive(Debug, Clone)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The last line of stderr (or stdout), for an error message.
    pub fn diagnostic(&self) -> String {
        let pick = |b: &[u8]| {
            String::from_utf8_lossy(b)
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(|l| l.trim().to_owned())
        };
        pick(&self.stderr)
            .or_else(|| pick(&self.stdout))
            .unwrap_or_else(|| format!("{} with no output", describe_status(self.status)))
    }
}

/// "exit code 3", "killed by signal 9".
pub fn describe_status(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "unknown exit".to_owned(),
    }
}

/// A child that could not be run to completion.
#[derive(Debug)]
pub enum ProcessError {
    Spawn {
        program: String,
        source: io::Error,
    },
    Timeout {
        program: String,
        after: Duration,
        stderr: Vec<u8>,
    },
    Wait {
        program: String,
        source: io::Error,
    },
}

impl fmt::Display for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Spawn { program, source } => {
                write!(
                    f,
                    "starting {program}: {source}: check it is installed and executable"
                )
            }
            Self::Timeout {
                program,
                after,
                stderr,
            } => {
                write!(
                    f,
                    "{program} did not finish within {} s and was killed",
                    after.as_secs()
                )?;
                let tail = String::from_utf8_lossy(stderr);
                match tail.lines().rev().find(|l| !l.trim().is_empty()) {
                    Some(l) => write!(f, "; its last words: {}", l.trim()),
                    None => Ok(()),
                }
            }
            Self::Wait { program, source } => write!(f, "waiting for {program}: {source}"),
        }
    }
}

impl std::error::Error for ProcessError {}

fn program_of(cmd: &Command) -> String {
    cmd.get_program().to_string_lossy().into_owned()
}

/// Reads up to `max` bytes, then discards the rest until EOF.
fn read_capped(mut r: impl Read, max: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match r.read(&mut chunk) {
            Ok(0) => return kept,
            Ok(n) => {
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&chunk[..n.min(room)]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return kept,
        }
    }
}

fn spawn_reader(
    name: &str,
    pipe: Option<impl Read + Send + 'static>,
    max: usize,
) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(p) = pipe {
        let spawned = thread::Builder::new().name(name.to_owned()).spawn(move || {
            let _ = tx.send(read_capped(p, max));
        });
        if spawned.is_err() {
            // The receiver sees a closed channel and reports no output.
        }
    }
    rx
}

/// Runs `cmd` to completion within `timeout`, capturing at most `max_output`
/// bytes of each of stdout and stderr. The child runs in its own process
/// group, which is killed whole on timeout.
pub fn run_bounded(
    cmd: &mut Command,
    timeout: Duration,
    max_output: usize,
) -> Result<Output, ProcessError> {
    use std::os::unix::process::CommandExt;
    let program = program_of(cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().map_err(|source| ProcessError::Spawn {
        program: program.clone(),
        source,
    })?;
    let out_rx = spawn_reader("child-stdout", child.stdout.take(), max_output);
    let err_rx = spawn_reader("child-stderr", child.stderr.take(), max_output);
    let pid = child.id();
    let waited = wait_with_timeout(child, timeout);
    let status = match waited {
        Ok(Some(status)) => status,
        Ok(None) => {
            kill_group(pid);
            let stderr = err_rx.recv_timeout(PIPE_DRAIN_TIMEOUT).unwrap_or_default();
            return Err(ProcessError::Timeout {
                program,
                after: timeout,
                stderr,
            });
        }
        Err(source) => return Err(ProcessError::Wait { program, source }),
    };
    let stdout = out_rx.recv_timeout(PIPE_DRAIN_TIMEOUT).unwrap_or_default();
    let stderr = err_rx.recv_timeout(PIPE_DRAIN_TIMEOUT).unwrap_or_default();
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// Waits for `child` on a helper thread; `Ok(None)` on timeout, after which
/// the helper thread reaps the child once it is killed.
fn wait_with_timeout(mut child: Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name("child-wait".to_owned())
        .spawn(move || {
            let _ = tx.send(child.wait());
        })?;
    match rx.recv_timeout(timeout) {
        Ok(r) => r.map(Some),
        Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err(io::Error::other("the wait thread ended without a status"))
        }
    }
}

/// SIGKILLs the process group led by `pid` (the child started with
/// `process_group(0)`).
pub fn kill_group(pid: u32) {
    if let Some(p) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
    }
}

/// Sends `signal` to one process.
pub fn signal(pid: u32, signal: rustix::process::Signal) -> io::Result<()> {
    let p = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| io::Error::other("invalid pid"))?;
    rustix::process::kill_process(p, signal).map_err(io::Error::from)
}

/// Waits up to [`REAP_TIMEOUT`] for a killed child to be reaped.
pub fn reap_after_kill(child: Child) -> io::Result<Option<ExitStatus>> {
    wait_with_timeout(child, REAP_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_output_and_status() {
        let out = run_bounded(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
            1024,
        )
        .expect("runs");
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.diagnostic(), "err");
    }

    #[test]
    fn caps_output() {
        let out = run_bounded(
            Command::new("sh").args(["-c", "yes | head -c 100000"]),
            Duration::from_secs(10),
            100,
        )
        .expect("runs");
        assert_eq!(out.stdout.len(), 100);
    }

    #[test]
    fn kills_the_whole_group_on_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("grandchild-alive");
        // The grandchild would write the marker after the timeout if it survived.
        let script = format!(
            "(sleep 2; touch {}) & echo started >&2; sleep 30",
            marker.display()
        );
        let e = run_bounded(
            Command::new("sh").args(["-c", &script]),
            Duration::from_millis(300),
            1024,
        )
        .expect_err("times out");
        assert!(
            e.to_string().starts_with(
                "sh did not finish within 0 s and was killed; its last words: started"
            ),
            "{e}"
        );
        // Poll past the grandchild's deadline: the marker must never appear.
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < deadline {
            assert!(!marker.exists(), "the grandchild survived the group kill");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    #[test]
    fn spawn_failure_names_the_program() {
        let e = run_bounded(
            &mut Command::new("/nonexistent/tool"),
            Duration::from_secs(1),
            10,
        )
        .expect_err("no such program");
        assert!(e.to_string().starts_with("starting /nonexistent/tool:"));
    }
}
