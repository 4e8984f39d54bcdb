//! Format version 2's paired exponent plane (docs/FORMAT.md, "Version 2"): adjacent bf16 units'
//! exponent bytes coded as one symbol, the *rank* of the pair in a table of at most
//! [`MAX_PAIRS`] pairs that the tensor's blob carries; a pair outside the table is the escape rank
//! (`D`, the table's length) and its two bytes follow in the stream, coded with the uniform table.
//!
//! Why: the rANS step is most of a bf16 decode, one step a unit on the exponent plane; ranks take
//! one step per two units (docs/DESIGN.md, "Format version 2, as built").
//! The table's pairs are made of the tensor's [`TOP_BYTES`] most frequent exponent bytes, so that
//! an engine counts them in a 16 x 16 array (a GPU block holds it in shared memory; all 65,536
//! pairs would not fit).

use crate::error::{corrupt, Result};
use crate::rans::decode::DecodeTable;
use crate::rans::table::{EncTable, FreqTable};

/// Most pairs a table holds (ranks `0..D`, the escape `D` at most 128: a rank is a byte symbol,
/// and the decoder looks the pairs' bytes up by rank with 128-byte permutes).
pub const MAX_PAIRS: usize = 128;
/// Fewest pairs a table holds (a table of one pair would code one pair and escapes).
pub const MIN_PAIRS: usize = 2;
/// Exponent bytes the pairs are made of: the most frequent ones.
pub const TOP_BYTES: usize = 16;

/// The table of one paired plane.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PairTable {
    /// `pairs[r]` = the bytes of units `2i` and `2i + 1` where rank `r` is coded.
    pairs: Vec<[u8; 2]>,
    /// The pairs' first and second bytes by rank, padded with zeros to [`MAX_PAIRS`] entries
    /// (the decoder's expansion looks them up by rank with byte permutes; the escape's entry is
    /// not used).
    firsts: [u8; MAX_PAIRS],
    seconds: [u8; MAX_PAIRS],
}

impl PairTable {
    /// A table of `pairs` (2 ..= 128 distinct pairs, as [`PairTable::parse`] requires).
    fn new(pairs: Vec<[u8; 2]>) -> PairTable {
        let (mut firsts, mut seconds) = ([0u8; MAX_PAIRS], [0u8; MAX_PAIRS]);
        for (r, p) in pairs.iter().enumerate() {
            (firsts[r], seconds[r]) = (p[0], p[1]);
        }
        PairTable {
            pairs,
            firsts,
            seconds,
        }
    }

    /// The escape rank (the number of pairs).
    pub fn escape(&self) -> u8 {
        self.pairs.len() as u8
    }

    /// The pairs by rank.
    pub fn pairs(&self) -> &[[u8; 2]] {
        &self.pairs
    }

    /// Bytes of the serialised table: `D`, then `D` pairs.
    pub fn serialized_len(&self) -> usize {
        1 + 2 * self.pairs.len()
    }

