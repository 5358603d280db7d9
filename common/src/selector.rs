//! Label selectors in the syntax Kubernetes users know, over a device's
//! operator labels and its facts ([`crate::labels::attributes`]):
//!
//! | form | matches a device |
//! |---|---|
//! | `key=value`, `key==value` | whose `key` is `value` |
//! | `key!=value` | whose `key` is absent or another value |
//! | `key in (a,b)` | whose `key` is one of them |
//! | `key notin (a,b)` | whose `key` is absent or none of them |
//! | `key` | that has `key` |
//! | `!key` | that has no `key` |
//!
//! Requirements are separated by commas and all must hold. An empty
//! selector matches every device. A selector that does not parse is
//! refused with where and why, before anything is read or written.

use std::collections::BTreeSet;
use std::fmt;

use crate::contracts::{is_label_key, MAX_LABEL_CHARS};

/// One requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

impl Requirement {
    pub fn key(&self) -> &str {
        match self {
            Self::Eq(k, _)
            | Self::NotEq(k, _)
            | Self::In(k, _)
            | Self::NotIn(k, _)
            | Self::Exists(k)
            | Self::NotExists(k) => k,
        }
    }

    fn matches(&self, value: Option<&str>) -> bool {
        match self {
            Self::Eq(_, v) => value == Some(v.as_str()),
            Self::NotEq(_, v) => value != Some(v.as_str()),
            Self::In(_, set) => value.is_some_and(|x| set.contains(x)),
            Self::NotIn(_, set) => value.is_none_or(|x| !set.contains(x)),
            Self::Exists(_) => value.is_some(),
            Self::NotExists(_) => value.is_none(),
        }
    }
}

/// A parsed selector: every requirement must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    pub requirements: Vec<Requirement>,
    text: String,
}

/// A selector that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError {
    pub selector: String,
    pub why: String,
}

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "selector {:?}: {}; use key=value, key!=value, key in (a,b), key notin (a,b), key or !key, separated by commas",
            self.selector, self.why
        )
    }
}

impl std::error::Error for SelectorError {}

/// Longest selector text.
const MAX_SELECTOR_CHARS: usize = 4096;

fn value_ok(v: &str) -> bool {
    v.len() <= MAX_LABEL_CHARS + 1
        && v.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'+'))
}

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => {
                depth += 1;
                if depth > 1 {
                    return Err("nested parentheses".into());
                }
            }
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("')' without '('".into());
                }
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("'(' without ')'".into());
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn key(k: &str) -> Result<String, String> {
    let k = k.trim();
    if k.is_empty() {
        return Err("a requirement has no key".into());
    }
    if !is_label_key(k) {
        return Err(format!(
            "{k:?} is not a key (1 to {MAX_LABEL_CHARS} letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
        ));
    }
    Ok(k.to_owned())
}

fn value(k: &str, v: &str) -> Result<String, String> {
    let v = v.trim();
    if !value_ok(v) {
        return Err(format!(
            "{k}: value {v:?} may hold only letters, digits, '-', '_', '.' and '+'"
        ));
    }
    Ok(v.to_owned())
}

fn set(k: &str, rest: &str) -> Result<BTreeSet<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("{k}: give the values in parentheses: {k} in (a,b)"))?;
    let mut out = BTreeSet::new();
    for v in inner.split(',') {
        out.insert(value(k, v)?);
    }
    if out.iter().all(String::is_empty) && inner.trim().is_empty() {
        return Err(format!("{k}: an empty set of values"));
    }
    Ok(out)
}

fn requirement(r: &str) -> Result<Requirement, String> {
    let r = r.trim();
    if r.is_empty() {
        return Err("an empty requirement (two commas, or one at an end)".into());
    }
    if let Some(k) = r.strip_prefix('!') {
        if k.contains(['=', '!', '(', ' ']) {
            return Err(format!("{r:?}: '!' takes a key alone (!key)"));
        }
        return Ok(Requirement::NotExists(key(k)?));
    }
    if let Some((k, v)) = r.split_once("!=") {
        return Ok(Requirement::NotEq(key(k)?, value(k.trim(), v)?));
    }
    if let Some((k, v)) = r.split_once("==").or_else(|| r.split_once('=')) {
        if v.contains('=') {
            return Err(format!("{r:?}: one '=' per requirement"));
        }
        return Ok(Requirement::Eq(key(k)?, value(k.trim(), v)?));
    }
    let Some((k, rest)) = r.split_once(char::is_whitespace) else {
        return Ok(Requirement::Exists(key(r)?));
    };
    let rest = rest.trim_start();
    let cut = rest
        .find(|c: char| c.is_whitespace() || c == '(')
        .unwrap_or(rest.len());
    let (op, values) = rest.split_at(cut);
    match op {
        "in" => Ok(Requirement::In(key(k)?, set(k, values)?)),
        "notin" => Ok(Requirement::NotIn(key(k)?, set(k, values)?)),
        _ => Err(format!(
            "{k}: unknown operator {op:?} (=, ==, !=, in, notin)"
        )),
    }
}

