//! Development probe: time of one `decompress_into` of small fp32 tensors (1.5 KiB, 96 KiB,
//! 576 KiB) with a one-thread engine, median of 7 x 2000 calls — the fixed cost of a call, which a
//! model's small tensors pay each. `cargo run --release --example smallprobe`
use std::time::Instant;
use tensorzip::{sample, CompressOptions, CpuEngine, DType};
fn main() {
    let eng = CpuEngine::new(1).unwrap();
    for (rows, cols) in [(1usize, 384usize), (64, 384), (384, 384)] {
        let data = sample::weights(rows, cols, DType::F32, 3);
        let blob = eng
            .compress(
                &data,
                DType::F32,
                &[rows as u64, cols as u64],
                &CompressOptions::default(),
            )
            .unwrap();
        let mut out = vec![0u8; data.len()];
        let mut ts = Vec::new();
        for _ in 0..7 {
            let t = Instant::now();
            for _ in 0..2000 {
                eng.decompress_into(&blob, &mut out).unwrap();
            }
            ts.push(t.elapsed().as_secs_f64() / 2000.0 * 1e6);
        }
        ts.sort_by(f64::total_cmp);
        println!("{} bytes: {:.1} us per decompress_into", data.len(), ts[3]);
    }
}
