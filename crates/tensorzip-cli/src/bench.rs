//! `tensorzip bench`: ratio and throughput on the tensors of .safetensors files, the figures the
//! benchmark script (`scripts/bench_cpu.py`) sets side by side with ZipNN.
//!
//! For each file it prints one JSON object: total original and compressed bytes of the tensors (blob
//! sizes, every header and table counted), the median over `--runs` of compress time into fresh
//! blobs ("compress", end-to-end) and into blob buffers reused from run to run ("compress warm"),
//! of decompress time into buffers the caller owns and has touched before ("warm"), and of
//! decompress time into fresh allocations ("end-to-end"), plus the order-0 entropy bound of the
//! byte planes with one table per tensor and with one table per 256 KiB chunk (a file without tensor
//! bytes has none of these: `null`). Every tensor counts, coded as `compress` codes it (a dtype
//! tensorzip does not model, as bytes); the tensors are read into memory first (with `--cast`,
//! converted), and the warm buffers, the blobs and the decoded copies of each run live beside
//! them, so a file takes ~4-5 times its size in memory. Both directions take
//! the tensors as `tensorzip compress` and `decompress` do: runs of small tensors concurrently
//! (`CpuEngine::decompress_many_into`, `archive::small_runs`; the compress as
//! `CpuEngine::compress_seq_into` codes a run's lead), each larger tensor on its own — compressed
//! one after the other with the next one's model built beside the tensor or the lead before it
//! (`CpuEngine::compress_seq_into`, `archive::encode_runs`), decompressed one at a time.
//!
//! With `--scaling` it also measures thread scaling *in pairs* (`scaling` in the JSON): every run
//! times the warm compress and the warm decompress on a one-thread engine and on the `--threads`
//! engine back to back (in alternating order), and a fixed compute loop on one thread and on as
//! many threads (the machine's own scaling: eight independent multiply chains a thread, which a
//! pair of hyperthreads of one core could not run twice as fast); it reports the medians and the
//! median of the per-run ratios. Our 2-core VMs change speed from second to second and sometimes
//! run their two vCPUs as if they shared a core (2026-12-03: the same warm MiniLM fp32 decode on
//! two threads at 1.19x, 1.87x and 1.80x one thread in three back-to-back processes, one thread
//! steady at 1.82-1.91 GB/s pinned to either vCPU): ratios of runs seconds apart cancel the drift,
//! the compute loop shows when the machine itself did not scale.

use std::time::Instant;

use tensorzip::archive::{encode_runs, lead_len, small_runs, BlobItem, SMALL_BLOB_SLACK};
use tensorzip::{sample, transform, CpuEngine, DType};

use crate::output::map_file;
use crate::{Common, EncoderArgs};

struct Item {
    dtype: DType,
    shape: Vec<u64>,
    data: Vec<u8>,
}

/// The tensors of the file at `path` as `tensorzip compress` codes them (a dtype tensorzip does not
/// model as bytes: `archive::tensor_coding`), F32 ones cast to `cast`.
fn load(path: &std::path::Path, cast: &str) -> Result<Vec<Item>, String> {
    let file = map_file(path)?;
    let (_, tensors) = tensorzip::archive::safetensors_layout(&file)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut items = Vec::new();
    for t in tensors {
        let raw = file.get(t.begin as usize..t.end as usize).ok_or_else(|| {
            format!(
                "{}: tensor {}: offsets outside the file",
                path.display(),
                t.name
            )
        })?;
        let (dtype, shape) =
            tensorzip::archive::tensor_coding(&t.dtype_name, &t.shape, raw.len() as u64);
        let to = match cast {
            "none" => dtype,
            "bf16" => DType::BF16,
            "f16" => DType::F16,
            other => return Err(format!("--cast {other}: expected none, bf16 or f16")),
        };
        let cast = (dtype == DType::F32)
            .then(|| sample::cast_f32_bytes(raw, to))
            .flatten();
        let (dtype, data) = match cast {
            Some(c) => (to, c),
            None => (dtype, raw.to_vec()),
        };
        items.push(Item { dtype, shape, data });
    }
    Ok(items)
}

