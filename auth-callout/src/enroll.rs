//! The enrollment service: one request from a device in `ENROLL` in, one
//! answer out, and at most one registry write between them
//! (`docs/design/enrollment.md`).
//!
//! Steps of [`Enrollment::handle`]: take the key from the subject (the
//! callout granted this connection exactly `fleetenroll.key.<its key>`, so
//! the subject is the proven key); answer `slow-down` to a key that asked
//! within [`ENROLL_MIN_REQUEST_INTERVAL`]; parse and check the request
//! (refusals are answered and logged, nothing written); read the device's
//! record; then:
//!
//! | record | answer, write |
//! |---|---|
//! | none | auto-approve rule matches: `approved`, record approved; else `pending`, a lobby ticket taken and the record pending (at most [`ENROLL_NEW_PENDING_PER_MINUTE`] new ones a minute per instance; a full lobby, [`MAX_PENDING_DEVICES`] tickets: `slow-down`, nothing written) |
//! | another key | `rejected`, the conflict kept on the record for the operator |
//! | pending | auto-approve rule matches now: `approved`, record approved; else `pending` |
//! | approved | `approved` |
//! | rejected, revoked | `rejected` |
//! | decommissioned | `decommissioned` (an operator must approve it again) |
//!
//! A write that loses its compare-and-set (another instance, or the
//! operator, wrote first) is read again and answered from what is there.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fleet_common::contracts::{
    AnswerState, Conflict, DeviceRecord, EnrollAnswer, EnrollRequest, RecordState,
};
use fleet_common::limits::{
    ENROLL_MIN_REQUEST_INTERVAL, ENROLL_NEW_PENDING_PER_MINUTE, ENROLL_RETRY_FIRST,
    MAX_PENDING_DEVICES,
};
use fleet_common::selector::Selector;
use fleet_common::subjects::ENROLL_PREFIX;
use fleet_common::time::Timestamp;

use crate::registry::{warn_no_lobby, Registry, RegistryError, Ticket};

/// Keys remembered for the per-key rate limit; past it the oldest half is
/// forgotten (a flood of fresh keys costs bounded memory).
const MAX_TRACKED_KEYS: usize = 100_000;
/// Writes tried before a racing request is answered from the last read.
const WRITE_TRIES: usize = 3;

/// What happened to one request, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    Answered {
        key: String,
        device: Option<String>,
        answer: EnrollAnswer,
        /// What was written, if anything.
        wrote: Option<RecordState>,
    },
    /// A subject that is not an enrollment subject (not answered).
    Ignored(String),
}

impl fmt::Display for Handled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Answered {
                key,
                device,
                answer,
                wrote,
            } => {
                write!(
                    f,
                    "enrollment request of {} (key {key}): {}",
                    device.as_deref().unwrap_or("?"),
                    answer.state.as_str()
                )?;
                if let Some(r) = &answer.reason {
                    write!(f, " ({r})")?;
                }
                if let Some(w) = wrote {
                    write!(f, "; recorded {}", w.as_str())?;
                }
                Ok(())
            }
            Self::Ignored(s) => write!(f, "not an enrollment subject: {s:?}"),
        }
    }
}

/// The enrollment service's state: the rule, the rate limits.
#[derive(Debug)]
pub struct Enrollment {
    auto_approve: Option<Selector>,
    last_request: Mutex<HashMap<String, Instant>>,
    new_pending: PendingBudget,
}

impl Enrollment {
    pub fn new(auto_approve: Option<Selector>) -> Self {
        Self {
            auto_approve,
            last_request: Mutex::new(HashMap::new()),
            new_pending: PendingBudget::new(),
        }
    }

