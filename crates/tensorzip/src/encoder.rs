//! The CPU encoder of one tensor: builds the model (pass 1), then codes chunks independently (pass 2).

use crate::blob::{BlobHeader, ChunkEntry, PlaneMode, Scheme, SEL_CONST, SEL_RAW};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::histogram::{histogram_hinted, FewHint};
use crate::model::{build_model, choose, const_selector, Model};
use crate::options::CompressOptions;
use crate::rans::encode::{encode_stream, BlockJob, EncoderScratch, Seq};
use crate::rans::MAX_STASH;
use crate::transform;

/// Per-thread scratch of the chunk encoder.
#[derive(Default)]
pub struct ChunkScratch {
    planes: Vec<u8>,
    sels: Vec<u8>,
    cond_syms: Vec<u8>,
    raw_area: Vec<u8>,
    rans: EncoderScratch,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<ChunkScratch> = std::cell::RefCell::new(ChunkScratch::default());
}

/// Runs `f` with this thread's encoder scratch (kept between calls, so no fresh memory per chunk).
pub fn with_scratch<R>(f: impl FnOnce(&mut ChunkScratch) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut ChunkScratch::default()),
    })
}

/// Tensors at least this large have their chunk payloads appended past the caches
/// ([`crate::streaming`]): the decoder's threshold for its output. One-thread warm compress against
/// ordinary stores (2026-12-03, Intel VM, alternating processes, median of 5 per-round ratios):
/// synthetic bf16 +3.5% and +2.4% (area, then the stream's words too), synthetic fp32 +3.2% and
/// +1.0%, MiniLM fp32 +2.3%, MiniLM bf16 +2.0%; 1 MiB instead of 8 changed nothing measurable on
/// MiniLM (its tensors but the embedding are 0.3-1.2 MiB in bf16).
pub const STREAMING_PAYLOAD_BYTES: usize = 8 << 20;

/// Encoder of one tensor.
pub struct TensorEncoder<'a> {
    data: &'a [u8],
    header: BlobHeader,
    model: Option<Model>,
    threshold: u64,
    /// Whether chunk payloads are appended past the caches ([`crate::streaming`]): by default
    /// tensors of at least [`STREAMING_PAYLOAD_BYTES`], whose payload leaves the caches before the
    /// blob is read ([`TensorEncoder::set_streaming`]).
    streaming: bool,
}

/// The header of a stored (uncompressed) blob of this tensor.
pub fn stored_header(dtype: DType, shape: &[u64]) -> BlobHeader {
    BlobHeader {
        scheme: Scheme::Stored,
        dtype,
        shape: shape.to_vec(),
        chunk_units: 0,
        block_units: 0,
    }
}

/// Checks that `data` holds exactly the bytes of a tensor of `dtype` and `shape`.
pub fn check_input(data: &[u8], dtype: DType, shape: &[u64]) -> Result<()> {
    check_len(data.len() as u64, dtype, shape)
}

/// Checks that `len` bytes are exactly a tensor of `dtype` and `shape` (rank and size within the
/// format's limits).
pub fn check_len(len: u64, dtype: DType, shape: &[u64]) -> Result<()> {
    if shape.len() > crate::blob::MAX_RANK {
        return Err(Error::InvalidInput(format!(
            "rank {} exceeds {}",
            shape.len(),
            crate::blob::MAX_RANK
        )));
    }
    let numel = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    let nbytes = numel.and_then(|n| n.checked_mul(dtype.itemsize() as u64));
    match nbytes {
        Some(n) if n < crate::blob::MAX_TENSOR_BYTES && n == len => Ok(()),
        Some(n) if n < crate::blob::MAX_TENSOR_BYTES => Err(Error::InvalidInput(format!(
            "{len} bytes given for a {dtype} tensor of shape {shape:?} ({n} bytes)"
        ))),
        _ => Err(Error::InvalidInput(format!("shape {shape:?} is too large"))),
    }
}

impl<'a> TensorEncoder<'a> {
    /// Validates the input and options and builds the model (pass 1).
    pub fn new(
        data: &'a [u8],
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
    ) -> Result<Self> {
        opts.validate()?;
        check_input(data, dtype, shape)?;
        let us = dtype.unit_size();
        if data.is_empty() || data.len() < opts.min_compress_bytes {
            return Ok(TensorEncoder {
                data,
                header: stored_header(dtype, shape),
                model: None,
                threshold: 0,
                streaming: false,
            });
        }
        let header = BlobHeader {
            scheme: Scheme::Planes,
            dtype,
            shape: shape.to_vec(),
            chunk_units: (opts.chunk_bytes / us) as u32,
            block_units: opts.block_units,
        };
        let model = build_model(data, &header, opts);
        Ok(TensorEncoder {
            data,
            header,
            model: Some(model),
            threshold: opts.threshold_q16(),
            streaming: data.len() >= STREAMING_PAYLOAD_BYTES,
        })
    }

    /// The header this encoder writes.
    pub fn header(&self) -> &BlobHeader {
        &self.header
    }

