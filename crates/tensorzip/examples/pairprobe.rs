//! Development probe for a format revision (docs/DESIGN.md, "The speed targets this format does
//! not reach"): a file's exponent planes coded two units per symbol, with today's coder.
//!
//! The file's bf16 tensors (or, where it has none, its fp32 ones) of at least 64 KiB: the exponent
//! bytes are taken in pairs of adjacent units; the tensor's 128 most frequent pairs get ranks
//! 0..=127, every other pair the escape rank 128 and its two bytes in an escape list. The rank
//! plane (half as many bytes as the exponent plane) and the bytes below the exponents are each
//! compressed as a `u8` tensor by the engine as it is. Measured, one thread, warm buffers:
//!
//! * the engine's own blobs of the tensors, conditioned plane on (the default) and off;
//! * the exponent plane alone as a `u8` tensor, and the rank plane as one: their sizes, compress
//!   and decode times;
//! * a whole pair decode as three passes (the two `u8` decodes, then an expansion through the
//!   129-entry pair table that patches the escapes and writes the units; AVX-512 for bf16), which
//!   checks the scheme is lossless;
//! * estimates for a decoder that decodes ranks where today's decodes exponents and expands them
//!   in the merge it already does: the engine's time with the exponent plane's decode swapped for
//!   the rank plane's, and its blob size with the exponent plane's share swapped for the ranks,
//!   the pair table (3 bytes an entry) and the escapes (2 bytes each, stored).
//!
//! `cargo run --release --example pairprobe -- FILE.safetensors [runs]` (times: the median of
//! `runs`, default 7, the variants alternating within each run). `FILE` may be `synth-bf16` or
//! `synth-fp32`: `gpu_bench synth`'s 1 GiB of tensors, made here. With `PLANES_OUT=DIR` the probe
//! only writes the tensors, their exponent planes and their rank planes as three safetensors files
//! in `DIR`, which `scripts/gpu_run.sh pairs` times on the GPU.
use std::time::Instant;

mod common;
use common::{file_tensors, num_arg};
use tensorzip::{CompressOptions, Condition, CpuEngine, DType};

const TOP: usize = 128;
const ESCAPE: u8 = TOP as u8;

/// One tensor's pair-coded form.
struct Pairs {
    /// Rank per pair of units; `ESCAPE` for a pair outside the table.
    ranks: Vec<u8>,
    /// The exponent bytes of each rank: `e0 | e1 << 8`.
    table: [u16; TOP + 1],
    /// The escaped pairs in unit order, as `table`'s entries.
    escapes: Vec<u16>,
    /// The bytes below each unit's exponent (ZipNN's transform: sign, then mantissa bits).
    low: Vec<u8>,
}

/// ZipNN's transform of `data` (units of `w` = 2 or 4 bytes, an even number of them): each unit's
/// exponent byte, and the `w - 1` bytes below it (little-endian).
fn planes(data: &[u8], w: usize) -> (Vec<u8>, Vec<u8>) {
    let mut exp = Vec::with_capacity(data.len() / w);
    let mut low = Vec::with_capacity(data.len() / w * (w - 1));
    let bits = 8 * w as u32;
    for u in data.chunks_exact(w) {
        let mut b = [0u8; 4];
        b[..w].copy_from_slice(u);
        let u = u32::from_le_bytes(b);
        let sign = u >> (bits - 1);
        let t = ((u >> (bits - 9)) & 0xFF) << (bits - 8)
            | sign << (bits - 9)
            | (u & ((1 << (bits - 9)) - 1));
        exp.push((t >> (bits - 8)) as u8);
        low.extend_from_slice(&t.to_le_bytes()[..w - 1]);
    }
    (exp, low)
}

/// A unit back from its exponent byte and the bytes below it (the inverse of [`planes`]).
fn unit(e: u8, low: &[u8], out: &mut [u8]) {
    let w = low.len() + 1;
    let bits = 8 * w as u32;
    let mut b = [0u8; 4];
    b[..w - 1].copy_from_slice(low);
    let t = u32::from_le_bytes(b);
    let sign = (t >> (bits - 9)) & 1;
    let u = sign << (bits - 1) | (e as u32) << (bits - 9) | (t & ((1 << (bits - 9)) - 1));
    out.copy_from_slice(&u.to_le_bytes()[..w]);
}

