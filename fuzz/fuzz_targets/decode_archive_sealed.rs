//! Like `decode_archive`, but the input's checksums are recomputed first (the index CRC and every
//! blob's CRCs), so the fuzzer explores what lies behind them: a hostile writer can always produce
//! correct checksums, so they are no defence, and decoding must stay safe without them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorzip::archive::ARCHIVE_HEADER_LEN;
use tensorzip::{crc32, crc32_pieces};

#[path = "archive_checks.rs"]
mod archive_checks;
#[path = "one_engine.rs"]
mod one_engine;

fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        d.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        d.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Rewrites the blob checksums and the index CRC in place (where the layout allows it).
fn seal(d: &mut [u8]) -> Option<()> {
    let piece = u32_at(d, 8)? as usize;
    let io = usize::try_from(u64_at(d, 24)?).ok()?;
    if io < ARCHIVE_HEADER_LEN || io > d.len() {
        return None;
    }
    let n = u32_at(d, io)? as usize;
    let mut at = io + 4;
    for _ in 0..n.min(1 << 16) {
        let off = usize::try_from(u64_at(d, at + 17)?).ok()?;
        let len = usize::try_from(u64_at(d, at + 25)?).ok()?;
        let nc = u32_at(d, at + 37)? as usize;
        let crcs_at = at + 41;
        at = crcs_at.checked_add(nc.checked_mul(4)?)?;
        if at > d.len() {
            return None;
        }
        if let Some(blob) = off.checked_add(len).and_then(|end| d.get(off..end)) {
            let got = if piece == 0 {
                vec![crc32(blob)]
            } else {
                crc32_pieces(blob, piece).ok()?
            };
            if got.len() == nc {
                let bytes: Vec<u8> = got.iter().flat_map(|c| c.to_le_bytes()).collect();
                d[crcs_at..crcs_at + 4 * nc].copy_from_slice(&bytes);
            }
        }
    }
    let crc = crc32(d.get(io..at)?);
    d.get_mut(at..at + 4)?.copy_from_slice(&crc.to_le_bytes());
    Some(())
}

fuzz_target!(|data: &[u8]| {
    let mut d = data.to_vec();
    let _ = seal(&mut d);
    archive_checks::check_archive(&d);
});
