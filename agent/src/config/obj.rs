//! Reading one JSON object of the config key by key, with the dotted
//! path of every key in its errors ([`KeyError`]) and every key not read
//! refused.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

/// A problem with one key, before the file path is attached.
#[derive(Debug)]
pub(super) struct KeyError {
    pub(super) key: String,
    pub(super) problem: String,
}

/// One JSON object of the config, consumed key by key; [`Obj::finish`]
/// refuses whatever is left.
pub(super) struct Obj {
    pub(super) prefix: String,
    pub(super) map: Map<String, Value>,
    pub(super) known: Vec<&'static str>,
}

impl Obj {
    pub(super) fn new(prefix: &str, value: Value) -> Result<Obj, KeyError> {
        match value {
            Value::Object(map) => Ok(Obj {
                prefix: prefix.to_owned(),
                map,
                known: Vec::new(),
            }),
            other => Err(KeyError {
                key: if prefix.is_empty() {
                    "(top level)".to_owned()
                } else {
                    prefix.to_owned()
                },
                problem: format!("expected an object {{...}}, found {}", kind(&other)),
            }),
        }
    }

    pub(super) fn path(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.prefix)
        }
    }

    pub(super) fn err(&self, key: &str, problem: impl Into<String>) -> KeyError {
        KeyError {
            key: self.path(key),
            problem: problem.into(),
        }
    }

    pub(super) fn take(&mut self, key: &'static str) -> Option<Value> {
        self.known.push(key);
        self.map.remove(key)
    }

    pub(super) fn required(&mut self, key: &'static str) -> Result<Value, KeyError> {
        self.take(key)
            .ok_or_else(|| self.err(key, "missing: this key is required"))
    }

    pub(super) fn string(&mut self, key: &'static str, v: Value) -> Result<String, KeyError> {
        match v {
            Value::String(s) if !s.is_empty() => Ok(s),
            Value::String(_) => Err(self.err(key, "must not be empty")),
            other => Err(self.err(key, format!("expected a string, found {}", kind(&other)))),
        }
    }

    pub(super) fn req_string(&mut self, key: &'static str) -> Result<String, KeyError> {
        let v = self.required(key)?;
        self.string(key, v)
    }

    pub(super) fn opt_string(&mut self, key: &'static str) -> Result<Option<String>, KeyError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => self.string(key, v).map(Some),
        }
    }

    pub(super) fn abs_path(&mut self, key: &'static str, v: String) -> Result<PathBuf, KeyError> {
        if v.starts_with('/') && !v.contains('\0') {
            Ok(PathBuf::from(v))
        } else {
            Err(self.err(
                key,
                format!("{v:?} is not an absolute path: write it starting with '/'"),
            ))
        }
    }

    pub(super) fn req_path(&mut self, key: &'static str) -> Result<PathBuf, KeyError> {
        let v = self.req_string(key)?;
        self.abs_path(key, v)
    }

    pub(super) fn opt_path(&mut self, key: &'static str) -> Result<Option<PathBuf>, KeyError> {
        match self.opt_string(key)? {
            None => Ok(None),
            Some(v) => self.abs_path(key, v).map(Some),
        }
    }

    pub(super) fn opt_bool(&mut self, key: &'static str, default: bool) -> Result<bool, KeyError> {
        match self.take(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(b),
            Some(other) => Err(self.err(
                key,
                format!("expected true or false, found {}", kind(&other)),
            )),
        }
    }

    /// Whole seconds within `min..=max`.
    pub(super) fn secs(
        &mut self,
        key: &'static str,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<Duration, KeyError> {
        self.whole(key, default, min, max, "seconds")
            .map(Duration::from_secs)
    }

    /// A whole number of `unit` in `min..=max`.
    pub(super) fn whole(
        &mut self,
        key: &'static str,
        default: u64,
        min: u64,
        max: u64,
        unit: &str,
    ) -> Result<u64, KeyError> {
        let n = match self.take(key) {
            None => default,
            Some(Value::Number(n)) => match n.as_u64() {
                Some(n) => n,
                None => {
                    return Err(self.err(key, format!("expected whole {unit}, found {n}")));
                }
            },
            Some(other) => {
                return Err(self.err(
                    key,
                    format!("expected a number of {unit}, found {}", kind(&other)),
                ));
            }
        };
        if n < min || n > max {
            return Err(self.err(
                key,
                format!("{n} is out of range: use {min} to {max} {unit}"),
            ));
        }
        Ok(n)
    }

    pub(super) fn strings(
        &mut self,
        key: &'static str,
        v: Value,
        max: usize,
    ) -> Result<Vec<String>, KeyError> {
        let Value::Array(items) = v else {
            return Err(self.err(
                key,
                format!("expected a list of strings, found {}", kind(&v)),
            ));
        };
        if items.len() > max {
            return Err(self.err(key, format!("{} entries: at most {max}", items.len())));
        }
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            match item {
                Value::String(s) if !s.is_empty() && !s.contains('\0') && s.len() <= 4096 => {
                    out.push(s)
                }
                other => {
                    return Err(self.err(
                        key,
                        format!(
                            "entry {i} must be a non-empty string of at most 4096 bytes, found {}",
                            kind(&other)
                        ),
                    ));
                }
            }
        }
        Ok(out)
    }

    pub(super) fn object(&mut self, key: &'static str, v: Value) -> Result<Obj, KeyError> {
        Obj::new(&self.path(key), v)
    }

    /// Refuses keys nobody took.
    pub(super) fn finish(self) -> Result<(), KeyError> {
        let mut unknown: Vec<&String> = self.map.keys().collect();
        unknown.sort();
        match unknown.first() {
            None => Ok(()),
            Some(k) => Err(KeyError {
                key: self.path(k),
                problem: format!(
                    "unknown key: the keys allowed here are {}",
                    self.known.join(", ")
                ),
            }),
        }
    }
}

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
