//! The archive: a whole `.safetensors` file compressed, from which `decompress` restores the original
//! file byte for byte (its header, metadata and any padding included).
//!
//! Every byte range of the original file becomes one blob: the safetensors header (the 8-byte length
//! and the JSON), each tensor (coded with its dtype and shape), and any other bytes. The blobs follow
//! each other in file order, then an index gives each range's offsets, the CRC-32 of its original
//! bytes and the CRC-32s of its blob. Layout and validation: `docs/FORMAT.md`, "Archive".

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};

use crate::checksum::crc32_pieces;
use crate::dtype::DType;
use crate::engine::CpuEngine;
use crate::error::{corrupt, truncated, Error, Result};
use crate::mapped::MappedFile;
use crate::options::CompressOptions;

/// First four bytes of an archive.
pub const ARCHIVE_MAGIC: [u8; 4] = *b"TZAR";
/// The archive version this build writes and reads.
pub const ARCHIVE_VERSION: u16 = 1;
/// Bytes of the fixed archive header.
pub const ARCHIVE_HEADER_LEN: usize = 32;
/// Bytes of one index entry before its blob checksums.
const ENTRY_FIXED: usize = 1 + 8 * 4 + 4 + 4;

/// The most bytes the header segment (the 8-byte length and the JSON) may have: the safetensors
/// crate's limit on the JSON (100,000,000 bytes, which `plan_safetensors` inherits from it) plus 8.
pub const MAX_SAFETENSORS_HEADER: u64 = 8 + 100_000_000;

/// What a byte range of the original file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SegmentKind {
    /// The safetensors header: 8-byte length and JSON (coded as bytes).
    Header = 0,
    /// One tensor's data (coded with its dtype and shape).
    Tensor = 1,
    /// Any other bytes (coded as bytes).
    Other = 2,
}

/// One byte range of the original file, as the compressor sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSegment {
    pub kind: SegmentKind,
    pub offset: u64,
    pub len: u64,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Tensor name (empty for non-tensor segments).
    pub name: String,
}

/// A safetensors tensor as listed in its file's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    /// The safetensors dtype name (`"BF16"`, ...).
    pub dtype_name: String,
    pub shape: Vec<u64>,
    /// Offsets in the file (not in the data section).
    pub begin: u64,
    pub end: u64,
}

/// Parses and validates a safetensors file's header (given the whole file, or at least its header and
/// the file's total length) and lists its tensors in data order, plus the header's byte length.
pub fn safetensors_layout(file: &[u8]) -> Result<(u64, Vec<TensorEntry>)> {
    if is_archive(file) {
        return Err(Error::NotSafetensors(
            "it is a tensorzip archive already (`tensorzip decompress` restores its file)".into(),
        ));
    }
    let (n, meta) = safetensors::SafeTensors::read_metadata(file).map_err(|e| {
        Error::NotSafetensors(match e {
            // The safetensors crate's own words, plus what its rule is: tensors' bytes are
            // consecutive ranges from 0 with no gap or overlap (tensorzip keeps that rule, so
            // that every file it accepts is one the reference reader loads).
            safetensors::SafeTensorError::InvalidOffset(_) => format!(
                "{e} (the tensors' data ranges must follow one another from 0, \
                 with no gap and no overlap)"
            ),
            e => e.to_string(),
        })
    })?;
    let base = 8 + n as u64;
    let mut tensors: Vec<TensorEntry> = meta
        .tensors()
        .into_iter()
        .map(|(name, info)| TensorEntry {
            name,
            dtype_name: format!("{:?}", info.dtype),
            shape: info.shape.iter().map(|&d| d as u64).collect(),
            begin: base + info.data_offsets.0 as u64,
            end: base + info.data_offsets.1 as u64,
        })
        .collect();
    tensors.sort_by(|a, b| (a.begin, a.end, &a.name).cmp(&(b.begin, b.end, &b.name)));
    Ok((base, tensors))
}

/// Parses a safetensors header alone (the 8-byte length and the JSON) and lists its tensors in data
/// order, with file offsets. Checks the JSON's structure but not the data section (which is absent).
pub fn parse_header(head: &[u8]) -> Result<(u64, Vec<TensorEntry>)> {
    parse_header_metadata(head).map(|(base, tensors, _)| (base, tensors))
}

/// [`parse_header`], and the header's `__metadata__` (string to string, sorted by key; `None`
/// without one).
///
/// The JSON is read into typed fields (`dtype`, `shape`, `data_offsets`; a tensor's other fields
/// and the key order are not kept): a header is at most [`MAX_SAFETENSORS_HEADER`] bytes, but it
/// comes out of a compressed segment, so a small forged archive can make one of that size out of
/// a few kilobytes, and a generic JSON tree of it took ~16 bytes per input byte (1.6 GB for a
/// 100 MB array of zeros in a 17 KB archive). Typed, the largest is a shape of small numbers:
/// 8 bytes per 2 input bytes. A name given twice keeps its last entry, as the safetensors crate
/// reads it.
pub fn parse_header_metadata(head: &[u8]) -> Result<HeaderParts> {
    let bad = |m: String| Error::NotSafetensors(m);
    if head.len() < 8 {
        return Err(bad("shorter than its 8-byte header length".into()));
    }
    let n = u64::from_le_bytes(head[..8].try_into().unwrap());
    if n != head.len() as u64 - 8 {
        return Err(bad(format!(
            "header length {n} does not match {} header bytes",
            head.len() - 8
        )));
    }
    let json: header_json::Header =
        serde_json::from_slice(&head[8..]).map_err(|e| bad(format!("header JSON: {e}")))?;
    let base = head.len() as u64;
    let mut tensors = Vec::with_capacity(json.tensors.len());
    for (name, t) in json.tensors {
        let (b, e) = t.data_offsets;
        if b > e {
            return Err(bad(format!("tensor {name:?}: data_offsets [{b}, {e}]")));
        }
        let begin = base
            .checked_add(b)
            .ok_or_else(|| bad("offsets overflow".into()))?;
        let end = base
            .checked_add(e)
            .ok_or_else(|| bad("offsets overflow".into()))?;
        tensors.push(TensorEntry {
            name,
            dtype_name: t.dtype,
            shape: t.shape,
            begin,
            end,
        });
    }
    tensors.sort_by(|a, b| (a.begin, a.end, &a.name).cmp(&(b.begin, b.end, &b.name)));
    let metadata = json.metadata.map(|m| m.into_iter().collect());
    Ok((base, tensors, metadata))
}

/// What [`parse_header_metadata`] returns: the header's length (where the data starts), its
/// tensors in data order, its `__metadata__`.
pub type HeaderParts = (u64, Vec<TensorEntry>, Option<Vec<(String, String)>>);

/// The typed form of a safetensors header's JSON ([`parse_header_metadata`]).
mod header_json {
    use std::collections::BTreeMap;

    /// One tensor's entry; other fields are skipped without being kept.
    #[derive(serde::Deserialize)]
    pub(super) struct Tensor {
        pub dtype: String,
        pub shape: Vec<u64>,
        pub data_offsets: (u64, u64),
    }

    pub(super) struct Header {
        pub tensors: BTreeMap<String, Tensor>,
        pub metadata: Option<BTreeMap<String, String>>,
    }

    impl<'de> serde::Deserialize<'de> for Header {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Header, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Header;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object of tensors")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Header, A::Error> {
                    let mut h = Header {
                        tensors: BTreeMap::new(),
                        metadata: None,
                    };
                    while let Some(key) = map.next_key::<String>()? {
                        if key == "__metadata__" {
                            h.metadata = Some(map.next_value()?);
                        } else {
                            let t: Tensor = map.next_value().map_err(|e| {
                                serde::de::Error::custom(format!("tensor {key:?}: {e}"))
                            })?;
                            h.tensors.insert(key, t);
                        }
                    }
                    Ok(h)
                }
            }
            d.deserialize_map(Visit)
        }
    }
}

/// Serialises tensors as a `.safetensors` file: `(name, safetensors dtype name, shape, bytes)` in the
/// order given, optional `__metadata__`, the header padded with spaces to a multiple of 8 bytes.
pub fn serialize_safetensors(
    tensors: &[(&str, &str, &[u64], &[u8])],
    metadata: Option<&[(String, String)]>,
) -> Result<Vec<u8>> {
    let list: Vec<(&str, &str, &[u64], u64)> = tensors
        .iter()
        .map(|&(n, d, s, b)| (n, d, s, b.len() as u64))
        .collect();
    let head = safetensors_header(&list, metadata)?;
    let mut out = Vec::with_capacity(head.len() + list.iter().map(|t| t.3 as usize).sum::<usize>());
    out.extend_from_slice(&head);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    Ok(out)
}

/// The header (8-byte length, then the JSON padded with spaces to a multiple of 8 bytes) of the
/// `.safetensors` file holding `(name, safetensors dtype name, shape, byte count)` back to back in
/// the order given.
pub fn safetensors_header(
    tensors: &[(&str, &str, &[u64], u64)],
    metadata: Option<&[(String, String)]>,
) -> Result<Vec<u8>> {
    let mut header = serde_json::Map::new();
    if let Some(m) = metadata {
        let obj: serde_json::Map<String, serde_json::Value> = m
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        header.insert("__metadata__".into(), serde_json::Value::Object(obj));
    }
    let mut off = 0u64;
    for (name, dtype, shape, len) in tensors {
        // The header's one reserved key: a tensor of that name would be read back as metadata.
        if *name == "__metadata__" {
            return Err(Error::InvalidInput(
                "\"__metadata__\" is reserved for the header's metadata, not a tensor name".into(),
            ));
        }
        if header.contains_key(*name) {
            return Err(Error::InvalidInput(format!(
                "tensor name {name:?} appears twice"
            )));
        }
        let end = off + len;
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [off, end]}),
        );
        off = end;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(header))
        .map_err(|e| Error::InvalidInput(e.to_string()))?;
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    // What a reader (ours, and the safetensors crate) refuses is refused here, before anything
    // is written: a save that replaced a good file with an unreadable one would lose it.
    if 8 + json.len() as u64 > MAX_SAFETENSORS_HEADER {
        return Err(Error::InvalidInput(format!(
            "the safetensors header would be {} bytes; the format allows at most {} \
             (long metadata or very many tensors)",
            8 + json.len(),
            MAX_SAFETENSORS_HEADER
        )));
    }
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// The segments of the `.safetensors` file made of `header` (from [`safetensors_header`]) and the
/// tensors `(name, safetensors dtype name, shape, byte count)` back to back: what
/// [`plan_safetensors`] gives for that file, without the file.
pub fn plan_tensors(header_len: u64, tensors: &[(&str, &str, &[u64], u64)]) -> Vec<SourceSegment> {
    let mut segs = vec![header_segment(header_len)];
    let mut pos = header_len;
    for &(name, dtype, shape, len) in tensors {
        segs.push(tensor_segment(name, dtype, shape, pos, len));
        pos += len;
    }
    segs
}

