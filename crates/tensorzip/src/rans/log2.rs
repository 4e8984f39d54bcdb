//! Integer fixed-point logarithms, identical on every engine.
//!
//! Encoder decisions (which table a block uses, whether it is stored raw, how tables are clustered)
//! compare code-length estimates. They are computed from these integer tables, never with floating
//! point, so the CPU and GPU engines take the same decisions bit for bit.

use std::sync::OnceLock;

use super::{PROB_BITS, PROB_SCALE};

/// Fractional bits of the fixed-point values (Q16: `1 << 16` is one bit).
pub const FRAC_BITS: u32 = 16;
/// Code length charged for a symbol that the table does not contain ("infinite").
pub const CL_ABSENT: u64 = 1 << 32;

/// `floor(log2(v) * 2^16)` for `v >= 1`, computed by repeated squaring (exact integer algorithm).
pub fn log2_q16(v: u64) -> u64 {
    debug_assert!(v >= 1);
    let ip = 63 - v.leading_zeros() as u64;
    // Mantissa in [2^62, 2^63) stands for [1, 2).
    let mut m: u128 = if ip <= 62 {
        (v as u128) << (62 - ip)
    } else {
        (v as u128) >> 1
    };
    let mut frac = 0u64;
    for i in (0..FRAC_BITS).rev() {
        m = (m * m) >> 62;
        if m >= 1u128 << 63 {
            m >>= 1;
            frac |= 1 << i;
        }
    }
    (ip << FRAC_BITS) | frac
}

/// Code length in Q16 bits of a symbol of frequency `f` (of 4096): `12 - log2(f)`; index 0 is absent.
pub fn code_len_table() -> &'static [u64; PROB_SCALE as usize + 1] {
    static T: OnceLock<Box<[u64; PROB_SCALE as usize + 1]>> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Box::new([0u64; PROB_SCALE as usize + 1]);
        t[0] = CL_ABSENT;
        for f in 1..=PROB_SCALE as u64 {
            t[f as usize] = ((PROB_BITS as u64) << FRAC_BITS) - log2_q16(f);
        }
        t
    })
}

/// `log2_q16(v)` for `0 <= v <= 65536` from a table (index 0 holds 0).
pub fn log2_small() -> &'static [u32] {
    static T: OnceLock<Vec<u32>> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = vec![0u32; 65537];
        for (v, slot) in t.iter_mut().enumerate().skip(1) {
            *slot = log2_q16(v as u64) as u32;
        }
        t
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2_is_exact_on_powers_and_close_elsewhere() {
        for k in 0..63 {
            assert_eq!(log2_q16(1u64 << k), (k as u64) << 16);
        }
        for v in [3u64, 5, 7, 1000, 4095, 65535, 123_456_789, u64::MAX] {
            let exact = (v as f64).log2() * 65536.0;
            let got = log2_q16(v) as f64;
            assert!(
                got <= exact + 1e-6 && exact - got < 2.0,
                "v={v} got={got} exact={exact}"
            );
        }
        let cl = code_len_table();
        assert_eq!(cl[4096], 0);
        assert_eq!(cl[2048], 1 << 16);
        assert_eq!(cl[1], 12 << 16);
        assert_eq!(log2_small()[65536], 16 << 16);
    }
}
