//! NATS nkeys as text: the encoding of Ed25519 public keys and seeds that
//! nats-server configs and NATS JWTs use (no cryptography here; signing lives
//! in `fleet-auth-callout`).
//!
//! A public key is base32 (RFC 4648 alphabet, no padding) of one prefix byte
//! naming its kind (`A` account, `N` server, `U` user, ...), the 32 key bytes
//! and a CRC-16/XMODEM of those 33 bytes, little-endian: 56 characters. A seed
//! is base32 of two prefix bytes (the seed marker `S` and the kind spread over
//! both), the 32 seed bytes and the CRC: 58 characters starting `S<kind>`.
//! Decoding is strict: only upper-case base32, zero trailing bits, a matching
//! checksum and a known kind.

use std::fmt;

/// Characters of an encoded public key.
pub const PUBLIC_KEY_CHARS: usize = 56;
/// Characters of an encoded seed.
pub const SEED_CHARS: usize = 58;

/// The prefix byte of a seed (`S` once encoded).
const SEED_PREFIX: u8 = 18 << 3;
const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// What an nkey is for, as its first letter tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NkeyKind {
    Operator,
    Account,
    Server,
    Cluster,
    User,
    /// An x25519 key (`X`), used by the callout's optional encryption.
    Curve,
}

impl NkeyKind {
    const ALL: [NkeyKind; 6] = [
        Self::Operator,
        Self::Account,
        Self::Server,
        Self::Cluster,
        Self::User,
        Self::Curve,
    ];

    fn prefix_byte(self) -> u8 {
        match self {
            Self::Operator => 14 << 3,
            Self::Account => 0,
            Self::Server => 13 << 3,
            Self::Cluster => 2 << 3,
            Self::User => 20 << 3,
            Self::Curve => 23 << 3,
        }
    }

    fn from_prefix_byte(b: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.prefix_byte() == b)
    }

    /// The first letter of its public keys.
    pub fn letter(self) -> char {
        match self {
            Self::Operator => 'O',
            Self::Account => 'A',
            Self::Server => 'N',
            Self::Cluster => 'C',
            Self::User => 'U',
            Self::Curve => 'X',
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Account => "account",
            Self::Server => "server",
            Self::Cluster => "cluster",
            Self::User => "user",
            Self::Curve => "curve (xkey)",
        }
    }
}

/// Why a text is not the nkey asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NkeyError {
    /// Not 56 (public) or 58 (seed) characters.
    Length {
        what: &'static str,
        chars: usize,
    },
    /// A character outside `A-Z2-7`, or non-zero trailing bits.
    Base32 {
        what: &'static str,
    },
    Checksum {
        what: &'static str,
    },
    UnknownPrefix {
        what: &'static str,
    },
    /// A valid key of another kind.
    WrongKind {
        what: &'static str,
        expected: NkeyKind,
        found: NkeyKind,
    },
}

impl fmt::Display for NkeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Length { what, chars } => {
                let want = if *what == "seed" {
                    SEED_CHARS
                } else {
                    PUBLIC_KEY_CHARS
                };
                write!(
                    f,
                    "invalid nkey {what}: {chars} characters, expected {want}; copy the whole key without spaces or quotes"
                )
            }
            Self::Base32 { what } => write!(
                f,
                "invalid nkey {what}: not upper-case base32 (A-Z, 2-7); copy the key again"
            ),
            Self::Checksum { what } => write!(
                f,
                "invalid nkey {what}: checksum mismatch, the key was altered or mistyped; copy it again"
            ),
            Self::UnknownPrefix { what } => {
                write!(f, "invalid nkey {what}: unknown key type prefix")
            }
            Self::WrongKind {
                what,
                expected,
                found,
            } => write!(
                f,
                "wrong nkey {what}: a {} key (starting {}), expected a {} key (starting {})",
                found.name(),
                found.letter(),
                expected.name(),
                expected.letter()
            ),
        }
    }
}

impl std::error::Error for NkeyError {}

/// A public nkey of a known kind.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PublicNkey {
    kind: NkeyKind,
    key: [u8; 32],
}

impl PublicNkey {
    pub fn new(kind: NkeyKind, key: [u8; 32]) -> Self {
        Self { kind, key }
    }

    /// Any kind of public key.
    pub fn parse(text: &str) -> Result<Self, NkeyError> {
        const WHAT: &str = "public key";
        if text.len() != PUBLIC_KEY_CHARS {
            return Err(NkeyError::Length {
                what: WHAT,
                chars: text.chars().count(),
            });
        }
        let raw = decode_checked(text, WHAT)?;
        let kind =
            NkeyKind::from_prefix_byte(raw[0]).ok_or(NkeyError::UnknownPrefix { what: WHAT })?;
        let mut key = [0u8; 32];
        key.copy_from_slice(&raw[1..33]);
        Ok(Self { kind, key })
    }

