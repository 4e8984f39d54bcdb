//! The checks shared by the archive fuzz targets (included by each with `#[path]`).

use tensorzip::archive::Archive;
use tensorzip::blob::peek_header;

use crate::one_engine::engine;

/// Segments that decode to more than this are only checked, not decoded (see decode_blob.rs).
const SEGMENT_LIMIT: u64 = 16 << 20;

/// Parses `data` as an archive, lists its tensors and decodes every segment streamed, in memory
/// and into the caller's buffers (all at once, as `load_file` does): each must return `Ok` or
/// `Err` (never panic), and they must agree.
pub fn check_archive(data: &[u8]) {
    let eng = engine();
    let Ok(ar) = Archive::parse(data) else { return };
    // Lists the tensors: decodes segment 0 (the safetensors header) in memory.
    let _ = ar.tensors(eng);
    // Segments small enough (each at most the limit, together at most four times it: their
    // buffers are held at once), into buffers sized by the index, in one call; compared with the
    // one-by-one decoding below.
    let mut budget = 4 * SEGMENT_LIMIT;
    let some: Vec<usize> = (0..ar.segments.len())
        .filter(|&i| {
            let n = ar.segments[i].orig_len;
            let take = n <= SEGMENT_LIMIT && n <= budget;
            budget -= if take { n } else { 0 };
            take
        })
        .collect();
    let mut bufs: Vec<Vec<u8>> = some
        .iter()
        .map(|&i| vec![0u8; ar.segments[i].orig_len as usize])
        .collect();
    let mut outs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    let together = ar.decode_segments_into(eng, &some, &mut outs);
    let mut all_ok = true;
    for i in 0..ar.segments.len() {
        let checked = ar.check_blob(i);
        // The GPU loader's order: layout unverified, the whole-blob CRC compared by the caller.
        // A layout `segment_layout` accepts is accepted unverified too, and a whole-blob CRC
        // agrees with `check_blob`.
        let unverified = ar.segment_layout_unverified(i);
        if ar.segment_layout(i).is_ok() {
            assert!(
                unverified.is_ok(),
                "segment {i}: checked layout but not unverified"
            );
        }
        if let Some(c) = ar.whole_blob_crc(i) {
            let same = tensorzip::checksum::crc32(ar.blob(i)) == c;
            assert_eq!(
                same,
                checked.is_ok(),
                "segment {i}: whole-blob CRC and check_blob disagree"
            );
        }
        let claimed = peek_header(ar.blob(i)).map(|h| h.nbytes()).unwrap_or(0);
        if claimed > SEGMENT_LIMIT {
            continue;
        }
        let mut streamed = Vec::new();
        let r = ar.decode_segment_to(eng, i, &mut streamed, &|_| {});
        // In memory, whatever length the index claims.
        let m = ar.decode_segment(eng, i);
        assert_eq!(
            r.is_ok(),
            m.is_ok(),
            "segment {i}: streamed and in-memory decoding disagree"
        );
        if let Ok(m) = m {
            assert!(
                m == streamed,
                "segment {i}: streamed and in-memory bytes differ"
            );
            assert_eq!(m.len() as u64, ar.segments[i].orig_len);
            if let (true, Ok(k)) = (together.is_ok(), some.binary_search(&i)) {
                assert!(
                    bufs[k] == m,
                    "segment {i}: decoded differently with the others"
                );
            }
        } else {
            all_ok &= some.binary_search(&i).is_err();
        }
    }
    // A segment skipped above (its blob claims more than the limit) was not compared.
    let skipped = some
        .iter()
        .any(|&i| peek_header(ar.blob(i)).map(|h| h.nbytes()).unwrap_or(0) > SEGMENT_LIMIT);
    if !skipped {
        assert_eq!(
            together.is_ok(),
            all_ok,
            "decoding together and one by one disagree"
        );
    }
}
