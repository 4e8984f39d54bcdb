//! Arbitrary bytes as a tensor: compressing never panics and its blob decodes back to exactly the
//! input, for every dtype and a spread of encoder options. The first four bytes choose the dtype
//! and the options (small blocks and chunks, so that short inputs still have many blocks and
//! chunks: the table search, the passthrough test, constant and conditioned planes and the
//! stash all meet odd data; bit 7 of the first byte asks for format version 2's paired
//! exponents); the rest, cut to whole elements, is the tensor. With bit 6 of the
//! fourth byte set, the tensor is also cut into three (at points the second and third bytes
//! choose) and the parts compressed as one run of the archive writer — a lead of small tensors
//! coded together, the rest one after the other (`compress_seq_into`, `compress_seq_to`) — whose
//! blobs must equal the parts' own.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorzip::{CompressOptions, Condition, DType};

#[path = "one_engine.rs"]
mod one_engine;
use one_engine::engine;

fuzz_target!(|data: &[u8]| {
    let [d, b, c, t, rest @ ..] = data else {
        return;
    };
    let dtype = DType::ALL[*d as usize % DType::ALL.len()];
    let opts = CompressOptions {
        block_units: 32 << (*b % 4),
        sample_blocks: 1 + (*b as usize >> 2) % 48,
        chunk_bytes: 8 * (1 + *c as usize % 128),
        // Off, or the default, or every dtype the format allows (fp16's conditioned plane).
        condition: match (*c & 0x80, *t & 0x80) {
            (0x80, _) => Condition::Off,
            (_, 0) => Condition::Auto,
            _ => Condition::All,
        },
        max_tables: 1 + (*t as usize % 8),
        passthrough_threshold: [0.95, 1.0, 0.6, 0.99][(*t as usize >> 3) % 4],
        min_compress_bytes: [0, 1024][(*t as usize >> 5) % 2],
        // Format version 2's paired exponents (bf16 only; other dtypes ignore it).
        pair_exponents: *d & 0x80 != 0,
    };
    let isz = dtype.itemsize();
    let n = rest.len() / isz;
    let tensor = &rest[..n * isz];
    let shape = [n as u64];
    let blob = engine()
        .compress(tensor, dtype, &shape, &opts)
        .expect("valid options and whole elements compress");
    let back = engine().decompress(&blob).expect("our own blob decodes");
    assert_eq!(back.dtype, dtype);
    assert_eq!(back.shape, shape);
    assert!(
        back.data == tensor,
        "round trip differs ({dtype:?}, {n} elements)"
    );
    if *t & 0x40 != 0 {
        sequence(tensor, dtype, n, (*b as usize, *c as usize), &opts);
    }
});

/// The parts of `tensor` (`n` elements) cut at two points, compressed as a run with a lead of
/// `b % 5` parts (4: more than there are, an error), in memory and streamed: each blob equals the
/// part's own `compress`.
fn sequence(tensor: &[u8], dtype: DType, n: usize, (b, c): (usize, usize), opts: &CompressOptions) {
    let isz = dtype.itemsize();
    let (x, y) = (b * n / 255, c * n / 255);
    let (x, y) = (x.min(y), x.max(y));
    let parts = [
        &tensor[..x * isz],
        &tensor[x * isz..y * isz],
        &tensor[y * isz..],
    ];
    let shapes: Vec<[u64; 1]> = parts.iter().map(|p| [(p.len() / isz) as u64]).collect();
    let items: Vec<(&[u8], DType, &[u64])> = parts
        .iter()
        .zip(&shapes)
        .map(|(p, s)| (*p, dtype, &s[..]))
        .collect();
    let alone: Vec<Vec<u8>> = items
        .iter()
        .map(|&(p, d, s)| engine().compress(p, d, s, opts).expect("a part compresses"))
        .collect();
    let lead = b % 5;
    let mut outs = vec![Vec::new(); 3];
    let seq = engine().compress_seq_into(&items, lead, opts, &mut outs);
    if lead > 3 {
        assert!(seq.is_err(), "a lead longer than the run");
        return;
    }
    seq.expect("the parts compress in sequence");
    assert!(outs == alone, "in-memory sequence differs (lead {lead})");
    let mut w = std::io::Cursor::new(Vec::new());
    let done = engine()
        .compress_seq_to(&items, lead, opts, &mut w, &|_, _| {})
        .expect("the parts stream in sequence");
    // Each blob's length, and the CRC-32 of each part's bytes (taken batch by batch as coded).
    assert_eq!(
        done,
        alone
            .iter()
            .zip(&items)
            .map(|(a, i)| (a.len() as u64, tensorzip::checksum::crc32(i.0)))
            .collect::<Vec<_>>()
    );
    // A stored blob is written over a longer coded attempt, which may leave bytes past the last
    // blob (the archive writer truncates its file): the blobs are the prefix.
    let want = alone.concat();
    let got = w.into_inner();
    assert!(
        got.len() >= want.len() && got[..want.len()] == want[..],
        "streamed sequence differs (lead {lead})"
    );
}
