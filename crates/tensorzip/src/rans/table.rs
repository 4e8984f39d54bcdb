//! Frequency tables: normalisation from counts, their compact serialisation, and the derived tables
//! the encoder and decoder use.
//!
//! Serialised form (normative in `docs/FORMAT.md`, "Frequency tables"): `lo: u8`, `hi: u8`, then one
//! code byte per symbol `lo..=hi`:
//! * `0` — symbol absent;
//! * `1..=127` — frequency equal to the code;
//! * `128..=207` — frequency `(16 + (k & 15)) << ((k >> 4) + 3)` with `k = code - 128`
//!   (128..=3968 in steps of 1/16 of a power of two);
//! * `255` — the *anchor*: frequency `4096 - sum(other frequencies)`; exactly one per table;
//! * anything else is invalid.
//!
//! The codes at `lo` and at `hi` are non-zero. A table of one symbol is `lo == hi` with code 255: that
//! symbol has frequency 4096 and costs nothing to code.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::decode::DecodeTable;
use super::log2::code_len_table;
use super::PROB_SCALE;
use crate::error::{corrupt, truncated, Result};

const ANCHOR: u8 = 255;

/// Frequency of a (non-anchor, non-zero) code byte, or `None` if the code is invalid.
pub const fn code_to_freq(c: u8) -> Option<u32> {
    match c {
        1..=127 => Some(c as u32),
        128..=207 => {
            let k = (c - 128) as u32;
            Some((16 + (k & 15)) << ((k >> 4) + 3))
        }
        _ => None,
    }
}

/// [`CODE_FREQ`]'s entry for a code byte that is not valid (208..=254).
const CODE_INVALID: u16 = u16::MAX;

/// Per code byte: its frequency ([`code_to_freq`]), 0 for 0 (absent) and for the anchor (its
/// frequency is the rest of 4096), or [`CODE_INVALID`].
static CODE_FREQ: [u16; 256] = {
    let mut t = [0u16; 256];
    let mut c = 1;
    while c < ANCHOR as usize {
        t[c] = match code_to_freq(c as u8) {
            Some(f) => f as u16,
            None => CODE_INVALID,
        };
        c += 1;
    }
    t
};

/// The code whose frequency is nearest to `q` (`1 <= q <= 4095`; ties go to the smaller value).
fn nearest_code(q: u32) -> u8 {
    debug_assert!((1..PROB_SCALE).contains(&q));
    if q <= 127 {
        return q as u8;
    }
    let e = (31 - q.leading_zeros()) - 7; // q in [128 << e, 256 << e)
    let step = 8u32 << e; // 2^(e + 3)
    let base = 128u32 << e;
    let mut m = (q - base + step / 2 - 1) >> (e + 3); // / step, rounded half down
    let mut e = e;
    if m == 16 {
        if e == 4 {
            m = 15; // 4096 is not representable; 3968 is the largest value
        } else {
            m = 0;
            e += 1;
        }
    }
    (128 + (e << 4) + m) as u8
}

/// The code just below `c` (smaller frequency), for `c >= 2`.
fn code_below(c: u8) -> u8 {
    c - 1
}

/// The first pass of [`FreqTable::normalize`]: the anchor and every other present symbol rounded to
/// its nearest code, before the frequencies are stepped down to fit.
struct Rounded {
    codes: [u8; 256],
    anchor: usize,
    /// Sum of the frequencies of the symbols other than the anchor.
    sum: u32,
    count_present: usize,
}

impl Rounded {
    fn of(counts: &[u64; 256], forced: Option<&[bool; 256]>) -> Option<Rounded> {
        let present = |s: usize| counts[s] > 0 || forced.is_some_and(|f| f[s]);
        // Every symbol with a count is present, so the loops below run over the present range
        // only (an exponent plane's tables span ~40 symbols: whole-range loops made this the
        // largest part of a small tensor's table search).
        let lo = (0..256).find(|&s| present(s))?;
        let hi = (lo..256).rev().find(|&s| present(s)).unwrap_or(lo);
        let n: u128 = counts[lo..=hi].iter().map(|&c| c as u128).sum();
        if n == 0 {
            return None;
        }
        // The first symbol of the largest count (which is present: n > 0).
        let mut anchor = lo;
        for s in lo + 1..=hi {
            if counts[s] > counts[anchor] {
                anchor = s;
            }
        }
        let mut codes = [0u8; 256];
        let mut sum = 0u32;
        let mut count_present = 0;
        for s in lo..=hi {
            if !present(s) {
                continue;
            }
            count_present += 1;
            if s == anchor {
                continue;
            }
            let q = if n < 1 << 48 {
                // The same quotient in 64-bit arithmetic (2 * c * 4096 + n < 2^62), which is
                // several times faster than a 128-bit division.
                let n = n as u64;
                ((2 * counts[s] * PROB_SCALE as u64 + n) / (2 * n)) as u32
            } else {
                ((2 * counts[s] as u128 * PROB_SCALE as u128 + n) / (2 * n)) as u32
            };
            let c = nearest_code(q.clamp(1, PROB_SCALE - 1));
            codes[s] = c;
            sum += code_to_freq(c)?;
        }
        codes[anchor] = ANCHOR;
        Some(Rounded {
            codes,
            anchor,
            sum,
            count_present,
        })
    }
}

