//! `fleetctl device label DEVICE key=value ... [key-]` and `fleetctl
//! device ls [-l SELECTOR]`; and the one way every command picks devices
//! by selector ([`select`]).
//!
//! Labels live in `fleet-operator` `labels.<device>` ([`DeviceLabels`]),
//! a bucket only the operator account reads or writes: devices never see
//! it. A label change is a read-modify-write by compare-and-set (retried
//! when another operator wrote in between).
//!
//! A selector reads a device's labels and its facts from `fleet-status`
//! `<device>.info`, under their own names (a label may not take them):
//! `device`, `arch`, `agent-version`, `os` (the first word of the OS name,
//! lower case: `debian`), `config-state` (`configured`, `changefreeze`),
//! `frozen` (`true`, `false`). A device exists for a selector once it has
//! reported anything or carries a label.

use std::collections::BTreeMap;
use std::fmt::Write;

use fleet_common::contracts::{check_label, DeviceLabels, LabelError, MAX_LABELS_PER_DEVICE};
use fleet_common::subjects::{labels_key, BUCKET_OPERATOR, LABELS_PREFIX};
use fleet_common::validate::DeviceId;

use crate::error::CtlError;
use crate::fleet::{self, DeviceView, Keys, Scope};
use crate::js;
use crate::js::{is_wrong_last_sequence, kv};
use crate::selector::Selector;

/// One device as a selector sees it.
#[derive(Debug, Clone)]
pub struct Device {
    pub view: DeviceView,
    pub labels: BTreeMap<String, String>,
}

impl Device {
    /// Labels and facts by name.
    pub fn attributes(&self) -> BTreeMap<String, String> {
        let mut a = self.labels.clone();
        a.insert("device".into(), self.view.id.to_string());
        if let Some(i) = &self.view.info {
            a.insert("arch".into(), i.arch.as_str().to_owned());
            a.insert("agent-version".into(), i.agent_version.to_string());
            if let Some(os) = i.os.as_str().split_whitespace().next() {
                a.insert("os".into(), os.to_ascii_lowercase());
            }
            a.insert(
                "config-state".into(),
                i.config_state.state.name().to_owned(),
            );
            a.insert(
                "frozen".into(),
                i.config_state.state.is_frozen().to_string(),
            );
        }
        a
    }

    pub fn matches(&self, sel: &Selector) -> bool {
        let a = self.attributes();
        sel.matches(|k| a.get(k).map(String::as_str))
    }
}

/// JetStream's "stream not found".
const ERR_STREAM_NOT_FOUND: &str = "(code 10059)";

/// Every device's labels (none while `fleet-operator` does not exist: a
/// deployment from before labels, until `fleetctl buckets create` runs).
pub fn read_all(conn: &nats::Connection) -> Result<BTreeMap<DeviceId, DeviceLabels>, CtlError> {
    let mut out = BTreeMap::new();
    let entries = match js::read_last(
        conn,
        BUCKET_OPERATOR,
        &format!("$KV.{BUCKET_OPERATOR}.{LABELS_PREFIX}.*"),
    ) {
        Err(CtlError::Nats { detail, .. }) if detail.contains(ERR_STREAM_NOT_FOUND) => {
            return Ok(out)
        }
        other => other?,
    };
    for e in entries {
        let Some(id) = e
            .key
            .strip_prefix(&format!("{LABELS_PREFIX}."))
            .and_then(|d| DeviceId::parse(d).ok())
        else {
            continue;
        };
        let Some(bytes) = e.value.filter(|v| !v.is_empty()) else {
            continue;
        };
        let labels = DeviceLabels::from_json(&bytes).map_err(|err| {
            CtlError::Refused(format!(
                "{BUCKET_OPERATOR} {}: {err}; rewrite it with fleetctl device label",
                e.key
            ))
        })?;
        out.insert(id, labels);
    }
    Ok(out)
}

/// The devices matching `sel` (every device without one), with the
/// status `keys` asked for, sorted by device.
pub fn select(
    conn: &nats::Connection,
    sel: Option<&Selector>,
    keys: Keys,
) -> Result<Vec<Device>, CtlError> {
    // Facts need `info`, which both key sets read.
    let mut views = fleet::read(conn, &Scope::Fleet, keys)?;
    let mut labels = read_all(conn)?;
    for id in labels.keys() {
        views
            .entry(id.clone())
            .or_insert_with(|| DeviceView::new(id.clone()));
    }
    Ok(views
        .into_values()
        .map(|view| Device {
            labels: labels
                .remove(&view.id)
                .map(|l| l.labels)
                .unwrap_or_default(),
            view,
        })
        .filter(|d| sel.is_none_or(|s| d.matches(s)))
        .collect())
}

/// One `key=value` (set) or `key-` (remove).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelChange {
    Set(String, String),
    Remove(String),
}

pub fn parse_change(arg: &str) -> Result<LabelChange, String> {
    if let Some((k, v)) = arg.split_once('=') {
        check_label(k, v).map_err(|e| e.to_string())?;
        return Ok(LabelChange::Set(k.to_owned(), v.to_owned()));
    }
    if let Some(k) = arg.strip_suffix('-') {
        check_label(k, "").map_err(|e| e.to_string())?;
        return Ok(LabelChange::Remove(k.to_owned()));
    }
    Err(format!(
        "{arg:?}: give key=value to set a label or key- to remove it"
    ))
}

