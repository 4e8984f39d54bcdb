//! Where a blob's bytes go: per plane, how many units are coded, raw or constant, and how many bytes
//! the header, tables, directory, selectors and rANS streams take. Used by `tensorzip info`.

use crate::blob::{BlobView, PlaneMode, Scheme, SEL_CONST, SEL_RAW};
use crate::error::Result;

/// Per-plane statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlaneStats {
    /// Frequency tables of the plane.
    pub tables: usize,
    /// Bytes of those tables.
    pub table_bytes: usize,
    /// Units coded with a table (rANS).
    pub coded_units: u64,
    /// Units stored raw.
    pub raw_units: u64,
    /// Units in constant chunks or blocks.
    pub const_units: u64,
    /// Units of chunks where the plane is conditioned (coded with the conditional table where the
    /// condition plane has the conditioning value, raw elsewhere; which is which only decoding
    /// tells).
    pub cond_units: u64,
    /// Whether the plane is paired (format version 2): its coded units are coded two a symbol.
    pub paired: bool,
}

impl PlaneStats {
    /// A short mode summary such as `"coded 97% raw 3%"` (`cond` for conditioned units, `paired`
    /// for coded units of a paired plane).
    pub fn summary(&self) -> String {
        let total =
            (self.coded_units + self.raw_units + self.const_units + self.cond_units).max(1) as f64;
        let mut parts = Vec::new();
        let coded = match self.paired {
            true => "paired",
            false => "coded",
        };
        for (name, v) in [
            (coded, self.coded_units),
            ("cond", self.cond_units),
            ("raw", self.raw_units),
            ("const", self.const_units),
        ] {
            if v > 0 {
                parts.push(format!("{name} {:.0}%", v as f64 / total * 100.0));
            }
        }
        if parts.is_empty() {
            "empty".into()
        } else {
            parts.join(" ")
        }
    }
}

/// Statistics of a whole blob.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobStats {
    pub stored: bool,
    pub blob_bytes: usize,
    pub original_bytes: u64,
    /// Header, tables and directory.
    pub overhead_bytes: usize,
    pub selector_bytes: usize,
    pub rans_bytes: usize,
    pub raw_bytes: usize,
    pub planes: Vec<PlaneStats>,
}