    /// Answers the request `payload` that arrived on `subject` at `now`.
    pub fn handle(
        &self,
        registry: &dyn Registry,
        subject: &str,
        payload: &[u8],
        now: Instant,
        at: Timestamp,
    ) -> Handled {
        let Some(key) = subject
            .strip_prefix(ENROLL_PREFIX)
            .and_then(|s| s.strip_prefix(".key."))
            .filter(|k| !k.is_empty() && !k.contains('.'))
        else {
            return Handled::Ignored(subject.to_owned());
        };
        let answered = |device: Option<String>, answer: EnrollAnswer, wrote| Handled::Answered {
            key: key.to_owned(),
            device,
            answer,
            wrote,
        };
        if !self.admit(key, now) {
            return answered(None, slow_down(ENROLL_MIN_REQUEST_INTERVAL), None);
        }
        let request = match EnrollRequest::parse(payload, key) {
            Ok(r) => r,
            Err(e) => return answered(None, rejected(e.to_string()), None),
        };
        let device = Some(request.device_id.to_string());
        match self.decide(registry, &request, now, at) {
            Ok((answer, wrote)) => answered(device, answer, wrote),
            Err(e) => answered(device, unavailable(&e), None),
        }
    }

    fn decide(
        &self,
        registry: &dyn Registry,
        request: &EnrollRequest,
        now: Instant,
        at: Timestamp,
    ) -> Result<(EnrollAnswer, Option<RecordState>), RegistryError> {
        let key = request.public_key.as_str();
        for _ in 0..WRITE_TRIES {
            let read = registry.read(&request.device_id)?;
            let (write, answer) = match read.record {
                None => {
                    if let Some(rule) = self.matching_rule(request) {
                        (
                            Some(DeviceRecord {
                                state: RecordState::Approved,
                                decided_at: Some(at),
                                decided_by: Some(format!("auto-approve {}", rule.as_str())),
                                ..new_record(request, at)
                            }),
                            approved(),
                        )
                    } else if self.new_pending.take(now) {
                        match registry.take_ticket(&request.device_id, at)? {
                            Ticket::Held => {}
                            Ticket::Full => return Ok((lobby_full(), None)),
                            Ticket::NoLobby(why) => warn_no_lobby(&why),
                        }
                        (Some(new_record(request, at)), pending())
                    } else {
                        return Ok((slow_down(Duration::from_secs(60)), None));
                    }
                }
                Some(mut r) if r.public_key.as_deref() != Some(key) => {
                    let count = r
                        .conflict
                        .as_ref()
                        .filter(|c| c.public_key == key)
                        .map_or(1, |c| c.count.saturating_add(1));
                    r.conflict = Some(Conflict {
                        public_key: key.to_owned(),
                        facts: request.facts.clone(),
                        at,
                        count,
                    });
                    let why = format!(
                        "device id {} is registered with another key; the operator sees this request in `fleetctl device pending`",
                        request.device_id
                    );
                    (Some(r), rejected(why))
                }
                Some(mut r) => match r.state {
                    RecordState::Pending => match self.matching_rule(request) {
                        Some(rule) => {
                            r.state = RecordState::Approved;
                            r.decided_at = Some(at);
                            r.decided_by = Some(format!("auto-approve {}", rule.as_str()));
                            r.facts = request.facts.clone();
                            (Some(r), approved())
                        }
                        None => (None, pending()),
                    },
                    RecordState::Approved => (None, approved()),
                    RecordState::Rejected => (
                        None,
                        rejected(
                            "rejected by the operator: ask them to approve this device".into(),
                        ),
                    ),
                    RecordState::Revoked => (
                        None,
                        rejected("revoked by the operator: ask them to approve this device".into()),
                    ),
                    RecordState::Decommissioned => (
                        None,
                        EnrollAnswer {
                            state: AnswerState::Decommissioned,
                            reason: Some(
                                "decommissioned: an operator must approve this device again".into(),
                            ),
                            retry_after_secs: Some(ENROLL_RETRY_FIRST.as_secs() * 12),
                        },
                    ),
                },
            };
            let Some(record) = write else {
                return Ok((answer, None));
            };
            match registry.write(&record, read.revision) {
                Ok(_) => return Ok((answer, Some(record.state))),
                Err(RegistryError::Moved) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok((pending(), None))
    }

    fn matching_rule(&self, request: &EnrollRequest) -> Option<&Selector> {
        self.auto_approve
            .as_ref()
            .filter(|s| s.matches(|k| request.facts.get(k).map(String::as_str)))
    }

    /// Whether `key` may ask now (one request per
    /// [`ENROLL_MIN_REQUEST_INTERVAL`]).
    fn admit(&self, key: &str, now: Instant) -> bool {
        let Ok(mut seen) = self.last_request.lock() else {
            return false;
        };
        if let Some(last) = seen.get(key) {
            if now.saturating_duration_since(*last) < ENROLL_MIN_REQUEST_INTERVAL {
                return false;
            }
        }
        if seen.len() >= MAX_TRACKED_KEYS {
            let cutoff = now.checked_sub(ENROLL_MIN_REQUEST_INTERVAL);
            seen.retain(|_, t| cutoff.is_none_or(|c| *t > c));
            if seen.len() >= MAX_TRACKED_KEYS {
                seen.clear();
            }
        }
        seen.insert(key.to_owned(), now);
        true
    }
}

/// How many new pending records may still be written this minute
/// ([`ENROLL_NEW_PENDING_PER_MINUTE`] a minute): the enrollment service's
/// and the callout's lobby each hold one.
#[derive(Debug)]
pub struct PendingBudget(Mutex<(Instant, u32)>);

impl PendingBudget {
    pub fn new() -> Self {
        Self(Mutex::new((Instant::now(), 0)))
    }

    /// Whether another new pending record may be written this minute.
    pub fn take(&self, now: Instant) -> bool {
        let Ok(mut w) = self.0.lock() else {
            return false;
        };
        if now.saturating_duration_since(w.0) >= Duration::from_secs(60) {
            *w = (now, 0);
        }
        if w.1 >= ENROLL_NEW_PENDING_PER_MINUTE {
            return false;
        }
        w.1 += 1;
        true
    }
}

impl Default for PendingBudget {
    fn default() -> Self {
        Self::new()
    }
}

fn new_record(request: &EnrollRequest, at: Timestamp) -> DeviceRecord {
    DeviceRecord {
        device_id: request.device_id.clone(),
        state: RecordState::Pending,
        public_key: Some(request.public_key.clone()),
        facts: request.facts.clone(),
        requested_at: Some(at),
        decided_at: None,
        decided_by: None,
        conflict: None,
    }
}

fn approved() -> EnrollAnswer {
    EnrollAnswer {
        state: AnswerState::Approved,
        reason: None,
        retry_after_secs: None,
    }
}

fn pending() -> EnrollAnswer {
    EnrollAnswer {
        state: AnswerState::Pending,
        reason: Some("waiting for an operator: fleetctl device approve".into()),
        retry_after_secs: Some(ENROLL_RETRY_FIRST.as_secs()),
    }
}

fn rejected(reason: String) -> EnrollAnswer {
    EnrollAnswer {
        state: AnswerState::Rejected,
        reason: Some(reason),
        retry_after_secs: Some(ENROLL_RETRY_FIRST.as_secs() * 12),
    }
}

fn slow_down(after: Duration) -> EnrollAnswer {
    EnrollAnswer {
        state: AnswerState::SlowDown,
        reason: Some("too many requests".into()),
        retry_after_secs: Some(after.as_secs().max(1)),
    }
}

/// The answer while every place in the lobby is taken.
pub fn lobby_full() -> EnrollAnswer {
    EnrollAnswer {
        state: AnswerState::SlowDown,
        reason: Some(format!(
            "the lobby is full: {MAX_PENDING_DEVICES} devices wait for an operator's decision (fleetctl device pending)"
        )),
        retry_after_secs: Some(60),
    }
}

fn unavailable(e: &RegistryError) -> EnrollAnswer {
    EnrollAnswer {
        state: AnswerState::SlowDown,
        reason: Some(e.to_string()),
        retry_after_secs: Some(ENROLL_RETRY_FIRST.as_secs()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::tests::MemRegistry;
    use fleet_common::subjects::enroll_subject;
    use fleet_common::validate::DeviceId;
    use serde_json::json;

    fn req(id: &str, key: &str, arch: &str) -> Vec<u8> {
        json!({"device-id": id, "public-key": key, "facts": {"arch": arch}})
            .to_string()
            .into_bytes()
    }

    fn ask(
        e: &Enrollment,
        reg: &MemRegistry,
        key: &str,
        body: &[u8],
        now: Instant,
    ) -> (AnswerState, Option<RecordState>) {
        match e.handle(reg, &enroll_subject(key), body, now, Timestamp::now()) {
            Handled::Answered { answer, wrote, .. } => (answer.state, wrote),
            Handled::Ignored(s) => panic!("ignored {s}"),
        }
    }

    fn record(reg: &MemRegistry, id: &str) -> DeviceRecord {
        reg.read(&DeviceId::parse(id).expect("id"))
            .expect("read")
            .record
            .expect("record")
    }

    #[test]
    fn a_new_device_is_pending_then_approved_by_the_operator() {
        let e = Enrollment::new(None);
        let reg = MemRegistry::default();
        let k = nkeys::KeyPair::new_user().public_key();
        let t0 = Instant::now();
        assert_eq!(
            ask(&e, &reg, &k, &req("dev-a", &k, "arm64"), t0),
            (AnswerState::Pending, Some(RecordState::Pending))
        );
        assert_eq!(
            record(&reg, "dev-a").public_key.as_deref(),
            Some(k.as_str())
        );
        // Asking again at once: slow down, nothing read or written.
        assert_eq!(
            ask(&e, &reg, &k, &req("dev-a", &k, "arm64"), t0),
            (AnswerState::SlowDown, None)
        );
        let t1 = t0 + ENROLL_MIN_REQUEST_INTERVAL;
        assert_eq!(
            ask(&e, &reg, &k, &req("dev-a", &k, "arm64"), t1),
            (AnswerState::Pending, None)
        );
        let mut r = record(&reg, "dev-a");
        r.state = RecordState::Approved;
        let rev = reg.read(&r.device_id).expect("read").revision;
        reg.write(&r, rev).expect("approve");
        let t2 = t1 + ENROLL_MIN_REQUEST_INTERVAL;
        assert_eq!(
            ask(&e, &reg, &k, &req("dev-a", &k, "arm64"), t2),
            (AnswerState::Approved, None)
        );
    }

    #[test]
    fn the_auto_approve_rule_approves_matching_facts_only() {
        let e = Enrollment::new(Some(Selector::parse("arch=arm64").expect("selector")));
        let reg = MemRegistry::default();
        let (a, b) = (
            nkeys::KeyPair::new_user().public_key(),
            nkeys::KeyPair::new_user().public_key(),
        );
        let now = Instant::now();
        assert_eq!(
            ask(&e, &reg, &a, &req("dev-a", &a, "arm64"), now),
            (AnswerState::Approved, Some(RecordState::Approved))
        );
        assert_eq!(
            record(&reg, "dev-a").decided_by.as_deref(),
            Some("auto-approve arch=arm64")
        );
        assert_eq!(
            ask(&e, &reg, &b, &req("dev-b", &b, "x86_64"), now),
            (AnswerState::Pending, Some(RecordState::Pending))
        );
    }

    #[test]
    fn a_full_lobby_turns_new_devices_away_and_a_freed_place_admits_one() {
        let e = Enrollment::new(Some(Selector::parse("arch=arm64").expect("selector")));
        let reg = MemRegistry::with_lobby(2);
        let keys: Vec<String> = (0..4)
            .map(|_| nkeys::KeyPair::new_user().public_key())
            .collect();
        let now = Instant::now();
        let asked: Vec<_> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| ask(&e, &reg, k, &req(&format!("dev-{i}"), k, "x86_64"), now))
            .collect();
        assert_eq!(
            asked,
            [
                (AnswerState::Pending, Some(RecordState::Pending)),
                (AnswerState::Pending, Some(RecordState::Pending)),
                (AnswerState::SlowDown, None),
                (AnswerState::SlowDown, None),
            ]
        );
        assert_eq!(
            reg.records.lock().expect("lock").len(),
            2,
            "nothing written"
        );
        // A device the rule approves takes no place.
        let k = nkeys::KeyPair::new_user().public_key();
        assert_eq!(
            ask(&e, &reg, &k, &req("dev-arm", &k, "arm64"), now),
            (AnswerState::Approved, Some(RecordState::Approved))
        );
        // A pending device asking again keeps its place; a freed place
        // (the operator decided dev-0) admits the next.
        let later = now + ENROLL_MIN_REQUEST_INTERVAL;
        assert_eq!(
            ask(&e, &reg, &keys[1], &req("dev-1", &keys[1], "x86_64"), later),
            (AnswerState::Pending, None)
        );
        reg.tickets.lock().expect("lock").remove("dev-0");
        assert_eq!(
            ask(&e, &reg, &keys[2], &req("dev-2", &keys[2], "x86_64"), later),
            (AnswerState::Pending, Some(RecordState::Pending))
        );
    }

    #[test]
    fn another_devices_id_is_refused_and_flagged() {
        let e = Enrollment::new(Some(Selector::parse("arch=arm64").expect("selector")));
        let reg = MemRegistry::default();
        let (a, thief) = (
            nkeys::KeyPair::new_user().public_key(),
            nkeys::KeyPair::new_user().public_key(),
        );
        let now = Instant::now();
        ask(&e, &reg, &a, &req("dev-a", &a, "arm64"), now);
        assert_eq!(
            ask(&e, &reg, &thief, &req("dev-a", &thief, "arm64"), now),
            (AnswerState::Rejected, Some(RecordState::Approved))
        );
        let r = record(&reg, "dev-a");
        assert_eq!(r.public_key.as_deref(), Some(a.as_str()), "key unchanged");
        assert_eq!(r.state, RecordState::Approved, "state unchanged");
        let c = r.conflict.expect("flagged");
        assert_eq!((c.public_key.as_str(), c.count), (thief.as_str(), 1));
    }

    #[test]
    fn bad_requests_are_answered_and_write_nothing() {
        let e = Enrollment::new(None);
        let reg = MemRegistry::default();
        let k = nkeys::KeyPair::new_user().public_key();
        let other = nkeys::KeyPair::new_user().public_key();
        let mut now = Instant::now();
        for body in [
            b"not json".to_vec(),
            req("dev.a", &k, "arm64"),
            req("dev-a", &other, "arm64"),
            json!({"device-id": "dev-a", "public-key": k, "facts": {"arch": "x".repeat(500)}})
                .to_string()
                .into_bytes(),
            vec![b'{'; 5000],
        ] {
            assert_eq!(ask(&e, &reg, &k, &body, now), (AnswerState::Rejected, None));
            now += ENROLL_MIN_REQUEST_INTERVAL;
        }
        assert!(reg.records.lock().expect("lock").is_empty());
        assert!(matches!(
            e.handle(&reg, "fleetenroll.key.", b"{}", now, Timestamp::now()),
            Handled::Ignored(_)
        ));
    }

    #[test]
    fn a_decommissioned_device_is_told_so_and_a_down_registry_means_retry() {
        let e = Enrollment::new(Some(Selector::parse("").expect("selector")));
        let reg = MemRegistry::default();
        let k = nkeys::KeyPair::new_user().public_key();
        let mut now = Instant::now();
        ask(&e, &reg, &k, &req("dev-a", &k, "arm64"), now);
        let mut r = record(&reg, "dev-a");
        r.state = RecordState::Decommissioned;
        let rev = reg.read(&r.device_id).expect("read").revision;
        reg.write(&r, rev).expect("decommission");
        now += ENROLL_MIN_REQUEST_INTERVAL;
        assert_eq!(
            ask(&e, &reg, &k, &req("dev-a", &k, "arm64"), now),
            (AnswerState::Decommissioned, None),
            "the auto-approve rule does not re-admit a decommissioned device"
        );
        reg.down.store(true, std::sync::atomic::Ordering::SeqCst);
        now += ENROLL_MIN_REQUEST_INTERVAL;
        assert_eq!(
            ask(&e, &reg, &k, &req("dev-a", &k, "arm64"), now),
            (AnswerState::SlowDown, None)
        );
    }
}
