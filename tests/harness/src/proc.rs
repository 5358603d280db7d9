//! Child processes owned by a test: spawned in their own process group, their
//! stdout and stderr captured line by line on two threads into one shared log
//! (a `Condvar` wakes waiters on every line), and the whole group SIGKILLed
//! and reaped on drop, so a panicking test leaves nothing running.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{kill_process, kill_process_group, Pid, Signal};

/// How often [`ChildGuard::wait_exit`] checks whether the child has exited.
const EXIT_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How long a reaped child's output may take to reach EOF (see `wait_exit`).
const OUTPUT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
struct Log {
    lines: Vec<String>,
    /// Output pipes still open (2 at spawn); 0 means no line can come.
    open_pipes: u8,
}

#[derive(Debug, Default)]
struct Shared {
    log: Mutex<Log>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Log> {
        // A reader thread never panics while holding the lock; recover anyway.
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A child process killed (SIGKILL to its process group) and reaped on drop.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Child,
    shared: Arc<Shared>,
    exit: Option<ExitStatus>,
}

impl ChildGuard {
    /// Spawns `cmd` in its own process group, stdin closed, stdout and stderr
    /// captured. `name` labels the reader threads and panic messages.
    pub fn spawn(mut cmd: Command, name: &str) -> ChildGuard {
        cmd.process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: cannot spawn {cmd:?}: {e}"));
        let shared = Arc::new(Shared::default());
        shared.lock().open_pipes = 2;
        let stdout = child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>);
        let stderr = child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>);
        for (stream, pipe) in [("out", stdout), ("err", stderr)] {
            let Some(pipe) = pipe else { continue };
            let shared = Arc::clone(&shared);
            // Detached: the thread ends at EOF, which the group kill brings.
            thread::Builder::new()
                .name(format!("harness-{name}-{stream}"))
                .spawn(move || read_lines(pipe, &shared))
                .unwrap_or_else(|e| panic!("{name}: cannot spawn a reader thread: {e}"));
        }
        ChildGuard {
            name: name.to_owned(),
            child,
            shared,
            exit: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits for the first line of the log containing `needle` and returns
    /// it. Panics with the log on timeout or when the child closes its
    /// output first.
    pub fn wait_for_line(&self, needle: &str, timeout: Duration) -> String {
        self.wait_for_line_after(0, needle, timeout)
    }

    /// Like [`wait_for_line`](Self::wait_for_line), but looks only at lines
    /// from index `from` on (take it from [`line_count`](Self::line_count)
    /// before the action whose line you expect).
    pub fn wait_for_line_after(&self, from: usize, needle: &str, timeout: Duration) -> String {
        match self.wait_line(from, needle, timeout) {
            Ok(line) => line,
            Err(why) => panic!("{}: {why}; log:\n{}", self.name, self.log()),
        }
    }

    /// Like [`wait_for_line_after`](Self::wait_for_line_after), but `None`
    /// instead of a panic.
    pub fn try_wait_for_line(
        &self,
        from: usize,
        needle: &str,
        timeout: Duration,
    ) -> Option<String> {
        self.wait_line(from, needle, timeout).ok()
    }

    fn wait_line(&self, from: usize, needle: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        let mut log = self.shared.lock();
        loop {
            if let Some(line) = log.lines.iter().skip(from).find(|l| l.contains(needle)) {
                return Ok(line.clone());
            }
            if log.open_pipes == 0 {
                return Err(format!("output closed before a line containing {needle:?}"));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("no line containing {needle:?} within {timeout:?}"));
            }
            log = self
                .shared
                .changed
                .wait_timeout(log, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Everything captured so far, stdout and stderr interleaved as read.
    pub fn log(&self) -> String {
        self.shared.lock().lines.join("\n")
    }

    /// The lines captured so far.
    pub fn lines(&self) -> Vec<String> {
        self.shared.lock().lines.clone()
    }

    /// How many lines have been captured so far.
    pub fn line_count(&self) -> usize {
        self.shared.lock().lines.len()
    }

    /// The exit status, if the child has exited (reaps it).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            match self.child.try_wait() {
                Ok(status) => self.exit = status,
                Err(e) => panic!("{}: wait failed: {e}", self.name),
            }
        }
        self.exit
    }

    /// Waits for the child to exit; panics with the log on timeout.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                // The readers may not have read the last lines yet (a
                // loaded machine): wait for both pipes' EOF, bounded, as a
                // process the child left behind may hold them open.
                self.wait_output_closed(OUTPUT_DRAIN_TIMEOUT);
                return status;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{}: still running after {timeout:?}; log:\n{}",
                    self.name,
                    self.log()
                );
            }
            thread::sleep(EXIT_POLL_INTERVAL);
        }
    }

    /// Waits until both output pipes reached EOF, or `timeout`.
    fn wait_output_closed(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut log = self.shared.lock();
        while log.open_pipes > 0 {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            log = self
                .shared
                .changed
                .wait_timeout(log, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sends `sig` to the child (not its group); a no-op once reaped.
    pub fn signal(&self, sig: Signal) {
        if self.exit.is_some() {
            return;
        }
        if let Err(e) = kill_process(self.rustix_pid(), sig) {
            panic!("{}: cannot send {sig:?}: {e}", self.name);
        }
    }

    /// SIGKILLs the whole process group and reaps the child. Idempotent.
    pub fn kill(&mut self) {
        if self.exit.is_some() {
            return;
        }
        // The group outlives a zombie leader, so this also reaches children
        // of a leader that already exited but is not reaped yet. ESRCH (the
        // group is gone) is fine.
        let _ = kill_process_group(self.rustix_pid(), Signal::KILL);
        match self.child.wait() {
            Ok(status) => self.exit = Some(status),
            Err(e) => panic!("{}: cannot reap after SIGKILL: {e}", self.name),
        }
    }

    fn rustix_pid(&self) -> Pid {
        Pid::from_child(&self.child)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = kill_process_group(self.rustix_pid(), Signal::KILL);
            let _ = self.child.wait();
        }
    }
}

fn read_lines(pipe: Box<dyn Read + Send>, shared: &Shared) {
    let mut reader = BufReader::new(pipe);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end_matches(['\n', '\r']).to_owned();
                shared.lock().lines.push(line);
                shared.changed.notify_all();
            }
        }
    }
    shared.lock().open_pipes -= 1;
    shared.changed.notify_all();
}
