//! The interleaved rANS decoder: a portable scalar path and an AVX2 path chosen at run time.
//!
//! Safety against hostile streams: table lookups are masked to 12 bits, every word read is bounds
//! checked (the AVX2 path only runs while 64 bytes per segment remain, which covers the most a step of 32 lanes can
//! read; the AVX-512 path too, and it takes a stream's last words from a zero-padded copy, where a
//! step that moves past them is the stream ending early), and the end-of-stream checks (all states
//! back at `2^16`, all words read) reject streams that do not decode to exactly what an encoder
//! wrote.

use super::table::RankedDecodeTable;
use super::{LANES, MAX_STASH, PROB_BITS, PROB_SCALE, STATE_BYTES, STATE_LOWER};
use crate::error::{corrupt, Error, Result};

/// The decoder's tables of one frequency table ([`super::table::FreqTable::decode_table`]).
pub struct DecodeTable {
    /// Per slot (`x & 4095`): `sym | freq << 8 | (slot - cum) << 20`.
    pub slots: [u32; PROB_SCALE as usize],
    /// The same lookup by rank, for a small table (the AVX-512 VBMI step's, where
    /// `crate::cpu::ranked_decode`).
    pub ranked: Option<RankedDecodeTable>,
}

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
    /// Lines to prefetch during the next steps.
    pf: Prefetches,
    /// Whether the AVX-512 steps look small tables up by rank ([`crate::cpu::ranked_decode`]
    /// unless a test chose).
    ranked: bool,
}

/// The lines a stream's steps prefetch: output for writing ([`Decoder::prefetch_output`]) and
/// input for reading ([`Decoder::prefetch_input`]).
#[derive(Clone, Copy, Default)]
struct Prefetches {
    out: Prefetch,
    inp: Prefetch,
}

impl Prefetches {
    /// A step's prefetches of both kinds; the SIMD step loops call it once a step.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn step(&mut self) {
        self.out.lines::<true>();
        self.inp.lines::<false>();
    }
}

/// Cache lines `at..end` (64 bytes each) still to prefetch, `step` of them a step.
#[derive(Clone, Copy, Default)]
struct Prefetch {
    at: usize,
    end: usize,
    step: usize,
}

impl Prefetch {
    fn new(bytes: &[u8], per_step: usize) -> Prefetch {
        let at = bytes.as_ptr() as usize;
        Prefetch {
            at: at & !63,
            end: at + bytes.len(),
            step: per_step.clamp(1, 8),
        }
    }

    /// Prefetches the next `step` lines (for writing with `WRITE`, else for reading) while any of
    /// the range is pending, and moves past them. One check a step, not one a line: the last step
    /// may hint up to `step - 1` lines past the range, which are the next block's (a prefetch
    /// never faults). The first two lines are unrolled (steps of one or two lines are the common
    /// case). Against a check per line, one thread, warm, probe of 9 rounds alternating
    /// (2026-12-04, Sapphire Rapids VM): synthetic bf16 4.09-4.17 -> 4.21-4.28 GB/s, synthetic
    /// fp32 5.67-5.84 -> 5.75-6.00, MiniLM bf16 4.17-4.27 -> 4.27-4.32, MiniLM fp16 4.56-5.23 ->
    /// 4.90-5.35; the same with a plain loop over the `step` lines gained nothing (4.15-4.18,
    /// 5.61-5.76, 4.23-4.26).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn lines<const WRITE: bool>(&mut self) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0};
        if self.at >= self.end {
            return;
        }
        let line = |a: usize| {
            // SAFETY: a prefetch is a hint: it never faults and changes no memory.
            unsafe {
                match WRITE {
                    true => _mm_prefetch::<_MM_HINT_ET0>(a as *const i8),
                    false => _mm_prefetch::<_MM_HINT_T0>(a as *const i8),
                }
            }
        };
        line(self.at);
        if self.step > 1 {
            line(self.at + 64);
            for j in 2..self.step {
                line(self.at + 64 * j);
            }
        }
        self.at += 64 * self.step;
    }
}

const MASK: u32 = PROB_SCALE - 1;

#[inline(always)]
fn step(x: u32, e: u32) -> u32 {
    ((e >> 8) & 0xFFF) * (x >> PROB_BITS) + (e >> 20)
}

/// Every segment's output must hold the block's `len` symbols: the SIMD steps store 8 or 16 bytes
/// per lane and step without a bounds check of their own (the decoder's callers size them so;
/// this keeps a public caller who does not from writing past a slice).
fn room_for(segs: &[DecodeSegment<'_, '_>], len: usize) -> Result<()> {
    match segs.iter().find(|s| s.out.len() < len) {
        None => Ok(()),
        Some(s) => Err(Error::OutputSize {
            expected: len,
            got: s.out.len(),
        }),
    }
}

