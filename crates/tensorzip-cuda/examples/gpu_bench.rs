//! GPU decode benchmark (run on the device machine by `scripts/gpu_run.sh`).
//!
//! `gpu_bench synth <bf16|fp32> <tensors> <runs>`: tensors of 8192 x 8192 with
//! `randn * 0.02 * exp(0.3 * randn(rows, 1))`; `gpu_bench file <path.safetensors> <none|bf16|f16> <runs>`;
//! `gpu_bench model - - <runs>`: the built-in sample model (many small tensors, like a real model).
//! The tensors are compressed by the CPU engine; the blobs are uploaded once; then the median over
//! `runs` of: the decode kernel alone (CUDA events, blobs and output in device memory), the
//! library's batch call `decode_device` with the blobs' layouts known (planning, plan upload,
//! launch, wait), the device-resident decode from nothing but the device copy of the blobs (their
//! prefixes read back and parsed first), and the pinned host round trip
//! (blob host -> device, decode, tensor device -> host). One JSON line per dataset.
//! `BENCH_DECODE_ONLY=1` skips the encoder's measurements; `CHUNK_BYTES=N` compresses with chunks of
//! N bytes instead of the default; `BLOCK_UNITS=N` with blocks of N units; `NO_COND=1` without the
//! conditioned plane; `COND_ALL=1` with it for fp16 too (`Condition::All`); `PAIRS=0` with bf16
//! exponents one unit a symbol (format version 1; by default they are paired, version 2).
//! `ENC_WAVES_AB=1,4` times the encoder again at those pipeline depths (`encode_waves_ab_gbps`).

use std::time::Instant;

use cudarc::driver::{DevicePtr, DevicePtrMut};
use rayon::prelude::*;
use tensorzip::blob::BlobLayout;
use tensorzip::{sample, CompressOptions, CpuEngine, DType};
use tensorzip_cuda::plan::{Job, Plan};
use tensorzip_cuda::GpuEngine;

fn weights(rows: usize, cols: usize, dtype: DType, seed: u64) -> Vec<u8> {
    let isz = dtype.itemsize();
    let mut out = vec![0u8; rows * cols * isz];
    out.par_chunks_mut(cols * isz)
        .enumerate()
        .for_each(|(r, row)| {
            row.copy_from_slice(&sample::weights(
                1,
                cols,
                dtype,
                seed.wrapping_mul(1_000_003).wrapping_add(r as u64),
            ));
        });
    out
}

/// A tensor to compress: dtype, shape, bytes.
type Input = (DType, Vec<u64>, Vec<u8>);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

