//! A cheap proof that a block is raw under every table of its plane, for the chunk encoder's
//! blocks whose histogram the model did not keep.
//!
//! A plane that is raw in nearly every block may still have tables (all-MiniLM-L6-v2's word
//! embedding: fp32's two low bytes are raw in 95–96% of the blocks, coded in 1–4%, constant in
//! 4%), and choosing each block's table needs its histogram: counting those random bytes was 8% of
//! a one-thread MiniLM fp32 compress. The cost of a block under a table is `sum h[s] × CL[s]`; a
//! table's cheap symbols (code length below the passthrough threshold's bits per byte, plus a
//! margin) are few. With `C` the cheap symbols of all the plane's tables and `m_t` table `t`'s least
//! code length outside `C`, every covering table costs at least
//! `sum_{s in C} h[s] × CL_t[s] + (n − h_C) × m_t`; if that is at least the raw threshold for every
//! table, *choose* returns raw — the same selector, so the same bytes, as from the full histogram.
//! Only the counts of the (at most [`MAX_CHEAP`]) symbols of `C` are taken, by comparison. A block
//! the bound does not settle is counted and chosen as before.

use crate::model::TableCost;

/// Most cheap symbols a plane may have for the bound to be used.
pub const MAX_CHEAP: usize = 8;

/// Margin above the passthrough threshold's bits per byte under which a symbol counts as cheap
/// (Q16 bits: a quarter bit). Larger keeps `m_t` higher (a tighter bound) at the price of more
/// symbols to count.
const CHEAP_MARGIN_Q16: u64 = 1 << 14;

/// The bound for one plane's tables.
pub struct RawBound {
    /// The cheap symbols (`n` of them).
    syms: [u8; MAX_CHEAP],
    n: usize,
    /// Per table: the code lengths of the cheap symbols (0 where absent) and the least code length
    /// of its present symbols outside them (`u32::MAX` if it has none).
    tables: Vec<([u64; MAX_CHEAP], u64)>,
    threshold_q16: u64,
}

impl RawBound {
    /// The bound for tables `costs` at `threshold_q16`, if they have at most [`MAX_CHEAP`] cheap
    /// symbols.
    pub fn new(costs: &[TableCost], threshold_q16: u64) -> Option<RawBound> {
        let cutoff = 8 * threshold_q16 + CHEAP_MARGIN_Q16;
        let mut syms = [0u8; MAX_CHEAP];
        let mut n = 0;
        for s in 0..256usize {
            if costs
                .iter()
                .any(|t| t.present(s) && u64::from(t.code_len(s)) < cutoff)
            {
                *syms.get_mut(n)? = s as u8;
                n += 1;
            }
        }
        let tables = costs
            .iter()
            .map(|t| {
                let mut cl = [0u64; MAX_CHEAP];
                for (c, &s) in cl.iter_mut().zip(&syms[..n]) {
                    *c = u64::from(t.code_len(s as usize));
                }
                let rest = (0..256usize)
                    .filter(|&s| t.present(s) && !syms[..n].contains(&(s as u8)))
                    .map(|s| u64::from(t.code_len(s)))
                    .min()
                    .unwrap_or(u64::from(u32::MAX));
                (cl, rest)
            })
            .collect();
        Some(RawBound {
            syms,
            n,
            tables,
            threshold_q16,
        })
    }

    /// Whether block `blk` (not one repeated byte) is raw under every table: `true` only if
    /// `model::choose` on its histogram returns raw.
    pub fn proves_raw(&self, blk: &[u8]) -> bool {
        let mut counts = [0u32; MAX_CHEAP];
        count_values(blk, &self.syms[..self.n], &mut counts);
        let len = blk.len() as u64;
        let h_c: u64 = counts.iter().map(|&c| u64::from(c)).sum();
        // `choose` keeps a table's cost c coded iff c << 16 < threshold × (8 len << 16), i.e.
        // iff c < threshold × 8 × len.
        let raw_at = self.threshold_q16 * 8 * len;
        self.tables.iter().all(|(cl, rest)| {
            let cheap: u64 = counts.iter().zip(cl).map(|(&h, &c)| u64::from(h) * c).sum();
            cheap + (len - h_c) * rest >= raw_at
        })
    }
}

