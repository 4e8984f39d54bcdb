//! The table search of one byte plane (`docs/FORMAT.md`, "Encoder decisions"): deterministic
//! k-means over the sampled blocks' histograms, each block's cost under a table computed as a dot
//! product of its counts (gathered to the plane's support) with the table's code lengths; and the
//! shortcuts that keep its decisions (the collision bound, the least-cost columns). Integer
//! arithmetic only, so that the GPU's search (`tensorzip-cuda`, `kernels/search.cu`) makes the
//! same choices.

use std::rc::Rc;

use crate::blob::SEL_RAW;
use crate::model::{raw_cost, stays_coded, LLOYD_ITERS};
use crate::rans::log2::{code_len_table, log2_q16, log2_small, CL_ABSENT, FRAC_BITS};
use crate::rans::table::FreqTable;

/// Rows summed in 32-bit lanes before they are carried into 64 bits: a row sums to at most 65536
/// (the largest block), so 65535 rows cannot overflow a lane.
const FLUSH_ROWS: usize = 65535;

/// The non-constant sampled blocks of one plane, as dense counts over the plane's *support* (the
/// symbols the sample contains, at most 256): row `b` is `counts[b * width..(b + 1) * width]`, column
/// `i` counts symbol `syms[i]`, and columns past `syms.len()` are zero. Costs become dot products of a
/// row with a table's code lengths gathered to the support, which vectorise; a bf16 exponent plane has
/// ~40 symbols in all, so a row is 40-48 counts instead of 256 (or a sparse list walked symbol by
/// symbol, what this replaced: the same integers, 2-3x the time).
struct Support<'a> {
    syms: Vec<u8>,
    width: usize,
    rows: Rows<'a>,
    /// The summed rows (over the support).
    total: Vec<u64>,
    /// Each row's sum: its block's length.
    lens: Vec<usize>,
    /// The dense rows again as 16-bit counts, `width16` (a multiple of 16) apart, when AVX2 is
    /// there and no block is longer than [`ROW16_MAX`]: the cost columns then take 16 counts per
    /// multiply ([`costs16_avx2`]).
    rows16: Option<Vec<u16>>,
    width16: usize,
}

/// Longest block whose counts the 16-bit cost path takes: every count fits a signed 16-bit lane,
/// and a row's `sum h * (code length mod 2^15)` stays below 2^31 (see [`costs16_avx2`]).
const ROW16_MAX: usize = 32767;

/// The rows of a [`Support`]: gathered to the support, or, when the sample has every symbol, the
/// histograms themselves (a mantissa plane: gathering and copying 1 KiB per block was a third of
/// such a plane's model time).
enum Rows<'a> {
    Dense(Vec<u32>),
    Whole(&'a [&'a [u32; 256]]),
}