    /// Appends the serialised table.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(self.pairs.len() as u8);
        for p in &self.pairs {
            out.extend_from_slice(p);
        }
    }

    /// Parses a plane's pair field (`u8 D`, then `D` pairs) at the start of `data`: `None` for
    /// `D = 0` (the plane is not paired), else the table; and the bytes used. `D` must be 0 or in
    /// `2..=128`, the pairs distinct.
    pub fn parse(data: &[u8], plane: usize) -> Result<(Option<PairTable>, usize)> {
        let Some(&d) = data.first() else {
            return crate::error::truncated(format!("pair count of plane {plane}"));
        };
        let d = d as usize;
        if d == 0 {
            return Ok((None, 1));
        }
        if !(MIN_PAIRS..=MAX_PAIRS).contains(&d) {
            return corrupt(format!(
                "plane {plane}: {d} pairs (0, or {MIN_PAIRS} to {MAX_PAIRS})"
            ));
        }
        let Some(bytes) = data.get(1..1 + 2 * d) else {
            return crate::error::truncated(format!("{d} pairs of plane {plane}"));
        };
        let pairs: Vec<[u8; 2]> = bytes.chunks_exact(2).map(|p| [p[0], p[1]]).collect();
        // Distinct: one bit a pair seen (8 KiB on the stack; sorting a copy of the pairs was a
        // fifth of parsing a small model's blobs).
        let mut seen = [0u64; 1024];
        for p in &pairs {
            let key = (p[0] as usize) << 8 | p[1] as usize;
            let (word, bit) = (key / 64, 1u64 << (key % 64));
            if seen[word] & bit != 0 {
                return corrupt(format!("plane {plane}: pair {p:?} twice in its table"));
            }
            seen[word] |= bit;
        }
        Ok((Some(PairTable::new(pairs)), 1 + 2 * d))
    }

    /// The bytes a block of `out.len()` units holds, from its ranks (`ranks.len()` must be
    /// `out.len() / 2`) and its escape group (`esc`: each escaped pair's two bytes in pair order,
    /// then the odd last unit's byte; exactly that many): [`PairTable::expand_ranks`], then
    /// [`PairTable::patch`] (the decoder calls the two apart: the escape group is decoded
    /// between them).
    #[cfg(test)]
    fn expand(&self, ranks: &[u8], esc: &[u8], out: &mut [u8]) -> Result<()> {
        let mut escaped = Vec::new();
        self.expand_ranks(ranks, out, &mut escaped)?;
        self.patch(&escaped, esc, out)
    }

    /// The pairs of a block's ranks into `out` (`2 ranks.len()` or one more bytes, else
    /// `InvalidInput`; an odd last unit's byte is [`PairTable::patch`]'s), and the indices of its escaped pairs into
    /// `escaped` (cleared first): the escape group holds `2 escaped.len()` bytes, plus one for an
    /// odd block. Ranks above the escape are an error (a table never codes them; only a
    /// single-symbol table of a forged blob can name one: `BlobLayout::parse` refuses both).
    pub fn expand_ranks(&self, ranks: &[u8], out: &mut [u8], escaped: &mut Vec<u32>) -> Result<()> {
        escaped.clear();
        if ranks.len() != out.len() / 2 {
            return Err(crate::error::Error::InvalidInput(format!(
                "{} ranks for a block of {} units",
                ranks.len(),
                out.len()
            )));
        }
        let n = ranks.len();
        let mut from = 0usize;
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::has_avx512_vbmi2() {
            // SAFETY: `has_avx512_vbmi2` found AVX-512 F (through `has_avx512`), BW and VBMI.
            from = unsafe { self.expand_avx512(&ranks[..n], out, escaped) };
        } else if crate::cpu::has_avx2() {
            // SAFETY: `has_avx2` found AVX2.
            from = unsafe { self.expand_avx2(&ranks[..n], out, escaped) };
        }
        let d = self.escape();
        for (i, &r) in ranks[..n].iter().enumerate().skip(from) {
            if r < d {
                out[2 * i..2 * i + 2].copy_from_slice(&self.pairs[r as usize]);
            } else {
                escaped.push(i as u32);
            }
        }
        match escaped.iter().find(|&&i| ranks[i as usize] > d) {
            Some(&i) => corrupt(format!("rank {} past the escape {d}", ranks[i as usize])),
            None => Ok(()),
        }
    }

    /// Writes a block's escaped pairs (`escaped`, as [`PairTable::expand_ranks`] found them) and
    /// an odd last unit (`out.len()` odd) from its escape group `esc`, which must hold exactly
    /// those bytes.
    pub fn patch(&self, escaped: &[u32], esc: &[u8], out: &mut [u8]) -> Result<()> {
        let odd = out.len() % 2;
        if esc.len() != 2 * escaped.len() + odd {
            return corrupt(format!(
                "escape group of {} bytes for {} escaped pairs",
                esc.len(),
                escaped.len()
            ));
        }
        for (&i, b) in escaped.iter().zip(esc.chunks_exact(2)) {
            let i = i as usize;
            out[2 * i..2 * i + 2].copy_from_slice(b);
        }
        if odd == 1 {
            out[out.len() - 1] = esc[esc.len() - 1];
        }
        Ok(())
    }

    /// [`PairTable::expand_ranks`]'s whole groups of 64 ranks: the pairs' first and second bytes
    /// each by one 128-byte permute (`vpermi2b`), interleaved into the 128 output bytes by two
    /// more; the group's escapes (~0.2% of a weight tensor's pairs) noted from a compare's mask.
    /// Word permutes of the pairs as 16-bit entries took three µops each on the Intel VM, and the
    /// expansion a quarter of a bf16 decode's rANS time; byte permutes take one. Returns the
    /// ranks done.
    ///
    /// # Safety
    /// AVX-512 F, BW and VBMI.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    unsafe fn expand_avx512(&self, ranks: &[u8], out: &mut [u8], escaped: &mut Vec<u32>) -> usize {
        use std::arch::x86_64::*;
        let n = ranks.len().min(out.len() / 2);
        // SAFETY (the loads): each table is 128 bytes, two 64-byte vectors.
        let v = |t: &[u8; MAX_PAIRS], k: usize| unsafe {
            _mm512_loadu_si512(t.as_ptr().add(64 * k) as *const _)
        };
        let (f0, f1, s0, s1) = (
            v(&self.firsts, 0),
            v(&self.firsts, 1),
            v(&self.seconds, 0),
            v(&self.seconds, 1),
        );
        // Output byte 2j of a half from the first bytes' byte j (index j), 2j + 1 from the
        // second bytes' (index 64 + j): the low half takes j = 0..31, the high half j = 32..63.
        let inter = |half: usize| {
            let idx: [u8; 64] =
                std::array::from_fn(|k| (32 * half + k / 2) as u8 | ((k as u8 & 1) << 6));
            // SAFETY: 64 bytes.
            unsafe { _mm512_loadu_si512(idx.as_ptr() as *const _) }
        };
        let (lo_idx, hi_idx) = (inter(0), inter(1));
        let d = _mm512_set1_epi8(self.escape() as i8);
        // The groups' loop in a function of its own (`expand_groups`), whose escape masks
        // `group_runs` turns into indices after it: a call in the loop's function (`Vec::push`,
        // even after the loop) had the table vectors kept on the stack and read from there every
        // group.
        group_runs(
            n,
            64,
            // SAFETY: ranks `i..i + 64 masks.len()` are in `ranks`, their output bytes in `out`;
            // the features are enabled here.
            |i, masks| unsafe {
                expand_groups(
                    [f0, f1, s0, s1, lo_idx, hi_idx, d],
                    ranks.as_ptr().add(i),
                    out.as_mut_ptr().add(2 * i),
                    masks,
                )
            },
            |i| escaped.push(i as u32),
        )
    }
}

/// The vector paths' loop over the whole groups of `width` items (at most 64) among `n`, in runs
/// of at most 64 groups: `run(at, masks)` does the run's groups from item `at`, writes each
/// group's escape mask into `masks` (bit `j`: the group's item `j`) and returns their OR; then
/// `escape(i)` is called for each escaped item `i` of the run, in order. Returns the items done.
#[cfg(target_arch = "x86_64")]
fn group_runs(
    n: usize,
    width: usize,
    mut run: impl FnMut(usize, &mut [u64]) -> u64,
    mut escape: impl FnMut(usize),
) -> usize {
    let mut masks = [0u64; 64];
    let mut i = 0;
    while i + width <= n {
        let g = ((n - i) / width).min(masks.len());
        if run(i, &mut masks[..g]) != 0 {
            for (k, &m) in masks[..g].iter().enumerate() {
                let mut m = m;
                while m != 0 {
                    escape(i + width * k + m.trailing_zeros() as usize);
                    m &= m - 1;
                }
            }
        }
        i += width * g;
    }
    i
}

/// The sixteen-entry pieces of the 128 bytes of `t` from `from` in the form [`look128`] looks
/// them up in: piece `k` is bytes `from + 16k ..+ 16` XOR the 16 bytes before them (piece 0 as it
/// is), in both 128-bit halves of a vector. Bytes past `t`'s end count as zeros.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn xor_chained(t: &[u8], from: usize) -> [std::arch::x86_64::__m256i; 8] {
    use std::arch::x86_64::*;
    let mut out = [_mm256_setzero_si256(); 8];
    let mut prev = _mm_setzero_si128();
    for (k, o) in out.iter_mut().enumerate() {
        let cur = match t.get(from + 16 * k..from + 16 * k + 16) {
            // SAFETY: 16 bytes of `t`.
            Some(piece) => unsafe { _mm_loadu_si128(piece.as_ptr() as *const __m128i) },
            None => _mm_setzero_si128(),
        };
        *o = _mm256_broadcastsi128_si256(_mm_xor_si128(cur, prev));
        prev = cur;
    }
    out
}

