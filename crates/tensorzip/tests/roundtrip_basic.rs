mod common;

use tensorzip::{compress, decompress, sample, CompressOptions, DType};

#[test]
fn bf16_weights_round_trip_and_compress() {
    let data = sample::weights(256, 1000, DType::BF16, 1);
    let blob = compress(
        &data,
        DType::BF16,
        &[256, 1000],
        &CompressOptions::default(),
    )
    .unwrap();
    let back = decompress(&blob).unwrap();
    assert_eq!(back.data, data);
    let ratio = blob.len() as f64 / data.len() as f64;
    assert!(ratio < 0.70, "ratio {ratio}");
}

#[test]
fn f32_weights_round_trip_and_compress() {
    let data = sample::weights(300, 777, DType::F32, 2);
    let blob = compress(&data, DType::F32, &[300, 777], &CompressOptions::default()).unwrap();
    let back = decompress(&blob).unwrap();
    assert_eq!(back.data, data);
    let ratio = blob.len() as f64 / data.len() as f64;
    assert!(ratio < 0.86, "ratio {ratio}");
}

/// Chunks decoded in pairs (their rANS streams in one loop, `decode_chunk_pair`) give what each
/// gives alone, on chunks large enough for the SIMD steps, with a shorter last chunk; and a stream
/// corrupted in one chunk of a pair fails the pair exactly when it fails that chunk alone.
#[test]
fn chunk_pairs_decode_as_single_chunks() {
    use tensorzip::decoder::TensorDecoder;
    let opts = CompressOptions {
        chunk_bytes: 32 * 1024,
        block_units: 1024,
        ..Default::default()
    };
    // bf16 whose second half has exponents 20 higher: its chunks code no unit of the
    // conditioned plane, so pairs meet blocks with and without a sub-segment.
    let mut shifted = sample::weights(90, 1000, DType::BF16, 6);
    let half = shifted.len() / 2;
    for u in shifted[half..].chunks_exact_mut(2) {
        let v = u16::from_le_bytes([u[0], u[1]]);
        let e = (v >> 7) & 0xFF;
        if e != 0 && e < 200 {
            u.copy_from_slice(&(v + (20 << 7)).to_le_bytes());
        }
    }
    for (dtype, cols, data) in [
        (DType::BF16, 1000, sample::weights(90, 1000, DType::BF16, 5)),
        (DType::BF16, 1000, shifted),
        (DType::F32, 777, sample::weights(90, 777, DType::F32, 5)),
        (DType::F16, 999, sample::weights(90, 999, DType::F16, 5)),
    ] {
        let blob = compress(&data, dtype, &[90, cols as u64], &opts).unwrap();
        let dec = TensorDecoder::new(&blob).unwrap();
        let h = dec.header();
        let n = h.n_chunks();
        assert!(
            n >= 3 && h.chunk_len(n - 1) < h.chunk_len(0),
            "{dtype}: {n} chunks"
        );
        assert_eq!(common::check_pairs(&dec), 0);
        assert_eq!(decompress(&blob).unwrap().data, data);
        // Corrupt bytes in the middle of the blob (a chunk's payload): pairs fail as singles do.
        let mut seed = 0x1234_5678u64;
        let mut failed = 0;
        for _ in 0..40 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let mut bad = blob.clone();
            let at = blob.len() / 4 + (seed >> 33) as usize % (blob.len() / 2);
            bad[at] ^= 1 << ((seed >> 20) % 8);
            if let Ok(dec) = TensorDecoder::new(&bad) {
                failed += common::check_pairs(&dec);
            }
        }
        assert!(failed > 0, "{dtype}: no corruption was detected");
    }
}

