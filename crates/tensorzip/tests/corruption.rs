//! Decoding is safe on any input: truncated, bit-flipped and hand-crafted hostile blobs and archives give
//! an `Err` (or, for blobs, which carry no checksum, possibly `Ok` with wrong data), never a panic, a
//! hang or an allocation that the input's size does not justify.
//!
//! Hostile blobs are built by taking a real blob apart (`Layout`, after the layout in `blob.rs`: a
//! 20-byte header and 8 bytes per dimension, per plane a table count and tables, one directory entry of
//! `8 + 2 * planes` bytes per chunk, then the payloads; a chunk's payload is its block selectors, its
//! rANS stream (32 lane states, then 16-bit words) and its raw bytes) and patching single fields.

mod common;

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::LazyLock;

use common::{make, small_opts, Dist};
use tensorzip::archive::{
    plan_safetensors, serialize_safetensors, write_archive, Archive, ArchiveOptions,
    ARCHIVE_HEADER_LEN,
};
use tensorzip::blob::{peek_header, BlobHeader, BLOB_MAGIC, SEL_CONST, SEL_RAW};
use tensorzip::decoder::{DecodeScratch, TensorDecoder};
use tensorzip::sample::Rng;
use tensorzip::stats::BlobStats;
use tensorzip::{crc32, CompressOptions, CpuEngine, DType, Error, Scheme, Tensor};

// ---------------------------------------------------------------------------------------------------
// Largest single allocation made by the current thread (to show that hostile sizes are rejected before
// anything is allocated for them).

struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|m| {
        if size > m.get() {
            m.set(size)
        }
    });
}

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, l: AllocLayout) -> *mut u8 {
        note(l.size());
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: AllocLayout) -> *mut u8 {
        note(l.size());
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: AllocLayout, new: usize) -> *mut u8 {
        note(new);
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: AllocLayout) {
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Runs `f` and returns its result and the largest single allocation this thread made meanwhile.
fn largest_alloc<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LARGEST.with(|m| m.set(0));
    let r = f();
    (r, LARGEST.with(|m| m.get()))
}

// ---------------------------------------------------------------------------------------------------

static ONE: LazyLock<CpuEngine> = LazyLock::new(|| CpuEngine::new(1).unwrap());
static TWO: LazyLock<CpuEngine> = LazyLock::new(|| CpuEngine::new(2).unwrap());

/// Outputs larger than this are not decoded by these tests (no hostile input here should claim one).
const DECODE_LIMIT: u64 = 64 << 20;

/// What decoding a (possibly hostile) blob gave.
#[derive(Debug)]
enum Outcome {
    Ok(Tensor),
    Err(Error),
    /// The blob passed validation but claims more than [`DECODE_LIMIT`] bytes; only its first chunk
    /// and a short range were decoded.
    TooLarge,
}

/// Decodes `blob` in every way the library offers and checks that they agree: either the whole-tensor
/// decoders all fail, or they all succeed with the same bytes, and then every chunk and range decoded
/// on its own matches those bytes. Panics (with `what` and the blob in hex) if anything panics.
fn decode_everything(blob: &[u8], what: &str) -> Outcome {
    guarded("blob", blob, what, || decode_everything_inner(blob))
}

