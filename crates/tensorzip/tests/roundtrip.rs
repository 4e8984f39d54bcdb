//! Round trips are bit-exact for every dtype, shape and distribution, through every decoding entry
//! point (whole blob, caller buffer, streaming, single chunks, element ranges), and the bytes written do
//! not depend on the thread count.
//!
//! Sizes are small and the chunk size is 1 KiB (`common::small_opts`), so chunk, block and 32-lane
//! boundaries are crossed cheaply. The scalar rANS path runs on every short tail (the AVX2 path, where
//! the CPU has it, only while 64 bytes per segment remain), and every chunk is also decoded on its own
//! and compared, so both paths are checked against the original without `TENSORZIP_NO_SIMD`.

mod common;

use std::io::Cursor;
use std::sync::LazyLock;

use common::{boundary_counts, make, random_bytes, small_opts, Dist};
use proptest::prelude::*;
use tensorzip::blob::{peek_header, BlobView, PlaneMode, SEL_CONST, SEL_RAW};
use tensorzip::decoder::{DecodeScratch, TensorDecoder};
use tensorzip::sample::Rng;
use tensorzip::{crc32, CompressOptions, Condition, CpuEngine, DType, Error, Scheme};

static ONE: LazyLock<CpuEngine> = LazyLock::new(|| CpuEngine::new(1).unwrap());
static TWO: LazyLock<CpuEngine> = LazyLock::new(|| CpuEngine::new(2).unwrap());
/// Three threads: the in-memory compress codes a blob's chunks in three runs of unequal length
/// when the chunk count is not a multiple of three.
static THREE: LazyLock<CpuEngine> = LazyLock::new(|| CpuEngine::new(3).unwrap());

fn numel(shape: &[u64]) -> u64 {
    shape.iter().product()
}

