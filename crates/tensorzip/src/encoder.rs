//! The CPU encoder of one tensor: builds the model (pass 1), then codes chunks independently (pass 2).

use crate::blob::{BlobHeader, ChunkEntry, PlaneMode, Scheme, SEL_CONST, SEL_RAW};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::histogram::{histogram_hinted, FewHint};
use crate::model::{build_model, choose, const_selector, Model};
use crate::options::CompressOptions;
use crate::rans::encode::{encode_stream, BlockJob, EncoderScratch, Seq};
use crate::rans::MAX_STASH;
use crate::raw_bound::RawBound;
use crate::transform;

/// Per-thread scratch of the chunk encoder.
#[derive(Default)]
pub struct ChunkScratch {
    planes: Vec<u8>,
    sels: Vec<u8>,
    cond_syms: Vec<u8>,
    raw_area: Vec<u8>,
    rans: EncoderScratch,
    /// A paired plane's ranks (version 2), block after block.
    ranks: Vec<u8>,
    /// A paired plane's escape groups, block after block.
    escapes: Vec<u8>,
}

impl ChunkScratch {
    /// Bytes the scratch holds (for tests of its size).
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.planes.capacity()
            + self.sels.capacity()
            + self.cond_syms.capacity()
            + self.raw_area.capacity()
            + 2 * self.rans.words_capacity()
    }

    /// Sizes the buffers for a chunk of `len` units of `us` bytes in `nb` blocks. The area and the
    /// coded bytes live in buffers kept at their largest length (written before they are read;
    /// never zeroed per chunk), with 8 spare bytes for the split's word stores — except that a
    /// buffer more than four times (and 1 MiB more than) this chunk's need is given back first:
    /// the scratch lives as long as its thread (a pool's, for the process's life), and chunks of
    /// 16 MiB (a valid `chunk_bytes`) left ~80 MiB a thread behind them for good.
    fn prepare(&mut self, us: usize, len: usize, nb: usize) {
        let need = us * len + 8;
        let most = 4 * need + (1 << 20);
        for buf in [&mut self.raw_area, &mut self.cond_syms, &mut self.planes] {
            if buf.len() > most {
                *buf = Vec::new();
            }
        }
        // At most one word per coded symbol.
        self.rans.trim(most);
        if self.raw_area.len() < need {
            self.raw_area.resize(need, 0);
        }
        if self.cond_syms.len() < len + 8 {
            self.cond_syms.resize(len + 8, 0);
        }
        self.planes.resize(us * len, 0);
        self.sels.clear();
        self.sels.resize(us * nb, 0);
        for buf in [&mut self.ranks, &mut self.escapes] {
            if buf.capacity() > most {
                *buf = Vec::new();
            }
            buf.clear();
        }
    }
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
/// (`crate::streaming`): the decoder's threshold for its output. One-thread warm compress against
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
    /// Per plane, the bound that settles raw blocks without their histogram
    /// ([`crate::raw_bound`]), for planes with tables whose block histograms the model did not
    /// keep.
    bounds: Vec<Option<RawBound>>,
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
    if shape.iter().any(|&d| d > crate::blob::MAX_DIM) {
        return Err(Error::InvalidInput(format!(
            "shape {shape:?} has a dimension of 2^63 or more"
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
                bounds: Vec::new(),
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
        let threshold = opts.threshold_q16();
        let bounds = (0..header.planes())
            .map(|p| {
                let pm = &model.planes[p];
                let kept = model.kept_every_block(p);
                // A paired plane's blocks choose by their bytes too (`pair_block`), so its bound
                // holds.
                match pm.tables.is_empty() || kept {
                    true => None,
                    false => RawBound::new(&pm.costs, threshold),
                }
            })
            .collect();
        Ok(TensorEncoder {
            data,
            header,
            model: Some(model),
            threshold,
            bounds,
            streaming: data.len() >= STREAMING_PAYLOAD_BYTES,
        })
    }

    /// The tensor's bytes.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The header this encoder writes.
    pub fn header(&self) -> &BlobHeader {
        &self.header
    }

    /// Whether chunk payloads are appended past the caches (see [`TensorEncoder::set_streaming`]).
    pub fn streaming(&self) -> bool {
        self.streaming
    }

    /// Whether chunk payloads are appended past the caches (`crate::streaming`; by default for
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
        match &self.model {
            Some(model) => {
                self.header.write_version(model.version(), out);
                model.write_tables(out);
            }
            None => self.header.write(out),
        }
    }

    /// Encodes chunk `c`: its payload replaces the contents of `payload`; returns its directory entry.
    ///
    /// # Panics
    /// If `c >= self.n_chunks()` (a stored encoder has no chunks), as slice indexing does: the
    /// engines only ask for chunks in `0..n_chunks()`.
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
    /// returns its directory entry. Panics as [`TensorEncoder::encode_chunk`] does. The in-memory
    /// compress codes a blob's chunks straight into the blob this way, without a payload buffer
    /// to copy from.
    pub fn encode_chunk_append(
        &self,
        c: u64,
        scratch: &mut ChunkScratch,
        out: &mut Vec<u8>,
    ) -> ChunkEntry {
        let n = self.n_chunks();
        assert!(c < n, "encode_chunk: chunk {c} of a tensor of {n} chunks");
        let base = out.len();
        let payload = out;
        let model = self
            .model
            .as_ref()
            .expect("a tensor with chunks has a model");
        let h = &self.header;
        let ch = self.chunk(c);
        let (us, len, nb) = (ch.us, ch.len, ch.nb);
        let block = |b: usize| ch.block(b);

        scratch.prepare(us, len, nb);
        let direct = direct_planes(model, h.dtype);
        let lay = match direct > 0 {
            true => self.lay_out_direct(c, direct, scratch),
            false => None,
        };
        let (lay, split) = match lay {
            Some(lay) => (lay, direct),
            None => (self.lay_out(c, scratch), 0),
        };
        let Layout {
            mut modes,
            cond,
            cond_ranges,
            area_len,
            coded,
            last_block_start,
            last_cond_raw,
            pair_ranges,
        } = lay;
        let planes: Vec<&[u8]> = scratch.planes.chunks(len).collect();
        let area = &scratch.raw_area[..area_len];
        let cond_syms = &scratch.cond_syms[..coded];
        let (ranks, escapes) = (&scratch.ranks[..], &scratch.escapes[..]);
        let paired = model.paired_plane();

        for p in 0..us {
            if modes[p] == PlaneMode::Blocks {
                payload.extend_from_slice(&scratch.sels[p * nb..(p + 1) * nb]);
            }
        }
        // The rANS stream: per block, the blocks coded with a multi-symbol table, then a paired
        // plane's ranks and escape group, then the conditioned sub-segment.
        let mut mains: Vec<Seq<'_>> = Vec::with_capacity(nb * us);
        let mut spans: Vec<BlockSeqs<'_>> = Vec::with_capacity(nb);
        let mut any = false;
        let uniform = crate::pairs::uniform_encode_table();
        for b in 0..nb {
            let from = mains.len();
            let (mut rank_seq, mut esc_seq) = (None, None);
            for p in 0..us {
                let sel = scratch.sels[p * nb + b];
                if modes[p] != PlaneMode::Blocks || sel == SEL_RAW || sel == SEL_CONST {
                    continue;
                }
                let enc = model.planes[p].enc[sel as usize].as_deref();
                if paired == Some(p) {
                    let (rr, er) = pair_ranges[b].clone();
                    if let (Some(enc), false) = (enc, rr.is_empty()) {
                        rank_seq = Some(Seq::new(&ranks[rr], enc));
                    }
                    if !er.is_empty() {
                        esc_seq = Some(Seq::new(&escapes[er], uniform));
                    }
                } else if let Some(enc) = enc {
                    mains.push(Seq::new(&planes[p][block(b)], enc));
                }
            }
            let sub = match cond {
                Some((p, _)) if !cond_ranges[b].is_empty() => {
                    let ce = model.planes[p]
                        .cond_enc
                        .as_ref()
                        .expect("a conditioned plane has a table");
                    Some(Seq::new(&cond_syms[cond_ranges[b].clone()], ce))
                }
                _ => None,
            };
            any |= mains.len() > from || sub.is_some() || rank_seq.is_some() || esc_seq.is_some();
            spans.push((from..mains.len(), rank_seq, esc_seq, sub));
        }
        let jobs: Vec<BlockJob<'_>> = spans
            .into_iter()
            .map(|(r, ranks, escapes, sub)| BlockJob {
                main: &mains[r],
                ranks,
                escapes,
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
            // The stream's words were stored non-temporally; `extend` may reallocate (copy
            // them), so they are fenced first, as the intrinsics' contract asks.
            crate::streaming::fence();
            crate::streaming::extend(payload, &area[..kept]);
            crate::streaming::fence();
        } else {
            payload.extend_from_slice(&area[..kept]);
        }
        // Coding must not expand a chunk: otherwise every non-constant plane is stored raw. A chunk
        // with no coded plane already is (its payload is its raw area: the raw planes block by
        // block), so only one with a coded plane is laid out again.
        if payload.len() - base >= len * us {
            let coded_planes = modes[..us]
                .iter()
                .any(|m| matches!(m, PlaneMode::Blocks | PlaneMode::Cond));
            if coded_planes {
                payload.truncate(base);
                for m in &mut modes[..us] {
                    if !matches!(m, PlaneMode::Const(_)) {
                        *m = PlaneMode::Raw;
                    }
                }
                if split > 0 {
                    // The planes split straight into the area are not in the planes buffer.
                    self.split_chunk(c, &mut scratch.planes);
                }
                for b in 0..nb {
                    for p in 0..us {
                        if modes[p] == PlaneMode::Raw {
                            payload.extend_from_slice(&scratch.planes[p * len..][block(b)]);
                        }
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

/// Where a paired block's ranks and escape group lie in [`ChunkScratch`]'s buffers.
type PairRanges = (std::ops::Range<usize>, std::ops::Range<usize>);

/// One block's sequences before its [`BlockJob`]: its main sequences' range, a paired plane's
/// ranks and escape group, the conditioned sub-segment.
type BlockSeqs<'a> = (
    std::ops::Range<usize>,
    Option<Seq<'a>>,
    Option<Seq<'a>>,
    Option<Seq<'a>>,
);

/// A chunk's geometry: `len` units of `us` bytes from unit `start`, in `nb` blocks of `bu` units,
/// the first of them global block `g0` (as `Sampling::block_range` numbers them).
struct Chunk {
    us: usize,
    len: usize,
    bu: usize,
    nb: usize,
    start: usize,
    g0: u64,
}

impl Chunk {
    /// Units of block `b` within the chunk.
    fn block(&self, b: usize) -> std::ops::Range<usize> {
        b * self.bu..((b + 1) * self.bu).min(self.len)
    }
}

/// Where a chunk's planes went: the modes, the conditioned plane's sub-segments, and the raw area
/// (`ChunkScratch::raw_area`, block by block: each block's raw bytes in plane order, the
/// conditioned plane's last).
struct Layout {
    modes: [PlaneMode; 8],
    /// The conditioned plane and its condition plane, when the chunk codes it (mode `Cond`).
    cond: Option<(usize, usize)>,
    /// Per block, its units' range in `ChunkScratch::cond_syms` (empty without `cond`).
    cond_ranges: Vec<std::ops::Range<usize>>,
    area_len: usize,
    /// Bytes in `ChunkScratch::cond_syms`.
    coded: usize,
    /// Where the last block's raw bytes start in the area.
    last_block_start: usize,
    /// The conditioned plane's raw bytes of the last block.
    last_cond_raw: usize,
    /// Per block, a paired plane's ranks and escape group (ranges in `ChunkScratch::ranks` and
    /// `ChunkScratch::escapes`; empty for blocks not coded, and without a paired plane).
    pair_ranges: Vec<PairRanges>,
}

impl Layout {
    /// An empty area and no sub-segments yet.
    fn new(modes: [PlaneMode; 8], cond: Option<(usize, usize)>, nb: usize) -> Layout {
        Layout {
            modes,
            cond,
            cond_ranges: Vec::with_capacity(if cond.is_some() { nb } else { 0 }),
            area_len: 0,
            coded: 0,
            last_block_start: 0,
            last_cond_raw: 0,
            pair_ranges: Vec::new(),
        }
    }

    /// Appends a block's raw bytes of a plane to the area.
    fn push_raw(&mut self, area: &mut [u8], raw: &[u8]) {
        area[self.area_len..self.area_len + raw.len()].copy_from_slice(raw);
        self.area_len += raw.len();
    }

    /// The conditioned plane's bytes of one block (`plane`, with condition bytes `cond`): those of
    /// units whose condition byte is `v` to the block's sub-segment in `cond_syms`, the others
    /// to the area.
    fn split_cond(
        &mut self,
        v: u8,
        cond: &[u8],
        plane: &[u8],
        cond_syms: &mut [u8],
        area: &mut [u8],
    ) {
        let (t, r) = crate::select::split_into(
            v,
            cond,
            plane,
            &mut cond_syms[self.coded..],
            &mut area[self.area_len..],
        );
        self.cond_ranges.push(self.coded..self.coded + t);
        self.coded += t;
        self.area_len += r;
        self.last_cond_raw = r;
    }
}

/// How many of a float tensor's first planes are split straight into a chunk's raw area
/// ([`TensorEncoder::lay_out_direct`]): those below the conditioned plane and its condition plane
/// (fp32's two low mantissa bytes, fp64's six), which are raw in nearly every block; none for
/// other dtypes, or where the model conditions a plane in that range.
fn direct_planes(model: &Model, dtype: DType) -> usize {
    let Some((p, q)) = dtype.conditioned_plane() else {
        return 0;
    };
    model
        .planes
        .iter()
        .take(p.min(q))
        .take_while(|pm| pm.cond.is_none())
        .count()
}

impl TensorEncoder<'_> {
    /// The geometry of chunk `c`.
    fn chunk(&self, c: u64) -> Chunk {
        let h = &self.header;
        let (len, bu) = (h.chunk_len(c), h.block_units as usize);
        Chunk {
            us: h.planes(),
            len,
            bu,
            nb: len.div_ceil(bu),
            start: c as usize * h.chunk_units as usize,
            g0: c * (h.chunk_units as u64).div_ceil(bu as u64),
        }
    }

    /// The bytes of chunk `ch`'s units `r`.
    fn units(&self, ch: &Chunk, r: std::ops::Range<usize>) -> &[u8] {
        &self.data[(ch.start + r.start) * ch.us..(ch.start + r.end) * ch.us]
    }

    /// Splits chunk `c` into `planes` (plane `p` at `p * len`).
    fn split_chunk(&self, c: u64, planes: &mut [u8]) {
        let ch = self.chunk(c);
        let src = self.units(&ch, 0..ch.len);
        let mut views: Vec<&mut [u8]> = planes[..ch.us * ch.len].chunks_mut(ch.len).collect();
        transform::split(self.header.dtype.transform(), src, &mut views);
    }

    /// Splits chunk `c` into the planes buffer, chooses every block's selector and the planes'
    /// modes, and copies the raw blocks into the raw area.
    fn lay_out(&self, c: u64, scratch: &mut ChunkScratch) -> Layout {
        let model = self.model.as_ref().expect("a Planes encoder has a model");
        let h = &self.header;
        let ch = self.chunk(c);
        let (us, len, nb, g0) = (ch.us, ch.len, ch.nb, ch.g0);
        let block = |b: usize| ch.block(b);
        self.split_chunk(c, &mut scratch.planes);
        let planes: Vec<&[u8]> = scratch.planes.chunks(len).collect();

        // Per-block selectors of every plane, and whether each block is one repeated byte.
        let mut modes = [PlaneMode::Raw; 8];
        let mut hist = [0u32; 256];
        let mut pair_ranges = Vec::new();
        for p in 0..us {
            let pm = &model.planes[p];
            let sels = &mut scratch.sels[p * nb..(p + 1) * nb];
            let mut all_raw = true;
            let mut const_val: Option<Option<u8>> = None; // Some(Some(v)): every block so far is v
            let mut hint = BlockHint::default();
            for (b, sel) in sels.iter_mut().enumerate() {
                let blk = &planes[p][block(b)];
                let pairs = (&mut scratch.ranks, &mut scratch.escapes, &mut pair_ranges);
                let (s, is_const) =
                    self.select_block(p, blk, g0 + b as u64, (&mut hist, &mut hint), pairs);
                *sel = s;
                all_raw &= s == SEL_RAW;
                const_val = match const_val {
                    None => Some(is_const.then_some(blk[0])),
                    Some(Some(v)) if is_const && v == blk[0] => Some(Some(v)),
                    _ => Some(None),
                };
            }
            modes[p] = match const_val {
                Some(Some(v)) => PlaneMode::Const(v),
                _ => coded_mode(pm, all_raw),
            };
        }

        // Conditioned plane: per block, the bytes of the units whose condition byte is the
        // table's go to the block's sub-segment (`cond_syms`), the others to the raw area.
        let cond = h
            .dtype
            .conditioned_plane()
            .filter(|&(p, _)| modes[p] == PlaneMode::Cond);
        let cond_value = cond.map(|(p, _)| cond_value(model, p));
        let (area, cond_syms) = (&mut scratch.raw_area, &mut scratch.cond_syms);
        let mut lay = Layout::new(modes, cond, nb);
        lay.pair_ranges = pair_ranges;
        for b in 0..nb {
            lay.last_block_start = lay.area_len;
            for p in 0..us {
                let blk = &planes[p][block(b)];
                if let Some(raw) = raw_part(modes[p], scratch.sels[p * nb + b], blk) {
                    lay.push_raw(area, raw);
                }
            }
            if let (Some((p, q)), Some(v)) = (cond, cond_value) {
                lay.split_cond(
                    v,
                    &planes[q][block(b)],
                    &planes[p][block(b)],
                    cond_syms,
                    area,
                );
            }
        }
        lay
    }

    /// [`TensorEncoder::lay_out`] with the first `k` planes split straight into the raw area, where
    /// their raw blocks go first in each block, instead of into the planes buffer and copied (one
    /// copy of half an fp32 tensor less). Each block of those planes is split into the area at
    /// the place it has if every one of them is raw; a raw block not at its place (a plane before
    /// it in the block is coded or constant) is moved down, a coded block is copied to the planes
    /// buffer (the stream reads it there), a constant one leaves its byte. The layout is the
    /// same; `None` (nothing written that matters) when a plane's first block is one repeated
    /// byte, which could make the plane constant in the chunk (mode `Const`, no area bytes, no
    /// selectors): [`TensorEncoder::lay_out`] then does the chunk. A plane whose first block is
    /// not constant cannot become `Const`.
    fn lay_out_direct(&self, c: u64, k: usize, scratch: &mut ChunkScratch) -> Option<Layout> {
        let model = self.model.as_ref().expect("a Planes encoder has a model");
        let h = &self.header;
        let ch = self.chunk(c);
        let (us, len, nb, g0) = (ch.us, ch.len, ch.nb, ch.g0);
        let transform = h.dtype.transform();
        // The conditioned plane, coded unless constant (which the first block rules out).
        let cond = h
            .dtype
            .conditioned_plane()
            .filter(|&(p, _)| model.planes[p].cond.is_some());
        let cond_value = cond.map(|(p, _)| cond_value(model, p));
        let ChunkScratch {
            planes,
            sels,
            cond_syms,
            raw_area: area,
            ranks,
            escapes,
            ..
        } = scratch;
        let mut all_raw = [true; 8];
        let mut hist = [0u32; 256];
        let mut hints = [BlockHint::default(); 8];
        let mut lay = Layout::new([PlaneMode::Raw; 8], cond, nb);
        for b in 0..nb {
            let r = ch.block(b);
            let n = r.len();
            let at = lay.area_len;
            lay.last_block_start = at;
            {
                // Planes below k into the area, one after the other; the rest into the buffer.
                let (direct, _) = area[at..].split_at_mut(k * n);
                let mut views: Vec<&mut [u8]> = direct.chunks_mut(n).collect();
                views.extend(
                    planes[k * len..us * len]
                        .chunks_mut(len)
                        .map(|p| &mut p[r.clone()]),
                );
                transform::split(transform, self.units(&ch, r.clone()), &mut views);
            }
            // The first k planes' blocks, from their places at `at + j n` to where they belong.
            for j in 0..k {
                let slot = at + j * n;
                let (s, is_const, _) = self.select(
                    &model.planes[j],
                    &area[slot..slot + n],
                    g0 + b as u64,
                    j,
                    &mut hist,
                    &mut hints[j],
                );
                if b == 0 && is_const {
                    return None;
                }
                sels[j * nb + b] = s;
                all_raw[j] &= s == SEL_RAW;
                let to = lay.area_len;
                match s {
                    SEL_RAW => {
                        if slot != to {
                            area.copy_within(slot..slot + n, to);
                        }
                        lay.area_len += n;
                    }
                    SEL_CONST => {
                        area[to] = area[slot];
                        lay.area_len += 1;
                    }
                    _ => planes[j * len..][r.clone()].copy_from_slice(&area[slot..slot + n]),
                }
            }
            for p in k..us {
                let pm = &model.planes[p];
                let blk = &planes[p * len..][r.clone()];
                let pairs = (&mut *ranks, &mut *escapes, &mut lay.pair_ranges);
                let (s, is_const) =
                    self.select_block(p, blk, g0 + b as u64, (&mut hist, &mut hints[p]), pairs);
                if b == 0 && is_const {
                    return None;
                }
                sels[p * nb + b] = s;
                all_raw[p] &= s == SEL_RAW;
                // A block's raw bytes are the same whether the plane ends up `Raw` or `Blocks`.
                if let Some(raw) = raw_part(coded_mode(pm, false), s, blk) {
                    lay.push_raw(area, raw);
                }
            }
            if let (Some((p, q)), Some(v)) = (cond, cond_value) {
                let (e, m) = (&planes[q * len..][r.clone()], &planes[p * len..][r]);
                lay.split_cond(v, e, m, cond_syms, area);
            }
        }
        for p in 0..us {
            lay.modes[p] = coded_mode(&model.planes[p], all_raw[p]);
        }
        Some(lay)
    }

    /// The selector of block `blk` of plane `p` (global block `g`) and whether the block is one
    /// repeated byte: [`TensorEncoder::select`], and for a paired plane the block's ranks and
    /// escape group where it is coded ([`TensorEncoder::pair_block`]; its ranges pushed to the
    /// third buffer).
    fn select_block(
        &self,
        p: usize,
        blk: &[u8],
        g: u64,
        (hist, hint): (&mut [u32; 256], &mut BlockHint),
        (ranks, escapes, ranges): (&mut Vec<u8>, &mut Vec<u8>, &mut Vec<PairRanges>),
    ) -> (u8, bool) {
        let model = self.model.as_ref().expect("a Planes encoder has a model");
        let pm = &model.planes[p];
        let (s, is_const, cost) = self.select(pm, blk, g, p, hist, hint);
        match &pm.pairs {
            Some(pc) => {
                let (s, r) = Self::pair_block(pc, (s, cost), blk, (ranks, escapes), self.threshold);
                ranges.push(r);
                (s, is_const)
            }
            None => (s, is_const),
        }
    }

    /// Block `blk` (its exponent bytes) of a paired plane (version 2), which chose selector `s`
    /// at cost `cost` (Q16 bits) by its exponent bytes: where `s` is a table, its ranks and
    /// escape group appended to the two buffers and their ranges returned with `s` — unless the
    /// escape group's bytes (8 bits each) added to that cost fail the passthrough rule, when the
    /// block is raw (FORMAT.md section 12's encoder decisions). Constant and raw blocks append
    /// nothing (empty ranges).
    fn pair_block(
        coder: &crate::pairs::PairCoder,
        (s, cost): (u8, u64),
        blk: &[u8],
        (ranks, escapes): (&mut Vec<u8>, &mut Vec<u8>),
        threshold: u64,
    ) -> (u8, PairRanges) {
        let (r0, e0) = (ranks.len(), escapes.len());
        let none = (r0..r0, e0..e0);
        if s >= SEL_CONST {
            return (s, none);
        }
        ranks.resize(r0 + blk.len() / 2, 0);
        let n_esc = coder.ranks(blk, &mut ranks[r0..], escapes);
        if !crate::model::stays_coded(cost + crate::model::raw_cost(n_esc), blk.len(), threshold) {
            ranks.truncate(r0);
            escapes.truncate(e0);
            return (SEL_RAW, none);
        }
        (s, (r0..ranks.len(), e0..escapes.len()))
    }

    /// The selector of one block `blk` of plane `p` (global block `g`), whether the block is
    /// one repeated byte, and the chosen table's cost in Q16 bits (meaningful where a table is
    /// chosen: a paired plane weighs its escapes against it).
    fn select(
        &self,
        pm: &crate::model::PlaneModel,
        blk: &[u8],
        g: u64,
        p: usize,
        hist: &mut [u32; 256],
        hint: &mut BlockHint,
    ) -> (u8, bool, u64) {
        let first = blk[0];
        if pm.tables.is_empty() {
            let is_const = blk.iter().all(|&v| v == first);
            return (if is_const { SEL_CONST } else { SEL_RAW }, is_const, 0);
        }
        let model = self.model.as_ref().expect("a Planes encoder has a model");
        let hist = match model.block_hist(g, p) {
            Some(kept) => kept,
            None => {
                if let Some(bound) = &self.bounds[p] {
                    match hint.bound_skip {
                        0 if blk.iter().any(|&v| v != first) => {
                            if bound.proves_raw(blk) {
                                return (SEL_RAW, false, 0);
                            }
                            hint.bound_skip = BOUND_SKIP_AFTER_MISS;
                        }
                        0 => {}
                        _ => hint.bound_skip -= 1,
                    }
                }
                histogram_hinted(blk, hist, &mut hint.few);
                &*hist
            }
        };
        let is_const = hist[first as usize] as usize == blk.len();
        let (sel, cost) = match is_const {
            true => (const_selector(first, &pm.tables), 0),
            false => choose(hist, blk.len(), &pm.costs, self.threshold),
        };
        (sel, is_const, cost)
    }
}

/// What the previous blocks of one plane taught about the next: how to count it
/// ([`FewHint`]), and how many blocks to count without trying the raw bound first (after a
/// block it did not settle).
#[derive(Clone, Copy, Default)]
struct BlockHint {
    few: FewHint,
    bound_skip: u8,
}

/// Blocks counted without the raw bound after one it did not settle: a plane whose blocks are
/// mostly coded then pays for the bound's comparisons on one block in 17.
const BOUND_SKIP_AFTER_MISS: u8 = 16;

/// The mode of a plane that is not one byte throughout the chunk: `Cond` if it has a conditional
/// table, else `Raw` if every block's selector is raw (`all_raw`), else `Blocks`.
fn coded_mode(pm: &crate::model::PlaneModel, all_raw: bool) -> PlaneMode {
    match () {
        _ if pm.cond.is_some() => PlaneMode::Cond,
        _ if all_raw => PlaneMode::Raw,
        _ => PlaneMode::Blocks,
    }
}

/// The value whose units the conditioned plane `p` codes.
fn cond_value(model: &Model, p: usize) -> u8 {
    model.planes[p]
        .cond
        .as_ref()
        .expect("a conditioned plane has a table")
        .0
}

/// What block `blk` of a plane in `mode` with selector `sel` puts in the raw area.
fn raw_part(mode: PlaneMode, sel: u8, blk: &[u8]) -> Option<&[u8]> {
    match mode {
        PlaneMode::Raw => Some(blk),
        PlaneMode::Const(_) | PlaneMode::Cond => None,
        PlaneMode::Blocks => match sel {
            SEL_RAW => Some(blk),
            SEL_CONST => Some(&blk[..1]),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::rng;

    /// Weights of `n` units (`sample::weights` in rows of 384, the last cut short).
    fn weights(dtype: DType, n: usize, seed: u64) -> Vec<u8> {
        let mut w = crate::sample::weights(n.div_ceil(384), 384, dtype, seed);
        w.truncate(n * dtype.itemsize());
        w
    }

    /// Lays out every chunk of `data` both ways; returns how many chunks took the direct way.
    fn compare_layouts(data: &[u8], dtype: DType, opts: &CompressOptions, what: &str) -> usize {
        let units = data.len() / dtype.itemsize();
        let enc = TensorEncoder::new(data, dtype, &[units as u64], opts).unwrap();
        let k = direct_planes(enc.model.as_ref().unwrap(), dtype);
        assert!(
            k > 0 || matches!(dtype, DType::BF16 | DType::F16),
            "{what}: no planes split into the area"
        );
        let h = enc.header().clone();
        let us = h.planes();
        let mut direct = 0;
        for c in 0..enc.n_chunks() {
            let len = h.chunk_len(c);
            let nb = len.div_ceil(h.block_units as usize);
            let (mut a, mut b) = (ChunkScratch::default(), ChunkScratch::default());
            a.prepare(us, len, nb);
            b.prepare(us, len, nb);
            let want = enc.lay_out(c, &mut a);
            if k == 0 {
                continue;
            }
            let Some(got) = enc.lay_out_direct(c, k, &mut b) else {
                continue;
            };
            direct += 1;
            let at = format!("{what}, chunk {c}");
            if what == "coded low blocks" {
                assert_eq!(want.modes[0], PlaneMode::Blocks, "{at}");
            }
            assert_eq!(got.modes, want.modes, "{at}");
            assert_eq!(got.cond, want.cond, "{at}");
            assert_eq!(got.cond_ranges, want.cond_ranges, "{at}");
            assert_eq!(got.area_len, want.area_len, "{at}");
            assert_eq!(got.last_block_start, want.last_block_start, "{at}");
            assert_eq!(got.last_cond_raw, want.last_cond_raw, "{at}");
            assert!(
                b.raw_area[..got.area_len] == a.raw_area[..want.area_len],
                "{at}: areas"
            );
            assert!(
                b.cond_syms[..got.coded] == a.cond_syms[..want.coded],
                "{at}: sub-segments"
            );
            let bu = h.block_units as usize;
            for p in 0..us {
                if want.modes[p] == PlaneMode::Blocks {
                    assert_eq!(b.sels[p * nb..][..nb], a.sels[p * nb..][..nb], "{at}");
                }
                // The planes the coded blocks are read from: whole from plane k on, the coded
                // blocks below it.
                for blk in 0..nb {
                    let coded = !matches!(a.sels[p * nb + blk], SEL_RAW | SEL_CONST);
                    if p >= k || (want.modes[p] == PlaneMode::Blocks && coded) {
                        let r = p * len + blk * bu..p * len + ((blk + 1) * bu).min(len);
                        assert!(b.planes[r.clone()] == a.planes[r], "{at}: plane {p}");
                    }
                }
            }
        }
        direct
    }

    /// Every chunk of `enc` coded in order: the payloads, and each chunk's payload and rANS
    /// lengths.
    fn code_all(enc: &TensorEncoder<'_>) -> (Vec<u8>, Vec<(u32, u32)>) {
        let mut out = Vec::new();
        let mut scratch = ChunkScratch::default();
        let entries: Vec<_> = (0..enc.n_chunks())
            .map(|c| enc.encode_chunk_append(c, &mut scratch, &mut out))
            .collect();
        let lens = entries
            .iter()
            .map(|e| (e.payload_len, e.rans_len))
            .collect();
        (out, lens)
    }

    /// The histograms the model kept of its sampled blocks (all of a tensor's blocks, or some)
    /// code to the same bytes as the encoder's own counts of those blocks: bf16 (its paired
    /// exponent plane) and fp32 weights, sampled wholly and in part.
    #[test]
    fn kept_block_histograms_change_no_byte() {
        for dtype in [DType::BF16, DType::F32] {
            let cu = (128 << 10) / dtype.itemsize();
            let data = weights(dtype, 3 * cu + 777, 31);
            let units = (data.len() / dtype.itemsize()) as u64;
            for sample_blocks in [1024, 7] {
                let opts = CompressOptions {
                    sample_blocks,
                    ..CompressOptions::default()
                };
                let at = format!("{dtype:?}, {sample_blocks} sampled blocks");
                let mut enc = TensorEncoder::new(&data, dtype, &[units], &opts).unwrap();
                let model = enc.model.as_ref().unwrap();
                let kept = (0..model.planes.len())
                    .filter(|&p| {
                        (0..units.div_ceil(4096)).any(|g| model.block_hist(g, p).is_some())
                    })
                    .count();
                assert!(kept > 0, "{at}: histograms kept");
                let q = model.planes.len() - 1;
                assert_eq!(model.kept_every_block(q), sample_blocks == 1024, "{at}");
                let with = code_all(&enc);
                enc.model.as_mut().unwrap().kept = None;
                assert!(
                    code_all(&enc) == with,
                    "{at}: the same payloads and entries"
                );
            }
        }
    }

    /// Blocks settled by the raw bound (`raw_bound.rs`) code to the same bytes as blocks chosen
    /// from their histograms: low planes with tables (a few coded and constant blocks among
    /// random ones), sampled (16 of 49 blocks) so that the encoder counts most blocks itself.
    #[test]
    fn the_raw_bound_changes_no_byte() {
        let dtype = DType::F32;
        let cu = (128 << 10) / 4;
        let mut data = weights(dtype, 6 * cu + 999, 23);
        let mut r = rng(29);
        for (i, u) in data.chunks_exact_mut(4).enumerate() {
            match (i / 4096) % 7 {
                1 => u[0] = (r() % 4) as u8,
                4 => u[..2].fill(0),
                _ => {}
            }
        }
        let opts = CompressOptions {
            sample_blocks: 16,
            ..CompressOptions::default()
        };
        let units = (data.len() / 4) as u64;
        let mut enc = TensorEncoder::new(&data, dtype, &[units], &opts).unwrap();
        let tables: Vec<usize> = enc
            .model
            .as_ref()
            .unwrap()
            .planes
            .iter()
            .map(|pm| pm.tables.len())
            .collect();
        assert!(
            enc.bounds[0].is_some(),
            "plane 0 bounded (tables {tables:?})"
        );
        let with = code_all(&enc);
        // The bound settles most blocks of planes 0 and 1 here: count them.
        let settled = data
            .chunks(4 * 4096)
            .filter(|blk| {
                let mut planes = vec![vec![0u8; blk.len() / 4]; 4];
                let mut views: Vec<&mut [u8]> = planes.iter_mut().map(|p| &mut p[..]).collect();
                transform::split(dtype.transform(), blk, &mut views);
                let plane = &planes[0];
                plane.iter().any(|&v| v != plane[0])
                    && enc.bounds[0].as_ref().unwrap().proves_raw(plane)
            })
            .count();
        assert!(
            settled > 20,
            "the bound settled {settled} blocks of plane 0"
        );
        enc.bounds.iter_mut().for_each(|b| *b = None);
        assert!(
            code_all(&enc) == with,
            "the same payloads and entries without the bound"
        );
    }

    #[test]
    fn planes_split_into_the_raw_area_lay_out_as_copied() {
        let opts = CompressOptions::default();
        // Three full chunks and a short one, in the float types with planes below the conditioned
        // one (bf16's and fp16's low byte is the conditioned plane: they never take the direct way).
        for dtype in [DType::F32, DType::F64] {
            let units = 3 * (128 << 10) / dtype.itemsize() + 5001;
            let data = weights(dtype, units, 7);
            let n = compare_layouts(&data, dtype, &opts, &format!("{dtype} weights"));
            assert_eq!(n, 4, "{dtype}: every chunk of weights is laid out directly");
        }
        for dtype in [DType::BF16, DType::F16] {
            let data = weights(dtype, 100_003, 3);
            assert_eq!(compare_layouts(&data, dtype, &opts, &format!("{dtype}")), 0);
        }
        // A zero block inside chunk 1 (its low planes repeat a byte there: those planes are
        // `Blocks` in the chunk, that block's selector constant), a zero first block in chunk 2
        // (laid out by copying: the planes could be `Const`), zeros from the middle of chunk 3 to
        // the end. Four sampled blocks (global 0, 6, 13 and 19 of 26), so that the model sees none
        // of the zeros and keeps the low planes raw.
        let sampled = CompressOptions {
            sample_blocks: 4,
            ..CompressOptions::default()
        };
        let dtype = DType::F32;
        let cu = (128 << 10) / 4;
        let mut data = weights(dtype, 3 * cu + 5001, 11);
        data[4 * (cu + 3 * 4096)..4 * (cu + 4 * 4096)].fill(0);
        data[4 * 2 * cu..4 * (2 * cu + 4096)].fill(0);
        data[4 * (3 * cu + 2000)..].fill(0);
        assert_eq!(compare_layouts(&data, dtype, &sampled, "zero blocks"), 3);
        // Low planes with tables: in every chunk, plane 0 of a few values in block 1 (coded; plane
        // 1's raw block moves down), plane 1 in block 5, plane 0 one value in block 3 (a constant
        // selector; plane 1 moves down but one byte), both in block 6; the rest random (raw).
        let mut data = weights(dtype, 3 * cu + 5001, 13);
        let mut r = rng(17);
        for (i, u) in data.chunks_exact_mut(4).enumerate() {
            match (i % cu) / 4096 {
                1 => u[0] = (r() % 4) as u8,
                5 => u[1] = (r() % 3) as u8,
                3 => u[0] = 7,
                6 => u[..2].copy_from_slice(&[(r() % 4) as u8, (r() % 3) as u8]),
                _ => {}
            }
        }
        let n = compare_layouts(&data, dtype, &opts, "coded low blocks");
        assert_eq!(n, 4, "coded low blocks: every chunk laid out directly");
        // fp32 widened from bf16: the low planes are zero everywhere.
        let mut data = weights(dtype, 3 * cu + 77, 5);
        for u in data.chunks_exact_mut(4) {
            u[..2].fill(0);
        }
        assert_eq!(compare_layouts(&data, dtype, &sampled, "widened bf16"), 0);
        // Random bytes: every plane raw, every chunk laid out directly.
        let mut r = rng(9);
        let data: Vec<u8> = (0..4 * (2 * cu + 333)).map(|_| r() as u8).collect();
        assert_eq!(compare_layouts(&data, dtype, &opts, "random bytes"), 3);
    }
}