    /// Whether chunk payloads are appended past the caches ([`crate::streaming`]; by default for
    /// tensors of at least [`STREAMING_PAYLOAD_BYTES`]). Callers that code chunks into buffers
    /// they copy from soon turn it off. The bytes are the same either way.
    pub fn set_streaming(&mut self, on: bool) {
        self.streaming = on;
    }

    /// Number of chunks to encode (0 for a stored blob).
    pub fn n_chunks(&self) -> u64 {
        self.header.n_chunks()
    }

    /// Appends the header and (for Planes) the table section.
    pub fn write_prefix(&self, out: &mut Vec<u8>) {
        self.header.write(out);
        if let Some(model) = &self.model {
            model.write_tables(out);
        }
    }

    /// Encodes chunk `c`: its payload replaces the contents of `payload`; returns its directory entry.
    pub fn encode_chunk(
        &self,
        c: u64,
        scratch: &mut ChunkScratch,
        payload: &mut Vec<u8>,
    ) -> ChunkEntry {
        payload.clear();
        self.encode_chunk_append(c, scratch, payload)
    }

    /// Encodes chunk `c` and appends its payload to `out` (whose bytes before stay as they are);
    /// returns its directory entry. The in-memory compress codes a blob's chunks straight into
    /// the blob this way, without a payload buffer to copy from.
    pub fn encode_chunk_append(
        &self,
        c: u64,
        scratch: &mut ChunkScratch,
        out: &mut Vec<u8>,
    ) -> ChunkEntry {
        let base = out.len();
        let payload = out;
        let model = self
            .model
            .as_ref()
            .expect("encode_chunk on a Planes encoder");
        let h = &self.header;
        let us = h.planes();
        let len = h.chunk_len(c);
        let start = c as usize * h.chunk_units as usize;
        let src = &self.data[start * us..(start + len) * us];
        let bu = h.block_units as usize;
        let nb = len.div_ceil(bu);
        let block = |b: usize| b * bu..((b + 1) * bu).min(len);

        scratch.planes.resize(us * len, 0);
        {
            let mut views: Vec<&mut [u8]> = scratch.planes.chunks_mut(len).collect();
            transform::split(h.dtype.transform(), src, &mut views);
        }
        let planes: Vec<&[u8]> = scratch.planes.chunks(len).collect();

        // Per-block selectors of every plane, and whether each block is one repeated byte.
        scratch.sels.clear();
        scratch.sels.resize(us * nb, 0);
        let mut modes = [PlaneMode::Raw; 8];
        let mut hist = [0u32; 256];
        // Global index of the chunk's first block (as `Sampling::block_range` numbers them).
        let g0 = c * (h.chunk_units as u64).div_ceil(bu as u64);
        for p in 0..us {
            let pm = &model.planes[p];
            let tables = &pm.tables;
            let sels = &mut scratch.sels[p * nb..(p + 1) * nb];
            let mut all_raw = true;
            let mut const_val: Option<Option<u8>> = None; // Some(Some(v)): every block so far is v
            let mut hint = FewHint::default();
            for (b, sel) in sels.iter_mut().enumerate() {
                let blk = &planes[p][block(b)];
                let first = blk[0];
                let is_const;
                if tables.is_empty() {
                    is_const = blk.iter().all(|&v| v == first);
                    *sel = if is_const { SEL_CONST } else { SEL_RAW };
                } else {
                    let hist = match model.block_hist(g0 + b as u64, p) {
                        Some(kept) => kept,
                        None => {
                            histogram_hinted(blk, &mut hist, &mut hint);
                            &hist
                        }
                    };
                    is_const = hist[first as usize] as usize == blk.len();
                    *sel = if is_const {
                        const_selector(first, tables)
                    } else {
                        choose(hist, blk.len(), &pm.costs, self.threshold).0
                    };
                }
                all_raw &= *sel == SEL_RAW;
                const_val = match const_val {
                    None => Some(is_const.then_some(first)),
                    Some(Some(v)) if is_const && v == first => Some(Some(v)),
                    _ => Some(None),
                };
            }
            modes[p] = match const_val {
                Some(Some(v)) => PlaneMode::Const(v),
                _ if pm.cond.is_some() => PlaneMode::Cond,
                _ if all_raw => PlaneMode::Raw,
                _ => PlaneMode::Blocks,
            };
        }

        // Conditioned plane: per block, the bytes of the units whose condition byte is the
        // table's go to the block's sub-segment (`cond_syms`), the others to the raw area.
        let cond = h
            .dtype
            .conditioned_plane()
            .filter(|&(p, _)| modes[p] == PlaneMode::Cond);
        let cond_value = cond.map(|(p, _)| {
            model.planes[p]
                .cond
                .as_ref()
                .expect("a conditioned plane has a table")
                .0
        });
        // Raw area, block by block: each block's raw bytes in plane order, the conditioned
        // plane's last, split straight into it. The area and the coded bytes live in buffers
        // kept at their largest length (written before they are read; never zeroed per chunk),
        // with 8 spare bytes for the split's word stores.
        let (area, cond_syms) = (&mut scratch.raw_area, &mut scratch.cond_syms);
        if area.len() < us * len + 8 {
            area.resize(us * len + 8, 0);
        }
        if cond.is_some() && cond_syms.len() < len + 8 {
            cond_syms.resize(len + 8, 0);
        }
        let mut cond_ranges = Vec::with_capacity(if cond.is_some() { nb } else { 0 });
        let (mut at, mut coded) = (0usize, 0usize);
        let mut last_block_start = 0;
        let mut last_cond_raw = 0;
        for b in 0..nb {
            last_block_start = at;
            for p in 0..us {
                let blk = &planes[p][block(b)];
                let raw = match modes[p] {
                    PlaneMode::Raw => Some(blk),
                    PlaneMode::Const(_) | PlaneMode::Cond => None,
                    PlaneMode::Blocks => match scratch.sels[p * nb + b] {
                        SEL_RAW => Some(blk),
                        SEL_CONST => Some(&blk[..1]),
                        _ => None,
                    },
                };
                if let Some(raw) = raw {
                    area[at..at + raw.len()].copy_from_slice(raw);
                    at += raw.len();
                }
            }
            if let (Some((p, q)), Some(v)) = (cond, cond_value) {
                let (t, r) = crate::select::split_into(
                    v,
                    &planes[q][block(b)],
                    &planes[p][block(b)],
                    &mut cond_syms[coded..],
                    &mut area[at..],
                );
                cond_ranges.push(coded..coded + t);
                coded += t;
                at += r;
                last_cond_raw = r;
            }
        }
        let (area, cond_syms) = (&area[..at], &cond_syms[..coded]);

        for p in 0..us {
            if modes[p] == PlaneMode::Blocks {
                payload.extend_from_slice(&scratch.sels[p * nb..(p + 1) * nb]);
            }
        }
        // The rANS stream: per block, the blocks coded with a multi-symbol table, then the
        // conditioned sub-segment.
        let mut mains: Vec<Seq<'_>> = Vec::with_capacity(nb * us);
        let mut spans: Vec<(std::ops::Range<usize>, Option<Seq<'_>>)> = Vec::with_capacity(nb);
        let mut any = false;
        for b in 0..nb {
            let from = mains.len();
            for p in 0..us {
                if modes[p] != PlaneMode::Blocks {
                    continue;
                }
                let sel = scratch.sels[p * nb + b];
                if sel == SEL_RAW || sel == SEL_CONST {
                    continue;
                }
                if let Some(enc) = &model.planes[p].enc[sel as usize] {
                    mains.push(Seq {
                        syms: &planes[p][block(b)],
                        packed: &enc.packed,
                        scalar: &enc.syms,
                    });
                }
            }
            let sub = match cond {
                Some((p, _)) if !cond_ranges[b].is_empty() => {
                    let ce = model.planes[p]
                        .cond_enc
                        .as_ref()
                        .expect("a conditioned plane has a table");
                    Some(Seq {
                        syms: &cond_syms[cond_ranges[b].clone()],
                        packed: &ce.packed,
                        scalar: &ce.syms,
                    })
                }
                _ => None,
            };
            any |= mains.len() > from || sub.is_some();
            spans.push((from..mains.len(), sub));
        }
        let jobs: Vec<BlockJob<'_>> = spans
            .into_iter()
            .map(|(r, sub)| BlockJob {
                main: &mains[r],
                sub,
            })
            .collect();
        // The stash: the last raw bytes of the last block travel in the stream's initial states.
        let stash_len = if !any {
            0
        } else if cond.is_some() {
            last_cond_raw.min(MAX_STASH)
        } else {
            (area.len() - last_block_start).min(MAX_STASH)
        };
        let kept = area.len() - stash_len;
        let sel_len = payload.len();
        if any {
            encode_stream(
                &jobs,
                &area[kept..],
                &mut scratch.rans,
                payload,
                self.streaming,
            );
        }
        let rans_len = payload.len() - sel_len;
        if self.streaming {
            crate::streaming::extend(payload, &area[..kept]);
            crate::streaming::fence();
        } else {
            payload.extend_from_slice(&area[..kept]);
        }
        // Coding must not expand a chunk: otherwise every non-constant plane is stored raw.
        if payload.len() - base >= len * us {
            payload.truncate(base);
            for p in 0..us {
                if !matches!(modes[p], PlaneMode::Const(_)) {
                    modes[p] = PlaneMode::Raw;
                }
            }
            for b in 0..nb {
                for p in 0..us {
                    if modes[p] == PlaneMode::Raw {
                        payload.extend_from_slice(&planes[p][block(b)]);
                    }
                }
            }
            return ChunkEntry {
                payload_len: (payload.len() - base) as u32,
                rans_len: 0,
                modes,
            };
        }
        ChunkEntry {
            payload_len: (payload.len() - base) as u32,
            rans_len: rans_len as u32,
            modes,
        }
    }
}
