use std::time::Instant;
use tensorzip::{sample, CompressOptions, CpuEngine, DType};
fn main() {
    let n: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(384);
    let dt = DType::F32;
    let data = sample::weights(1, n, dt, 3);
    let e = CpuEngine::new(1).unwrap();
    let opts = CompressOptions::default();
    let mut out = Vec::new();
    let t0 = Instant::now();
    let iters = 5000;
    for _ in 0..iters { e.compress_into(&data, dt, &[n as u64], &opts, &mut out).unwrap(); }
    println!("{:.1} us per compress of {} bytes -> {}", t0.elapsed().as_secs_f64() * 1e6 / iters as f64, data.len(), out.len());
}
