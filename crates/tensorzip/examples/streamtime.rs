//! Development probe for the streaming paths (`compress_to`, `decompress_to`): codes one synthetic
//! tensor of `rows` x 8192 and times both into warm in-memory writers, printing the sorted GB/s of
//! seven runs each (the first runs include fresh memory). The CLI's compress and decompress use
//! these paths; `hotloop` times the in-memory ones.
//! `THREADS=n cargo run --release --example streamtime -- [bf16|fp32|fp16] [rows]`
use std::io::Cursor;
use std::time::Instant;

mod common;
use common::{dtype_arg, num_arg, threads_env};
use tensorzip::{sample, CompressOptions, CpuEngine};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dt = dtype_arg(&args);
    let rows = num_arg(&args, 2, 8192);
    let data = sample::weights(rows, 8192, dt, 7);
    let shape = [rows as u64, 8192];
    let opts = CompressOptions::default();
    let eng = CpuEngine::new(threads_env()).unwrap();
    let blob = eng.compress(&data, dt, &shape, &opts).unwrap();
    let gbps = |t: Instant| data.len() as f64 / t.elapsed().as_secs_f64() / 1e9;
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v.iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut cur = Cursor::new(Vec::with_capacity(blob.len()));
    let mut comp = Vec::new();
    for _ in 0..7 {
        cur.set_position(0);
        let t = Instant::now();
        let n = eng
            .compress_to(&data, dt, &shape, &opts, &mut cur, &|_| {})
            .unwrap();
        comp.push(gbps(t));
        assert!(
            cur.get_ref()[..n as usize] == blob[..],
            "compress_to differs"
        );
    }
    let mut out = Vec::with_capacity(data.len());
    let mut dec = Vec::new();
    for _ in 0..7 {
        out.clear();
        let t = Instant::now();
        eng.decompress_to(&blob, &mut out, &|_| {}).unwrap();
        dec.push(gbps(t));
        assert!(out == data, "decompress_to differs");
    }
    println!(
        "{dt:?} {rows}x8192, {} threads: compress_to GB/s {}; decompress_to GB/s {}",
        eng.threads(),
        sorted(comp),
        sorted(dec)
    );
}
