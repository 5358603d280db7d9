//! Property-test inputs for the parsers of outside input (the parsers
//! fuzzed): mutations of a valid sample and a time bound on each parse, shared
//! by the crates whose parsers are private (tested in-crate).

use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;

/// Longest one parse may take in a debug build on a loaded machine (a
/// release build takes microseconds).
pub const PARSE_BOUND: Duration = Duration::from_secs(2);

/// Cases per property: `PROPTEST_CASES` (`make fuzz`), else 64.
pub fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64)
}

/// `sample` with one to five edits: a byte replaced, one of `tokens`
/// spliced in, a truncation, a byte removed.
pub fn mutated(
    sample: &'static str,
    tokens: &'static [&'static str],
) -> impl Strategy<Value = Vec<u8>> {
    vec((any::<usize>(), 0u8..4, any::<u8>()), 1..6).prop_map(move |edits| {
        let mut b = sample.as_bytes().to_vec();
        for (at, kind, x) in edits {
            let at = at % (b.len() + 1);
            match kind {
                0 if at < b.len() => b[at] = x,
                1 => {
                    let t = tokens[usize::from(x) % tokens.len()].as_bytes();
                    b.splice(at..at, t.iter().copied());
                }
                2 => b.truncate(at),
                _ if at < b.len() => {
                    b.remove(at);
                }
                _ => {}
            }
        }
        b
    })
}

/// Runs `f`, failing the test when it took longer than [`PARSE_BOUND`].
pub fn bounded<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    assert!(
        started.elapsed() < PARSE_BOUND,
        "{what} took {:?}",
        started.elapsed()
    );
    out
}
