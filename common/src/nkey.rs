//! NATS nkeys as text, through the `nkeys` crate: typed wrappers that say
//! which kind of key a text is and why one is refused.
//!
//! A public key is 56 characters, a seed 58 starting `S<kind>`; the crate
//! decodes them (upper-case base32 without padding, CRC-16 checksum, a known
//! prefix). On top of it, a key must be of the kind asked for, and a seed is
//! accepted only as its canonical text (the crate maps a seed of an unknown
//! kind to an operator seed; re-encoding tells them apart).

use std::fmt;

use nkeys::error::ErrorKind;
use nkeys::{KeyPair, KeyPairType};

/// Characters of an encoded public key.
pub const PUBLIC_KEY_CHARS: usize = 56;
/// Characters of an encoded seed.
pub const SEED_CHARS: usize = 58;

/// What an nkey is for, as its first letter tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NkeyKind {
    Operator,
    Account,
    Server,
    Cluster,
    User,
    Module,
    Service,
    /// An x25519 key (`X`), used by the callout's optional encryption.
    Curve,
}

impl NkeyKind {
    /// Every kind the `nkeys` crate knows.
    pub const ALL: [NkeyKind; 8] = [
        Self::Operator,
        Self::Account,
        Self::Server,
        Self::Cluster,
        Self::User,
        Self::Module,
        Self::Service,
        Self::Curve,
    ];

    /// The first letter of its public keys.
    pub fn letter(self) -> char {
        match self {
            Self::Operator => 'O',
            Self::Account => 'A',
            Self::Server => 'N',
            Self::Cluster => 'C',
            Self::User => 'U',
            Self::Module => 'M',
            Self::Service => 'V',
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
            Self::Module => "module",
            Self::Service => "service",
            Self::Curve => "curve (xkey)",
        }
    }

    /// The `nkeys` crate's name for it.
    pub fn pair_type(self) -> KeyPairType {
        match self {
            Self::Operator => KeyPairType::Operator,
            Self::Account => KeyPairType::Account,
            Self::Server => KeyPairType::Server,
            Self::Cluster => KeyPairType::Cluster,
            Self::User => KeyPairType::User,
            Self::Module => KeyPairType::Module,
            Self::Service => KeyPairType::Service,
            Self::Curve => KeyPairType::Curve,
        }
    }