fn pair_code(data: &[u8], w: usize) -> Pairs {
    let (exp, low) = planes(data, w);
    let mut counts = vec![0u32; 65536];
    for p in exp.chunks_exact(2) {
        counts[p[0] as usize | (p[1] as usize) << 8] += 1;
    }
    let mut order: Vec<usize> = (0..65536).filter(|&p| counts[p] > 0).collect();
    order.sort_by_key(|&p| (std::cmp::Reverse(counts[p]), p));
    let mut rank_of = vec![ESCAPE; 65536];
    let mut table = [0u16; TOP + 1];
    for (r, &p) in order.iter().take(TOP).enumerate() {
        rank_of[p] = r as u8;
        table[r] = p as u16;
    }
    let mut ranks = Vec::with_capacity(exp.len() / 2);
    let mut escapes = Vec::new();
    for p in exp.chunks_exact(2) {
        let pair = p[0] as usize | (p[1] as usize) << 8;
        let r = rank_of[pair];
        if r == ESCAPE {
            escapes.push(pair as u16);
        }
        ranks.push(r);
    }
    Pairs {
        ranks,
        table,
        escapes,
        low,
    }
}

/// The bf16 units back from decoded ranks and low bytes: the rank expansion, the escapes and the
/// inverse transform in one pass (AVX-512 where the CPU has VBMI, else scalar).
fn expand(p: &Pairs, ranks: &[u8], low: &[u8], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if low.len() == 2 * ranks.len()
        && std::is_x86_feature_detected!("avx512vbmi")
        && std::is_x86_feature_detected!("avx512bw")
    {
        // SAFETY: the features were detected; the function checks its slices' lengths.
        unsafe { expand_avx512(p, ranks, low, out) };
        return;
    }
    expand_scalar(p, ranks, low, out, 0, 0);
}

/// Pairs `from..` of [`expand`], the escapes from `esc` on (units of any width).
fn expand_scalar(p: &Pairs, ranks: &[u8], low: &[u8], out: &mut [u8], from: usize, esc: usize) {
    let w = out.len() / (2 * ranks.len());
    let mut esc = p.escapes[esc..].iter();
    for (i, &r) in ranks.iter().enumerate().skip(from) {
        let pair = match r {
            ESCAPE => *esc.next().expect("an escape per escape rank"),
            _ => p.table[r as usize],
        };
        for (h, e) in [pair as u8, (pair >> 8) as u8].into_iter().enumerate() {
            let u = 2 * i + h;
            unit(
                e,
                &low[u * (w - 1)..(u + 1) * (w - 1)],
                &mut out[u * w..(u + 1) * w],
            );
        }
    }
}

