//! Archives (`.tz` files) decoded on the GPU: the same checks as the CPU path (blob checksums before
//! decoding, the CRC-32 of every decoded segment after), with many segments per launch.

use std::io::Write;

use cudarc::driver::DevicePtrMut;
use rayon::prelude::*;

use tensorzip::archive::Archive;
use tensorzip::blob::BlobLayout;

use crate::engine::GpuEngine;
use crate::error::Result;

/// Decoded bytes gathered per launch: bounds host and device memory (plus one segment larger than
/// this, which goes alone).
pub const BATCH_BYTES: u64 = 512 << 20;

/// Most segments per launch. Device memory per tensor does not shrink with its bytes (the
/// encoder's table slots, ~90 KiB a tensor at the default 8 tables; the decoder's 16 KiB
/// expansion of each table): 512 MiB of 4 KiB tensors made 131,072 of them in one batch, ~11 GiB
/// of encoder slots (a review's finding, 2026-12-05). 4096 keeps that under ~0.4 GiB and leaves
/// a model's shard (hundreds of tensors; MiniLM's 104) in one launch.
pub const BATCH_SEGMENTS: usize = 4096;

/// Decodes every segment of `ar` in order into `w`, batching consecutive segments into launches of
/// up to [`BATCH_BYTES`]. Each batch's blobs are checked as they are uploaded, the decoded bytes'
/// CRC-32s on the GPU ([`Segments::decode_into`]), and the bytes go from the device to `w` through
/// the staging buffers ([`GpuEngine::download_to`]: no host copy of a batch). `progress` gets the
/// number of original bytes written so far.
pub fn decode_archive_to<W: Write>(
    eng: &GpuEngine,
    ar: &Archive<'_>,
    w: &mut W,
    progress: &dyn Fn(u64),
) -> Result<()> {
    decode_batches(eng, ar, Some(w), progress)
}

/// Decodes every segment of `ar` on the GPU and checks it (each blob's checksums, then the decoded
/// bytes' CRC-32 on the GPU) without bringing anything back to the host: `verify --gpu`.
/// `progress` gets the number of original bytes checked so far.
pub fn check_archive(eng: &GpuEngine, ar: &Archive<'_>, progress: &dyn Fn(u64)) -> Result<()> {
    decode_batches(eng, ar, None, progress)
}

/// [`decode_archive_to`] with `w`, [`check_archive`] without.
fn decode_batches(
    eng: &GpuEngine,
    ar: &Archive<'_>,
    mut w: Option<&mut dyn Write>,
    progress: &dyn Fn(u64),
) -> Result<()> {
    let lens: Vec<u64> = ar.segments.iter().map(|s| s.orig_len).collect();
    let mut done = 0u64;
    for run in batches(&lens) {
        let segs: Vec<usize> = run.collect();
        // Parsed (and, with piece checksums, checked) before anything is allocated for the batch.
        let batch = Segments::parse(ar, &segs)?;
        let mut outs = Vec::with_capacity(segs.len());
        let mut out_len = 0u64;
        for k in 0..segs.len() {
            outs.push(out_len);
            out_len += batch.nbytes(k).div_ceil(16) * 16;
        }
        let s = eng.stream();
        let mut dev_out = s.alloc_zeros::<u8>(out_len.max(1) as usize)?;
        let (base, _g) = dev_out.device_ptr_mut(s);
        let outs: Vec<u64> = outs.iter().map(|o| base + o).collect();
        // SAFETY: each output lies inside `dev_out` (sized above for every segment's decoded
        // length, 16-byte aligned, disjoint), which outlives the call.
        unsafe { batch.decode_into(eng, &outs)? };
        for (k, &o) in outs.iter().enumerate() {
            let len = batch.nbytes(k);
            if let Some(w) = w.as_deref_mut() {
                // SAFETY: `o .. o + len` lies inside `dev_out`, decoded above.
                unsafe { eng.download_to(o, len, w)? };
            }
            done += len;
            progress(done);
        }
    }
    Ok(())
}