/// A normalised frequency table over byte symbols.
#[derive(Clone, PartialEq, Eq)]
pub struct FreqTable {
    /// Frequency of each symbol; `0` = absent. The sum is exactly 4096.
    pub freq: [u16; 256],
    codes: [u8; 256],
    lo: u8,
    hi: u8,
}

impl std::fmt::Debug for FreqTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nz: Vec<(u8, u16)> = (0..256)
            .filter(|&s| self.freq[s] > 0)
            .map(|s| (s as u8, self.freq[s]))
            .collect();
        f.debug_struct("FreqTable").field("freq", &nz).finish()
    }
}

impl FreqTable {
    /// Normalises `counts` to a table. Every symbol with a non-zero count or `forced[s]` gets a
    /// frequency of at least 1. Returns `None` when no count is positive.
    ///
    /// Algorithm (normative, `docs/FORMAT.md` "Table normalisation"): the anchor is the symbol with the
    /// largest count (the smallest symbol among ties). Every other present symbol `s` gets
    /// `q = max(1, floor((2*c[s]*4096 + n) / (2n)))` (clamped to 4095) rounded to the nearest code
    /// (ties to the smaller frequency). While the others sum to more than 4095, the symbol with the
    /// largest frequency (smallest symbol among ties) steps down one code. The anchor takes the rest.
    pub fn normalize(counts: &[u64; 256], forced: Option<&[bool; 256]>) -> Option<FreqTable> {
        let Rounded {
            mut codes,
            anchor,
            mut sum,
            count_present,
        } = Rounded::of(counts, forced)?;
        if count_present > 1 && sum > PROB_SCALE - 1 {
            // Step the largest frequency down (the smallest symbol among ties), one code at a time.
            // A heap keyed (frequency, reversed symbol) pops exactly that symbol; scanning all 256
            // symbols per step was ~40% of this function, which is ~12% of compressing fp16.
            let mut heap: BinaryHeap<(u32, Reverse<usize>)> = (0..256)
                .filter(|&s| s != anchor && codes[s] != 0)
                .filter_map(|s| Some((code_to_freq(codes[s])?, Reverse(s))))
                .collect();
            while sum > PROB_SCALE - 1 {
                // Never empty, and the top frequency is > 1: at most 255 others of frequency 1
                // sum to less than 4096.
                let Some((f, Reverse(s))) = heap.pop() else {
                    break;
                };
                let c = code_below(codes[s]);
                let Some(nf) = code_to_freq(c) else {
                    break;
                };
                sum = sum - f + nf;
                codes[s] = c;
                heap.push((nf, Reverse(s)));
            }
        }
        Some(Self::from_codes(codes).expect("normalize builds valid codes"))
    }

    /// The table of `codes` (`None` as [`FreqTable::fill_freq`] fails, or for no symbol).
    fn from_codes(codes: [u8; 256]) -> Option<FreqTable> {
        let lo = codes.iter().position(|&c| c != 0)? as u8;
        let hi = 255 - codes.iter().rev().position(|&c| c != 0)? as u8;
        let mut t = FreqTable {
            freq: [0; 256],
            codes,
            lo,
            hi,
        };
        t.fill_freq().then_some(t)
    }

    /// Fills `freq` from `codes` over `lo..=hi` (zero before): `false` for an invalid code, no
    /// anchor or two, or frequencies summing past 4096 (`freq` then holds no meaning; the callers
    /// drop the table). Branch-free over the symbols, by [`CODE_FREQ`]: a table's codes are close
    /// to random bytes, so the per-code match it replaced mispredicted on most of them (~20% of
    /// parsing all-MiniLM-L6-v2 bf16's blob prefixes).
    fn fill_freq(&mut self) -> bool {
        let (lo, hi) = (self.lo as usize, self.hi as usize);
        let mut sum = 0u32;
        let mut anchors = 0u32;
        let mut invalid = 0u32;
        for (f, &c) in self.freq[lo..=hi].iter_mut().zip(&self.codes[lo..=hi]) {
            let v = CODE_FREQ[c as usize];
            invalid |= (v == CODE_INVALID) as u32;
            anchors += (c == ANCHOR) as u32;
            *f = v;
            sum += v as u32;
        }
        if invalid != 0 || anchors != 1 || sum >= PROB_SCALE {
            return false;
        }
        let Some(a) = self.codes[lo..=hi].iter().position(|&c| c == ANCHOR) else {
            return false;
        };
        self.freq[lo + a] = (PROB_SCALE - sum) as u16;
        true
    }

    /// Bytes of the serialised table.
    pub fn serialized_len(&self) -> usize {
        2 + (self.hi - self.lo) as usize + 1
    }

