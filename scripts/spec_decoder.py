#!/usr/bin/env python3
"""An independent decoder of the tensorzip format, version 1, written from docs/FORMAT.md alone.

Pure Python (numpy for the plane merge and the inverse transforms). It exists to check that the
specification is complete: it was written without reading the implementation, and its tests
(bindings/python/tests/test_format_spec.py) compare it with what the real encoder writes.

Public functions:

* ``decode_blob(data) -> (dtype_code, shape, raw_bytes)``   -- sections 1 to 6
* ``parse_blob(data) -> BlobInfo``                           -- header, tables, directory, modes, selectors
* ``restore_archive(data) -> bytes``                        -- sections 8 and 9
* ``crc32(data)``, ``crc32_pieces(data, k)``                 -- section 8 (own table-driven CRC)

Every violated "must" of the spec raises ``ValueError``. CLI::

    python scripts/spec_decoder.py ARCHIVE.tz OUT          # restore the .safetensors file
    python scripts/spec_decoder.py --blob BLOB OUT         # decode one blob into its raw bytes
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass, field

import numpy as np

# ---------------------------------------------------------------------------------------------
# Section 8: CRC-32 (zlib's: reflected polynomial 0xEDB88320, init and final XOR 0xFFFFFFFF).
# Written here, not taken from zlib, so the checksum is checked against the spec's definition.


def _make_crc_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _make_crc_table()


def crc32(data, crc: int = 0) -> int:
    """CRC-32 of ``data`` as section 8 defines it (equal to zlib.crc32)."""
    c = crc ^ 0xFFFFFFFF
    t = _CRC_TABLE
    for b in bytes(data):
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def crc32_pieces(data, k: int) -> list[int]:
    """Section 8: the CRC-32s of data[0:k], data[k:2k], ...; no pieces for empty input."""
    if k <= 0:
        raise ValueError("crc32_pieces: piece size must be positive")
    data = bytes(data)
    return [crc32(data[i:i + k]) for i in range(0, len(data), k)]


# ---------------------------------------------------------------------------------------------
# Section 1: dtypes. code -> (name, U, units per element, itemsize, E of the transform or None,
# conditioned plane or None, plane it is conditioned on or None)

@dataclass(frozen=True)
class DType:
    code: int
    name: str
    U: int                 # bytes per unit = number of byte planes
    units_per_elem: int
    itemsize: int          # bytes per element
    E: int | None          # exponent bits for "sign below exponent", None = identity
    cond_plane: int | None
    cond_on: int | None


DTYPES = {
    0: DType(0, "bool", 1, 1, 1, None, None, None),
    1: DType(1, "u8", 1, 1, 1, None, None, None),
    2: DType(2, "i8", 1, 1, 1, None, None, None),
    3: DType(3, "u16", 2, 1, 2, None, None, None),
    4: DType(4, "i16", 2, 1, 2, None, None, None),
    5: DType(5, "u32", 4, 1, 4, None, None, None),
    6: DType(6, "i32", 4, 1, 4, None, None, None),
    7: DType(7, "u64", 8, 1, 8, None, None, None),
    8: DType(8, "i64", 8, 1, 8, None, None, None),
    9: DType(9, "f16", 2, 1, 2, None, 0, 1),
    10: DType(10, "bf16", 2, 1, 2, 8, 0, 1),
    11: DType(11, "f32", 4, 1, 4, 8, 2, 3),
    12: DType(12, "f64", 8, 1, 8, 11, 6, 7),
    13: DType(13, "float8_e4m3fn", 1, 1, 1, None, None, None),
    14: DType(14, "float8_e5m2", 1, 1, 1, None, None, None),
    15: DType(15, "float8_e4m3fnuz", 1, 1, 1, None, None, None),
    16: DType(16, "float8_e5m2fnuz", 1, 1, 1, None, None, None),
    17: DType(17, "complex64", 4, 2, 8, 8, 2, 3),
}

_NP_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


# ---------------------------------------------------------------------------------------------
# Section 2: the inverse of "sign below exponent", vectorised over an array of B-bit units.

def inverse_transform(t: np.ndarray, B: int, E: int) -> np.ndarray:
    """u = ((t >> 1) & (((1 << E) - 1) << M)) | ((t << E) & (1 << (B - 1))) | (t & ((1 << M) - 1))."""
    M = B - 1 - E
    ty = t.dtype.type
    exp_mask = ty(((1 << E) - 1) << M)
    sign_bit = ty(1 << (B - 1))
    mant_mask = ty((1 << M) - 1)
    return ((t >> ty(1)) & exp_mask) | ((t << ty(E)) & sign_bit) | (t & mant_mask)


def forward_transform(u: np.ndarray, B: int, E: int) -> np.ndarray:
    """t = ((u << 1) & (((1 << E) - 1) << (M + 1))) | ((u >> E) & (1 << M)) | (u & ((1 << M) - 1))."""
    M = B - 1 - E
    ty = u.dtype.type
    return (((u << ty(1)) & ty(((1 << E) - 1) << (M + 1))) | ((u >> ty(E)) & ty(1 << M))
            | (u & ty((1 << M) - 1)))


# ---------------------------------------------------------------------------------------------
# A little bounds-checked reader: every read past the end is a ValueError (never an IndexError).

class _Reader:
    def __init__(self, data: bytes, pos: int = 0, end: int | None = None):
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise ValueError(f"truncated: {what} needs {n} bytes at offset {self.pos}, "
                             f"{self.end - self.pos} left")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def u8(self, what):
        return self.take(1, what)[0]

    def u16(self, what):
        return struct.unpack("<H", self.take(2, what))[0]

    def u32(self, what):
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what):
        return struct.unpack("<Q", self.take(8, what))[0]


# ---------------------------------------------------------------------------------------------
# Section 4: frequency tables.

@dataclass
class Table:
    lo: int
    hi: int
    codes: bytes
    freq: list           # 256 frequencies, sum 4096
    cum: list            # 256 cumulative frequencies
    nsym: int            # number of symbols with f > 0
    _slot: list | None = None   # slot -> (symbol, f, cum), built on first use

    def single_symbol(self) -> int | None:
        if self.nsym == 1:
            return next(s for s in range(256) if self.freq[s])
        return None

    def slot_table(self):
        if self._slot is None:
            st = [None] * 4096
            for s in range(256):
                f = self.freq[s]
                if f:
                    entry = (s, f, self.cum[s])
                    for k in range(self.cum[s], self.cum[s] + f):
                        st[k] = entry
            self._slot = st
        return self._slot

    def serialised(self) -> bytes:
        return bytes([self.lo, self.hi]) + self.codes


def _uniform_table() -> Table:
    """Section 12's uniform table: every byte frequency 16 (not serialised)."""
    freq = [16] * 256
    return Table(0, 255, bytes([16] * 256), freq, [16 * s for s in range(256)], 256)


