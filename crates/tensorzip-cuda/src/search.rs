//! The encoder's table search on the GPU (`kernels/search.cu`): a plane's frequency tables from the
//! histograms of its sampled blocks (the core's `model::cluster`) and, where they leave the plane
//! raw, its conditional table (`model::choose_conditional`), by the same integer arithmetic, so that
//! the tables are the CPU engine's bit for bit. One thread block per plane, all planes of a call at
//! once, where the host searches one tensor's attempts after the other (docs/GPU.md, "The table
//! search on the GPU").
//!
//! The host trusts nothing the kernel writes: each plane's output is parsed with the format's own
//! table parser and its counts checked ([`parse_out`]); a failed check is an error, never a table.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use tensorzip::model::{Model, PlaneModel};
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
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SearchParams {
    max_tables: u32,
    threshold: u32,
}

// SAFETY: plain `repr(C)` structs of integers, laid out as their CUDA counterparts (`SearchJob`:
// six u64 and two u32, 56 bytes; `SearchParams`: two u32).
unsafe impl DeviceRepr for SearchJob {}
// SAFETY: as above.
unsafe impl DeviceRepr for SearchParams {}
const _: () = assert!(std::mem::size_of::<SearchJob>() == 56);

/// Most tables a plane may have (the format's limit, `blob::MAX_TABLES`; the kernel's too).
const MAX_TABLES: u64 = tensorzip::blob::MAX_TABLES as u64;

/// Scratch bytes of a job of `n` sampled blocks and `max_tables` tables: `Layout` in search.cu,
/// each piece rounded up to 16 bytes. The kernel computes the same and refuses a smaller scratch
/// (status 1), so a disagreement is an error, not an overrun.
pub(crate) fn scratch_bytes(n: u64, max_tables: u64) -> u64 {
    let r = |b: u64| (b + 15) & !15;
    let t = max_tables;
    let per_bank = r(t * n * 8)
        + r(n * 8)
        + r(n)
        + r(n)
        + r(n * 8)
        + r(t * 256 * 8)
        + r(t)
        + r(t * 256)
        + r(t * 256 * 2)
        + r(t * 4)
        + r(t * 256 * 4);
    r(256 * n * 4) + r(n * 4) + r(n * 4) + r(n * 8) + 2 * per_bank + r(n) + r(t * 256 * 8)
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
            "status {status} (scratch smaller than the kernel's layout)"
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

/// Most sampled blocks a tensor may have for its planes to be searched on the GPU: a plane's
/// scratch grows with them (~1.1 KiB a block and ~17 bytes per block and table: ~1.2 MiB at the
/// default 1024 samples and 8 tables). Calls with more (an option far from the default) are
/// searched by the host.
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
}

/// A queued search: its device buffers (alive until the stream has run it) and where each plane's
/// output lies in [`Queued::outs`].
pub(crate) struct Queued {
    _jobs: CudaSlice<SearchJob>,
    _scratch: CudaSlice<u8>,
    /// Every plane's output, `stride` u32 apart, in the order of the planes given.
    pub outs: CudaSlice<u32>,
    stride: usize,
}

/// Queues the search of `planes` on stream `s` with kernel `f` (`tz_search`), in launches of
/// consecutive planes whose scratch adds up to at most `limit` bytes, one plane at least (cut as the
/// encoder cuts its chunks into waves, `encode::waves`). One scratch buffer as large as the largest
/// launch's serves every launch in turn (they follow each other on the stream), so a call's search
/// memory stays bounded however many tensors it has.
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
) -> Result<Queued> {
    let t = max_tables as u64;
    let sizes: Vec<u64> = planes
        .iter()
        .map(|p| scratch_bytes(p.n_sampled as u64, t))
        .collect();
    let groups = crate::encode::waves(sizes.len(), limit, |i| sizes[i]);
    let largest = groups.iter().map(|g| g.1).max().unwrap_or(0);
    // SAFETY: plain bytes; the kernel writes every scratch entry before it reads it.
    let mut scratch = unsafe { s.alloc::<u8>(largest.max(16) as usize) }?;
    let stride = (out_bytes(t) / 4) as usize;
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
            )
        }?;
    }
    Ok(Queued {
        _jobs: jobs_dev,
        _scratch: scratch,
        outs,
        stride,
    })
}

