//! GPU engine tests. They need a CUDA device, so they are `#[ignore]`d (CI shows them as ignored, with
//! the reason); `scripts/gpu_run.sh` runs them on the device machine with `--include-ignored`.

use cudarc::driver::{DevicePtr, DevicePtrMut};
use tensorzip::{compress, sample, CompressOptions, Condition, DType};
use tensorzip_cuda::{DecodeLayout, GpuEngine};

const NEEDS_GPU: &str = "needs a CUDA GPU: run with --include-ignored on the device machine";

/// Under compute-sanitizer (`TENSORZIP_TEST_QUICK=1`) fewer cases run: it is ~100x slower.
fn quick() -> bool {
    std::env::var_os("TENSORZIP_TEST_QUICK").is_some()
}

fn engine() -> GpuEngine {
    GpuEngine::new(0).expect("CUDA device")
}

/// The engine with each of the decoder's warp layouts (one warp per chunk; a decoding and a
/// merging warp per chunk), which must give the same results.
fn layouts() -> Vec<(DecodeLayout, GpuEngine)> {
    let eng = engine();
    [DecodeLayout::OneWarp, DecodeLayout::TwoWarps]
        .into_iter()
        .map(|l| (l, eng.on_stream(eng.stream().clone()).with_decode_layout(l)))
        .collect()
}

/// Deterministic test data of every flavour for a dtype.
fn cases(dtype: DType, n: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    let isz = dtype.itemsize();
    let mut rng = sample::Rng::new(seed);
    let mut out = Vec::new();
    let float = matches!(dtype, DType::F32 | DType::BF16 | DType::F16 | DType::F64);
    if float {
        out.push(("weights".into(), sample::weights(1, n, dtype, seed)));
    }
    if float && isz >= 4 {
        // Weights whose two lowest bytes are skewed: blocks code those planes and the exponent
        // plane, with the plane below the exponent conditioned (fp32), so the multi-plane lean
        // loop also counts the conditioned units.
        let mut w = sample::weights(1, n, dtype, seed + 2);
        for (k, b) in w.iter_mut().enumerate() {
            if k % isz < 2 {
                let r = rng.next_u64();
                *b = ((r % 5) + ((r >> 32) % 5)) as u8;
            }
        }
        out.push(("weights, skewed low bytes".into(), w));
    }
    out.push((
        "random".into(),
        (0..n * isz).map(|_| rng.next_u64() as u8).collect(),
    ));
    // Every byte plane skewed (a triangular distribution, its width growing with the plane and
    // changing every 4096 units), so that blocks code several planes each (the decoder's
    // multi-plane lean loop for two or three, the general loop for more) and planes get several
    // tables (more than a block's cache holds for 4- and 8-byte units: the rest are read from
    // global memory); plane 1 uniform in the second half, so that blocks there code one plane
    // fewer.
    out.push((
        "skewed planes".into(),
        (0..n * isz)
            .map(|k| {
                let (i, j) = (k / isz, (k % isz) as u64);
                let r = rng.next_u64();
                if j == 1 && i >= n / 2 {
                    r as u8
                } else {
                    let m = 3 + 5 * j + 6 * ((i / 4096) % 8) as u64;
                    ((r % m) + ((r >> 32) % m)) as u8
                }
            })
            .collect(),
    ));
    out.push(("zeros".into(), vec![0u8; n * isz]));
    out.push((
        "constant".into(),
        (0..n * isz).map(|i| (i % isz) as u8 + 3).collect(),
    ));
    let mut outlier = if float {
        sample::weights(1, n, dtype, seed + 1)
    } else {
        vec![1u8; n * isz]
    };
    if n > 0 {
        let at = (n / 2) * isz;
        for b in &mut outlier[at..at + isz] {
            *b = 0x7F;
        }
    }
    out.push(("outlier".into(), outlier));
    out
}

fn all_option_sets() -> Vec<CompressOptions> {
    vec![
        CompressOptions::default(),
        // Format version 1 (the default pairs bf16 exponents since 2026-12-06).
        CompressOptions {
            pair_exponents: false,
            min_compress_bytes: 0,
            ..Default::default()
        },
        CompressOptions {
            chunk_bytes: 1024,
            block_units: 64,
            min_compress_bytes: 0,
            ..Default::default()
        },
        CompressOptions {
            chunk_bytes: 4096 + 8,
            block_units: 32,
            min_compress_bytes: 0,
            max_tables: 3,
            ..Default::default()
        },
        CompressOptions {
            chunk_bytes: 1 << 20,
            block_units: 8192,
            min_compress_bytes: 0,
            ..Default::default()
        },
        CompressOptions {
            condition: Condition::Off,
            min_compress_bytes: 0,
            ..Default::default()
        },
        // fp16's conditioned plane too (not by default): the GPU encoder must write it alike.
        CompressOptions {
            condition: Condition::All,
            min_compress_bytes: 0,
            ..Default::default()
        },
    ]
}

