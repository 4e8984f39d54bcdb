//! The CPU engine: whole-tensor compress and decompress, multi-threaded over chunks with rayon.

use std::io::{Seek, SeekFrom, Write};

use rayon::prelude::*;

use crate::blob::{BlobHeader, Scheme};
use crate::decoder::{DecodeScratch, TensorDecoder};
use crate::dtype::DType;
use crate::encoder::{stored_header, ChunkOut, ChunkScratch, TensorEncoder};
use crate::error::{Error, Result};
use crate::options::CompressOptions;

/// A decoded tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

/// The CPU engine. `threads == 0` uses rayon's global pool (all cores); any other count gets a pool
/// of its own. Output bytes never depend on the thread count.
pub struct CpuEngine {
    pool: Option<rayon::ThreadPool>,
}

impl Default for CpuEngine {
    fn default() -> Self {
        CpuEngine { pool: None }
    }
}

impl CpuEngine {
    /// An engine on `threads` threads (0 = all cores).
    pub fn new(threads: usize) -> Result<Self> {
        if threads == 0 {
            return Ok(CpuEngine { pool: None });
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tensorzip-{i}"))
            .build()
            .map_err(|e| Error::InvalidOption(format!("cannot start {threads} threads: {e}")))?;
        Ok(CpuEngine { pool: Some(pool) })
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.pool.as_ref().map_or_else(rayon::current_num_threads, |p| p.current_num_threads())
    }

    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    /// Compresses the bytes of a tensor (row-major, little-endian) into a blob.
    pub fn compress(&self, data: &[u8], dtype: DType, shape: &[u64], opts: &CompressOptions) -> Result<Vec<u8>> {
        self.run(|| {
            let enc = TensorEncoder::new(data, dtype, shape, opts)?;
            if enc.header().scheme == Scheme::Stored {
                return Ok(stored_blob(enc.header(), data));
            }
            let chunks: Vec<ChunkOut> = (0..enc.n_chunks())
                .into_par_iter()
                .map_init(ChunkScratch::default, |s, c| enc.encode_chunk(c, s))
                .collect();
            Ok(assemble(&enc, &chunks))
        })
    }

    /// Decompresses a blob into a new buffer.
    pub fn decompress(&self, blob: &[u8]) -> Result<Tensor> {
        let dec = TensorDecoder::new(blob)?;
        let h = dec.header().clone();
        let mut data = vec![0u8; h.nbytes() as usize];
        self.decode_all(&dec, &mut data)?;
        Ok(Tensor { dtype: h.dtype, shape: h.shape, data })
    }

    /// Decompresses a blob into `out`, which must hold exactly the tensor's bytes.
    pub fn decompress_into(&self, blob: &[u8], out: &mut [u8]) -> Result<BlobHeader> {
        let dec = TensorDecoder::new(blob)?;
        self.decode_all(&dec, out)?;
        Ok(dec.header().clone())
    }

    fn decode_all(&self, dec: &TensorDecoder<'_>, out: &mut [u8]) -> Result<()> {
        let h = dec.header();
        if out.len() as u64 != h.nbytes() {
            return Err(Error::OutputSize { expected: h.nbytes() as usize, got: out.len() });
        }
        match h.scheme {
            Scheme::Stored => {
                out.copy_from_slice(dec.view().stored_data());
                Ok(())
            }
            Scheme::Planes => {
                // Tasks of two chunks each, decoded as a pair.
                let cb = h.chunk_units as usize * h.planes();
                self.run(|| {
                    out.par_chunks_mut(2 * cb)
                        .enumerate()
                        .try_for_each_init(DecodeScratch::default, |s, (i, o)| dec.decode_chunks(2 * i, o, s))
                })
            }
        }
    }

    /// Decodes elements `start..end` (row-major order) into `out` (exactly their bytes), touching only
    /// the chunks that hold them.
    pub fn decompress_range_into(&self, blob: &[u8], start: u64, end: u64, out: &mut [u8]) -> Result<BlobHeader> {
        let dec = TensorDecoder::new(blob)?;
        let h = dec.header().clone();
        let numel = h.numel();
        if start > end || end > numel {
            return Err(Error::Range { start, end, numel });
        }
        let isz = h.dtype.itemsize() as u64;
        let expected = ((end - start) * isz) as usize;
        if out.len() != expected {
            return Err(Error::OutputSize { expected, got: out.len() });
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
        let (c0, c1) = (b0 / cb, (b1 - 1) / cb);
        // Split `out` at chunk boundaries, then decode each chunk (directly when wholly inside).
        let mut pieces: Vec<(usize, &mut [u8])> = Vec::with_capacity(c1 - c0 + 1);
        let mut rest = out;
        for c in c0..=c1 {
            let lo = b0.max(c * cb);
            let hi = b1.min((c + 1) * cb);
            let (head, tail) = rest.split_at_mut(hi - lo);
            pieces.push((c, head));
            rest = tail;
        }
        self.run(|| {
            pieces.into_par_iter().try_for_each_init(
                || (DecodeScratch::default(), Vec::new()),
                |(s, tmp), (c, piece)| {
                    let chunk_bytes = h.chunk_len(c as u64) * h.planes();
                    let lo = b0.max(c * cb) - c * cb;
                    if lo == 0 && piece.len() == chunk_bytes {
                        dec.decode_chunk(c, piece, s)
                    } else {
                        tmp.resize(chunk_bytes, 0);
                        dec.decode_chunk(c, tmp, s)?;
                        piece.copy_from_slice(&tmp[lo..lo + piece.len()]);
                        Ok(())
                    }
                },
            )
        })?;
        Ok(h)
    }
}

/// Bytes of original data handled per batch by the streaming paths (bounds their memory).
pub const STREAM_BATCH_BYTES: usize = 32 << 20;

impl CpuEngine {
    fn batch_chunks(&self, chunk_bytes: usize) -> usize {
        (STREAM_BATCH_BYTES / chunk_bytes.max(1)).max(2 * self.threads()).max(1)
    }

    /// Compresses a tensor straight into `w` (at its current position) with bounded memory: chunks are
    /// coded in batches of [`STREAM_BATCH_BYTES`] and written as they come; the directory is written
    /// last, in the space reserved for it. Writes the same bytes as [`CpuEngine::compress`] and returns
    /// the blob's length. `progress` receives the number of original bytes handled so far.
    ///
    /// If the coded blob is not smaller than a stored one, the stored blob is written over it; the
    /// caller truncates the file after its last write.
    pub fn compress_to<W: Write + Seek>(
        &self,
        data: &[u8],
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
        w: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<u64> {
        let io = |e: std::io::Error| Error::Io(e.to_string());
        let start = w.stream_position().map_err(io)?;
        let enc = self.run(|| TensorEncoder::new(data, dtype, shape, opts))?;
        let write_stored = |w: &mut W| -> Result<u64> {
            w.seek(SeekFrom::Start(start)).map_err(io)?;
            let h = stored_header(dtype, shape);
            let mut head = Vec::new();
            h.write(&mut head);
            w.write_all(&head).map_err(io)?;
            for piece in data.chunks(STREAM_BATCH_BYTES) {
                w.write_all(piece).map_err(io)?;
            }
            progress(data.len() as u64);
            Ok((head.len() + data.len()) as u64)
        };
        if enc.header().scheme == Scheme::Stored {
            return write_stored(w);
        }
        let h = enc.header().clone();
        let mut prefix = Vec::new();
        enc.write_prefix(&mut prefix);
        w.write_all(&prefix).map_err(io)?;
        let n = h.n_chunks() as usize;
        let entry_len = h.dir_entry_len();
        let dir_pos = start + prefix.len() as u64;
        w.seek(SeekFrom::Current((n * entry_len) as i64)).map_err(io)?;
        let chunk_bytes = h.chunk_units as usize * h.planes();
        let batch = self.batch_chunks(chunk_bytes);
        let mut dir = Vec::with_capacity(n * entry_len);
        let mut total = (prefix.len() + n * entry_len) as u64;
        let mut c0 = 0;
        while c0 < n {
            let c1 = (c0 + batch).min(n);
            let outs: Vec<ChunkOut> = self.run(|| {
                (c0 as u64..c1 as u64).into_par_iter().map_init(ChunkScratch::default, |s, c| enc.encode_chunk(c, s)).collect()
            });
            for o in &outs {
                o.entry.write(h.planes(), &mut dir);
                w.write_all(&o.payload).map_err(io)?;
                total += o.payload.len() as u64;
            }
            progress(((c1 * chunk_bytes) as u64).min(data.len() as u64));
            c0 = c1;
        }
        let stored_len = (stored_header(dtype, shape).encoded_len() + data.len()) as u64;
        if total >= stored_len {
            return write_stored(w);
        }
        w.seek(SeekFrom::Start(dir_pos)).map_err(io)?;
        w.write_all(&dir).map_err(io)?;
        w.seek(SeekFrom::Start(start + total)).map_err(io)?;
        Ok(total)
    }

    /// Decompresses a blob into `w` with bounded memory (batches of [`STREAM_BATCH_BYTES`]) and returns
    /// the CRC-32 of the decoded bytes. `progress` receives the number of bytes written so far.
    pub fn decompress_to<W: Write>(&self, blob: &[u8], w: &mut W, progress: &(dyn Fn(u64) + Sync)) -> Result<u32> {
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
                let batch = self.batch_chunks(cb);
                let total = h.nbytes() as usize;
                let mut buf = vec![0u8; (batch * cb).min(total)];
                let mut c0 = 0;
                while c0 < n {
                    let c1 = (c0 + batch).min(n);
                    let len = (c1 * cb).min(total) - c0 * cb;
                    let out = &mut buf[..len];
                    self.run(|| {
                        out.par_chunks_mut(2 * cb)
                            .enumerate()
                            .try_for_each_init(DecodeScratch::default, |s, (i, o)| dec.decode_chunks(c0 + 2 * i, o, s))
                    })?;
                    crc.update(out);
                    w.write_all(out).map_err(io)?;
                    progress((c0 * cb + len) as u64);
                    c0 = c1;
                }
            }
        }
        Ok(crc.finalize())
    }
}

/// The bytes of a stored blob.
pub fn stored_blob(header: &BlobHeader, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(header.encoded_len() + data.len());
    header.write(&mut out);
    out.extend_from_slice(data);
    out
}

/// Concatenates prefix, directory and payloads; falls back to a stored blob when that is not smaller.
fn assemble(enc: &TensorEncoder<'_>, chunks: &[ChunkOut]) -> Vec<u8> {
    let mut prefix = Vec::new();
    enc.write_prefix(&mut prefix);
    let planes = enc.header().planes();
    let dir_len = chunks.len() * enc.header().dir_entry_len();
    let total = prefix.len() + dir_len + chunks.iter().map(|c| c.payload.len()).sum::<usize>();
    let stored = stored_header(enc.header().dtype, &enc.header().shape);
    if total >= stored.encoded_len() + enc.data().len() {
        return stored_blob(&stored, enc.data());
    }
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&prefix);
    for c in chunks {
        c.entry.write(planes, &mut out);
    }
    for c in chunks {
        out.extend_from_slice(&c.payload);
    }
    out
}
