//! Copies between pageable host memory and the device, pipelined through the engine's page-locked
//! staging buffers.
//!
//! Why: a copy from or to ordinary (pageable) host memory goes through the driver's own small
//! staging area, one thread, at ~8-10 GB/s on the H200's host; a page-locked buffer moves at the
//! PCIe limit (~55 GB/s) but is slow to allocate. Here the engine keeps `STAGES` buffers of
//! `STAGE_BYTES`, host threads (rayon) copy each piece between the caller's memory and a buffer,
//! and the DMA of one piece overlaps the host copy of the next.

use std::io::Write;

use cudarc::driver::{result, sys, PinnedHostSlice};
use rayon::prelude::*;

use crate::engine::GpuEngine;
use crate::error::{Error, Result};

/// Bytes per staging buffer.
pub const STAGE_BYTES: usize = 32 << 20;
/// Staging buffers (pieces in flight).
pub const STAGES: usize = 3;
/// Transfers from this size on go through the staging buffers; smaller ones are plain copies (the
/// staging buffers cost ~100 MB of page-locked memory and their allocation, once per process: a
/// loss for a command-line run on a small file, measured 0.17 -> 0.09 GB/s on a 9 MB model).
const STAGED_MIN: usize = 32 << 20;

/// Whether a transfer of `bytes` goes through the staging buffers (see [`STAGED_MIN`]): the one
/// rule for every caller.
pub(crate) fn staged(bytes: u64) -> bool {
    bytes >= STAGED_MIN as u64
}

/// Bytes per host-thread copy task.
const TASK_BYTES: usize = 1 << 20;

/// Per piece of a gathered upload, the CRC state of its bytes copied so far (a piece spans
/// windows, and a window's tasks report in order).
struct PieceCrcs(Vec<Option<crc32fast::Hasher>>);

impl PieceCrcs {
    fn new(pieces: usize) -> PieceCrcs {
        PieceCrcs(vec![None; pieces])
    }

    /// Adds the states [`fill_window`] returned for one window.
    fn add(&mut self, parts: Vec<(usize, crc32fast::Hasher)>) {
        for (k, h) in parts {
            match &mut self.0[k] {
                Some(acc) => acc.combine(&h),
                slot => *slot = Some(h),
            }
        }
    }

    /// Each piece's CRC-32 (that of no bytes for a piece no window held).
    fn finish(self) -> Vec<u32> {
        self.0
            .into_iter()
            .map(|h| h.map_or_else(|| crc32fast::hash(&[]), |h| h.finalize()))
            .collect()
    }
}

/// Bytes of a gathered upload's piece: its index and the bytes.
type Src<'a> = (usize, &'a [u8]);

