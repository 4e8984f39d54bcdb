//! The per-tensor blob: header, frequency tables, chunk directory, payload.
//!
//! Layout and validation rules are normative in `docs/FORMAT.md`; this module is their implementation.
//! Parsing validates every size and offset before anything is decoded or allocated, so every
//! allocation is bounded by the length of the blob.

use crate::dtype::DType;
use crate::error::{corrupt, truncated, Error, Result};
use crate::pairs::PairTable;
use crate::rans::table::FreqTable;

/// First four bytes of every blob.
pub const BLOB_MAGIC: [u8; 4] = *b"TZBL";
/// The blob format version this build writes by default (and reads).
pub const BLOB_VERSION: u16 = 1;
/// The version of blobs with a paired exponent plane (docs/FORMAT.md, "Version 2"): written only
/// where a tensor is coded with one (`CompressOptions::pair_exponents`); read by this build too.
pub const BLOB_VERSION_PAIRED: u16 = 2;
/// Fixed part of the header before the shape.
pub const HEADER_FIXED: usize = 20;
/// Largest rank a blob may declare.
pub const MAX_RANK: usize = 64;
/// Largest chunk, in bytes of original data (cuZipNN's limit).
pub const MAX_CHUNK_BYTES: usize = 16 << 20;
/// Smallest and largest table-selection block, in units.
pub const MIN_BLOCK_UNITS: u32 = 32;
pub const MAX_BLOCK_UNITS: u32 = 65536;
/// Most frequency tables one plane may have.
pub const MAX_TABLES: usize = 64;
/// Tensors must be smaller than this many bytes.
pub const MAX_TENSOR_BYTES: u64 = 1 << 56;
/// The largest dimension a shape may have: `i64::MAX`, what torch, NumPy and safetensors' readers
/// hold a size in (a zero-size tensor's other dimensions are not bounded by its byte count: a
/// shape `[2^64 - 1, 0]` reached torch as an overflow error).
pub const MAX_DIM: u64 = i64::MAX as u64;

/// Block selector: the block is one repeated byte, stored once in the raw area.
pub const SEL_CONST: u8 = 254;
/// Block selector: the block's bytes are stored raw in the raw area.
pub const SEL_RAW: u8 = 255;

/// How a blob's payload is coded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Scheme {
    /// The original bytes, unchanged.
    Stored = 0,
    /// Transform, byte planes, rANS (the lossless scheme).
    Planes = 1,
}

/// Mode of one plane within one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaneMode {
    /// All bytes are stored raw.
    Raw,
    /// Every byte equals this value.
    Const(u8),
    /// Per-block selectors decide.
    Blocks,
    /// Conditioned on the plane's condition plane: the bytes of units whose condition byte equals the
    /// plane's condition value are rANS-coded (one sub-segment per block), the others are raw.
    Cond,
}

/// The fixed header of a blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobHeader {
    pub scheme: Scheme,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Units per chunk (0 for [`Scheme::Stored`]).
    pub chunk_units: u32,
    /// Units per table-selection block (0 for [`Scheme::Stored`]).
    pub block_units: u32,
}

impl BlobHeader {
    /// Number of elements (product of the shape; 1 for a 0-d tensor).
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
    /// Number of coded units.
    pub fn units(&self) -> u64 {
        self.numel() * self.dtype.units_per_element() as u64
    }
    /// Bytes of the original tensor.
    pub fn nbytes(&self) -> u64 {
        self.numel() * self.dtype.itemsize() as u64
    }
    /// Number of byte planes.
    pub fn planes(&self) -> usize {
        self.dtype.unit_size()
    }
    /// Number of chunks.
    pub fn n_chunks(&self) -> u64 {
        match self.scheme {
            Scheme::Stored => 0,
            // A parsed header has chunk_units > 0; a header built by hand may not.
            Scheme::Planes => match self.chunk_units {
                0 => 0,
                cu => self.units().div_ceil(cu as u64),
            },
        }
    }
    /// Units in chunk `c` (0 past the last chunk).
    pub fn chunk_len(&self, c: u64) -> usize {
        let start = c.saturating_mul(self.chunk_units as u64);
        self.units()
            .saturating_sub(start)
            .min(self.chunk_units as u64) as usize
    }
    /// Bytes of the encoded header.
    pub fn encoded_len(&self) -> usize {
        HEADER_FIXED + 8 * self.shape.len()
    }
    /// Bytes of one directory entry.
    pub fn dir_entry_len(&self) -> usize {
        8 + 2 * self.planes()
    }

