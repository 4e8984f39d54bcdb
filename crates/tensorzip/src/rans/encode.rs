//! The interleaved rANS encoder (scalar; the encoder runs once per tensor, the decoder many times).

use super::table::EncSymbol;
use super::{LANES, STATE_LOWER};

/// One coded segment: the symbols of one plane in one block, and the table that codes them.
#[derive(Clone, Copy)]
pub struct Segment<'a> {
    pub syms: &'a [u8],
    pub table: &'a [EncSymbol; 256],
}

/// Reusable encoder scratch.
#[derive(Default)]
pub struct EncoderScratch {
    words: Vec<u16>,
}

/// Encodes the segments of a chunk into one stream and appends it to `out` (32 states, then words).
///
/// `blocks[b]` lists the coded segments of block `b` in ascending plane order; all segments of a block
/// have the same length. The decoder reads symbols block by block, then 32-symbol step by step, then
/// plane by plane, then lane by lane; the encoder walks that order backwards.
///
/// Every symbol must have a non-zero frequency in its table, and no table may be a single-symbol table
/// (those blocks are not part of the stream).
pub fn encode_stream(blocks: &[Vec<Segment<'_>>], scratch: &mut EncoderScratch, out: &mut Vec<u8>) {
    let total: usize = blocks.iter().flatten().map(|s| s.syms.len()).sum();
    let words = &mut scratch.words;
    words.clear();
    words.resize(total + 1, 0);
    let mut pos = 0usize;
    let mut x = [STATE_LOWER as u64; LANES];
    for block in blocks.iter().rev() {
        let Some(first) = block.first() else { continue };
        let len = first.syms.len();
        let rounds = len.div_ceil(LANES);
        for r in (0..rounds).rev() {
            let base = r * LANES;
            let active = LANES.min(len - base);
            for seg in block.iter().rev() {
                debug_assert_eq!(seg.syms.len(), len);
                let syms = &seg.syms[base..base + active];
                for l in (0..active).rev() {
                    let s = &seg.table[syms[l] as usize];
                    debug_assert!(s.x_max != 0, "symbol {} absent from its table", syms[l]);
                    let mut xl = x[l];
                    let emit = xl >= s.x_max;
                    words[pos] = xl as u16;
                    pos += emit as usize;
                    xl >>= 16 * emit as u32;
                    let q = ((xl as u128 * s.rcp as u128) >> s.shift) as u64;
                    x[l] = xl + s.cum as u64 + q * s.cmpl as u64;
                }
            }
        }
    }
    out.reserve(LANES * 4 + 2 * pos);
    for xl in x {
        out.extend_from_slice(&(xl as u32).to_le_bytes());
    }
    for w in words[..pos].iter().rev() {
        out.extend_from_slice(&w.to_le_bytes());
    }
}