    /// Appends the serialised table to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(self.lo);
        out.push(self.hi);
        out.extend_from_slice(&self.codes[self.lo as usize..=self.hi as usize]);
    }

    /// Parses one table from the front of `data`; returns it and the bytes it used.
    pub fn parse(data: &[u8]) -> Result<(FreqTable, usize)> {
        let mut one = Vec::with_capacity(1);
        let used = Self::parse_into(data, &mut one)?;
        match one.pop() {
            Some(t) => Ok((t, used)),
            None => corrupt("frequency table not parsed"),
        }
    }

    /// Parses one table from the front of `data` onto the end of `list` (where it is built: a
    /// table made on the stack and moved, 770 bytes written in small stores and read back in large
    /// ones, cost ~12% of parsing a small model's blobs); returns the bytes it used. On an error
    /// `list` is as it was.
    pub fn parse_into(data: &[u8], list: &mut Vec<FreqTable>) -> Result<usize> {
        if data.len() < 2 {
            return truncated("frequency table header");
        }
        let (lo, hi) = (data[0], data[1]);
        if lo > hi {
            return corrupt(format!("frequency table range {lo}..={hi} is empty"));
        }
        let len = 2 + (hi - lo) as usize + 1;
        if data.len() < len {
            return truncated("frequency table codes");
        }
        let body = &data[2..len];
        if body[0] == 0 || body[body.len() - 1] == 0 {
            return corrupt("frequency table range does not start and end at present symbols");
        }
        list.push(FreqTable {
            freq: [0; 256],
            codes: [0; 256],
            lo,
            hi,
        });
        let k = list.len() - 1;
        let t = &mut list[k];
        t.codes[lo as usize..=hi as usize].copy_from_slice(body);
        if !t.fill_freq() {
            list.pop();
            return corrupt(
                "frequency table has invalid codes, no single anchor, or frequencies over 4096",
            );
        }
        Ok(len)
    }

    /// Whether the table has a single symbol (frequency 4096: coding it costs nothing).
    pub fn is_single(&self) -> bool {
        self.lo == self.hi
    }

    /// The symbol of a single-symbol table.
    pub fn single_symbol(&self) -> u8 {
        self.lo
    }

    /// Code length of the counts `hist` under this table, in Q16 bits;
    /// [`CL_ABSENT`](super::log2::CL_ABSENT) per symbol the table lacks.
    pub fn cost(&self, hist: &[u32; 256]) -> u64 {
        let cl = code_len_table();
        let mut total = 0u64;
        for (s, &h) in hist.iter().enumerate() {
            if h != 0 {
                total += h as u64 * cl[self.freq[s] as usize];
            }
        }
        total
    }

    /// Cumulative frequencies (in symbol order).
    pub fn cumulative(&self) -> [u32; 256] {
        let mut cum = [0u32; 256];
        let mut acc = 0u32;
        for s in 0..256 {
            cum[s] = acc;
            acc += self.freq[s] as u32;
        }
        cum
    }

    /// The decoder's tables: for slot `x & 4095`, `sym | freq << 8 | (slot - cum) << 20`, and
    /// for a table of at most 64 symbols the same lookup by rank ([`RankedDecodeTable`]) where
    /// its buckets allow it. Only for tables of two or more symbols.
    pub fn decode_table(&self) -> Box<DecodeTable> {
        debug_assert!(!self.is_single());
        let mut t = Box::new(DecodeTable {
            slots: [0u32; PROB_SCALE as usize],
            ranked: None,
        });
        fill_slots(&mut t.slots, &self.freq);
        t.ranked = RankedDecodeTable::new(&self.freq);
        t
    }

    /// The encoder's per-symbol constants. Only for tables of two or more symbols.
    pub fn encode_table(&self) -> Box<EncTable> {
        self.encode_table_with(crate::cpu::wide_rank_lookups())
    }

    /// [`FreqTable::encode_table`], with entries by rank for tables of up to 32 symbols, and with
    /// `wide` up to [`RANKED_SYMBOLS`].
    pub(crate) fn encode_table_with(&self, wide: bool) -> Box<EncTable> {
        let cum = self.cumulative();
        let mut t = Box::new(EncTable {
            syms: [EncSymbol::default(); 256],
            packed: [0; 256],
            ranked: None,
        });
        for s in 0..256 {
            let f = self.freq[s] as u32;
            if f != 0 {
                t.syms[s] = EncSymbol {
                    inv: 1.0 / f as f64,
                    freq: f,
                    cum: cum[s],
                };
                let r = if f == 1 {
                    u32::MAX as u64
                } else {
                    (1u64 << 32) / f as u64
                };
                t.packed[s] = f as u64 | (cum[s] as u64) << 16 | r << 32;
            }
        }
        let present = (0..256).filter(|&s| self.freq[s] != 0);
        let n = present.clone().count();
        if n <= NARROW_RANKED_SYMBOLS || (wide && n <= RANKED_SYMBOLS) {
            let mut rt = Box::new(RankedTable {
                rank: [0; 256],
                fc: [0; RANKED_VECTOR_ENTRIES],
                rcp: [0; RANKED_VECTOR_ENTRIES],
                wide: n > NARROW_RANKED_SYMBOLS,
                last: None,
            });
            for (k, s) in present.enumerate() {
                rt.rank[s] = k as u8;
                let (fc, rcp) = (t.packed[s] as u32, (t.packed[s] >> 32) as u32);
                match k < RANKED_VECTOR_ENTRIES {
                    true => (rt.fc[k], rt.rcp[k]) = (fc, rcp),
                    false => rt.last = Some((fc, rcp)),
                }
            }
            t.ranked = Some(rt);
        }
        t
    }
}

/// The encoder's view of a table: per symbol, scalar constants and a packed form for the SIMD path.
#[derive(Clone, Debug)]
pub struct EncTable {
    pub syms: [EncSymbol; 256],
    /// `freq | cum << 16 | R << 32` with `R = floor(2^32 / freq)` (`2^32 - 1` for `freq == 1`):
    /// `(x * R) >> 32` is `x / freq` or one less, for any `x < 2^32`.
    pub packed: [u64; 256],
    /// The same entries indexed by rank, for a table of at most [`RANKED_SYMBOLS`] symbols.
    pub ranked: Option<Box<RankedTable>>,
}

