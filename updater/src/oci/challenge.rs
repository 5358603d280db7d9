//! The registry's `Bearer` challenge (RFC 6750): parsed from a 401 and
//! turned into the anonymous token request.

use super::error::{shown, OciError, SHOWN_CHARS};

/// A `Bearer` challenge (RFC 6750), as registries send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    pub(super) realm: String,
    pub(super) service: Option<String>,
    pub(super) scope: Option<String>,
}

pub(super) fn challenge_of(url: &str, response: &ureq::Response) -> Result<Challenge, OciError> {
    let headers = response.all("www-authenticate");
    let refuse = |why: String| OciError::Challenge {
        url: url.to_owned(),
        why,
    };
    if headers.is_empty() {
        return Err(refuse(
            "HTTP 401 without a WWW-Authenticate header".to_owned(),
        ));
    }
    let mut schemes = Vec::new();
    for h in &headers {
        match parse_bearer(h) {
            Ok(c) => return Ok(c),
            Err(ChallengeError::Scheme(s)) => schemes.push(s),
            Err(ChallengeError::Malformed(why)) => {
                return Err(refuse(format!("its Bearer challenge {}: {why}", shown(h))))
            }
        }
    }
    Err(refuse(format!(
        "it offers {} authentication, not an anonymous Bearer token",
        schemes.join(", ")
    )))
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ChallengeError {
    /// Another scheme (Basic, ...): its name.
    Scheme(String),
    Malformed(&'static str),
}

/// Parses `Bearer realm="..",service="..",scope=".."` (parameters as
/// tokens or quoted strings, in any order, unknown ones ignored).
pub(crate) fn parse_bearer(header: &str) -> Result<Challenge, ChallengeError> {
    let header = header.trim();
    let (scheme, mut rest) = header.split_once([' ', '\t']).unwrap_or((header, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(ChallengeError::Scheme(
            scheme.chars().take(SHOWN_CHARS).collect(),
        ));
    }
    let (mut realm, mut service, mut scope) = (None, None, None);
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            break;
        }
        let eq = rest
            .find('=')
            .ok_or(ChallengeError::Malformed("a parameter without '='"))?;
        let name = rest[..eq].trim().to_ascii_lowercase();
        rest = rest[eq + 1..].trim_start();
        let value;
        if let Some(quoted) = rest.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, escaped)) => v.push(escaped),
                        None => break,
                    },
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => v.push(c),
                }
            }
            let end = end.ok_or(ChallengeError::Malformed("an unterminated quoted string"))?;
            value = v;
            rest = &quoted[end + 1..];
        } else {
            let end = rest.find([',', ' ', '\t']).unwrap_or(rest.len());
            value = rest[..end].to_owned();
            rest = &rest[end..];
        }
        match name.as_str() {
            "realm" => realm = Some(value),
            "service" => service = Some(value),
            "scope" => scope = Some(value),
            _ => {}
        }
    }
    let realm = realm.ok_or(ChallengeError::Malformed("no realm"))?;
    Ok(Challenge {
        realm,
        service,
        scope,
    })
}

/// RFC 3986 percent-encoding of everything but the unreserved characters.
pub(super) fn percent_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