const USAGE: &str =
    "usage: gpu_bench synth <bf16|fp32> <n> <runs> | file <path> <none|bf16|f16> <runs> | model - - <runs>";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // The three words before <runs> (which defaults to 10) are needed by every form.
    if args.len() < 4 || (args[1] == "synth" && args[3].parse::<usize>().is_err()) {
        eprintln!("{USAGE}");
        std::process::exit(2);
    }
    let runs: usize = args.get(4).and_then(|v| v.parse().ok()).unwrap_or(10);
    let (name, tensors): (String, Vec<Input>) = match args[1].as_str() {
        "model" => (
            "built-in sample model (34 tensors, 32 MiB)".into(),
            sample::sample_model(7)
                .into_iter()
                .map(|t| (t.dtype, t.shape, t.data))
                .collect(),
        ),
        "synth" => {
            let dtype = if args[2] == "bf16" {
                DType::BF16
            } else {
                DType::F32
            };
            let n: usize = args[3].parse().unwrap();
            (
                format!("synthetic {} {}x8192x8192", args[2], n),
                (0..n)
                    .map(|i| {
                        (
                            dtype,
                            vec![8192, 8192],
                            weights(8192, 8192, dtype, i as u64 + 1),
                        )
                    })
                    .collect(),
            )
        }
        "file" => {
            let bytes = std::fs::read(&args[2]).unwrap();
            let (_, list) = tensorzip::archive::safetensors_layout(&bytes).unwrap();
            let cast = args[3].as_str();
            let ts = list
                .iter()
                .filter_map(|t| {
                    let d = DType::from_safetensors_name(&t.dtype_name)?;
                    let raw = &bytes[t.begin as usize..t.end as usize];
                    let to = match cast {
                        "bf16" => DType::BF16,
                        "f16" => DType::F16,
                        _ => d,
                    };
                    let cast = (d == DType::F32)
                        .then(|| sample::cast_f32_bytes(raw, to))
                        .flatten();
                    Some(match cast {
                        Some(c) => (to, t.shape.clone(), c),
                        None => (d, t.shape.clone(), raw.to_vec()),
                    })
                })
                .collect();
            let base = std::path::Path::new(&args[2])
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            let label = if cast == "none" {
                base
            } else {
                format!("{base} cast to {cast}")
            };
            (label, ts)
        }
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    let orig: usize = tensors.iter().map(|t| t.2.len()).sum();
    let cpu = CpuEngine::default();
    let t = Instant::now();
    let opts = CompressOptions {
        condition: match (std::env::var_os("NO_COND"), std::env::var_os("COND_ALL")) {
            (Some(_), _) => tensorzip::Condition::Off,
            (None, Some(_)) => tensorzip::Condition::All,
            (None, None) => tensorzip::Condition::Auto,
        },
        chunk_bytes: std::env::var("CHUNK_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(CompressOptions::default().chunk_bytes),
        block_units: std::env::var("BLOCK_UNITS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(CompressOptions::default().block_units),
        pair_exponents: std::env::var("PAIRS").map_or(true, |v| v != "0"),
        ..Default::default()
    };
    let blobs: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(d, s, data)| cpu.compress(data, *d, s, &opts).unwrap())
        .collect();
    let cpu_compress_s = t.elapsed().as_secs_f64();
    let comp: usize = blobs.iter().map(|b| b.len()).sum();

    let eng = GpuEngine::new(0).unwrap();
    let s = eng.stream().clone();
    let mut host = Vec::with_capacity(comp);
    let mut offsets = Vec::new();
    for b in &blobs {
        offsets.push(host.len() as u64);
        host.extend_from_slice(b);
    }
    // Parsed on one thread: for a model's prefixes (MiniLM: 104 blobs, ~60 KiB) waking the pool
    // costs more than it saves.
    let parse = |host: &[u8]| -> Vec<BlobLayout> {
        blobs
            .iter()
            .zip(&offsets)
            .map(|(b, &o)| {
                BlobLayout::parse(&host[o as usize..o as usize + b.len()], b.len()).unwrap()
            })
            .collect()
    };
    let plan_of = |layouts: &[BlobLayout]| {
        let mut out_off = 0u64;
        let mut outs = Vec::new();
        for l in layouts {
            outs.push(out_off);
            out_off += l.header.nbytes().div_ceil(256) * 256;
        }
        let jobs: Vec<Job<'_>> = layouts
            .iter()
            .zip(&offsets)
            .zip(&outs)
            .map(|((l, &d), &o)| Job {
                layout: l,
                data_offset: d,
                out_offset: o,
            })
            .collect();
        (Plan::new(&jobs).unwrap(), outs, out_off)
    };
    let layouts = parse(&host);
    let (plan, outs, out_len) = plan_of(&layouts);
    let dev_data = s.clone_htod(&host).unwrap();
    let mut dev_out = s.alloc_zeros::<u8>(out_len as usize).unwrap();
    let mut dplan = eng.upload(&plan).unwrap();
    let (dp, _g1) = dev_data.device_ptr(&s);
    let (op, _g2) = dev_out.device_ptr_mut(&s);
    drop((_g1, _g2));
    // Warm up and check once.
    // SAFETY: the plan was built from these blobs at these offsets; the output buffer holds every
    // tensor at its offset; both live until the end of main.
    unsafe { eng.launch(&mut dplan, dp, op).unwrap() };
    eng.check(&dplan).unwrap();
    let back = s.clone_dtoh(&dev_out).unwrap();
    for (t, &o) in tensors.iter().zip(&outs) {
        assert!(
            back[o as usize..o as usize + t.2.len()] == t.2[..],
            "GPU decode differs"
        );
    }
    // Kernel alone.
    let mut kernel = Vec::new();
    for _ in 0..runs {
        let e0 = s
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap();
        // SAFETY: as above.
        unsafe { eng.launch(&mut dplan, dp, op).unwrap() };
        let e1 = s
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap();
        eng.check(&dplan).unwrap();
        kernel.push(e0.elapsed_ms(&e1).unwrap() as f64 / 1e3);
    }
    // The batch call of the library with the layouts known (parsed when the archive was opened):
    // `GpuEngine::decode_device` plans, uploads the plan, launches and waits.
    let call_jobs: Vec<(&BlobLayout, u64, u64)> = layouts
        .iter()
        .zip(&offsets)
        .zip(&outs)
        .map(|((l, &o), &out)| (l, dp + o, op + out))
        .collect();
    let mut call = Vec::new();
    for _ in 0..runs {
        s.synchronize().unwrap();
        let t = Instant::now();
        // SAFETY: each job's blob lies in `dev_data` and its output in `dev_out` (both alive until
        // the end of main), as the plan above; outputs are disjoint.
        unsafe { eng.decode_device(&call_jobs).unwrap() };
        call.push(t.elapsed().as_secs_f64());
    }
    // Device-resident decode with planning, as a reader of blobs resident on the GPU does it
    // (Python's `decompress_tensors`): `GpuEngine::read_layouts` reads the blob prefixes (header,
    // tables, directory) back — the first 4 KiB and 1/4096 of each, then the rest of the longer
    // ones — and parses them in parallel; then the plan, its upload and the decode.
    let resident_blobs: Vec<(u64, usize)> = blobs
        .iter()
        .zip(&offsets)
        .map(|(b, &o)| (dp + o, b.len()))
        .collect();
    let mut resident = Vec::new();
    // Where that time goes (microseconds, per run): reading back and parsing the prefixes,
    // planning, uploading the plan, launching and waiting.
    let mut steps: [Vec<f64>; 4] = Default::default();
    for _ in 0..runs {
        s.synchronize().unwrap();
        let t = Instant::now();
        // SAFETY: every blob lies inside `dev_data`, alive until the end of main.
        let layouts2: Vec<BlobLayout> = unsafe { eng.read_layouts(&resident_blobs).unwrap() }
            .into_iter()
            .map(|l| l.unwrap())
            .collect();
        let t1 = t.elapsed().as_secs_f64();
        let (plan2, _, _) = plan_of(&layouts2);
        let t2 = t.elapsed().as_secs_f64();
        let mut dplan2 = eng.upload(&plan2).unwrap();
        let t3 = t.elapsed().as_secs_f64();
        // SAFETY: as above.
        unsafe { eng.launch(&mut dplan2, dp, op).unwrap() };
        eng.check(&dplan2).unwrap();
        let t4 = t.elapsed().as_secs_f64();
        resident.push(t4);
        for (v, d) in steps.iter_mut().zip([t1, t2 - t1, t3 - t2, t4 - t3]) {
            v.push(d * 1e6);
        }
    }
    let steps_us: Vec<f64> = steps.into_iter().map(median).collect();
    // Pinned host round trip: blob host -> device, decode, tensors device -> host.
    let ctx = eng.context().clone();
    // SAFETY: pinned host buffers of plain bytes, written before being read.
    let mut pin_in = unsafe { ctx.alloc_pinned::<u8>(host.len()).unwrap() };
    pin_in.as_mut_slice().unwrap().copy_from_slice(&host);
    // SAFETY: as above.
    let mut pin_out = unsafe { ctx.alloc_pinned::<u8>(out_len as usize).unwrap() };
    let mut dev_in = s.alloc_zeros::<u8>(host.len()).unwrap();
    let mut round = Vec::new();
    for _ in 0..runs {
        s.synchronize().unwrap();
        let t = Instant::now();
        s.memcpy_htod(&pin_in, &mut dev_in).unwrap();
        let (ip, _g) = dev_in.device_ptr(&s);
        // SAFETY: `dev_in` holds the same blobs as `dev_data`, at the same offsets.
        unsafe { eng.launch(&mut dplan, ip, op).unwrap() };
        drop(_g);
        s.memcpy_dtoh(&dev_out, &mut pin_out).unwrap();
        eng.check(&dplan).unwrap();
        round.push(t.elapsed().as_secs_f64());
    }
    drop((dev_data, dev_out, dev_in, dplan));
    let gb = |t: f64| orig as f64 / t / 1e9;
    // The decoder's figures, reported in both modes.
    let k = median(kernel);
    let mut report = serde_json::json!({
        "dataset": name, "chunks": plan.groups.iter().map(|g| g.chunks.len()).sum::<usize>(),
        "ratio": comp as f64 / orig as f64,
        "paired_blobs": layouts.iter().filter(|l| l.paired_plane().is_some()).count(),
        "decode_kernel_gbps": gb(k), "decode_kernel_ms": k * 1e3,
        "decode_call_gbps": gb(median(call)),
        "decode_resident_with_planning_gbps": gb(median(resident)),
        "planning_steps_us": {"read_layouts": steps_us[0], "plan": steps_us[1],
            "upload": steps_us[2], "launch_and_wait": steps_us[3]},
        "pinned_round_trip_decode_gbps": gb(median(round)),
    });
    if std::env::var_os("BENCH_DECODE_ONLY").is_some() {
        // Decoder comparisons (scripts/gpu_ab.sh): no encoder runs.
        println!("{report}");
        return;
    }
    // GPU encode, device-resident: tensors in device memory -> blobs in device memory.
    let dev_tensors: Vec<_> = tensors
        .iter()
        .map(|t| {
            s.clone_htod(if t.2.is_empty() { &[0u8][..] } else { &t.2 })
                .unwrap()
        })
        .collect();
    // The encoder's view of device copies of the tensors.
    let describe =
        |bufs: &[cudarc::driver::CudaSlice<u8>]| -> Vec<tensorzip_cuda::encode::DeviceTensor> {
            tensors
                .iter()
                .zip(bufs)
                .map(|(t, d)| tensorzip_cuda::encode::DeviceTensor {
                    ptr: d.device_ptr(&s).0,
                    nbytes: t.2.len(),
                    dtype: t.0,
                    shape: t.1.clone(),
                })
                .collect()
        };
    let dev_list = describe(&dev_tensors);
    // One batch call for all tensors (one encoder launch per unit size).
    let encode_all = || -> Vec<tensorzip_cuda::DeviceBlob> {
        // SAFETY: every tensor's buffer lives until the end of main.
        unsafe { eng.compress_batch_device(&dev_list, &opts).unwrap() }
    };
    let first = encode_all();
    let encode_equal_cpu = first
        .iter()
        .zip(&blobs)
        .all(|(g, c)| s.clone_dtoh(&g.buf.slice(0..g.len)).unwrap() == *c);
    drop(first);
    let mut enc = Vec::new();
    for _ in 0..runs {
        s.synchronize().unwrap();
        let t = Instant::now();
        let out = encode_all();
        s.synchronize().unwrap();
        enc.push(t.elapsed().as_secs_f64());
        drop(out);
    }
    // `ENC_WAVES_AB=1,4`: the device-resident encode again with the encoder's pipeline at each of
    // these depths (`GpuEngine::with_pipe_waves`), alternating in three rounds of `runs` runs
    // each; the median of each round, per depth (`encode_waves_ab_gbps`).
    let mut waves_ab = serde_json::Map::new();
    if let Ok(list) = std::env::var("ENC_WAVES_AB") {
        let depths: Vec<u64> = list
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        let mut by: Vec<Vec<f64>> = vec![Vec::new(); depths.len()];
        for _round in 0..3 {
            for (d, &w) in depths.iter().enumerate() {
                let e = eng.on_stream(s.clone()).with_pipe_waves(w);
                let mut ts = Vec::new();
                for _ in 0..runs {
                    s.synchronize().unwrap();
                    let t = Instant::now();
                    // SAFETY: every tensor's buffer lives until the end of main.
                    let out = unsafe { e.compress_batch_device(&dev_list, &opts).unwrap() };
                    s.synchronize().unwrap();
                    ts.push(t.elapsed().as_secs_f64());
                    drop(out);
                }
                by[d].push(gb(median(ts)));
            }
        }
        for (w, v) in depths.iter().zip(by) {
            waves_ab.insert(w.to_string(), serde_json::json!(v));
        }
    }
    // Pinned host round trip of the encoder: tensor host -> device, encode, blob -> host.
    let mut pin_t = Vec::new();
    for t in &tensors {
        // SAFETY: pinned host buffers of plain bytes, written before being read.
        let mut b = unsafe { ctx.alloc_pinned::<u8>(t.2.len().max(1)).unwrap() };
        b.as_mut_slice().unwrap()[..t.2.len()].copy_from_slice(&t.2);
        pin_t.push(b);
    }
    // SAFETY: as above.
    let mut pin_blob = unsafe { ctx.alloc_pinned::<u8>(comp + 4096 * blobs.len()).unwrap() };
    let mut dev_t: Vec<_> = tensors
        .iter()
        .map(|t| s.alloc_zeros::<u8>(t.2.len().max(1)).unwrap())
        .collect();
    let round_list = describe(&dev_t);
    let mut enc_round = Vec::new();
    for _ in 0..runs {
        s.synchronize().unwrap();
        let t0 = Instant::now();
        for (pin, dt) in pin_t.iter().zip(&mut dev_t) {
            s.memcpy_htod(pin, dt).unwrap();
        }
        // SAFETY: the device buffers live until the end of main.
        let out = unsafe { eng.compress_batch_device(&round_list, &opts).unwrap() };
        let mut at = 0usize;
        for b in &out {
            let dst = &mut pin_blob.as_mut_slice().unwrap()[at..at + b.len];
            s.memcpy_dtoh(&b.buf.slice(0..b.len), dst).unwrap();
            at += b.len;
        }
        s.synchronize().unwrap();
        enc_round.push(t0.elapsed().as_secs_f64());
    }
    let encoder = serde_json::json!({
        "tool": match (opts.pair_exponents, opts.condition != tensorzip::Condition::Off) {
            (false, true) => "tensorzip v1",
            (false, false) => "tensorzip v1 (condition off)",
            (true, true) => "tensorzip",
            (true, false) => "tensorzip (condition off)",
        },
        "tensors": tensors.len(), "original_bytes": orig, "compressed_bytes": comp,
        "ratio": comp as f64 / orig as f64,
        "encode_resident_gbps": gb(median(enc)), "encode_equal_cpu": encode_equal_cpu,
        "pinned_round_trip_encode_gbps": gb(median(enc_round)),
        "encode_waves_ab_gbps": waves_ab,
        "cpu_compress_gbps": orig as f64 / cpu_compress_s / 1e9, "cpu_threads": rayon::current_num_threads(),
    });
    if let (Some(r), serde_json::Value::Object(e)) = (report.as_object_mut(), encoder) {
        r.extend(e);
    }
    println!("{report}");
}