/// Tensors past `STREAMING_OUTPUT_BYTES` are written with non-temporal stores, or with ordinary
/// stores into lines the rANS steps prefetched (blocks with coded planes, on AVX2 and AVX-512
/// CPUs): the same bytes, for every unit size and transform those paths cover (coded and raw
/// blocks mixed), also at a shifted output buffer.
#[test]
fn large_tensors_written_past_the_caches_round_trip() {
    use tensorzip::decoder::STREAMING_OUTPUT_BYTES;
    use tensorzip::CpuEngine;
    for dtype in [DType::BF16, DType::F16, DType::F32, DType::I32, DType::U16] {
        let isz = dtype.itemsize() as u64;
        let cols = 4099u64;
        let rows = (STREAMING_OUTPUT_BYTES / isz).div_ceil(cols) + 1;
        let data: Vec<u8> = if matches!(dtype, DType::BF16 | DType::F16 | DType::F32) {
            sample::weights(rows as usize, cols as usize, dtype, 9)
        } else {
            (0..rows * cols * isz)
                .map(|i| ((i * 2_654_435_761) >> 7) as u8)
                .collect()
        };
        assert!(data.len() as u64 >= STREAMING_OUTPUT_BYTES);
        let blob = compress(&data, dtype, &[rows, cols], &CompressOptions::default()).unwrap();
        assert_eq!(decompress(&blob).unwrap().data, data, "{dtype}");
        let mut shifted = vec![0u8; data.len() + 3];
        CpuEngine::new(1)
            .unwrap()
            .decompress_into(&blob, &mut shifted[3..])
            .unwrap();
        assert!(shifted[3..] == data[..], "{dtype} at an odd address");
    }
}