/// # Safety
/// AVX-512F, BW and VBMI required.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn expand_avx512(p: &Pairs, ranks: &[u8], low: &[u8], out: &mut [u8]) {
    use std::arch::x86_64::*;
    assert!(low.len() == 2 * ranks.len() && out.len() == 4 * ranks.len());
    // The table's 128 pairs as 16-bit words in four vectors (ranks 0-63, 64-127).
    let t = |k: usize| _mm512_loadu_si512(p.table[32 * k..].as_ptr() as *const _);
    let (t0, t1, t2, t3) = (t(0), t(1), t(2), t(3));
    let (mut i, mut esc) = (0, 0);
    while i + 32 <= ranks.len() {
        // SAFETY (the loads and stores): pairs i..i+32 are in bounds of `ranks`, their units'
        // low bytes (64 from 2i) of `low`, their output (128 bytes from 4i) of `out`.
        let r = _mm512_cvtepu8_epi16(_mm256_loadu_si256(ranks.as_ptr().add(i) as *const _));
        let escaped = _mm512_cmpeq_epi16_mask(r, _mm512_set1_epi16(ESCAPE as i16));
        let lo = _mm512_permutex2var_epi16(t0, r, t1);
        let hi = _mm512_permutex2var_epi16(t2, r, t3);
        let mut pairs =
            _mm512_mask_blend_epi16(_mm512_test_epi16_mask(r, _mm512_set1_epi16(64)), lo, hi);
        if escaped != 0 {
            let mut buf = [0u16; 32];
            _mm512_storeu_si512(buf.as_mut_ptr() as *mut _, pairs);
            for (j, b) in buf.iter_mut().enumerate() {
                if escaped >> j & 1 == 1 {
                    *b = p.escapes[esc];
                    esc += 1;
                }
            }
            pairs = _mm512_loadu_si512(buf.as_ptr() as *const _);
        }
        // 64 exponents (bytes of `pairs`, in unit order) and 64 low bytes: units as 16-bit words.
        let lows = _mm512_loadu_si512(low.as_ptr().add(2 * i) as *const _);
        for h in 0..2 {
            let e = _mm512_cvtepu8_epi16(match h {
                0 => _mm512_castsi512_si256(pairs),
                _ => _mm512_extracti64x4_epi64::<1>(pairs),
            });
            let l = _mm512_cvtepu8_epi16(match h {
                0 => _mm512_castsi512_si256(lows),
                _ => _mm512_extracti64x4_epi64::<1>(lows),
            });
            // sign (bit 7 of the low byte) to bit 15, the exponent to bits 7-14, mantissa 0-6:
            // (l | l << 8) & 0x807F | e << 7.
            let u = _mm512_ternarylogic_epi32::<0xEA>(
                _mm512_or_si512(l, _mm512_slli_epi16::<8>(l)),
                _mm512_set1_epi16(0x807Fu16 as i16),
                _mm512_slli_epi16::<7>(e),
            );
            _mm512_storeu_si512(out.as_mut_ptr().add(4 * i + 64 * h) as *mut _, u);
        }
        i += 32;
    }
    expand_scalar(p, ranks, low, out, i, esc);
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `gpu_bench synth`'s tensors (8192 x 8192, each row from its own seed), in safetensors layout.
fn synthetic(dt: DType, n: usize) -> Vec<u8> {
    use rayon::prelude::*;
    let mut tensors = Vec::new();
    for i in 0..n {
        let mut t = vec![0u8; 8192 * 8192 * dt.itemsize()];
        let seed = i as u64 + 1;
        t.par_chunks_mut(8192 * dt.itemsize())
            .enumerate()
            .for_each(|(r, row)| {
                let s = seed.wrapping_mul(1_000_003).wrapping_add(r as u64);
                row.copy_from_slice(&tensorzip::sample::weights(1, 8192, dt, s));
            });
        tensors.push((format!("t{i}"), t));
    }
    let st = match dt {
        DType::BF16 => safetensors::Dtype::BF16,
        _ => safetensors::Dtype::F32,
    };
    let views = tensors.iter().map(|(name, t)| {
        let v = safetensors::tensor::TensorView::new(st, vec![8192, 8192], t).unwrap();
        (name.clone(), v)
    });
    safetensors::tensor::serialize(views, None).unwrap()
}

