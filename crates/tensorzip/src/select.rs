//! Splitting and merging the bytes of a conditioned plane by their condition byte.
//!
//! A conditioned plane's units whose condition byte equals the plane's condition value are coded (in
//! their block's sub-segment of the stream), the others stored raw. These helpers move bytes between
//! the plane and the (coded, raw) pair, 64 units at a time with byte compression and expansion
//! where the CPU has AVX-512 VBMI2, else eight at a time with byte shuffles where it has AVX2, with
//! a scalar fallback producing the same bytes.

/// Encoder side: splits `plane` by `cond == value` into the coded bytes (appended to `syms`) and the
/// raw bytes (appended to `raw`), in unit order.
pub fn split(value: u8, cond: &[u8], plane: &[u8], syms: &mut Vec<u8>, raw: &mut Vec<u8>) {
    let n = cond.len();
    let (s0, r0) = (syms.len(), raw.len());
    // Room for whole 8-byte stores; truncated to the real lengths at the end.
    syms.resize(s0 + n + 8, 0);
    raw.resize(r0 + n + 8, 0);
    let (t, r) = split_into(value, cond, plane, &mut syms[s0..], &mut raw[r0..]);
    syms.truncate(s0 + t);
    raw.truncate(r0 + r);
}

/// [`split`] into slices, each with room for `cond.len() + 8` bytes (the SIMD loops store whole
/// words past the bytes they keep); returns how many bytes went to `syms` and to `raw`. The
/// encoder splits into buffers it keeps at their largest length, so that nothing is zeroed for
/// each block.
pub fn split_into(
    value: u8,
    cond: &[u8],
    plane: &[u8],
    syms: &mut [u8],
    raw: &mut [u8],
) -> (usize, usize) {
    assert_eq!(cond.len(), plane.len());
    let n = cond.len();
    assert!(
        syms.len() >= n + 8 && raw.len() >= n + 8,
        "split_into: room for n + 8 bytes"
    );
    let (mut i, mut t, mut r) = (0, 0, 0);
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx512_vbmi2() {
            // SAFETY: AVX-512 F/BW/VBMI2 were checked; both outputs have room for n + 8 bytes
            // (asserted above).
            (i, t, r) = unsafe { split_avx512(value, cond, plane, syms, raw) };
        } else if crate::cpu::has_avx2() {
            // SAFETY: AVX2 was checked; both outputs have room for n + 8 bytes (asserted above).
            (i, t, r) = unsafe { split_simd(value, cond, plane, syms, raw) };
        }
    }
    for (&e, &m) in cond[i..].iter().zip(&plane[i..]) {
        if e == value {
            syms[t] = m;
            t += 1;
        } else {
            raw[r] = m;
            r += 1;
        }
    }
    (t, r)
}

/// Decoder side, step 1: the mask of coded units (`cond == value`) of every 8 units (into `masks`,
/// bit `i` = unit `8g + i`); returns how many units are coded.
pub fn masks(value: u8, cond: &[u8], masks: &mut Vec<u8>) -> usize {
    masks.clear();
    masks.resize(cond.len().div_ceil(8) + 4, 0);
    let mut i = 0;
    let mut t = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx2() {
            // SAFETY: AVX2 was checked; `masks` holds one byte per 8 units plus 4.
            (i, t) = unsafe { masks_simd(value, cond, masks) };
        }
    }
    for (j, &e) in cond.iter().enumerate().skip(i) {
        masks[j / 8] |= ((e == value) as u8) << (j % 8);
        t += (e == value) as usize;
    }
    masks.truncate(cond.len().div_ceil(8));
    t
}

/// Decoder side, step 2: fills `out` with the coded bytes `sub` at the coded units and the raw bytes
/// `raw` elsewhere, in unit order, following `masks` from [`masks`]. `sub` must hold at least the
/// coded units' bytes (extra bytes are ignored; 64 spare ones keep the vector loops going to the
/// end) and `raw` at least the others'.
pub fn scatter(masks: &[u8], sub: &[u8], raw: &[u8], out: &mut [u8]) {
    let (mut i, mut k, mut r) = (0, 0, 0);
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx512_vbmi2() {
            // SAFETY: AVX-512 F/BW/VBMI2 were checked; the loop reads 64 bytes of `sub` and `raw`
            // and 8 mask bytes, and writes 64 of `out`, only while that many remain in each.
            (i, k, r) = unsafe { scatter_avx512(masks, sub, raw, out) };
        }
        if crate::cpu::has_avx2() {
            // SAFETY: AVX2 was checked; the loop reads 8 bytes of `sub` and `raw` and writes 8 of
            // `out` only while 8 remain in each.
            (i, k, r) = unsafe { scatter_simd(masks, sub, raw, out, (i, k, r)) };
        }
    }
    for (j, o) in out.iter_mut().enumerate().skip(i) {
        if masks[j / 8] >> (j % 8) & 1 != 0 {
            *o = sub[k];
            k += 1;
        } else {
            *o = raw[r];
            r += 1;
        }
    }
}

/// `f::<8>(args)` where `e8` ([`fused_transform`]), else `f::<0>(args)`.
#[cfg(target_arch = "x86_64")]
macro_rules! by_transform {
    ($e8:expr, $f:ident($($arg:expr),*)) => {
        match $e8 {
            true => $f::<8>($($arg),*),
            false => $f::<0>($($arg),*),
        }
    };
}