/// Consecutive runs of items of `lens` bytes, each of at most [`BATCH_BYTES`] (an item larger
/// than that is a run of its own) and [`BATCH_SEGMENTS`] items: the GPU's batches of an archive's
/// segments, decoded or encoded together.
pub fn batches(lens: &[u64]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < lens.len() {
        let mut j = i;
        let mut bytes = 0u64;
        while j < lens.len()
            && (j == i || (bytes + lens[j] <= BATCH_BYTES && j - i < BATCH_SEGMENTS))
        {
            bytes += lens[j];
            j += 1;
        }
        runs.push(i..j);
        i = j;
    }
    runs
}

/// Segments of an archive to be decoded on the GPU together: their blobs parsed (checked against
/// the index; with one checksum per blob the checksums are taken by the upload, else here), then
/// [`Segments::decode_into`] device memory in one launch. The command line's `decompress --gpu`
/// and the Python package's `load_file(device="cuda")` both go through it.
pub struct Segments<'a> {
    ar: &'a Archive<'a>,
    segs: Vec<usize>,
    layouts: Vec<BlobLayout>,
    /// The blobs' stored CRC-32s when the archive keeps one per blob (checked on upload).
    stored: Option<Vec<u32>>,
}

impl<'a> Segments<'a> {
    /// Parses segments `segs` of `ar` (all cores; the first failure in order is reported).
    pub fn parse(ar: &'a Archive<'a>, segs: &[usize]) -> Result<Segments<'a>> {
        if let Some(&i) = segs.iter().find(|&&i| i >= ar.segments.len()) {
            return Err(tensorzip::Error::InvalidInput(format!(
                "segment {i} of {}",
                ar.segments.len()
            ))
            .into());
        }
        let stored: Option<Vec<u32>> = segs.iter().map(|&i| ar.whole_blob_crc(i)).collect();
        let whole = stored.is_some();
        let parsed: Vec<tensorzip::Result<BlobLayout>> = segs
            .par_iter()
            .map(|&i| {
                if whole {
                    ar.segment_layout_unverified(i)
                } else {
                    ar.segment_layout(i)
                }
            })
            .collect();
        let layouts = parsed.into_iter().collect::<tensorzip::Result<Vec<_>>>()?;
        Ok(Segments {
            ar,
            segs: segs.to_vec(),
            layouts,
            stored,
        })
    }

    /// The decoded length of the `k`-th segment (its tensor's bytes, as the index says).
    pub fn nbytes(&self, k: usize) -> u64 {
        self.layouts[k].header.nbytes()
    }

    /// Uploads the blobs (16-byte aligned in one device buffer, straight from the archive's bytes:
    /// no gathered host copy), compares their checksums, decodes the `k`-th segment to `outs[k]`
    /// in one launch and checks each decoded segment's CRC-32 on the GPU; waits.
    ///
    /// # Safety
    /// Each `outs[k]` must be `self.nbytes(k)` writable bytes of device memory in `eng`'s context,
    /// alive until this returns; outputs must not overlap.
    pub unsafe fn decode_into(&self, eng: &GpuEngine, outs: &[u64]) -> Result<()> {
        if outs.len() != self.segs.len() {
            return Err(tensorzip::Error::InvalidInput(format!(
                "{} outputs for {} segments",
                outs.len(),
                self.segs.len()
            ))
            .into());
        }
        let trace = eng.tracer(format!("gpu decode of {} segments", self.segs.len()));
        let ar = self.ar;
        let mut placed = Vec::with_capacity(self.segs.len());
        let mut len = 0u64;
        for &i in &self.segs {
            len = len.next_multiple_of(16);
            placed.push(len);
            len += ar.blob(i).len() as u64;
        }
        let pieces: Vec<(&[u8], u64)> = self
            .segs
            .iter()
            .zip(&placed)
            .map(|(&i, &at)| (ar.blob(i), at))
            .collect();
        let s = eng.stream();
        // SAFETY: plain bytes, all written by the upload below before the decoder reads them.
        let mut dev = unsafe { s.alloc::<u8>(len.max(1) as usize) }?;
        let base = dev.device_ptr_mut(s).0;
        trace("buffer");
        if let Some(stored) = &self.stored {
            // SAFETY: `dev` holds `len` bytes, the end of the last piece.
            let crcs = unsafe { eng.upload_gather_crc(&pieces, base) }?;
            for ((&i, &c), &want) in self.segs.iter().zip(&crcs).zip(stored) {
                if c != want {
                    return Err(
                        tensorzip::Error::Checksum(format!("segment {i}: blob piece 0")).into(),
                    );
                }
            }
        } else {
            // SAFETY: as above.
            unsafe { eng.upload_gather(&pieces, base) }?;
        }
        trace("uploaded");
        let jobs: Vec<(&BlobLayout, u64, u64)> = self
            .layouts
            .iter()
            .zip(&placed)
            .zip(outs)
            .map(|((l, &at), &o)| (l, base + at, o))
            .collect();
        // SAFETY: each blob lies at its offset in `dev` (uploaded above, parsed from the same
        // bytes); the outputs are the caller's.
        unsafe { eng.decode_device(&jobs) }?;
        trace("decoded");
        let ranges: Vec<(u64, u64)> = outs
            .iter()
            .enumerate()
            .map(|(k, &o)| (o, self.nbytes(k)))
            .collect();
        // SAFETY: each output holds `nbytes` decoded bytes.
        let crcs = unsafe { eng.crc32_ranges_device(&ranges) }?;
        trace("checked");
        for (&i, crc) in self.segs.iter().zip(&crcs) {
            ar.check_decoded(i, *crc)?;
        }
        drop(dev);
        Ok(())
    }
}