/// The segment of the safetensors header (`len` bytes at the start of the file), coded as bytes.
fn header_segment(len: u64) -> SourceSegment {
    SourceSegment {
        kind: SegmentKind::Header,
        offset: 0,
        len,
        dtype: DType::U8,
        shape: vec![len],
        name: String::new(),
    }
}

/// The segment of one tensor: coded with its dtype and shape when tensorzip has the dtype and the
/// byte count matches the shape, else as bytes.
fn tensor_segment(
    name: &str,
    dtype_name: &str,
    shape: &[u64],
    offset: u64,
    len: u64,
) -> SourceSegment {
    let (dtype, shape) = tensor_coding(dtype_name, shape, len);
    SourceSegment {
        kind: SegmentKind::Tensor,
        offset,
        len,
        dtype,
        shape,
        name: name.to_string(),
    }
}

/// The dtype and shape a safetensors tensor of `len` bytes is coded with: its own where tensorzip
/// has the dtype, the byte count matches the shape and a blob can hold its rank, else bytes
/// (`U8`, one dimension) — dtypes tensorzip does not model (F4, F8_E8M0, ...), entries whose size
/// disagrees with their shape, and tensors of more than [`crate::blob::MAX_RANK`] dimensions
/// (valid safetensors, which `compress` refused before).
pub fn tensor_coding(dtype_name: &str, shape: &[u64], len: u64) -> (DType, Vec<u64>) {
    let dtype = DType::from_safetensors_name(dtype_name);
    let numel: Option<u64> = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    match (dtype, numel) {
        (Some(d), Some(n))
            if n.checked_mul(d.itemsize() as u64) == Some(len)
                && shape.len() <= crate::blob::MAX_RANK =>
        {
            (d, shape.to_vec())
        }
        _ => (DType::U8, vec![len]),
    }
}

/// Splits a safetensors file into the segments the archive codes.
pub fn plan_safetensors(file: &[u8]) -> Result<Vec<SourceSegment>> {
    let (base, tensors) = safetensors_layout(file)?;
    let mut segs = vec![header_segment(base)];
    let mut pos = base;
    for t in tensors {
        if t.begin < pos || t.end < t.begin || t.end > file.len() as u64 {
            return Err(Error::NotSafetensors(format!(
                "tensor {:?} overlaps another or lies outside the file",
                t.name
            )));
        }
        if t.begin > pos {
            segs.push(other(pos, t.begin - pos));
        }
        segs.push(tensor_segment(
            &t.name,
            &t.dtype_name,
            &t.shape,
            t.begin,
            t.end - t.begin,
        ));
        pos = t.end;
    }
    if pos < file.len() as u64 {
        segs.push(other(pos, file.len() as u64 - pos));
    }
    Ok(segs)
}

fn other(offset: u64, len: u64) -> SourceSegment {
    SourceSegment {
        kind: SegmentKind::Other,
        offset,
        len,
        dtype: DType::U8,
        shape: vec![len],
        name: String::new(),
    }
}

/// Options of the archive writer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ArchiveOptions {
    pub compress: CompressOptions,
    /// The blob checksums cover pieces of this many bytes (cuZipNN's `checksum_chunk_bytes`); 0 means
    /// one checksum per blob.
    pub checksum_piece_bytes: u32,
}

/// One index entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub kind: SegmentKind,
    pub orig_offset: u64,
    pub orig_len: u64,
    pub blob_offset: u64,
    pub blob_len: u64,
    /// CRC-32 of the original bytes.
    pub orig_crc: u32,
    /// CRC-32 of each piece of the blob.
    pub blob_crcs: Vec<u32>,
}

/// Number of checksum pieces of a blob of `len` bytes.
fn n_pieces(len: u64, piece: u32) -> u64 {
    if piece == 0 {
        1
    } else {
        len.div_ceil(piece as u64).max(1)
    }
}

/// A writer the blob encoders can seek in (blobs reserve their directory and fill it in last). It
/// is `Send`: the CPU engine writes one batch of chunks from a pool thread while the next is coded.
pub trait SeekWrite: Write + Seek + Send {}
impl<T: Write + Seek + Send> SeekWrite for T {}

