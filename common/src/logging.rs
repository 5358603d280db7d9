//! Logging: to journald with structured fields when the process runs under
//! systemd (its stderr is a journal stream), to stderr otherwise.
//!
//! Structured fields use `log`'s key-values:
//! `log::info!(device = id.as_str(); "snapshot complete")`. On stderr they
//! follow the message as `key=value`.

use std::io::Write;

use log::{kv, Level, LevelFilter, Log, Metadata, Record};

/// Environment variable selecting the level (`error`..`trace`; default `info`).
pub const LOG_LEVEL_ENV: &str = "FLEET_LOG";

/// Installs the logger for `program`. Safe to call once per process; a second
/// call is ignored.
pub fn init(program: &'static str) {
    let level = std::env::var(LOG_LEVEL_ENV)
        .ok()
        .and_then(|v| v.parse::<LevelFilter>().ok())
        .unwrap_or(LevelFilter::Info);
    if systemd_journal_logger::connected_to_journal() {
        if let Ok(logger) = systemd_journal_logger::JournalLog::new() {
            let logger = logger.with_syslog_identifier(program.to_owned());
            if logger.install().is_ok() {
                log::set_max_level(level);
                return;
            }
        }
    }
    if log::set_boxed_logger(Box::new(StderrLog { program })).is_ok() {
        log::set_max_level(level);
    }
}

struct StderrLog {
    program: &'static str,
}

struct KvLine<'a>(&'a mut String);

impl<'kvs> kv::VisitSource<'kvs> for KvLine<'_> {
    fn visit_pair(&mut self, key: kv::Key<'kvs>, value: kv::Value<'kvs>) -> Result<(), kv::Error> {
        use std::fmt::Write;
        let _ = write!(self.0, " {key}={value}");
        Ok(())
    }
}

impl Log for StderrLog {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let mut fields = String::new();
        let _ = record.key_values().visit(&mut KvLine(&mut fields));
        let level = match record.level() {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        };
        let line = format!(
            "{} {}[{}] {level}: {}{fields}\n",
            crate::time::Timestamp::now(),
            self.program,
            std::process::id(),
            record.args()
        );
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}
