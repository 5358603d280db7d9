//! Candidate stand-ins: real executables that honour the agent's CLI and
//! misbehave on cue, served as artifacts like a real agent.
//!
//! The device image is Debian minbase: no python3, but `perl-base` is
//! essential there, and it can send `READY=1` to `$NOTIFY_SOCKET` from the
//! main process itself (the agent unit has `NotifyAccess=main`, so a helper
//! such as `socat` or `systemd-notify`, another PID, would be ignored).
//!
//! - `--version` prints `fleet-agent <version>`;
//! - `--self-test` prints a [`SelfTestReport`] (built here from the
//!   contract type) naming the stand-in's version, and exits 0, or 15 with
//!   a failed check;
//! - `run` does what [`Run`] says.

use fleet_common::contracts::{SelfTestCheck, SelfTestReport};
use fleet_common::validate::{BoundedText, Version};

/// What the stand-in's `--self-test` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelfTest {
    Pass,
    /// Exits 15 (the agent's desired-read failure) with a failed check.
    Fail,
}

/// What the stand-in's `run` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run {
    /// Runs and never sends `READY=1` (systemd's `TimeoutStartSec` ends it).
    NeverReady,
    /// Exits 1 before `READY=1`, after `delay_ms`.
    CrashBeforeReady { delay_ms: u64 },
    /// The first run sends `READY=1`, then exits 1 a second later; every
    /// later run (systemd's restart) runs the real agent at `real` in its
    /// place (same PID: `exec`). Whether it ran before is a marker file in
    /// the agent's state directory.
    CrashOnceAfterReady { real: String },
}

/// One stand-in agent.
#[derive(Debug, Clone)]
pub struct StandIn {
    pub version: String,
    pub self_test: SelfTest,
    pub run: Run,
}

/// Where [`Run::CrashOnceAfterReady`] notes its first run.
pub const CRASHED_ONCE_MARKER: &str = "/var/lib/harmony-fleet/agent/e2e-crashed-once";

const SCRIPT: &str = r#"#!/usr/bin/perl
# Harmony fleet end-to-end stand-in agent @VERSION@: honours the agent's
# CLI (--version, --self-test, run) and misbehaves on cue (@RUN_NAME@).
use strict;
use warnings;
use Socket;

sub notify {
    my ($message) = @_;
    my $path = $ENV{NOTIFY_SOCKET} or die "stand-in: no NOTIFY_SOCKET\n";
    $path =~ s/^@/\0/;
    socket(my $s, AF_UNIX, SOCK_DGRAM, 0) or die "stand-in: socket: $!\n";
    defined(send($s, $message, 0, pack_sockaddr_un($path))) or die "stand-in: notify: $!\n";
}

my $command = $ARGV[0] // '';
if ($command eq '--version') {
    print "fleet-agent @VERSION@\n";
    exit 0;
}
if ($command eq '--self-test') {
@SELF_TEST@
}
if ($command ne 'run') {
    print STDERR "usage: fleet-agent run | --self-test | --version\n";
    exit 2;
}
$SIG{TERM} = sub { print STDERR "stand-in @VERSION@: SIGTERM\n"; exit 0; };
@RUN@
"#;

impl StandIn {
    pub fn new(version: &str, self_test: SelfTest, run: Run) -> Self {
        Self {
            version: version.to_owned(),
            self_test,
            run,
        }
    }

    /// The report `--self-test` prints.
    fn report(&self) -> String {
        let mut report = SelfTestReport {
            version: Version::parse(&self.version).expect("a valid version"),
            checks: Default::default(),
        };
        report.checks.push(SelfTestCheck {
            name: BoundedText::parse("config").expect("name"),
            ok: true,
            detail: None,
        });
        if self.self_test == SelfTest::Fail {
            report.checks.push(SelfTestCheck {
                name: BoundedText::parse("desired-read").expect("name"),
                ok: false,
                detail: Some(
                    BoundedText::parse("end-to-end stand-in: fails its probe on purpose")
                        .expect("detail"),
                ),
            });
        }
        let json = serde_json::to_string(&report).expect("a report is JSON");
        assert!(!json.contains('\''), "the report is quoted in perl: {json}");
        json
    }

    /// The executable's bytes.
    pub fn script(&self) -> Vec<u8> {
        let self_test = match (&self.run, self.self_test) {
            // The real agent's own probe, under the stand-in's name.
            (Run::CrashOnceAfterReady { real }, SelfTest::Pass) => {
                format!("    exec {{ '{real}' }} $0, @ARGV or die \"stand-in: exec: $!\\n\";")
            }
            (_, SelfTest::Pass) => format!("    print '{}', \"\\n\";\n    exit 0;", self.report()),
            (_, SelfTest::Fail) => format!(
                "    print '{}', \"\\n\";\n    print STDERR \"stand-in: the probe fails on purpose\\n\";\n    exit 15;",
                self.report()
            ),
        };
        let (name, run) = match &self.run {
            Run::NeverReady => (
                "never ready".to_owned(),
                "while (1) { sleep 3600; }".to_owned(),
            ),
            Run::CrashBeforeReady { delay_ms } => (
                format!("crashes {delay_ms} ms after its start, before READY"),
                format!(
                    "select(undef, undef, undef, {});\nprint STDERR \"stand-in @VERSION@: crashing before READY\\n\";\nexit 1;",
                    *delay_ms as f64 / 1000.0
                ),
            ),
            Run::CrashOnceAfterReady { real } => (
                "crashes once after READY, then runs the real agent".to_owned(),
                format!(
                    "if (! -e '{CRASHED_ONCE_MARKER}') {{\n    open(my $f, '>', '{CRASHED_ONCE_MARKER}') or die \"stand-in: marker: $!\\n\";\n    close($f);\n    notify(\"READY=1\");\n    print STDERR \"stand-in @VERSION@: READY sent; crashing\\n\";\n    sleep 1;\n    exit 1;\n}}\nexec {{ '{real}' }} $0, @ARGV or die \"stand-in: exec {real}: $!\\n\";"
                ),
            ),
        };
        SCRIPT
            .replace("@SELF_TEST@", &self_test)
            .replace("@RUN@", &run)
            .replace("@RUN_NAME@", &name)
            .replace("@VERSION@", &self.version)
            .into_bytes()
    }
}