    /// Appends the encoded header (version 1).
    pub fn write(&self, out: &mut Vec<u8>) {
        self.write_version(BLOB_VERSION, out)
    }

    /// Appends the encoded header, saying `version` (2 for a blob with a paired plane).
    pub fn write_version(&self, version: u16, out: &mut Vec<u8>) {
        out.extend_from_slice(&BLOB_MAGIC);
        out.extend_from_slice(&version.to_le_bytes());
        out.push(self.scheme as u8);
        out.push(self.dtype.code());
        out.push(self.shape.len() as u8);
        out.push(0); // flags
        out.extend_from_slice(&0u16.to_le_bytes()); // reserved
        out.extend_from_slice(&self.chunk_units.to_le_bytes());
        out.extend_from_slice(&self.block_units.to_le_bytes());
        for d in &self.shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
    }

    /// Parses and validates a header; returns it and its length.
    pub fn parse(data: &[u8]) -> Result<(BlobHeader, usize)> {
        if data.len() < 4 {
            return truncated(format!(
                "blob of {} bytes is shorter than its magic number",
                data.len()
            ));
        }
        if data[..4] != BLOB_MAGIC {
            return Err(Error::BadMagic);
        }
        if data.len() < 6 {
            return truncated("blob header (version)");
        }
        let version = u16::from_le_bytes([data[4], data[5]]);
        if version != BLOB_VERSION && version != BLOB_VERSION_PAIRED {
            return Err(Error::UnsupportedVersion {
                found: version,
                supported: BLOB_VERSION_PAIRED,
            });
        }
        if data.len() < HEADER_FIXED {
            return truncated("blob header");
        }
        let scheme = match data[6] {
            0 => Scheme::Stored,
            1 => Scheme::Planes,
            s => return corrupt(format!("unknown scheme {s}")),
        };
        let dtype = DType::from_code(data[7])?;
        let rank = data[8] as usize;
        if rank > MAX_RANK {
            return corrupt(format!("rank {rank} exceeds {MAX_RANK}"));
        }
        if data[9] != 0 || data[10] != 0 || data[11] != 0 {
            return corrupt("reserved header bytes are not zero");
        }
        let chunk_units = u32::from_le_bytes(data[12..16].try_into().unwrap());
        let block_units = u32::from_le_bytes(data[16..20].try_into().unwrap());
        let len = HEADER_FIXED + 8 * rank;
        if data.len() < len {
            return truncated("blob shape");
        }
        let shape: Vec<u64> = (0..rank)
            .map(|i| {
                u64::from_le_bytes(
                    data[HEADER_FIXED + 8 * i..HEADER_FIXED + 8 * i + 8]
                        .try_into()
                        .unwrap(),
                )
            })
            .collect();
        if shape.iter().any(|&d| d > MAX_DIM) {
            return corrupt("a dimension of 2^63 or more");
        }
        let mut numel = 1u64;
        for &d in &shape {
            numel = numel
                .checked_mul(d)
                .ok_or_else(|| Error::Corrupt("shape overflows".into()))?;
        }
        if numel
            .checked_mul(dtype.itemsize() as u64)
            .is_none_or(|b| b >= MAX_TENSOR_BYTES)
        {
            return corrupt("tensor of 2^56 bytes or more");
        }
        match scheme {
            Scheme::Stored => {
                if chunk_units != 0 || block_units != 0 {
                    return corrupt("stored blob with non-zero chunk or block size");
                }
            }
            Scheme::Planes => {
                if chunk_units == 0 || chunk_units as usize * dtype.unit_size() > MAX_CHUNK_BYTES {
                    return corrupt(format!(
                        "chunk of {chunk_units} units is outside 1..=16 MiB"
                    ));
                }
                if !block_units.is_power_of_two()
                    || !(MIN_BLOCK_UNITS..=MAX_BLOCK_UNITS).contains(&block_units)
                {
                    return corrupt(format!(
                        "block of {block_units} units is not a power of two in 32..=65536"
                    ));
                }
            }
        }
        Ok((
            BlobHeader {
                scheme,
                dtype,
                shape,
                chunk_units,
                block_units,
            },
            len,
        ))
    }
}