/// Compresses `data` and checks every way of decoding it. Returns the blob.
fn check(data: &[u8], dtype: DType, shape: &[u64], opts: &CompressOptions, seed: u64) -> Vec<u8> {
    let ctx = format!("{dtype} shape {shape:?} opts {opts:?} seed {seed}");
    let isz = dtype.itemsize();
    assert_eq!(
        data.len() as u64,
        numel(shape) * isz as u64,
        "{ctx}: test data size"
    );

    // Same bytes on 1, 2 and 3 threads, all cores, and through the streaming writer.
    let blob = ONE
        .compress(data, dtype, shape, opts)
        .unwrap_or_else(|e| panic!("{ctx}: compress: {e}"));
    let blob2 = TWO.compress(data, dtype, shape, opts).unwrap();
    assert!(
        blob == blob2,
        "{ctx}: 1 and 2 threads wrote different blobs"
    );
    let blob3 = THREE.compress(data, dtype, shape, opts).unwrap();
    assert!(
        blob == blob3,
        "{ctx}: 1 and 3 threads wrote different blobs"
    );
    let blob_all = tensorzip::compress(data, dtype, shape, opts).unwrap();
    assert!(
        blob == blob_all,
        "{ctx}: all-core engine wrote a different blob"
    );
    let mut cur = Cursor::new(vec![0xEEu8; 3]); // the blob starts where the writer stands
    cur.set_position(3);
    let n = TWO
        .compress_to(data, dtype, shape, opts, &mut cur, &|_| {})
        .unwrap();
    let mut streamed = cur.into_inner();
    assert_eq!(
        &streamed[..3],
        &[0xEE; 3],
        "{ctx}: compress_to wrote before its start"
    );
    streamed.truncate(3 + n as usize);
    assert!(
        streamed[3..] == blob[..],
        "{ctx}: compress_to wrote a different blob ({} vs {} bytes)",
        n,
        blob.len()
    );

    // Header.
    let h = peek_header(&blob).unwrap();
    assert_eq!(h.dtype, dtype, "{ctx}");
    assert_eq!(h.shape, shape, "{ctx}");
    assert_eq!(h.nbytes(), data.len() as u64, "{ctx}");
    if h.scheme == Scheme::Stored {
        assert_eq!(
            blob.len(),
            h.encoded_len() + data.len(),
            "{ctx}: stored blob size"
        );
    } else {
        assert!(
            blob.len() < h.encoded_len() + data.len(),
            "{ctx}: coded blob not smaller than stored"
        );
    }

    // Whole-blob decoding, on 1 and 2 threads and all cores.
    for (name, t) in [
        ("1 thread", ONE.decompress(&blob)),
        ("2 threads", TWO.decompress(&blob)),
        ("all", tensorzip::decompress(&blob)),
    ] {
        let t = t.unwrap_or_else(|e| panic!("{ctx}: decompress ({name}): {e}"));
        assert_eq!(t.dtype, dtype, "{ctx}");
        assert_eq!(t.shape, shape, "{ctx}");
        assert!(
            t.data == data,
            "{ctx}: decompress ({name}) differs at byte {:?}",
            first_diff(&t.data, data)
        );
    }

    // Into a caller buffer (pre-filled with garbage), and wrong sizes.
    let mut out = vec![0xA5u8; data.len()];
    let hh = TWO.decompress_into(&blob, &mut out).unwrap();
    assert_eq!(hh, h, "{ctx}");
    assert!(
        out == data,
        "{ctx}: decompress_into differs at byte {:?}",
        first_diff(&out, data)
    );
    let mut out = vec![0x5Au8; data.len()];
    tensorzip::decompress_into(&blob, &mut out).unwrap();
    assert!(out == data, "{ctx}: decompress_into (all cores) differs");
    let mut big = vec![0u8; data.len() + 1];
    assert!(
        matches!(
            ONE.decompress_into(&blob, &mut big),
            Err(Error::OutputSize { .. })
        ),
        "{ctx}"
    );
    if !data.is_empty() {
        let mut small = vec![0u8; data.len() - 1];
        assert!(
            matches!(
                ONE.decompress_into(&blob, &mut small),
                Err(Error::OutputSize { .. })
            ),
            "{ctx}"
        );
    }

    // Streaming decoder: same bytes, CRC of the original.
    let mut w = Vec::new();
    let crc = TWO.decompress_to(&blob, &mut w, &|_| {}).unwrap();
    assert!(w == data, "{ctx}: decompress_to differs");
    assert_eq!(crc, crc32(data), "{ctx}: decompress_to CRC");

    // Every chunk on its own, in reverse order and with one scratch (no state leaks between chunks).
    let dec = TensorDecoder::new(&blob).unwrap();
    if h.scheme == Scheme::Planes {
        let cb = h.chunk_units as usize * h.planes();
        let n_chunks = h.n_chunks() as usize;
        assert_eq!(n_chunks, data.len().div_ceil(cb), "{ctx}: chunk count");
        let mut scratch = DecodeScratch::default();
        for c in (0..n_chunks).rev() {
            let want = &data[c * cb..((c + 1) * cb).min(data.len())];
            let mut got = vec![0xC3u8; want.len()];
            dec.decode_chunk(c, &mut got, &mut scratch)
                .unwrap_or_else(|e| panic!("{ctx}: chunk {c}: {e}"));
            assert!(
                got == want,
                "{ctx}: chunk {c} differs at byte {:?}",
                first_diff(&got, want)
            );
        }
    }

    // Element ranges: empty, whole, around every chunk boundary, and random ones.
    let ne = numel(shape);
    let mut ranges = vec![(0, 0), (0, ne), (ne, ne)];
    if h.scheme == Scheme::Planes {
        let per_chunk = (h.chunk_units as u64 * h.planes() as u64) / isz as u64;
        let n_bounds = (ne - 1) / per_chunk; // chunk boundaries strictly inside the tensor
        let step = n_bounds.div_ceil(6).max(1); // at most about half a dozen of them
        for k in (1..=n_bounds)
            .step_by(step as usize)
            .chain([n_bounds].into_iter().filter(|&k| k > 0))
        {
            let b = k * per_chunk;
            ranges.push((b - 1, b + 1));
            ranges.push((b, (b + per_chunk).min(ne)));
            ranges.push((b - 1, b));
            ranges.push((b - 1, ne));
        }
    }
    let mut rng = Rng::new(seed ^ 0x5EED);
    for _ in 0..8 {
        if ne == 0 {
            break;
        }
        let a = rng.next_u64() % (ne + 1);
        let b = rng.next_u64() % (ne + 1);
        ranges.push((a.min(b), a.max(b)));
    }
    for (s, e) in ranges {
        let want = &data[s as usize * isz..e as usize * isz];
        let mut got = vec![0x3Cu8; want.len()];
        let eng: &CpuEngine = if s % 2 == 0 { &ONE } else { &TWO };
        let hr = eng
            .decompress_range_into(&blob, s, e, &mut got)
            .unwrap_or_else(|err| panic!("{ctx}: range {s}..{e}: {err}"));
        assert_eq!(hr, h, "{ctx}");
        assert!(
            got == want,
            "{ctx}: range {s}..{e} differs at byte {:?}",
            first_diff(&got, want)
        );
    }
    let mut buf = vec![0u8; isz];
    assert!(
        matches!(
            ONE.decompress_range_into(&blob, ne, ne + 1, &mut buf),
            Err(Error::Range { .. })
        ),
        "{ctx}"
    );
    if ne >= 2 {
        let mut none: Vec<u8> = Vec::new();
        assert!(
            matches!(
                ONE.decompress_range_into(&blob, 2, 1, &mut none),
                Err(Error::Range { .. })
            ),
            "{ctx}"
        );
        let mut wrong = vec![0u8; isz + 1];
        assert!(
            matches!(
                ONE.decompress_range_into(&blob, 0, 1, &mut wrong),
                Err(Error::OutputSize { .. })
            ),
            "{ctx}"
        );
    }
    blob
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// Which plane modes and block selectors a blob uses (to show that the tests reach every decode path).
#[derive(Default, Debug, Clone, Copy)]
struct Coverage {
    stored: bool,
    planes: bool,
    raw_plane: bool,
    const_plane: bool,
    block_plane: bool,
    sel_table: bool,
    sel_raw: bool,
    sel_const: bool,
    rans: bool,
    multi_table: bool,
    /// A plane coded conditioned on the exponent plane.
    cond_plane: bool,
    /// A blob of format version 2 (a paired exponent plane).
    paired: bool,
}

impl Coverage {
    fn add(&mut self, blob: &[u8]) {
        let v = BlobView::parse(blob).unwrap();
        let h = v.header.clone();
        if h.scheme == Scheme::Stored {
            self.stored = true;
            return;
        }
        self.planes = true;
        self.multi_table |= v.tables.iter().any(|t| t.len() > 1);
        let bu = h.block_units as usize;
        for c in 0..h.n_chunks() as usize {
            let e = v.entry(c).unwrap();
            let nb = h.chunk_len(c as u64).div_ceil(bu);
            self.rans |= e.rans_len > 0;
            let mut cursor = 0;
            for p in 0..h.planes() {
                // (Not an exhaustive `match`: this keeps compiling if the format gains plane modes.)
                let m = e.modes[p];
                self.raw_plane |= m == PlaneMode::Raw;
                self.const_plane |= matches!(m, PlaneMode::Const(_));
                self.cond_plane |= m == PlaneMode::Cond;
                if m == PlaneMode::Blocks {
                    self.block_plane = true;
                    for &s in &v.payload(c)[cursor..cursor + nb] {
                        match s {
                            SEL_RAW => self.sel_raw = true,
                            SEL_CONST => self.sel_const = true,
                            _ => self.sel_table = true,
                        }
                    }
                    cursor += nb;
                }
            }
        }
    }
}

fn all_distributions_at_boundaries(dtype: DType) -> Coverage {
    let opts = small_opts();
    // Format version 2's paired exponent plane, for the dtypes that have one.
    let paired = CompressOptions {
        pair_exponents: true,
        ..small_opts()
    };
    let mut cov = Coverage::default();
    for (di, &dist) in Dist::ALL.iter().enumerate() {
        for (ci, &n) in boundary_counts(dtype).iter().enumerate() {
            let seed = (dtype.code() as u64) << 32 | (di as u64) << 16 | ci as u64;
            let data = make(dtype, n, dist, seed);
            if dtype.paired_plane().is_some() {
                let blob = check(&data, dtype, &[n as u64], &paired, seed);
                cov.paired |= blob.len() >= 6 && blob[4..6] == [2, 0];
            }
            let blob = check(&data, dtype, &[n as u64], &opts, seed);
            assert_eq!(
                blob[4..6],
                [1, 0],
                "{dtype} {dist:?} n={n}: version 1 by default"
            );
            cov.add(&blob);
            // Constant data of a few hundred bytes or more must actually be coded.
            if matches!(dist, Dist::Zero | Dist::Constant) && data.len() >= 256 {
                assert_eq!(
                    peek_header(&blob).unwrap().scheme,
                    Scheme::Planes,
                    "{dtype} {dist:?} n={n} was stored"
                );
            }
        }
    }
    // A 2-D and a 3-D view of a multi-chunk tensor.
    let n = 3 * 1024 / dtype.itemsize() + 7;
    let data = make(dtype, n * 3, Dist::Weights, 99);
    cov.add(&check(&data, dtype, &[3, n as u64], &opts, 1));
    cov.add(&check(&data, dtype, &[n as u64, 1, 3], &opts, 2));
    if dtype.paired_plane().is_some() {
        let blob = check(&data, dtype, &[3, n as u64], &paired, 3);
        cov.paired |= blob[4..6] == [2, 0];
        // A larger tensor in the default blocks, whose rank tables weigh less against its
        // exponent plane (step 6; a rank table has 3 + D bytes).
        let m = 16 * n;
        let data = make(dtype, m * 3, Dist::Weights, 98);
        let default_paired = CompressOptions {
            pair_exponents: true,
            ..CompressOptions::default()
        };
        let blob = check(&data, dtype, &[3, m as u64], &default_paired, 4);
        cov.paired |= blob[4..6] == [2, 0];
        assert!(cov.paired, "{dtype}: no blob paired its exponent plane");
    }
    assert!(cov.planes && cov.stored, "{dtype}: {cov:?}");
    assert!(cov.const_plane || cov.sel_const, "{dtype}: {cov:?}");
    cov
}

/// Format version 2 pairs a tensor only where that costs at most ~1/32 of its exponent plane
/// (FORMAT.md section 12, step 6): on bf16 data whose exponents scatter (each block its own
/// scale, or exponents spread over dozens of values) the paired blob stays within 4% of the
/// version 1 blob, while the per-block rule alone let such tensors grow by up to 30%. Every
/// blob round-trips.
#[test]
fn pairing_never_costs_much_size() {
    let mut rng = Rng::new(0x5eed);
    let mut worst = 0.0f64;
    for case in 0..48u64 {
        let n = 2000 + (rng.next_u64() % 6000) as usize;
        let block_units = [32u32, 64, 256][case as usize % 3];
        let spread = 8 + (rng.next_u64() % 56) as u32;
        let per_block = case % 2 == 0;
        let mut data = Vec::with_capacity(2 * n);
        let mut scale = 0u32;
        for i in 0..n {
            if i % block_units as usize == 0 || !per_block {
                scale = 64 + (rng.next_u64() % spread as u64) as u32;
            }
            let e = match per_block {
                true => scale + (rng.next_u64() % 3) as u32,
                false => scale,
            };
            let unit = ((e & 0xFF) << 7) as u16 | (rng.next_u64() & 0x807F) as u16;
            data.extend_from_slice(&unit.to_le_bytes());
        }
        let opts = CompressOptions {
            block_units,
            sample_blocks: 1 + (rng.next_u64() % 64) as usize,
            max_tables: [1, 8, 64][case as usize % 3],
            pair_exponents: false,
            ..CompressOptions::default()
        };
        let paired = CompressOptions {
            pair_exponents: true,
            ..opts.clone()
        };
        let v1 = check(&data, DType::BF16, &[n as u64], &opts, case);
        let v2 = check(&data, DType::BF16, &[n as u64], &paired, case);
        let grew = v2.len() as f64 / v1.len() as f64;
        worst = worst.max(grew);
        assert!(
            grew <= 1.04,
            "case {case}: n {n}, blocks of {block_units}, spread {spread}, per block {per_block}: \
             paired {} bytes against {} ({grew:.3})",
            v2.len(),
            v1.len()
        );
    }
    assert!(
        worst > 1.0,
        "no case paired at a cost: the test shows nothing"
    );
}

macro_rules! per_dtype {
    ($($name:ident: $dt:expr),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                all_distributions_at_boundaries($dt);
            }
        )*
        /// Keeps the per-dtype list in step with `DType::ALL`.
        #[test]
        fn per_dtype_tests_cover_every_dtype() {
            let listed = [$($dt),*];
            assert_eq!(listed.len(), DType::ALL.len());
            for d in DType::ALL {
                assert!(listed.contains(&d), "no round-trip test for {d}");
            }
        }
    };
}