impl Queued {
    /// The model of the tensor whose planes start at plane `first` of the search (`planes` of
    /// them), from the downloaded outputs `down` (`outs` copied to the host): each plane's output
    /// checked by [`parse_out`], and the encoder's constants of each table, as the core's
    /// `model_from_counts` builds them. `cond_plane`: the plane that may have a conditional table.
    pub(crate) fn model(
        &self,
        down: &[u32],
        first: usize,
        planes: usize,
        max_tables: usize,
        cond_plane: Option<usize>,
    ) -> Result<Model> {
        let planes = (0..planes)
            .map(|p| {
                let at = (first + p) * self.stride;
                let words = down
                    .get(at..at + self.stride)
                    .ok_or_else(|| Error::Kernel("table search output missing".into()))?;
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                let got = parse_out(&bytes, max_tables, cond_plane == Some(p))?;
                Ok(PlaneModel {
                    enc: got
                        .tables
                        .iter()
                        .map(|t| (!t.is_single()).then(|| t.encode_table()))
                        .collect(),
                    cond_enc: got.cond.as_ref().map(|(_, t)| t.encode_table()),
                    tables: got.tables,
                    cond: got.cond,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Model {
            planes,
            block_hists: Vec::new(),
        })
    }
}

/// Queues the search of every job in `jobs` (a device array of `n` [`SearchJob`]s).
///
/// # Safety
/// `jobs` holds `n` jobs whose addresses are device memory of this context, alive until the
/// stream has run the launch: each histogram array `n_sampled` blocks of `stride` u32 apart,
/// each scratch `scratch_len` bytes, each output [`out_bytes`]`(max_tables)` bytes, each joint
/// array (where not 0) 65536 u32.
unsafe fn launch(
    f: &CudaFunction,
    s: &Arc<CudaStream>,
    jobs: u64,
    n: u32,
    max_tables: u32,
    threshold: u32,
) -> Result<()> {
    if max_tables == 0 || max_tables as u64 > MAX_TABLES {
        return Err(Error::Unsupported(format!("{max_tables} tables per plane")));
    }
    if n == 0 {
        return Ok(());
    }
    let params = SearchParams {
        max_tables,
        threshold,
    };
    let mut b = s.launch_builder(f);
    b.arg(&jobs).arg(&params);
    let cfg = LaunchConfig {
        grid_dim: (n, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: arguments match `tz_search`; the buffers are the caller's promise, and the kernel
    // checks each scratch against its own layout before using it.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GpuEngine;
    use cudarc::driver::DevicePtr;
    use tensorzip::model::{choose_conditional, cluster};

    /// A plane's sampled histograms, its blocks in the tensor, and its joint counts if any.
    type TestPlane = (Vec<[u32; 256]>, u64, Option<Vec<u32>>);

    /// A deterministic generator (splitmix64).
    fn rng(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
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

    /// Runs the search kernel on planes given as host histograms and returns its parsed outputs.
    fn gpu_search(
        planes: &[TestPlane],
        max_tables: usize,
        threshold: u32,
        limit: u64,
    ) -> Vec<PlaneTables> {
        let eng = GpuEngine::new(0).expect("CUDA device");
        let s = eng.stream().clone();
        let units = units();
        let f = units
            .common(eng.context())
            .unwrap()
            .load_function("tz_search")
            .unwrap();
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
            });
            keep.push((h, joint_dev));
        }
        // SAFETY: the histograms and joint counts above live until the synchronisation below.
        let q = unsafe { queue(&f, &s, &list, max_tables as u32, threshold, limit) }.unwrap();
        let down = s.clone_dtoh(&q.outs).unwrap();
        s.synchronize().unwrap();
        drop(keep);
        planes
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let words = &down[i * q.stride..(i + 1) * q.stride];
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                parse_out(&bytes, max_tables, p.2.is_some()).unwrap()
            })
            .collect()
    }

    /// The core's search on the same counts: `model_from_counts`'s constant filter, `cluster`,
    /// and `choose_conditional` where the plane has no tables.
    fn cpu_search(
        hists: &[[u32; 256]],
        n_blocks: u64,
        joint: Option<&[u32]>,
        max_tables: usize,
        threshold: u32,
    ) -> PlaneTables {
        let blocks: Vec<&[u32; 256]> = hists
            .iter()
            .filter(|h| h.iter().filter(|&&c| c != 0).nth(1).is_some())
            .collect();
        let n_sampled = hists.len() as u64;
        let tables = cluster(&blocks, n_sampled, n_blocks, max_tables, threshold as u64);
        let cond = match joint {
            Some(j) if tables.is_empty() => choose_conditional(j, n_sampled, n_blocks),
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
        // Outcomes seen: planes with no table, one, two, three or more; conditional tables.
        let mut seen = [0usize; 5];
        for max_tables in [8usize, 1, 3, 64] {
            for threshold in [62259u32, 65536, 1] {
                // One launch for all planes, or (with one of the thresholds) one launch per
                // plane, all sharing one scratch.
                let limit = if threshold == 65536 { 0 } else { u64::MAX };
                let gpu = gpu_search(&planes, max_tables, threshold, limit);
                for (i, ((h, nbk, j), g)) in planes.iter().zip(&gpu).enumerate() {
                    let cpu = cpu_search(h, *nbk, j.as_deref(), max_tables, threshold);
                    seen[g.tables.len().min(3)] += 1;
                    seen[4] += g.cond.is_some() as usize;
                    assert_eq!(
                        g, &cpu,
                        "case {i} ({:?}), max_tables {max_tables}, threshold {threshold}",
                        cases[i]
                    );
                }
            }
        }
        // The cases reach every outcome (else the comparison above could pass on trivial ones).
        assert!(seen.iter().all(|&n| n > 0), "outcomes {seen:?}");
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
}
