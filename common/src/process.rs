//! Child processes with a bound on everything: run time, captured output,
//! and the whole process group killed on timeout.
//!
//! Steps of [`run_bounded`]: spawn the child in its own process group with
//! stdin closed; read stdout and stderr on their own threads (so a chatty
//! child cannot deadlock on a full pipe), keeping at most `max_output` bytes
//! of each (the first of stdout, the last of stderr, where a failing tool
//! says why) and counting what was cut; wait on a third thread; on
//! timeout, SIGKILL the group and reap. Once the child has exited, its
//! pipes get `PIPE_DRAIN_TIMEOUT` to close; a daemonized grandchild that
//! holds them open costs that wait, never what the child wrote.
//!
//! Every group started and not yet reaped is registered, so that a daemon
//! stopping with a child still hung kills it ([`kill_live_groups`]) instead
//! of leaving it behind. Text from a child reaches a log line or a report
//! only through [`bounded_text`]: escaped, cut, and saying how much was cut.

use std::fmt;
use std::io::{self, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

/// Bytes of a child's stderr (or stdout) line kept in an error message. An
/// error message is logged whole and reported as free text of at most
/// [`crate::limits::MAX_TEXT_CHARS`]: this leaves room for what the message
/// says around it, and an escaped character may take up to 10 bytes.
pub const MAX_DIAGNOSTIC_BYTES: usize = 640;
/// Bytes of outside text (a child's output, a parser's complaint quoting
/// it) in one log line: a few KiB, so a flood of garbage cannot fill the
/// journal.
pub const MAX_LOG_TEXT_BYTES: usize = 4 * 1024;

/// After the child exits or is killed, how long to wait for its output pipes
/// to close (a daemonized grandchild may hold them open).
const PIPE_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long to wait for the kernel to reap a killed child.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// What a finished child left.
#[derive(Debug, Clone)]
pub struct Output {
    pub status: ExitStatus,
    /// The first bytes of stdout, at most the bound given.
    pub stdout: Vec<u8>,
    /// The last bytes of stderr, at most the bound given.
    pub stderr: Vec<u8>,
    /// Bytes of stdout read and not kept (after the first).
    pub stdout_cut: u64,
    /// Bytes of stderr read and not kept (before the last).
    pub stderr_cut: u64,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The last line of stderr (or stdout), for an error message: escaped
    /// and at most [`MAX_DIAGNOSTIC_BYTES`], saying what was cut.
    pub fn diagnostic(&self) -> String {
        last_line(&self.stderr)
            .or_else(|| last_line(&self.stdout))
            .map(|l| bounded_text(l, MAX_DIAGNOSTIC_BYTES))
            .unwrap_or_else(|| format!("{} with no output", describe_status(self.status)))
    }
}

/// The last line of `b` that is not blank, trimmed.
fn last_line(b: &[u8]) -> Option<&[u8]> {
    b.split(|&c| c == b'\n')
        .rev()
        .map(|l| l.trim_ascii())
        .find(|l| !l.is_empty())
}

/// Outside bytes as text safe for a log line or a report: invalid UTF-8
/// replaced, control characters escaped (`\u{1b}`, `\n`), at most `max`
/// bytes, and a cut marked with how many bytes of the input were left out.
pub fn bounded_text(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::new();
    let mut used = 0usize;
    for (at, c) in text.char_indices() {
        let piece: String = if c.is_control() {
            c.escape_default().collect()
        } else {
            c.to_string()
        };
        if out.len() + piece.len() > max {
            let left = text.len() - at;
            // The marker counts input bytes (not escaped ones).
            out.push_str(&format!("… [{left} more bytes cut]"));
            return out;
        }
        out.push_str(&piece);
        used = at + c.len_utf8();
    }
    debug_assert_eq!(used, text.len());
    out
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
                match last_line(stderr) {
                    Some(l) => write!(
                        f,
                        "; its last words: {}",
                        bounded_text(l, MAX_DIAGNOSTIC_BYTES)
                    ),
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

/// Which part of a stream is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// The first bytes (output to parse: a cut one is refused whole).
    Head,
    /// The last bytes (a diagnostic: the cause is at the end).
    Tail,
}

/// What a reader thread has taken from one stream so far.
#[derive(Default)]
struct Captured {
    kept: Vec<u8>,
    cut: u64,
}

/// Locks a capture; a reader that panicked left plain bytes: still usable.
fn lock(c: &Mutex<Captured>) -> std::sync::MutexGuard<'_, Captured> {
    c.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reads until EOF into `into`, keeping at most `max` bytes as `keep` says
/// and counting the bytes left out. The buffer never exceeds twice `max`,
/// whatever the stream's size. What was read is in `into` at every moment,
/// so a stream that never reaches EOF (a daemonized grandchild holds the
/// pipe) still yields what its child wrote.
fn read_capped(mut r: impl Read, max: usize, keep: Keep, into: &Mutex<Captured>) {
    let mut chunk = [0u8; 8192];
    loop {
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                let mut c = lock(into);
                match keep {
                    Keep::Head => {
                        let room = max.saturating_sub(c.kept.len());
                        let take = n.min(room);
                        c.kept.extend_from_slice(&chunk[..take]);
                        c.cut += (n - take) as u64;
                    }
                    Keep::Tail => {
                        c.kept.extend_from_slice(&chunk[..n]);
                        // Dropped in steps of at least `max`: amortized cost.
                        if c.kept.len() > max.saturating_mul(2).max(chunk.len()) {
                            let drop = c.kept.len() - max;
                            c.kept.drain(..drop);
                            c.cut += drop as u64;
                        }
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
}

/// One output stream of a child, read on its own thread.
struct Reader {
    captured: Arc<Mutex<Captured>>,
    done: mpsc::Receiver<()>,
    max: usize,
}

impl Reader {
    fn spawn(name: &str, pipe: Option<impl Read + Send + 'static>, max: usize, keep: Keep) -> Self {
        let captured = Arc::new(Mutex::new(Captured::default()));
        let (tx, done) = mpsc::channel();
        if let Some(p) = pipe {
            let into = Arc::clone(&captured);
            // A thread that cannot be spawned leaves the capture empty: the
            // child's output is then reported as empty, never invented.
            let _ = thread::Builder::new().name(name.to_owned()).spawn(move || {
                read_capped(p, max, keep, &into);
                let _ = tx.send(());
            });
        }
        Self {
            captured,
            done,
            max,
        }
    }

    /// Waits up to `timeout` for EOF, then returns what was read (all of it
    /// at EOF; what the child wrote before a grandchild kept the pipe open
    /// otherwise) and the count of bytes left out.
    fn finish(self, timeout: Duration) -> (Vec<u8>, u64) {
        let _ = self.done.recv_timeout(timeout);
        let mut c = lock(&self.captured);
        let mut kept = std::mem::take(&mut c.kept);
        let mut cut = c.cut;
        if kept.len() > self.max {
            let drop = kept.len() - self.max;
            kept.drain(..drop);
            cut += drop as u64;
        }
        kept.shrink_to_fit();
        (kept, cut)
    }
}

/// Process groups started by [`run_bounded`] and not yet reaped.
static LIVE_GROUPS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn live_groups() -> std::sync::MutexGuard<'static, Vec<u32>> {
    // A panic while holding the lock leaves a plain Vec: still usable.
    LIVE_GROUPS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registered from spawn until reaped or killed.
struct LiveGroup(u32);

impl LiveGroup {
    fn register(pid: u32) -> Self {
        live_groups().push(pid);
        Self(pid)
    }
}

impl Drop for LiveGroup {
    fn drop(&mut self) {
        live_groups().retain(|p| *p != self.0);
    }
}

/// SIGKILLs the process group of every child [`run_bounded`] is still
/// waiting for (in any thread); returns how many. For a daemon about to
/// exit: a hung child must not outlive it (outside systemd nothing else
/// would stop it).
pub fn kill_live_groups() -> usize {
    let groups = live_groups().clone();
    for pid in &groups {
        kill_group(*pid);
    }
    groups.len()
}

/// Runs `cmd` to completion within `timeout`, capturing at most `max_output`
/// bytes of each of stdout and stderr. The child runs in its own process
/// group, which is killed whole on timeout.
pub fn run_bounded(
    cmd: &mut Command,
    timeout: Duration,
    max_output: usize,
) -> Result<Output, ProcessError> {
    run_bounded_split(cmd, timeout, max_output, max_output)
}

/// [`run_bounded`] with separate bounds: the first `max_stdout` bytes of
/// stdout and the last `max_stderr` bytes of stderr are kept.
pub fn run_bounded_split(
    cmd: &mut Command,
    timeout: Duration,
    max_stdout: usize,
    max_stderr: usize,
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
    let pid = child.id();
    let _live = LiveGroup::register(pid);
    let out_reader = Reader::spawn("child-stdout", child.stdout.take(), max_stdout, Keep::Head);
    let err_reader = Reader::spawn("child-stderr", child.stderr.take(), max_stderr, Keep::Tail);
    let waited = wait_with_timeout(child, timeout);
    let status = match waited {
        Ok(Some(status)) => status,
        Ok(None) => {
            kill_group(pid);
            let (stderr, _) = err_reader.finish(PIPE_DRAIN_TIMEOUT);
            return Err(ProcessError::Timeout {
                program,
                after: timeout,
                stderr,
            });
        }
        Err(source) => return Err(ProcessError::Wait { program, source }),
    };
    let (stdout, stdout_cut) = out_reader.finish(PIPE_DRAIN_TIMEOUT);
    let (stderr, stderr_cut) = err_reader.finish(PIPE_DRAIN_TIMEOUT);
    Ok(Output {
        status,
        stdout,
        stderr,
        stdout_cut,
        stderr_cut,
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

    /// Tests that run children take this: one of them kills every live group.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[test]
    fn captures_output_and_status() {
        let _serial = serial();
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
    fn output_is_kept_when_a_grandchild_holds_the_pipe_open() {
        let _serial = serial();
        // The grandchild keeps stdout and stderr open past the drain bound.
        let out = run_bounded(
            Command::new("sh").args(["-c", "echo out; echo err >&2; sleep 4 & exit 0"]),
            Duration::from_secs(10),
            1024,
        )
        .expect("runs");
        assert!(out.success());
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    fn caps_output() {
        let _serial = serial();
        let out = run_bounded(
            Command::new("sh").args(["-c", "yes | head -c 100000"]),
            Duration::from_secs(10),
            100,
        )
        .expect("runs");
        assert_eq!(out.stdout.len(), 100);
        assert_eq!(out.stdout_cut, 99_900);
    }

    #[test]
    fn keeps_the_head_of_stdout_and_the_tail_of_stderr() {
        let _serial = serial();
        let out = run_bounded_split(
            Command::new("sh").args([
                "-c",
                "head -c 100000 /dev/zero | tr '\\0' o; head -c 100000 /dev/zero | tr '\\0' e >&2; echo 'the cause' >&2; exit 1",
            ]),
            Duration::from_secs(10),
            1000,
            50,
        )
        .expect("runs");
        assert_eq!(out.stdout, vec![b'o'; 1000]);
        assert_eq!(out.stdout_cut, 99_000);
        assert_eq!(out.stderr.len(), 50);
        assert!(out.stderr.ends_with(b"the cause\n"));
        assert_eq!(out.stderr_cut, 100_010 - 50);
        // The line began before the kept tail.
        assert_eq!(out.diagnostic(), format!("{}the cause", "e".repeat(40)));
    }

    #[test]
    fn a_diagnostic_is_escaped_and_bounded_and_says_what_was_cut() {
        let _serial = serial();
        let out = run_bounded(
            Command::new("sh").args(["-c", "printf 'Error: \\033[31mred\\007\\n' >&2; exit 2"]),
            Duration::from_secs(10),
            1024,
        )
        .expect("runs");
        assert_eq!(out.diagnostic(), "Error: \\u{1b}[31mred\\u{7}");
        let out = run_bounded(
            Command::new("sh").args(["-c", "head -c 10000 /dev/zero | tr '\\0' x >&2; exit 2"]),
            Duration::from_secs(10),
            1 << 20,
        )
        .expect("runs");
        let d = out.diagnostic();
        let cut = 10_000 - MAX_DIAGNOSTIC_BYTES;
        assert_eq!(
            d,
            format!(
                "{}… [{cut} more bytes cut]",
                "x".repeat(MAX_DIAGNOSTIC_BYTES)
            )
        );
        assert_eq!(bounded_text(b"a\nb", 10), "a\\nb");
        assert_eq!(bounded_text(b"\xffok", 10), "\u{fffd}ok");
        assert_eq!(bounded_text("ééé".as_bytes(), 3), "é… [4 more bytes cut]");
    }

    #[test]
    fn kills_the_whole_group_on_timeout() {
        let _serial = serial();
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
    fn a_stopping_daemon_kills_the_children_still_running() {
        let _serial = serial();
        let waiting = thread::spawn(|| {
            run_bounded(
                Command::new("sh").args(["-c", "sleep 30 & exec sleep 31"]),
                Duration::from_secs(60),
                1024,
            )
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while live_groups().is_empty() {
            assert!(std::time::Instant::now() < deadline, "never registered");
            thread::sleep(Duration::from_millis(10));
        }
        assert!(kill_live_groups() >= 1);
        let out = waiting.join().expect("joined").expect("reaped");
        assert_eq!(describe_status(out.status), "killed by signal 9");
        assert_eq!(out.diagnostic(), "killed by signal 9 with no output");
    }

    #[test]
    fn spawn_failure_names_the_program() {
        let _serial = serial();
        let e = run_bounded(
            &mut Command::new("/nonexistent/tool"),
            Duration::from_secs(1),
            10,
        )
        .expect_err("no such program");
        assert!(e.to_string().starts_with("starting /nonexistent/tool:"));
    }
}
