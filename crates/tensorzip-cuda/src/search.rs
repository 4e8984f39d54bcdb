//! The encoder's table search on the GPU (`kernels/search.cu`): a plane's frequency tables from the
//! histograms of its sampled blocks (the core's `model::cluster`) and, where they leave the plane
//! raw, its conditional table (`model::choose_conditional`), by the same integer arithmetic, so that
//! the tables are the CPU engine's bit for bit. A thread block cluster per plane ([`cluster_size`]
//! blocks, each a share of the plane's sampled blocks; one block where the device has no clusters),
//! all planes of a call at once, where the host searches one tensor's attempts after the other
//! (docs/GPU.md, "The table search on the GPU").
//!
//! The host trusts nothing the kernel writes: each plane's output is parsed with the format's own
//! table parser and its counts checked ([`parse_out`]); a failed check is an error, never a table.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use tensorzip::rans::table::FreqTable;

use crate::error::{Error, Result};

/// The kernel source.
pub const SEARCH_SRC: &str = include_str!("../kernels/search.cu");

/// One plane to search, as `SearchJob` in search.cu.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct SearchJob {
    /// Device address of the plane's histogram (256 u32) in sampled block 0; block `i`'s is
    /// `4 * i * stride` bytes further.
    pub hists: u64,
    /// The job's scratch ([`scratch_bytes`]) and its length.
    pub scratch: u64,
    pub scratch_len: u64,
    /// The job's output ([`out_bytes`]).
    pub out: u64,
    /// Joint counts (65536 u32, condition byte major) when the plane may be conditioned, else 0.
    pub joint: u64,
    /// Blocks of the plane in the whole tensor.
    pub n_blocks: u64,
    /// Sampled blocks (histograms).
    pub n_sampled: u32,
    /// u32 from one sampled block's histogram to the next.
    pub stride: u32,
    /// The flat-plane rule's probe spacing (`tensorzip::model::flat_stride`), 0 where it does not
    /// apply.
    pub flat_stride: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SearchParams {
    max_tables: u32,
    threshold: u32,
}

// SAFETY: plain `repr(C)` structs of integers, laid out as their CUDA counterparts (`SearchJob`:
// six u64 and four u32, 64 bytes; `SearchParams`: two u32).
unsafe impl DeviceRepr for SearchJob {}
// SAFETY: as above.
unsafe impl DeviceRepr for SearchParams {}
const _: () = assert!(std::mem::size_of::<SearchJob>() == 64);

/// Most tables a plane may have (the format's limit, `blob::MAX_TABLES`; the kernel's too).
const MAX_TABLES: u64 = tensorzip::blob::MAX_TABLES as u64;

/// Refuses a table count the search and the tables' expansion are not made for (1..=MAX_TABLES).
fn check_max_tables(max_tables: u32) -> Result<()> {
    if max_tables == 0 || max_tables as u64 > MAX_TABLES {
        return Err(Error::Unsupported(format!("{max_tables} tables per plane")));
    }
    Ok(())
}

/// Scratch bytes of a job of `n` sampled blocks and `max_tables` tables searched by a cluster of
/// `cluster` thread blocks: `Layout` in search.cu, each piece rounded up to 16 bytes — the arrays
/// of the sampled blocks, shared by the cluster, then a copy of the table arrays per thread block.
/// The kernel computes the same and refuses a smaller scratch (status 1), so a disagreement is an
/// error, not an overrun. The dense rows are 16-bit: no count of a non-constant block passes 65535
/// (the kernel refuses one that does, status 2).
pub(crate) fn scratch_bytes(n: u64, max_tables: u64, cluster: u64) -> u64 {
    let r = |b: u64| (b + 15) & !15;
    let t = max_tables;
    let blocks_bank = r(t * n * 8) + r(n * 8) + r(n) + r(n) + r(n * 8);
    let blocks = r(256 * n * 2) + r(n * 4) + r(n * 4) + r(n * 8) + 2 * blocks_bank + r(n);
    let tables_bank =
        r(t * 256 * 8) + r(t) + r(t * 256) + r(t * 256 * 2) + r(t * 4) + r(t * 256 * 4);
    let tables = 2 * tables_bank + r(t * 256 * 8);
    blocks + cluster.max(1) * tables
}

/// The most thread blocks of a plane's cluster (`MAX_CLUSTER` in search.cu): the portable cluster
/// size of CUDA.
pub(crate) const MAX_CLUSTER: u32 = 8;

/// u64 words of each of a search block's two exchange slots, which lead its dynamic shared memory
/// (`Cl` in search.cu): room for the Lloyd step's sums (a u64, then `128 * max_tables` u64 of
/// 32-bit sums) in a cluster of several blocks, 256 (the support's totals) otherwise.
fn exchange_words(max_tables: u32, cluster: u32) -> u32 {
    match cluster > 1 {
        true => 256.max(1 + 128 * max_tables),
        false => 256,
    }
}

/// Bytes of a job's output: a 16-byte head, then up to `max_tables` tables and the conditional
/// one, each at most 258 bytes serialised.
pub(crate) fn out_bytes(max_tables: u64) -> u64 {
    (16 + (max_tables + 1) * 258).div_ceil(16) * 16
}

/// A plane's tables as the search found them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlaneTables {
    pub tables: Vec<FreqTable>,
    pub cond: Option<(u8, FreqTable)>,
}

/// Parses and checks one job's output (`max_tables` as launched): status 0, at most `max_tables`
/// tables, every table valid by the format's parser, the written length inside the buffer, a
/// conditional table only where it was asked for and with every symbol present.
pub(crate) fn parse_out(out: &[u8], max_tables: usize, conditioned: bool) -> Result<PlaneTables> {
    let bad = |what: &str| Err(Error::Kernel(format!("table search output: {what}")));
    if out.len() < 16 {
        return bad("shorter than its head");
    }
    let word =
        |i: usize| u32::from_le_bytes([out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]]);
    let (kept, cond, status, end) = (word(0) as usize, word(1), word(2), word(3) as usize);
    if status != 0 {
        return bad(&format!(
            "status {status} ({})",
            match status {
                1 => "scratch smaller than the kernel's layout, or too many sampled blocks",
                2 => "a sampled block's count above 65535",
                _ => "unknown",
            }
        ));
    }
    if kept > max_tables || end > out.len() || end < 16 {
        return bad(&format!("{kept} tables ending at byte {end}"));
    }
    // The format's parser, its errors reported as the kernel's (not as a corrupt blob's).
    let parse = |bytes: &[u8]| {
        FreqTable::parse(bytes).map_err(|e| Error::Kernel(format!("table search output: {e}")))
    };
    let mut at = 16;
    let mut tables = Vec::with_capacity(kept);
    for _ in 0..kept {
        let (t, used) = parse(&out[at..end])?;
        tables.push(t);
        at += used;
    }
    let cond = match cond {
        0 => None,
        c if c >> 8 == 1 && conditioned && kept == 0 => {
            let (t, used) = parse(&out[at..end])?;
            if t.freq.contains(&0) {
                return bad("a conditional table without every symbol");
            }
            at += used;
            Some(((c & 255) as u8, t))
        }
        c => return bad(&format!("conditional word {c:#x}")),
    };
    if at != end {
        return bad("tables shorter than the written length");
    }
    Ok(PlaneTables { tables, cond })
}