    /// A public key of kind `expected`.
    pub fn parse_kind(text: &str, expected: NkeyKind) -> Result<Self, NkeyError> {
        let k = Self::parse(text)?;
        if k.kind != expected {
            return Err(NkeyError::WrongKind {
                what: "public key",
                expected,
                found: k.kind,
            });
        }
        Ok(k)
    }

    pub fn kind(&self) -> NkeyKind {
        self.kind
    }

    /// The raw Ed25519 (or x25519) public key.
    pub fn key(&self) -> &[u8; 32] {
        &self.key
    }

    pub fn encode(&self) -> String {
        let mut raw = Vec::with_capacity(35);
        raw.push(self.kind.prefix_byte());
        raw.extend_from_slice(&self.key);
        push_crc(&mut raw);
        base32_encode(&raw)
    }
}

impl fmt::Display for PublicNkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

impl fmt::Debug for PublicNkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicNkey({})", self.encode())
    }
}

/// A seed: the private half of an nkey. `Debug` does not show it and there is
/// no `Display`; [`NkeySeed::encode`] is for writing a new seed file only.
#[derive(Clone, PartialEq, Eq)]
pub struct NkeySeed {
    kind: NkeyKind,
    seed: [u8; 32],
}

impl NkeySeed {
    pub fn new(kind: NkeyKind, seed: [u8; 32]) -> Self {
        Self { kind, seed }
    }

    /// A seed of any kind.
    pub fn parse(text: &str) -> Result<Self, NkeyError> {
        const WHAT: &str = "seed";
        if text.len() != SEED_CHARS {
            return Err(NkeyError::Length {
                what: WHAT,
                chars: text.chars().count(),
            });
        }
        let raw = decode_checked(text, WHAT)?;
        if raw[0] & 0xf8 != SEED_PREFIX {
            return Err(NkeyError::UnknownPrefix { what: WHAT });
        }
        // The kind's prefix byte is spread over two bytes: its high 3 bits
        // in the low bits of the first, its low 5 bits in the high bits of
        // the second (whose low 3 bits are zero).
        let prefix = ((raw[0] & 0x07) << 5) | (raw[1] >> 3);
        if raw[1] & 0x07 != 0 {
            return Err(NkeyError::UnknownPrefix { what: WHAT });
        }
        let kind =
            NkeyKind::from_prefix_byte(prefix).ok_or(NkeyError::UnknownPrefix { what: WHAT })?;
        let mut seed = [0u8; 32];
        seed.copy_from_slice(&raw[2..34]);
        Ok(Self { kind, seed })
    }

    /// A seed of kind `expected`.
    pub fn parse_kind(text: &str, expected: NkeyKind) -> Result<Self, NkeyError> {
        let s = Self::parse(text)?;
        if s.kind != expected {
            return Err(NkeyError::WrongKind {
                what: "seed",
                expected,
                found: s.kind,
            });
        }
        Ok(s)
    }

    pub fn kind(&self) -> NkeyKind {
        self.kind
    }

    /// The raw 32-byte Ed25519 seed.
    pub fn seed_bytes(&self) -> &[u8; 32] {
        &self.seed
    }

    /// The seed as text (`S` + kind letter + ...), for a new seed file.
    pub fn encode(&self) -> String {
        let p = self.kind.prefix_byte();
        let mut raw = Vec::with_capacity(36);
        raw.push(SEED_PREFIX | (p >> 5));
        raw.push((p & 0x1f) << 3);
        raw.extend_from_slice(&self.seed);
        push_crc(&mut raw);
        base32_encode(&raw)
    }
}

impl fmt::Debug for NkeySeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NkeySeed({}, <redacted>)", self.kind.name())
    }
}

/// Base32-decodes `text` and checks and strips its CRC.
fn decode_checked(text: &str, what: &'static str) -> Result<Vec<u8>, NkeyError> {
    let mut raw = base32_decode(text).ok_or(NkeyError::Base32 { what })?;
    if raw.len() < 3 {
        return Err(NkeyError::Base32 { what });
    }
    let n = raw.len() - 2;
    let crc = u16::from_le_bytes([raw[n], raw[n + 1]]);
    raw.truncate(n);
    if crc16(&raw) != crc {
        return Err(NkeyError::Checksum { what });
    }
    Ok(raw)
}

fn push_crc(raw: &mut Vec<u8>) {
    let crc = crc16(raw);
    raw.extend_from_slice(&crc.to_le_bytes());
}

/// CRC-16/XMODEM (polynomial 0x1021, initial value 0, no reflection), the
/// checksum of nkeys.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// RFC 4648 base32, upper case, no padding.
pub fn base32_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(5) * 8);
    let mut buffer: u32 = 0;
    let mut bits = 0u32;
    for &b in data {
        buffer = (buffer << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 0x1f) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(
            ALPHABET[((buffer << (5 - bits)) & 0x1f) as usize],
        ));
    }
    out
}