/// The transforms the fused scatter-and-merge loops undo: `Some(false)` for none, `Some(true)` for
/// an 8-bit exponent below the sign (bf16, fp32); `None` for the others, which take the separate
/// passes.
#[cfg(target_arch = "x86_64")]
fn fused_transform(t: crate::dtype::Transform) -> Option<bool> {
    use crate::dtype::Transform;
    match t {
        Transform::Identity => Some(false),
        Transform::SignBelowExponent { exp_bits: 8 } => Some(true),
        _ => None,
    }
}

/// [`scatter`] of a two-byte unit's conditioned plane 0 fused with the merge of the block's two
/// planes into units (`plane1`: the condition plane): `dst` receives the units (`2 * n` bytes for
/// `n` units) as `transform::merge(t, [plane 0, plane1], dst)` would, with plane 0 scattered from
/// `masks`, `sub` and `raw`; `plane0` is scratch of `n` bytes (it holds plane 0 where the fused
/// loop left the rest to the separate passes). With AVX-512 VBMI2, 64 units a step go from the
/// expanded bytes straight into the units, without storing the plane and reading it back.
pub fn scatter_merge2(
    t: crate::dtype::Transform,
    (masks, sub, raw): (&[u8], &[u8], &[u8]),
    plane1: &[u8],
    plane0: &mut [u8],
    dst: &mut [u8],
) {
    let n = dst.len() / 2;
    let (mut i, mut k, mut r) = (0, 0, 0);
    #[cfg(target_arch = "x86_64")]
    if let Some(e8) = fused_transform(t).filter(|_| plane1.len() >= n) {
        let p1 = &plane1[..n];
        if crate::cpu::has_avx512_vbmi2() {
            // SAFETY: AVX-512 F/BW/VBMI2 were checked; the loop reads 64 bytes of `sub`, `raw`
            // and `plane1` and 8 mask bytes, and writes 128 of `dst`, only while that many remain
            // in each.
            (i, k, r) =
                unsafe { by_transform!(e8, scatter_merge2_avx512(masks, sub, raw, p1, dst)) };
        } else if crate::cpu::has_avx2() {
            // SAFETY: AVX2 was checked; the loop reads 32 bytes of `sub`, `raw` and `plane1` and
            // 4 mask bytes, and writes 64 of `dst`, only while that many remain in each.
            (i, k, r) = unsafe { by_transform!(e8, scatter_merge2_avx2(masks, sub, raw, p1, dst)) };
        }
    }
    scatter(&masks[i / 8..], &sub[k..], &raw[r..], &mut plane0[i..n]);
    crate::transform::merge(t, &[&plane0[i..n], &plane1[i..n]], &mut dst[2 * i..]);
}

/// The 64-unit steps of [`scatter_merge2`]: plane 0's bytes expanded under the mask
/// (`vpexpandb`), interleaved with plane 1's into 16-bit units, the inverse transform (`E = 8`:
/// plane 1 is the exponent, moved to bits 14..7 above the mantissa, plane 0's top bit the sign;
/// `E = 0`: none), two 64-byte stores. Returns where it stopped (unit, coded byte, raw byte).
///
/// # Safety
/// AVX-512F, AVX-512BW and AVX-512VBMI2 required; `plane1` holds `dst.len() / 2` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt")]
unsafe fn scatter_merge2_avx512<const E: u32>(
    masks: &[u8],
    sub: &[u8],
    raw: &[u8],
    plane1: &[u8],
    dst: &mut [u8],
) -> (usize, usize, usize) {
    use std::arch::x86_64::*;
    let n = dst.len() / 2;
    let (mut i, mut k, mut r) = (0, 0, 0);
    // SAFETY: 64 bytes are read at sub[k..], raw[r..] and plane1[i..] and 128 written at
    // dst[2i..], each only while that many remain; 8 mask bytes are read at masks[i / 8..] while
    // i + 64 <= n (masks holds a byte per 8 units).
    unsafe {
        // 64-bit lanes of the in-lane unpacks in unit order: units 0..32, then 32..64.
        let first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
        let second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
        let inv = |u: __m512i| {
            if E == 0 {
                u
            } else {
                // Bits 15..8 (the exponent) -> 14..7, bit 7 (the sign) -> 15, bits 6..0 stay: the
                // exponent from the right shift over the rest, then the sign from the left shift
                // over bit 15 (ternary logic 0xCA, as `scatter_merge4_avx512`'s: where the first
                // operand's bit is set the second's, elsewhere the third's). Four operations where
                // three ANDs and two ORs after the shifts were seven.
                let t = _mm512_ternarylogic_epi32::<0xCA>(
                    _mm512_set1_epi16(0x7F80),
                    _mm512_srli_epi16::<1>(u),
                    u,
                );
                _mm512_ternarylogic_epi32::<0xCA>(
                    _mm512_set1_epi16(-0x8000),
                    _mm512_slli_epi16::<8>(u),
                    t,
                )
            }
        };
        while i + 64 <= n && k + 64 <= sub.len() && r + 64 <= raw.len() {
            let m = u64::from_le_bytes(masks[i / 8..i / 8 + 8].try_into().unwrap_unchecked());
            let s = _mm512_loadu_si512(sub.as_ptr().add(k) as *const __m512i);
            let x = _mm512_loadu_si512(raw.as_ptr().add(r) as *const __m512i);
            let a = _mm512_mask_expand_epi8(_mm512_maskz_expand_epi8(!m, x), m, s);
            let b = _mm512_loadu_si512(plane1.as_ptr().add(i) as *const __m512i);
            let lo = _mm512_unpacklo_epi8(a, b);
            let hi = _mm512_unpackhi_epi8(a, b);
            let out = dst.as_mut_ptr().add(2 * i) as *mut __m512i;
            _mm512_storeu_si512(out, inv(_mm512_permutex2var_epi64(lo, first, hi)));
            _mm512_storeu_si512(out.add(1), inv(_mm512_permutex2var_epi64(lo, second, hi)));
            let c = m.count_ones() as usize;
            k += c;
            r += 64 - c;
            i += 64;
        }
    }
    (i, k, r)
}

