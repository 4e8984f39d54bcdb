//! The bit transform and the split of units into byte planes (and back).
//!
//! `split` turns `n` units of `unit_size` bytes into `unit_size` planes of `n` bytes; `merge` is its
//! exact inverse. Each has a plain loop over fixed-width integers (the portable path, and the
//! ends of the wide loops) and, for 2- and 4-byte units, AVX2 shuffle loops chosen at run time.

use crate::dtype::Transform;

/// Forward and inverse transform of a unit of `$bits` bits whose exponent has `e` bits.
macro_rules! sign_below_exponent {
    ($m:ident, $t:ty, $bits:expr) => {
        mod $m {
            #[inline(always)]
            pub(super) fn fwd(u: $t, e: u32) -> $t {
                let mant_bits = $bits - 1 - e;
                let exp_old: $t = (((1 as $t) << e) - 1) << mant_bits;
                let mant: $t = ((1 as $t) << mant_bits) - 1;
                ((u << 1) & (exp_old << 1)) | ((u >> e) & ((1 as $t) << mant_bits)) | (u & mant)
            }
            #[inline(always)]
            pub(super) fn inv(t: $t, e: u32) -> $t {
                let mant_bits = $bits - 1 - e;
                let exp_old: $t = (((1 as $t) << e) - 1) << mant_bits;
                let mant: $t = ((1 as $t) << mant_bits) - 1;
                ((t >> 1) & exp_old) | ((t << e) & ((1 as $t) << ($bits - 1))) | (t & mant)
            }
        }
    };
}

sign_below_exponent!(w16, u16, 16u32);
sign_below_exponent!(w32, u32, 32u32);
sign_below_exponent!(w64, u64, 64u32);

/// The transform of a 2-byte unit with an 8-bit exponent (`E` = 8), or none (`E` = 0): plane 1's
/// byte (the exponent) above plane 0's, as [`split`] would place them.
#[inline(always)]
pub(crate) fn fwd16<const E: u32>(u: u16) -> u16 {
    match E {
        0 => u,
        _ => w16::fwd(u, E),
    }
}

/// [`fwd16`] on sixteen 16-bit lanes.
///
/// # Safety
/// AVX2 required.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
#[inline]
pub(crate) unsafe fn fwd16_wide<const E: u32>(
    u: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    if E == 0 {
        return u;
    }
    // w16::fwd with an 8-bit exponent: bits 14..7 -> 15..8, bit 15 -> 7.
    // SAFETY: register operations only; AVX2 is enabled for this function.
    unsafe {
        fields3(
            _mm256_slli_epi16::<1>(u),
            _mm256_set1_epi16(-0x100), // 0xFF00
            _mm256_srli_epi16::<8>(u),
            _mm256_set1_epi16(0x80),
            u,
            _mm256_set1_epi16(0x7F),
        )
    }
}

/// Transformed value of one unit given as little-endian bytes (test and reference helper).
pub fn transform_unit(t: Transform, unit: &[u8]) -> Vec<u8> {
    let e = match t {
        Transform::Identity => return unit.to_vec(),
        Transform::SignBelowExponent { exp_bits } => exp_bits,
    };
    match unit.len() {
        2 => w16::fwd(u16::from_le_bytes([unit[0], unit[1]]), e)
            .to_le_bytes()
            .to_vec(),
        4 => w32::fwd(u32::from_le_bytes(unit.try_into().unwrap()), e)
            .to_le_bytes()
            .to_vec(),
        8 => w64::fwd(u64::from_le_bytes(unit.try_into().unwrap()), e)
            .to_le_bytes()
            .to_vec(),
        _ => unit.to_vec(),
    }
}