    fn of(t: &KeyPairType) -> Self {
        match t {
            KeyPairType::Operator => Self::Operator,
            KeyPairType::Account => Self::Account,
            KeyPairType::Server => Self::Server,
            KeyPairType::Cluster => Self::Cluster,
            KeyPairType::User => Self::User,
            KeyPairType::Module => Self::Module,
            KeyPairType::Service => Self::Service,
            KeyPairType::Curve => Self::Curve,
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

impl NkeyError {
    /// Ours for the `nkeys` crate's refusal of `text`.
    fn from_crate(e: &nkeys::error::Error, what: &'static str, text: &str) -> Self {
        match e.kind() {
            ErrorKind::InvalidKeyLength => Self::Length {
                what,
                chars: text.chars().count(),
            },
            ErrorKind::ChecksumFailure => Self::Checksum { what },
            ErrorKind::InvalidPrefix => Self::UnknownPrefix { what },
            // CodecFailure: not base32 (and nothing else the decoding of a
            // key of the right length reports).
            _ => Self::Base32 { what },
        }
    }
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

/// A public nkey of a known kind, as its validated text.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PublicNkey {
    kind: NkeyKind,
    text: String,
}

impl PublicNkey {
    /// Any kind of public key.
    pub fn parse(text: &str) -> Result<Self, NkeyError> {
        const WHAT: &str = "public key";
        let (prefix, _) =
            nkeys::from_public_key(text).map_err(|e| NkeyError::from_crate(&e, WHAT, text))?;
        // The crate refused any prefix but a public key's, so this is exact.
        let kind = NkeyKind::of(&KeyPairType::from(prefix));
        Ok(Self {
            kind,
            text: text.to_owned(),
        })
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

    /// The public key of `pair`.
    pub fn of(pair: &KeyPair) -> Self {
        Self {
            kind: NkeyKind::of(&pair.key_pair_type()),
            text: pair.public_key(),
        }
    }

    pub fn kind(&self) -> NkeyKind {
        self.kind
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn encode(&self) -> String {
        self.text.clone()
    }
}

impl fmt::Display for PublicNkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for PublicNkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicNkey({})", self.text)
    }
}

/// A seed: the private half of an nkey, as the crate's key pair. `Debug`
/// does not show it and there is no `Display`; [`NkeySeed::encode`] is for
/// writing a new seed file only.
#[derive(Clone)]
pub struct NkeySeed {
    kind: NkeyKind,
    pair: KeyPair,
    text: String,
}

impl NkeySeed {
    /// A fresh seed of `kind` from the crate's generator (the operating
    /// system's randomness through `rand`).
    pub fn generate(kind: NkeyKind) -> Result<Self, NkeyError> {
        let pair = KeyPair::new(kind.pair_type());
        let text = pair
            .seed()
            .map_err(|e| NkeyError::from_crate(&e, "seed", ""))?;
        Ok(Self { kind, pair, text })
    }

    /// A seed of any kind.
    pub fn parse(text: &str) -> Result<Self, NkeyError> {
        const WHAT: &str = "seed";
        let pair = KeyPair::from_seed(text).map_err(|e| NkeyError::from_crate(&e, WHAT, text))?;
        // An unknown kind decodes as an operator seed, and the bits below a
        // kind's prefix are not checked: only the canonical text is a seed.
        if pair.seed().ok().as_deref() != Some(text) {
            return Err(NkeyError::UnknownPrefix { what: WHAT });
        }
        Ok(Self {
            kind: NkeyKind::of(&pair.key_pair_type()),
            pair,
            text: text.to_owned(),
        })
    }

    /// A seed of kind `expected`.
    pub fn parse_kind(text: &str, expected: NkeyKind) -> Result<Self, NkeyError> {
        let s = Self::parse(text)?;
        s.expect_kind(expected)?;
        Ok(s)
    }

    /// Refuses a seed of another kind than `expected`.
    pub fn expect_kind(&self, expected: NkeyKind) -> Result<(), NkeyError> {
        if self.kind != expected {
            return Err(NkeyError::WrongKind {
                what: "seed",
                expected,
                found: self.kind,
            });
        }
        Ok(())
    }

    pub fn kind(&self) -> NkeyKind {
        self.kind
    }

    /// The key pair, to sign with.
    pub fn key_pair(&self) -> &KeyPair {
        &self.pair
    }

    /// Its public key.
    pub fn public_key(&self) -> PublicNkey {
        PublicNkey::of(&self.pair)
    }

    /// The seed as text (`S` + kind letter + ...), for a new seed file.
    pub fn encode(&self) -> String {
        self.text.clone()
    }
}

impl fmt::Debug for NkeySeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NkeySeed({}, <redacted>)", self.kind.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Published pair from the nkeys test suite.
    const SEED: &str = "SAAPN4W3EG6KCJGUQTKTJ5GSB5NHK5CHAJL4DBGFUM3HHROI4XUEP4OBK4";
    const ACCOUNT: &str = "ACODERUVFFAWZQDSS6SBIACUA5O6SXF7HJ3YTYXBALHZP3P7R4BUO4J2";

    #[test]
    fn published_seed_and_public_key_decode_and_reencode() {
        let seed = NkeySeed::parse_kind(SEED, NkeyKind::Account).expect("seed");
        assert_eq!(seed.kind(), NkeyKind::Account);
        assert_eq!(seed.encode(), SEED);
        assert_eq!(seed.public_key().as_str(), ACCOUNT);
        let public = PublicNkey::parse_kind(ACCOUNT, NkeyKind::Account).expect("public");
        assert_eq!(public.encode(), ACCOUNT);
        assert_eq!(public.to_string(), ACCOUNT);
        assert!(!format!("{seed:?}").contains(&SEED[2..10]));
    }

    #[test]
    fn every_kind_round_trips_with_its_letter() {
        for kind in NkeyKind::ALL {
            let s = NkeySeed::generate(kind).expect("seed");
            let text = s.encode();
            assert_eq!(text.len(), SEED_CHARS);
            assert!(text.starts_with('S'));
            assert_eq!(text.chars().nth(1), Some(kind.letter()), "{kind:?} {text}");
            let back = NkeySeed::parse(&text).expect("parses");
            assert_eq!((back.kind(), back.encode()), (kind, text));
            let p = s.public_key();
            let text = p.encode();
            assert_eq!(text.len(), PUBLIC_KEY_CHARS);
            assert!(text.starts_with(kind.letter()), "{kind:?} {text}");
            assert_eq!(p.kind(), kind);
            assert_eq!(PublicNkey::parse(&text), Ok(p));
        }
    }

    #[test]
    fn texts_the_crate_decodes_but_are_no_nkey_are_refused() {
        // Built outside (prefix bytes, 32 bytes of 9, CRC-16/XMODEM, base32),
        // each with a correct checksum:
        // a seed of the unknown kind 25 << 3, which the crate decodes as an
        // operator seed;
        let unknown_seed = "SZAASCIJBEEQSCIJBEEQSCIJBEEQSCIJBEEQSCIJBEEQSCIJBEEQSCII4Q";
        // an account seed with bits set below its kind;
        let stray_bits = "SAAQSCIJBEEQSCIJBEEQSCIJBEEQSCIJBEEQSCIJBEEQSCIJBEEQSCLIOI";
        // a public key of the unknown kind 25 << 3.
        let unknown_public = "ZAEQSCIJBEEQSCIJBEEQSCIJBEEQSCIJBEEQSCIJBEEQSCIJBEEQSIE4";
        for seed in [unknown_seed, stray_bits] {
            assert!(
                nkeys::KeyPair::from_seed(seed).is_ok(),
                "the crate decodes it"
            );
            assert_eq!(
                NkeySeed::parse(seed).map(|_| ()),
                Err(NkeyError::UnknownPrefix { what: "seed" }),
                "{seed}"
            );
        }
        assert_eq!(
            PublicNkey::parse(unknown_public),
            Err(NkeyError::UnknownPrefix { what: "public key" })
        );
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
            PublicNkey::parse(&ACCOUNT.to_lowercase()).map(|_| ()),
            Err(NkeyError::Base32 { what: "public key" })
        );
        // A seed is not a public key.
        assert_eq!(
            PublicNkey::parse(SEED).map(|_| ()),
            Err(NkeyError::Length {
                what: "public key",
                chars: 58
            })
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
        // Non-zero trailing bits (58 characters carry 2 spare bits): the
        // last character of the published seed is `4` (value 28).
        let mut trailing = SEED.to_owned();
        trailing.replace_range(57..58, "5");
        assert_eq!(
            NkeySeed::parse(&trailing).map(|_| ()),
            Err(NkeyError::Base32 { what: "seed" })
        );
    }
}