per_dtype! {
    boundaries_bool: DType::Bool,
    boundaries_u8: DType::U8,
    boundaries_i8: DType::I8,
    boundaries_u16: DType::U16,
    boundaries_i16: DType::I16,
    boundaries_u32: DType::U32,
    boundaries_i32: DType::I32,
    boundaries_u64: DType::U64,
    boundaries_i64: DType::I64,
    boundaries_f16: DType::F16,
    boundaries_bf16: DType::BF16,
    boundaries_f32: DType::F32,
    boundaries_f64: DType::F64,
    boundaries_f8e4m3fn: DType::F8E4M3FN,
    boundaries_f8e5m2: DType::F8E5M2,
    boundaries_f8e4m3fnuz: DType::F8E4M3FNUZ,
    boundaries_f8e5m2fnuz: DType::F8E5M2FNUZ,
    boundaries_complex64: DType::Complex64,
}

/// The multi-byte float dtypes together reach every plane mode and selector kind.
#[test]
fn every_decode_path_is_reached() {
    let mut all = Coverage::default();
    let opts = small_opts();
    for dtype in [DType::BF16, DType::F32, DType::F16] {
        for dist in Dist::ALL {
            for n in [700usize, 1500] {
                let data = make(dtype, n, dist, n as u64);
                let blob = check(&data, dtype, &[n as u64], &opts, 3);
                let c = &mut all;
                c.add(&blob);
            }
        }
    }
    // A tensor whose blocks alternate between constant, random and weights: every selector kind.
    let mut data = Vec::new();
    for b in 0..48u64 {
        match b % 3 {
            0 => data.extend(std::iter::repeat_n(0x41u8, 128)),
            1 => data.extend(random_bytes(128, b)),
            _ => data.extend(common::weights(DType::BF16, 64, b)),
        }
    }
    let n = data.len() as u64 / 2;
    all.add(&check(&data, DType::BF16, &[n], &opts, 4));
    // Blocks from two unrelated skewed distributions: a plane with several tables.
    let mut rng = Rng::new(11);
    let mut data = Vec::new();
    for b in 0..64u64 {
        for _ in 0..64 {
            let v = (rng.normal().abs() * 3.0) as u8;
            data.push(if b % 2 == 0 {
                v
            } else {
                200u8.wrapping_sub(v.wrapping_mul(7))
            });
        }
    }
    let n = data.len() as u64;
    all.add(&check(&data, DType::U8, &[n], &opts, 5));
    let Coverage {
        stored,
        planes,
        raw_plane,
        const_plane,
        block_plane,
        sel_table,
        sel_raw,
        sel_const,
        rans,
        multi_table,
        ..
    } = all;
    assert!(
        stored
            && planes
            && raw_plane
            && const_plane
            && block_plane
            && sel_table
            && sel_raw
            && sel_const
            && rans
            && multi_table,
        "{all:?}"
    );
}