/// One chunk's directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkEntry {
    /// Bytes of the chunk's payload.
    pub payload_len: u32,
    /// Bytes of its rANS stream (0 = none).
    pub rans_len: u32,
    /// Mode of each plane.
    pub modes: [PlaneMode; 8],
}

impl ChunkEntry {
    /// Appends the entry for `planes` planes.
    pub fn write(&self, planes: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.payload_len.to_le_bytes());
        out.extend_from_slice(&self.rans_len.to_le_bytes());
        for m in &self.modes[..planes] {
            let (a, b) = match *m {
                PlaneMode::Raw => (0, 0),
                PlaneMode::Const(v) => (1, v),
                PlaneMode::Blocks => (2, 0),
                PlaneMode::Cond => (3, 0),
            };
            out.push(a);
            out.push(b);
        }
    }

    /// Parses an entry of `planes` planes (the slice holds exactly one entry).
    pub fn parse(data: &[u8], planes: usize) -> Result<ChunkEntry> {
        let mut e = ChunkEntry::lengths(data);
        e.parse_modes(data, planes)?;
        Ok(e)
    }

    /// The entry's two lengths, its modes all `Raw` (for [`ChunkEntry::parse_modes`]).
    #[inline]
    fn lengths(data: &[u8]) -> ChunkEntry {
        ChunkEntry {
            payload_len: u32::from_le_bytes(data[0..4].try_into().unwrap()),
            rans_len: u32::from_le_bytes(data[4..8].try_into().unwrap()),
            modes: [PlaneMode::Raw; 8],
        }
    }

    /// Parses the modes of `planes` planes into this entry, where it lies (a directory's entries are
    /// parsed into their vector's slots: built on the stack and copied, an entry's mode bytes were
    /// stored one at a time and read back 16 at a time, a store-forwarding stall that took ~3/4 of
    /// `BlobLayout::parse`'s time on a 1 GiB blob's 8192 chunks).
    #[inline]
    fn parse_modes(&mut self, data: &[u8], planes: usize) -> Result<()> {
        for (p, m) in self.modes[..planes].iter_mut().enumerate() {
            let (a, b) = (data[8 + 2 * p], data[9 + 2 * p]);
            *m = match (a, b) {
                (0, 0) => PlaneMode::Raw,
                (1, v) => PlaneMode::Const(v),
                (2, 0) => PlaneMode::Blocks,
                (3, 0) => PlaneMode::Cond,
                _ => return corrupt(format!("invalid plane mode ({a}, {b})")),
            };
        }
        Ok(())
    }
}

/// The validated layout of a blob: header, tables and directory, parsed from the blob's prefix and
/// its total length (the payloads themselves may live elsewhere, e.g. in GPU memory).
#[derive(Debug, Clone)]
pub struct BlobLayout {
    pub header: BlobHeader,
    /// Frequency tables of each plane.
    pub tables: Vec<Vec<FreqTable>>,
    /// The conditional table of each plane, if any: units whose condition byte equals the value are
    /// coded with the table.
    pub cond: Vec<Option<(u8, FreqTable)>>,
    /// The pair table of each plane, if it is paired (version 2; `docs/FORMAT.md`, "Version 2"):
    /// its block tables code ranks of pairs of units.
    pub pairs: Vec<Option<PairTable>>,
    /// The directory (validated entry by entry).
    pub entries: Vec<ChunkEntry>,
    /// Offset of each chunk's payload in the blob, plus the end (`n_chunks + 1` values).
    pub offsets: Vec<usize>,
    /// Offset of the first payload byte (Stored: of the raw data).
    pub payload_start: usize,
    /// Bytes of the whole blob.
    pub total_len: usize,
}

/// What [`BlobLayout::parse`] reads before the directory: the header and, for a Planes blob, every
/// plane's tables, validated, and where the directory lies.
struct LayoutHead {
    header: BlobHeader,
    tables: Vec<Vec<FreqTable>>,
    cond: Vec<Option<(u8, FreqTable)>>,
    pairs: Vec<Option<PairTable>>,
    /// Where the directory starts (a Stored blob: where its data starts).
    pos: usize,
    /// Bytes of the directory (checked to fit in the blob; 0 for a Stored blob).
    dir_len: usize,
}