#[test]
fn tensors_compressed_together_equal_tensors_compressed_alone() {
    use tensorzip::archive::{
        encode_runs, lead_len, small_runs, BlobItem, SMALL_BLOB_SLACK, SMALL_GROUP_BYTES,
        SMALL_SEGMENT_BYTES,
    };
    use tensorzip::CpuEngine;
    let eng = CpuEngine::new(2).unwrap();
    let opts = CompressOptions::default();
    let tensors: Vec<(Vec<u8>, DType, Vec<u64>)> = vec![
        (
            sample::weights(64, 300, DType::BF16, 3),
            DType::BF16,
            vec![64, 300],
        ),
        (vec![7u8; 12], DType::F32, vec![3]),
        (
            sample::weights(20, 1111, DType::F32, 4),
            DType::F32,
            vec![20, 1111],
        ),
        (Vec::new(), DType::F16, vec![0, 5]),
        (sample::weights(3, 5, DType::F16, 5), DType::F16, vec![15]),
    ];
    let items: Vec<BlobItem<'_>> = tensors
        .iter()
        .map(|(d, t, s)| (&d[..], *t, &s[..]))
        .collect();
    // Buffers holding other bytes first: each is replaced.
    let mut outs = vec![vec![0xAAu8; 100]; items.len()];
    eng.compress_many_into(&items, &opts, &mut outs).unwrap();
    for (out, (d, t, s)) in outs.iter().zip(&tensors) {
        assert!(*out == eng.compress(d, *t, s, &opts).unwrap());
        assert_eq!(decompress(out).unwrap().data, *d);
    }
    // As many buffers as tensors, or an error.
    assert!(eng
        .compress_many_into(&items, &opts, &mut outs[..4])
        .is_err());
    // Decompressed together, into new buffers and into the caller's.
    let blobs: Vec<&[u8]> = outs.iter().map(|b| &b[..]).collect();
    let back = eng.decompress_many(&blobs).unwrap();
    let mut into: Vec<Vec<u8>> = tensors.iter().map(|t| vec![0x55; t.0.len()]).collect();
    eng.decompress_many_into(&blobs, &mut into).unwrap();
    for ((b, i), (d, t, s)) in back.iter().zip(&into).zip(&tensors) {
        assert_eq!((&b.data, b.dtype, &b.shape), (d, *t, s));
        assert_eq!(i, d);
    }
    assert!(eng.decompress_many_into(&blobs[1..], &mut into).is_err());
    // A buffer of the wrong size, or a damaged blob: an error, not a panic.
    into[2].pop();
    assert!(eng.decompress_many_into(&blobs, &mut into).is_err());
    let mut bad = outs[0].clone();
    bad.truncate(bad.len() / 2);
    assert!(eng.decompress_many(&[&bad[..], blobs[1]]).is_err());
    // Each blob's outcome, in order, into the caller's slices: the damaged one (index 1) and the
    // short buffer (index 2) fail, the others decode.
    into[2].push(0);
    let mut with_bad = blobs.clone();
    with_bad[1] = &bad[..];
    let mut slices = short_slices(&mut into, 2);
    let each = eng.decompress_each_into(&with_bad, &mut slices).unwrap();
    assert_eq!(each.len(), tensors.len());
    for (k, r) in each.iter().enumerate() {
        assert_eq!(r.is_err(), k == 1 || k == 2, "blob {k}: {r:?}");
    }
    for (k, (i, (d, _, _))) in into.iter().zip(&tensors).enumerate() {
        if k > 2 || k == 0 {
            assert_eq!(i, d, "blob {k}");
        }
    }
    assert!(eng.decompress_many_into(&with_bad, &mut into).is_err());
    assert!(eng.decompress_each_into(&blobs[1..], &mut into).is_err());

    // The runs the archive writer codes together; each segment counts with the slack.
    let small = SMALL_SEGMENT_BYTES - 1;
    let slack = SMALL_BLOB_SLACK;
    // Whole small segments one group holds.
    let per = (SMALL_GROUP_BYTES / (small + slack)) as usize;
    assert!(per >= 2 && (per as u64 + 1) * (small + slack) > SMALL_GROUP_BYTES);
    let mut lens = vec![10, small, SMALL_SEGMENT_BYTES, 5, 6];
    lens.extend(std::iter::repeat_n(small, per));
    lens.push(0);
    // 10 + small; the large segment alone; 5 + 6 and as many small ones as fit after them (one
    // fewer than `per` when 11 bytes tip the sum over); the rest with the empty segment.
    let fit = if 11 + (per as u64 + 2) * slack + per as u64 * small <= SMALL_GROUP_BYTES {
        per
    } else {
        per - 1
    };
    let runs = small_runs(&lens);
    let mut want = vec![0..2, 2..3, 3..5 + fit];
    if fit < per {
        want.push(5 + fit..lens.len());
    } else {
        want[2].end = lens.len();
    }
    assert_eq!(runs, want);
    let many = vec![small; 2 * per + 1];
    assert_eq!(
        small_runs(&many),
        vec![0..per, per..2 * per, 2 * per..2 * per + 1]
    );
    assert!(small_runs(&[]).is_empty());
    // Tiny segments: a run holds at most the group over the slack of them, not a million.
    let tiny = vec![1u64; 100_000];
    let cap = (SMALL_GROUP_BYTES / (1 + slack)) as usize;
    let runs = small_runs(&tiny);
    assert!(runs.iter().all(|r| r.len() == cap || r.end == tiny.len()));
    assert_eq!(runs.len(), tiny.len().div_ceil(cap));

    // The runs handed over in one call: a large segment joins the run before it, so that a run
    // is a lead of small segments (possibly none) and the large ones after it.
    let large = SMALL_SEGMENT_BYTES;
    let mixed = [large, large + 1, 10, 20, large, 5, large, large, large, 7];
    let runs = encode_runs(&mixed);
    assert_eq!(runs, vec![0..2, 2..5, 5..9, 9..10]);
    let leads: Vec<usize> = runs.iter().map(|r| lead_len(&mixed, r)).collect();
    assert_eq!(leads, vec![0, 2, 1, 1]);
    for (r, lead) in runs.iter().zip(leads) {
        let (small, big) = mixed[r.clone()].split_at(lead);
        assert!(small.iter().all(|&l| l < large), "{r:?}");
        assert!(big.iter().all(|&l| l >= large), "{r:?}");
    }
    assert_eq!(lead_len(&mixed, &(9..9)), 0);
    // The large segment after `10 + small` joins them; the small runs after it stay as they were.
    let mut want_enc = want.clone();
    want_enc.remove(1);
    want_enc[0].end = 3;
    assert_eq!(encode_runs(&lens), want_enc);
    assert_eq!(encode_runs(&many), small_runs(&many));
    assert!(encode_runs(&[]).is_empty());
}

