//! Format version 2's pair model in the GPU encoder (docs/FORMAT.md section 12; docs/GPU.md,
//! "Encoder", *Format version 2*): the kernels' job layouts, their launches, and the host's reading
//! of what they decided.
//!
//! On the device (the default): seven small kernels of kernels/search.cu ([`KERNELS`]), on the
//! stream after `tz_enc_tables`, find each tensor's top bytes, make every sampled block's version
//! 1 choice and sum the pair weights of its histogram per table, make the pair table, normalise and
//! expand the rank tables, sum step 6's costs and decide (from the sampled blocks' histograms:
//! no kernel reads the tensor's units); the encode kernel's tables
//! (`PairBlock`) and the tensor's parameters are written on the device, with no host round trip
//! before the encode kernel. The host reads the output while the encoder runs ([`parse_out`]) and
//! writes the blob's head from it.
//!
//! On the host (the host search's path, `encode::pair_models`): the core's own code on the same
//! histograms, and the encode kernel's tables written by [`pair_block`].

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use tensorzip::pairs::{PairCoder, PairTable, MAX_PAIRS};
use tensorzip::rans::table::FreqTable;

use crate::engine::Plain;
use crate::error::{Error, Result};

/// Bytes of the encode kernel's `PairBlock` in front of the rank tables' entries
/// (`PAIR_ENTRIES_AT` in encode.cu, `PAIR_HEAD` in search.cu).
const PAIR_HEAD: u64 = 832;

/// Bytes of a tensor's top map and `tz_pair_top`'s totals and ticket (`PairJob::top`; zeroed
/// before the model runs).
pub(crate) const TOP_BYTES: u64 = 256 + 4 * 256 + 16;

/// Thread blocks of `tz_pair_top` per tensor (`PAIR_TOP_SLICES` in search.cu).
const TOP_SLICES: u32 = 16;

/// Sampled blocks a thread block of `tz_pair_groups` sums (`PAIR_GROUP_BATCH` in search.cu).
const GROUP_BATCH: u32 = 16;

/// The pair model's kernels (search.cu), in launch order.
pub(crate) const KERNELS: [&str; 7] = [
    "tz_pair_top",
    "tz_pair_groups",
    "tz_pair_table",
    "tz_pair_tables",
    "tz_pair_expand",
    "tz_pair_cost",
    "tz_pair_decide",
];

/// One sampled block of a tensor that may pair (layout shared with `struct PairSampleJob` in
/// search.cu).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct PairSampleJob {
    /// Its tensor's index among the [`PairJob`]s.
    pub tensor: u32,
    /// Its index among its tensor's sampled blocks.
    pub block: u32,
}

/// One tensor whose plane 1 may pair (layout shared with `struct PairJob` in search.cu, which
/// describes each field).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct PairJob {
    pub hists: u64,
    pub top: u64,
    pub cls: u64,
    pub n_tables: u64,
    pub pair: u64,
    pub head: u64,
    pub v1_out: u64,
    pub area: u64,
    pub out: u64,
    pub n_blocks: u64,
    pub stride: u32,
    pub n_sampled: u32,
    pub planes: u32,
    pub threshold: u32,
}

// SAFETY: `repr(C)`: two u32 (8 bytes, no padding).
unsafe impl Plain for PairSampleJob {}
// SAFETY: `repr(C)`: ten u64 and four u32 (96 bytes, no padding).
unsafe impl Plain for PairJob {}
const _: () = assert!(std::mem::size_of::<PairSampleJob>() == 8);
const _: () = assert!(std::mem::size_of::<PairJob>() == 96);

/// Bytes of a tensor's area (`PairJob::area`; `pair_area` in search.cu lays it out): the
/// `PairBlock`, `max_tables` tables' entries, code lengths and info words, then the model's
/// scratch — per table the pair weights' sums and their squares (257 u64), step 6's sums, the
/// pairs, the state, and per sampled block a choice byte and a cost. A multiple of 16 (the areas of a call lie side
/// by side, and the entries are 16-byte loads).
pub(crate) fn area_bytes(max_tables: u64, n_sampled: u64) -> u64 {
    let r16 = |x: u64| x.div_ceil(16) * 16;
    let pairs = MAX_PAIRS as u64;
    PAIR_HEAD
        + max_tables * (4096 + 1024 + 16)
        + r16(max_tables * 257 * 8)
        + 16
        + 2 * pairs
        + 16
        + r16(n_sampled)
        + r16(8 * n_sampled)
}

/// Bytes of a tensor's output for the host (`PairJob::out`): a 16-byte head, the pair field and
/// `max_tables` rank tables of at most `3 + MAX_PAIRS` bytes; a multiple of 16.
pub(crate) fn out_bytes(max_tables: u64) -> u64 {
    (16 + 1 + 2 * MAX_PAIRS as u64 + max_tables * (3 + MAX_PAIRS as u64)).div_ceil(16) * 16
}

