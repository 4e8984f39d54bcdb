//! The interleaved rANS decoder: a portable scalar path and an AVX2 path chosen at run time.
//!
//! Safety against hostile streams: table lookups are masked to 12 bits, every word read is bounds
//! checked (the AVX2 path only runs while 64 bytes remain, which covers the most a step of 32 lanes can
//! read), and the end-of-stream checks (all states back at `2^16`, all words read) reject streams that
//! do not decode to exactly what an encoder wrote.

use super::{LANES, PROB_BITS, PROB_SCALE, STATE_BYTES, STATE_LOWER};
use crate::error::{corrupt, Result};

/// Decoder slot table of one frequency table (see [`super::table::FreqTable::decode_table`]).
pub type DecodeTable = [u32; PROB_SCALE as usize];

/// One segment to decode: its table and where its symbols go.
pub struct DecodeSegment<'t, 'o> {
    pub table: &'t DecodeTable,
    pub out: &'o mut [u8],
}

/// Decoder state over one stream.
pub struct Decoder<'a> {
    x: [u32; LANES],
    words: &'a [u8],
    pos: usize,
}

const MASK: u32 = PROB_SCALE - 1;

#[inline(always)]
fn step(x: u32, e: u32) -> u32 {
    ((e >> 8) & 0xFFF) * (x >> PROB_BITS) + (e >> 20)
}

impl<'a> Decoder<'a> {
    /// Starts decoding `stream` (states, then words).
    pub fn new(stream: &'a [u8]) -> Result<Self> {
        if stream.len() < STATE_BYTES || (stream.len() - STATE_BYTES) % 2 != 0 {
            return corrupt(format!("rANS stream of {} bytes (need 128 + an even number)", stream.len()));
        }
        let mut x = [0u32; LANES];
        for (l, xl) in x.iter_mut().enumerate() {
            *xl = u32::from_le_bytes(stream[4 * l..4 * l + 4].try_into().unwrap());
            if *xl < STATE_LOWER {
                return corrupt("rANS initial state below 2^16");
            }
        }
        Ok(Decoder { x, words: &stream[STATE_BYTES..], pos: 0 })
    }