/// The 32-unit steps of [`scatter_merge2`] with AVX2: plane 0's bytes scattered sixteen at a time
/// ([`scatter16`]), interleaved with plane 1's into 16-bit units and the inverse transform applied
/// (as `transform::merge2_wide`'s steps), two 32-byte stores; plane 0 is never stored. Returns
/// where it stopped (unit, coded byte, raw byte). MiniLM bf16 decode, one thread (`phasetime`,
/// fused and separate passes alternating in one process, 40 runs, AVX2-only AMD EPYC,
/// 2026-12-07): medians 34.5 / 34.5 / 31.8 -> 33.3 / 33.3 / 30.7 ms.
///
/// # Safety
/// AVX2 required; `plane1` holds `dst.len() / 2` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn scatter_merge2_avx2<const E: u32>(
    masks: &[u8],
    sub: &[u8],
    raw: &[u8],
    plane1: &[u8],
    dst: &mut [u8],
) -> (usize, usize, usize) {
    use std::arch::x86_64::*;
    let lut = shuffles();
    let n = dst.len() / 2;
    let (mut i, mut k, mut r) = (0, 0, 0);
    // SAFETY: each half reads 16 bytes at sub[k..] and raw[r..], which move by at most 16 from
    // the step's start, so 32 remaining cover both; 32 bytes are read at plane1[i..] and 64
    // written at dst[2i..], 4 mask bytes read at masks[i / 8..], while i + 32 <= n.
    unsafe {
        let inv = |t: __m256i| {
            if E == 0 {
                t
            } else {
                crate::transform::inv16_e8(t)
            }
        };
        while i + 32 <= n && k + 32 <= sub.len() && r + 32 <= raw.len() {
            let (v0, c0) = scatter16(
                lut,
                &masks[i / 8..],
                sub.as_ptr().add(k),
                raw.as_ptr().add(r),
            );
            let (k1, r1) = (k + c0, r + 16 - c0);
            let (v1, c1) = scatter16(
                lut,
                &masks[i / 8 + 2..],
                sub.as_ptr().add(k1),
                raw.as_ptr().add(r1),
            );
            let a = _mm256_set_m128i(v1, v0);
            let b = _mm256_loadu_si256(plane1.as_ptr().add(i) as *const __m256i);
            let lo = _mm256_unpacklo_epi8(a, b);
            let hi = _mm256_unpackhi_epi8(a, b);
            let out = dst.as_mut_ptr().add(2 * i) as *mut __m256i;
            _mm256_storeu_si256(out, inv(_mm256_permute2x128_si256::<0x20>(lo, hi)));
            _mm256_storeu_si256(out.add(1), inv(_mm256_permute2x128_si256::<0x31>(lo, hi)));
            k = k1 + c1;
            r = r1 + 16 - c1;
            i += 32;
        }
    }
    (i, k, r)
}

/// [`scatter`] of a four-byte unit's conditioned plane 2 fused with the merge of the block's four
/// planes into units (`planes`: planes 0, 1 and 3, plane 3 the condition plane): `dst` receives
/// the units (`4 * n` bytes for `n` units) as `transform::merge(t, [p0, p1, plane 2, p3], dst)`
/// would, with plane 2 scattered from `masks`, `sub` and `raw`; `plane2` is scratch of `n` bytes
/// (it holds plane 2 where the fused loop left the rest to the separate passes). With AVX-512
/// VBMI2, 64 units a step go from the expanded bytes straight into the units.
pub fn scatter_merge4(
    t: crate::dtype::Transform,
    (masks, sub, raw): (&[u8], &[u8], &[u8]),
    [p0, p1, p3]: [&[u8]; 3],
    plane2: &mut [u8],
    dst: &mut [u8],
) {
    let n = dst.len() / 4;
    let (mut i, mut k, mut r) = (0, 0, 0);
    #[cfg(target_arch = "x86_64")]
    if let Some(e8) = fused_transform(t).filter(|_| [p0, p1, p3].iter().all(|p| p.len() >= n)) {
        let planes = [&p0[..n], &p1[..n], &p3[..n]];
        if crate::cpu::has_avx512_vbmi2() {
            // SAFETY: AVX-512 F/BW/VBMI2 were checked; the loop reads 64 bytes of `sub`, `raw`
            // and each plane and 8 mask bytes, and writes 256 of `dst`, only while that many
            // remain in each.
            (i, k, r) =
                unsafe { by_transform!(e8, scatter_merge4_avx512(masks, sub, raw, planes, dst)) };
        } else if crate::cpu::has_avx2() {
            // SAFETY: AVX2 was checked; the loop reads 16 bytes of `sub`, `raw` and each plane
            // and 2 mask bytes, and writes 64 of `dst`, only while that many remain in each.
            (i, k, r) =
                unsafe { by_transform!(e8, scatter_merge4_avx2(masks, sub, raw, planes, dst)) };
        }
    }
    scatter(&masks[i / 8..], &sub[k..], &raw[r..], &mut plane2[i..n]);
    crate::transform::merge(
        t,
        &[&p0[i..n], &p1[i..n], &plane2[i..n], &p3[i..n]],
        &mut dst[4 * i..],
    );
}