impl<'a> Support<'a> {
    #[inline(always)] // into `cluster_avx2`
    fn new(blocks: &'a [&'a [u32; 256]]) -> Support<'a> {
        // One pass over the histograms: their OR (non-zero where any block has the symbol), their
        // sum (32-bit lanes carried into 64 bits every `FLUSH_ROWS` rows, as in `group_sums`) and
        // each block's length. Loops that vectorise; three passes were a fifth of a mantissa plane's
        // model time.
        let mut seen = [0u32; 256];
        let mut narrow = [0u32; 256];
        let mut wide = [0u64; 256];
        let mut lens = Vec::with_capacity(blocks.len());
        for (i, h) in blocks.iter().enumerate() {
            prefetch_ahead(blocks, i);
            let mut len = 0u32;
            for ((a, n), &c) in seen.iter_mut().zip(narrow.iter_mut()).zip(h.iter()) {
                *a |= c;
                *n = n.wrapping_add(c);
                len = len.wrapping_add(c);
            }
            lens.push(len as usize);
            if (i + 1) % FLUSH_ROWS == 0 {
                for (w, n) in wide.iter_mut().zip(narrow.iter_mut()) {
                    *w += *n as u64;
                    *n = 0;
                }
            }
        }
        for (w, &n) in wide.iter_mut().zip(narrow.iter()) {
            *w += n as u64;
        }
        let syms: Vec<u8> = (0..256)
            .filter(|&s| seen[s] != 0)
            .map(|s| s as u8)
            .collect();
        let width = syms.len().div_ceil(8) * 8;
        let mut total = vec![0u64; width];
        for (t, &s) in total.iter_mut().zip(&syms) {
            *t = wide[s as usize];
        }
        if syms.len() == 256 {
            return Support {
                syms,
                width,
                rows: Rows::Whole(blocks),
                total,
                lens,
                rows16: None,
                width16: 0,
            };
        }
        let mut counts = vec![0u32; blocks.len() * width];
        for (row, h) in counts.chunks_exact_mut(width).zip(blocks) {
            for (c, &s) in row.iter_mut().zip(&syms) {
                *c = h[s as usize];
            }
        }
        let width16 = syms.len().div_ceil(16) * 16;
        let rows16 = (crate::cpu::has_avx2() && lens.iter().all(|&l| l <= ROW16_MAX)).then(|| {
            let mut rows16 = vec![0u16; blocks.len() * width16];
            for (r16, row) in rows16
                .chunks_exact_mut(width16)
                .zip(counts.chunks_exact(width))
            {
                for (c16, &c) in r16.iter_mut().zip(row) {
                    // At most the block's length, ROW16_MAX.
                    *c16 = c as u16;
                }
            }
            rows16
        });
        Support {
            syms,
            width,
            rows: Rows::Dense(counts),
            total,
            lens,
            rows16,
            width16,
        }
    }

    fn row(&self, b: usize) -> &[u32] {
        match &self.rows {
            Rows::Dense(counts) => &counts[b * self.width..(b + 1) * self.width],
            Rows::Whole(blocks) => &blocks[b][..],
        }
    }

    /// The summed rows of the blocks of each group: `group(b)` names block `b`'s group (`None`: no
    /// group), `n` groups; group `g`'s sums are `[g * width..(g + 1) * width]` of the result (one
    /// allocation, not one per group: the search's allocations were ~10% of a small tensor's
    /// model). The sums are kept in 32-bit lanes, which vectorise, and carried into 64 bits every
    /// `FLUSH_ROWS` rows of a group (a row sums to at most 65536, the largest block, so the 32-bit
    /// lanes cannot overflow in between).
    #[inline(always)] // into `cluster_avx2`
    fn group_sums(&self, n: usize, group: impl Fn(usize) -> Option<usize>) -> Vec<u64> {
        let width = self.width;
        let mut wide = vec![0u64; n * width];
        let mut narrow = vec![0u32; n * width];
        let mut rows = vec![0u32; n];
        let flush = |to: &mut [u64], from: &mut [u32]| {
            for (t, f) in to.iter_mut().zip(from.iter_mut()) {
                *t += *f as u64;
                *f = 0;
            }
        };
        for b in 0..self.len() {
            let Some(g) = group(b).filter(|&g| g < n) else {
                continue;
            };
            let sums = g * width..(g + 1) * width;
            for (a, &c) in narrow[sums.clone()].iter_mut().zip(self.row(b)) {
                *a = a.wrapping_add(c);
            }
            rows[g] += 1;
            if rows[g] == FLUSH_ROWS as u32 {
                flush(&mut wide[sums.clone()], &mut narrow[sums]);
                rows[g] = 0;
            }
        }
        flush(&mut wide, &mut narrow);
        wide
    }

    fn len(&self) -> usize {
        match &self.rows {
            Rows::Dense(counts) => counts.len() / self.width,
            Rows::Whole(blocks) => blocks.len(),
        }
    }

    /// A table's code lengths gathered to the support, as 32-bit values (all below `12 << 16`; 0
    /// where the table lacks the symbol), and the symbols it lacks (`u32::MAX` there). In arrays
    /// of the whole alphabet's length, of which the first `width` (`width16`) entries are used:
    /// no allocation for each of the search's ~50 columns a tensor.
    fn code_lengths(&self, t: &FreqTable) -> SupportCl {
        let cl = code_len_table();
        let mut lens = [0u32; 256];
        let mut absent = [0u32; 256];
        for (i, &s) in self.syms.iter().enumerate() {
            let l = cl[t.freq[s as usize] as usize];
            if l == CL_ABSENT {
                absent[i] = u32::MAX;
            } else {
                lens[i] = l as u32;
            }
        }
        // The 16-bit form: each length as `hi * 2^15 + lo` (`hi` <= 24: lengths are at most
        // 12 << 16), absent symbols marked 0xFFFF.
        let split = self.rows16.as_ref().map(|_| {
            let mut lo = [0u16; 256];
            let mut hi = [0u16; 256];
            let mut absent16 = [0u16; 256];
            for i in 0..self.syms.len() {
                lo[i] = (lens[i] & 0x7FFF) as u16;
                hi[i] = (lens[i] >> 15) as u16;
                absent16[i] = absent[i] as u16;
            }
            Split16 { lo, hi, absent16 }
        });
        SupportCl {
            lens,
            absent,
            split,
        }
    }

    /// The costs of blocks `first..first + out.len()` under a table (`u64::MAX` for a block with a
    /// symbol the table lacks): [`costs_of`] their rows.
    fn costs(&self, first: usize, cl: &SupportCl, out: &mut [u64]) {
        let n = out.len();
        match &self.rows {
            Rows::Dense(counts) => {
                #[cfg(target_arch = "x86_64")]
                if let (Some(rows16), Some(split)) = (&self.rows16, &cl.split) {
                    let w = self.width16;
                    // SAFETY: `rows16` exists only where AVX2 was detected at run time; the rows
                    // and the split lengths are `width16` long, a multiple of 16.
                    unsafe { costs16_avx2(&rows16[first * w..(first + n) * w], w, split, out) };
                    return;
                }
                let rows = &counts[first * self.width..(first + n) * self.width];
                costs_of(rows.chunks_exact(self.width), cl, out)
            }
            Rows::Whole(blocks) => {
                costs_of(blocks[first..first + n].iter().map(|h| &h[..]), cl, out)
            }
        }
    }

    /// Normalised table of the summed counts `sum` (over the support), every support symbol present.
    fn table(&self, sum: &[u64]) -> Option<FreqTable> {
        let mut full = [0u64; 256];
        let mut forced = [false; 256];
        for (&s, &c) in self.syms.iter().zip(sum) {
            full[s as usize] = c;
            forced[s as usize] = true;
        }
        FreqTable::normalize(&full, Some(&forced))
    }
}

/// Code lengths over a support (see [`Support::code_lengths`]).
struct SupportCl {
    lens: [u32; 256],
    absent: [u32; 256],
    /// For a support with 16-bit rows: the lengths split for [`costs16_avx2`].
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    split: Option<Split16>,
}

/// Code lengths `hi * 2^15 + lo` as two 16-bit arrays, and the absent symbols (0xFFFF), over a
/// support's `width16` columns.
struct Split16 {
    lo: [u16; 256],
    hi: [u16; 256],
    absent16: [u16; 256],
}

/// The cost of each 16-bit row of `rows` (`w` counts apart, a multiple of 16) under the split code
/// lengths into `out` (`u64::MAX` where the row has a symbol the table lacks): the integer
/// [`dense_cost_generic`] computes, 16 counts per step. `vpmaddwd` multiplies counts (at most
/// 32767: blocks of at most [`ROW16_MAX`] units) by `lo` (< 2^15) and by `hi` and adds pairs into
/// 32-bit lanes; a row's `sum h * lo` is at most `32767 * 32767` < 2^31, so no lane overflows, and
/// `sum h * l = 2^15 * sum h * hi + sum h * lo` exactly. The 32-bit loop took ~3x the instructions
/// and was a quarter of a bf16 exponent plane's search.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn costs16_avx2(rows: &[u16], w: usize, split: &Split16, out: &mut [u64]) {
    use std::arch::x86_64::*;
    for (o, h) in out.iter_mut().zip(rows.chunks_exact(w)) {
        let mut acc_lo = _mm256_setzero_si256();
        let mut acc_hi = _mm256_setzero_si256();
        let mut miss = _mm256_setzero_si256();
        for (((h, lo), hi), a) in h
            .chunks_exact(16)
            .zip(split.lo.chunks_exact(16))
            .zip(split.hi.chunks_exact(16))
            .zip(split.absent16.chunks_exact(16))
        {
            // SAFETY: each chunk is 16 u16 = 32 bytes; unaligned loads.
            let (vh, vlo, vhi, va) = unsafe {
                (
                    _mm256_loadu_si256(h.as_ptr() as *const __m256i),
                    _mm256_loadu_si256(lo.as_ptr() as *const __m256i),
                    _mm256_loadu_si256(hi.as_ptr() as *const __m256i),
                    _mm256_loadu_si256(a.as_ptr() as *const __m256i),
                )
            };
            acc_lo = _mm256_add_epi32(acc_lo, _mm256_madd_epi16(vh, vlo));
            acc_hi = _mm256_add_epi32(acc_hi, _mm256_madd_epi16(vh, vhi));
            miss = _mm256_or_si256(miss, _mm256_and_si256(vh, va));
        }
        *o = if _mm256_testz_si256(miss, miss) == 1 {
            // Both sums in registers: pairs, then the two halves, then pairs again leave
            // [lo, hi, lo, hi]; every partial sum of `lo` lanes is below 2^31 (see above).
            let pairs = _mm256_hadd_epi32(acc_lo, acc_hi);
            let halves = _mm_add_epi32(
                _mm256_castsi256_si128(pairs),
                _mm256_extracti128_si256::<1>(pairs),
            );
            let both = _mm_hadd_epi32(halves, halves);
            let lo = _mm_cvtsi128_si32(both) as u32 as u64;
            let hi = _mm_extract_epi32::<1>(both) as u32 as u64;
            (hi << 15) + lo
        } else {
            u64::MAX
        };
    }
}