/// An engine that writes blobs into an archive: the CPU engine, or the GPU engine of
/// `tensorzip-cuda`. Every engine writes the same bytes.
pub trait BlobEncoder {
    /// Compresses a tensor into `w` at its current position (as [`CpuEngine::compress_to`]) and
    /// returns the blob's length; `progress` gets the original bytes handled so far.
    fn encode_blob(
        &self,
        data: &[u8],
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
        w: &mut dyn SeekWrite,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<u64>;

    /// Compresses several tensors (`(bytes, dtype, shape)`) into memory, one blob each, with the
    /// bytes [`BlobEncoder::encode_blob`] writes. `write_archive` hands over runs of small tensors
    /// this way; this default codes them one after the other.
    fn encode_blobs(&self, items: &[BlobItem<'_>], opts: &CompressOptions) -> Result<Vec<Vec<u8>>> {
        items
            .iter()
            .map(|&(data, dtype, shape)| {
                let mut cur = std::io::Cursor::new(Vec::new());
                let n = self.encode_blob(data, dtype, shape, opts, &mut cur, &|_| {})?;
                let mut blob = cur.into_inner();
                blob.truncate(n as usize);
                Ok(blob)
            })
            .collect()
    }

    /// Compresses tensors one after the other into `w`, each blob where the one before it ends,
    /// and returns each blob's length and the CRC-32 of the tensor's original bytes; `progress`
    /// gets a tensor's index and its original bytes handled so far. The first `lead` tensors are
    /// small ones (a run of [`small_runs`]) that may be coded together, the rest large ones.
    /// `write_archive` hands over its runs this way; this default codes the lead with
    /// [`BlobEncoder::encode_blobs`] and the others with [`BlobEncoder::encode_blob`] in turn,
    /// each large tensor's checksum taken just before it is coded (so that a caller giving back a
    /// mapped file's pages once they are coded, `mapped::Spent`, never has a whole run read in).
    fn encode_blob_seq(
        &self,
        items: &[BlobItem<'_>],
        lead: usize,
        opts: &CompressOptions,
        w: &mut dyn SeekWrite,
        progress: &(dyn Fn(usize, u64) + Sync),
    ) -> Result<Vec<(u64, u32)>> {
        let io = |e: std::io::Error| Error::Io(e.to_string());
        let Some(small) = items.get(..lead) else {
            return Err(Error::InvalidInput(format!(
                "{lead} leading tensors of {}",
                items.len()
            )));
        };
        let blobs = self.encode_blobs(small, opts)?;
        if blobs.len() != small.len() {
            return Err(Error::Engine(format!(
                "{} blobs for {} tensors",
                blobs.len(),
                small.len()
            )));
        }
        let mut done = Vec::with_capacity(items.len());
        for (k, blob) in blobs.into_iter().enumerate() {
            w.write_all(&blob).map_err(io)?;
            done.push((blob.len() as u64, crate::checksum::crc32(small[k].0)));
            progress(k, small[k].0.len() as u64);
        }
        for (k, &(data, dtype, shape)) in items.iter().enumerate().skip(lead) {
            let crc = crate::checksum::crc32(data);
            let start = w.stream_position().map_err(io)?;
            let len = self.encode_blob(data, dtype, shape, opts, w, &|d| progress(k, d))?;
            w.seek(SeekFrom::Start(start + len)).map_err(io)?;
            done.push((len, crc));
        }
        Ok(done)
    }
}

/// A tensor to compress: its bytes, dtype and shape.
pub type BlobItem<'a> = (&'a [u8], DType, &'a [u64]);

impl BlobEncoder for CpuEngine {
    fn encode_blob(
        &self,
        data: &[u8],
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
        w: &mut dyn SeekWrite,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<u64> {
        self.compress_to(data, dtype, shape, opts, &mut &mut *w, progress)
    }

    /// The tensors are coded concurrently (each with the chunk parallelism it has): a model's small
    /// tensors have a few chunks each and a table search that is mostly sequential, so one at a
    /// time they left a second core idle (MiniLM fp32 on 2 cores: 1.3x one core).
    fn encode_blobs(&self, items: &[BlobItem<'_>], opts: &CompressOptions) -> Result<Vec<Vec<u8>>> {
        let mut blobs: Vec<Vec<u8>> = items
            .iter()
            .map(|i| crate::fresh::with_capacity(i.0.len() + SMALL_BLOB_SLACK as usize))
            .collect();
        self.compress_many_into(items, opts, &mut blobs)?;
        Ok(blobs)
    }

    /// The lead is coded while the model of the first large tensor is built, and the model of
    /// each large tensor while the one before it is coded ([`CpuEngine::compress_seq_to`]).
    fn encode_blob_seq(
        &self,
        items: &[BlobItem<'_>],
        lead: usize,
        opts: &CompressOptions,
        w: &mut dyn SeekWrite,
        progress: &(dyn Fn(usize, u64) + Sync),
    ) -> Result<Vec<(u64, u32)>> {
        self.compress_seq_to(items, lead, opts, &mut &mut *w, progress)
    }
}

/// The runs of segments of `lens` bytes that [`write_archive`] codes together: consecutive segments
/// each under [`SMALL_SEGMENT_BYTES`], at most [`SMALL_GROUP_BYTES`] in all, each counted with
/// [`SMALL_BLOB_SLACK`] more (a larger segment is a run of its own). The slack bounds the number
/// of segments in a run: a file of a million one-byte tensors (a 100 MB header) made a single run
/// whose blobs' buffers alone took gigabytes.
pub fn small_runs(lens: &[u64]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < lens.len() {
        let mut j = i;
        let mut group = 0;
        while j < lens.len()
            && lens[j] < SMALL_SEGMENT_BYTES
            && group + lens[j] + SMALL_BLOB_SLACK <= SMALL_GROUP_BYTES
        {
            group += lens[j] + SMALL_BLOB_SLACK;
            j += 1;
        }
        let end = j.max(i + 1);
        runs.push(i..end);
        i = end;
    }
    runs
}

/// The runs of segments of `lens` bytes that [`write_archive`] hands to the engine in one call
/// ([`BlobEncoder::encode_blob_seq`]): a run of [`small_runs`] (its *lead*, possibly empty)
/// followed by the larger segments after it, up to the next small one. A run of small segments
/// not followed by a large one is a run of its own.
pub fn encode_runs(lens: &[u64]) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for run in small_runs(lens) {
        match runs.last_mut() {
            Some(last) if is_large(lens, &run) => last.end = run.end,
            _ => runs.push(run),
        }
    }
    runs
}

/// Whether `run` (of [`small_runs`]) is one large segment.
fn is_large(lens: &[u64], run: &std::ops::Range<usize>) -> bool {
    lens.get(run.start)
        .is_some_and(|&l| l >= SMALL_SEGMENT_BYTES)
}

/// The number of small segments a run of [`encode_runs`] starts with (its lead, coded together);
/// the segments after them are large ones, coded one after the other.
pub fn lead_len(lens: &[u64], run: &std::ops::Range<usize>) -> usize {
    run.clone()
        .take_while(|&i| lens.get(i).is_some_and(|&l| l < SMALL_SEGMENT_BYTES))
        .count()
}

/// `write_archive` codes runs of segments smaller than this together ([`BlobEncoder::encode_blobs`]),
/// at most [`SMALL_GROUP_BYTES`] of them at a time (their blobs are held in memory until written).
pub const SMALL_SEGMENT_BYTES: u64 = 4 << 20;
/// See [`SMALL_SEGMENT_BYTES`]. 24 MiB since 2026-12-02: with 8 MiB (about one MiniLM layer) the
/// groups' ends, where the last tensor's mostly sequential table search runs alone, held two
/// threads at a median 1.58x one on MiniLM fp32 (compress); 24 MiB 1.78x (docs/BENCHMARKS.md). Peak
/// memory stays under the file + 64 MiB: 125.5 MB for MiniLM fp32 (91 MB), 252 MB for 216 MB of
/// incompressible 3.6 MB tensors (their blobs as large as the input).
pub const SMALL_GROUP_BYTES: u64 = 24 << 20;
/// Room reserved past a small segment's length for its blob (header, tables, directory; a blob
/// that needs more grows its buffer), and what each segment counts for besides its bytes in
/// [`small_runs`]. 64 KiB before 2026-12-05.
pub const SMALL_BLOB_SLACK: u64 = 4096;

/// The bytes of each segment of a file being archived: a whole file in memory (`[u8]`), or pieces
/// kept elsewhere (e.g. tensors in their own buffers), so that no copy of the whole file is needed.
pub trait SegmentBytes {
    /// The bytes of segment `i` (described by `seg`).
    fn segment(&self, i: usize, seg: &SourceSegment) -> &[u8];
}

impl SegmentBytes for [u8] {
    fn segment(&self, _i: usize, seg: &SourceSegment) -> &[u8] {
        &self[seg.offset as usize..(seg.offset + seg.len) as usize]
    }
}

/// Compresses the segments of `src` into `out`, which is truncated and rewritten. Returns the archive's
/// length. `progress` receives the original bytes handled so far.
pub fn write_archive(
    engine: &dyn BlobEncoder,
    src: &(impl SegmentBytes + ?Sized),
    segments: &[SourceSegment],
    opts: &ArchiveOptions,
    out: &mut File,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<u64> {
    opts.compress.validate()?;
    let mut aw = ArchiveWriter::new(out, opts.checksum_piece_bytes)?;
    let bytes_of = |i: usize| -> Result<&[u8]> {
        let (s, data) = (&segments[i], src.segment(i, &segments[i]));
        if data.len() as u64 != s.len {
            return Err(Error::InvalidInput(format!(
                "segment {i} has {} bytes, {} expected",
                data.len(),
                s.len
            )));
        }
        Ok(data)
    };
    let lens: Vec<u64> = segments.iter().map(|s| s.len).collect();
    for run in encode_runs(&lens) {
        let (i, j) = (run.start, run.end);
        let items = (i..j)
            .map(|k| Ok((bytes_of(k)?, segments[k].dtype, &segments[k].shape[..])))
            .collect::<Result<Vec<BlobItem<'_>>>>()?;
        // The run's small segments are coded together, into memory, and written in order; the
        // large ones after them are streamed into the file one after the other. The engine
        // takes the original bytes' checksums as it goes.
        let lead = lead_len(&lens, &run);
        aw.append_checked(&segments[i..j], |w| {
            engine.encode_blob_seq(&items, lead, &opts.compress, w, &|k, done| {
                progress(segments[i + k].offset + done)
            })
        })?;
    }
    aw.finish(segments.last().map_or(0, |s| s.offset + s.len))
}

/// An archive being written (FORMAT.md section 9): segments' blobs appended in order, then
/// [`ArchiveWriter::finish`] takes the blobs' checksums, writes the index and the header. The
/// engines' path is [`write_archive`]; a caller whose segments are not host bytes (the Python
/// package's `save_file` of CUDA tensors, encoded on the GPU) appends blobs it makes itself.
pub struct ArchiveWriter<'f> {
    w: std::io::BufWriter<&'f mut File>,
    checksum_piece_bytes: u32,
    entries: Vec<Segment>,
    pos: u64,
}

impl<'f> ArchiveWriter<'f> {
    /// Truncates `out` and starts the archive in it (its blobs go after the header's place).
    pub fn new(out: &'f mut File, checksum_piece_bytes: u32) -> Result<ArchiveWriter<'f>> {
        let io = |e: std::io::Error| Error::Io(e.to_string());
        out.set_len(0).map_err(io)?;
        out.seek(SeekFrom::Start(ARCHIVE_HEADER_LEN as u64))
            .map_err(io)?;
        Ok(ArchiveWriter {
            w: std::io::BufWriter::with_capacity(1 << 20, out),
            checksum_piece_bytes,
            entries: Vec::new(),
            pos: ARCHIVE_HEADER_LEN as u64,
        })
    }

    /// Appends the blobs of `segs` (whose original bytes have the CRC-32s `orig_crcs`): `write`
    /// writes them one after the other from the current position and returns their lengths.
    /// Segments must be appended in the order of their offsets, each starting where the one
    /// before ended. After an error the archive cannot be finished: the caller discards the file
    /// (both callers write a temporary file and rename it only on success).
    pub fn append(
        &mut self,
        segs: &[SourceSegment],
        orig_crcs: &[u32],
        write: impl FnOnce(&mut dyn SeekWrite) -> Result<Vec<u64>>,
    ) -> Result<()> {
        if orig_crcs.len() != segs.len() {
            return Err(Error::InvalidInput(format!(
                "{} checksums for {} segments",
                orig_crcs.len(),
                segs.len()
            )));
        }
        self.append_checked(segs, |w| {
            let lens = write(w)?;
            if lens.len() != orig_crcs.len() {
                return Err(Error::Engine(format!(
                    "{} blobs written for {} segments",
                    lens.len(),
                    segs.len()
                )));
            }
            Ok(lens.into_iter().zip(orig_crcs.iter().copied()).collect())
        })
    }

    /// [`ArchiveWriter::append`] where `write` returns, for each segment, its blob's length and
    /// the CRC-32 of its original bytes (taken as they were coded).
    pub fn append_checked(
        &mut self,
        segs: &[SourceSegment],
        write: impl FnOnce(&mut dyn SeekWrite) -> Result<Vec<(u64, u32)>>,
    ) -> Result<()> {
        let io = |e: std::io::Error| Error::Io(e.to_string());
        let mut next = self.covered();
        for s in segs {
            if s.offset != next {
                return Err(Error::InvalidInput(format!(
                    "segment at offset {} appended where {next} was expected",
                    s.offset
                )));
            }
            next = s.offset + s.len;
        }
        let written = write(&mut self.w)?;
        if written.len() != segs.len() {
            return Err(Error::Engine(format!(
                "{} blobs written for {} segments",
                written.len(),
                segs.len()
            )));
        }
        for (s, (len, orig_crc)) in segs.iter().zip(written) {
            self.entries.push(Segment {
                kind: s.kind,
                orig_offset: s.offset,
                orig_len: s.len,
                blob_offset: self.pos,
                blob_len: len,
                orig_crc,
                blob_crcs: Vec::new(),
            });
            self.pos += len;
        }
        // An engine may leave the position elsewhere (a blob's directory is written after its
        // payloads): the next blob starts where this one ended.
        self.w.seek(SeekFrom::Start(self.pos)).map_err(io)?;
        Ok(())
    }

    /// The original bytes the segments appended so far cover (they start at 0 and follow one
    /// another).
    fn covered(&self) -> u64 {
        self.entries
            .last()
            .map_or(0, |e| e.orig_offset + e.orig_len)
    }

    /// Takes the blobs' checksums, writes the index and the archive's header, for an original of
    /// `original_len` bytes (the segments appended must cover it). Returns the archive's length.
    pub fn finish(self, original_len: u64) -> Result<u64> {
        let io = |e: std::io::Error| Error::Io(e.to_string());
        let covered = self.covered();
        if covered != original_len {
            return Err(Error::InvalidInput(format!(
                "segments cover {covered} bytes of {original_len}"
            )));
        }
        let ArchiveWriter {
            w,
            checksum_piece_bytes,
            mut entries,
            pos,
        } = self;
        let out = w.into_inner().map_err(|e| io(e.into_error()))?;
        // Blob checksums, read back from the file (it is in the page cache) in windows of at most
        // 1 MiB, a window per thread at a time, so that a large blob does not cost its size in
        // memory: through a mapping of the file where it maps (no copy; each window's pages given
        // back once hashed), else by reads.
        // SAFETY: the file is the archive this writer is writing (a temporary file of its caller);
        // it is mapped read-only and dropped before the index is written, and a change by another
        // process would only give wrong checksums.
        let map = unsafe { MappedFile::map(out) }.ok();
        {
            let mut reader = BlobReader::new(checksum_piece_bytes, map.as_ref());
            for e in &mut entries {
                e.blob_crcs = reader.checksums(out, e.blob_offset, e.blob_len)?;
            }
        }
        // With the truncation guard installed, a page that could not be read (the file shortened
        // by another process, an I/O error) read as zeros: checksums of zeros must not be kept.
        if map.as_ref().is_some_and(|m| m.changed()) {
            return Err(Error::Io(
                "the archive being written was shortened or changed while its checksums were taken"
                    .into(),
            ));
        }
        drop(map);
        let mut index = Vec::new();
        index.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for e in &entries {
            index.push(e.kind as u8);
            for v in [e.orig_offset, e.orig_len, e.blob_offset, e.blob_len] {
                index.extend_from_slice(&v.to_le_bytes());
            }
            index.extend_from_slice(&e.orig_crc.to_le_bytes());
            index.extend_from_slice(&(e.blob_crcs.len() as u32).to_le_bytes());
            for c in &e.blob_crcs {
                index.extend_from_slice(&c.to_le_bytes());
            }
        }
        let crc = crc32fast::hash(&index);
        index.extend_from_slice(&crc.to_le_bytes());
        out.seek(SeekFrom::Start(pos)).map_err(io)?;
        out.write_all(&index).map_err(io)?;
        let end = pos + index.len() as u64;
        out.set_len(end).map_err(io)?;
        let mut head = Vec::with_capacity(ARCHIVE_HEADER_LEN);
        head.extend_from_slice(&ARCHIVE_MAGIC);
        head.extend_from_slice(&ARCHIVE_VERSION.to_le_bytes());
        head.extend_from_slice(&0u16.to_le_bytes());
        head.extend_from_slice(&checksum_piece_bytes.to_le_bytes());
        head.extend_from_slice(&0u32.to_le_bytes());
        head.extend_from_slice(&original_len.to_le_bytes());
        head.extend_from_slice(&pos.to_le_bytes());
        out.seek(SeekFrom::Start(0)).map_err(io)?;
        out.write_all(&head).map_err(io)?;
        out.flush().map_err(io)?;
        Ok(end)
    }
}

/// Reads blobs back from an archive being written and takes their checksums (CRC-32 of every
/// `piece` bytes; of the whole blob when `piece` is 0): windows of the blob (at most 1 MiB, a
/// multiple of the piece where the piece is smaller) are read and hashed by all of rayon's threads
/// at once, into buffers kept from blob to blob, and the hashes of the parts of a piece that
/// spans windows are combined (`crc32fast::Hasher::combine`). The sequential loop before (1 MiB
/// reads, one hasher) was 27 ms of a 311 ms two-thread `tensorzip compress` of 256 MiB fp32
/// (2026-12-04, Intel VM; the read's copy and the CRC about half each). With a mapping of the file
/// the windows are slices of it instead of copies (the reads' copy was ~8% of the samples of a
/// two-thread compress of a 1.68 GB file, 2026-12-05).
struct BlobReader<'m> {
    piece: u64,
    /// One buffer per window read at once.
    bufs: Vec<Vec<u8>>,
    window: u64,
    /// The file mapped, if it maps: windows are read from it, and its pages given back once hashed.
    map: Option<&'m MappedFile>,
}

impl<'m> BlobReader<'m> {
    fn new(piece: u32, map: Option<&'m MappedFile>) -> BlobReader<'m> {
        const WINDOW_BYTES: u64 = 1 << 20;
        let piece = piece as u64;
        let window = match piece {
            1..WINDOW_BYTES => WINDOW_BYTES / piece * piece,
            _ => WINDOW_BYTES,
        };
        let threads = rayon::current_num_threads().clamp(1, 16);
        BlobReader {
            piece,
            bufs: vec![Vec::new(); threads],
            window,
            map,
        }
    }

    /// The checksums of the `len` bytes at `offset` of `file`.
    fn checksums(&mut self, file: &File, offset: u64, len: u64) -> Result<Vec<u32>> {
        use rayon::prelude::*;
        let (w, piece) = (self.window, self.piece);
        // The index stores the count as a u32 (FORMAT.md, the archive's index).
        if piece > 0 && len.div_ceil(piece) > u32::MAX as u64 {
            return Err(Error::InvalidOption(format!(
                "checksum_chunk_bytes = {piece} gives a blob of {len} bytes more than 2^32 - 1 \
                 checksums; use larger pieces"
            )));
        }
        // Where the part of a blob that starts at `at` ends: the next piece's start, or `end`.
        let part_end = |at: u64, end: u64| match piece {
            0 => end,
            p => (at / p + 1).saturating_mul(p).min(end),
        };
        let n = len.div_ceil(w);
        let mut crcs = Vec::new();
        let mut cur = crc32fast::Hasher::new();
        let mut k0 = 0;
        while k0 < n {
            let k1 = (k0 + self.bufs.len() as u64).min(n);
            let map = self.map;
            // Per window, its parts' hashes and whether each ends a piece.
            let done: Vec<Result<Vec<(crc32fast::Hasher, bool)>>> = self.bufs[..(k1 - k0) as usize]
                .par_iter_mut()
                .enumerate()
                .map(|(i, buf)| {
                    let at = (k0 + i as u64) * w;
                    let end = (at + w).min(len);
                    let span = (offset + at) as usize..(offset + end) as usize;
                    let buf: &[u8] = match map.and_then(|m| m.get(span)) {
                        Some(mapped) => mapped,
                        None => {
                            buf.resize((end - at) as usize, 0);
                            read_at(file, buf, offset + at)?;
                            buf
                        }
                    };
                    let mut parts = Vec::new();
                    let mut a = at;
                    while a < end {
                        let b = part_end(a, end);
                        let mut h = crc32fast::Hasher::new();
                        h.update(&buf[(a - at) as usize..(b - at) as usize]);
                        let ends = piece > 0 && (b % piece == 0 || b == len);
                        parts.push((h, ends));
                        a = b;
                    }
                    Ok(parts)
                })
                .collect();
            for parts in done {
                for (h, ends) in parts? {
                    cur.combine(&h);
                    if ends {
                        crcs.push(std::mem::replace(&mut cur, crc32fast::Hasher::new()).finalize());
                    }
                }
            }
            if let Some(m) = self.map {
                m.release((offset + k0 * w) as usize..(offset + (k1 * w).min(len)) as usize);
            }
            k0 = k1;
        }
        if piece == 0 {
            crcs.push(cur.finalize());
        }
        Ok(crcs)
    }
}

/// Fills `buf` from `file` at `offset` (without moving the file's position on Unix, so that
/// threads can read at once).
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> Result<()> {
    let io = |e: std::io::Error| Error::Io(e.to_string());
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        file.read_exact_at(buf, offset).map_err(io)
    }
    #[cfg(not(unix))]
    {
        // One reader at a time elsewhere: a shared position.
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        use std::io::Read;
        let mut f = file;
        f.seek(SeekFrom::Start(offset)).map_err(io)?;
        f.read_exact(buf).map_err(io)
    }
}

/// A parsed and validated archive.
pub struct Archive<'a> {
    data: &'a [u8],
    pub original_len: u64,
    pub checksum_piece_bytes: u32,
    /// Shared, so that [`Archive::index`] and [`ArchiveIndex::over`] cost nothing per call.
    pub segments: std::sync::Arc<[Segment]>,
}

/// An archive's validated index without the bytes it was parsed from ([`Archive::index`]): a
/// reader that keeps a file open parses it once and makes the [`Archive`] of each call with
/// [`ArchiveIndex::over`] instead of parsing the index again (the Python reader's `load_file` of
/// 16,000 tensors took 36 s parsing it per tensor).
#[derive(Debug, Clone)]
pub struct ArchiveIndex {
    original_len: u64,
    checksum_piece_bytes: u32,
    segments: std::sync::Arc<[Segment]>,
    data_len: usize,
}

impl ArchiveIndex {
    /// The archive of this index over `data`, the bytes it was parsed from. Only their length is
    /// checked (every offset was validated against it, so every range stays inside); bytes
    /// changed since then fail the checksums this index holds, as a damaged archive does.
    pub fn over<'a>(&self, data: &'a [u8]) -> Result<Archive<'a>> {
        if data.len() != self.data_len {
            return Err(Error::Io(format!(
                "the archive is {} bytes, not the {} it had when its index was read",
                data.len(),
                self.data_len
            )));
        }
        Ok(Archive {
            data,
            original_len: self.original_len,
            checksum_piece_bytes: self.checksum_piece_bytes,
            segments: self.segments.clone(),
        })
    }

    /// The segments.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }
}

fn u64_at(d: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(d[at..at + 8].try_into().unwrap())
}
fn u32_at(d: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(d[at..at + 4].try_into().unwrap())
}

/// What bytes that are not an archive look like, for the error that says so: a safetensors file (an
/// 8-byte header length that fits, then `{`) or a single blob.
fn what_it_is(data: &[u8]) -> &'static str {
    let st_len = data
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0xFF; 8])));
    match st_len {
        Some(n) if n >= 2 && n <= data.len() as u64 - 8 && data.get(8) == Some(&b'{') => {
            "; it is a safetensors file: `tensorzip compress` makes an archive of it"
        }
        _ if data.starts_with(&crate::blob::BLOB_MAGIC) => {
            "; it is a single tensorzip blob (a tensor compressed alone), not an archive of a file"
        }
        _ => "",
    }
}

