//! An in-process service manager for tests and for devices without systemd
//! as PID 1. It runs the agent the way the `fleet-agent.service` unit does,
//! speaking the real sd_notify protocol:
//!
//! - a datagram socket (`NOTIFY_SOCKET`) in a private directory under the
//!   run directory; senders are checked with `SCM_CREDENTIALS` and only the
//!   agent's process group is heard (systemd's `NotifyAccess`);
//! - start: spawn the active link with `run --config <agent config>` as the
//!   probe user, in its own process group, killed if the updater dies;
//!   wait for `READY=1` within the start bound; exiting before it, or not
//!   sending it in time (the group is then killed), is a start failure;
//! - stop: SIGTERM to the main process, wait for it within the stop bound,
//!   then SIGKILL the whole group (`KillMode=mixed`);
//! - `MAINPID=` and `STATUS=` are recorded; each start gets a random
//!   invocation id.
//!
//! The children are spawned from the supervisor's own long-lived thread,
//! because the parent-death signal fires when the forking thread exits.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_common::process::{describe_status, kill_group, reap_after_kill, signal};
use fleet_common::Layout;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

use super::{ServiceError, ServiceManager};
use crate::runas::RunAs;

/// How often the supervisor thread looks at its child and the notify
/// socket when it has no request: the reaction time to a crashed agent.
const IDLE_POLL: Duration = Duration::from_millis(200);
/// Longest single wait on the notify socket while starting, so a child that
/// exits before `READY=1` is noticed quickly.
const NOTIFY_POLL: Duration = Duration::from_millis(50);
/// How often a stopping child is checked for exit.
const EXIT_POLL: Duration = Duration::from_millis(20);
/// A reply from the supervisor thread comes within the request's own bound;
/// this margin covers the thread finishing its current poll.
const REPLY_MARGIN: Duration = Duration::from_secs(10);
/// Largest notify datagram read (systemd reads up to its pipe size; agents
/// send a few short lines).
const MAX_NOTIFY_BYTES: usize = 4096;

/// The supervisor could not be set up.
#[derive(Debug)]
pub struct SupervisorError {
    pub step: &'static str,
    pub path: PathBuf,
    pub source: io::Error,
}

impl fmt::Display for SupervisorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "supervisor: {} {}: {}",
            self.step,
            self.path.display(),
            self.source
        )
    }
}

impl std::error::Error for SupervisorError {}

/// What the supervisor knows of the current run, readable at any time.
#[derive(Debug, Default, Clone)]
struct View {
    invocation_id: Option<String>,
    main_pid: Option<u32>,
    status: Option<String>,
}

enum Request {
    Start {
        bound: Duration,
        reply: mpsc::Sender<Result<(), String>>,
    },
    Stop {
        bound: Duration,
        reply: mpsc::Sender<Result<Duration, String>>,
    },
}

/// The handle: requests go to the `updater-supervisor` thread.
#[derive(Debug)]
pub struct Supervisor {
    unit: String,
    requests: Mutex<mpsc::Sender<Request>>,
    view: Arc<Mutex<View>>,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Start { bound, .. } => write!(f, "Start({bound:?})"),
            Self::Stop { bound, .. } => write!(f, "Stop({bound:?})"),
        }
    }
}

impl Supervisor {
    /// Binds the notify socket and starts the supervisor thread. Nothing is
    /// started until [`ServiceManager::start`] or [`ServiceManager::boot`].
    pub fn spawn(layout: &Layout, probe_user: &str, unit: &str) -> Result<Self, SupervisorError> {
        let dir = layout
            .run_dir()
            .join(format!("supervisor.{}", std::process::id()));
        let err = |step, path: &Path| {
            let path = path.to_owned();
            move |source| SupervisorError { step, path, source }
        };
        remove_stale_dirs(&layout.run_dir());
        std::fs::create_dir_all(&dir).map_err(err("creating", &dir))?;
        // Traversable by the agent's user, who must reach the socket.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .map_err(err("setting the mode of", &dir))?;
        let path = dir.join("notify");
        let notify = UnixDatagram::bind(&path).map_err(err("binding", &path))?;
        // Writable by anyone, like systemd's /run/systemd/notify: the
        // sender's credentials decide who is heard.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
            .map_err(err("setting the mode of", &path))?;
        rustix::net::sockopt::set_socket_passcred(&notify, true)
            .map_err(|e| err("enabling SO_PASSCRED on", &path)(e.into()))?;
        let view = Arc::new(Mutex::new(View::default()));
        let worker = Worker {
            link: layout.active_agent_link(),
            config: layout.agent_config(),
            probe_user: probe_user.to_owned(),
            notify,
            notify_path: path.clone(),
            child: None,
            view: Arc::clone(&view),
            unit: unit.to_owned(),
        };
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("updater-supervisor".to_owned())
            .spawn(move || worker.run(&rx))
            .map_err(err("starting the thread for", &path))?;
        Ok(Self {
            unit: unit.to_owned(),
            requests: Mutex::new(tx),
            view,
        })
    }