/// Strict RFC 4648 base32 without padding: `None` on a character outside
/// the alphabet, an impossible length, or non-zero trailing bits.
pub fn base32_decode(text: &str) -> Option<Vec<u8>> {
    // 8 characters carry 5 bytes; a final group of 1, 3 or 6 is impossible.
    if matches!(text.len() % 8, 1 | 3 | 6) {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 5 / 8);
    let mut buffer: u32 = 0;
    let mut bits = 0u32;
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'2'..=b'7' => c - b'2' + 26,
            _ => return None,
        };
        buffer = (buffer << 5) | u32::from(v);
        bits += 5;
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

    // Published pair from the nkeys test suite.
    const SEED: &str = "SAAPN4W3EG6KCJGUQTKTJ5GSB5NHK5CHAJL4DBGFUM3HHROI4XUEP4OBK4";
    const ACCOUNT: &str = "ACODERUVFFAWZQDSS6SBIACUA5O6SXF7HJ3YTYXBALHZP3P7R4BUO4J2";

    #[test]
    fn crc16_matches_the_xmodem_check_value() {
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn base32_matches_rfc4648_vectors() {
        for (plain, enc) in [
            ("", ""),
            ("f", "MY"),
            ("fo", "MZXQ"),
            ("foo", "MZXW6"),
            ("foob", "MZXW6YQ"),
            ("fooba", "MZXW6YTB"),
            ("foobar", "MZXW6YTBOI"),
        ] {
            assert_eq!(base32_encode(plain.as_bytes()), enc);
            assert_eq!(base32_decode(enc).as_deref(), Some(plain.as_bytes()));
        }
        assert_eq!(base32_decode("MZXW6YTBO"), None, "impossible length");
        assert_eq!(base32_decode("mzxw6"), None, "lower case");
        assert_eq!(base32_decode("MZ"), None, "non-zero trailing bits");
        assert_eq!(base32_decode("MZXW6===").as_deref(), None, "padding");
    }

    #[test]
    fn published_seed_and_public_key_decode_and_reencode() {
        let seed = NkeySeed::parse_kind(SEED, NkeyKind::Account).expect("seed");
        assert_eq!(seed.kind(), NkeyKind::Account);
        assert_eq!(seed.encode(), SEED);
        let public = PublicNkey::parse_kind(ACCOUNT, NkeyKind::Account).expect("public");
        assert_eq!(public.encode(), ACCOUNT);
        assert_eq!(public.to_string(), ACCOUNT);
        assert!(!format!("{seed:?}").contains(&SEED[2..10]));
    }

    #[test]
    fn every_kind_round_trips_with_its_letter() {
        for kind in NkeyKind::ALL {
            let p = PublicNkey::new(kind, [7u8; 32]);
            let text = p.encode();
            assert_eq!(text.len(), PUBLIC_KEY_CHARS);
            assert!(text.starts_with(kind.letter()), "{kind:?} {text}");
            assert_eq!(PublicNkey::parse(&text), Ok(p));
            let s = NkeySeed::new(kind, [9u8; 32]);
            let text = s.encode();
            assert_eq!(text.len(), SEED_CHARS);
            assert!(text.starts_with('S'));
            assert_eq!(text.chars().nth(1), Some(kind.letter()), "{kind:?} {text}");
            assert_eq!(NkeySeed::parse(&text), Ok(s));
        }
    }

    #[test]
    fn refusals_name_the_problem() {
        assert_eq!(
            PublicNkey::parse("ABC").map(|_| ()),
            Err(NkeyError::Length {
                what: "public key",
                chars: 3
            })
        );
        let mut flipped = ACCOUNT.to_owned();
        flipped.replace_range(10..11, if &ACCOUNT[10..11] == "A" { "B" } else { "A" });
        let err = PublicNkey::parse(&flipped).expect_err("altered");
        assert_eq!(err, NkeyError::Checksum { what: "public key" });
        assert_eq!(
            err.to_string(),
            "invalid nkey public key: checksum mismatch, the key was altered or mistyped; copy it again"
        );
        let err = PublicNkey::parse_kind(ACCOUNT, NkeyKind::User).expect_err("kind");
        assert_eq!(
            err.to_string(),
            "wrong nkey public key: a account key (starting A), expected a user key (starting U)"
        );
        assert_eq!(
            NkeySeed::parse(ACCOUNT).map(|_| ()),
            Err(NkeyError::Length {
                what: "seed",
                chars: 56
            })
        );
        let lower = SEED.to_lowercase();
        assert_eq!(
            NkeySeed::parse(&lower).map(|_| ()),
            Err(NkeyError::Base32 { what: "seed" })
        );
        assert_eq!(
            NkeySeed::parse_kind(SEED, NkeyKind::User).map(|_| ()),
            Err(NkeyError::WrongKind {
                what: "seed",
                expected: NkeyKind::User,
                found: NkeyKind::Account
            })
        );
    }
}