/// The dtypes, option sets and sizes of the round-trip tests. Quick mode keeps one dtype per kernel
/// (unit size and transform), fewer sizes and option sets.
fn matrix() -> (&'static [DType], Vec<CompressOptions>, &'static [usize]) {
    let sets = all_option_sets();
    if quick() {
        (
            &[
                DType::U8,
                DType::F16,
                DType::BF16,
                DType::I32,
                DType::F32,
                DType::I64,
                DType::F64,
            ],
            vec![sets[0].clone(), sets[1].clone(), sets[4].clone()],
            &[1, 70_001],
        )
    } else {
        (&DType::ALL, sets, &[0, 1, 31, 32, 33, 1000, 4097, 70_001])
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_decodes_cpu_blobs_of_every_dtype_and_shape() {
    let _ = NEEDS_GPU;
    let layouts = layouts();
    let (dtypes, sets, sizes) = matrix();
    for &dtype in dtypes {
        for &n in sizes {
            for (name, data) in cases(dtype, n, n as u64 + dtype.code() as u64) {
                let numel = n;
                for (k, opts) in sets.iter().enumerate() {
                    let blob = compress(&data, dtype, &[numel as u64], opts).unwrap();
                    for (l, eng) in &layouts {
                        let out = eng
                            .decompress_host(&[&blob])
                            .unwrap_or_else(|e| panic!("{dtype} {name} n={n} opts#{k} {l:?}: {e}"));
                        assert_eq!(out[0].data, data, "{dtype} {name} n={n} opts#{k} {l:?}");
                        assert_eq!(out[0].dtype, dtype);
                    }
                }
            }
        }
    }
}

/// bf16 tensors for format version 2 (paired exponents): weights; weights with scattered
/// exponents outside the top 16 (escaped pairs, in groups of one or many per block); weights of
/// few exponents in long runs (blocks whose ranks are few); random bytes.
fn paired_cases(n: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    let mut rng = sample::Rng::new(seed);
    let w = sample::weights(1, n, DType::BF16, seed);
    let mut scattered = w.clone();
    for i in 0..n {
        let r = rng.next_u64();
        // 1 in 512 units, and every unit of each 50th run of 4096: a high byte of 0x10..=0x7F
        // (exponents from 2^-95 up to Inf and NaN).
        if r.is_multiple_of(512) || (i / 4096) % 50 == 49 {
            scattered[2 * i + 1] = (r >> 8) as u8 & 0x7F | 0x10;
        }
    }
    let runs: Vec<u8> = (0..n)
        .flat_map(|i| {
            let e = 0x3C + ((i / 700) % 3) as u8;
            [(rng.next_u64() as u8) & 0x7F, e]
        })
        .collect();
    let random = (0..2 * n).map(|_| rng.next_u64() as u8).collect();
    vec![
        ("weights".into(), w),
        ("scattered exponents".into(), scattered),
        ("exponent runs".into(), runs),
        ("random".into(), random),
    ]
}

/// `data` compressed by both engines: the CPU's blob where the GPU's equals it (and decodes on the
/// GPU to `data`), else how they differ (both lengths and the first differing byte), named by
/// `label`.
fn gpu_blob_is_the_cpus(
    eng: &GpuEngine,
    data: &[u8],
    dtype: DType,
    shape: &[u64],
    opts: &CompressOptions,
    label: &str,
) -> Result<Vec<u8>, String> {
    let cpu = compress(data, dtype, shape, opts).unwrap();
    let gpu = eng
        .compress_host(data, dtype, shape, opts)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    if gpu != cpu {
        let at = gpu.iter().zip(&cpu).position(|(a, b)| a != b);
        return Err(format!(
            "{label}: gpu {} bytes, cpu {}, first difference at {at:?}",
            gpu.len(),
            cpu.len()
        ));
    }
    let back = eng.decompress_host(&[&gpu]).unwrap();
    assert_eq!(back[0].data, data, "{label}");
    Ok(cpu)
}

/// The option sets of the version 2 tests: defaults; short chunks of 64-unit blocks and three
/// tables; 8192-unit blocks in 1 MiB chunks (costs in 64 bits); 32768-unit blocks (staged in the
/// chunk's global scratch, where the encoder's ranks are coded without the lean steps; added
/// 2026-12-06 after the session's last device call, not yet run); no conditioned plane; one table
/// and a lower threshold (more blocks turned raw by their escapes).
fn paired_sets() -> Vec<CompressOptions> {
    let paired = |o: CompressOptions| CompressOptions {
        pair_exponents: true,
        min_compress_bytes: 0,
        ..o
    };
    vec![
        paired(CompressOptions::default()),
        paired(CompressOptions {
            chunk_bytes: 4096 + 8,
            block_units: 64,
            max_tables: 3,
            ..Default::default()
        }),
        paired(CompressOptions {
            chunk_bytes: 1 << 20,
            block_units: 8192,
            ..Default::default()
        }),
        paired(CompressOptions {
            chunk_bytes: 1 << 20,
            block_units: 32768,
            ..Default::default()
        }),
        paired(CompressOptions {
            condition: Condition::Off,
            ..Default::default()
        }),
        paired(CompressOptions {
            max_tables: 1,
            passthrough_threshold: 0.8,
            ..Default::default()
        }),
    ]
}

/// The element counts of the version 2 tests (fewer in quick mode, as under the sanitizer).
fn paired_sizes() -> &'static [usize] {
    if quick() {
        // 50,001 units: since the pair model prices a block from its histogram (2026-12-06),
        // tensors of 4,097 units of weights do not pair (their rank tables cost more than 1/32),
        // and with only those below 70,001 under a third of the quick cases paired.
        &[1, 4097, 50_001, 70_001]
    } else {
        &[0, 1, 33, 4097, 50_001, 70_001, 262_145]
    }
}

/// Format version 2 (FORMAT.md section 12): the GPU decodes the CPU engine's blobs with paired
/// exponents — ranks expanded through the pair table, escape groups, odd last blocks, blocks in
/// shared memory and in global scratch, with and without the conditioned plane — in each warp
/// layout, alone and in one batch with version 1 blobs.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_decodes_cpu_blobs_with_paired_exponents() {
    let layouts = layouts();
    let (sets, sizes) = (paired_sets(), paired_sizes());
    let (mut v2, mut total) = (0, 0);
    let mut batch: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for &n in sizes {
        for (name, data) in paired_cases(n, n as u64 + 11) {
            for (k, opts) in sets.iter().enumerate() {
                let blob = compress(&data, DType::BF16, &[n as u64], opts).unwrap();
                total += 1;
                if blob.get(4..6) == Some(&[2, 0]) {
                    v2 += 1;
                }
                for (l, eng) in &layouts {
                    let out = eng
                        .decompress_host(&[&blob])
                        .unwrap_or_else(|e| panic!("{name} n={n} opts#{k} {l:?}: {e}"));
                    assert_eq!(out[0].data, data, "{name} n={n} opts#{k} {l:?}");
                }
                if k == 0 {
                    batch.push((blob, data.clone()));
                    let v1_opts = CompressOptions {
                        pair_exponents: false,
                        ..CompressOptions::default()
                    };
                    let v1 = compress(&data, DType::BF16, &[n as u64], &v1_opts).unwrap();
                    batch.push((v1, data.clone()));
                }
            }
        }
    }
    // The cases must exercise what they are for: most large tensors pair.
    assert!(v2 * 3 >= total, "only {v2} of {total} blobs are version 2");
    let refs: Vec<&[u8]> = batch.iter().map(|(b, _)| b.as_slice()).collect();
    for (l, eng) in &layouts {
        let out = eng.decompress_host(&refs).unwrap();
        for ((_, want), got) in batch.iter().zip(&out) {
            assert!(got.data == *want, "batch {l:?}");
        }
    }
}

