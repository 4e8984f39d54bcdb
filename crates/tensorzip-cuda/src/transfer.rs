//! Copies between pageable host memory and the device, pipelined through the engine's page-locked
//! staging buffers.
//!
//! Why: a copy from or to ordinary (pageable) host memory goes through the driver's own small
//! staging area, one thread, at ~8-10 GB/s on the H200's host; a page-locked buffer moves at the
//! PCIe limit (~55 GB/s) but is slow to allocate. Here the engine keeps `STAGES` buffers of
//! `STAGE_BYTES`, host threads (rayon) copy each piece between the caller's memory and a buffer,
//! and the DMA of one piece overlaps the host copy of the next.

use cudarc::driver::{result, sys, PinnedHostSlice};
use rayon::prelude::*;

use crate::engine::GpuEngine;
use crate::error::{Error, Result};

/// Bytes per staging buffer.
pub const STAGE_BYTES: usize = 32 << 20;
/// Staging buffers (pieces in flight).
pub const STAGES: usize = 3;
/// Bytes per host-thread copy task.
const TASK_BYTES: usize = 1 << 20;

/// `dst.copy_from_slice(src)` with all cores.
fn par_copy(dst: &mut [u8], src: &[u8]) {
    dst.par_chunks_mut(TASK_BYTES)
        .zip(src.par_chunks(TASK_BYTES))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

impl GpuEngine {
    /// The staging buffers (allocated on first use, kept).
    fn staging(&self) -> Result<std::sync::MutexGuard<'_, Vec<PinnedHostSlice<u8>>>> {
        let mut g = self
            .shared()
            .staging
            .lock()
            .map_err(|_| Error::Driver("staging buffers lock poisoned".into()))?;
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
        if src.is_empty() {
            return Ok(());
        }
        let s = self.stream();
        let mut bufs = self.staging()?;
        let mut done: Vec<Option<cudarc::driver::CudaEvent>> = (0..STAGES).map(|_| None).collect();
        for (k, piece) in src.chunks(STAGE_BYTES).enumerate() {
            let b = k % STAGES;
            if let Some(e) = done[b].take() {
                e.synchronize()?;
            }
            let stage = bufs[b].as_mut_slice()?;
            par_copy(&mut stage[..piece.len()], piece);
            // SAFETY: `dst + k * STAGE_BYTES` .. + len lies inside the caller's range; the staging
            // buffer is page-locked and not touched again until this copy's event has completed.
            unsafe {
                result::memcpy_htod_async(
                    dst + (k * STAGE_BYTES) as u64,
                    &stage[..piece.len()],
                    s.cu_stream(),
                )?;
            }
            done[b] = Some(s.record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?);
        }
        s.synchronize()?;
        Ok(())
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
        let s = self.stream();
        let mut bufs = self.staging()?;
        let total = dst.len();
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
        for k in 0..n.min(STAGES) {
            issue(k, &mut bufs, &mut done)?;
        }
        for k in 0..n {
            let b = k % STAGES;
            if let Some(e) = done[b].take() {
                e.synchronize()?;
            }
            let len = len_of(k);
            let at = k * STAGE_BYTES;
            par_copy(&mut dst[at..at + len], &bufs[b].as_slice()?[..len]);
            if k + STAGES < n {
                issue(k + STAGES, &mut bufs, &mut done)?;
            }
        }
        Ok(())
    }
}
