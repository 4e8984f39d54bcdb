//! The interleaved rANS decoder: a portable scalar path and an AVX2 path chosen at run time.
//!
//! Safety against hostile streams: table lookups are masked to 12 bits, every word read is bounds
//! checked (the AVX2 path only runs while 64 bytes remain, which covers the most a step of 32 lanes can
//! read), and the end-of-stream checks (all states back at `2^16`, all words read) reject streams that
//! do not decode to exactly what an encoder wrote.

use super::{LANES, MAX_STASH, PROB_BITS, PROB_SCALE, STATE_BYTES, STATE_LOWER};
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
    /// Whether any symbol was decoded (a stream that codes nothing is invalid).
    used: bool,
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
            return corrupt(format!(
                "rANS stream of {} bytes (need 128 + an even number)",
                stream.len()
            ));
        }
        let mut x = [0u32; LANES];
        for (l, xl) in x.iter_mut().enumerate() {
            *xl = u32::from_le_bytes(stream[4 * l..4 * l + 4].try_into().unwrap());
            if *xl < STATE_LOWER {
                return corrupt("rANS state below 2^16");
            }
        }
        Ok(Decoder {
            x,
            words: &stream[STATE_BYTES..],
            pos: 0,
            used: false,
        })
    }

    /// Decodes one block: `len` symbols of every segment (each `out` holds at least `len` bytes).
    pub fn decode_block(&mut self, segs: &mut [DecodeSegment<'_, '_>], len: usize) -> Result<()> {
        self.used |= len > 0 && !segs.is_empty();
        let done = simd_rounds(self, segs, len, 0);
        self.decode_block_scalar(segs, len, done)
    }

    /// Decodes a block of each of two independent streams (two chunks): the same as
    /// [`Decoder::decode_block`] on each, with the steps of the two interleaved in one loop while
    /// both have full steps left. A step is a chain of dependent operations (table lookup, state
    /// update, refill); two chains in one loop overlap where the registers hold both streams'
    /// states (AVX-512VL: single-thread decode +3-13%, `engine.rs`). The first stream's error is
    /// reported first.
    pub fn decode_block_pair(
        a: (&mut Decoder<'a>, &mut [DecodeSegment<'_, '_>], usize),
        b: (&mut Decoder<'_>, &mut [DecodeSegment<'_, '_>], usize),
    ) -> Result<()> {
        let ((da, sa, la), (db, sb, lb)) = (a, b);
        da.used |= la > 0 && !sa.is_empty();
        db.used |= lb > 0 && !sb.is_empty();
        let both = simd_rounds_pair(da, sa, la, db, sb, lb);
        let done_a = simd_rounds(da, sa, la, both);
        da.decode_block_scalar(sa, la, done_a)?;
        let done_b = simd_rounds(db, sb, lb, both);
        db.decode_block_scalar(sb, lb, done_b)
    }

    /// Portable decoder, from step `first_round` on.
    fn decode_block_scalar(
        &mut self,
        segs: &mut [DecodeSegment<'_, '_>],
        len: usize,
        first_round: usize,
    ) -> Result<()> {
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

    /// Checks that the stream ended exactly — every word read, every lane back at its initial state —
    /// and returns the `stash_len` stash bytes those states carry.
    pub fn finish(self, stash_len: usize) -> Result<[u8; MAX_STASH]> {
        if !self.used {
            return corrupt("rANS stream where no symbol is coded");
        }
        if self.pos != self.words.len() {
            return corrupt(format!(
                "rANS stream has {} unread bytes",
                self.words.len() - self.pos
            ));
        }
        let mut stash = [0u8; MAX_STASH];
        for (l, &x) in self.x.iter().enumerate() {
            let carried = stash_len.saturating_sub(2 * l).min(2);
            let v = x.wrapping_sub(STATE_LOWER);
            if x < STATE_LOWER || v >= 1 << (8 * carried) {
                return corrupt("rANS final state mismatch");
            }
            stash[2 * l] = v as u8;
            stash[2 * l + 1] = (v >> 8) as u8;
        }
        Ok(stash)
    }
}

/// Table lookup of eight 12-bit slots. On the CPUs we measured (AMD Zen 3), moving the slots to
/// general registers in pairs and loading each entry is faster than `vpgatherdd` (0.32 against 0.48
/// ns per symbol in `docs/BENCHMARKS.md`'s microbenchmark).
///
/// # Safety
/// AVX2 required; every lane of `slots` must be below 4096.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
#[inline]
unsafe fn lookup(
    table: &DecodeTable,
    slots: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let lo = _mm256_castsi256_si128(slots);
    let hi = _mm256_extracti128_si256::<1>(slots);
    let q0 = _mm_cvtsi128_si64(lo) as u64;
    let q1 = _mm_extract_epi64::<1>(lo) as u64;
    let q2 = _mm_cvtsi128_si64(hi) as u64;
    let q3 = _mm_extract_epi64::<1>(hi) as u64;
    // SAFETY: the caller guarantees every slot is below the table's length.
    let t = |i: u64| unsafe { *table.get_unchecked((i & 0xFFFF_FFFF) as usize) as i32 };
    _mm256_setr_epi32(
        t(q0),
        t(q0 >> 32),
        t(q1),
        t(q1 >> 32),
        t(q2),
        t(q2 >> 32),
        t(q3),
        t(q3 >> 32),
    )
}

/// Full steps `first..` of a block decoded with SIMD where the CPU has it; returns the number of
/// steps done (the rest, and a partial last step, go to the scalar path).
fn simd_rounds(
    dec: &mut Decoder<'_>,
    segs: &mut [DecodeSegment<'_, '_>],
    len: usize,
    first: usize,
) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx512vl() {
            // SAFETY: AVX2 and AVX-512VL support were checked at run time.
            return unsafe { avx512_rounds(dec, segs, len, first) };
        }
        if crate::cpu::has_avx2() {
            // SAFETY: AVX2 support was checked at run time.
            return unsafe { avx2_rounds(dec, segs, len, first) };
        }
    }
    first
}

