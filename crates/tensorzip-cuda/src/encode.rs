//! The GPU encoder: tensors in device memory become blobs in device memory, byte for byte the blobs
//! the CPU engine writes (`docs/GPU.md`, "Encoder"). Many tensors (a whole model) are encoded
//! together, with one encoder launch per unit size and transform.
//!
//! Steps, all on the engine's stream:
//! 1. `tz_hist_*` counts each tensor's sampled blocks per plane (and the joint counts of the
//!    conditioned plane).
//! 2. `tz_search` (kernels/search.cu, `src/search.rs`) chooses every plane's tables from those
//!    counts, a cluster of thread blocks per plane (`search::cluster_size`), by the core's own
//!    integer decisions (so the tables are the CPU engine's), and `tz_enc_tables` expands them
//!    into the encode kernel's form and writes each tensor's table counts and payload start into
//!    its parameters, on the device. With
//!    `TENSORZIP_DEV_HOST_SEARCH=1` (or more than 8192 sampled blocks, `search::MAX_SAMPLED`)
//!    the counts are downloaded instead, the host runs the core's `model_from_counts` and uploads
//!    its tables in the search's output layout.
//! 3. `tz_encode_*` codes every chunk (one warp each) into a scratch slot and reports its sizes,
//!    to device memory and to the host's page-locked buffer (mapped). Meanwhile the host
//!    downloads the search's few KiB of tables, parses and checks them with the format's parser
//!    and writes each blob's header and tables from them.
//! 4. `tz_place` checks the sizes and sums them into each chunk's place in its blob, and
//!    `tz_compact` moves the payloads there, on the device; meanwhile the host checks the reports
//!    again and writes the directories; each blob's header, tables and directory are uploaded in
//!    front. After the final synchronisation the host checks the placement's verdict and that the
//!    device's table counts and payload starts are its own (both downloaded after the compaction).
//!
//! Host synchronisations: one for the search's tables (while the encoder runs), one after the last
//! wave's encode kernel, for its reports (a wave is as many chunks as [`SCRATCH_BYTES`] of scratch
//! holds: 1 GiB of bf16 is one wave), one at the end. None between the search and the encoder,
//! none per chunk or per wave.

use rayon::prelude::*;

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};
use tensorzip::blob::{BlobHeader, ChunkEntry, PlaneMode, Scheme};
use tensorzip::encoder::{check_len, stored_header};
use tensorzip::joint::JointCounts;
use tensorzip::model::{
    model_from_counts, pair_plane, write_paired_plane_tables, write_plane_tables, Model, Sampling,
};
use tensorzip::{CompressOptions, DType};

use crate::engine::{staged_len, DeviceWrites, Plain};

use crate::engine::GpuEngine;
use crate::error::{Error, Result};

/// Source of the encoder kernels.
pub const ENCODE_SRC: &str = concat!(
    include_str!("../kernels/smem.cuh"),
    include_str!("../kernels/encode.cu")
);

use crate::transfer::staged;

/// Most scratch memory one wave of chunks may use (a chunk's slot is ~2.5x its size: 1 GiB of
/// tensors is one wave).
pub const SCRATCH_BYTES: u64 = 4 << 30;

/// One tensor of a batch (layout shared with `struct EncParams` in encode.cu).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct EncParams {
    units: u64,
    blocks_per_chunk: u64,
    chunk_units: u32,
    block_units: u32,
    threshold: u32,
    cond_plane: u32,
    cond_src: u32,
    cond_value: u32,
    cond_table: u32,
    joint_plane: u32,
    joint_src: u32,
    cap_words: u32,
    off_sels: u64,
    off_coff: u64,
    off_states: u64,
    off_area: u64,
    off_csyms: u64,
    off_words: u64,
    off_stage: u64,
    table_base: [u32; 8],
    n_tables: [u32; 8],
    /// `tz_place`: device address of the tensor's first payload byte in its blob, and the payload
    /// bytes the blob has room for.
    dst_base: u64,
    dst_cap: u64,
    /// Format version 2: device address of the paired plane's tables (`pair_model::pair_block`;
    /// 0: not paired), and
    /// the slot's room for a block's escape group.
    pair: u64,
    off_esc: u64,
}

/// One chunk of a batch (layout shared with `struct EncJob` in encode.cu).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct EncJob {
    data: u64,
    chunk: u64,
    slot: u64,
    dst: u64,
    tensor: u32,
    /// Index in its wave of the wave's first job of the same tensor (`tz_place`).
    seg: u32,
}

/// What the encoder reports per chunk (layout shared with `struct ChunkOut` in encode.cu).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct ChunkOut {
    payload_len: u32,
    rans_len: u32,
    sel_len: u32,
    kept: u32,
    n_words: u32,
    nb: u32,
    pad: [u32; 2],
    modes: [u8; 8],
    values: [u8; 8],
}

// SAFETY: plain `repr(C)` structs of integers, laid out as their CUDA counterparts.
unsafe impl DeviceRepr for EncParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for EncJob {}
// SAFETY: as above.
unsafe impl DeviceRepr for ChunkOut {}
// SAFETY: all-zero bytes are a valid value of every field.
unsafe impl ValidAsZeroBits for ChunkOut {}
// SAFETY: `repr(C)`: two u64, ten u32, seven u64, two [u32; 8] arrays and four u64 (208 bytes, no
// padding).
unsafe impl Plain for EncParams {}
// SAFETY: `repr(C)`: four u64 and two u32 (40 bytes, no padding).
unsafe impl Plain for EncJob {}
const _: () = assert!(std::mem::size_of::<EncParams>() == 208);
const _: () = assert!(std::mem::size_of::<EncJob>() == 40);
const _: () = assert!(std::mem::size_of::<ChunkOut>() == 48);

/// The encoder's kernels: the common ones (placement, compaction, CRC-32) loaded on first use, the counting
/// and encoding kernels (`tz_hist_*`, `tz_encode_*`) of each of [`VARIANTS`] when a call first
/// needs them (`compile::Units`).
pub(crate) struct EncodeKernels {
    units: crate::compile::Units,
    place: CudaFunction,
    compact: CudaFunction,
    pub(crate) crc: CudaFunction,
    pub(crate) crc_list: CudaFunction,
    /// The table search and the expansion of its tables (`tz_search`, `tz_enc_tables`,
    /// kernels/search.cu), compiled on first use.
    search_units: crate::compile::Units,
    search: std::sync::OnceLock<crate::search::SearchKernels>,
}

/// (unit size, exponent bits) of each kernel instantiation, and its name suffix.
/// The last, `2e8p`, is bf16's with paired exponents (format version 2), which the tensors of a
/// call with `pair_exponents` take (`variant`).
pub(crate) const VARIANTS: [(usize, u32, &str); 8] = [
    (1, 0, "1"),
    (2, 0, "2"),
    (2, 8, "2e8"),
    (4, 0, "4"),
    (4, 8, "4e8"),
    (8, 0, "8"),
    (8, 11, "8e11"),
    (2, 8, "2e8p"),
];

/// [`VARIANTS`]' index of bf16 with paired exponents.
const PAIRED_VARIANT: usize = 7;

/// The encoder's compile units: one per [`VARIANTS`] entry (labelled by its suffix), its
/// counting and encoding kernels.
pub(crate) fn encode_units() -> crate::compile::Units {
    let variants = VARIANTS
        .iter()
        .map(|v| {
            let s = v.2;
            (
                s.to_string(),
                [format!("tz_hist_{s}"), format!("tz_encode_{s}")],
            )
        })
        .collect();
    crate::compile::Units::new(
        "tz_encode",
        "TZ_UNIT",
        variants,
        crate::compile::source("tz_encode", ENCODE_SRC),
    )
}

impl EncodeKernels {
    pub(crate) fn load(eng: &GpuEngine) -> Result<EncodeKernels> {
        let units = encode_units();
        let module = units.common(eng.context())?;
        Ok(EncodeKernels {
            place: module.load_function("tz_place")?,
            compact: module.load_function("tz_compact")?,
            crc: module.load_function("tz_crc32")?,
            crc_list: module.load_function("tz_crc32_list")?,
            units,
            search_units: crate::search::units(),
            search: std::sync::OnceLock::new(),
        })
    }

    /// `tz_search` and `tz_enc_tables`, compiled or loaded on the first call.
    fn search(&self, eng: &GpuEngine) -> Result<&crate::search::SearchKernels> {
        if let Some(f) = self.search.get() {
            return Ok(f);
        }
        let f = crate::search::load(&self.search_units, eng.context(), eng.stream())?;
        Ok(self.search.get_or_init(|| f))
    }

