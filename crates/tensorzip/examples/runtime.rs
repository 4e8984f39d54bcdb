//! Development probe: where two threads lose against one in a warm compress of a file, run by run
//! (the runs `tensorzip compress` hands the engine: `archive::encode_runs`). Alternates one and
//! `THREADS` threads for `rounds` rounds and prints, per run, the median milliseconds of each and
//! their ratio, with the run's size and tensor count.
//! `THREADS=2 cargo run --release --example runtime -- FILE [rounds]`
use std::time::Instant;

mod common;
use common::{file_tensors, num_arg, threads_env};
use tensorzip::archive::{encode_runs, lead_len, BlobItem};
use tensorzip::encoder::TensorEncoder;
use tensorzip::{CompressOptions, CpuEngine};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bytes = std::fs::read(&args[1]).expect("read the file");
    let rounds = num_arg(&args, 2, 9);
    let tensors = file_tensors(&bytes);
    let items: Vec<BlobItem<'_>> = tensors.iter().map(|(d, dt, s)| (*d, *dt, &s[..])).collect();
    let lens: Vec<u64> = items.iter().map(|i| i.0.len() as u64).collect();
    let runs = encode_runs(&lens);
    let opts = CompressOptions::default();
    let engines = [
        CpuEngine::new(1).unwrap(),
        CpuEngine::new(threads_env()).unwrap(),
    ];
    let mut outs: Vec<Vec<u8>> = items.iter().map(|i| vec![1u8; i.0.len() + 65536]).collect();
    // times[run][engine]
    let mut times = vec![[Vec::new(), Vec::new()]; runs.len()];
    for round in 0..rounds + 1 {
        for k in 0..2 {
            let e = (k + round) % 2;
            for (ri, r) in runs.iter().enumerate() {
                let t = Instant::now();
                engines[e]
                    .compress_seq_into(
                        &items[r.clone()],
                        lead_len(&lens, r),
                        &opts,
                        &mut outs[r.clone()],
                    )
                    .unwrap();
                if round > 0 {
                    times[ri][e].push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mut s1, mut sn) = (0.0, 0.0);
    for (ri, r) in runs.iter().enumerate() {
        let [a, b] = &mut times[ri];
        let (a, b) = (med(a), med(b));
        s1 += a;
        sn += b;
        let mb: u64 = lens[r.clone()].iter().sum();
        println!(
            "run {ri:2}: {:3} tensors ({} lead) {:6.1} MB  1T {a:7.2} ms  nT {b:7.2} ms  {:.2}x",
            r.len(),
            lead_len(&lens, r),
            mb as f64 / 1e6,
            a / b
        );
    }
    println!(
        "sum of medians: 1T {s1:.1} ms, nT {sn:.1} ms, {:.2}x",
        s1 / sn
    );
    // The largest tensor's model (pass 1) alone, on each engine.
    let big = (0..items.len()).max_by_key(|&i| lens[i]).unwrap();
    let (d, dt, shape) = items[big];
    let pools = [1, threads_env()].map(|n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    });
    let mut tm = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for k in 0..2 {
            let e = (k + round) % 2;
            let t = Instant::now();
            pools[e].install(|| TensorEncoder::new(d, dt, shape, &opts).unwrap());
            tm[e].push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let [a, b] = &mut tm;
    let (a, b) = (med(a), med(b));
    println!(
        "largest tensor's model: 1T {a:.2} ms, nT {b:.2} ms, {:.2}x",
        a / b
    );
}
