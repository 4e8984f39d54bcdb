//! The CPU decoder of one tensor. Chunks decode independently; within a chunk, each block's coded
//! planes are decoded into small per-plane buffers and merged straight into the caller's output.
//! Chunks are decoded in pairs where possible: the two rANS streams advance in one loop, so the
//! latency of one stream's table lookups hides behind the other's.

use std::sync::OnceLock;

use crate::blob::{BlobHeader, BlobView, ChunkEntry, PlaneMode, Scheme, SEL_CONST, SEL_RAW};
use crate::select;
use crate::error::{corrupt, truncated, Error, Result};
use crate::rans::decode::{DecodeSegment, DecodeTable, Decoder};
use crate::transform;

/// Per-thread scratch of the chunk decoder (per-plane block buffers of two chunks, and the
/// conditioned plane's contexts and coded bytes).
#[derive(Default)]
pub struct DecodeScratch {
    a: Vec<u8>,
    b: Vec<u8>,
    sub: Vec<u8>,
    masks: Vec<u8>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<DecodeScratch> = std::cell::RefCell::new(DecodeScratch::default());
}

/// Runs `f` with this thread's decoder scratch (kept between calls).
pub fn with_scratch<R>(f: impl FnOnce(&mut DecodeScratch) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut DecodeScratch::default()),
    })
}

/// A validated blob, ready to decode any chunk.
pub struct TensorDecoder<'a> {
    view: BlobView<'a>,
    /// Decoder tables, built on first use (`None` inside for single-symbol tables).
    dec: Vec<Vec<OnceLock<Option<Box<DecodeTable>>>>>,
    /// Conditional table of each plane, built on first use.
    cond_dec: Vec<OnceLock<Box<DecodeTable>>>,
}

/// Decoding state of one chunk: its parsed layout, where each plane's raw bytes are, its stream.
struct Cursor<'d, 'a> {
    td: &'d TensorDecoder<'a>,
    c: usize,
    len: usize,
    nb: usize,
    entry: ChunkEntry,
    sels: [&'a [u8]; 8],
    raw: &'a [u8],
    raw_pos: [usize; 8],
    /// The conditioned plane, its condition plane, and where its raw bytes end.
    cond: Option<(usize, usize, usize)>,
    rans: Option<Decoder<'a>>,
}

impl<'d, 'a> Cursor<'d, 'a> {
    /// Parses chunk `c`'s selectors and stream and checks that its raw area has the size they imply.
    fn new(td: &'d TensorDecoder<'a>, c: usize) -> Result<Self> {
        let h = &td.view.header;
        let us = h.planes();
        let len = h.chunk_len(c as u64);
        let entry = td.view.entry(c)?;
        let payload = td.view.payload(c);
        let bu = h.block_units as usize;
        let nb = len.div_ceil(bu);
        let block_len = |b: usize| bu.min(len - b * bu);

        let mut cursor = 0usize;
        let mut sels: [&[u8]; 8] = [&[]; 8];
        for p in 0..us {
            if entry.modes[p] == PlaneMode::Blocks {
                let Some(s) = payload.get(cursor..cursor + nb) else {
                    return truncated(format!("block selectors of chunk {c}"));
                };
                let k = td.view.tables[p].len();
                if let Some(&bad) = s.iter().find(|&&v| (v as usize) >= k && v != SEL_CONST && v != SEL_RAW) {
                    return corrupt(format!("chunk {c} plane {p}: selector {bad} but {k} tables"));
                }
                sels[p] = s;
                cursor += nb;
            }
        }
        let rans_len = entry.rans_len as usize;
        let Some(rans) = payload.get(cursor..cursor + rans_len) else {
            return truncated(format!("rANS stream of chunk {c}"));
        };
        cursor += rans_len;
        let raw = &payload[cursor..];

        // Raw bytes: planes in ascending order, the conditioned plane last (its share is the rest).
        let mut raw_pos = [0usize; 8];
        let mut raw_total = 0usize;
        let mut need_rans = false;
        let mut cond = None;
        for p in 0..us {
            raw_pos[p] = raw_total;
            raw_total += match entry.modes[p] {
                PlaneMode::Raw => len,
                PlaneMode::Const(_) => 0,
                PlaneMode::Cond => {
                    // blob.rs checked that this plane has conditional tables, so it is the dtype's
                    // conditioned plane.
                    let (cp, q) = h.dtype.conditioned_plane().expect("validated by BlobView::entry");
                    debug_assert_eq!(cp, p);
                    cond = Some((p, q, 0));
                    0
                }
                PlaneMode::Blocks => {
                    let mut n = 0;
                    for (b, &s) in sels[p].iter().enumerate() {
                        n += match s {
                            SEL_RAW => block_len(b),
                            SEL_CONST => 1,
                            j => {
                                need_rans |= !td.view.tables[p][j as usize].is_single();
                                0
                            }
                        };
                    }
                    n
                }
            };
        }
        if raw_total > raw.len() || (cond.is_none() && raw_total != raw.len()) {
            return corrupt(format!("chunk {c}: raw area holds {} bytes, selectors need {raw_total}", raw.len()));
        }
        if let Some((p, q, _)) = cond {
            raw_pos[p] = raw_total;
            cond = Some((p, q, raw.len()));
        }
        // With a conditioned plane, whether the stream is needed is known only while decoding.
        if need_rans && rans_len == 0 || cond.is_none() && !need_rans && rans_len > 0 {
            return corrupt(format!("chunk {c}: rANS stream of {rans_len} bytes where it is {}needed", if need_rans { "" } else { "not " }));
        }
        let rans = if rans_len > 0 { Some(Decoder::new(rans)?) } else { None };
        Ok(Cursor { td, c, len, nb, entry, sels, raw, raw_pos, cond, rans })
    }