/// A 128-byte table ([`xor_chained`] pieces `p`) looked up by every byte of `x` with AVX2, which
/// has no permute across more than 16 bytes: piece `k` is shuffled by `x - 16k`, which for `x`
/// under `16k` is negative (its top bit set: the shuffle gives 0) and otherwise picks entry `x %
/// 16`; so the XOR of the eight shuffles is the XOR of pieces `0..=x / 16` at `x % 16`, which
/// telescopes to the table's entry `x`. Bytes of `x` from 128 get meaningless values.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn look128(
    p: &[std::arch::x86_64::__m256i; 8],
    x: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let sixteen = _mm256_set1_epi8(16);
    let mut x = x;
    let mut v = _mm256_shuffle_epi8(p[0], x);
    for piece in &p[1..] {
        x = _mm256_sub_epi8(x, sixteen);
        v = _mm256_xor_si256(v, _mm256_shuffle_epi8(*piece, x));
    }
    v
}

/// A 256-byte table (its halves' [`xor_chained`] pieces) looked up by every byte of `x`: bytes
/// below 128 from the first half, the others (their top bit flipped) from the second.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn look256_avx2(
    t: &[[std::arch::x86_64::__m256i; 8]; 2],
    x: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 (this function's features).
    let (lo, hi) = unsafe {
        (
            look128(&t[0], x),
            look128(&t[1], _mm256_xor_si256(x, _mm256_set1_epi8(-128))),
        )
    };
    _mm256_blendv_epi8(lo, hi, x)
}

/// [`look_window_avx2`]'s table: the top-byte indices of bytes `base..base + 32`, each XOR 255
/// (so that 0, what a shuffle gives outside a piece, reads back as 255: not a top byte), in two
/// sixteen-byte pieces, each in both 128-bit halves; bytes past 255 are not top bytes.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn window_pieces(index: &[u8; 256], base: u8) -> [std::arch::x86_64::__m256i; 2] {
    use std::arch::x86_64::*;
    let piece = |k: usize| {
        let b: [u8; 16] = std::array::from_fn(|j| {
            index
                .get(base as usize + 16 * k + j)
                .map_or(0, |&i| i ^ 0xFF)
        });
        // SAFETY: 16 bytes; AVX2.
        unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(b.as_ptr() as *const __m128i)) }
    };
    [piece(0), piece(1)]
}

/// Every byte of `x`'s top-byte index (255 for the other bytes) where the top bytes lie in
/// `base..base + 32` ([`TopBytes::window`]; `w` from [`window_pieces`]): with `d = x - base`, piece
/// `k` is shuffled by `d - 16k` plus 0x70, saturated, whose top bit is clear only for `d - 16k`
/// in `0..16` (the bytes below `16k` wrap to 240 and more) and whose low nibble is then `d - 16k`.
/// Two shuffles where [`look256_avx2`] takes sixteen: the top bytes of a bf16 tensor's exponents
/// are a run of neighbouring values (all of MiniLM bf16's tensors' within 16). MiniLM bf16's encode
/// pass, one thread (`phasetime`, the two lookups alternating in one process, 30 runs, AVX2-only
/// AMD EPYC, 2026-12-07): medians 37.2-42.0 -> 33.6-37.4 ms.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn look_window_avx2(
    w: &[std::arch::x86_64::__m256i; 2],
    base: u8,
    x: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let bias = _mm256_set1_epi8(0x70);
    let d = _mm256_sub_epi8(x, _mm256_set1_epi8(base as i8));
    let c0 = _mm256_adds_epu8(d, bias);
    let c1 = _mm256_adds_epu8(_mm256_sub_epi8(d, _mm256_set1_epi8(16)), bias);
    let r = _mm256_or_si256(_mm256_shuffle_epi8(w[0], c0), _mm256_shuffle_epi8(w[1], c1));
    _mm256_xor_si256(r, _mm256_set1_epi8(-1))
}

impl PairTable {
    /// [`PairTable::expand_ranks`]'s whole groups of 32 ranks with AVX2: the first and the second
    /// bytes each looked up by [`look128`]. Escaped ranks (and the ranks past 127 of a forged
    /// blob) get bytes that [`PairTable::patch`] overwrites or the caller's check refuses.
    /// Was a scalar loop: a quarter of a one-thread bf16 (version 2) decode's time on an AVX2-only
    /// AMD EPYC (2026-12-07). Returns the ranks done.
    ///
    /// # Safety
    /// AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn expand_avx2(&self, ranks: &[u8], out: &mut [u8], escaped: &mut Vec<u32>) -> usize {
        let n = ranks.len().min(out.len() / 2);
        // SAFETY: AVX2 (this function's features).
        let tables = unsafe { [xor_chained(&self.firsts, 0), xor_chained(&self.seconds, 0)] };
        group_runs(
            n,
            32,
            // SAFETY: ranks `i..i + 32 masks.len()` are in `ranks`, their output bytes in `out`;
            // AVX2.
            |i, masks| unsafe {
                expand_groups_avx2(
                    &tables,
                    self.escape(),
                    ranks.as_ptr().add(i),
                    out.as_mut_ptr().add(2 * i),
                    masks,
                )
            },
            |i| escaped.push(i as u32),
        )
    }
}

