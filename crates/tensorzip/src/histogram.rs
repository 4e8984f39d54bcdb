//! Byte histograms of the encoder's blocks (both passes count every block of every plane they
//! consider: ~16% of a one-thread bf16 compress was these loops, 2026-12-03).
//!
//! The portable loop keeps eight sub-histograms, which hides the store-to-load dependency of
//! repeated bytes (exponent planes repeat a few values: with four, bf16 compress spent 6% of its
//! time there). A byte plane whose values are mostly a few (an exponent plane: the eight most
//! frequent exponents of a weight tensor hold ~99% of it) is counted faster with AVX-512 by
//! comparing 64 bytes at a time with each of eight *candidate* values and counting the matches
//! in byte lanes; the bytes that match none are packed aside and counted one by one. The result
//! is the exact histogram either way: the candidates only decide the speed. They come from a
//! sample of the block, or from the previous block of the same plane ([`FewHint`]), which is
//! how the encoder counts a plane's blocks one after the other.

/// What the previous blocks of one plane taught about counting the next: the candidates that
/// covered the last block, or how many blocks to count the portable way before sampling again.
#[derive(Clone, Copy, Default)]
pub struct FewHint {
    cands: Option<[u8; FEW]>,
    skip: u8,
}

/// Blocks of a plane counted the portable way after a sample found no few values, before the
/// next sample.
const SKIP_AFTER_MISS: u8 = 15;

/// Counts the bytes of `bytes` into `hist` (cleared first).
pub fn histogram(bytes: &[u8], hist: &mut [u32; 256]) {
    histogram_hinted(bytes, hist, &mut FewHint::default());
}

/// Counts the bytes of `bytes` into `hist` (cleared first), one block of a plane whose previous
/// block was counted with the same `hint` (which this updates).
pub fn histogram_hinted(bytes: &[u8], hist: &mut [u32; 256], hint: &mut FewHint) {
    #[cfg(target_arch = "x86_64")]
    {
        if bytes.len() >= FEW_MIN_LEN && crate::cpu::has_avx512_vbmi2() {
            let cands = match hint.cands {
                Some(c) => Some(c),
                None if hint.skip > 0 => {
                    hint.skip -= 1;
                    None
                }
                None => {
                    let c = few_values(bytes);
                    if c.is_none() {
                        hint.skip = SKIP_AFTER_MISS;
                    }
                    c
                }
            };
            if let Some(c) = cands {
                // SAFETY: AVX-512F, BW and VBMI2 support was checked at run time.
                let rest = unsafe { avx512::count_few(bytes, &c, hist) };
                // Candidates that left more than a sixteenth of the block are sampled anew.
                hint.cands = (rest * 16 <= bytes.len()).then_some(c);
                return;
            }
        }
    }
    let _ = hint;
    count_bytes(bytes, hist);
}

/// Blocks shorter than this are counted by the portable loop (the candidates' sample and the
/// packed rest cost more than they save).
const FEW_MIN_LEN: usize = 1024;

/// Candidate values counted by comparison.
const FEW: usize = 8;

/// The portable count: eight sub-histograms.
fn count_bytes(bytes: &[u8], hist: &mut [u32; 256]) {
    let mut h = [[0u32; 256]; 8];
    let mut it = bytes.chunks_exact(8);
    for c in &mut it {
        for k in 0..8 {
            h[k][c[k] as usize] += 1;
        }
    }
    for &b in it.remainder() {
        h[0][b as usize] += 1;
    }
    for s in 0..256 {
        hist[s] = (0..8).map(|k| h[k][s]).sum();
    }
}