/// The 16-unit steps of [`scatter_merge4`] with AVX2: plane 2's bytes scattered ([`scatter16`]),
/// the four planes' bytes unpacked into units (`transform::units16`, as `merge4_wide`'s steps) and
/// the inverse transform applied, two 32-byte stores; plane 2 is never stored. Returns where it
/// stopped (unit, coded byte, raw byte). MiniLM fp32 decode, one thread (as [`scatter_merge2_avx2`]'s
/// A/B, 30 runs): medians 33.5 / 33.5 / 34.4 -> 33.0 / 33.1 / 33.2 ms.
///
/// # Safety
/// AVX2 required; every plane holds `dst.len() / 4` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn scatter_merge4_avx2<const E: u32>(
    masks: &[u8],
    sub: &[u8],
    raw: &[u8],
    [p0, p1, p3]: [&[u8]; 3],
    dst: &mut [u8],
) -> (usize, usize, usize) {
    use crate::transform::{inv32_e8, units16};
    use std::arch::x86_64::*;
    let lut = shuffles();
    let n = dst.len() / 4;
    let (mut i, mut k, mut r) = (0, 0, 0);
    // SAFETY: 16 bytes are read at sub[k..], raw[r..] and each plane at [i..] and 64 written at
    // dst[4i..], each only while that many remain; 2 mask bytes at masks[i / 8..] while i + 16 <= n.
    unsafe {
        let inv = |t: __m256i| if E == 0 { t } else { inv32_e8(t) };
        let at = |p: &[u8], i: usize| _mm_loadu_si128(p.as_ptr().add(i) as *const __m128i);
        while i + 16 <= n && k + 16 <= sub.len() && r + 16 <= raw.len() {
            let (c, coded) = scatter16(
                lut,
                &masks[i / 8..],
                sub.as_ptr().add(k),
                raw.as_ptr().add(r),
            );
            let (u01, u23) = units16([at(p0, i), at(p1, i), c, at(p3, i)]);
            let out = dst.as_mut_ptr().add(4 * i) as *mut __m256i;
            _mm256_storeu_si256(out, inv(u01));
            _mm256_storeu_si256(out.add(1), inv(u23));
            k += coded;
            r += 16 - coded;
            i += 16;
        }
    }
    (i, k, r)
}