/// `PLANES_OUT=DIR`: writes the tensors as they are (`DIR/full.safetensors`), their exponent
/// planes (`DIR/exp.safetensors`) and their rank planes (`DIR/ranks.safetensors`), as `u8`
/// tensors of one dimension, for `gpu_bench file` to time the GPU decoder on each.
fn write_planes(dir: &str, bytes: &[u8]) {
    let mut exps = Vec::new();
    let mut ranks = Vec::new();
    let mut full = Vec::new();
    for (name, (data, dt, shape)) in file_tensors(bytes).into_iter().enumerate() {
        let w = dt.itemsize();
        if !matches!(dt, DType::BF16 | DType::F32) || data.len() % (2 * w) != 0 {
            continue;
        }
        exps.push((format!("t{name}"), planes(data, w).0));
        ranks.push((format!("t{name}"), pair_code(data, w).ranks));
        full.push((format!("t{name}"), dt, shape, data));
    }
    let u8s = |list: &[(String, Vec<u8>)], file: &str| {
        let views = list.iter().map(|(n, b)| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![b.len()], b)
                .unwrap();
            (n.clone(), v)
        });
        safetensors::tensor::serialize_to_file(views, None, format!("{dir}/{file}").as_ref())
            .unwrap();
    };
    u8s(&exps, "exp.safetensors");
    u8s(&ranks, "ranks.safetensors");
    let views = full.iter().map(|(n, dt, shape, b)| {
        let st = match dt {
            DType::BF16 => safetensors::Dtype::BF16,
            _ => safetensors::Dtype::F32,
        };
        let shape = shape.iter().map(|&d| d as usize).collect();
        (
            n.clone(),
            safetensors::tensor::TensorView::new(st, shape, b).unwrap(),
        )
    });
    safetensors::tensor::serialize_to_file(views, None, format!("{dir}/full.safetensors").as_ref())
        .unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bytes = match args[1].as_str() {
        "synth-bf16" => synthetic(DType::BF16, 8),
        "synth-fp32" => synthetic(DType::F32, 4),
        path => std::fs::read(path).expect("read the file"),
    };
    if let Ok(dir) = std::env::var("PLANES_OUT") {
        write_planes(&dir, &bytes);
        return;
    }
    let runs = num_arg(&args, 2, 7);
    let eng = CpuEngine::new(1).unwrap();
    let (on, off) = (
        CompressOptions::default(),
        CompressOptions {
            condition: Condition::Off,
            ..CompressOptions::default()
        },
    );
    struct T<'a> {
        data: &'a [u8],
        pairs: Pairs,
        blobs: [Vec<u8>; 5], // bf16 cond on, bf16 cond off, ranks, low bytes, exponents
        bufs: [Vec<u8>; 4],  // output, ranks, low bytes, exponents
        exp: Vec<u8>,
    }
    let mut ts = Vec::new();
    let tensors = file_tensors(&bytes);
    let dt = match tensors.iter().any(|t| t.1 == DType::BF16) {
        true => DType::BF16,
        false => DType::F32,
    };
    let w = dt.itemsize();
    for (data, _, shape) in tensors.into_iter().filter(|t| t.1 == dt) {
        if data.len() < 65536 || data.len() % (2 * w) != 0 {
            continue;
        }
        let pairs = pair_code(data, w);
        let mut blobs: [Vec<u8>; 5] = Default::default();
        eng.compress_into(data, dt, &shape, &on, &mut blobs[0])
            .unwrap();
        eng.compress_into(data, dt, &shape, &off, &mut blobs[1])
            .unwrap();
        let n = pairs.ranks.len() as u64;
        eng.compress_into(&pairs.ranks, DType::U8, &[n], &off, &mut blobs[2])
            .unwrap();
        let low = pairs.low.len() as u64;
        eng.compress_into(&pairs.low, DType::U8, &[low], &off, &mut blobs[3])
            .unwrap();
        let exp = planes(data, w).0;
        eng.compress_into(&exp, DType::U8, &[2 * n], &off, &mut blobs[4])
            .unwrap();
        let bufs = [
            vec![0u8; data.len()],
            vec![0u8; n as usize],
            vec![0u8; low as usize],
            vec![0u8; 2 * n as usize],
        ];
        ts.push(T {
            data,
            pairs,
            blobs,
            exp,
            bufs,
        });
    }
    let orig: usize = ts.iter().map(|t| t.data.len()).sum();
    let size = |k: usize| ts.iter().map(|t| t.blobs[k].len()).sum::<usize>();
    let rank_size = size(2)
        + size(3)
        + ts.iter()
            .map(|t| 3 * TOP + 2 * t.pairs.escapes.len())
            .sum::<usize>();
    let escapes: usize = ts.iter().map(|t| t.pairs.escapes.len()).sum();
    println!(
        "{} {dt:?} tensors, {:.1} MiB; escapes {:.3}% of pairs",
        ts.len(),
        orig as f64 / 1048576.0,
        100.0 * escapes as f64 / (orig / (2 * w)) as f64
    );
    let pct = |b: usize| 100.0 * b as f64 / orig as f64;
    println!(
        "ratio: {dt:?} conditioned {:.3}%, not {:.3}%, pairs {:.3}% (ranks {:.3} + low bytes as one u8 plane {:.3} + tables/escapes {:.3}; the exponent plane alone {:.3})",
        pct(size(0)),
        pct(size(1)),
        pct(rank_size),
        pct(size(2)),
        pct(size(3)),
        pct(rank_size - size(2) - size(3)),
        pct(size(4))
    );
    // The engine's blobs with the exponent plane's share swapped for the ranks, their table and
    // escapes (as a format revision would code them; the conditioned plane unchanged).
    let swap = rank_size - size(3) - size(4);
    println!(
        "ratio estimate, pairs in the engine's blob: conditioned {:.3}%, not {:.3}%",
        pct(size(0) + swap),
        pct(size(1) + swap)
    );
    // Compress, warm: the engine's blob, and its exponent plane against the ranks as u8 tensors
    // (the ranks' own making, a lookup per pair, not counted: this probe's is scalar).
    let mut comp: [Vec<f64>; 3] = Default::default();
    let mut scratch = Vec::new();
    for _ in 0..runs {
        for (v, cv) in comp.iter_mut().enumerate() {
            let mut total = 0.0;
            for t in &ts {
                let (src, cdt, shape) = match v {
                    0 => (t.data, dt, vec![(t.data.len() / w) as u64]),
                    1 => (&t.exp[..], DType::U8, vec![t.exp.len() as u64]),
                    _ => (
                        &t.pairs.ranks[..],
                        DType::U8,
                        vec![t.pairs.ranks.len() as u64],
                    ),
                };
                let a = Instant::now();
                eng.compress_into(src, cdt, &shape, &on, &mut scratch)
                    .unwrap();
                total += a.elapsed().as_secs_f64();
            }
            cv.push(total);
        }
    }
    let c: Vec<f64> = comp.iter_mut().map(|v| median(v)).collect();
    let gb = orig as f64 / 1e9;
    println!(
        "compress: engine {:.3} ms ({:.3} GB/s), its exponent plane alone {:.3} ms, the ranks {:.3} ms: estimate {:.3} GB/s",
        1e3 * c[0],
        gb / c[0],
        1e3 * c[1],
        1e3 * c[2],
        gb / (c[0] - c[1] + c[2])
    );
    // Per variant and run, the sum of the tensors' decode times (the checks outside them).
    let mut times: [Vec<f64>; 4] = Default::default();
    let mut parts: [Vec<f64>; 3] = Default::default();
    for _ in 0..runs {
        for (v, tv) in times.iter_mut().enumerate() {
            let (mut total, mut part) = (0.0, [0.0f64; 3]);
            for t in ts.iter_mut() {
                let [out, ranks, low, exp] = &mut t.bufs;
                let a = Instant::now();
                if v == 3 {
                    eng.decompress_into(&t.blobs[4], exp).unwrap();
                    total += a.elapsed().as_secs_f64();
                    continue;
                }
                if v < 2 {
                    eng.decompress_into(&t.blobs[v], out).unwrap();
                    total += a.elapsed().as_secs_f64();
                } else {
                    eng.decompress_into(&t.blobs[2], ranks).unwrap();
                    let b = Instant::now();
                    eng.decompress_into(&t.blobs[3], low).unwrap();
                    let c = Instant::now();
                    expand(&t.pairs, ranks, low, out);
                    let d = Instant::now();
                    part[0] += (b - a).as_secs_f64();
                    part[1] += (c - b).as_secs_f64();
                    part[2] += (d - c).as_secs_f64();
                    total += (d - a).as_secs_f64();
                }
                assert!(*out == t.data, "variant {v} decoded wrong");
            }
            tv.push(total);
            if v == 2 {
                for (k, p) in part.iter().enumerate() {
                    parts[k].push(*p);
                }
            }
        }
    }
    let names = [
        "engine, conditioned",
        "engine, not conditioned",
        "pairs",
        "exponent plane alone (u8)",
    ];
    for (k, name) in names.iter().enumerate() {
        let m = median(&mut times[k]);
        println!("{name}: {:.3} ms, {:.3} GB/s", 1e3 * m, gb / m);
    }
    let (r, l, e) = (
        median(&mut parts[0]),
        median(&mut parts[1]),
        median(&mut parts[2]),
    );
    println!(
        "pairs' parts: ranks {:.3} ms, low bytes {:.3} ms, expansion {:.3} ms",
        1e3 * r,
        1e3 * l,
        1e3 * e
    );
    // A fused decoder would decode a block's ranks where today's decodes its exponents and expand
    // them in the merge it already does: today's time with the exponent plane's decode swapped
    // for the rank plane's.
    let exp = median(&mut times[3]);
    for (k, name) in ["conditioned", "not conditioned"].iter().enumerate() {
        let fused = median(&mut times[k]) - exp + r;
        println!(
            "decode estimate, ranks in the engine's decoder, {name}: {:.3} ms, {:.3} GB/s",
            1e3 * fused,
            gb / fused
        );
    }
}