/// `(sum h[i] * cl[i], whether no i has h[i] > 0 where absent[i] = u32::MAX)` over equal-length
/// slices (a multiple of 8 long; `absent` is 0 or `u32::MAX`).
fn dense_cost_generic(h: &[u32], cl: &[u32], absent: &[u32]) -> (u64, bool) {
    let mut acc = 0u64;
    let mut miss = 0u32;
    for ((&h, &cl), &a) in h.iter().zip(cl).zip(absent) {
        acc += h as u64 * cl as u64;
        miss |= h & a;
    }
    (acc, miss == 0)
}

/// [`dense_cost_generic`] with AVX2: eight counts per step, the even and odd lanes' 32 x 32 -> 64-bit
/// products summed apart (the compiler's own vectorisation of the loop shuffled every lane through
/// scalar registers).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
#[inline]
unsafe fn dense_cost_avx2(h: &[u32], cl: &[u32], absent: &[u32]) -> (u64, bool) {
    use std::arch::x86_64::*;
    let mut even = _mm256_setzero_si256();
    let mut odd = _mm256_setzero_si256();
    let mut miss = _mm256_setzero_si256();
    for ((h, cl), a) in h
        .chunks_exact(8)
        .zip(cl.chunks_exact(8))
        .zip(absent.chunks_exact(8))
    {
        // SAFETY: each chunk is 8 u32 = 32 bytes; unaligned loads.
        let (vh, vc, va) = unsafe {
            (
                _mm256_loadu_si256(h.as_ptr() as *const __m256i),
                _mm256_loadu_si256(cl.as_ptr() as *const __m256i),
                _mm256_loadu_si256(a.as_ptr() as *const __m256i),
            )
        };
        even = _mm256_add_epi64(even, _mm256_mul_epu32(vh, vc));
        odd = _mm256_add_epi64(
            odd,
            _mm256_mul_epu32(_mm256_srli_epi64(vh, 32), _mm256_srli_epi64(vc, 32)),
        );
        miss = _mm256_or_si256(miss, _mm256_and_si256(vh, va));
    }
    let sum = _mm256_add_epi64(even, odd);
    let mut lanes = [0u64; 4];
    // SAFETY: `lanes` is 32 bytes; unaligned store.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, sum) };
    (lanes.iter().sum(), _mm256_testz_si256(miss, miss) == 1)
}

/// The cost of each row of `rows` under the code lengths `cl` into `out` (`u64::MAX` where the table
/// lacks a symbol of the row), with one feature test for the run and no call per row (a bf16
/// exponent row is only six vectors).
fn costs_of<'r>(rows: impl Iterator<Item = &'r [u32]>, cl: &SupportCl, out: &mut [u64]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx2() {
            // SAFETY: AVX2 support was checked at run time.
            unsafe { costs_avx2(rows, &cl.lens, &cl.absent, out) };
            return;
        }
    }
    for (o, h) in out.iter_mut().zip(rows) {
        let (c, covered) = dense_cost_generic(h, &cl.lens, &cl.absent);
        *o = if covered { c } else { u64::MAX };
    }
}

/// [`dense_cost_avx2`] for each row of `rows` into `out`: `u64::MAX` where the row is not covered.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn costs_avx2<'r>(
    rows: impl Iterator<Item = &'r [u32]>,
    cl: &[u32],
    absent: &[u32],
    out: &mut [u64],
) {
    for (o, h) in out.iter_mut().zip(rows) {
        // SAFETY: AVX2 is enabled for this function, as for the callee.
        let (c, covered) = unsafe { dense_cost_avx2(h, cl, absent) };
        *o = if covered { c } else { u64::MAX };
    }
}

/// `sum h * (log2 n - log2 h)` in Q16 bits over a dense row: the block's order-0 entropy. Computed
/// as `n log2 n - sum h log2 h` (the same integer: every term is exact, and zero counts add nothing),
/// which has no branch per symbol.
pub(crate) fn ideal_cost_dense(row: &[u32]) -> u64 {
    let lg = log2_small();
    let n: u32 = row.iter().sum();
    #[cfg(target_arch = "x86_64")]
    let sum_h_lg = if crate::cpu::has_avx2() && row.len().is_multiple_of(8) {
        // SAFETY: AVX2 support was checked at run time; the row is a whole number of 8-lane steps.
        unsafe { sum_c_log2_avx2(row, lg) }.unwrap_or_else(|| sum_c_log2(row, lg))
    } else {
        sum_c_log2(row, lg)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let sum_h_lg = sum_c_log2(row, lg);
    let ln = lg
        .get(n as usize)
        .map_or_else(|| log2_q16(n as u64), |&l| l as u64);
    n as u64 * ln - sum_h_lg
}

/// `sum c * log2_q16(c)` over a row (`lg` is [`log2_small`]).
fn sum_c_log2(row: &[u32], lg: &[u32]) -> u64 {
    row.iter()
        .map(|&c| {
            c as u64
                * lg.get(c as usize)
                    .map_or_else(|| log2_q16(c as u64), |&l| l as u64)
        })
        .sum()
}

/// [`sum_c_log2`] with AVX2, eight counts per step: the logarithms gathered from `lg`, the 32 x 32
/// -> 64-bit products of the even and odd lanes summed apart (the scalar loop was a third of a
/// mantissa plane's model time: 256 counts per block). `None` if a count is past the table (no
/// block of the format has one; the caller then takes the scalar path).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn sum_c_log2_avx2(row: &[u32], lg: &[u32]) -> Option<u64> {
    use std::arch::x86_64::*;
    let top = lg.len() as i32 - 1;
    let limit = _mm256_set1_epi32(top);
    let mut even = _mm256_setzero_si256();
    let mut odd = _mm256_setzero_si256();
    let mut over = _mm256_setzero_si256();
    for c in row.chunks_exact(8) {
        // SAFETY: the chunk is 8 u32 = 32 bytes; unaligned load.
        let vc = unsafe { _mm256_loadu_si256(c.as_ptr() as *const __m256i) };
        // Indices clamped to the table, so that the gather stays inside it; a clamped lane marks
        // the row for the scalar path.
        let idx = _mm256_min_epu32(vc, limit);
        over = _mm256_or_si256(over, _mm256_xor_si256(idx, vc));
        // SAFETY: every index is at most `lg.len() - 1`; 4-byte elements.
        let vl = unsafe { _mm256_i32gather_epi32::<4>(lg.as_ptr() as *const i32, idx) };
        even = _mm256_add_epi64(even, _mm256_mul_epu32(vc, vl));
        odd = _mm256_add_epi64(
            odd,
            _mm256_mul_epu32(_mm256_srli_epi64(vc, 32), _mm256_srli_epi64(vl, 32)),
        );
    }
    if _mm256_testz_si256(over, over) == 0 {
        return None;
    }
    let sum = _mm256_add_epi64(even, odd);
    let mut lanes = [0u64; 4];
    // SAFETY: `lanes` is 32 bytes; unaligned store.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, sum) };
    Some(lanes.iter().sum())
}