/// `counts[j]` = occurrences of `values[j]` in `bytes` (`values` distinct, at most
/// [`MAX_CHEAP`]).
fn count_values(bytes: &[u8], values: &[u8], counts: &mut [u32; MAX_CHEAP]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx512_vbmi2() {
            // SAFETY: AVX-512F and BW support was checked at run time (with VBMI2).
            done = unsafe { count_values_avx512(bytes, values, counts) };
        } else if crate::cpu::has_avx2() {
            // SAFETY: AVX2 support was checked at run time.
            done = unsafe { count_values_avx2(bytes, values, counts) };
        }
    }
    for &b in &bytes[done..] {
        if let Some(j) = values.iter().position(|&v| v == b) {
            counts[j] += 1;
        }
    }
}

/// [`count_values`] over whole 64-byte vectors; returns the bytes counted.
///
/// # Safety
/// AVX-512F and BW required.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,popcnt")]
unsafe fn count_values_avx512(bytes: &[u8], values: &[u8], counts: &mut [u32; MAX_CHEAP]) -> usize {
    use std::arch::x86_64::*;
    let whole = bytes.len() / 64 * 64;
    for (j, &v) in values.iter().enumerate() {
        let want = _mm512_set1_epi8(v as i8);
        let mut n = 0u32;
        for c in bytes[..whole].chunks_exact(64) {
            // SAFETY: `c` is 64 readable bytes.
            let x = unsafe { _mm512_loadu_si512(c.as_ptr() as *const _) };
            n += _mm512_cmpeq_epi8_mask(x, want).count_ones();
        }
        counts[j] = n;
    }
    whole
}