/// Runs `f`, which decodes `input` (a blob or an archive); if it panics, panics again with `what`
/// and the input in hex, so that a failing case can be replayed.
fn guarded<T>(kind: &str, input: &[u8], what: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(o) => o,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            panic!(
                "decoding panicked ({what}): {msg:?}\n{kind} ({} bytes): {}",
                input.len(),
                hex(input)
            );
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn decode_everything_inner(blob: &[u8]) -> Outcome {
    let _ = BlobStats::of(blob);
    let header = peek_header(blob);
    let dec = TensorDecoder::new(blob);
    let h = match (&header, &dec) {
        (Err(e), Err(_)) => {
            assert!(tensorzip::decompress(blob).is_err());
            return Outcome::Err(e.clone());
        }
        (Ok(_), Err(e)) => {
            assert!(ONE.decompress(blob).is_err());
            assert!(TWO.decompress_to(blob, &mut Vec::new(), &|_| {}).is_err());
            return Outcome::Err(e.clone());
        }
        (Ok(h), Ok(_)) => h.clone(),
        (Err(e), Ok(_)) => panic!("the decoder accepted a blob whose header fails to parse: {e}"),
    };
    let dec = dec.unwrap();
    assert_eq!(dec.header(), &h);
    if h.nbytes() > DECODE_LIMIT {
        if h.scheme == Scheme::Planes {
            let mut o = vec![0u8; h.chunk_len(0) * h.planes()];
            let _ = dec.decode_chunk(0, &mut o, &mut DecodeScratch::default());
        }
        let mut o = vec![0u8; h.dtype.itemsize()];
        let _ = ONE.decompress_range_into(blob, 0, 1, &mut o);
        return Outcome::TooLarge;
    }
    let full = TWO.decompress(blob);
    let one = ONE.decompress(blob);
    let mut into = vec![0x77u8; h.nbytes() as usize];
    let r_into = ONE.decompress_into(blob, &mut into);
    let mut streamed = Vec::new();
    let r_stream = TWO.decompress_to(blob, &mut streamed, &|_| {});
    let t = match full {
        Err(e) => {
            assert!(one.is_err(), "2 threads: {e}; 1 thread: Ok");
            assert!(r_into.is_err(), "decompress: {e}; decompress_into: Ok");
            assert!(r_stream.is_err(), "decompress: {e}; decompress_to: Ok");
            // Single chunks and ranges may still decode (they touch less); they must not panic.
            if h.scheme == Scheme::Planes {
                let mut s = DecodeScratch::default();
                for c in 0..h.n_chunks() as usize {
                    let mut o = vec![0u8; h.chunk_len(c as u64) * h.planes()];
                    let _ = dec.decode_chunk(c, &mut o, &mut s);
                }
                common::check_pairs(&dec);
            }
            let ne = h.numel();
            for (a, b) in [(0, ne.min(1)), (ne / 2, ne), (ne.saturating_sub(3), ne)] {
                let mut o = vec![0u8; ((b - a) * h.dtype.itemsize() as u64) as usize];
                let _ = ONE.decompress_range_into(blob, a, b, &mut o);
            }
            return Outcome::Err(e);
        }
        Ok(t) => t,
    };
    assert_eq!(one.as_ref().ok(), Some(&t), "1 and 2 threads disagree");
    assert!(
        r_into.is_ok() && into == t.data,
        "decompress_into disagrees: {r_into:?}"
    );
    assert_eq!(r_stream, Ok(crc32(&t.data)), "decompress_to disagrees");
    assert!(streamed == t.data);
    assert_eq!(t.shape, h.shape);
    assert_eq!(t.dtype, h.dtype);
    if h.scheme == Scheme::Planes {
        let cb = h.chunk_units as usize * h.planes();
        let mut s = DecodeScratch::default();
        for c in 0..h.n_chunks() as usize {
            let want = &t.data[c * cb..((c + 1) * cb).min(t.data.len())];
            let mut o = vec![0u8; want.len()];
            dec.decode_chunk(c, &mut o, &mut s)
                .expect("a chunk failed alone but not in the whole tensor");
            assert!(o == want, "chunk {c} decodes differently alone");
        }
        common::check_pairs(&dec);
    }
    let ne = h.numel();
    let isz = h.dtype.itemsize() as u64;
    for (a, b) in [
        (0, ne),
        (0, ne.min(1)),
        (ne / 3, ne - ne / 3),
        (ne.saturating_sub(5), ne),
    ] {
        let mut o = vec![0u8; ((b - a) * isz) as usize];
        ONE.decompress_range_into(blob, a, b, &mut o)
            .expect("a range failed but not the whole tensor");
        assert!(
            o == t.data[(a * isz) as usize..(b * isz) as usize],
            "range {a}..{b} disagrees"
        );
    }
    Outcome::Ok(t)
}

fn expect_err(blob: &[u8], what: &str) -> Error {
    match decode_everything(blob, what) {
        Outcome::Err(e) => e,
        Outcome::Ok(_) => panic!("{what}: decoded without error\nblob: {}", hex(blob)),
        Outcome::TooLarge => panic!(
            "{what}: passed validation claiming a huge tensor\nblob: {}",
            hex(blob)
        ),
    }
}

// ---------------------------------------------------------------------------------------------------
// A blob taken apart.

/// Where one plane's part of the table section lies (offsets in `Layout::tables`).
#[derive(Clone, Debug)]
struct PlaneSection {
    flag_at: usize,
    /// (value, table, table length).
    cond: Option<(usize, usize, usize)>,
}

#[derive(Clone, Debug)]
struct Layout {
    header: Vec<u8>,
    /// Everything between the header and the directory (per plane: a table count, the tables, and
    /// whatever else the format keeps there), kept as it is.
    tables: Vec<u8>,
    /// Directory entries (`8 + 2 * planes` bytes each).
    entries: Vec<Vec<u8>>,
    payloads: Vec<Vec<u8>>,
    planes: usize,
    block_units: usize,
    chunk_units: usize,
    units: u64,
    /// Whether table `j` of plane `p` has two symbols or more.
    multi: Vec<Vec<bool>>,
}

impl Layout {
    fn parse(blob: &[u8]) -> Layout {
        let view = tensorzip::blob::BlobView::parse(blob).unwrap();
        let h = view.header.clone();
        assert_eq!(h.scheme, Scheme::Planes, "Layout needs a coded blob");
        let e = h.dir_entry_len();
        let n = h.n_chunks() as usize;
        let dir_start = view.overhead_len() - n * e;
        let mut pos = dir_start;
        let entries: Vec<Vec<u8>> = (0..n)
            .map(|c| blob[pos + c * e..pos + (c + 1) * e].to_vec())
            .collect();
        pos += n * e;
        let mut payloads = Vec::new();
        for ent in &entries {
            let len = u32::from_le_bytes(ent[0..4].try_into().unwrap()) as usize;
            payloads.push(blob[pos..pos + len].to_vec());
            pos += len;
        }
        assert_eq!(pos, blob.len());
        let l = Layout {
            header: blob[..h.encoded_len()].to_vec(),
            tables: blob[h.encoded_len()..dir_start].to_vec(),
            entries,
            payloads,
            planes: h.planes(),
            block_units: h.block_units as usize,
            chunk_units: h.chunk_units as usize,
            units: h.units(),
            multi: view
                .tables
                .iter()
                .map(|ts| ts.iter().map(|t| !t.is_single()).collect())
                .collect(),
        };
        assert!(l.build() == blob, "Layout does not rebuild the blob");
        l
    }

    fn build(&self) -> Vec<u8> {
        let mut out = self.header.clone();
        out.extend_from_slice(&self.tables);
        for e in &self.entries {
            out.extend_from_slice(e);
        }
        for p in &self.payloads {
            out.extend_from_slice(p);
        }
        out
    }

    /// Keeps only the first `k` chunks of a rank-1 tensor (whose chunks hold whole elements) and
    /// shrinks its shape to match: a small valid blob that keeps the tables of a large one.
    fn first_chunks(&self, k: usize) -> Layout {
        let mut l = self.clone();
        l.entries.truncate(k);
        l.payloads.truncate(k);
        let units = (k * self.chunk_units) as u64;
        let dtype = DType::from_code(self.header[7]).unwrap();
        assert_eq!(self.header[8], 1, "rank 1");
        let numel = units / dtype.units_per_element() as u64;
        l.header[20..28].copy_from_slice(&numel.to_le_bytes());
        l.units = units;
        l
    }

    /// The table section walked after the current format (per plane: a table count, the tables, a
    /// conditional-table flag, and for a flag of 1 a condition value and the conditional table): for
    /// each plane, the offset of its flag and of its condition value, conditional table and length.
    fn sections(&self) -> Vec<PlaneSection> {
        let t = &self.tables;
        let table_len = |at: usize| 2 + (t[at + 1] - t[at]) as usize + 1;
        let mut at = 0;
        let mut out = Vec::new();
        for _ in 0..self.planes {
            let count_at = at;
            at += 1;
            for _ in 0..t[count_at] {
                at += table_len(at);
            }
            let flag_at = at;
            at += 1;
            let cond = (t[flag_at] == 1).then(|| {
                let c = (at, at + 1, table_len(at + 1));
                at += 1 + c.2;
                c
            });
            out.push(PlaneSection { flag_at, cond });
        }
        assert_eq!(
            at,
            t.len(),
            "the table section does not follow the expected layout"
        );
        out
    }

    /// The tables of plane 0 (the first in the table section): (offset in `tables`, length) of each.
    fn plane0_tables(&self) -> Vec<(usize, usize)> {
        let k = self.tables[0] as usize;
        let mut at = 1;
        let mut out = Vec::new();
        for _ in 0..k {
            let (lo, hi) = (self.tables[at], self.tables[at + 1]);
            let len = 2 + (hi - lo) as usize + 1;
            out.push((at, len));
            at += len;
        }
        out
    }

    fn payload_len(&self, c: usize) -> u32 {
        u32::from_le_bytes(self.entries[c][0..4].try_into().unwrap())
    }
    fn set_payload_len(&mut self, c: usize, v: u32) {
        self.entries[c][0..4].copy_from_slice(&v.to_le_bytes());
    }
    fn rans_len(&self, c: usize) -> u32 {
        u32::from_le_bytes(self.entries[c][4..8].try_into().unwrap())
    }
    fn set_rans_len(&mut self, c: usize, v: u32) {
        self.entries[c][4..8].copy_from_slice(&v.to_le_bytes());
    }
    /// Makes every payload length match its payload.
    fn sync_lens(&mut self) {
        for c in 0..self.entries.len() {
            let n = self.payloads[c].len() as u32;
            self.set_payload_len(c, n);
        }
    }
    fn mode(&self, c: usize, p: usize) -> (u8, u8) {
        (self.entries[c][8 + 2 * p], self.entries[c][9 + 2 * p])
    }
    fn set_mode(&mut self, c: usize, p: usize, m: (u8, u8)) {
        self.entries[c][8 + 2 * p] = m.0;
        self.entries[c][9 + 2 * p] = m.1;
    }
    /// Whether every plane of chunk `c` is raw (0, 0), constant (1, v) or block-selected (2, 0): the
    /// payload is then selectors, rANS stream, raw area (the helpers below assume it).
    fn is_simple(&self, c: usize) -> bool {
        (0..self.planes).all(|p| matches!(self.mode(c, p), (0, 0) | (1, _) | (2, 0)))
    }
    fn chunk_len(&self, c: usize) -> usize {
        (self.units - (c * self.chunk_units) as u64).min(self.chunk_units as u64) as usize
    }
    /// Selector bytes of each block-selected plane of a simple chunk `c`: (plane, offset in the
    /// payload, count).
    fn selectors(&self, c: usize) -> Vec<(usize, usize, usize)> {
        assert!(self.is_simple(c));
        let nb = self.chunk_len(c).div_ceil(self.block_units);
        let mut at = 0;
        let mut out = Vec::new();
        for p in 0..self.planes {
            if self.mode(c, p) == (2, 0) {
                out.push((p, at, nb));
                at += nb;
            }
        }
        out
    }
    /// Offset of a simple chunk `c`'s rANS stream in its payload.
    fn rans_start(&self, c: usize) -> usize {
        self.selectors(c).iter().map(|s| s.2).sum()
    }
    /// A simple chunk with a rANS stream and one of its planes whose selectors include a
    /// multi-symbol table: (chunk, plane, selector offset, block).
    fn coded_site(&self) -> (usize, usize, usize, usize) {
        for c in 0..self.entries.len() {
            if self.rans_len(c) == 0 || !self.is_simple(c) {
                continue;
            }
            for (p, at, nb) in self.selectors(c) {
                for b in 0..nb {
                    let s = self.payloads[c][at + b];
                    if s != SEL_RAW && s != SEL_CONST && self.multi[p][s as usize] {
                        return (c, p, at + b, b);
                    }
                }
            }
        }
        panic!("no coded block in this blob");
    }
}

// ---------------------------------------------------------------------------------------------------
// Real blobs.

/// A coded multi-chunk u8 blob (one plane) with rANS streams, several tables and every selector kind:
/// its blocks cycle through constant, random, and two unrelated skewed distributions.
fn coded_blob() -> Vec<u8> {
    let mut rng = Rng::new(21);
    let mut data = Vec::new();
    for b in 0..96u64 {
        for _ in 0..64 {
            let v = (rng.normal().abs() * 2.0) as u8;
            data.push(match b % 4 {
                0 => 0x3F,
                1 => rng.next_u64() as u8,
                2 => v,
                _ => 100 + v,
            });
        }
    }
    let n = data.len() as u64;
    let blob = tensorzip::compress(&data, DType::U8, &[n], &small_opts()).unwrap();
    assert_eq!(peek_header(&blob).unwrap().scheme, Scheme::Planes);
    let l = Layout::parse(&blob);
    assert!(l.entries.len() >= 3);
    assert!(
        l.multi[0].iter().filter(|&&m| m).count() >= 2,
        "want several tables: {:?}",
        l.multi
    );
    blob
}

/// A coded multi-chunk bf16 blob (two planes).
fn coded_bf16_blob() -> Vec<u8> {
    let mut data = Vec::new();
    for b in 0..24u64 {
        match b % 4 {
            0 => data.extend(std::iter::repeat_n(0x3Fu8, 128)),
            1 => data.extend(common::random_bytes(128, b)),
            _ => data.extend(make(DType::BF16, 64, Dist::Weights, b)),
        }
    }
    let n = data.len() as u64 / 2;
    let blob = tensorzip::compress(&data, DType::BF16, &[n], &small_opts()).unwrap();
    assert_eq!(peek_header(&blob).unwrap().scheme, Scheme::Planes);
    blob
}

/// A small blob whose chunks code a plane conditioned on the exponent (`PlaneMode::Cond`): the first
/// three chunks of a large tensor (conditioning pays only for large tensors), with its tables.
fn cond_blob(dtype: DType) -> Vec<u8> {
    static BLOBS: LazyLock<std::sync::Mutex<std::collections::HashMap<u8, Vec<u8>>>> =
        LazyLock::new(Default::default);
    let mut cache = BLOBS.lock().unwrap();
    cache
        .entry(dtype.code())
        .or_insert_with(|| {
            let n = 256_000 / dtype.itemsize();
            let data = make(dtype, n, Dist::Weights, 5);
            let opts = CompressOptions {
                chunk_bytes: 1024,
                block_units: 64,
                min_compress_bytes: 0,
                ..Default::default()
            };
            let big = tensorzip::compress(&data, dtype, &[n as u64], &opts).unwrap();
            let small = Layout::parse(&big).first_chunks(3).build();
            let l = Layout::parse(&small);
            let (cp, _) = dtype.conditioned_plane().unwrap();
            assert!(
                l.sections()[cp].cond.is_some(),
                "{dtype}: no conditional table"
            );
            assert!(
                (0..3).all(|c| l.mode(c, cp) == (3, 0)),
                "{dtype}: chunks not conditioned"
            );
            match decode_everything(&small, "conditioned blob") {
                Outcome::Ok(t) => assert!(t.data == data[..t.data.len()]),
                o => panic!("{dtype}: the first chunks of a real blob fail to decode: {o:?}"),
            }
            small
        })
        .clone()
}

/// Small blobs of several kinds (all decode correctly).
fn sample_blobs() -> Vec<(String, Vec<u8>)> {
    let o = small_opts();
    let mut v = vec![
        ("u8 mixed".to_string(), coded_blob()),
        ("bf16 mixed".to_string(), coded_bf16_blob()),
        ("bf16 conditioned".to_string(), cond_blob(DType::BF16)),
        ("f32 conditioned".to_string(), cond_blob(DType::F32)),
        ("bf16 paired".to_string(), paired_blob()),
    ];
    for (dtype, n, dist) in [
        (DType::F32, 400, Dist::NanInf),
        (DType::Complex64, 150, Dist::Weights),
        (DType::F64, 90, Dist::Subnormal),
        (DType::U8, 1500, Dist::Weights),
        (DType::I16, 700, Dist::Outlier),
        (DType::F16, 520, Dist::Constant),
        (DType::U8, 100, Dist::Random),
    ] {
        let data = make(dtype, n, dist, n as u64);
        let blob = tensorzip::compress(&data, dtype, &[n as u64], &o).unwrap();
        v.push((format!("{dtype} {dist:?} x{n}"), blob));
    }
    v.push((
        "empty".into(),
        tensorzip::compress(&[], DType::F32, &[4, 0], &o).unwrap(),
    ));
    v.push((
        "0-d".into(),
        tensorzip::compress(&[1, 2, 3, 4], DType::F32, &[], &o).unwrap(),
    ));
    for (name, b) in &v {
        match decode_everything(b, name) {
            Outcome::Ok(_) => {}
            o => panic!("{name}: a real blob fails to decode: {o:?}"),
        }
    }
    v
}

// ---------------------------------------------------------------------------------------------------
// Truncation, trailing bytes, bit flips.

#[test]
fn every_truncation_of_a_blob_is_an_error() {
    for (name, blob) in sample_blobs() {
        let hlen = peek_header(&blob).unwrap().encoded_len();
        for n in 0..blob.len() {
            let cut = &blob[..n];
            let e = expect_err(cut, &format!("{name} cut to {n} bytes"));
            match (n, &e) {
                (0..4, Error::Truncated(_)) => {}
                (0..4, e) => panic!("{name} cut to {n}: {e:?}"),
                _ if n < hlen => {
                    assert!(matches!(e, Error::Truncated(_)), "{name} cut to {n}: {e:?}")
                }
                _ => assert!(
                    matches!(e, Error::Truncated(_) | Error::Corrupt(_)),
                    "{name} cut to {n}: {e:?}"
                ),
            }
        }
    }
}

#[test]
fn trailing_bytes_are_an_error() {
    for (name, blob) in sample_blobs() {
        for extra in [&[0u8][..], &[0xFF; 7], b"TZBL"] {
            let mut b = blob.clone();
            b.extend_from_slice(extra);
            let e = expect_err(&b, &format!("{name} + {} bytes", extra.len()));
            assert!(
                matches!(e, Error::Corrupt(_)),
                "{name} + {} bytes: {e:?}",
                extra.len()
            );
        }
        // Two blobs back to back are not one blob.
        let mut two = blob.clone();
        two.extend_from_slice(&blob);
        assert!(matches!(
            expect_err(&two, &format!("{name} twice")),
            Error::Corrupt(_)
        ));
    }
}

/// Runs `f` on another thread; fails the test if it has not finished after `secs` (a hang).
fn with_watchdog(secs: u64, what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p)
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still running after {secs} s (a hang?)")
        }
    }
}