/// Splits `src` (whole units) into `planes.len()` byte planes after the transform.
///
/// Each plane must hold `src.len() / planes.len()` bytes.
pub fn split(t: Transform, src: &[u8], planes: &mut [&mut [u8]]) {
    let us = planes.len();
    debug_assert!(us > 0 && src.len().is_multiple_of(us));
    let n = src.len() / us;
    match (planes, t) {
        ([p0], _) => p0[..n].copy_from_slice(&src[..n]),
        ([p0, p1], Transform::Identity) => split2::<0>(src, &mut p0[..n], &mut p1[..n]),
        ([p0, p1], Transform::SignBelowExponent { exp_bits: 8 }) => {
            split2::<8>(src, &mut p0[..n], &mut p1[..n])
        }
        ([p0, p1, p2, p3], Transform::Identity) => split4::<0>(src, [p0, p1, p2, p3]),
        ([p0, p1, p2, p3], Transform::SignBelowExponent { exp_bits: 8 }) => {
            split4::<8>(src, [p0, p1, p2, p3])
        }
        (planes, t) => {
            let e = match t {
                Transform::Identity => 0,
                Transform::SignBelowExponent { exp_bits } => exp_bits,
            };
            debug_assert_eq!(us, 8);
            for (i, c) in src.chunks_exact(8).enumerate() {
                let mut u = u64::from_le_bytes(c.try_into().unwrap());
                if e != 0 {
                    u = w64::fwd(u, e);
                }
                for (p, plane) in planes.iter_mut().enumerate() {
                    plane[i] = (u >> (8 * p)) as u8;
                }
            }
        }
    }
}

// Monomorphic plain loops (E = exponent bits, 0 = identity).
#[inline(always)]
fn split2_impl<const E: u32>(src: &[u8], p0: &mut [u8], p1: &mut [u8]) {
    let n = p0.len();
    let (src, p1) = (&src[..2 * n], &mut p1[..n]);
    for i in 0..n {
        let mut u = src[2 * i] as u16 | (src[2 * i + 1] as u16) << 8;
        if E != 0 {
            u = w16::fwd(u, E);
        }
        p0[i] = u as u8;
        p1[i] = (u >> 8) as u8;
    }
}

#[inline(always)]
fn split4_impl<const E: u32>(src: &[u8], planes: [&mut &mut [u8]; 4]) {
    let [p0, p1, p2, p3] = planes;
    let n = src.len() / 4;
    let (p0, p1, p2, p3) = (&mut p0[..n], &mut p1[..n], &mut p2[..n], &mut p3[..n]);
    for i in 0..n {
        let mut u =
            u32::from_le_bytes([src[4 * i], src[4 * i + 1], src[4 * i + 2], src[4 * i + 3]]);
        if E != 0 {
            u = w32::fwd(u, E);
        }
        p0[i] = u as u8;
        p1[i] = (u >> 8) as u8;
        p2[i] = (u >> 16) as u8;
        p3[i] = (u >> 24) as u8;
    }
}

#[inline(always)]
fn merge2_impl<const E: u32>(p0: &[u8], p1: &[u8], dst: &mut [u8]) {
    let n = dst.len() / 2;
    let (p0, p1) = (&p0[..n], &p1[..n]);
    for i in 0..n {
        let mut u = p0[i] as u16 | (p1[i] as u16) << 8;
        if E != 0 {
            u = w16::inv(u, E);
        }
        dst[2 * i] = u as u8;
        dst[2 * i + 1] = (u >> 8) as u8;
    }
}

#[inline(always)]
fn merge4_impl<const E: u32>(p: [&[u8]; 4], dst: &mut [u8]) {
    let n = dst.len() / 4;
    let (p0, p1, p2, p3) = (&p[0][..n], &p[1][..n], &p[2][..n], &p[3][..n]);
    for i in 0..n {
        let mut u =
            p0[i] as u32 | (p1[i] as u32) << 8 | (p2[i] as u32) << 16 | (p3[i] as u32) << 24;
        if E != 0 {
            u = w32::inv(u, E);
        }
        dst[4 * i..4 * i + 4].copy_from_slice(&u.to_le_bytes());
    }
}