/// Per block, the least cost over the cost columns added so far and the column that has it, as
/// `cluster`'s choice compares them: column by column, strictly less (the lowest index wins ties;
/// `u64::MAX`, not covered, never wins). A loop over blocks without branches, which vectorises,
/// instead of a branchy walk over the tables per block.
#[derive(Clone)]
struct Least {
    c: Vec<u64>,
    j: Vec<u8>,
}

impl Least {
    fn new(nb: usize) -> Least {
        Least {
            c: vec![u64::MAX; nb],
            j: vec![0; nb],
        }
    }

    /// Compares column `j` (the costs of every block under table `j`) with the least so far.
    #[inline(always)] // into `cluster_avx2`
    fn add(&mut self, j: usize, col: &[u64]) {
        for ((bc, bj), &c) in self.c.iter_mut().zip(self.j.iter_mut()).zip(col) {
            let better = c < *bc;
            *bc = if better { c } else { *bc };
            *bj = if better { j as u8 } else { *bj };
        }
    }
}

/// Blocks shown raw under every table by a cheap lower bound of their `ideal_cost_dense`: order-0
/// entropy is at least collision entropy, `n H >= n log2(n^2 / S)` with `S = sum c^2`. In Q16,
/// `log2_q16` is below the true value by less than 2 units, so `ideal_cost_dense >= 2^16 n H - 2n`,
/// and [`collision_lower_bound`] subtracts 2 more units per symbol for rounding `log2 S` down. If
/// the bound fails the passthrough test, so does the block's own entropy. (A near-uniform plane —
/// bf16's sign-and-mantissa byte, fp32's three low bytes — has collision entropy ~7.9 bits, far
/// above the 7.6 of the default threshold; its 256 gathered logarithms per block and the support
/// pass were most of such a plane's model time.)
///
/// The bound falls as `S` grows (`log2_q16` is monotone), so for a block length `n` the test is
/// `S <= s_max(n)`, found once per length by bisection: no logarithm per block.
struct CollisionTest {
    threshold: u64,
    /// The last block length seen and its `s_max` (`None`: no `S` passes).
    last: Option<(u64, Option<u64>)>,
}

/// `2^16 n log2(n^2 / S)` rounded down, less `4n` (see [`CollisionTest`]), at least 0.
fn collision_lower_bound(n: u64, s: u64) -> u64 {
    (2 * n * log2_q16(n)).saturating_sub(n * (log2_q16(s) + 2) + 2 * n)
}

impl CollisionTest {
    fn new(threshold: u64) -> Self {
        CollisionTest {
            threshold,
            last: None,
        }
    }

    /// The largest `S` in `1..=n^2` whose bound fails the passthrough test, if any.
    fn s_max(&self, n: u64) -> Option<u64> {
        let fails = |s: u64| !stays_coded(collision_lower_bound(n, s), n as usize, self.threshold);
        if !fails(1) {
            return None;
        }
        // Invariant: fails(lo), and !fails(s) for every s > hi.
        let (mut lo, mut hi) = (1u64, n * n);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fails(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Some(lo)
    }

    /// Whether the block of histogram `h` is raw under every table (`false`: not shown).
    #[inline(always)] // into `cluster_avx2`
    fn raw(&mut self, h: &[u32; 256]) -> bool {
        let (n, sq) = sum_and_squares(h);
        // Blocks hold at most 65536 units; anything else is not claimed (and keeps the products
        // below far from overflowing).
        if n == 0 || n > 1 << 16 {
            return false;
        }
        let limit = match self.last {
            Some((m, limit)) if m == n => limit,
            _ => {
                let limit = self.s_max(n);
                self.last = Some((n, limit));
                limit
            }
        };
        limit.is_some_and(|l| sq <= l)
    }
}

/// Probe blocks of the flat-plane rule (`docs/FORMAT.md`, "Flat planes"): about this many of a
/// float tensor's sampled blocks, spread evenly.
pub const FLAT_PROBES: usize = 16;

/// The spacing of the flat-plane rule's probe blocks among `n_sampled` sampled blocks (sampled
/// blocks `i` with `i % stride == 0`), or `None` where the rule does not apply (fewer than
/// `2 * FLAT_PROBES` sampled blocks).
pub fn probe_stride(n_sampled: usize) -> Option<usize> {
    let s = n_sampled / FLAT_PROBES;
    (s >= 2).then_some(s)
}

/// Whether a block's histogram has at least two distinct bytes (a block of one repeated byte
/// costs nothing under any table, and its plane is searched without it).
pub fn varied(h: &[u32; 256]) -> bool {
    h.iter().filter(|&&c| c != 0).nth(1).is_some()
}

/// The flat-plane rule: whether every probe histogram in `probes` has at least two distinct bytes
/// and is shown raw under every table by the collision bound (`CollisionTest`). A plane whose
/// probes are all flat gets no block tables, and its other sampled blocks need not be counted:
/// fp32's two low mantissa bytes were counted in every sampled block only for the planes to be
/// stored raw (not counting them: MiniLM fp32 one-thread compress +8%, 2026-12-03).
pub fn probes_flat<'h>(probes: impl Iterator<Item = &'h [u32; 256]>, threshold: u64) -> bool {
    let mut test = CollisionTest::new(threshold);
    let mut probes = probes.peekable();
    probes.peek().is_some() && probes.all(|h| varied(h) && test.raw(h))
}

