//! The interleaved rANS encoder. It walks the decoder's order backwards; full steps of 32 symbols
//! use AVX-512 or AVX2 where the CPU has them (identical output to the scalar path).

use super::table::{EncSymbol, EncTable, RankedTable};
use super::{stash_states, LANES, PROB_BITS, PROB_SCALE};

/// A sequence of symbols and the table that codes them.
#[derive(Clone, Copy)]
pub struct Seq<'a> {
    pub syms: &'a [u8],
    /// Packed entries (see [`super::table::EncTable::packed`]).
    pub packed: &'a [u64; 256],
    /// Scalar entries.
    pub scalar: &'a [EncSymbol; 256],
    /// The entries by rank, where the table is small (see [`RankedTable`]).
    pub ranked: Option<&'a RankedTable>,
}

impl<'a> Seq<'a> {
    /// `syms` coded with `table`.
    pub fn new(syms: &'a [u8], table: &'a EncTable) -> Seq<'a> {
        Seq {
            syms,
            packed: &table.packed,
            scalar: &table.syms,
            ranked: table.ranked.as_deref(),
        }
    }
}

/// The symbols one block contributes to its chunk's stream: the `main` sequences (all of one length,
/// in ascending plane order) are decoded step by step together; then the `sub` sequence on its own.
/// (Slices of one vector per chunk: two vectors per block were ~3% of a bf16 compress in the
/// allocator.)
#[derive(Clone, Copy, Default)]
pub struct BlockJob<'a> {
    pub main: &'a [Seq<'a>],
    /// A paired plane's ranks (format version 2), decoded after the main sequences.
    pub ranks: Option<Seq<'a>>,
    /// A paired plane's escape group, decoded after the ranks.
    pub escapes: Option<Seq<'a>>,
    pub sub: Option<Seq<'a>>,
}

/// Reusable encoder scratch.
#[derive(Default)]
pub struct EncoderScratch {
    words: Vec<u16>,
}

impl EncoderScratch {
    /// Gives the word buffer back if it holds more than `most` words (it keeps its largest length
    /// otherwise).
    pub(crate) fn trim(&mut self, most: usize) {
        if self.words.len() > most {
            self.words = Vec::new();
        }
    }

    #[cfg(test)]
    pub(crate) fn words_capacity(&self) -> usize {
        self.words.capacity()
    }
}

dispatch_wide! {
    /// `words.reverse()`, compiled for AVX-512F or AVX2 where the CPU has them: inlined into
    /// [`encode_stream`] it was SSE2 code (three 8-lane shuffles per 16 bytes, ~1.5% of a
    /// one-thread bf16 coding pass).
    fn reverse_words(words: &mut [u16]) = reverse_in_place;
}

/// The body of [`reverse_words`].
#[inline(always)]
fn reverse_in_place(words: &mut [u16]) {
    words.reverse()
}

