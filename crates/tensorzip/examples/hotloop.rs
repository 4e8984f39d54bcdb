//! Development probe for the single-thread hot loops: codes one synthetic tensor once, then
//! compresses and decompresses it (into a warm buffer) repeatedly, printing GB/s of each run.
//! `THREADS=n cargo run --release --example hotloop -- [bf16|fp32|fp16] [rows] [runs] [enc|dec|both] [cond=0|1]`
use std::time::Instant;

mod common;
use common::cpu;
use tensorzip::{sample, CompressOptions, CpuEngine, DType};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dt = match args.get(1).map(String::as_str).unwrap_or("bf16") {
        "fp32" => DType::F32,
        "fp16" => DType::F16,
        _ => DType::BF16,
    };
    let rows: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let runs: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5);
    let what = args.get(4).cloned().unwrap_or("both".into());
    let mut opts = CompressOptions::default();
    if let Some(c) = args.get(5) {
        opts.condition = c != "cond=0";
    }
    let data = sample::weights(rows, 4096, dt, 7);
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let eng = CpuEngine::new(threads).unwrap();
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