/// Histograms ahead of the one being read whose lines are requested early: a plane's histograms
/// are 1 KiB each, `planes` KiB apart (4 KiB for fp32: a page each, where the hardware prefetchers
/// stop), and the GPU encoder's come fresh from a download, out of every cache.
const PREFETCH_AHEAD: usize = 4;

/// While histogram `i` of `hists` is read: asks for the one `PREFETCH_AHEAD` further on, if any.
#[inline(always)]
pub(crate) fn prefetch_ahead(hists: &[&[u32; 256]], i: usize) {
    if let Some(ahead) = hists.get(i + PREFETCH_AHEAD) {
        prefetch_hist(ahead);
    }
}

/// Asks for the 16 cache lines of a histogram.
#[inline(always)]
fn prefetch_hist(h: &[u32; 256]) {
    #[cfg(target_arch = "x86_64")]
    for line in h.chunks_exact(16) {
        // SAFETY: a prefetch is a hint: it reads nothing architecturally and cannot fault; the
        // address is inside `h`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr() as *const i8
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = h;
}

/// `(sum c, sum c^2)` over a histogram (the second wrapping: exact whenever the sum is at most
/// 2^16, the only case [`CollisionTest::raw`] uses it).
#[inline(always)] // into `cluster_avx2`
fn sum_and_squares(h: &[u32; 256]) -> (u64, u64) {
    let (mut n, mut sq) = (0u64, 0u64);
    for &c in h {
        n += c as u64;
        sq = sq.wrapping_add(c as u64 * c as u64);
    }
    (n, sq)
}

/// Chooses the tables of one plane from the histograms of its non-constant sampled blocks `blocks`
/// (`n_sampled` blocks were sampled in all, of `n_blocks` in the plane). Normative description:
/// `docs/FORMAT.md`, "Encoder decisions".
///
/// Table 0 is the normalised sum of all sampled blocks. Further tables are grown one at a time, like
/// k-means with deterministic k-means++ seeding: a seed block is picked with probability proportional
/// to its *regret* (cost under its current table minus its own order-0 entropy) by a fixed
/// low-discrepancy sequence; the candidate table is the seed's counts, refined by Lloyd iterations
/// (tables 1.. become the normalised sums of the blocks that choose them; table 0 stays). A candidate is
/// kept only if the saving it brings (scaled from the sample to the plane) exceeds the bytes it adds.
/// Every table covers every symbol the sample contains, so any block can choose any table.
pub fn cluster(
    blocks: &[&[u32; 256]],
    n_sampled: u64,
    n_blocks: u64,
    max_tables: usize,
    threshold: u64,
) -> Vec<FreqTable> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx2() {
            // SAFETY: AVX2 support was checked at run time.
            return unsafe { cluster_avx2(blocks, n_sampled, n_blocks, max_tables, threshold) };
        }
    }
    cluster_body(blocks, n_sampled, n_blocks, max_tables, threshold)
}

/// [`cluster`] compiled for AVX2: the loops over histograms and cost columns that it and the
/// helpers inlined into it run (the squares of the collision test, the support pass, the least
/// costs, the group sums) vectorise 8 lanes wide instead of SSE2's 4. Integer arithmetic only: the
/// same tables on every path.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn cluster_avx2(
    blocks: &[&[u32; 256]],
    n_sampled: u64,
    n_blocks: u64,
    max_tables: usize,
    threshold: u64,
) -> Vec<FreqTable> {
    cluster_body(blocks, n_sampled, n_blocks, max_tables, threshold)
}

/// The table search ends when the blocks' regrets sum to less than 1 / `REGRET_STOP` of their
/// cost under their choices (0.5%): the most any further table could save. Since 2026-12-06;
/// before, the search made all `2 × max_tables` attempts on every 384 × 384 and 384 × 1536
/// matrix of all-MiniLM-L6-v2 (~8 ms of a ~45 ms bf16 compress). With the stop: the model pass of
/// MiniLM bf16 17.8 → 13.9 ms, its archive +908 bytes (66.17% either way); MiniLM fp32 +9,211
/// bytes (+0.010 points), fp16 +30, synthetic bf16 +2,825 (docs/BENCHMARKS.md). At 1%: 13.0 ms,
/// but fp32 +0.04 and synthetic bf16 +0.07 points.
const REGRET_STOP: u128 = 200;