/// [`split2_impl`], with [`split2_wide`]'s shuffles where the CPU has AVX2.
#[inline(always)]
fn split2<const E: u32>(src: &[u8], p0: &mut [u8], p1: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2() {
        // SAFETY: AVX2 support was checked at run time.
        return unsafe { split2_wide::<E>(src, p0, p1) };
    }
    split2_impl::<E>(src, p0, p1)
}

/// [`split4_impl`], with [`split4_wide`]'s shuffles where the CPU has AVX2.
#[inline(always)]
fn split4<const E: u32>(src: &[u8], planes: [&mut &mut [u8]; 4]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2() {
        // SAFETY: AVX2 support was checked at run time.
        return unsafe { split4_wide::<E>(src, planes) };
    }
    split4_impl::<E>(src, planes)
}

/// `(a & ma) | (b & mb) | (c & mc)`: the three moved bit fields of the forward and inverse
/// transforms in the wide split and merge loops.
///
/// # Safety
/// AVX2 required.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn fields3(
    a: std::arch::x86_64::__m256i,
    ma: std::arch::x86_64::__m256i,
    b: std::arch::x86_64::__m256i,
    mb: std::arch::x86_64::__m256i,
    c: std::arch::x86_64::__m256i,
    mc: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(a, ma), _mm256_and_si256(b, mb)),
        _mm256_and_si256(c, mc),
    )
}

/// `w16::inv` with an 8-bit exponent on sixteen 16-bit units: bits 15..8 (the exponent) -> 14..7,
/// bit 7 (the sign) -> 15, bits 6..0 stay.
///
/// # Safety
/// AVX2 required.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn inv16_e8(t: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 (this function's features).
    unsafe {
        fields3(
            _mm256_srli_epi16::<1>(t),
            _mm256_set1_epi16(0x7F80),
            _mm256_slli_epi16::<8>(t),
            _mm256_set1_epi16(-0x8000),
            t,
            _mm256_set1_epi16(0x7F),
        )
    }
}

/// `w32::inv` with an 8-bit exponent on eight 32-bit units: bits 31..24 (the exponent) -> 30..23,
/// bit 23 (the sign) -> 31, bits 22..0 stay.
///
/// # Safety
/// AVX2 required.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn inv32_e8(t: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 (this function's features).
    unsafe {
        fields3(
            _mm256_srli_epi32::<1>(t),
            _mm256_set1_epi32(0x7F80_0000),
            _mm256_slli_epi32::<8>(t),
            _mm256_set1_epi32(i32::MIN),
            t,
            _mm256_set1_epi32(0x7F_FFFF),
        )
    }
}

/// Sixteen four-byte units from sixteen bytes of each of their planes (plane `k` byte `k` of
/// each unit) by byte then word unpacks: units 0..8 and 8..16.
///
/// # Safety
/// AVX2 required.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn units16(
    [a, b, c, d]: [std::arch::x86_64::__m128i; 4],
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    let ab_lo = _mm_unpacklo_epi8(a, b);
    let ab_hi = _mm_unpackhi_epi8(a, b);
    let cd_lo = _mm_unpacklo_epi8(c, d);
    let cd_hi = _mm_unpackhi_epi8(c, d);
    // Units 0-3, 4-7, 8-11, 12-15 as 32-bit lanes.
    let u0 = _mm_unpacklo_epi16(ab_lo, cd_lo);
    let u1 = _mm_unpackhi_epi16(ab_lo, cd_lo);
    let u2 = _mm_unpacklo_epi16(ab_hi, cd_hi);
    let u3 = _mm_unpackhi_epi16(ab_hi, cd_hi);
    (_mm256_set_m128i(u1, u0), _mm256_set_m128i(u3, u2))
}