/// [`PairTable::expand_avx2`]'s loop over `masks.len()` groups of 32 ranks at `ranks`, each
/// group's 64 bytes written at `out`, its escape mask (ranks at or past `escape`) into `masks`;
/// returns the masks' OR. `tables`: the first bytes' and the second bytes' [`xor_chained`]
/// pieces.
///
/// # Safety
/// AVX2; `32 masks.len()` ranks readable at `ranks`, twice that many bytes writable at `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline(never)]
unsafe fn expand_groups_avx2(
    tables: &[[std::arch::x86_64::__m256i; 8]; 2],
    escape: u8,
    ranks: *const u8,
    out: *mut u8,
    masks: &mut [u64],
) -> u64 {
    use std::arch::x86_64::*;
    let [fs, ss] = tables;
    let d = _mm256_set1_epi8(escape as i8);
    let mut any = 0u64;
    for (g, m) in masks.iter_mut().enumerate() {
        // SAFETY: group `g`'s 32 ranks and 64 output bytes are in the caller's bounds; AVX2.
        unsafe {
            let r = _mm256_loadu_si256(ranks.add(32 * g) as *const __m256i);
            let (f, s) = (look128(fs, r), look128(ss, r));
            // Pairs 0-7 and 16-23 (`lo`'s halves), 8-15 and 24-31 (`hi`'s), first byte first.
            let lo = _mm256_unpacklo_epi8(f, s);
            let hi = _mm256_unpackhi_epi8(f, s);
            let o = out.add(64 * g);
            _mm256_storeu_si256(o as *mut __m256i, _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256(
                o.add(32) as *mut __m256i,
                _mm256_permute2x128_si256(lo, hi, 0x31),
            );
            // rank >= escape, unsigned: max(rank, escape) == rank.
            *m = _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_max_epu8(r, d), r)) as u32 as u64;
        }
        any |= *m;
    }
    any
}

/// [`PairTable::expand_avx512`]'s loop over `masks.len()` groups of 64 ranks at `ranks`, each
/// group's 128 bytes written at `out`, its escape mask into `masks`; returns the masks' OR.
/// `v` holds the first bytes' and second bytes' tables (two vectors each), the two interleaving
/// indices and the escape rank in every byte.
///
/// # Safety
/// AVX-512 F, BW and VBMI; `64 masks.len()` ranks readable at `ranks`, twice that many bytes
/// writable at `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline(never)]
unsafe fn expand_groups(
    v: [std::arch::x86_64::__m512i; 7],
    ranks: *const u8,
    out: *mut u8,
    masks: &mut [u64],
) -> u64 {
    use std::arch::x86_64::*;
    let [f0, f1, s0, s1, lo_idx, hi_idx, d] = v;
    let mut any = 0u64;
    for (g, m) in masks.iter_mut().enumerate() {
        // SAFETY: group `g`'s 64 ranks and 128 output bytes are in the caller's bounds.
        unsafe {
            let r = _mm512_loadu_si512(ranks.add(64 * g) as *const _);
            let firsts = _mm512_permutex2var_epi8(f0, r, f1);
            let seconds = _mm512_permutex2var_epi8(s0, r, s1);
            let o = out.add(128 * g);
            _mm512_storeu_si512(
                o as *mut _,
                _mm512_permutex2var_epi8(firsts, lo_idx, seconds),
            );
            _mm512_storeu_si512(
                o.add(64) as *mut _,
                _mm512_permutex2var_epi8(firsts, hi_idx, seconds),
            );
            *m = _mm512_cmpge_epu8_mask(r, d);
        }
        any |= *m;
    }
    any
}

/// The most frequent exponent bytes of a plane, the pairs' alphabet.
#[derive(Clone)]
pub struct TopBytes {
    /// Byte -> its index among the top bytes (`0..n`), or 255.
    index: [u8; 256],
    /// The top bytes by index.
    bytes: Vec<u8>,
}

impl TopBytes {
    /// The [`TOP_BYTES`] most frequent bytes of `hist` (larger count first, smaller byte among
    /// ties), those with a count only.
    pub fn of(hist: &[u64; 256]) -> TopBytes {
        let mut order: Vec<usize> = (0..256).filter(|&b| hist[b] > 0).collect();
        // The keys are distinct (bytes are), so an unstable sort gives the same order.
        order.sort_unstable_by_key(|&b| (std::cmp::Reverse(hist[b]), b));
        order.truncate(TOP_BYTES);
        let mut index = [255u8; 256];
        for (i, &b) in order.iter().enumerate() {
            index[b] = i as u8;
        }
        TopBytes {
            index,
            bytes: order.iter().map(|&b| b as u8).collect(),
        }
    }

    /// Byte -> its index among the top bytes, or 255 (what a GPU kernel looks the keys up in).
    pub fn index(&self) -> &[u8; 256] {
        &self.index
    }

    /// The least top byte where every top byte lies within 32 of it (the window the AVX2 rank
    /// search looks the top-byte indices up in with two shuffles); `None` where they spread wider
    /// or there are none.
    pub fn window(&self) -> Option<u8> {
        let lo = *self.bytes.iter().min()?;
        let hi = *self.bytes.iter().max()?;
        (hi - lo < 32).then_some(lo)
    }

    /// Adds a block's pair weights to `w` (FORMAT.md section 12, step 2): with `h` the block's
    /// byte counts, `w[16 a + b] += h[x] × h[y]` for the top bytes `x`, `y` of indices `a`, `b` —
    /// of the block's `L²` ordered pairs of units, those holding `x` then `y`, the pair's
    /// expected count (times `2L`) were the block's units independent. A block holds at most
    /// 2^16 units and a plane at most 2^16 sampled blocks, so the sums fit 64 bits.
    // Inlined into `model::pair_plane`'s AVX-512F and AVX2 builds (out of line it ran as SSE2
    // code, ~2% of a one-thread model pass of MiniLM bf16's matrices).
    #[inline(always)]
    pub fn add_pair_weights(&self, h: &[u32; 256], w: &mut [u64; 256]) {
        let n = self.bytes.len();
        let mut t = [0u64; 16];
        for (c, &x) in t.iter_mut().zip(&self.bytes) {
            *c = h[x as usize] as u64;
        }
        for a in 0..n {
            if t[a] == 0 {
                continue;
            }
            for (wb, &tb) in w[a << 4..(a << 4) + 16].iter_mut().zip(&t) {
                *wb += t[a] * tb;
            }
        }
    }

    /// The key of the pair `(x, y)`, if both are top bytes.
    fn key(&self, x: u8, y: u8) -> Option<u8> {
        let (a, b) = (self.index[x as usize], self.index[y as usize]);
        (a != 255 && b != 255).then_some(a << 4 | b)
    }
}