/// The median of `v` (the upper one of an even count).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Order-0 entropy (bytes) of the planes of a tensor, one table per `chunk_bytes` of data.
fn bound(item: &Item, chunk_bytes: usize) -> f64 {
    let us = item.dtype.unit_size();
    let units = item.data.len() / us;
    let cu = (chunk_bytes / us).max(1);
    let mut total = 0.0;
    let mut planes = vec![vec![0u8; cu.min(units)]; us];
    for chunk in item.data.chunks(cu * us) {
        let n = chunk.len() / us;
        let mut views: Vec<&mut [u8]> = planes.iter_mut().map(|p| &mut p[..n]).collect();
        transform::split(item.dtype.transform(), chunk, &mut views);
        for p in &planes {
            let mut h = [0u64; 256];
            for &b in &p[..n] {
                h[b as usize] += 1;
            }
            let bits: f64 = h
                .iter()
                .filter(|&&c| c > 0)
                .map(|&c| c as f64 * (n as f64 / c as f64).log2())
                .sum();
            total += (bits / 8.0).min(n as f64);
        }
    }
    total
}

pub fn run(
    files: &[std::path::PathBuf],
    cast: &str,
    runs: usize,
    scaling: bool,
    enc: &EncoderArgs,
    common: &Common,
) -> Result<(), String> {
    let eng = CpuEngine::new(common.threads).map_err(|e| e.to_string())?;
    // Validated by `run` (EncoderArgs::check), `runs` >= 1 by its parser.
    let opts = enc.options();
    // A directory stands for the .safetensors files under it, as for `compress`; a file that
    // fails is reported and the others measured ("1 of 3 inputs failed"); once stdout is closed
    // (`| head -1`) nobody reads the rest, which are skipped.
    let files = crate::tree::expand(files, crate::tree::Wanted::Models)?;
    let mut closed = false;
    crate::each(&files, |path| {
        if closed {
            return Ok(());
        }
        let doc = measure(&eng, path, cast, runs, scaling, &opts)?;
        closed = !crate::commands::write_out(&format!("{doc}\n"))?;
        Ok(())
    })
}