impl LayoutHead {
    /// The header and tables from `data` (a prefix of a blob of `total_len` bytes, at most that
    /// long), with [`BlobLayout::parse`]'s rules for them.
    fn parse(data: &[u8], total_len: usize) -> Result<LayoutHead> {
        let (header, mut pos) = BlobHeader::parse(data)?;
        let nbytes = header.nbytes() as usize;
        match header.scheme {
            Scheme::Stored => {
                let end = pos
                    .checked_add(nbytes)
                    .ok_or_else(|| Error::Corrupt("size overflows".into()))?;
                if total_len < end {
                    return truncated(format!(
                        "stored blob holds {} of {} data bytes",
                        total_len - pos,
                        nbytes
                    ));
                }
                if total_len > end {
                    return corrupt(format!(
                        "{} bytes after the end of the blob",
                        total_len - end
                    ));
                }
                if data[4..6] != BLOB_VERSION.to_le_bytes() {
                    return corrupt("a stored blob of version 2 (which only pairs coded planes)");
                }
                Ok(LayoutHead {
                    header,
                    tables: Vec::new(),
                    cond: Vec::new(),
                    pairs: Vec::new(),
                    pos,
                    dir_len: 0,
                })
            }
            Scheme::Planes => {
                let planes = header.planes();
                let mut tables = Vec::with_capacity(planes);
                let mut cond = Vec::with_capacity(planes);
                let mut pairs = Vec::with_capacity(planes);
                let v2 = data[4..6] == BLOB_VERSION_PAIRED.to_le_bytes();
                for p in 0..planes {
                    // Version 2: the plane's pair field first (`u8 D`, `D` pairs).
                    let paired = match v2 {
                        false => None,
                        true => {
                            let (t, used) = PairTable::parse(&data[pos..], p)?;
                            pos += used;
                            if t.is_some() && header.dtype.paired_plane() != Some(p) {
                                return corrupt(format!(
                                    "plane {p} of a {} tensor cannot be paired",
                                    header.dtype
                                ));
                            }
                            t
                        }
                    };
                    let Some(&k) = data.get(pos) else {
                        return truncated(format!("table count of plane {p}"));
                    };
                    pos += 1;
                    if k as usize > MAX_TABLES {
                        return corrupt(format!(
                            "plane {p} declares {k} tables (at most {MAX_TABLES})"
                        ));
                    }
                    let mut list = Vec::with_capacity(k as usize);
                    for j in 0..k as usize {
                        pos += FreqTable::parse_into(&data[pos..], &mut list)?;
                        // A paired plane's tables code ranks: none past the escape.
                        if let Some(pt) = &paired {
                            let d = pt.escape() as usize;
                            if list[j].freq[d + 1..].iter().any(|&f| f > 0) {
                                return corrupt(format!(
                                    "plane {p}: a table of ranks past the escape {d}"
                                ));
                            }
                        }
                    }
                    tables.push(list);
                    pairs.push(paired);
                    let Some(&nc) = data.get(pos) else {
                        return truncated(format!("conditional table flag of plane {p}"));
                    };
                    pos += 1;
                    match nc {
                        0 => cond.push(None),
                        1 => {
                            if header.dtype.conditioned_plane().map(|c| c.0) != Some(p) {
                                return corrupt(format!(
                                    "plane {p} of a {} tensor cannot be conditioned",
                                    header.dtype
                                ));
                            }
                            let Some(&v) = data.get(pos) else {
                                return truncated(format!("condition byte of plane {p}"));
                            };
                            pos += 1;
                            let (t, used) = FreqTable::parse(&data[pos..])?;
                            pos += used;
                            if t.is_single() {
                                return corrupt(format!(
                                    "plane {p}: conditional table of one symbol"
                                ));
                            }
                            cond.push(Some((v, t)));
                        }
                        n => {
                            return corrupt(format!(
                                "plane {p}: conditional table flag {n} (0 or 1)"
                            ))
                        }
                    }
                }
                if v2 && pairs.iter().all(Option::is_none) {
                    return corrupt("a version 2 blob without a paired plane");
                }
                let n_chunks = header.n_chunks();
                let entry = header.dir_entry_len() as u64;
                // The directory must fit in the blob (this bounds every allocation by its length)...
                let dir_len = n_chunks
                    .checked_mul(entry)
                    .filter(|&l| l <= (total_len - pos.min(total_len)) as u64);
                let Some(dir_len) = dir_len else {
                    return truncated(format!("chunk directory of {n_chunks} chunks"));
                };
                Ok(LayoutHead {
                    header,
                    tables,
                    cond,
                    pairs,
                    pos,
                    dir_len: dir_len as usize,
                })
            }
        }
    }
}