def code_to_freq(code: int) -> int | None:
    """Section 4's code table: frequency of a code, None for the anchor (255); ValueError if invalid."""
    if code == 0:
        return 0
    if 1 <= code <= 127:
        return code
    if 128 <= code <= 207:
        k = code - 128
        return (16 + (k & 15)) << ((k >> 4) + 3)
    if code == 255:
        return None
    raise ValueError(f"invalid frequency code {code}")


def read_table(r: _Reader, what: str) -> Table:
    lo = r.u8(what + " lo")
    hi = r.u8(what + " hi")
    if lo > hi:
        raise ValueError(f"{what}: lo {lo} > hi {hi}")
    codes = r.take(hi - lo + 1, what + " codes")
    if codes[0] == 0 or codes[-1] == 0:
        raise ValueError(f"{what}: code at lo or hi is 0")
    freq = [0] * 256
    anchor = None
    total = 0
    for i, code in enumerate(codes):
        f = code_to_freq(code)
        s = lo + i
        if f is None:
            if anchor is not None:
                raise ValueError(f"{what}: more than one anchor (code 255)")
            anchor = s
        else:
            freq[s] = f
            total += f
    if anchor is None:
        raise ValueError(f"{what}: no anchor (code 255)")
    if total > 4095:
        raise ValueError(f"{what}: non-anchor frequencies sum to {total} > 4095")
    freq[anchor] = 4096 - total
    cum = [0] * 256
    acc = 0
    for s in range(256):
        cum[s] = acc
        acc += freq[s]
    nsym = sum(1 for f in freq if f)
    return Table(lo, hi, bytes(codes), freq, cum, nsym)