/// The full steps the two streams of [`Decoder::decode_block_pair`] decode together (from step
/// 0), with SIMD where the CPU has it; each stream continues alone from there.
fn simd_rounds_pair(
    da: &mut Decoder<'_>,
    sa: &mut [DecodeSegment<'_, '_>],
    la: usize,
    db: &mut Decoder<'_>,
    sb: &mut [DecodeSegment<'_, '_>],
    lb: usize,
) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx512vl() {
            // SAFETY: AVX2 and AVX-512VL support were checked at run time.
            return unsafe { avx512_rounds_pair(da, sa, la, db, sb, lb) };
        }
        if crate::cpu::has_avx2() {
            // SAFETY: AVX2 support was checked at run time.
            return unsafe { avx2_rounds_pair(da, sa, la, db, sb, lb) };
        }
    }
    0
}

/// The SIMD state of one stream in a run of full steps: 32 lanes as four vectors of eight, the
/// read position, and the words.
#[cfg(target_arch = "x86_64")]
struct Lanes {
    x: [std::arch::x86_64::__m256i; 4],
    pos: usize,
    words: *const u8,
    wlen: usize,
}

/// One step `r` of every segment of a stream (`$l`: its [`Lanes`]), inside an `unsafe` block of
/// a function with AVX2 enabled. A macro rather than a function so that it is compiled inline in
/// each loop (the states stay in registers; a call kept them in memory).
///
/// Safety (the caller's): every segment holds at least `32 (r + 1)` bytes; at least
/// `64 * segs.len()` bytes of words remain after `pos`. Slots are masked to 12 bits (the tables
/// hold 4096 entries); a step reads at most 64 bytes of words per segment.
#[cfg(target_arch = "x86_64")]
macro_rules! simd_step {
    ($l:expr, $segs:expr, $r:expr, $perm:expr) => {{
        use std::arch::x86_64::*;
        let mask = _mm256_set1_epi32(MASK as i32);
        let zero = _mm256_setzero_si256();
        let bytesel = _mm256_setr_epi8(
            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1,
            -1, -1, -1, -1, -1, -1, -1, -1, -1,
        );
        let join = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
        let l: &mut Lanes = $l;
        for seg in $segs.iter_mut() {
            for (v, xv) in l.x.iter_mut().enumerate() {
                let e = lookup(seg.table, _mm256_and_si256(*xv, mask));
                // The frequency is 12 bits, as the slot mask.
                let f = _mm256_and_si256(_mm256_srli_epi32::<8>(e), mask);
                let nx = _mm256_add_epi32(
                    _mm256_mullo_epi32(f, _mm256_srli_epi32::<12>(*xv)),
                    _mm256_srli_epi32::<20>(e),
                );
                // Symbols: the low byte of each entry; 8 bytes for these 8 lanes.
                let sy = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(e, bytesel), join);
                let out = seg.out.as_mut_ptr().add($r * LANES + 8 * v);
                _mm_storel_epi64(out as *mut __m128i, _mm256_castsi256_si128(sy));
                // Lanes whose state fell below 2^16 read one word each, in lane order.
                let need = _mm256_cmpeq_epi32(_mm256_srli_epi32::<16>(nx), zero);
                let m = _mm256_movemask_ps(_mm256_castsi256_ps(need)) as usize;
                let w =
                    _mm256_cvtepu16_epi32(_mm_loadu_si128(l.words.add(l.pos) as *const __m128i));
                let idx = _mm256_loadu_si256($perm.as_ptr().add(m) as *const __m256i);
                let w = _mm256_permutevar8x32_epi32(w, idx);
                let refilled = _mm256_or_si256(_mm256_slli_epi32::<16>(nx), w);
                *xv = _mm256_blendv_epi8(nx, refilled, need);
                l.pos += 2 * m.count_ones() as usize;
            }
        }
    }};
}

