//! CRC-32 on the GPU, equal to `zlib.crc32` (and to the core's `crc32_pieces`).

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::engine::GpuEngine;
use crate::error::Result;

/// Pieces a whole-buffer CRC is split into on the GPU (then combined on the host).
const WHOLE_PIECE: u64 = 64 << 10;

const POLY: u32 = 0xEDB8_8320;

/// One piece of `tz_crc32_list` (layout shared with `struct CrcRange` in encode.cu).
#[repr(C)]
#[derive(Clone, Copy)]
struct CrcRange {
    addr: u64,
    len: u64,
}

// SAFETY: a plain `repr(C)` struct of integers, with the same layout as its CUDA counterpart.
unsafe impl DeviceRepr for CrcRange {}

/// The launch of a CRC kernel over `n` pieces: one warp per piece, 8 warps per block, the grid
/// looping beyond 65535 blocks.
fn crc_launch(n: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(8).min(65535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `a * b mod P` in CRC-32's reflected representation (bit 31 is x^0).
fn multmodp(a: u32, mut b: u32) -> u32 {
    let mut p = 0;
    for k in (0..32).rev() {
        if a >> k & 1 != 0 {
            p ^= b;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    p
}

/// `x^(8 n) mod P`.
fn x8n(mut n: u64) -> u32 {
    let mut sq = 1u32 << 30; // x^1
    let mut p = 1u32 << 31; // x^0
                            // x^(2^k) for k = 0, 1, 2 gives x^8 after three squarings.
    for _ in 0..3 {
        sq = multmodp(sq, sq);
    }
    while n != 0 {
        if n & 1 != 0 {
            p = multmodp(sq, p);
        }
        sq = multmodp(sq, sq);
        n >>= 1;
    }
    p
}

/// The CRC-32 of `a || b` from `crc(a)`, `crc(b)` and `b`'s length (zlib's `crc32_combine`).
pub fn crc32_combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    multmodp(x8n(len_b), crc_a) ^ crc_b
}

impl GpuEngine {
    /// CRC-32 of each `piece` bytes of the `len` bytes at device address `data` (the last piece may
    /// be shorter; none for `len == 0`); `piece == 0` gives one CRC of the whole buffer.
    ///
    /// # Safety
    /// `data` must be a valid device address of `len` readable bytes in this engine's context.
    pub unsafe fn crc32_pieces_device(&self, data: u64, len: u64, piece: u64) -> Result<Vec<u32>> {
        if len == 0 {
            return Ok(if piece == 0 { vec![0] } else { Vec::new() });
        }
        let gpu_piece = if piece == 0 { WHOLE_PIECE } else { piece };
        let n = len.div_ceil(gpu_piece);
        let k = self.encode_kernels()?;
        let s = self.stream();
        let mut out: CudaSlice<u32> = s.alloc_zeros(n as usize)?;
        {
            let mut b = s.launch_builder(&k.crc);
            b.arg(&data).arg(&len).arg(&gpu_piece).arg(&mut out).arg(&n);
            let cfg = crc_launch(n);
            // SAFETY: arguments match `tz_crc32`; it reads `len` bytes at `data` (caller's promise)
            // and writes `n` CRCs into `out`.
            unsafe { b.launch(cfg) }?;
        }
        let crcs = s.clone_dtoh(&out)?;
        if piece != 0 {
            return Ok(crcs);
        }
        let mut whole = 0u32;
        for (i, c) in crcs.iter().enumerate() {
            let plen = gpu_piece.min(len - i as u64 * gpu_piece);
            whole = if i == 0 {
                *c
            } else {
                crc32_combine(whole, *c, plen)
            };
        }
        Ok(vec![whole])
    }

    /// The CRC-32 of each of many device ranges `(address, length)` with one launch, one upload and
    /// one download (a model's tensors after a batch decode: one call instead of one per tensor).
    /// Long ranges are split into pieces, combined on the host.
    ///
    /// # Safety
    /// Every range must be readable device memory of this engine's context, alive until this
    /// returns.
    pub unsafe fn crc32_ranges_device(&self, ranges: &[(u64, u64)]) -> Result<Vec<u32>> {
        let mut pieces = Vec::with_capacity(ranges.len());
        for &(addr, len) in ranges {
            let mut at = 0;
            while at < len {
                let n = WHOLE_PIECE.min(len - at);
                pieces.push(CrcRange {
                    addr: addr + at,
                    len: n,
                });
                at += n;
            }
        }
        if pieces.is_empty() {
            return Ok(vec![0; ranges.len()]);
        }
        let k = self.encode_kernels()?;
        let s = self.stream();
        let descs = s.clone_htod(&pieces)?;
        let mut out: CudaSlice<u32> = s.alloc_zeros(pieces.len())?;
        {
            let n = pieces.len() as u64;
            let mut b = s.launch_builder(&k.crc_list);
            b.arg(&descs).arg(&n).arg(&mut out);
            let cfg = crc_launch(n);
            // SAFETY: arguments match `tz_crc32_list`; it reads the pieces (inside the caller's
            // ranges) and writes one CRC per piece into `out`.
            unsafe { b.launch(cfg) }?;
        }
        let crcs = s.clone_dtoh(&out)?;
        // Every piece but a range's last is WHOLE_PIECE long: its shift is computed once.
        let shift = x8n(WHOLE_PIECE);
        let mut got = crcs.iter();
        Ok(ranges
            .iter()
            .map(|&(_, len)| {
                let mut whole = 0u32;
                let mut at = 0;
                while at < len {
                    let n = WHOLE_PIECE.min(len - at);
                    let c = *got.next().unwrap_or(&0);
                    whole = if at == 0 {
                        c
                    } else if n == WHOLE_PIECE {
                        multmodp(shift, whole) ^ c
                    } else {
                        crc32_combine(whole, c, n)
                    };
                    at += n;
                }
                whole
            })
            .collect())
    }

    /// [`GpuEngine::crc32_pieces_device`] of a device buffer.
    pub fn crc32_pieces_slice(&self, data: &CudaSlice<u8>, piece: u64) -> Result<Vec<u32>> {
        let s = self.stream();
        let (p, _g) = data.device_ptr(s);
        // SAFETY: `data` is a live allocation of this context of `data.len()` bytes.
        unsafe { self.crc32_pieces_device(p, data.len() as u64, piece) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combine_matches_crc_of_concatenation() {
        let a: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        let b: Vec<u8> = (0..777u32).map(|i| (i * 13 + 1) as u8).collect();
        let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
        let (ca, cb) = (crc32fast::hash(&a), crc32fast::hash(&b));
        assert_eq!(
            crc32_combine(ca, cb, b.len() as u64),
            crc32fast::hash(&whole)
        );
        assert_eq!(crc32_combine(ca, crc32fast::hash(&[]), 0), ca);
    }
}