/// Most symbols a table may have for [`RankedTable`]: eight vectors of sixteen 32-bit entries
/// ([`RANKED_VECTOR_ENTRIES`]) and one more held apart ([`RankedTable::last`]). 129 is what a
/// version 2 rank plane's tables have (128 pair ranks and the escape: every such table of
/// all-MiniLM-L6-v2 bf16), which gathered before.
pub const RANKED_SYMBOLS: usize = RANKED_VECTOR_ENTRIES + 1;

/// Entries of [`RankedTable`]'s fields by rank held in vectors: ranks 0-127.
pub const RANKED_VECTOR_ENTRIES: usize = 128;

/// Most symbols of a narrow [`RankedTable`] (entries in two vectors, one permute a field).
pub const NARROW_RANKED_SYMBOLS: usize = 32;

/// A small table's entries by rank, so that the AVX-512 encoder looks them up with register
/// permutes instead of gathers: symbol → rank by two 128-byte permutes (`vpermi2b`), rank →
/// entry by one two-register permute (`vpermi2d`) per vector of sixteen lanes for up to 32
/// symbols, or four and three blends (`wide`, up to 128, made only where
/// `crate::cpu::wide_rank_lookups`), and for a 129th symbol (rank 128, `last`) one more blend of
/// a broadcast entry into the lanes of that rank. Gathers are the
/// encoder's bottleneck on some cores (AMD Zen 4: ~13 cycles for an eight-lane 64-bit gather,
/// two per sixteen symbols), and most tables are small: the exponent planes of every tensor of
/// all-MiniLM-L6-v2 and of the synthetic sets, bf16 and fp32, have at most 29 symbols
/// (docs/DESIGN.md, "Small tables by rank").
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub struct RankedTable {
    /// Rank of each present symbol among the present symbols (0 for absent ones, which a
    /// sequence never holds).
    pub rank: [u8; 256],
    /// `freq | cum << 16` by rank (the low half of [`EncTable::packed`]), ranks 0-127.
    pub fc: [u32; RANKED_VECTOR_ENTRIES],
    /// `R` by rank (the high half of [`EncTable::packed`]), ranks 0-127.
    pub rcp: [u32; RANKED_VECTOR_ENTRIES],
    /// More than [`NARROW_RANKED_SYMBOLS`] symbols: the lookup takes all eight vectors.
    pub wide: bool,
    /// The `fc` and `rcp` entries of rank 128, for a table of [`RANKED_SYMBOLS`] symbols (only
    /// `wide` ones).
    pub last: Option<(u32, u32)>,
}

// The AVX-512 encoder reads each field with aligned 64-byte loads.
const _: () = assert!(
    std::mem::offset_of!(RankedTable, fc) % 64 == 0
        && std::mem::offset_of!(RankedTable, rcp) % 64 == 0
);

/// The decoder's lookup of a table of at most [`RANKED_DECODE_SYMBOLS`] symbols by rank, with
/// register permutes instead of a gather of [`DecodeTable::slots`] (AVX-512 VBMI, where
/// `crate::cpu::ranked_decode`): on the Zen 4 VM a 16-lane gather issues every ~7.5 ns, and a
/// model of the AVX-512 step (two streams, random states, this table's lookup against the
/// gather) took 0.41-0.42 instead of 0.68-0.72 ns a symbol (docs/DESIGN.md, "Small tables by
/// rank").
///
/// Slot `s` belongs to the symbol of rank `r` with `end[r - 1] <= s < end[r]`. Bucket
/// `b = s >> 5` (32 slots) holds the rank of its first slot, `c`. Where at most one rank ends
/// inside the bucket (after its first slot), `r = c + (s >= end[c])`. The few buckets where
/// several do (rare symbols of frequency below 32 side by side: 1-3 per exponent table of
/// all-MiniLM-L6-v2) are marked `0x80 | m << 5` and look the rank up per slot in `fine`, at
/// `32 m + (s & 31)`, for `m < 4`; a table with more such buckets has no ranked form. Ranks
/// 32-63 (`wide`: tables of 33-64 symbols, which a tensor whose rows' scales vary widely has, as
/// its tables cover every exponent of its sample) take a second pair of vectors of `end` and
/// `entry`, chosen by bit 5 of the rank.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub struct RankedDecodeTable {
    /// Per bucket of 32 slots: the rank of its first slot, or `0x80 | m << 5` for the `m`-th
    /// bucket looked up in `fine`.
    pub bucket: [u8; 128],
    /// The rank of each slot of the marked buckets: slot `32 j` of the `m`-th at `32 m + j`.
    pub fine: [u8; 128],
    /// `cum + freq` by rank (4096 past the last rank).
    pub end: [u32; RANKED_DECODE_SYMBOLS],
    /// `sym | freq << 8 | cum << 20` by rank.
    pub entry: [u32; RANKED_DECODE_SYMBOLS],
    /// More than [`NARROW_RANKED_SYMBOLS`] symbols: ranks 32-63 are in use.
    pub wide: bool,
}

/// Most symbols a table may have for [`RankedDecodeTable`] (four vectors a field).
pub const RANKED_DECODE_SYMBOLS: usize = 64;

