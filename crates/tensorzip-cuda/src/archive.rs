//! Archives (`.tz` files) decoded on the GPU: the same checks as the CPU path (blob checksums before
//! decoding, the CRC-32 of every decoded segment after), with many segments per launch.

use std::io::Write;

use rayon::prelude::*;

use tensorzip::archive::Archive;
use tensorzip::blob::BlobLayout;
use tensorzip::checksum::crc32;

use crate::engine::GpuEngine;
use crate::error::Result;

/// Decoded bytes gathered per launch: bounds host and device memory (plus one segment larger than
/// this, which goes alone).
pub const BATCH_BYTES: u64 = 512 << 20;

/// Decodes every segment of `ar` in order into `w`, batching consecutive segments into launches of
/// up to [`BATCH_BYTES`]. `progress` gets the number of original bytes written so far.
pub fn decode_archive_to<W: Write>(
    eng: &GpuEngine,
    ar: &Archive<'_>,
    w: &mut W,
    progress: &dyn Fn(u64),
) -> Result<()> {
    let n = ar.segments.len();
    let mut i = 0;
    let mut done = 0u64;
    while i < n {
        let mut j = i;
        let mut bytes = 0u64;
        while j < n && (j == i || bytes + ar.segments[j].orig_len <= BATCH_BYTES) {
            bytes += ar.segments[j].orig_len;
            j += 1;
        }
        // Checksums and header-vs-index agreement, before anything is allocated for the batch (the
        // sizes summed above come from the index, which the archive's parser has checked).
        // (All checked in parallel, the first failure in order reported: the same error as a
        // sequential check; the layouts they parse are the ones decoded.)
        let checks: Vec<tensorzip::Result<BlobLayout>> = (i..j)
            .into_par_iter()
            .map(|k| ar.segment_layout(k))
            .collect();
        let layouts = checks.into_iter().collect::<tensorzip::Result<Vec<_>>>()?;
        let blobs: Vec<&[u8]> = (i..j).map(|k| ar.blob(k)).collect();
        let batch = eng.decode_host_parsed(&blobs, &layouts)?;
        for (k, &(_, _, off, len)) in (i..j).zip(&batch.tensors) {
            let bytes = &batch.data[off as usize..(off + len) as usize];
            if crc32(bytes) != ar.segments[k].orig_crc {
                return Err(
                    tensorzip::Error::Checksum(format!("segment {k}: decoded data")).into(),
                );
            }
            w.write_all(bytes)
                .map_err(|e| tensorzip::Error::Io(e.to_string()))?;
            done += len;
            progress(done);
        }
        i = j;
    }
    Ok(())
}

/// The GPU engine as the archive writer's blob encoder: each large tensor is uploaded, encoded on the
/// GPU and the blob downloaded and written; runs of small ones go as one batch (the same bytes as
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
        let blob = self
            .compress_host(data, dtype, shape, opts)
            .map_err(crate::error::Error::into_core)?;
        w.write_all(&blob)
            .map_err(|e| tensorzip::Error::Io(e.to_string()))?;
        progress(data.len() as u64);
        Ok(blob.len() as u64)
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
