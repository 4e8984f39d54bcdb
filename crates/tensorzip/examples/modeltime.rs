//! Development probe for the encoder's model (the table search the GPU engine waits for): counts
//! the sampled blocks of one synthetic tensor once, then times `model_from_counts` on those counts,
//! printing the median and a digest of the tables (which must not change when the search gets
//! faster). With `tensors` > 1, that many models are built at once (rayon, as the GPU engine does
//! for the tensors of a batch). (A per-plane timing of `cluster` was taken out: called directly in
//! a pool job it took ~3x as long (6 ms for the bf16 exponent plane on the CPU VM) as wrapped in
//! `rayon::join` (1.4-2.5 ms) or inside `model_from_counts`; rayon's nested parallel loops behave
//! differently at the top of a job. The whole-model figure is what the engines see.)
//! `THREADS=n [COLD=1] [IDLE_MS=n] cargo run --release --example modeltime -- [bf16|fp32|fp16] [rows] [runs] [tensors]`
use std::time::Instant;

use rayon::prelude::*;

use tensorzip::blob::{BlobHeader, Scheme};
use tensorzip::joint::JointCounts;
use tensorzip::model::{histogram, model_from_counts, Sampling};
mod common;
use common::{dtype_arg, num_arg, threads_env};
use tensorzip::{sample, transform, CompressOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dt = dtype_arg(&args);
    let rows = num_arg(&args, 2, 8192);
    let runs = num_arg(&args, 3, 15);
    let n_tensors = num_arg(&args, 4, 1);
    let threads = threads_env();
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .unwrap();
    let cols = 8192;
    let data = sample::weights(rows, cols, dt, 7);
    let opts = CompressOptions::default();
    let us = dt.unit_size();
    let header = BlobHeader {
        scheme: Scheme::Planes,
        dtype: dt,
        shape: vec![rows as u64, cols as u64],
        chunk_units: (opts.chunk_bytes / us) as u32,
        block_units: opts.block_units,
    };
    let sampling = Sampling::new(&header, &opts);
    let bu = sampling.block_units as usize;
    let mut hists = Vec::new();
    let mut joint = vec![0u32; 65536];
    let cond = dt.conditioned_plane();
    let mut scratch = vec![0u8; bu * us];
    for &g in &sampling.picks {
        let r = sampling.block_range(g);
        let len = (r.end - r.start) as usize;
        let src = &data[r.start as usize * us..r.end as usize * us];
        let mut views: Vec<&mut [u8]> = scratch.chunks_mut(bu).map(|p| &mut p[..len]).collect();
        transform::split(dt.transform(), src, &mut views);
        for p in 0..us {
            let mut h = [0u32; 256];
            histogram(&scratch[p * bu..p * bu + len], &mut h);
            hists.push(h);
        }
        if let Some((p, q)) = cond {
            let (mp, eq) = (
                &scratch[p * bu..p * bu + len],
                &scratch[q * bu..q * bu + len],
            );
            if mp.iter().any(|&m| m != mp[0]) {
                for (&e, &m) in eq.iter().zip(mp) {
                    joint[(e as usize) << 8 | m as usize] += 1;
                }
            }
        }
    }
    let mut times = Vec::new();
    let mut digest = 0u32;
    // The GPU encoder's search runs on counts just downloaded and after the host waited for the
    // GPU: `COLD=1` overwrites 256 MiB before each run (the counts and the search's working set
    // leave the caches), `IDLE_MS=n` sleeps n ms before each run (the pool's threads park).
    let cold = std::env::var_os("COLD").is_some_and(|v| v != "0");
    let idle_ms: u64 = std::env::var("IDLE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut evict = if cold {
        vec![0u8; 256 << 20]
    } else {
        Vec::new()
    };
    for run in 0..runs {
        if cold {
            evict.fill(run as u8);
            std::hint::black_box(&evict);
        }
        if idle_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(idle_ms));
        }
        let t = Instant::now();
        let mut models: Vec<_> = (0..n_tensors)
            .into_par_iter()
            .map(|_| {
                model_from_counts(&header, &opts, &sampling, &hists, |_, _| {
                    JointCounts::from_dense(&joint)
                })
            })
            .collect();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        let model = models.swap_remove(0);
        let mut out = Vec::new();
        model.write_tables(&mut out);
        digest = tensorzip::crc32(&out);
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{dt:?} {rows}x{cols} x{n_tensors} threads {threads}: model_from_counts median {:.3} ms (min {:.3}), tables crc {digest:08x}",
        times[times.len() / 2],
        times[0]
    );
}