/// Whether `data` starts with the archive magic number.
pub fn is_archive(data: &[u8]) -> bool {
    data.len() >= 4 && data[..4] == ARCHIVE_MAGIC
}

impl<'a> Archive<'a> {
    /// Parses the header and the index and checks that they describe a consistent archive: the index's
    /// own CRC matches, the segments tile the original file in order, the blobs tile the space between
    /// the header and the index in order.
    pub fn parse(data: &'a [u8]) -> Result<Archive<'a>> {
        if data.len() < 4 || data[..4] != ARCHIVE_MAGIC {
            return Err(Error::NotAnArchive(what_it_is(data).into()));
        }
        if data.len() < 6 {
            return truncated("archive header");
        }
        let version = u16::from_le_bytes([data[4], data[5]]);
        if version != ARCHIVE_VERSION {
            return Err(Error::UnsupportedVersion {
                found: version,
                supported: ARCHIVE_VERSION,
            });
        }
        if data.len() < ARCHIVE_HEADER_LEN {
            return truncated("archive header");
        }
        if data[6..8] != [0, 0] || data[12..16] != [0; 4] {
            return corrupt("reserved archive header bytes are not zero");
        }
        let piece = u32_at(data, 8);
        let original_len = u64_at(data, 16);
        let index_offset = u64_at(data, 24);
        if index_offset < ARCHIVE_HEADER_LEN as u64 || index_offset > data.len() as u64 {
            return truncated(format!(
                "index at offset {index_offset} of a {}-byte archive",
                data.len()
            ));
        }
        let idx = &data[index_offset as usize..];
        if idx.len() < 8 {
            return truncated("archive index");
        }
        let n = u32_at(idx, 0) as usize;
        if n == 0 {
            // Every archive has at least the safetensors header's segment.
            return corrupt("archive index lists no segments");
        }
        let mut at = 4;
        let mut segments = Vec::new();
        let mut orig = 0u64;
        let mut blob = ARCHIVE_HEADER_LEN as u64;
        for i in 0..n {
            if idx.len() < at + ENTRY_FIXED {
                return truncated(format!("archive index entry {i}"));
            }
            let kind = match idx[at] {
                0 => SegmentKind::Header,
                1 => SegmentKind::Tensor,
                2 => SegmentKind::Other,
                k => return corrupt(format!("segment {i} has unknown kind {k}")),
            };
            let e = Segment {
                kind,
                orig_offset: u64_at(idx, at + 1),
                orig_len: u64_at(idx, at + 9),
                blob_offset: u64_at(idx, at + 17),
                blob_len: u64_at(idx, at + 25),
                orig_crc: u32_at(idx, at + 33),
                blob_crcs: Vec::new(),
            };
            let nc = u32_at(idx, at + 37) as u64;
            at += ENTRY_FIXED;
            if e.orig_offset != orig || e.blob_offset != blob {
                return corrupt(format!("segment {i} is out of place"));
            }
            if (i == 0) != (kind == SegmentKind::Header) {
                return corrupt("the first segment (and only it) must be the safetensors header");
            }
            if e.blob_len == 0 {
                // A blob has at least its header.
                return corrupt(format!("segment {i} has an empty blob"));
            }
            if kind == SegmentKind::Header && e.orig_len > MAX_SAFETENSORS_HEADER {
                // Every reader decodes this segment into memory first: a claim past what any
                // safetensors file can have (a few bytes of constant chunks can claim gigabytes)
                // is refused before anything is allocated for it.
                return corrupt(format!(
                    "the safetensors header segment claims {} bytes (at most {MAX_SAFETENSORS_HEADER})",
                    e.orig_len
                ));
            }
            if nc != n_pieces(e.blob_len, piece) {
                return corrupt(format!("segment {i} has {nc} checksums"));
            }
            let Some(crc_end) = (nc as usize)
                .checked_mul(4)
                .and_then(|b| b.checked_add(at))
                .filter(|&x| x <= idx.len())
            else {
                return truncated(format!("checksums of segment {i}"));
            };
            let crcs = idx[at..crc_end]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            at = crc_end;
            orig = orig
                .checked_add(e.orig_len)
                .ok_or_else(|| Error::Corrupt("sizes overflow".into()))?;
            blob = blob
                .checked_add(e.blob_len)
                .ok_or_else(|| Error::Corrupt("sizes overflow".into()))?;
            if blob > index_offset {
                return corrupt(format!("blob of segment {i} runs into the index"));
            }
            segments.push(Segment {
                blob_crcs: crcs,
                ..e
            });
        }
        if idx.len() < at + 4 {
            return truncated("archive index checksum");
        }
        if crc32fast::hash(&idx[..at]) != u32_at(idx, at) {
            return Err(Error::Checksum("archive index".into()));
        }
        if idx.len() != at + 4 {
            return corrupt(format!(
                "{} bytes after the archive index",
                idx.len() - at - 4
            ));
        }
        if blob != index_offset {
            return corrupt("blobs do not end where the index starts");
        }
        if orig != original_len {
            return corrupt(format!(
                "segments cover {orig} of {original_len} original bytes"
            ));
        }
        Ok(Archive {
            data,
            original_len,
            checksum_piece_bytes: piece,
            segments: segments.into(),
        })
    }

    /// This archive's index, to make it again over the same bytes without parsing
    /// ([`ArchiveIndex::over`]).
    pub fn index(&self) -> ArchiveIndex {
        ArchiveIndex {
            original_len: self.original_len,
            checksum_piece_bytes: self.checksum_piece_bytes,
            segments: self.segments.clone(),
            data_len: self.data.len(),
        }
    }

    /// Segment `i`, or an error naming the index where there is no such segment (the methods
    /// below that return a `Result` check `i` with it; those that do not panic, as slices do).
    fn segment(&self, i: usize) -> Result<&Segment> {
        self.segments.get(i).ok_or_else(|| {
            Error::InvalidInput(format!(
                "segment {i} of an archive of {} segments",
                self.segments.len()
            ))
        })
    }

    /// The blob of segment `i`. Panics if there is no segment `i`.
    pub fn blob(&self, i: usize) -> &'a [u8] {
        &self.data[self.blob_range(i)]
    }