/// Queues the pair model ([`KERNELS`], `fs` in that order) of the tensors `jobs` (a device array
/// of `n` [`PairJob`]s) whose sampled blocks are `sample_jobs` (`n_samples` [`PairSampleJob`]s),
/// on `s`, after `tz_enc_tables` (whose code lengths and table counts the model reads).
///
/// # Safety
/// Device addresses of this context, alive until the stream has run the launches: every job's
/// addresses as `struct PairJob` in search.cu describes them (its area [`area_bytes`] and output
/// [`out_bytes`] long for `max_tables` and its sampled blocks, its top map [`TOP_BYTES`] long and
/// zeroed), every sample job's tensor and block indices inside the jobs and the tensor's sampled
/// blocks.
pub(crate) unsafe fn queue(
    fs: &[CudaFunction],
    s: &Arc<CudaStream>,
    (jobs, n): (u64, u32),
    (sample_jobs, n_samples): (u64, u32),
    max_tables: u32,
) -> Result<()> {
    if n == 0 || fs.len() != KERNELS.len() {
        return Ok(());
    }
    for (k, f) in fs.iter().enumerate() {
        let mut b = s.launch_builder(f);
        // Per tensor: (jobs, max_tables), `tz_pair_top` in slices; per sampled block a warp
        // (`tz_pair_cost`) or per batch of them (`tz_pair_groups`): (sample jobs, their count,
        // jobs, max_tables).
        let (x, y) = match KERNELS[k] {
            "tz_pair_groups" | "tz_pair_cost" => {
                b.arg(&sample_jobs)
                    .arg(&n_samples)
                    .arg(&jobs)
                    .arg(&max_tables);
                let per = match KERNELS[k] {
                    "tz_pair_groups" => GROUP_BATCH,
                    _ => 8,
                };
                (n_samples.div_ceil(per), 1)
            }
            "tz_pair_top" => {
                b.arg(&jobs).arg(&max_tables);
                (n, TOP_SLICES)
            }
            // A thread block per (tensor, rank table): those past a tensor's tables return (and
            // all of them where `max_tables` is past the format's `MAX_TABLES`, search.cu's
            // `PAIR_TABLES_MAX`: no tensor pairs then).
            "tz_pair_expand" => {
                b.arg(&jobs).arg(&max_tables);
                (n, max_tables.clamp(1, tensorzip::blob::MAX_TABLES as u32))
            }
            _ => {
                b.arg(&jobs).arg(&max_tables);
                (n, 1)
            }
        };
        if x == 0 {
            continue;
        }
        let cfg = LaunchConfig {
            grid_dim: (x, y, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments match each kernel's (search.cu, in `KERNELS` order); the addresses
        // are the caller's promise, and each kernel stays inside its job's buffers.
        unsafe { b.launch(cfg) }?;
    }
    Ok(())
}

/// What the pair model decided for a tensor whose plane 1 has `k` version 1 tables, from its
/// output `out`: `None` (not paired), or the pair table and the `k` rank tables, each checked as a
/// reader checks them (the format's parsers; every rank `0..=D` coded, nothing above) — a kernel
/// bug gives an error, never a head the decoder cannot read.
pub(crate) fn parse_out(out: &[u8], k: usize) -> Result<Option<(PairTable, Vec<FreqTable>)>> {
    let bad = |what: &str| Error::Kernel(format!("pair model output: {what}"));
    let word = |i: usize| -> Result<u32> {
        out.get(4 * i..4 * i + 4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .ok_or_else(|| bad("truncated"))
    };
    if word(0)? == 0 {
        return Ok(None);
    }
    let end = word(2)? as usize;
    if word(0)? != 1 || word(1)? as usize != k || end > out.len() || end < 16 {
        return Err(bad("head"));
    }
    let body = &out[16..end];
    let (pairs, mut at) = PairTable::parse(body, 1).map_err(|e| bad(&e.to_string()))?;
    let pairs = pairs.ok_or_else(|| bad("no pairs"))?;
    let d = pairs.escape() as usize;
    let mut tables = Vec::with_capacity(k);
    for _ in 0..k {
        let (t, used) = FreqTable::parse(&body[at..]).map_err(|e| bad(&e.to_string()))?;
        if (0..256).any(|r| (t.freq[r] > 0) != (r <= d)) {
            return Err(bad("a rank table that does not code exactly the ranks"));
        }
        tables.push(t);
        at += used;
    }
    if at != body.len() {
        return Err(bad("trailing bytes"));
    }
    Ok(Some((pairs, tables)))
}

/// A paired plane's tables as the encode kernel reads them, written by the host (the host
/// search's path; `tz_pair_table`, `tz_pair_tables` and `tz_pair_decide` write the same on the
/// device): the layout of `struct PairBlock` in encode.cu — each byte's index among the top bytes
/// (16 for others), the rank of each pair of such indices at `17 a + b` (the escape where `a` or
/// `b` is 16; 304 bytes), the rank of each key `16 a + b` of top-byte indices, the escape rank as a
/// u32 and 12 bytes of padding — then 256 16-byte entries ([`crate::encode::enc_entry`]) per rank
/// table.
pub(crate) fn pair_block(coder: &PairCoder, tables: &[FreqTable]) -> Vec<u8> {
    let mut b = Vec::with_capacity(PAIR_HEAD as usize + 4096 * tables.len());
    b.extend(coder.top().index().iter().map(|&i| i.min(16)));
    let (ranks, d) = (coder.key_ranks(), coder.table.escape());
    b.extend((0..304).map(|k| match (k / 17, k % 17) {
        (a @ 0..16, c @ 0..16) => ranks[16 * a + c],
        _ => d,
    }));
    b.extend_from_slice(ranks);
    b.extend_from_slice(&(d as u32).to_le_bytes());
    b.extend_from_slice(&[0; 12]);
    for t in tables {
        for (&f, c) in t.freq.iter().zip(t.cumulative()) {
            for w in crate::encode::enc_entry(f as u32, c) {
                b.extend_from_slice(&w.to_le_bytes());
            }
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensorzip::blob::{BlobHeader, Scheme};
    use tensorzip::model::build_model;
    use tensorzip::{sample, CompressOptions, DType};

    /// A paired plane's pair table and rank tables, as the core makes them for a bf16 tensor.
    fn core_pairs() -> (PairTable, Vec<FreqTable>) {
        let data = sample::weights(64, 4096, DType::BF16, 3);
        let opts = CompressOptions {
            pair_exponents: true,
            ..Default::default()
        };
        let header = BlobHeader {
            scheme: Scheme::Planes,
            dtype: DType::BF16,
            shape: vec![64, 4096],
            chunk_units: (opts.chunk_bytes / 2) as u32,
            block_units: opts.block_units,
        };
        let model = build_model(&data, &header, &opts);
        let pm = &model.planes[1];
        let coder = pm.pairs.as_ref().expect("the sample pairs");
        (coder.table.clone(), pm.tables.clone())
    }

    /// The pair model's output layout for a paired plane: head, pair field, rank tables.
    fn output(pairs: &PairTable, tables: &[FreqTable]) -> Vec<u8> {
        let mut body = Vec::new();
        pairs.write(&mut body);
        for t in tables {
            t.write(&mut body);
        }
        let mut out = Vec::new();
        for w in [1u32, tables.len() as u32, 16 + body.len() as u32, 0] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&body);
        out.resize(out_bytes(8) as usize, 0);
        out
    }

    /// The host reads back what the kernel wrote, and refuses an output a decoder could not use
    /// or that disagrees with the version 1 table count: a kernel bug is an error, not a blob.
    #[test]
    fn pair_outputs_are_read_and_checked() {
        let (pairs, tables) = core_pairs();
        let k = tables.len();
        let good = output(&pairs, &tables);
        let (p, t) = parse_out(&good, k).unwrap().unwrap();
        assert_eq!((p, t), (pairs.clone(), tables.clone()));
        let mut none = good.clone();
        none[..4].fill(0);
        assert!(parse_out(&none, k).unwrap().is_none());
        let d = pairs.escape() as usize;
        let body_end = 16 + pairs.serialized_len();
        let mut broken: Vec<(&str, Vec<u8>)> = Vec::new();
        broken.push(("table count", good.clone()));
        let mut flag = good.clone();
        flag[0] = 2;
        broken.push(("flag", flag));
        let mut end = good.clone();
        end[8..12].copy_from_slice(&(good.len() as u32 + 1).to_le_bytes());
        broken.push(("end past the buffer", end));
        let mut one = good.clone();
        one[16] = 1;
        broken.push(("one pair", one));
        let mut twice = good.clone();
        twice[19] = twice[17];
        twice[20] = twice[18];
        broken.push(("a pair twice", twice));
        // The first rank table's rank D made absent (its code 0).
        let mut absent = good.clone();
        absent[body_end + 2 + d] = 0;
        broken.push(("a rank absent", absent));
        let mut trailing = good.clone();
        let e = u32::from_le_bytes(good[8..12].try_into().unwrap()) + 1;
        trailing[8..12].copy_from_slice(&e.to_le_bytes());
        broken.push(("trailing byte", trailing));
        for (i, (what, out)) in broken.iter().enumerate() {
            let want = if i == 0 { k + 1 } else { k };
            let r = parse_out(out, want);
            assert!(
                matches!(r, Err(Error::Kernel(_))),
                "{what}: {:?}",
                r.map(|o| o.is_some())
            );
        }
        assert!(parse_out(&good[..10], k).is_err());
    }
}