impl<'a> Decoder<'a> {
    /// Starts decoding `stream` (states, then words).
    pub fn new(stream: &'a [u8]) -> Result<Self> {
        if stream.len() < STATE_BYTES || !(stream.len() - STATE_BYTES).is_multiple_of(2) {
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
            pf: Prefetches::default(),
            ranked: crate::cpu::ranked_decode(),
        })
    }

    /// The decoder with the lookups by rank on or off where the CPU has AVX-512 VBMI (off
    /// elsewhere), whatever [`crate::cpu::ranked_decode`] chose: the tests run both step loops
    /// on any such CPU.
    #[cfg(test)]
    fn with_ranked(mut self, ranked: bool) -> Self {
        self.ranked = ranked && crate::cpu::has_avx512_vbmi2();
        self
    }

    /// Asks the next steps to prefetch `out`'s cache lines for writing, `per_step` lines a step
    /// (1..=8; the AVX-512 and AVX2 steps do, the scalar loop ignores it). A block's output
    /// merged into lines fetched this way is written with ordinary stores that do not wait for
    /// memory; non-temporal stores, used before for large outputs, left a block's last ~100
    /// stores in the store buffer when its merge ended, and the next block's first stores (its
    /// symbols) waited for them. The prefetches must end well before the merge: at two lines a
    /// step, 4-byte units (256 lines and 128 steps a block) were prefetched by the block's last
    /// steps and decoded 12% slower than with non-temporal stores (without the conditioned
    /// plane), at four 17% faster; the decoder asked for one line per byte of the unit, which
    /// ends the prefetches halfway through a full block's steps (since the raw bytes are
    /// prefetched too, [`Decoder::prefetch_input`], at most two lines a step:
    /// `Cursor::aim_prefetch`). Measured against non-temporal stores (2026-12-03, a 64 MiB
    /// tensor on one thread of the Intel AVX-512 VM, 4096-unit blocks, alternating in one
    /// process, 24 rounds): bf16 +18-21%, fp32 +9-10%; without the conditioned plane +29-31% /
    /// +18-23% (docs/DESIGN.md, "CPU engine"). The AVX2 steps (`TENSORZIP_NO_AVX512=1` on the
    /// same VM, 30 rounds): bf16 / fp32 +9%, all of MiniLM bf16 / fp32 +11% / +10%.
    pub fn prefetch_output(&mut self, out: &[u8], per_step: usize) {
        self.pf.out = Prefetch::new(out, per_step);
    }

    /// Asks the next steps to prefetch `bytes`' cache lines for reading, `per_step` lines a step
    /// (1..=8; as [`Decoder::prefetch_output`]): the raw bytes a block's merge reads after its
    /// steps.
    pub fn prefetch_input(&mut self, bytes: &[u8], per_step: usize) {
        self.pf.inp = Prefetch::new(bytes, per_step);
    }

    /// Whether every line of the range given to [`Decoder::prefetch_output`] was prefetched (then
    /// it is written with ordinary stores); forgets both ranges either way.
    pub fn take_prefetched(&mut self) -> bool {
        let done = self.pf.out.end != 0 && self.pf.out.at >= self.pf.out.end;
        self.pf = Prefetches::default();
        done
    }

    /// Decodes one block: `len` symbols of every segment (each `out` holds at least `len` bytes).
    pub fn decode_block(&mut self, segs: &mut [DecodeSegment<'_, '_>], len: usize) -> Result<()> {
        room_for(segs, len)?;
        self.used |= len > 0 && !segs.is_empty();
        let done = simd_rounds(self, segs, len, 0)?;
        self.decode_block_scalar(segs, len, done)
    }

    /// Decodes a block of each of two independent streams (two chunks): the same as
    /// [`Decoder::decode_block`] on each, with the steps of the two interleaved in one loop while
    /// both have full steps left. A step is a chain of dependent operations (table lookup, state
    /// update, refill); two chains in one loop overlap where the registers hold both streams'
    /// states (with AVX-512: see `avx512`). The first stream's error is reported first.
    pub fn decode_block_pair(
        a: (&mut Decoder<'a>, &mut [DecodeSegment<'_, '_>], usize),
        b: (&mut Decoder<'_>, &mut [DecodeSegment<'_, '_>], usize),
    ) -> Result<()> {
        let ((da, sa, la), (db, sb, lb)) = (a, b);
        room_for(sa, la)?;
        room_for(sb, lb)?;
        da.used |= la > 0 && !sa.is_empty();
        db.used |= lb > 0 && !sb.is_empty();
        let both = simd_rounds_pair(da, sa, la, db, sb, lb);
        let done_a = simd_rounds(da, sa, la, both)?;
        da.decode_block_scalar(sa, la, done_a)?;
        let done_b = simd_rounds(db, sb, lb, both)?;
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
                    let e = seg.table.slots[(x & MASK) as usize];
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
    let t = |i: u64| unsafe { *table.slots.get_unchecked((i & 0xFFFF_FFFF) as usize) as i32 };
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

/// Steps `first..` of a block decoded with SIMD where the CPU has it; returns the step it
/// stopped at (the rest go to the scalar path: with AVX-512 none, with AVX2 the steps near the
/// stream's end), or an error where the stream ran out.
fn simd_rounds(
    dec: &mut Decoder<'_>,
    segs: &mut [DecodeSegment<'_, '_>],
    len: usize,
    first: usize,
) -> Result<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx512() {
            // SAFETY: AVX-512F support was checked at run time, and for the ranked steps BW and
            // VBMI (`ranked` is only set where `cpu::has_avx512_vbmi2`).
            let r = unsafe {
                if dec.ranked {
                    avx512::rounds_ranked(dec, segs, len, first)
                } else {
                    avx512::rounds(dec, segs, len, first)
                }
            };
            return match r {
                Some(r) => Ok(r),
                None => corrupt("rANS stream ends early"),
            };
        }
        if crate::cpu::has_avx2() {
            // SAFETY: AVX2 support was checked at run time.
            return Ok(unsafe { avx2_rounds(dec, segs, len, first) });
        }
    }
    Ok(first)
}

/// The full steps the two streams of [`Decoder::decode_block_pair`] decode together (from step
/// 0): with AVX-512, where the two streams' states fit the registers; 0 elsewhere (each stream
/// then goes on alone: with AVX2's 16 registers, two streams interleaved were 3-8% slower than one
/// at a time, docs/DESIGN.md).
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
        if crate::cpu::has_avx512() {
            // SAFETY: AVX-512F support was checked at run time, and for the ranked steps BW and
            // VBMI (`ranked` is only set where `cpu::has_avx512_vbmi2`).
            return unsafe {
                if da.ranked && db.ranked {
                    avx512::rounds_pair_ranked(da, sa, la, db, sb, lb)
                } else {
                    avx512::rounds_pair(da, sa, la, db, sb, lb)
                }
            };
        }
    }
    let _ = (da, sa, la, db, sb, lb);
    0
}