    /// Where the blob of segment `i` lies in the archive's bytes (`parse` checked it lies inside).
    /// Panics if there is no segment `i`.
    pub fn blob_range(&self, i: usize) -> std::ops::Range<usize> {
        let s = &self.segments[i];
        s.blob_offset as usize..(s.blob_offset + s.blob_len) as usize
    }

    /// The stored CRC-32 of the whole of segment `i`'s blob, if the archive keeps one checksum per
    /// blob (`checksum_piece_bytes` 0, the default), else `None`. Panics if there is no segment
    /// `i`.
    pub fn whole_blob_crc(&self, i: usize) -> Option<u32> {
        match (self.checksum_piece_bytes, &self.segments[i].blob_crcs[..]) {
            (0, &[c]) => Some(c),
            _ => None,
        }
    }

    /// Checks segment `i`'s blob against its stored checksums.
    pub fn check_blob(&self, i: usize) -> Result<()> {
        let stored = &self.segment(i)?.blob_crcs;
        let blob = self.blob(i);
        let got = if self.checksum_piece_bytes == 0 {
            vec![crate::checksum::crc32(blob)]
        } else {
            crc32_pieces(blob, self.checksum_piece_bytes as usize)?
        };
        match got.iter().zip(stored).position(|(a, b)| a != b) {
            None if got.len() == stored.len() => Ok(()),
            None => Err(Error::Checksum(format!(
                "segment {i}: {} blob checksums stored for {} pieces",
                stored.len(),
                got.len()
            ))),
            Some(p) => Err(Error::Checksum(format!("segment {i}: blob piece {p}"))),
        }
    }

    /// Checks segment `i`'s blob checksums and that its header agrees with the index on the length.
    pub fn check_segment(&self, i: usize) -> Result<()> {
        self.segment_layout(i).map(|_| ())
    }

    /// [`Archive::check_segment`], returning the blob's validated layout (for callers that plan
    /// the decoding themselves, e.g. the GPU engine, instead of parsing the blob a second time).
    pub fn segment_layout(&self, i: usize) -> Result<crate::blob::BlobLayout> {
        self.check_blob(i)?;
        self.segment_layout_unverified(i)
    }

    /// [`Archive::segment_layout`] without the blob's checksums: the layout parsed (the parser
    /// accepts any bytes safely) and checked against the index. For a caller that checksums the
    /// blob on its way elsewhere (the GPU engine's upload, against [`Archive::whole_blob_crc`]);
    /// nothing decoded from the blob may be used before that check passes.
    pub fn segment_layout_unverified(&self, i: usize) -> Result<crate::blob::BlobLayout> {
        let s = self.segment(i)?;
        let blob = self.blob(i);
        // A full parse (directory included) bounds the length by what the blob can hold.
        let layout = crate::blob::BlobLayout::parse(blob, blob.len())?;
        let n = layout.header.nbytes();
        if n != s.orig_len {
            return corrupt(format!(
                "segment {i} decodes to {n} bytes, not {}",
                s.orig_len
            ));
        }
        // The header and the other bytes are bytes (FORMAT.md §9): coded with a wider unit, a
        // header of constant units would be a smaller forgery still.
        let h = &layout.header;
        if s.kind != SegmentKind::Tensor && (h.dtype != DType::U8 || h.shape != [s.orig_len]) {
            return corrupt(format!(
                "segment {i} ({:?}) is not a u8 blob of shape [{}]",
                s.kind, s.orig_len
            ));
        }
        Ok(layout)
    }