impl BlobStats {
    /// Parses `blob` (validating its header and directory) and gathers the statistics.
    pub fn of(blob: &[u8]) -> Result<BlobStats> {
        let view = BlobView::parse(blob)?;
        let h = &view.header;
        let mut st = BlobStats {
            stored: h.scheme == Scheme::Stored,
            blob_bytes: blob.len(),
            original_bytes: h.nbytes(),
            overhead_bytes: view.overhead_len(),
            ..Default::default()
        };
        if st.stored {
            st.raw_bytes = h.nbytes() as usize;
            return Ok(st);
        }
        let us = h.planes();
        st.planes = (0..us)
            .map(|p| PlaneStats {
                tables: view.tables[p].len(),
                table_bytes: view.tables[p]
                    .iter()
                    .map(|t| t.serialized_len())
                    .sum::<usize>()
                    + view.pairs[p].as_ref().map_or(0, |t| t.serialized_len()),
                paired: view.pairs[p].is_some(),
                ..Default::default()
            })
            .collect();
        let bu = h.block_units as usize;
        for c in 0..h.n_chunks() as usize {
            let e = view.entry(c)?;
            let len = h.chunk_len(c as u64);
            let nb = len.div_ceil(bu);
            let payload = view.payload(c);
            let mut cursor = 0;
            for p in 0..us {
                let ps = &mut st.planes[p];
                match e.modes[p] {
                    PlaneMode::Cond => ps.cond_units += len as u64,
                    PlaneMode::Raw => ps.raw_units += len as u64,
                    PlaneMode::Const(_) => ps.const_units += len as u64,
                    PlaneMode::Blocks => {
                        let sels = payload.get(cursor..cursor + nb).unwrap_or(&[]);
                        cursor += nb;
                        for (b, &s) in sels.iter().enumerate() {
                            let bl = bu.min(len - b * bu) as u64;
                            match s {
                                SEL_RAW => ps.raw_units += bl,
                                SEL_CONST => ps.const_units += bl,
                                _ => ps.coded_units += bl,
                            }
                        }
                    }
                }
            }
            st.selector_bytes += cursor.min(payload.len());
            st.rans_bytes += e.rans_len as usize;
            st.raw_bytes += payload.len().saturating_sub(cursor + e.rans_len as usize);
        }
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{compress, sample, CompressOptions, DType};

    #[test]
    fn conditioned_planes_are_summarised_as_such() {
        let w = sample::weights(64, 1024, DType::F32, 3);
        let shape = [64u64, 1024];
        let on = compress(&w, DType::F32, &shape, &CompressOptions::default()).unwrap();
        let st = BlobStats::of(&on).unwrap();
        // fp32 weights: the plane below the exponent (plane 2) is conditioned on the exponent.
        assert_eq!(st.planes[2].cond_units, 64 * 1024);
        assert_eq!(st.planes[2].summary(), "cond 100%");
        assert_eq!(st.planes[2].coded_units, 0);
        assert!(st.planes[3].summary().starts_with("coded"));
        let opts = CompressOptions {
            condition: crate::Condition::Off,
            ..Default::default()
        };
        let off = compress(&w, DType::F32, &shape, &opts).unwrap();
        let st = BlobStats::of(&off).unwrap();
        assert!(st.planes.iter().all(|p| p.cond_units == 0));
        assert!(st.planes.iter().all(|p| !p.summary().contains("cond")));
    }

    /// A version 2 blob's paired plane is summarised as `paired`, its pair table among its
    /// table bytes.
    #[test]
    fn paired_planes_are_summarised_as_such() {
        let w = sample::weights(64, 1024, DType::BF16, 3);
        let opts = CompressOptions {
            pair_exponents: true,
            ..Default::default()
        };
        let blob = compress(&w, DType::BF16, &[64, 1024], &opts).unwrap();
        let st = BlobStats::of(&blob).unwrap();
        assert!(st.planes[1].paired && !st.planes[0].paired);
        assert!(
            st.planes[1].summary().starts_with("paired"),
            "{}",
            st.planes[1].summary()
        );
        let view = BlobView::parse(&blob).unwrap();
        let tables: usize = view.tables[1].iter().map(|t| t.serialized_len()).sum();
        let pairs = view.pairs[1].as_ref().unwrap().serialized_len();
        assert_eq!(st.planes[1].table_bytes, tables + pairs);
    }

    /// fp16 is conditioned only when asked for (`Condition::All`): by default its blob is the one
    /// without conditioning, byte for byte, and with `All` a tensor whose low byte follows its
    /// high byte gets the conditioned plane and decodes exactly.
    #[test]
    fn fp16_is_conditioned_only_when_asked() {
        use crate::Condition;
        // High bytes 0x30..0x37; where it is 0x34, the low byte is one of four values.
        let mut r = sample::Rng::new(7);
        let w: Vec<u8> = (0..1 << 16)
            .flat_map(|_| {
                let hi = 0x30 + (r.next_u64() % 8) as u16;
                let lo = match hi {
                    0x34 => (r.next_u64() % 4) as u16 * 0x40,
                    _ => r.next_u64() as u16 & 0xFF,
                };
                (hi << 8 | lo).to_le_bytes()
            })
            .collect();
        let shape = [256u64, 256];
        let with = |condition| {
            let opts = CompressOptions {
                condition,
                ..Default::default()
            };
            compress(&w, DType::F16, &shape, &opts).unwrap()
        };
        let (auto, off, all) = (
            with(Condition::Auto),
            with(Condition::Off),
            with(Condition::All),
        );
        assert!(auto == off);
        assert!(BlobStats::of(&auto)
            .unwrap()
            .planes
            .iter()
            .all(|p| p.cond_units == 0));
        assert!(BlobStats::of(&all).unwrap().planes[0].cond_units > 0);
        assert!(all.len() < auto.len());
        assert!(crate::decompress(&all).unwrap().data == w);
    }
}