/// AVX2 decoding of steps `first..` of a block: 32 lanes as four vectors of eight, table
/// lookups through general registers (`lookup`), refills via a permutation table; a partial last
/// step with the lanes past the block's end masked. Returns the step it stopped at (the rest, the
/// steps near the stream's end, go to the scalar path). (Two streams
/// interleaved in one loop were measured on this project's Zen 3 VM at 3-8% *slower* than one at a
/// time, 2026-11-30, docs/DESIGN.md: eight state vectors and the constants do not fit the 16
/// registers.)
///
/// # Safety
/// The CPU must support AVX2. Every segment must hold at least `len` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn avx2_rounds(
    dec: &mut Decoder<'_>,
    segs: &mut [DecodeSegment<'_, '_>],
    len: usize,
    first: usize,
) -> usize {
    use std::arch::x86_64::*;
    let full_rounds = len / LANES;
    let nseg = segs.len();
    if nseg == 0 {
        return full_rounds.max(first);
    }
    let perm = crate::cpu::refill_permutations();
    // One step of every segment reads at most 64 bytes per segment.
    let need_bytes = 64 * nseg;
    let mut r = first;
    // SAFETY: every access below stays inside the decoder states, the segment outputs (which hold
    // `len` bytes, and `r * 32 + 32 <= len` for full steps; a partial step stores through checked
    // slices), the tables (slot masked to 12 bits) and the word stream (a step runs only while
    // `need_bytes` remain unread).
    unsafe {
        let xp = dec.x.as_mut_ptr() as *mut __m256i;
        let mut x = [
            _mm256_loadu_si256(xp),
            _mm256_loadu_si256(xp.add(1)),
            _mm256_loadu_si256(xp.add(2)),
            _mm256_loadu_si256(xp.add(3)),
        ];
        let mut pos = dec.pos;
        let words = dec.words.as_ptr();
        let wlen = dec.words.len();
        let mask = _mm256_set1_epi32(MASK as i32);
        let zero = _mm256_setzero_si256();
        let bytesel = _mm256_setr_epi8(
            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1,
            -1, -1, -1, -1, -1, -1, -1, -1, -1,
        );
        let join = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
        // One step of the eight lanes of `xv` on `table`: their symbols (the low byte of each
        // entry, 8 bytes) and their states after it, refilled from the stream at `pos` where they
        // fell below 2^16, each such lane one word, in lane order. With `keep` (a partial step's
        // lanes) only those lanes: the others read no word and keep their state.
        let step = |xv: __m256i, table: &DecodeTable, keep: Option<__m256i>, pos: &mut usize| {
            let e = lookup(table, _mm256_and_si256(xv, mask));
            // The frequency is 12 bits, as the slot mask.
            let f = _mm256_and_si256(_mm256_srli_epi32::<8>(e), mask);
            let nx = _mm256_add_epi32(
                _mm256_mullo_epi32(f, _mm256_srli_epi32::<12>(xv)),
                _mm256_srli_epi32::<20>(e),
            );
            let sy = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(e, bytesel), join);
            let mut need = _mm256_cmpeq_epi32(_mm256_srli_epi32::<16>(nx), zero);
            if let Some(k) = keep {
                need = _mm256_and_si256(need, k);
            }
            let m = _mm256_movemask_ps(_mm256_castsi256_ps(need)) as usize;
            let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(words.add(*pos) as *const __m128i));
            let idx = _mm256_loadu_si256(perm.as_ptr().add(m) as *const __m256i);
            let w = _mm256_permutevar8x32_epi32(w, idx);
            let refilled = _mm256_or_si256(_mm256_slli_epi32::<16>(nx), w);
            let mut next = _mm256_blendv_epi8(nx, refilled, need);
            if let Some(k) = keep {
                next = _mm256_blendv_epi8(xv, next, k);
            }
            *pos += 2 * m.count_ones() as usize;
            (_mm256_castsi256_si128(sy), next)
        };
        let mut pf = dec.pf;
        while r < full_rounds && wlen - pos >= need_bytes {
            pf.step();
            for seg in segs.iter_mut() {
                for (v, xv) in x.iter_mut().enumerate() {
                    let (sy, next) = step(*xv, seg.table, None, &mut pos);
                    let out = seg.out.as_mut_ptr().add(r * LANES + 8 * v);
                    _mm_storel_epi64(out as *mut __m128i, sy);
                    *xv = next;
                }
            }
            r += 1;
        }
        // A partial last step (`len` not a multiple of the 32 lanes: a conditioned sub-segment's
        // or an escape group's last symbols, or the whole of a short one): the lanes past `len`
        // neither store a symbol, nor read a word, nor change their state. Taken by the scalar
        // loop until 2026-12-08: on the AVX2 VM (one thread, both paths in one process,
        // alternating runs) MiniLM bf16 decode -6%, fp32 -3.6%, fp16 and synthetic bf16 (few
        // partial steps) unchanged.
        let active = len % LANES;
        if r == full_rounds && active != 0 && wlen - pos >= need_bytes {
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            for seg in segs.iter_mut() {
                for (v, xv) in x.iter_mut().enumerate() {
                    let n = active.saturating_sub(8 * v).min(8);
                    if n == 0 {
                        break;
                    }
                    let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane);
                    let (sy, next) = step(*xv, seg.table, Some(keep), &mut pos);
                    // Through a checked slice: this step's lanes may end inside the eight.
                    let bytes = (_mm_cvtsi128_si64(sy) as u64).to_le_bytes();
                    let at = r * LANES + 8 * v;
                    seg.out[at..at + n].copy_from_slice(&bytes[..n]);
                    *xv = next;
                }
            }
            r += 1;
        }
        for (v, xv) in x.iter().enumerate() {
            _mm256_storeu_si256(xp.add(v), *xv);
        }
        dec.pos = pos;
        dec.pf = pf;
    }
    r
}