    fn ask<T>(
        &self,
        action: &'static str,
        bound: Duration,
        make: impl FnOnce(mpsc::Sender<Result<T, String>>) -> Request,
    ) -> Result<T, ServiceError> {
        let fail = |message: String| ServiceError {
            action,
            unit: self.unit.clone(),
            message,
        };
        let (tx, rx) = mpsc::channel();
        self.requests
            .lock()
            .map_err(|_| fail("the supervisor lock is poisoned".to_owned()))?
            .send(make(tx))
            .map_err(|_| fail("the supervisor thread is gone".to_owned()))?;
        match rx.recv_timeout(bound + REPLY_MARGIN) {
            Ok(r) => r.map_err(fail),
            Err(_) => Err(fail(format!(
                "the supervisor did not answer within {} s",
                (bound + REPLY_MARGIN).as_secs()
            ))),
        }
    }
}

impl ServiceManager for Supervisor {
    fn unit(&self) -> &str {
        &self.unit
    }

    fn stop(&self, bound: Duration) -> Result<Duration, ServiceError> {
        self.ask("stop", bound, |reply| Request::Stop { bound, reply })
    }

    fn start(&self, bound: Duration) -> Result<(), ServiceError> {
        self.ask("start", bound, |reply| Request::Start { bound, reply })
    }

    fn invocation_id(&self) -> Option<String> {
        self.view.lock().ok()?.invocation_id.clone()
    }

    fn boot(&self, bound: Duration) -> Result<(), ServiceError> {
        self.start(bound)
    }
}

