//! Wall-clock timestamps on the wire: UTC, millisecond precision, RFC 3339
//! (`2026-11-29T13:44:31.123Z`), so an operator reads them without tools.
//! Durations inside one process use `Instant`, never these.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Timestamp(u64);

/// A timestamp that is not RFC 3339 UTC with optional fraction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimestampError(String);

impl fmt::Display for TimestampError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid timestamp {:?}: use RFC 3339 UTC such as 2026-11-29T13:44:31.123Z",
            self.0.chars().take(64).collect::<String>()
        )
    }
}

impl std::error::Error for TimestampError {}

impl Timestamp {
    pub fn now() -> Self {
        Self::from_system(SystemTime::now())
    }

    pub fn from_system(t: SystemTime) -> Self {
        // A clock before 1970 reads as the epoch rather than failing.
        let ms = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
        Self(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    pub fn from_unix_millis(ms: u64) -> Self {
        Self(ms)
    }

    pub fn unix_millis(self) -> u64 {
        self.0
    }

    /// Time from `earlier` to `self`, zero if the clock went backwards.
    /// The UTC date, `YYYY-MM-DD`.
    pub fn utc_date(self) -> String {
        let (y, m, d) = civil_from_days(self.0 / 1000 / 86_400);
        format!("{y:04}-{m:02}-{d:02}")
    }

    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    pub fn parse(v: &str) -> Result<Self, TimestampError> {
        let err = || TimestampError(v.to_owned());
        let b = v.as_bytes();
        if b.len() < 20 || b.len() > 30 || b[b.len() - 1] != b'Z' {
            return Err(err());
        }
        let num = |r: std::ops::Range<usize>| -> Result<u64, TimestampError> {
            let s = v.get(r).ok_or_else(err)?;
            if s.bytes().all(|c| c.is_ascii_digit()) {
                s.parse().map_err(|_| err())
            } else {
                Err(err())
            }
        };
        if b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
            return Err(err());
        }
        let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
        let millis = match b[19] {
            b'Z' if b.len() == 20 => 0,
            b'.' => {
                let frac = v.get(20..v.len() - 1).ok_or_else(err)?;
                if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|c| c.is_ascii_digit()) {
                    return Err(err());
                }
                let padded = format!("{frac:0<3}");
                padded[..3].parse::<u64>().map_err(|_| err())?
            }
            _ => return Err(err()),
        };
        if !(1970..=9999).contains(&year)
            || !(1..=12).contains(&month)
            || day < 1
            || day > days_in_month(year, month)
            || hour > 23
            || min > 59
            || sec > 60
        {
            return Err(err());
        }
        let days = days_from_civil(year, month, day);
        Ok(Self(
            ((days * 86_400 + hour * 3600 + min * 60 + sec) * 1000) + millis,
        ))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0 / 1000;
        let millis = self.0 % 1000;
        let (y, m, d) = civil_from_days(secs / 86_400);
        let rem = secs % 86_400;
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
            rem / 3600,
            (rem % 3600) / 60,
            rem % 60
        )
    }
}

impl TryFrom<String> for Timestamp {
    type Error = TimestampError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<Timestamp> for String {
    fn from(t: Timestamp) -> String {
        t.to_string()
    }
}

fn is_leap(y: u64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: u64, m: u64) -> u64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm, for
/// years from 1970 on).
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count since 1970-01-01.
fn civil_from_days(z: u64) -> (u64, u64, u64) {
    let z = z + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for (ms, text) in [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (1_795_959_871_123, "2026-11-29T13:44:31.123Z"),
            (4_102_444_799_999, "2099-12-31T23:59:59.999Z"),
        ] {
            let t = Timestamp::from_unix_millis(ms);
            assert_eq!(t.to_string(), text);
            assert_eq!(Timestamp::parse(text), Ok(t));
        }
        assert_eq!(
            Timestamp::parse("2026-11-29T13:44:31Z").map(|t| t.unix_millis()),
            Ok(1_795_959_871_000)
        );
        assert_eq!(
            Timestamp::parse("2026-11-29T13:44:31.5Z").map(|t| t.unix_millis()),
            Ok(1_795_959_871_500)
        );
    }

    #[test]
    fn refuses_other_forms() {
        for bad in [
            "",
            "2026-11-29",
            "2026-11-29T13:44:31+01:00",
            "2026-13-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "2026-11-29 13:44:31Z",
            "2026-11-29T13:44:31.Z",
            "1969-12-31T23:59:59Z",
            "+026-11-29T13:44:31Z",
        ] {
            assert_eq!(
                Timestamp::parse(bad),
                Err(TimestampError(bad.into())),
                "{bad}"
            );
        }
    }
}
