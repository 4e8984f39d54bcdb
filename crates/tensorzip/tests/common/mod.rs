//! Test data shared by the integration tests: seeded tensors of every dtype and distribution.
#![allow(dead_code)]

use tensorzip::sample::{self, Rng};
use tensorzip::{CompressOptions, DType};

/// Small options under which chunk and block boundaries are cheap to hit.
pub fn small_opts() -> CompressOptions {
    CompressOptions {
        chunk_bytes: 1024,
        block_units: 64,
        min_compress_bytes: 0,
        ..Default::default()
    }
}

/// How the values of a test tensor are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dist {
    /// Normal weights (`sample::weights`) for float dtypes; skewed small values for the others.
    Weights,
    /// One repeated non-zero unit.
    Constant,
    /// All bytes zero.
    Zero,
    /// Uniformly random bytes.
    Random,
    /// Weights with one huge element.
    Outlier,
    /// Weights sprinkled with NaN, +-Inf, -0 (extreme values for integer dtypes).
    NanInf,
    /// Subnormal floats (tiny values for integer dtypes).
    Subnormal,
}

impl Dist {
    pub const ALL: [Dist; 7] = [
        Dist::Weights,
        Dist::Constant,
        Dist::Zero,
        Dist::Random,
        Dist::Outlier,
        Dist::NanInf,
        Dist::Subnormal,
    ];
}

/// Gaussian-ish weights of `n` elements of `dtype`, as little-endian bytes.
pub fn weights(dtype: DType, n: usize, seed: u64) -> Vec<u8> {
    match dtype {
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => sample::weights(1, n, dtype, seed),
        DType::Complex64 => sample::weights(1, 2 * n, DType::F32, seed),
        DType::Bool => {
            let mut r = Rng::new(seed);
            (0..n).map(|_| (r.uniform() < 0.1) as u8).collect()
        }
        DType::F8E4M3FN | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ => {
            // The top byte of bf16 weights: a realistic skewed 8-bit float byte distribution.
            let w = sample::weights(1, n, DType::BF16, seed);
            w.chunks_exact(2).map(|c| c[1]).collect()
        }
        _ => {
            // Small signed integers (two's complement, little-endian) with a normal distribution.
            let mut r = Rng::new(seed);
            let isz = dtype.itemsize();
            let mut out = Vec::with_capacity(n * isz);
            for _ in 0..n {
                let v = (r.normal() * 20.0).round() as i64;
                out.extend_from_slice(&v.to_le_bytes()[..isz]);
            }
            out
        }
    }
}

pub use tensorzip::sample::random_bytes;

/// Bit patterns of special values of `dtype` (NaN, +-Inf, -0, max) as little-endian units.
fn specials(dtype: DType) -> Vec<Vec<u8>> {
    let v: Vec<u64> = match dtype {
        DType::F16 => vec![0x7E00, 0x7C01, 0xFE00, 0x7C00, 0xFC00, 0x8000, 0x7BFF],
        DType::BF16 => vec![0x7FC0, 0x7F81, 0xFFC0, 0x7F80, 0xFF80, 0x8000, 0x7F7F],
        DType::F32 | DType::Complex64 => vec![
            0x7FC0_0000,
            0x7F80_0001,
            0xFFC0_0000,
            0x7F80_0000,
            0xFF80_0000,
            0x8000_0000,
            0x7F7F_FFFF,
        ],
        DType::F64 => vec![
            0x7FF8_0000_0000_0000,
            0x7FF0_0000_0000_0001,
            0xFFF8_0000_0000_0000,
            0x7FF0_0000_0000_0000,
            0xFFF0_0000_0000_0000,
            0x8000_0000_0000_0000,
            0x7FEF_FFFF_FFFF_FFFF,
        ],
        DType::F8E4M3FN => vec![0x7F, 0xFF, 0x80, 0x7E],
        DType::F8E5M2 => vec![0x7C, 0xFC, 0x7E, 0xFF, 0x80, 0x7B],
        DType::F8E4M3FNUZ | DType::F8E5M2FNUZ => vec![0x80, 0x7F, 0xFF],
        DType::Bool => vec![0, 1, 0xFF],
        // Integers: min, max, -1, 0.
        _ => {
            let bits = 8 * dtype.itemsize() as u32;
            let max = if bits == 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
            vec![1u64 << (bits - 1), max >> 1, max, 0]
        }
    };
    let usz = dtype.unit_size();
    v.into_iter()
        .map(|x| x.to_le_bytes()[..usz].to_vec())
        .collect()
}