impl BlobLayout {
    /// Parses and validates the header, tables and directory from `prefix`, the first bytes of a blob
    /// of `total_len` bytes. `Error::Truncated` if `prefix` ends before the directory does (when it is
    /// shorter than `total_len`, a longer prefix may succeed).
    pub fn parse(prefix: &[u8], total_len: usize) -> Result<BlobLayout> {
        let data = &prefix[..prefix.len().min(total_len)];
        let LayoutHead {
            header,
            tables,
            cond,
            pairs,
            mut pos,
            dir_len,
        } = LayoutHead::parse(data, total_len)?;
        match header.scheme {
            Scheme::Stored => Ok(BlobLayout {
                header,
                tables,
                cond,
                pairs,
                entries: Vec::new(),
                offsets: Vec::new(),
                payload_start: pos,
                total_len,
            }),
            Scheme::Planes => {
                let planes = header.planes();
                let n_chunks = header.n_chunks();
                let entry = header.dir_entry_len() as u64;
                // ... and be in the prefix.
                let Some(dir) = data.get(pos..pos + dir_len) else {
                    return truncated(format!(
                        "chunk directory of {n_chunks} chunks (prefix of {} bytes)",
                        data.len()
                    ));
                };
                pos += dir_len;
                let mut entries = Vec::with_capacity(n_chunks as usize);
                let mut offsets = Vec::with_capacity(n_chunks as usize + 1);
                let mut off = pos;
                offsets.push(off);
                for (c, raw) in dir.chunks_exact(entry as usize).enumerate() {
                    // Parsed in its slot (`ChunkEntry::parse_modes` says why); a failure returns.
                    entries.push(ChunkEntry::lengths(raw));
                    entries[c].parse_modes(raw, planes)?;
                    let e = &entries[c];
                    for p in 0..planes {
                        if e.modes[p] == PlaneMode::Cond && cond[p].is_none() {
                            return corrupt(format!("chunk {c} plane {p} is conditioned but the plane has no conditional table"));
                        }
                    }
                    if e.rans_len != 0 && (e.rans_len < 128 || e.rans_len % 2 != 0) {
                        return corrupt(format!(
                            "chunk {c}: rANS stream of {} bytes (need 0, or 128 + an even number)",
                            e.rans_len
                        ));
                    }
                    off = off
                        .checked_add(e.payload_len as usize)
                        .filter(|&o| o <= total_len)
                        .ok_or_else(|| Error::Truncated(format!("payload of chunk {c}")))?;
                    offsets.push(off);
                }
                if off != total_len {
                    return corrupt(format!(
                        "{} bytes after the end of the blob",
                        total_len - off
                    ));
                }
                Ok(BlobLayout {
                    header,
                    tables,
                    cond,
                    pairs,
                    entries,
                    offsets,
                    payload_start: pos,
                    total_len,
                })
            }
        }
    }

    /// The directory entry of chunk `c` (an error past the last chunk, or for a stored blob).
    pub fn entry(&self, c: usize) -> Result<ChunkEntry> {
        self.entries.get(c).copied().ok_or_else(|| {
            Error::InvalidInput(format!(
                "chunk {c} of a blob with {} coded chunks",
                self.entries.len()
            ))
        })
    }

    /// The byte range of chunk `c`'s payload in the blob (`c` must be below the number of
    /// chunks, as [`BlobLayout::entry`] checks).
    pub fn payload_range(&self, c: usize) -> std::ops::Range<usize> {
        self.offsets[c]..self.offsets[c + 1]
    }

    /// How many first bytes of a blob of `total_len` bytes [`BlobLayout::parse`] needs (its
    /// [`BlobLayout::overhead_len`]: header, tables and directory), as far as `prefix`, its first
    /// bytes, tells: the exact length once `prefix` holds the header and the tables (the
    /// directory's length follows from them), else `Error::Truncated` (a longer prefix may tell).
    /// Any other error is one `parse` would give for the same bytes. A reader of a blob in device
    /// memory copies that many bytes to the host, where a guess either fell short or copied the
    /// payloads too.
    pub fn needed_len(prefix: &[u8], total_len: usize) -> Result<usize> {
        let data = &prefix[..prefix.len().min(total_len)];
        let head = LayoutHead::parse(data, total_len)?;
        Ok(head.pos + head.dir_len)
    }