/// Notify directories of earlier (crashed) supervisors of this root.
fn remove_stale_dirs(run_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(run_dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("supervisor.")
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

struct Running {
    child: Child,
    pid: u32,
}

/// The supervisor thread's state.
struct Worker {
    link: PathBuf,
    config: PathBuf,
    probe_user: String,
    notify: UnixDatagram,
    notify_path: PathBuf,
    child: Option<Running>,
    view: Arc<Mutex<View>>,
    unit: String,
}

impl Worker {
    fn run(mut self, rx: &mpsc::Receiver<Request>) {
        loop {
            match rx.recv_timeout(IDLE_POLL) {
                Ok(Request::Start { bound, reply }) => {
                    let _ = reply.send(self.start(bound));
                }
                Ok(Request::Stop { bound, reply }) => {
                    let _ = reply.send(self.stop(bound));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => self.watch(),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = self.stop(Duration::from_secs(10));
                    let _ = std::fs::remove_file(&self.notify_path);
                    if let Some(dir) = self.notify_path.parent() {
                        let _ = std::fs::remove_dir(dir);
                    }
                    return;
                }
            }
        }
    }

    fn set_view(&self, f: impl FnOnce(&mut View)) {
        if let Ok(mut v) = self.view.lock() {
            f(&mut v);
        }
    }

    /// Between requests: hear notifications, notice a crashed agent.
    fn watch(&mut self) {
        while let Some(lines) = self.receive(None) {
            self.apply(&lines);
        }
        if let Some(status) = self.exited() {
            log::warn!(
                "supervisor: {} exited with {}",
                self.unit,
                describe_status(status)
            );
            self.child = None;
            self.set_view(|v| v.main_pid = None);
        }
    }

    /// The exit status of the child, if it has exited (and is now reaped).
    fn exited(&mut self) -> Option<ExitStatus> {
        let r = self.child.as_mut()?;
        match r.child.try_wait() {
            Ok(Some(status)) => {
                // Leftovers of its group go with it (KillMode=mixed).
                kill_group(r.pid);
                Some(status)
            }
            Ok(None) => None,
            Err(e) => {
                log::warn!("supervisor: waiting for pid {}: {e}", r.pid);
                None
            }
        }
    }

    fn start(&mut self, bound: Duration) -> Result<(), String> {
        if self.child.is_some() && self.exited().is_none() {
            return Ok(());
        }
        self.child = None;
        // Stale messages of an earlier run must not count for this one.
        while self.receive(None).is_some() {}
        let run_as = RunAs::resolve(&self.probe_user).map_err(|e| e.to_string())?;
        let mut cmd = run_as.command(&self.link);
        cmd.arg("run")
            .arg("--config")
            .arg(&self.config)
            .env("NOTIFY_SOCKET", &self.notify_path)
            .stdin(Stdio::null());
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.link.display()))?;
        let pid = child.id();
        let invocation = uuid::Uuid::new_v4().simple().to_string();
        log::info!(
            "supervisor: started {} as pid {pid} ({}), invocation {invocation}",
            self.link.display(),
            run_as.describe()
        );
        self.set_view(|v| {
            *v = View {
                invocation_id: Some(invocation),
                main_pid: Some(pid),
                status: None,
            }
        });
        self.child = Some(Running { child, pid });
        let deadline = Instant::now() + bound;
        loop {
            if let Some(status) = self.exited() {
                self.child = None;
                self.set_view(|v| v.main_pid = None);
                return Err(format!(
                    "the agent exited with {} before sending READY=1",
                    describe_status(status)
                ));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let killed = self.kill();
                return Err(format!(
                    "the agent did not send READY=1 within {:.1} s; {killed}",
                    bound.as_secs_f64()
                ));
            }
            if let Some(lines) = self.receive(Some(left.min(NOTIFY_POLL))) {
                if self.apply(&lines) {
                    log::info!("supervisor: {} is ready (pid {pid})", self.unit);
                    return Ok(());
                }
            }
        }
    }

    fn stop(&mut self, bound: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        if self.child.is_none() || self.exited().is_some() {
            self.child = None;
            return Ok(Duration::ZERO);
        }
        let Some(mut r) = self.child.take() else {
            return Ok(Duration::ZERO);
        };
        let _ = signal(r.pid, rustix::process::Signal::TERM);
        let deadline = started + bound;
        let outcome = loop {
            match r.child.try_wait() {
                Ok(Some(_)) => break Ok(started.elapsed()),
                Ok(None) if Instant::now() >= deadline => {
                    kill_group(r.pid);
                    break match reap_after_kill(r.child) {
                        Ok(Some(_)) => {
                            log::warn!(
                                "supervisor: {} ignored SIGTERM for {} s and was killed",
                                self.unit,
                                bound.as_secs()
                            );
                            Ok(started.elapsed())
                        }
                        _ => Err(format!("pid {} survived SIGKILL", r.pid)),
                    };
                }
                Ok(None) => std::thread::sleep(EXIT_POLL),
                Err(e) => break Err(format!("waiting for pid {}: {e}", r.pid)),
            }
        };
        kill_group(r.pid);
        self.set_view(|v| v.main_pid = None);
        outcome
    }

    /// SIGKILLs the child's group and reaps it; says what happened.
    fn kill(&mut self) -> String {
        let Some(r) = self.child.take() else {
            return "no process was left".to_owned();
        };
        kill_group(r.pid);
        self.set_view(|v| v.main_pid = None);
        match reap_after_kill(r.child) {
            Ok(Some(_)) => "the agent was killed".to_owned(),
            _ => format!("pid {} could not be reaped", r.pid),
        }
    }

    /// Applies one notification; true when it says `READY=1`.
    fn apply(&self, lines: &[String]) -> bool {
        let mut ready = false;
        for line in lines {
            if line == "READY=1" {
                ready = true;
            } else if let Some(s) = line.strip_prefix("STATUS=") {
                let s: String = s.chars().take(256).collect();
                log::info!("supervisor: {} status: {s}", self.unit);
                self.set_view(|v| v.status = Some(s));
            } else if let Some(p) = line.strip_prefix("MAINPID=") {
                if let Ok(p) = p.parse() {
                    self.set_view(|v| v.main_pid = Some(p));
                }
            } else if line == "STOPPING=1" {
                log::info!("supervisor: {} is stopping", self.unit);
            }
        }
        ready
    }

    /// One datagram from the child's process group, waiting at most `wait`
    /// (`None`: only what is already queued). Others are dropped.
    fn receive(&self, wait: Option<Duration>) -> Option<Vec<String>> {
        let (nonblocking, timeout) = match wait {
            None => (true, None),
            Some(d) => (false, Some(d.max(Duration::from_millis(1)))),
        };
        self.notify.set_nonblocking(nonblocking).ok()?;
        self.notify.set_read_timeout(timeout).ok()?;
        let mut buf = [0u8; MAX_NOTIFY_BYTES];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmCredentials(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let (n, sender) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg =
                rustix::net::recvmsg(&self.notify, &mut iov, &mut control, RecvFlags::empty())
                    .ok()?;
            let mut sender = None;
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmCredentials(c) = m {
                    sender = Some(c.pid);
                }
            }
            (msg.bytes, sender)
        };
        let Some(child) = self.child.as_ref() else {
            // Nobody is running: a late message of an earlier run.
            return Some(Vec::new());
        };
        let from_child = sender.is_some_and(|pid| {
            u32::try_from(pid.as_raw_nonzero().get()).ok() == Some(child.pid)
                || rustix::process::getpgid(Some(pid))
                    .is_ok_and(|g| u32::try_from(g.as_raw_nonzero().get()).ok() == Some(child.pid))
        });
        if !from_child {
            log::warn!("supervisor: ignored a notification from pid {sender:?}, not the agent's");
            return Some(Vec::new());
        }
        let text = String::from_utf8_lossy(&buf[..n.min(buf.len())]).into_owned();
        Some(text.lines().map(str::to_owned).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Python stand-in agent: sends `notify` (if any) on start, records
    /// SIGTERM in `<root>/events`, then waits.
    fn agent(root: &Path, notify: &str) -> Layout {
        assert!(
            Path::new("/usr/bin/python3").exists(),
            "missing /usr/bin/python3: install the Debian package python3"
        );
        let layout = Layout::with_root(root);
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        std::fs::create_dir_all(layout.versions_dir()).expect("mkdir");
        std::fs::create_dir_all(layout.active_agent_link().parent().expect("parent"))
            .expect("mkdir");
        let bin = layout.versions_dir().join("fleet-agent-v1");
        let script = format!(
            r#"#!/usr/bin/python3
import os, signal, socket, sys, time
events = "{root}/events"
def term(*_):
    open(events, "a").write("term\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
msg = {notify:?}
if msg:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(msg.encode(), os.environ["NOTIFY_SOCKET"])
while True:
    time.sleep(60)
"#,
            root = root.display()
        );
        std::fs::write(&bin, script).expect("write");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::os::unix::fs::symlink(&bin, layout.active_agent_link()).expect("link");
        layout
    }

    #[test]
    fn start_waits_for_ready_and_stop_terms_the_agent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = agent(dir.path(), "STATUS=warming up\nREADY=1");
        let s = Supervisor::spawn(&layout, "nobody", "fleet-agent.service").expect("spawn");
        s.start(Duration::from_secs(20)).expect("ready");
        let id = s.invocation_id().expect("invocation id");
        assert_eq!(id.len(), 32);
        assert_eq!(
            s.view.lock().expect("view").status.as_deref(),
            Some("warming up")
        );
        // Starting an active service changes nothing (systemctl semantics).
        s.start(Duration::from_secs(20)).expect("still ready");
        assert_eq!(s.invocation_id(), Some(id));
        let drained = s.stop(Duration::from_secs(20)).expect("stopped");
        assert!(drained < Duration::from_secs(20));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("events")).expect("events"),
            "term\n"
        );
        assert_eq!(
            s.stop(Duration::from_secs(1)).expect("no-op"),
            Duration::ZERO
        );
    }

    #[test]
    fn no_ready_within_the_bound_is_a_start_failure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = agent(dir.path(), "STATUS=never ready");
        let s = Supervisor::spawn(&layout, "nobody", "fleet-agent.service").expect("spawn");
        let e = s.start(Duration::from_millis(800)).expect_err("not ready");
        assert_eq!(
            e.to_string(),
            "start fleet-agent.service: the agent did not send READY=1 within 0.8 s; the agent was killed"
        );
    }

    #[test]
    fn exiting_before_ready_is_a_start_failure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = agent(dir.path(), "");
        let bin = layout.versions_dir().join("fleet-agent-v1");
        std::fs::write(&bin, "#!/bin/sh\necho crashing >&2\nexit 3\n").expect("write");
        let s = Supervisor::spawn(&layout, "nobody", "fleet-agent.service").expect("spawn");
        let e = s.start(Duration::from_secs(20)).expect_err("crashed");
        assert_eq!(
            e.to_string(),
            "start fleet-agent.service: the agent exited with exit code 3 before sending READY=1"
        );
    }
}