/// `bench` of one file: its JSON object.
fn measure(
    eng: &CpuEngine,
    path: &std::path::Path,
    cast: &str,
    runs: usize,
    scaling: bool,
    opts: &tensorzip::CompressOptions,
) -> Result<serde_json::Value, String> {
    let items = load(path, cast)?;
    let orig: u64 = items.iter().map(|i| i.data.len() as u64).sum();
    let mut warm: Vec<Vec<u8>> = items.iter().map(|i| vec![1u8; i.data.len()]).collect();
    // Blob buffers of the warm compress, touched once (by a first compress) before timing,
    // with the room `BlobEncoder::encode_blobs` gives.
    let slack = SMALL_BLOB_SLACK as usize;
    let mut warm_blobs: Vec<Vec<u8>> = Vec::with_capacity(items.len());
    for i in &items {
        let mut b = vec![1u8; i.data.len() + slack];
        eng.compress_into(&i.data, i.dtype, &i.shape, opts, &mut b)
            .map_err(|e| e.to_string())?;
        warm_blobs.push(b);
    }
    // Tensors are compressed as `tensorzip compress` codes a file: runs of small tensors
    // together (concurrently), larger ones one after the other (archive::encode_runs), and
    // decompressed as `tensorzip decompress` does: runs of small ones together, each larger
    // one alone (archive::small_runs).
    let lens: Vec<u64> = items.iter().map(|i| i.data.len() as u64).collect();
    let runs_of = small_runs(&lens);
    let enc_runs = encode_runs(&lens);
    let blob_items: Vec<BlobItem<'_>> = items
        .iter()
        .map(|i| (&i.data[..], i.dtype, &i.shape[..]))
        .collect();
    // Whether decoded tensors equal the file's.
    let exact = |outs: &[Vec<u8>]| items.iter().zip(outs).all(|(i, out)| &i.data == out);
    let (mut tc, mut tcw, mut tw, mut te) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut comp = 0u64;
    let warm_pass = WarmPasses {
        items: &blob_items,
        runs_of: &runs_of,
        enc_runs: &enc_runs,
        lens: &lens,
        opts,
    };
    for _ in 0..runs {
        tcw.push(warm_pass.compress(eng, &mut warm_blobs)?);
        let t = Instant::now();
        let mut blobs: Vec<Vec<u8>> = Vec::with_capacity(items.len());
        for r in &enc_runs {
            let run = &blob_items[r.clone()];
            // Fresh blobs, as `BlobEncoder::encode_blobs` gives.
            let mut fresh: Vec<Vec<u8>> = run
                .iter()
                .map(|i| tensorzip::fresh::with_capacity(i.0.len() + slack))
                .collect();
            eng.compress_seq_into(run, lead_len(&lens, r), opts, &mut fresh)
                .map_err(|e| e.to_string())?;
            blobs.extend(fresh);
        }
        tc.push(t.elapsed().as_secs_f64());
        comp = blobs.iter().map(|b| b.len() as u64).sum();
        if blobs != warm_blobs {
            return Err(format!(
                "{}: compress_into differs from compress",
                path.display()
            ));
        }
        let blob_refs: Vec<&[u8]> = blobs.iter().map(|b| &b[..]).collect();
        tw.push(warm_pass.decompress(eng, &blob_refs, &mut warm)?);
        // End to end: every tensor decoded into a new buffer, all of them alive until the pass
        // ends (a loaded model's are), so that no run of the pass reuses pages an earlier one
        // touched (ZipNN's outputs are kept alike by scripts/bench_cpu.py).
        let t = Instant::now();
        let mut fresh = Vec::with_capacity(runs_of.len());
        for r in &runs_of {
            fresh.push(
                eng.decompress_many(&blob_refs[r.clone()])
                    .map_err(|e| e.to_string())?,
            );
        }
        te.push(t.elapsed().as_secs_f64());
        let fresh_exact = fresh
            .iter()
            .flatten()
            .map(|t| &t.data)
            .eq(items.iter().map(|i| &i.data));
        drop(fresh);
        if !fresh_exact || !exact(&warm) {
            return Err(format!("{}: round trip is not exact", path.display()));
        }
    }
    let b_tensor: f64 = items.iter().map(|i| bound(i, usize::MAX / 2)).sum();
    let b_chunk: f64 = items.iter().map(|i| bound(i, 256 << 10)).sum();
    // A file without tensor bytes has no speed (nor ratio, nor bound): null, not 0.
    let gb = |t: Vec<f64>| (orig > 0).then(|| orig as f64 / median(t) / 1e9);
    let per_byte = |x: f64| (orig > 0).then(|| x / orig as f64);
    let scaling = match scaling && eng.threads() > 1 {
        true => {
            let s = warm_pass.measure(eng, runs, &mut warm_blobs, &mut warm)?;
            if !exact(&warm) {
                return Err(format!("{}: round trip is not exact", path.display()));
            }
            s.json(orig)
        }
        false => serde_json::Value::Null,
    };
    Ok(serde_json::json!({
        "file": path.display().to_string(), "cast": cast, "threads": eng.threads(), "runs": runs,
        "tensors": items.len(), "original_bytes": orig, "compressed_bytes": comp,
        "ratio": per_byte(comp as f64),
        "compress_gbps": gb(tc), "compress_warm_gbps": gb(tcw), "decompress_warm_gbps": gb(tw), "decompress_e2e_gbps": gb(te),
        "bound_per_tensor": per_byte(b_tensor), "bound_per_256k_chunk": per_byte(b_chunk),
        "scaling": scaling,
    }))
}

