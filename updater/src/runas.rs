//! How candidates (the probe) and, under the supervisor, the agent itself
//! are started: as the probe user (`fleet-agent`) when the updater is root,
//! as the updater's own user otherwise (so tests run unprivileged); with a
//! clean environment, `/` as working directory, and the parent-death signal
//! set so a child never outlives a crashed updater.

use std::fmt;
use std::path::Path;
use std::process::Command;

use fleet_common::users::{self, Account};

/// The minimal `PATH` of a child (systemd's default).
const CHILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The account children run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunAs {
    /// The updater is not root: children keep its uid.
    Current { home: String, name: String },
    /// The updater is root: children switch to this account.
    User(Account),
}

/// The probe user does not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownUser(pub String);

impl fmt::Display for UnknownUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "user {:?} does not exist in /etc/passwd: candidates never run as root; run device setup (sysusers) or set probe-user in the updater config",
            self.0
        )
    }
}

impl std::error::Error for UnknownUser {}

impl RunAs {
    /// `probe_user` when this process is root, this process's user otherwise.
    pub fn resolve(probe_user: &str) -> Result<Self, UnknownUser> {
        let (uid, _) = users::current_ids();
        if uid == 0 {
            return users::lookup_user(probe_user)
                .map(Self::User)
                .ok_or_else(|| UnknownUser(probe_user.to_owned()));
        }
        let account = users::lookup_uid(uid);
        Ok(Self::Current {
            home: account
                .as_ref()
                .map(|a| a.home.clone())
                .or_else(|| std::env::var("HOME").ok())
                .unwrap_or_else(|| "/".to_owned()),
            name: account.map(|a| a.name).unwrap_or_else(|| uid.to_string()),
        })
    }

    /// For messages: `fleet-agent (uid 998)`.
    pub fn describe(&self) -> String {
        match self {
            Self::Current { name, .. } => format!("{name} (the updater's own user)"),
            Self::User(a) => format!("{} (uid {})", a.name, a.uid),
        }
    }

    /// A command for `program` as this account: clean environment, cwd `/`,
    /// its own process group, killed when the updater dies.
    pub fn command(&self, program: &Path) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(program);
        cmd.env_clear().env("PATH", CHILD_PATH).current_dir("/");
        match self {
            Self::Current { home, name } => {
                cmd.env("HOME", home).env("USER", name).env("LOGNAME", name);
            }
            Self::User(a) => {
                // std drops root's supplementary groups when it switches uid.
                cmd.uid(a.uid)
                    .gid(a.gid)
                    .env("HOME", &a.home)
                    .env("USER", &a.name)
                    .env("LOGNAME", &a.name);
            }
        }
        cmd.process_group(0);
        die_with_parent(&mut cmd);
        cmd
    }
}

/// Arms `PR_SET_PDEATHSIG` (SIGKILL) in the child. It is armed after the
/// uid switch (std runs `pre_exec` hooks last), since a credential change
/// clears it. The signal fires when the *thread* that forked exits, so
/// long-lived children must be spawned from a thread that lives as long as
/// the process (the supervisor's own thread).
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = rustix::process::getpid();
    // SAFETY: the hook runs in the forked child before exec, where only
    // async-signal-safe calls are allowed: it makes two raw syscalls through
    // rustix (prctl, getppid), allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            // The updater died between fork and prctl: do not run orphaned.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::other("the updater exited"));
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn children_get_a_clean_environment() {
        let run_as = RunAs::resolve("nobody").expect("resolve");
        let mut cmd = run_as.command(Path::new("/bin/sh"));
        cmd.args(["-c", "echo $PATH; pwd; id -u; echo ${FLEET_SECRET:-unset}"]);
        // Only this test uses this variable.
        std::env::set_var("FLEET_SECRET", "leaked");
        let out = fleet_common::process::run_bounded(&mut cmd, Duration::from_secs(10), 4096)
            .expect("runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], CHILD_PATH);
        assert_eq!(lines[1], "/");
        let want_uid = match &run_as {
            RunAs::User(a) => a.uid.to_string(),
            RunAs::Current { .. } => users::current_ids().0.to_string(),
        };
        assert_eq!(lines[2], want_uid);
        assert_eq!(lines[3], "unset");
    }

    #[test]
    fn root_needs_an_existing_probe_user() {
        if users::current_ids().0 != 0 {
            assert!(matches!(
                RunAs::resolve("no-such-user-xyz"),
                Ok(RunAs::Current { .. })
            ));
            return;
        }
        assert_eq!(
            RunAs::resolve("no-such-user-xyz").expect_err("unknown").to_string(),
            "user \"no-such-user-xyz\" does not exist in /etc/passwd: candidates never run as root; run device setup (sysusers) or set probe-user in the updater config"
        );
    }
}