/// The 64-unit steps of [`scatter_merge4`]: plane 2's bytes expanded under the mask (`vpexpandb`),
/// planes 0 and 1, and planes 2 and 3, paired into 16-bit halves of units in unit order by two-source
/// byte permutes (`vpermt2b`), the halves joined into 32-bit units by two-source word permutes
/// (`vpermt2w`), the inverse transform (`E = 8`: plane 3 is the exponent, moved to bits 30..23, bit
/// 23 the sign; `E = 0`: none), four 64-byte stores. Eight permutes for 64 units, where byte and
/// word unpacks and 128-bit lane shuffles took sixteen on the same port: +0.9% / +1.2% one-thread
/// decode of synthetic / MiniLM fp32 (2026-12-03, six alternating rounds; the loop is not bound
/// by that port). Returns where it stopped (unit, coded byte, raw byte).
///
/// # Safety
/// AVX-512F, AVX-512BW, AVX-512VBMI and AVX-512VBMI2 required; every plane holds `dst.len() / 4`
/// bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vbmi2,popcnt")]
unsafe fn scatter_merge4_avx512<const E: u32>(
    masks: &[u8],
    sub: &[u8],
    raw: &[u8],
    [p0, p1, p3]: [&[u8]; 3],
    dst: &mut [u8],
) -> (usize, usize, usize) {
    use std::arch::x86_64::*;
    let n = dst.len() / 4;
    let (mut i, mut k, mut r) = (0, 0, 0);
    // Byte pairs (x[u], y[u]) of units 0..32 and 32..64 from two 64-byte sources, and 32-bit units
    // (pair01, pair23) of units 0..16 and 16..32 of two registers of pairs.
    let (lo, hi) = (interleave_index(64, 0), interleave_index(64, 32));
    let (q0, q1) = (interleave_index(32, 0), interleave_index(32, 16));
    // SAFETY: 64 bytes are read at sub[k..], raw[r..] and each plane at [i..] and 256 written at
    // dst[4i..], each only while that many remain; 8 mask bytes are read at masks[i / 8..] while
    // i + 64 <= n (masks holds a byte per 8 units); the index tables are 64-byte arrays.
    unsafe {
        let ld = |p: *const u8| _mm512_loadu_si512(p as *const __m512i);
        let (pair_lo, pair_hi) = (ld(lo.as_ptr()), ld(hi.as_ptr()));
        let (unit_lo, unit_hi) = (ld(q0.as_ptr()), ld(q1.as_ptr()));
        let inv = |u: __m512i| {
            if E == 0 {
                u
            } else {
                // Bits 31..24 (the exponent) -> 30..23, bit 23 (the sign) -> 31, 22..0 stay:
                // the exponent from the right shift over the rest, then the sign from the left
                // shift over bit 31 (ternary logic 0xCA: where the first operand's bit is set the
                // second's, elsewhere the third's).
                let t = _mm512_ternarylogic_epi32::<0xCA>(
                    _mm512_set1_epi32(0x7F80_0000),
                    _mm512_srli_epi32::<1>(u),
                    u,
                );
                _mm512_ternarylogic_epi32::<0xCA>(
                    _mm512_set1_epi32(i32::MIN),
                    _mm512_slli_epi32::<8>(u),
                    t,
                )
            }
        };
        let at = |p: &[u8], x: usize| ld(p.as_ptr().add(x));
        while i + 64 <= n && k + 64 <= sub.len() && r + 64 <= raw.len() {
            let m = u64::from_le_bytes(masks[i / 8..i / 8 + 8].try_into().unwrap_unchecked());
            let a =
                _mm512_mask_expand_epi8(_mm512_maskz_expand_epi8(!m, at(raw, r)), m, at(sub, k));
            let (b0, b1, b3) = (at(p0, i), at(p1, i), at(p3, i));
            let lo01 = _mm512_permutex2var_epi8(b0, pair_lo, b1);
            let hi01 = _mm512_permutex2var_epi8(b0, pair_hi, b1);
            let lo23 = _mm512_permutex2var_epi8(a, pair_lo, b3);
            let hi23 = _mm512_permutex2var_epi8(a, pair_hi, b3);
            let out = dst.as_mut_ptr().add(4 * i) as *mut __m512i;
            _mm512_storeu_si512(out, inv(_mm512_permutex2var_epi16(lo01, unit_lo, lo23)));
            _mm512_storeu_si512(
                out.add(1),
                inv(_mm512_permutex2var_epi16(lo01, unit_hi, lo23)),
            );
            _mm512_storeu_si512(
                out.add(2),
                inv(_mm512_permutex2var_epi16(hi01, unit_lo, hi23)),
            );
            _mm512_storeu_si512(
                out.add(3),
                inv(_mm512_permutex2var_epi16(hi01, unit_hi, hi23)),
            );
            let c = m.count_ones() as usize;
            k += c;
            r += 64 - c;
            i += 64;
        }
    }
    (i, k, r)
}

/// The index vector of a two-source permute of `n` elements a register (`vpermt2b`: 64 bytes,
/// `vpermt2w`: 32 words) that interleaves elements `first .. first + n / 2` of its two sources:
/// element `2j` is the first source's `first + j`, element `2j + 1` the second's (index `n + first
/// + j`). As bytes, each element little-endian in `64 / n` bytes.
#[cfg(target_arch = "x86_64")]
fn interleave_index(n: usize, first: usize) -> [u8; 64] {
    let size = 64 / n;
    let mut idx = [0u8; 64];
    for j in 0..n / 2 {
        for (k, v) in [(2 * j, first + j), (2 * j + 1, n + first + j)] {
            idx[k * size..(k + 1) * size].copy_from_slice(&(v as u16).to_le_bytes()[..size]);
        }
    }
    idx
}

/// For each 8-bit mask: `[0..8]` the positions of its set bits packed to the front ("compress"), and
/// `[8..16]` for each position the rank of that bit among the set bits, 0x80 where clear ("expand").
fn shuffles() -> &'static [[u8; 16]; 256] {
    static T: std::sync::OnceLock<Box<[[u8; 16]; 256]>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = Box::new([[0x80u8; 16]; 256]);
        for (m, row) in t.iter_mut().enumerate() {
            let mut k = 0u8;
            for i in 0..8u8 {
                if m & (1 << i) != 0 {
                    row[k as usize] = i;
                    row[8 + i as usize] = k;
                    k += 1;
                }
            }
        }
        t
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn masks_simd(value: u8, cond: &[u8], masks: &mut [u8]) -> (usize, usize) {
    use std::arch::x86_64::*;
    let (mut i, mut t) = (0, 0);
    // SAFETY: 32 bytes are read at cond[i..] with i + 32 <= len; 4 mask bytes are written at
    // masks[i / 8..], inside its len / 8 + 4 bytes.
    unsafe {
        let v = _mm256_set1_epi8(value as i8);
        while i + 32 <= cond.len() {
            let e = _mm256_loadu_si256(cond.as_ptr().add(i) as *const __m256i);
            let m = _mm256_movemask_epi8(_mm256_cmpeq_epi8(e, v)) as u32;
            (masks.as_mut_ptr().add(i / 8) as *mut u32).write_unaligned(m.to_le());
            t += m.count_ones() as usize;
            i += 32;
        }
    }
    (i, t)
}