/// Candidates for the comparisons: the [`FEW`] most frequent values of a sample of
/// [`SAMPLE`] bytes spread over `bytes` (then, if the sample has fewer, the lowest values absent
/// from it: distinct values either way), if the sample holds at most [`FEW_MAX_DISTINCT`] values
/// and those [`FEW`] hold all but [`SAMPLE`] / 16 of it (else most bytes would go through the
/// packed rest: `None`). A flat plane stops at its 25th distinct value, a few dozen bytes in.
fn few_values(bytes: &[u8]) -> Option<[u8; FEW]> {
    let step = bytes.len() / SAMPLE;
    if step == 0 {
        return None;
    }
    // Values seen, in order of first sight, with their counts; `slot[v]` is 1 + v's index.
    let mut slot = [0u8; 256];
    let mut seen = [(0u8, 0u32); FEW_MAX_DISTINCT];
    let mut n = 0usize;
    for i in 0..SAMPLE {
        let v = bytes[i * step];
        match slot[v as usize] {
            0 => {
                *seen.get_mut(n)? = (v, 1);
                n += 1;
                slot[v as usize] = n as u8;
            }
            s => seen[s as usize - 1].1 += 1,
        }
    }
    // The most frequent first (the lowest value among ties), by selection of the first FEW.
    let seen = &mut seen[..n];
    let top = n.min(FEW);
    for k in 0..top {
        let mut best = k;
        for j in k + 1..n {
            let ((bv, bc), (jv, jc)) = (seen[best], seen[j]);
            if jc > bc || (jc == bc && jv < bv) {
                best = j;
            }
        }
        seen.swap(k, best);
    }
    let covered: u32 = seen[..top].iter().map(|&(_, count)| count).sum();
    if (covered as usize) * 16 < SAMPLE * 15 {
        return None;
    }
    // At most 24 of the 256 values are present, so the absent ones fill the rest.
    let absent = (0..=255u8).filter(|&v| slot[v as usize] == 0);
    let mut cands = [0u8; FEW];
    for (c, v) in cands
        .iter_mut()
        .zip(seen[..top].iter().map(|&(v, _)| v).chain(absent))
    {
        *c = v;
    }
    Some(cands)
}

/// Bytes sampled for [`few_values`].
const SAMPLE: usize = 64;