/// A 256-byte table in four vectors, for [`look256`].
#[cfg(target_arch = "x86_64")]
struct IndexVectors([std::arch::x86_64::__m512i; 4]);

#[cfg(target_arch = "x86_64")]
impl IndexVectors {
    /// # Safety
    /// AVX-512 F.
    #[target_feature(enable = "avx512f")]
    unsafe fn of(t: &[u8; 256]) -> IndexVectors {
        use std::arch::x86_64::_mm512_loadu_si512;
        // SAFETY: `t` is 256 bytes, four 64-byte vectors.
        IndexVectors(std::array::from_fn(|k| unsafe {
            _mm512_loadu_si512(t.as_ptr().add(64 * k) as *const _)
        }))
    }
}

/// The 256-byte table `t` looked up by every byte of `x`: bytes below 128 from its first two
/// vectors, the others from the last two.
///
/// # Safety
/// AVX-512 F, BW and VBMI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
unsafe fn look256(t: &IndexVectors, x: std::arch::x86_64::__m512i) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let lo = _mm512_permutex2var_epi8(t.0[0], x, t.0[1]);
    let hi = _mm512_permutex2var_epi8(t.0[2], x, t.0[3]);
    _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi)
}

/// The keys of the 32 pairs of exponent bytes in `e` (64 bytes, pair `j` in bytes `2j` and
/// `2j + 1`): key `j` (`16 a + b` of the pair's top-byte indices) in byte `j` of the result's low
/// half (the high half is not meaningful), and bit `j` of the mask set where the pair holds a byte
/// that is not a top byte.
///
/// # Safety
/// AVX-512 F, BW and VBMI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
unsafe fn keys_of(
    index: &IndexVectors,
    e: std::arch::x86_64::__m512i,
) -> (std::arch::x86_64::__m512i, u32) {
    use std::arch::x86_64::*;
    // SAFETY: the features are enabled here.
    let idx = unsafe { look256(index, e) };
    let a = _mm512_and_si512(idx, _mm512_set1_epi16(0xFF));
    let b = _mm512_srli_epi16::<8>(idx);
    let bad = _mm512_cmpge_epu16_mask(_mm512_or_si512(a, b), _mm512_set1_epi16(16));
    let key = _mm512_or_si512(_mm512_slli_epi16::<4>(a), b);
    (_mm512_castsi256_si512(_mm512_cvtepi16_epi8(key)), bad)
}

/// The encoder's side of a pair table: the table, and the rank of every pair of top bytes.
pub struct PairCoder {
    pub table: PairTable,
    top: TopBytes,
    /// `rank16[16 a + b]`: the rank of the pair of top bytes `a`, `b`, or the escape.
    rank16: [u8; 256],
}

impl PairCoder {
    /// The table of the pairs' weights (`counts` by key, as [`TopBytes::add_pair_weights`]
    /// sums them): the pairs with a weight, larger weight first (smaller first byte, then smaller
    /// second byte among ties), at most [`MAX_PAIRS`]. `None` where fewer than [`MIN_PAIRS`].
    pub fn new(top: TopBytes, counts: &[u64; 256]) -> Option<PairCoder> {
        let n = top.bytes.len();
        let mut cands: Vec<(u64, [u8; 2], usize)> = (0..n * n)
            .map(|k| (k / n, k % n))
            .map(|(a, b)| {
                let at = a << 4 | b;
                (counts[at], [top.bytes[a], top.bytes[b]], at)
            })
            .filter(|c| c.0 > 0)
            .collect();
        // The keys are distinct (pairs are), so an unstable sort gives the same order.
        cands.sort_unstable_by_key(|c| (std::cmp::Reverse(c.0), c.1));
        cands.truncate(MAX_PAIRS);
        if cands.len() < MIN_PAIRS {
            return None;
        }
        let table = PairTable::new(cands.iter().map(|c| c.1).collect());
        let mut rank16 = [table.escape(); 256];
        for (r, c) in cands.iter().enumerate() {
            rank16[c.2] = r as u8;
        }
        Some(PairCoder { table, top, rank16 })
    }

    /// The top bytes the pairs are made of.
    pub fn top(&self) -> &TopBytes {
        &self.top
    }

    /// The rank of each key `16 a + b` (top bytes of indices `a`, `b`), the escape for keys of
    /// no pair in the table.
    pub fn key_ranks(&self) -> &[u8; 256] {
        &self.rank16
    }

    /// A rank table's weights (FORMAT.md section 12, step 4) from the pair weights `keys`
    /// summed over its blocks ([`TopBytes::add_pair_weights`]) and their `squares` (the sum of
    /// `L²`, every ordered pair of units): rank `r < D` the weight of its pair, the escape the
    /// rest (pairs outside the table, and pairs holding another byte).
    pub fn rank_weights(&self, keys: &[u64; 256], squares: u64) -> [u64; 256] {
        let mut w = [0u64; 256];
        let mut paired = 0;
        for (&r, &k) in self.rank16.iter().zip(keys) {
            if r != self.table.escape() {
                w[r as usize] = k;
                paired += k;
            }
        }
        w[self.table.escape() as usize] = squares - paired;
        w
    }

    /// The ranks of a block's exponent bytes `exps` into `ranks` (`exps.len() / 2` of them), and
    /// its escape group into `esc` (appended: each escaped pair's two bytes, then an odd last
    /// byte); returns the number of escape bytes appended.
    pub fn ranks(&self, exps: &[u8], ranks: &mut [u8], esc: &mut Vec<u8>) -> usize {
        let before = esc.len();
        let d = self.table.escape();
        let mut from = 0;
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::has_avx512_vbmi2() {
            // SAFETY: `has_avx512_vbmi2` found AVX-512 F (through `has_avx512`), BW and VBMI.
            from = unsafe { self.ranks_avx512(exps, ranks, esc) };
        } else if crate::cpu::has_avx2() {
            // SAFETY: `has_avx2` found AVX2.
            from = unsafe { self.ranks_avx2(exps, ranks, esc) };
        }
        for (r, p) in ranks.iter_mut().zip(exps.chunks_exact(2)).skip(from) {
            let rank = self
                .top
                .key(p[0], p[1])
                .map_or(d, |k| self.rank16[k as usize]);
            if rank == d {
                esc.extend_from_slice(p);
            }
            *r = rank;
        }
        if exps.len() % 2 == 1 {
            esc.push(exps[exps.len() - 1]);
        }
        esc.len() - before
    }