/// [`count_values`] over whole 32-byte vectors with AVX2; returns the bytes counted. Each value's
/// matches are summed in byte lanes (a compare gives -1 where equal: subtracted), at most 255
/// vectors before the lanes are added up. Was the scalar loop on CPUs without AVX-512 VBMI: most
/// of `TensorEncoder::select`, 36% of a one-thread MiniLM fp32 encode pass on an AVX2-only AMD
/// EPYC (2026-12-07), whose low planes are raw in nearly every block.
///
/// # Safety
/// AVX2 required.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn count_values_avx2(bytes: &[u8], values: &[u8], counts: &mut [u32; MAX_CHEAP]) -> usize {
    use std::arch::x86_64::*;
    let whole = bytes.len() / 32 * 32;
    for (j, &v) in values.iter().enumerate().take(MAX_CHEAP) {
        let want = _mm256_set1_epi8(v as i8);
        let mut n = 0u64;
        for run in bytes[..whole].chunks(255 * 32) {
            let mut acc = _mm256_setzero_si256();
            for c in run.chunks_exact(32) {
                // SAFETY: `c` is 32 readable bytes.
                let x = unsafe { _mm256_loadu_si256(c.as_ptr() as *const __m256i) };
                acc = _mm256_sub_epi8(acc, _mm256_cmpeq_epi8(x, want));
            }
            // The 32 byte counts (each at most 255) summed in four 64-bit lanes.
            let sums = _mm256_sad_epu8(acc, _mm256_setzero_si256());
            n += (_mm256_extract_epi64::<0>(sums)
                + _mm256_extract_epi64::<1>(sums)
                + _mm256_extract_epi64::<2>(sums)
                + _mm256_extract_epi64::<3>(sums)) as u64;
        }
        counts[j] += n as u32;
    }
    whole
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{choose, tests::rng};
    use crate::rans::table::FreqTable;

    /// The AVX2 count (called directly: an AVX-512 VBMI CPU takes another path) against a count
    /// by hand, for lengths around its 32-byte vectors and its 255-vector runs, one to eight
    /// values, bytes of every value.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_counts_equal_the_scalar_ones() {
        if !crate::cpu::avx2_or_skip() {
            return;
        }
        let mut r = rng(5);
        for len in [0usize, 31, 32, 33, 4096, 8159, 8160, 8161, 8192, 20000] {
            // Skewed bytes: value 0 (the first value) is frequent, the others rare or absent.
            let bytes: Vec<u8> = (0..len)
                .map(|_| match r() % 4 {
                    0 => (r() % 256) as u8,
                    _ => (r() % 6) as u8,
                })
                .collect();
            for n in 1..=MAX_CHEAP {
                let values: Vec<u8> = (0..n).map(|j| (j * 37 % 256) as u8).collect();
                let mut got = [0u32; MAX_CHEAP];
                // SAFETY: AVX2 checked above.
                let done = unsafe { count_values_avx2(&bytes, &values, &mut got) };
                assert_eq!(done, len / 32 * 32);
                for (j, &v) in values.iter().enumerate() {
                    let want = bytes[..done].iter().filter(|&&b| b == v).count() as u32;
                    assert_eq!(got[j], want, "length {len}, value {v}");
                }
                assert!(got[n..].iter().all(|&c| c == 0));
            }
        }
        // One byte throughout: every lane counts every vector of a run (the 255 limit).
        let same = vec![37u8; 20001];
        let mut got = [0u32; MAX_CHEAP];
        // SAFETY: AVX2 checked above.
        let done = unsafe { count_values_avx2(&same, &[0, 37], &mut got) };
        assert_eq!((done, got[0], got[1]), (20000, 0, 20000));
    }

    /// Whenever the bound says raw, `choose` on the block's full histogram says raw; and it says
    /// raw for most random blocks (else it saves nothing).
    #[test]
    fn the_bound_never_claims_a_block_choose_would_code() {
        let mut r = rng(21);
        let mut claimed = 0;
        for case in 0..400u64 {
            // Tables as the model makes them for a mostly flat plane: table 0 near-uniform with
            // a few frequent symbols, others of a few symbols, all with the whole alphabet forced
            // in or not.
            let k = 1 + (case % 4) as usize;
            let tables: Vec<FreqTable> = (0..k)
                .map(|t| {
                    let mut counts = [0u64; 256];
                    for (s, c) in counts.iter_mut().enumerate() {
                        *c = match t {
                            0 => 100 + r() % 20 + if s < 4 { r() % 400 } else { 0 },
                            _ => {
                                u64::from(s < 2 + t) * (1000 + r() % 1000)
                                    + u64::from(case % 2 == 0)
                            }
                        };
                    }
                    FreqTable::normalize(&counts, None).unwrap()
                })
                .collect();
            let costs: Vec<TableCost> = tables.iter().map(TableCost::new).collect();
            let threshold = [62259u64, 65536, 60000, 52000][(case / 4 % 4) as usize];
            let Some(bound) = RawBound::new(&costs, threshold) else {
                continue;
            };
            // Blocks from random to skewed towards the cheap symbols.
            let len = [4096usize, 1000, 64, 4097, 333][(case % 5) as usize];
            let skew = case % 7;
            let blk: Vec<u8> = (0..len)
                .map(|_| match r() % 8 < skew {
                    true => (r() % 4) as u8,
                    false => r() as u8,
                })
                .collect();
            if blk.iter().all(|&v| v == blk[0]) {
                continue;
            }
            let mut hist = [0u32; 256];
            blk.iter().for_each(|&v| hist[v as usize] += 1);
            if bound.proves_raw(&blk) {
                claimed += 1;
                assert_eq!(
                    choose(&hist, len, &costs, threshold).0,
                    crate::blob::SEL_RAW,
                    "case {case}: the bound claims a block choose codes"
                );
            }
        }
        assert!(claimed > 100, "the bound settled {claimed} blocks");
    }

    #[test]
    fn values_are_counted_at_every_length() {
        let mut r = rng(4);
        for len in [0usize, 1, 63, 64, 65, 200, 4096] {
            let bytes: Vec<u8> = (0..len).map(|_| (r() % 6) as u8).collect();
            let values = [0u8, 3, 5, 9];
            let mut got = [0u32; MAX_CHEAP];
            count_values(&bytes, &values, &mut got);
            for (j, &v) in values.iter().enumerate() {
                let want = bytes.iter().filter(|&&b| b == v).count() as u32;
                assert_eq!(got[j], want, "len {len}, value {v}");
            }
        }
    }
}