/// Encodes a chunk's blocks into one stream and appends it to `out` (32 states, then words); the
/// initial states carry `stash` (at most 64 bytes, see [`super::stash_states`]).
///
/// Decoding order: block by block; within a block the main sequences step by step (a step is 32
/// symbols: lane `l` takes symbol `32 r + l`), plane by plane within a step; then the ranks, the
/// escape group and the sub sequence, each step by step on its own. The encoder walks that order backwards. Every symbol must have a non-zero frequency
/// in its table. With `streaming`, the words are appended past the caches
/// (`crate::streaming::extend`; the caller fences).
pub(crate) fn encode_stream(
    blocks: &[BlockJob<'_>],
    stash: &[u8],
    scratch: &mut EncoderScratch,
    out: &mut Vec<u8>,
    streaming: bool,
) {
    let total: usize = blocks
        .iter()
        .map(|b| {
            b.main
                .iter()
                .chain(&b.ranks)
                .chain(&b.escapes)
                .chain(&b.sub)
                .map(|s| s.syms.len())
                .sum::<usize>()
        })
        .sum();
    let words = &mut scratch.words;
    // Full steps store 8 words per vector of 8 lanes even when fewer are kept: leave slack. The
    // buffer keeps its largest length (every word is written before it is read; zeroing it for
    // each chunk was ~1% of a bf16 compress).
    if words.len() < total + 2 * LANES {
        words.resize(total + 2 * LANES, 0);
    }
    let mut x = stash_states(stash);
    let mut pos = 0usize;
    for block in blocks.iter().rev() {
        for one in [&block.sub, &block.escapes, &block.ranks]
            .into_iter()
            .flatten()
        {
            pos = encode_group(&mut x, std::slice::from_ref(one), words, pos);
        }
        if !block.main.is_empty() {
            pos = encode_group(&mut x, block.main, words, pos);
        }
    }
    out.reserve(LANES * 4 + 2 * pos);
    for xl in x {
        out.extend_from_slice(&xl.to_le_bytes());
    }
    // The words were emitted backwards: the stream holds them in reverse emission order. They are
    // reversed in place and appended as bytes (zeroing the output first and storing each word
    // into it was ~1% of a bf16 compress).
    let words = &mut words[..pos];
    reverse_words(words);
    if cfg!(target_endian = "little") {
        // SAFETY: the bytes of `pos` initialised u16s, read as 2 * pos bytes (u8 has no alignment
        // requirement; the borrow of `words` outlives the slice).
        let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, 2 * pos) };
        if streaming {
            crate::streaming::extend(out, bytes);
        } else {
            out.extend_from_slice(bytes);
        }
    } else {
        for w in words.iter() {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
}

/// Encodes a group of equally long sequences decoded step by step together.
fn encode_group(
    x: &mut [u32; LANES],
    group: &[Seq<'_>],
    words: &mut [u16],
    mut pos: usize,
) -> usize {
    let len = group[0].syms.len();
    // The SIMD steps read every sequence's symbols and write words by this length unchecked:
    // a group's sequences are one block's planes, all of one length (checked once a group).
    assert!(
        group.iter().all(|s| s.syms.len() == len),
        "a group's sequences differ in length"
    );
    let full = len / LANES;
    if !len.is_multiple_of(LANES) {
        for seq in group.iter().rev() {
            pos = encode_scalar(x, seq, full * LANES, len, words, pos);
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx512() {
            if crate::cpu::has_avx512_vbmi2() && group.iter().any(|s| s.ranked.is_some()) {
                // SAFETY: AVX-512F/BW/VBMI support was checked at run time; `words` as below.
                return unsafe { avx512_full_rounds_ranked(x, group, full, words, pos) };
            }
            // SAFETY: AVX-512F support was checked at run time; `words` has room for every symbol
            // plus 2 * 32 words of slack (each vector store writes 16 words).
            return unsafe { avx512_full_rounds(x, group, full, words, pos) };
        }
        if crate::cpu::has_avx2() {
            // SAFETY: AVX2 support was checked at run time; `words` has room for every symbol plus
            // 2 * 32 words of slack (each vector store writes 8 words).
            return unsafe { avx2_full_rounds(x, group, full, words, pos) };
        }
    }
    for r in (0..full).rev() {
        for seq in group.iter().rev() {
            pos = encode_scalar(x, seq, r * LANES, (r + 1) * LANES, words, pos);
        }
    }
    pos
}

/// Scalar encoding of symbols `from..to` of one step of `seq` (lanes from high to low).
fn encode_scalar(
    x: &mut [u32; LANES],
    seq: &Seq<'_>,
    from: usize,
    to: usize,
    words: &mut [u16],
    mut pos: usize,
) -> usize {
    for k in (from..to).rev() {
        let l = k - from;
        let s = &seq.scalar[seq.syms[k] as usize];
        debug_assert!(s.freq != 0, "symbol {} absent from its table", seq.syms[k]);
        let mut xl = x[l];
        let emit = xl as u64 >= (s.freq as u64) << (32 - PROB_BITS);
        words[pos] = xl as u16;
        pos += emit as usize;
        if emit {
            xl >>= 16;
        }
        x[l] = xl + s.cum + s.div(xl) * (PROB_SCALE - s.freq);
    }
    pos
}

/// AVX2 encoding of full steps `full-1` down to 0 of a group: four vectors of eight lanes, highest
/// lanes first; words of the lanes that renormalise are packed into the output with a shuffle table;
/// the division by the frequency is a multiply by a 32-bit reciprocal and one correction.
///
/// # Safety
/// AVX2 required; `words` must have room for `pos` plus every symbol of these steps plus 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn avx2_full_rounds(
    x: &mut [u32; LANES],
    group: &[Seq<'_>],
    full: usize,
    words: &mut [u16],
    mut pos: usize,
) -> usize {
    use std::arch::x86_64::*;
    let lut = crate::cpu::emit_shuffles();
    // SAFETY: symbols are read inside full steps of the sequence (k0 + 8 <= full * 32 <= len), and
    // stores of 16 bytes at `pos` stay inside `words` (guaranteed by the caller).
    unsafe {
        let xp = x.as_mut_ptr() as *mut __m256i;
        let mut xv = [
            _mm256_loadu_si256(xp),
            _mm256_loadu_si256(xp.add(1)),
            _mm256_loadu_si256(xp.add(2)),
            _mm256_loadu_si256(xp.add(3)),
        ];
        let m12 = _mm256_set1_epi32(0xFFF);
        let scale = _mm256_set1_epi32(PROB_SCALE as i32);
        let one = _mm256_set1_epi32(1);
        // Low 16 bits of each lane, lanes in descending order, in the low 8 bytes of each half.
        let rev16 = _mm256_setr_epi8(
            12, 13, 8, 9, 4, 5, 0, 1, -1, -1, -1, -1, -1, -1, -1, -1, 12, 13, 8, 9, 4, 5, 0, 1, -1,
            -1, -1, -1, -1, -1, -1, -1,
        );
        let wp = words.as_mut_ptr();
        // One vector's step (lanes `k0..k0 + 8`), written out four times with constant indices
        // so that the four states stay in registers: a loop over the vectors kept them on the
        // stack, each state through a store and a reload every step. With the chain shortened
        // below, MiniLM bf16's encode pass (one thread, `phasetime`, the two versions alternating
        // in one process, 30 runs, AVX2-only AMD EPYC, 2026-12-07) 37.5-37.9 -> 37.2-37.7 ms.
        let step = |seq: &Seq<'_>, k0: usize, x0: __m256i, pos: &mut usize| {
            // The entries of lanes 0, 1, 4, 5 in `a` and 2, 3, 6, 7 in `b`: the in-lane
            // shuffles below then give the low and the high words in lane order, where loading
            // them in order took a lane-crossing permute after each (MiniLM bf16 / fp32 encode
            // pass, in-process A/B as above: 33.5 / 35.0 / 35.7 -> 32.4 / 33.4 / 35.5 ms and
            // 46.1 / 46.1 -> 45.0 / 44.3 ms).
            let mut t = [0u64; 8];
            for (i, ti) in t.iter_mut().enumerate() {
                let lane = [0, 1, 4, 5, 2, 3, 6, 7][i];
                *ti = seq.packed[*seq.syms.get_unchecked(k0 + lane) as usize];
            }
            let a = _mm256_castsi256_ps(_mm256_loadu_si256(t.as_ptr() as *const __m256i));
            let b = _mm256_castsi256_ps(_mm256_loadu_si256(t.as_ptr().add(4) as *const __m256i));
            let fc = _mm256_castps_si256(_mm256_shuffle_ps::<0b10_00_10_00>(a, b));
            let rcp = _mm256_castps_si256(_mm256_shuffle_ps::<0b11_01_11_01>(a, b));
            let freq = _mm256_and_si256(fc, m12);
            let cum = _mm256_srli_epi32::<16>(fc);
            // Renormalise: lanes with x >= freq << 20 emit their low 16 bits.
            let xmax = _mm256_slli_epi32::<20>(freq);
            let emit = _mm256_cmpeq_epi32(_mm256_max_epu32(x0, xmax), x0);
            let m = _mm256_movemask_ps(_mm256_castsi256_ps(emit)) as usize;
            let w = _mm256_shuffle_epi8(x0, rev16);
            // Lanes 7..4 (high half) come before lanes 3..0.
            let w = _mm_unpacklo_epi64(_mm256_extracti128_si256::<1>(w), _mm256_castsi256_si128(w));
            let w = _mm_shuffle_epi8(w, _mm_loadu_si128(lut.as_ptr().add(m) as *const __m128i));
            _mm_storeu_si128(wp.add(*pos) as *mut __m128i, w);
            *pos += m.count_ones() as usize;
            let x1 = _mm256_blendv_epi8(x0, _mm256_srli_epi32::<16>(x0), emit);
            // q = x / freq: high half of x * R, then one correction.
            let even = _mm256_srli_epi64::<32>(_mm256_mul_epu32(x1, rcp));
            let odd = _mm256_mul_epu32(_mm256_srli_epi64::<32>(x1), _mm256_srli_epi64::<32>(rcp));
            let q = _mm256_blend_epi32::<0b1010_1010>(even, odd);
            // x' = x + cum + q (scale - freq), q one short where x - q freq >= freq: both
            // products of the estimate at once and `scale - freq` added where it was short (as
            // `encode16`: one multiplication fewer in the chain from state to state).
            let cmpl = _mm256_sub_epi32(scale, freq);
            let rem = _mm256_sub_epi32(x1, _mm256_mullo_epi32(q, freq));
            let x2 = _mm256_add_epi32(_mm256_add_epi32(x1, cum), _mm256_mullo_epi32(q, cmpl));
            let fix = _mm256_cmpgt_epi32(rem, _mm256_sub_epi32(freq, one));
            _mm256_add_epi32(x2, _mm256_and_si256(fix, cmpl))
        };
        for r in (0..full).rev() {
            for seq in group.iter().rev() {
                let k0 = r * LANES;
                xv[3] = step(seq, k0 + 24, xv[3], &mut pos);
                xv[2] = step(seq, k0 + 16, xv[2], &mut pos);
                xv[1] = step(seq, k0 + 8, xv[1], &mut pos);
                xv[0] = step(seq, k0, xv[0], &mut pos);
            }
        }
        for (v, vx) in xv.iter().enumerate() {
            _mm256_storeu_si256(xp.add(v), *vx);
        }
    }
    pos
}

/// Sixteen lanes' `(freq | cum << 16, R)` by two 64-bit gathers from a sequence's packed
/// entries, split by a two-source permute, in descending lane order (the order the AVX-512 loops
/// hold their states in: [`avx512_steps`]); inside an `unsafe` block of a function with AVX-512F
/// and SSSE3 enabled. Safety (the caller's): 16 symbols at `$syms`.
#[cfg(target_arch = "x86_64")]
macro_rules! gathered_entries {
    ($seq:expr, $syms:expr) => {{
        let table = $seq.packed.as_ptr();
        let idx = _mm512_cvtepu8_epi32(descending16!(_mm_loadu_si128($syms as *const __m128i)));
        let a = _mm512_i32gather_epi64::<8>(_mm512_castsi512_si256(idx), table as *const _);
        let b = _mm512_i32gather_epi64::<8>(_mm512_extracti64x4_epi64::<1>(idx), table as *const _);
        // Even dwords of two vectors of eight u64 (the low halves), then the odd ones.
        let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odds = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        (
            _mm512_permutex2var_epi32(a, evens, b),
            _mm512_permutex2var_epi32(a, odds, b),
        )
    }};
}

/// The sixteen bytes of a 128-bit vector in reverse order (byte 15 first); inside an `unsafe`
/// block of a function with SSSE3 enabled.
#[cfg(target_arch = "x86_64")]
macro_rules! descending16 {
    ($v:expr) => {
        _mm_shuffle_epi8(
            $v,
            _mm_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        )
    };
}

/// One encoding step of sixteen lanes held in descending lane order (lane 15 in the vector's
/// first element; [`avx512_steps`]) from their entries (`fc` = `freq | cum << 16`, `rcp` = R, in
/// the same order): renormalise (the emitted words, compressed to the front, are in descending
/// lane order as the format wants them; narrowed to 16 bits), then `x = (x / freq) * scale + cum
/// + x % freq` with the division by the reciprocal and one correction. Inside an `unsafe` block
/// of a function with AVX-512F enabled. Safety (the caller's): 16 words of room at `$wp + $pos`.
#[cfg(target_arch = "x86_64")]
macro_rules! encode16 {
    ($x:expr, $fc:expr, $rcp:expr, $wp:expr, $pos:expr) => {{
        let (fc, rcp) = ($fc, $rcp);
        let m12 = _mm512_set1_epi32(0xFFF);
        let freq = _mm512_and_si512(fc, m12);
        let cum = _mm512_srli_epi32::<16>(fc);
        let x0 = $x;
        // Renormalise: lanes with x >= freq << 20 emit their low 16 bits.
        let emit = _mm512_cmpge_epu32_mask(x0, _mm512_slli_epi32::<20>(freq));
        let w = _mm512_maskz_compress_epi32(emit, x0);
        _mm256_storeu_si256($wp.add($pos) as *mut __m256i, _mm512_cvtepi32_epi16(w));
        $pos += emit.count_ones() as usize;
        let x1 = _mm512_mask_blend_epi32(emit, x0, _mm512_srli_epi32::<16>(x0));
        // q = x / freq: high half of x * R, then one correction.
        let even = _mm512_srli_epi64::<32>(_mm512_mul_epu32(x1, rcp));
        let odd = _mm512_mul_epu32(_mm512_srli_epi64::<32>(x1), _mm512_srli_epi64::<32>(rcp));
        let q = _mm512_mask_blend_epi32(0xAAAA, even, odd);
        // x' = x + cum + q (scale - freq), q one short where x - q freq >= freq: both products
        // of the estimate at once, and `scale - freq` added once more where it was short (the
        // same sum modulo 2^32). The states chain each step to the next through these
        // operations; with the correction before the second product the chain held two 32-bit
        // multiplications (10 cycles each on Intel) in a row.
        let cmpl = _mm512_sub_epi32(_mm512_set1_epi32(PROB_SCALE as i32), freq);
        let rem = _mm512_sub_epi32(x1, _mm512_mullo_epi32(q, freq));
        let x2 = _mm512_add_epi32(_mm512_add_epi32(x1, cum), _mm512_mullo_epi32(q, cmpl));
        let fix = _mm512_cmpge_epu32_mask(rem, freq);
        $x = _mm512_mask_add_epi32(x2, fix, x2, cmpl);
    }};
}

/// The AVX-512 loops' skeleton: the states in two vectors of sixteen lanes, each in descending
/// lane order (lane 15 first), so that the words a step emits come out of a compress in the
/// format's order; steps `full-1` down to 0, the group's sequences from the last; `$step` codes
/// one sequence's step (its 32 symbols at `$syms`) into the states `$xv` and the words at `$wp`.
/// Inside an `unsafe` block of a function with AVX-512F enabled. Safety (the caller's): every
/// sequence holds `32 full` symbols.
///
/// Why the order: held in lane order, each step's emit mask was bit-reversed for the compress (a
/// run of ~17 scalar instructions a vector step, in `perf annotate` the most sampled part of the
/// loop after the gathers).
#[cfg(target_arch = "x86_64")]
macro_rules! avx512_steps {
    ($x:expr, $group:expr, $full:expr, $words:expr, |$seq:ident, $syms:ident, $xv:ident, $wp:ident| $step:block) => {{
        let xp = $x.as_mut_ptr() as *mut __m512i;
        let reverse = _mm512_setr_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        let mut $xv = [
            _mm512_permutexvar_epi32(reverse, _mm512_loadu_si512(xp)),
            _mm512_permutexvar_epi32(reverse, _mm512_loadu_si512(xp.add(1))),
        ];
        let $wp = $words.as_mut_ptr();
        for r in (0..$full).rev() {
            for $seq in $group.iter().rev() {
                let $syms = $seq.syms.as_ptr().add(r * LANES);
                $step
            }
        }
        _mm512_storeu_si512(xp, _mm512_permutexvar_epi32(reverse, $xv[0]));
        _mm512_storeu_si512(xp.add(1), _mm512_permutexvar_epi32(reverse, $xv[1]));
    }};
}

/// [`avx2_full_rounds`] with AVX-512F: two vectors of sixteen lanes, highest lanes first; the table
/// entries by two 64-bit gathers per vector ([`gathered_entries`]), the step by [`encode16`]. The
/// same arithmetic, so the same words and states.
///
/// # Safety
/// AVX-512F required; `words` must have room for `pos` plus every symbol of these steps plus 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,popcnt")]
unsafe fn avx512_full_rounds(
    x: &mut [u32; LANES],
    group: &[Seq<'_>],
    full: usize,
    words: &mut [u16],
    mut pos: usize,
) -> usize {
    use std::arch::x86_64::*;
    // SAFETY: symbols are read inside full steps of the sequence (k0 + 16 <= full * 32 <= len);
    // gather indices are symbols (< 256, the length of `packed`); stores of 32 bytes at `pos`
    // stay inside `words` (guaranteed by the caller).
    unsafe {
        avx512_steps!(x, group, full, words, |seq, syms, xv, wp| {
            for v in (0..2).rev() {
                let (fc, rcp) = gathered_entries!(seq, syms.add(16 * v));
                encode16!(xv[v], fc, rcp, wp, pos);
            }
        });
    }
    pos
}

/// [`avx512_full_rounds`] for groups with small tables ([`RankedTable`]): a step's 32 symbols are
/// turned into ranks by two 128-byte permutes and a blend on the symbols' top bit, and each
/// vector's entries taken by rank with two-register permutes (four and three blends for a wide
/// table); sequences without ranks gather as there. Same words and states.
///
/// # Safety
/// AVX-512F, BW and VBMI required; `words` as for [`avx512_full_rounds`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,popcnt")]
unsafe fn avx512_full_rounds_ranked(
    x: &mut [u32; LANES],
    group: &[Seq<'_>],
    full: usize,
    words: &mut [u16],
    mut pos: usize,
) -> usize {
    use std::arch::x86_64::*;
    // SAFETY: as in `avx512_full_rounds`; the ranked tables' loads read their own 64-byte-aligned
    // arrays (256 rank bytes, 128 entries each of `fc` and `rcp`: vectors 0..8), and the
    // permutes read only their indices' low bits, so any rank selects an entry of the table
    // (a present symbol's rank its own, rank 128's replaced by `last`; absent symbols, which a
    // sequence never holds, map to 0).
    unsafe {
        avx512_steps!(x, group, full, words, |seq, syms, xv, wp| {
            if let Some(rt) = seq.ranked {
                let s = _mm512_castsi256_si512(_mm256_loadu_si256(syms as *const __m256i));
                let rp = rt.rank.as_ptr() as *const __m512i;
                let low = _mm512_permutex2var_epi8(
                    _mm512_load_si512(rp),
                    s,
                    _mm512_load_si512(rp.add(1)),
                );
                let high = _mm512_permutex2var_epi8(
                    _mm512_load_si512(rp.add(2)),
                    s,
                    _mm512_load_si512(rp.add(3)),
                );
                let ranks = _mm512_mask_blend_epi8(_mm512_movepi8_mask(s), low, high);
                let fp = rt.fc.as_ptr() as *const __m512i;
                let cp = rt.rcp.as_ptr() as *const __m512i;
                // Entries `32 q .. 32 q + 32` of a field by rank (the permute reads the rank's
                // low five bits).
                let quarter = |t: *const __m512i, q: usize, idx: __m512i| {
                    let lo = _mm512_load_si512(t.add(2 * q));
                    _mm512_permutex2var_epi32(lo, idx, _mm512_load_si512(t.add(2 * q + 1)))
                };
                for v in (0..2).rev() {
                    // The ranks in descending lane order, as the states are held.
                    let idx = _mm512_cvtepu8_epi32(descending16!(if v == 0 {
                        _mm512_castsi512_si128(ranks)
                    } else {
                        _mm512_extracti32x4_epi32::<1>(ranks)
                    }));
                    let (fc, rcp) = if rt.wide {
                        // The quarter by the rank's bits 5 and 6.
                        let b5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32));
                        let b6 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(64));
                        let field = |t: *const __m512i| {
                            let low =
                                _mm512_mask_blend_epi32(b5, quarter(t, 0, idx), quarter(t, 1, idx));
                            let high =
                                _mm512_mask_blend_epi32(b5, quarter(t, 2, idx), quarter(t, 3, idx));
                            _mm512_mask_blend_epi32(b6, low, high)
                        };
                        match rt.last {
                            None => (field(fp), field(cp)),
                            // Rank 128 (bit 7; the permutes read bits 0-4) from the entry held
                            // apart.
                            Some((lf, lr)) => {
                                let b7 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(128));
                                (
                                    _mm512_mask_blend_epi32(
                                        b7,
                                        field(fp),
                                        _mm512_set1_epi32(lf as i32),
                                    ),
                                    _mm512_mask_blend_epi32(
                                        b7,
                                        field(cp),
                                        _mm512_set1_epi32(lr as i32),
                                    ),
                                )
                            }
                        }
                    } else {
                        (quarter(fp, 0, idx), quarter(cp, 0, idx))
                    };
                    encode16!(xv[v], fc, rcp, wp, pos);
                }
            } else {
                for v in (0..2).rev() {
                    let (fc, rcp) = gathered_entries!(seq, syms.add(16 * v));
                    encode16!(xv[v], fc, rcp, wp, pos);
                }
            }
        });
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rans::table::FreqTable;

    /// The scalar, AVX2 and AVX-512 full steps (gathering, and by rank where tables are small)
    /// emit the same words and end in the same states, for groups of one to three sequences over
    /// tables from skewed to flat (including frequency-1 symbols, whose reciprocal is the special
    /// `2^32 - 1`); every other case's tables keep at most 32 symbols scattered over 0..=255 (the
    /// rank lookup's two halves), some groups mixing small and large tables.
    #[test]
    fn simd_full_steps_equal_the_scalar_ones() {
        let mut next = crate::rans::test_input::xorshift(0x9E37_79B9_7F4A_7C15);
        let (mut ranked_cases, mut wide_cases, mut last_cases) = (0, 0, 0);
        for case in 0..120 {
            let full = 1 + (next() % 9) as usize;
            let nseq = 1 + case % 3;
            let mut tables = Vec::new();
            let mut syms = Vec::new();
            for i in 0..nseq {
                let mut counts = crate::rans::test_input::table_counts(&mut next, case);
                if case % 4 == 2 {
                    // 127, 128 or 129 symbols: the widest ranked tables, whose 129th symbol
                    // (rank 128) is held apart.
                    let width = 127 + (case / 4) % 3;
                    let first = (next() % (257 - width as u64)) as usize;
                    counts = std::array::from_fn(|s| match s >= first && s < first + width {
                        true => 1 + next() % [3, 100, 100_000][(case / 4) % 3],
                        false => 0,
                    });
                }
                if case % 2 == 1 && (i == 0 || next().is_multiple_of(2)) {
                    // 2 to 32 symbols, anywhere (a table of one symbol codes no rANS: the
                    // plane is constant there). The first two are distinct.
                    let keep = 2 + next() % 31;
                    let mut kept = [0u64; 256];
                    let first = next() % 256;
                    for k in 0..keep {
                        let s = if k < 2 { first + k } else { next() } % 256;
                        kept[s as usize] = 1 + next() % [3, 100, 100_000][case % 3];
                    }
                    counts = kept;
                }
                let t = FreqTable::normalize(&counts, None).unwrap();
                let present: Vec<u8> = (0..256)
                    .filter(|&s| t.freq[s] > 0)
                    .map(|s| s as u8)
                    .collect();
                syms.push(
                    (0..full * LANES)
                        .map(|_| present[(next() % present.len() as u64) as usize])
                        .collect::<Vec<u8>>(),
                );
                // Wide tables by rank too, whatever this CPU's vendor (they are correct on
                // any CPU with VBMI; `encode_table` makes them only where they pay).
                tables.push(t.encode_table_with(true));
            }
            let group: Vec<Seq<'_>> = (0..nseq).map(|i| Seq::new(&syms[i], &tables[i])).collect();
            ranked_cases += group.iter().any(|s| s.ranked.is_some()) as usize;
            wide_cases += group.iter().any(|s| s.ranked.is_some_and(|r| r.wide)) as usize;
            last_cases += group
                .iter()
                .any(|s| s.ranked.is_some_and(|r| r.last.is_some()))
                as usize;
            // States anywhere in [2^16, 2^32), as the encoder keeps them.
            let start: [u32; LANES] = std::array::from_fn(|_| {
                crate::rans::STATE_LOWER
                    + (next() % (u32::MAX - crate::rans::STATE_LOWER) as u64) as u32
            });
            let run = |path: &str| -> ([u32; LANES], Vec<u16>) {
                let mut st = start;
                let mut words = vec![0u16; nseq * full * LANES + 2 * LANES];
                let mut pos = 0;
                match path {
                    "scalar" => {
                        for r in (0..full).rev() {
                            for seq in group.iter().rev() {
                                pos = encode_scalar(
                                    &mut st,
                                    seq,
                                    r * LANES,
                                    (r + 1) * LANES,
                                    &mut words,
                                    pos,
                                );
                            }
                        }
                    }
                    // SAFETY: each path runs only where the CPU has its features; `words` has the
                    // slack the SIMD paths need.
                    #[cfg(target_arch = "x86_64")]
                    "avx2" => {
                        pos = unsafe { avx2_full_rounds(&mut st, &group, full, &mut words, 0) }
                    }
                    #[cfg(target_arch = "x86_64")]
                    "avx512" => {
                        pos = unsafe { avx512_full_rounds(&mut st, &group, full, &mut words, 0) }
                    }
                    #[cfg(target_arch = "x86_64")]
                    "avx512_ranked" => {
                        pos = unsafe {
                            avx512_full_rounds_ranked(&mut st, &group, full, &mut words, 0)
                        }
                    }
                    _ => unreachable!(),
                }
                words.truncate(pos);
                (st, words)
            };
            let want = run("scalar");
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx2") {
                    assert!(run("avx2") == want, "AVX2, case {case}");
                }
                if std::is_x86_feature_detected!("avx512f") {
                    assert!(run("avx512") == want, "AVX-512, case {case}");
                }
                if crate::cpu::has_avx512_vbmi2() {
                    assert!(run("avx512_ranked") == want, "AVX-512 by rank, case {case}");
                }
            }
        }
        assert!(
            ranked_cases >= 60 && wide_cases >= 10 && last_cases >= 5,
            "{ranked_cases} cases with a small table, {wide_cases} with a wide one, {last_cases} \
             with 129 symbols"
        );
    }
}