UNIFORM = _uniform_table()


# ---------------------------------------------------------------------------------------------
# Section 3.1: the blob header.

MAGIC_BLOB = b"TZBL"
MAX_CHUNK_BYTES = 16 << 20
MODE_RAW, MODE_CONST, MODE_BLOCKS, MODE_COND = 0, 1, 2, 3
MODE_NAMES = {0: "raw", 1: "const", 2: "blocks", 3: "cond"}


@dataclass
class Header:
    scheme: int
    dtype: DType
    shape: tuple
    chunk_units: int
    block_units: int
    numel: int
    nbytes: int          # numel * itemsize
    units: int
    size: int            # header size in bytes
    version: int = 1


def parse_header(data: bytes) -> Header:
    r = _Reader(data)
    magic = r.take(4, "blob magic")
    if magic != MAGIC_BLOB:
        raise ValueError(f"BadMagic: {magic!r}")
    version = r.u16("version")
    if version not in (1, 2):
        raise ValueError(f"UnsupportedVersion: found {version}, supported 2")
    scheme = r.u8("scheme")
    if scheme not in (0, 1):
        raise ValueError(f"invalid scheme {scheme}")
    code = r.u8("dtype")
    if code not in DTYPES:
        raise ValueError(f"invalid dtype code {code}")
    dt = DTYPES[code]
    rank = r.u8("rank")
    if rank > 64:
        raise ValueError(f"rank {rank} > 64")
    flags = r.u8("flags")
    if flags != 0:
        raise ValueError(f"flags {flags} != 0")
    reserved = r.u16("reserved")
    if reserved != 0:
        raise ValueError("reserved field != 0")
    chunk_units = r.u32("chunk_units")
    block_units = r.u32("block_units")
    shape = tuple(r.u64("shape") for _ in range(rank))
    # Each dimension below 2^63; numel = product (1 for rank 0) must not overflow and
    # numel * itemsize must be below 2^56. FORMAT.md does not say how "overflow" is judged; the
    # real decoder multiplies left to right in u64 and refuses any overflowing running product
    # (so [2^62, 4, 0] is refused although its product is 0, and [0, 2^62, 4] is accepted).
    numel = 1
    for d in shape:
        if d >= 1 << 63:
            raise ValueError(f"dimension {d} >= 2^63")
        numel *= d
        if numel >= 1 << 64:
            raise ValueError("shape product overflows")
    nbytes = numel * dt.itemsize
    if nbytes >= 1 << 56:
        raise ValueError("numel * itemsize >= 2^56")
    if scheme == 0:
        if chunk_units != 0 or block_units != 0:
            raise ValueError("Stored blob with nonzero chunk_units/block_units")
        if version != 1:
            raise ValueError("Stored blob of version 2")
    else:
        if chunk_units < 1 or chunk_units * dt.U > MAX_CHUNK_BYTES:
            raise ValueError(f"invalid chunk_units {chunk_units}")
        if not (32 <= block_units <= 65536) or block_units & (block_units - 1):
            raise ValueError(f"invalid block_units {block_units}")
    return Header(scheme, dt, shape, chunk_units, block_units, numel, nbytes,
                  numel * dt.units_per_elem, r.pos, version)


# ---------------------------------------------------------------------------------------------
# Section 3.3: the Planes blob's tables section and directory.

@dataclass
class PlaneTables:
    tables: list                      # K block tables
    cond_value: int | None = None     # C == 1: the condition value
    cond_table: Table | None = None
    pairs: list | None = None         # version 2 (section 12): the D pairs (a, b) by rank