/// Format version 2 encoded on the GPU (FORMAT.md section 12): for the paired cases and option
/// sets of the decode test above, the GPU's blobs are the CPU engine's byte for byte — pair and
/// rank tables, escape groups, blocks turned raw by their escapes, odd last blocks, tensors that
/// stay version 1 — one tensor at a time and all of them in one batch; and each decodes.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_encodes_the_cpu_engines_bytes_with_paired_exponents() {
    let eng = engine();
    let (sets, sizes) = (paired_sets(), paired_sizes());
    let (mut v2, mut total) = (0, 0);
    let mut failures = Vec::new();
    for (k, opts) in sets.iter().enumerate() {
        let mut items = Vec::new();
        for &n in sizes {
            for (name, data) in paired_cases(n, n as u64 + 11) {
                let shape = vec![n as u64];
                let label = format!("{name} n={n} opts#{k}");
                total += 1;
                match gpu_blob_is_the_cpus(&eng, &data, DType::BF16, &shape, opts, &label) {
                    Ok(cpu) => {
                        v2 += (cpu.get(4..6) == Some(&[2, 0])) as usize;
                        items.push((data, shape, cpu));
                    }
                    Err(f) => failures.push(f),
                }
            }
        }
        let batch: Vec<tensorzip::archive::BlobItem<'_>> = items
            .iter()
            .map(|(d, s, _)| (d.as_slice(), DType::BF16, s.as_slice()))
            .collect();
        let got = eng.compress_host_batch(&batch, opts).unwrap();
        for ((_, _, cpu), gpu) in items.iter().zip(&got) {
            assert!(gpu == cpu, "batch opts#{k}");
        }
    }
    assert!(
        failures.is_empty(),
        "{} GPU blobs differ from the CPU's: {:#?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
    assert!(v2 * 3 >= total, "only {v2} of {total} blobs are version 2");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_batch_decodes_a_whole_model_in_one_launch() {
    let model = sample::sample_model(7);
    let blobs: Vec<Vec<u8>> = model
        .iter()
        .map(|t| compress(&t.data, t.dtype, &t.shape, &CompressOptions::default()).unwrap())
        .collect();
    let refs: Vec<&[u8]> = blobs.iter().map(|b| b.as_slice()).collect();
    for (l, eng) in layouts() {
        let out = eng.decompress_host(&refs).unwrap();
        for (t, o) in model.iter().zip(&out) {
            assert_eq!(o.data, t.data, "{} {l:?}", t.name);
            assert_eq!(o.shape, t.shape);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_rejects_corrupted_blobs_without_faulting() {
    let data = sample::weights(64, 1000, DType::BF16, 3);
    let opts = CompressOptions {
        chunk_bytes: 4096,
        block_units: 256,
        pair_exponents: false,
        ..Default::default()
    };
    let v1 = compress(&data, DType::BF16, &[64, 1000], &opts).unwrap();
    // Format version 2: the pair field, rank tables, ranks and escape groups corrupted too.
    let paired = CompressOptions {
        pair_exponents: true,
        max_tables: 1,
        ..opts
    };
    let v2 = compress(&data, DType::BF16, &[64, 1000], &paired).unwrap();
    assert_eq!(&v2[4..6], &[2, 0], "the blob pairs its exponents");
    for (blob, seed) in [(v1, 99), (v2, 100)] {
        corrupted_rounds(&blob, &data, seed);
    }
}

/// Random bit flips and truncations of `blob` (which decodes to `data`): the GPU engine, in each
/// warp layout, must reject what the CPU engine rejects and return the CPU's bytes otherwise.
fn corrupted_rounds(blob: &[u8], data: &[u8], seed: u64) {
    let eng = engine();
    let layouts = layouts();
    let mut rng = sample::Rng::new(seed);
    let mut errors = 0;
    let mut disagree = Vec::new();
    let rounds = if quick() { 100 } else { 2000 };
    for i in 0..rounds {
        let mut b = blob.to_vec();
        let flips = 1 + (i % 4);
        for _ in 0..flips {
            let at = (rng.next_u64() % b.len() as u64) as usize;
            b[at] ^= 1 << (rng.next_u64() % 8);
        }
        // The GPU must agree with the CPU engine, in each warp layout: both reject, or both
        // return the same bytes.
        let cpu = tensorzip::decompress(&b);
        for (l, eng) in &layouts {
            match (&cpu, eng.decompress_host(&[&b])) {
                (Err(_), Err(_)) => errors += 1,
                (Ok(c), Ok(g)) if c.data == g[0].data => {}
                (c, g) => disagree.push(format!(
                    "round {i} {l:?}: cpu {:?} gpu {:?}",
                    c.as_ref().map(|t| t.data.len()),
                    g.map(|t| t[0].data.len())
                )),
            }
        }
        // Truncations.
        let cut = (rng.next_u64() % blob.len() as u64) as usize;
        assert!(
            eng.decompress_host(&[&blob[..cut]]).is_err(),
            "truncated to {cut}"
        );
    }
    assert!(
        disagree.is_empty(),
        "CPU and GPU disagree on {} corrupted blobs: {:?}",
        disagree.len(),
        &disagree[..disagree.len().min(5)]
    );
    assert!(
        errors > rounds * layouts.len() / 2,
        "only {errors} of {rounds} corrupted blobs rejected in {} layouts",
        layouts.len()
    );
    // The engines still work afterwards.
    for (_, eng) in &layouts {
        assert_eq!(eng.decompress_host(&[blob]).unwrap()[0].data, data);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_encodes_the_cpu_engines_bytes_for_every_dtype_and_shape() {
    let eng = engine();
    let (dtypes, sets, sizes) = matrix();
    let mut failures = Vec::new();
    for &dtype in dtypes {
        for &n in sizes {
            for (name, data) in cases(dtype, n, n as u64 + dtype.code() as u64) {
                // Shapes: 1-d, and 0-d for single elements.
                let shapes: Vec<Vec<u64>> = if n == 1 {
                    vec![vec![1], vec![]]
                } else {
                    vec![vec![n as u64]]
                };
                for shape in shapes {
                    for (k, opts) in sets.iter().enumerate() {
                        // The GPU decodes its own blob too.
                        let label = format!("{dtype} {name} n={n} {shape:?} opts#{k}");
                        if let Err(f) =
                            gpu_blob_is_the_cpus(&eng, &data, dtype, &shape, opts, &label)
                        {
                            failures.push(f);
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} GPU blobs differ from the CPU's: {:#?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
}

/// Tensors of many sampled blocks: 8192 (the most the GPU's table search takes: its loops over
/// more blocks than a thread block has threads) and 9000 (the host searches them instead), for
/// bf16 and fp32 with 32-unit blocks; the blobs must be the CPU's either way.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_encodes_tensors_of_many_sampled_blocks() {
    let eng = engine();
    for dtype in [DType::BF16, DType::F32] {
        let n = 300_000usize;
        let (_, data) = cases(dtype, n, 7).swap_remove(0);
        for sample_blocks in [8192usize, 9000] {
            let opts = CompressOptions {
                block_units: 32,
                sample_blocks,
                ..Default::default()
            };
            let shape = [n as u64];
            let cpu = compress(&data, dtype, &shape, &opts).unwrap();
            let gpu = eng.compress_host(&data, dtype, &shape, &opts).unwrap();
            assert!(gpu == cpu, "{dtype} with {sample_blocks} sampled blocks");
        }
    }
}

/// More chunks in one wave than the placement's thread block has threads (1024: several tiles of
/// its prefix sums), up to ten per thread: 1,221 and 9,766 chunks of 4 KiB, in one wave (no
/// pipeline) and in the default pipeline's waves (the 9,766 in two). The blobs must be the CPU's.
/// (A placement split into two kernels, tried on 2026-12-02, failed to launch at 1024 threads, out
/// of registers, while every other test, with fewer chunks a wave, passed.)
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_encodes_waves_of_many_chunks() {
    for eng in [engine().with_pipe_waves(1), engine()] {
        for (dtype, n) in [
            (DType::BF16, 2_500_000usize),
            (DType::F32, 1_250_000),
            (DType::BF16, 20_000_000),
        ] {
            let (_, data) = cases(dtype, n, 11).swap_remove(0);
            let opts = CompressOptions {
                chunk_bytes: 4096,
                ..Default::default()
            };
            let shape = [n as u64];
            let cpu = compress(&data, dtype, &shape, &opts).unwrap();
            let gpu = eng.compress_host(&data, dtype, &shape, &opts).unwrap();
            assert!(gpu == cpu, "{dtype}, {n} units in chunks of 4 KiB");
        }
    }
}

/// The encoder's pipeline (a wave's compaction under the next wave's encoding, two scratch buffers
/// in turn) at depths 1 to 8, on a batch of two launch groups (bf16 and fp32) whose tensors span
/// waves, and on a stream of the caller's: every blob the CPU's, and the same blobs at every depth.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_encode_pipeline_depths_give_the_cpus_blobs() {
    let opts = CompressOptions {
        chunk_bytes: 4096,
        ..Default::default()
    };
    let tensors: Vec<(DType, Vec<u8>, Vec<u64>)> = [
        (DType::BF16, 9_000_000usize, 21),
        (DType::F32, 2_600_000, 22),
        (DType::BF16, 777, 23),
        (DType::BF16, 3_000_001, 24),
    ]
    .into_iter()
    .map(|(dtype, n, seed)| {
        let (_, data) = cases(dtype, n, seed).swap_remove(0);
        (dtype, data, vec![n as u64])
    })
    .collect();
    let cpu: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(d, data, shape)| compress(data, *d, shape, &opts).unwrap())
        .collect();
    let base = engine();
    let side = base.context().new_stream().unwrap();
    for (depth, on_side) in [(1, false), (2, false), (3, true), (4, false), (8, true)] {
        let eng = match on_side {
            true => base.on_stream(side.clone()),
            false => engine(),
        }
        .with_pipe_waves(depth);
        let s = eng.stream();
        let bufs: Vec<_> = tensors
            .iter()
            .map(|t| s.clone_htod(&t.1).unwrap())
            .collect();
        let list: Vec<tensorzip_cuda::encode::DeviceTensor> = tensors
            .iter()
            .zip(&bufs)
            .map(|(t, b)| tensorzip_cuda::encode::DeviceTensor {
                ptr: b.device_ptr(s).0,
                nbytes: t.1.len(),
                dtype: t.0,
                shape: t.2.clone(),
            })
            .collect();
        // SAFETY: every buffer lives until the end of the loop's round.
        let blobs = unsafe { eng.compress_batch_device(&list, &opts) }.unwrap();
        for (k, (b, c)) in blobs.iter().zip(&cpu).enumerate() {
            let gpu = s.clone_dtoh(&b.buf.slice(0..b.len)).unwrap();
            assert!(
                gpu == *c,
                "tensor {k}: GPU blob at pipeline depth {depth} differs"
            );
        }
    }
}

/// Waves of at most 1 MiB of scratch (three chunk slots of bf16): the sample model's tensors span
/// many waves, and tensors start and end inside them, as a call of more than ~3 GiB does with the
/// default; the blobs must be the CPU's all the same.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_encodes_in_many_waves_as_in_one() {
    let eng = engine().with_wave_bytes(1 << 20);
    let s = eng.stream();
    let model = sample::sample_model(5);
    let opts = CompressOptions::default();
    let bufs: Vec<_> = model
        .iter()
        .map(|t| s.clone_htod(&t.data).unwrap())
        .collect();
    let list: Vec<tensorzip_cuda::encode::DeviceTensor> = model
        .iter()
        .zip(&bufs)
        .map(|(t, b)| tensorzip_cuda::encode::DeviceTensor {
            ptr: b.device_ptr(s).0,
            nbytes: t.data.len(),
            dtype: t.dtype,
            shape: t.shape.clone(),
        })
        .collect();
    // SAFETY: every buffer lives until the end of the test.
    let blobs = unsafe { eng.compress_batch_device(&list, &opts) }.unwrap();
    assert_blobs_are_the_cpus(&eng, &model, &blobs, &opts, "in waves");
}

/// Each of `blobs` (from one `compress_batch_device` call on `model`'s tensors) downloaded and
/// compared with the CPU engine's blob of the same tensor; returns the CPU's blobs.
fn assert_blobs_are_the_cpus(
    eng: &GpuEngine,
    model: &[sample::SampleTensor],
    blobs: &[tensorzip_cuda::encode::DeviceBlob],
    opts: &CompressOptions,
    what: &str,
) -> Vec<Vec<u8>> {
    let s = eng.stream();
    assert_eq!(blobs.len(), model.len());
    model
        .iter()
        .zip(blobs)
        .map(|(t, b)| {
            let cpu = compress(&t.data, t.dtype, &t.shape, opts).unwrap();
            let gpu = s.clone_dtoh(&b.buf.slice(0..b.len)).unwrap();
            assert!(gpu == cpu, "{}: GPU blob {what} differs", t.name);
            cpu
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_encodes_a_sample_model_like_the_cpu() {
    let eng = engine();
    let s = eng.stream();
    let model = sample::sample_model(11);
    let opts = CompressOptions::default();
    // One tensor at a time, and the whole model in one batch (unaligned copies included).
    let bufs: Vec<_> = model
        .iter()
        .map(|t| {
            let mut v = vec![0u8; t.data.len() + 1];
            v[1..].copy_from_slice(&t.data);
            s.clone_htod(&v).unwrap()
        })
        .collect();
    let list: Vec<tensorzip_cuda::encode::DeviceTensor> = model
        .iter()
        .zip(&bufs)
        .enumerate()
        .map(|(i, (t, b))| tensorzip_cuda::encode::DeviceTensor {
            // Every other tensor starts one byte into its buffer (unaligned).
            ptr: b.device_ptr(s).0 + (i % 2) as u64,
            nbytes: t.data.len(),
            dtype: t.dtype,
            shape: t.shape.clone(),
        })
        .collect();
    // The odd ones hold the tensor from byte 1; the even ones need it from byte 0.
    let even: Vec<_> = model
        .iter()
        .map(|t| s.clone_htod(&t.data).unwrap())
        .collect();
    let list: Vec<_> = list
        .into_iter()
        .enumerate()
        .map(|(i, mut d)| {
            if i % 2 == 0 {
                d.ptr = even[i].device_ptr(s).0;
            }
            d
        })
        .collect();
    // SAFETY: every buffer lives until the end of the test.
    let blobs = unsafe { eng.compress_batch_device(&list, &opts) }.unwrap();
    let cpus = assert_blobs_are_the_cpus(&eng, &model, &blobs, &opts, "in a batch");
    for (t, cpu) in model.iter().zip(&cpus) {
        let one = eng
            .compress_host(&t.data, t.dtype, &t.shape, &opts)
            .unwrap();
        assert!(one == *cpu, "{}: GPU blob differs", t.name);
    }
    // From the host in one batch (what `compress --gpu` does with runs of small tensors), with
    // an empty tensor, a 0-d one and odd lengths between them.
    let extra: Vec<(Vec<u8>, DType, Vec<u64>)> = vec![
        (Vec::new(), DType::F32, vec![0, 3]),
        (vec![7, 0, 128, 63], DType::F32, vec![]),
        (
            (0..3001u32).map(|i| (i * 31 % 251) as u8).collect(),
            DType::U8,
            vec![3001],
        ),
        (
            (0..2050u32).map(|i| (i % 7) as u8).collect(),
            DType::BF16,
            vec![5, 205],
        ),
    ];
    let mut items: Vec<tensorzip::archive::BlobItem<'_>> = Vec::new();
    for (i, t) in model.iter().enumerate() {
        items.push((&t.data, t.dtype, &t.shape));
        let e = &extra[i % extra.len()];
        items.push((&e.0, e.1, &e.2));
    }
    let got = eng.compress_host_batch(&items, &opts).unwrap();
    assert_eq!(got.len(), items.len());
    for (k, (&(data, dtype, shape), gpu)) in items.iter().zip(&got).enumerate() {
        let cpu = compress(data, dtype, shape, &opts).unwrap();
        assert!(*gpu == cpu, "item {k}: host batch GPU blob differs");
    }
    assert!(eng.compress_host_batch(&[], &opts).unwrap().is_empty());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_crc32_equals_zlib() {
    let eng = engine();
    let mut rng = sample::Rng::new(5);
    let data: Vec<u8> = (0..300_007).map(|_| rng.next_u64() as u8).collect();
    let s = eng.stream();
    let dev = s.clone_htod(&data).unwrap();
    for &(start, len) in &[
        (0usize, 0usize),
        (0, 1),
        (3, 5),
        (1, 100_000),
        (0, 300_007),
        (7, 65_536),
    ] {
        let view = dev.slice(start..start + len);
        let (p, _g) = view.device_ptr(s);
        for piece in [0u64, 1, 3, 4, 100, 4096, 16384, 1 << 20] {
            // SAFETY: the view holds `len` bytes of a live allocation.
            let got = unsafe { eng.crc32_pieces_device(p, len as u64, piece) }.unwrap();
            let want = if piece == 0 {
                vec![tensorzip::crc32(&data[start..start + len])]
            } else {
                tensorzip::crc32_pieces(&data[start..start + len], piece as usize).unwrap()
            };
            assert_eq!(got, want, "start {start} len {len} piece {piece}");
        }
    }
    // Many ranges in one call, each equal to zlib's CRC of its bytes: empty ones, odd offsets,
    // ranges longer than a piece (64 KiB) and exact multiples of it, overlapping ones.
    let base = dev.device_ptr(s).0;
    let ranges: Vec<(usize, usize)> = vec![
        (0, 0),
        (5, 1),
        (0, 300_007),
        (3, 65_536),
        (1, 131_072),
        (65_537, 65_535),
        (299_999, 8),
        (17, 0),
        (1000, 200_001),
    ];
    let dev_ranges: Vec<(u64, u64)> = ranges
        .iter()
        .map(|&(o, n)| (base + o as u64, n as u64))
        .collect();
    // SAFETY: every range lies inside `dev`, alive until the end of the test.
    let got = unsafe { eng.crc32_ranges_device(&dev_ranges) }.unwrap();
    let want: Vec<u32> = ranges
        .iter()
        .map(|&(o, n)| tensorzip::crc32(&data[o..o + n]))
        .collect();
    assert_eq!(got, want);
    // SAFETY: no ranges.
    assert_eq!(
        unsafe { eng.crc32_ranges_device(&[]) }.unwrap(),
        Vec::<u32>::new()
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_staged_transfers_round_trip() {
    let eng = engine();
    let s = eng.stream();
    let stage = tensorzip_cuda::transfer::STAGE_BYTES;
    for len in [
        0usize,
        1,
        4097,
        stage - 1,
        stage,
        3 * stage + 7,
        5 * stage + 12345,
    ] {
        let src: Vec<u8> = (0..len).map(|i| (i * 31 + i / 7) as u8).collect();
        let mut dev = s.alloc_zeros::<u8>(len.max(1)).unwrap();
        let (p, g) = dev.device_ptr(s);
        drop(g);
        // SAFETY: `dev` holds at least `len` bytes and lives until the end of the iteration.
        unsafe { eng.upload_to(&src, p) }.unwrap();
        let back = s.clone_dtoh(&dev).unwrap();
        assert!(back[..len] == src[..], "upload of {len} bytes");
        let mut down = vec![0u8; len];
        // SAFETY: as above.
        unsafe { eng.download_from(p, &mut down) }.unwrap();
        assert!(down == src, "download of {len} bytes");
        // Straight into a writer, piece by piece.
        let mut written = Vec::new();
        // SAFETY: as above.
        unsafe { eng.download_to(p, len as u64, &mut written) }.unwrap();
        assert!(written == src, "download of {len} bytes into a writer");
        let _ = &mut dev;
    }
    // A writer that fails part way: the error comes back, and the staging buffers are free for
    // the next transfer (no copy of the failed one still lands in them).
    struct FailAfter(usize);
    impl std::io::Write for FailAfter {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.0 == 0 {
                return Err(std::io::Error::other("disk full"));
            }
            self.0 -= 1;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let len = 5 * stage + 3;
    let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 3) as u8).collect();
    let dev = s.clone_htod(&src).unwrap();
    let (p, g) = dev.device_ptr(s);
    drop(g);
    // SAFETY: `dev` holds `len` bytes and lives until the end of the test.
    let r = unsafe { eng.download_to(p, len as u64, &mut FailAfter(1)) };
    assert!(r.is_err_and(|e| e.to_string().contains("disk full")));
    let other: Vec<u8> = src.iter().map(|b| b ^ 0x5A).collect();
    let mut dev2 = s.alloc_zeros::<u8>(len).unwrap();
    let (p2, g2) = dev2.device_ptr(s);
    drop(g2);
    // SAFETY: `dev2` holds `len` bytes and lives until the end of the test.
    unsafe { eng.upload_to(&other, p2) }.unwrap();
    assert!(
        s.clone_dtoh(&dev2).unwrap() == other,
        "upload after a failed download"
    );
    let _ = &mut dev2;
    // Gathered uploads: pieces 16-aligned with gaps (zeros on the device, over bytes that were
    // not zero), a piece across several staging windows, empty pieces; and refused orders.
    let src: Vec<u8> = (0..3 * stage + 999)
        .map(|i| (i * 13 + i / 5) as u8 | 1)
        .collect();
    let pieces: Vec<(&[u8], u64)> = vec![
        (&src[..5], 0),
        (&src[5..5], 16),
        (&src[5..2 * stage + 3], 16),
        (&src[100..117], (2 * stage + 19).next_multiple_of(16) as u64),
        (&src[117..], (2 * stage + 64) as u64),
    ];
    let end = pieces.last().map_or(0, |&(b, at)| at as usize + b.len());
    let mut want = vec![0u8; end];
    for &(b, at) in &pieces {
        want[at as usize..at as usize + b.len()].copy_from_slice(b);
    }
    let mut dev = s.clone_htod(&vec![0xFFu8; end]).unwrap();
    let (p, g) = dev.device_ptr(s);
    drop(g);
    // SAFETY: `dev` holds `end` bytes and lives until the end of the test.
    unsafe { eng.upload_gather(&pieces, p) }.unwrap();
    assert!(s.clone_dtoh(&dev).unwrap() == want, "gathered upload");
    // The same with each piece's CRC-32 taken on the way.
    s.memset_zeros(&mut dev).unwrap();
    // SAFETY: as above.
    let crcs = unsafe { eng.upload_gather_crc(&pieces, p) }.unwrap();
    assert!(
        s.clone_dtoh(&dev).unwrap() == want,
        "gathered upload with CRCs"
    );
    let expected: Vec<u32> = pieces.iter().map(|&(b, _)| crc32fast::hash(b)).collect();
    assert_eq!(crcs, expected);
    // SAFETY: refused before anything is written.
    let bad = unsafe { eng.upload_gather(&[(&src[..8], 8), (&src[..8], 4)], p) };
    assert!(bad.is_err(), "overlapping pieces accepted");
    let _ = &mut dev;
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_encodes_and_decodes_large_host_tensors_through_the_staging_buffers() {
    let eng = engine();
    // 48 MiB: above the size from which compress_host stages its copies.
    let data = sample::weights(3 << 10, 8 << 10, DType::BF16, 21);
    let shape = [3 << 10, 8 << 10];
    let opts = CompressOptions::default();
    let cpu = compress(&data, DType::BF16, &shape, &opts).unwrap();
    let gpu = eng
        .compress_host(&data, DType::BF16, &shape, &opts)
        .unwrap();
    assert!(
        gpu == cpu,
        "GPU blob differs ({} vs {} bytes)",
        gpu.len(),
        cpu.len()
    );
    // And back through the staged upload and download of `decompress_host` (the batch is above
    // the size from which it stages), next to a small blob in the same batch.
    let small = compress(&data[..4096], DType::BF16, &[2048], &opts).unwrap();
    let out = eng.decompress_host(&[&small, &cpu]).unwrap();
    assert!(
        out[0].data == data[..4096],
        "small tensor of a staged batch"
    );
    assert!(out[1].data == data, "large tensor of a staged batch");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_copies_stored_blobs_of_every_size_and_alignment() {
    // Stored blobs go through `tz_copy` (up to 1 MiB, every alignment) or the copy engine (larger),
    // all in one batch.
    let eng = engine();
    let opts = CompressOptions {
        min_compress_bytes: usize::MAX,
        ..CompressOptions::default()
    };
    let sizes = [
        1usize,
        15,
        16,
        17,
        255,
        4099,
        65536,
        (1 << 20) - 1,
        1 << 20,
        (1 << 20) + 5,
        (3 << 20) + 1,
    ];
    let datas: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| (0..n).map(|i| (i * 7 + k * 13 + i / 251) as u8).collect())
        .collect();
    let blobs: Vec<Vec<u8>> = datas
        .iter()
        .map(|d| compress(d, DType::U8, &[d.len() as u64], &opts).unwrap())
        .collect();
    let refs: Vec<&[u8]> = blobs.iter().map(|b| b.as_slice()).collect();
    let out = eng.decompress_host(&refs).unwrap();
    for (d, o) in datas.iter().zip(&out) {
        assert!(o.data == *d, "stored blob of {} bytes", d.len());
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_reads_ranges_back_in_one_gather() {
    let eng = engine();
    let s = eng.stream();
    let src: Vec<u8> = (0..(1usize << 20) + 3)
        .map(|i| (i * 131 + i / 97) as u8)
        .collect();
    let dev = s.clone_htod(&src).unwrap();
    let (p, g) = dev.device_ptr(s);
    drop(g);
    let ranges: Vec<(usize, usize)> = vec![
        (0, 0),
        (0, 1),
        (5, 17),
        (16, 16),
        (3, 4096),
        (1000, 0),
        (0, src.len()),
        (src.len() - 1, 1),
    ];
    let dev_ranges: Vec<(u64, u64)> = ranges
        .iter()
        .map(|&(o, n)| (p + o as u64, n as u64))
        .collect();
    let want: Vec<u8> = ranges
        .iter()
        .flat_map(|&(o, n)| src[o..o + n].iter().copied())
        .collect();
    // Repeated, the small and the large read back to back: the host must not read the page-locked
    // buffer before the device has written it (a missed wait shows up as stale or zero bytes).
    for _ in 0..8 {
        // SAFETY: every range lies inside `dev`, alive until the end of the test.
        let got = unsafe { eng.read_ranges(&dev_ranges) }.unwrap();
        assert!(got == want);
        // SAFETY: as above.
        let got = unsafe { eng.read_ranges(&dev_ranges[2..4]) }.unwrap();
        assert!(got[..] == want[1..1 + 17 + 16]);
    }
}

/// `GpuEngine::read_layouts` of blobs resident on the GPU gives, blob by blob, what the host's
/// parse of the same bytes gives: the layouts (a prefix longer than the first 4 KiB read
/// included) and each bad blob's own error (empty, noise, cut inside its directory, damaged in its
/// header); the good blobs then decode from those layouts to their data.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_reads_layouts_of_resident_blobs() {
    use tensorzip::blob::BlobLayout;
    let eng = engine();
    let s = eng.stream();
    let small = CompressOptions {
        chunk_bytes: 1024,
        ..CompressOptions::default()
    };
    let mut datas = Vec::new();
    let mut blobs = Vec::new();
    for (dt, n, opts) in [
        (DType::BF16, 5000usize, CompressOptions::default()),
        (DType::F32, 3, CompressOptions::default()),
        // 2048 chunks: a directory far past the first 4 KiB read.
        (DType::BF16, 1 << 20, small.clone()),
        (DType::F32, 70_000, small.clone()),
        (DType::F16, 1, CompressOptions::default()),
    ] {
        let data = sample::weights(1, n, dt, 7 + n as u64);
        blobs.push(compress(&data, dt, &[n as u64], &opts).unwrap());
        datas.push(data);
    }
    let good = blobs.len();
    let long = blobs[2].clone();
    assert!(BlobLayout::parse(&long, long.len()).unwrap().overhead_len() > 4096);
    // Bad ones: empty, noise, the long blob cut inside its directory, a header byte damaged.
    blobs.push(Vec::new());
    blobs.push(
        (0..3000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
            .collect(),
    );
    blobs.push(long[..3000].to_vec());
    let mut damaged = blobs[0].clone();
    damaged[4] ^= 0x40;
    blobs.push(damaged);
    // All in one device buffer, 16-byte aligned.
    let mut host = Vec::new();
    let mut at = Vec::new();
    for b in &blobs {
        host.resize(host.len().next_multiple_of(16), 0);
        at.push(host.len());
        host.extend_from_slice(b);
    }
    host.push(0);
    let dev = s.clone_htod(&host).unwrap();
    let (p, g) = dev.device_ptr(s);
    drop(g);
    let resident: Vec<(u64, usize)> = blobs
        .iter()
        .zip(&at)
        .map(|(b, &o)| (p + o as u64, b.len()))
        .collect();
    // SAFETY: every blob lies inside `dev`, alive until the end of the test.
    let got = unsafe { eng.read_layouts(&resident) }.unwrap();
    assert_eq!(got.len(), blobs.len());
    for (k, (g, b)) in got.iter().zip(&blobs).enumerate() {
        match (g, BlobLayout::parse(b, b.len())) {
            (Ok(l), Ok(h)) => {
                assert_eq!(l.header, h.header, "blob {k}");
                assert_eq!(l.overhead_len(), h.overhead_len(), "blob {k}");
                assert!(k < good, "blob {k} should not parse");
            }
            (Err(e), Err(h)) => {
                assert_eq!(format!("{e:?}"), format!("{h:?}"), "blob {k}");
                assert!(k >= good, "blob {k} should parse");
            }
            (g, h) => panic!("blob {k}: device {:?}, host {:?}", g.is_ok(), h.is_ok()),
        }
    }
    let layouts: Vec<BlobLayout> = got[..good].iter().map(|l| l.clone().unwrap()).collect();
    let sizes: Vec<usize> = datas.iter().map(|d| d.len().next_multiple_of(16)).collect();
    let mut out = s.alloc_zeros::<u8>(sizes.iter().sum::<usize>()).unwrap();
    let (op, g) = out.device_ptr_mut(s);
    drop(g);
    let mut o = 0;
    let mut jobs = Vec::new();
    for (k, l) in layouts.iter().enumerate() {
        jobs.push((l, resident[k].0, op + o as u64));
        o += sizes[k];
    }
    // SAFETY: the layouts were parsed from these blobs at these addresses; the outputs tile `out`
    // (each tensor's bytes, rounded up to 16); all alive until the end of the test.
    unsafe { eng.decode_device(&jobs) }.unwrap();
    let back = s.clone_dtoh(&out).unwrap();
    let mut o = 0;
    for (k, d) in datas.iter().enumerate() {
        assert!(back[o..o + d.len()] == d[..], "blob {k} decoded");
        o += sizes[k];
    }
}

/// An archive written through the GPU engine (`compress --gpu`: `BlobEncoder::encode_blob_seq`'s
/// default, a run's lead of small tensors in one batch, the large ones after it one after the
/// other) equals the CPU engine's, whose large tensors are coded with the next one's model built
/// beside them (the first beside the lead); a large random tensor between them is stored by both.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_archives_of_consecutive_large_tensors_equal_the_cpus() {
    use tensorzip::archive::{plan_safetensors, serialize_safetensors, write_archive};
    use tensorzip::archive::{ArchiveOptions, SMALL_SEGMENT_BYTES};
    let random = sample::random_bytes(1100 * 1024 * 4, 6);
    let data: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = vec![
        (
            "s0",
            "BF16",
            vec![64, 100],
            sample::weights(64, 100, DType::BF16, 1),
        ),
        (
            "big",
            "F32",
            vec![1100, 1024],
            sample::weights(1100, 1024, DType::F32, 2),
        ),
        ("rand", "F32", vec![1100, 1024], random),
        (
            "big2",
            "BF16",
            vec![2200, 1024],
            sample::weights(2200, 1024, DType::BF16, 3),
        ),
        (
            "s1",
            "F16",
            vec![33, 7],
            sample::weights(33, 7, DType::F16, 4),
        ),
        (
            "big3",
            "F16",
            vec![2100, 1024],
            sample::weights(2100, 1024, DType::F16, 5),
        ),
        // Above the staging threshold: uploaded and its blob written through the staging buffers.
        (
            "huge",
            "BF16",
            vec![5120, 4096],
            sample::weights(5120, 4096, DType::BF16, 6),
        ),
    ];
    let tensors: Vec<(&str, &str, &[u64], &[u8])> = data
        .iter()
        .map(|(n, d, s, x)| (*n, *d, &s[..], &x[..]))
        .collect();
    for t in [&tensors[1], &tensors[2], &tensors[3], &tensors[5]] {
        assert!(t.3.len() as u64 > SMALL_SEGMENT_BYTES);
    }
    let file = serialize_safetensors(&tensors, None).unwrap();
    let segs = plan_safetensors(&file).unwrap();
    let opts = ArchiveOptions::default();
    let write = |eng: &dyn tensorzip::archive::BlobEncoder| {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = tempfile::tempfile().unwrap();
        write_archive(eng, &file[..], &segs, &opts, &mut f, &|_| {}).unwrap();
        let mut bytes = Vec::new();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut bytes).unwrap();
        bytes
    };
    let eng = engine();
    let gpu = write(&eng);
    let cpu = write(&tensorzip::CpuEngine::new(0).unwrap());
    assert!(
        gpu == cpu,
        "the GPU engine's archive differs from the CPU's"
    );
    // Decoded on the GPU (`decompress --gpu`) and checked there (`verify --gpu`), with one
    // checksum per blob and with piece checksums; a changed byte in a blob is refused by both.
    for piece in [0u32, 1 << 20] {
        let opts = ArchiveOptions {
            checksum_piece_bytes: piece,
            ..ArchiveOptions::default()
        };
        let mut f = tempfile::tempfile().unwrap();
        write_archive(&eng, &file[..], &segs, &opts, &mut f, &|_| {}).unwrap();
        let bytes = {
            use std::io::{Read, Seek, SeekFrom};
            let mut b = Vec::new();
            f.seek(SeekFrom::Start(0)).unwrap();
            f.read_to_end(&mut b).unwrap();
            b
        };
        let ar = tensorzip::archive::Archive::parse(&bytes).unwrap();
        let mut back = Vec::new();
        tensorzip_cuda::archive::decode_archive_to(&eng, &ar, &mut back, &|_| {}).unwrap();
        assert!(back == file, "GPU decode of the archive (pieces {piece})");
        tensorzip_cuda::archive::check_archive(&eng, &ar, &|_| {}).unwrap();
        let (big, _) = ar
            .segments
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.blob_len))
            .max_by_key(|&(_, l)| l)
            .unwrap();
        let mut bad = bytes.clone();
        let at = (ar.segments[big].blob_offset + ar.segments[big].blob_len / 2) as usize;
        bad[at] ^= 0x10;
        let ar = tensorzip::archive::Archive::parse(&bad).unwrap();
        let e = tensorzip_cuda::archive::decode_archive_to(&eng, &ar, &mut Vec::new(), &|_| {})
            .unwrap_err();
        assert!(e.to_string().contains("checksum mismatch"), "{e}");
        let e = tensorzip_cuda::archive::check_archive(&eng, &ar, &|_| {}).unwrap_err();
        assert!(e.to_string().contains("checksum mismatch"), "{e}");
    }
}

/// One engine used from several host threads at once, each on a stream of its own, as the Python
/// package does (it releases the GIL): decodes of tensors whose launches take different amounts
/// of shared memory, and encodes with the counting step's joint counts in shared memory and not
/// (blocks of 4096 and 8192 units), interleaved. A kernel's shared-memory limit is one setting per
/// process, and the search's logarithm table is filled once: each thread's results must still be
/// the CPU engine's, every time.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_engine_shared_by_threads_on_their_own_streams() {
    let eng = engine();
    let rounds = if quick() { 2 } else { 12 };
    let jobs: Vec<(Vec<u8>, DType, CompressOptions)> = vec![
        (
            sample::weights(4, 1 << 18, DType::BF16, 1),
            DType::BF16,
            CompressOptions::default(),
        ),
        (
            sample::weights(3, 4099, DType::F32, 2),
            DType::F32,
            CompressOptions {
                chunk_bytes: 8 << 10,
                block_units: 8192,
                ..CompressOptions::default()
            },
        ),
        (
            sample::weights(2, 1 << 16, DType::F16, 3),
            DType::F16,
            CompressOptions {
                max_tables: 16,
                block_units: 1024,
                ..CompressOptions::default()
            },
        ),
    ];
    let expected: Vec<Vec<u8>> = jobs
        .iter()
        .map(|(d, t, o)| compress(d, *t, &[(d.len() / t.itemsize()) as u64], o).unwrap())
        .collect();
    std::thread::scope(|sc| {
        for t in 0..jobs.len() {
            let mine = eng.on_stream(eng.context().new_stream().unwrap());
            let (jobs, expected) = (&jobs, &expected);
            sc.spawn(move || {
                for r in 0..rounds {
                    // Each thread starts at another job and goes round them all.
                    let (data, dtype, opts) = &jobs[(t + r) % jobs.len()];
                    let want = &expected[(t + r) % jobs.len()];
                    let shape = [(data.len() / dtype.itemsize()) as u64];
                    let blob = mine.compress_host(data, *dtype, &shape, opts).unwrap();
                    assert!(
                        &blob == want,
                        "thread {t} round {r}: GPU blob differs from the CPU's"
                    );
                    let out = mine.decompress_host(&[want]).unwrap();
                    assert!(
                        out[0].data == *data,
                        "thread {t} round {r}: decoded bytes differ"
                    );
                }
            });
        }
    });
}

/// A plan uploaded on one stream and launched on another (an engine from `on_stream`), the
/// upload stream kept busy with a large memset queued before the upload and cudarc's event
/// tracking off (as in the Python bindings): the launch waits for the upload, `check` from either engine reports on the launch, and the plan dropped right after its
/// launch is freed after it. Every round decodes the CPU's blob exactly.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
fn gpu_plan_launched_on_another_stream_than_its_upload() {
    use cudarc::driver::DevicePtrMut;
    use tensorzip::blob::BlobLayout;
    use tensorzip_cuda::plan::{Job, Plan};
    let up = engine();
    // SAFETY: as the Python bindings do (which is where a plan could meet another stream): no
    // event bookkeeping by cudarc, whose waits on the plan's table buffer would otherwise order
    // the kernels after the upload by themselves; this test's own buffers are each used on one
    // stream, which it waits for.
    unsafe { up.context().disable_event_tracking() };
    let other = up.on_stream(up.context().new_stream().unwrap());
    let s = other.stream();
    let rounds = if quick() { 2 } else { 8 };
    for r in 0..rounds {
        // Other data each round: a plan's buffers reused from the round before (the pool hands
        // back freed memory) would hold other descriptors and tables, not the right ones.
        let data = sample::weights(1, (1 << 20) + 4096 * r, DType::BF16, 11 + r as u64);
        let shape = [(data.len() / 2) as u64];
        let blob = compress(&data, DType::BF16, &shape, &CompressOptions::default()).unwrap();
        let layout = BlobLayout::parse(&blob, blob.len()).unwrap();
        let dev_blob = s.clone_htod(&blob).unwrap();
        let mut dev_out = s.alloc_zeros::<u8>(data.len()).unwrap();
        s.synchronize().unwrap();
        let plan = Plan::new(&[Job {
            layout: &layout,
            data_offset: 0,
            out_offset: 0,
        }])
        .unwrap();
        // ~0.5 GiB of zeros queued on the upload stream ahead of the plan's upload.
        let busy = up.stream().alloc_zeros::<u8>(1 << 29).unwrap();
        let mut dplan = up.upload(&plan).unwrap();
        {
            let (dp, _g1) = dev_blob.device_ptr(s);
            let (op, _g2) = dev_out.device_ptr_mut(s);
            // SAFETY: the plan was built from this blob at offset 0, its output at offset 0 of
            // `dev_out`, which holds the whole tensor; both outlive the launch (checked below).
            unsafe { other.launch(&mut dplan, dp, op) }.unwrap();
        }
        if r % 2 == 0 {
            // Checked from the engine that uploaded it.
            up.check(&dplan).unwrap();
        } else {
            // Dropped unchecked: freed on the upload stream after the launch.
            drop(dplan);
        }
        drop(busy);
        let back = s.clone_dtoh(&dev_out).unwrap();
        assert!(back == data, "round {r}: decoded bytes differ");
    }
}