/// Generates the SIMD step loops for one set of target features: `$single` decodes full steps
/// `first..` of one stream, `$pair` steps `0..` of two streams interleaved. The same code compiled
/// with AVX-512VL has 32 vector registers instead of 16: the pair's eight state vectors and the
/// constants then fit (with AVX2 alone, two streams interleaved were measured 3-8% *slower* than
/// one at a time on a Zen 3 VM, 2026-11-30, docs/DESIGN.md).
///
/// A step of a stream, for each segment and each vector of eight lanes: table lookup through
/// general registers (`lookup`), state update, symbol bytes stored, and the lanes whose state fell
/// below 2^16 refilled in lane order through a permutation table.
#[cfg(target_arch = "x86_64")]
macro_rules! simd_step_loops {
    ($features:literal, $single:ident, $pair:ident) => {
        /// Loads a stream's states for a run of full steps.
        ///
        /// # Safety
        /// The CPU must support the enabled features.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn load_lanes(dec: &Decoder<'_>) -> Lanes {
            use std::arch::x86_64::*;
            let xp = dec.x.as_ptr() as *const __m256i;
            // SAFETY: `x` is 32 u32 = four unaligned 32-byte vectors.
            unsafe {
                Lanes {
                    x: [
                        _mm256_loadu_si256(xp),
                        _mm256_loadu_si256(xp.add(1)),
                        _mm256_loadu_si256(xp.add(2)),
                        _mm256_loadu_si256(xp.add(3)),
                    ],
                    pos: dec.pos,
                    words: dec.words.as_ptr(),
                    wlen: dec.words.len(),
                }
            }
        }

        /// Stores a stream's states and read position back.
        ///
        /// # Safety
        /// The CPU must support the enabled features.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn store_lanes(dec: &mut Decoder<'_>, l: &Lanes) {
            use std::arch::x86_64::*;
            let xp = dec.x.as_mut_ptr() as *mut __m256i;
            for (v, xv) in l.x.iter().enumerate() {
                // SAFETY: as in `load_lanes`.
                unsafe { _mm256_storeu_si256(xp.add(v), *xv) };
            }
            dec.pos = l.pos;
        }

        /// Full steps `first..` of a block of one stream; returns the step it stopped at.
        ///
        /// # Safety
        /// The CPU must support the enabled features. Every segment must hold at least `len` bytes.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $single(
            dec: &mut Decoder<'_>,
            segs: &mut [DecodeSegment<'_, '_>],
            len: usize,
            first: usize,
        ) -> usize {
            let full = len / LANES;
            if segs.is_empty() {
                return full.max(first);
            }
            let perm = crate::cpu::refill_permutations();
            let need = 64 * segs.len();
            // SAFETY: the features are enabled; steps run while `r < full` (so `32 (r + 1) <= len`)
            // and `need` bytes of words remain.
            unsafe {
                let mut l = load_lanes(dec);
                let mut r = first;
                while r < full && l.wlen - l.pos >= need {
                    simd_step!(&mut l, segs, r, perm);
                    r += 1;
                }
                store_lanes(dec, &l);
                r
            }
        }

        /// Full steps `0..` of a block of each of two streams, interleaved; returns the number of
        /// steps both decoded.
        ///
        /// # Safety
        /// As for the single-stream loop, for both streams.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $pair(
            da: &mut Decoder<'_>,
            sa: &mut [DecodeSegment<'_, '_>],
            la: usize,
            db: &mut Decoder<'_>,
            sb: &mut [DecodeSegment<'_, '_>],
            lb: usize,
        ) -> usize {
            if sa.is_empty() || sb.is_empty() {
                return 0;
            }
            let full = (la / LANES).min(lb / LANES);
            let perm = crate::cpu::refill_permutations();
            let (need_a, need_b) = (64 * sa.len(), 64 * sb.len());
            // SAFETY: as in the single-stream loop, for each stream.
            unsafe {
                let mut a = load_lanes(da);
                let mut b = load_lanes(db);
                let mut r = 0;
                while r < full && a.wlen - a.pos >= need_a && b.wlen - b.pos >= need_b {
                    simd_step!(&mut a, sa, r, perm);
                    simd_step!(&mut b, sb, r, perm);
                    r += 1;
                }
                store_lanes(da, &a);
                store_lanes(db, &b);
                r
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    simd_step_loops!("avx2,popcnt", avx2_rounds, avx2_rounds_pair);
}
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    simd_step_loops!(
        "avx2,popcnt,avx512f,avx512vl",
        avx512_rounds,
        avx512_rounds_pair
    );
}
#[cfg(target_arch = "x86_64")]
use avx2::{avx2_rounds, avx2_rounds_pair};
#[cfg(target_arch = "x86_64")]
use avx512::{avx512_rounds, avx512_rounds_pair};