// The AVX-512 decoder reads each field with aligned 64-byte loads.
const _: () = assert!(
    std::mem::offset_of!(RankedDecodeTable, fine) % 64 == 0
        && std::mem::offset_of!(RankedDecodeTable, end) % 64 == 0
        && std::mem::offset_of!(RankedDecodeTable, entry) % 64 == 0
);

/// Buckets of [`RankedDecodeTable`] a table may have looked up slot by slot (`fine` holds 128
/// ranks: 32 a bucket).
const FINE_BUCKETS: usize = 4;

impl RankedDecodeTable {
    /// The ranked lookup of the table of frequencies `freq` (summing to 4096, two or more
    /// symbols), or `None` where it has more than 64 symbols or more than four buckets where
    /// several ranks end.
    pub fn new(freq: &[u16; 256]) -> Option<RankedDecodeTable> {
        let mut t = RankedDecodeTable {
            bucket: [0; 128],
            fine: [0; 128],
            end: [PROB_SCALE; RANKED_DECODE_SYMBOLS],
            entry: [0; RANKED_DECODE_SYMBOLS],
            wide: false,
        };
        let mut n = 0usize;
        let mut cum = 0u32;
        for (s, &f) in freq.iter().enumerate() {
            if f == 0 {
                continue;
            }
            if n == RANKED_DECODE_SYMBOLS {
                return None;
            }
            t.entry[n] = s as u32 | (f as u32) << 8 | cum << 20;
            cum += f as u32;
            t.end[n] = cum;
            n += 1;
        }
        if n < 2 || cum != PROB_SCALE {
            return None;
        }
        t.wide = n > NARROW_RANKED_SYMBOLS;
        // One walk over the buckets: `c` is the rank of the bucket's first slot, `past` the first
        // rank that ends at or after the bucket's end (ranks `c..past` end inside it).
        let end = t.end;
        let mut fine = [0u8; 128];
        let (mut c, mut past, mut marked) = (0usize, 0usize, 0usize);
        for b in 0..128usize {
            let first = 32 * b as u32;
            while end[c] <= first {
                c += 1;
            }
            past = past.max(c);
            while past < n - 1 && end[past] < first + 32 {
                past += 1;
            }
            // Ends inside the bucket, after its first slot: `end[c] > first` always.
            if past - c <= 1 {
                t.bucket[b] = c as u8;
                continue;
            }
            if marked == FINE_BUCKETS {
                return None;
            }
            t.bucket[b] = 0x80 | (marked as u8) << 5;
            let mut r = c;
            for j in 0..32 {
                while end[r] <= first + j as u32 {
                    r += 1;
                }
                fine[32 * marked + j] = r as u8;
            }
            marked += 1;
        }
        t.fine = fine;
        Some(t)
    }
}

/// The decoder's slot entries of `freq` (summing to 4096): for each symbol `s` in order, its `f`
/// slots `sym | f << 8 | k << 20`, `k < f`. With AVX-512 sixteen entries a store: building the
/// tables was 3% of a one-thread decode of all-MiniLM-L6-v2 bf16 (perf, 2026-12-06; a 16 KiB
/// fill per table, ~11 MB per decode of the model).
fn fill_slots(slots: &mut [u32; PROB_SCALE as usize], freq: &[u16; 256]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx512() {
        // SAFETY: AVX-512F support was checked at run time.
        return unsafe { fill_slots_avx512(slots, freq) };
    }
    fill_slots_impl(slots, freq)
}

/// [`fill_slots`] sixteen entries a store: a symbol's entries are its base word OR'd with
/// `k << 20`, `k` counting up by sixteen a vector; the last partial vector by a masked store.
///
/// # Safety
/// AVX-512F required.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fill_slots_avx512(slots: &mut [u32; PROB_SCALE as usize], freq: &[u16; 256]) {
    use std::arch::x86_64::*;
    let iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let ks = _mm512_slli_epi32::<20>(iota);
    let step = _mm512_set1_epi32(16 << 20);
    let mut at = 0usize;
    for (s, &f) in freq.iter().enumerate() {
        let f = f as usize;
        if f == 0 {
            continue;
        }
        // A normalised table sums to 4096; a malformed one is left partly filled, not overrun.
        if at + f > slots.len() {
            return;
        }
        let mut v = _mm512_or_si512(_mm512_set1_epi32((s | f << 8) as i32), ks);
        let mut k = 0;
        // SAFETY: every store covers slots[at + k .. at + k + 16] with at + k + 16 <= at + f <=
        // 4096, or (masked) only the f - k < 16 entries left.
        unsafe {
            let p = slots.as_mut_ptr().add(at);
            while k + 16 <= f {
                _mm512_storeu_si512(p.add(k) as *mut _, v);
                v = _mm512_add_epi32(v, step);
                k += 16;
            }
            if k < f {
                _mm512_mask_storeu_epi32(p.add(k) as *mut _, ((1u32 << (f - k)) - 1) as u16, v);
            }
        }
        at += f;
    }
}

fn fill_slots_impl(slots: &mut [u32; PROB_SCALE as usize], freq: &[u16; 256]) {
    let mut at = 0usize;
    for (s, &f) in freq.iter().enumerate() {
        let f = f as usize;
        // A normalised table sums to 4096: `get_mut` only keeps a malformed one from panicking.
        if let Some(run) = slots.get_mut(at..at + f) {
            let base = s as u32 | (f as u32) << 8;
            for (k, e) in run.iter_mut().enumerate() {
                *e = base | (k as u32) << 20;
            }
        }
        at += f;
    }
}