    /// Queues `tz_place` over a wave of `n` jobs (encode.cu): checks each chunk's report against
    /// its slot and blob, and writes its place in the blob to its job's `dst` (sets `*bad` instead
    /// of trusting a report that fails a check).
    ///
    /// # Safety
    /// Device addresses of this engine's context, alive until the stream has run the launch:
    /// `jobs` and `outs` `n` entries each, `params` an entry for every tensor index in `jobs`,
    /// `placed` a u64 per tensor, `bad` one u32.
    #[allow(clippy::too_many_arguments)]
    unsafe fn place(
        &self,
        s: &Arc<CudaStream>,
        jobs: u64,
        n: u32,
        params: u64,
        outs: u64,
        placed: u64,
        bad: u64,
        us: u32,
    ) -> Result<()> {
        let mut b = s.launch_builder(&self.place);
        b.arg(&jobs)
            .arg(&n)
            .arg(&params)
            .arg(&outs)
            .arg(&placed)
            .arg(&bad)
            .arg(&us);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (n.div_ceil(32).clamp(1, 32) * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments match `tz_place`; the buffers are the caller's promise.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Queues `tz_compact` over a wave of `n` jobs placed by [`EncodeKernels::place`]: copies each
    /// chunk's payload from its slot in `scratch` to its `dst`, unless `*bad` is set.
    ///
    /// # Safety
    /// As [`EncodeKernels::place`], which must have been queued before on the same stream with the
    /// same buffers; each job's slot (and 16 bytes past its end) inside `scratch`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn compact(
        &self,
        s: &Arc<CudaStream>,
        scratch: u64,
        jobs: u64,
        params: u64,
        outs: u64,
        n: u32,
        bad: u64,
    ) -> Result<()> {
        let mut b = s.launch_builder(&self.compact);
        b.arg(&scratch)
            .arg(&jobs)
            .arg(&params)
            .arg(&outs)
            .arg(&n)
            .arg(&bad);
        let cfg = LaunchConfig {
            grid_dim: (n, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments match `tz_compact`; every copy goes to a place `tz_place` checked to
        // lie inside its blob (else `bad` is set and nothing is copied).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// The counting and encoding kernels of each of `variants` (indices into [`VARIANTS`]),
    /// compiling those not built yet, together.
    fn variants(
        &self,
        eng: &GpuEngine,
        variants: &[usize],
    ) -> Result<Vec<&(CudaFunction, CudaFunction)>> {
        self.units.kernels(eng.context(), variants)
    }
}

/// A blob in device memory: its first `len` bytes of `buf`.
pub struct DeviceBlob {
    pub buf: CudaSlice<u8>,
    pub len: usize,
}

/// A tensor in device memory, to be compressed.
#[derive(Debug, Clone)]
pub struct DeviceTensor {
    /// Device address of its bytes (row-major, little-endian), in the engine's context.
    pub ptr: u64,
    pub nbytes: usize,
    pub dtype: DType,
    pub shape: Vec<u64>,
}

/// The encoder variant of a tensor of `dtype`: its unit size and transform's, or bf16's with
/// paired exponents where `opts` asks for them (its tensors may still stay version 1).
fn variant(dtype: DType, opts: &CompressOptions) -> Result<usize> {
    if opts.pair_exponents && dtype.paired_plane().is_some() {
        return Ok(PAIRED_VARIANT);
    }
    let us = dtype.unit_size();
    let e = match dtype.transform() {
        tensorzip::dtype::Transform::Identity => 0,
        tensorzip::dtype::Transform::SignBelowExponent { exp_bits } => exp_bits,
    };
    VARIANTS
        .iter()
        .position(|&(u, x, _)| u == us && x == e)
        .ok_or_else(|| Error::Unsupported(format!("no encoder kernel for {dtype}")))
}

/// A block's planes are staged in shared memory up to this size (else in the chunk's slot).
const STAGE_SMEM_MAX: u64 = 32 << 10;

/// Shared bytes of an encoder warp's histograms for units of `us` bytes: `us` KiB, at least 4 KiB
/// for two-byte units, whose lean rANS steps keep a table of 256 16-byte entries there
/// (`hist_bytes` in encode.cu).
fn hist_bytes(us: u64) -> u64 {
    if us == 2 {
        4096
    } else {
        us * 1024
    }
}

/// The encode kernel's table entry of a symbol of frequency `f` (0..=4096) and cumulative frequency
/// `c` (`expand_table` in search.cu writes it, `push` in encode.cu reads it): the low and high
/// words of ceil(2^44 / f), `c`, 4096 - f; all zero when `f` is 0. The host writes a paired
/// plane's rank tables with it (`pair_block`); the tests check the device's tables against it and
/// the exactness of its quotient.
pub(crate) fn enc_entry(f: u32, c: u32) -> [u32; 4] {
    if f == 0 {
        return [0; 4];
    }
    let m = (1u64 << 44).div_ceil(f as u64);
    [m as u32, (m >> 32) as u32, c, 4096 - f]
}

/// Lays out one chunk's scratch slot in `p` (offsets of the selectors, the conditioned split's
/// block offsets, the states, the raw area, the conditioned symbols, the words and, when a block's
/// planes do not fit in shared memory, their staging), sized for the tensor's longest chunk.
/// Returns the slot's bytes and whether a block is staged in shared memory.
/// A tensor that may pair (format version 2) also gets room for a block's escape group.
fn slot_layout(
    p: &mut EncParams,
    header: &BlobHeader,
    units: u64,
    us: u64,
    paired: bool,
) -> (u64, bool) {
    let cmax = (header.chunk_units as u64).min(units);
    let bu = header.block_units as u64;
    let nbmax = cmax.div_ceil(bu);
    let r16 = |x: u64| x.div_ceil(16) * 16;
    let smem_stage = us * bu <= STAGE_SMEM_MAX;
    p.off_sels = 0;
    p.off_coff = r16(us * nbmax);
    p.off_states = p.off_coff + r16(4 * (nbmax + 1));
    p.off_area = p.off_states + 128;
    p.off_csyms = p.off_area + r16(cmax * us + 64);
    p.off_words = p.off_csyms + r16(cmax + 64);
    p.cap_words = (cmax * us / 2 + 1) as u32;
    p.off_stage = p.off_words + r16(2 * p.cap_words as u64);
    let slot_bytes = p.off_stage + if smem_stage { 0 } else { r16(us * bu) };
    p.off_esc = slot_bytes;
    let slot_bytes = slot_bytes + if paired { r16(bu) } else { 0 };
    (slot_bytes, smem_stage)
}

/// Tensors by launch group (key: unit-size variant and whether blocks are staged in shared memory),
/// each group's tensors in order: one encoder launch per group and wave (step 3), the waves cut by
/// [`group_wave_limit`].
fn launch_groups<K: PartialEq>(keys: impl Iterator<Item = K>) -> Vec<(K, Vec<usize>)> {
    let mut groups: Vec<(K, Vec<usize>)> = Vec::new();
    for (i, key) in keys.enumerate() {
        match groups.iter_mut().find(|g| g.0 == key) {
            Some(g) => g.1.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    groups
}

/// Waves a launch group's chunks are cut into where it has at least `PIPE_MIN_SLOTS` chunks a
/// wave, so that each wave's placement and compaction (bound by memory traffic) run on a stream of
/// their own under the encoding of the next waves (bound by the encode kernel's latency): 1 GiB
/// of bf16 (8192 chunks) is two waves of 4096. Two, not more: on an H100 (2026-12-07, GPU.md step
/// 4) two waves encoded 1 GiB of bf16 ~2% faster than one and fp32 ~2%, four no faster than one,
/// eight 12% slower (each wave's launch ends in a tail of idle SMs); two unequal ones (the first
/// with 67, 75 or 80% of the bytes, so that less compaction follows the last encode) no faster
/// than two equal ones (2026-12-07 19:1x, BENCHMARKS.md). `GpuEngine::with_pipe_waves`,
/// or `TENSORZIP_DEV_ENC_WAVES=N` when the engine is made, sets another count (1: the compaction
/// after the whole encode, as before 2026-12-07), for same-binary comparisons.
pub const PIPE_WAVES: u64 = 2;

/// The fewest chunks of a wave cut for the pipeline: about half of what an H100's SMs hold at once
/// (bf16: 16 warps, a chunk each, on 132 SMs), so that a wave's launch fills the GPU. A group of
/// fewer than twice as many chunks is one wave: its chunks would otherwise wait for each other's
/// compactions.
const PIPE_MIN_SLOTS: u64 = 1024;

/// The waves of the pipeline: [`PIPE_WAVES`], or the development override.
pub(crate) fn pipe_waves_from_env() -> u64 {
    std::env::var("TENSORZIP_DEV_ENC_WAVES")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(PIPE_WAVES, |n| n.clamp(1, 64))
}

/// The wave limit of a launch group of `n` slots taking `total` bytes, the largest `largest`:
/// `cap` (the engine's `wave_bytes`), or less so that [`waves`] cuts the group into at most
/// `pipe` waves of at least [`PIPE_MIN_SLOTS`] slots. (Each wave but the last then holds at least
/// `total / k` bytes, rounded up, so there are at most `k`; for equal slots, `k` waves of equal
/// counts but the last.)
fn group_wave_limit(n: u64, total: u64, largest: u64, cap: u64, pipe: u64) -> u64 {
    let k = pipe.min(n / PIPE_MIN_SLOTS).max(1);
    match k {
        1 => cap,
        _ => cap.min(total.div_ceil(k) + largest.max(1) - 1),
    }
}

/// The waves `len` slots of `slot(i)` bytes are cut into, with each wave's bytes: consecutive
/// slots while they fit in `limit` bytes, at least one per wave. The encoder's chunks go in such
/// waves of scratch, and the table search's planes in such launches (`search::queue`).
pub(crate) fn waves(
    len: usize,
    limit: u64,
    slot: impl Fn(usize) -> u64,
) -> Vec<(std::ops::Range<usize>, u64)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let (mut end, mut bytes) = (at, 0u64);
        while end < len && (end == at || bytes + slot(end) <= limit) {
            bytes += slot(end);
            end += 1;
        }
        out.push((at..end, bytes));
        at = end;
    }
    out
}

/// The encoder's block width for warps of `per_warp` shared bytes: the one, up to the most warps a
/// block of `f` may have (its launch bounds in encode.cu — 256 threads for 1- and 2-byte units, 352
/// for 4 and 8 — as the driver reports them), that keeps the most warps resident per SM, as the
/// driver counts it for `f` (its registers, the shared memory, the SM's limits); the narrower on a
/// tie. The kernel is latency-bound, so resident warps are its speed: fp32's 20 KiB warps ran 4 per
/// block and 2 blocks per SM (8 warps) with the fixed 96 KiB blocks used before; one block of 11
/// encodes 1 GiB at 126-132 GB/s against 116-125 (H200, 2026-12-01, docs/BENCHMARKS.md). Where the
/// registers bound the warps, one-warp blocks keep as many as wider ones and the narrowest is taken:
/// bf16 (121 registers: 16 warps, as 2 blocks of 8 had) then runs blocks of one warp, at the same
/// speed in the same calls (117.8-119.5 against 112.5-120.5); 1-byte units (80 registers) get 25
/// warps instead of 24. (The warps of a block share nothing but the launch.) A development
/// override, `TENSORZIP_DEV_ENC_BLOCK=BYTES,WARPS`, sets the block's shared bytes and most warps
/// instead. `smem_limit` is the device's shared memory per block ([`crate::engine`]'s
/// `Shared::smem_limit`), of which `f`'s static shared memory takes its part.
fn enc_block_width(f: &CudaFunction, per_warp: u64, smem_limit: u32) -> Result<u32> {
    let most = (f.max_threads_per_block()?.max(32) / 32) as u32;
    let dev = std::env::var("TENSORZIP_DEV_ENC_BLOCK").ok().and_then(|v| {
        let (a, b) = v.split_once(',')?;
        let (bytes, warps): (u64, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        (bytes > 0 && (1..=most).contains(&warps)).then_some((bytes, warps))
    });
    if let Some((bytes, warps)) = dev {
        return Ok((bytes / per_warp).clamp(1, warps as u64) as u32);
    }
    // The attribute set to the device's most (any launch below fits it), which the occupancy query
    // needs: it counts a block's dynamic shared memory only up to the function's limit.
    let room = crate::engine::allow_dynamic_smem(f, smem_limit, 0)?;
    if room < per_warp {
        return Err(Error::Unsupported(format!(
            "{smem_limit} bytes of shared memory per block (the encoder's warps need {per_warp})"
        )));
    }
    let most = ((room / per_warp) as u32).clamp(1, most);
    let mut best = (0u32, 1u32);
    for w in 1..=most {
        let blocks = f.occupancy_max_active_blocks_per_multiprocessor(
            32 * w,
            (w as u64 * per_warp) as usize,
            None,
        )?;
        if blocks * w > best.0 {
            best = (blocks * w, w);
        }
    }
    Ok(best.1)
}

/// The shared joint counts of a `tz_hist_*` block: 256 x 256 16-bit counters.
const JOINT_SMEM_BYTES: u32 = 128 << 10;

/// Sampled blocks per thread block of `tz_hist_*` (`PICKS_PER_BLOCK` in encode.cu). 16 since
/// 2026-12-02 (8 before): each thread block zeroes and flushes 128 KiB of shared joint counts, and
/// twice the blocks per flush took 1 GiB bf16 encode calls from 290.8 / 292.7 / 289.4 to 294.2 /
/// 295.0 / 298.2 GB/s (H200, same call; docs/BENCHMARKS.md). The 16-bit shared counters still
/// cannot overflow: see encode.cu.
const PICKS_PER_BLOCK: u64 = 16;

/// Sampled blocks of one tensor for one thread block of `tz_hist_*` (layout shared with
/// `struct HistJob` in encode.cu).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct HistJob {
    data: u64,
    first: u64,
    n: u32,
    tensor: u32,
    joint: u64,
}

// SAFETY: a plain `repr(C)` struct of integers, laid out as its CUDA counterpart.
unsafe impl DeviceRepr for HistJob {}
// SAFETY: `repr(C)`: u64, u64, u32, u32, u64 (32 bytes, no padding).
unsafe impl Plain for HistJob {}

/// Format version 2's paired planes (FORMAT.md section 12) of the tensors `of`, whose version 1
/// `models` the host made (the host search's path: `TENSORZIP_DEV_HOST_SEARCH=1`, or more sampled
/// blocks than the device's model takes): the core's `model::pair_plane` decides from each
/// tensor's sampled histograms, the CPU engine's code on the same counts. A model that pairs
/// becomes version 2. (The device's model, `pair_model`, makes the same decisions on the device.)
fn pair_models(of: &[PairInput<'_>], models: &mut [Model], opts: &CompressOptions) {
    for (i, t) in of.iter().enumerate().filter(|(_, t)| t.may_pair) {
        pair_plane(&mut models[i], t.header, opts, t.sampling, t.hists);
    }
}

/// A tensor whose pair model the device makes: its index among them, its area's and output's
/// offsets in the model's buffers, and its paired plane.
#[derive(Clone, Copy)]
struct DevPair {
    index: usize,
    area_at: u64,
    out_at: u64,
    plane: usize,
}

/// A tensor of a call, as [`pair_models`] needs it.
struct PairInput<'a> {
    header: &'a BlobHeader,
    sampling: &'a Sampling,
    /// Its sampled blocks' histograms (`[i * planes + p]`).
    hists: &'a [[u32; 256]],
    /// Whether the call asks it to pair (bf16 with `pair_exponents`).
    may_pair: bool,
}

/// A tensor of the batch being coded with planes.
struct Coded {
    /// Index of the tensor in the batch (its size, dtype and shape are there).
    index: usize,
    /// Its bytes (the aligned copy, if one was made): a stored blob copies them.
    data: u64,
    header: BlobHeader,
    params: EncParams,
    prefix: Vec<u8>,
    /// A version 2 blob's head (header and tables), written by the host.
    v2_head: Option<Vec<u8>>,
    blob: CudaSlice<u8>,
    dir: Vec<u8>,
    total: u64,
    /// The plane that may have a conditional table.
    may_condition: Option<usize>,
}

impl GpuEngine {
    /// Compresses a tensor held on the host: uploads it, encodes it on the GPU and downloads the
    /// blob. The bytes equal [`tensorzip::CpuEngine::compress`]'s.
    pub fn compress_host(
        &self,
        data: &[u8],
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
    ) -> Result<Vec<u8>> {
        self.encode_host(data, dtype, shape, opts, |blob| {
            let s = self.stream();
            if !staged(blob.len as u64) {
                return Ok(s.clone_dtoh(&blob.buf.slice(0..blob.len))?);
            }
            let mut out = tensorzip::fresh::zeroed(blob.len);
            let bp = blob.buf.device_ptr(s).0;
            // SAFETY: the blob's buffer holds at least `blob.len` bytes.
            unsafe { self.download_from(bp, &mut out)? };
            Ok(out)
        })
    }

    /// [`GpuEngine::compress_host`] that writes the blob to `w` (from the staging buffers, piece by
    /// piece: [`GpuEngine::download_to`]) instead of returning it; returns its length. The archive
    /// writer's path for a large tensor: no host copy of the blob is made.
    pub fn compress_host_to(
        &self,
        data: &[u8],
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
        w: &mut dyn std::io::Write,
    ) -> Result<u64> {
        self.encode_host(data, dtype, shape, opts, |blob| {
            let bp = blob.buf.device_ptr(self.stream()).0;
            // SAFETY: the blob's buffer holds at least `blob.len` bytes.
            unsafe { self.download_to(bp, blob.len as u64, w)? };
            Ok(blob.len as u64)
        })
    }

    /// Uploads a host tensor (through the staging buffers when large), encodes it and hands the
    /// blob, still on the device, to `take`.
    fn encode_host<R>(
        &self,
        data: &[u8],
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
        take: impl FnOnce(&DeviceBlob) -> Result<R>,
    ) -> Result<R> {
        let s = self.stream();
        if !staged(data.len() as u64) {
            // Small tensors: plain copies (`transfer::staged`).
            let dev = s.clone_htod(if data.is_empty() { &[0u8][..] } else { data })?;
            let blob = {
                let (p, _g) = dev.device_ptr(s);
                // SAFETY: `dev` holds `data.len()` bytes (at least one) and outlives the call,
                // which waits for its work before returning.
                unsafe { self.compress_device(p, data.len(), dtype, shape, opts)? }
            };
            return take(&blob);
        }
        // Large ones: the upload through the engine's page-locked staging buffers (transfer.rs).
        let mut dev = s.alloc_zeros::<u8>(data.len())?;
        let p = dev.device_ptr_mut(s).0;
        // SAFETY: `dev` holds `data.len()` bytes and outlives both calls, which wait for their work
        // before returning.
        let blob = unsafe {
            self.upload_to(data, p)?;
            self.compress_device(p, data.len(), dtype, shape, opts)?
        };
        drop(dev);
        take(&blob)
    }

    /// Compresses several tensors held on the host with one upload, one batch encode
    /// ([`GpuEngine::compress_batch_device`]) and one gathered download; the blobs equal
    /// [`tensorzip::CpuEngine::compress`]'s. Meant for many small tensors (an archive writer hands
    /// over runs of up to 8 MiB): the upload is a plain copy, not staged.
    pub fn compress_host_batch(
        &self,
        items: &[tensorzip::archive::BlobItem<'_>],
        opts: &CompressOptions,
    ) -> Result<Vec<Vec<u8>>> {
        opts.validate()?;
        let s = self.stream();
        // The tensors side by side, each at a 16-byte aligned offset (the kernels' loads).
        let mut offsets = Vec::with_capacity(items.len());
        let mut total = 0usize;
        for &(data, _, _) in items {
            offsets.push(total);
            total = (total + data.len()).div_ceil(16) * 16;
        }
        let mut host = tensorzip::fresh::zeroed(total.max(1));
        for (&(data, _, _), &o) in items.iter().zip(&offsets) {
            host[o..o + data.len()].copy_from_slice(data);
        }
        let dev = s.clone_htod(&host)?;
        drop(host);
        let base = dev.device_ptr(s).0;
        let tensors: Vec<DeviceTensor> = items
            .iter()
            .zip(&offsets)
            .map(|(&(data, dtype, shape), &o)| DeviceTensor {
                ptr: base + o as u64,
                nbytes: data.len(),
                dtype,
                shape: shape.to_vec(),
            })
            .collect();
        // SAFETY: every tensor lies inside `dev` (offsets and lengths above), which lives until
        // the end of this function and which nothing else writes.
        let blobs = unsafe { self.compress_batch_device(&tensors, opts)? };
        let ranges: Vec<(u64, u64)> = blobs
            .iter()
            .map(|b| (b.buf.device_ptr(s).0, b.len as u64))
            .collect();
        // SAFETY: each range is the written part of a live blob buffer.
        let all = unsafe { self.read_ranges(&ranges)? };
        let mut at = 0;
        Ok(blobs
            .iter()
            .map(|b| {
                let v = all[at..at + b.len].to_vec();
                at += b.len;
                v
            })
            .collect())
    }

    /// Compresses the tensor of `nbytes` bytes at device address `data` into a blob in device
    /// memory (see [`GpuEngine::compress_batch_device`]).
    ///
    /// # Safety
    /// As [`GpuEngine::compress_batch_device`].
    pub unsafe fn compress_device(
        &self,
        data: u64,
        nbytes: usize,
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
    ) -> Result<DeviceBlob> {
        let t = DeviceTensor {
            ptr: data,
            nbytes,
            dtype,
            shape: shape.to_vec(),
        };
        // SAFETY: forwarded from the caller.
        let mut v = unsafe { self.compress_batch_device(std::slice::from_ref(&t), opts)? };
        v.pop()
            .ok_or_else(|| Error::Driver("the batch encoder returned no blob".into()))
    }

    /// Compresses many tensors in device memory into blobs in device memory, with one encoder launch
    /// per unit size and transform for all their chunks. The work runs on the engine's stream; the
    /// call returns when every blob is complete. Each blob equals the CPU engine's.
    ///
    /// # Safety
    /// Every tensor's `ptr` must be a valid device address of `nbytes` readable bytes in this
    /// engine's context, not written by anyone until this returns.
    pub unsafe fn compress_batch_device(
        &self,
        tensors: &[DeviceTensor],
        opts: &CompressOptions,
    ) -> Result<Vec<DeviceBlob>> {
        opts.validate()?;
        for t in tensors {
            check_len(t.nbytes as u64, t.dtype, &t.shape)?;
        }
        let s = self.stream().clone();
        let trace =
            crate::engine::step_tracer(&s, format!("gpu encode of {} tensors", tensors.len()));
        let trace_spans = crate::engine::trace_mode().is_some();
        let mut blobs: Vec<Option<DeviceBlob>> = (0..tensors.len()).map(|_| None).collect();
        // Device buffers that kernels still read are kept until the final synchronisation.
        let mut keep_alive = Vec::new();
        let mut keep_search: Option<crate::search::Queued> = None;
        let mut keep_host_outs: Option<CudaSlice<u32>> = None;
        // Blob heads and stored blobs, written together at the end.
        let mut writes = DeviceWrites::default();
        // 1. Counts of the sampled blocks: one launch per unit size for every tensor's picks.
        struct Counting {
            index: usize,
            data: u64,
            header: BlobHeader,
            sampling: Sampling,
            params: EncParams,
            variant: usize,
            /// Bytes of one chunk's scratch slot (its layout is in `params`), and whether a
            /// block's planes are staged in shared memory.
            slot_bytes: u64,
            smem_stage: bool,
            /// Where its counts are in the download: histograms, joint counts (u32 offsets).
            hist_at: usize,
            joint_at: Option<usize>,
        }
        impl Counting {
            /// The plane that may have a conditional table: the one whose joint counts are taken.
            fn may_condition(&self) -> Option<usize> {
                self.joint_at.map(|_| self.params.joint_plane as usize)
            }
        }
        let mut counting = Vec::new();
        for (i, t) in tensors.iter().enumerate() {
            if t.nbytes == 0 || t.nbytes < opts.min_compress_bytes {
                // SAFETY: forwarded from the caller.
                blobs[i] = Some(unsafe {
                    self.stored_blob(t.ptr, t.nbytes, t.dtype, &t.shape, &mut writes)?
                });
                continue;
            }
            let us = t.dtype.unit_size();
            // The kernels load 16 bytes at a time: an unaligned tensor is copied first.
            let data = if t.ptr % 16 != 0 {
                let mut tmp = s.alloc_zeros::<u8>(t.nbytes)?;
                let tp = tmp.device_ptr_mut(&s).0;
                // SAFETY: both ranges hold `nbytes` bytes (the source by the caller's promise).
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(tp, t.ptr, t.nbytes, s.cu_stream())?;
                }
                keep_alive.push(tmp);
                tp
            } else {
                t.ptr
            };
            let header = BlobHeader {
                scheme: Scheme::Planes,
                dtype: t.dtype,
                shape: t.shape.clone(),
                chunk_units: (opts.chunk_bytes / us) as u32,
                block_units: opts.block_units,
            };
            let sampling = Sampling::new(&header, opts);
            let mut p = EncParams {
                units: sampling.units,
                blocks_per_chunk: sampling.blocks_per_chunk,
                chunk_units: header.chunk_units,
                block_units: header.block_units,
                threshold: opts.threshold_q16() as u32,
                cond_plane: 255,
                cond_src: 255,
                joint_plane: 255,
                joint_src: 255,
                ..Default::default()
            };
            if let Some((cp, cq)) = opts.conditioned_plane(t.dtype) {
                p.joint_plane = cp as u32;
                p.joint_src = cq as u32;
            }
            let variant = variant(t.dtype, opts)?;
            let paired = variant == PAIRED_VARIANT;
            let (slot_bytes, smem_stage) =
                slot_layout(&mut p, &header, sampling.units, us as u64, paired);
            counting.push(Counting {
                index: i,
                data,
                header,
                sampling,
                params: p,
                variant,
                slot_bytes,
                smem_stage,
                hist_at: 0,
                joint_at: None,
            });
        }
        trace("setup");
        if counting.is_empty() {
            // Stored blobs only: their writes run now, and must be complete before the caller
            // may write its tensors again. (Every return after queueing writes flushes them.)
            // SAFETY: as at the end of this function.
            let staged = unsafe { writes.flush(self)? };
            s.synchronize()?;
            drop(staged);
            return Ok(blobs.into_iter().flatten().collect());
        }
        let k = self.encode_kernels()?;
        // Every variant the batch needs, compiled together on first use.
        let mut needed: Vec<usize> = counting.iter().map(|c| c.variant).collect();
        needed.sort_unstable();
        needed.dedup();
        k.variants(self, &needed)?;
        // Counts of every launch go to one device buffer, downloaded at once.
        let mut total_u32 = 0usize;
        let mut launches = Vec::new();
        for (v, &(us, _, _)) in VARIANTS.iter().enumerate() {
            let members: Vec<usize> = (0..counting.len())
                .filter(|&i| counting[i].variant == v)
                .collect();
            if members.is_empty() {
                continue;
            }
            let mut picks = Vec::new();
            let mut jobs = Vec::new();
            let hist_base = total_u32;
            for &i in &members {
                let c = &mut counting[i];
                c.hist_at = hist_base + picks.len() * us * 256;
                picks.extend_from_slice(&c.sampling.picks);
                total_u32 += c.sampling.picks.len() * us * 256;
            }
            let mut at = 0u64;
            let joint_from = total_u32;
            for &i in &members {
                let c = &mut counting[i];
                let joint = if c.params.joint_plane < 8 {
                    c.joint_at = Some(total_u32);
                    total_u32 += 65536;
                    c.joint_at
                } else {
                    None
                };
                let n = c.sampling.picks.len() as u64;
                let mut q = 0;
                while q < n {
                    let m = (n - q).min(PICKS_PER_BLOCK);
                    jobs.push(HistJob {
                        data: c.data,
                        first: at + q,
                        n: m as u32,
                        tensor: i as u32,
                        // Offset in the counts buffer (unused without joint counts).
                        joint: joint.map_or(0, |j| j as u64),
                    });
                    q += m;
                }
                at += n;
            }
            launches.push((v, hist_base, picks, jobs, joint_from..total_u32));
        }
        trace("count plan");
        // The counts: each histogram is written whole by `tz_hist_*`; only the joint counts, which
        // it adds to, start at zero.
        // SAFETY: u32 counters; the histograms are written before the search reads them, the
        // joint counts zeroed here first.
        let mut counts_dev = unsafe { s.alloc::<u32>(total_u32.max(1)) }?;
        let counts_ptr = counts_dev.device_ptr_mut(&s).0;
        for (.., joint) in &launches {
            if !joint.is_empty() {
                // SAFETY: `joint` lies inside `counts_dev` (laid out above).
                unsafe {
                    cudarc::driver::result::memset_d8_async(
                        counts_ptr + 4 * joint.start as u64,
                        0,
                        4 * joint.len(),
                        s.cu_stream(),
                    )
                }?;
            }
        }
        trace("count buffer");
        // The parameters, and every launch's picks and jobs, in one page-locked upload (three
        // uploads from pageable memory before, each a host call ahead of the first kernel while
        // the GPU waits; in two same-call A/Bs on the H200 the difference was within the noise).
        let cap = staged_len::<EncParams>(counting.len())
            + launches
                .iter()
                .map(|(_, _, picks, jobs, _)| {
                    staged_len::<u64>(picks.len()) + staged_len::<HistJob>(jobs.len())
                })
                .sum::<usize>();
        let (count_inputs, (params_at, inputs_at)) = self.upload_staged(cap, |st, _| {
            let params: Vec<EncParams> = counting.iter().map(|c| c.params).collect();
            let params_at = st.push(&params);
            let inputs_at: Vec<(usize, usize)> = launches
                .iter()
                .map(|(_, _, picks, jobs, _)| (st.push(picks), st.push(jobs)))
                .collect();
            Ok((params_at, inputs_at))
        })?;
        let inputs_ptr = count_inputs.device_ptr(&s).0;
        let count_params = inputs_ptr + params_at as u64;
        for ((v, hist_base, _, jobs, _), &(picks_at, jobs_at)) in launches.iter().zip(&inputs_at) {
            let picks = inputs_ptr + picks_at as u64;
            let jobs_dev = inputs_ptr + jobs_at as u64;
            let hist_ptr = counts_ptr + 4 * *hist_base as u64;
            let f = &k.variants(self, &[*v])?[0].0;
            // Joint counts in shared memory (16-bit counters) when PICKS_PER_BLOCK sampled blocks
            // cannot overflow them — blocks of at most 4096 units (encode.cu, `hist_entry`) — and
            // the device has the 128 KiB beside the kernel's static shared memory (not on Ada or
            // consumer Ampere, 99 KiB: there they are counted in global memory, as for larger
            // blocks).
            let room = crate::engine::allow_dynamic_smem(f, self.shared().smem_limit, 0)?;
            let fits = JOINT_SMEM_BYTES as u64 <= room;
            let joint_smem = (opts.block_units <= 4096 && fits) as u32;
            let smem = joint_smem * JOINT_SMEM_BYTES;
            let mut b = s.launch_builder(f);
            b.arg(&jobs_dev)
                .arg(&count_params)
                .arg(&picks)
                .arg(&hist_ptr)
                .arg(&counts_ptr)
                .arg(&joint_smem);
            let cfg = LaunchConfig {
                grid_dim: (jobs.len() as u32, 1, 1),
                block_dim: (1024, 1, 1),
                shared_mem_bytes: smem,
            };
            // SAFETY: arguments match `tz_hist_*` (the jobs, parameters and picks staged above,
            // in `count_inputs`, kept until the end); each job's picks are blocks of its tensor, so
            // every unit read lies inside its bytes; histograms and joint counts are written at the
            // offsets laid out above, inside `counts_dev`.
            unsafe { b.launch(cfg) }?;
        }
        trace("count kernels");
        // 2. The tables: searched on the GPU (`tz_search`, a cluster of blocks per plane), or, with
        // `TENSORZIP_DEV_HOST_SEARCH=1` or more sampled blocks than the search's scratch is sized
        // for, by the host from the downloaded counts (the core's `model_from_counts`, written out
        // in the search's output layout and uploaded). Both give the same tables. Then
        // `tz_enc_tables` expands every plane's output into the encode kernel's tables, in fixed
        // slots (plane `g` of the call: slots `g * (max_tables + 1)` on, its conditional table in
        // the last), and writes each tensor's table counts, conditional plane and payload start
        // into its parameters: the encoder follows the search on the stream with no host round
        // trip (which was ~0.4-0.5 ms of a 1 GiB call with the GPU idle). The host parses the same
        // outputs while the encoder runs, writes the blob heads from them, and refuses the call if
        // they fail a check or disagree with what the device wrote.
        let t_max = opts.max_tables as u64;
        let plane_first: Vec<usize> = counting
            .iter()
            .scan(0, |at, c| {
                let first = *at;
                *at += c.header.planes();
                Some(first)
            })
            .collect();
        let n_planes: usize = counting.iter().map(|c| c.header.planes()).sum();
        let gpu_search = std::env::var_os("TENSORZIP_DEV_HOST_SEARCH").is_none_or(|v| v == "0")
            && counting
                .iter()
                .all(|c| c.sampling.picks.len() as u64 <= crate::search::MAX_SAMPLED);
        // Format version 2: with the GPU's search, each tensor that may pair gets its pair model
        // on the device (`pair_model`; queued after `tz_enc_tables` below): (its index among
        // them, its area's and output's offsets). With the host's search,
        // the host makes it (`pair_models`): per tensor, the version 2 model and the bytes its
        // tables section has in version 1, where it pairs.
        let mut paired: Vec<Option<(Model, usize)>> = (0..counting.len()).map(|_| None).collect();
        let mut dev_pair: Vec<Option<DevPair>> = vec![None; counting.len()];
        let (mut area_len, mut pout_len, mut n_samples) = (0u64, 0u64, 0usize);
        if gpu_search {
            let mut m = 0;
            for (i, c) in counting.iter().enumerate() {
                let plane = c.header.dtype.paired_plane();
                if let Some(o) = plane.filter(|_| c.variant == PAIRED_VARIANT) {
                    if c.sampling.picks.is_empty() {
                        continue;
                    }
                    dev_pair[i] = Some(DevPair {
                        index: m,
                        area_at: area_len,
                        out_at: pout_len,
                        plane: o,
                    });
                    m += 1;
                    area_len += crate::pair_model::area_bytes(t_max, c.sampling.picks.len() as u64);
                    pout_len += crate::pair_model::out_bytes(t_max);
                    n_samples += c.sampling.picks.len();
                }
            }
        }
        let n_dev_pair = dev_pair.iter().flatten().count();
        // The device pair model's buffers: the tensors' areas (`PairBlock`s, rank tables'
        // entries, scratch), outputs for the host and top maps.
        let dev_pair_bufs = match n_dev_pair {
            0 => None,
            // SAFETY: plain bytes and counts; every one the kernels read is written by them
            // first (`tz_pair_top` starts each tensor's sums and its output's head), but for the
            // top maps' totals, zeroed here.
            _ => Some(unsafe {
                (
                    s.alloc::<u8>(area_len as usize)?,
                    s.alloc::<u8>(pout_len as usize)?,
                    s.alloc_zeros::<u8>(crate::pair_model::TOP_BYTES as usize * n_dev_pair)?,
                )
            }),
        };
        // Their jobs, but for the fields that point into the parameters and tables (filled in
        // the upload below), and the sample jobs (every sampled block of each, in order).
        let mut pair_jobs: Vec<(usize, usize, crate::pair_model::PairJob)> = Vec::new();
        let mut sample_jobs = Vec::with_capacity(n_samples);
        if let Some((area, pout, tops)) = &dev_pair_bufs {
            let ptr = |b: &CudaSlice<u8>| b.device_ptr(&s).0;
            let (area, pout, tops) = (ptr(area), ptr(pout), ptr(tops));
            for (i, c) in counting.iter().enumerate() {
                let Some(DevPair {
                    index: m,
                    area_at,
                    out_at,
                    plane: o,
                }) = dev_pair[i]
                else {
                    continue;
                };
                let us = c.header.planes();
                let tensor = pair_jobs.len() as u32;
                sample_jobs.extend(
                    (0..c.sampling.picks.len() as u32)
                        .map(|block| crate::pair_model::PairSampleJob { tensor, block }),
                );
                pair_jobs.push((
                    i,
                    o,
                    crate::pair_model::PairJob {
                        hists: counts_ptr + 4 * (c.hist_at + o * 256) as u64,
                        top: tops + crate::pair_model::TOP_BYTES * m as u64,
                        area: area + area_at,
                        out: pout + out_at,
                        n_blocks: c.sampling.n_blocks,
                        stride: (us * 256) as u32,
                        n_sampled: c.sampling.picks.len() as u32,
                        planes: us as u32,
                        threshold: opts.threshold_q16() as u32,
                        ..Default::default()
                    },
                ));
            }
        }
        let sk = k.search(self)?;
        let (search_f, tables_f) = (&sk.search, &sk.tables);
        let outs_dev = if gpu_search {
            let mut planes = Vec::with_capacity(n_planes);
            for c in &counting {
                let us = c.header.planes();
                for p in 0..us {
                    planes.push(crate::search::Plane {
                        hists: counts_ptr + 4 * (c.hist_at + p * 256) as u64,
                        stride: (us * 256) as u32,
                        n_sampled: c.sampling.picks.len() as u32,
                        n_blocks: c.sampling.n_blocks,
                        joint: match c.joint_at {
                            Some(j) if c.may_condition() == Some(p) => counts_ptr + 4 * j as u64,
                            _ => 0,
                        },
                        flat_stride: tensorzip::model::flat_stride(
                            c.header.dtype,
                            c.sampling.picks.len(),
                        )
                        .map_or(0, |s| s as u32),
                    });
                }
            }
            // SAFETY: each plane's histograms are `n_sampled` blocks of `us * 256` u32 from its
            // first one, and its joint counts 65536 u32, inside `counts_dev`, which the stream
            // frees only after the search (stream-ordered) below.
            let q = unsafe {
                crate::search::queue(
                    search_f,
                    &s,
                    &planes,
                    opts.max_tables as u32,
                    opts.threshold_q16() as u32,
                    // A sixteenth of the encoder's wave limit: 256 MiB by default (~200 bf16
                    // planes a launch); smaller waves, as in the many-waves test, give
                    // launches of a plane or a few.
                    self.wave_bytes() / 16,
                    self.shared().smem_limit,
                )
            }?;
            keep_search = Some(q);
            &keep_search.as_ref().expect("just set").outs
        } else {
            let spans_from = trace_spans.then(std::time::Instant::now);
            let mut pinned = self.pinned_u32(total_u32)?;
            s.memcpy_dtoh(&counts_dev, &mut pinned.as_mut_slice()?[..total_u32])?;
            s.synchronize()?;
            let host_down = &pinned.as_slice()?[..total_u32];
            let hists = |c: &Counting| -> &[[u32; 256]] {
                let n = c.sampling.picks.len() * c.header.planes() * 256;
                let flat = &host_down[c.hist_at..c.hist_at + n];
                // SAFETY: [u32; 256] has the alignment of u32 and no padding; `flat` holds a
                // whole number of them.
                unsafe {
                    std::slice::from_raw_parts(flat.as_ptr() as *const [u32; 256], flat.len() / 256)
                }
            };
            let mut models: Vec<Model> = counting
                .par_iter()
                .map(|c| {
                    let joint = |_: usize, _: usize| match c.joint_at {
                        Some(j) => JointCounts::from_dense(&host_down[j..j + 65536]),
                        None => JointCounts::default(),
                    };
                    model_from_counts(&c.header, opts, &c.sampling, hists(c), joint)
                })
                .collect();
            // The search's outputs are the version 1 tables: a paired plane's blocks choose by
            // them (the encode kernel's code lengths), and its rank tables come in its
            // `PairBlock`.
            let outs: Vec<Vec<u32>> = models
                .iter()
                .map(|model| {
                    model
                        .planes
                        .iter()
                        .flat_map(|pm| {
                            crate::search::write_out(&pm.tables, pm.cond.as_ref(), t_max)
                        })
                        .collect()
                })
                .collect();
            if opts.pair_exponents {
                let v1_len: Vec<usize> = models
                    .iter()
                    .map(|m| {
                        let mut v = Vec::new();
                        m.write_tables(&mut v);
                        v.len()
                    })
                    .collect();
                let of: Vec<PairInput> = counting
                    .iter()
                    .map(|c| PairInput {
                        header: &c.header,
                        sampling: &c.sampling,
                        hists: hists(c),
                        may_pair: c.variant == PAIRED_VARIANT,
                    })
                    .collect();
                pair_models(&of, &mut models, opts);
                for (i, m) in models.into_iter().enumerate() {
                    if m.version() == tensorzip::blob::BLOB_VERSION_PAIRED {
                        paired[i] = Some((m, v1_len[i]));
                    }
                }
            }
            drop(pinned);
            if let Some(t) = spans_from {
                eprintln!(
                    "gpu encode: host table search {:.3} ms",
                    t.elapsed().as_secs_f64() * 1e3
                );
            }
            keep_host_outs = Some(s.clone_htod(&outs.concat())?);
            keep_host_outs.as_ref().expect("just set")
        };
        trace("search");
        // The encoder's jobs, prepared while the GPU counts and searches (they depend on the
        // tensors' layouts only): per launch group (unit size and transform, stage in shared
        // memory or not) its chunks in tensor and chunk order, in waves that fit the scratch
        // (`waves`); each job with its slot in the wave's scratch and the wave's first job of
        // its tensor, from which `tz_place` sums the payloads into places.
        let groups = launch_groups(counting.iter().map(|c| (c.variant, c.smem_stage)));
        let pipe = self.pipe_waves();
        let mut jobs: Vec<EncJob> = Vec::new();
        // (launch group, the wave's jobs, its scratch bytes)
        let mut wave_jobs: Vec<(usize, std::ops::Range<usize>, u64)> = Vec::new();
        for (g, (_, members)) in groups.iter().enumerate() {
            let all: Vec<(usize, u64)> = members
                .iter()
                .flat_map(|&i| (0..counting[i].header.n_chunks()).map(move |c| (i, c)))
                .collect();
            let slot = |&(i, _): &(usize, u64)| counting[i].slot_bytes;
            let (total, largest) = (all.iter().map(slot).sum(), all.iter().map(slot).max());
            let limit = group_wave_limit(
                all.len() as u64,
                total,
                largest.unwrap_or(0),
                self.wave_bytes(),
                pipe,
            );
            for (wave, bytes) in waves(all.len(), limit, |j| counting[all[j].0].slot_bytes) {
                let at = wave.start;
                let first = jobs.len();
                let (mut off, mut seg) = (0u64, 0u32);
                for (w, &(i, c)) in all[wave].iter().enumerate() {
                    if w == 0 || all[at + w - 1].0 != i {
                        seg = w as u32;
                    }
                    jobs.push(EncJob {
                        data: counting[i].data,
                        chunk: c,
                        slot: off,
                        dst: 0,
                        tensor: i as u32,
                        seg,
                    });
                    off += counting[i].slot_bytes;
                }
                wave_jobs.push((g, first..jobs.len(), bytes));
            }
        }
        // The encoders' scratch: two buffers, each big enough for the largest wave, which the waves
        // take in turn (one where there is a single wave), so that a wave's compaction can read
        // its slots while the next wave encodes into the other buffer. Each buffer has 16 bytes
        // of padding (the compaction reads a little past a slot's end) and starts at a 256-byte
        // boundary. Not zeroed: the encode kernel writes every byte the compaction stores
        // before it is read (on an H200 the zeroing of 1 GiB's 2.5 GiB of slots was 0.63 ms of
        // the call, once the table search had moved to the GPU and no longer hid it). Checked on
        // the H200 (2026-12-02): the encoder's GPU tests give the CPU's blobs also with the
        // scratch filled with 0xAB.
        let largest_wave = wave_jobs.iter().map(|w| w.2).max().unwrap_or(0);
        let buffer_stride = (largest_wave + 16).next_multiple_of(256);
        let buffers = if wave_jobs.len() > 1 { 2 } else { 1 };
        // SAFETY: plain bytes, every one the kernels use written by them first (above).
        let scratch = unsafe { s.alloc::<u8>((buffer_stride * buffers) as usize) }?;
        // The blobs: room for the longest head the tables can make (each plane's count byte, its
        // tables of at most 258 bytes, the conditional table's 2 + 258), the directory and the
        // tensor's bytes; the payloads start where `tz_enc_tables` puts them (`dst_base`: the
        // header and directory here, the tables' bytes added on the device), and the head is
        // written in front once the host has parsed the tables. Parameters with the fixed table
        // slots; the tables' counts and the conditional plane come from the device.
        let slots = t_max + 1;
        // The paired planes' tables (format version 2), one upload: per tensor that pairs, its
        // `PairBlock` and its rank tables' entries.
        let mut pair_at = vec![None; counting.len()];
        let mut pair_bytes: Vec<u8> = Vec::new();
        for (i, v2) in paired.iter().enumerate() {
            let Some((m, _)) = v2 else { continue };
            let Some(o) = m.paired_plane() else { continue };
            let pm = &m.planes[o];
            let Some(coder) = pm.pairs.as_ref() else {
                continue;
            };
            pair_at[i] = Some(pair_bytes.len() as u64);
            pair_bytes.extend_from_slice(&crate::pair_model::pair_block(coder, &pm.tables));
        }
        let pair_dev = match pair_bytes.is_empty() {
            true => None,
            false => Some(s.clone_htod(&pair_bytes)?),
        };
        let pair_base = pair_dev.as_ref().map_or(0, |d| d.device_ptr(&s).0);
        let mut coded = Vec::with_capacity(counting.len());
        for (ci, c) in counting.into_iter().enumerate() {
            let t = &tensors[c.index];
            let planes = c.header.planes();
            let mut header_bytes = Vec::new();
            c.header.write(&mut header_bytes);
            let dir_len = c.header.n_chunks() as usize * c.header.dir_entry_len();
            // A version 2 blob's head, whole (its tables are the host's), and the bytes its
            // version 1 tables section has (what `tz_enc_tables` adds to the payloads' start).
            let v2 = paired[ci].take().map(|(m, v1_len)| {
                let mut head = Vec::new();
                c.header.write_version(m.version(), &mut head);
                m.write_tables(&mut head);
                (head, v1_len)
            });
            // (A pair field for each plane, at most 257 bytes for the paired one, where the
            // device may pair the tensor: its rank tables are shorter than the 258 bytes each
            // table is given.)
            let tables_max = planes * (1 + 258 * t_max as usize + 260)
                + dev_pair[ci].map_or(0, |_| planes + 256);
            let head_max = (header_bytes.len() + tables_max)
                .max(v2.as_ref().map_or(0, |(h, _)| h.len()))
                + dir_len;
            // SAFETY: plain bytes; everything below the blob's length is written before it is read.
            let blob = unsafe { s.alloc::<u8>(head_max + t.nbytes) }?;
            let mut p = c.params;
            for (q, base) in p.table_base.iter_mut().enumerate().take(planes) {
                *base = ((plane_first[ci] + q) as u64 * slots) as u32;
            }
            if let (Some(q), Some((_, src))) = (c.may_condition(), t.dtype.conditioned_plane()) {
                p.cond_src = src as u32;
                p.cond_table = ((plane_first[ci] + q) as u64 * slots + t_max) as u32;
            }
            p.dst_base = blob.device_ptr(&s).0 + (header_bytes.len() + dir_len) as u64;
            if let Some((head, v1_len)) = &v2 {
                p.dst_base = blob.device_ptr(&s).0 + (head.len() + dir_len - v1_len) as u64;
            }
            if let Some(at) = pair_at[ci] {
                p.pair = pair_base + at;
            }
            p.dst_cap = t.nbytes as u64;
            coded.push(Coded {
                may_condition: c.may_condition(),
                index: c.index,
                data: c.data,
                header: c.header,
                params: p,
                prefix: header_bytes,
                v2_head: v2.map(|(h, _)| h),
                blob,
                dir: Vec::new(),
                total: 0,
            });
        }
        // The encode kernel's tables, in their fixed slots (not zeroed: a slot is read only if its
        // plane's `n_tables` or conditional plane says `tz_enc_tables` wrote it), and each tensor's
        // constant-block selectors (2 KiB, 256 per plane). 5 KiB a slot: 45 KiB per plane at the
        // default 8 tables (325 KiB at the format's 64), whether or not the search keeps them.
        let n_slots = (n_planes as u64 * slots) as usize;
        // SAFETY: plain integers; see above.
        let fcs = unsafe { s.alloc::<u32>(n_slots * 1024) }?;
        // SAFETY: as above.
        let cls = unsafe { s.alloc::<u32>(n_slots * 256) }?;
        // SAFETY: as above.
        let info = unsafe { s.alloc::<u32>(n_slots) }?;
        let const_sel = s.alloc_zeros::<u8>(coded.len() * 2048)?;
        let (fcs_ptr, cls_ptr, info_ptr, const_sel_ptr) = (
            fcs.device_ptr(&s).0,
            cls.device_ptr(&s).0,
            info.device_ptr(&s).0,
            const_sel.device_ptr(&s).0,
        );
        let outs_ptr = outs_dev.device_ptr(&s).0;
        let out_stride = crate::search::out_bytes(t_max);
        trace("blob buffers");
        // Parameters, jobs and the table jobs in one page-locked upload; the table jobs point
        // into the parameters uploaded with them.
        let params: Vec<EncParams> = coded.iter().map(|c| c.params).collect();
        let cap = staged_len::<EncParams>(params.len())
            + staged_len::<EncJob>(jobs.len())
            + staged_len::<crate::search::TablesJob>(n_planes)
            + staged_len::<crate::pair_model::PairJob>(pair_jobs.len())
            + staged_len::<crate::pair_model::PairSampleJob>(sample_jobs.len());
        let (jobs_dev, [params_ptr, jobs_base, tables_jobs, pair_jobs_at, sample_jobs_at]) =
            self.upload_staged(cap, |st, base| {
                let params_at = base + st.push(&params) as u64;
                let jobs_at = base + st.push(&jobs) as u64;
                let field = |i: usize, off: usize| {
                    params_at + (i * std::mem::size_of::<EncParams>() + off) as u64
                };
                let mut tj = Vec::with_capacity(n_planes);
                for (i, c) in coded.iter().enumerate() {
                    for q in 0..c.header.planes() {
                        let g = plane_first[i] + q;
                        tj.push(crate::search::TablesJob {
                            out: outs_ptr + g as u64 * out_stride,
                            n_tables: field(i, std::mem::offset_of!(EncParams, n_tables) + 4 * q),
                            cond_plane: field(i, std::mem::offset_of!(EncParams, cond_plane)),
                            cond_value: field(i, std::mem::offset_of!(EncParams, cond_value)),
                            head: field(i, std::mem::offset_of!(EncParams, dst_base)),
                            const_sel: const_sel_ptr + (i * 2048 + q * 256) as u64,
                            table: c.params.table_base[q],
                            plane: q as u32,
                            conditioned: (c.may_condition == Some(q)) as u32,
                            pad: 0,
                        });
                    }
                }
                let tables_at = base + st.push(&tj) as u64;
                // The pair model's jobs: plane `o`'s code lengths, table count and output, the
                // parameters it writes.
                let pj: Vec<crate::pair_model::PairJob> = pair_jobs
                    .iter()
                    .map(|&(i, o, j)| {
                        let c = &coded[i];
                        crate::pair_model::PairJob {
                            cls: cls_ptr + 4 * 256 * c.params.table_base[o] as u64,
                            n_tables: field(i, std::mem::offset_of!(EncParams, n_tables) + 4 * o),
                            pair: field(i, std::mem::offset_of!(EncParams, pair)),
                            head: field(i, std::mem::offset_of!(EncParams, dst_base)),
                            v1_out: outs_ptr + (plane_first[i] + o) as u64 * out_stride,
                            ..j
                        }
                    })
                    .collect();
                let pair_at = base + st.push(&pj) as u64;
                let samples_at = base + st.push(&sample_jobs) as u64;
                Ok([params_at, jobs_at, tables_at, pair_at, samples_at])
            })?;
        // SAFETY: every job's output lies inside `outs_dev` (`n_planes` outputs of `out_stride`
        // bytes), its parameter fields inside the uploaded parameters, its selectors inside
        // `const_sel`, and its slots (`table ..= table + max_tables`) inside the `n_slots` of `fcs`,
        // `cls` and `info`; all live until the final synchronisation.
        unsafe {
            crate::search::queue_tables(
                tables_f,
                &s,
                tables_jobs,
                n_planes as u32,
                opts.max_tables as u32,
                [fcs_ptr, cls_ptr, info_ptr],
            )
        }?;
        if dev_pair_bufs.is_some() {
            // SAFETY: the jobs uploaded above, as `pair_model::queue` requires: each area and
            // output sized by `area_bytes` / `out_bytes` for `max_tables`, the histograms and
            // code lengths inside `counts_dev` and `cls`, the parameter fields inside the
            // uploaded parameters, each sample job a sampled block of its tensor (laid out
            // above); all alive until the final
            // synchronisation (`counts_dev` until the stream has run these).
            unsafe {
                crate::pair_model::queue(
                    &sk.pair,
                    &s,
                    (pair_jobs_at, pair_jobs.len() as u32),
                    (sample_jobs_at, sample_jobs.len() as u32),
                    opts.max_tables as u32,
                )
            }?;
        }
        drop(counts_dev);
        trace("tables");
        let outs = s.alloc_zeros::<ChunkOut>(jobs.len())?;
        let mut placed = s.alloc_zeros::<u64>(coded.len())?;
        let mut bad = s.alloc_zeros::<u32>(1)?;
        let outs_base = outs.device_ptr(&s).0;
        let placed_ptr = placed.device_ptr_mut(&s).0;
        let bad_ptr = bad.device_ptr_mut(&s).0;
        // 3-4. Per wave: the encoder (its reports also written into the host's page-locked
        // buffer, for the directories), `tz_place` (the reports checked and summed into places on
        // the device) and `tz_compact` (the payloads moved to their places). No host round trip
        // between waves: the host parses the tables while the encoder runs and reads the reports
        // while the last placement and compaction run.
        let mut widths = Vec::with_capacity(groups.len());
        for ((v, smem_stage), members) in &groups {
            let us = VARIANTS[*v].0 as u64;
            let stage_bytes = if *smem_stage {
                members
                    .iter()
                    .map(|&i| us * coded[i].header.block_units as u64)
                    .max()
                    .unwrap_or(0)
                    .div_ceil(16)
                    * 16
            } else {
                0
            };
            let per_warp = hist_bytes(us) + stage_bytes;
            let f = &k.variants(self, &[*v])?[0].1;
            let warps = enc_block_width(f, per_warp, self.shared().smem_limit)?;
            let smem = (warps as u64 * per_warp) as u32;
            crate::engine::allow_dynamic_smem(f, self.shared().smem_limit, smem as u64)?;
            widths.push((f, warps, smem, stage_bytes as u32, us as u32));
        }
        // One page-locked buffer for the search's outputs, the pair model's outputs, the reports,
        // the placement verdict and the parameters as the device left them.
        const OUT_U32: usize = std::mem::size_of::<ChunkOut>() / 4;
        const PARAM_U32: usize = std::mem::size_of::<EncParams>() / 4;
        let search_u32 = n_planes * crate::search::out_words(t_max);
        let down_u32 = search_u32 + pout_len as usize / 4;
        // The reports at a 16-byte boundary: the encode kernel writes each as three 16-byte stores.
        let rep_at = down_u32.next_multiple_of(4);
        let par_at = rep_at + jobs.len() * OUT_U32 + 1;
        let mut pinned = self.pinned_u32(par_at + coded.len() * PARAM_U32)?;
        let scratch_ptr = scratch.device_ptr(&s).0;
        let run = (|| -> Result<()> {
            let host = pinned.as_mut_slice()?;
            // The page-locked buffer as the device addresses it (mapped: with unified addressing,
            // all page-locked memory is). The encode kernel writes its reports there directly, so
            // that no copy stands on the stream between the kernel and the placement (a 393 KB
            // download of 1 GiB's 8192 reports took 17 us there on the H200).
            let mut host_dev: cudarc::driver::sys::CUdeviceptr = 0;
            // SAFETY: `host` is page-locked memory of this context (`pinned_u32`); the call only
            // writes `host_dev`.
            unsafe {
                cudarc::driver::sys::cuMemHostGetDevicePointer_v2(
                    &mut host_dev,
                    host.as_mut_ptr() as *mut std::ffi::c_void,
                    0,
                )
            }
            .result()?;
            // SAFETY: the outputs, `search_u32` u32 of `outs_dev` and the pair model's `pout_len`
            // bytes, into the page-locked buffer, which the host reads only after the `searched`
            // event.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    &mut host[..search_u32],
                    outs_ptr,
                    s.cu_stream(),
                )?;
                if let Some((_, pout, _)) = &dev_pair_bufs {
                    cudarc::driver::result::memcpy_dtoh_async(
                        &mut host[search_u32..down_u32],
                        pout.device_ptr(&s).0,
                        s.cu_stream(),
                    )?;
                }
            }
            let searched = s.record_event(Some(
                cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
            ))?;
            // The waves: each wave's encoder on side stream `w % 2` into scratch buffer `w % 2`,
            // once the compaction of wave `w - 2` (the buffer's last user) is done; its placement
            // and compaction on side stream 2, in wave order (the placement carries each tensor's
            // running place from wave to wave), once it is encoded. So a wave's compaction runs
            // under the next wave's encoding, and two encoder launches may share the SMs where
            // one drains. The side streams join the call's stream at the end of this block. (A
            // single wave runs on the call's stream.)
            let mut reported = Vec::with_capacity(2);
            {
                // A call of one wave (any of fewer than 2048 chunks) runs it all on its own
                // stream, as before the pipeline: no streams to make, no events to wait for.
                let side = match wave_jobs.len() > 1 {
                    true => Some(crate::side_streams::SideStreams::fork(s.context(), &s, 3)?),
                    false => None,
                };
                let on = |k: usize| side.as_ref().map_or(&s, |set| set.get(k));
                let copier = on(2);
                let event = |st: &CudaStream| {
                    st.record_event(Some(
                        cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
                    ))
                };
                let mut compacted: Vec<cudarc::driver::CudaEvent> =
                    Vec::with_capacity(wave_jobs.len());
                for (w, (g, range, bytes)) in wave_jobs.iter().enumerate() {
                    let (f, warps, smem, sb, us) = widths[*g];
                    let buffer = (w % 2) as u64;
                    // The buffers are sized for the largest wave (checked here all the same).
                    if buffer_stride * (buffer + 1) > scratch.len() as u64
                        || bytes + 16 > buffer_stride
                    {
                        return Err(Error::Driver(format!(
                            "encoder scratch of {} bytes is short of a wave of {bytes}",
                            scratch.len()
                        )));
                    }
                    let slots_ptr = scratch_ptr + buffer * buffer_stride;
                    let enc = on(w % 2);
                    let one_stream = Arc::ptr_eq(enc, copier);
                    if let Some(before) = w.checked_sub(2).map(|p| &compacted[p]) {
                        enc.wait(before)?;
                    }
                    let n = range.len() as u32;
                    let jobs_ptr = jobs_base + (range.start * std::mem::size_of::<EncJob>()) as u64;
                    let outs_ptr =
                        outs_base + (range.start * std::mem::size_of::<ChunkOut>()) as u64;
                    let host_outs = host_dev + 4 * (rep_at + range.start * OUT_U32) as u64;
                    let mut b = enc.launch_builder(f);
                    b.arg(&jobs_ptr)
                        .arg(&n)
                        .arg(&params_ptr)
                        .arg(&fcs_ptr)
                        .arg(&cls_ptr)
                        .arg(&info_ptr)
                        .arg(&const_sel_ptr)
                        .arg(&slots_ptr)
                        .arg(&outs_ptr)
                        .arg(&host_outs)
                        .arg(&sb)
                        .arg(&warps);
                    let cfg = LaunchConfig {
                        grid_dim: (n.div_ceil(warps), 1, 1),
                        block_dim: (32 * warps, 1, 1),
                        shared_mem_bytes: smem,
                    };
                    // SAFETY: arguments match `tz_encode_*`; each job's chunk lies inside its
                    // tensor, and it writes only its own slot (inside the wave's scratch buffer,
                    // checked above, which no compaction still reads: the stream waited for the
                    // buffer's last one), its `outs` entry and its report in the page-locked
                    // buffer (`host_outs`: the wave's `n` reports from `rep_at + range.start *
                    // OUT_U32`, inside the buffer, which the host reads only after the `reported`
                    // events and keeps until the stream is done); the shared memory holds `warps`
                    // x (histograms + stage); the tables it reads are the slots `tz_enc_tables`
                    // wrote (below each plane's `n_tables`, and the conditional one only where it
                    // set the conditional plane): the side streams start after them.
                    unsafe { b.launch(cfg) }?;
                    trace("encode kernel");
                    let encoded = event(enc)?;
                    if !one_stream {
                        copier.wait(&encoded)?;
                    }
                    // The host reads the reports once the last wave of each encoder stream is
                    // done, while the last placements and compactions run.
                    if w + 2 >= wave_jobs.len() {
                        reported.push(encoded);
                    }
                    // SAFETY: the wave's `n` jobs and reports (written: the placement's stream
                    // waited for the wave's encoder, or is its stream), `params` and `placed` with
                    // an entry for every tensor the jobs name (built above from `counting`'s
                    // indices), `bad`; the placements run in wave order on one stream.
                    unsafe {
                        k.place(
                            copier, jobs_ptr, n, params_ptr, outs_ptr, placed_ptr, bad_ptr, us,
                        )
                    }?;
                    trace("placed");
                    // SAFETY: as for `place`; the slots of the wave's jobs lie inside its scratch
                    // buffer (checked above).
                    unsafe {
                        k.compact(
                            copier, slots_ptr, jobs_ptr, params_ptr, outs_ptr, n, bad_ptr,
                        )
                    }?;
                    trace("compacted");
                    compacted.push(event(copier)?);
                }
                if let Some(set) = &side {
                    set.join()?;
                }
            }
            // The placement's verdict and the parameters as the device left them, after the last
            // compaction (nothing waits for them on the stream; the host checks them after the
            // call's final synchronisation).
            // SAFETY: one u32 and the parameters (`coded.len()` of them from `params_ptr`), into
            // the page-locked buffer's last entries, read after the final synchronisation.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    &mut host[par_at - 1..par_at],
                    bad_ptr,
                    s.cu_stream(),
                )?;
                cudarc::driver::result::memcpy_dtoh_async(
                    &mut host[par_at..par_at + coded.len() * PARAM_U32],
                    params_ptr,
                    s.cu_stream(),
                )?;
            }
            if reported.is_empty() {
                return Err(Error::Driver("encoder waves do not cover the batch".into()));
            }
            // While the encoder runs: every plane's output parsed and checked, and each blob's
            // head (header, tables) written from it.
            searched.synchronize()?;
            trace("host waits for the tables");
            let host = &*host;
            let area_base = dev_pair_bufs.as_ref().map_or(0, |b| b.0.device_ptr(&s).0);
            let parsed = coded
                .par_iter()
                .enumerate()
                .map(|(i, c)| {
                    let mut prefix = c.prefix.clone();
                    let mut kept = [0u32; 8];
                    let mut cond = None;
                    let mut planes = Vec::with_capacity(c.header.planes());
                    for (q, n) in kept.iter_mut().enumerate().take(c.header.planes()) {
                        let pt = crate::search::parse_plane(
                            &host[..search_u32],
                            plane_first[i] + q,
                            opts.max_tables,
                            c.may_condition == Some(q),
                        )?;
                        write_plane_tables(&pt.tables, pt.cond.as_ref(), &mut prefix);
                        *n = pt.tables.len() as u32;
                        if let Some((v, _)) = pt.cond {
                            cond = Some((q as u32, v as u32));
                        }
                        planes.push(pt);
                    }
                    // A version 2 blob: the outputs were its version 1 tables, checked as
                    // above; its head is the host's (the host's search), or made from the
                    // device's pair model (which also set the parameters' `pair`).
                    let mut pair = c.params.pair;
                    if let Some(head) = &c.v2_head {
                        prefix.clone_from(head);
                    }
                    if let Some(DevPair {
                        area_at,
                        out_at,
                        plane: o,
                        ..
                    }) = dev_pair[i]
                    {
                        let from = search_u32 + out_at as usize / 4;
                        let words =
                            &host[from..from + crate::pair_model::out_bytes(t_max) as usize / 4];
                        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                        pair = 0;
                        if let Some((pt, ranks)) =
                            crate::pair_model::parse_out(&bytes, planes[o].tables.len())?
                        {
                            prefix.clear();
                            c.header
                                .write_version(tensorzip::blob::BLOB_VERSION_PAIRED, &mut prefix);
                            for (q, p) in planes.iter().enumerate() {
                                let (pairs, tables) = match q == o {
                                    true => (Some(&pt), &ranks),
                                    false => (None, &p.tables),
                                };
                                write_paired_plane_tables(
                                    pairs,
                                    tables,
                                    p.cond.as_ref(),
                                    &mut prefix,
                                );
                            }
                            pair = area_base + area_at;
                        }
                    }
                    Ok((prefix, kept, cond, pair))
                })
                .collect::<Result<Vec<_>>>()?;
            for (c, (prefix, kept, cond, pair)) in coded.iter_mut().zip(parsed) {
                c.prefix = prefix;
                c.params.pair = pair;
                c.total = (c.prefix.len() + c.header.n_chunks() as usize * c.header.dir_entry_len())
                    as u64;
                c.params.n_tables = kept;
                if let Some((q, v)) = cond {
                    c.params.cond_plane = q;
                    c.params.cond_value = v;
                }
            }
            trace("host tables");
            for r in &reported {
                r.synchronize()?;
            }
            Ok(())
        })();
        if let Err(e) = run {
            // Nothing may still be copying into the page-locked buffer when it is handed back.
            let _ = s.synchronize();
            return Err(e);
        }
        trace("reports");
        // What `tz_enc_tables` wrote into the parameters must be what the host parsed: the same
        // table counts and conditional plane, and the payloads placed right after the head (each
        // blob's head ends at `c.total` now, before the payloads are added). The parameters are
        // downloaded after the last compaction, so this is checked after the final
        // synchronisation, as the placement's verdict is.
        // (the tensor's index in the batch, its planes, its parameters, its blob, its head's end)
        let expect: Vec<(usize, usize, EncParams, u64, u64)> = coded
            .iter()
            .map(|c| {
                let base = c.blob.device_ptr(&s).0;
                (c.index, c.header.planes(), c.params, base, base + c.total)
            })
            .collect();
        let host = match pinned.as_slice() {
            Ok(h) => &h[..par_at + coded.len() * PARAM_U32],
            Err(e) => {
                // The downloads into the page-locked buffer may still run: wait before it can
                // be given back.
                let _ = s.synchronize();
                return Err(e.into());
            }
        };
        // Every step until the final synchronisation returns its error only after waiting for the
        // stream: the compaction and the downloads into the page-locked buffer may still run.
        let heads = (|| -> Result<Option<CudaSlice<u8>>> {
            let got_bytes = &host[rep_at..rep_at + jobs.len() * OUT_U32];
            // SAFETY: `ChunkOut` is `repr(C)`, 48 bytes of u32 and u8 fields (alignment 4, no
            // padding, every bit pattern valid), and the encode kernels wrote `got_bytes` (the
            // `reported` event has completed).
            let got: &[ChunkOut] = unsafe {
                std::slice::from_raw_parts(got_bytes.as_ptr() as *const ChunkOut, jobs.len())
            };
            for (j, o) in jobs.iter().zip(got) {
                let cd = &mut coded[j.tensor as usize];
                let us = cd.header.planes();
                let len = cd.header.chunk_len(j.chunk) as u64 * us as u64;
                let sum = o.sel_len as u64 + o.rans_len as u64 + o.kept as u64;
                if o.payload_len as u64 != sum
                    || o.payload_len as u64 > len
                    || (o.rans_len != 0 && o.rans_len != 128 + 2 * o.n_words)
                    || o.n_words > cd.params.cap_words
                    || cd.total + o.payload_len as u64 > cd.blob.len() as u64
                {
                    return Err(Error::Driver(format!(
                        "encoder kernel reported inconsistent sizes for chunk {}: {o:?}",
                        j.chunk
                    )));
                }
                cd.total += o.payload_len as u64;
                // Each of the tensor's planes a mode it may have (conditioned: only the plane
                // the tensor may condition), the others raw (tz_place checks as much).
                let mut modes = [PlaneMode::Raw; 8];
                for (q, &m) in o.modes.iter().enumerate() {
                    let mode = match m {
                        0 => PlaneMode::Raw,
                        1 if q < us => PlaneMode::Const(o.values[q]),
                        2 if q < us => PlaneMode::Blocks,
                        3 if q < us && cd.may_condition == Some(q) => PlaneMode::Cond,
                        _ => {
                            return Err(Error::Driver(format!(
                                "encoder kernel reported mode {m} for plane {q} of chunk {}",
                                j.chunk
                            )))
                        }
                    };
                    if q < us {
                        modes[q] = mode;
                    }
                }
                ChunkEntry {
                    payload_len: o.payload_len,
                    rans_len: o.rans_len,
                    modes,
                }
                .write(us, &mut cd.dir);
            }
            trace("chunks");
            for c in coded {
                let t = &tensors[c.index];
                let stored_len = stored_header(t.dtype, &t.shape).encoded_len() + t.nbytes;
                if c.total >= stored_len as u64 {
                    // SAFETY: forwarded from the caller.
                    blobs[c.index] = Some(unsafe {
                        self.stored_blob(c.data, t.nbytes, t.dtype, &t.shape, &mut writes)?
                    });
                    continue;
                }
                let mut head = c.prefix;
                head.extend_from_slice(&c.dir);
                writes.put(&head, c.blob.device_ptr(&s).0);
                blobs[c.index] = Some(DeviceBlob {
                    buf: c.blob,
                    len: c.total as usize,
                });
            }
            // SAFETY: the heads go to the start of their blobs (each `head_len` bytes were
            // allocated in front of its payloads); stored blobs read the caller's tensors (its
            // promise).
            unsafe { std::mem::take(&mut writes).flush(self) }
        })();
        trace("heads queued");
        let synced = s.synchronize();
        trace("synchronized");
        let staged = heads?;
        synced?;
        drop(staged);
        // The parameters were uploaded in `coded`'s order: entry `at`.
        for (at, (i, planes, want, base, head_end)) in expect.into_iter().enumerate() {
            // SAFETY: `EncParams` is plain integers (every bit pattern valid), read unaligned from
            // its `PARAM_U32` u32 in the downloaded range (the stream has finished).
            let dev: EncParams = unsafe {
                std::ptr::read_unaligned(
                    host[par_at + at * PARAM_U32..].as_ptr() as *const EncParams
                )
            };
            if dev.n_tables[..planes] != want.n_tables[..planes]
                || dev.cond_plane != want.cond_plane
                || (want.cond_plane < 8 && dev.cond_value != want.cond_value)
                || dev.dst_base != head_end
                || dev.pair != want.pair
            {
                return Err(Error::Kernel(format!(
                    "encoder tables on the device disagree with the search's output (tensor {i}: \
                     tables {:?} / {:?}, conditional plane {} / {}, payloads at +{} / +{}, \
                     paired {} / {})",
                    &dev.n_tables[..planes],
                    &want.n_tables[..planes],
                    dev.cond_plane,
                    want.cond_plane,
                    dev.dst_base.wrapping_sub(base),
                    head_end - base,
                    dev.pair != 0,
                    want.pair != 0
                )));
            }
        }
        if host[par_at - 1] != 0 {
            return Err(Error::Driver(
                "encoder placement found a chunk's sizes inconsistent; nothing was compacted"
                    .into(),
            ));
        }
        drop(pinned);
        drop((keep_alive, count_inputs));
        drop((jobs_dev, outs, placed, bad));
        drop((
            fcs,
            cls,
            info,
            const_sel,
            keep_search,
            keep_host_outs,
            pair_dev,
        ));
        trace("done");
        Ok(blobs.into_iter().flatten().collect())
    }

