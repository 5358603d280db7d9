//! The one streaming path of every download, HTTPS or OCI blob
//! ([`stream_verified`]): bytes are counted against the limit, hashed and
//! written to the caller's temp file as they arrive, never held whole in
//! memory. Also what both sources say about a failed transfer
//! ([`TRANSPORT_HINTS`], [`describe_io`]) and [`hash_file`].

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use fleet_common::durable::{AtomicFile, DurableError, DurableStep};
use fleet_common::https;
use fleet_common::validate::Sha256Hex;
use sha2::Digest;

/// Read size of the streaming path: large enough that hashing and writing
/// run at memory speed, small enough to keep the updater's RSS flat.
const CHUNK_BYTES: usize = 128 * 1024;
/// Blocks in flight between the reading and the hashing thread.
const PIPELINE_BLOCKS: usize = 3;

/// What a finished fetch wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub bytes: u64,
    pub sha256: Sha256Hex,
}

/// The way forward of a failed download, in the words of the updater's
/// config ([`https::transport_message`]).
pub(crate) const TRANSPORT_HINTS: https::TransportHints = https::TransportHints {
    certificate: "the server's certificate is not trusted: give its CA in ca-file of the updater config, or fix the server's chain",
    connect: "check the URL and the device's network",
};

pub(crate) fn describe_io(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
            format!("timed out ({e}): the server stalled")
        }
        _ => e.to_string(),
    }
}

/// A failure of the shared streaming path.
#[derive(Debug)]
pub enum StreamError {
    TooLarge,
    Read { received: u64, source: io::Error },
    Write(DurableError),
}

/// Copies `body` into `out` until EOF, hashing as it goes, refusing more
/// than `limit` bytes (it reads one byte past the limit to know).
///
/// Two threads share the work: this one reads (for HTTPS, that is TLS
/// decryption) while a scoped `updater-hash` thread hashes and writes the
/// blocks already read; [`PIPELINE_BLOCKS`] blocks circulate between them,
/// so memory stays bounded. If that thread cannot be created, one thread
/// does everything.
pub fn stream_verified(
    mut body: impl Read,
    limit: u64,
    out: &mut AtomicFile,
) -> Result<Fetched, StreamError> {
    match pipelined(&mut body, limit, out) {
        Some(result) => result,
        None => {
            log::warn!("cannot start the hashing thread; hashing on the download thread");
            sequential(&mut body, limit, out)
        }
    }
}

/// [`stream_verified`] on two threads; `None` when the second thread
/// cannot be created (nothing was read then).
fn pipelined(
    body: &mut impl Read,
    limit: u64,
    out: &mut AtomicFile,
) -> Option<Result<Fetched, StreamError>> {
    std::thread::scope(|scope| {
        let (full_tx, full_rx) = mpsc::sync_channel::<(Vec<u8>, usize)>(PIPELINE_BLOCKS);
        let (free_tx, free_rx) = mpsc::channel::<Vec<u8>>();
        let writer = std::thread::Builder::new()
            .name("updater-hash".to_owned())
            .spawn_scoped(scope, move || -> Result<Sha256Hex, DurableError> {
                let mut hasher = sha2::Sha256::new();
                for (block, n) in full_rx {
                    hasher.update(&block[..n]);
                    out.write_all(&block[..n])?;
                    // The reader may have stopped; the block is then dropped.
                    let _ = free_tx.send(block);
                }
                Ok(Sha256Hex::from_digest(&hasher.finalize().into()))
            })
            .ok()?;
        let mut spare: Vec<Vec<u8>> = (0..PIPELINE_BLOCKS)
            .map(|_| vec![0u8; CHUNK_BYTES])
            .collect();
        let mut received: u64 = 0;
        let outcome = loop {
            let mut block = match spare.pop() {
                Some(b) => b,
                None => match free_rx.recv() {
                    Ok(b) => b,
                    // The writer stopped: its error is collected below.
                    Err(_) => break Ok(()),
                },
            };
            let n = match fill(body, &mut block) {
                Ok(n) => n,
                Err((n, source)) => {
                    break Err(StreamError::Read {
                        received: received + n as u64,
                        source,
                    })
                }
            };
            if n == 0 {
                break Ok(());
            }
            received += n as u64;
            if received > limit {
                break Err(StreamError::TooLarge);
            }
            if full_tx.send((block, n)).is_err() {
                break Ok(());
            }
        };
        drop(full_tx);
        let hashed = writer.join().unwrap_or_else(|_| {
            Err(DurableError {
                step: DurableStep::Write,
                path: PathBuf::from("the download"),
                source: io::Error::other("the hashing thread panicked"),
            })
        });
        Some(outcome.and_then(|()| {
            let sha256 = hashed.map_err(StreamError::Write)?;
            Ok(Fetched {
                bytes: received,
                sha256,
            })
        }))
    })
}

/// [`stream_verified`] on the calling thread alone.
fn sequential(
    body: &mut impl Read,
    limit: u64,
    out: &mut AtomicFile,
) -> Result<Fetched, StreamError> {
    let mut hasher = sha2::Sha256::new();
    let mut block = vec![0u8; CHUNK_BYTES];
    let mut received: u64 = 0;
    loop {
        let n = fill(body, &mut block).map_err(|(n, source)| StreamError::Read {
            received: received + n as u64,
            source,
        })?;
        if n == 0 {
            break;
        }
        received += n as u64;
        if received > limit {
            return Err(StreamError::TooLarge);
        }
        hasher.update(&block[..n]);
        out.write_all(&block[..n]).map_err(StreamError::Write)?;
    }
    Ok(Fetched {
        bytes: received,
        sha256: Sha256Hex::from_digest(&hasher.finalize().into()),
    })
}

/// Reads until `block` is full or EOF (TLS yields one 16 KiB record per
/// read), so hashing and writing run on large blocks. On error, also says
/// how many bytes of this block had arrived.
fn fill(body: &mut impl Read, block: &mut [u8]) -> Result<usize, (usize, io::Error)> {
    let mut n = 0;
    while n < block.len() {
        match body.read(&mut block[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((n, e)),
        }
    }
    Ok(n)
}

/// SHA-256 of a file, streamed.
pub fn hash_file(path: &Path) -> io::Result<Sha256Hex> {
    let mut f = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Sha256Hex::from_digest(&hasher.finalize().into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_hashes_counts_and_stops_past_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("a");
        let data = vec![7u8; 300_000];
        let mut out = AtomicFile::create(&target, 0o755).expect("create");
        let got = stream_verified(&data[..], 300_000, &mut out).expect("fits");
        assert_eq!(got.bytes, 300_000);
        assert_eq!(got.sha256, Sha256Hex::of(&data));
        let mut out = AtomicFile::create(&target, 0o755).expect("create");
        assert!(matches!(
            stream_verified(&data[..], 299_999, &mut out),
            Err(StreamError::TooLarge)
        ));
        // The single-thread fallback gives the same answers.
        let mut out = AtomicFile::create(&target, 0o755).expect("create");
        assert_eq!(
            sequential(&mut &data[..], 300_000, &mut out).expect("fits"),
            got
        );
        out.commit().expect("commit");
        assert_eq!(std::fs::read(&target).expect("read"), data);
        let mut out = AtomicFile::create(&target, 0o755).expect("create");
        assert!(matches!(
            sequential(&mut &data[..], 299_999, &mut out),
            Err(StreamError::TooLarge)
        ));
        let f = dir.path().join("f");
        std::fs::write(&f, &data).expect("write");
        assert_eq!(hash_file(&f).expect("hash"), Sha256Hex::of(&data));
    }
}