impl Selector {
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        let err = |why: String| SelectorError {
            selector: text.to_owned(),
            why,
        };
        if text.len() > MAX_SELECTOR_CHARS {
            return Err(err(format!("longer than {MAX_SELECTOR_CHARS} characters")));
        }
        if text.trim().is_empty() {
            return Ok(Selector::default());
        }
        let mut requirements = Vec::new();
        for part in split_top(text).map_err(err)? {
            requirements.push(requirement(part).map_err(err)?);
        }
        Ok(Selector {
            requirements,
            text: text.to_owned(),
        })
    }

    /// Whether a device whose attribute `k` is `get(k)` matches.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| r.matches(get(r.key())))
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn sel(s: &str) -> Selector {
        Selector::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    fn m(s: &str, attrs: &[(&str, &str)]) -> bool {
        let a: BTreeMap<&str, &str> = attrs.iter().copied().collect();
        sel(s).matches(|k| a.get(k).copied())
    }

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_form_parses() {
        assert_eq!(
            sel("site=berlin,tier!=canary,env in (prod, stage),env notin (x),legacy,!old, a==b")
                .requirements,
            vec![
                Requirement::Eq("site".into(), "berlin".into()),
                Requirement::NotEq("tier".into(), "canary".into()),
                Requirement::In("env".into(), set(&["prod", "stage"])),
                Requirement::NotIn("env".into(), set(&["x"])),
                Requirement::Exists("legacy".into()),
                Requirement::NotExists("old".into()),
                Requirement::Eq("a".into(), "b".into()),
            ]
        );
        assert_eq!(sel("").requirements, vec![]);
        assert_eq!(
            sel("agent-version=0.2.0+build.1").requirements,
            vec![Requirement::Eq(
                "agent-version".into(),
                "0.2.0+build.1".into()
            )]
        );
        assert_eq!(
            sel("tier=").requirements,
            vec![Requirement::Eq("tier".into(), String::new())]
        );
    }

    #[test]
    fn matching_follows_kubernetes() {
        let berlin = [("site", "berlin"), ("env", "prod")];
        assert!(m("site=berlin", &berlin));
        assert!(!m("site=paris", &berlin));
        assert!(m("tier!=canary", &berlin), "!= matches an absent key");
        assert!(!m("site!=berlin", &berlin));
        assert!(m("env in (prod,stage)", &berlin));
        assert!(!m("env in (stage)", &berlin));
        assert!(!m("tier in (canary)", &berlin), "in needs the key");
        assert!(
            m("tier notin (canary)", &berlin),
            "notin matches an absent key"
        );
        assert!(!m("env notin (prod)", &berlin));
        assert!(m("site", &berlin));
        assert!(!m("legacy", &berlin));
        assert!(m("!legacy", &berlin));
        assert!(!m("!site", &berlin));
        assert!(m("site=berlin,env in (prod),!legacy", &berlin));
        assert!(
            !m("site=berlin,legacy", &berlin),
            "every requirement must hold"
        );
        assert!(m("", &berlin), "empty matches all");
    }

    #[test]
    fn bad_syntax_is_refused_saying_why() {
        for (s, says) in [
            ("site=berlin,", "an empty requirement"),
            (",site", "an empty requirement"),
            ("env in (prod", "'(' without ')'"),
            ("env in prod)", "')' without '('"),
            ("env in prod", "give the values in parentheses"),
            ("env in ()", "an empty set of values"),
            ("env within (a)", "unknown operator \"within\""),
            ("site=ber lin", "value \"ber lin\" may hold only"),
            ("=berlin", "a requirement has no key"),
            ("-site=x", "\"-site\" is not a key"),
            ("!site=x", "'!' takes a key alone"),
            ("a=b=c", "one '=' per requirement"),
            ("env in ((a))", "nested parentheses"),
        ] {
            let e = Selector::parse(s).expect_err(s);
            let text = e.to_string();
            assert!(text.contains(says), "{s}: {text}");
            assert!(text.contains("use key=value"), "{text}");
        }
    }
}
