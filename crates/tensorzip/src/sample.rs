//! Seeded synthetic tensors: the built-in sample model and the data of tests and benchmarks.
//!
//! Weights follow the recipe of `docs/BENCHMARKS.md`: `randn * 0.02 * exp(0.3 * randn(rows, 1))`
//! (Gaussian values with a per-row scale), cast to the requested dtype with round-to-nearest-even.

use crate::dtype::DType;

/// A small, fast, seeded generator (SplitMix64).
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// `n` seeded random bytes (incompressible data for tests and benchmarks).
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(n);
    out
}

/// The bytes of an f32 tensor (`raw`, little-endian) cast to `to` with round to nearest even:
/// `Some` for bf16 and f16, `None` for any other target dtype.
pub fn cast_f32_bytes(raw: &[u8], to: DType) -> Option<Vec<u8>> {
    let f32s = raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    match to {
        DType::BF16 => Some(f32s.flat_map(|v| f32_to_bf16(v).to_le_bytes()).collect()),
        DType::F16 => Some(f32s.flat_map(|v| f32_to_f16(v).to_le_bytes()).collect()),
        _ => None,
    }
}

/// `f32` to bfloat16 bits, round to nearest even (NaN stays NaN).
pub fn f32_to_bf16(v: f32) -> u16 {
    let u = v.to_bits();
    if v.is_nan() {
        return ((u >> 16) | 0x40) as u16;
    }
    ((u as u64 + 0x7FFF + ((u >> 16) & 1) as u64) >> 16) as u16
}

/// `f32` to IEEE half bits, round to nearest even.
pub fn f32_to_f16(v: f32) -> u16 {
    let u = v.to_bits();
    let sign = ((u >> 16) & 0x8000) as u16;
    let exp = ((u >> 23) & 0xFF) as i32;
    let mant = u & 0x7F_FFFF;
    if exp == 0xFF {
        return sign | 0x7C00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1F {
        return sign | 0x7C00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1FFF;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

/// Weights `randn * 0.02 * exp(0.3 * randn(row))` of `rows x cols`, as little-endian bytes of `dtype`
/// (a float dtype: f32, bf16, f16 or f64).
pub fn weights(rows: usize, cols: usize, dtype: DType, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(rows * cols * dtype.itemsize());
    for _ in 0..rows {
        let scale = 0.02 * (0.3 * rng.normal()).exp();
        for _ in 0..cols {
            let v = rng.normal() * scale;
            match dtype {
                DType::F64 => out.extend_from_slice(&v.to_le_bytes()),
                DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
                DType::BF16 => out.extend_from_slice(&f32_to_bf16(v as f32).to_le_bytes()),
                DType::F16 => out.extend_from_slice(&f32_to_f16(v as f32).to_le_bytes()),
                other => panic!("weights() makes float tensors, not {other}"),
            }
        }
    }
    out
}

/// One named tensor of the built-in sample model.
pub struct SampleTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

/// The built-in sample model: a small transformer-shaped set of bf16 weights (about 24 MiB) with the
/// shapes of a 4-layer, 512-wide decoder, plus f32 norms and an i64 buffer.
pub fn sample_model(seed: u64) -> Vec<SampleTensor> {
    let (d, ff, vocab, layers) = (512usize, 2048usize, 8192usize, 4usize);
    let mut out = Vec::new();
    let mut s = seed;
    let mut push = |name: String, dtype: DType, shape: Vec<u64>, data: Vec<u8>| {
        out.push(SampleTensor {
            name,
            dtype,
            shape,
            data,
        });
    };
    s += 1;
    push(
        "embed_tokens.weight".into(),
        DType::BF16,
        vec![vocab as u64, d as u64],
        weights(vocab, d, DType::BF16, s),
    );
    for l in 0..layers {
        for (n, r, c) in [
            ("q_proj", d, d),
            ("k_proj", d, d),
            ("v_proj", d, d),
            ("o_proj", d, d),
            ("up_proj", ff, d),
            ("down_proj", d, ff),
        ] {
            s += 1;
            push(
                format!("layers.{l}.{n}.weight"),
                DType::BF16,
                vec![r as u64, c as u64],
                weights(r, c, DType::BF16, s),
            );
        }
        for n in ["input_norm", "post_norm"] {
            let mut rng = Rng::new(s);
            s += 1;
            let data = (0..d)
                .flat_map(|_| ((1.0 + 0.05 * rng.normal()) as f32).to_le_bytes())
                .collect();
            push(
                format!("layers.{l}.{n}.weight"),
                DType::F32,
                vec![d as u64],
                data,
            );
        }
    }
    let ids = (0..512i64).flat_map(|i| i.to_le_bytes()).collect();
    push("position_ids".into(), DType::I64, vec![1, 512], ids);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_round_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3F80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80); // tie -> even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(f32_to_f16(1.0), 0x3C00);
        assert_eq!(f32_to_f16(65504.0), 0x7BFF);
        assert_eq!(f32_to_f16(1e6), 0x7C00);
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001); // smallest subnormal
        assert_eq!(f32_to_f16(-0.0), 0x8000);
        for v in [0.1f32, -3.75, 1e-5, 123.456] {
            let h = half::f16::from_f32(v).to_bits();
            assert_eq!(f32_to_f16(v), h, "{v}");
        }
    }
}