/// A subnormal (or tiny) random unit of `dtype`.
fn subnormal_unit(dtype: DType, r: &mut Rng) -> Vec<u8> {
    let x = r.next_u64();
    let (mask, usz): (u64, usize) = match dtype {
        DType::F16 => (0x83FF, 2),
        DType::BF16 => (0x807F, 2),
        DType::F32 | DType::Complex64 => (0x807F_FFFF, 4),
        DType::F64 => (0x800F_FFFF_FFFF_FFFF, 8),
        DType::F8E4M3FN | DType::F8E4M3FNUZ => (0x87, 1),
        DType::F8E5M2 | DType::F8E5M2FNUZ => (0x83, 1),
        DType::Bool => (0x01, 1),
        other => (0x8000_0000_0000_0007, other.itemsize()),
    };
    let mut v = x & mask;
    if matches!(
        dtype,
        DType::U8
            | DType::I8
            | DType::U16
            | DType::I16
            | DType::U32
            | DType::I32
            | DType::U64
            | DType::I64
    ) {
        v &= 7; // tiny integers
    }
    v.to_le_bytes()[..usz].to_vec()
}

/// `n` elements of `dtype` drawn from `dist`.
pub fn make(dtype: DType, n: usize, dist: Dist, seed: u64) -> Vec<u8> {
    let isz = dtype.itemsize();
    let usz = dtype.unit_size();
    let nb = n * isz;
    let mut r = Rng::new(seed ^ 0xD1CE);
    let data = match dist {
        Dist::Weights => weights(dtype, n, seed),
        Dist::Zero => vec![0u8; nb],
        Dist::Random => random_bytes(nb, seed),
        Dist::Constant => {
            // One repeated unit (for complex64 the real and imaginary parts are equal).
            let mut unit = random_bytes(usz, seed);
            if unit.iter().all(|&b| b == 0) {
                unit[0] = 0x5A;
            }
            if dtype == DType::Bool {
                unit = vec![1];
            }
            unit.iter().copied().cycle().take(nb).collect()
        }
        Dist::Outlier => {
            let mut d = weights(dtype, n, seed);
            if n > 0 {
                let at = (r.next_u64() % n as u64) as usize * isz;
                let big = specials(dtype).last().cloned().unwrap();
                for k in 0..isz / usz {
                    d[at + k * usz..at + (k + 1) * usz].copy_from_slice(&big);
                }
            }
            d
        }
        Dist::NanInf => {
            let mut d = weights(dtype, n, seed);
            let sp = specials(dtype);
            let units = nb / usz;
            for u in 0..units {
                if r.uniform() < 0.1 {
                    let s = &sp[(r.next_u64() % sp.len() as u64) as usize];
                    d[u * usz..(u + 1) * usz].copy_from_slice(s);
                }
            }
            d
        }
        Dist::Subnormal => {
            let units = nb / usz;
            let mut d = Vec::with_capacity(nb);
            for _ in 0..units {
                d.extend_from_slice(&subnormal_unit(dtype, &mut r));
            }
            d
        }
    };
    assert_eq!(data.len(), nb, "{dtype} {dist:?}");
    data
}

/// Element counts that hit the interesting boundaries of [`small_opts`] for `dtype`: one element,
/// non-multiples of the 32 lanes and of the 64-unit blocks, one chunk +-1 element, several chunks.
pub fn boundary_counts(dtype: DType) -> Vec<usize> {
    let per_chunk = 1024 / dtype.itemsize();
    let mut v = vec![
        1,
        2,
        31,
        33,
        63,
        65,
        97,
        per_chunk - 1,
        per_chunk,
        per_chunk + 1,
        2 * per_chunk - 1,
        2 * per_chunk + 1,
    ];
    v.push(5 * per_chunk + per_chunk / 2 + 3);
    v.sort_unstable();
    v.dedup();
    v
}

/// `decode_chunk_pair` on chunks `c` and `c + 1` (their streams decoded in one loop) agrees with
/// `decode_chunk` on each, for every pair of a Planes blob: the same bytes when both decode, an
/// error when either fails. Returns how many pairs failed.
pub fn check_pairs(dec: &tensorzip::decoder::TensorDecoder<'_>) -> usize {
    use tensorzip::decoder::DecodeScratch;
    let h = dec.header();
    let (mut s, mut sa, mut sb) = (
        DecodeScratch::default(),
        DecodeScratch::default(),
        DecodeScratch::default(),
    );
    let len = |c: usize| h.chunk_len(c as u64) * h.planes();
    let mut failed = 0;
    for c in 0..(h.n_chunks() as usize).saturating_sub(1) {
        let (mut a, mut b) = (vec![0u8; len(c)], vec![0u8; len(c + 1)]);
        let ra = dec.decode_chunk(c, &mut a, &mut s);
        let rb = dec.decode_chunk(c + 1, &mut b, &mut s);
        let (mut pa, mut pb) = (vec![0x55u8; len(c)], vec![0x55u8; len(c + 1)]);
        let rp = dec.decode_chunk_pair(c, &mut pa, &mut pb, &mut sa, &mut sb);
        assert_eq!(
            rp.is_ok(),
            ra.is_ok() && rb.is_ok(),
            "{}: chunks {c} and {}: pair {rp:?}, alone {ra:?} and {rb:?}",
            h.dtype,
            c + 1
        );
        if rp.is_ok() {
            assert!(
                pa == a && pb == b,
                "{}: chunks {c} and {} decode differently in a pair",
                h.dtype,
                c + 1
            );
        } else {
            failed += 1;
        }
    }
    failed
}
