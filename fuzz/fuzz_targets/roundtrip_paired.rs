//! Format version 2 (paired bf16 exponents, FORMAT.md section 12) under the fuzzer: a bf16 tensor
//! large enough to pair, shaped by the input, compressed with paired exponents and decoded back
//! bit for bit, whole and as a range of elements.
//!
//! Why a target of its own: `roundtrip` takes its tensor from the input's bytes, and at its
//! `-max_len` (32,768 bytes: at most 16,382 bf16 units) a tensor is too small for the pair model
//! to pay for its tables, so that target's tensors do not pair (FUZZING.md). Here the input
//! describes the tensor instead of being it:
//! * byte 0: the tensor's length (40,000–133,000 units, odd counts among them) and whether the
//!   conditioned plane is on;
//! * byte 1: the block size (64–4096 units), the chunk size (1–128 KiB), 1, 3, 5 or 7 tables;
//! * byte 2: the exponents' base and how far a row's exponents may shift (rows of 384 units);
//! * the next 16 bytes: the weights of 16 exponents (base + 0..15) — a spread of the common and
//!   the rare, so that pairs escape and ranks run short;
//! * the rest: units written verbatim over the tensor at a place bytes 0–1 choose, so that the
//!   fuzzer plants NaNs, infinities, subnormals and stray exponents where it likes.
//!
//! Mantissas and signs come from the core's `sample::Rng` seeded by the input, so the same input
//! is the same tensor. Most inputs pair (183 of 304 random inputs in a probe, 2026-12-07); those
//! that do not still round-trip as version 1.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorzip::sample::Rng;
use tensorzip::{CompressOptions, Condition, DType};

#[path = "one_engine.rs"]
mod one_engine;
use one_engine::engine;

fuzz_target!(|data: &[u8]| {
    let [a, b, c, rest @ ..] = data else {
        return;
    };
    let (weights, planted) = rest.split_at(rest.len().min(16));
    let n = 40_000 + 3_001 * (*a as usize % 32);
    let opts = CompressOptions {
        block_units: 64 << (*b % 7),
        chunk_bytes: 1024 << ((*b as usize >> 3) % 8),
        max_tables: 1 + (*b as usize >> 6) * 2,
        condition: match *a & 0x80 {
            0 => Condition::Auto,
            _ => Condition::Off,
        },
        min_compress_bytes: 0,
        pair_exponents: true,
        ..CompressOptions::default()
    };
    // Cumulative weights of the 16 exponents (an input with no weight at all: exponent 0 alone);
    // each row of 384 units shifts its exponents up by 0 to 2 `drift`.
    let mut cum = [0u32; 16];
    let mut total = 0u32;
    for (i, w) in cum.iter_mut().enumerate() {
        // Halving from one exponent to the next, as a weight matrix's exponents fall off below
        // its scale (flat weights over 16 exponents have too many pairs to pair).
        total += weights
            .get(i)
            .map_or(u32::from(i == 0), |&w| u32::from(w) << (15 - i));
        *w = total;
    }
    if total == 0 {
        cum = [1; 16];
        total = 1;
    }
    let base = 96 + u16::from(*c % 32);
    let drift = u64::from(*c >> 5);
    let mut rng = Rng::new(u64::from_le_bytes([*a, *b, *c, 0, 0, 0, 0, 1]));
    let mut shift = 0u16;
    let mut tensor = Vec::with_capacity(2 * n);
    for i in 0..n {
        if i % 384 == 0 && drift != 0 {
            shift = (rng.next_u64() % (2 * drift + 1)) as u16;
        }
        let r = rng.next_u64();
        let pick = (r % u64::from(total)) as u32;
        let k = cum.iter().position(|&c| pick < c).unwrap_or(15) as u16;
        let e = (base + k + shift) & 0xFF;
        let unit = ((r >> 32) as u16 & 0x807F) | e << 7;
        tensor.extend_from_slice(&unit.to_le_bytes());
    }
    // The planted units, whole ones only, at an even offset inside the tensor.
    let planted = &planted[..planted.len().min(2 * n) & !1];
    let at = ((usize::from(*a) << 8 | usize::from(*b)) * 2 % (2 * n - planted.len() + 1)) & !1;
    tensor[at..at + planted.len()].copy_from_slice(planted);

    let shape = [n as u64];
    let blob = engine()
        .compress(&tensor, DType::BF16, &shape, &opts)
        .expect("valid options and whole elements compress");
    let back = engine().decompress(&blob).expect("our own blob decodes");
    assert_eq!(back.shape, shape);
    assert!(back.data == tensor, "round trip differs ({n} units)");
    // A range of elements decoded alone (its chunks only) equals the same slice.
    let (lo, hi) = {
        let x = (usize::from(*c) * n / 255) as u64;
        let y = (at / 2 + planted.len() / 2) as u64;
        (x.min(y), x.max(y))
    };
    let mut part = vec![0u8; 2 * (hi - lo) as usize];
    engine()
        .decompress_range_into(&blob, lo, hi, &mut part)
        .expect("a range of our own blob decodes");
    assert!(
        part == tensor[2 * lo as usize..2 * hi as usize],
        "range {lo}..{hi} of {n} units differs"
    );
});