    /// A stored blob of the `nbytes` bytes at `data`; its bytes are written by `writes`.
    ///
    /// # Safety
    /// As [`GpuEngine::compress_batch_device`].
    unsafe fn stored_blob(
        &self,
        data: u64,
        nbytes: usize,
        dtype: DType,
        shape: &[u64],
        writes: &mut DeviceWrites,
    ) -> Result<DeviceBlob> {
        let s = self.stream();
        let mut head = Vec::new();
        stored_header(dtype, shape).write(&mut head);
        let len = head.len() + nbytes;
        // SAFETY: plain bytes; `writes` fills every one (the head, then the tensor's bytes).
        let buf = unsafe { s.alloc::<u8>(len) }?;
        let bp = buf.device_ptr(s).0;
        writes.put(&head, bp);
        writes.copy(data, bp + head.len() as u64, nbytes as u64);
        Ok(DeviceBlob { buf, len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encode kernel's `push`, on the host: the state after coding a symbol of entry `e` into
    /// the renormalised state `x`.
    fn push(x: u32, e: [u32; 4]) -> u32 {
        let hi = ((x as u64 * e[0] as u64) >> 32) as u32;
        let q = x.wrapping_mul(e[1]).wrapping_add(hi) >> 12;
        x.wrapping_add(e[2]).wrapping_add(q.wrapping_mul(e[3]))
    }

    /// The kernel's quotient from the 45-bit reciprocal is floor(x / f) for every frequency and
    /// every state the encoder pushes from (f <= x < f << 20, x >= 2^16): each frequency at the
    /// ends of its range, at the states around every 4099th multiple of f and at 4096 spread
    /// states; the result is the rANS state the core computes.
    #[test]
    fn push_quotient_is_exact() {
        let mut rng = tensorzip::sample::Rng::new(44);
        for f in 1u32..=4095 {
            let c = 4096 - f;
            let e = enc_entry(f, c);
            let lo = 1u64 << 16;
            let hi = (f as u64) << 20; // exclusive
            let check = |x: u64| {
                if x < lo || x >= hi {
                    return;
                }
                let x = x as u32;
                let want = (x / f) * 4096 + x % f + c;
                assert_eq!(push(x, e), want, "f {f} x {x}");
            };
            for x in [lo, lo + 1, hi - 2, hi - 1] {
                check(x);
            }
            let mut k = lo / f as u64;
            while k * (f as u64) < hi {
                let m = k * f as u64;
                check(m.wrapping_sub(1));
                check(m);
                check(m + f as u64 - 1);
                k += 4099;
            }
            for _ in 0..4096 {
                check(lo + rng.next_u64() % (hi - lo));
            }
        }
    }

    /// The waves of chunks (and the search's launches of planes): in order, covering every slot,
    /// each within the limit unless it is one slot, and each with its slots' bytes.
    #[test]
    fn waves_cover_the_slots_in_order_within_the_limit() {
        let sizes = [5u64, 5, 5, 20, 1, 1, 9];
        let ranges = |limit| -> Vec<_> {
            waves(sizes.len(), limit, |i| sizes[i])
                .into_iter()
                .map(|(r, _)| r)
                .collect()
        };
        assert_eq!(ranges(10), vec![0..2, 2..3, 3..4, 4..6, 6..7]);
        assert_eq!(ranges(11), vec![0..2, 2..3, 3..4, 4..7]);
        assert_eq!(ranges(0), (0..7).map(|i| i..i + 1).collect::<Vec<_>>());
        assert_eq!(ranges(u64::MAX), vec![0..7]);
        assert!(waves(0, 10, |_| 1).is_empty());
        let mut x = 5u64;
        let mut r = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x >> 33
        };
        for _ in 0..1000 {
            let sizes: Vec<u64> = (0..(r() % 40)).map(|_| r() % 100).collect();
            let limit = r() % 300;
            let g = waves(sizes.len(), limit, |i| sizes[i]);
            assert_eq!(g.iter().map(|(w, _)| w.len()).sum::<usize>(), sizes.len());
            for (k, (w, bytes)) in g.iter().enumerate() {
                assert!(!w.is_empty());
                assert_eq!(w.start, if k == 0 { 0 } else { g[k - 1].0.end });
                assert_eq!(*bytes, sizes[w.clone()].iter().sum::<u64>());
                assert!(w.len() == 1 || *bytes <= limit);
            }
        }
    }

    #[test]
    fn large_groups_are_cut_into_pipeline_waves() {
        let cut = |slots: &[u64], cap: u64, pipe: u64| {
            let total = slots.iter().sum();
            let largest = slots.iter().copied().max().unwrap_or(0);
            let limit = group_wave_limit(slots.len() as u64, total, largest, cap, pipe);
            waves(slots.len(), limit, |j| slots[j])
        };
        // 1 GiB of bf16: 8192 slots of ~320 KiB, two waves of 4096 slots (four of 2048).
        let bf16 = vec![327_696u64; 8192];
        let w = cut(&bf16, SCRATCH_BYTES, PIPE_WAVES);
        assert_eq!(w.len(), 2);
        assert!(w
            .iter()
            .all(|(r, b)| r.len() == 4096 && *b == 4096 * 327_696));
        let w = cut(&bf16, SCRATCH_BYTES, 4);
        assert_eq!(w.len(), 4);
        assert!(w
            .iter()
            .all(|(r, b)| r.len() == 2048 && *b == 2048 * 327_696));
        // A pipeline of one wave: the whole group, as before the pipeline.
        assert_eq!(cut(&bf16, SCRATCH_BYTES, 1).len(), 1);
        // Too few chunks for waves of PIPE_MIN_SLOTS: one wave, however large its slots (a tensor
        // of a few 16 MiB chunks must not have them wait for each other).
        assert_eq!(cut(&[40 << 20; 7], SCRATCH_BYTES, PIPE_WAVES).len(), 1);
        assert_eq!(cut(&[1 << 20; 2047], SCRATCH_BYTES, PIPE_WAVES).len(), 1);
        assert_eq!(cut(&[1 << 20; 2048], SCRATCH_BYTES, PIPE_WAVES).len(), 2);
        // The engine's cap (the many-waves test's) still bounds a wave.
        assert_eq!(cut(&bf16, 1 << 20, PIPE_WAVES).len(), 8192 / 3 + 1);
        // At most the count asked for, none of them tiny, every slot in one; unequal slots too.
        let mixed: Vec<u64> = (0..9000u64).map(|j| 1000 + (j * 7919) % 300_000).collect();
        for slots in [vec![327_696u64; 8193], vec![1000; 5000], mixed] {
            for pipe in [2, 3, 4, 8] {
                let w = cut(&slots, SCRATCH_BYTES, pipe);
                assert!(
                    w.len() as u64 <= pipe,
                    "{} slots, {pipe}: {} waves",
                    slots.len(),
                    w.len()
                );
                assert_eq!(w.iter().map(|(r, _)| r.len()).sum::<usize>(), slots.len());
                let least = w[..w.len() - 1].iter().map(|(r, _)| r.len()).min();
                assert!(
                    least.is_none_or(|l| l as u64 >= PIPE_MIN_SLOTS / 2),
                    "{least:?}"
                );
            }
        }
    }

    /// What one `tz_place` + `tz_compact` run left: the verdict, the bytes placed per tensor and
    /// the blob buffer.
    struct Placed {
        bad: u32,
        placed: Vec<u64>,
        blob: Vec<u8>,
    }

    /// Runs the placement and compaction of `waves` (ranges of `jobs`) of one-byte units on the
    /// device: slot `j` of the scratch holds 256 bytes `j * 256 + i` (its raw area at offset 0);
    /// tensor `t`'s payload goes to the 1 KiB blob buffer (filled with 0xEE) at `base[t]`, with room
    /// for `cap[t]` bytes; chunks of 256 units.
    fn place_and_compact(
        jobs: &[EncJob],
        waves: &[std::ops::Range<usize>],
        units: &[u64],
        base: &[u64],
        cap: &[u64],
        outs: &[ChunkOut],
    ) -> Placed {
        let eng = GpuEngine::new(0).expect("CUDA device");
        let s = eng.stream().clone();
        let k = eng.encode_kernels().expect("kernels");
        let scratch: Vec<u8> = (0..jobs.len() * 256 + 16).map(|i| i as u8).collect();
        let scratch = s.clone_htod(&scratch).unwrap();
        let blob = s.clone_htod(&vec![0xEEu8; 1024]).unwrap();
        let blob_ptr = blob.device_ptr(&s).0;
        let params: Vec<EncParams> = (0..units.len())
            .map(|t| EncParams {
                units: units[t],
                blocks_per_chunk: 1,
                chunk_units: 256,
                block_units: 256,
                cap_words: 129,
                dst_base: blob_ptr + base[t],
                dst_cap: cap[t],
                ..Default::default()
            })
            .collect();
        let jobs_dev = s.clone_htod(jobs).unwrap();
        let params_dev = s.clone_htod(&params).unwrap();
        let outs_dev = s.clone_htod(outs).unwrap();
        let placed = s.alloc_zeros::<u64>(units.len()).unwrap();
        let bad = s.alloc_zeros::<u32>(1).unwrap();
        let ptr = |p: u64, i: usize, size: usize| p + (i * size) as u64;
        for w in waves {
            let n = w.len() as u32;
            let jobs_ptr = ptr(jobs_dev.device_ptr(&s).0, w.start, 40);
            let outs_ptr = ptr(outs_dev.device_ptr(&s).0, w.start, 48);
            let (params_ptr, placed_ptr, bad_ptr) = (
                params_dev.device_ptr(&s).0,
                placed.device_ptr(&s).0,
                bad.device_ptr(&s).0,
            );
            // SAFETY: every buffer above outlives the synchronisation below; slots are 256 bytes
            // of `scratch` each, with 16 bytes to spare at its end.
            unsafe {
                k.place(
                    &s, jobs_ptr, n, params_ptr, outs_ptr, placed_ptr, bad_ptr, 1,
                )
                .unwrap();
                k.compact(
                    &s,
                    scratch.device_ptr(&s).0,
                    jobs_ptr,
                    params_ptr,
                    outs_ptr,
                    n,
                    bad_ptr,
                )
                .unwrap();
            }
        }
        let got = Placed {
            bad: s.clone_dtoh(&bad).unwrap()[0],
            placed: s.clone_dtoh(&placed).unwrap(),
            blob: s.clone_dtoh(&blob).unwrap(),
        };
        s.synchronize().unwrap();
        got
    }

    /// A chunk's report of `kept` raw bytes only.
    fn raw(kept: u32) -> ChunkOut {
        ChunkOut {
            payload_len: kept,
            kept,
            ..Default::default()
        }
    }

    /// Jobs of one wave: (tensor, chunk) in order, slot `j` for job `j`, `seg` the first job of
    /// the same tensor in the same wave.
    fn wave_jobs(list: &[(u32, u64)], waves: &[std::ops::Range<usize>]) -> Vec<EncJob> {
        let mut jobs = Vec::new();
        for w in waves {
            for j in w.clone() {
                let (tensor, chunk) = list[j];
                let seg = (w.start..=j)
                    .rev()
                    .take_while(|&i| list[i].0 == tensor)
                    .last()
                    .unwrap()
                    - w.start;
                jobs.push(EncJob {
                    slot: 256 * j as u64,
                    chunk,
                    tensor,
                    seg: seg as u32,
                    ..Default::default()
                });
            }
        }
        jobs
    }

    #[test]
    #[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
    fn placement_carries_over_waves_and_refuses_reports_it_cannot_trust() {
        // Tensor 0: 700 units (chunks of 256, 256, 188); tensor 1: 300 units (256, 44).
        let list = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)];
        let units = [700, 300];
        let base = [16, 600];
        let waves = [0..2, 2..5];
        let jobs = wave_jobs(&list, &waves);
        let kept = [100, 50, 188, 10, 44];
        let outs: Vec<ChunkOut> = kept.iter().map(|&k| raw(k)).collect();
        let got = place_and_compact(&jobs, &waves, &units, &base, &[400, 60], &outs);
        assert_eq!((got.bad, &got.placed[..]), (0, &[338u64, 54][..]));
        let mut want = vec![0xEEu8; 1024];
        let mut at = [16usize, 600];
        for (j, (&(t, _), &k)) in list.iter().zip(&kept).enumerate() {
            for i in 0..k as usize {
                want[at[t as usize] + i] = (j * 256 + i) as u8;
            }
            at[t as usize] += k as usize;
        }
        assert!(got.blob == want, "payloads not where the reports put them");

        // Each lie below, in one wave: nothing may be written anywhere.
        let whole = 0..5;
        let one = std::slice::from_ref(&whole);
        let jobs1 = wave_jobs(&list, one);
        let untouched = vec![0xEEu8; 1024];
        // (what is wrong, jobs, reports, the tensors' room)
        type Lie = (&'static str, Vec<EncJob>, Vec<ChunkOut>, [u64; 2]);
        let mut lies: Vec<Lie> = Vec::new();
        let mut o = outs.clone();
        o[4] = raw(60); // longer than its chunk (44 units), with room in the blob
        lies.push(("longer than the chunk", jobs1.clone(), o, [400, 200]));
        lies.push(("past the blob", jobs1.clone(), outs.clone(), [400, 53]));
        let mut o = outs.clone();
        o[1].payload_len = 51; // not the sum of its pieces
        lies.push(("pieces do not add up", jobs1.clone(), o, [400, 60]));
        let mut o = outs.clone();
        o[0].rans_len = 130;
        o[0].n_words = 5; // 128 + 2 * 5 != 130
        o[0].payload_len = 230;
        lies.push(("stream length", jobs1.clone(), o, [400, 60]));
        let mut o = outs.clone();
        o[2].sel_len = 3;
        o[2].nb = 3; // more blocks than a chunk has
        o[2].modes[0] = 2;
        o[2].kept = 185;
        lies.push(("selectors", jobs1.clone(), o, [400, 60]));
        let mut o = outs.clone();
        // A Blocks mode on plane 1 of one-byte units: tz_compact would copy its selectors too,
        // one byte past what the report placed.
        o[2].modes[0] = 2;
        o[2].modes[1] = 2;
        o[2].nb = 1;
        o[2].sel_len = 1;
        o[2].kept = 187;
        lies.push(("a mode past the planes", jobs1.clone(), o, [400, 60]));
        let mut o = outs.clone();
        o[2].modes[0] = 4;
        lies.push(("no such mode", jobs1.clone(), o, [400, 60]));
        let mut j = jobs1.clone();
        j[4].seg = 1; // its segment starts at another tensor's job
        lies.push(("segment", j, outs.clone(), [400, 60]));
        let mut j = jobs1.clone();
        j[3].seg = 4; // after the job itself
        lies.push(("segment after the job", j, outs.clone(), [400, 60]));
        for (what, jobs, outs, cap) in lies {
            let got = place_and_compact(&jobs, one, &units, &base, &cap, &outs);
            assert_eq!(got.bad, 1, "{what}: not refused");
            assert!(got.blob == untouched, "{what}: bytes were written");
        }
    }
}