/// Distinct values in the sample beyond which a plane is counted by the portable loop.
const FEW_MAX_DISTINCT: usize = 24;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Bytes compared per segment; a segment's unmatched bytes are packed into a stack buffer
    /// of this size and counted before the next segment.
    const SEGMENT: usize = 4096;

    /// Exact histogram of `bytes` into `hist`: each 64-byte vector compared with each candidate
    /// (distinct values, so the matches are disjoint), the matches counted in per-byte-lane
    /// counters (at most 64 per lane in a segment, summed at its end), the bytes that match
    /// none packed aside and counted one by one, as are the last partial vector's.
    ///
    /// # Safety
    /// AVX-512F, AVX-512BW and AVX-512VBMI2 required.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt")]
    pub(super) unsafe fn count_few(
        bytes: &[u8],
        cands: &[u8; super::FEW],
        hist: &mut [u32; 256],
    ) -> usize {
        let vals = cands.map(|c| _mm512_set1_epi8(c as i8));
        let minus_one = _mm512_set1_epi8(-1);
        hist.fill(0);
        let mut total_rest = 0;
        // Not zeroed (a 4 KiB memset on every call): only the bytes the packed stores wrote are
        // read back.
        let mut rest = [const { std::mem::MaybeUninit::<u8>::uninit() }; SEGMENT];
        let mut chunks = bytes.chunks_exact(64);
        while chunks.len() > 0 {
            let mut acc = [_mm512_setzero_si512(); super::FEW];
            let mut n_rest = 0usize;
            for c in (&mut chunks).take(SEGMENT / 64) {
                // SAFETY: `c` is 64 readable bytes.
                let v = unsafe { _mm512_loadu_si512(c.as_ptr() as *const _) };
                let m = vals.map(|x| _mm512_cmpeq_epi8_mask(v, x));
                for k in 0..super::FEW {
                    acc[k] = _mm512_mask_sub_epi8(acc[k], m[k], acc[k], minus_one);
                }
                let any = ((m[0] | m[1]) | (m[2] | m[3])) | ((m[4] | m[5]) | (m[6] | m[7]));
                let left = !any;
                // SAFETY: at most `SEGMENT / 64` vectors per segment add at most 64 bytes each,
                // so `n_rest <= SEGMENT - 64` before this store and its 64 bytes are in `rest`;
                // they initialise `rest[n_rest..n_rest + 64]`, which covers the bytes counted.
                unsafe {
                    _mm512_storeu_si512(
                        rest.as_mut_ptr().add(n_rest) as *mut _,
                        _mm512_maskz_compress_epi8(left, v),
                    )
                };
                n_rest += left.count_ones() as usize;
            }
            for (k, &c) in cands.iter().enumerate() {
                let sums = _mm512_sad_epu8(acc[k], _mm512_setzero_si512());
                hist[c as usize] += _mm512_reduce_add_epi64(sums) as u32;
            }
            // SAFETY: every byte below `n_rest` was written by one of the stores above (each
            // covers the bytes it adds to `n_rest` and more).
            let packed = unsafe { std::slice::from_raw_parts(rest.as_ptr() as *const u8, n_rest) };
            for &b in packed {
                hist[b as usize] += 1;
            }
            total_rest += n_rest;
        }
        for &b in chunks.remainder() {
            hist[b as usize] += 1;
        }
        total_rest + chunks.remainder().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(bytes: &[u8]) -> [u32; 256] {
        let mut h = [0u32; 256];
        for &b in bytes {
            h[b as usize] += 1;
        }
        h
    }

    /// Every path gives the exact histogram: skewed planes (the comparison path), flat ones
    /// (the portable path), lengths around the thresholds and the vector width, planes of fewer
    /// than eight values or one; and with one hint carried over all of these blocks in
    /// turn (candidates of a skewed block applied to a flat one, or to one skewed elsewhere).
    #[test]
    fn histogram_is_exact() {
        let mut next = crate::rans::test_input::xorshift(0x9E37_79B9_7F4A_7C15);
        let mut hint = FewHint::default();
        for case in 0..200 {
            let len = match case % 5 {
                0 => FEW_MIN_LEN - 1 + (next() % 3) as usize,
                1 => (next() % 200) as usize,
                2 => 4096,
                _ => 64 * (1 + (next() % 100) as usize) + (next() % 64) as usize,
            };
            let spread = 1 + (case % 40) as u64;
            let bytes: Vec<u8> = (0..len)
                .map(|_| match case % 4 {
                    // A few values around 120 or 60, as exponent planes.
                    0 => (120 + (next() % spread) as i64 - (next() % spread) as i64) as u8,
                    1 => (60 + (next() % spread) as i64 - (next() % spread) as i64) as u8,
                    2 => next() as u8,
                    _ => 7,
                })
                .collect();
            let mut h = [1u32; 256];
            histogram(&bytes, &mut h);
            assert_eq!(h, reference(&bytes), "case {case}, len {len}");
            let mut h = [1u32; 256];
            count_bytes(&bytes, &mut h);
            assert_eq!(h, reference(&bytes), "case {case}, len {len}: portable");
            let mut h = [1u32; 256];
            histogram_hinted(&bytes, &mut h, &mut hint);
            assert_eq!(h, reference(&bytes), "case {case}, len {len}: hinted");
        }
    }

    /// The sample finds the few values of an exponent-like block (distinct candidates) and
    /// declines a flat block or one of too many values.
    #[test]
    fn few_values_of_skewed_and_flat_blocks() {
        let mut next = crate::rans::test_input::xorshift(0x2545_F491_4F6C_DD1D);
        // 120 in half of the bytes, 119 in a quarter, ... 113 in 1/256, a few others.
        let skewed: Vec<u8> = (0..4096)
            .map(|_| {
                let r = next();
                match (r % 1024).leading_zeros() - 54 {
                    z if z < 8 => 120 - z as u8,
                    _ => 100 + (r >> 20) as u8 % 4,
                }
            })
            .collect();
        let c = few_values(&skewed).expect("few values");
        assert!([120, 119, 118].iter().all(|v| c.contains(v)), "{c:?}");
        let mut sorted = c;
        sorted.sort_unstable();
        assert!(sorted.windows(2).all(|w| w[0] != w[1]), "{c:?}");
        let flat: Vec<u8> = (0..4096).map(|_| next() as u8).collect();
        assert_eq!(few_values(&flat), None);
        let wide: Vec<u8> = (0..4096).map(|_| 100 + (next() % 20) as u8).collect();
        assert_eq!(few_values(&wide), None);
        let one = vec![9u8; 4096];
        let c = few_values(&one).expect("one value");
        assert_eq!(c[0], 9);
        assert!(c[1..].iter().all(|&v| v != 9));
    }
}