/// AVX-512F steps: 32 lanes as two vectors of sixteen, table lookups by `vpgatherdd`, refills by
/// `vpexpandd` (the next sixteen words widened, the first ones moved to the lanes whose state fell
/// below 2^16, in lane order): a third of the AVX2 step's instructions. One stream at a time is
/// bound by the step's latency (the gather's above all); two streams interleaved (`rounds_pair`)
/// overlap. One thread of the Intel VM of 2026-12-01 (`examples/hotloop {bf16,fp32,fp16} 4096 7
/// dec`): AVX2 1.27 / 2.07 / 1.38 GB/s; this, one stream 1.39-1.43 / 2.19-2.24 / 1.41-1.52; two
/// streams 1.79-1.86 / 2.62-2.70 / 1.89-1.97. (`vpexpandw` straight from memory, AVX512-VBMI2, was
/// no faster.) Where [`crate::cpu::ranked_decode`], tables of at most 64 symbols are looked up
/// by rank with register permutes instead ([`RankedDecodeTable`]; `rounds_ranked`).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// One stream's states in a run of full steps.
    struct Lanes {
        x: [__m512i; 2],
        pos: usize,
        words: *const u8,
        wlen: usize,
        pf: Prefetches,
    }

    /// # Safety
    /// AVX-512F required.
    #[target_feature(enable = "avx512f,popcnt")]
    #[inline]
    unsafe fn load(dec: &Decoder<'_>) -> Lanes {
        let xp = dec.x.as_ptr() as *const __m512i;
        // SAFETY: `x` is 32 u32 = two unaligned 64-byte vectors.
        unsafe {
            Lanes {
                x: [_mm512_loadu_si512(xp), _mm512_loadu_si512(xp.add(1))],
                pos: dec.pos,
                words: dec.words.as_ptr(),
                wlen: dec.words.len(),
                pf: dec.pf,
            }
        }
    }

    /// # Safety
    /// AVX-512F required.
    #[target_feature(enable = "avx512f,popcnt")]
    #[inline]
    unsafe fn store(dec: &mut Decoder<'_>, l: &Lanes) {
        let xp = dec.x.as_mut_ptr() as *mut __m512i;
        // SAFETY: as in `load`.
        unsafe {
            _mm512_storeu_si512(xp, l.x[0]);
            _mm512_storeu_si512(xp.add(1), l.x[1]);
        }
        dec.pos = l.pos;
        dec.pf = l.pf;
    }

    /// Sixteen lanes' table entries (gathered at their states' 12-bit slots) and their states
    /// before renormalisation.
    ///
    /// # Safety
    /// AVX-512F required; `table` holds 4096 entries (the slots are masked to 12 bits).
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn entries_and_next(x: __m512i, table: *const u32) -> (__m512i, __m512i) {
        let mask = _mm512_set1_epi32(MASK as i32);
        // SAFETY: the gather reads entries 0..4096 of `table` (the caller's).
        let e =
            unsafe { _mm512_i32gather_epi32::<4>(_mm512_and_si512(x, mask), table as *const _) };
        // The frequency is 12 bits, as the slot mask.
        let f = _mm512_and_si512(_mm512_srli_epi32::<8>(e), mask);
        let nx = _mm512_add_epi32(
            _mm512_mullo_epi32(f, _mm512_srli_epi32::<12>(x)),
            _mm512_srli_epi32::<20>(e),
        );
        (e, nx)
    }

    /// [`entries_and_next`] of `table`'s slots: the plain AVX-512 steps' lookup.
    ///
    /// # Safety
    /// AVX-512F required.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn gathered(x: __m512i, table: &DecodeTable) -> (__m512i, __m512i) {
        // SAFETY: `slots` holds 4096 entries.
        unsafe { entries_and_next(x, table.slots.as_ptr()) }
    }

    /// What [`entries_and_next`] gives, looked up by rank with register permutes where the table
    /// has a ranked form ([`RankedDecodeTable`], whose doc explains the buckets), else gathered.
    /// The entries differ from the slot table's above bit 20 (`cum` there, `slot - cum` in the
    /// slot table), which the steps do not read (they store the low byte).
    ///
    /// # Safety
    /// AVX-512F, BW and VBMI required.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    #[inline]
    unsafe fn by_rank_or_gathered(x: __m512i, table: &DecodeTable) -> (__m512i, __m512i) {
        // SAFETY (all three): the features are enabled; `slots` holds 4096 entries.
        match &table.ranked {
            Some(t) if !t.wide => unsafe { by_rank::<false>(x, t) },
            Some(t) => unsafe { by_rank::<true>(x, t) },
            None => unsafe { entries_and_next(x, table.slots.as_ptr()) },
        }
    }

    /// [`by_rank_or_gathered`]'s lookup by rank, of ranks up to 31 or (`WIDE`) 63.
    ///
    /// # Safety
    /// AVX-512F, BW and VBMI required.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    #[inline]
    unsafe fn by_rank<const WIDE: bool>(x: __m512i, t: &RankedDecodeTable) -> (__m512i, __m512i) {
        let mask = _mm512_set1_epi32(MASK as i32);
        let v = |p: *const u8, k: usize| {
            // SAFETY: every field of the table is 64-byte aligned (asserted beside its
            // definition); `bucket` and `fine` are two vectors long, `end` and `entry` four.
            unsafe { _mm512_load_si512(p.add(64 * k) as *const _) }
        };
        let (bucket, fine) = (t.bucket.as_ptr(), t.fine.as_ptr());
        let (ends, entries) = (t.end.as_ptr() as *const u8, t.entry.as_ptr() as *const u8);
        let slot = _mm512_and_si512(x, mask);
        // The bucket's byte lands in each lane's low byte (the lane's other index bytes are 0,
        // so its other bytes hold bucket 0's, which nothing below reads: the dword permutes use
        // bits 0-4, the byte permute bits 0-6 of the low byte, the tests bits 5 and 7).
        let cb = _mm512_permutex2var_epi8(v(bucket, 0), _mm512_srli_epi32::<5>(slot), v(bucket, 1));
        let marked = _mm512_test_epi32_mask(cb, _mm512_set1_epi32(0x80));
        // A field by rank: ranks 0-31 from its first two vectors, 32-63 (bit 5) from the next two.
        let bit5 = _mm512_set1_epi32(0x20);
        let field = |p: *const u8, r: __m512i| {
            let lo = _mm512_permutex2var_epi32(v(p, 0), r, v(p, 1));
            match WIDE {
                false => lo,
                true => _mm512_mask_blend_epi32(
                    _mm512_test_epi32_mask(r, bit5),
                    lo,
                    _mm512_permutex2var_epi32(v(p, 2), r, v(p, 3)),
                ),
            }
        };
        let past = _mm512_cmpge_epu32_mask(slot, field(ends, cb));
        let coarse = _mm512_mask_add_epi32(cb, past, cb, _mm512_set1_epi32(1));
        // `fine` index: bits 5-6 from the bucket's byte (`m`), bits 0-4 from the slot.
        let at = _mm512_ternarylogic_epi32::<0xCA>(_mm512_set1_epi32(0x1F), slot, cb);
        let ranked = _mm512_permutex2var_epi8(v(fine, 0), at, v(fine, 1));
        let rank = _mm512_mask_blend_epi32(marked, coarse, ranked);
        let e = field(entries, rank);
        let f = _mm512_and_si512(_mm512_srli_epi32::<8>(e), mask);
        let nx = _mm512_add_epi32(
            _mm512_mullo_epi32(f, _mm512_srli_epi32::<12>(x)),
            _mm512_sub_epi32(slot, _mm512_srli_epi32::<20>(e)),
        );
        (e, nx)
    }

    /// One step `r` of every segment of a stream, inside an `unsafe` block of a function with the
    /// features enabled (a macro, so that each loop keeps its states in registers).
    ///
    /// Safety (the caller's): every segment holds at least `32 (r + 1)` bytes; at least
    /// `64 * segs.len()` bytes of words remain after `pos`. Slots are masked to 12 bits (the tables
    /// hold 4096 entries); a step reads at most 64 bytes of words per segment.
    macro_rules! step512 {
        ($look:ident, $l:expr, $segs:expr, $r:expr) => {{
            let lower = _mm512_set1_epi32(STATE_LOWER as i32);
            let l: &mut Lanes = $l;
            for seg in $segs.iter_mut() {
                let table = seg.table;
                let out = seg.out.as_mut_ptr().add($r * LANES);
                for (v, xv) in l.x.iter_mut().enumerate() {
                    let (e, nx) = $look(*xv, table);
                    // Symbols: the low byte of each entry.
                    _mm_storeu_si128(out.add(16 * v) as *mut __m128i, _mm512_cvtepi32_epi8(e));
                    let k = _mm512_cmplt_epu32_mask(nx, lower);
                    // The 16 words at the read position widened to 32 bits; the first
                    // `popcount(k)` of them moved to the refilling lanes, in lane order.
                    let w = _mm512_maskz_expand_epi32(
                        k,
                        _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                            l.words.add(l.pos) as *const __m256i
                        )),
                    );
                    *xv = _mm512_mask_blend_epi32(
                        k,
                        nx,
                        _mm512_or_si512(_mm512_slli_epi32::<16>(nx), w),
                    );
                    l.pos += 2 * k.count_ones() as usize;
                }
            }
        }};
    }

    /// The last, partial step `r` of every segment of a stream: only the first `n` lanes
    /// (`0 < n < 32`) decode a symbol and may read a word, as in the full step (the scalar loop's
    /// order: segment by segment, lanes in order); the others keep their states and store
    /// nothing. Same caller's safety as [`step512`], with `32 r + n` bytes in every segment.
    /// A block's conditioned sub-segment ends in such a step (a fifth of a bf16 block's units
    /// are conditioned), which the scalar loop decoded a lane at a time.
    macro_rules! step512_partial {
        ($look:ident, $l:expr, $segs:expr, $r:expr, $n:expr) => {{
            let lower = _mm512_set1_epi32(STATE_LOWER as i32);
            let l: &mut Lanes = $l;
            let active = (1u32 << $n) - 1;
            for seg in $segs.iter_mut() {
                let table = seg.table;
                let out = seg.out.as_mut_ptr().add($r * LANES);
                for (v, xv) in l.x.iter_mut().enumerate() {
                    let am = (active >> (16 * v)) as __mmask16;
                    let (e, nx) = $look(*xv, table);
                    // Symbols of the active lanes only (a masked store writes nothing else).
                    _mm512_mask_cvtepi32_storeu_epi8(out.add(16 * v) as *mut _, am, e);
                    let k = _mm512_cmplt_epu32_mask(nx, lower) & am;
                    let w = _mm512_maskz_expand_epi32(
                        k,
                        _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                            l.words.add(l.pos) as *const __m256i
                        )),
                    );
                    let next = _mm512_mask_blend_epi32(
                        k,
                        nx,
                        _mm512_or_si512(_mm512_slli_epi32::<16>(nx), w),
                    );
                    *xv = _mm512_mask_blend_epi32(am, *xv, next);
                    l.pos += 2 * k.count_ones() as usize;
                }
            }
        }};
    }

    /// The step loops of one stream ([`rounds`]) and of two ([`rounds_pair`]), made with the lookup
    /// `$look` and the target features `$features`: with [`gathered`] for every AVX-512 CPU, and
    /// with [`by_rank_or_gathered`] (`rounds_ranked`, `rounds_pair_ranked`) where
    /// [`crate::cpu::ranked_decode`].
    macro_rules! rounds_fns {
        ($rounds:ident, $pair:ident, $look:ident, $features:literal) => {
            /// Steps `first..` of a block of one stream, the last partial one included; returns the
            /// step it stopped at (all of them, but for more than 8 segments near the stream's
            /// end), or `None` where the stream ran out (a lane needed a word past its end).
            ///
            /// # Safety
            /// The CPU must support the enabled features. Every segment must hold at least `len`
            /// bytes.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $rounds(
                dec: &mut Decoder<'_>,
                segs: &mut [DecodeSegment<'_, '_>],
                len: usize,
                first: usize,
            ) -> Option<usize> {
                let full = len / LANES;
                let n = len % LANES;
                let steps = len.div_ceil(LANES);
                if segs.is_empty() || first >= steps {
                    return Some(steps.max(first));
                }
                let need = 64 * segs.len();
                // SAFETY: the features are enabled; full steps run while `r < full` (so `32 (r + 1)
                // <= len`), the partial step at `r = full` with `32 r + n = len`, each only while
                // `need` bytes of words remain (in the stream, or in `tail` below).
                unsafe {
                    let mut l = load(dec);
                    let mut r = first;
                    while r < full && l.wlen - l.pos >= need {
                        l.pf.step();
                        step512!($look, &mut l, segs, r);
                        r += 1;
                    }
                    // The partial step: `32 full + n` bytes in every segment, `need` bytes of
                    // words. It prefetches too: a block's output not aligned to cache lines has a
                    // line more than its main steps take (fp32: 257 at two a step), and a
                    // sub-segment of fewer than 32 units has only this step (without, 4% of a
                    // synthetic fp32 tensor's blocks were merged by the slower non-temporal
                    // passes).
                    if r == full && n != 0 && l.wlen - l.pos >= need {
                        l.pf.step();
                        step512_partial!($look, &mut l, segs, r, n);
                        r += 1;
                    }
                    if r < steps && need <= 512 {
                        // The stream's last words (fewer than a step may read: a chunk's last few
                        // steps) copied into a zeroed buffer that a step cannot read past, so that
                        // they stay vector steps (the scalar loop took them: 1-2% of a one-thread
                        // decode) and prefetch as the others (without, a chunk's last block missed
                        // some of its output lines and was merged by the slower non-temporal
                        // passes). A step that leaves the read position past the copied words read
                        // a word the stream does not have: the stream ran out.
                        let rem = l.wlen - l.pos;
                        let mut tail = [0u8; 1024];
                        std::ptr::copy_nonoverlapping(l.words.add(l.pos), tail.as_mut_ptr(), rem);
                        let (words, wlen, pos) = (l.words, l.wlen, l.pos);
                        (l.words, l.wlen, l.pos) = (tail.as_ptr(), rem + need, 0);
                        while r < full && l.pos <= rem {
                            l.pf.step();
                            step512!($look, &mut l, segs, r);
                            r += 1;
                        }
                        if r == full && n != 0 && l.pos <= rem {
                            l.pf.step();
                            step512_partial!($look, &mut l, segs, r, n);
                            r += 1;
                        }
                        let over = l.pos > rem;
                        (l.words, l.wlen, l.pos) = (words, wlen, pos + l.pos.min(rem));
                        if over {
                            store(dec, &l);
                            return None;
                        }
                    }
                    store(dec, &l);
                    Some(r)
                }
            }

            /// Full steps `0..` of a block of each of two streams, interleaved; returns the number
            /// of steps both decoded.
            ///
            /// # Safety
            /// As for [`rounds`], for both streams.
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
                let (need_a, need_b) = (64 * sa.len(), 64 * sb.len());
                // SAFETY: as in `rounds`, for each stream.
                unsafe {
                    let mut a = load(da);
                    let mut b = load(db);
                    let mut r = 0;
                    while r < full && a.wlen - a.pos >= need_a && b.wlen - b.pos >= need_b {
                        a.pf.step();
                        b.pf.step();
                        step512!($look, &mut a, sa, r);
                        step512!($look, &mut b, sb, r);
                        r += 1;
                    }
                    store(da, &a);
                    store(db, &b);
                    r
                }
            }
        };
    }

    rounds_fns!(rounds, rounds_pair, gathered, "avx512f,popcnt");
    rounds_fns!(
        rounds_ranked,
        rounds_pair_ranked,
        by_rank_or_gathered,
        "avx512f,avx512bw,avx512vbmi,popcnt"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rans::table::FreqTable;

    /// One segment per table, decoding into the matching output.
    fn segments<'t, 'o>(
        tables: &'t [Box<DecodeTable>],
        outs: &'o mut [Vec<u8>],
    ) -> Vec<DecodeSegment<'t, 'o>> {
        tables
            .iter()
            .zip(outs.iter_mut())
            .map(|(t, o)| DecodeSegment { table: t, out: o })
            .collect()
    }

    /// The SIMD steps (full and partial, one stream and two interleaved) decode what the scalar
    /// loop decodes, lane by lane, and leave the same states and read position — over any
    /// words (a stream of random words is decodable), block lengths that are and are not
    /// multiples of the 32 lanes, one to three segments, tables from skewed to flat; and a
    /// stream that runs out fails on both paths (the vector steps take a stream's last words
    /// from a padded copy: a short stream runs there from its first step). The second half of
    /// the cases use tables of at most 64 symbols, which the ranked steps look up by rank
    /// ([`RankedDecodeTable`]); every case runs both step loops where the CPU has AVX-512 VBMI
    /// (whatever vendor), and the test checks that such tables, with and without buckets looked
    /// up slot by slot, were among them.
    #[test]
    fn simd_steps_equal_the_scalar_loop() {
        let mut next = crate::rans::test_input::xorshift(0x2545_F491_4F6C_DD1D);
        let (mut plain, mut with_fine, mut wide) = (0, 0, 0);
        for case in 0..240 {
            let nseg = 1 + case % 3;
            let tables: Vec<Box<DecodeTable>> = (0..nseg)
                .map(|_| {
                    let counts = match case < 120 {
                        true => crate::rans::test_input::table_counts(&mut next, case),
                        false => crate::rans::test_input::narrow_counts(&mut next, case),
                    };
                    FreqTable::normalize(&counts, None).unwrap().decode_table()
                })
                .collect();
            for t in tables.iter().filter_map(|t| t.ranked.as_ref()) {
                match t.bucket.iter().any(|&b| b & 0x80 != 0) {
                    true => with_fine += 1,
                    false => plain += 1,
                }
                wide += t.wide as usize;
            }
            let len = 1 + (next() % 200) as usize;
            // Enough words for every lane to refill at every step, or (every fourth case) a
            // stream cut short.
            let n_words = if case % 4 == 3 {
                (next() % 64) as usize
            } else {
                nseg * len + 64
            };
            let mut stream = Vec::with_capacity(STATE_BYTES + 2 * n_words);
            for _ in 0..LANES {
                let s = STATE_LOWER + (next() % (u32::MAX - STATE_LOWER) as u64) as u32;
                stream.extend_from_slice(&s.to_le_bytes());
            }
            stream.extend((0..2 * n_words).map(|_| next() as u8));
            // `None`: the scalar loop; `Some(ranked)`: the SIMD steps, with the lookups by rank
            // or not (by rank only where the CPU has VBMI).
            let run = |simd: Option<bool>| {
                let mut outs = vec![vec![0u8; len]; nseg];
                let mut dec = Decoder::new(&stream).unwrap();
                let mut segs = segments(&tables, &mut outs);
                let r = match simd {
                    Some(ranked) => {
                        dec = dec.with_ranked(ranked);
                        dec.decode_block(&mut segs, len)
                    }
                    None => dec.decode_block_scalar(&mut segs, len, 0),
                };
                drop(segs);
                (r.is_ok(), dec.x, dec.pos, outs)
            };
            let want = run(None);
            for ranked in [false, true] {
                let got = run(Some(ranked));
                assert_eq!(got.0, want.0, "case {case}, ranked {ranked}: result");
                if want.0 {
                    assert!(
                        got == want,
                        "case {case}, ranked {ranked}: len {len}, {nseg} segments"
                    );
                }
                // Two streams in one loop: each as if alone.
                let mut outs_a = vec![vec![0u8; len]; nseg];
                let mut outs_b = vec![vec![0u8; len]; nseg];
                let (mut da, mut db) = (
                    Decoder::new(&stream).unwrap().with_ranked(ranked),
                    Decoder::new(&stream).unwrap().with_ranked(ranked),
                );
                let mut sa = segments(&tables, &mut outs_a);
                let mut sb = segments(&tables, &mut outs_b);
                let r =
                    Decoder::decode_block_pair((&mut da, &mut sa, len), (&mut db, &mut sb, len));
                drop((sa, sb));
                assert_eq!(
                    r.is_ok(),
                    want.0,
                    "case {case}, ranked {ranked}: pair result"
                );
                if want.0 {
                    assert!(
                        (da.x, da.pos, &outs_a) == (want.1, want.2, &want.3),
                        "case {case}, ranked {ranked}: pair a"
                    );
                    assert!(
                        (db.x, db.pos, &outs_b) == (want.1, want.2, &want.3),
                        "case {case}, ranked {ranked}: pair b"
                    );
                }
            }
        }
        assert!(
            plain >= 20 && with_fine >= 20 && wide >= 20,
            "ranked tables: {plain} without and {with_fine} with fine buckets, {wide} wide"
        );
    }
}