    /// How many first bytes of a blob of `total_len` bytes a reader that fetches its prefix piece
    /// by piece (from device memory, say) should hold next, given `prefix`, what it holds now:
    /// [`BlobLayout::needed_len`] once `prefix` tells it; while the header and tables are not all
    /// in, a longer read (twice `prefix`, at least 64 KiB, at most `total_len`). The reader reads
    /// that many bytes and asks again until the answer is no more than what it holds. Never more
    /// than `total_len` (`needed_len` bounds the directory by the blob). Other errors are the
    /// ones [`BlobLayout::parse`] gives for the same bytes.
    pub fn prefix_to_read(prefix: &[u8], total_len: usize) -> Result<usize> {
        match BlobLayout::needed_len(prefix, total_len) {
            Err(Error::Truncated(_)) if prefix.len() < total_len => {
                Ok(prefix.len().saturating_mul(2).max(1 << 16).min(total_len))
            }
            r => r,
        }
    }

    /// One step of a reader that fetches a blob's prefix piece by piece: the layout parsed from
    /// `prefix` (the blob's first bytes; the blob is `total_len` bytes), or its error — the one
    /// [`BlobLayout::parse`] of the whole blob gives — or, where `prefix` is too short to tell,
    /// [`PrefixStep::Want`] the length to read next ([`BlobLayout::prefix_to_read`]), always more
    /// than `prefix` holds. Each step parses the prefix once (the common case, a first read that
    /// holds the whole prefix, costs one parse); only a short one also asks `prefix_to_read`.
    pub fn parse_prefix(prefix: &[u8], total_len: usize) -> PrefixStep {
        let prefix = &prefix[..prefix.len().min(total_len)];
        match BlobLayout::parse(prefix, total_len) {
            Err(Error::Truncated(e)) if prefix.len() < total_len => {
                match BlobLayout::prefix_to_read(prefix, total_len) {
                    Ok(need) if need > prefix.len() => PrefixStep::Want(need),
                    // It holds all its header and tables say the prefix is: the blob itself is
                    // short of what its directory names.
                    Ok(_) => PrefixStep::Parsed(Err(Error::Truncated(e))),
                    Err(e) => PrefixStep::Parsed(Err(e)),
                }
            }
            r => PrefixStep::Parsed(r.map(Box::new)),
        }
    }

    /// Bytes of the header, tables and directory (everything but payloads).
    pub fn overhead_len(&self) -> usize {
        self.payload_start
    }

    /// The paired plane, if the blob has one (version 2).
    pub fn paired_plane(&self) -> Option<usize> {
        self.pairs.iter().position(Option::is_some)
    }
}

/// What [`BlobLayout::parse_prefix`] tells a reader of a blob's prefix.
#[derive(Debug)]
pub enum PrefixStep {
    /// The layout, or the error that the whole blob's parse gives.
    Parsed(Result<Box<BlobLayout>>),
    /// The prefix is too short to tell: read this many first bytes (more than held) and ask again.
    Want(usize),
}

/// A validated blob: its layout and its bytes.
pub struct BlobView<'a> {
    pub layout: BlobLayout,
    data: &'a [u8],
}

impl std::ops::Deref for BlobView<'_> {
    type Target = BlobLayout;
    fn deref(&self) -> &BlobLayout {
        &self.layout
    }
}

impl<'a> BlobView<'a> {
    /// Parses and validates the header, tables and directory of `data`, which must be exactly one blob.
    pub fn parse(data: &'a [u8]) -> Result<BlobView<'a>> {
        Ok(BlobView {
            layout: BlobLayout::parse(data, data.len())?,
            data,
        })
    }

    /// The payload of chunk `c`.
    pub fn payload(&self, c: usize) -> &'a [u8] {
        &self.data[self.layout.payload_range(c)]
    }

    /// The raw data of a stored blob.
    pub fn stored_data(&self) -> &'a [u8] {
        &self.data[self.layout.payload_start..]
    }

    /// Bytes of the whole blob.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the blob is empty (never: a blob has at least a header).
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// Reads only the header of a blob (for `info`-style inspection).
pub fn peek_header(data: &[u8]) -> Result<BlobHeader> {
    BlobHeader::parse(data).map(|(h, _)| h)
}