/// The warm compress and decompress of one file's tensors (the "warm" figures, and the paired
/// scaling measurement).
struct WarmPasses<'a> {
    items: &'a [BlobItem<'a>],
    /// The runs the decompress takes together (`small_runs`).
    runs_of: &'a [std::ops::Range<usize>],
    /// The runs the compress takes together (`encode_runs`).
    enc_runs: &'a [std::ops::Range<usize>],
    /// The tensors' sizes.
    lens: &'a [u64],
    opts: &'a tensorzip::CompressOptions,
}

/// Per-run seconds of the paired measurement: one thread, then `threads`.
struct Scaling {
    threads: usize,
    compress: Vec<(f64, f64)>,
    decompress: Vec<(f64, f64)>,
    machine: Vec<(f64, f64)>,
    /// The kernel's TLB shootdowns (all CPUs) during each round's compress pair and decompress
    /// pair, where `/proc/interrupts` tells (Linux).
    shootdowns: Vec<(Option<u64>, Option<u64>)>,
}

/// The machine's TLB shootdowns so far (the `TLB:` row of `/proc/interrupts`, summed over the
/// CPUs), or `None` where there is no such row. On the 2-core VM (2026-12-04, a probe of 75
/// rounds each way) the rounds of MiniLM fp32's word embedding that ran 1.4-2x slower than the
/// rest had 1-9 shootdowns where the others had 0-1 (the kernel unmapping or sampling pages while
/// we code: the VM runs DAMON with a pageout scheme); whole-file pairs also dip by 10% in rounds
/// without any. The pairs report them per round.
fn tlb_shootdowns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/interrupts").ok()?;
    let row = text.lines().find(|l| l.trim_start().starts_with("TLB:"))?;
    Some(
        row.split_whitespace()
            .skip(1)
            .map_while(|x| x.parse::<u64>().ok())
            .sum(),
    )
}