    /// Decodes one block: `len` symbols of every segment (each `out` holds at least `len` bytes).
    pub fn decode_block(&mut self, segs: &mut [DecodeSegment<'_, '_>], len: usize) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::cpu::has_avx2() {
                // SAFETY: AVX2 support was checked at run time just above.
                return unsafe { self.decode_block_avx2(segs, len) };
            }
        }
        self.decode_block_scalar(segs, len, 0)
    }

    /// Portable decoder, from step `first_round` on.
    fn decode_block_scalar(&mut self, segs: &mut [DecodeSegment<'_, '_>], len: usize, first_round: usize) -> Result<()> {
        let rounds = len.div_ceil(LANES);
        for r in first_round..rounds {
            let base = r * LANES;
            let active = LANES.min(len - base);
            for seg in segs.iter_mut() {
                let out = &mut seg.out[base..base + active];
                for (l, o) in out.iter_mut().enumerate() {
                    let x = self.x[l];
                    let e = seg.table[(x & MASK) as usize];
                    *o = e as u8;
                    let mut x = step(x, e);
                    if x < STATE_LOWER {
                        let Some(w) = self.words.get(self.pos..self.pos + 2) else {
                            return corrupt("rANS stream ends early");
                        };
                        x = (x << 16) | u16::from_le_bytes([w[0], w[1]]) as u32;
                        self.pos += 2;
                    }
                    self.x[l] = x;
                }
            }
        }
        Ok(())
    }

    /// AVX2 decoder: 32 lanes as four vectors of eight; refills via a permutation table.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn decode_block_avx2(&mut self, segs: &mut [DecodeSegment<'_, '_>], len: usize) -> Result<()> {
        use std::arch::x86_64::*;
        let full_rounds = len / LANES;
        let perm = crate::cpu::refill_permutations();
        let mut r = 0;
        // SAFETY: every pointer access below stays inside `self.x`, the segment outputs (which hold
        // `len` bytes, and `r * 32 + 32 <= len` for full rounds), the table (index masked to 12 bits)
        // and `self.words` (the loop runs only while 64 bytes remain unread).
        unsafe {
            let xp = self.x.as_mut_ptr() as *mut __m256i;
            let mut x = [
                _mm256_loadu_si256(xp),
                _mm256_loadu_si256(xp.add(1)),
                _mm256_loadu_si256(xp.add(2)),
                _mm256_loadu_si256(xp.add(3)),
            ];
            let mask = _mm256_set1_epi32(MASK as i32);
            let fmask = _mm256_set1_epi32(0xFFF);
            let bytesel = _mm256_setr_epi8(
                0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1,
                -1, -1, -1, -1, -1,
            );
            let words = self.words.as_ptr();
            let wlen = self.words.len();
            // One step of every segment reads at most 64 bytes per segment.
            let need_bytes = 64 * segs.len();
            let mut pos = self.pos;
            while r < full_rounds && wlen - pos >= need_bytes {
                for seg in segs.iter_mut() {
                    let table = seg.table.as_ptr() as *const i32;
                    let out = seg.out.as_mut_ptr().add(r * LANES);
                    for (v, xv) in x.iter_mut().enumerate() {
                        let slot = _mm256_and_si256(*xv, mask);
                        let e = _mm256_i32gather_epi32::<4>(table, slot);
                        let f = _mm256_and_si256(_mm256_srli_epi32::<8>(e), fmask);
                        let bias = _mm256_srli_epi32::<20>(e);
                        let nx = _mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srli_epi32::<12>(*xv)), bias);
                        // Symbols: low byte of each entry, 4 per 128-bit half.
                        let s = _mm256_shuffle_epi8(e, bytesel);
                        let lo = _mm256_cvtsi256_si32(s) as u32;
                        let hi = _mm256_extract_epi32::<4>(s) as u32;
                        (out.add(8 * v) as *mut u32).write_unaligned(lo);
                        (out.add(8 * v + 4) as *mut u32).write_unaligned(hi);
                        // Refill lanes whose state fell below 2^16, in lane order.
                        let need = _mm256_cmpeq_epi32(_mm256_srli_epi32::<16>(nx), _mm256_setzero_si256());
                        let m = _mm256_movemask_ps(_mm256_castsi256_ps(need)) as usize;
                        let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(words.add(pos) as *const __m128i));
                        let idx = _mm256_loadu_si256(perm.as_ptr().add(m) as *const __m256i);
                        let w = _mm256_permutevar8x32_epi32(w, idx);
                        let refilled = _mm256_or_si256(_mm256_slli_epi32::<16>(nx), w);
                        *xv = _mm256_blendv_epi8(nx, refilled, need);
                        pos += 2 * m.count_ones() as usize;
                    }
                }
                r += 1;
            }
            _mm256_storeu_si256(xp, x[0]);
            _mm256_storeu_si256(xp.add(1), x[1]);
            _mm256_storeu_si256(xp.add(2), x[2]);
            _mm256_storeu_si256(xp.add(3), x[3]);
            self.pos = pos;
        }
        // The last steps (a partial one, or where fewer than 64 bytes per segment remain) go scalar.
        self.decode_block_scalar(segs, len, r)
    }

    /// Checks that the stream ended exactly: all states back at `2^16` and every word read.
    pub fn finish(self) -> Result<()> {
        if self.pos != self.words.len() {
            return corrupt(format!("rANS stream has {} unread bytes", self.words.len() - self.pos));
        }
        if self.x.iter().any(|&x| x != STATE_LOWER) {
            return corrupt("rANS final state mismatch");
        }
        Ok(())
    }
}
