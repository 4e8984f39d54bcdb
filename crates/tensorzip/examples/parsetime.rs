//! Times `BlobLayout::parse` (header, tables and directory) and `BlobLayout::needed_len` (header
//! and tables only) of one large blob's prefix: what a GPU decode's host side parses before it
//! plans (docs/BENCHMARKS.md, "The directory parsed in place").
//!
//! `cargo run --release --example parsetime -- [ROWS] [RUNS]`: a ROWS × 8192 bf16 tensor of
//! `sample::weights` (default 8192 rows, 128 MiB, 1024 chunks), RUNS rounds of 2000 parses.
use std::hint::black_box;
use std::time::Instant;

use tensorzip::blob::BlobLayout;
use tensorzip::{compress, sample, CompressOptions, DType};

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let rows = args.next().and_then(Result::ok).unwrap_or(8192);
    let runs = args.next().and_then(Result::ok).unwrap_or(5);
    let t = sample::weights(rows, 8192, DType::BF16, 1);
    let shape = [rows as u64, 8192];
    let blob = compress(&t, DType::BF16, &shape, &CompressOptions::default()).expect("compress");
    let layout = BlobLayout::parse(&blob, blob.len()).expect("parse");
    let pre = &blob[..layout.overhead_len()];
    println!(
        "blob of {} bytes: prefix {} bytes, {} chunks",
        blob.len(),
        pre.len(),
        layout.entries.len()
    );
    let n = 2000;
    for _ in 0..runs {
        let t0 = Instant::now();
        for _ in 0..n {
            black_box(BlobLayout::parse(black_box(pre), blob.len()).expect("parse"));
        }
        let parse = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
        let t0 = Instant::now();
        for _ in 0..n {
            black_box(BlobLayout::needed_len(black_box(pre), blob.len()).expect("head"));
        }
        let head = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
        println!("parse {parse:.1} us, of which header and tables ~{head:.1} us");
    }
}
