//! Development probe for the single-thread hot loops: codes one synthetic tensor once, then
//! compresses and decompresses it (into a warm buffer) repeatedly, printing GB/s of each run.
//! `THREADS=n [PAIRS=0] cargo run --release --example hotloop -- [bf16|fp32|fp16] [rows] [runs] [enc|dec|both] [cond=0|1|all]`
use std::time::Instant;

mod common;
use common::{condition_named, cpu, dtype_arg, num_arg, pairs_env, threads_env};
use tensorzip::{sample, CompressOptions, CpuEngine};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dt = dtype_arg(&args);
    let rows = num_arg(&args, 2, 4096);
    let runs = num_arg(&args, 3, 5);
    let what = args.get(4).cloned().unwrap_or("both".into());
    let mut opts = CompressOptions::default();
    if let Some(c) = args.get(5) {
        opts.condition = condition_named(c.strip_prefix("cond=").unwrap_or_default());
    }
    opts.pair_exponents = pairs_env();
    let data = sample::weights(rows, 4096, dt, 7);
    let eng = CpuEngine::new(threads_env()).unwrap();
    let shape = [rows as u64, 4096];
    let mut blob = Vec::new();
    eng.compress_into(&data, dt, &shape, &opts, &mut blob)
        .unwrap();
    println!("ratio {:.4}", blob.len() as f64 / data.len() as f64);
    let mut out = vec![0u8; data.len()];
    let gb = data.len() as f64 / 1e9;
    for _ in 0..runs {
        if what != "dec" {
            let (t, c) = (Instant::now(), cpu());
            eng.compress_into(&data, dt, &shape, &opts, &mut blob)
                .unwrap();
            let (w, c) = (t.elapsed().as_secs_f64(), cpu() - c);
            println!("enc {:.3} GB/s (cpu time: {:.3} GB/s)", gb / w, gb / c);
        }
        if what != "enc" {
            let (t, c) = (Instant::now(), cpu());
            eng.decompress_into(&blob, &mut out).unwrap();
            let (w, c) = (t.elapsed().as_secs_f64(), cpu() - c);
            println!("dec {:.3} GB/s (cpu time: {:.3} GB/s)", gb / w, gb / c);
        }
    }
    assert!(what == "enc" || out == data);
}
