//! CRC-32 checksums with cuZipNN's semantics: the CRC-32 (the one of zlib: `zlib.crc32`) of every
//! `piece` bytes of a byte string, the last piece possibly shorter.

use rayon::prelude::*;

use crate::error::{Error, Result};

/// Default piece size of [`crc32_pieces`] (cuZipNN's `checksum_chunk_bytes`).
pub const DEFAULT_CHECKSUM_CHUNK_BYTES: usize = 16384;

/// CRC-32 of each `piece`-byte piece of `data` (an empty input has no pieces).
pub fn crc32_pieces(data: &[u8], piece: usize) -> Result<Vec<u32>> {
    if piece == 0 {
        return Err(Error::InvalidOption(
            "checksum_chunk_bytes must be positive".into(),
        ));
    }
    // Four bytes a piece: with small pieces the list can outgrow the data (pieces of 1 byte: 4x),
    // so a list the allocator refuses is an error, not an abort.
    let n = data.len().div_ceil(piece);
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        bytes: (n as u64).saturating_mul(4),
    })?;
    data.par_chunks(piece)
        .map(crc32fast::hash)
        .collect_into_vec(&mut out);
    Ok(out)
}

/// The streaming form of [`crc32_pieces`]: the same checksums from the bytes given in any number of
/// calls, with bounded memory. `piece == 0` means one CRC-32 of everything (also of nothing).
pub struct PieceHasher {
    piece: u64,
    done: u64,
    cur: crc32fast::Hasher,
    out: Vec<u32>,
}

impl PieceHasher {
    pub fn new(piece: u64) -> Self {
        PieceHasher {
            piece,
            done: 0,
            cur: crc32fast::Hasher::new(),
            out: Vec::new(),
        }
    }

    pub fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let room = if self.piece == 0 {
                data.len()
            } else {
                ((self.piece - self.done) as usize).min(data.len())
            };
            self.cur.update(&data[..room]);
            self.done += room as u64;
            data = &data[room..];
            if self.done == self.piece {
                let full = std::mem::replace(&mut self.cur, crc32fast::Hasher::new());
                self.out.push(full.finalize());
                self.done = 0;
            }
        }
    }

    pub fn finish(mut self) -> Vec<u32> {
        if self.piece == 0 || self.done > 0 {
            self.out.push(self.cur.finalize());
        }
        self.out
    }
}

/// Bytes per task of [`crc32`]'s parallel path; inputs of at most twice this are hashed in one go.
const CRC_TASK_BYTES: usize = 1 << 20;

/// CRC-32 of the whole of `data` (equal to `zlib.crc32(data)`), on all of rayon's threads for large
/// inputs: 1 MiB pieces hashed in parallel and their CRCs combined in order (`Hasher::combine`,
/// exact). One thread hashes ~11 GB/s (crc32fast on the 2-core AMD VM; two threads 16 GB/s): a
/// whole-blob checksum of a 0.7 GB blob was ~65 ms of one core before its GPU load, whose upload
/// over PCIe takes ~15 ms. The archive's whole-blob and original-data checksums go through here.
pub fn crc32(data: &[u8]) -> u32 {
    if data.len() <= 2 * CRC_TASK_BYTES {
        return crc32fast::hash(data);
    }
    data.par_chunks(CRC_TASK_BYTES)
        .map(|c| {
            let mut h = crc32fast::Hasher::new();
            h.update(c);
            h
        })
        .reduce_with(|mut a, b| {
            a.combine(&b);
            a
        })
        .map_or_else(|| crc32fast::hash(&[]), |h| h.finalize())
}

/// Checks `data` against checksums from [`crc32_pieces`]; the error names the first bad piece.
pub fn verify_pieces(data: &[u8], piece: usize, expected: &[u32]) -> Result<()> {
    let got = crc32_pieces(data, piece)?;
    if got.len() != expected.len() {
        return Err(Error::Checksum(format!(
            "{} checksums for {} pieces",
            expected.len(),
            got.len()
        )));
    }
    match got.iter().zip(expected).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(Error::Checksum(format!(
            "piece {i} (bytes {}..) differs",
            i * piece
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_zlib_check_values() {
        // zlib.crc32(b"123456789") == 0xCBF43926
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            crc32_pieces(b"123456789", 4).unwrap(),
            vec![crc32(b"1234"), crc32(b"5678"), crc32(b"9")]
        );
        assert!(crc32_pieces(b"", 4).unwrap().is_empty());
        assert!(crc32_pieces(b"x", 0).is_err());
        let c = crc32_pieces(b"abcdef", 2).unwrap();
        assert!(verify_pieces(b"abcdef", 2, &c).is_ok());
        assert!(verify_pieces(b"abcdeX", 2, &c).is_err());
    }

    #[test]
    fn parallel_crc32_equals_one_pass() {
        // Sizes around the parallel path's threshold and task size, and several tasks with a
        // short last one.
        let data: Vec<u8> = (0..(5 * CRC_TASK_BYTES + 12345) as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for n in [
            0,
            1,
            CRC_TASK_BYTES,
            2 * CRC_TASK_BYTES,
            2 * CRC_TASK_BYTES + 1,
            3 * CRC_TASK_BYTES - 1,
            data.len(),
        ] {
            assert_eq!(crc32(&data[..n]), crc32fast::hash(&data[..n]), "{n}");
        }
    }

    #[test]
    fn streamed_pieces_equal_crc32_pieces() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for piece in [1usize, 3, 4096, 9_999, 10_000, 10_001] {
            for step in [1usize, 7, 4096, 10_000] {
                let mut h = PieceHasher::new(piece as u64);
                data.chunks(step).for_each(|c| h.update(c));
                assert_eq!(
                    h.finish(),
                    crc32_pieces(&data, piece).unwrap(),
                    "{piece} {step}"
                );
            }
        }
        let mut h = PieceHasher::new(0);
        data.chunks(333).for_each(|c| h.update(c));
        assert_eq!(h.finish(), vec![crc32(&data)]);
        assert_eq!(PieceHasher::new(0).finish(), vec![crc32(b"")]);
        assert!(PieceHasher::new(4).finish().is_empty());
    }
}