#[test]
fn odd_shapes_every_dtype() {
    let mut shapes: Vec<Vec<u64>> = vec![
        vec![],        // 0-d: one element
        vec![0],       // empty
        vec![3, 0, 5], // empty, rank 3
        vec![0, 0],
        vec![1],
        vec![1, 1, 1],
        vec![7, 13, 3], // 273 elements: not a multiple of 32
        vec![33, 1],
    ];
    shapes.push(vec![1; 64]); // the largest rank
    let mut r64 = vec![1u64; 64];
    r64[10] = 3;
    r64[63] = 45;
    shapes.push(r64);
    for dtype in DType::ALL {
        for shape in &shapes {
            let n = numel(shape) as usize;
            for (opts, dist) in [
                (small_opts(), Dist::Weights),
                (CompressOptions::default(), Dist::Weights),
                (small_opts(), Dist::Zero),
            ] {
                let data = make(dtype, n, dist, n as u64);
                let blob = check(&data, dtype, shape, &opts, 5);
                if n == 0 {
                    let t = tensorzip::decompress(&blob).unwrap();
                    assert!(t.data.is_empty());
                    assert_eq!(&t.shape, shape);
                }
            }
        }
    }
}

/// Default options (128 KiB chunks, 4096-unit blocks): long blocks keep the vectorised decoder busy.
#[test]
fn default_options_multi_chunk_identical_across_threads() {
    let opts = CompressOptions::default();
    let mut cov = Coverage::default();
    for (dtype, rows, cols) in [
        (DType::BF16, 160, 1000),
        (DType::F32, 70, 1001),
        (DType::F16, 129, 1024),
    ] {
        let data = common::weights(dtype, rows * cols, rows as u64);
        let blob = check(&data, dtype, &[rows as u64, cols as u64], &opts, 6);
        cov.add(&blob);
        let h = peek_header(&blob).unwrap();
        assert_eq!(h.scheme, Scheme::Planes);
        assert!(h.n_chunks() >= 2, "{dtype}: {} chunks", h.n_chunks());
        assert!(
            blob.len() < data.len() * 9 / 10,
            "{dtype}: {} -> {}",
            data.len(),
            blob.len()
        );
    }
    // Large float tensors code the byte below the exponent conditioned on the exponent.
    assert!(cov.cond_plane && cov.rans && cov.block_plane, "{cov:?}");
}

