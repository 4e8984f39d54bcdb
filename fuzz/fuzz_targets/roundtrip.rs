//! Arbitrary bytes as a tensor: compressing never panics and its blob decodes back to exactly the
//! input, for every dtype and a spread of encoder options. The first four bytes choose the dtype
//! and the options (small blocks and chunks, so that short inputs still have many blocks and
//! chunks: the table search, the passthrough test, constant and conditioned planes and the
//! stash all meet odd data); the rest, cut to whole elements, is the tensor.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tensorzip::{CompressOptions, CpuEngine, DType};

fn engine() -> &'static CpuEngine {
    static E: OnceLock<CpuEngine> = OnceLock::new();
    E.get_or_init(|| CpuEngine::new(1).expect("one thread"))
}

fuzz_target!(|data: &[u8]| {
    let [d, b, c, t, rest @ ..] = data else {
        return;
    };
    let dtype = DType::ALL[*d as usize % DType::ALL.len()];
    let opts = CompressOptions {
        block_units: 32 << (*b % 4),
        sample_blocks: 1 + (*b as usize >> 2) % 48,
        chunk_bytes: 8 * (1 + *c as usize % 128),
        condition: *c & 0x80 == 0,
        max_tables: 1 + (*t as usize % 8),
        passthrough_threshold: [0.95, 1.0, 0.6, 0.99][(*t as usize >> 3) % 4],
        min_compress_bytes: [0, 1024][(*t as usize >> 5) % 2],
        ..CompressOptions::default()
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
    assert!(back.data == tensor, "round trip differs ({dtype:?}, {n} elements)");
});