    /// Checks segment `i`'s blob, decodes it into `w`, and checks the CRC-32 of what it decoded.
    pub fn decode_segment_to<W: Write + Send>(
        &self,
        engine: &CpuEngine,
        i: usize,
        w: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<()> {
        self.check_segment(i)?;
        self.decode_checked_to(engine, i, w, progress)
    }

    /// [`Archive::decode_segment_to`] of a segment that [`Archive::check_segment`] has passed.
    fn decode_checked_to<W: Write + Send>(
        &self,
        engine: &CpuEngine,
        i: usize,
        w: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<()> {
        let crc = engine.decompress_to(self.blob(i), w, progress)?;
        self.check_decoded(i, crc)
    }

    /// Checks `crc`, the CRC-32 of what segment `i` decoded to (by any engine), against the
    /// original's.
    pub fn check_decoded(&self, i: usize, crc: u32) -> Result<()> {
        match crc == self.segment(i)?.orig_crc {
            true => Ok(()),
            false => Err(Error::Checksum(format!("segment {i}: decoded data"))),
        }
    }

    /// Decodes segments `range` into memory, concurrently (checksums checked): for runs of small
    /// segments ([`small_runs`]), which one at a time leave cores idle.
    pub fn decode_segments(
        &self,
        engine: &CpuEngine,
        range: std::ops::Range<usize>,
    ) -> Result<Vec<Vec<u8>>> {
        use rayon::prelude::*;
        let segs = self.segments.get(range.clone()).ok_or_else(|| {
            Error::InvalidInput(format!("segments {range:?} of {}", self.segments.len()))
        })?;
        let first = range.start;
        engine.run(|| {
            (0..segs.len())
                .into_par_iter()
                .map(|k| self.decode_segment(engine, first + k))
                .collect()
        })
    }

    /// Decodes segments `segs` into `outs` (segment `segs[k]` into `outs[k]`, which must hold
    /// exactly its original bytes), concurrently: each blob's checksums are checked before it is
    /// decoded and the decoded bytes' CRC-32 after, as [`Archive::decode_segment`] does. Buffers
    /// the caller owns, e.g. a whole model's tensors, filled in one call: one tensor at a time
    /// left cores idle on a model's small tensors (a chunk or two each) and on the checksum of
    /// each large one. On failure the error of the first failing segment in `segs`' order is
    /// returned (after every segment was tried) and the buffers' contents are unspecified.
    pub fn decode_segments_into(
        &self,
        engine: &CpuEngine,
        segs: &[usize],
        outs: &mut [&mut [u8]],
    ) -> Result<()> {
        self.decode_segments_into_then(engine, segs, outs, &|_| {})
    }

    /// [`Archive::decode_segments_into`], calling `read(i)` (from any thread) once the blob of
    /// segment `i` has been read for the last time, decoded or not: a reader of a mapped file gives
    /// its pages back then (`mapped::MappedFile::release`).
    pub fn decode_segments_into_then(
        &self,
        engine: &CpuEngine,
        segs: &[usize],
        outs: &mut [&mut [u8]],
        read: &(dyn Fn(usize) + Sync),
    ) -> Result<()> {
        use rayon::prelude::*;
        if segs.len() != outs.len() {
            return Err(Error::InvalidInput(format!(
                "{} buffers for {} segments",
                outs.len(),
                segs.len()
            )));
        }
        for (&i, out) in segs.iter().zip(outs.iter()) {
            let s = self.segments.get(i).ok_or_else(|| {
                Error::InvalidInput(format!("segment {i} of {}", self.segments.len()))
            })?;
            if out.len() as u64 != s.orig_len {
                return Err(Error::OutputSize {
                    expected: s.orig_len as usize,
                    got: out.len(),
                });
            }
        }
        let results: Vec<Result<()>> = engine.run(|| {
            segs.par_iter()
                .zip(outs.par_iter_mut())
                .map(|(&i, out)| {
                    let decoded = self
                        .check_segment(i)
                        .and_then(|()| engine.decompress_into_crc(self.blob(i), out));
                    read(i);
                    self.check_decoded(i, decoded?)
                })
                .collect()
        });
        results.into_iter().collect()
    }

    /// Decodes every segment into `w`, in order, checking every checksum: runs of small segments
    /// ([`small_runs`], as [`write_archive`] coded them) concurrently into memory and then written,
    /// a large segment streamed. What `tensorzip decompress` writes. `progress` receives the
    /// original bytes written so far.
    pub fn decode_all_to<W: Write + Send>(
        &self,
        engine: &CpuEngine,
        w: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<()> {
        let io = |e: std::io::Error| Error::Io(e.to_string());
        let lens: Vec<u64> = self.segments.iter().map(|s| s.orig_len).collect();
        for run in small_runs(&lens) {
            if run.len() > 1 {
                let bufs = self.decode_segments(engine, run.clone())?;
                for (i, b) in run.zip(bufs) {
                    w.write_all(&b).map_err(io)?;
                    progress(self.segments[i].orig_offset + b.len() as u64);
                }
                continue;
            }
            let i = run.start;
            let base = self.segments[i].orig_offset;
            self.decode_segment_to(engine, i, w, &|done| progress(base + done))?;
        }
        Ok(())
    }

    /// Decodes segment `i` into memory (checksums checked).
    pub fn decode_segment(&self, engine: &CpuEngine, i: usize) -> Result<Vec<u8>> {
        // Only a length the blob itself confirms is allocated — which can still be far more
        // than the blob (constant chunks), so a refused allocation is an error, not an abort.
        self.check_segment(i)?;
        let mut out = crate::fresh::try_with_capacity(self.segments[i].orig_len)?;
        self.decode_checked_to(engine, i, &mut out, &|_| {})?;
        Ok(out)
    }

    /// The original file's safetensors header (segment 0 decoded).
    pub fn safetensors_header(&self, engine: &CpuEngine) -> Result<Vec<u8>> {
        if self.segments.is_empty() {
            return corrupt("archive has no segments");
        }
        self.decode_segment(engine, 0)
    }

    /// The tensors listed in the original header, each with the index of its segment.
    pub fn tensors(&self, engine: &CpuEngine) -> Result<Vec<(TensorEntry, usize)>> {
        let head = self.safetensors_header(engine)?;
        let (_, tensors) =
            parse_header(&head).map_err(|e| Error::Corrupt(format!("stored header: {e}")))?;
        // Each tensor's segment: the first tensor segment of its range (a search per tensor from
        // the start was quadratic: 7 s for 80,000 tensors).
        let mut first = std::collections::HashMap::with_capacity(self.segments.len());
        for (i, s) in self.segments.iter().enumerate() {
            if s.kind == SegmentKind::Tensor {
                first.entry((s.orig_offset, s.orig_len)).or_insert(i);
            }
        }
        let mut out = Vec::with_capacity(tensors.len());
        for t in tensors {
            match first.get(&(t.begin, t.end - t.begin)) {
                Some(&i) => out.push((t, i)),
                None => return corrupt(format!("tensor {:?} has no segment", t.name)),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Archiving tensors from their own buffers (`plan_tensors` + a `SegmentBytes` of pieces) gives
    /// the same segments and the same archive bytes as archiving their serialised file.
    #[test]
    fn archives_from_pieces_equal_archives_of_the_serialised_file() {
        let a: Vec<u8> = (0..4000u32)
            .flat_map(|i| ((i % 97) as f32 * 0.01).to_le_bytes())
            .collect();
        let b: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let c: Vec<u8> = vec![3u8; 10];
        let tensors: Vec<(&str, &str, &[u64], &[u8])> = vec![
            ("a", "F32", &[40, 100], &a),
            ("b", "F8_E8M0", &[300], &b),
            ("empty", "BF16", &[0, 4], &[]),
            ("c", "U8", &[2, 5], &c),
        ];
        let meta = vec![("k".to_string(), "v".to_string())];
        let file = serialize_safetensors(&tensors, Some(&meta)).unwrap();
        let list: Vec<(&str, &str, &[u64], u64)> = tensors
            .iter()
            .map(|&(n, d, s, x)| (n, d, s, x.len() as u64))
            .collect();
        let head = safetensors_header(&list, Some(&meta)).unwrap();
        let segs = plan_tensors(head.len() as u64, &list);
        assert_eq!(segs, plan_safetensors(&file).unwrap());
        struct Pieces<'a>(&'a [u8], Vec<&'a [u8]>);
        impl SegmentBytes for Pieces<'_> {
            fn segment(&self, i: usize, _: &SourceSegment) -> &[u8] {
                if i == 0 {
                    self.0
                } else {
                    self.1[i - 1]
                }
            }
        }
        let pieces = Pieces(&head, tensors.iter().map(|t| t.3).collect());
        let opts = ArchiveOptions::default();
        let eng = CpuEngine::new(1).unwrap();
        let written = [
            archive(&|f| {
                write_archive(&eng, &file[..], &segs, &opts, f, &|_| {}).unwrap();
            }),
            archive(&|f| {
                write_archive(&eng, &pieces, &segs, &opts, f, &|_| {}).unwrap();
            }),
        ];
        assert_eq!(written[0], written[1]);
    }

    /// An archive keeps one checksum per blob by default (`whole_blob_crc`, the CRC-32 of the blob)
    /// and pieces otherwise (`None`); `segment_layout_unverified` parses a blob whose payload was
    /// damaged (the checksum is left to the caller) while `segment_layout` refuses it.
    #[test]
    fn whole_blob_checksums_and_unverified_layouts() {
        let a: Vec<u8> = (0..40_000u32)
            .flat_map(|i| ((i % 97) as f32 * 0.01).to_le_bytes())
            .collect();
        let tensors: Vec<(&str, &str, &[u64], &[u8])> = vec![("a", "F32", &[400, 100], &a)];
        let file = serialize_safetensors(&tensors, None).unwrap();
        let segs = plan_safetensors(&file).unwrap();
        let eng = CpuEngine::new(1).unwrap();
        for piece in [0u32, 4096] {
            let opts = ArchiveOptions {
                checksum_piece_bytes: piece,
                ..Default::default()
            };
            let mut bytes = archive(&|f| {
                write_archive(&eng, &file[..], &segs, &opts, f, &|_| {}).unwrap();
            });
            let ar = Archive::parse(&bytes).unwrap();
            let t = (0..ar.segments.len())
                .find(|&i| ar.segments[i].kind == SegmentKind::Tensor)
                .unwrap();
            let whole = ar.whole_blob_crc(t);
            assert_eq!(whole, (piece == 0).then(|| crc32fast::hash(ar.blob(t))));
            // The last byte of the blob: payload, not header or directory.
            let at = (ar.segments[t].blob_offset + ar.segments[t].blob_len - 1) as usize;
            drop(ar);
            bytes[at] ^= 0x10;
            let ar = Archive::parse(&bytes).unwrap();
            assert!(ar.segment_layout(t).is_err());
            assert!(ar.segment_layout_unverified(t).is_ok());
            if piece == 0 {
                assert_ne!(ar.whole_blob_crc(t), Some(crc32fast::hash(ar.blob(t))));
            }
        }
    }

    /// A tensor may not be named `__metadata__` (the header's reserved key), with or without
    /// metadata; any other name, the empty one included, is written as given.
    #[test]
    fn the_metadata_key_is_not_a_tensor_name() {
        for meta in [None, Some(&[("k".to_string(), "v".to_string())][..])] {
            let r = safetensors_header(&[("__metadata__", "F32", &[1], 4)], meta);
            assert!(
                matches!(&r, Err(Error::InvalidInput(m)) if m.contains("reserved")),
                "{r:?}"
            );
        }
        let head =
            safetensors_header(&[("", "F32", &[1], 4), ("a\"b", "U8", &[2], 2)], None).unwrap();
        let (_, list) = parse_header(&head).unwrap();
        assert_eq!(list.len(), 2);
    }

    /// `decode_segments_into` fills the caller's buffers with exactly what `decode_segment` gives,
    /// in any order of segments; refuses a buffer of the wrong size, a missing segment and a
    /// mismatched count before decoding; and reports a damaged blob (checked before decoding) and
    /// a damaged original checksum (checked after) as the first failing segment in the order
    /// asked.
    #[test]
    fn segments_decode_into_the_callers_buffers() {
        let a: Vec<u8> = (0..40_000u32)
            .flat_map(|i| ((i % 97) as f32 * 0.01).to_le_bytes())
            .collect();
        let b: Vec<u8> = (0..3000u32)
            .flat_map(|i| (i as u16).to_le_bytes())
            .collect();
        let tensors: Vec<(&str, &str, &[u64], &[u8])> = vec![
            ("a", "F32", &[400, 100], &a),
            ("e", "BF16", &[0], &[]),
            ("b", "BF16", &[3000], &b),
        ];
        let file = serialize_safetensors(&tensors, None).unwrap();
        let segs = plan_safetensors(&file).unwrap();
        let eng = CpuEngine::new(2).unwrap();
        let mut bytes = archive(&|f| {
            write_archive(
                &eng,
                &file[..],
                &segs,
                &ArchiveOptions::default(),
                f,
                &|_| {},
            )
            .unwrap();
        });
        let ar = Archive::parse(&bytes).unwrap();
        let n = ar.segments.len();
        let want: Vec<Vec<u8>> = (0..n)
            .map(|i| ar.decode_segment(&eng, i).unwrap())
            .collect();
        let order: Vec<usize> = (0..n).rev().collect();
        let mut bufs: Vec<Vec<u8>> = order.iter().map(|&i| vec![0xAB; want[i].len()]).collect();
        let mut outs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        ar.decode_segments_into(&eng, &order, &mut outs).unwrap();
        for (k, &i) in order.iter().enumerate() {
            assert_eq!(bufs[k], want[i], "segment {i}");
        }
        // Refused before anything is decoded.
        let mut short = vec![0u8; want[1].len() - 1];
        assert!(matches!(
            ar.decode_segments_into(&eng, &[1], &mut [&mut short[..]]),
            Err(Error::OutputSize { .. })
        ));
        assert!(matches!(
            ar.decode_segments_into(&eng, &[n], &mut [&mut [][..]]),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            ar.decode_segments_into(&eng, &[0, 1], &mut [&mut [][..]]),
            Err(Error::InvalidInput(_))
        ));
        // A flipped payload byte of the first tensor's blob, and the last tensor's original CRC
        // (in the index, whose own CRC is rewritten so that the archive still parses).
        let (ta, tb) = (1, n - 1);
        let at = (ar.segments[ta].blob_offset + ar.segments[ta].blob_len - 1) as usize;
        let index_offset = u64::from_le_bytes(bytes[24..32].try_into().unwrap()) as usize;
        drop(ar);
        bytes[at] ^= 0x10;
        let idx = &mut bytes[index_offset..];
        let mut pos = 4;
        for i in 0..n {
            let nc = u32::from_le_bytes(idx[pos + 37..pos + 41].try_into().unwrap()) as usize;
            if i == tb {
                idx[pos + 33] ^= 1;
            }
            pos += ENTRY_FIXED + 4 * nc;
        }
        let crc = crc32fast::hash(&idx[..pos]).to_le_bytes();
        idx[pos..pos + 4].copy_from_slice(&crc);
        let ar = Archive::parse(&bytes).unwrap();
        let mut bufs: Vec<Vec<u8>> = (0..n).map(|i| vec![0; want[i].len()]).collect();
        let mut outs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        let all: Vec<usize> = (0..n).collect();
        let first = |r: Result<()>| match r {
            Err(Error::Checksum(m)) => m,
            other => panic!("{other:?}"),
        };
        // Every blob is reported read once, the failing ones too (a reader gives its pages back).
        let read = std::sync::Mutex::new(vec![0; n]);
        let count = |i: usize| read.lock().unwrap()[i] += 1;
        let m = first(ar.decode_segments_into_then(&eng, &all, &mut outs, &count));
        assert!(m.starts_with(&format!("segment {ta}: blob")), "{m}");
        assert_eq!(*read.lock().unwrap(), vec![1; n]);
        let m = first(ar.decode_segments_into(&eng, &[tb], &mut outs[tb..]));
        assert_eq!(m, format!("segment {tb}: decoded data"));
    }

    /// An archive written segment by segment through `ArchiveWriter` (blobs made one at a time,
    /// as the GPU `save_file` does) equals `write_archive`'s; appends out of order, checksum
    /// counts that do not match and an incomplete original are refused.
    #[test]
    fn archive_writer_appends_equal_write_archive() {
        let a: Vec<u8> = (0..20_000u32)
            .flat_map(|i| ((i % 89) as f32 * 0.01).to_le_bytes())
            .collect();
        let b: Vec<u8> = (0..999u32).map(|i| (i * 5) as u8).collect();
        let tensors: Vec<(&str, &str, &[u64], &[u8])> = vec![
            ("a", "F32", &[200, 100], &a),
            ("e", "BF16", &[0, 3], &[]),
            ("b", "U8", &[999], &b),
        ];
        let file = serialize_safetensors(&tensors, None).unwrap();
        let segs = plan_safetensors(&file).unwrap();
        let eng = CpuEngine::new(2).unwrap();
        for piece in [0u32, 4096] {
            let opts = ArchiveOptions {
                checksum_piece_bytes: piece,
                ..ArchiveOptions::default()
            };
            let want = archive(&|f| {
                write_archive(&eng, &file[..], &segs, &opts, f, &|_| {}).unwrap();
            });
            let bytes_of =
                |s: &SourceSegment| &file[s.offset as usize..(s.offset + s.len) as usize];
            let got = archive(&|f| {
                let mut aw = ArchiveWriter::new(f, piece).unwrap();
                for (k, s) in segs.iter().enumerate() {
                    let data = bytes_of(s);
                    let crc = crate::checksum::crc32(data);
                    aw.append(&segs[k..k + 1], &[crc], |w| {
                        let n =
                            eng.encode_blob(data, s.dtype, &s.shape, &opts.compress, w, &|_| {})?;
                        Ok(vec![n])
                    })
                    .unwrap();
                }
                aw.finish(file.len() as u64).unwrap();
            });
            assert!(got == want, "piece {piece}");
        }
        let mut f = tempfile::tempfile().unwrap();
        let mut aw = ArchiveWriter::new(&mut f, 0).unwrap();
        let blob = |w: &mut dyn SeekWrite| -> Result<Vec<u64>> {
            w.write_all(b"x").map_err(|e| Error::Io(e.to_string()))?;
            Ok(vec![1])
        };
        // Not the first segment first; two checksums for one segment; too few blob lengths; too
        // many.
        assert!(aw.append(&segs[1..2], &[0], blob).is_err());
        assert!(aw.append(&segs[0..1], &[0, 0], blob).is_err());
        assert!(aw.append(&segs[0..2], &[0, 0], blob).is_err());
        let two = |w: &mut dyn SeekWrite| -> Result<Vec<u64>> { blob(w).map(|_| vec![1, 1]) };
        assert!(aw.append(&segs[0..1], &[0], two).is_err());
        let checked = |w: &mut dyn SeekWrite| -> Result<Vec<(u64, u32)>> {
            blob(w).map(|_| vec![(1, 0), (1, 0)])
        };
        assert!(aw.append_checked(&segs[0..1], checked).is_err());
        drop(aw);
        let mut aw = ArchiveWriter::new(&mut f, 0).unwrap();
        aw.append(&segs[0..1], &[0], blob).unwrap();
        assert!(
            aw.finish(file.len() as u64).is_err(),
            "an incomplete original"
        );
    }

    /// The bytes of the archive `src` writes into a temporary file.
    fn archive(src: &dyn Fn(&mut File)) -> Vec<u8> {
        use std::io::Read;
        let mut f = tempfile::tempfile().unwrap();
        src(&mut f);
        let mut bytes = Vec::new();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut bytes).unwrap();
        bytes
    }

    /// Blob checksums read back by windows on several threads, by reads and from a mapping of the
    /// file, equal those of the blob's bytes in memory: every piece size (none, one byte, odd,
    /// larger than a window), blobs shorter than a window, of whole windows and of a window and a
    /// bit, at odd offsets.
    #[test]
    fn blob_checksums_read_back_equal_the_bytes_checksums() {
        let bytes = crate::sample::random_bytes((3 << 20) + 777, 10);
        let path = std::env::temp_dir().join(format!("tz-crc-{}.bin", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        // SAFETY: a file of this test's own that nobody changes.
        let mapped = unsafe { MappedFile::map(&file) }.unwrap();
        for (threads, map) in [(1, None), (3, None), (1, Some(&mapped)), (3, Some(&mapped))] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for piece in [
                0u32,
                1,
                4093,
                16384,
                1 << 20,
                (1 << 20) + 1,
                3 << 20,
                u32::MAX,
            ] {
                let mut reader = pool.install(|| BlobReader::new(piece, map));
                for (offset, len) in [
                    (0u64, 0u64),
                    (5, 100),
                    (3, 1 << 20),
                    (1, (2 << 20) + 5),
                    (0, bytes.len() as u64),
                ] {
                    if piece == 1 && len > 100 {
                        continue;
                    }
                    let blob = &bytes[offset as usize..(offset + len) as usize];
                    let want = match piece {
                        0 => vec![crate::checksum::crc32(blob)],
                        p => crc32_pieces(blob, p as usize).unwrap(),
                    };
                    let got = pool
                        .install(|| reader.checksums(&file, offset, len))
                        .unwrap();
                    assert_eq!(
                        got,
                        want,
                        "{threads} threads, piece {piece}, {offset}+{len}, mapped {}",
                        map.is_some()
                    );
                    assert!(mapped[..] == bytes[..], "the mapping reads back");
                }
            }
        }
        // Past the file's end: an error, by reads and with a mapping (which falls back to them).
        for map in [None, Some(&mapped)] {
            let mut reader = BlobReader::new(0, map);
            assert!(reader.checksums(&file, 10, bytes.len() as u64).is_err());
        }
        drop(mapped);
        drop(file);
        let _ = std::fs::remove_file(&path);
    }

    /// Runs of small segments go through `encode_blobs` (concurrently on the CPU engine), in groups
    /// of at most `SMALL_GROUP_BYTES`; a large segment between them is streamed. The archive equals
    /// one written segment by segment with `encode_blob`, at 1 and 2 threads, and decodes back.
    #[test]
    fn small_segments_coded_together_write_the_same_archive() {
        use crate::sample::weights;
        let mut data: Vec<(String, &str, Vec<u64>, Vec<u8>)> = Vec::new();
        for k in 0..6 {
            data.push((
                format!("s{k}"),
                "BF16",
                vec![64, 100],
                weights(64, 100, DType::BF16, k),
            ));
        }
        // Larger than SMALL_SEGMENT_BYTES: streamed one after the other (the second is random
        // bytes, stored).
        data.push((
            "big".into(),
            "F32",
            vec![1100, 1024],
            weights(1100, 1024, DType::F32, 9),
        ));
        let random = crate::sample::random_bytes(1100 * 1024 * 4, 9);
        data.push(("rand".into(), "F32", vec![1100, 1024], random));
        data.push((
            "big2".into(),
            "BF16",
            vec![2200, 1024],
            weights(2200, 1024, DType::BF16, 10),
        ));
        // One more of these than SMALL_GROUP_BYTES holds: two groups.
        let m_bytes = 768 * 1024 * 4;
        let n_m = (SMALL_GROUP_BYTES / m_bytes) as usize + 1;
        for k in 0..n_m {
            data.push((
                format!("m{k}"),
                "F32",
                vec![768, 1024],
                weights(768, 1024, DType::F32, 20 + k as u64),
            ));
        }
        data.push((
            "last".into(),
            "F16",
            vec![33, 7],
            weights(33, 7, DType::F16, 30),
        ));
        let tensors: Vec<(&str, &str, &[u64], &[u8])> = data
            .iter()
            .map(|(n, d, s, x)| (n.as_str(), *d, &s[..], &x[..]))
            .collect();
        for big in &tensors[6..9] {
            assert!(big.3.len() as u64 > SMALL_SEGMENT_BYTES);
        }
        assert_eq!(tensors[9].3.len() as u64, m_bytes);
        assert!(n_m as u64 * m_bytes > SMALL_GROUP_BYTES);
        let file = serialize_safetensors(&tensors, None).unwrap();
        let segs = plan_safetensors(&file).unwrap();
        let opts = ArchiveOptions::default();
        /// The CPU engine with the trait's default `encode_blobs` and `encode_blob_seq`: one
        /// segment at a time.
        struct OneByOne(CpuEngine);
        impl BlobEncoder for OneByOne {
            fn encode_blob(
                &self,
                data: &[u8],
                dtype: DType,
                shape: &[u64],
                opts: &CompressOptions,
                w: &mut dyn SeekWrite,
                progress: &(dyn Fn(u64) + Sync),
            ) -> Result<u64> {
                self.0.encode_blob(data, dtype, shape, opts, w, progress)
            }
        }
        let one = OneByOne(CpuEngine::new(1).unwrap());
        let reference = archive(&|f| {
            write_archive(&one, &file[..], &segs, &opts, f, &|_| {}).unwrap();
        });
        for threads in [1, 2] {
            let eng = CpuEngine::new(threads).unwrap();
            let written = archive(&|f| {
                write_archive(&eng, &file[..], &segs, &opts, f, &|_| {}).unwrap();
            });
            assert!(written == reference, "{threads} threads: archives differ");
        }
        let ar = Archive::parse(&reference).unwrap();
        // Of the large tensors, the random one is stored and the others are coded.
        let schemes: Vec<(u64, crate::blob::Scheme)> = (0..ar.segments.len())
            .filter(|&i| ar.segments[i].orig_len > SMALL_SEGMENT_BYTES)
            .map(|i| {
                let head = crate::blob::BlobHeader::parse(ar.blob(i)).unwrap().0;
                (ar.segments[i].orig_len, head.scheme)
            })
            .collect();
        use crate::blob::Scheme::{Planes, Stored};
        let (f, b) = (1100 * 1024 * 4, 2200 * 1024 * 2);
        assert_eq!(schemes, vec![(f, Planes), (f, Stored), (b, Planes)]);
        let eng = CpuEngine::new(2).unwrap();
        let mut back = Vec::new();
        for i in 0..ar.segments.len() {
            back.extend_from_slice(&ar.decode_segment(&eng, i).unwrap());
        }
        assert!(back == file, "the archive does not decode to the file");
    }

    /// The trait's default `encode_blob_seq` refuses a lead longer than the tensors, and an
    /// engine whose `encode_blobs` returns a blob more or less than asked is an error, not a panic.
    #[test]
    fn the_default_sequence_checks_its_lead_and_the_engines_blob_count() {
        /// The CPU engine, its `encode_blobs` giving `extra` blobs more (or, below zero, fewer).
        struct Miscount(CpuEngine, i32);
        impl BlobEncoder for Miscount {
            fn encode_blob(
                &self,
                data: &[u8],
                dtype: DType,
                shape: &[u64],
                opts: &CompressOptions,
                w: &mut dyn SeekWrite,
                progress: &(dyn Fn(u64) + Sync),
            ) -> Result<u64> {
                self.0.encode_blob(data, dtype, shape, opts, w, progress)
            }
            fn encode_blobs(
                &self,
                items: &[BlobItem<'_>],
                opts: &CompressOptions,
            ) -> Result<Vec<Vec<u8>>> {
                let mut blobs = self.0.encode_blobs(items, opts)?;
                match self.1 {
                    1 => blobs.push(vec![1, 2, 3]),
                    -1 => {
                        blobs.pop();
                    }
                    _ => {}
                }
                Ok(blobs)
            }
        }
        let data = crate::sample::weights(30, 40, DType::BF16, 2);
        let shape = [30u64, 40];
        let items: Vec<BlobItem<'_>> = vec![(&data[..], DType::BF16, &shape[..]); 3];
        let opts = CompressOptions::default();
        let run = |eng: &Miscount, lead: usize| {
            let mut w = std::io::Cursor::new(Vec::new());
            eng.encode_blob_seq(&items, lead, &opts, &mut w, &|_, _| {})
        };
        let exact = Miscount(CpuEngine::new(1).unwrap(), 0);
        let done = run(&exact, 2).unwrap();
        assert_eq!(done.len(), 3);
        assert!(
            done.iter().all(|&(_, crc)| crc == crc32fast::hash(&data)),
            "the original bytes' checksums"
        );
        assert!(run(&exact, 4).is_err());
        for extra in [1, -1] {
            let eng = Miscount(CpuEngine::new(1).unwrap(), extra);
            assert!(run(&eng, 2).is_err(), "{extra} blobs more");
            // Without a lead `encode_blobs` is asked for no blobs: one more is still an error.
            assert!(
                run(&eng, 0).is_err() == (extra == 1),
                "{extra} blobs more, no lead"
            );
        }
    }
}