/// Fills `stage`, the bytes `w0 .. w0 + stage.len()` of a gathered upload, from `pieces` (sorted,
/// disjoint; zeros between them) with all cores. `first` is the first piece that can reach into
/// this window and is advanced past the pieces that end inside it. With `crc`, returns the CRC
/// state of each piece's bytes in the window (piece index, state), in order; else nothing.
fn fill_window(
    stage: &mut [u8],
    w0: u64,
    pieces: &[(&[u8], u64)],
    first: &mut usize,
    crc: bool,
) -> Vec<(usize, crc32fast::Hasher)> {
    let w1 = w0 + stage.len() as u64;
    // The window as consecutive parts, each bytes of a piece (its index and the bytes) or a gap
    // (`None`: `n` zeros).
    let mut parts: Vec<(usize, Option<Src<'_>>)> = Vec::new();
    let mut pos = w0;
    let mut i = *first;
    while i < pieces.len() && pos < w1 {
        let (bytes, at) = pieces[i];
        if at >= w1 {
            break;
        }
        if at > pos {
            parts.push(((at - pos) as usize, None));
            pos = at;
        }
        let pend = at + bytes.len() as u64;
        let upto = pend.min(w1);
        if upto > pos {
            let from = (pos - at) as usize;
            let n = (upto - pos) as usize;
            parts.push((n, Some((i, &bytes[from..from + n]))));
            pos = upto;
        }
        if pend > w1 {
            break;
        }
        i += 1;
    }
    *first = i;
    if pos < w1 {
        parts.push(((w1 - pos) as usize, None));
    }
    // Cut to at most TASK_BYTES, so that a large piece is copied by several threads.
    let mut tasks: Vec<(&mut [u8], Option<Src<'_>>)> = Vec::new();
    let mut rest = stage;
    for (n, src) in parts {
        let mut off = 0;
        while off < n {
            let m = (n - off).min(TASK_BYTES);
            let (head, tail) = rest.split_at_mut(m);
            rest = tail;
            tasks.push((head, src.map(|(k, b)| (k, &b[off..off + m]))));
            off += m;
        }
    }
    tasks
        .into_par_iter()
        .filter_map(|(d, src)| match src {
            Some((k, src)) => {
                d.copy_from_slice(src);
                // Hashed from the copy, which is in this core's cache.
                crc.then(|| {
                    let mut h = crc32fast::Hasher::new();
                    h.update(d);
                    (k, h)
                })
            }
            None => {
                d.fill(0);
                None
            }
        })
        .collect()
}

/// `dst.copy_from_slice(src)` with all cores.
fn par_copy(dst: &mut [u8], src: &[u8]) {
    dst.par_chunks_mut(TASK_BYTES)
        .zip(src.par_chunks(TASK_BYTES))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

impl GpuEngine {
    /// The staging buffers (allocated on first use, kept).
    fn staging(&self) -> Result<std::sync::MutexGuard<'_, Vec<PinnedHostSlice<u8>>>> {
        let mut g = self.lock_buffer(&self.shared().staging)?;
        while g.len() < STAGES {
            // SAFETY: plain bytes; each piece is written before it is read.
            g.push(unsafe { self.context().alloc_pinned_with_flags::<u8>(STAGE_BYTES, 0) }?);
        }
        Ok(g)
    }

    /// Copies host bytes `src` to the device address `dst` on the engine's stream, and waits.
    ///
    /// # Safety
    /// `dst` must be a device address of `src.len()` writable bytes in this engine's context.
    pub unsafe fn upload_to(&self, src: &[u8], dst: u64) -> Result<()> {
        // SAFETY: the one piece covers `dst .. dst + src.len()`, the caller's range.
        unsafe { self.upload_gather(&[(src, 0)], dst) }
    }

    /// Copies host byte strings to the device, `pieces[k] = (bytes, at)` to `dst + at`, and waits:
    /// the device range `dst .. dst + end` (`end` = the last piece's end) is written in
    /// `STAGE_BYTES` windows, each assembled in a staging buffer from the pieces it holds (bytes
    /// between pieces become zeros) by all cores and copied while the next one is assembled. So
    /// many blobs (a model's, from a mapped archive) go up without first being gathered into one
    /// new host buffer — which cost a full copy into fresh memory before a GPU load.
    /// The pieces must be in increasing order of `at` and must not overlap (else `Error::Unsupported`).
    ///
    /// # Safety
    /// `dst .. dst + end` must be writable device memory in this engine's context.
    pub unsafe fn upload_gather(&self, pieces: &[(&[u8], u64)], dst: u64) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.gather(pieces, dst, false) }.map(|_| ())
    }

    /// [`GpuEngine::upload_gather`] that also returns the CRC-32 (zlib's) of each piece, computed
    /// by the threads that copy it, from the bytes they copied: a load that checks blob checksums
    /// reads the blobs once instead of twice (the check was a separate pass over the mapped file
    /// before the upload).
    ///
    /// # Safety
    /// As [`GpuEngine::upload_gather`].
    pub unsafe fn upload_gather_crc(&self, pieces: &[(&[u8], u64)], dst: u64) -> Result<Vec<u32>> {
        // SAFETY: the caller's promise.
        unsafe { self.gather(pieces, dst, true) }
    }

    /// The gathered upload; with `crc`, the pieces' CRC-32s (else an empty vector).
    unsafe fn gather(&self, pieces: &[(&[u8], u64)], dst: u64, crc: bool) -> Result<Vec<u32>> {
        let mut end = 0u64;
        for &(b, at) in pieces {
            end = match at.checked_add(b.len() as u64) {
                Some(e) if at >= end => e,
                _ => {
                    return Err(Error::Unsupported(
                        "upload pieces overlap, are out of order or end past 2^64".into(),
                    ))
                }
            };
        }
        let mut crcs = PieceCrcs::new(if crc { pieces.len() } else { 0 });
        if end == 0 {
            return Ok(crcs.finish());
        }
        let s = self.stream();
        let mut bufs = self.staging()?;
        let mut done: Vec<Option<cudarc::driver::CudaEvent>> = (0..STAGES).map(|_| None).collect();
        // The first piece that may reach into the current window.
        let mut first = 0usize;
        let n_windows = end.div_ceil(STAGE_BYTES as u64) as usize;
        let mut windows = || -> Result<()> {
            for k in 0..n_windows {
                let w0 = (k * STAGE_BYTES) as u64;
                let len = (end - w0).min(STAGE_BYTES as u64) as usize;
                let b = k % STAGES;
                if let Some(e) = done[b].take() {
                    e.synchronize()?;
                }
                let stage = &mut bufs[b].as_mut_slice()?[..len];
                crcs.add(fill_window(stage, w0, pieces, &mut first, crc));
                // SAFETY: `dst + w0 .. + len` lies inside the caller's range; the staging buffer
                // is page-locked and not touched again until this copy's event has completed (or
                // the stream has, below).
                unsafe { result::memcpy_htod_async(dst + w0, &*stage, s.cu_stream())? };
                done[b] = Some(s.record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?);
            }
            Ok(())
        };
        let queued = windows();
        // Also after an error part of the way: copies already queued read the staging buffers,
        // which the next transfer refills, and the caller's `dst` — wait for them first.
        let synced = s.synchronize();
        queued?;
        synced?;
        Ok(crcs.finish())
    }

    /// Copies the device bytes at `src` to host memory `dst` (on the engine's stream; the stream's
    /// earlier work is complete before the bytes are read), and waits.
    ///
    /// # Safety
    /// `src` must be a device address of `dst.len()` readable bytes in this engine's context.
    pub unsafe fn download_from(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        // A new destination faults its pages in as it is filled: 2 MiB at a time where the kernel
        // allows it (see tensorzip::fresh).
        tensorzip::fresh::advise_huge(dst);
        let total = dst.len();
        // SAFETY: the caller's promise, for `total` bytes.
        unsafe {
            self.download_pieces(src, total, |at, piece| {
                par_copy(&mut dst[at..at + piece.len()], piece);
                Ok(())
            })
        }
    }

    /// Writes the `len` device bytes at `src` to `w` (the stream's earlier work is complete before
    /// they are read) straight from the staging buffers: a piece is written while the next ones
    /// are copied from the device, and no host buffer of `len` bytes is made. For the command
    /// line's `--gpu` paths, whose blobs and tensors go to a file: a download into a new buffer
    /// first faulted in `len` bytes of fresh memory and copied them once more before the write.
    /// Small transfers (under the staging threshold) are one plain copy.
    ///
    /// # Safety
    /// `src` must be a device address of `len` readable bytes in this engine's context.
    pub unsafe fn download_to(&self, src: u64, len: u64, w: &mut dyn Write) -> Result<()> {
        let io = |e: std::io::Error| Error::Format(tensorzip::Error::Io(e.to_string()));
        if len == 0 {
            return Ok(());
        }
        if !staged(len) {
            let mut host = vec![0u8; len as usize];
            let s = self.stream();
            // SAFETY: the caller's promise; `host` holds `len` bytes and is not touched until the
            // stream has been synchronised.
            unsafe { result::memcpy_dtoh_async(&mut host, src, s.cu_stream()) }?;
            s.synchronize()?;
            return w.write_all(&host).map_err(io);
        }
        // SAFETY: the caller's promise.
        unsafe {
            self.download_pieces(src, len as usize, |_, piece| w.write_all(piece).map_err(io))
        }
    }

    /// The download loop: the `total` device bytes at `src`, copied in `STAGE_BYTES` pieces into the
    /// staging buffers (up to `STAGES` in flight), handed in order to `take(offset, piece)` as each
    /// one arrives; waits for all.
    ///
    /// # Safety
    /// `src` must be a device address of `total` readable bytes in this engine's context.
    unsafe fn download_pieces(
        &self,
        src: u64,
        total: usize,
        mut take: impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let s = self.stream();
        let mut bufs = self.staging()?;
        let n = total.div_ceil(STAGE_BYTES);
        let len_of = |k: usize| STAGE_BYTES.min(total - k * STAGE_BYTES);
        let mut done: Vec<Option<cudarc::driver::CudaEvent>> = (0..STAGES).map(|_| None).collect();
        let issue = |k: usize,
                     bufs: &mut Vec<PinnedHostSlice<u8>>,
                     done: &mut Vec<Option<cudarc::driver::CudaEvent>>|
         -> Result<()> {
            let b = k % STAGES;
            let stage = bufs[b].as_mut_slice()?;
            // SAFETY: `src + k * STAGE_BYTES` .. + len lies inside the caller's range; the staging
            // buffer is page-locked and read only after this copy's event has completed.
            unsafe {
                result::memcpy_dtoh_async(
                    &mut stage[..len_of(k)],
                    src + (k * STAGE_BYTES) as u64,
                    s.cu_stream(),
                )?;
            }
            done[b] = Some(s.record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?);
            Ok(())
        };
        let mut run = || -> Result<()> {
            for k in 0..n.min(STAGES) {
                issue(k, &mut bufs, &mut done)?;
            }
            for k in 0..n {
                let b = k % STAGES;
                if let Some(e) = done[b].take() {
                    e.synchronize()?;
                }
                let len = len_of(k);
                take(k * STAGE_BYTES, &bufs[b].as_slice()?[..len])?;
                if k + STAGES < n {
                    issue(k + STAGES, &mut bufs, &mut done)?;
                }
            }
            Ok(())
        };
        let r = run();
        if r.is_err() {
            // Copies still in flight write into the staging buffers, which the next transfer
            // fills: none may outlive this call (a failed write, e.g. a full disk, returns early).
            let _ = s.synchronize();
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes `upload_gather` writes to `dst .. dst + end`, assembled one window at a time with
    /// windows of `w` bytes, against the pieces placed into zeros directly.
    fn gathered(pieces: &[(&[u8], u64)], w: usize) -> (Vec<u8>, Vec<u8>) {
        let end = pieces.last().map_or(0, |&(b, at)| at as usize + b.len());
        let mut want = vec![0u8; end];
        for &(b, at) in pieces {
            want[at as usize..at as usize + b.len()].copy_from_slice(b);
        }
        let mut got = vec![0xAAu8; end];
        let mut first = 0;
        let mut crcs = PieceCrcs::new(pieces.len());
        for (k, stage) in got.chunks_mut(w).enumerate() {
            crcs.add(fill_window(stage, (k * w) as u64, pieces, &mut first, true));
        }
        for (&(b, _), c) in pieces.iter().zip(crcs.finish()) {
            assert_eq!(c, crc32fast::hash(b), "CRC of a {}-byte piece", b.len());
        }
        (got, want)
    }

    #[test]
    fn gathered_windows_hold_the_pieces_and_zeros_between() {
        let data: Vec<u8> = (0..3 * TASK_BYTES as u32 + 77)
            .map(|i| (i % 251) as u8 + 1)
            .collect();
        let (a, b, c) = (
            &data[..10],
            &data[10..10 + 2 * TASK_BYTES + 5],
            &data[100..100],
        );
        let cases: Vec<Vec<(&[u8], u64)>> = vec![
            vec![(a, 0)],
            vec![(a, 3), (c, 13), (a, 16), (c, 40)],
            vec![(a, 0), (b, 16), (a, 16 + b.len() as u64 + 5)],
            vec![(c, 0), (b, 1)],
        ];
        for pieces in &cases {
            // Windows that cut pieces anywhere, and one window for everything.
            for w in [1usize, 3, 7, 16, 4096, TASK_BYTES + 3, 4 * TASK_BYTES] {
                let (got, want) = gathered(pieces, w);
                assert!(got == want, "window {w}");
            }
        }
    }
}