/// Encoder constants of one symbol.
#[derive(Clone, Copy, Default, Debug)]
pub struct EncSymbol {
    /// `1 / freq`, rounded to the nearest double.
    pub inv: f64,
    /// Frequency (0 = absent).
    pub freq: u32,
    /// Cumulative frequency.
    pub cum: u32,
}

/// Offset that makes [`EncSymbol::div`] exact (see there).
pub const DIV_BIAS: f64 = 1.0 / 65536.0;

impl EncSymbol {
    /// `floor(x / freq)` for `x < freq << 20` (the encoder's range), exactly.
    ///
    /// With `inv = RN(1/f)` the rounded product `x * inv` is within `2^-32` of `x / f` (relative error
    /// below `2^-52` on a quotient below `2^20`), and the rounded sum adds at most `2^-33`.
    /// The true quotient is `q + k/f` with `0 <= k < f <= 4095`, so adding `2^-16` lifts an exact
    /// integer that rounded down back above `q`, and cannot push `q + (f-1)/f` past `q + 1` because
    /// `1/f > 2^-16 + 2^-32`.
    #[inline(always)]
    pub fn div(&self, x: u32) -> u32 {
        (x as f64 * self.inv + DIV_BIAS) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rans::log2::CL_ABSENT;

    /// The branch-free parse's lookup is `code_to_freq` (0 for the absent code and the anchor),
    /// and a table parses exactly where the per-code rules accept it: every code byte in every
    /// position of a small table, with and without an anchor, twice anchored, summing past 4096.
    #[test]
    fn code_freq_lookup_is_code_to_freq() {
        for c in 0..=255u8 {
            let want = match c {
                0 | ANCHOR => 0,
                c => code_to_freq(c).map_or(CODE_INVALID, |f| f as u16),
            };
            assert_eq!(CODE_FREQ[c as usize], want, "code {c}");
        }
        for c in 0..=255u8 {
            for (codes, ok) in [
                (
                    vec![ANCHOR, c, 3],
                    c != ANCHOR && (c == 0 || code_to_freq(c).is_some()),
                ),
                (vec![5, c, 7], c == ANCHOR),
                (vec![ANCHOR, c, 207, 207], false),
                (vec![c], c == ANCHOR),
            ] {
                let mut data = vec![10u8, 10 + codes.len() as u8 - 1];
                data.extend_from_slice(&codes);
                let got = FreqTable::parse(&data);
                assert_eq!(got.is_ok(), ok, "codes {codes:?}");
                if let Ok((t, used)) = got {
                    assert_eq!(used, data.len());
                    assert_eq!(t.freq.iter().map(|&f| f as u32).sum::<u32>(), PROB_SCALE);
                    for (s, &code) in codes.iter().enumerate() {
                        let f = t.freq[10 + s] as u32;
                        match code {
                            0 => assert_eq!(f, 0),
                            ANCHOR => assert!(f > 0),
                            code => assert_eq!(Some(f), code_to_freq(code)),
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn codes_cover_values_and_nearest_is_nearest() {
        let mut values: Vec<u32> = (0..=255u8).filter_map(code_to_freq).collect();
        values.sort_unstable();
        values.dedup();
        assert_eq!(values.len(), 127 + 80);
        assert_eq!(*values.last().unwrap(), 3968);
        for q in 1..PROB_SCALE {
            let c = nearest_code(q);
            let f = code_to_freq(c).unwrap();
            let best = values
                .iter()
                .map(|&v| (v as i64 - q as i64).abs())
                .min()
                .unwrap();
            assert_eq!((f as i64 - q as i64).abs(), best, "q={q}");
        }
        // Codes are monotone, so stepping a code down lowers the frequency.
        for c in 2..=207u8 {
            assert!(code_to_freq(c - 1).unwrap() < code_to_freq(c).unwrap());
        }
    }

    /// The step down as FORMAT.md states it, one linear scan per step, after the shared first
    /// rounding pass: the reference the heap in `normalize` must equal.
    fn normalize_reference(
        counts: &[u64; 256],
        forced: Option<&[bool; 256]>,
        steps: &mut u32,
    ) -> Option<[u8; 256]> {
        let Rounded {
            mut codes,
            anchor,
            mut sum,
            count_present,
        } = Rounded::of(counts, forced)?;
        while count_present > 1 && sum > PROB_SCALE - 1 {
            let mut best = usize::MAX;
            let mut best_f = 0;
            for s in 0..256 {
                if s != anchor && codes[s] != 0 && code_to_freq(codes[s]).unwrap() > best_f {
                    best_f = code_to_freq(codes[s]).unwrap();
                    best = s;
                }
            }
            let c = codes[best] - 1;
            sum = sum - best_f + code_to_freq(c).unwrap();
            codes[best] = c;
            *steps += 1;
        }
        Some(codes)
    }

    #[test]
    fn normalize_equals_the_reference() {
        let mut rng = crate::sample::Rng::new(41);
        let (mut steps, mut stepped) = (0u32, 0u32);
        for case in 0..3000 {
            let mut counts = [0u64; 256];
            let present = 1 + (rng.next_u64() % 256) as usize;
            // Skewed counts (a few large, many tiny: many symbols rounded up to frequency 1, so
            // many steps down), uniform ones, and huge ones (the 128-bit path).
            for _ in 0..present {
                let s = (rng.next_u64() % 256) as usize;
                counts[s] = match case % 4 {
                    0 => 1 + rng.next_u64() % 3,
                    1 => 1 + (rng.next_u64() % 1000).pow(3),
                    2 => 1 + rng.next_u64() % 100_000,
                    _ => (1 << 50) + rng.next_u64() % (1 << 40),
                };
            }
            if case % 7 == 0 {
                counts[(rng.next_u64() % 256) as usize] += 1 << 30;
            }
            let forced = (case % 5 == 0).then(|| {
                let mut f = [false; 256];
                for _ in 0..20 {
                    f[(rng.next_u64() % 256) as usize] = true;
                }
                f
            });
            let before = steps;
            let want = normalize_reference(&counts, forced.as_ref(), &mut steps);
            stepped += u32::from(steps > before);
            let got = FreqTable::normalize(&counts, forced.as_ref()).map(|t| t.codes);
            assert_eq!(got, want, "case {case}");
        }
        // The cases exercise the stepping down, not only the first rounding.
        assert!(
            stepped > 100 && steps > 1000,
            "{stepped} cases stepped, {steps} steps"
        );
    }

    /// The decoder's slot entries, filled sixteen a store with AVX-512 or by the portable loop,
    /// are each symbol's `f` entries `sym | f << 8 | k << 20` in symbol order: tables of 2 to
    /// 256 symbols, frequencies from 1 to 4094, runs of every length modulo 16.
    #[test]
    fn decode_table_slots_are_each_symbols_run() {
        let mut next = crate::rans::test_input::xorshift(0x9E37_79B9_7F4A_7C15);
        for case in 0..300 {
            let mut counts = [0u64; 256];
            let n = 2 + case % 255;
            for _ in 0..n {
                counts[(next() % 256) as usize] += 1 + next() % (1 << (next() % 20));
            }
            if counts.iter().filter(|&&c| c > 0).count() < 2 {
                counts[0] += 1;
                counts[255] += 1;
            }
            let t = FreqTable::normalize(&counts, None).unwrap();
            let d = t.decode_table();
            let mut want = Vec::with_capacity(PROB_SCALE as usize);
            for s in 0..256u32 {
                let f = t.freq[s as usize] as u32;
                want.extend((0..f).map(|k| s | f << 8 | k << 20));
            }
            assert_eq!(&d.slots[..], &want[..], "case {case}");
            // The portable loop too (what CPUs without AVX-512 run).
            let mut plain = [0u32; PROB_SCALE as usize];
            fill_slots_impl(&mut plain, &t.freq);
            assert_eq!(&plain[..], &want[..], "case {case}, portable");
        }
    }

    #[test]
    fn normalize_sums_to_scale_and_serialises() {
        let mut counts = [0u64; 256];
        for s in 100..140 {
            counts[s] = ((s as u64 - 99) * 7919) % 100_000 + 1;
        }
        counts[120] = 10_000_000;
        let t = FreqTable::normalize(&counts, None).unwrap();
        assert_eq!(t.freq.iter().map(|&f| f as u32).sum::<u32>(), PROB_SCALE);
        for s in 0..256 {
            assert_eq!(t.freq[s] > 0, counts[s] > 0);
        }
        let mut buf = Vec::new();
        t.write(&mut buf);
        assert_eq!(buf.len(), t.serialized_len());
        let (back, used) = FreqTable::parse(&buf).unwrap();
        assert_eq!(used, buf.len());
        assert_eq!(back, t);
    }

    #[test]
    fn normalize_handles_flat_and_single_and_forced() {
        let flat = [1000u64; 256];
        let t = FreqTable::normalize(&flat, None).unwrap();
        assert!(t.freq.iter().all(|&f| f == 16));
        let mut one = [0u64; 256];
        one[7] = 5;
        let t = FreqTable::normalize(&one, None).unwrap();
        assert!(t.is_single());
        assert_eq!(t.freq[7], 4096);
        let mut forced = [false; 256];
        forced[200] = true;
        let t = FreqTable::normalize(&one, Some(&forced)).unwrap();
        assert!(!t.is_single());
        assert_eq!(t.freq[200], 1);
        assert_eq!(t.freq[7], 4095);
        // Many tiny symbols next to a huge one: the fix-up keeps the sum at 4096.
        let mut skew = [1u64; 256];
        skew[0] = u32::MAX as u64;
        let t = FreqTable::normalize(&skew, None).unwrap();
        assert_eq!(t.freq.iter().map(|&f| f as u32).sum::<u32>(), PROB_SCALE);
        assert_eq!(t.freq[0], 4096 - 255);
        assert!(FreqTable::normalize(&[0u64; 256], None).is_none());
    }

    #[test]
    fn parse_rejects_bad_tables() {
        assert!(FreqTable::parse(&[]).is_err());
        assert!(FreqTable::parse(&[5]).is_err());
        assert!(FreqTable::parse(&[5, 4, 255]).is_err()); // lo > hi
        assert!(FreqTable::parse(&[5, 6, 255]).is_err()); // truncated
        assert!(FreqTable::parse(&[5, 6, 10, 20]).is_err()); // no anchor
        assert!(FreqTable::parse(&[5, 6, 255, 255]).is_err()); // two anchors
        assert!(FreqTable::parse(&[5, 7, 255, 0, 0]).is_err()); // hi absent
        assert!(FreqTable::parse(&[5, 6, 255, 208]).is_err()); // invalid code
        assert!(FreqTable::parse(&[0, 1, 207, 207]).is_err()); // 3968 + anchor is fine, but
                                                               // two 3968s exceed the scale:
        assert!(FreqTable::parse(&[0, 2, 207, 207, 255]).is_err());
        assert!(FreqTable::parse(&[9, 9, 255]).unwrap().0.is_single());
    }

    #[test]
    fn encoder_reciprocal_is_exact_division() {
        let mut counts = [0u64; 256];
        for (s, c) in counts.iter_mut().enumerate() {
            *c = (s as u64 * 31 + 7) % 97 + 1;
        }
        let t = FreqTable::normalize(&counts, None).unwrap();
        let e = t.encode_table();
        let mut x = 1u32;
        for s in 0..256 {
            let f = t.freq[s] as u32;
            let es = e.syms[s];
            let r = e.packed[s] >> 32;
            let reciprocal_div = |v: u32| {
                let q = ((v as u64 * r) >> 32) as u32;
                if v - q * f >= f {
                    q + 1
                } else {
                    q
                }
            };
            // Every multiple of f and its neighbours up to the top of the range, for this f.
            for q in (0..(1u32 << 20)).step_by(97) {
                for v in [q * f, (q * f).saturating_sub(1), q * f + f - 1] {
                    if v < f << 20 {
                        assert_eq!(es.div(v), v / f, "v={v} f={f}");
                        assert_eq!(reciprocal_div(v), v / f, "v={v} f={f}");
                    }
                }
            }
            for k in 0..2000u32 {
                x = x.wrapping_mul(747_796_405).wrapping_add(2_891_336_453 ^ k);
                let top = (f << 20) - 1; // largest state the encoder divides
                let xs = [
                    x % (f << 20),
                    top,
                    top - 1,
                    0,
                    1,
                    f,
                    f - 1,
                    f + 1,
                    (top / f) * f,
                    (top / f) * f - 1,
                ];
                for &v in &xs {
                    assert_eq!(es.div(v), v / f, "v={v} f={f}");
                    assert_eq!(reciprocal_div(v), v / f, "v={v} f={f}");
                }
            }
        }
    }

    #[test]
    fn cost_uses_code_lengths() {
        let mut counts = [0u64; 256];
        counts[1] = 1;
        counts[2] = 1;
        let t = FreqTable::normalize(&counts, None).unwrap();
        let mut h = [0u32; 256];
        h[1] = 10;
        assert_eq!(t.cost(&h), 10 << 16); // p = 1/2 -> 1 bit each
        h[3] = 1;
        assert!(t.cost(&h) >= CL_ABSENT);
    }

    /// A ranked decoder table gives every slot the slot table's symbol and range, read as the
    /// AVX-512 step reads it (bucket, one end compared, or the slot's own rank in `fine`); tables
    /// of more than 64 symbols, or with more than four buckets where several ranks end, have none.
    #[test]
    fn ranked_decode_table_ranks_every_slot() {
        let mut next = crate::rans::test_input::xorshift(0x9E37_79B9_7F4A_7C15);
        let (mut ranked, mut with_fine, mut wide) = (0, 0, 0);
        for case in 0..400 {
            let counts = match case % 2 {
                0 => crate::rans::test_input::narrow_counts(&mut next, case),
                _ => crate::rans::test_input::table_counts(&mut next, case),
            };
            let f = FreqTable::normalize(&counts, None).unwrap();
            let t = f.decode_table();
            let n = f.freq.iter().filter(|&&q| q != 0).count();
            let Some(r) = &t.ranked else {
                // Only too many symbols or too many ends side by side leave a table unranked.
                let cum = f.cumulative();
                let mut ends: Vec<u32> = (0..256)
                    .map(|s| cum[s] + f.freq[s] as u32)
                    .filter(|&e| e < PROB_SCALE)
                    .collect();
                ends.dedup();
                let crowded = (0..128u32)
                    .filter(|&b| {
                        let inside = ends.iter().filter(|&&e| e > 32 * b && e < 32 * b + 32);
                        inside.count() > 1
                    })
                    .count();
                assert!(n > 64 || crowded > 4, "case {case}: {n} symbols unranked");
                continue;
            };
            ranked += 1;
            with_fine += r.bucket.iter().any(|&b| b & 0x80 != 0) as usize;
            assert_eq!(r.wide, n > 32, "case {case}");
            wide += r.wide as usize;
            for s in 0..PROB_SCALE {
                let b = r.bucket[s as usize >> 5];
                let rank = match b & 0x80 {
                    0 => b as usize + (s >= r.end[b as usize]) as usize,
                    _ => r.fine[(b as usize & 0x60) | (s as usize & 31)] as usize,
                };
                let e = r.entry[rank];
                let want = t.slots[s as usize];
                let cum = e >> 20;
                assert_eq!(e & 0xFFFFF, want & 0xFFFFF, "case {case}, slot {s}");
                assert_eq!(s - cum, want >> 20, "case {case}, slot {s}");
                assert_eq!(r.end[rank], cum + ((e >> 8) & 0xFFF), "case {case}");
            }
        }
        assert!(
            ranked >= 100 && with_fine >= 20 && wide >= 20,
            "{ranked} ranked, {with_fine} with fine buckets, {wide} wide"
        );
    }
}