@dataclass
class ChunkEntry:
    index: int
    start_unit: int
    length: int                       # units in the chunk
    payload_offset: int               # absolute offset in the blob
    payload_len: int
    rans_len: int
    modes: list                       # per plane (mode, value)
    selectors: dict = field(default_factory=dict)   # plane -> bytes (filled by parse_chunk)


@dataclass
class BlobInfo:
    header: Header
    planes: list = field(default_factory=list)      # PlaneTables per plane (Planes scheme)
    chunks: list = field(default_factory=list)      # ChunkEntry per chunk


def parse_blob(data: bytes) -> BlobInfo:
    """Parse and validate the header, the tables section and the directory (not the payloads)."""
    data = bytes(data)
    h = parse_header(data)
    info = BlobInfo(h)
    if h.scheme == 0:
        # 3.2: exactly numel * itemsize bytes follow.
        if len(data) - h.size != h.nbytes:
            raise ValueError(f"Stored blob holds {len(data) - h.size} bytes, expected {h.nbytes}")
        return info
    dt = h.dtype
    r = _Reader(data, h.size)
    for p in range(dt.U):
        pairs = None
        if h.version == 2:
            # Section 12: u8 D, then D pairs; D = 0 or 2..=128, only on bf16's plane 1, distinct.
            D = r.u8(f"plane {p} D")
            if D:
                if not 2 <= D <= 128:
                    raise ValueError(f"plane {p}: D = {D}")
                if not (dt.name == "bf16" and p == 1):
                    raise ValueError(f"plane {p} of a {dt.name} tensor cannot be paired")
                raw_pairs = r.take(2 * D, f"plane {p} pairs")
                pairs = [(raw_pairs[2 * i], raw_pairs[2 * i + 1]) for i in range(D)]
                if len(set(pairs)) != D:
                    raise ValueError(f"plane {p}: a pair twice")
        K = r.u8(f"plane {p} K")
        if K > 64:
            raise ValueError(f"plane {p}: K = {K} > 64")
        tables = [read_table(r, f"plane {p} table {j}") for j in range(K)]
        if pairs is not None and any(f for t in tables for f in t.freq[len(pairs) + 1:]):
            raise ValueError(f"plane {p}: a table of ranks past the escape {len(pairs)}")
        C = r.u8(f"plane {p} C")
        if C not in (0, 1):
            raise ValueError(f"plane {p}: C = {C}")
        pt = PlaneTables(tables, pairs=pairs)
        if C == 1:
            if p != dt.cond_plane:
                raise ValueError(f"plane {p} has a conditional table but is not the conditioned plane")
            pt.cond_value = r.u8("condition value")
            pt.cond_table = read_table(r, f"plane {p} conditional table")
            if pt.cond_table.nsym < 2:
                raise ValueError("conditional table with fewer than two symbols")
        info.planes.append(pt)
    if h.version == 2 and all(pt.pairs is None for pt in info.planes):
        raise ValueError("a version 2 blob without a paired plane")
    # Directory: n_chunks entries of 8 + 2U bytes.
    n_chunks = -(-h.units // h.chunk_units)
    entries = []
    for c in range(n_chunks):
        payload_len = r.u32("directory payload_len")
        rans_len = r.u32("directory rans_len")
        modes = []
        for p in range(dt.U):
            mode = r.u8("mode")
            value = r.u8("mode value")
            if mode == MODE_CONST:
                pass
            elif mode in (MODE_RAW, MODE_BLOCKS, MODE_COND):
                if value != 0:
                    raise ValueError(f"chunk {c} plane {p}: mode {mode} with value {value}")
                if mode == MODE_COND and info.planes[p].cond_table is None:
                    raise ValueError(f"chunk {c} plane {p}: Cond without a conditional table")
            else:
                raise ValueError(f"chunk {c} plane {p}: invalid mode {mode}")
            modes.append((mode, value))
        start = c * h.chunk_units
        entries.append(ChunkEntry(c, start, min(h.chunk_units, h.units - start), 0,
                                  payload_len, rans_len, modes))
    # The payloads must end exactly at the end of the blob.
    off = r.pos
    for e in entries:
        e.payload_offset = off
        off += e.payload_len
    if off != len(data):
        raise ValueError(f"payloads end at {off}, blob length {len(data)}")
    info.chunks = entries
    return info


# ---------------------------------------------------------------------------------------------
# Section 5: the rANS stream of one chunk.

RANS_L = 1 << 16


class _Stream:
    def __init__(self, data: bytes, off: int, length: int):
        self.present = length > 0
        if not self.present:
            self.x = None
            return
        if length < 128 or length % 2:
            raise ValueError(f"rans_len {length}: must be 0 or even and >= 128")
        self.x = list(struct.unpack_from("<32I", data, off))
        if any(x < RANS_L for x in self.x):
            raise ValueError("rANS initial state below 2^16")
        nwords = (length - 128) // 2
        self.words = struct.unpack_from(f"<{nwords}H", data, off + 128)
        self.wpos = 0
        self.used = False

    def decode_segment(self, out, table: Table):
        """Decode len(out) symbols step by step (symbol k in lane k mod 32) into the list out,
        renormalising after each step (5.2, 5.3): a group of one segment."""
        self.decode_group([out], [table], len(out))

    def decode_group(self, outs, tables, L):
        """The main group (5.2): segments of length L decoded step by step, interleaved by step:
        step r decodes, for each segment in plane order, symbols 32r .. of lanes 0 .. ."""
        if not outs:
            return
        if not self.present:
            raise ValueError("coded symbols in a chunk without a rANS stream")
        self.used = True
        sts = [t.slot_table() for t in tables]
        x = self.x
        words = self.words
        for base in range(0, L, 32):
            lanes = min(32, L - base)
            for out, st in zip(outs, sts):
                for l in range(lanes):
                    xl = x[l]
                    slot = xl & 4095
                    s, f, c = st[slot]
                    out[base + l] = s
                    x[l] = f * (xl >> 12) + slot - c
                for l in range(lanes):
                    if x[l] < RANS_L:
                        if self.wpos >= len(words):
                            raise ValueError("rANS stream read past its end")
                        x[l] = (x[l] << 16) | words[self.wpos]
                        self.wpos += 1

    def finish(self, S: int) -> bytes:
        """5.4: at the end of the chunk every word is read and lane l holds 2^16 + v_l, where v_l
        carries stash bytes 2l and 2l+1 (those below S). Returns the S stash bytes."""
        if not self.present:
            return b""
        if not self.used:
            raise ValueError("a rANS stream in a chunk that codes no symbol")
        if self.wpos != len(self.words):
            raise ValueError(f"rANS stream: {len(self.words) - self.wpos} words left unread")
        stash = bytearray()
        for l in range(32):
            carried = max(0, min(2, S - 2 * l))
            v = self.x[l] - RANS_L
            if v < 0 or v >= 1 << (8 * carried):
                raise ValueError(f"rANS lane {l} ends at {self.x[l]:#x}, not 2^16 + {carried} byte(s)")
            for k in range(carried):
                stash.append((v >> (8 * k)) & 0xFF)
        return bytes(stash)


# ---------------------------------------------------------------------------------------------
# Sections 3.3 and 6: decoding one chunk into its U byte planes.

def _decode_chunk(data: bytes, info: BlobInfo, e: ChunkEntry) -> np.ndarray:
    h = info.header
    dt = h.dtype
    U = dt.U
    bu = h.block_units
    L_chunk = e.length
    nb = -(-L_chunk // bu)
    end = e.payload_offset + e.payload_len
    pos = e.payload_offset

    # Selectors: for each Blocks plane in ascending order, one byte per block.
    for p in range(U):
        if e.modes[p][0] == MODE_BLOCKS:
            if pos + nb > end:
                raise ValueError(f"chunk {e.index}: selectors overrun the payload")
            sel = data[pos:pos + nb]
            pos += nb
            K = len(info.planes[p].tables)
            for s in sel:
                if not (s < K or s in (254, 255)):
                    raise ValueError(f"chunk {e.index} plane {p}: invalid selector {s}")
            e.selectors[p] = sel
    # rANS stream, then the raw area (the rest of the payload).
    if e.rans_len > end - pos:
        raise ValueError(f"chunk {e.index}: rans_len {e.rans_len} overruns the payload")
    stream = _Stream(data, pos, e.rans_len)
    pos += e.rans_len
    raw = _Reader(data, pos, end)

    cond_p = next((p for p in range(U) if e.modes[p][0] == MODE_COND), None)

    def take_tail(n: int, last: bool) -> bytes:
        """The next n bytes of the raw sequence; at the chunk's last block the stash (5.4) is its
        last S of them, and the raw area must then be used up."""
        if not last:
            return raw.take(n, f"chunk {e.index} raw area")
        S = min(64, n) if stream.present else 0
        tail = raw.take(n - S, f"chunk {e.index} raw area") + stream.finish(S)
        if raw.pos != raw.end:
            raise ValueError(f"chunk {e.index}: {raw.end - raw.pos} raw bytes left over")
        return tail

    planes = [[0] * L_chunk for _ in range(U)]
    for p in range(U):
        if e.modes[p][0] == MODE_CONST:
            planes[p] = [e.modes[p][1]] * L_chunk

    for b in range(nb):
        start = b * bu
        L = min(bu, L_chunk - start)
        last = b == nb - 1
        # Single-symbol blocks, and the main group (segments of Blocks planes whose selector names
        # a table of two or more symbols), decoded step by step across the segments.
        seg_planes, seg_tables = [], []
        paired = None    # section 12: (plane, table) of the paired plane's coded block
        nonraw_len = 0   # this block's part of the raw sequence, but the Cond plane's
        for p in range(U):
            mode = e.modes[p][0]
            if mode == MODE_RAW:
                nonraw_len += L
            elif mode == MODE_BLOCKS:
                s = e.selectors[p][b]
                if s == 255:
                    nonraw_len += L
                elif s == 254:
                    nonraw_len += 1
                elif info.planes[p].pairs is not None:
                    paired = (p, info.planes[p].tables[s])
                else:
                    t = info.planes[p].tables[s]
                    one = t.single_symbol()
                    if one is not None:
                        planes[p][start:start + L] = [one] * L
                    else:
                        seg_planes.append(p)
                        seg_tables.append(t)
        outs = [[0] * L for _ in seg_planes]
        stream.decode_group(outs, seg_tables, L)
        for p, out in zip(seg_planes, outs):
            planes[p][start:start + L] = out
        if paired is not None:
            # Section 12: the ranks, then the escape group (uniform table), then the bytes.
            p, t = paired
            pairs = info.planes[p].pairs
            D = len(pairs)
            n = L // 2
            one = t.single_symbol()
            if one is not None:
                ranks = [one] * n
            else:
                ranks = [0] * n
                if n:
                    stream.decode_segment(ranks, t)
            escapes = sum(1 for r in ranks if r == D)
            m = 2 * escapes + L % 2
            esc = [0] * m
            if m:
                stream.decode_segment(esc, UNIFORM)
            k = 0
            out = planes[p]
            for i, r in enumerate(ranks):
                if r < D:
                    out[start + 2 * i], out[start + 2 * i + 1] = pairs[r]
                elif r == D:
                    out[start + 2 * i], out[start + 2 * i + 1] = esc[k], esc[k + 1]
                    k += 2
                else:
                    raise ValueError(f"chunk {e.index}: rank {r} past the escape {D}")
            if L % 2:
                out[start + L - 1] = esc[k]

        # The block's raw bytes of the planes but the Cond plane. Without a Cond plane the stash
        # (the last S bytes of the raw sequence) may cut into them at the last block.
        part = take_tail(nonraw_len, last and cond_p is None)
        k = 0
        for p in range(U):
            mode = e.modes[p][0]
            if mode == MODE_RAW or (mode == MODE_BLOCKS and e.selectors[p][b] == 255):
                planes[p][start:start + L] = part[k:k + L]
                k += L
            elif mode == MODE_BLOCKS and e.selectors[p][b] == 254:
                planes[p][start:start + L] = [part[k]] * L
                k += 1

        # The Cond plane: units whose condition-plane byte equals the value are coded (the
        # sub-segment, after the main group), the others raw (after the other planes' raw bytes).
        if cond_p is not None:
            pt = info.planes[cond_p]
            on = planes[dt.cond_on]
            v = pt.cond_value
            coded_idx = [i for i in range(start, start + L) if on[i] == v]
            T = len(coded_idx)
            Rn = L - T
            if T:
                sub = [0] * T
                stream.decode_segment(sub, pt.cond_table)
            rawb = take_tail(Rn, last)
            cp = planes[cond_p]
            ci = ri = 0
            for i in range(start, start + L):
                if on[i] == v:
                    cp[i] = sub[ci]
                    ci += 1
                else:
                    cp[i] = rawb[ri]
                    ri += 1
    if nb == 0:  # an empty chunk cannot occur (chunks hold >= 1 unit), but keep the checks total
        stream.finish(0)
    return np.array(planes, dtype=np.uint8).reshape(U, L_chunk)


def _merge_planes(planes: np.ndarray, dt: DType) -> bytes:
    """Merge U byte planes into units (plane p = byte p, little-endian) and apply the inverse
    transform (section 2)."""
    U = dt.U
    if U == 1:
        return planes[0].tobytes()
    # Interleave: unit i's bytes are planes[0][i], planes[1][i], ... (little-endian).
    inter = np.ascontiguousarray(planes.T)
    units = inter.view(np.dtype(_NP_UINT[U]).newbyteorder("<")).reshape(-1).astype(_NP_UINT[U])
    if dt.E is not None:
        units = inverse_transform(units, 8 * U, dt.E)
    return units.astype(np.dtype(_NP_UINT[U]).newbyteorder("<")).tobytes()


def decode_blob(data) -> tuple[int, tuple, bytes]:
    """Decode one blob: (dtype code, shape, the tensor's raw little-endian bytes)."""
    data = bytes(data)
    info = parse_blob(data)
    h = info.header
    if h.scheme == 0:
        return h.dtype.code, h.shape, data[h.size:]
    pieces = []
    for e in info.chunks:
        planes = _decode_chunk(data, info, e)
        pieces.append(_merge_planes(planes, h.dtype))
    out = b"".join(pieces)
    assert len(out) == h.nbytes
    return h.dtype.code, h.shape, out


def chunk_summary(data) -> list:
    """Per chunk: the plane modes and selectors (after decoding), for coverage checks in tests."""
    data = bytes(data)
    info = parse_blob(data)
    out = []
    for e in info.chunks:
        _decode_chunk(data, info, e)
        out.append({"modes": e.modes, "rans_len": e.rans_len,
                    "selectors": {p: bytes(s) for p, s in e.selectors.items()}})
    return out


# ---------------------------------------------------------------------------------------------
# Section 9: the archive.

MAGIC_ARCHIVE = b"TZAR"


@dataclass
class Entry:
    kind: int
    orig_offset: int
    orig_len: int
    blob_offset: int
    blob_len: int
    orig_crc: int
    crcs: list


def parse_archive(data: bytes) -> tuple[int, int, list]:
    """Validate the header and the index; returns (original_len, checksum_piece_bytes, entries)."""
    data = bytes(data)
    r = _Reader(data)
    if r.take(4, "archive magic") != MAGIC_ARCHIVE:
        raise ValueError("BadMagic: not a tensorzip archive")
    version = r.u16("archive version")
    if version != 1:
        raise ValueError(f"UnsupportedVersion: found {version}, supported 1")
    if r.u16("reserved") != 0:
        raise ValueError("archive reserved field != 0")
    piece = r.u32("checksum_piece_bytes")
    if r.u32("reserved") != 0:
        raise ValueError("archive reserved field != 0")
    original_len = r.u64("original_len")
    index_offset = r.u64("index_offset")
    if index_offset < 32 or index_offset > len(data):
        raise ValueError(f"index_offset {index_offset} out of range")
    ir = _Reader(data, index_offset)
    n = ir.u32("index n")
    if n < 1:
        raise ValueError("archive index with no entry")
    entries = []
    for i in range(n):
        kind = ir.u8("entry kind")
        orig_offset = ir.u64("orig_offset")
        orig_len = ir.u64("orig_len")
        blob_offset = ir.u64("blob_offset")
        blob_len = ir.u64("blob_len")
        orig_crc = ir.u32("orig_crc")
        n_crc = ir.u32("n_crc")
        # n_crc is checked against blob_len before the CRCs are read (bounded reads).
        want = 1 if piece == 0 else -(-blob_len // piece)
        if n_crc != want:
            raise ValueError(f"entry {i}: n_crc {n_crc}, expected {want}")
        crcs = list(struct.unpack("<%dI" % n_crc, ir.take(4 * n_crc, "entry crcs")))
        entries.append(Entry(kind, orig_offset, orig_len, blob_offset, blob_len, orig_crc, crcs))
    index_end = ir.pos
    stored_crc = ir.u32("index crc")
    if crc32(data[index_offset:index_end]) != stored_crc:
        raise ValueError("archive index CRC mismatch")
    if ir.pos != len(data):
        raise ValueError(f"{len(data) - ir.pos} bytes after the archive index")
    # Tiling rules.
    orig_pos, blob_pos = 0, 32
    for i, e in enumerate(entries):
        if e.kind not in (0, 1, 2):
            raise ValueError(f"entry {i}: invalid kind {e.kind}")
        if (e.kind == 0) != (i == 0):
            raise ValueError(f"entry {i}: kind 0 must be the first entry and only it")
        if e.kind == 0 and e.orig_len > 8 + 100_000_000:
            raise ValueError("safetensors header entry too long")
        if e.blob_len < 1:
            raise ValueError(f"entry {i}: empty blob")
        if e.orig_offset != orig_pos:
            raise ValueError(f"entry {i}: ranges do not tile the original file")
        if e.blob_offset != blob_pos:
            raise ValueError(f"entry {i}: blobs do not tile the archive")
        orig_pos += e.orig_len
        blob_pos += e.blob_len
    if orig_pos != original_len:
        raise ValueError("ranges do not end at original_len")
    if blob_pos != index_offset:
        raise ValueError("blobs do not end at index_offset")
    return original_len, piece, entries


def restore_archive(data) -> bytes:
    """Section 9: the original .safetensors bytes, every checksum checked."""
    data = bytes(data)
    original_len, piece, entries = parse_archive(data)
    out = []
    for i, e in enumerate(entries):
        blob = data[e.blob_offset:e.blob_offset + e.blob_len]
        got = [crc32(blob)] if piece == 0 else crc32_pieces(blob, piece)
        if got != e.crcs:
            raise ValueError(f"entry {i}: blob checksum mismatch")
        h = parse_header(blob)
        if h.nbytes != e.orig_len:
            raise ValueError(f"entry {i}: blob holds {h.nbytes} bytes, range {e.orig_len}")
        if e.kind in (0, 2) and (h.dtype.code != 1 or h.shape != (e.orig_len,)):
            raise ValueError(f"entry {i}: kind {e.kind} must be a u8 blob of shape [orig_len]")
        _, _, raw = decode_blob(blob)
        if crc32(raw) != e.orig_crc:
            raise ValueError(f"entry {i}: CRC-32 of the decoded bytes does not match")
        out.append(raw)
    restored = b"".join(out)
    assert len(restored) == original_len
    return restored


# ---------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    blob_mode = False
    if argv and argv[0] == "--blob":
        blob_mode = True
        argv = argv[1:]
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], "rb") as f:
        data = f.read()
    try:
        if blob_mode:
            code, shape, out = decode_blob(data)
            print(f"dtype {DTYPES[code].name}, shape {list(shape)}, {len(out)} bytes", file=sys.stderr)
        else:
            out = restore_archive(data)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    with open(argv[1], "wb") as f:
        f.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
