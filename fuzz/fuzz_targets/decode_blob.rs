//! Arbitrary bytes as a blob: every decoding entry point must return `Ok` or `Err`, never panic, hang
//! or allocate more than the input justifies; and where the whole tensor decodes, every chunk and every
//! range decoded on its own must agree with it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorzip::blob::{peek_header, BlobLayout, PrefixStep, Scheme};
use tensorzip::decoder::{DecodeScratch, TensorDecoder};
use tensorzip::stats::BlobStats;

#[path = "one_engine.rs"]
mod one_engine;
use one_engine::engine;

/// Whole-tensor decoding is tried only up to this many output bytes. A valid blob may legitimately
/// describe a much larger tensor than itself (constant chunks cost a directory entry each, about a
/// million to one), and allocating that is the caller's decision, not a bug.
const WHOLE_LIMIT: u64 = 16 << 20;
/// Chunks decoded one by one when the whole tensor is not.
const MAX_SINGLE_CHUNKS: usize = 4;

fuzz_target!(|data: &[u8]| {
    let eng = engine();
    let header = peek_header(data);
    let _ = BlobStats::of(data);
    // The prefix a reader copies from device memory: where the layout parses, exactly its
    // overhead; where `needed_len` fails otherwise than by truncation, so does the parse.
    let needed = BlobLayout::needed_len(data, data.len());
    let whole = BlobLayout::parse(data, data.len());
    match &whole {
        Ok(l) => assert_eq!(needed.ok(), Some(l.overhead_len()), "needed_len"),
        Err(e) => {
            if let Err(n) = &needed {
                assert_eq!(format!("{n:?}"), format!("{e:?}"), "needed_len's error");
            }
        }
    }
    // A reader of the blob in device memory (`GpuEngine::read_layouts`): from a first read of
    // 4 KiB (a few bytes for short inputs, so that more than one round is tried), each step asks
    // for more than it holds and ends, within 64 rounds, in the whole blob's parse.
    let mut held = (1usize << 12).min(data.len() / 3);
    let mut ended = None;
    for _ in 0..64 {
        match BlobLayout::parse_prefix(&data[..held], data.len()) {
            PrefixStep::Parsed(r) => {
                ended = Some(r);
                break;
            }
            PrefixStep::Want(n) => {
                assert!(
                    n > held && n <= data.len(),
                    "parse_prefix asked {n} holding {held}"
                );
                held = n;
            }
        }
    }
    match (ended.expect("parse_prefix did not settle"), &whole) {
        (Ok(g), Ok(w)) => assert_eq!(g.overhead_len(), w.overhead_len(), "parse_prefix"),
        (Err(g), Err(w)) => assert_eq!(format!("{g:?}"), format!("{w:?}"), "parse_prefix's error"),
        (g, _) => panic!(
            "parse_prefix gave {:?} where the whole parse differs",
            g.is_ok()
        ),
    }
    let dec = match TensorDecoder::new(data) {
        Ok(d) => d,
        Err(_) => {
            assert!(tensorzip::decompress(data).is_err());
            return;
        }
    };
    let h = dec.header().clone();
    assert_eq!(header.as_ref(), Ok(&h));
    let isz = h.dtype.itemsize() as u64;
    let numel = h.numel();
    let cb = h.chunk_units as usize * h.planes();
    let mut scratch = DecodeScratch::default();

    if h.nbytes() > WHOLE_LIMIT {
        // Only a few chunks and a short range.
        if h.scheme == Scheme::Planes {
            for c in 0..(h.n_chunks() as usize).min(MAX_SINGLE_CHUNKS) {
                let mut o = vec![0u8; h.chunk_len(c as u64) * h.planes()];
                let _ = dec.decode_chunk(c, &mut o, &mut scratch);
            }
        }
        let end = numel.min(3);
        let mut o = vec![0u8; (end * isz) as usize];
        let _ = eng.decompress_range_into(data, 0, end, &mut o);
        return;
    }

    let whole = eng.decompress(data);
    let mut streamed = Vec::new();
    let crc = eng.decompress_to(data, &mut streamed, &|_| {});
    assert_eq!(
        whole.is_ok(),
        crc.is_ok(),
        "decompress and decompress_to disagree"
    );
    if let Ok(t) = &whole {
        assert_eq!(t.shape, h.shape);
        assert_eq!(t.dtype, h.dtype);
        assert!(streamed == t.data, "decompress_to wrote different bytes");
        assert_eq!(crc.unwrap(), tensorzip::crc32(&t.data));
    }
    // Into a buffer with the CRC taken as chunks are decoded (`load_file`'s path).
    let mut into = vec![0u8; h.nbytes() as usize];
    let fused = eng.decompress_into_crc(data, &mut into);
    assert_eq!(
        whole.is_ok(),
        fused.is_ok(),
        "decompress and decompress_into_crc disagree"
    );
    if let (Ok(t), Ok(c)) = (&whole, fused) {
        assert!(into == t.data, "decompress_into_crc wrote different bytes");
        assert_eq!(c, tensorzip::crc32(&t.data));
    }

    // Each chunk on its own.
    if h.scheme == Scheme::Planes {
        for c in 0..h.n_chunks() as usize {
            let mut o = vec![0u8; h.chunk_len(c as u64) * h.planes()];
            let r = dec.decode_chunk(c, &mut o, &mut scratch);
            if let Ok(t) = &whole {
                assert!(
                    r.is_ok(),
                    "chunk {c} fails alone but the whole tensor decodes"
                );
                assert!(
                    o[..] == t.data[c * cb..c * cb + o.len()],
                    "chunk {c} decodes differently alone"
                );
            }
        }
    }

    // A few short ranges (elements), around the start, the middle and the end, and one of all
    // but the first and last elements (its whole chunks decoded as a tensor's are).
    let mid = numel / 2;
    for (a, b) in [
        (0, numel.min(3)),
        (mid, (mid + 5).min(numel)),
        (numel.saturating_sub(2), numel),
        (numel.min(1), numel.saturating_sub(1).max(numel.min(1))),
    ] {
        let mut o = vec![0u8; ((b - a) * isz) as usize];
        let r = eng.decompress_range_into(data, a, b, &mut o);
        if let Ok(t) = &whole {
            assert!(
                r.is_ok(),
                "range {a}..{b} fails but the whole tensor decodes"
            );
            assert!(
                o[..] == t.data[(a * isz) as usize..(b * isz) as usize],
                "range {a}..{b} differs"
            );
        }
    }
});
