//! The CPU decoder of one tensor. Chunks decode independently; within a chunk, each block's coded
//! planes are decoded into small per-plane buffers and merged straight into the caller's output.
//! Chunks are decoded in pairs where possible: the two rANS streams advance in one loop, so the
//! latency of one stream's table lookups hides behind the other's.

use std::sync::OnceLock;

use crate::blob::{BlobHeader, BlobView, ChunkEntry, PlaneMode, SEL_CONST, SEL_RAW};
use crate::error::{corrupt, truncated, Error, Result};
use crate::rans::decode::{DecodeSegment, DecodeTable, Decoder};
use crate::rans::MAX_STASH;
use crate::select;
use crate::transform;

/// Per-thread scratch of the chunk decoder (the block's per-plane buffers, and the conditioned
/// plane's contexts and coded bytes).
#[derive(Default)]
pub struct DecodeScratch {
    planes: Vec<u8>,
    bufs: BlockBufs,
    /// A chunk's block selectors, copied ([`Cursor::sels`]); kept between chunks.
    sels: Vec<u8>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<DecodeScratch> = std::cell::RefCell::new(DecodeScratch::default());
    /// The second chunk's scratch of [`TensorDecoder::decode_chunk_pair`].
    static SCRATCH_B: std::cell::RefCell<DecodeScratch> = std::cell::RefCell::new(DecodeScratch::default());
}

/// Runs `f` with this thread's decoder scratch (kept between calls).
pub fn with_scratch<R>(f: impl FnOnce(&mut DecodeScratch) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut DecodeScratch::default()),
    })
}

/// Runs `f` with this thread's two decoder scratches (for a pair of chunks; kept between calls).
pub fn with_scratch_pair<R>(f: impl FnOnce(&mut DecodeScratch, &mut DecodeScratch) -> R) -> R {
    with_scratch(|a| {
        SCRATCH_B.with(|s| match s.try_borrow_mut() {
            Ok(mut b) => f(a, &mut b),
            Err(_) => f(a, &mut DecodeScratch::default()),
        })
    })
}

/// A validated blob, ready to decode any chunk.
pub struct TensorDecoder<'a> {
    view: BlobView<'a>,
    /// Decoder tables, built on first use (`None` inside for single-symbol tables).
    dec: Vec<Vec<OnceLock<Option<Box<DecodeTable>>>>>,
    /// Conditional table of each plane, built on first use.
    cond_dec: Vec<OnceLock<Box<DecodeTable>>>,
    /// Whether the decoded bytes of blocks whose output lines the rANS steps did not prefetch
    /// are written with non-temporal stores (a tensor of at least [`STREAMING_OUTPUT_BYTES`]: see
    /// [`transform::merge_streaming`] and `Cursor::aim_prefetch`).
    streaming: bool,
}

/// Tensors at least this large are written past the caches (`transform::merge_streaming`) where
/// their lines were not prefetched during the block's steps (blocks with no coded plane, CPUs
/// without AVX2): four times a core's L2 on the CPUs we measure, so the output would leave the
/// caches before anyone reads it anyway.
pub const STREAMING_OUTPUT_BYTES: u64 = 8 << 20;

/// Decoding state of one chunk: its parsed layout, where the current block's raw bytes start, its
/// stream.
struct Cursor<'d, 'a> {
    td: &'d TensorDecoder<'a>,
    c: usize,
    len: usize,
    nb: usize,
    entry: ChunkEntry,
    /// The chunk's block selectors, plane after plane (`nb` each, for the planes of mode
    /// `Blocks`), copied out of the input and checked there: every later read of a selector
    /// reads the checked copy. (Read from the input each time, a mapped file rewritten or cut
    /// short while it is decoded — the truncation guard maps zeros over the cut pages — could
    /// change a selector after its check and index a table that does not exist.)
    sels: Vec<u8>,
    /// Where plane `p`'s selectors start in `sels`.
    sel_at: [usize; 8],
    /// The raw area (block by block; without the stash).
    raw: &'a [u8],
    /// Offset in `raw` of the current block's raw bytes.
    raw_off: usize,
    /// Offset in `raw` up to which the steps were asked to prefetch.
    raw_pf: usize,
    /// The conditioned plane and its condition plane.
    cond: Option<(usize, usize)>,
    /// The paired plane (version 2), where the chunk codes it (mode `Blocks`).
    paired: Option<usize>,
    rans: Option<Decoder<'a>>,
}

/// A block's paired plane (version 2) where its selector names a table: the ranks' decoder
/// table (`None` for a single-symbol table, whose rank is `single`) and how many ranks.
struct PairGroup<'d> {
    table: Option<&'d DecodeTable>,
    single: u8,
    /// The block's units.
    len: usize,
}

impl PairGroup<'_> {
    /// The block's ranks: one a pair of units (an odd last unit is its escape group's).
    fn ranks(&self) -> usize {
        self.len / 2
    }
}

