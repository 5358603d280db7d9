//! Base64 (RFC 4648) through the `base64` crate, configured in one place:
//! the URL-safe alphabet without padding that JWTs and JWKs use, decoded
//! strictly (no padding, no whitespace, zero trailing bits), and the standard
//! alphabet with padding for HTTP Basic credentials and JetStream API answers.
//!
//! Shared by the auth callout (JWT and JWK decoding, NATS JWT encoding), the
//! agent (the Basic credentials of its token requests) and the test harness.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;

/// URL-safe base64 without padding, strict: padding, characters outside the
/// alphabet (whitespace included) and non-zero trailing bits are refused.
pub const URL: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(false),
);

/// Standard base64 with `=` padding (HTTP Basic credentials).
pub const STD: GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// URL-safe base64 without padding.
pub fn encode_url(data: &[u8]) -> String {
    URL.encode(data)
}

/// Standard base64 with `=` padding.
pub fn encode_std(data: &[u8]) -> String {
    STD.encode(data)
}

/// Strict URL-safe base64 without padding: `None` on any other character,
/// an impossible length, or non-zero trailing bits.
pub fn decode_url(text: &str) -> Option<Vec<u8>> {
    URL.decode(text).ok()
}

/// Standard base64 with `=` padding (the bodies and headers in JetStream
/// API answers): `None` on anything else.
pub fn decode_std(text: &str) -> Option<Vec<u8>> {
    STD.decode(text).ok()
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
            assert_eq!(decode_std(std).as_deref(), Some(plain.as_bytes()));
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
        assert_eq!(decode_url("Zg="), None, "partial padding");
        assert_eq!(decode_url("+/+/"), None, "standard alphabet");
        assert_eq!(decode_url("Zh"), None, "non-zero trailing bits");
        assert_eq!(decode_url("Zm9vYmFz"), Some(b"foobas".to_vec()));
        assert_eq!(decode_url("Zm9vYmF"), None, "non-zero trailing bits");
        assert_eq!(decode_url("Zm9vY"), None, "impossible length");
        assert_eq!(decode_url("Zm 9v"), None, "whitespace");
        assert_eq!(decode_url("Zm9v\n"), None, "trailing newline");
        assert_eq!(decode_url(" Zm9v"), None, "leading space");
        // The JWT header {"alg":"none"} round trips.
        let h = encode_url(br#"{"alg":"none"}"#);
        assert_eq!(h, "eyJhbGciOiJub25lIn0");
        assert_eq!(decode_url(&h).as_deref(), Some(&br#"{"alg":"none"}"#[..]));
    }

    #[test]
    fn url_decoding_round_trips_every_length() {
        let data: Vec<u8> = (0..=255u8).collect();
        for n in 0..data.len() {
            let text = encode_url(&data[..n]);
            assert!(!text.contains('='), "{text}");
            assert_eq!(decode_url(&text).as_deref(), Some(&data[..n]), "{n} bytes");
        }
    }
}