#[inline(always)]
fn cluster_body(
    blocks: &[&[u32; 256]],
    n_sampled: u64,
    n_blocks: u64,
    max_tables: usize,
    threshold: u64,
) -> Vec<FreqTable> {
    // A plain loop, not `Iterator::all`: the latter's `try_fold` was not inlined into
    // `cluster_avx2`, so the sums of squares ran as SSE2 code (~9% of a bf16 tensor's search).
    let mut collision = CollisionTest::new(threshold);
    let mut all_raw = true;
    for (i, h) in blocks.iter().enumerate() {
        prefetch_ahead(blocks, i);
        if !collision.raw(h) {
            all_raw = false;
            break;
        }
    }
    if blocks.is_empty() || all_raw {
        return Vec::new();
    }
    let sup = Support::new(blocks);
    let nb = sup.len();
    let (total, lens) = (&sup.total[..], &sup.lens[..]);
    let ideal: Vec<u64> = (0..nb).map(|b| ideal_cost_dense(sup.row(b))).collect();
    // No table codes a block below its entropy, and `ideal` is at most that entropy, so a block
    // whose `ideal` fails the passthrough test is raw under every table. If every block is, every
    // choice below is raw, the saving is 0 and the tables are dropped at the end: return that
    // now. (A near-uniform plane — a float's low mantissa bytes — took a third of a small
    // tensor's model time in attempts that could not succeed.)
    if !ideal
        .iter()
        .zip(lens)
        .any(|(&c, &len)| stays_coded(c, len, threshold))
    {
        return Vec::new();
    }
    // The cost of every block under every table is kept per table (a column; u64::MAX where the
    // table does not cover the block), and a column is recomputed only when its table changes.
    // A column is computed on this thread: at most `sample_blocks` rows of a few vectors each,
    // ~10-20 us of work, less than waking pool threads for it costs. (Split over the pool until
    // 2026-12-02: one bf16 tensor's model took 1.35 ms on the H200's 16-thread host, 0.73 ms with
    // the columns on one thread; eight tensors at once, which keep the pool busy anyway,
    // 1.17 -> 1.27 ms, and the GPU encoder's call did not change.) The choice from the columns is
    // exactly `choose`'s.
    let column = |t: &FreqTable| -> Vec<u64> {
        let cl = sup.code_lengths(t);
        let mut col = vec![0u64; nb];
        sup.costs(0, &cl, &mut col);
        col
    };
    // Each block's choice from its least cost over the columns: the covering table of least cost if
    // that stays coded, else raw.
    let choice_of = |least: &Least| -> Vec<(u8, u64)> {
        least
            .c
            .iter()
            .zip(&least.j)
            .zip(lens)
            .map(|((&c, &j), &len)| {
                if c != u64::MAX && stays_coded(c, len, threshold) {
                    (j, c)
                } else {
                    (SEL_RAW, raw_cost(len))
                }
            })
            .collect()
    };
    let least_of = |cols: &[Rc<Vec<u64>>]| -> Least {
        let mut least = Least::new(nb);
        for (j, col) in cols.iter().enumerate() {
            least.add(j, col);
        }
        least
    };
    let table_bytes =
        |tables: &[FreqTable]| -> u64 { tables.iter().map(|t| t.serialized_len() as u64).sum() };
    let scale = |q16: u64| q16 as u128 * n_blocks as u128 / n_sampled as u128;

    // Table 0: the summed counts (every support symbol has a positive total, so forcing the
    // support changes nothing).
    let mut tables = vec![sup.table(total).expect("non-empty blocks")];
    let mut cols = vec![Rc::new(column(&tables[0]))];
    let mut least = least_of(&cols);
    let mut choice = choice_of(&least);
    // Per table, the summed counts it was normalised from (`None`: table 0 and a seed's candidate):
    // a Lloyd step that sums the same counts for it would normalise it to itself, so it does not.
    // A step that changes no table leaves the columns and so the choice as they were, and ends
    // the iterations. (Renormalising unchanged sums was a large part of the search on a small
    // fp16 tensor: ~260 tables normalised for 144 blocks.)
    let mut made_from: Vec<Option<Rc<[u64]>>> = vec![None];
    let mut attempt = 0u64;
    // Seeds whose candidate was rejected since the tables last changed: the candidate depends only
    // on the seed's counts and the test only on the tables and choices, so the same seed is
    // rejected again without normalising its table (a one-block tensor drew the same seed in every
    // attempt: most of compressing a 1.5 KiB tensor).
    let mut rejected = vec![false; nb];
    while tables.len() < max_tables && attempt < 2 * max_tables as u64 {
        attempt += 1;
        let regrets: Vec<u64> = choice
            .iter()
            .zip(&ideal)
            .map(|(&(_, c), &id)| c.saturating_sub(id))
            .collect();
        let sum: u128 = regrets.iter().map(|&r| r as u128).sum();
        // No table codes a block below its order-0 cost, so the tables to come can save at most
        // the regrets' sum: the search ends once that is under 1 / REGRET_STOP of the blocks'
        // cost under their choices (FORMAT.md section 7).
        // (Also the trial's `before` below: `choice` changes only when a trial is kept.)
        let cost: u64 = choice.iter().map(|&(_, c)| c).sum();
        if sum == 0 || sum * REGRET_STOP < cost as u128 {
            break;
        }
        // frac(attempt * 0.6180339887) in Q32 picks a point of the cumulative regret.
        let target = (sum * ((attempt.wrapping_mul(0x9E37_79B9) & 0xFFFF_FFFF) as u128)) >> 32;
        let mut acc = 0u128;
        let mut seed = regrets.len() - 1;
        for (i, &r) in regrets.iter().enumerate() {
            acc += r as u128;
            if acc > target {
                seed = i;
                break;
            }
        }
        if rejected[seed] {
            continue;
        }
        let seed_counts: Vec<u64> = sup.row(seed).iter().map(|&c| c as u64).collect();
        let cand = sup.table(&seed_counts).expect("seed block is non-empty");
        // Cheap rejection: the candidate must at least improve its own seed block (`choose` with
        // the candidate alone).
        let mut c = [0u64];
        sup.costs(seed, &sup.code_lengths(&cand), &mut c);
        let seed_cost = if c[0] != u64::MAX && stays_coded(c[0], lens[seed], threshold) {
            c[0]
        } else {
            raw_cost(lens[seed])
        };
        if seed_cost >= choice[seed].1 {
            rejected[seed] = true;
            continue;
        }
        let mut trial = tables.clone();
        trial.push(cand);
        // The columns are shared with the current set (only a changed table gets a new one), and
        // the candidate's column is added to the current least costs rather than all columns
        // compared again (the same result: it has the highest index, so it wins only if strictly
        // less). Cloning every column and comparing them all anew were ~25% of a bf16 exponent
        // plane's search on one thread.
        let mut trial_cols = cols.clone();
        trial_cols.push(Rc::new(column(&trial[trial.len() - 1])));
        let mut trial_least = least.clone();
        trial_least.add(trial.len() - 1, &trial_cols[trial.len() - 1]);
        let mut trial_choice = choice_of(&trial_least);
        let mut trial_from = made_from.clone();
        trial_from.push(None);
        for _ in 0..LLOYD_ITERS {
            // Summed counts of the blocks choosing each table, in one pass.
            let sums = sup.group_sums(trial.len(), |b| Some(trial_choice[b].0 as usize));
            let mut changed = false;
            for (j, sum) in sums.chunks_exact(sup.width).enumerate().skip(1) {
                if trial_from[j].as_deref() == Some(sum) {
                    continue;
                }
                if let Some(t) = sup.table(sum) {
                    if t != trial[j] {
                        trial_cols[j] = Rc::new(column(&t));
                        trial[j] = t;
                        changed = true;
                    }
                    trial_from[j] = Some(Rc::from(sum));
                }
            }
            if !changed {
                break;
            }
            trial_least = least_of(&trial_cols);
            trial_choice = choice_of(&trial_least);
        }
        let after: u64 = trial_choice.iter().map(|&(_, c)| c).sum();
        let added = (((table_bytes(&trial) - table_bytes(&tables)) * 8) as u128) << FRAC_BITS;
        if scale(cost.saturating_sub(after)) <= added {
            rejected[seed] = true;
            continue;
        }
        tables = trial;
        cols = trial_cols;
        least = trial_least;
        choice = trial_choice;
        made_from = trial_from;
        rejected.fill(false);
    }
    // The plane's tables must pay for themselves: the coded blocks' saving over raw (scaled to the
    // whole plane) has to exceed the tables' serialised size. Otherwise the plane has no tables.
    let saving: u64 = choice
        .iter()
        .zip(lens)
        .filter(|(&(sel, _), _)| sel != SEL_RAW)
        .map(|(&(_, c), &len)| raw_cost(len) - c)
        .sum();
    if scale(saving) <= ((table_bytes(&tables) as u128 * 8) << FRAC_BITS) {
        return Vec::new();
    }
    // Keep table 0 (the fallback) and every table some sampled block chose.
    let used: Vec<bool> = (0..tables.len())
        .map(|j| j == 0 || choice.iter().any(|&(sel, _)| sel as usize == j))
        .collect();
    tables
        .into_iter()
        .zip(used)
        .filter(|(_, u)| *u)
        .map(|(t, _)| t)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::rng;

    #[test]
    fn dense_cost_paths_agree_with_the_definition() {
        let mut r = rng(0x2545_F491_4F6C_DD1D);
        for width in [8usize, 16, 48, 256] {
            for _ in 0..200 {
                let h: Vec<u32> = (0..width)
                    .map(|_| {
                        if r().is_multiple_of(3) {
                            0
                        } else {
                            (r() % 70_000) as u32
                        }
                    })
                    .collect();
                let cl: Vec<u32> = (0..width).map(|_| (r() % (12 << 16)) as u32).collect();
                let absent: Vec<u32> = (0..width)
                    .map(|_| if r().is_multiple_of(17) { u32::MAX } else { 0 })
                    .collect();
                let want_cost: u64 = h.iter().zip(&cl).map(|(&h, &c)| h as u64 * c as u64).sum();
                let want_cov = h.iter().zip(&absent).all(|(&h, &a)| h == 0 || a == 0);
                assert_eq!(dense_cost_generic(&h, &cl, &absent), (want_cost, want_cov));
                #[cfg(target_arch = "x86_64")]
                if crate::cpu::has_avx2() {
                    // SAFETY: AVX2 support was checked at run time.
                    let got = unsafe { dense_cost_avx2(&h, &cl, &absent) };
                    assert_eq!(got, (want_cost, want_cov));
                }
            }
        }
    }

    #[test]
    fn a_column_of_costs_equals_the_generic_costs_row_by_row() {
        let mut r = rng(5);
        // Even rows use symbols 0, 14, 28, ..., odd rows 0, 7, 14, ...
        let hists: Vec<[u32; 256]> = (0..300)
            .map(|b| {
                let step = if b % 2 == 0 { 14 } else { 7 };
                std::array::from_fn(|s| {
                    if s % step == 0 {
                        1 + (r() % 900) as u32
                    } else {
                        0
                    }
                })
            })
            .collect();
        let refs: Vec<&[u32; 256]> = hists.iter().collect();
        let sup = Support::new(&refs);
        let mut counts = [0u64; 256];
        for s in (0..256).step_by(14) {
            counts[s] = 1 + r() % 50;
        }
        // A table of the even rows' symbols only: the odd rows are not covered.
        let t = FreqTable::normalize(&counts, None).unwrap();
        let cl = sup.code_lengths(&t);
        let mut col = vec![0u64; sup.len()];
        sup.costs(0, &cl, &mut col);
        for (b, &c) in col.iter().enumerate() {
            let (want, covered) = dense_cost_generic(sup.row(b), &cl.lens, &cl.absent);
            assert_eq!(c, if covered { want } else { u64::MAX }, "row {b}");
        }
        assert!(col.contains(&u64::MAX) && col.iter().any(|&c| c != u64::MAX));
    }

    #[test]
    fn sixteen_bit_cost_columns_equal_the_generic_costs() {
        let mut r = rng(9);
        // ~40 symbols around 100 (an exponent plane), blocks of up to 4096 units; then the extremes
        // the 16-bit path admits: a block of 32767 units all of one symbol, and one of 32767 units
        // spread over two.
        let mut hists: Vec<[u32; 256]> = (0..500)
            .map(|_| {
                let mut h = [0u32; 256];
                let len = 1 + r() % 4096;
                for _ in 0..len {
                    let s = 100 + (r() % 13) as usize * (r() % 4) as usize - 18;
                    h[s] += 1;
                }
                h
            })
            .collect();
        let mut one = [0u32; 256];
        one[82] = 32767;
        hists.push(one);
        let mut two = [0u32; 256];
        two[82] = 32000;
        two[135] = 767;
        hists.push(two);
        let refs: Vec<&[u32; 256]> = hists.iter().collect();
        let sup = Support::new(&refs);
        assert_eq!(sup.rows16.is_some(), crate::cpu::has_avx2());
        // Tables from a few rows (symbols of other rows absent: uncovered rows), from the total
        // (every row covered), and one where symbol 82 is rare (its longest code lengths).
        let mut tables: Vec<FreqTable> = (0..6)
            .map(|k| {
                let c: Vec<u64> = sup.row(k * 37).iter().map(|&c| c as u64).collect();
                let mut full = [0u64; 256];
                for (&s, &c) in sup.syms.iter().zip(&c) {
                    full[s as usize] = c;
                }
                FreqTable::normalize(&full, None).unwrap()
            })
            .collect();
        tables.push(sup.table(&sup.total).unwrap());
        let mut rare = [1u64 << 30; 256];
        rare[82] = 1;
        tables.push(FreqTable::normalize(&rare, None).unwrap());
        for t in &tables {
            let cl = sup.code_lengths(t);
            let mut col = vec![0u64; sup.len()];
            sup.costs(0, &cl, &mut col);
            for (b, &c) in col.iter().enumerate() {
                let (want, covered) = dense_cost_generic(sup.row(b), &cl.lens, &cl.absent);
                assert_eq!(c, if covered { want } else { u64::MAX }, "row {b}");
            }
            // A part of the column, from an odd first row.
            let mut part = vec![0u64; 100];
            sup.costs(301, &cl, &mut part);
            assert_eq!(part, col[301..401]);
        }
    }

    #[test]
    fn support_of_every_symbol_keeps_the_histograms_as_rows() {
        let mut r = rng(17);
        for full in [true, false] {
            let hists: Vec<[u32; 256]> = (0..70)
                .map(|_| {
                    std::array::from_fn(|s| {
                        if full || s % 3 != 0 {
                            1 + (r() % 300) as u32
                        } else {
                            0
                        }
                    })
                })
                .collect();
            let refs: Vec<&[u32; 256]> = hists.iter().collect();
            let sup = Support::new(&refs);
            assert_eq!(matches!(sup.rows, Rows::Whole(_)), full);
            assert_eq!(sup.len(), hists.len());
            for (b, h) in hists.iter().enumerate() {
                let row: Vec<u32> = sup.syms.iter().map(|&s| h[s as usize]).collect();
                assert_eq!(&sup.row(b)[..row.len()], &row[..]);
                assert!(sup.row(b)[row.len()..].iter().all(|&c| c == 0));
                assert_eq!(sup.lens[b], h.iter().sum::<u32>() as usize);
            }
            let total = sup.group_sums(1, |_| Some(0));
            assert_eq!(sup.total, total);
            let t = sup.table(&sup.total).unwrap();
            let cl = sup.code_lengths(&t);
            let mut col = vec![0u64; sup.len()];
            sup.costs(3, &cl, &mut col[3..]);
            for b in 3..sup.len() {
                let (want, covered) = dense_cost_generic(sup.row(b), &cl.lens, &cl.absent);
                assert!(covered);
                assert_eq!(col[b], want, "row {b}");
            }
        }
    }

    #[test]
    fn ideal_cost_paths_agree() {
        let lg = log2_small();
        let mut r = rng(1234);
        for width in [8usize, 32, 256] {
            for k in 0..300 {
                let mut row: Vec<u32> = (0..width)
                    .map(|_| {
                        if r().is_multiple_of(4) {
                            0
                        } else {
                            (r() % 65537) as u32
                        }
                    })
                    .collect();
                if k % 50 == 0 {
                    // Past the table: the vector path declines and the scalar one computes it.
                    row[width / 2] = 65537 + (r() % 1000) as u32;
                }
                let want = sum_c_log2(&row, lg);
                #[cfg(target_arch = "x86_64")]
                if crate::cpu::has_avx2() {
                    // SAFETY: AVX2 support was checked at run time; `width` is a multiple of 8.
                    let got = unsafe { sum_c_log2_avx2(&row, lg) };
                    assert_eq!(got, (k % 50 != 0).then_some(want), "width {width} row {k}");
                }
            }
        }
    }

    #[test]
    fn ideal_cost_is_the_sum_over_present_symbols() {
        let lg = log2_small();
        let mut r = rng(99);
        for _ in 0..500 {
            let row: Vec<u32> = (0..64)
                .map(|_| {
                    if r().is_multiple_of(2) {
                        0
                    } else {
                        (r() % 1000) as u32
                    }
                })
                .collect();
            let n: u32 = row.iter().sum();
            if n == 0 {
                continue;
            }
            let want: u64 = row
                .iter()
                .filter(|&&c| c != 0)
                .map(|&c| c as u64 * (lg[n as usize] as u64 - lg[c as usize] as u64))
                .sum();
            assert_eq!(ideal_cost_dense(&row), want);
        }
    }

    #[test]
    fn collision_test_only_claims_blocks_raw_by_their_own_entropy() {
        // Histograms from one symbol to all 256, flat or skewed, short and long blocks, several
        // thresholds: whenever the cheap test calls a block raw, its exact order-0 cost fails the
        // passthrough test too.
        let mut r = rng(0x9E37_79B9_7F4A_7C15);
        let mut claimed = 0;
        for threshold in [62259u64, 65536, 58982, 32768, 1] {
            let mut test = CollisionTest::new(threshold);
            for case in 0..600 {
                let width = 1 + (r() % 256) as usize;
                let n = [1usize, 2, 37, 4095, 4096, 65535][case % 6];
                let skew = r() % 4;
                let mut h = [0u32; 256];
                for _ in 0..n {
                    let mut s = (r() % width as u64) as usize;
                    for _ in 0..skew {
                        s = s.min((r() % width as u64) as usize);
                    }
                    h[s] += 1;
                }
                if test.raw(&h) {
                    claimed += 1;
                    assert!(
                        !stays_coded(ideal_cost_dense(&h), n, threshold),
                        "threshold {threshold}, n {n}, width {width}, skew {skew}"
                    );
                }
            }
        }
        // The shortcut is taken where it is meant to be: flat blocks of 4096 bytes.
        assert!(claimed > 100, "{claimed} blocks claimed");
    }

    #[test]
    fn collision_test_declines_counts_no_block_has() {
        // Sums past a block's 65536 units (and products that would overflow) are not claimed.
        let mut test = CollisionTest::new(62259);
        assert!(!test.raw(&[u32::MAX; 256]));
        assert!(!test.raw(&[257; 256]));
        assert!(!test.raw(&[0; 256]));
        assert!(test.raw(&[256; 256]));
    }

    #[test]
    fn collision_limit_is_the_largest_failing_sum_of_squares() {
        for threshold in [62259u64, 65536, 40000] {
            let test = CollisionTest::new(threshold);
            for n in 1..=48u64 {
                let fails =
                    |s: u64| !stays_coded(collision_lower_bound(n, s), n as usize, threshold);
                let brute = (1..=n * n).filter(|&s| fails(s)).max();
                assert_eq!(test.s_max(n), brute, "n {n}, threshold {threshold}");
                if let Some(m) = brute {
                    assert!((1..=m).all(fails), "not monotone at n {n}");
                }
            }
        }
    }

    #[test]
    fn cluster_builds_covering_tables_that_pay_for_themselves() {
        // Two kinds of blocks with different exponent-like distributions: two tables beat one.
        let mut r = rng(7);
        let mut hists = Vec::new();
        for b in 0..256 {
            let mut h = [0u32; 256];
            let centre = if b % 2 == 0 { 120 } else { 126 };
            for _ in 0..4096 {
                let s = centre + (r() % 5) as usize - ((r() % 5) as usize);
                h[s] += 1;
            }
            hists.push(h);
        }
        let refs: Vec<&[u32; 256]> = hists.iter().collect();
        let tables = cluster(&refs, 256, 256, 8, 62259);
        assert!(tables.len() >= 2, "{} tables", tables.len());
        for t in &tables {
            for h in &hists {
                for (s, &c) in h.iter().enumerate() {
                    assert!(c == 0 || t.freq[s] != 0, "table lacks symbol {s}");
                }
            }
        }
    }
}