impl<'d, 'a> Cursor<'d, 'a> {
    /// Parses chunk `c`'s selectors (copied into `sels`, a buffer to reuse) and locates its
    /// stream and raw area.
    fn new(td: &'d TensorDecoder<'a>, c: usize, mut sels: Vec<u8>) -> Result<Self> {
        let h = &td.view.header;
        let us = h.planes();
        let entry = td.view.entry(c)?;
        let len = h.chunk_len(c as u64);
        let payload = td.view.payload(c);
        let nb = len.div_ceil(h.block_units as usize);

        let mut cursor = 0usize;
        let mut sel_at = [0usize; 8];
        sels.clear();
        let mut need_rans = false;
        let mut cond = None;
        for p in 0..us {
            match entry.modes[p] {
                PlaneMode::Blocks => {
                    let Some(s) = payload.get(cursor..cursor + nb) else {
                        return truncated(format!("block selectors of chunk {c}"));
                    };
                    sel_at[p] = sels.len();
                    sels.extend_from_slice(s);
                    let k = td.view.tables[p].len();
                    for &v in &sels[sel_at[p]..] {
                        if v == SEL_RAW || v == SEL_CONST {
                            continue;
                        }
                        match td.view.tables[p].get(v as usize) {
                            Some(t) => need_rans |= !t.is_single(),
                            None => {
                                return corrupt(format!(
                                    "chunk {c} plane {p}: selector {v} but {k} tables"
                                ))
                            }
                        }
                    }
                    cursor += nb;
                }
                PlaneMode::Cond => {
                    // BlobView::entry checked that this plane has a conditional table, so it is the
                    // dtype's conditioned plane.
                    cond = h.dtype.conditioned_plane();
                }
                PlaneMode::Raw | PlaneMode::Const(_) => {}
            }
        }
        let paired = td
            .view
            .paired_plane()
            .filter(|&o| entry.modes[o] == PlaneMode::Blocks);
        let rans_len = entry.rans_len as usize;
        let Some(rans) = payload.get(cursor..cursor + rans_len) else {
            return truncated(format!("rANS stream of chunk {c}"));
        };
        cursor += rans_len;
        // With a conditioned plane, or a paired one (escapes), whether the stream is needed is
        // known only while decoding.
        let known = cond.is_none() && paired.is_none();
        if need_rans && rans_len == 0 || known && !need_rans && rans_len > 0 {
            return corrupt(format!(
                "chunk {c}: rANS stream of {rans_len} bytes where it is {}needed",
                if need_rans { "" } else { "not " }
            ));
        }
        let rans = if rans_len > 0 {
            Some(Decoder::new(rans)?)
        } else {
            None
        };
        Ok(Cursor {
            td,
            c,
            len,
            nb,
            entry,
            sels,
            sel_at,
            raw: &payload[cursor..],
            raw_off: 0,
            raw_pf: 0,
            cond,
            paired,
            rans,
        })
    }

    fn block_len(&self, b: usize) -> usize {
        let bu = self.td.view.header.block_units as usize;
        bu.min(self.len - b * bu)
    }

    /// Plane `p`'s selector of block `b` (a plane of mode `Blocks`, `b < nb`).
    fn sel(&self, p: usize, b: usize) -> u8 {
        self.sels[self.sel_at[p] + b]
    }

    /// Raw bytes of each plane in block `b`, but for the conditioned plane (known only once its
    /// condition is decoded), and their offsets within the block's raw bytes.
    fn layout(&self, b: usize) -> ([usize; 8], [usize; 8], usize) {
        let blen = self.block_len(b);
        let (mut off, mut size, mut total) = ([0usize; 8], [0usize; 8], 0);
        for p in 0..self.td.view.header.planes() {
            off[p] = total;
            size[p] = match self.entry.modes[p] {
                PlaneMode::Raw => blen,
                PlaneMode::Blocks => match self.sel(p, b) {
                    SEL_RAW => blen,
                    SEL_CONST => 1,
                    _ => 0,
                },
                PlaneMode::Const(_) | PlaneMode::Cond => 0,
            };
            total += size[p];
        }
        (off, size, total)
    }

