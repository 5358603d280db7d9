//! Users and groups of the running system, read from `/etc/passwd`,
//! `/etc/group` and `/proc` (no NSS: devices use local files).

use std::path::Path;

/// A local account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

const PASSWD: &str = "/etc/passwd";
const GROUP: &str = "/etc/group";
/// Larger account databases are not something a device has.
const MAX_DB_BYTES: u64 = 4 * 1024 * 1024;

fn read_db(path: &str) -> Option<String> {
    let bytes = crate::durable::read_bounded(Path::new(path), MAX_DB_BYTES).ok()?;
    String::from_utf8(bytes).ok()
}

/// The account named `name` in `/etc/passwd`.
pub fn lookup_user(name: &str) -> Option<Account> {
    parse_passwd(&read_db(PASSWD)?, |a| a.name == name)
}

/// The account with uid `uid` in `/etc/passwd`.
pub fn lookup_uid(uid: u32) -> Option<Account> {
    parse_passwd(&read_db(PASSWD)?, |a| a.uid == uid)
}

fn parse_passwd(db: &str, want: impl Fn(&Account) -> bool) -> Option<Account> {
    db.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 {
            return None;
        }
        let a = Account {
            name: f[0].to_owned(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: f[5].to_owned(),
        };
        want(&a).then_some(a)
    })
}

/// The gid of the group named `name` in `/etc/group`.
pub fn lookup_group(name: &str) -> Option<u32> {
    parse_group(&read_db(GROUP)?, name)
}

fn parse_group(db: &str, name: &str) -> Option<u32> {
    db.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 3 && f[0] == name)
            .then(|| f[2].parse().ok())
            .flatten()
    })
}

/// The supplementary groups of a process (`Groups:` in `/proc/<pid>/status`).
pub fn supplementary_groups(pid: i32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_groups_line(&status)
}

fn parse_groups_line(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find(|l| l.starts_with("Groups:"))?;
    Some(
        line["Groups:".len()..]
            .split_whitespace()
            .filter_map(|g| g.parse().ok())
            .collect(),
    )
}

/// The effective uid and gid of this process.
pub fn current_ids() -> (u32, u32) {
    (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_account_databases() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nfleet-agent:x:998:997::/var/lib/harmony-fleet/agent:/usr/sbin/nologin\nbroken\n";
        let a = parse_passwd(passwd, |a| a.name == "fleet-agent").expect("found");
        assert_eq!(
            (a.uid, a.gid, a.home.as_str()),
            (998, 997, "/var/lib/harmony-fleet/agent")
        );
        assert!(parse_passwd(passwd, |a| a.name == "nobody").is_none());
        let group = "root:x:0:\nfleet-control:x:996:alice,bob\n";
        assert_eq!(parse_group(group, "fleet-control"), Some(996));
        assert_eq!(parse_group(group, "fleet"), None);
        assert_eq!(
            parse_groups_line("Name:\tx\nGroups:\t4 24 996 \nVmRSS: 1 kB\n"),
            Some(vec![4, 24, 996])
        );
        assert_eq!(lookup_user("root").map(|a| a.uid), Some(0));
        assert!(supplementary_groups(std::process::id() as i32).is_some());
    }
}