    /// [`PairCoder::ranks`]'s whole groups of 32 pairs: the pairs' keys ([`keys_of`]), their
    /// ranks by a 256-byte lookup (the escape for pairs of other bytes); the group's escaped
    /// pairs appended one by one. Returns the pairs done.
    ///
    /// # Safety
    /// AVX-512 F, BW and VBMI.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    unsafe fn ranks_avx512(&self, exps: &[u8], ranks: &mut [u8], esc: &mut Vec<u8>) -> usize {
        use std::arch::x86_64::*;
        let n = ranks.len().min(exps.len() / 2);
        // SAFETY (both): the features are enabled here.
        let index = unsafe { IndexVectors::of(&self.top.index) };
        let rank16 = unsafe { IndexVectors::of(&self.rank16) };
        let escape = _mm512_set1_epi8(self.table.escape() as i8);
        let mut i = 0;
        while i + 32 <= n {
            // SAFETY: bytes `2i..2i + 64` of `exps` and ranks `i..i + 32` are in bounds.
            let escaped = unsafe {
                let (key, bad) = keys_of(
                    &index,
                    _mm512_loadu_si512(exps.as_ptr().add(2 * i) as *const _),
                );
                // 512-bit operations throughout (not AVX-512VL's 256-bit ones): the low half
                // holds the 32 ranks.
                let rank = _mm512_mask_blend_epi8(bad as u64, look256(&rank16, key), escape);
                _mm256_storeu_si256(
                    ranks.as_mut_ptr().add(i) as *mut _,
                    _mm512_castsi512_si256(rank),
                );
                _mm512_cmpeq_epi8_mask(rank, escape) & 0xFFFF_FFFF
            };
            let mut m = escaped;
            while m != 0 {
                let j = i + m.trailing_zeros() as usize;
                esc.extend_from_slice(&exps[2 * j..2 * j + 2]);
                m &= m - 1;
            }
            i += 32;
        }
        i
    }
}

impl PairCoder {
    /// [`PairCoder::ranks`]'s whole groups of 32 pairs with AVX2: each exponent byte's top-byte
    /// index and each key's rank by [`look256_avx2`], the keys made in 16-bit lanes (a pair is
    /// one lane); the escaped pairs appended after each run of groups. Was a scalar loop: 36% of
    /// a one-thread bf16 (version 2) encode pass on an AVX2-only AMD EPYC (2026-12-07). Returns
    /// the pairs done.
    ///
    /// # Safety
    /// AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn ranks_avx2(&self, exps: &[u8], ranks: &mut [u8], esc: &mut Vec<u8>) -> usize {
        // SAFETY (both arms): AVX2, this function's features.
        match self.top.window() {
            Some(base) => unsafe {
                let w = window_pieces(&self.top.index, base);
                self.ranks_with(|e| look_window_avx2(&w, base, e), exps, ranks, esc)
            },
            None => unsafe {
                let t = [
                    xor_chained(&self.top.index, 0),
                    xor_chained(&self.top.index, 128),
                ];
                self.ranks_with(|e| look256_avx2(&t, e), exps, ranks, esc)
            },
        }
    }

    /// [`PairCoder::ranks_avx2`] with `index` giving every byte's top-byte index (255 for the
    /// others) 32 at a time.
    ///
    /// # Safety
    /// AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn ranks_with(
        &self,
        index: impl Fn(std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256i,
        exps: &[u8],
        ranks: &mut [u8],
        esc: &mut Vec<u8>,
    ) -> usize {
        let n = ranks.len().min(exps.len() / 2);
        // SAFETY: AVX2 (this function's features).
        let rank16 = unsafe { [xor_chained(&self.rank16, 0), xor_chained(&self.rank16, 128)] };
        group_runs(
            n,
            32,
            // SAFETY: exponent bytes `2i..2(i + 32 masks.len())` are in `exps`, ranks `i..i + 32
            // masks.len()` in `ranks`; AVX2.
            |i, masks| unsafe {
                ranks_groups_avx2(
                    &index,
                    &rank16,
                    self.table.escape(),
                    exps.as_ptr().add(2 * i),
                    ranks.as_mut_ptr().add(i),
                    masks,
                )
            },
            |j| esc.extend_from_slice(&exps[2 * j..2 * j + 2]),
        )
    }
}

/// [`PairCoder::ranks_avx2`]'s loop over `masks.len()` groups of 32 pairs (64 exponent bytes at
/// `exps`), each group's 32 ranks written at `ranks`, its escape mask into `masks`; returns the
/// masks' OR. `index`: every byte's top-byte index (255 for the others; [`look_window_avx2`] or
/// [`look256_avx2`]); `rank16`: the ranks' [`look256_avx2`] halves.
///
/// # Safety
/// AVX2; `64 masks.len()` bytes readable at `exps`, `32 masks.len()` writable at `ranks`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline(never)]
unsafe fn ranks_groups_avx2(
    index: &impl Fn(std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256i,
    rank16: &[[std::arch::x86_64::__m256i; 8]; 2],
    escape: u8,
    exps: *const u8,
    ranks: *mut u8,
    masks: &mut [u64],
) -> u64 {
    use std::arch::x86_64::*;
    let d = _mm256_set1_epi8(escape as i8);
    let low = _mm256_set1_epi16(0xFF);
    let fifteen = _mm256_set1_epi16(15);
    // 16 pairs of exponent bytes (one a 16-bit lane) -> (their keys, 16 a + b of the bytes'
    // top-byte indices; their "not both top bytes" masks), 16-bit lanes each.
    let keys = |e: __m256i| {
        let idx = index(e);
        let (a, b) = (_mm256_and_si256(idx, low), _mm256_srli_epi16::<8>(idx));
        let bad = _mm256_cmpgt_epi16(_mm256_or_si256(a, b), fifteen);
        (_mm256_or_si256(_mm256_slli_epi16::<4>(a), b), bad)
    };
    let mut any = 0u64;
    for (g, m) in masks.iter_mut().enumerate() {
        // SAFETY: group `g`'s 64 exponent bytes and 32 ranks are in the caller's bounds; AVX2.
        unsafe {
            let e = exps.add(64 * g);
            let (k0, bad0) = keys(_mm256_loadu_si256(e as *const __m256i));
            let (k1, bad1) = keys(_mm256_loadu_si256(e.add(32) as *const __m256i));
            // The packs interleave the two inputs' 128-bit halves: quadwords 0, 2, 1, 3 put the
            // 32 pairs back in order. A bad pair's key may saturate; its rank is the escape.
            let key = _mm256_permute4x64_epi64::<0xD8>(_mm256_packus_epi16(k0, k1));
            let bad = _mm256_permute4x64_epi64::<0xD8>(_mm256_packs_epi16(bad0, bad1));
            let rank = _mm256_blendv_epi8(look256_avx2(rank16, key), d, bad);
            _mm256_storeu_si256(ranks.add(32 * g) as *mut __m256i, rank);
            *m = _mm256_movemask_epi8(_mm256_cmpeq_epi8(rank, d)) as u32 as u64;
        }
        any |= *m;
    }
    any
}

/// The uniform table the escape groups are coded with: every byte frequency 16 (8 bits, as
/// raw). Not serialised: fixed by the format.
pub fn uniform_table() -> &'static FreqTable {
    static T: std::sync::OnceLock<FreqTable> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let t = FreqTable::normalize(&[1u64; 256], None).expect("counts");
        debug_assert!(t.freq.iter().all(|&f| f == 16));
        t
    })
}