/// The search kernel's compile unit (one, with no variants).
pub(crate) fn units() -> crate::compile::Units {
    crate::compile::Units::new(
        "tz_search",
        "TZ_UNIT",
        Vec::new(),
        crate::compile::source("tz_search", SEARCH_SRC),
    )
}

/// The search unit's kernels.
pub(crate) struct SearchKernels {
    pub search: CudaFunction,
    pub tables: CudaFunction,
    /// Format version 2's pair model, in launch order (`crate::pair_model::KERNELS`).
    pub pair: Vec<CudaFunction>,
}

/// The search unit's kernels (`tz_search`, `tz_enc_tables`, the pair model's), from `units`
/// (compiled or cached), with the unit's logarithm table filled (`tz_log2_init` on stream `s`, waited for before this
/// returns). The table belongs to the loaded module, so it is filled once per module; the wait
/// matters because the kernels are shared: queued on `s` only, the fill was ordered before this
/// caller's searches but not before another thread's on another stream, which could read the
/// table still zero (a review's finding, 2026-12-05; one wait per process).
pub(crate) fn load(
    units: &crate::compile::Units,
    ctx: &Arc<cudarc::driver::CudaContext>,
    s: &Arc<CudaStream>,
) -> Result<SearchKernels> {
    let m = units.common(ctx)?;
    let init = m.load_function("tz_log2_init")?;
    let cfg = LaunchConfig {
        grid_dim: (65, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `tz_log2_init` takes no arguments and writes only its module's table.
    unsafe { s.launch_builder(&init).launch(cfg) }?;
    s.synchronize()?;
    Ok(SearchKernels {
        search: m.load_function("tz_search")?,
        tables: m.load_function("tz_enc_tables")?,
        pair: crate::pair_model::KERNELS
            .iter()
            .map(|n| m.load_function(n))
            .collect::<std::result::Result<_, _>>()?,
    })
}

/// Most sampled blocks a tensor may have for its planes to be searched on the GPU: a plane's
/// scratch grows with them (~0.55 KiB a block and ~17 bytes per block and table: ~0.7 MiB at the
/// default 1024 samples and 8 tables, plus ~76 KiB of table arrays per block of its cluster:
/// ~1.3 MiB in all at 8 blocks). Calls with more (an option far from the default) are
/// searched by the host. search.cu has the same limit (`MAX_SAMPLED`: its Lloyd step sums counts
/// in 32 bits) and refuses a job above it (status 1).
pub(crate) const MAX_SAMPLED: u64 = 8192;

/// One plane to search, on the device.
pub(crate) struct Plane {
    /// Its histogram in sampled block 0 (256 u32); block `i`'s `i * stride` u32 further.
    pub hists: u64,
    pub stride: u32,
    pub n_sampled: u32,
    pub n_blocks: u64,
    /// The joint counts when it may be conditioned, else 0.
    pub joint: u64,
    /// The flat-plane rule's probe spacing (`tensorzip::model::flat_stride`), 0: no rule.
    pub flat_stride: u32,
}

/// A queued search: its device buffers (alive until the stream has run it) and its outputs.
pub(crate) struct Queued {
    _jobs: CudaSlice<SearchJob>,
    _scratch: CudaSlice<u8>,
    /// Every plane's output, [`out_words`] u32 apart, in the order of the planes given.
    pub outs: CudaSlice<u32>,
}

/// Dynamic shared memory of a search block (`to_arena` in search.cu; less where the device has
/// less). Measured on an H100 (2026-12-07, `ncu` of the search of 1 GiB bf16 as 8 tensors, one
/// call): 465.6 us with everything in global memory (0f7a7c4's kernel), 415.9 with this kernel and
/// no arena, 426.0 with 64 KiB, **413.6 with 128 KiB** (the per-block arrays, the dense rows and
/// the code lengths at the default 1024 samples and 8 tables), 441.6 with all the ~208 KiB the
/// device allows: the arena takes its bytes from the L1 cache, whose loss the dense rows' scattered
/// histogram reads pay. The attempts are bound by their threads' dependent chains and the
/// blocks' barriers, so where their data lies matters little (docs/BENCHMARKS.md, "Where the
/// table search's time goes", and docs/GPU.md, "A cluster per plane for `tz_search`").
const SEARCH_ARENA: u32 = 128 * 1024;

/// Thread blocks per plane the search asks for: 4, the best measured (H100, 2026-12-07, `ncu` of
/// the search of 1 GiB bf16 as 8 tensors: one block 439-442 us, 4 blocks 354-358, 8 blocks
/// 405-418; the encode call in a same-call A/B against one block, bf16 306.5 against 300.3 GB/s
/// and fp32 332.8 against 328.2; docs/BENCHMARKS.md, "The table search by a cluster of 4 blocks
/// per plane, merged").
const DEFAULT_CLUSTER: u32 = 4;

/// Thread blocks per plane for the search on `f`'s device: [`DEFAULT_CLUSTER`] where the device
/// launches thread block clusters (Hopper on) and a cluster of that many search blocks fits
/// (`cuOccupancyMaxActiveClusters`), else 1; `TENSORZIP_DEV_SEARCH_CLUSTER=N` asks for N (1 to
/// [`MAX_CLUSTER`]; a development switch for comparing sizes, subject to the same check).
/// `dynamic` is the search blocks' dynamic shared memory for that size (`dynamic(c)`).
pub(crate) fn cluster_size(
    f: &CudaFunction,
    s: &Arc<CudaStream>,
    dynamic: impl Fn(u32) -> u32,
) -> Result<u32> {
    let want = std::env::var("TENSORZIP_DEV_SEARCH_CLUSTER")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .map_or(DEFAULT_CLUSTER, |v| v.clamp(1, MAX_CLUSTER));
    let launches = s
        .context()
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)
        .unwrap_or(0);
    if want == 1 || launches == 0 {
        return Ok(1);
    }
    let mut attr = cluster_attribute(want);
    let cfg = launch_config(want, want, dynamic(want), s, &mut attr);
    let mut fits: std::ffi::c_int = 0;
    // SAFETY: `cfg` describes a launch of `f` (its attribute array, one entry, lives in `attr`
    // for the call); the driver only reads it and writes the count.
    let r = unsafe {
        cudarc::driver::sys::cuOccupancyMaxActiveClusters(&mut fits, f.cu_function(), &cfg)
    };
    Ok(
        match r == cudarc::driver::sys::CUresult::CUDA_SUCCESS && fits > 0 {
            true => want,
            false => 1,
        },
    )
}

/// The launch attribute of a one-dimensional cluster of `c` blocks.
fn cluster_attribute(c: u32) -> cudarc::driver::sys::CUlaunchAttribute {
    use cudarc::driver::sys;
    // SAFETY: a plain C struct and union of integers, for which all-zero bytes are valid.
    let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    a.value.clusterDim.x = c;
    a.value.clusterDim.y = 1;
    a.value.clusterDim.z = 1;
    a
}

/// A `cuLaunchKernelEx` configuration: `blocks` thread blocks of 1024 threads in clusters of `c`
/// (the attribute `attr`, which must outlive the configuration's use), `dynamic` bytes of dynamic
/// shared memory, on stream `s`.
fn launch_config(
    blocks: u32,
    c: u32,
    dynamic: u32,
    s: &Arc<CudaStream>,
    attr: &mut cudarc::driver::sys::CUlaunchAttribute,
) -> cudarc::driver::sys::CUlaunchConfig {
    cudarc::driver::sys::CUlaunchConfig {
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 1024,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: dynamic,
        hStream: s.cu_stream(),
        attrs: attr,
        numAttrs: u32::from(c > 1),
    }
}

/// Queues the search of `planes` on stream `s` with kernel `f` (`tz_search`), in launches of
/// consecutive planes whose scratch adds up to at most `limit` bytes, one plane at least (cut as the
/// encoder cuts its chunks into waves, `encode::waves`). One scratch buffer as large as the largest
/// launch's serves every launch in turn (they follow each other on the stream), so a call's search
/// memory stays bounded however many tensors it has. Each plane gets a cluster of
/// [`cluster_size`] thread blocks; each block its two exchange slots ([`exchange_words`]) and
/// [`SEARCH_ARENA`] bytes of dynamic shared memory (at most what `smem_limit`, the device's
/// per-block shared memory, leaves after the kernel's static part): the kernel keeps there as many
/// of its scratch arrays as fit (`to_arena` in search.cu); its launch bounds give one block per SM
/// whatever it asks.
///
/// # Safety
/// Every address in `planes` is device memory of this context, alive until the stream has run
/// the launches: `n_sampled` histograms of 256 u32, `stride` u32 apart, and (where not 0) 65536
/// u32 of joint counts.
pub(crate) unsafe fn queue(
    f: &CudaFunction,
    s: &Arc<CudaStream>,
    planes: &[Plane],
    max_tables: u32,
    threshold: u32,
    limit: u64,
    smem_limit: u32,
) -> Result<Queued> {
    check_max_tables(max_tables)?;
    // `TENSORZIP_DEV_SEARCH_ARENA=BYTES` sets another size (a development switch, for comparing
    // how much of the scratch is worth keeping in shared memory).
    let arena = std::env::var("TENSORZIP_DEV_SEARCH_ARENA")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(SEARCH_ARENA as u64);
    let most = crate::engine::allow_dynamic_smem(
        f,
        smem_limit,
        16 * exchange_words(max_tables, 1) as u64,
    )?;
    let dynamic = |c: u32| (16 * exchange_words(max_tables, c) as u64 + arena).min(most) as u32;
    let cluster = match 16 * exchange_words(max_tables, MAX_CLUSTER) as u64 <= most {
        true => cluster_size(f, s, dynamic)?,
        false => 1,
    };
    // SAFETY: the caller's promise, passed on.
    unsafe {
        queue_sized(
            f,
            s,
            planes,
            max_tables,
            threshold,
            limit,
            cluster,
            dynamic(cluster),
        )
    }
}

/// [`queue`] with `cluster` thread blocks per plane and `dynamic` bytes of dynamic shared memory
/// per block (at least the exchange slots': the caller checked it against the device).
///
/// # Safety
/// As [`queue`]'s.
#[allow(clippy::too_many_arguments)]
unsafe fn queue_sized(
    f: &CudaFunction,
    s: &Arc<CudaStream>,
    planes: &[Plane],
    max_tables: u32,
    threshold: u32,
    limit: u64,
    cluster: u32,
    dynamic: u32,
) -> Result<Queued> {
    let t = max_tables as u64;
    let sizes: Vec<u64> = planes
        .iter()
        .map(|p| scratch_bytes(p.n_sampled as u64, t, cluster as u64))
        .collect();
    let groups = crate::encode::waves(sizes.len(), limit, |i| sizes[i]);
    let largest = groups.iter().map(|g| g.1).max().unwrap_or(0);
    // SAFETY: plain bytes; the kernel writes every scratch entry before it reads it.
    let mut scratch = unsafe { s.alloc::<u8>(largest.max(16) as usize) }?;
    let stride = out_words(t);
    // Zeroed (a few KiB a plane): the whole buffer is downloaded, also the bytes past each
    // plane's tables.
    let mut outs = s.alloc_zeros::<u32>((stride * planes.len()).max(1))?;
    let (sp, op) = (scratch.device_ptr_mut(s).0, outs.device_ptr_mut(s).0);
    let mut jobs = Vec::with_capacity(planes.len());
    for (g, _) in &groups {
        // Each launch's planes from the start of the one scratch.
        let mut at = 0u64;
        for i in g.clone() {
            let p = &planes[i];
            jobs.push(SearchJob {
                hists: p.hists,
                scratch: sp + at,
                scratch_len: sizes[i],
                out: op + (i * stride * 4) as u64,
                joint: p.joint,
                n_blocks: p.n_blocks,
                n_sampled: p.n_sampled,
                stride: p.stride,
                flat_stride: p.flat_stride,
                pad: 0,
            });
            at += sizes[i];
        }
    }
    let jobs_dev = s.clone_htod(&jobs)?;
    let base = jobs_dev.device_ptr(s).0;
    for (g, _) in &groups {
        // SAFETY: the histograms and joint counts are the caller's promise; every scratch and
        // output range above lies inside `scratch` and `outs`, which `Queued` keeps; launches of
        // one stream run one after the other, so each has the scratch to itself.
        unsafe {
            launch(
                f,
                s,
                base + (g.start * std::mem::size_of::<SearchJob>()) as u64,
                g.len() as u32,
                max_tables,
                threshold,
                cluster,
                dynamic,
            )
        }?;
    }
    Ok(Queued {
        _jobs: jobs_dev,
        _scratch: scratch,
        outs,
    })
}

/// u32 of one plane's output: [`out_bytes`] / 4.
pub(crate) fn out_words(max_tables: u64) -> usize {
    (out_bytes(max_tables) / 4) as usize
}

/// Plane `i`'s tables from outputs `down` (planes [`out_words`] apart, as the search or
/// [`write_out`] lays them out), checked by [`parse_out`]; `conditioned`: whether the plane may
/// have a conditional table.
pub(crate) fn parse_plane(
    down: &[u32],
    i: usize,
    max_tables: usize,
    conditioned: bool,
) -> Result<PlaneTables> {
    let stride = out_words(max_tables as u64);
    let words = down
        .get(i * stride..(i + 1) * stride)
        .ok_or_else(|| Error::Kernel("table search output missing".into()))?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    parse_out(&bytes, max_tables, conditioned)
}

/// A plane's output as the search kernel lays it out (head, tables, conditional table; zeros to
/// [`out_words`]), from tables the host searched (`TENSORZIP_DEV_HOST_SEARCH=1`, or more sampled
/// blocks than the kernel takes), so that `tz_enc_tables` and [`parse_plane`] take both.
pub(crate) fn write_out(
    tables: &[FreqTable],
    cond: Option<&(u8, FreqTable)>,
    max_tables: u64,
) -> Vec<u32> {
    let mut bytes = vec![0u8; 16];
    for t in tables {
        t.write(&mut bytes);
    }
    if let Some((_, t)) = cond {
        t.write(&mut bytes);
    }
    let cond_word = cond.map_or(0, |(v, _)| 0x100 | *v as u32);
    let end = bytes.len() as u32;
    for (k, w) in [tables.len() as u32, cond_word, 0, end].iter().enumerate() {
        bytes[4 * k..4 * k + 4].copy_from_slice(&w.to_le_bytes());
    }
    bytes.resize(out_bytes(max_tables) as usize, 0);
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

/// One plane's tables to expand into the encode kernel's form (`TablesJob` in search.cu).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct TablesJob {
    /// The plane's output ([`out_bytes`] bytes).
    pub out: u64,
    /// Device addresses in its tensor's `EncParams`: `n_tables[plane]` (u32), `cond_plane` and
    /// `cond_value` (u32, written only where the plane gets a conditional table), `dst_base` (u64,
    /// to which the plane's serialised tables' bytes are added).
    pub n_tables: u64,
    pub cond_plane: u64,
    pub cond_value: u64,
    pub head: u64,
    /// The plane's 256 constant-block selectors.
    pub const_sel: u64,
    /// The plane's first table slot (its conditional table's slot is `table + max_tables`).
    pub table: u32,
    pub plane: u32,
    /// 1 where the plane may have a conditional table.
    pub conditioned: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct TablesParams {
    max_tables: u32,
    out_bytes: u32,
}

// SAFETY: plain `repr(C)` structs of integers, laid out as their CUDA counterparts (`TablesJob`:
// six u64 and four u32, 64 bytes; `TablesParams`: two u32).
unsafe impl DeviceRepr for TablesJob {}
// SAFETY: as above.
unsafe impl DeviceRepr for TablesParams {}
// SAFETY: `repr(C)`, 64 bytes of integers without padding.
unsafe impl crate::engine::Plain for TablesJob {}
const _: () = assert!(std::mem::size_of::<TablesJob>() == 64);

/// Queues `tz_enc_tables` (kernel `f`, from the search's unit) over `n` jobs at `jobs`: each
/// plane's output checked again and expanded into the encode kernel's tables (`fcs`: per symbol
/// four u32 ([`crate::encode::enc_entry`]), `cls`: a u32, `info`: a u32 per table slot, 256
/// symbols a slot).
///
/// # Safety
/// Device addresses of this context, alive until the stream has run the launch: `jobs` `n`
/// [`TablesJob`]s whose outputs are [`out_bytes`]`(max_tables)` bytes each and whose other
/// addresses point into live parameters and selectors; `fcs`, `cls` and `info` hold every job's
/// slots `table ..= table + max_tables`.
pub(crate) unsafe fn queue_tables(
    f: &CudaFunction,
    s: &Arc<CudaStream>,
    jobs: u64,
    n: u32,
    max_tables: u32,
    [fcs, cls, info]: [u64; 3],
) -> Result<()> {
    check_max_tables(max_tables)?;
    if n == 0 {
        return Ok(());
    }
    let params = TablesParams {
        max_tables,
        out_bytes: out_bytes(max_tables as u64) as u32,
    };
    let mut b = s.launch_builder(f);
    b.arg(&jobs).arg(&params).arg(&fcs).arg(&cls).arg(&info);
    let cfg = LaunchConfig {
        grid_dim: (n, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: arguments match `tz_enc_tables`; the addresses are the caller's promise, and the
    // kernel reads each output only inside its `out_bytes`.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// Queues the search of every job in `jobs` (a device array of `n` [`SearchJob`]s), each thread
/// block with `arena` bytes of dynamic shared memory (allowed for `f` before).
///
/// # Safety
/// `jobs` holds `n` jobs whose addresses are device memory of this context, alive until the
/// stream has run the launch: each histogram array `n_sampled` blocks of `stride` u32 apart,
/// each scratch `scratch_len` bytes, each output [`out_bytes`]`(max_tables)` bytes, each joint
/// array (where not 0) 65536 u32.
#[allow(clippy::too_many_arguments)]
unsafe fn launch(
    f: &CudaFunction,
    s: &Arc<CudaStream>,
    jobs: u64,
    n: u32,
    max_tables: u32,
    threshold: u32,
    cluster: u32,
    dynamic: u32,
) -> Result<()> {
    check_max_tables(max_tables)?;
    if n == 0 {
        return Ok(());
    }
    let mut params = SearchParams {
        max_tables,
        threshold,
    };
    if cluster <= 1 {
        let mut b = s.launch_builder(f);
        b.arg(&jobs).arg(&params);
        let cfg = LaunchConfig {
            grid_dim: (n, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: dynamic,
        };
        // SAFETY: arguments match `tz_search`; the buffers are the caller's promise, and the
        // kernel checks each scratch against its own layout before using it (and keeps its
        // arrays in the dynamic shared memory only within the size it reads from the launch).
        unsafe { b.launch(cfg) }?;
        return Ok(());
    }
    // A cluster of `cluster` blocks per job, through `cuLaunchKernelEx` (cudarc's launch builder
    // has no cluster attribute). The arguments are plain values (no cudarc buffer whose events
    // would need recording).
    let blocks = n
        .checked_mul(cluster)
        .ok_or_else(|| Error::Unsupported(format!("{n} search jobs in clusters of {cluster}")))?;
    let mut jobs = jobs;
    let mut attr = cluster_attribute(cluster);
    let cfg = launch_config(blocks, cluster, dynamic, s, &mut attr);
    let mut args = [
        (&mut jobs) as *mut u64 as *mut std::ffi::c_void,
        (&mut params) as *mut SearchParams as *mut std::ffi::c_void,
    ];
    s.context().bind_to_thread()?;
    // SAFETY: `cfg` (with its attribute in `attr`) and `args` (addresses of the two arguments,
    // in `tz_search`'s order and types) live through the call, which copies them; the buffers
    // are the caller's promise, as above, and the kernel checks the scratch, its cluster size and
    // its dynamic shared memory before using them.
    unsafe {
        cudarc::driver::sys::cuLaunchKernelEx(
            &cfg,
            f.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GpuEngine;
    use cudarc::driver::DevicePtr;
    use tensorzip::cluster::{probe_stride, probes_flat, varied};
    use tensorzip::model::{choose_conditional, cluster};

    /// A plane's sampled histograms, its blocks in the tensor, and its joint counts if any.
    type TestPlane = (Vec<[u32; 256]>, u64, Option<Vec<u32>>);

    /// A deterministic generator (the core's splitmix64).
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut r = tensorzip::sample::Rng::new(seed);
        move || r.next_u64()
    }

    /// Histograms of `n` sampled blocks of one plane, of kind `kind`, `len` units a block (some
    /// shorter, as at chunk ends).
    fn plane_hists(kind: u32, n: usize, len: u32, seed: u64) -> Vec<[u32; 256]> {
        let mut r = rng(seed);
        (0..n)
            .map(|i| {
                let mut h = [0u32; 256];
                let l = if i % 37 == 36 { len / 3 + 1 } else { len };
                // Per-block drift: a scale that changes slowly over the plane.
                let drift = ((i as u64 * 7 / n.max(1) as u64) + (r() % 2)) as u32;
                for _ in 0..l {
                    let s = match kind {
                        // exponent-like: a peak near 120 whose width drifts
                        0 => {
                            let mut e = 124u32.saturating_sub(drift);
                            while !r().is_multiple_of(3) && e > 90 {
                                e -= 1;
                            }
                            if r().is_multiple_of(97) {
                                e = (r() % 256) as u32;
                            }
                            e
                        }
                        // near-uniform (a mantissa byte)
                        1 => (r() % 256) as u32,
                        // few symbols, changing between halves of the plane
                        2 => {
                            if i < n / 2 {
                                [3u32, 3, 3, 7, 9][(r() % 5) as usize]
                            } else {
                                [200u32, 201, 201, 201, 3][(r() % 5) as usize]
                            }
                        }
                        // some constant blocks, some two-symbol ones
                        3 => {
                            if i % 3 == 0 {
                                17
                            } else {
                                17 + (r() % 2) as u32 * (i as u32 % 5)
                            }
                        }
                        // near-uniform but for block 1, of four symbols (a compressible
                        // block between the flat-plane rule's probes)
                        5 => match i {
                            1 => (r() % 4) as u32,
                            _ => (r() % 256) as u32,
                        },
                        // skewed over the whole byte range
                        _ => {
                            let a = (r() % 256) as u32;
                            let b = (r() % 256) as u32;
                            a.min(b).min(((r() % 256) as u32 + drift * 20) % 256)
                        }
                    };
                    h[s as usize] += 1;
                }
                h
            })
            .collect()
    }

    /// Joint counts of a plane conditioned on another: rows with their own skew, some empty.
    fn joint_counts(seed: u64, scale: u32) -> Vec<u32> {
        let mut r = rng(seed);
        let mut j = vec![0u32; 65536];
        for e in 0..256usize {
            if e % 5 == 3 {
                continue;
            }
            let skew = (r() % 6) as u32;
            let n = (r() % 4000) as u32 * scale;
            for _ in 0..n {
                let mut m = (r() % 256) as u32;
                for _ in 0..skew {
                    m = m.min((r() % 256) as u32);
                }
                j[e * 256 + m as usize] += 1;
            }
        }
        j
    }

    /// Runs the search kernel on planes given as host histograms and returns its parsed outputs:
    /// with `cluster` thread blocks per plane, or (None) as the encoder launches it.
    fn gpu_search(
        planes: &[TestPlane],
        max_tables: usize,
        threshold: u32,
        limit: u64,
        flat_rule: bool,
        cluster: Option<u32>,
    ) -> Vec<Result<PlaneTables>> {
        let eng = GpuEngine::new(0).expect("CUDA device");
        let s = eng.stream().clone();
        let f = load(&units(), eng.context(), &s).unwrap().search;
        let mut keep = Vec::new();
        let mut list = Vec::new();
        for (hists, n_blocks, joint) in planes {
            let flat: Vec<u32> = hists.iter().flat_map(|h| h.iter().copied()).collect();
            let h = s.clone_htod(&flat).unwrap();
            let joint_dev = joint.as_ref().map(|j| s.clone_htod(j).unwrap());
            list.push(Plane {
                hists: h.device_ptr(&s).0,
                stride: 256,
                n_sampled: hists.len() as u32,
                n_blocks: *n_blocks,
                joint: joint_dev.as_ref().map_or(0, |j| j.device_ptr(&s).0),
                flat_stride: match flat_rule {
                    true => probe_stride(hists.len()).map_or(0, |s| s as u32),
                    false => 0,
                },
            });
            keep.push((h, joint_dev));
        }
        // SAFETY: the histograms and joint counts above live until the synchronisation below.
        let smem = eng.shared().smem_limit;
        let (mt, thr) = (max_tables as u32, threshold);
        let q = match cluster {
            None => unsafe { queue(&f, &s, &list, mt, thr, limit, smem) },
            Some(c) => {
                let most = crate::engine::allow_dynamic_smem(&f, smem, 0).unwrap() as u32;
                let dynamic = (16 * exchange_words(mt, c) + SEARCH_ARENA).min(most);
                unsafe { queue_sized(&f, &s, &list, mt, thr, limit, c, dynamic) }
            }
        }
        .unwrap();
        let down = s.clone_dtoh(&q.outs).unwrap();
        s.synchronize().unwrap();
        drop(keep);
        planes
            .iter()
            .enumerate()
            .map(|(i, p)| parse_plane(&down, i, max_tables, p.2.is_some()))
            .collect()
    }

    /// The core's search on the same counts: `model_from_counts`'s flat-plane rule (with `flat`,
    /// as for a float tensor), constant filter, `cluster`, and `choose_conditional` where the plane
    /// has no tables.
    fn cpu_search(
        hists: &[[u32; 256]],
        n_blocks: u64,
        joint: Option<&[u32]>,
        max_tables: usize,
        threshold: u32,
        flat: bool,
    ) -> PlaneTables {
        let blocks: Vec<&[u32; 256]> = hists.iter().filter(|h| varied(h)).collect();
        let n_sampled = hists.len() as u64;
        let flat_probes = flat
            && probe_stride(hists.len())
                .is_some_and(|s| probes_flat(hists.iter().step_by(s), threshold as u64));
        let tables = match flat_probes {
            true => Vec::new(),
            false => cluster(&blocks, n_sampled, n_blocks, max_tables, threshold as u64),
        };
        let cond = match joint {
            Some(j) if tables.is_empty() => choose_conditional(
                &tensorzip::joint::JointCounts::from_dense(j),
                n_sampled,
                n_blocks,
            ),
            _ => None,
        };
        PlaneTables { tables, cond }
    }

    #[test]
    #[ignore = "needs a CUDA device (scripts/gpu_run.sh tests runs it)"]
    fn gpu_table_search_equals_the_cores() {
        if let Err(why) = crate::available() {
            eprintln!("skipped: {why}");
            return;
        }
        // (kind, sampled blocks, block length, blocks in the tensor, joint counts)
        let cases: Vec<(u32, usize, u32, u64, Option<u32>)> = vec![
            (0, 1024, 4096, 32768, None),
            (0, 1024, 4096, 1024, None),
            (0, 300, 4096, 300, None),
            (0, 1, 4096, 1, None),
            (0, 7, 100, 7, None),
            (1, 1024, 4096, 65536, Some(1)),
            (1, 64, 4096, 64, Some(3)),
            (1, 16, 4096, 16, Some(200)),
            (2, 1024, 4096, 8192, None),
            (2, 33, 777, 33, None),
            (3, 1024, 4096, 4096, Some(1)),
            (3, 5, 64, 5, None),
            (4, 1024, 4096, 1 << 20, None),
            (4, 512, 65536, 512, None),
            (4, 900, 2048, 100_000, Some(2)),
            (5, 1024, 4096, 4096, None),
            (5, 40, 4096, 40, Some(1)),
        ];
        let planes: Vec<TestPlane> = cases
            .iter()
            .enumerate()
            .map(|(i, &(kind, n, len, n_blocks, joint))| {
                let seed = i as u64 + 1;
                (
                    plane_hists(kind, n, len, seed),
                    n_blocks,
                    joint.map(|sc| joint_counts(seed ^ 0x55, sc)),
                )
            })
            .collect();
        // Outcomes seen: planes with no table, one, two, three or more; conditional tables; and
        // planes left without tables by the flat-plane rule that have some without it.
        let mut seen = [0usize; 6];
        // `TENSORZIP_TEST_QUICK` set (as for tests/gpu.rs under compute-sanitizer): the first
        // table limit and threshold only, for `compute-sanitizer --tool racecheck`, under which
        // the other limits and thresholds take minutes (the outcome check below then does not
        // apply).
        let quick = std::env::var_os("TENSORZIP_TEST_QUICK").is_some();
        let (limits, thresholds) = match quick {
            true => (&[8usize][..], &[62259u32][..]),
            false => (&[8usize, 1, 3, 64][..], &[62259u32, 65536, 1][..]),
        };
        // As the encoder launches it, then one block per plane (devices without clusters) and
        // clusters of 3 (shares of unequal sizes; with 1, 5 and 7 sampled blocks, blocks with
        // none) and of MAX_CLUSTER. Quick: as launched and clusters of 3 only (racecheck did not
        // finish all four in 300 s on the H100 on 2026-12-07).
        let clusters = match quick {
            false => &[None, Some(1), Some(3), Some(MAX_CLUSTER)][..],
            true => &[None, Some(3)][..],
        };
        for &max_tables in limits {
            for &threshold in thresholds {
                // One launch for all planes, or (with one of the thresholds) one launch per
                // plane, all sharing one scratch.
                let limit = if threshold == 65536 { 0 } else { u64::MAX };
                let mut without_rule = Vec::new();
                for flat in [false, true] {
                    let cpu: Vec<PlaneTables> = planes
                        .iter()
                        .map(|(h, nbk, j)| {
                            cpu_search(h, *nbk, j.as_deref(), max_tables, threshold, flat)
                        })
                        .collect();
                    for &cluster in clusters {
                        let gpu = gpu_search(&planes, max_tables, threshold, limit, flat, cluster);
                        for (i, (g, cpu)) in gpu.iter().zip(&cpu).enumerate() {
                            let g = g.as_ref().expect("search output");
                            assert_eq!(
                                g, cpu,
                                "case {i} ({:?}), max_tables {max_tables}, threshold {threshold}, \
                                 flat-plane rule {flat}, cluster {cluster:?}",
                                cases[i]
                            );
                        }
                    }
                    for (i, g) in cpu.iter().enumerate() {
                        seen[g.tables.len().min(3)] += 1;
                        seen[4] += g.cond.is_some() as usize;
                        match flat {
                            false => without_rule.push(g.tables.len()),
                            true => {
                                seen[5] += (g.tables.is_empty() && without_rule[i] > 0) as usize
                            }
                        }
                    }
                }
            }
        }
        // The cases reach every outcome (else the comparison above could pass on trivial ones).
        assert!(quick || seen.iter().all(|&n| n > 0), "outcomes {seen:?}");
    }

    #[test]
    #[ignore = "needs a CUDA device (scripts/gpu_run.sh tests runs it)"]
    fn gpu_refuses_counts_past_16_bits() {
        if let Err(why) = crate::available() {
            eprintln!("skipped: {why}");
            return;
        }
        // The kernel keeps a plane's counts in 16 bits, which holds every non-constant block of
        // the format (at most 65536 units). A histogram of a longer block (not one this engine's
        // counting writes) is refused with status 2, not searched on truncated counts; the
        // same launch's other planes are searched as usual.
        let mut hists = plane_hists(0, 64, 4096, 7);
        hists[10] = [0; 256];
        hists[10][3] = 70_000;
        hists[10][4] = 1;
        let normal = plane_hists(0, 64, 4096, 8);
        let planes: Vec<TestPlane> = vec![(hists, 64, None), (normal.clone(), 64, None)];
        let out = gpu_search(&planes, 8, 62259, u64::MAX, false, None);
        let err = out[0]
            .as_ref()
            .expect_err("a count above 65535 must be refused");
        assert!(err.to_string().contains("status 2"), "{err}");
        let good = out[1].as_ref().expect("the other plane is searched");
        assert_eq!(good, &cpu_search(&normal, 64, None, 8, 62259, false));
    }

    /// Whatever bytes the kernel might leave, parsing them gives tables or an error, never a panic:
    /// random buffers of every length up to a plane's output, and plausible heads (table count,
    /// conditional word, written length) over random or mostly valid table bytes.
    #[test]
    fn parsing_any_output_never_panics() {
        let mut r = rng(99);
        let full = out_bytes(8) as usize;
        for i in 0..20_000 {
            let len = (r() % (full as u64 + 1)) as usize;
            let mut out: Vec<u8> = (0..len).map(|_| r() as u8).collect();
            if i % 2 == 0 && len >= 16 {
                let head = [
                    (r() % 10) as u32,
                    if r().is_multiple_of(2) {
                        0
                    } else {
                        0x100 | (r() % 256) as u32
                    },
                    r().is_multiple_of(3) as u32,
                    (r() % (len as u64 + 8)) as u32,
                ];
                for (k, w) in head.iter().enumerate() {
                    out[4 * k..4 * k + 4].copy_from_slice(&w.to_le_bytes());
                }
                // Tables that are mostly valid: lo <= hi, an anchor, small codes.
                let mut at = 16;
                while at + 2 < len && !r().is_multiple_of(4) {
                    let lo = (r() % 200) as u8;
                    let hi = lo.saturating_add((r() % 40) as u8);
                    out[at] = lo;
                    out[at + 1] = hi;
                    let end = (at + 2 + (hi - lo) as usize + 1).min(len);
                    for (k, b) in out[at + 2..end].iter_mut().enumerate() {
                        *b = if k == 0 { 255 } else { (r() % 3) as u8 };
                    }
                    at = end;
                }
            }
            for (max_tables, cond) in [(8, false), (8, true), (0, true), (64, false)] {
                let _ = parse_out(&out, max_tables, cond);
            }
        }
    }

    #[test]
    fn output_that_fails_a_check_is_an_error() {
        let mut out = vec![0u8; out_bytes(8) as usize];
        let put = |out: &mut Vec<u8>, i: usize, v: u32| {
            out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes())
        };
        // One table: symbols 5..=6, codes (anchor, 1): valid.
        put(&mut out, 0, 1);
        put(&mut out, 3, 20);
        out[16..20].copy_from_slice(&[5, 6, 255, 1]);
        let ok = parse_out(&out, 8, false).unwrap();
        assert_eq!(ok.tables.len(), 1);
        assert!(ok.cond.is_none());
        // More tables than allowed.
        assert!(parse_out(&out, 0, false).is_err());
        // A status.
        let mut o = out.clone();
        put(&mut o, 2, 1);
        assert!(parse_out(&o, 8, false).is_err());
        // A length past the buffer, or not where the tables end.
        let mut o = out.clone();
        put(&mut o, 3, 1 << 20);
        assert!(parse_out(&o, 8, false).is_err());
        let mut o = out.clone();
        put(&mut o, 3, 21);
        assert!(parse_out(&o, 8, false).is_err());
        // An invalid table (two anchors): the kernel's error, not a blob's.
        let mut o = out.clone();
        o[19] = 255;
        assert!(matches!(parse_out(&o, 8, false), Err(Error::Kernel(_))));
        // A conditional table where none was asked for, or beside tables.
        let mut o = out.clone();
        put(&mut o, 1, 0x105);
        assert!(parse_out(&o, 8, true).is_err());
        assert!(parse_out(&o, 8, false).is_err());
    }

    /// Tables from random counts: skewed over a few symbols, sometimes one symbol only.
    fn random_table(r: &mut impl FnMut() -> u64, all: bool) -> FreqTable {
        let mut c = [0u64; 256];
        let (lo, width) = if all {
            (0, 256)
        } else {
            ((r() % 250) as usize, 1 + (r() % 40) as usize)
        };
        for (s, v) in c.iter_mut().enumerate().skip(lo).take(width) {
            *v = if all {
                1 + r() % 50
            } else {
                r() % (1 + 1000 / (1 + (s - lo) as u64))
            };
        }
        if c.iter().all(|&v| v == 0) {
            c[lo] = 1;
        }
        FreqTable::normalize(&c, None).expect("counts with a symbol")
    }

    #[test]
    fn written_outputs_parse_back() {
        let mut r = rng(5);
        for n in 0..=8usize {
            let tables: Vec<FreqTable> = (0..n).map(|_| random_table(&mut r, false)).collect();
            let cond = (n == 0).then(|| (7u8, random_table(&mut r, true)));
            let out = write_out(&tables, cond.as_ref(), 8);
            assert_eq!(out.len(), out_words(8));
            let got = parse_plane(&out, 0, 8, true).unwrap();
            assert_eq!(got, PlaneTables { tables, cond });
        }
    }

    /// Outputs for `tz_enc_tables`: valid ones (tables and conditional tables from real counts), and
    /// each of them broken in one place about half of the time; and whether each plane may be
    /// conditioned.
    fn test_outputs(t_max: u64) -> (Vec<Vec<u32>>, Vec<bool>) {
        let mut r = rng(17);
        let mut outs: Vec<Vec<u32>> = Vec::new();
        let mut conditioned = Vec::new();
        for i in 0..600 {
            let n = if i % 4 == 0 { 0 } else { (r() % 9) as usize };
            let tables: Vec<FreqTable> = (0..n).map(|_| random_table(&mut r, false)).collect();
            let cond =
                (n == 0 && i % 3 != 0).then(|| ((r() % 256) as u8, random_table(&mut r, true)));
            let mut out = write_out(&tables, cond.as_ref(), t_max);
            let end = out[3] as usize;
            if r().is_multiple_of(2) {
                let mut bytes: Vec<u8> = out.iter().flat_map(|w| w.to_le_bytes()).collect();
                let blen = bytes.len() as u64;
                match r() % 6 {
                    0 => bytes[(r() % blen) as usize] ^= 1 << (r() % 8),
                    1 if end > 16 => bytes[16 + (r() % (end as u64 - 16)) as usize] = r() as u8,
                    2 => bytes[(r() % 16) as usize] = r() as u8,
                    3 => bytes[12..16]
                        .copy_from_slice(&((end as u64 + r() % 5) as u32).to_le_bytes()),
                    4 if end > 18 => bytes[16] = 255,
                    _ => bytes[8] = 1,
                }
                out = bytes
                    .chunks_exact(4)
                    .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                    .collect();
            }
            outs.push(out);
            conditioned.push(i % 5 != 4);
        }
        (outs, conditioned)
    }

    /// The verdicts of `parse_plane` on [`test_outputs`]: (accepted, refused, with a conditional
    /// table).
    fn verdicts(outs: &[Vec<u32>], conditioned: &[bool], t_max: u64) -> (usize, usize, usize) {
        let mut v = (0, 0, 0);
        for (out, &c) in outs.iter().zip(conditioned) {
            match parse_plane(out, 0, t_max as usize, c) {
                Ok(pt) => {
                    v.0 += 1;
                    v.2 += pt.cond.is_some() as usize;
                }
                Err(_) => v.1 += 1,
            }
        }
        v
    }

    #[test]
    fn test_outputs_reach_every_verdict() {
        let (outs, conditioned) = test_outputs(8);
        let (accepted, refused, with_cond) = verdicts(&outs, &conditioned, 8);
        assert!(
            accepted > 250 && refused > 100 && with_cond > 50,
            "{accepted} {refused} {with_cond}"
        );
    }

    /// Device layout of the parameter fields `tz_enc_tables` writes, one per plane of the test.
    #[repr(C)]
    #[derive(Clone, Copy, Default, Debug, PartialEq)]
    struct Fields {
        n_tables: u32,
        cond_plane: u32,
        cond_value: u32,
        pad: u32,
        head: u64,
    }
    // SAFETY: plain integers, laid out as the offsets the test passes.
    unsafe impl DeviceRepr for Fields {}

    #[test]
    #[ignore = "needs a CUDA device (scripts/gpu_run.sh tests runs it)"]
    fn gpu_expands_the_outputs_the_host_accepts_and_no_others() {
        use tensorzip::blob::SEL_CONST;
        use tensorzip::model::const_selector;
        use tensorzip::rans::log2::code_len_table;
        let t_max = 8u64;
        let words = out_words(t_max);
        let (outs, conditioned) = test_outputs(t_max);
        let n = outs.len();
        let eng = GpuEngine::new(0).expect("CUDA device");
        let s = eng.stream().clone();
        let f = load(&units(), eng.context(), &s).unwrap().tables;
        let slots = (t_max + 1) as usize;
        let outs_dev = s.clone_htod(&outs.concat()).unwrap();
        let fields0 = Fields {
            cond_plane: 255,
            head: 1000,
            ..Default::default()
        };
        let fields = s.clone_htod(&vec![fields0; n]).unwrap();
        let fcs = s.alloc_zeros::<u32>(n * slots * 1024).unwrap();
        let cls = s.alloc_zeros::<u32>(n * slots * 256).unwrap();
        let info = s.alloc_zeros::<u32>(n * slots).unwrap();
        let sel = s.alloc_zeros::<u8>(n * 256).unwrap();
        let (op, fp, sp) = (
            outs_dev.device_ptr(&s).0,
            fields.device_ptr(&s).0,
            sel.device_ptr(&s).0,
        );
        let jobs: Vec<TablesJob> = (0..n)
            .map(|i| {
                let at = fp + (i * std::mem::size_of::<Fields>()) as u64;
                TablesJob {
                    out: op + (i * words * 4) as u64,
                    n_tables: at,
                    cond_plane: at + 4,
                    cond_value: at + 8,
                    head: at + 16,
                    const_sel: sp + (i * 256) as u64,
                    table: (i * slots) as u32,
                    plane: (i % 8) as u32,
                    conditioned: conditioned[i] as u32,
                    pad: 0,
                }
            })
            .collect();
        let jobs_dev = s.clone_htod(&jobs).unwrap();
        // SAFETY: every address above lies in the buffers above, alive until the downloads.
        unsafe {
            queue_tables(
                &f,
                &s,
                jobs_dev.device_ptr(&s).0,
                n as u32,
                t_max as u32,
                [
                    fcs.device_ptr(&s).0,
                    cls.device_ptr(&s).0,
                    info.device_ptr(&s).0,
                ],
            )
        }
        .unwrap();
        let got_fields = s.clone_dtoh(&fields).unwrap();
        let (got_fcs, got_cls) = (s.clone_dtoh(&fcs).unwrap(), s.clone_dtoh(&cls).unwrap());
        let (got_info, got_sel) = (s.clone_dtoh(&info).unwrap(), s.clone_dtoh(&sel).unwrap());
        s.synchronize().unwrap();
        let cl = code_len_table();
        let (mut accepted, mut refused, mut with_cond) = (0, 0, 0);
        for i in 0..n {
            let fd = got_fields[i];
            let Ok(pt) = parse_plane(&outs[i], 0, t_max as usize, conditioned[i]) else {
                refused += 1;
                assert_eq!(
                    fd,
                    Fields {
                        n_tables: 0,
                        ..fields0
                    },
                    "output {i} refused by the host"
                );
                assert!(got_sel[i * 256..(i + 1) * 256]
                    .iter()
                    .all(|&v| v == SEL_CONST));
                continue;
            };
            accepted += 1;
            let mut head = Vec::new();
            tensorzip::model::write_plane_tables(&pt.tables, pt.cond.as_ref(), &mut head);
            let want = Fields {
                n_tables: pt.tables.len() as u32,
                cond_plane: if pt.cond.is_some() {
                    (i % 8) as u32
                } else {
                    255
                },
                cond_value: pt.cond.as_ref().map_or(0, |c| c.0 as u32),
                pad: 0,
                head: 1000 + head.len() as u64,
            };
            assert_eq!(fd, want, "output {i}");
            let check = |slot: usize, t: &FreqTable| {
                let cum = t.cumulative();
                for (sym, (&f, &c)) in t.freq.iter().zip(&cum).enumerate() {
                    let f = f as u32;
                    let at = slot * 256 + sym;
                    let want = crate::encode::enc_entry(f, c);
                    assert_eq!(got_fcs[4 * at..4 * at + 4], want, "output {i} slot {slot}");
                    let want_cl = if f == 0 {
                        u32::MAX
                    } else {
                        cl[f as usize] as u32
                    };
                    assert_eq!(got_cls[at], want_cl);
                }
                let single = if t.is_single() {
                    1 << 31 | t.single_symbol() as u32
                } else {
                    0
                };
                assert_eq!(got_info[slot], single);
            };
            for (k, t) in pt.tables.iter().enumerate() {
                check(i * slots + k, t);
            }
            if let Some((_, t)) = &pt.cond {
                with_cond += 1;
                check(i * slots + t_max as usize, t);
            }
            for v in 0..256 {
                assert_eq!(got_sel[i * 256 + v], const_selector(v as u8, &pt.tables));
            }
        }
        // Every output was checked against the host's verdict, which `test_outputs_reach_every_verdict`
        // shows reaches acceptance, refusal and conditional tables.
        assert_eq!(
            (accepted, refused, with_cond),
            verdicts(&outs, &conditioned, t_max)
        );
    }
}