#[test]
fn random_bit_flips_never_panic() {
    with_watchdog(600, "bit flips", || {
        let mut rng = Rng::new(0xF11B);
        let (mut errs, mut oks, mut wrong) = (0, 0, 0);
        for (name, blob) in sample_blobs() {
            let original = tensorzip::decompress(&blob).unwrap();
            // Byte ranges of the header, the table section and the directory.
            let (header, tables, dir) = match BlobHeader::parse(&blob).unwrap().0.scheme {
                Scheme::Planes => {
                    let l = Layout::parse(&blob);
                    let h = l.header.len();
                    let t = h + l.tables.len();
                    (
                        0..h,
                        h..t,
                        t..t + l.entries.iter().map(|e| e.len()).sum::<usize>(),
                    )
                }
                Scheme::Stored => (
                    0..blob.len().min(peek_header(&blob).unwrap().encoded_len()),
                    0..0,
                    0..0,
                ),
            };
            // Every single-bit flip of the header and the directory; random flips in the table
            // section; random flips anywhere (1 to 4 bits at once).
            let mut cases: Vec<Vec<usize>> = header
                .chain(dir)
                .flat_map(|byte| (0..8).map(move |b| vec![8 * byte + b]))
                .collect();
            if !tables.is_empty() {
                for _ in 0..150 {
                    cases.push(vec![
                        8 * tables.start + (rng.next_u64() % (8 * tables.len() as u64)) as usize,
                    ]);
                }
            }
            for _ in 0..300 {
                let nbits = 1 + (rng.next_u64() % 4) as usize;
                cases.push(
                    (0..nbits)
                        .map(|_| (rng.next_u64() % (blob.len() as u64 * 8)) as usize)
                        .collect(),
                );
            }
            for bits in cases {
                let mut b = blob.clone();
                for &bit in &bits {
                    b[bit / 8] ^= 1 << (bit % 8);
                }
                if b == blob {
                    continue;
                }
                match decode_everything(&b, &format!("{name} with bits {bits:?} flipped")) {
                    Outcome::Err(_) | Outcome::TooLarge => errs += 1,
                    Outcome::Ok(t) => {
                        oks += 1;
                        wrong += (t != original) as usize;
                    }
                }
            }
        }
        eprintln!("bit flips: {errs} errors, {oks} decoded ({wrong} of them to different data)");
        assert!(errs > 1000, "only {errs} flips were detected");
    });
}