    /// Phase 1 of block `b`: fills planes of a constant or single-symbol table into `scratch` (one
    /// `block_units` slice per plane) and returns the coded segments, which decode into `scratch` too.
    fn prepare<'s>(&self, b: usize, scratch: &'s mut [u8]) -> Segments<'d, 's> {
        let h = &self.td.view.header;
        let bu = h.block_units as usize;
        let blen = self.block_len(b);
        let mut segs = Segments::new();
        for (p, buf) in scratch.chunks_mut(bu).enumerate().take(h.planes()) {
            let buf = &mut buf[..blen];
            match self.entry.modes[p] {
                PlaneMode::Raw | PlaneMode::Cond => {}
                PlaneMode::Const(v) => buf.fill(v),
                PlaneMode::Blocks => match self.sel(p, b) {
                    // The bytes of raw and constant blocks are taken from the raw area in phase 2.
                    SEL_RAW | SEL_CONST => {}
                    // A paired plane's ranks are a group of their own (`pair_group`).
                    _ if self.paired == Some(p) => {}
                    j => match self.td.table(p, j as usize) {
                        None => buf.fill(self.td.view.tables[p][j as usize].single_symbol()),
                        Some(table) => segs.push(DecodeSegment { table, out: buf }),
                    },
                },
            }
        }
        segs
    }

    fn rans(&mut self) -> Result<&mut Decoder<'a>> {
        let c = self.c;
        self.rans
            .as_mut()
            .ok_or_else(|| Error::Corrupt(format!("chunk {c}: coded symbols but no rANS stream")))
    }

    /// Decodes block `b` of this chunk into `out` (the chunk's bytes).
    fn decode_block(
        &mut self,
        b: usize,
        scratch: &mut DecodeScratch,
        out: &mut [u8],
    ) -> Result<()> {
        let blen = self.block_len(b);
        let mut segs = self.prepare(b, &mut scratch.planes);
        let pg = self.pair_group(b);
        if !segs.is_empty() || pg.is_some() {
            self.aim_prefetch(b, out, !segs.is_empty(), pg.as_ref());
        }
        if !segs.is_empty() {
            self.rans()?.decode_block(segs.as_mut_slice(), blen)?;
        }
        if let Some(pg) = pg {
            let bufs = &mut scratch.bufs;
            if let Some(mut seg) = self.rank_segment(&pg, bufs) {
                self.rans()?
                    .decode_block(std::slice::from_mut(&mut seg), pg.ranks())?;
            }
            self.expand_ranks(b, &pg, &mut scratch.planes, bufs)?;
            if let Some(mut seg) = self.escape_segment(&pg, bufs) {
                let n = seg.out.len();
                self.rans()?
                    .decode_block(std::slice::from_mut(&mut seg), n)?;
            }
            self.patch_pairs(b, &pg, &mut scratch.planes, bufs)?;
        }
        self.finish_block(b, &mut scratch.planes, &mut scratch.bufs, out)
    }

    /// Block `b`'s paired plane, where its selector names a table (else `None`).
    fn pair_group(&self, b: usize) -> Option<PairGroup<'d>> {
        let o = self.paired?;
        let j = match self.sel(o, b) {
            SEL_RAW | SEL_CONST => return None,
            j => j as usize,
        };
        let td: &'d TensorDecoder<'a> = self.td;
        Some(PairGroup {
            table: td.table(o, j),
            single: td.view.tables[o][j].single_symbol(),
            len: self.block_len(b),
        })
    }

    /// The ranks of a paired block: their segment (into `bufs.ranks`) where they are coded; a
    /// single-symbol table's fill them here and there is none.
    fn rank_segment<'s>(
        &self,
        pg: &PairGroup<'d>,
        bufs: &'s mut BlockBufs,
    ) -> Option<DecodeSegment<'d, 's>> {
        bufs.ranks.resize(pg.ranks(), 0);
        let ranks = &mut bufs.ranks[..pg.ranks()];
        match pg.table {
            Some(table) if pg.ranks() > 0 => Some(DecodeSegment { table, out: ranks }),
            Some(_) => None,
            None => {
                ranks.fill(pg.single);
                None
            }
        }
    }

    /// A paired block's escape group, once its ranks are expanded (`bufs.escaped` holds the
    /// escaped pairs): its segment (into `bufs.escapes`, coded with the uniform table), where it
    /// has symbols.
    fn escape_segment<'s>(
        &self,
        pg: &PairGroup<'d>,
        bufs: &'s mut BlockBufs,
    ) -> Option<DecodeSegment<'d, 's>> {
        let n = 2 * bufs.escaped.len() + pg.len % 2;
        bufs.escapes.resize(n, 0);
        (n > 0).then(|| DecodeSegment {
            table: crate::pairs::uniform_decode_table(),
            out: &mut bufs.escapes[..n],
        })
    }

    /// The pairs of a paired block's ranks (`bufs.ranks`) into its plane's scratch, the escaped
    /// ones noted in `bufs.escaped` ([`crate::pairs::PairTable::expand_ranks`]).
    fn expand_ranks(
        &self,
        b: usize,
        pg: &PairGroup<'d>,
        scratch: &mut [u8],
        bufs: &mut BlockBufs,
    ) -> Result<()> {
        let (table, out) = self.paired_out(pg, scratch);
        let r = table.expand_ranks(&bufs.ranks[..pg.ranks()], out, &mut bufs.escaped);
        r.map_err(|e| self.in_block(b, e))
    }

    /// A paired block's escaped pairs and odd unit from its escape group (`bufs.escapes`).
    fn patch_pairs(
        &self,
        b: usize,
        pg: &PairGroup<'d>,
        scratch: &mut [u8],
        bufs: &BlockBufs,
    ) -> Result<()> {
        let (table, out) = self.paired_out(pg, scratch);
        let r = table.patch(&bufs.escaped, &bufs.escapes, out);
        r.map_err(|e| self.in_block(b, e))
    }

    /// The paired plane's table and its scratch bytes of a block of `pg.len` units.
    fn paired_out<'s>(
        &self,
        pg: &PairGroup<'d>,
        scratch: &'s mut [u8],
    ) -> (&'d crate::pairs::PairTable, &'s mut [u8]) {
        let o = self.paired.expect("a pair group has a paired plane");
        let bu = self.td.view.header.block_units as usize;
        let td: &'d TensorDecoder<'a> = self.td;
        let table = td.view.pairs[o]
            .as_ref()
            .expect("a paired plane has a pair table");
        (table, &mut scratch[o * bu..o * bu + pg.len])
    }

    /// `e` with the chunk and block it happened in, where it says what is wrong with the blob.
    fn in_block(&self, b: usize, e: Error) -> Error {
        match e {
            Error::Corrupt(m) => Error::Corrupt(format!("chunk {} block {b}: {m}", self.c)),
            other => other,
        }
    }

    /// Phase 2 of block `b` (after its main segments): the conditioned plane (its condition, its coded
    /// bytes, its raw bytes), the stash at the last block, and the merge into `out`.
    fn finish_block(
        &mut self,
        b: usize,
        scratch: &mut [u8],
        bufs: &mut BlockBufs,
        out: &mut [u8],
    ) -> Result<()> {
        let st = self.finish_start(b, scratch, bufs)?;
        if st.coded > 0 {
            let table = self.cond_table();
            let mut seg = [DecodeSegment {
                table,
                out: &mut bufs.sub[..st.coded],
            }];
            self.rans()?.decode_block(&mut seg, st.coded)?;
        }
        self.finish_end(b, &st, scratch, bufs, out)
    }

    /// Has the rANS steps of block `b` prefetch its output lines ([`Decoder::prefetch_output`]):
    /// a large tensor's block is then merged with ordinary stores instead of non-temporal ones,
    /// and a smaller tensor's ordinary stores (which read their lines from memory anyway) find
    /// them arrived. The latter measured on all-MiniLM-L6-v2, every tensor decoded into a warm
    /// buffer on one thread, with / without, alternating in one process (2026-12-03, 30 rounds):
    /// bf16 +10-14%, fp32 +9%, fp16 +12%. Also the block's raw bytes, for reading
    /// ([`Decoder::prefetch_input`]); with / without, same VM and method (2026-12-03 12:1x, 16-20
    /// rounds): one thread, one 8192 x 4096 tensor fp32 / bf16 / fp16 +15% / +4-14% / +9%, all of
    /// MiniLM +11% / +9% / +14%; two threads fp32 +20%, bf16 +3%, MiniLM fp32 +11%; the AVX2
    /// steps (`TENSORZIP_NO_AVX512=1`) fp32 +13%, MiniLM bf16 +1%. Prefetching one block further
    /// ahead changed nothing (+1-2% / -0.3-0.7%), and the stream's words, 4 KiB ahead at each
    /// block, cost 2-4%: the hardware follows the stream.
    fn aim_prefetch(&mut self, b: usize, out: &[u8], main: bool, pairs: Option<&PairGroup<'d>>) {
        let us = self.td.view.header.planes();
        let blen = self.block_len(b);
        let out_start = b * self.td.view.header.block_units as usize * us;
        // The block's full steps: one per 32 units of the main group, one per 32 ranks.
        let steps = match main {
            true => blen / 32,
            false => 0,
        } + pairs.map_or(0, |pg| match pg.table {
            Some(_) => pg.ranks() / 32,
            None => 0,
        });
        if let (Some(r), Some(o)) = (
            self.rans.as_mut(),
            out.get(out_start..out_start + blen * us),
        ) {
            // A block's full steps (one per 32 units) prefetch its output (`us` lines per 32
            // units), at most two lines a step: 4-byte units within all of their main steps.
            // Four lines a step (done halfway) was best until the raw bytes were prefetched
            // too; since then two are +2-10% on fp32 at one thread (+8% at two; 4-32-128 MiB,
            // in one process, 12-40 rounds; one a step -19%), 8-byte units unchanged (+1%),
            // 2-byte units at one a step unchanged (bf16) or -25% (fp16). A paired block has
            // fewer steps (its ranks take one per 64 units): as many lines a step as it takes to
            // cover the output by its last one.
            let per_step = match pairs {
                None => us.min(2),
                Some(_) => us
                    .min(2)
                    .max((blen * us).div_ceil(64).div_ceil(steps.max(1))),
            };
            r.prefetch_output(o, per_step);
        }
        // The raw bytes the block's merge reads after its steps (at most `fixed` plus one byte a
        // unit of the conditioned plane; lines past them are the next block's), prefetched a
        // few lines a step over all of its full steps: the payload is read for the first time
        // there, and the hardware's stream prefetcher restarts at every 4 KiB page.
        let (_, _, fixed) = self.layout(b);
        let n = fixed + if self.cond.is_some() { blen } else { 0 };
        let raw_start = self.raw_pf.max(self.raw_off);
        let raw_end = (self.raw_off + n).min(self.raw.len());
        if let (Some(r), Some(bytes)) = (self.rans.as_mut(), self.raw.get(raw_start..raw_end)) {
            r.prefetch_input(bytes, bytes.len().div_ceil(64).div_ceil(steps.max(1)));
            self.raw_pf = raw_end;
        }
    }

    /// The decoder table of the conditioned plane (only where the chunk has one).
    fn cond_table(&self) -> &'d DecodeTable {
        let (p, _) = self
            .cond
            .expect("coded units only with a conditioned plane");
        self.td.cond_table(p)
    }

    /// Phase 2a of block `b`: which units of the conditioned plane are coded (their masks in
    /// `bufs.masks`, room for their bytes in `bufs.sub`), and how the block's raw bytes lie.
    fn finish_start(
        &mut self,
        b: usize,
        scratch: &mut [u8],
        bufs: &mut BlockBufs,
    ) -> Result<Finish> {
        let h = &self.td.view.header;
        let bu = h.block_units as usize;
        let blen = self.block_len(b);
        let (off, size, fixed) = self.layout(b);
        let avail = self.raw.len() - self.raw_off;
        let area = &self.raw[self.raw_off..];
        // The conditioned plane: which units are coded, from the condition plane's bytes.
        let mut coded = 0;
        if let Some((p, q)) = self.cond {
            let value = self.td.view.cond[p]
                .as_ref()
                .expect("a conditioned plane has a table")
                .0;
            let qbuf = &mut scratch[q * bu..q * bu + blen];
            match self.entry.modes[q] {
                PlaneMode::Raw | PlaneMode::Blocks if size[q] > 0 => {
                    let Some(bytes) = area.get(off[q]..off[q] + size[q]) else {
                        return corrupt(format!("chunk {}: raw area ends early", self.c));
                    };
                    if size[q] == 1 {
                        qbuf.fill(bytes[0]);
                    } else {
                        qbuf.copy_from_slice(bytes);
                    }
                }
                _ => {}
            }
            coded = select::masks(value, qbuf, &mut bufs.masks);
        }
        let cond_raw = if self.cond.is_some() { blen - coded } else { 0 };
        let total = fixed + cond_raw;
        let last = b + 1 == self.nb;
        let stash_len = if last && self.rans.is_some() {
            (if self.cond.is_some() { cond_raw } else { total }).min(MAX_STASH)
        } else {
            0
        };
        let from_area = total - stash_len;
        if from_area > avail || (last && from_area != avail) {
            return corrupt(format!(
                "chunk {}: raw area holds {avail} bytes for the rest, {from_area} needed",
                self.c
            ));
        }
        // Spare bytes let the scatter read whole groups (of 64 units with AVX-512, else 8) to
        // the end.
        bufs.sub.resize(coded + 64, 0);
        Ok(Finish {
            off,
            fixed,
            coded,
            total,
            last,
            stash_len,
            from_area,
        })
    }

    /// Phase 2c of block `b`, once the conditioned plane's coded bytes are in `bufs.sub`: the
    /// stash at the last block, the scatter of the conditioned plane, and the merge into `out`.
    fn finish_end(
        &mut self,
        b: usize,
        st: &Finish,
        scratch: &mut [u8],
        bufs: &mut BlockBufs,
        out: &mut [u8],
    ) -> Result<()> {
        let h = &self.td.view.header;
        let us = h.planes();
        let bu = h.block_units as usize;
        let blen = self.block_len(b);
        let (off, fixed, total, from_area) = (st.off, st.fixed, st.total, st.from_area);
        // Whether the steps prefetched this block's output (before the stream may end below).
        let prefetched = self.rans.as_mut().is_some_and(|r| r.take_prefetched());
        let area = &self.raw[self.raw_off..];
        // The block's raw bytes (its first `total`; more may follow): from the area, plus the
        // stash at the end of the chunk.
        let seg: &[u8] = if st.last && self.rans.is_some() {
            let c = self.c;
            let stash = self
                .rans
                .take()
                .expect("checked")
                .finish(st.stash_len)
                .map_err(|e| match e {
                    Error::Corrupt(m) => Error::Corrupt(format!("chunk {c}: {m}")),
                    other => other,
                })?;
            bufs.tail.clear();
            bufs.tail.extend_from_slice(&area[..from_area]);
            bufs.tail.extend_from_slice(&stash[..st.stash_len]);
            // Spare bytes after the block's, for the scatter below.
            bufs.tail.resize(total + 64, 0);
            &bufs.tail
        } else {
            area
        };
        let start = b * bu * us;
        // Large output past the caches by non-temporal stores, unless its lines were just
        // prefetched for writing (then ordinary stores do not wait for memory).
        let streaming = self.td.streaming && !prefetched;
        let raw_block = |p: usize| {
            matches!(self.entry.modes[p], PlaneMode::Raw)
                || matches!(self.entry.modes[p], PlaneMode::Blocks if self.sel(p, b) == SEL_RAW)
        };
        let const_block = |p: usize| matches!(self.entry.modes[p], PlaneMode::Blocks if self.sel(p, b) == SEL_CONST);
        // Every plane's bytes for the merge but the conditioned plane's, whose scratch the
        // scatter fills.
        let mut srcs: [&[u8]; 8] = [&[]; 8];
        let mut cond_buf: &mut [u8] = &mut [];
        for (p, buf) in scratch.chunks_mut(bu).enumerate().take(us) {
            match self.cond {
                Some((q, _)) if q == p => cond_buf = &mut buf[..blen],
                _ => {
                    srcs[p] =
                        block_plane(raw_block(p), const_block(p), seg, off[p], &mut buf[..blen])
                }
            }
        }
        let (t, units) = (h.dtype.transform(), &mut out[start..start + blen * us]);
        // The conditioned plane's raw bytes, with whatever follows them in the area (the next
        // blocks', or the spare bytes at the last block): the scatter takes only the block's,
        // but its vector loops read 64 bytes at a time and stop where fewer remain, leaving a
        // block's last one or two groups of 64 units to the slower separate passes otherwise
        // (3-5% of a one-thread decode).
        let scattered = (&bufs.masks[..], &bufs.sub[..], &seg[fixed..]);
        match (self.cond, us) {
            // The scatter and the merge in one pass: two-byte units whose plane 0 is conditioned
            // on plane 1 (bf16, fp16), four-byte units whose plane 2 is conditioned on plane 3
            // (fp32). The non-temporal merge keeps the separate passes.
            (Some((0, 1)), 2) if !streaming => {
                select::scatter_merge2(t, scattered, srcs[1], cond_buf, units)
            }
            (Some((2, 3)), 4) if !streaming => {
                select::scatter_merge4(t, scattered, [srcs[0], srcs[1], srcs[3]], cond_buf, units)
            }
            _ => {
                if let Some((p, _)) = self.cond {
                    select::scatter(scattered.0, scattered.1, scattered.2, cond_buf);
                    srcs[p] = cond_buf;
                }
                let merge = if streaming {
                    transform::merge_streaming
                } else {
                    transform::merge
                };
                merge(t, &srcs[..us], units);
            }
        }
        self.raw_off += from_area;
        Ok(())
    }
}

