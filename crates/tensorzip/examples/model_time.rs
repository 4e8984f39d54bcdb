use std::time::Instant;
use tensorzip::{model, sample, BlobHeader, CompressOptions, DType, Scheme};
fn main() {
    for dtype in [DType::BF16, DType::F32] {
        let rows = 1024;
        let data = sample::weights(rows, 8192, dtype, 1);
        let opts = CompressOptions::default();
        let us = dtype.unit_size();
        let h = BlobHeader {
            scheme: Scheme::Planes,
            dtype,
            shape: vec![rows as u64, 8192],
            chunk_units: (opts.chunk_bytes / us) as u32,
            block_units: opts.block_units,
        };
        for _ in 0..3 {
            let t = Instant::now();
            let m = model::build_model(&data, &h, &opts);
            println!(
                "{dtype}: {:.2} ms, tables {:?}",
                t.elapsed().as_secs_f64() * 1e3,
                m.planes
                    .iter()
                    .map(|p| (p.tables.len(), p.cond.is_some()))
                    .collect::<Vec<_>>()
            );
        }
    }
}