/// Tensors coded one after the other with the next one's model built beside them, after a lead
/// coded together (`compress_seq_into`, `compress_seq_to`), give the blobs of one-by-one
/// compression — stored tensors (empty, tiny, random bytes) and coded ones of every float kind
/// among them, at one and two threads, for every length of the lead — and an invalid tensor is
/// an error, whichever place it has.
#[test]
fn tensors_coded_in_sequence_equal_tensors_coded_alone() {
    use std::io::{Cursor, Seek, SeekFrom, Write};
    use tensorzip::archive::BlobItem;
    use tensorzip::CpuEngine;
    let opts = CompressOptions {
        chunk_bytes: 8192,
        block_units: 512,
        ..Default::default()
    };
    let random = sample::random_bytes(70_001, 14);
    let tensors: Vec<(Vec<u8>, DType, Vec<u64>)> = vec![
        (
            sample::weights(150, 700, DType::F32, 11),
            DType::F32,
            vec![150, 700],
        ),
        (Vec::new(), DType::BF16, vec![0]),
        (
            sample::weights(300, 513, DType::BF16, 12),
            DType::BF16,
            vec![300, 513],
        ),
        (random, DType::U8, vec![70_001]),
        (vec![3u8; 8], DType::F64, vec![]),
        (
            sample::weights(77, 1000, DType::F16, 13),
            DType::F16,
            vec![77, 1000],
        ),
    ];
    let items: Vec<BlobItem<'_>> = tensors
        .iter()
        .map(|(d, t, s)| (&d[..], *t, &s[..]))
        .collect();
    let alone: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(d, t, s)| compress(d, *t, s, &opts).unwrap())
        .collect();
    for threads in [1, 2] {
        let eng = CpuEngine::new(threads).unwrap();
        for lead in 0..=items.len() {
            let mut outs = vec![vec![0xAAu8; 100]; items.len()];
            eng.compress_seq_into(&items, lead, &opts, &mut outs)
                .unwrap();
            assert!(
                outs == alone,
                "{threads} threads, lead {lead}: in-memory blobs differ"
            );
            // Into a writer that already holds 5 bytes, and past bytes left from before.
            let mut w = Cursor::new(vec![0x77u8; 1 << 20]);
            w.seek(SeekFrom::Start(5)).unwrap();
            let done = std::sync::Mutex::new(vec![0u64; items.len()]);
            let lens = eng
                .compress_seq_to(&items, lead, &opts, &mut w, &|k, n| {
                    let mut d = done.lock().unwrap();
                    assert!(n >= d[k], "tensor {k}: progress went back");
                    d[k] = n;
                })
                .unwrap();
            let end = w.position() as usize;
            w.write_all(b"end").unwrap();
            let written = w.into_inner();
            let want: Vec<u8> = alone.concat();
            // Each blob's length, and the checksum of each tensor's bytes (taken batch by batch
            // for the streamed ones) equal to zlib.crc32's.
            assert_eq!(
                lens,
                alone
                    .iter()
                    .zip(&items)
                    .map(|(b, i)| (b.len() as u64, crc32fast::hash(i.0)))
                    .collect::<Vec<_>>(),
                "{threads} threads, lead {lead}"
            );
            assert_eq!(
                end,
                5 + want.len(),
                "{threads} threads, lead {lead}: the writer's position"
            );
            assert!(
                written[5..end] == want[..],
                "{threads} threads, lead {lead}: streamed blobs differ"
            );
            assert_eq!(&written[end..end + 3], b"end");
            // Progress reached every tensor's end, and no further.
            for (k, (d, _, _)) in tensors.iter().enumerate() {
                assert_eq!(
                    done.lock().unwrap()[k],
                    d.len() as u64,
                    "lead {lead}: tensor {k}'s progress"
                );
            }
        }
        // A tensor whose bytes do not fill its shape, first, in the middle or last, in the lead
        // or in the sequence: an error.
        let short = &tensors[2].0[..tensors[2].0.len() - 2];
        for at in [0, 3, items.len()] {
            let mut bad = items.clone();
            bad.insert(at, (short, DType::BF16, &tensors[2].2[..]));
            for lead in [0, 2, 4, bad.len()] {
                let mut outs = vec![Vec::new(); bad.len()];
                assert!(eng.compress_seq_into(&bad, lead, &opts, &mut outs).is_err());
                let mut w = Cursor::new(Vec::new());
                assert!(eng
                    .compress_seq_to(&bad, lead, &opts, &mut w, &|_, _| {})
                    .is_err());
            }
        }
        // As many buffers as tensors, and a lead no longer than the tensors, or an error.
        let mut outs = vec![Vec::new(); items.len()];
        assert!(eng
            .compress_seq_into(&items, 0, &opts, &mut outs[..2])
            .is_err());
        let over = items.len() + 1;
        assert!(eng
            .compress_seq_into(&items, over, &opts, &mut outs)
            .is_err());
        let mut w = Cursor::new(Vec::new());
        assert!(eng
            .compress_seq_to(&items, over, &opts, &mut w, &|_, _| {})
            .is_err());
        // No tensors: nothing written.
        let mut w = Cursor::new(Vec::new());
        assert!(eng
            .compress_seq_to(&[], 0, &opts, &mut w, &|_, _| {})
            .unwrap()
            .is_empty());
        assert!(w.into_inner().is_empty());
    }
}