/// `compress_to` and `decompress_to` stream a tensor larger than their batches (half of
/// `STREAM_BATCH_BYTES` each, one written while the next is coded or decoded): the same bytes as
/// `compress` and the original, the right CRC, and progress that rises to the tensor's size.
#[test]
fn streaming_over_several_batches() {
    let opts = CompressOptions::default();
    let (rows, cols) = (2560usize, 8192usize); // 40 MiB of bf16: three batches
    assert!(rows * cols * 2 > tensorzip::engine::STREAM_BATCH_BYTES);
    let data = common::weights(DType::BF16, rows * cols, 11);
    let shape = [rows as u64, cols as u64];
    let blob = TWO.compress(&data, DType::BF16, &shape, &opts).unwrap();
    for eng in [&*ONE, &*TWO] {
        let seen = std::sync::Mutex::new(Vec::new());
        let mut cur = Cursor::new(Vec::new());
        let n = eng
            .compress_to(&data, DType::BF16, &shape, &opts, &mut cur, &|done| {
                seen.lock().unwrap().push(done)
            })
            .unwrap();
        let streamed = cur.into_inner();
        assert_eq!(n as usize, blob.len());
        assert!(streamed[..n as usize] == blob[..], "compress_to differs");
        let seen = seen.into_inner().unwrap();
        assert!(seen.len() >= 3, "progress reported {} times", seen.len());
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "progress {seen:?}");
        assert_eq!(seen.last().copied(), Some(data.len() as u64));

        let seen = std::sync::Mutex::new(Vec::new());
        let mut back = Vec::new();
        let crc = eng
            .decompress_to(&blob, &mut back, &|done| seen.lock().unwrap().push(done))
            .unwrap();
        assert!(back == data, "decompress_to differs");
        assert_eq!(crc, crc32(&data));
        let seen = seen.into_inner().unwrap();
        assert!(seen.len() >= 3, "progress reported {} times", seen.len());
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "progress {seen:?}");
        assert_eq!(seen.last().copied(), Some(data.len() as u64));
    }
}