/// The GPU engine as the archive writer's blob encoder: each large tensor is uploaded, encoded on the
/// GPU and the blob written to the file as it is downloaded; runs of small ones go as one batch (the same bytes as
/// the CPU engine's either way).
impl tensorzip::archive::BlobEncoder for GpuEngine {
    fn encode_blob(
        &self,
        data: &[u8],
        dtype: tensorzip::DType,
        shape: &[u64],
        opts: &tensorzip::CompressOptions,
        w: &mut dyn tensorzip::archive::SeekWrite,
        progress: &(dyn Fn(u64) + Sync),
    ) -> tensorzip::Result<u64> {
        // The blob goes from the device to the file piece by piece (no host copy of it).
        let len = self
            .compress_host_to(data, dtype, shape, opts, w)
            .map_err(crate::error::Error::into_core)?;
        progress(data.len() as u64);
        Ok(len)
    }

    /// A run of small tensors in one batch on the GPU: one upload, one encode, one download.
    fn encode_blobs(
        &self,
        items: &[tensorzip::archive::BlobItem<'_>],
        opts: &tensorzip::CompressOptions,
    ) -> tensorzip::Result<Vec<Vec<u8>>> {
        self.compress_host_batch(items, opts)
            .map_err(crate::error::Error::into_core)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batches cover every item once, in order; none passes `BATCH_BYTES` unless it is a single
    /// item, nor `BATCH_SEGMENTS` items; and each takes as many items as fit (the next one would
    /// not).
    #[test]
    fn batches_cover_everything_in_order_within_the_limit() {
        let b = BATCH_BYTES;
        let cases: Vec<Vec<u64>> = vec![
            vec![],
            vec![0],
            vec![b],
            vec![b + 1, 1],
            vec![1, b, 1],
            vec![b / 2, b / 2, b / 2, 0, 0],
            vec![3 * b, 0, 7, b - 7, 1],
            (0..1000).map(|i| (i * 7919) % (b / 37)).collect(),
            vec![0; 3 * BATCH_SEGMENTS + 5],
            vec![4096; 2 * BATCH_SEGMENTS],
        ];
        for lens in &cases {
            let runs = batches(lens);
            let mut next = 0;
            for r in &runs {
                assert_eq!(r.start, next, "{lens:?}");
                assert!(r.end > r.start, "{lens:?}");
                let sum: u64 = lens[r.clone()].iter().sum();
                assert!(sum <= b || r.len() == 1, "{lens:?}: {r:?}");
                assert!(r.len() <= BATCH_SEGMENTS, "{r:?}");
                if r.end < lens.len() {
                    assert!(
                        sum + lens[r.end] > b || r.len() == BATCH_SEGMENTS,
                        "{r:?} could take the next"
                    );
                }
                next = r.end;
            }
            assert_eq!(next, lens.len(), "{lens:?}");
        }
    }
}