/// A block's bytes of one plane for the merge (`buf.len()` of them): its raw bytes at `seg[at..]`
/// (`raw`), else its decoded bytes in `buf`, which a block of one repeated byte (`fill`: the byte
/// at `seg[at]`) fills first.
fn block_plane<'s>(raw: bool, fill: bool, seg: &'s [u8], at: usize, buf: &'s mut [u8]) -> &'s [u8] {
    if raw {
        return &seg[at..at + buf.len()];
    }
    if fill {
        buf.fill(seg[at]);
    }
    buf
}

/// The steps of a block's segments in each of two chunks (`(cursor, segments, length)`): both
/// streams in one loop ([`Decoder::decode_block_pair`]) when both have segments, else the one
/// that has (a chunk without segments here may have no stream at all).
fn steps_of_both<'a>(
    (ca, ga, la): (&mut Cursor<'_, 'a>, &mut [DecodeSegment<'_, '_>], usize),
    (cb, gb, lb): (&mut Cursor<'_, 'a>, &mut [DecodeSegment<'_, '_>], usize),
) -> Result<()> {
    match (ga.is_empty(), gb.is_empty()) {
        (false, false) => Decoder::decode_block_pair((ca.rans()?, ga, la), (cb.rans()?, gb, lb)),
        (false, true) => ca.rans()?.decode_block(ga, la),
        (true, false) => cb.rans()?.decode_block(gb, lb),
        (true, true) => Ok(()),
    }
}

