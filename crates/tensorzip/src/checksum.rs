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
    Ok(data.par_chunks(piece).map(crc32fast::hash).collect())
}

/// CRC-32 of the whole of `data` (equal to `zlib.crc32(data)`).
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
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
}
