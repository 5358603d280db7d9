//! Base64 (RFC 4648): the URL-safe alphabet without padding that JWTs and
//! JWKs use, strictly decoded (no padding, no whitespace, zero trailing
//! bits), and the standard alphabet with padding for HTTP Basic credentials.
//!
//! Shared by the auth callout (JWT and JWK decoding, NATS JWT encoding) and
//! the agent (the Basic credentials of its token requests).

const URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// URL-safe base64 without padding.
pub fn encode_url(data: &[u8]) -> String {
    encode(data, URL, false)
}

/// Standard base64 with `=` padding.
pub fn encode_std(data: &[u8]) -> String {
    encode(data, STD, true)
}

fn encode(data: &[u8], alphabet: &[u8; 64], pad: bool) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..4 {
            if i < chars {
                out.push(char::from(alphabet[((n >> (18 - 6 * i)) & 0x3f) as usize]));
            } else if pad {
                out.push('=');
            }
        }
    }
    out
}

/// Strict URL-safe base64 without padding: `None` on any other character,
/// an impossible length, or non-zero trailing bits.
pub fn decode_url(text: &str) -> Option<Vec<u8>> {
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut buffer: u32 = 0;
    let mut bits = 0u32;
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        buffer = ((buffer << 6) | u32::from(v)) & 0xff_ffff;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((buffer >> bits) & 0xff) as u8);
        }
    }
    if buffer & ((1 << bits) - 1) != 0 {
        return None;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4648_vectors() {
        for (plain, std, url) in [
            ("", "", ""),
            ("f", "Zg==", "Zg"),
            ("fo", "Zm8=", "Zm8"),
            ("foo", "Zm9v", "Zm9v"),
            ("foob", "Zm9vYg==", "Zm9vYg"),
            ("fooba", "Zm9vYmE=", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy", "Zm9vYmFy"),
        ] {
            assert_eq!(encode_std(plain.as_bytes()), std);
            assert_eq!(encode_url(plain.as_bytes()), url);
            assert_eq!(decode_url(url).as_deref(), Some(plain.as_bytes()));
        }
    }

    #[test]
    fn url_alphabet_differs_from_standard() {
        let data = [0xfb, 0xff, 0xbf];
        assert_eq!(encode_std(&data), "+/+/");
        assert_eq!(encode_url(&data), "-_-_");
        assert_eq!(decode_url("-_-_").as_deref(), Some(&data[..]));
    }

    #[test]
    fn strict_decoding_refuses_non_canonical_text() {
        assert_eq!(decode_url("Zg=="), None, "padding");
        assert_eq!(decode_url("+/+/"), None, "standard alphabet");
        assert_eq!(decode_url("Zh"), None, "non-zero trailing bits");
        assert_eq!(decode_url("Zm9vY"), None, "impossible length");
        assert_eq!(decode_url("Zm 9v"), None, "whitespace");
        // The JWT header {"alg":"none"} round trips.
        let h = encode_url(br#"{"alg":"none"}"#);
        assert_eq!(h, "eyJhbGciOiJub25lIn0");
        assert_eq!(decode_url(&h).as_deref(), Some(&br#"{"alg":"none"}"#[..]));
    }
}