/// [`split2_impl`] in steps of 32 units: the transform on 16-bit lanes, then one byte shuffle per
/// 16 units (low bytes to the lane's first half, high bytes to its second) and two lane
/// permutations. Same-run A/B against the compiler's vectorisation of the plain loop (Intel VM,
/// 2026-12-01, `examples/phasetime`, one thread): MiniLM bf16 compress unchanged — the split is
/// where the source is first read, and it waits on those loads.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn split2_wide<const E: u32>(src: &[u8], p0: &mut [u8], p1: &mut [u8]) {
    use std::arch::x86_64::*;
    let n = p0.len();
    let (src, p1) = (&src[..2 * n], &mut p1[..n]);
    let mut i = 0;
    // SAFETY: loads of 64 bytes at src[2i..] and stores of 32 bytes at p0[i..], p1[i..] only while
    // 32 units remain; the prefetches ahead of them only hint (a prefetch never faults).
    unsafe {
        let fwd = |u: __m256i| fwd16_wide::<E>(u);
        let sel = _mm256_setr_epi8(
            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3,
            5, 7, 9, 11, 13, 15,
        );
        let ahead = crate::cpu::split_prefetch_bytes();
        while i + 32 <= n {
            let s = src.as_ptr().add(2 * i) as *const __m256i;
            _mm_prefetch::<_MM_HINT_T0>((s as *const i8).wrapping_add(ahead));
            // Per 128-bit lane: 8 low bytes, then 8 high bytes; then plane 0's 16 bytes in the
            // low half, plane 1's in the high half.
            let a = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(
                fwd(_mm256_loadu_si256(s)),
                sel,
            ));
            let b = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(
                fwd(_mm256_loadu_si256(s.add(1))),
                sel,
            ));
            _mm256_storeu_si256(
                p0.as_mut_ptr().add(i) as *mut __m256i,
                _mm256_permute2x128_si256::<0x20>(a, b),
            );
            _mm256_storeu_si256(
                p1.as_mut_ptr().add(i) as *mut __m256i,
                _mm256_permute2x128_si256::<0x31>(a, b),
            );
            i += 32;
        }
    }
    split2_impl::<E>(&src[2 * i..], &mut p0[i..], &mut p1[i..]);
}

/// [`split4_impl`] in steps of 32 units: the transform on 32-bit lanes, one byte shuffle per 8
/// units (each plane's 4 bytes together in each 128-bit lane), a lane permutation (each plane's 8
/// bytes together), then a 4 x 4 transpose of 64-bit pieces across four such vectors. MiniLM
/// fp32 compress 3-5% faster than with the compiler's loop (same A/B as [`split2_wide`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn split4_wide<const E: u32>(src: &[u8], planes: [&mut &mut [u8]; 4]) {
    use std::arch::x86_64::*;
    let n = src.len() / 4;
    let [q0, q1, q2, q3] = planes;
    let (q0, q1, q2, q3) = (&mut q0[..n], &mut q1[..n], &mut q2[..n], &mut q3[..n]);
    let mut i = 0;
    // SAFETY: loads of 128 bytes at src[4i..] and stores of 32 bytes at each plane[i..] only while
    // 32 units remain; the prefetches ahead of them only hint (a prefetch never faults).
    unsafe {
        let exp = _mm256_set1_epi32(-0x100_0000); // 0xFF00_0000
        let sign = _mm256_set1_epi32(0x80_0000);
        let mant = _mm256_set1_epi32(0x7F_FFFF);
        let fwd = |u: __m256i| {
            if E == 0 {
                u
            } else {
                // w32::fwd with an 8-bit exponent: bits 30..23 -> 31..24, bit 31 -> 23.
                fields3(
                    _mm256_slli_epi32::<1>(u),
                    exp,
                    _mm256_srli_epi32::<8>(u),
                    sign,
                    u,
                    mant,
                )
            }
        };
        let sel = _mm256_setr_epi8(
            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6,
            10, 14, 3, 7, 11, 15,
        );
        let gather = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let s = src.as_ptr() as *const __m256i;
        // 8 units as [plane 0 | plane 1 | plane 2 | plane 3], 8 bytes each.
        let ld = |k: usize| {
            _mm256_permutevar8x32_epi32(
                _mm256_shuffle_epi8(fwd(_mm256_loadu_si256(s.add(k))), sel),
                gather,
            )
        };
        let prefetch = crate::cpu::split_prefetch_bytes();
        while i + 32 <= n {
            let k = i / 8;
            let ahead = (s as *const i8).wrapping_add(4 * i + prefetch);
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            let (a, b, c, d) = (ld(k), ld(k + 1), ld(k + 2), ld(k + 3));
            // [a0 b0 a2 b2], [a1 b1 a3 b3], [c0 d0 c2 d2], [c1 d1 c3 d3] (64-bit pieces).
            let ab02 = _mm256_unpacklo_epi64(a, b);
            let ab13 = _mm256_unpackhi_epi64(a, b);
            let cd02 = _mm256_unpacklo_epi64(c, d);
            let cd13 = _mm256_unpackhi_epi64(c, d);
            let st = |q: &mut [u8], v: __m256i| {
                _mm256_storeu_si256(q.as_mut_ptr().add(i) as *mut __m256i, v)
            };
            st(q0, _mm256_permute2x128_si256::<0x20>(ab02, cd02));
            st(q1, _mm256_permute2x128_si256::<0x20>(ab13, cd13));
            st(q2, _mm256_permute2x128_si256::<0x31>(ab02, cd02));
            st(q3, _mm256_permute2x128_si256::<0x31>(ab13, cd13));
            i += 32;
        }
    }
    split4_impl::<E>(
        &src[4 * i..],
        [
            &mut &mut q0[i..],
            &mut &mut q1[i..],
            &mut &mut q2[i..],
            &mut &mut q3[i..],
        ],
    );
}

