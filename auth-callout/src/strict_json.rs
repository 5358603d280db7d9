//! JSON as the callout reads the identity provider's words (JWT header,
//! claims, JWKS): a `serde_json::Value`, except that an object naming the
//! same key twice, at any depth, is refused.
//!
//! Why: `serde_json::Value` keeps the last of duplicate keys, other parsers
//! keep the first. A token signed with `device_id` twice would then prove one
//! device to one parser and another device to the next; RFC 7519 section 4
//! lets a verifier refuse such a token, and a security boundary must.
//! Nesting depth stays bounded by serde_json's recursion limit (128).

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;
use serde_json::{Map, Value};

/// Longest duplicate key quoted back.
const SHOWN_KEY_CHARS: usize = 80;

/// Why bytes are not strict JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StrictJsonError {
    /// Not JSON at all (syntax, encoding, trailing bytes, nesting too deep).
    Syntax,
    /// An object names `key` twice (the key, cut to 80 characters).
    DuplicateKey(String),
}

impl fmt::Display for StrictJsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syntax => f.write_str("not JSON"),
            Self::DuplicateKey(k) => write!(f, "names the key {k:?} twice"),
        }
    }
}

/// Parses `bytes` as one JSON value, refusing duplicate object keys.
pub fn parse(bytes: &[u8]) -> Result<Value, StrictJsonError> {
    let duplicate = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = Strict(&duplicate)
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v));
    match (parsed, duplicate.into_inner()) {
        (Ok(v), None) => Ok(v),
        (_, Some(key)) => Err(StrictJsonError::DuplicateKey(key)),
        (Err(_), None) => Err(StrictJsonError::Syntax),
    }
}

/// Parses `bytes` as one JSON object, refusing duplicate keys; `None` for
/// any other value.
pub fn parse_object(bytes: &[u8]) -> Result<Option<Map<String, Value>>, StrictJsonError> {
    Ok(match parse(bytes)? {
        Value::Object(m) => Some(m),
        _ => None,
    })
}

/// The seed: builds a `Value`, noting the first duplicate key it meets.
#[derive(Clone, Copy)]
struct Strict<'a>(&'a RefCell<Option<String>>);

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // JSON text has no NaN or infinity; `from` maps them to null anyway.
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(self)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                let shown: String = key.chars().take(SHOWN_KEY_CHARS).collect();
                *self.0.borrow_mut() = Some(shown);
                return Err(A::Error::custom("duplicate key"));
            }
            let v = map.next_value_seed(self)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_what_serde_json_parses() {
        let text = br#"{"a":[1,-2,3.5,true,null,"x\u0000"],"b":{"c":{}},"d":18446744073709551615}"#;
        assert_eq!(
            parse(text),
            Ok(serde_json::from_slice::<Value>(text).expect("json"))
        );
        assert_eq!(parse(b" 7 "), Ok(json!(7)));
        assert_eq!(parse_object(b"[]"), Ok(None));
    }

    #[test]
    fn refuses_duplicate_keys_at_any_depth() {
        for (text, key) in [
            (r#"{"a":1,"a":2}"#, "a"),
            (r#"{"a":1,"b":{"c":1,"c":1}}"#, "c"),
            (r#"{"keys":[{"kid":"k","kid":"k"}]}"#, "kid"),
            // The same key spelt with an escape is the same key.
            (r#"{"alg":"RS256","\u0061lg":"none"}"#, "alg"),
        ] {
            assert_eq!(
                parse(text.as_bytes()),
                Err(StrictJsonError::DuplicateKey(key.into())),
                "{text}"
            );
        }
        assert_eq!(
            StrictJsonError::DuplicateKey("a".into()).to_string(),
            "names the key \"a\" twice"
        );
        // The same key in sibling objects is fine.
        assert!(parse(br#"[{"a":1},{"a":2}]"#).is_ok());
    }

    #[test]
    fn refuses_what_is_not_json() {
        for text in [
            &b""[..],
            b"{",
            b"{} x",
            b"{\"a\":}",
            b"\xff",
            b"NaN",
            &[b'['; 200],
        ] {
            assert_eq!(parse(text), Err(StrictJsonError::Syntax), "{text:?}");
        }
    }
}