#[test]
fn random_byte_overwrites_of_fields_never_panic() {
    // Overwrite whole little-endian fields with extreme or random values.
    with_watchdog(600, "field overwrites", || {
        let blob = coded_blob();
        let mut rng = Rng::new(77);
        let l = Layout::parse(&blob);
        let dir_start = blob.len()
            - l.payloads.iter().map(|p| p.len()).sum::<usize>()
            - l.entries.len() * l.entries[0].len();
        let mut fields: Vec<(usize, usize)> =
            vec![(4, 2), (6, 1), (7, 1), (8, 1), (12, 4), (16, 4), (20, 8)];
        for c in 0..l.entries.len() {
            let at = dir_start + c * l.entries[0].len();
            fields.push((at, 4));
            fields.push((at + 4, 4));
            for p in 0..l.planes {
                fields.push((at + 8 + 2 * p, 1));
                fields.push((at + 9 + 2 * p, 1));
            }
        }
        for &(at, w) in &fields {
            let mut values: Vec<u64> = vec![
                0,
                1,
                2,
                31,
                32,
                33,
                127,
                128,
                253,
                254,
                255,
                256,
                4096,
                65535,
                65536,
                1 << 24,
                1 << 31,
                u32::MAX as u64,
                1 << 40,
                u64::MAX,
            ];
            values.extend((0..6).map(|_| rng.next_u64()));
            for v in values {
                let mut b = blob.clone();
                b[at..at + w].copy_from_slice(&v.to_le_bytes()[..w]);
                decode_everything(&b, &format!("field at {at} ({w} bytes) = {v}"));
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------------
// Lying headers.

fn patched(blob: &[u8], at: usize, bytes: &[u8]) -> Vec<u8> {
    let mut b = blob.to_vec();
    b[at..at + bytes.len()].copy_from_slice(bytes);
    b
}

fn assert_corrupt(blob: &[u8], what: &str) -> String {
    match expect_err(blob, what) {
        Error::Corrupt(m) => m,
        e => panic!("{what}: expected Error::Corrupt, got {e:?}"),
    }
}

fn assert_truncated(blob: &[u8], what: &str) -> String {
    match expect_err(blob, what) {
        Error::Truncated(m) => m,
        e => panic!("{what}: expected Error::Truncated, got {e:?}"),
    }
}

#[test]
fn wrong_magic_is_bad_magic() {
    let blob = coded_blob();
    for magic in [*b"TZBX", *b"TZAR", *b"\0\0\0\0", *b"tzbl", *b"PK\x03\x04"] {
        assert_eq!(
            expect_err(&patched(&blob, 0, &magic), "magic"),
            Error::BadMagic
        );
    }
    assert_eq!(
        expect_err(b"hello, world! this is not a blob", "text"),
        Error::BadMagic
    );
    assert!(matches!(expect_err(b"", "empty"), Error::Truncated(_)));
    assert!(matches!(expect_err(b"TZB", "3 bytes"), Error::Truncated(_)));
    assert!(matches!(
        expect_err(b"TZBL", "magic only"),
        Error::Truncated(_)
    ));
    assert!(matches!(
        expect_err(b"TZBL\x01\x00", "magic and version"),
        Error::Truncated(_)
    ));
}

#[test]
fn other_versions_are_unsupported() {
    let blob = coded_blob();
    for v in [0u16, 3, 0x100, u16::MAX] {
        let e = expect_err(&patched(&blob, 4, &v.to_le_bytes()), "version");
        assert_eq!(
            e,
            Error::UnsupportedVersion {
                found: v,
                supported: 2
            }
        );
        // The version is checked before the rest of the header is needed.
        let e = expect_err(&patched(&blob, 4, &v.to_le_bytes())[..6], "version, short");
        assert_eq!(
            e,
            Error::UnsupportedVersion {
                found: v,
                supported: 2
            }
        );
    }
    // Version 2 is read, but a version 1 blob said to be version 2 (its tables section read with
    // pair fields), and the reverse, are errors; so is a stored blob of version 2.
    expect_err(&patched(&blob, 4, &2u16.to_le_bytes()), "v1 as v2");
    expect_err(&patched(&paired_blob(), 4, &1u16.to_le_bytes()), "v2 as v1");
    let stored = tensorzip::compress(&[1, 2, 3, 4], DType::F32, &[], &small_opts()).unwrap();
    assert_eq!(peek_header(&stored).unwrap().scheme, Scheme::Stored);
    expect_err(&patched(&stored, 4, &2u16.to_le_bytes()), "stored v2");
}

/// A bf16 blob of format version 2 (paired exponents): weights with rare exponents (escapes) and
/// an odd length (a last block of odd length), several chunks, conditioned. 50,001 units and one
/// table: a tensor pairs only where its pair and rank tables and its escapes cost at most 1/32
/// of its exponent plane (FORMAT.md section 12, step 6).
fn paired_blob() -> Vec<u8> {
    let n = 50001;
    let mut data = make(DType::BF16, n, Dist::Weights, 77);
    for u in data.chunks_exact_mut(2).step_by(997) {
        u[1] ^= 0x20; // an exponent far from the others
    }
    let opts = CompressOptions {
        pair_exponents: true,
        chunk_bytes: 2048,
        max_tables: 1,
        ..small_opts()
    };
    let blob = tensorzip::compress(&data, DType::BF16, &[n as u64], &opts).unwrap();
    assert_eq!(blob[4..6], [2, 0], "version 2");
    let l = tensorzip::blob::BlobLayout::parse(&blob, blob.len()).unwrap();
    assert_eq!(l.paired_plane(), Some(1));
    match decode_everything(&blob, "paired blob") {
        Outcome::Ok(t) => assert!(t.data == data),
        o => panic!("a paired blob fails to decode: {o:?}"),
    }
    blob
}

/// Bytes of a bf16 blob's plane 0 part of the tables section, but its version 2 pair field: its
/// table count, tables and conditional table (plane 1's part follows).
fn plane0_tables_len(blob: &[u8]) -> usize {
    let l = tensorzip::blob::BlobLayout::parse(blob, blob.len()).unwrap();
    let tables: usize = l.tables[0].iter().map(|t| t.serialized_len()).sum();
    let cond = l.cond[0]
        .as_ref()
        .map_or(0, |(_, t)| 1 + t.serialized_len());
    1 + tables + 1 + cond
}

#[test]
fn paired_tables_that_lie_are_errors() {
    let blob = paired_blob();
    // Plane 1's pair field: after the header (28 bytes), plane 0's pair field (a zero) and
    // plane 0's tables.
    let at = 28 + 1 + plane0_tables_len(&blob);
    let d = blob[at] as usize;
    assert!((2..=128).contains(&d), "D = {d}");
    let msg = |b: &[u8], what: &str| match expect_err(b, what) {
        Error::Corrupt(m) | Error::Truncated(m) => m,
        e => panic!("{what}: {e:?}"),
    };
    for bad in [1u8, 129, 255] {
        let m = msg(&patched(&blob, at, &[bad]), "pair count");
        assert!(m.contains("pairs"), "{bad}: {m}");
    }
    // A pair twice.
    let first = [blob[at + 1], blob[at + 2]];
    let m = msg(&patched(&blob, at + 3, &first), "a pair twice");
    assert!(m.contains("twice"), "{m}");
    // Plane 0 (not pairable in bf16) with pairs.
    let mut b = blob.clone();
    b[28] = 2;
    expect_err(&b, "plane 0 paired");
    // One pair fewer: the tables' escape rank is now past the escape.
    let mut b = blob.clone();
    b.drain(at + 1 + 2 * (d - 1)..at + 1 + 2 * d);
    b[at] = d as u8 - 1;
    let m = msg(&b, "a table of ranks past the escape");
    assert!(m.contains("past the escape"), "{m}");
    // Version 2 with no paired plane: a version 1 blob given empty pair fields.
    let v1 = coded_bf16_blob();
    let p1 = 28 + plane0_tables_len(&v1);
    let mut b = v1.clone();
    b[4] = 2;
    b.insert(p1, 0);
    b.insert(28, 0);
    let m = msg(&b, "version 2 without pairs");
    assert!(m.contains("without a paired plane"), "{m}");
}

#[test]
fn bad_fixed_header_fields_are_corrupt() {
    let blob = coded_blob();
    // Scheme and dtype codes.
    for s in [2u8, 3, 255] {
        assert_corrupt(&patched(&blob, 6, &[s]), "scheme");
    }
    for d in [18u8, 19, 200, 255] {
        assert_corrupt(&patched(&blob, 7, &[d]), "dtype");
    }
    // Flags and reserved bytes.
    for at in 9..12 {
        assert_corrupt(&patched(&blob, at, &[1]), "reserved");
    }
    // Rank over 64.
    for r in [65u8, 100, 255] {
        let m = assert_corrupt(&patched(&blob, 8, &[r]), "rank");
        assert!(m.contains("rank"), "{m}");
    }
    // A rank that does not match the shape bytes.
    for r in [0u8, 2, 3, 64] {
        decode_everything(&patched(&blob, 8, &[r]), "rank mismatch");
        assert!(tensorzip::decompress(&patched(&blob, 8, &[r])).is_err());
    }
    // Chunk size zero or over 16 MiB; stored blobs with chunk or block sizes.
    assert_corrupt(&patched(&blob, 12, &0u32.to_le_bytes()), "chunk_units 0");
    assert_corrupt(
        &patched(&blob, 12, &((8u32 << 20) + 1).to_le_bytes()),
        "chunk_units over 16 MiB",
    );
    assert_corrupt(
        &patched(&blob, 12, &u32::MAX.to_le_bytes()),
        "chunk_units max",
    );
    let stored =
        tensorzip::compress(&[7u8; 40], DType::U8, &[40], &CompressOptions::default()).unwrap();
    assert_eq!(peek_header(&stored).unwrap().scheme, Scheme::Stored);
    assert_corrupt(
        &patched(&stored, 12, &1u32.to_le_bytes()),
        "stored with chunk_units",
    );
    assert_corrupt(
        &patched(&stored, 16, &32u32.to_le_bytes()),
        "stored with block_units",
    );
    // Block size not a power of two, or outside 32..=65536.
    for bu in [0u32, 1, 16, 31, 48, 96, 1000, 131072, 1 << 31, u32::MAX] {
        let m = assert_corrupt(&patched(&blob, 16, &bu.to_le_bytes()), "block_units");
        assert!(m.contains("block"), "{m}");
    }
}

/// A 40-byte (or longer, for rank > 1) blob: a header for a tensor of `shape`, with chunks of
/// `chunk_bytes` (0 for a stored blob), then zeros (table counts of zero, and nothing else).
fn tiny_blob(scheme: u8, dtype: DType, chunk_bytes: u32, block: u32, shape: &[u64]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&BLOB_MAGIC);
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&[scheme, dtype.code(), shape.len() as u8, 0, 0, 0]);
    b.extend_from_slice(
        &(chunk_bytes / dtype.unit_size() as u32)
            .max(chunk_bytes.min(1))
            .to_le_bytes(),
    );
    b.extend_from_slice(&block.to_le_bytes());
    for d in shape {
        b.extend_from_slice(&d.to_le_bytes());
    }
    b.resize(b.len().max(40), 0);
    b
}

#[test]
fn huge_shapes_are_rejected_before_allocating() {
    let blob = coded_blob();
    assert_eq!(peek_header(&blob).unwrap().dtype.itemsize(), 1);
    // More than 2^56 bytes.
    for shape in [u64::MAX, 1 << 63, 1 << 57, (1 << 56) + 1] {
        let b = patched(&blob, 20, &shape.to_le_bytes());
        let (e, big) = largest_alloc(|| expect_err(&b, "huge shape"));
        assert!(matches!(e, Error::Corrupt(_)), "{shape}: {e:?}");
        assert!(big < 1 << 20, "shape {shape}: allocated {big} bytes");
    }
    // Products that overflow u64, or exceed 2^56 bytes only through the element size.
    for (dtype, shape) in [
        (DType::U8, vec![1u64 << 40, 1 << 40]),
        (DType::U8, vec![u64::MAX, 2]),
        (DType::F64, vec![1 << 54]),
        (DType::Complex64, vec![1 << 30, 1 << 24]),
    ] {
        let b = tiny_blob(1, dtype, 1024, 64, &shape);
        let (e, big) = largest_alloc(|| expect_err(&b, "overflowing shape"));
        assert!(matches!(e, Error::Corrupt(_)), "{dtype} {shape:?}: {e:?}");
        assert!(big < 1 << 16, "{dtype} {shape:?}: allocated {big} bytes");
    }
    // A zero-size tensor with a dimension no reader can hold (2^63 or more): refused, although
    // its byte count (0) is fine; 2^63 - 1 is allowed.
    for (shape, ok) in [
        (vec![u64::MAX, 0], false),
        (vec![0, 1 << 63], false),
        (vec![(1 << 63) - 1, 0], true),
    ] {
        let b = tiny_blob(0, DType::U8, 0, 0, &shape);
        let b = &b[..20 + 8 * shape.len()];
        let r = tensorzip::decompress(b);
        match ok {
            true => assert_eq!(r.map(|t| t.shape).ok(), Some(shape.clone())),
            false => assert!(matches!(r, Err(Error::Corrupt(_))), "{shape:?}: {r:?}"),
        }
    }
    // Large but allowed sizes: the directory (or the data) is not there.
    for shape in [1u64 << 40, 1 << 32, 1 << 20, 1_000_000] {
        let b = patched(&blob, 20, &shape.to_le_bytes());
        let (e, big) = largest_alloc(|| expect_err(&b, "large shape"));
        assert!(
            matches!(e, Error::Truncated(_) | Error::Corrupt(_)),
            "{shape}: {e:?}"
        );
        assert!(big < 1 << 20, "shape {shape}: allocated {big} bytes");
    }
    // A tiny blob claiming a gigantic tensor, stored or coded, with any chunk size.
    for (scheme, chunk, block) in [
        (0u8, 0u32, 0u32),
        (1, 1024, 64),
        (1, 16 << 20, 65536),
        (1, 1, 32),
    ] {
        for dtype in [DType::U8, DType::F32, DType::Complex64] {
            let b = tiny_blob(scheme, dtype, chunk, block, &[1 << 40]);
            assert_eq!(b.len(), 40);
            let (r, big) = largest_alloc(|| {
                (
                    TensorDecoder::new(&b).err(),
                    tensorzip::decompress(&b).err(),
                    ONE.decompress_range_into(&b, 0, 1, &mut [0u8; 8][..dtype.itemsize()])
                        .err(),
                )
            });
            assert!(
                r.0.is_some() && r.1.is_some() && r.2.is_some(),
                "scheme {scheme} {dtype} chunk {chunk}: {r:?}"
            );
            assert!(
                big < 64 << 10,
                "scheme {scheme} {dtype} chunk {chunk}: allocated {big} bytes"
            );
            assert!(matches!(r.0, Some(Error::Truncated(_))), "{r:?}");
        }
    }
}

#[test]
fn table_sections_that_lie_are_errors() {
    let blob = coded_blob();
    let l = Layout::parse(&blob);
    let at0 = l.header.len(); // plane 0's table count
                              // More tables than allowed.
    for k in [65u8, 100, 255] {
        let m = assert_corrupt(&patched(&blob, at0, &[k]), "table count");
        assert!(m.contains("tables"), "{m}");
    }
    // Counts that disagree with the tables that follow.
    let k = l.tables[0];
    for v in [k + 1, k + 2, k - 1, 0] {
        expect_err(
            &patched(&blob, at0, &[v]),
            &format!("table count {v} instead of {k}"),
        );
    }
    // A table removed (its bytes and the count).
    let ts = l.plane0_tables();
    for &(at, len) in &ts {
        let mut m = l.clone();
        m.tables.drain(at..at + len);
        m.tables[0] -= 1;
        expect_err(&m.build(), "table removed");
    }
    // Malformed tables: each edit of each table of three symbols or more.
    let mut edited = 0;
    for &(at, tl) in ts.iter().filter(|&&(_, tl)| tl >= 5) {
        let edits: Vec<(&str, Vec<(usize, u8)>)> = vec![
            ("lo > hi", vec![(0, 200), (1, 100)]),
            ("zero at lo", vec![(2, 0)]),
            ("zero at hi", vec![(tl - 1, 0)]),
            ("invalid code 208", vec![(2, 208)]),
            ("invalid code 254", vec![(3, 254)]),
            ("second anchor", vec![(2, 255), (3, 255)]),
        ];
        for (what, edit) in edits {
            let mut m = l.clone();
            for (i, v) in edit {
                m.tables[at + i] = v;
            }
            let msg = assert_corrupt(&m.build(), what);
            assert!(msg.contains("table"), "{what}: {msg}");
        }
        // No anchor.
        let mut m = l.clone();
        for x in &mut m.tables[at + 2..at + tl] {
            *x = 1;
        }
        let msg = assert_corrupt(&m.build(), "no anchor");
        assert!(msg.contains("table"), "{msg}");
        // Frequencies at the largest code: they sum to more than 4096.
        let mut m = l.clone();
        for x in &mut m.tables[at + 2..at + tl - 1] {
            *x = 207;
        }
        m.tables[at + tl - 1] = 255;
        let msg = assert_corrupt(&m.build(), "frequencies over 4096");
        assert!(msg.contains("table"), "{msg}");
        edited += 1;
    }
    assert!(
        edited >= 2,
        "the blob has {edited} tables of 3 symbols or more"
    );
    // Bytes of the table section (the count, the ends and some codes of every table of plane 0, and
    // random others) replaced by interesting values: never a panic.
    let mut rng = Rng::new(8);
    let mut spots = vec![0usize, l.tables.len() - 1];
    for &(at, len) in &ts {
        spots.extend([
            at,
            at + 1,
            at + 2,
            at + 3,
            at + len / 2,
            at + len - 2,
            at + len - 1,
        ]);
    }
    spots.extend((0..24).map(|_| (rng.next_u64() % l.tables.len() as u64) as usize));
    spots.sort_unstable();
    spots.dedup();
    for i in spots {
        let old = l.tables[i];
        for v in [
            0u8,
            1,
            2,
            64,
            65,
            127,
            128,
            207,
            208,
            254,
            255,
            old.wrapping_add(1),
            old.wrapping_sub(1),
            !old,
        ] {
            let mut m = l.clone();
            m.tables[i] = v;
            decode_everything(&m.build(), &format!("table byte {i} = {v}"));
        }
    }
}

#[test]
fn directories_that_lie_are_errors() {
    let blob = coded_blob();
    let l = Layout::parse(&blob);
    let n = l.entries.len();
    // Payload lengths that point past the end.
    for c in 0..n {
        for v in [
            l.payload_len(c) + 1,
            l.payload_len(c) + 1000,
            u32::MAX,
            1 << 31,
        ] {
            let mut m = l.clone();
            m.set_payload_len(c, v);
            let (msg, big) = largest_alloc(|| {
                assert_truncated(&m.build(), &format!("chunk {c} payload of {v} bytes"))
            });
            assert!(msg.contains("payload"), "{msg}");
            assert!(big < 1 << 20);
        }
        // Shorter: trailing bytes after the last payload.
        if l.payload_len(c) > 0 {
            let mut m = l.clone();
            m.set_payload_len(c, l.payload_len(c) - 1);
            assert_corrupt(&m.build(), "payload short");
        }
    }
    // Lengths shifted between neighbours: the total is right, each chunk is not.
    for c in 0..n - 1 {
        for d in [1u32, 2, 64] {
            let mut m = l.clone();
            if m.payload_len(c) < d {
                continue;
            }
            m.set_payload_len(c, l.payload_len(c) - d);
            m.set_payload_len(c + 1, l.payload_len(c + 1) + d);
            expect_err(
                &m.build(),
                &format!("{d} bytes moved from chunk {c} to {}", c + 1),
            );
        }
    }
    // A directory cut short (entries missing).
    let mut m = l.clone();
    m.entries.pop();
    m.payloads.pop();
    assert!(matches!(
        expect_err(&m.build(), "entry missing"),
        Error::Truncated(_) | Error::Corrupt(_)
    ));
    // Invalid plane modes.
    for c in 0..n {
        for p in 0..l.planes {
            for mode in [(0u8, 1u8), (2, 1), (200, 0), (255, 255)] {
                let mut m = l.clone();
                m.set_mode(c, p, mode);
                let msg = assert_corrupt(&m.build(), &format!("chunk {c} plane {p} mode {mode:?}"));
                assert!(msg.contains("mode"), "{msg}");
            }
            // Valid modes that disagree with the payload.
            for mode in [(0u8, 0u8), (1, 0x3F), (2, 0)] {
                if l.mode(c, p) == mode {
                    continue;
                }
                let mut m = l.clone();
                m.set_mode(c, p, mode);
                decode_everything(&m.build(), &format!("chunk {c} plane {p} mode {mode:?}"));
            }
        }
    }
}

#[test]
fn selectors_out_of_range_are_corrupt() {
    let blob = coded_blob();
    let l = Layout::parse(&blob);
    let (c, p, at, _) = l.coded_site();
    let k = l.multi[p].len() as u8;
    for s in [k, k + 1, 64, 200, 253] {
        let mut m = l.clone();
        m.payloads[c][at] = s;
        let msg = assert_corrupt(&m.build(), &format!("selector {s}"));
        assert!(msg.contains("selector"), "{msg}");
    }
    // Valid selectors of another kind: the raw area or the stream no longer fits.
    for s in [SEL_RAW, SEL_CONST] {
        let mut m = l.clone();
        m.payloads[c][at] = s;
        expect_err(&m.build(), &format!("selector {s}"));
    }
    // The coded site's selector set to every value, every other selector to every kind of value:
    // never a panic.
    for s in 0..=255u8 {
        let mut m = l.clone();
        m.payloads[c][at] = s;
        decode_everything(&m.build(), &format!("chunk {c} selector at {at} = {s}"));
    }
    for c in (0..l.entries.len()).filter(|&c| l.is_simple(c)) {
        for (p, at, nb) in l.selectors(c) {
            let k = l.multi[p].len() as u8;
            for b in 0..nb {
                for s in (0..k + 2).chain([63, 64, 252, SEL_CONST, SEL_RAW]) {
                    let mut m = l.clone();
                    m.payloads[c][at + b] = s;
                    decode_everything(&m.build(), &format!("chunk {c} selector {b} = {s}"));
                }
            }
        }
    }
}

#[test]
fn rans_streams_that_lie_are_corrupt() {
    let blob = coded_blob();
    let l = Layout::parse(&blob);
    let (c, ..) = l.coded_site();
    let rs = l.rans_start(c);
    let rl = l.rans_len(c) as usize;
    assert!(rl >= 128 + 2, "stream of {rl} bytes");

    // Odd length: one byte of the stream removed.
    let mut m = l.clone();
    m.payloads[c].remove(rs + rl - 1);
    m.set_rans_len(c, rl as u32 - 1);
    m.sync_lens();
    let msg = assert_corrupt(&m.build(), "odd stream");
    assert!(msg.contains("rANS"), "{msg}");

    // Shorter than the 128 bytes of lane states.
    for keep in [0usize, 2, 64, 126, 127] {
        let mut m = l.clone();
        m.payloads[c].drain(rs + keep..rs + rl);
        m.set_rans_len(c, keep as u32);
        m.sync_lens();
        let msg = assert_corrupt(&m.build(), &format!("stream of {keep} bytes"));
        assert!(msg.contains("rANS"), "{keep}: {msg}");
    }

    // Exactly the states, no words; one word too few; one word too many.
    for (what, edit) in [
        ("states only", 0i32),
        ("word missing", -2),
        ("extra word", 2),
        ("two extra words", 4),
    ] {
        let mut m = l.clone();
        let new_len = if what == "states only" {
            128
        } else {
            (rl as i32 + edit) as usize
        };
        if new_len < rl {
            m.payloads[c].drain(rs + new_len..rs + rl);
        } else {
            for _ in rl..new_len {
                m.payloads[c].insert(rs + rl, 0xA5);
            }
        }
        m.set_rans_len(c, new_len as u32);
        m.sync_lens();
        let msg = assert_corrupt(&m.build(), what);
        assert!(msg.contains("rANS"), "{what}: {msg}");
    }

    // A lane state below 2^16.
    for lane in [0usize, 17, 31] {
        let mut m = l.clone();
        m.payloads[c][rs + 4 * lane..rs + 4 * lane + 4].copy_from_slice(&0xFFFFu32.to_le_bytes());
        let msg = assert_corrupt(&m.build(), "state below 2^16");
        assert!(msg.contains("rANS"), "{msg}");
    }

    // No stream where one is needed; a stream where none is.
    let mut m = l.clone();
    m.payloads[c].drain(rs..rs + rl);
    m.set_rans_len(c, 0);
    m.sync_lens();
    let msg = assert_corrupt(&m.build(), "stream missing");
    assert!(msg.contains("rANS"), "{msg}");
    if let Some(c2) = (0..l.entries.len()).find(|&c2| l.rans_len(c2) == 0 && l.is_simple(c2)) {
        let mut m = l.clone();
        let rs2 = m.rans_start(c2);
        let stream: Vec<u8> = (0..32).flat_map(|_| 0x10000u32.to_le_bytes()).collect();
        m.payloads[c2].splice(rs2..rs2, stream);
        m.set_rans_len(c2, 128);
        m.sync_lens();
        assert_corrupt(&m.build(), "stream not needed");
    }

    // rANS length pointing past the payload.
    for v in [l.payload_len(c), l.payload_len(c) + 2, u32::MAX - 1] {
        let mut m = l.clone();
        m.set_rans_len(c, v);
        expect_err(&m.build(), &format!("rans_len {v}"));
    }

    // Every 2-byte word and every state byte of the stream replaced: never a panic.
    let mut rng = Rng::new(3);
    for i in 0..rl {
        let mut m = l.clone();
        m.payloads[c][rs + i] = rng.next_u64() as u8;
        decode_everything(&m.build(), &format!("stream byte {i}"));
    }
}

#[test]
fn raw_areas_of_the_wrong_size_are_corrupt() {
    let blob = coded_blob();
    let l = Layout::parse(&blob);
    for c in (0..l.entries.len()).filter(|&c| l.is_simple(c)) {
        for delta in [-1i32, 1] {
            let mut m = l.clone();
            if delta < 0 {
                if m.payloads[c].len() == m.rans_start(c) + m.rans_len(c) as usize {
                    continue;
                }
                m.payloads[c].pop();
            } else {
                m.payloads[c].push(0);
            }
            m.sync_lens();
            let msg = assert_corrupt(&m.build(), &format!("chunk {c} raw area {delta:+}"));
            assert!(msg.contains("raw") || msg.contains("rANS"), "{msg}");
        }
    }
}

#[test]
fn stored_blobs_that_lie_are_errors() {
    let data = common::random_bytes(301, 1);
    let blob = tensorzip::compress(&data, DType::U8, &[301], &CompressOptions::default()).unwrap();
    assert_eq!(peek_header(&blob).unwrap().scheme, Scheme::Stored);
    for shape in [300u64, 302, 0, 1 << 40] {
        let e = expect_err(&patched(&blob, 20, &shape.to_le_bytes()), "stored shape");
        assert!(
            matches!(e, Error::Truncated(_) | Error::Corrupt(_)),
            "{shape}: {e:?}"
        );
    }
    // A dtype whose size does not divide the data.
    assert!(matches!(
        expect_err(&patched(&blob, 7, &[DType::F32.code()]), "stored dtype"),
        Error::Truncated(_) | Error::Corrupt(_)
    ));
    // Turned into a coded blob with valid sizes: the tables and directory are garbage.
    let mut b = patched(&blob, 6, &[1]);
    b[12..16].copy_from_slice(&1024u32.to_le_bytes());
    b[16..20].copy_from_slice(&64u32.to_le_bytes());
    decode_everything(&b, "stored as coded");
}

/// The chunk calls check their arguments: a chunk past the last, a buffer of the wrong size and a
/// stored blob (which has no chunks) are errors, not panics, in release builds too.
#[test]
fn chunk_calls_refuse_arguments_that_do_not_fit() {
    let blob = coded_blob();
    let dec = TensorDecoder::new(&blob).unwrap();
    let h = dec.header().clone();
    let n = h.n_chunks() as usize;
    let cb = h.chunk_len(0) * h.planes();
    let mut s = DecodeScratch::default();
    let mut t = DecodeScratch::default();
    let mut o = vec![0u8; cb];
    assert!(matches!(
        dec.decode_chunk(n, &mut o, &mut s),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        dec.decode_chunk(usize::MAX, &mut o, &mut s),
        Err(Error::InvalidInput(_))
    ));
    for len in [0, cb - 1, cb + 1] {
        let mut short = vec![0u8; len];
        let e = dec.decode_chunk(0, &mut short, &mut s).unwrap_err();
        assert_eq!(
            e,
            Error::OutputSize {
                expected: cb,
                got: len
            }
        );
    }
    let mut p = vec![0u8; cb];
    assert!(dec
        .decode_chunk_pair(0, &mut o, &mut p, &mut s, &mut t)
        .is_ok());
    let last = h.chunk_len(n as u64 - 1) * h.planes();
    let mut q = vec![0u8; last];
    assert!(matches!(
        dec.decode_chunk_pair(n - 1, &mut o, &mut q, &mut s, &mut t),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        dec.decode_chunk_pair(0, &mut o, &mut p[1..], &mut s, &mut t),
        Err(Error::OutputSize { .. })
    ));
    let stored = tensorzip::compress(
        &common::random_bytes(301, 1),
        DType::U8,
        &[301],
        &CompressOptions::default(),
    )
    .unwrap();
    let dec = TensorDecoder::new(&stored).unwrap();
    assert_eq!(dec.header().scheme, Scheme::Stored);
    assert!(matches!(
        dec.decode_chunk(0, &mut [0u8; 301], &mut s),
        Err(Error::InvalidInput(_))
    ));
}

// ---------------------------------------------------------------------------------------------------
// Archives.

fn temp_path(tag: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "tensorzip-corruption-{}-{tag}-{n}",
        std::process::id()
    ))
}

/// A small safetensors file and its archive.
/// A new file at `path`, open for reading and writing (the archive writer reads its blobs back).
fn new_file(path: &std::path::Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .unwrap()
}

fn small_archive(piece: u32) -> (Vec<u8>, Vec<u8>) {
    let w = make(DType::BF16, 700, Dist::Weights, 1);
    let z = [0u8; 64];
    let f = make(DType::F32, 50, Dist::NanInf, 2);
    let tensors: Vec<(&str, &str, &[u64], &[u8])> = vec![
        ("w", "BF16", &[7u64, 100][..], &w[..]),
        ("zeros", "I32", &[16u64][..], &z[..]),
        ("f", "F32", &[50u64][..], &f[..]),
        ("empty", "F32", &[0u64, 3][..], &[][..]),
    ];
    let meta = vec![("format".to_string(), "pt".to_string())];
    let file = serialize_safetensors(&tensors, Some(&meta)).unwrap();
    let segs = plan_safetensors(&file).unwrap();
    let path = temp_path("archive");
    let mut out = new_file(&path);
    let opts = ArchiveOptions {
        compress: CompressOptions {
            min_compress_bytes: 0,
            ..small_opts()
        },
        checksum_piece_bytes: piece,
    };
    write_archive(&*ONE, &file[..], &segs, &opts, &mut out, &|_| {}).unwrap();
    drop(out);
    let ar = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(restore(&ar).unwrap(), file);
    (file, ar)
}

/// Everything a reader of an archive does: parse, list tensors, decode every segment (in memory and
/// streamed). Returns the restored file. Panics only if decoding panics.
fn restore(ar: &[u8]) -> Result<Vec<u8>, Error> {
    let a = Archive::parse(ar)?;
    let _ = a.tensors(&ONE);
    for i in 0..a.segments.len() {
        let _ = a.check_blob(i);
    }
    let mut streamed = Vec::new();
    for i in 0..a.segments.len() {
        a.decode_segment_to(&TWO, i, &mut streamed, &|_| {})?;
    }
    let mut out = Vec::new();
    for i in 0..a.segments.len() {
        out.extend(a.decode_segment(&ONE, i)?);
    }
    assert!(out == streamed, "in-memory and streamed decoding disagree");
    assert_eq!(out.len() as u64, a.original_len);
    Ok(out)
}

fn restore_guarded(ar: &[u8], what: &str) -> Result<Vec<u8>, Error> {
    guarded("archive", ar, what, || restore(ar))
}

#[test]
fn every_truncation_of_an_archive_is_an_error() {
    for piece in [0u32, 64] {
        let (_, ar) = small_archive(piece);
        for n in 0..ar.len() {
            let e = Archive::parse(&ar[..n])
                .err()
                .unwrap_or_else(|| panic!("archive cut to {n} bytes parses"));
            match n {
                0..4 => assert!(matches!(e, Error::NotAnArchive(_)), "{e:?}"),
                _ => assert!(
                    matches!(
                        e,
                        Error::Truncated(_) | Error::Corrupt(_) | Error::Checksum(_)
                    ),
                    "cut to {n}: {e:?}"
                ),
            }
            assert!(restore_guarded(&ar[..n], &format!("cut to {n}")).is_err());
        }
        // Trailing bytes.
        let mut b = ar.clone();
        b.push(0);
        assert!(restore_guarded(&b, "trailing byte").is_err());
    }
}

#[test]
fn archive_bit_flips_are_detected_or_harmless() {
    with_watchdog(600, "archive flips", || {
        for piece in [0u32, 64] {
            let (file, ar) = small_archive(piece);
            let mut rng = Rng::new(piece as u64 + 9);
            let mut cases: Vec<Vec<usize>> = (0..ARCHIVE_HEADER_LEN * 8).map(|b| vec![b]).collect();
            // Every bit of the index, then random flips anywhere.
            let index_offset = u64::from_le_bytes(ar[24..32].try_into().unwrap()) as usize;
            cases.extend((index_offset * 8..ar.len() * 8).map(|b| vec![b]));
            for _ in 0..1500 {
                let nbits = 1 + (rng.next_u64() % 3) as usize;
                cases.push(
                    (0..nbits)
                        .map(|_| (rng.next_u64() % (ar.len() as u64 * 8)) as usize)
                        .collect(),
                );
            }
            let mut undetected = 0;
            for bits in cases {
                let mut b = ar.clone();
                for &bit in &bits {
                    b[bit / 8] ^= 1 << (bit % 8);
                }
                if b == ar {
                    continue;
                }
                // Checksums cover the index, every blob and every decoded segment: a flip is either
                // caught or changes nothing that is restored.
                if let Ok(out) = restore_guarded(&b, &format!("bits {bits:?}")) {
                    assert!(out == file, "piece {piece}: bits {bits:?} flipped: restored a different file without an error");
                    undetected += 1;
                }
            }
            // Only the checksum piece size can change harmlessly (from 0 to a size above every blob).
            assert!(undetected < 64, "{undetected} flips went unnoticed");
        }
    });
}

#[test]
fn archive_headers_that_lie_are_errors() {
    let (_, ar) = small_archive(0);
    assert_eq!(
        Archive::parse(&patched(&ar, 0, b"TZBL")).err(),
        Some(Error::NotAnArchive(
            "; it is a single tensorzip blob (a tensor compressed alone), not an archive of a file"
                .into()
        ))
    );
    for v in [0u16, 2, u16::MAX] {
        assert_eq!(
            Archive::parse(&patched(&ar, 4, &v.to_le_bytes())).err(),
            Some(Error::UnsupportedVersion {
                found: v,
                supported: 1
            })
        );
    }
    for at in [6usize, 7, 12, 15] {
        assert!(matches!(
            Archive::parse(&patched(&ar, at, &[1])),
            Err(Error::Corrupt(_))
        ));
    }
    for off in [0u64, 31, ar.len() as u64 + 1, u64::MAX] {
        assert!(
            matches!(
                Archive::parse(&patched(&ar, 24, &off.to_le_bytes())),
                Err(Error::Truncated(_))
            ),
            "index at {off}"
        );
    }
    assert!(Archive::parse(&patched(&ar, 16, &1u64.to_le_bytes())).is_err());
}

/// Re-seals an archive's index after an edit (its CRC is not a defence against a hostile writer).
fn reseal_index(ar: &mut [u8]) {
    let io = u64::from_le_bytes(ar[24..32].try_into().unwrap()) as usize;
    let end = ar.len() - 4;
    let crc = crc32(&ar[io..end]);
    ar[end..].copy_from_slice(&crc.to_le_bytes());
}

/// An index whose CRC is right but whose sizes lie must give an error before anything is allocated
/// for those sizes.
#[test]
fn hostile_archive_index_with_valid_crc() {
    let (_, ar) = small_archive(0);
    let a = Archive::parse(&ar).unwrap();
    let n = a.segments.len();
    let io = u64::from_le_bytes(ar[24..32].try_into().unwrap()) as usize;
    // Offset of each entry in the archive.
    let mut at = io + 4;
    let mut entry_at = Vec::new();
    for s in a.segments.iter() {
        entry_at.push(at);
        at += 41 + 4 * s.blob_crcs.len();
    }
    // A segment whose original length is 1 GiB more (the later offsets and the total agree).
    for i in 0..n {
        let mut b = ar.clone();
        let old = a.segments[i].orig_len;
        let new = old + (1 << 30);
        b[entry_at[i] + 9..entry_at[i] + 17].copy_from_slice(&new.to_le_bytes());
        for j in i + 1..n {
            let off = a.segments[j].orig_offset + (1 << 30);
            b[entry_at[j] + 1..entry_at[j] + 9].copy_from_slice(&off.to_le_bytes());
        }
        let total = a.original_len + (1 << 30);
        b[16..24].copy_from_slice(&total.to_le_bytes());
        reseal_index(&mut b);
        if i == 0 {
            // Past the safetensors header's own limit: refused by the parse.
            let e = Archive::parse(&b).err().unwrap();
            assert!(
                matches!(e, Error::Corrupt(ref m) if m.contains("header segment")),
                "{e:?}"
            );
            continue;
        }
        let p = Archive::parse(&b).expect("sizes are consistent, the CRC is right");
        let (r, big) = largest_alloc(|| p.decode_segment(&ONE, i));
        assert!(r.is_err(), "segment {i}: decoded with a wrong length");
        assert!(big < 64 << 20, "segment {i} claims {new} bytes: decode_segment allocated {big} bytes before failing ({r:?})");
        let (r, big) = largest_alloc(|| p.tensors(&ONE));
        assert!(r.is_err() || i != 0, "segment {i}");
        assert!(
            big < 64 << 20,
            "tensors() with segment {i} claiming {new} bytes allocated {big} bytes before failing"
        );
        let (r, big) =
            largest_alloc(|| p.decode_segment_to(&ONE, i, &mut std::io::sink(), &|_| {}));
        assert!(r.is_err());
        assert!(big < 64 << 20, "decode_segment_to allocated {big} bytes");
    }
    // A wrong original CRC is caught after decoding.
    let mut b = ar.clone();
    b[entry_at[1] + 33] ^= 1;
    reseal_index(&mut b);
    let p = Archive::parse(&b).unwrap();
    assert!(matches!(p.decode_segment(&ONE, 1), Err(Error::Checksum(_))));
    // Many segments claimed, few present.
    let mut b = ar.clone();
    b[io..io + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal_index(&mut b);
    let (r, big) = largest_alloc(|| Archive::parse(&b).err());
    assert!(r.is_some());
    assert!(big < 1 << 20, "{big}");
    // A checksum count that overflows.
    let mut b = ar.clone();
    b[entry_at[0] + 37..entry_at[0] + 41].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal_index(&mut b);
    assert!(Archive::parse(&b).is_err());
    // The header segment at the limit is parsed (and fails later, at its blob's length); one byte
    // more is refused by the parse.
    for (extra, ok) in [(0u64, true), (1, false)] {
        let mut b = ar.clone();
        let new = tensorzip::archive::MAX_SAFETENSORS_HEADER + extra;
        let grow = new - a.segments[0].orig_len;
        b[entry_at[0] + 9..entry_at[0] + 17].copy_from_slice(&new.to_le_bytes());
        for j in 1..n {
            let off = a.segments[j].orig_offset + grow;
            b[entry_at[j] + 1..entry_at[j] + 9].copy_from_slice(&off.to_le_bytes());
        }
        b[16..24].copy_from_slice(&(a.original_len + grow).to_le_bytes());
        reseal_index(&mut b);
        let p = Archive::parse(&b);
        assert_eq!(p.is_ok(), ok, "{new}");
        if let Ok(p) = p {
            let (r, big) = largest_alloc(|| p.tensors(&ONE));
            assert!(r.is_err() && big < 64 << 20, "{big}");
        }
    }
    // Hand-made archives of an original of 0 bytes whose sizes all agree: no segment at all, and
    // one header segment with an empty blob (FORMAT.md section 9: n >= 1, blob_len >= 1).
    let archive_of = |index: &[u8]| {
        let mut b = ar[..ARCHIVE_HEADER_LEN].to_vec();
        b[8..12].copy_from_slice(&0u32.to_le_bytes());
        b[16..24].copy_from_slice(&0u64.to_le_bytes());
        b[24..32].copy_from_slice(&(ARCHIVE_HEADER_LEN as u64).to_le_bytes());
        b.extend_from_slice(index);
        b.extend_from_slice(&crc32(index).to_le_bytes());
        b
    };
    let e = Archive::parse(&archive_of(&0u32.to_le_bytes()))
        .err()
        .unwrap();
    assert!(
        matches!(e, Error::Corrupt(ref m) if m.contains("no segments")),
        "{e:?}"
    );
    let mut index = 1u32.to_le_bytes().to_vec();
    index.push(0); // kind: the safetensors header
    for field in [0u64, 0, ARCHIVE_HEADER_LEN as u64, 0] {
        index.extend_from_slice(&field.to_le_bytes());
    }
    index.extend_from_slice(&0u32.to_le_bytes()); // orig_crc of no bytes
    index.extend_from_slice(&1u32.to_le_bytes()); // one CRC (piece size 0)
    index.extend_from_slice(&0u32.to_le_bytes());
    let e = Archive::parse(&archive_of(&index)).err().unwrap();
    assert!(
        matches!(e, Error::Corrupt(ref m) if m.contains("empty blob")),
        "{e:?}"
    );
}

/// A safetensors header comes out of a compressed segment, so a few kilobytes of archive can make
/// one of the format's largest size (100 MB): reading it must take memory in proportion to it, not
/// a multiple that a generic JSON tree costs (~16 bytes a byte: 1.6 GB for an array of zeros).
#[test]
fn large_forged_headers_are_read_in_proportion() {
    let head_of = |json: &str| {
        let mut h = (json.len() as u64).to_le_bytes().to_vec();
        h.extend_from_slice(json.as_bytes());
        h
    };
    let zeros = vec!["0"; 2 << 20].join(",");
    // An array where a tensor's entry must be an object: refused at its first number.
    let head = head_of(&format!("{{\"a\":[{zeros}]}}"));
    let (r, big) = largest_alloc(|| tensorzip::archive::parse_header(&head));
    assert!(matches!(r, Err(Error::NotSafetensors(_))), "{r:?}");
    assert!(
        big < 1 << 20,
        "{big} bytes for an entry that is not an object"
    );
    // A shape of 2^21 dimensions: kept as numbers (8 bytes per 2 bytes of JSON), and refused
    // later, where a tensor's rank is checked against what the blob format holds.
    let head = head_of(&format!(
        "{{\"a\":{{\"dtype\":\"U8\",\"shape\":[{zeros}],\"data_offsets\":[0,0]}}}}"
    ));
    let (r, big) = largest_alloc(|| tensorzip::archive::parse_header(&head));
    assert_eq!(r.unwrap().1[0].shape.len(), 2 << 20);
    assert!(
        big <= 5 * head.len(),
        "{big} bytes for a header of {}",
        head.len()
    );
    // Metadata: strings only (as the safetensors crate reads it), sorted by key; a name given
    // twice keeps its last entry.
    let t = |o: u64| format!("{{\"dtype\":\"U8\",\"shape\":[{o}],\"data_offsets\":[0,{o}]}}");
    let json = format!(
        "{{\"b\":{},\"__metadata__\":{{\"z\":\"1\",\"k\":\"v\"}},\"b\":{},\"x\":{{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1],\"extra\":[1,{{}}]}}}}",
        t(3),
        t(2)
    );
    let (base, list, meta) = tensorzip::archive::parse_header_metadata(&head_of(&json)).unwrap();
    assert_eq!(base, 8 + json.len() as u64);
    let names: Vec<_> = list
        .iter()
        .map(|e| (e.name.as_str(), e.end - e.begin))
        .collect();
    assert_eq!(names, [("x", 1), ("b", 2)]);
    assert_eq!(
        meta.unwrap(),
        [
            ("k".to_string(), "v".to_string()),
            ("z".to_string(), "1".to_string())
        ]
    );
    let json = "{\"__metadata__\":{\"k\":1}}";
    assert!(tensorzip::archive::parse_header_metadata(&head_of(json)).is_err());
}

/// The header and the other bytes of a file are coded as bytes (FORMAT.md section 9): a header
/// segment coded with wider units (whose constant units would make a forged header of the largest
/// size out of fewer bytes still) is refused, though its blob and checksums are right.
#[test]
fn header_segments_that_are_not_bytes_are_corrupt() {
    use tensorzip::archive::{safetensors_header, ArchiveWriter};
    let head = safetensors_header(&[("a", "U8", &[2][..], 2)], None).unwrap();
    let file = [&head[..], &[1u8, 2]].concat();
    let segs = plan_safetensors(&file).unwrap();
    assert_eq!(segs.len(), 2);
    let opts = CompressOptions::default();
    for (dtype, shape) in [
        (DType::U8, vec![head.len() as u64]),
        (DType::U16, vec![head.len() as u64 / 2]),
        (DType::U8, vec![head.len() as u64 / 2, 2]),
    ] {
        let blobs = [
            tensorzip::compress(&head, dtype, &shape, &opts).unwrap(),
            tensorzip::compress(&[1, 2], DType::U8, &[2], &opts).unwrap(),
        ];
        let path = temp_path("u16-header");
        let mut out = new_file(&path);
        let mut w = ArchiveWriter::new(&mut out, 0).unwrap();
        let crcs = [crc32(&head), crc32(&[1, 2])];
        w.append(&segs, &crcs, |w| {
            for b in &blobs {
                w.write_all(b).unwrap();
            }
            Ok(blobs.iter().map(|b| b.len() as u64).collect())
        })
        .unwrap();
        w.finish(file.len() as u64).unwrap();
        drop(out);
        let ar = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let a = Archive::parse(&ar).unwrap();
        if dtype == DType::U8 && shape.len() == 1 {
            assert_eq!(restore(&ar).unwrap(), file);
            continue;
        }
        let e = a.tensors(&ONE).unwrap_err();
        assert!(
            matches!(e, Error::Corrupt(ref m) if m.contains("not a u8 blob")),
            "{dtype:?} {shape:?}: {e:?}"
        );
        assert!(restore(&ar).is_err());
    }
}

/// The archive's per-segment calls that return a `Result` refuse a segment index past the last.
#[test]
fn segment_indices_past_the_last_are_errors() {
    let (_, ar) = small_archive(0);
    let a = Archive::parse(&ar).unwrap();
    let n = a.segments.len();
    for i in [n, n + 1, usize::MAX] {
        assert!(matches!(a.check_blob(i), Err(Error::InvalidInput(_))));
        assert!(matches!(a.check_segment(i), Err(Error::InvalidInput(_))));
        assert!(matches!(
            a.segment_layout_unverified(i),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(a.check_decoded(i, 0), Err(Error::InvalidInput(_))));
        assert!(matches!(
            a.decode_segment(&ONE, i),
            Err(Error::InvalidInput(_))
        ));
        let mut sink = std::io::sink();
        assert!(matches!(
            a.decode_segment_to(&ONE, i, &mut sink, &|_| {}),
            Err(Error::InvalidInput(_))
        ));
    }
}

// ---------------------------------------------------------------------------------------------------
// Conditioned planes.

#[test]
fn conditional_tables_that_lie_are_errors() {
    for dtype in [DType::BF16, DType::F32] {
        let blob = cond_blob(dtype);
        let l = Layout::parse(&blob);
        let secs = l.sections();
        let (cp, _) = dtype.conditioned_plane().unwrap();
        let (value_at, table_at, table_len) = secs[cp].cond.unwrap();
        let edit = |f: &dyn Fn(&mut Layout)| {
            let mut m = l.clone();
            f(&mut m);
            m.build()
        };
        // Flags other than 0 and 1.
        for v in [2u8, 3, 128, 255] {
            let msg = assert_corrupt(
                &edit(&|m| m.tables[secs[cp].flag_at] = v),
                &format!("{dtype}: flag {v}"),
            );
            assert!(msg.contains("flag"), "{msg}");
        }
        // A conditional table on a plane that cannot have one: the flag of another plane set (its
        // value and table are then read from what follows, so any error will do), or the table moved.
        for p in (0..l.planes).filter(|&p| p != cp) {
            expect_err(
                &edit(&|m| m.tables[secs[p].flag_at] = 1),
                &format!("{dtype}: flag on plane {p}"),
            );
        }
        // The conditional table removed: the chunks that use it are corrupt.
        let b = edit(&|m| {
            m.tables.drain(value_at..table_at + table_len);
            m.tables[secs[cp].flag_at] = 0;
        });
        let msg = assert_corrupt(&b, &format!("{dtype}: conditional table removed"));
        assert!(msg.contains("condition"), "{msg}");
        // A conditional table of one symbol.
        let b = edit(&|m| {
            m.tables
                .splice(table_at..table_at + table_len, [7u8, 7, 255]);
        });
        let msg = assert_corrupt(&b, &format!("{dtype}: single-symbol conditional table"));
        assert!(msg.contains("one symbol"), "{msg}");
        // Malformed conditional tables.
        for (what, i, v) in [
            ("lo > hi", 0usize, 255u8),
            ("zero at lo", 2, 0),
            ("invalid code", 2, 208),
            ("zero at hi", table_len - 1, 0),
        ] {
            let b = edit(&|m| m.tables[table_at + i] = v);
            let msg = assert_corrupt(&b, &format!("{dtype}: conditional table {what}"));
            assert!(msg.contains("table"), "{what}: {msg}");
        }
        // Truncated inside the conditional table.
        let cut = l.header.len() + table_at + table_len / 2;
        assert!(matches!(
            expect_err(&blob[..cut], "cut in the conditional table"),
            Error::Truncated(_)
        ));
        // Every condition value, and every byte of the conditional table with a few values: never a
        // panic (a different condition value decodes different bytes or fails).
        for v in 0..=255u8 {
            decode_everything(
                &edit(&|m| m.tables[value_at] = v),
                &format!("{dtype}: condition value {v}"),
            );
        }
        let mut rng = Rng::new(31);
        let spots: Vec<usize> = [0, 1, 2, 3, table_len - 2, table_len - 1]
            .into_iter()
            .chain((0..16).map(|_| (rng.next_u64() % table_len as u64) as usize))
            .collect();
        for i in spots {
            for v in [0u8, 1, 100, 207, 208, 255] {
                decode_everything(
                    &edit(&|m| m.tables[table_at + i] = v),
                    &format!("{dtype}: conditional table byte {i} = {v}"),
                );
            }
        }
    }
}

#[test]
fn conditioned_chunks_that_lie_are_errors() {
    for dtype in [DType::BF16, DType::F32] {
        let blob = cond_blob(dtype);
        let l = Layout::parse(&blob);
        let (cp, q) = dtype.conditioned_plane().unwrap();
        let c = 1;
        assert_eq!(l.mode(c, cp), (3, 0));
        // Conditioned mode on a plane without a conditional table.
        for p in (0..l.planes).filter(|&p| p != cp) {
            let mut m = l.clone();
            m.set_mode(c, p, (3, 0));
            let msg = assert_corrupt(&m.build(), &format!("{dtype}: plane {p} conditioned"));
            assert!(msg.contains("condition"), "{msg}");
        }
        // The conditioned plane in another mode, and its condition plane in every mode.
        for mode in [(0u8, 0u8), (1, 0), (2, 0)] {
            let mut m = l.clone();
            m.set_mode(c, cp, mode);
            expect_err(
                &m.build(),
                &format!("{dtype}: conditioned plane in mode {mode:?}"),
            );
            let mut m = l.clone();
            m.set_mode(c, q, mode);
            decode_everything(
                &m.build(),
                &format!("{dtype}: condition plane in mode {mode:?}"),
            );
        }
        // The raw area one byte short or long: the conditioned plane's raw bytes run out or are left.
        for delta in [-1i32, 1] {
            let mut m = l.clone();
            if delta < 0 {
                m.payloads[c].pop();
            } else {
                m.payloads[c].push(0);
            }
            m.sync_lens();
            let msg = assert_corrupt(&m.build(), &format!("{dtype}: raw area {delta:+}"));
            assert!(msg.contains("raw") || msg.contains("rANS"), "{msg}");
        }
        // No rANS stream: everything after the selectors is taken as raw bytes.
        let nb = l.chunk_len(c).div_ceil(l.block_units);
        let sel_len = nb * (0..l.planes).filter(|&p| l.mode(c, p) == (2, 0)).count();
        let mut m = l.clone();
        let rl = m.rans_len(c) as usize;
        m.payloads[c].drain(sel_len..sel_len + rl);
        m.set_rans_len(c, 0);
        m.sync_lens();
        expect_err(&m.build(), &format!("{dtype}: stream removed"));
        // Bytes of the chunk's payload replaced (random ones, and all of the first 300: selectors
        // and stream states): never a panic, and the other chunks still decode alone.
        let mut rng = Rng::new(dtype.code() as u64);
        let len = l.payloads[c].len();
        let spots: Vec<usize> = (0..len.min(300))
            .chain((0..300).map(|_| (rng.next_u64() % len as u64) as usize))
            .collect();
        for i in spots {
            let mut m = l.clone();
            m.payloads[c][i] = rng.next_u64() as u8;
            let b = m.build();
            decode_everything(&b, &format!("{dtype}: chunk {c} byte {i}"));
            if i % 64 == 0 {
                let dec = TensorDecoder::new(&b).unwrap();
                let cb = l.chunk_units * l.planes;
                let mut o = vec![0u8; cb];
                dec.decode_chunk(0, &mut o, &mut DecodeScratch::default())
                    .expect("an untouched chunk decodes");
            }
        }
    }
}

/// `BlobLayout::needed_len` of every prefix of a blob: `Truncated` until the prefix holds the
/// header and tables, then exactly the blob's `overhead_len` (what a reader of a blob in device
/// memory copies to the host); and on damaged bytes it fails only where `parse` fails the same way.
#[test]
fn needed_len_is_the_prefix_parse_needs() {
    use tensorzip::blob::BlobLayout;
    let mut blobs = Vec::new();
    for (i, dt) in [DType::BF16, DType::F32, DType::F16, DType::U8]
        .into_iter()
        .enumerate()
    {
        for (n, opts) in [
            (5000, small_opts()),
            (70_000, small_opts()),
            (3, CompressOptions::default()),
            (300_000, CompressOptions::default()),
        ] {
            let data = make(dt, n, Dist::Weights, 40 + i as u64);
            blobs.push(tensorzip::compress(&data, dt, &[n as u64], &opts).unwrap());
        }
    }
    blobs.push(paired_blob());
    let mut r = Rng::new(77);
    for (b, blob) in blobs.iter().enumerate() {
        let l = BlobLayout::parse(blob, blob.len()).unwrap();
        let over = l.overhead_len();
        let dir = match l.header.scheme {
            Scheme::Stored => 0,
            Scheme::Planes => l.header.n_chunks() as usize * l.header.dir_entry_len(),
        };
        for k in 0..=(over + 8).min(blob.len()) {
            match BlobLayout::needed_len(&blob[..k], blob.len()) {
                Ok(n) => {
                    assert_eq!(n, over, "blob {b}, prefix {k}");
                    assert!(
                        k >= over - dir,
                        "blob {b}, prefix {k}: told before its tables"
                    );
                }
                Err(Error::Truncated(_)) => assert!(k < over - dir, "blob {b}, prefix {k}"),
                Err(e) => panic!("blob {b}, prefix {k}: {e:?}"),
            }
        }
        // Damage in the header and tables: an error of `needed_len` is `parse`'s own.
        for _ in 0..200 {
            let mut d = blob.clone();
            let at = (r.next_u64() % (over - dir).max(1) as u64) as usize;
            d[at] ^= 1 << (r.next_u64() % 8);
            if let Err(e) = BlobLayout::needed_len(&d, d.len()) {
                let p = BlobLayout::parse(&d, d.len()).expect_err("parse accepts it");
                assert_eq!(format!("{e:?}"), format!("{p:?}"), "blob {b}, byte {at}");
            }
        }
    }
}

/// `BlobLayout::parse_prefix` (and the `prefix_to_read` it asks), followed as a reader of a blob
/// in device memory follows it (`GpuEngine::read_layouts`), from first reads of 0..=64 bytes and a
/// few larger sizes: every length it asks is more than held and at most the blob, and it ends
/// within a few rounds in what the whole blob's parse gives — the layout, or the same error — on
/// valid blobs, their truncations and bit-flipped copies, and noise.
#[test]
fn parse_prefix_ends_in_the_whole_blobs_parse() {
    use tensorzip::blob::{BlobLayout, PrefixStep};
    let mut blobs = Vec::new();
    for (i, dt) in [DType::BF16, DType::F32, DType::U8].into_iter().enumerate() {
        for n in [3, 5000, 300_000] {
            let data = make(dt, n, Dist::Weights, 90 + i as u64);
            blobs.push(tensorzip::compress(&data, dt, &[n as u64], &small_opts()).unwrap());
        }
    }
    blobs.push(paired_blob());
    let follow = |blob: &[u8], first: usize| -> (tensorzip::Result<Box<BlobLayout>>, usize) {
        let mut held = first.min(blob.len());
        for round in 1..=64 {
            match BlobLayout::parse_prefix(&blob[..held], blob.len()) {
                PrefixStep::Parsed(r) => return (r, round),
                PrefixStep::Want(n) => {
                    assert!(
                        n > held && n <= blob.len(),
                        "asked {n} holding {held} of {}",
                        blob.len()
                    );
                    held = n;
                }
            }
        }
        panic!("did not settle from a first read of {first}");
    };
    let same = |blob: &[u8], first: usize, what: &str| -> usize {
        let (got, rounds) = follow(blob, first);
        match (got, BlobLayout::parse(blob, blob.len())) {
            (Ok(g), Ok(w)) => {
                assert_eq!(g.header, w.header, "{what}, first read {first}");
                assert_eq!(
                    g.overhead_len(),
                    w.overhead_len(),
                    "{what}, first read {first}"
                );
            }
            (Err(g), Err(w)) => {
                assert_eq!(
                    format!("{g:?}"),
                    format!("{w:?}"),
                    "{what}, first read {first}"
                )
            }
            (g, w) => panic!(
                "{what}, first read {first}: {:?} against {:?}",
                g.is_ok(),
                w.is_ok()
            ),
        }
        rounds
    };
    let firsts = |len: usize| (0..=64).chain([1000, 4096, 1 << 16, len]);
    let mut r = Rng::new(5);
    for (b, blob) in blobs.iter().enumerate() {
        for first in firsts(blob.len()) {
            let rounds = same(blob, first, &format!("blob {b}"));
            assert!(rounds <= 3, "blob {b}, first read {first}: {rounds} rounds");
        }
        let over = BlobLayout::parse(blob, blob.len()).unwrap().overhead_len();
        for cut in [
            0,
            1,
            over / 2,
            over.saturating_sub(1),
            over,
            over + 1,
            blob.len() - 1,
        ] {
            let cut = &blob[..cut.min(blob.len())];
            for first in [0, 7, 4096] {
                same(cut, first, &format!("blob {b} cut to {}", cut.len()));
            }
        }
        for _ in 0..40 {
            let mut d = blob.clone();
            let at = (r.next_u64() % over as u64) as usize;
            d[at] ^= 1 << (r.next_u64() % 8);
            for first in [0, 9, 4096] {
                same(&d, first, &format!("blob {b} flipped at {at}"));
            }
        }
    }
    for len in [0usize, 1, 100, 5000, 200_000] {
        let noise: Vec<u8> = (0..len).map(|_| r.next_u64() as u8).collect();
        assert!(follow(&noise, 4096).0.is_err(), "noise of {len} bytes");
    }
}