/// Sixteen units of [`scatter`]'s output (mask bytes `masks[0..2]`): the coded bytes from `sub`
/// and the raw ones from `raw`, one 16-byte load of each, the expansions of the two mask bytes side
/// by side (the second half's ranks moved on by the first half's counts); and how many were coded.
///
/// # Safety
/// AVX2; `masks` holds two bytes, 16 bytes are readable at `sub` and at `raw`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
#[inline]
unsafe fn scatter16(
    lut: &[[u8; 16]; 256],
    masks: &[u8],
    sub: *const u8,
    raw: *const u8,
) -> (std::arch::x86_64::__m128i, usize) {
    use std::arch::x86_64::*;
    let (m0, m1) = (masks[0] as usize, masks[1] as usize);
    let n0 = m0.count_ones() as usize;
    // SAFETY: 16 bytes at `sub` and `raw` (the caller's promise), 16 of a table row.
    unsafe {
        let s = _mm_loadu_si128(sub as *const __m128i);
        let x = _mm_loadu_si128(raw as *const __m128i);
        // `lut[m][8..]` is the expansion of mask m: unpackhi takes it from each row.
        let row = |m: usize| _mm_loadu_si128(lut[m].as_ptr() as *const __m128i);
        let es = _mm_unpackhi_epi64(row(m0), _mm_add_epi8(row(m1), _mm_set1_epi8(n0 as i8)));
        let er = _mm_unpackhi_epi64(
            row(!m0 & 0xFF),
            _mm_add_epi8(row(!m1 & 0xFF), _mm_set1_epi8((8 - n0) as i8)),
        );
        // Clear positions (0x80) stay negative after the addition (0x80 + at most 8), so the
        // shuffle still writes zero there.
        let v = _mm_or_si128(_mm_shuffle_epi8(s, es), _mm_shuffle_epi8(x, er));
        (v, n0 + m1.count_ones() as usize)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn scatter_simd(
    masks: &[u8],
    sub: &[u8],
    raw: &[u8],
    out: &mut [u8],
    from: (usize, usize, usize),
) -> (usize, usize, usize) {
    use std::arch::x86_64::*;
    let lut = shuffles();
    let (mut i, mut k, mut r) = from;
    // SAFETY: 16 (then 8) bytes are read at sub[k..] and raw[r..] and written at out[i..], each only
    // while that many remain; the mask bytes of units i.. exist while i + 16 (8) <= out.len().
    unsafe {
        // Sixteen units a step: one load of each source, the expansions of the two mask bytes side
        // by side (the second half's ranks moved on by the first half's counts). Half the loop's
        // overhead of eight units a step: 0.17 against 0.225 ns per unit alone on the AMD VM of
        // 2026-12-01.
        while i + 16 <= out.len() && k + 16 <= sub.len() && r + 16 <= raw.len() {
            let (v, n) = scatter16(
                lut,
                &masks[i / 8..],
                sub.as_ptr().add(k),
                raw.as_ptr().add(r),
            );
            _mm_storeu_si128(out.as_mut_ptr().add(i) as *mut __m128i, v);
            k += n;
            r += 16 - n;
            i += 16;
        }
        while i + 8 <= out.len() && k + 8 <= sub.len() && r + 8 <= raw.len() {
            let m = masks[i / 8] as usize;
            let s = _mm_loadl_epi64(sub.as_ptr().add(k) as *const __m128i);
            let x = _mm_loadl_epi64(raw.as_ptr().add(r) as *const __m128i);
            let es = _mm_loadl_epi64(lut[m].as_ptr().add(8) as *const __m128i);
            let er = _mm_loadl_epi64(lut[!m & 0xFF].as_ptr().add(8) as *const __m128i);
            let v = _mm_or_si128(_mm_shuffle_epi8(s, es), _mm_shuffle_epi8(x, er));
            _mm_storel_epi64(out.as_mut_ptr().add(i) as *mut __m128i, v);
            let n = m.count_ones() as usize;
            k += n;
            r += 8 - n;
            i += 8;
        }
    }
    (i, k, r)
}

/// [`scatter`] 64 units at a time: the coded and the raw bytes are each expanded (`vpexpandb`)
/// into the positions of their units and merged under the mask. Returns where it stopped (unit,
/// coded byte, raw byte), whole groups of eight units (`i` a multiple of 64).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt")]
unsafe fn scatter_avx512(
    masks: &[u8],
    sub: &[u8],
    raw: &[u8],
    out: &mut [u8],
) -> (usize, usize, usize) {
    use std::arch::x86_64::*;
    let (mut i, mut k, mut r) = (0, 0, 0);
    // SAFETY: 64 bytes are read at sub[k..] and raw[r..] and written at out[i..], each only while
    // 64 remain; 8 mask bytes are read at masks[i / 8..] while i + 64 <= out.len() (masks holds a
    // byte per 8 units).
    unsafe {
        while i + 64 <= out.len() && k + 64 <= sub.len() && r + 64 <= raw.len() {
            let m = u64::from_le_bytes(masks[i / 8..i / 8 + 8].try_into().unwrap_unchecked());
            let s = _mm512_loadu_si512(sub.as_ptr().add(k) as *const __m512i);
            let x = _mm512_loadu_si512(raw.as_ptr().add(r) as *const __m512i);
            let v = _mm512_mask_expand_epi8(_mm512_maskz_expand_epi8(!m, x), m, s);
            _mm512_storeu_si512(out.as_mut_ptr().add(i) as *mut __m512i, v);
            let n = m.count_ones() as usize;
            k += n;
            r += 64 - n;
            i += 64;
        }
    }
    (i, k, r)
}

/// [`split`] 64 units at a time: the coded and the raw bytes each packed (`vpcompressb`) under
/// the mask of the condition bytes equal to `value` (or not), the scalar loop taking the rest.
/// Returns where it stopped (unit, coded byte, raw byte). Against the 8-unit shuffles of
/// [`split_simd`] (2026-12-03, the Intel AVX-512 VM, one thread, the encode pass alternating in
/// one process, 16 rounds): MiniLM bf16 +9%, synthetic bf16 +7%, MiniLM fp32 +4%.
///
/// # Safety
/// AVX-512F, AVX-512BW and AVX-512VBMI2 required; `syms` and `raw` each hold at least
/// `cond.len()` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt")]
unsafe fn split_avx512(
    value: u8,
    cond: &[u8],
    plane: &[u8],
    syms: &mut [u8],
    raw: &mut [u8],
) -> (usize, usize, usize) {
    use std::arch::x86_64::*;
    let (mut i, mut t, mut r) = (0, 0, 0);
    let n = cond.len().min(plane.len());
    // SAFETY: 64 bytes are read at cond[i..] and plane[i..] while i + 64 <= n, and 64 written at
    // syms[t..] and raw[r..] (the packed bytes, then garbage that the next stores or the caller's
    // truncation drop): t + r = i, so t + 64 and r + 64 are at most i + 64 <= n, within outputs
    // of at least n bytes. (The memory form of `vpcompressb` is slow on the CPUs we use.)
    unsafe {
        let v = _mm512_set1_epi8(value as i8);
        while i + 64 <= n {
            let e = _mm512_loadu_si512(cond.as_ptr().add(i) as *const __m512i);
            let x = _mm512_loadu_si512(plane.as_ptr().add(i) as *const __m512i);
            let m = _mm512_cmpeq_epi8_mask(e, v);
            let (a, b) = (
                _mm512_maskz_compress_epi8(m, x),
                _mm512_maskz_compress_epi8(!m, x),
            );
            _mm512_storeu_si512(syms.as_mut_ptr().add(t) as *mut __m512i, a);
            _mm512_storeu_si512(raw.as_mut_ptr().add(r) as *mut __m512i, b);
            let c = m.count_ones() as usize;
            t += c;
            r += 64 - c;
            i += 64;
        }
    }
    (i, t, r)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn split_simd(
    value: u8,
    cond: &[u8],
    plane: &[u8],
    syms: &mut [u8],
    raw: &mut [u8],
) -> (usize, usize, usize) {
    use std::arch::x86_64::*;
    let lut = shuffles();
    let (mut i, mut t, mut r) = (0, 0, 0);
    // SAFETY: 32 bytes are read at cond[i..] with i + 32 <= len and 8 at plane[i + 8g..]; 8-byte
    // stores at syms[t..] and raw[r..] stay within len + 8 (t + r = i).
    unsafe {
        let v = _mm256_set1_epi8(value as i8);
        while i + 32 <= cond.len() {
            let e = _mm256_loadu_si256(cond.as_ptr().add(i) as *const __m256i);
            let m = _mm256_movemask_epi8(_mm256_cmpeq_epi8(e, v)) as u32;
            for g in 0..4 {
                let mg = ((m >> (8 * g)) & 0xFF) as usize;
                let pv = _mm_loadl_epi64(plane.as_ptr().add(i + 8 * g) as *const __m128i);
                let sel = _mm_loadl_epi64(lut[mg].as_ptr() as *const __m128i);
                let rej = _mm_loadl_epi64(lut[!mg & 0xFF].as_ptr() as *const __m128i);
                _mm_storel_epi64(
                    syms.as_mut_ptr().add(t) as *mut __m128i,
                    _mm_shuffle_epi8(pv, sel),
                );
                _mm_storel_epi64(
                    raw.as_mut_ptr().add(r) as *mut __m128i,
                    _mm_shuffle_epi8(pv, rej),
                );
                let n = mg.count_ones() as usize;
                t += n;
                r += 8 - n;
            }
            i += 32;
        }
    }
    (i, t, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_masks_scatter_round_trip() {
        let mut x = 12345u32;
        // Condition bytes equal to the value (123) for a quarter, seven eighths, none or all of
        // the units: every mask pattern of the 8- and 16-unit loops, all-set and all-clear too.
        let picks: [[u8; 8]; 4] = [
            [120, 123, 123, 124, 127, 140, 0, 255],
            [123, 123, 123, 123, 123, 123, 123, 9],
            [1, 2, 3, 4, 5, 6, 7, 8],
            [123; 8],
        ];
        let lens = [
            0usize, 1, 7, 8, 9, 15, 16, 17, 23, 24, 31, 32, 33, 64, 100, 1000, 4096, 4099,
        ];
        for (pick, len) in picks.iter().flat_map(|p| lens.iter().map(move |&l| (p, l))) {
            let cond: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    pick[(x >> 16) as usize % 8]
                })
                .collect();
            let plane: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            let (mut syms, mut raw) = (vec![9u8], vec![7u8]);
            split(123, &cond, &plane, &mut syms, &mut raw);
            assert_eq!(syms[0], 9);
            assert_eq!(raw[0], 7);
            let want: Vec<u8> = cond
                .iter()
                .zip(&plane)
                .filter(|(&e, _)| e == 123)
                .map(|(_, &m)| m)
                .collect();
            assert_eq!(&syms[1..], &want[..]);
            let mut mk = Vec::new();
            assert_eq!(masks(123, &cond, &mut mk), want.len());
            assert_eq!(mk.len(), len.div_ceil(8));
            let mut out = vec![0u8; len];
            scatter(&mk, &syms[1..], &raw[1..], &mut out);
            assert_eq!(out, plane);
            // With spare bytes after both (as the decoder has), the vector loop runs to the end.
            let spare = |v: &[u8]| [v, &[0xEE; 64][..]].concat();
            let mut out = vec![0u8; len];
            scatter(&mk, &spare(&syms[1..]), &spare(&raw[1..]), &mut out);
            assert_eq!(out, plane);
            // Scattered and merged in one pass, as the scatter then the merge: both transforms of
            // two-byte units (the 64-unit loop with spare bytes, the separate passes without).
            for t in [
                crate::dtype::Transform::Identity,
                crate::dtype::Transform::SignBelowExponent { exp_bits: 8 },
            ] {
                // The AVX2 fused steps' units (`w` bytes each, whole steps of `step` units) and
                // the coded and raw bytes they took, against the separate passes' `want`: the
                // units before where they stopped, and with spare bytes every whole step.
                #[cfg(target_arch = "x86_64")]
                let e8 = fused_transform(t) == Some(true);
                #[cfg(target_arch = "x86_64")]
                let avx2_agrees = |w: usize, step: usize, got: &[u8], want: &[u8], at, sub_len| {
                    let (i, k, r): (usize, usize, usize) = at;
                    assert_eq!(
                        got[..w * i],
                        want[..w * i],
                        "{t:?}, {len} units of {w}, AVX2"
                    );
                    let coded = (0..i).filter(|&j| cond[j] == 123).count();
                    assert_eq!(
                        (k, r),
                        (coded, i - coded),
                        "{t:?}, {len} units of {w}, AVX2"
                    );
                    if sub_len >= syms.len() + 63 {
                        assert_eq!(
                            i,
                            len / step * step,
                            "{len} units of {w}, AVX2, spare bytes"
                        );
                    }
                };
                let mut want = vec![0u8; 2 * len];
                crate::transform::merge(t, &[&plane, &cond], &mut want);
                for (sub, raw) in [
                    (syms[1..].to_vec(), raw[1..].to_vec()),
                    (spare(&syms[1..]), spare(&raw[1..])),
                ] {
                    let (mut p0, mut got) = (vec![0u8; len], vec![0u8; 2 * len]);
                    scatter_merge2(t, (&mk, &sub, &raw), &cond, &mut p0, &mut got);
                    assert_eq!(got, want, "{t:?}, {len} units");
                    // The AVX2 steps called directly (where AVX-512 VBMI2 is, `scatter_merge2`
                    // takes its own): whole steps of 32 units, to the last one with spare bytes.
                    #[cfg(target_arch = "x86_64")]
                    if crate::cpu::has_avx2() {
                        let mut got = vec![0u8; 2 * len];
                        // SAFETY: AVX2 was checked; `cond` holds a byte per unit.
                        let at = unsafe {
                            by_transform!(e8, scatter_merge2_avx2(&mk, &sub, &raw, &cond, &mut got))
                        };
                        avx2_agrees(2, 32, &got, &want, at, sub.len());
                    }
                }
                // Four-byte units, plane 2 conditioned on plane 3.
                let lo: Vec<u8> = (0..len).map(|i| (i * 11 % 253) as u8).collect();
                let mid: Vec<u8> = (0..len).map(|i| (i * 29 % 241) as u8 ^ 0x5A).collect();
                let mut want = vec![0u8; 4 * len];
                crate::transform::merge(t, &[&lo, &mid, &plane, &cond], &mut want);
                for (sub, raw) in [
                    (syms[1..].to_vec(), raw[1..].to_vec()),
                    (spare(&syms[1..]), spare(&raw[1..])),
                ] {
                    let (mut p2, mut got) = (vec![0u8; len], vec![0u8; 4 * len]);
                    scatter_merge4(t, (&mk, &sub, &raw), [&lo, &mid, &cond], &mut p2, &mut got);
                    assert_eq!(got, want, "{t:?}, {len} four-byte units");
                    // The AVX2 steps called directly, as above.
                    #[cfg(target_arch = "x86_64")]
                    if crate::cpu::has_avx2() {
                        let mut got = vec![0u8; 4 * len];
                        let planes = [&lo[..], &mid[..], &cond[..]];
                        // SAFETY: AVX2 was checked; every plane holds a byte per unit.
                        let at = unsafe {
                            by_transform!(
                                e8,
                                scatter_merge4_avx2(&mk, &sub, &raw, planes, &mut got)
                            )
                        };
                        avx2_agrees(4, 16, &got, &want, at, sub.len());
                    }
                }
            }
        }
    }
}