    fn block_len(&self, b: usize) -> usize {
        let bu = self.td.view.header.block_units as usize;
        bu.min(self.len - b * bu)
    }

    /// Phase 1 of block `b`: fills constant planes into `scratch` (one `block_units` slice per plane)
    /// and returns the coded segments, which decode into `scratch` too.
    fn prepare<'s>(&self, b: usize, scratch: &'s mut [u8]) -> Vec<DecodeSegment<'d, 's>> {
        let h = &self.td.view.header;
        let bu = h.block_units as usize;
        let blen = self.block_len(b);
        let mut segs = Vec::new();
        for (p, buf) in scratch.chunks_mut(bu).enumerate().take(h.planes()) {
            let buf = &mut buf[..blen];
            match self.entry.modes[p] {
                PlaneMode::Raw | PlaneMode::Cond => {}
                PlaneMode::Const(v) => buf.fill(v),
                PlaneMode::Blocks => match self.sels[p][b] {
                    SEL_RAW => {}
                    SEL_CONST => buf.fill(self.raw[self.raw_pos[p]]),
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
        self.rans.as_mut().ok_or_else(|| Error::Corrupt(format!("chunk {c}: coded symbols but no rANS stream")))
    }

    /// Whether block `b` of plane `p` is read from the raw area (rather than `scratch`).
    fn from_raw(&self, p: usize, b: usize) -> bool {
        match self.entry.modes[p] {
            PlaneMode::Raw => true,
            PlaneMode::Blocks => self.sels[p][b] == SEL_RAW,
            PlaneMode::Const(_) | PlaneMode::Cond => false,
        }
    }

    /// Phase 1b of block `b` (after the main segments): the conditioned plane — contexts from the
    /// condition plane, the coded bytes from the stream, the others from the raw area.
    fn decode_cond(&mut self, b: usize, scratch: &mut [u8], sub: &mut Vec<u8>, masks: &mut Vec<u8>) -> Result<()> {
        let Some((p, q, raw_end)) = self.cond else { return Ok(()) };
        let bu = self.td.view.header.block_units as usize;
        let blen = self.block_len(b);
        let value = self.td.view.cond[p].as_ref().expect("a conditioned plane has a table").0;
        let (pbuf, qbuf) = if p < q {
            let (lo, hi) = scratch.split_at_mut(q * bu);
            (&mut lo[p * bu..p * bu + blen], &hi[..blen])
        } else {
            let (lo, hi) = scratch.split_at_mut(p * bu);
            (&mut hi[..blen], &lo[q * bu..q * bu + blen])
        };
        let condition: &[u8] = if self.from_raw(q, b) { &self.raw[self.raw_pos[q]..self.raw_pos[q] + blen] } else { qbuf };
        let t = select::masks(value, condition, masks);
        let nraw = blen - t;
        let start = self.raw_pos[p];
        if start + nraw > raw_end {
            return corrupt(format!("chunk {}: raw bytes of the conditioned plane run out", self.c));
        }
        sub.resize(t, 0);
        if t > 0 {
            let table = self.td.cond_table(p);
            let mut seg = [DecodeSegment { table, out: &mut sub[..] }];
            self.rans()?.decode_block(&mut seg, t)?;
        }
        select::scatter(masks, sub, &self.raw[start..start + nraw], pbuf);
        self.raw_pos[p] = start + nraw;
        Ok(())
    }

    /// Phase 2 of block `b`: gathers each plane's bytes and merges them into the chunk's output.
    fn merge(&mut self, b: usize, scratch: &[u8], out: &mut [u8]) {
        let h = &self.td.view.header;
        let us = h.planes();
        let bu = h.block_units as usize;
        let blen = self.block_len(b);
        let mut srcs: [&[u8]; 8] = [&[]; 8];
        for (p, buf) in scratch.chunks(bu).enumerate().take(us) {
            srcs[p] = if self.from_raw(p, b) {
                let s = &self.raw[self.raw_pos[p]..self.raw_pos[p] + blen];
                self.raw_pos[p] += blen;
                s
            } else {
                if self.entry.modes[p] == PlaneMode::Blocks && self.sels[p][b] == SEL_CONST {
                    self.raw_pos[p] += 1;
                }
                &buf[..blen]
            };
        }
        let start = b * bu * us;
        transform::merge(h.dtype.transform(), &srcs[..us], &mut out[start..start + blen * us]);
    }

    /// Checks the end of the chunk: the stream ended exactly, the raw area was used up.
    fn finish(self) -> Result<()> {
        if let Some((p, _, end)) = self.cond {
            if self.raw_pos[p] != end {
                return corrupt(format!("chunk {}: {} raw bytes left over", self.c, end - self.raw_pos[p]));
            }
        }
        match self.rans {
            None => Ok(()),
            Some(d) => d.finish().map_err(|e| match e {
                Error::Corrupt(m) => Error::Corrupt(format!("chunk {}: {m}", self.c)),
                other => other,
            }),
        }
    }
}

impl<'a> TensorDecoder<'a> {
    /// Parses and validates `blob`.
    pub fn new(blob: &'a [u8]) -> Result<Self> {
        let view = BlobView::parse(blob)?;
        let dec = view.tables.iter().map(|ts| ts.iter().map(|_| OnceLock::new()).collect()).collect();
        let cond_dec = view.cond.iter().map(|_| OnceLock::new()).collect();
        Ok(TensorDecoder { view, dec, cond_dec })
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
        self.cond_dec[p].get_or_init(|| self.view.cond[p].as_ref().expect("a conditioned plane has a table").1.decode_table())
    }

    fn scratch_len(&self) -> usize {
        self.view.header.planes() * self.view.header.block_units as usize
    }

    /// Decodes chunk `c` into `out`, which holds exactly that chunk's bytes.
    pub fn decode_chunk(&self, c: usize, out: &mut [u8], scratch: &mut DecodeScratch) -> Result<()> {
        debug_assert_eq!(self.view.header.scheme, Scheme::Planes);
        let mut cur = Cursor::new(self, c)?;
        debug_assert_eq!(out.len(), cur.len * self.view.header.planes());
        scratch.a.resize(self.scratch_len(), 0);
        for b in 0..cur.nb {
            let blen = cur.block_len(b);
            let mut segs = cur.prepare(b, &mut scratch.a);
            if !segs.is_empty() {
                cur.rans()?.decode_block(&mut segs, blen)?;
            }
            drop(segs);
            cur.decode_cond(b, &mut scratch.a, &mut scratch.sub, &mut scratch.masks)?;
            cur.merge(b, &scratch.a, out);
        }
        cur.finish()
    }

    /// Decodes chunks `c` and `c + 1` into `out_a` and `out_b` together (same result as two
    /// [`TensorDecoder::decode_chunk`] calls, faster).
    pub fn decode_chunk_pair(&self, c: usize, out_a: &mut [u8], out_b: &mut [u8], scratch: &mut DecodeScratch) -> Result<()> {
        let mut ca = Cursor::new(self, c)?;
        let mut cb = Cursor::new(self, c + 1)?;
        scratch.a.resize(self.scratch_len(), 0);
        scratch.b.resize(self.scratch_len(), 0);
        for b in 0..ca.nb.max(cb.nb) {
            let (la, lb) = ((b < ca.nb).then(|| ca.block_len(b)), (b < cb.nb).then(|| cb.block_len(b)));
            let mut sa = if la.is_some() { ca.prepare(b, &mut scratch.a) } else { Vec::new() };
            let mut sb = if lb.is_some() { cb.prepare(b, &mut scratch.b) } else { Vec::new() };
            match (la, lb) {
                (Some(x), Some(y)) if x == y && !sa.is_empty() && sa.len() == sb.len() => {
                    let (Some(da), Some(db)) = (ca.rans.as_mut(), cb.rans.as_mut()) else {
                        return corrupt(format!("chunk {c} or {}: coded symbols but no rANS stream", c + 1));
                    };
                    Decoder::decode_block_pair(da, &mut sa, db, &mut sb, x)?;
                }
                _ => {
                    if let (Some(x), false) = (la, sa.is_empty()) {
                        ca.rans()?.decode_block(&mut sa, x)?;
                    }
                    if let (Some(y), false) = (lb, sb.is_empty()) {
                        cb.rans()?.decode_block(&mut sb, y)?;
                    }
                }
            }
            drop((sa, sb));
            if la.is_some() {
                ca.decode_cond(b, &mut scratch.a, &mut scratch.sub, &mut scratch.masks)?;
                ca.merge(b, &scratch.a, out_a);
            }
            if lb.is_some() {
                cb.decode_cond(b, &mut scratch.b, &mut scratch.sub, &mut scratch.masks)?;
                cb.merge(b, &scratch.b, out_b);
            }
        }
        ca.finish()?;
        cb.finish()
    }

    /// Decodes chunks `first..` into `out`, which holds their bytes back to back (pairs where possible).
    pub fn decode_chunks(&self, first: usize, out: &mut [u8], scratch: &mut DecodeScratch) -> Result<()> {
        let cb = self.view.header.chunk_units as usize * self.view.header.planes();
        let mut c = first;
        let mut rest = out;
        while !rest.is_empty() {
            if rest.len() > cb {
                let (a, tail) = rest.split_at_mut(cb);
                let nb = cb.min(tail.len());
                let (b, tail) = tail.split_at_mut(nb);
                self.decode_chunk_pair(c, a, b, scratch)?;
                rest = tail;
                c += 2;
            } else {
                self.decode_chunk(c, rest, scratch)?;
                break;
            }
        }
        Ok(())
    }
}