/// The coded segments of a block (at most one per plane), kept on the stack: a `Vec` per block
/// was an allocation and a free for every 4096 units decoded (~3% of a one-thread fp32 decode).
struct Segments<'t, 'o> {
    items: [DecodeSegment<'t, 'o>; 8],
    n: usize,
}

/// The table of the unused entries of a [`Segments`] (never decoded with: they are past `n`).
static UNUSED_TABLE: DecodeTable = DecodeTable {
    slots: [0; crate::rans::PROB_SCALE as usize],
    ranked: None,
};

impl<'t, 'o> Segments<'t, 'o> {
    fn new() -> Self {
        Segments {
            items: std::array::from_fn(|_| DecodeSegment {
                table: &UNUSED_TABLE,
                out: &mut [],
            }),
            n: 0,
        }
    }

    /// Adds a segment (a block has at most one per plane, and at most 8 planes).
    fn push(&mut self, seg: DecodeSegment<'t, 'o>) {
        self.items[self.n] = seg;
        self.n += 1;
    }

    fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn as_mut_slice(&mut self) -> &mut [DecodeSegment<'t, 'o>] {
        &mut self.items[..self.n]
    }
}

/// How a block's raw bytes lie (phase 2 of the decoder, between its steps).
struct Finish {
    /// Offset of each plane's raw bytes within the block's.
    off: [usize; 8],
    /// Raw bytes of the planes other than the conditioned one.
    fixed: usize,
    /// Coded units of the conditioned plane.
    coded: usize,
    /// Raw bytes of the block in all.
    total: usize,
    /// Whether this is the chunk's last block (its raw bytes end with the stash).
    last: bool,
    stash_len: usize,
    /// Raw bytes of the block read from the raw area (`total - stash_len`).
    from_area: usize,
}

