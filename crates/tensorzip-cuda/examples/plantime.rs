//! Development probe (runs without a GPU): time of the host side of a batch decode for a
//! safetensors file — parsing every blob's layout and building the launch plan.
//! `cargo run --release -p tensorzip-cuda --example plantime -- FILE [CHUNK_BYTES] [RUNS]` (5 runs by
//! default; more for a profile)
use std::time::Instant;

use tensorzip::blob::BlobLayout;
use tensorzip::{CompressOptions, CpuEngine, DType};
use tensorzip_cuda::plan::{Job, Plan};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bytes = std::fs::read(&args[1]).expect("read the file");
    let (_, list) = tensorzip::archive::safetensors_layout(&bytes).expect("a safetensors file");
    let opts = CompressOptions {
        chunk_bytes: args
            .get(2)
            .and_then(|v| v.parse().ok())
            .unwrap_or(CompressOptions::default().chunk_bytes),
        ..Default::default()
    };
    let cpu = CpuEngine::default();
    let blobs: Vec<Vec<u8>> = list
        .iter()
        .map(|t| {
            let dt = DType::from_safetensors_name(&t.dtype_name).expect("dtype");
            let data = &bytes[t.begin as usize..t.end as usize];
            cpu.compress(data, dt, &t.shape, &opts).expect("compress")
        })
        .collect();
    let runs = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(5);
    for _ in 0..runs {
        let t = Instant::now();
        let layouts: Vec<BlobLayout> = blobs
            .iter()
            .map(|b| BlobLayout::parse(b, b.len()).expect("parse"))
            .collect();
        let t_parse = t.elapsed();
        let mut off = 0u64;
        let jobs: Vec<Job<'_>> = layouts
            .iter()
            .zip(&blobs)
            .map(|(l, b)| {
                let j = Job {
                    layout: l,
                    data_offset: off,
                    out_offset: off,
                };
                off += b.len() as u64;
                j
            })
            .collect();
        let plan = Plan::new(&jobs).expect("plan");
        let chunks: usize = plan.groups.iter().map(|g| g.chunks.len()).sum();
        println!(
            "{} blobs, {chunks} chunks, {} tables: parse {:.1} us, plan {:.1} us",
            blobs.len(),
            plan.table_info.len(),
            t_parse.as_secs_f64() * 1e6,
            (t.elapsed() - t_parse).as_secs_f64() * 1e6
        );
    }
}