const CAS_ATTEMPTS: usize = 5;

/// `fleetctl device label`: applies `changes` to `device`'s labels by
/// compare-and-set; returns the line to print.
pub fn label(
    conn: &nats::Connection,
    device: &str,
    changes: &[LabelChange],
) -> Result<String, CtlError> {
    let d = DeviceId::parse(device).map_err(|e| CtlError::Input(e.to_string()))?;
    let store = kv(conn, BUCKET_OPERATOR)?;
    let key = labels_key(&d);
    for _ in 0..CAS_ATTEMPTS {
        let entry = store
            .entry(&key)
            .map_err(CtlError::nats(format!("reading {BUCKET_OPERATOR} {key}")))?;
        let (mut labels, revision) = match entry {
            None => (DeviceLabels::default(), None),
            Some(e) if e.value.is_empty() => (DeviceLabels::default(), Some(e.revision)),
            Some(e) => (
                // A damaged value is replaced by what this command says.
                DeviceLabels::from_json(&e.value).unwrap_or_default(),
                Some(e.revision),
            ),
        };
        for c in changes {
            match c {
                LabelChange::Set(k, v) => {
                    labels.labels.insert(k.clone(), v.clone());
                }
                LabelChange::Remove(k) => {
                    labels.labels.remove(k);
                }
            }
        }
        if labels.labels.len() > MAX_LABELS_PER_DEVICE {
            return Err(CtlError::Input(
                LabelError::TooMany(labels.labels.len()).to_string(),
            ));
        }
        let bytes = serde_json::to_vec(&labels).map_err(|e| CtlError::Input(e.to_string()))?;
        let written = match revision {
            Some(r) => store.update(&key, &bytes, r),
            None => store.create(&key, &bytes),
        };
        match written {
            Ok(rev) => {
                return Ok(format!(
                    "{d}: {} (revision {rev})\n",
                    render(&labels.labels)
                ))
            }
            Err(e) if is_wrong_last_sequence(&e) => continue,
            Err(e) => {
                return Err(CtlError::Nats {
                    what: format!("writing {BUCKET_OPERATOR} {key}"),
                    detail: e.to_string(),
                })
            }
        }
    }
    Err(CtlError::Conflict(format!(
        "{BUCKET_OPERATOR} {key} changed under each of {CAS_ATTEMPTS} attempts (other operators are writing it); nothing was written: run the command again"
    )))
}

/// `site=berlin,tier=canary`, or `no labels`.
pub fn render(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "no labels".into();
    }
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `fleetctl device ls [-l SELECTOR]`: one line per matching device.
pub fn ls(conn: &nats::Connection, sel: Option<&Selector>, json: bool) -> Result<String, CtlError> {
    let devices = select(conn, sel, Keys::Upgrade)?;
    if json {
        let rows: Vec<serde_json::Value> = devices
            .iter()
            .map(|d| {
                serde_json::json!({
                    "device": d.view.id,
                    "labels": d.labels,
                    "facts": d.attributes().into_iter()
                        .filter(|(k, _)| !d.labels.contains_key(k))
                        .collect::<BTreeMap<_, _>>(),
                })
            })
            .collect();
        let mut s = serde_json::to_string_pretty(&rows).unwrap_or_else(|_| "[]".into());
        s.push('\n');
        return Ok(s);
    }
    let mut rows = vec![[
        "DEVICE".to_owned(),
        "AGENT".to_owned(),
        "ARCH".to_owned(),
        "CONFIG".to_owned(),
        "LABELS".to_owned(),
    ]];
    for d in &devices {
        let dash = || "-".to_owned();
        let i = d.view.info.as_ref();
        rows.push([
            d.view.id.to_string(),
            i.map_or_else(dash, |i| i.agent_version.to_string()),
            i.map_or_else(dash, |i| i.arch.as_str().to_owned()),
            i.map_or_else(dash, |i| i.config_state.state.name().to_owned()),
            render(&d.labels),
        ]);
    }
    let mut out = table(&rows);
    let _ = writeln!(out, "{} devices", devices.len());
    Ok(out)
}

/// Aligned columns, the last one unpadded.
pub fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, (c, w)) in r.iter().zip(widths).enumerate() {
            if i + 1 == N {
                line.push_str(c);
            } else {
                let _ = write!(line, "{c:<w$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_parse_and_refuse() {
        assert_eq!(
            parse_change("site=berlin"),
            Ok(LabelChange::Set("site".into(), "berlin".into()))
        );
        assert_eq!(
            parse_change("tier-"),
            Ok(LabelChange::Remove("tier".into()))
        );
        assert!(parse_change("arch=arm")
            .expect_err("fact")
            .contains("name of a device fact"));
        assert!(parse_change("site")
            .expect_err("bare")
            .contains("key=value to set"));
        assert!(parse_change("site=a b").is_err());
    }
}