/// Per-thread buffers of phase 2.
#[derive(Default)]
struct BlockBufs {
    sub: Vec<u8>,
    masks: Vec<u8>,
    tail: Vec<u8>,
    /// A paired block's ranks, the indices of its escaped pairs, and its escape group
    /// (version 2).
    ranks: Vec<u8>,
    escaped: Vec<u32>,
    escapes: Vec<u8>,
}

impl<'a> TensorDecoder<'a> {
    /// Parses and validates `blob`.
    pub fn new(blob: &'a [u8]) -> Result<Self> {
        let view = BlobView::parse(blob)?;
        let dec = view
            .tables
            .iter()
            .map(|ts| ts.iter().map(|_| OnceLock::new()).collect())
            .collect();
        let cond_dec = view.cond.iter().map(|_| OnceLock::new()).collect();
        let streaming = view.header.nbytes() >= STREAMING_OUTPUT_BYTES;
        Ok(TensorDecoder {
            view,
            dec,
            cond_dec,
            streaming,
        })
    }

    /// The blob's header.
    pub fn header(&self) -> &BlobHeader {
        &self.view.header
    }

    /// The validated view (tables, directory).
    pub fn view(&self) -> &BlobView<'a> {
        &self.view
    }

    fn table(&self, p: usize, j: usize) -> Option<&DecodeTable> {
        self.dec[p][j]
            .get_or_init(|| {
                let t = &self.view.tables[p][j];
                (!t.is_single()).then(|| t.decode_table())
            })
            .as_deref()
    }

    fn cond_table(&self, p: usize) -> &DecodeTable {
        self.cond_dec[p].get_or_init(|| {
            self.view.cond[p]
                .as_ref()
                .expect("a conditioned plane has a table")
                .1
                .decode_table()
        })
    }

    fn scratch_len(&self) -> usize {
        self.view.header.planes() * self.view.header.block_units as usize
    }

    /// Decodes chunk `c` into `out`, which holds exactly that chunk's bytes.
    pub fn decode_chunk(
        &self,
        c: usize,
        out: &mut [u8],
        scratch: &mut DecodeScratch,
    ) -> Result<()> {
        let mut cur = Cursor::new(self, c, std::mem::take(&mut scratch.sels))?;
        self.chunk_output(&cur, out.len())?;
        scratch.planes.resize(self.scratch_len(), 0);
        let r = (0..cur.nb).try_for_each(|b| cur.decode_block(b, scratch, out));
        scratch.sels = cur.sels;
        self.fence();
        r
    }

    /// Checks that a caller's buffer for `cur`'s chunk holds exactly the chunk's bytes.
    fn chunk_output(&self, cur: &Cursor<'_, 'a>, got: usize) -> Result<()> {
        let expected = cur.len * self.view.header.planes();
        match got == expected {
            true => Ok(()),
            false => Err(Error::OutputSize { expected, got }),
        }
    }

    /// After a chunk call's last block: orders the non-temporal stores of a streaming merge
    /// before whatever the caller does next (one fence per call, not per block).
    fn fence(&self) {
        if self.streaming {
            transform::streaming_fence();
        }
    }

    /// Decodes chunks `c` and `c + 1` into `out_a` and `out_b` (each exactly its chunk's bytes),
    /// block by block in lockstep, so that the two chunks' rANS streams are decoded in one loop
    /// ([`Decoder::decode_block_pair`]): one stream's steps are a chain of dependent operations,
    /// and two chains overlap. The outputs are those of [`TensorDecoder::decode_chunk`] on each,
    /// and it fails exactly when either fails (with the error met first, block by block).
    pub fn decode_chunk_pair(
        &self,
        c: usize,
        out_a: &mut [u8],
        out_b: &mut [u8],
        scratch_a: &mut DecodeScratch,
        scratch_b: &mut DecodeScratch,
    ) -> Result<()> {
        let mut ca = Cursor::new(self, c, std::mem::take(&mut scratch_a.sels))?;
        let mut cb = Cursor::new(
            self,
            c.saturating_add(1),
            std::mem::take(&mut scratch_b.sels),
        )?;
        self.chunk_output(&ca, out_a.len())?;
        self.chunk_output(&cb, out_b.len())?;
        scratch_a.planes.resize(self.scratch_len(), 0);
        scratch_b.planes.resize(self.scratch_len(), 0);
        let r = Self::blocks_pair(&mut ca, &mut cb, out_a, out_b, scratch_a, scratch_b);
        (scratch_a.sels, scratch_b.sels) = (ca.sels, cb.sels);
        self.fence();
        r
    }

    /// The paired planes of block `b` of two chunks (either may have none): both blocks' ranks
    /// in one loop, each expanded into its plane's scratch, both escape groups in one loop, each
    /// patched in.
    fn pairs_of_both(
        (ca, pa, sa): (
            &mut Cursor<'_, 'a>,
            Option<&PairGroup<'_>>,
            &mut DecodeScratch,
        ),
        (cb, pb, sb): (
            &mut Cursor<'_, 'a>,
            Option<&PairGroup<'_>>,
            &mut DecodeScratch,
        ),
        b: usize,
    ) -> Result<()> {
        let len = |s: &Option<DecodeSegment<'_, '_>>| s.as_ref().map_or(0, |s| s.out.len());
        let mut ra = pa.and_then(|pg| ca.rank_segment(pg, &mut sa.bufs));
        let mut rb = pb.and_then(|pg| cb.rank_segment(pg, &mut sb.bufs));
        let (na, nb) = (len(&ra), len(&rb));
        steps_of_both(
            (&mut *ca, ra.as_mut_slice(), na),
            (&mut *cb, rb.as_mut_slice(), nb),
        )?;
        if let Some(pg) = pa {
            ca.expand_ranks(b, pg, &mut sa.planes, &mut sa.bufs)?;
        }
        if let Some(pg) = pb {
            cb.expand_ranks(b, pg, &mut sb.planes, &mut sb.bufs)?;
        }
        let mut ea = pa.and_then(|pg| ca.escape_segment(pg, &mut sa.bufs));
        let mut eb = pb.and_then(|pg| cb.escape_segment(pg, &mut sb.bufs));
        let (ma, mb) = (len(&ea), len(&eb));
        steps_of_both(
            (&mut *ca, ea.as_mut_slice(), ma),
            (&mut *cb, eb.as_mut_slice(), mb),
        )?;
        if let Some(pg) = pa {
            ca.patch_pairs(b, pg, &mut sa.planes, &sa.bufs)?;
        }
        if let Some(pg) = pb {
            cb.patch_pairs(b, pg, &mut sb.planes, &sb.bufs)?;
        }
        Ok(())
    }

    /// The blocks of [`TensorDecoder::decode_chunk_pair`].
    fn blocks_pair(
        ca: &mut Cursor<'_, 'a>,
        cb: &mut Cursor<'_, 'a>,
        out_a: &mut [u8],
        out_b: &mut [u8],
        scratch_a: &mut DecodeScratch,
        scratch_b: &mut DecodeScratch,
    ) -> Result<()> {
        for b in 0..ca.nb.max(cb.nb) {
            if b >= cb.nb {
                ca.decode_block(b, scratch_a, out_a)?;
                continue;
            }
            if b >= ca.nb {
                cb.decode_block(b, scratch_b, out_b)?;
                continue;
            }
            let (la, lb) = (ca.block_len(b), cb.block_len(b));
            let mut ga = ca.prepare(b, &mut scratch_a.planes);
            let mut gb = cb.prepare(b, &mut scratch_b.planes);
            let (pa, pb) = (ca.pair_group(b), cb.pair_group(b));
            if !ga.is_empty() || pa.is_some() {
                ca.aim_prefetch(b, out_a, !ga.is_empty(), pa.as_ref());
            }
            if !gb.is_empty() || pb.is_some() {
                cb.aim_prefetch(b, out_b, !gb.is_empty(), pb.as_ref());
            }
            steps_of_both(
                (&mut *ca, ga.as_mut_slice(), la),
                (&mut *cb, gb.as_mut_slice(), lb),
            )?;
            // A paired plane's ranks, then its escape groups, of the two blocks in one loop each.
            if pa.is_some() || pb.is_some() {
                Self::pairs_of_both(
                    (&mut *ca, pa.as_ref(), scratch_a),
                    (&mut *cb, pb.as_ref(), scratch_b),
                    b,
                )?;
            }
            // The conditioned sub-segments of the two blocks in one loop too (a fifth of a bf16
            // decode's steps).
            let sa = ca.finish_start(b, &mut scratch_a.planes, &mut scratch_a.bufs)?;
            let sb = cb.finish_start(b, &mut scratch_b.planes, &mut scratch_b.bufs)?;
            let mut suba = match sa.coded {
                0 => None,
                n => Some(DecodeSegment {
                    table: ca.cond_table(),
                    out: &mut scratch_a.bufs.sub[..n],
                }),
            };
            let mut subb = match sb.coded {
                0 => None,
                n => Some(DecodeSegment {
                    table: cb.cond_table(),
                    out: &mut scratch_b.bufs.sub[..n],
                }),
            };
            steps_of_both(
                (&mut *ca, suba.as_mut_slice(), sa.coded),
                (&mut *cb, subb.as_mut_slice(), sb.coded),
            )?;
            ca.finish_end(b, &sa, &mut scratch_a.planes, &mut scratch_a.bufs, out_a)?;
            cb.finish_end(b, &sb, &mut scratch_b.planes, &mut scratch_b.bufs, out_b)?;
        }
        Ok(())
    }
}