/// A constant tensor costs its header, a few bytes of tables per plane and its directory: no payload.
#[test]
fn constant_tensors_cost_only_their_structure() {
    for dtype in DType::ALL {
        for dist in [Dist::Zero, Dist::Constant] {
            for opts in [
                small_opts(),
                CompressOptions {
                    min_compress_bytes: 0,
                    ..CompressOptions::default()
                },
            ] {
                let n = 4 * 1024 / dtype.itemsize() + 1; // five chunks under small_opts
                let data = make(dtype, n, dist, 12);
                let blob = check(&data, dtype, &[n as u64], &opts, 12);
                let v = BlobView::parse(&blob).unwrap();
                let h = &v.header;
                assert_eq!(h.scheme, Scheme::Planes, "{dtype} {dist:?}");
                let dir = h.n_chunks() as usize * h.dir_entry_len();
                let tables = v.overhead_len() - h.encoded_len() - dir;
                let payload = blob.len() - v.overhead_len();
                assert!(
                    payload == 0 && tables <= 16 * h.planes(),
                    "{dtype} {dist:?} chunk_bytes {}: {} bytes -> {} (header {}, tables {tables}, directory {dir}, payload {payload})",
                    opts.chunk_bytes,
                    data.len(),
                    blob.len(),
                    h.encoded_len()
                );
            }
        }
    }
}

/// Chunks so small that the header, tables and directory alone reach a stored blob's length: the
/// blob is stored (decided before any chunk is coded), the same through every writer; one size
/// up, where the directory leaves room, the blob is coded or stored by its real length.
#[test]
fn tiny_chunks_whose_directory_outweighs_the_data_are_stored() {
    for dtype in DType::ALL {
        for chunk_bytes in [8, 16, 64, 256] {
            let opts = CompressOptions {
                chunk_bytes,
                min_compress_bytes: 0,
                ..small_opts()
            };
            let n = 3000 / dtype.itemsize() + 1;
            let data = make(dtype, n, Dist::Weights, 21);
            let blob = check(&data, dtype, &[n as u64], &opts, 21);
            let h = peek_header(&blob).unwrap();
            let units = data.len() / dtype.unit_size();
            let chunks = units.div_ceil(chunk_bytes / dtype.unit_size());
            let dir = chunks * (8 + 2 * dtype.unit_size());
            let stored =
                data.len() + tensorzip::encoder::stored_header(dtype, &[n as u64]).encoded_len();
            if dir >= stored {
                assert_eq!(
                    h.scheme,
                    Scheme::Stored,
                    "{dtype} chunk_bytes {chunk_bytes}"
                );
            }
            assert!(blob.len() <= stored, "{dtype} chunk_bytes {chunk_bytes}");
            if chunk_bytes == 8 {
                assert!(dir >= stored, "{dtype}: the case is not exercised");
            }
        }
    }
}

