//! Writes seed corpora of real blobs and archives for the fuzz targets:
//! `cargo run --release --example seeds -- corpus` fills `corpus/decode_blob/`,
//! `corpus/decode_archive/` and `corpus/compress_file/` (see `seeds.sh`). Everything is seeded, so the seeds are the same each run.

use std::path::{Path, PathBuf};

use tensorzip::archive::{plan_safetensors, serialize_safetensors, write_archive, ArchiveOptions};
use tensorzip::blob::BlobView;
use tensorzip::sample::{self, Rng};
use tensorzip::{CompressOptions, CpuEngine, DType};

fn bytes_of(dtype: DType, n: usize, kind: u32, seed: u64) -> Vec<u8> {
    let isz = dtype.itemsize();
    let mut r = Rng::new(seed);
    match kind {
        // Weights (floats) or skewed small values (everything else).
        0 => match dtype {
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => {
                sample::weights(1, n, dtype, seed)
            }
            DType::Complex64 => sample::weights(1, 2 * n, DType::F32, seed),
            _ => (0..n)
                .flat_map(|_| ((r.normal() * 6.0).round() as i64).to_le_bytes()[..isz].to_vec())
                .collect(),
        },
        // Constant.
        1 => vec![0x3C; n * isz],
        // Uniformly random.
        2 => (0..n * isz).map(|_| r.next_u64() as u8).collect(),
        // Blocks that alternate between constant, random and skewed.
        _ => (0..n * isz)
            .map(|i| match (i / 64) % 3 {
                0 => 7,
                1 => r.next_u64() as u8,
                _ => (r.normal().abs() * 3.0) as u8,
            })
            .collect(),
    }
}

/// The first `k` chunks of a rank-1 blob, with its shape shrunk to match: a small valid blob that
/// keeps the tables (and the coding modes) of a large one.
fn first_chunks(blob: &[u8], k: usize) -> Vec<u8> {
    let v = BlobView::parse(blob).unwrap();
    let h = &v.header;
    assert_eq!(h.shape.len(), 1);
    let e = h.dir_entry_len();
    let dir_start = v.overhead_len() - h.n_chunks() as usize * e;
    let mut out = blob[..dir_start + k * e].to_vec();
    for c in 0..k {
        out.extend_from_slice(v.payload(c));
    }
    let numel = (k as u64 * h.chunk_units as u64) / h.dtype.units_per_element() as u64;
    out[20..28].copy_from_slice(&numel.to_le_bytes());
    out
}

fn write(dir: &Path, name: &str, data: &[u8]) {
    std::fs::write(dir.join(name), data).unwrap();
}