impl WarmPasses<'_> {
    fn compress(&self, eng: &CpuEngine, blobs: &mut [Vec<u8>]) -> Result<f64, String> {
        let t = Instant::now();
        for r in self.enc_runs {
            let (items, outs) = (&self.items[r.clone()], &mut blobs[r.clone()]);
            eng.compress_seq_into(items, lead_len(self.lens, r), self.opts, outs)
                .map_err(|e| e.to_string())?;
        }
        Ok(t.elapsed().as_secs_f64())
    }

    fn decompress(
        &self,
        eng: &CpuEngine,
        blobs: &[&[u8]],
        outs: &mut [Vec<u8>],
    ) -> Result<f64, String> {
        let t = Instant::now();
        for r in self.runs_of {
            eng.decompress_many_into(&blobs[r.clone()], &mut outs[r.clone()])
                .map_err(|e| e.to_string())?;
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// `runs` rounds of one thread against `eng`'s threads, the order alternating from round to
    /// round; `blobs` are the warm compress's buffers (their contents end as the blobs), `outs` the
    /// warm decompress's.
    fn measure(
        &self,
        eng: &CpuEngine,
        runs: usize,
        blobs: &mut [Vec<u8>],
        outs: &mut [Vec<u8>],
    ) -> Result<Scaling, String> {
        let one = CpuEngine::new(1).map_err(|e| e.to_string())?;
        let n = eng.threads();
        let mut s = Scaling {
            threads: n,
            compress: Vec::new(),
            decompress: Vec::new(),
            machine: Vec::new(),
            shootdowns: Vec::new(),
        };
        let since = |t0: Option<u64>| Some(tlb_shootdowns()?.saturating_sub(t0?));
        // The spare buffers let both engines compress into warm memory without copying; one
        // untimed pass each way touches them and the one-thread engine's scratch first.
        let mut spare: Vec<Vec<u8>> = blobs.to_vec();
        self.compress(&one, &mut spare)?;
        let refs: Vec<&[u8]> = spare.iter().map(|b| &b[..]).collect();
        self.decompress(&one, &refs, outs)?;
        for run in 0..runs {
            let order = [(&one, 0), (eng, 1)];
            let order = if run % 2 == 0 {
                order
            } else {
                [order[1], order[0]]
            };
            let mut c = [0.0; 2];
            let mut d = [0.0; 2];
            let mut m = [0.0; 2];
            let t0 = tlb_shootdowns();
            for (e, k) in order {
                c[k] = self.compress(e, if k == 0 { &mut spare } else { blobs })?;
            }
            let tc = since(t0);
            if spare != blobs {
                return Err("one thread and several compress differently".into());
            }
            let refs: Vec<&[u8]> = spare.iter().map(|b| &b[..]).collect();
            let t0 = tlb_shootdowns();
            for (e, k) in order {
                d[k] = self.decompress(e, &refs, outs)?;
            }
            let td = since(t0);
            for (_, k) in order {
                m[k] = spin_threads(if k == 0 { 1 } else { n });
            }
            s.compress.push((c[0], c[1]));
            s.decompress.push((d[0], d[1]));
            s.machine.push((m[0], m[1]));
            s.shootdowns.push((tc, td));
        }
        Ok(s)
    }
}

/// Seconds for `threads` threads to each run the same fixed integer loop (~10-20 ms on one core
/// of our VMs): equal to one thread's time where the cores do not slow each other. The loop runs
/// eight independent chains, so that one thread keeps the multiplier busy: two vCPUs that are
/// hyperthreads of one core then share it and show ~1x, where a single dependent chain would
/// still overlap and show 2x.
fn spin_threads(threads: usize) -> f64 {
    fn spin(seed: u64) -> u64 {
        let mut x: [u64; 8] = std::array::from_fn(|k| seed.wrapping_add(k as u64));
        for _ in 0..(1u64 << 22) {
            for v in x.iter_mut() {
                *v = v
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *v ^= *v >> 29;
            }
            x = std::hint::black_box(x);
        }
        x.iter().fold(0, |a, v| a ^ v)
    }
    let t = Instant::now();
    if threads == 1 {
        std::hint::black_box(spin(1));
    } else {
        std::thread::scope(|sc| {
            for k in 0..threads {
                sc.spawn(move || std::hint::black_box(spin(k as u64 + 1)));
            }
        });
    }
    t.elapsed().as_secs_f64()
}

impl Scaling {
    fn json(&self, orig: u64) -> serde_json::Value {
        let gb = |t: f64| orig as f64 / t / 1e9;
        // Speed ratio many / one of each run, and the medians of each side.
        let side = |v: &[(f64, f64)], machine: bool| {
            let ratios: Vec<f64> = v
                .iter()
                .map(|&(a, b)| match machine {
                    true => self.threads as f64 * a / b,
                    false => a / b,
                })
                .collect();
            let one = median(v.iter().map(|p| p.0).collect());
            let many = median(v.iter().map(|p| p.1).collect());
            (median(ratios.clone()), ratios, one, many)
        };
        let round =
            |v: Vec<f64>| -> Vec<f64> { v.iter().map(|r| (r * 1000.0).round() / 1000.0).collect() };
        let (cr, crs, c1, cn) = side(&self.compress, false);
        let (dr, drs, d1, dn) = side(&self.decompress, false);
        let (mr, mrs, _, _) = side(&self.machine, true);
        serde_json::json!({
            "threads": self.threads, "runs": self.compress.len(),
            "compress_warm_ratio": cr, "compress_warm_1t_gbps": gb(c1), "compress_warm_nt_gbps": gb(cn),
            "decompress_warm_ratio": dr, "decompress_warm_1t_gbps": gb(d1), "decompress_warm_nt_gbps": gb(dn),
            "machine_ratio": mr,
            "compress_warm_ratios": round(crs), "decompress_warm_ratios": round(drs), "machine_ratios": round(mrs),
            "compress_tlb_shootdowns": self.shootdowns.iter().map(|p| p.0).collect::<Vec<_>>(),
            "decompress_tlb_shootdowns": self.shootdowns.iter().map(|p| p.1).collect::<Vec<_>>(),
        })
    }
}
