//! The CPU engine: whole-tensor compress and decompress, multi-threaded over chunks with rayon.

use std::io::{Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use crate::blob::ChunkEntry;
use crate::blob::{BlobHeader, Scheme};
use crate::decoder::{with_scratch, with_scratch_pair, TensorDecoder};
use crate::dtype::DType;
use crate::encoder::{self, stored_header, TensorEncoder};
use crate::error::{Error, Result};
use crate::options::CompressOptions;
use crate::pieces;

/// A decoded tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

/// The CPU engine. `threads == 0` uses rayon's global pool (all cores); any other count gets a pool
/// of its own. Output bytes never depend on the thread count.
#[derive(Default)]
pub struct CpuEngine {
    pool: Option<rayon::ThreadPool>,
    /// Payload buffers kept from one call to the next (at most 40 MiB of capacity, about a
    /// batch): `compress_to`'s chunk payloads and the in-memory compress's pieces (runs of a
    /// blob's chunks coded by several threads, [`pieces::code_pieces`]). Fresh pages cost more
    /// to touch than the coding of a chunk (`clear_page` was 10% of a repeated 32 MiB bf16
    /// compress on the 2-core VM).
    payloads: std::sync::Mutex<Vec<Vec<u8>>>,
}

/// `lead` if `items` has that many tensors, else an error.
fn lead_of(items: usize, lead: usize) -> Result<usize> {
    match lead <= items {
        true => Ok(lead),
        false => Err(Error::InvalidInput(format!(
            "{lead} leading tensors of {items}"
        ))),
    }
}

/// An error unless there are as many output buffers as inputs (`what`: the inputs' name).
fn one_buffer_each(inputs: usize, outs: usize, what: &str) -> Result<()> {
    if inputs == outs {
        return Ok(());
    }
    Err(Error::InvalidInput(format!(
        "{inputs} {what} and {outs} output buffers"
    )))
}

impl CpuEngine {
    /// An engine on `threads` threads (0 = all cores).
    pub fn new(threads: usize) -> Result<Self> {
        if threads == 0 {
            return Ok(CpuEngine::default());
        }
        if threads > MAX_THREADS {
            return Err(Error::InvalidOption(format!(
                "{threads} threads: at most {MAX_THREADS}"
            )));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tensorzip-{i}"))
            .build()
            .map_err(|e| Error::InvalidOption(format!("cannot start {threads} threads: {e}")))?;
        Ok(CpuEngine {
            pool: Some(pool),
            ..Default::default()
        })
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.pool
            .as_ref()
            .map_or_else(rayon::current_num_threads, |p| p.current_num_threads())
    }

    pub(crate) fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    /// Compresses the bytes of a tensor (row-major, little-endian) into a blob.
    pub fn compress(
        &self,
        data: &[u8],
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
    ) -> Result<Vec<u8>> {
        // A blob is at most a stored blob (data plus a header); reserving that once avoids
        // regrowing, and pages never written cost nothing. A small tensor's blob is then cut to
        // its length: the spare 64 KiB was ~45 times a 1.5 KiB blob, kept as long as the blob
        // (the Python package hands this vector to torch without a copy).
        let mut out = crate::fresh::with_capacity(data.len() + 64 * 1024);
        self.compress_into(data, dtype, shape, opts, &mut out)?;
        if out.capacity() - out.len() > crate::archive::SMALL_BLOB_SLACK as usize
            && out.len() < 1 << 20
        {
            out.shrink_to_fit();
        }
        Ok(out)
    }

    /// Like [`CpuEngine::compress`], but replaces the contents of `out`, reusing its memory.
    pub fn compress_into(
        &self,
        data: &[u8],
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        self.run(|| self.compress_in_place(data, dtype, shape, opts, out))
    }

    /// Compresses several tensors (`(bytes, dtype, shape)`) concurrently, blob `i` replacing the
    /// contents of `outs[i]` (as [`CpuEngine::compress_into`], reusing its memory). A model's
    /// small tensors have a few chunks each and a table search that is mostly sequential, so one
    /// at a time they leave cores idle (MiniLM fp32 on 2 cores: 1.3x one core). Coded side by
    /// side, each tensor's chunks go straight into its blob while every thread is busy; a thread
    /// that runs out of tensors takes pieces of the others' (`pieces::code_pieces`).
    pub fn compress_many_into(
        &self,
        items: &[crate::archive::BlobItem<'_>],
        opts: &CompressOptions,
        outs: &mut [Vec<u8>],
    ) -> Result<()> {
        one_buffer_each(items.len(), outs.len(), "tensors")?;
        self.run(|| self.code_many(items, opts, outs))
    }

    /// [`CpuEngine::compress_many_into`] on a thread of the pool, `outs` as many as `items`.
    fn code_many(
        &self,
        items: &[crate::archive::BlobItem<'_>],
        opts: &CompressOptions,
        outs: &mut [Vec<u8>],
    ) -> Result<()> {
        items
            .par_iter()
            .zip(outs.par_iter_mut())
            .try_for_each(|(&(data, dtype, shape), out)| {
                self.compress_in_place(data, dtype, shape, opts, out)
            })
    }

    /// Compresses tensors, blob `i` replacing the contents of `outs[i]` (the bytes of
    /// [`CpuEngine::compress_into`]): the first `lead` tensors (a model's small ones) are coded
    /// together, as [`CpuEngine::compress_many_into`] does, while the model of tensor `lead` is
    /// built beside them; the tensors from `lead` on are coded one after the other, the model of
    /// each built while the one before it is coded. A tensor's model (sampling and table search)
    /// scales worse over threads than its coding, and a large tensor's is milliseconds: on its
    /// own it left a thread idle at the start of every large tensor.
    pub fn compress_seq_into(
        &self,
        items: &[crate::archive::BlobItem<'_>],
        lead: usize,
        opts: &CompressOptions,
        outs: &mut [Vec<u8>],
    ) -> Result<()> {
        one_buffer_each(items.len(), outs.len(), "tensors")?;
        let (small, seq) = items.split_at(lead_of(items.len(), lead)?);
        let (small_outs, seq_outs) = outs.split_at_mut(small.len());
        // `k` runs over the sequence's items, of which there are as many as its buffers.
        self.in_sequence(
            seq,
            opts,
            || self.code_many(small, opts, small_outs),
            |k, enc, _| self.code_in_place(enc, opts, &mut seq_outs[k]),
        )?;
        Ok(())
    }

    /// On the pool: `lead()` beside the model of item 0, then `code(k, encoder of item k, lead's
    /// result)` for the items in order, the model of item `k + 1` built beside each; stops at the
    /// first error.
    fn in_sequence<'a, L: Send, R: Send>(
        &self,
        items: &[crate::archive::BlobItem<'a>],
        opts: &CompressOptions,
        lead: impl FnOnce() -> Result<L> + Send,
        mut code: impl FnMut(usize, TensorEncoder<'a>, &mut L) -> Result<R> + Send,
    ) -> Result<(L, Vec<R>)> {
        let model = |k: usize| {
            items
                .get(k)
                .map(|&(data, dtype, shape)| TensorEncoder::new(data, dtype, shape, opts))
        };
        self.run(|| {
            let mut done = Vec::with_capacity(items.len());
            let (led, mut next) = rayon::join(lead, || model(0));
            let mut led = led?;
            while let Some(enc) = next.take() {
                let (k, enc) = (done.len(), enc?);
                let (r, n) = rayon::join(|| code(k, enc, &mut led), || model(k + 1));
                done.push(r?);
                next = n;
            }
            Ok((led, done))
        })
    }

    /// Decompresses a blob into a new buffer.
    pub fn decompress(&self, blob: &[u8]) -> Result<Tensor> {
        let dec = TensorDecoder::new(blob)?;
        let h = dec.header().clone();
        // The size is the blob's claim (up to ~1.7 million times the blob's own, for constant
        // chunks): a refused allocation is an error, not an abort.
        let mut data = crate::fresh::try_zeroed(h.nbytes())?;
        self.decode_all(&dec, &mut data, false)?;
        Ok(Tensor {
            dtype: h.dtype,
            shape: h.shape,
            data,
        })
    }

    /// Decompresses a blob into `out`, which must hold exactly the tensor's bytes.
    pub fn decompress_into(&self, blob: &[u8], out: &mut [u8]) -> Result<BlobHeader> {
        let dec = TensorDecoder::new(blob)?;
        self.decode_all(&dec, out, false)?;
        Ok(dec.header().clone())
    }

    /// [`CpuEngine::decompress_into`], returning the CRC-32 of the decoded bytes (equal to
    /// `zlib.crc32(out)`), taken as they are decoded instead of in a pass over `out` afterwards.
    pub fn decompress_into_crc(&self, blob: &[u8], out: &mut [u8]) -> Result<u32> {
        let dec = TensorDecoder::new(blob)?;
        self.decode_all(&dec, out, true)
            .map(|c| c.expect("a checksum was asked for"))
    }

    /// Decompresses several blobs concurrently, blob `i` into `outs[i]` (which must hold exactly its
    /// tensor's bytes), as [`CpuEngine::decompress_into`]; a model's small tensors have a chunk or
    /// two each, too few to keep every core busy one tensor at a time. The first failing blob in
    /// order gives the error ([`CpuEngine::decompress_each_into`] tells which); once a blob has
    /// failed, the blobs after it are not decoded (their buffers hold what they held, or part of
    /// their tensor), while those before it still are, since one of them may fail first.
    pub fn decompress_many_into<O: AsMut<[u8]> + Send>(
        &self,
        blobs: &[&[u8]],
        outs: &mut [O],
    ) -> Result<()> {
        one_buffer_each(blobs.len(), outs.len(), "blobs")?;
        // The lowest index of a failed blob so far: a task past it has nothing to tell.
        let first_bad = AtomicUsize::new(usize::MAX);
        let results: Vec<Option<Result<BlobHeader>>> = self.run(|| {
            blobs
                .par_iter()
                .zip(outs.par_iter_mut())
                .enumerate()
                .map(|(k, (b, out))| {
                    if k > first_bad.load(Ordering::Relaxed) {
                        return None;
                    }
                    let r = self.decompress_into(b, out.as_mut());
                    if r.is_err() {
                        first_bad.fetch_min(k, Ordering::Relaxed);
                    }
                    Some(r)
                })
                .collect()
        });
        // Every blob before the lowest failed index was decoded (a skip needs a failure before
        // it), so the first error in order is the first failing blob's.
        results
            .into_iter()
            .flatten()
            .try_for_each(|r| r.map(|_| ()))
    }

    /// [`CpuEngine::decompress_many_into`] with each blob's outcome, in order: every blob is
    /// decoded (or fails) on its own. `Err` only where `outs` is not one buffer a blob.
    pub fn decompress_each_into<O: AsMut<[u8]> + Send>(
        &self,
        blobs: &[&[u8]],
        outs: &mut [O],
    ) -> Result<Vec<Result<BlobHeader>>> {
        one_buffer_each(blobs.len(), outs.len(), "blobs")?;
        Ok(self.run(|| {
            blobs
                .par_iter()
                .zip(outs.par_iter_mut())
                .map(|(b, out)| self.decompress_into(b, out.as_mut()))
                .collect()
        }))
    }

    /// Decompresses several blobs concurrently into new buffers (as [`CpuEngine::decompress`]).
    pub fn decompress_many(&self, blobs: &[&[u8]]) -> Result<Vec<Tensor>> {
        self.run(|| blobs.par_iter().map(|b| self.decompress(b)).collect())
    }

    /// Decodes the whole tensor into `out` (exactly its bytes), and with `crc` returns the CRC-32
    /// of the decoded bytes.
    fn decode_all(
        &self,
        dec: &TensorDecoder<'_>,
        out: &mut [u8],
        crc: bool,
    ) -> Result<Option<u32>> {
        let h = dec.header();
        if out.len() as u64 != h.nbytes() {
            return Err(Error::OutputSize {
                expected: h.nbytes() as usize,
                got: out.len(),
            });
        }
        match h.scheme {
            Scheme::Stored => {
                out.copy_from_slice(dec.view().stored_data());
                Ok(crc.then(|| self.run(|| crate::checksum::crc32(out))))
            }
            Scheme::Planes => self.decode_chunks_par_crc(dec, 0, out, crc),
        }
    }

    /// Decodes chunks `first..` into `out` (their bytes back to back) in parallel, a chunk per task.
    fn decode_chunks_par(
        &self,
        dec: &TensorDecoder<'_>,
        first: usize,
        out: &mut [u8],
    ) -> Result<()> {
        self.decode_chunks_par_crc(dec, first, out, false)
            .map(|_| ())
    }

    /// [`CpuEngine::decode_chunks_par`], and with `crc` the CRC-32 of the decoded bytes, each
    /// task's piece hashed right after it is decoded (while it is in cache; a pass over the whole
    /// output afterwards read it back from memory) and the pieces' CRCs combined in order.
    fn decode_chunks_par_crc(
        &self,
        dec: &TensorDecoder<'_>,
        first: usize,
        out: &mut [u8],
        crc: bool,
    ) -> Result<Option<u32>> {
        let h = dec.header();
        let cb = h.chunk_units as usize * h.planes();
        let n = out.len().div_ceil(cb);
        let hash = |o: &[u8]| {
            crc.then(|| {
                let mut h = crc32fast::Hasher::new();
                h.update(o);
                h
            })
        };
        let single = |(i, o): (usize, &mut [u8])| {
            with_scratch(|s| dec.decode_chunk(first + i, o, s))?;
            Ok::<_, Error>(hash(o))
        };
        // Chunks in pairs, their streams decoded in one loop (`decode_chunk_pair`), where the CPU
        // has AVX-512 (elsewhere the pair loop is not used: `simd_rounds_pair`). One core of the
        // Intel VM of 2026-12-01 (`examples/hotloop ... dec`): bf16 1.39-1.43 -> 1.79-1.86 GB/s,
        // fp32 2.19-2.24 -> 2.62-2.70, fp16 1.41-1.52 -> 1.89-1.97.
        let pair = |(i, o): (usize, &mut [u8])| {
            let c = first + 2 * i;
            if o.len() <= cb {
                with_scratch(|s| dec.decode_chunk(c, o, s))?;
            } else {
                let (oa, ob) = o.split_at_mut(cb);
                with_scratch_pair(|sa, sb| dec.decode_chunk_pair(c, oa, ob, sa, sb))?;
            }
            Ok::<_, Error>(hash(o))
        };
        let avx512 = crate::cpu::has_avx512();
        type Pieces = Result<Vec<Option<crc32fast::Hasher>>>;
        let pieces: Pieces = if n <= 1 || self.threads() == 1 {
            // One task, or one worker: decoded on the calling thread, without the hand-off to
            // the pool and back (two thread switches: ~80 us on this VM, more than decoding a
            // 128 KiB chunk takes; a 1.5 KiB tensor decompressed in 77-87 us, now 2).
            match avx512 {
                true => out.chunks_mut(2 * cb).enumerate().map(pair).collect(),
                false => out.chunks_mut(cb).enumerate().map(single).collect(),
            }
        } else {
            self.run(|| {
                // Pairs only where pairing leaves no worker idle.
                if !avx512 || n.div_ceil(2) < rayon::current_num_threads() {
                    return out.par_chunks_mut(cb).enumerate().map(single).collect();
                }
                out.par_chunks_mut(2 * cb).enumerate().map(pair).collect()
            })
        };
        let pieces = pieces?;
        Ok(crc.then(|| {
            let mut all = crc32fast::Hasher::new();
            for p in pieces.iter().flatten() {
                all.combine(p);
            }
            all.finalize()
        }))
    }

    /// Decodes elements `start..end` (row-major order) into `out` (exactly their bytes), touching only
    /// the chunks that hold them.
    pub fn decompress_range_into(
        &self,
        blob: &[u8],
        start: u64,
        end: u64,
        out: &mut [u8],
    ) -> Result<BlobHeader> {
        let dec = TensorDecoder::new(blob)?;
        let h = dec.header().clone();
        let numel = h.numel();
        if start > end || end > numel {
            return Err(Error::Range { start, end, numel });
        }
        let isz = h.dtype.itemsize() as u64;
        let expected = ((end - start) * isz) as usize;
        if out.len() != expected {
            return Err(Error::OutputSize {
                expected,
                got: out.len(),
            });
        }
        if start == end {
            return Ok(h);
        }
        let (b0, b1) = ((start * isz) as usize, (end * isz) as usize);
        if h.scheme == Scheme::Stored {
            out.copy_from_slice(&dec.view().stored_data()[b0..b1]);
            return Ok(h);
        }
        let cb = h.chunk_units as usize * h.planes();
        // The chunks wholly inside the range are decoded as a whole tensor's are (in pairs where
        // the CPU has AVX-512, in parallel: `decode_chunks_par`); a chunk cut by either end of
        // the range is decoded into a buffer and its part copied. Before 2026-12-04 every chunk
        // was a task of its own, without the pair loop.
        let nbytes = h.nbytes() as usize;
        let chunk_end = |c: usize| ((c + 1) * cb).min(nbytes);
        let whole = |c: usize| b0 <= c * cb && chunk_end(c) <= b1;
        let (c0, c1) = (b0 / cb, (b1 - 1) / cb);
        let head_cut = !whole(c0);
        let tail_cut = c1 != c0 && !whole(c1);
        // Whole chunks `w0..w1`, contiguous between the cut ones.
        let (w0, w1) = (c0 + head_cut as usize, c1 + 1 - tail_cut as usize);
        let head_len = if head_cut {
            chunk_end(c0).min(b1) - b0
        } else {
            0
        };
        let mid_len = if w1 > w0 {
            chunk_end(w1 - 1) - w0 * cb
        } else {
            0
        };
        let (head, rest) = out.split_at_mut(head_len);
        let (mid, tail) = rest.split_at_mut(mid_len);
        // The cut chunks: (chunk, its part of the output, where that part starts in the chunk).
        let mut cut: Vec<(usize, &mut [u8], usize)> = Vec::with_capacity(2);
        if head_cut {
            cut.push((c0, head, b0 - c0 * cb));
        }
        if tail_cut {
            cut.push((c1, tail, 0));
        }
        let part = |(c, piece, lo): (usize, &mut [u8], usize)| -> Result<()> {
            let mut tmp = vec![0u8; h.chunk_len(c as u64) * h.planes()];
            with_scratch(|s| dec.decode_chunk(c, &mut tmp, s))?;
            piece.copy_from_slice(&tmp[lo..lo + piece.len()]);
            Ok(())
        };
        let middle = |mid: &mut [u8]| match mid.is_empty() {
            true => Ok(()),
            false => self.decode_chunks_par(&dec, w0, mid),
        };
        self.run(|| {
            let (a, b) = rayon::join(|| cut.into_par_iter().try_for_each(part), || middle(mid));
            a.and(b)
        })?;
        Ok(h)
    }
}

/// The most worker threads an engine starts. Far more than any machine's cores; what it stops is a
/// typo such as `--threads 100000`, whose thread creation ran out of memory maps and panicked
/// inside a new thread (std's stack guard setup) instead of failing cleanly.
pub const MAX_THREADS: usize = 1024;

/// Bytes of original data handled per batch by the streaming paths (bounds their memory).
pub const STREAM_BATCH_BYTES: usize = 32 << 20;

/// A batch of chunks coded by [`CpuEngine::stream_blob`], waiting to be written.
struct CodedBatch {
    entries: Vec<ChunkEntry>,
    payloads: Vec<Vec<u8>>,
    chunks: std::ops::Range<usize>,
}

/// Writes a coded batch of `compress_to`: the chunks' directory entries to `dir`, their payloads
/// to `w`. Returns the payload bytes written.
fn write_batch<W: Write>(
    planes: usize,
    entries: &[ChunkEntry],
    bufs: &[Vec<u8>],
    dir: &mut Vec<u8>,
    w: &mut W,
) -> Result<u64> {
    for e in entries {
        e.write(planes, dir);
    }
    // Vectored writes of about WRITE_GROUP_BYTES: a buffered writer hands them straight to the
    // file instead of copying each ~100 KiB payload into its buffer first.
    let mut slices: Vec<std::io::IoSlice<'_>> = Vec::new();
    let mut n = 0;
    for (i, b) in bufs.iter().enumerate() {
        slices.push(std::io::IoSlice::new(b));
        n += b.len();
        if n >= WRITE_GROUP_BYTES || i + 1 == bufs.len() {
            write_all_vectored(w, &mut slices).map_err(|e| Error::Io(e.to_string()))?;
            slices.clear();
            n = 0;
        }
    }
    Ok(bufs.iter().map(|b| b.len() as u64).sum())
}

/// Payload bytes per vectored write of [`write_batch`]. `tensorzip compress` of 256 MiB fp32 on two
/// threads (2026-12-04, Intel VM, eight alternating rounds): the copy into the `BufWriter` was 10%
/// of its samples; 1 MiB groups written past it (with the sequence of large tensors, against the
/// build before both) took the median from 0.316 to 0.307 s, while one writev of a whole batch
/// (~16 MiB) was slower (0.37-0.69 s: a long write syscall stalls).
const WRITE_GROUP_BYTES: usize = 1 << 20;

/// `Write::write_all` for several buffers (the standard library's is not stable).
fn write_all_vectored<W: Write>(
    w: &mut W,
    mut slices: &mut [std::io::IoSlice<'_>],
) -> std::io::Result<()> {
    std::io::IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => std::io::IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Trims the engine's pool of payload buffers to what is kept for the next call: at most a
/// streaming batch's worth of capacity.
fn keep_some(pool: &mut Vec<Vec<u8>>) {
    let mut kept = 0usize;
    pool.retain(|b| {
        kept += b.capacity();
        kept <= STREAM_BATCH_BYTES + STREAM_BATCH_BYTES / 4
    });
}

impl CpuEngine {
    /// The in-memory compress (runs inside the pool): on one thread, or for a blob of fewer than
    /// two pieces, the blob's chunks are coded one after the other straight into `out`, after the
    /// prefix and the space for the directory; otherwise the pool's threads code pieces of it and
    /// place them in order ([`pieces::code_pieces`]). On one thread nothing is copied:
    /// [`CpuEngine::compress_to`]'s per-chunk payload buffers, written into the blob after each
    /// batch, made a one-thread compress 12-20% slower (2026-12-03, the Intel VM: MiniLM bf16 /
    /// fp32, synthetic bf16). The same bytes as [`CpuEngine::compress_to`].
    fn compress_in_place(
        &self,
        data: &[u8],
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let enc = TensorEncoder::new(data, dtype, shape, opts)?;
        self.code_in_place(enc, opts, out)
    }

    /// The coding step of [`CpuEngine::compress_in_place`], for an encoder whose model is built.
    fn code_in_place(
        &self,
        mut enc: TensorEncoder<'_>,
        opts: &CompressOptions,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        out.clear();
        let n = enc.n_chunks() as usize;
        let piece_chunks = (pieces::PIECE_BYTES / opts.chunk_bytes).max(1);
        let in_pieces = rayon::current_num_threads() > 1 && n >= 2 * piece_chunks;
        let streaming = enc.streaming();
        // Pieces are coded into buffers that must stay in the cache until they are placed: the
        // placing copy writes past the caches instead.
        enc.set_streaming(streaming && !in_pieces);
        let (h, data) = (enc.header(), enc.data());
        let write_stored = |out: &mut Vec<u8>| {
            out.clear();
            stored_header(h.dtype, &h.shape).write(out);
            out.extend_from_slice(data);
        };
        if h.scheme == Scheme::Stored {
            write_stored(out);
            return Ok(());
        }
        enc.write_prefix(out);
        let (dir_pos, dir_len) = (out.len(), n * h.dir_entry_len());
        let stored_len = stored_header(h.dtype, &h.shape).encoded_len() + data.len();
        // Tiny chunks (`chunk_bytes` 8 gives a directory of 1.25-3 times the data): when the
        // header, tables and directory alone reach a stored blob's length the blob is stored
        // whatever its payloads, so neither the directory nor the chunks are made.
        if dir_pos + dir_len >= stored_len {
            write_stored(out);
            return Ok(());
        }
        out.resize(dir_pos + dir_len, 0);
        // Codes chunks `from..to` into `buf` and their directory entries into `dir`; stops early
        // once `buf` reaches the stored blob's length (the blob will be stored: the directory
        // then lacks entries).
        let code = |from: usize, to: usize, buf: &mut Vec<u8>, dir: &mut Vec<u8>| {
            encoder::with_scratch(|s| {
                for c in from..to {
                    enc.encode_chunk_append(c as u64, s, buf)
                        .write(h.planes(), dir);
                    if buf.len() >= stored_len {
                        break;
                    }
                }
            })
        };
        let mut dir = Vec::with_capacity(dir_len);
        if !in_pieces {
            code(0, n, out, &mut dir);
        } else {
            pieces::code_pieces(
                out,
                &mut dir,
                (n, piece_chunks),
                stored_len,
                data.len(),
                streaming,
                &self.payloads,
                &code,
            );
            keep_some(&mut self.payloads.lock().unwrap_or_else(|e| e.into_inner()));
        }
        if out.len() >= stored_len || dir.len() != dir_len {
            write_stored(out);
            return Ok(());
        }
        out[dir_pos..dir_pos + dir_len].copy_from_slice(&dir);
        Ok(())
    }

    /// Chunks of `chunk_bytes` per batch of the streaming calls: [`STREAM_BATCH_BYTES`] of them,
    /// or more to give every thread two, but never past twice that many bytes (so with the
    /// largest chunks, 16 MiB, or many threads, fewer threads are busy: two batches of 16 MiB
    /// chunks for 8 threads held 900 MiB before this bound, 2026-12-05 review).
    fn batch_chunks(&self, chunk_bytes: usize) -> usize {
        let cb = chunk_bytes.max(1);
        (2 * self.threads())
            .min(2 * STREAM_BATCH_BYTES / cb)
            .max(STREAM_BATCH_BYTES / cb)
            .max(1)
    }

    /// Compresses a tensor straight into `w` (at its current position) with bounded memory: chunks are
    /// coded in batches of half [`STREAM_BATCH_BYTES`], each written while the next is coded; the
    /// directory is written last, in the space reserved for it. Writes the same bytes as
    /// [`CpuEngine::compress`] and returns the blob's length. `progress` receives the number of
    /// original bytes handled so far.
    ///
    /// If the coded blob is not smaller than a stored one, the stored blob is written over it; the
    /// caller truncates the file after its last write.
    pub fn compress_to<W: Write + Seek + Send>(
        &self,
        data: &[u8],
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
        w: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<u64> {
        // The whole call runs in the pool: the `run`s inside are then plain calls. Handing each
        // step to the pool apart cost two thread switches per step, which dominated small tensors
        // (a 1.5 KiB fp32 tensor: ~330 us per compress with one thread, most of it in the
        // scheduler).
        self.run(|| self.compress_to_in_pool(data, dtype, shape, opts, w, progress))
    }

    /// [`CpuEngine::compress_to`], on a thread of the engine's pool.
    fn compress_to_in_pool<W: Write + Seek + Send>(
        &self,
        data: &[u8],
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
        w: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<u64> {
        let enc = TensorEncoder::new(data, dtype, shape, opts)?;
        self.stream_blob(enc, w, progress, None)
    }

    /// Compresses tensors one after the other into `w` (each blob where the one before it ends,
    /// with the bytes of [`CpuEngine::compress_to`]) and returns each blob's length and the CRC-32
    /// of the tensor's original bytes; `progress` receives a tensor's index and the original bytes
    /// of it handled so far. As in [`CpuEngine::compress_seq_into`], the first `lead` tensors are
    /// coded together (into memory, then written) while the model of tensor `lead` is built, and
    /// the model of each later tensor is built while the one before it is coded.
    ///
    /// A large tensor's checksum is taken batch by batch as its coded batches are written (the
    /// batch's bytes were just read by the coders), not in a pass of its own before: the archive
    /// writer took the checksums of a whole run of tensors before coding it, which read the run
    /// twice and had all of a mapped file's run in memory at once (`mapped::Spent` gives pages back
    /// once coded).
    pub fn compress_seq_to<W: Write + Seek + Send>(
        &self,
        items: &[crate::archive::BlobItem<'_>],
        lead: usize,
        opts: &CompressOptions,
        w: &mut W,
        progress: &(dyn Fn(usize, u64) + Sync),
    ) -> Result<Vec<(u64, u32)>> {
        let (small, seq) = items.split_at(lead_of(items.len(), lead)?);
        let n_small = small.len();
        // The lead's blobs and checksums, written into `w` before the first tensor of the
        // sequence (or at the end if there is none), with their lengths.
        type Lead = Option<(Vec<Vec<u8>>, Vec<u32>)>;
        let write_lead = |led: &mut Lead, w: &mut W| -> Result<Vec<(u64, u32)>> {
            let mut out = Vec::new();
            if let Some((blobs, crcs)) = led.take() {
                for (k, (blob, crc)) in blobs.into_iter().zip(crcs).enumerate() {
                    w.write_all(&blob).map_err(|e| Error::Io(e.to_string()))?;
                    out.push((blob.len() as u64, crc));
                    progress(k, small[k].0.len() as u64);
                }
            }
            Ok(out)
        };
        let mut done = Vec::with_capacity(items.len());
        let (mut rest, seq_done) = self.in_sequence(
            seq,
            opts,
            || {
                let mut blobs: Vec<Vec<u8>> = small
                    .iter()
                    .map(|i| {
                        crate::fresh::with_capacity(
                            i.0.len() + crate::archive::SMALL_BLOB_SLACK as usize,
                        )
                    })
                    .collect();
                self.code_many(small, opts, &mut blobs)?;
                let crcs = small.iter().map(|i| crate::checksum::crc32(i.0)).collect();
                Ok(Some((blobs, crcs)))
            },
            |k, enc, led| {
                done.extend(write_lead(led, w)?);
                let mut crc = crc32fast::Hasher::new();
                let len =
                    self.stream_blob(enc, w, &|d| progress(n_small + k, d), Some(&mut crc))?;
                Ok((len, crc.finalize()))
            },
        )?;
        done.extend(write_lead(&mut rest, w)?);
        done.extend(seq_done);
        Ok(done)
    }

    /// Writes the blob of an encoder whose model is built into `w` at its current position,
    /// leaving `w` at the blob's end (see [`CpuEngine::compress_to`]); on a pool thread. With
    /// `crc`, the tensor's bytes are added to it as they are written: a coded batch's once it is
    /// coded, beside its write.
    fn stream_blob<W: Write + Seek + Send>(
        &self,
        enc: TensorEncoder<'_>,
        w: &mut W,
        progress: &(dyn Fn(u64) + Sync),
        mut crc: Option<&mut crc32fast::Hasher>,
    ) -> Result<u64> {
        let io = |e: std::io::Error| Error::Io(e.to_string());
        let start = w.stream_position().map_err(io)?;
        let (h, data) = (enc.header(), enc.data());
        let write_stored = |w: &mut W| -> Result<u64> {
            w.seek(SeekFrom::Start(start)).map_err(io)?;
            let mut head = Vec::new();
            stored_header(h.dtype, &h.shape).write(&mut head);
            w.write_all(&head).map_err(io)?;
            for piece in data.chunks(STREAM_BATCH_BYTES) {
                w.write_all(piece).map_err(io)?;
            }
            progress(data.len() as u64);
            Ok((head.len() + data.len()) as u64)
        };
        if h.scheme == Scheme::Stored {
            if let Some(crc) = crc {
                crc.update(data);
            }
            return write_stored(w);
        }
        let mut prefix = Vec::new();
        enc.write_prefix(&mut prefix);
        let n = h.n_chunks() as usize;
        let entry_len = h.dir_entry_len();
        let stored_len = (stored_header(h.dtype, &h.shape).encoded_len() + data.len()) as u64;
        // As in `compress_into`: a prefix and directory that reach a stored blob's length make the
        // blob stored before any chunk is coded (and before the directory is held in memory).
        if (prefix.len() + n * entry_len) as u64 >= stored_len {
            if let Some(crc) = crc {
                crc.update(data);
            }
            return write_stored(w);
        }
        w.write_all(&prefix).map_err(io)?;
        let dir_pos = start + prefix.len() as u64;
        w.seek(SeekFrom::Current((n * entry_len) as i64))
            .map_err(io)?;
        let chunk_bytes = h.chunk_units as usize * h.planes();
        // Two batches are in memory at once (one written, one coded): each is half the streaming
        // batch, so memory stays as it was when batches were coded and written in turn.
        let batch = self.batch_chunks(2 * chunk_bytes);
        let mut dir = Vec::with_capacity(n * entry_len);
        let mut total = (prefix.len() + n * entry_len) as u64;
        // Payload buffers are reused from batch to batch and from call to call (fresh memory is
        // slow to touch). A call running concurrently on the same engine starts with none.
        let mut pool: Vec<Vec<u8>> =
            std::mem::take(&mut *self.payloads.lock().unwrap_or_else(|e| e.into_inner()));
        // The coded batch waiting to be written.
        let mut pending: Option<CodedBatch> = None;
        // The tensor's bytes of `chunks`.
        let bytes_of = |chunks: &std::ops::Range<usize>| {
            let len = data.len();
            &data[(chunks.start * chunk_bytes).min(len)..(chunks.end * chunk_bytes).min(len)]
        };
        let mut c0 = 0;
        // The last step only writes the last batch (its batch of chunks is empty).
        while c0 < n || pending.is_some() {
            let c1 = (c0 + batch).min(n);
            let mut bufs: Vec<Vec<u8>> = (c0..c1).map(|_| pool.pop().unwrap_or_default()).collect();
            // The previous batch is written (on this thread) while this one is coded (by the
            // pool): the writes were a sequential tenth of a one-thread compress, and took the
            // two-thread speed-up on a 128 MiB fp32 tensor down to ~1.6x.
            let (written, entries) = self.run(|| {
                rayon::join(
                    || -> Result<()> {
                        if let Some(p) = &pending {
                            total += write_batch(h.planes(), &p.entries, &p.payloads, &mut dir, w)?;
                            if let Some(crc) = crc.as_deref_mut() {
                                crc.update(bytes_of(&p.chunks));
                            }
                        }
                        Ok(())
                    },
                    || -> Vec<ChunkEntry> {
                        bufs.par_iter_mut()
                            .enumerate()
                            .map(|(i, buf)| {
                                encoder::with_scratch(|s| enc.encode_chunk((c0 + i) as u64, s, buf))
                            })
                            .collect()
                    },
                )
            });
            written?;
            if let Some(p) = pending.take() {
                pool.extend(p.payloads);
                progress(((p.chunks.end * chunk_bytes) as u64).min(data.len() as u64));
            }
            if c0 < n {
                pending = Some(CodedBatch {
                    entries,
                    payloads: bufs,
                    chunks: c0..c1,
                });
            }
            c0 = c1;
        }
        keep_some(&mut pool);
        *self.payloads.lock().unwrap_or_else(|e| e.into_inner()) = pool;
        if total >= stored_len {
            return write_stored(w);
        }
        w.seek(SeekFrom::Start(dir_pos)).map_err(io)?;
        w.write_all(&dir).map_err(io)?;
        w.seek(SeekFrom::Start(start + total)).map_err(io)?;
        Ok(total)
    }

    /// Decompresses a blob into `w` with bounded memory (batches of half [`STREAM_BATCH_BYTES`], each
    /// checksummed and written while the next is decoded) and returns the CRC-32 of the decoded
    /// bytes. `progress` receives the number of bytes written so far.
    pub fn decompress_to<W: Write + Send>(
        &self,
        blob: &[u8],
        w: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<u32> {
        let io = |e: std::io::Error| Error::Io(e.to_string());
        let dec = TensorDecoder::new(blob)?;
        let h = dec.header().clone();
        let mut crc = crc32fast::Hasher::new();
        match h.scheme {
            Scheme::Stored => {
                let data = dec.view().stored_data();
                let mut done = 0;
                for piece in data.chunks(STREAM_BATCH_BYTES) {
                    crc.update(piece);
                    w.write_all(piece).map_err(io)?;
                    done += piece.len() as u64;
                    progress(done);
                }
            }
            Scheme::Planes => {
                let cb = h.chunk_units as usize * h.planes();
                let n = h.n_chunks() as usize;
                // Two buffers of half a streaming batch: one is checksummed and written (on
                // this thread) while the pool decodes the next into the other.
                let batch = self.batch_chunks(2 * cb);
                let total = h.nbytes() as usize;
                let mut bufs = [
                    vec![0u8; (batch * cb).min(total)],
                    vec![0u8; (batch * cb).min(total.saturating_sub(batch * cb))],
                ];
                // The decoded batch waiting to be written (in the buffer other than `k`): its
                // length and its end in the tensor's bytes.
                let mut pending: Option<(usize, usize)> = None;
                let mut c0 = 0;
                let mut k = 0;
                while c0 < n || pending.is_some() {
                    let c1 = (c0 + batch).min(n);
                    let len = (c1 * cb).min(total) - (c0 * cb).min(total);
                    let (a, b) = bufs.split_at_mut(1);
                    let (cur, prev) = if k == 0 {
                        (&mut a[0], &b[0])
                    } else {
                        (&mut b[0], &a[0])
                    };
                    let (written, decoded) = self.run(|| {
                        rayon::join(
                            || -> Result<()> {
                                if let Some((plen, _)) = pending {
                                    crc.update(&prev[..plen]);
                                    w.write_all(&prev[..plen]).map_err(io)?;
                                }
                                Ok(())
                            },
                            || -> Result<()> {
                                if c0 < n {
                                    self.decode_chunks_par(&dec, c0, &mut cur[..len])?;
                                }
                                Ok(())
                            },
                        )
                    });
                    written?;
                    decoded?;
                    if let Some((_, end)) = pending.take() {
                        progress(end as u64);
                    }
                    if c0 < n {
                        pending = Some((len, c0 * cb + len));
                        k ^= 1;
                    }
                    c0 = c1;
                }
            }
        }
        Ok(crc.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts_past_the_limit_are_an_option_error() {
        assert!(matches!(
            CpuEngine::new(MAX_THREADS + 1),
            Err(Error::InvalidOption(_))
        ));
        assert_eq!(CpuEngine::new(3).unwrap().threads(), 3);
    }

    /// A small tensor's blob does not keep the 64 KiB `compress` reserves (the Python package
    /// keeps the vector as long as the blob tensor lives); a chunk of the largest size leaves
    /// no scratch four times too large for the next, small one.
    #[test]
    fn small_blobs_and_scratch_keep_no_large_spare_memory() {
        let eng = CpuEngine::new(1).unwrap();
        let data = crate::sample::weights(1, 384, DType::F32, 5);
        let blob = eng
            .compress(&data, DType::F32, &[384], &CompressOptions::default())
            .unwrap();
        assert!(
            blob.capacity() - blob.len() <= 4096,
            "{} of {}",
            blob.capacity(),
            blob.len()
        );
        let big = CompressOptions {
            chunk_bytes: crate::blob::MAX_CHUNK_BYTES,
            ..CompressOptions::default()
        };
        let large = crate::sample::weights(1, 2 << 20, DType::BF16, 6);
        eng.compress(&large, DType::BF16, &[2 << 20], &big).unwrap();
        eng.compress(&data, DType::F32, &[384], &CompressOptions::default())
            .unwrap();
        let held = eng.run(|| crate::encoder::with_scratch(|s| s.held_bytes()));
        assert!(held < 2 << 20, "{held} bytes of scratch kept");
    }

    /// A writer that takes at most 7 bytes a call, of the first slice only, and is interrupted
    /// every third call.
    struct Stingy(Vec<u8>, usize);

    impl Write for Stingy {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.1 += 1;
            if self.1.is_multiple_of(3) {
                return Err(std::io::ErrorKind::Interrupted.into());
            }
            let n = b.len().min(7);
            self.0.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// `decompress_into_crc` decodes what `decompress_into` does and returns `zlib.crc32` of it,
    /// for stored and coded blobs, one chunk, odd and even chunk counts (the pair loop's lone
    /// last chunk), on one thread and on several; it refuses a wrong-sized buffer.
    #[test]
    fn decoding_with_its_checksum_equals_decoding_then_hashing() {
        use crate::sample::{random_bytes, weights};
        let small = CompressOptions {
            chunk_bytes: 4096,
            block_units: 256,
            ..Default::default()
        };
        let cases: Vec<(Vec<u8>, DType, Vec<u64>, CompressOptions)> = vec![
            (
                weights(40, 100, DType::BF16, 1),
                DType::BF16,
                vec![40, 100],
                small.clone(),
            ),
            (
                weights(41, 100, DType::F32, 2),
                DType::F32,
                vec![41, 100],
                small.clone(),
            ),
            (
                weights(9, 64, DType::F16, 3),
                DType::F16,
                vec![9, 64],
                small.clone(),
            ),
            (
                weights(8, 64, DType::F32, 4),
                DType::F32,
                vec![8, 64],
                CompressOptions::default(),
            ),
            (
                random_bytes(30_000, 5),
                DType::U8,
                vec![30_000],
                small.clone(),
            ),
            (vec![7; 12], DType::U8, vec![12], small),
        ];
        for threads in [1, 3] {
            let eng = CpuEngine::new(threads).unwrap();
            for (data, dt, shape, opts) in &cases {
                let blob = eng.compress(data, *dt, shape, opts).unwrap();
                let mut out = vec![0xAB; data.len()];
                let crc = eng.decompress_into_crc(&blob, &mut out).unwrap();
                assert_eq!(&out, data, "{dt} {shape:?}, {threads} threads");
                assert_eq!(
                    crc,
                    crc32fast::hash(data),
                    "{dt} {shape:?}, {threads} threads"
                );
                let mut short = vec![0; data.len() - 1];
                assert!(matches!(
                    eng.decompress_into_crc(&blob, &mut short),
                    Err(Error::OutputSize { .. })
                ));
            }
        }
    }

    /// `write_all_vectored` writes every buffer whole and in order through short and interrupted
    /// writes, and reports a writer that takes nothing.
    #[test]
    fn vectored_writes_write_everything() {
        let bufs: Vec<Vec<u8>> = [0usize, 5, 0, 20, 1, 7, 0]
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
            .collect();
        let mut w = Stingy(Vec::new(), 0);
        let mut slices: Vec<std::io::IoSlice<'_>> =
            bufs.iter().map(|b| std::io::IoSlice::new(b)).collect();
        write_all_vectored(&mut w, &mut slices).unwrap();
        assert_eq!(w.0, bufs.concat());
        let mut full = [0u8; 4];
        let mut slices = [std::io::IoSlice::new(&bufs[3])];
        let err = write_all_vectored(&mut &mut full[..], &mut slices).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WriteZero);
        // A batch's payloads through `write_batch`: all of them, in order, and their count.
        let mut dir = Vec::new();
        let mut w = Stingy(Vec::new(), 0);
        let n = write_batch(2, &[], &bufs, &mut dir, &mut w).unwrap();
        assert_eq!(n, 33);
        assert_eq!(w.0, bufs.concat());
    }

    /// The payload buffers the engine keeps between calls carry nothing from one blob into the
    /// next: blobs coded one after the other through one engine, and by two threads at once through
    /// it, equal those of fresh engines.
    #[test]
    fn kept_payload_buffers_do_not_change_blobs() {
        let opts = CompressOptions {
            chunk_bytes: 4096,
            block_units: 256,
            ..Default::default()
        };
        let inputs: Vec<(DType, Vec<u64>, Vec<u8>)> = [
            (DType::BF16, 300usize, 517usize),
            (DType::F32, 64, 1000),
            (DType::F16, 7, 33),
            (DType::BF16, 40, 2048),
            (DType::U8, 1, 70_000),
        ]
        .into_iter()
        .map(|(d, r, c)| {
            let data = if d == DType::U8 {
                (0..r * c).map(|i| (i * 7 % 13) as u8).collect()
            } else {
                crate::sample::weights(r, c, d, (r * c) as u64)
            };
            (d, vec![r as u64, c as u64], data)
        })
        .collect();
        let fresh: Vec<Vec<u8>> = inputs
            .iter()
            .map(|(d, s, x)| {
                CpuEngine::new(1)
                    .unwrap()
                    .compress(x, *d, s, &opts)
                    .unwrap()
            })
            .collect();
        let eng = CpuEngine::new(2).unwrap();
        for _ in 0..2 {
            for ((d, s, x), want) in inputs.iter().zip(&fresh) {
                assert_eq!(&eng.compress(x, *d, s, &opts).unwrap(), want);
            }
        }
        std::thread::scope(|sc| {
            for t in 0..2 {
                let (eng, inputs, fresh, opts) = (&eng, &inputs, &fresh, &opts);
                sc.spawn(move || {
                    for k in 0..inputs.len() * 2 {
                        let i = (k + t) % inputs.len();
                        let (d, s, x) = &inputs[i];
                        assert_eq!(&eng.compress(x, *d, s, opts).unwrap(), &fresh[i]);
                    }
                });
            }
        });
    }
}