/// The in-memory compress codes a blob of two pieces or more (1 MiB of input each: 64 chunks of
/// 16 KiB here) on all the pool's threads and places the pieces in order (`pieces::code_pieces`):
/// with more threads than cores, pieces end out of order and wait. The blob equals one thread's
/// and the streaming writer's, for coded blobs of three to four pieces and for one that ends
/// stored (random bytes: every chunk raw, and the blob longer than a stored one, so the placing
/// stops).
#[test]
fn blobs_coded_in_pieces_by_many_threads_equal_one_threads() {
    use tensorzip::CpuEngine;
    let one = CpuEngine::new(1).unwrap();
    let many = CpuEngine::new(16).unwrap();
    let opts = CompressOptions {
        chunk_bytes: 16 << 10,
        ..Default::default()
    };
    let random = common::random_bytes(3_000_000, 0x9E37_79B9_7F4A_7C15);
    let cases: Vec<(Vec<u8>, DType, Vec<u64>)> = vec![
        (
            sample::weights(1200, 1500, DType::BF16, 7),
            DType::BF16,
            vec![1200, 1500],
        ),
        (
            sample::weights(599, 1001, DType::F32, 8),
            DType::F32,
            vec![599, 1001],
        ),
        (random, DType::F16, vec![1_500_000]),
    ];
    for (data, dtype, shape) in &cases {
        let want = one.compress(data, *dtype, shape, &opts).unwrap();
        for _ in 0..4 {
            let mut out = vec![0xA5u8; 17];
            many.compress_into(data, *dtype, shape, &opts, &mut out)
                .unwrap();
            assert!(out == want, "{dtype}: 16 threads wrote a different blob");
        }
        let mut cur = std::io::Cursor::new(Vec::new());
        let n = many
            .compress_to(data, *dtype, shape, &opts, &mut cur, &|_| {})
            .unwrap();
        assert!(
            cur.into_inner()[..n as usize] == want[..],
            "{dtype}: compress_to"
        );
        assert_eq!(decompress(&want).unwrap().data, *data);
        let scheme = tensorzip::blob::peek_header(&want).unwrap().scheme;
        assert_eq!(
            scheme == tensorzip::Scheme::Stored,
            *dtype == DType::F16,
            "{dtype}"
        );
    }
}

