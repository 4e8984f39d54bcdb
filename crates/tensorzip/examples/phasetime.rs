//! Development probe: single-thread CPU time of the encoder's two passes on a safetensors file —
//! the model (sampling, histograms, table search) and the chunk encoding — tensor by tensor,
//! warm (each pass repeated; the median of `runs` is reported).
//! `PHASE=model|encode` times (and runs) only that pass, for profiles of one; `PHASE=decode` codes
//! the file once and times only the decode of its blobs, tensor by tensor into warm buffers
//! (`CpuEngine::decompress_into`, as `tensorzip bench`'s warm decompress on one thread).
//! `THREADS=n [SAMPLE=blocks] [PAIRS=0] [PHASE=…] cargo run --release --example phasetime -- FILE [runs]` (`SAMPLE`
//! overrides `sample_blocks`, for A/B runs of the sampling).
use std::time::Instant;

mod common;
use common::{file_tensors, num_arg, pairs_env, threads_env};
use tensorzip::encoder::{with_scratch, TensorEncoder};
use tensorzip::CompressOptions;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bytes = std::fs::read(&args[1]).expect("read the file");
    let runs = num_arg(&args, 2, 5);
    let mut opts = CompressOptions::default();
    if let Some(n) = std::env::var("SAMPLE").ok().and_then(|v| v.parse().ok()) {
        opts.sample_blocks = n;
    }
    opts.pair_exponents = pairs_env();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads_env())
        .build()
        .unwrap();
    let items = file_tensors(&bytes);
    let total: usize = items.iter().map(|i| i.0.len()).sum();
    pool.install(|| {
        let (mut tm, mut te) = (Vec::new(), Vec::new());
        let mut payload = Vec::new();
        let phase = std::env::var("PHASE").unwrap_or_default();
        if phase == "decode" {
            decode_only(&items, &opts, runs, total);
            return;
        }
        let build = || -> Vec<TensorEncoder<'_>> {
            items
                .iter()
                .map(|(d, dt, s)| TensorEncoder::new(d, *dt, s, &opts).unwrap())
                .collect()
        };
        let kept = (phase == "encode").then(build);
        for _ in 0..runs {
            let t = Instant::now();
            let built = match kept {
                Some(_) => None,
                None => Some(build()),
            };
            let encs = kept.as_ref().or(built.as_ref()).unwrap();
            tm.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let mut n = 0usize;
            for e in encs.iter().filter(|_| phase != "model") {
                for c in 0..e.n_chunks() {
                    with_scratch(|s| e.encode_chunk(c, s, &mut payload));
                    n += payload.len();
                }
            }
            te.push(t.elapsed().as_secs_f64());
            std::hint::black_box(n);
        }
        tm.sort_by(f64::total_cmp);
        te.sort_by(f64::total_cmp);
        let (m, e) = (tm[runs / 2], te[runs / 2]);
        println!(
            "model {:.1} ms, encode {:.1} ms (serial over chunks): {:.3} GB/s together",
            m * 1e3,
            e * 1e3,
            total as f64 / (m + e) / 1e9
        );
    });
}

/// `PHASE=decode`: every tensor compressed once, then decoded `runs` times into warm buffers; the
/// median run's time.
fn decode_only(
    items: &[(&[u8], tensorzip::DType, Vec<u64>)],
    opts: &CompressOptions,
    runs: usize,
    total: usize,
) {
    let eng = tensorzip::CpuEngine::new(1).unwrap();
    let blobs: Vec<Vec<u8>> = items
        .iter()
        .map(|(d, dt, s)| eng.compress(d, *dt, s, opts).unwrap())
        .collect();
    let mut outs: Vec<Vec<u8>> = items.iter().map(|i| vec![0u8; i.0.len()]).collect();
    let mut td = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        for (b, o) in blobs.iter().zip(outs.iter_mut()) {
            eng.decompress_into(b, o).unwrap();
        }
        td.push(t.elapsed().as_secs_f64());
    }
    td.sort_by(f64::total_cmp);
    let d = td[runs / 2];
    println!(
        "decode {:.2} ms (tensor by tensor, one thread): {:.3} GB/s",
        d * 1e3,
        total as f64 / d / 1e9
    );
}
