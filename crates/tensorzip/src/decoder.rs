//! The CPU decoder of one tensor. Chunks decode independently; within a chunk, each block's coded
//! planes are decoded into small per-plane buffers and merged straight into the caller's output.

use std::sync::OnceLock;

use crate::blob::{BlobHeader, BlobView, PlaneMode, Scheme, SEL_CONST, SEL_RAW};
use crate::error::{corrupt, truncated, Error, Result};
use crate::rans::decode::{DecodeSegment, DecodeTable, Decoder};
use crate::transform;

/// Per-thread scratch of the chunk decoder.
#[derive(Default)]
pub struct DecodeScratch {
    planes: Vec<u8>,
}

/// A validated blob, ready to decode any chunk.
pub struct TensorDecoder<'a> {
    view: BlobView<'a>,
    /// Decoder tables, built on first use (`None` inside for single-symbol tables).
    dec: Vec<Vec<OnceLock<Option<Box<DecodeTable>>>>>,
}

impl<'a> TensorDecoder<'a> {
    /// Parses and validates `blob`.
    pub fn new(blob: &'a [u8]) -> Result<Self> {
        let view = BlobView::parse(blob)?;
        let dec = view.tables.iter().map(|ts| ts.iter().map(|_| OnceLock::new()).collect()).collect();
        Ok(TensorDecoder { view, dec })
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

    /// Decodes chunk `c` into `out`, which holds exactly that chunk's bytes.
    pub fn decode_chunk(&self, c: usize, out: &mut [u8], scratch: &mut DecodeScratch) -> Result<()> {
        let h = &self.view.header;
        debug_assert_eq!(h.scheme, Scheme::Planes);
        let us = h.planes();
        let len = h.chunk_len(c as u64);
        debug_assert_eq!(out.len(), len * us);
        let entry = self.view.entry(c)?;
        let payload = self.view.payload(c);
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
                let k = self.view.tables[p].len();
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

        // Where each plane's raw bytes start, and whether any block needs the rANS stream.
        let mut raw_pos = [0usize; 8];
        let mut raw_total = 0usize;
        let mut need_rans = false;
        for p in 0..us {
            raw_pos[p] = raw_total;
            raw_total += match entry.modes[p] {
                PlaneMode::Raw => len,
                PlaneMode::Const(_) => 0,
                PlaneMode::Blocks => {
                    let mut n = 0;
                    for (b, &s) in sels[p].iter().enumerate() {
                        n += match s {
                            SEL_RAW => block_len(b),
                            SEL_CONST => 1,
                            j => {
                                need_rans |= !self.view.tables[p][j as usize].is_single();
                                0
                            }
                        };
                    }
                    n
                }
            };
        }
        if raw_total != raw.len() {
            return corrupt(format!("chunk {c}: raw area holds {} bytes, selectors need {raw_total}", raw.len()));
        }
        if need_rans != (rans_len > 0) {
            return corrupt(format!("chunk {c}: rANS stream of {rans_len} bytes where it is {}needed", if need_rans { "" } else { "not " }));
        }
        let mut dec = if need_rans { Some(Decoder::new(rans)?) } else { None };

        scratch.planes.resize(us * bu, 0);
        let transform = h.dtype.transform();
        for b in 0..nb {
            let blen = block_len(b);
            // Phase 1: fill constants and decode coded planes into the per-plane buffers.
            {
                let mut segs: Vec<DecodeSegment<'_, '_>> = Vec::with_capacity(us);
                for (p, buf) in scratch.planes.chunks_mut(bu).enumerate().take(us) {
                    let buf = &mut buf[..blen];
                    match entry.modes[p] {
                        PlaneMode::Raw => {}
                        PlaneMode::Const(v) => buf.fill(v),
                        PlaneMode::Blocks => match sels[p][b] {
                            SEL_RAW => {}
                            SEL_CONST => {
                                buf.fill(raw[raw_pos[p]]);
                            }
                            j => match self.table(p, j as usize) {
                                None => buf.fill(self.view.tables[p][j as usize].single_symbol()),
                                Some(table) => segs.push(DecodeSegment { table, out: buf }),
                            },
                        },
                    }
                }
                if !segs.is_empty() {
                    dec.as_mut().expect("need_rans was checked").decode_block(&mut segs, blen)?;
                }
            }
            // Phase 2: gather each plane's source and merge into the output.
            let mut srcs: [&[u8]; 8] = [&[]; 8];
            for (p, buf) in scratch.planes.chunks(bu).enumerate().take(us) {
                let from_raw = match entry.modes[p] {
                    PlaneMode::Raw => true,
                    PlaneMode::Blocks => sels[p][b] == SEL_RAW,
                    PlaneMode::Const(_) => false,
                };
                srcs[p] = if from_raw {
                    let s = &raw[raw_pos[p]..raw_pos[p] + blen];
                    raw_pos[p] += blen;
                    s
                } else {
                    if entry.modes[p] == PlaneMode::Blocks && sels[p][b] == SEL_CONST {
                        raw_pos[p] += 1;
                    }
                    &buf[..blen]
                };
            }
            let start = b * bu * us;
            transform::merge(transform, &srcs[..us], &mut out[start..start + blen * us]);
        }
        if let Some(d) = dec {
            d.finish().map_err(|e| match e {
                Error::Corrupt(m) => Error::Corrupt(format!("chunk {c}: {m}")),
                other => other,
            })?;
        }
        Ok(())
    }
}