/// Every dtype tensorzip codes is read from a safetensors header under its safetensors name and
/// coded as that dtype — C64 and the two FNUZ fp8 types included, which the safetensors crate
/// before 0.8 did not know, so `tensorzip compress` refused files that `safetensors` (Python) and
/// our own `save_file` write.
#[test]
fn safetensors_files_of_every_dtype_are_planned_as_that_dtype() {
    use tensorzip::archive::{plan_safetensors, serialize_safetensors};
    for d in DType::ALL {
        let bytes = vec![0x3cu8; 3 * d.itemsize()];
        let file = serialize_safetensors(
            &[("t", d.safetensors_name(), &[3u64][..], &bytes[..])],
            None,
        )
        .unwrap();
        let segs = plan_safetensors(&file).unwrap_or_else(|e| panic!("{d:?}: {e}"));
        let t = segs.iter().find(|s| s.name == "t").unwrap();
        assert_eq!((t.dtype, &t.shape[..]), (d, &[3u64][..]), "{d:?}");
    }
    // More dimensions than a blob holds (64): valid safetensors, coded as its bytes (it was
    // refused), restored byte for byte.
    let shape = [vec![1u64; 64], vec![3]].concat();
    let bytes = sample::weights(1, 3, DType::F32, 9);
    let file = serialize_safetensors(&[("deep", "F32", &shape[..], &bytes[..])], None).unwrap();
    let segs = plan_safetensors(&file).unwrap();
    let t = segs.iter().find(|s| s.name == "deep").unwrap();
    assert_eq!((t.dtype, &t.shape[..]), (DType::U8, &[12u64][..]));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deep.tz");
    let mut f = std::fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    let opts = tensorzip::archive::ArchiveOptions::default();
    let engine = tensorzip::CpuEngine::new(1).unwrap();
    tensorzip::archive::write_archive(&engine, &file[..], &segs, &opts, &mut f, &|_| {}).unwrap();
    let archive = std::fs::read(&path).unwrap();
    let ar = tensorzip::archive::Archive::parse(&archive).unwrap();
    let mut back = Vec::new();
    ar.decode_all_to(&engine, &mut back, &|_| {}).unwrap();
    assert!(back == file);
}

/// `decompress_many_into` stops decoding the blobs after a failed one, yet reports the first
/// failing blob in order: here blob 1 (damaged) waits behind a large blob 0 on its thread while
/// blob 3's short buffer fails at once on the other, so both fail and blob 1's error must win.
#[test]
fn decompress_many_into_reports_the_first_failing_blob() {
    use tensorzip::{CpuEngine, Error};
    let eng = CpuEngine::new(2).unwrap();
    let opts = CompressOptions::default();
    let shapes: [(usize, usize); 5] = [(1024, 4096), (64, 300), (8, 100), (16, 200), (4, 50)];
    let tensors: Vec<Vec<u8>> = shapes
        .iter()
        .enumerate()
        .map(|(k, &(r, c))| sample::weights(r, c, DType::BF16, k as u64))
        .collect();
    let good: Vec<Vec<u8>> = tensors
        .iter()
        .zip(&shapes)
        .map(|(t, &(r, c))| compress(t, DType::BF16, &[r as u64, c as u64], &opts).unwrap())
        .collect();
    let mut damaged_blob = good[1].clone();
    damaged_blob.truncate(damaged_blob.len() / 2);
    let good: Vec<&[u8]> = good.iter().map(|b| &b[..]).collect();
    let mut views = good.clone();
    views[1] = &damaged_blob;
    let mut outs: Vec<Vec<u8>> = tensors.iter().map(|t| vec![0; t.len()]).collect();
    let damaged = eng.decompress_each_into(&views, &mut outs.clone()).unwrap()[1]
        .as_ref()
        .unwrap_err()
        .to_string();
    for _ in 0..10 {
        let mut slices = short_slices(&mut outs, 3);
        let e = eng.decompress_many_into(&views, &mut slices).unwrap_err();
        assert_eq!(e.to_string(), damaged);
        assert_eq!(
            &slices[0][..],
            &tensors[0][..],
            "blob 0 decoded before the failure"
        );
    }
    // A short buffer alone: its own error.
    let mut slices = short_slices(&mut outs, 3);
    let e = eng.decompress_many_into(&good, &mut slices).unwrap_err();
    assert!(matches!(e, Error::OutputSize { .. }), "{e}");
}

/// Mutable views of `outs`, each whole but `short`'s, which lacks its first byte.
fn short_slices(outs: &mut [Vec<u8>], short: usize) -> Vec<&mut [u8]> {
    outs.iter_mut()
        .enumerate()
        .map(|(k, v)| if k == short { &mut v[1..] } else { &mut v[..] })
        .collect()
}
