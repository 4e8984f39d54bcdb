//! Appending bytes past the caches: the encoder's payload of a large tensor is written once and not
//! read again until the blob is written out, by when it has long left the caches. Ordinary stores
//! first read every written line from memory (the CPU owns a line before it changes it); the
//! non-temporal stores here do not, which halves the memory traffic of writing the payload.
//!
//! Non-temporal stores are weakly ordered: a thread that appended with [`extend`] must call
//! [`fence`] before the bytes are handed to anyone (the encoder does so once per chunk).

/// Below this many bytes [`extend`] copies with ordinary stores (the aligned loop's set-up costs
/// more than the lines it spares).
const MIN_STREAMED: usize = 512;

/// Appends `src` to `dst`, with non-temporal 32-byte stores where the CPU has AVX2 (from the first
/// 32-byte aligned byte on; the ends by ordinary copies). The same bytes as
/// `dst.extend_from_slice(src)`; the caller fences ([`fence`]) before the bytes are read by another
/// thread.
pub fn extend(dst: &mut Vec<u8>, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if src.len() >= MIN_STREAMED && crate::cpu::has_avx2() {
        dst.reserve(src.len());
        let start = dst.len();
        // SAFETY: AVX2 support was checked at run time; `reserve` left `src.len()` writable bytes
        // after `start`, which `extend_avx2` writes in full before the length is set.
        unsafe {
            extend_avx2(dst.as_mut_ptr().add(start), src);
            dst.set_len(start + src.len());
        }
        return;
    }
    dst.extend_from_slice(src);
}

/// Writes `src` into `dst` (of the same length) as [`extend`] appends it; the caller fences.
pub fn copy(dst: &mut [std::mem::MaybeUninit<u8>], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "streaming::copy needs equal lengths");
    let dp = dst.as_mut_ptr().cast::<u8>();
    #[cfg(target_arch = "x86_64")]
    if src.len() >= MIN_STREAMED && crate::cpu::has_avx2() {
        // SAFETY: AVX2 support was checked at run time; `dst` is `src.len()` writable bytes
        // (MaybeUninit<u8> has u8's layout) that cannot overlap the shared borrow `src`.
        unsafe { extend_avx2(dp, src) };
        return;
    }
    // SAFETY: as above, without the vector stores.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dp, src.len()) };
}

/// Orders this thread's earlier non-temporal stores ([`extend`]) before its later stores.
pub fn fence() {
    crate::transform::streaming_fence();
}

/// Writes `src` to `dst`: the bytes before the first 32-byte aligned address and the last partial
/// 32 bytes by `copy_nonoverlapping`, the rest by `vmovntdq`.
///
/// # Safety
/// AVX2 required; `dst` must be valid for `src.len()` bytes of writes and not overlap `src`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn extend_avx2(dst: *mut u8, src: &[u8]) {
    use std::arch::x86_64::*;
    let n = src.len();
    let head = (dst as usize).wrapping_neg() % 32;
    let head = head.min(n);
    // SAFETY: `head <= n` bytes into a `dst` valid for `n`; the loop's loads and aligned stores
    // stay below `n` (`i + 32 <= n`) and the tail copies the `n - i` bytes left.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
        let mut i = head;
        while i + 32 <= n {
            let v = _mm256_loadu_si256(src.as_ptr().add(i) as *const __m256i);
            _mm256_stream_si256(dst.add(i) as *mut __m256i, v);
            i += 32;
        }
        std::ptr::copy_nonoverlapping(src.as_ptr().add(i), dst.add(i), n - i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extend_and_copy_write_the_same_bytes_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
        for pre in 0..40 {
            for len in [0, 1, 31, 511, 512, 513, 1000, 2047, 3000] {
                let mut dst: Vec<u8> = (0..pre).map(|i| i as u8 ^ 0x5a).collect();
                let mut want = dst.clone();
                extend(&mut dst, &src[..len]);
                fence();
                want.extend_from_slice(&src[..len]);
                assert_eq!(dst, want, "pre {pre} len {len}");
                let mut buf = vec![0x77u8; pre + len + 3];
                let mut into: Vec<std::mem::MaybeUninit<u8>> =
                    vec![std::mem::MaybeUninit::new(0x77); pre + len + 3];
                copy(&mut into[pre..pre + len], &src[..len]);
                fence();
                // SAFETY: every element was initialised (by `vec!`, then by `copy`).
                let got: Vec<u8> = into.iter().map(|b| unsafe { b.assume_init() }).collect();
                buf[pre..pre + len].copy_from_slice(&src[..len]);
                assert_eq!(got, buf, "copy: pre {pre} len {len}");
            }
        }
    }
}