/// Orders the non-temporal stores of earlier [`merge_streaming`] calls of this thread before its
/// later stores (a store fence; nothing where no such stores are made).
pub(crate) fn streaming_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` is part of SSE, which every x86_64 CPU has; it only orders stores.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}

/// [`merge`] for output that will not be read again soon (a large tensor: it leaves the caches before
/// anyone reads it): 2- and 4-byte units are written with non-temporal stores where the CPU has
/// AVX2, so that the written lines are not first read from memory. Writing the output was a third
/// of a bf16 decode after the AVX-512 decoder steps; with these stores one thread decodes bf16 ~9%
/// faster on the Intel VM of 2026-12-01 (`examples/hotloop bf16 4096 7 dec`, 1.96-2.00 ->
/// 2.15-2.18 GB/s). Same bytes as [`merge`].
///
/// Non-temporal stores are weakly ordered: the caller must call [`streaming_fence`] after its last
/// `merge_streaming` and before the output is handed to anyone (the decoder does so once per chunk
/// call). One fence per 4096-unit block instead cost a bf16 decode of a 64 MiB tensor on one
/// thread 4-8% (2026-12-03, docs/DESIGN.md, "CPU engine").
pub(crate) fn merge_streaming(t: Transform, planes: &[&[u8]], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2() {
        let e = match t {
            Transform::Identity => 0,
            Transform::SignBelowExponent { exp_bits } => exp_bits,
        };
        // SAFETY: AVX2 support was checked at run time.
        match (planes, e) {
            ([p0, p1], 0) => return unsafe { merge2_wide::<0, true>(p0, p1, dst) },
            ([p0, p1], 8) => return unsafe { merge2_wide::<8, true>(p0, p1, dst) },
            ([p0, p1, p2, p3], 0) => {
                return unsafe { merge4_wide::<0, true>([p0, p1, p2, p3], dst) }
            }
            ([p0, p1, p2, p3], 8) => {
                return unsafe { merge4_wide::<8, true>([p0, p1, p2, p3], dst) }
            }
            _ => {}
        }
    }
    merge(t, planes, dst)
}

/// Units of `unit` bytes written by the scalar loop before a loop of 32-byte aligned stores to `dst`:
/// those before the first aligned unit among the first `32 / unit` (all `n` if none is aligned).
/// Ordinary stores need no alignment: none.
#[cfg(target_arch = "x86_64")]
fn aligned_head<const NT: bool>(dst: &[u8], unit: usize, n: usize) -> usize {
    if !NT {
        return 0;
    }
    (0..n.min(32 / unit))
        .find(|&i| (dst.as_ptr() as usize + unit * i).is_multiple_of(32))
        .unwrap_or(n)
}

/// Stores 32 bytes at `at`: non-temporal with `NT` (`at` 32-byte aligned), else ordinary.
///
/// # Safety
/// AVX2 required; `at` must be 32 writable bytes (32-byte aligned with `NT`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store256<const NT: bool>(
    at: *mut std::arch::x86_64::__m256i,
    v: std::arch::x86_64::__m256i,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's promise.
    unsafe {
        match NT {
            true => _mm256_stream_si256(at, v),
            false => _mm256_storeu_si256(at, v),
        }
    }
}

/// [`merge2_impl`] in 64-byte steps of byte unpacks. With `NT`, the steps are written by
/// non-temporal stores from the first 32-byte aligned unit on (the ends by the scalar loop; the
/// caller fences, [`streaming_fence`]); without, by ordinary stores from the first unit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn merge2_wide<const E: u32, const NT: bool>(p0: &[u8], p1: &[u8], dst: &mut [u8]) {
    use std::arch::x86_64::*;
    let n = dst.len() / 2;
    let (p0, p1) = (&p0[..n], &p1[..n]);
    let head = aligned_head::<NT>(dst, 2, n);
    merge2_impl::<E>(&p0[..head], &p1[..head], &mut dst[..2 * head]);
    let mut i = head;
    // SAFETY: loads of 32 bytes at p0[i..], p1[i..] and stores of 64 bytes at dst[2i..] only while
    // 32 units remain; with `NT` the stores are 32-byte aligned (2i advances by 64 from an aligned
    // start).
    unsafe {
        let inv = |t: __m256i| if E == 0 { t } else { inv16_e8(t) };
        while i + 32 <= n {
            let a = _mm256_loadu_si256(p0.as_ptr().add(i) as *const __m256i);
            let b = _mm256_loadu_si256(p1.as_ptr().add(i) as *const __m256i);
            let lo = _mm256_unpacklo_epi8(a, b);
            let hi = _mm256_unpackhi_epi8(a, b);
            let out = dst.as_mut_ptr().add(2 * i) as *mut __m256i;
            store256::<NT>(out, inv(_mm256_permute2x128_si256::<0x20>(lo, hi)));
            store256::<NT>(out.add(1), inv(_mm256_permute2x128_si256::<0x31>(lo, hi)));
            i += 32;
        }
    }
    merge2_impl::<E>(&p0[i..], &p1[i..], &mut dst[2 * i..]);
}

/// [`merge4_impl`] in 64-byte steps of byte and word unpacks, stored as in [`merge2_wide`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn merge4_wide<const E: u32, const NT: bool>(p: [&[u8]; 4], dst: &mut [u8]) {
    use std::arch::x86_64::*;
    let n = dst.len() / 4;
    let p = [&p[0][..n], &p[1][..n], &p[2][..n], &p[3][..n]];
    let head = aligned_head::<NT>(dst, 4, n);
    let cut = |k: std::ops::Range<usize>| {
        [
            &p[0][k.clone()],
            &p[1][k.clone()],
            &p[2][k.clone()],
            &p[3][k],
        ]
    };
    merge4_impl::<E>(cut(0..head), &mut dst[..4 * head]);
    let mut i = head;
    // SAFETY: loads of 16 bytes at each plane[i..] and stores of 64 bytes at dst[4i..] only while
    // 16 units remain; with `NT` the stores are 32-byte aligned (4i advances by 64 from an aligned
    // start).
    unsafe {
        let inv = |t: __m256i| if E == 0 { t } else { inv32_e8(t) };
        while i + 16 <= n {
            let ld = |k: usize| _mm_loadu_si128(p[k].as_ptr().add(i) as *const __m128i);
            let (u01, u23) = units16([ld(0), ld(1), ld(2), ld(3)]);
            let out = dst.as_mut_ptr().add(4 * i) as *mut __m256i;
            store256::<NT>(out, inv(u01));
            store256::<NT>(out.add(1), inv(u23));
            i += 16;
        }
    }
    merge4_impl::<E>(cut(i..n), &mut dst[4 * i..]);
}

/// Merges byte planes back into units and undoes the transform. Inverse of [`split`]. Panics
/// without planes or where `dst` is not a whole number of units.
pub fn merge(t: Transform, planes: &[&[u8]], dst: &mut [u8]) {
    let us = planes.len();
    assert!(
        us > 0 && dst.len().is_multiple_of(us),
        "merge: {us} planes into {} bytes",
        dst.len()
    );
    let n = dst.len() / us;
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2() {
        // The unpack loops of `merge_streaming` with ordinary stores: the compiler's loops widen
        // each plane's bytes to 32 bits and shift them into place (8 units per step), a quarter
        // of a small fp32 tensor's decode on the Intel VM.
        // SAFETY: AVX2 support was checked at run time.
        match (planes, t) {
            ([p0, p1], Transform::Identity) => {
                return unsafe { merge2_wide::<0, false>(p0, p1, dst) }
            }
            ([p0, p1], Transform::SignBelowExponent { exp_bits: 8 }) => {
                return unsafe { merge2_wide::<8, false>(p0, p1, dst) }
            }
            ([p0, p1, p2, p3], Transform::Identity) => {
                return unsafe { merge4_wide::<0, false>([p0, p1, p2, p3], dst) }
            }
            ([p0, p1, p2, p3], Transform::SignBelowExponent { exp_bits: 8 }) => {
                return unsafe { merge4_wide::<8, false>([p0, p1, p2, p3], dst) }
            }
            _ => {}
        }
    }
    // Without AVX2: the plain loops (the AVX2 paths returned above).
    match (planes, t) {
        ([p0], _) => dst.copy_from_slice(&p0[..n]),
        ([p0, p1], Transform::Identity) => merge2_impl::<0>(p0, p1, dst),
        ([p0, p1], Transform::SignBelowExponent { exp_bits: 8 }) => merge2_impl::<8>(p0, p1, dst),
        ([p0, p1, p2, p3], Transform::Identity) => merge4_impl::<0>([p0, p1, p2, p3], dst),
        ([p0, p1, p2, p3], Transform::SignBelowExponent { exp_bits: 8 }) => {
            merge4_impl::<8>([p0, p1, p2, p3], dst)
        }
        (planes, t) => {
            let e = match t {
                Transform::Identity => 0,
                Transform::SignBelowExponent { exp_bits } => exp_bits,
            };
            debug_assert_eq!(us, 8);
            for (i, c) in dst.chunks_exact_mut(8).enumerate() {
                let mut u = 0u64;
                for (p, plane) in planes.iter().enumerate() {
                    u |= (plane[i] as u64) << (8 * p);
                }
                if e != 0 {
                    u = w64::inv(u, e);
                }
                c.copy_from_slice(&u.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ZipNN 0.5.4's bf16 reordering (`reorder_float_bits_dtype16`, applied to one 16-bit half).
    fn zipnn_bf16(u: u16) -> u16 {
        let u = u as u32;
        (((u >> 8) & 0x80) | ((u << 1) & 0xFF00) | (u & 0x7F)) as u16
    }
    /// ZipNN 0.5.4's fp32 reordering (`reorder_float_bits_dtype32`).
    fn zipnn_f32(u: u32) -> u32 {
        ((u >> 8) & 0x80_0000) | ((u << 1) & 0xFF00_0000) | (u & 0x7F_FFFF)
    }

    #[test]
    fn matches_zipnn_bit_reordering_exactly() {
        for u in 0..=u16::MAX {
            assert_eq!(w16::fwd(u, 8), zipnn_bf16(u));
            assert_eq!(w16::inv(w16::fwd(u, 8), 8), u);
        }
        let mut x = 0x1234_5678u32;
        for _ in 0..100_000 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            assert_eq!(w32::fwd(x, 8), zipnn_f32(x));
            assert_eq!(w32::inv(w32::fwd(x, 8), 8), x);
        }
        for u in [0u32, u32::MAX, 0x8000_0000, 0x7F80_0000, 0x7FC0_0001] {
            assert_eq!(w32::fwd(u, 8), zipnn_f32(u));
        }
    }

    #[test]
    fn f64_transform_puts_exponent_on_top() {
        let v = -1.5f64; // sign 1, biased exponent 1023, mantissa 0x8000000000000
        let t = w64::fwd(v.to_bits(), 11);
        assert_eq!(t >> 53, 1023);
        assert_eq!((t >> 52) & 1, 1);
        assert_eq!(t & ((1 << 52) - 1), 0x8_0000_0000_0000);
        let mut x = 99u64;
        for _ in 0..100_000 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            assert_eq!(w64::inv(w64::fwd(x, 11), 11), x);
        }
    }

    #[test]
    fn streaming_merge_writes_the_same_bytes() {
        let src: Vec<u8> = (0..8 * 1000 + 8).map(|i| (i * 131 + 7) as u8).collect();
        for (us, t) in [
            (2, Transform::Identity),
            (2, Transform::SignBelowExponent { exp_bits: 8 }),
            (4, Transform::Identity),
            (4, Transform::SignBelowExponent { exp_bits: 8 }),
            (8, Transform::SignBelowExponent { exp_bits: 11 }),
            (1, Transform::Identity),
        ] {
            for units in [0usize, 1, 15, 16, 17, 33, 64, 65, 999] {
                let s = &src[..units * us];
                let mut bufs = vec![vec![0u8; units]; us];
                let mut planes: Vec<&mut [u8]> =
                    bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
                split(t, s, &mut planes);
                let views: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
                // Every offset of the output from a 32-byte boundary.
                let mut backing = vec![0u8; units * us + 64];
                for off in 0..32 {
                    let out = &mut backing[off..off + units * us];
                    out.fill(0xAA);
                    merge_streaming(t, &views, out);
                    assert!(
                        out == s,
                        "{us}-byte units, {t:?}, {units} units, offset {off}"
                    );
                }
            }
        }
    }

    #[test]
    fn split_merge_round_trip_all_widths() {
        // Lengths around the SIMD loops' 32-unit steps, from an odd offset (unaligned loads).
        let mut x = 0x2545_F491u32;
        let bytes: Vec<u8> = (0..8 * 301 + 1)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        for units in [0, 1, 31, 32, 33, 37, 64, 95, 300] {
            split_merge_round_trip(&bytes[1..1 + 8 * units]);
        }
    }

    fn split_merge_round_trip(src: &[u8]) {
        for (us, t) in [
            (1, Transform::Identity),
            (2, Transform::Identity),
            (2, Transform::SignBelowExponent { exp_bits: 8 }),
            (4, Transform::Identity),
            (4, Transform::SignBelowExponent { exp_bits: 8 }),
            (8, Transform::Identity),
            (8, Transform::SignBelowExponent { exp_bits: 11 }),
        ] {
            let n = src.len() / us;
            let mut bufs = vec![vec![0u8; n]; us];
            let mut planes: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
            split(t, src, &mut planes);
            for i in 0..n {
                let tu = transform_unit(t, &src[i * us..(i + 1) * us]);
                for p in 0..us {
                    assert_eq!(bufs[p][i], tu[p]);
                }
            }
            let views: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
            let mut back = vec![0u8; src.len()];
            merge(t, &views, &mut back);
            assert_eq!(back, src);
        }
    }
}