/// A tensor whose size is below `min_compress_bytes` is stored; one just above is coded.
#[test]
fn min_compress_bytes_is_honoured() {
    let opts = CompressOptions {
        min_compress_bytes: 2048,
        ..small_opts()
    };
    let data = vec![0u8; 2046];
    let blob = check(&data, DType::BF16, &[1023], &opts, 7);
    assert_eq!(peek_header(&blob).unwrap().scheme, Scheme::Stored);
    let data = vec![0u8; 2048];
    let blob = check(&data, DType::BF16, &[1024], &opts, 8);
    assert_eq!(peek_header(&blob).unwrap().scheme, Scheme::Planes);
}

#[test]
fn invalid_inputs_and_options_are_rejected() {
    let data = vec![0u8; 64];
    let ok = small_opts();
    let bad_input =
        |r: tensorzip::Result<Vec<u8>>| assert!(matches!(r, Err(Error::InvalidInput(_))), "{r:?}");
    bad_input(tensorzip::compress(&data, DType::F32, &[15], &ok));
    bad_input(tensorzip::compress(&data, DType::F32, &[17], &ok));
    bad_input(tensorzip::compress(&data, DType::U8, &[u64::MAX, 2], &ok));
    bad_input(tensorzip::compress(&data, DType::U8, &[1 << 57], &ok));
    bad_input(tensorzip::compress(&[], DType::U8, &[1 << 63, 0], &ok));
    assert!(tensorzip::compress(&[], DType::U8, &[(1 << 63) - 1, 0], &ok).is_ok());
    bad_input(tensorzip::compress(&data[..1], DType::U8, &[1; 65], &ok));
    let bad_opt = |o: CompressOptions| {
        let r = tensorzip::compress(&data, DType::U8, &[64], &o);
        assert!(matches!(r, Err(Error::InvalidOption(_))), "{o:?}: {r:?}");
    };
    bad_opt(CompressOptions {
        chunk_bytes: 0,
        ..ok.clone()
    });
    bad_opt(CompressOptions {
        chunk_bytes: 1020,
        ..ok.clone()
    });
    bad_opt(CompressOptions {
        chunk_bytes: (16 << 20) + 8,
        ..ok.clone()
    });
    bad_opt(CompressOptions {
        block_units: 16,
        ..ok.clone()
    });
    bad_opt(CompressOptions {
        block_units: 96,
        ..ok.clone()
    });
    bad_opt(CompressOptions {
        block_units: 131072,
        ..ok.clone()
    });
    bad_opt(CompressOptions {
        passthrough_threshold: 0.0,
        ..ok.clone()
    });
    bad_opt(CompressOptions {
        passthrough_threshold: 1.01,
        ..ok.clone()
    });
    bad_opt(CompressOptions {
        passthrough_threshold: f64::NAN,
        ..ok.clone()
    });
    bad_opt(CompressOptions {
        max_tables: 0,
        ..ok.clone()
    });
    bad_opt(CompressOptions {
        max_tables: 65,
        ..ok.clone()
    });
    bad_opt(CompressOptions {
        sample_blocks: 0,
        ..ok.clone()
    });
    bad_opt(CompressOptions {
        sample_blocks: usize::MAX,
        ..ok.clone()
    });
    bad_opt(CompressOptions {
        sample_blocks: (1 << 16) + 1,
        block_units: 32,
        ..ok.clone()
    });
    // 2^16 blocks of 2^15 units: 2^31 sampled units.
    bad_opt(CompressOptions {
        sample_blocks: 1 << 16,
        block_units: 1 << 15,
        ..ok.clone()
    });
    for (sample_blocks, block_units) in [(1 << 16, 1 << 14), (1 << 14, 1 << 16)] {
        let o = CompressOptions {
            sample_blocks,
            block_units,
            ..ok.clone()
        };
        assert!(
            tensorzip::compress(&data, DType::U8, &[64], &o).is_ok(),
            "{o:?}"
        );
    }
}