/// [`uniform_table`]'s decoder table.
pub fn uniform_decode_table() -> &'static DecodeTable {
    static T: std::sync::OnceLock<Box<DecodeTable>> = std::sync::OnceLock::new();
    T.get_or_init(|| uniform_table().decode_table())
}

/// [`uniform_table`]'s encoder table.
pub fn uniform_encode_table() -> &'static EncTable {
    static T: std::sync::OnceLock<Box<EncTable>> = std::sync::OnceLock::new();
    T.get_or_init(|| uniform_table().encode_table())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coder_of(exps: &[u8]) -> PairCoder {
        let mut hist = [0u64; 256];
        for &e in exps {
            hist[e as usize] += 1;
        }
        let top = TopBytes::of(&hist);
        let mut weights = [0u64; 256];
        for block in exps.chunks(4096) {
            let mut h = [0u32; 256];
            for &e in block {
                h[e as usize] += 1;
            }
            top.add_pair_weights(&h, &mut weights);
        }
        PairCoder::new(top, &weights).expect("pairs")
    }

    /// Ranks and escapes expand back to the bytes, through the vector path and the scalar one,
    /// for blocks of every length around the vector's 32 pairs, with and without escapes.
    #[test]
    fn ranks_expand_to_their_bytes() {
        let mut next = crate::rans::test_input::xorshift(7);
        // Exponent-like bytes: mostly 20 values, some rare ones (escapes).
        let exps: Vec<u8> = (0..20001)
            .map(|_| match next() % 100 {
                0 => (next() % 256) as u8,
                v => 110 + (v % 20) as u8,
            })
            .collect();
        let coder = coder_of(&exps);
        assert!(coder.table.pairs.len() > 64, "ranks past 64 are used");
        // 8193 units and more: expansions of more than 64 groups of 64 ranks, which the vector
        // path takes in several calls of its loop.
        for len in [
            0usize, 1, 2, 3, 63, 64, 65, 66, 127, 128, 129, 4096, 4097, 5000, 8192, 8193, 8320,
            20001,
        ] {
            let blk = &exps[..len];
            let mut ranks = vec![0u8; len / 2];
            let mut esc = Vec::new();
            let n = coder.ranks(blk, &mut ranks, &mut esc);
            assert_eq!(n, esc.len());
            let mut out = vec![0u8; len];
            coder.table.expand(&ranks, &esc, &mut out).unwrap();
            assert_eq!(out, blk, "length {len}");
        }
        // A block without escapes takes the vector path to its last whole group.
        let plain: Vec<u8> = (0..4096).map(|i| 110 + (i % 7) as u8).collect();
        let coder = coder_of(&plain);
        let mut ranks = vec![0u8; 2048];
        let mut esc = Vec::new();
        assert_eq!(coder.ranks(&plain, &mut ranks, &mut esc), 0);
        let mut out = vec![0u8; 4096];
        coder.table.expand(&ranks, &esc, &mut out).unwrap();
        assert_eq!(out, plain);
    }

    /// The AVX2 expansion (where this CPU has AVX2; an AVX-512 VBMI CPU takes another path in
    /// `expand_ranks`, so it is called directly) against the scalar loop: tables of 0 to 128
    /// pairs, ranks anywhere in 0..=255 (past the escape too, as a forged blob's), every length
    /// around its 32-rank groups and its 64-group calls: the same bytes for every rank under the
    /// escape and the same escaped indices, in order.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_expansion_equals_the_scalar_one() {
        if !crate::cpu::avx2_or_skip() {
            return;
        }
        let mut next = crate::rans::test_input::xorshift(0x9E37_79B9_7F4A_7C15);
        for n_pairs in [0usize, 1, 2, 15, 16, 17, 64, 100, 127, 128] {
            let pairs: Vec<[u8; 2]> = (0..n_pairs)
                .map(|r| [r as u8 ^ 0x5A, (next() % 256) as u8])
                .collect();
            let t = PairTable::new(pairs);
            let d = t.escape();
            for len in [0usize, 1, 31, 32, 33, 64, 100, 2048, 2049, 4096 + 7] {
                let ranks: Vec<u8> = (0..len)
                    .map(|_| match next() % 8 {
                        0 => (next() % 256) as u8,
                        _ => (next() % (n_pairs as u64 + 1)) as u8,
                    })
                    .collect();
                let mut out = vec![0xEEu8; 2 * len];
                let mut escaped = Vec::new();
                // SAFETY: AVX2 checked above.
                let done = unsafe { t.expand_avx2(&ranks, &mut out, &mut escaped) };
                assert_eq!(done, len / 32 * 32, "{n_pairs} pairs, {len} ranks");
                let mut want_escaped = Vec::new();
                for (i, &r) in ranks[..done].iter().enumerate() {
                    if r < d {
                        assert_eq!(
                            out[2 * i..2 * i + 2],
                            t.pairs[r as usize],
                            "{n_pairs} pairs, rank {r} at {i}"
                        );
                    } else {
                        want_escaped.push(i as u32);
                    }
                }
                assert_eq!(escaped, want_escaped, "{n_pairs} pairs, {len} ranks");
                assert!(
                    out[2 * done..].iter().all(|&b| b == 0xEE),
                    "past the groups"
                );
            }
        }
    }

    /// The AVX2 ranks (called directly, as the expansion above) against the scalar definition:
    /// exponent bytes from the top bytes and beside them (bytes of every value, below and from
    /// 128), tables that hold few and many of the top bytes' pairs, every length around the
    /// 32-pair groups: the same ranks and the same escape bytes, in order.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_ranks_equal_the_scalar_ones() {
        if !crate::cpu::avx2_or_skip() {
            return;
        }
        let mut next = crate::rans::test_input::xorshift(0x2545_F491_4F6C_DD1D);
        // (first byte, spread, % of rare bytes, pairs of equal bytes): in the last case the
        // first 4096 bytes take eight values and the rest eight others, so that the pair weights
        // (from each block's histogram) rank the sixteenth top byte's pair with itself: the rank
        // a pair with a byte outside the top bytes would look up (its key saturates) if it were
        // not made the escape.
        // Which cases took the window's lookup (top bytes within 32 of each other) and which
        // the whole table's: both must be tested, and a window whose second piece runs past 255.
        let mut windows = Vec::new();
        for (base, spread, rare, doubled) in [
            (110u8, 20u64, 50u64, false),
            (120, 6, 3, false),
            (200, 30, 10, false),
            (0, 16, 2, false),
            (100, 16, 1, true),
            (234, 22, 0, false),
            (60, 100, 0, false),
        ] {
            let mut exps: Vec<u8> = Vec::with_capacity(9000);
            while exps.len() < 9000 {
                let v = match doubled {
                    true => base + 8 * (exps.len() >= 4096) as u8 + (next() % 8) as u8,
                    false => base.wrapping_add((next() % spread) as u8),
                };
                match (next() % 100 < rare, doubled) {
                    (true, _) => exps.extend([(next() % 256) as u8, v]),
                    (false, true) => exps.extend([v, v]),
                    (false, false) => exps.extend([v, base.wrapping_add((next() % spread) as u8)]),
                }
            }
            let coder = coder_of(&exps);
            windows.push(coder.top.window());
            if doubled {
                assert_ne!(
                    coder.rank16[255],
                    coder.table.escape(),
                    "(15, 15) is ranked"
                );
            }
            let d = coder.table.escape();
            for len in [0usize, 1, 63, 64, 65, 130, 4096, 4097, 9000] {
                let blk = &exps[..len];
                let mut ranks = vec![0xEEu8; len / 2];
                let mut esc = Vec::new();
                // SAFETY: AVX2 checked above.
                let done = unsafe { coder.ranks_avx2(blk, &mut ranks, &mut esc) };
                assert_eq!(done, len / 2 / 32 * 32, "length {len}");
                let mut want_esc = Vec::new();
                for (i, p) in blk.chunks_exact(2).take(done).enumerate() {
                    let want = coder
                        .top
                        .key(p[0], p[1])
                        .map_or(d, |k| coder.rank16[k as usize]);
                    assert_eq!(ranks[i], want, "length {len}, pair {i} {p:?}");
                    if want == d {
                        want_esc.extend_from_slice(p);
                    }
                }
                assert_eq!(esc, want_esc, "length {len}");
                assert!(ranks[done..].iter().all(|&r| r == 0xEE), "past the groups");
            }
        }
        assert_eq!(
            windows,
            [
                Some(110),
                None,
                Some(200),
                Some(0),
                Some(100),
                Some(234),
                None
            ]
        );
    }

    /// Escape bytes that do not match the ranks, and ranks past the escape, are errors.
    #[test]
    fn expansion_checks_its_escapes() {
        let t = PairTable::new(vec![[1, 2], [3, 4]]);
        let mut out = [0u8; 5];
        assert!(t.expand(&[0, 1], &[9], &mut out).is_ok());
        assert_eq!(out, [1, 2, 3, 4, 9]);
        assert!(
            t.expand(&[0, 2], &[9], &mut out).is_err(),
            "escape without bytes"
        );
        assert!(
            t.expand(&[0, 2], &[5, 6, 9, 9], &mut out).is_err(),
            "bytes left over"
        );
        assert!(
            t.expand(&[0, 3], &[9], &mut out).is_err(),
            "rank past the escape"
        );
        assert!(t.expand(&[0, 1], &[], &mut out).is_err(), "no odd byte");
        let mut even = [0u8; 4];
        assert!(t.expand(&[2, 1], &[5, 6], &mut even).is_ok());
        assert_eq!(even, [5, 6, 3, 4]);
    }

    #[test]
    fn pair_fields_parse_as_written() {
        let t = PairTable::new(vec![[1, 2], [3, 4], [2, 1]]);
        let mut buf = Vec::new();
        t.write(&mut buf);
        assert_eq!(buf.len(), t.serialized_len());
        assert_eq!(PairTable::parse(&buf, 1).unwrap(), (Some(t), 7));
        assert_eq!(PairTable::parse(&[0], 1).unwrap(), (None, 1));
        assert!(PairTable::parse(&[1, 5, 5], 1).is_err(), "one pair");
        assert!(PairTable::parse(&[129], 1).is_err(), "129 pairs");
        assert!(
            PairTable::parse(&[2, 1, 2, 1, 2], 1).is_err(),
            "a pair twice"
        );
        assert!(PairTable::parse(&[2, 1, 2, 1], 1).is_err(), "cut short");
        assert!(PairTable::parse(&[], 1).is_err(), "nothing");
    }

    #[test]
    fn the_uniform_table_is_sixteen_each() {
        assert!(uniform_table().freq.iter().all(|&f| f == 16));
    }
}