fn main() {
    let root = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus".into()));
    let blobs = root.join("decode_blob");
    let archives = root.join("decode_archive");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::create_dir_all(&archives).unwrap();
    let eng = CpuEngine::new(1).unwrap();
    let opts = [
        CompressOptions {
            chunk_bytes: 1024,
            block_units: 64,
            min_compress_bytes: 0,
            ..Default::default()
        },
        CompressOptions {
            chunk_bytes: 256,
            block_units: 32,
            min_compress_bytes: 0,
            max_tables: 2,
            ..Default::default()
        },
        CompressOptions {
            chunk_bytes: 8,
            block_units: 32,
            min_compress_bytes: 0,
            ..Default::default()
        },
        CompressOptions {
            chunk_bytes: 4096,
            block_units: 1024,
            min_compress_bytes: 0,
            passthrough_threshold: 1.0,
            ..Default::default()
        },
    ];
    let mut count = 0;
    for (di, dtype) in DType::ALL.into_iter().enumerate() {
        for kind in 0..4u32 {
            let (o, n) = match (di + kind as usize) % 4 {
                0 => (0, 1500 / dtype.itemsize()),
                1 => (1, 700 / dtype.itemsize()),
                2 => (2, 40 / dtype.itemsize()),
                _ => (3, 3000 / dtype.itemsize()),
            };
            let data = bytes_of(dtype, n, kind, (di * 4 + kind as usize) as u64);
            let blob = eng.compress(&data, dtype, &[n as u64], &opts[o]).unwrap();
            write(&blobs, &format!("{}-{kind}", dtype.torch_name()), &blob);
            count += 1;
        }
    }
    // Format version 2: bf16 with paired exponents (escapes, an odd last block). The encoder
    // pairs a tensor only where its estimate of the paired plane, pair and rank tables included,
    // costs at most 1/32 more than the version 1 plane (FORMAT.md section 12, step 6); since the
    // pair model weighs pairs from each block's histogram (2026-12-06), that holds only for
    // tensors large enough to carry the tables: 60,001 units here (tables of seeds of 12,001 to
    // 20,000 units, as these were before, came out version 1 and `seeds.sh` failed). Two common
    // exponents, a rare one every 701 units (20 distinct bytes: 14 of them top bytes, the others
    // escaping), sign and mantissa bits from four values. Kept whole at 4096-byte chunks (27.5
    // KB, its last chunk and block odd), and as its first 3 and 7 chunks at 1024-byte chunks
    // (`first_chunks`: small blobs with the paired tables of a large one).
    let n = 60_001;
    let mut rng = Rng::new(40 + n as u64);
    let data: Vec<u8> = (0..n)
        .flat_map(|i| {
            let e = match i % 701 {
                0 => 30 + (i / 701 % 20) as u16,
                _ => 100 + (rng.next_u64() % 2) as u16,
            };
            let low = [0u16, 1, 0x40, 0x8000][(rng.next_u64() % 4) as usize];
            (e << 7 | low).to_le_bytes()
        })
        .collect();
    let mut k = 0;
    for (chunk_bytes, block_units, cuts) in [
        (4096, 256, &[None][..]),
        (1024, 64, &[Some(3), Some(7)][..]),
    ] {
        let paired = CompressOptions {
            chunk_bytes,
            block_units,
            min_compress_bytes: 0,
            max_tables: 2,
            pair_exponents: true,
            ..Default::default()
        };
        let whole = eng
            .compress(&data, DType::BF16, &[n as u64], &paired)
            .unwrap();
        assert_eq!(whole[4..6], [2, 0], "seed bf16-paired-{k} is version 2");
        for cut in cuts {
            let blob = match cut {
                Some(c) => first_chunks(&whole, *c),
                None => whole.clone(),
            };
            let back = eng.decompress(&blob).unwrap().data;
            assert!(
                back == data[..back.len()],
                "seed bf16-paired-{k} decodes to its units"
            );
            write(&blobs, &format!("bf16-paired-{k}"), &blob);
            count += 1;
            k += 1;
        }
    }
    // Odd shapes: empty, 0-d, rank 3.
    for (name, dtype, shape, data) in [
        ("empty", DType::F32, vec![3u64, 0], vec![]),
        ("scalar", DType::F64, vec![], 1.5f64.to_le_bytes().to_vec()),
        (
            "rank3",
            DType::BF16,
            vec![3, 5, 7],
            sample::weights(1, 105, DType::BF16, 9),
        ),
    ] {
        let blob = eng.compress(&data, dtype, &shape, &opts[0]).unwrap();
        write(&blobs, name, &blob);
        count += 1;
    }

    // Large float tensors code the byte below the exponent conditioned on the exponent; their first
    // chunks make small seeds with conditioned planes.
    for dtype in [
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::Complex64,
        DType::F16,
    ] {
        let n = 512_000 / dtype.itemsize();
        let data = bytes_of(dtype, n, 0, 77);
        let blob = eng.compress(&data, dtype, &[n as u64], &opts[0]).unwrap();
        let small = first_chunks(&blob, 2);
        assert_eq!(
            tensorzip::decompress(&small).unwrap().data,
            data[..2 * 1024]
        );
        write(&blobs, &format!("{}-cond", dtype.torch_name()), &small);
        count += 1;
    }

    // Archives: a small safetensors file with a few tensors, with and without checksum pieces.
    let w = sample::weights(8, 96, DType::BF16, 1);
    let f = bytes_of(DType::F32, 40, 0, 2);
    let ids: Vec<u8> = (0..16i64).flat_map(|i| i.to_le_bytes()).collect();
    let tensors: Vec<(&str, &str, &[u64], &[u8])> = vec![
        ("w", "BF16", &[8u64, 96][..], &w[..]),
        ("f", "F32", &[40u64][..], &f[..]),
        ("ids", "I64", &[16u64][..], &ids[..]),
        ("e", "F16", &[0u64][..], &[][..]),
    ];
    let meta = vec![("format".to_string(), "pt".to_string())];
    let file = serialize_safetensors(&tensors, Some(&meta)).unwrap();
    // The safetensors files themselves, for `compress_file` (its first byte picks the options).
    let inputs = root.join("compress_file");
    std::fs::create_dir_all(&inputs).unwrap();
    for (i, p) in [0u8, 0x47, 0x80, 0xc1].into_iter().enumerate() {
        write(
            &inputs,
            &format!("file-{i}"),
            &[&[p][..], &file[..]].concat(),
        );
        count += 1;
    }
    // One with a gap between tensors and trailing bytes (kept byte for byte by the archive).
    let mut gappy = file.clone();
    gappy.extend_from_slice(b"trailing bytes");
    write(&inputs, "file-trailing", &[&[3u8][..], &gappy[..]].concat());
    count += 1;
    let segs = plan_safetensors(&file).unwrap();
    for (i, piece) in [0u32, 256].into_iter().enumerate() {
        let tmp = std::env::temp_dir().join(format!("tensorzip-seed-{}-{i}", std::process::id()));
        let mut out = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .unwrap();
        let ao = ArchiveOptions {
            compress: opts[i].clone(),
            checksum_piece_bytes: piece,
        };
        write_archive(&eng, &file[..], &segs, &ao, &mut out, &|_| {}).unwrap();
        drop(out);
        let ar = std::fs::read(&tmp).unwrap();
        std::fs::remove_file(&tmp).unwrap();
        write(&archives, &format!("archive-{i}"), &ar);
        count += 1;
    }
    eprintln!("wrote {count} seeds under {}", root.display());
}