/// Re-runs some of these tests in a child process with `TENSORZIP_NO_SIMD=1`, so the portable decoder
/// also decodes long blocks on CPUs that have AVX2.
#[test]
fn scalar_decoder_agrees() {
    if std::env::var_os("TENSORZIP_NO_SIMD").is_some() {
        return; // already the child
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .env("TENSORZIP_NO_SIMD", "1")
        .args([
            "--test-threads",
            "2",
            "boundaries_bf16",
            "boundaries_f32",
            "default_options_multi_chunk",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scalar run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("3 passed"),
        "expected 3 tests to run in the child:\n{stdout}"
    );
}

/// CRC-32 of the blobs of every dtype and distribution, with the default options (sampled blocks,
/// several tables) and the small ones (many chunks and blocks).
fn encoder_digest() -> u32 {
    let mut all = Vec::new();
    for (di, &dtype) in DType::ALL.iter().enumerate() {
        for (si, &dist) in Dist::ALL.iter().enumerate() {
            let seed = (di * 16 + si) as u64;
            for (opts, n) in [(CompressOptions::default(), 150_000), (small_opts(), 3_000)] {
                let data = make(dtype, n, dist, seed);
                let blob = ONE.compress(&data, dtype, &[n as u64], &opts).unwrap();
                all.extend_from_slice(&crc32(&blob).to_le_bytes());
            }
        }
    }
    crc32(&all)
}

/// The encoder's decisions are integer arithmetic specified in FORMAT.md, so its SIMD paths (the
/// table search's AVX2 build, the cost and histogram loops, the AVX2 / AVX-512 coders) must write
/// the bytes the portable code writes: this process's blobs against a child's with
/// `TENSORZIP_NO_SIMD=1`.
#[test]
fn scalar_and_simd_encoders_write_the_same_bytes() {
    const CHILD: &str = "TZ_TEST_ENCODER_DIGEST_CHILD";
    if std::env::var_os(CHILD).is_some() {
        println!("encoder digest {:08x}", encoder_digest());
        return;
    }
    if std::env::var_os("TENSORZIP_NO_SIMD").is_some() {
        return; // the scalar decoder's child run: nothing to compare against
    }
    let ours = encoder_digest();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .env("TENSORZIP_NO_SIMD", "1")
        .env(CHILD, "1")
        .args([
            "--exact",
            "scalar_and_simd_encoders_write_the_same_bytes",
            "--nocapture",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "scalar run failed:\n{stdout}");
    let theirs = stdout
        .lines()
        .find_map(|l| l.strip_prefix("encoder digest "))
        .and_then(|h| u32::from_str_radix(h.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no digest from the scalar run:\n{stdout}"));
    assert_eq!(
        ours, theirs,
        "SIMD and portable encoders wrote different blobs (digests {ours:08x} / {theirs:08x})"
    );
}

// ---- property-based ----

fn dtype_strategy() -> impl Strategy<Value = DType> {
    (0..DType::ALL.len()).prop_map(|i| DType::ALL[i])
}

fn dist_strategy() -> impl Strategy<Value = Dist> {
    (0..Dist::ALL.len()).prop_map(|i| Dist::ALL[i])
}

/// Shapes of rank 0..=3 with at most about 3000 elements (zeros included).
fn shape_strategy() -> impl Strategy<Value = Vec<u64>> {
    prop_oneof![
        Just(vec![]),
        (0u64..3000).prop_map(|n| vec![n]),
        (0u64..60, 0u64..60).prop_map(|(a, b)| vec![a, b]),
        (0u64..14, 0u64..14, 0u64..14).prop_map(|(a, b, c)| vec![a, b, c]),
    ]
}

fn opts_strategy() -> impl Strategy<Value = CompressOptions> {
    (
        1usize..=512,
        5u32..=10,
        1u32..=1000,
        1usize..=8,
        prop_oneof![Just(0usize), 0usize..4096],
        1usize..=64,
        prop_oneof![
            Just(Condition::Off),
            Just(Condition::Auto),
            Just(Condition::All)
        ],
        any::<bool>(),
    )
        .prop_map(
            |(c8, bu_log, thr, tables, min, samples, condition, pairs)| CompressOptions {
                chunk_bytes: 8 * c8,
                block_units: 1 << bu_log,
                passthrough_threshold: thr as f64 / 1000.0,
                max_tables: tables,
                min_compress_bytes: min,
                sample_blocks: samples,
                condition,
                pair_exponents: pairs,
            },
        )
}

/// 64 cases in the test suite; `PROPTEST_CASES=N` asks for a longer run (an explicit `cases` in
/// the config would otherwise override proptest's own reading of that variable).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn prop_round_trip(dtype in dtype_strategy(), shape in shape_strategy(), dist in dist_strategy(), opts in opts_strategy(), seed in any::<u64>()) {
        let n = numel(&shape) as usize;
        let data = make(dtype, n, dist, seed);
        check(&data, dtype, &shape, &opts, seed);
    }
}
