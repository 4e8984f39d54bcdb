//! The encoder's model: which frequency tables each byte plane gets (the search itself is
//! [`crate::cluster`]), and which table (or raw, or constant) each block uses. Everything here is
//! integer arithmetic on counts and on the fixed-point code lengths of [`crate::rans::log2`],
//! specified in `docs/FORMAT.md` ("Encoder decisions") so that every engine reproduces it exactly.

use rayon::prelude::*;

use crate::blob::{BlobHeader, SEL_CONST, SEL_RAW};
/// The table search lives in [`crate::cluster`]; this path is kept for its callers.
pub use crate::cluster::cluster;
use crate::cluster::{ideal_cost_dense, prefetch_ahead, probe_stride, probes_flat, varied};
use crate::dtype::{DType, Transform};
use crate::options::CompressOptions;
use crate::pairs::{PairCoder, TopBytes};
use crate::rans::log2::{code_len_table, FRAC_BITS};
use crate::rans::table::{EncTable, FreqTable};
use crate::transform;

/// Lloyd iterations after each new table is seeded. One, not three (until 2026-12-01): the cost
/// columns the search computes are most of its time, and a synthetic bf16 exponent plane needs 36
/// with one iteration, 63 with two, 69 with three, for blobs at most 0.0045 points larger
/// (MiniLM fp16; ≤ 0.0022 on the other benchmark sets). The GPU encoder waits for this search:
/// its 1 GiB call went 10–14% faster on the H200 (docs/DESIGN.md, "Lloyd iterations").
pub const LLOYD_ITERS: usize = 1;

/// Byte histograms live in [`crate::histogram`]; this path is kept for its callers.
pub use crate::histogram::histogram;
use crate::histogram::{histogram_hinted, FewHint};
use crate::joint::{BlockJoint, JointCounts};

/// Raw cost of a block of `len` bytes, in Q16 bits.
pub(crate) fn raw_cost(len: usize) -> u64 {
    (8 * len as u64) << FRAC_BITS
}

/// FORMAT.md's passthrough rule: a block of `len` bytes whose least covering cost is `cost` stays
/// coded only if that is below `threshold_q16 / 65536` of its raw cost.
pub(crate) fn stays_coded(cost: u64, len: usize, threshold_q16: u64) -> bool {
    (cost as u128) << 16 < threshold_q16 as u128 * raw_cost(len) as u128
}

/// The selector of a non-constant block of `len` bytes with histogram `hist`, and its cost in Q16
/// bits: the covering table of least cost (lowest index among ties) if that cost is below
/// `threshold_q16 / 65536` of the raw cost, else raw. `costs[j]` is table `j`'s [`TableCost`].
pub fn choose(hist: &[u32; 256], len: usize, costs: &[TableCost], threshold_q16: u64) -> (u8, u64) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx512() {
            // SAFETY: AVX-512F support was checked at run time.
            return unsafe { choose_avx512(hist, len, costs, threshold_q16) };
        }
    }
    choose_portable(hist, len, costs, threshold_q16)
}

/// The least of `(table, cost)` candidates in order (the lowest index among ties), as a
/// selector and cost under the passthrough rule ([`choose`]).
fn least_or_raw(
    candidates: impl Iterator<Item = (usize, u64)>,
    len: usize,
    threshold_q16: u64,
) -> (u8, u64) {
    let mut best: Option<(usize, u64)> = None;
    for (j, c) in candidates {
        if best.is_none_or(|(_, b)| c < b) {
            best = Some((j, c));
        }
    }
    match best {
        Some((j, c)) if stays_coded(c, len, threshold_q16) => (j as u8, c),
        _ => (SEL_RAW, raw_cost(len)),
    }
}

/// [`choose`] without AVX-512: a block of few symbols is costed over its (symbol, count) pairs.
fn choose_portable(
    hist: &[u32; 256],
    len: usize,
    costs: &[TableCost],
    threshold_q16: u64,
) -> (u8, u64) {
    let n = hist.iter().filter(|&&c| c != 0).count();
    if n > DENSE_SYMBOLS {
        // Tables of the whole alphabet cover the block; the others are checked against its
        // support (rare: the flat planes' tables have forced support).
        let support = (!costs.iter().all(|t| t.full)).then(|| TableCost::support(hist));
        let covering = costs
            .iter()
            .enumerate()
            .filter(|(_, t)| t.full || support.is_some_and(|sup| t.covers_set(&sup)));
        return least_or_raw(covering.map(|(j, t)| (j, t.cost(hist))), len, threshold_q16);
    }
    // The block's (symbol, count) pairs, on the stack (a vector per block was an allocation
    // and a free for every block of every plane with tables).
    let mut pairs = [(0u8, 0u32); DENSE_SYMBOLS];
    let mut k = 0;
    for (s, &c) in hist.iter().enumerate() {
        if c != 0 {
            pairs[k] = (s as u8, c);
            k += 1;
        }
    }
    let sp = &pairs[..k];
    let covering = costs.iter().enumerate().filter(|(_, t)| t.covers(sp));
    least_or_raw(
        covering.map(|(j, t)| (j, t.cost_sparse(sp))),
        len,
        threshold_q16,
    )
}

/// [`choose`] with AVX-512: the block's support as a bit set from sixteen-lane tests, and every
/// covering table's cost as a dot product with the dense histogram over the sixteen-symbol
/// groups that hold a count ([`dot_groups_avx512`]; an exponent block's ~10-20 symbols lie in one
/// or two), whatever the number of symbols. The sparse path's scan of 256 counts for the present
/// ones, a branch each, cost more than the dot products of eight tables: `choose` was ~7% of a
/// one-thread all-MiniLM-L6-v2 bf16 encode. The sums are the same integers, so the choice is too.
///
/// # Safety
/// AVX-512F required.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn choose_avx512(
    hist: &[u32; 256],
    len: usize,
    costs: &[TableCost],
    threshold_q16: u64,
) -> (u8, u64) {
    use std::arch::x86_64::*;
    let mut support = [0u64; 4];
    let mut groups = 0u16;
    for (i, h) in hist.chunks_exact(16).enumerate() {
        // SAFETY: each chunk is 16 readable u32.
        let v = unsafe { _mm512_loadu_si512(h.as_ptr() as *const _) };
        let m = _mm512_test_epi32_mask(v, v);
        support[i / 4] |= u64::from(m) << (16 * (i % 4));
        groups |= u16::from(m != 0) << i;
    }
    let covering = costs
        .iter()
        .enumerate()
        .filter(|(_, t)| t.full || t.covers_set(&support));
    // SAFETY: AVX-512F support is this function's precondition.
    let cost = |t: &TableCost| unsafe { dot_groups_avx512(hist, &t.cl, groups) };
    least_or_raw(covering.map(|(j, t)| (j, cost(t))), len, threshold_q16)
}

/// `sum h[s] * cl[s]` over the sixteen-symbol groups `i` whose bit is set in `groups` (the others
/// must hold no count), even and odd lanes multiplied apart by `vpmuludq`.
///
/// # Safety
/// AVX-512F required.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_groups_avx512(hist: &[u32; 256], cl: &[u32; 256], mut groups: u16) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = _mm512_setzero_si512();
    while groups != 0 {
        let i = groups.trailing_zeros() as usize;
        groups &= groups - 1;
        // SAFETY: i < 16, so 16 u32 from 16 i lie in each 256-entry array.
        let (h, c) = unsafe {
            (
                _mm512_loadu_si512(hist.as_ptr().add(16 * i) as *const _),
                _mm512_loadu_si512(cl.as_ptr().add(16 * i) as *const _),
            )
        };
        acc = _mm512_add_epi64(acc, _mm512_mul_epu32(h, c));
        acc = _mm512_add_epi64(
            acc,
            _mm512_mul_epu32(_mm512_srli_epi64::<32>(h), _mm512_srli_epi64::<32>(c)),
        );
    }
    _mm512_reduce_add_epi64(acc) as u64
}

/// Blocks of more distinct bytes than this are costed over their dense histogram.
const DENSE_SYMBOLS: usize = 64;

/// A table's code lengths laid out for [`choose`]. A block of a flat plane (fp32's low mantissa
/// bytes: 256 symbols, up to eight tables) costed over its (symbol, count) pairs took two
/// dependent loads a symbol a table, about as much as counting it; over the dense histogram the
/// cost is a dot product with `cl` (0 for absent symbols; with AVX-512 sixteen symbols a step,
/// `dot_groups_avx512`), and a table of the whole alphabet (the flat planes' tables have forced support) covers every
/// block without a look.
pub struct TableCost {
    cl: [u32; 256],
    present: [u64; 4],
    full: bool,
}

impl TableCost {
    pub fn new(t: &FreqTable) -> TableCost {
        let cl = code_len_table();
        let mut c = TableCost {
            cl: [0; 256],
            present: [0; 4],
            full: true,
        };
        for s in 0..256 {
            let f = t.freq[s] as usize;
            if f != 0 {
                // Code lengths are at most 12 bits in Q16: they fit 32 bits.
                c.cl[s] = cl[f] as u32;
                c.present[s / 64] |= 1 << (s % 64);
            } else {
                c.full = false;
            }
        }
        c
    }

    /// Whether symbol `s` is in the table.
    pub fn present(&self, s: usize) -> bool {
        self.present[s / 64] >> (s % 64) & 1 != 0
    }

    /// The code length of symbol `s` in Q16 bits (0 where it is not in the table).
    pub fn code_len(&self, s: usize) -> u32 {
        self.cl[s]
    }

    /// The symbols with a non-zero count, as a bit set.
    fn support(hist: &[u32; 256]) -> [u64; 4] {
        let mut set = [0u64; 4];
        for (s, &h) in hist.iter().enumerate() {
            set[s / 64] |= u64::from(h != 0) << (s % 64);
        }
        set
    }

    /// Whether every symbol of the support `set` is in the table.
    fn covers_set(&self, set: &[u64; 4]) -> bool {
        set.iter().zip(&self.present).all(|(s, p)| s & !p == 0)
    }

    /// Whether every symbol of the block (its (symbol, count) pairs) is in the table.
    fn covers(&self, sp: &[(u8, u32)]) -> bool {
        self.full
            || sp
                .iter()
                .all(|&(s, _)| self.present[s as usize / 64] >> (s % 64) & 1 != 0)
    }

    /// `sum h[s] * CL[f[s]]` over a covered block's dense histogram (exact: counts below 2^17
    /// times code lengths below 2^20, 256 of them, sum below 2^45). `choose_portable`'s: with
    /// AVX-512, `choose_avx512` takes the same sums with `dot_groups_avx512`.
    fn cost(&self, hist: &[u32; 256]) -> u64 {
        hist.iter()
            .zip(&self.cl)
            .map(|(&h, &c)| u64::from(h) * u64::from(c))
            .sum()
    }

    /// The same over the block's (symbol, count) pairs.
    fn cost_sparse(&self, sp: &[(u8, u32)]) -> u64 {
        sp.iter()
            .map(|&(s, h)| u64::from(h) * u64::from(self.cl[s as usize]))
            .sum()
    }
}

/// Per-plane model: the tables and the encoder's constants for each.
pub struct PlaneModel {
    pub tables: Vec<FreqTable>,
    /// Encoder constants of each multi-symbol table (`None` for single-symbol tables).
    pub enc: Vec<Option<Box<EncTable>>>,
    /// The conditional table, if the plane is conditioned: units whose condition byte equals the
    /// value are coded with it.
    pub cond: Option<(u8, FreqTable)>,
    /// Encoder constants of the conditional table.
    pub cond_enc: Option<Box<EncTable>>,
    /// The code lengths blocks choose by ([`choose`]): each table's, or for a paired plane the
    /// version 1 tables' (its `tables` code ranks; a block takes the rank table of the index it
    /// chose, [`pair_plane`]).
    pub costs: Vec<TableCost>,
    /// The plane's pair table, where the blob pairs it (version 2): its tables code ranks
    /// ([`crate::pairs`]).
    pub pairs: Option<Box<PairCoder>>,
}

impl PlaneModel {
    /// The model of a plane with block tables `tables` (and no conditional table or pairs): the
    /// encoder's constants and the code lengths derived from them.
    fn of_tables(tables: Vec<FreqTable>) -> PlaneModel {
        PlaneModel {
            enc: tables
                .iter()
                .map(|t| (!t.is_single()).then(|| t.encode_table()))
                .collect(),
            costs: tables.iter().map(TableCost::new).collect(),
            tables,
            cond: None,
            cond_enc: None,
            pairs: None,
        }
    }
}

/// The spacing of the flat-plane rule's probes (`docs/FORMAT.md`, "Flat planes") for a tensor of
/// `dtype` with `n_sampled` sampled blocks: float dtypes (those with a conditioned plane) only,
/// whose low mantissa bytes are flat wherever they are; integers' planes need not be.
pub fn flat_stride(dtype: DType, n_sampled: usize) -> Option<usize> {
    dtype.conditioned_plane()?;
    probe_stride(n_sampled)
}

/// A conditional table must save at least `1 / 2^COND_MIN_SAVING_SHIFT` of the raw size of the bytes it
/// codes (1/64: decoding them costs a second rANS step, so small savings are not worth it).
pub const COND_MIN_SAVING_SHIFT: u32 = 6;

/// Chooses the conditional table of a plane from the joint counts `J[e][m]` of condition
/// byte `e` and plane byte `m` over the sampled blocks where the plane is not constant (`n_sampled`
/// blocks were sampled of `n_blocks`). For each `e`, the
/// candidate is the table of its counts with all 256 symbols present; it qualifies if it saves at
/// least 1/64 of the raw size of those bytes and, scaled to the plane, more than its serialised size
/// plus two bytes. The qualifying candidate with the largest net saving (lowest `e` among ties) wins.
pub fn choose_conditional(
    joint: &JointCounts,
    n_sampled: u64,
    n_blocks: u64,
) -> Option<(u8, FreqTable)> {
    let cl = code_len_table();
    let all = [true; 256];
    // Every candidate has all 256 symbols: its serialised size is 2 + 256 bytes.
    let table_cost = ((2 + 2 + 256) as u128 * 8) << FRAC_BITS;
    let mut best: Option<(u8, FreqTable, u128)> = None;
    for e in 0..256usize {
        let Some(row) = joint.row(e as u8) else {
            continue;
        };
        let n: u64 = row.iter().map(|&c| c as u64).sum();
        if n == 0 {
            continue;
        }
        let raw = (8 * n) << FRAC_BITS;
        // Rows that cannot qualify are skipped before their table is normalised (most rows of a
        // near-uniform plane; normalising them was 18% of compressing MiniLM fp16). No table codes
        // the row in less than its exact order-0 entropy (Gibbs; every code length here is rounded
        // up), and `ideal_cost_dense` (floored logarithms) is below that entropy by less than `n`
        // in Q16: so `raw - ideal + n` bounds any candidate's saving from above, and a row failing
        // the two tests below with that bound fails them with its table. The decision is unchanged.
        let ideal = ideal_cost_dense(row);
        let bound = (raw + n).saturating_sub(ideal);
        if (bound << COND_MIN_SAVING_SHIFT) < raw
            || bound as u128 * n_blocks as u128 / n_sampled as u128 <= table_cost
        {
            continue;
        }
        let counts: [u64; 256] = std::array::from_fn(|m| row[m] as u64);
        let t = FreqTable::normalize(&counts, Some(&all)).expect("n > 0");
        let cost: u64 = row
            .iter()
            .enumerate()
            .map(|(m, &c)| c as u64 * cl[t.freq[m] as usize])
            .sum();
        let Some(saving) = raw.checked_sub(cost) else {
            continue;
        };
        let scaled = saving as u128 * n_blocks as u128 / n_sampled as u128;
        debug_assert_eq!(
            ((2 + t.serialized_len()) as u128 * 8) << FRAC_BITS,
            table_cost
        );
        if (saving << COND_MIN_SAVING_SHIFT) >= raw && scaled > table_cost {
            let net = scaled - table_cost;
            if best.as_ref().is_none_or(|b| net > b.2) {
                best = Some((e as u8, t, net));
            }
        }
    }
    best.map(|(e, t, _)| (e, t))
}

/// The model of a whole tensor.
pub struct Model {
    pub planes: Vec<PlaneModel>,
    /// The histograms of the sampled blocks the model was built from, kept for the encoder;
    /// `None` where it kept none (no plane with block tables, or a model made from counts).
    pub kept: Option<KeptHists>,
}

/// The sampled blocks' histograms a [`Model`] was built from, kept so that the encoder need not
/// count them again: `hists[i * planes + p]` for sampled block `i` (global block `picks[i]`, or
/// `i` where `picks` is `None`: every block sampled), read for the model's planes with block
/// tables only. Where only some blocks were sampled (a tensor of more than `sample_blocks`
/// blocks) the encoder still counts the others; keeping the sampled ones saved ~a third of the
/// counting of all-MiniLM-L6-v2's embedding matrix (1024 of 2861 blocks).
///
/// The buffer is the model pass's own, moved here, not copied (the copy, 1 KiB a block and plane,
/// was ~4% of a one-thread bf16 model pass), and handed back when dropped to the dropping thread's
/// pool of such buffers (`SAMPLED_HISTS`) for a later tensor's model.
pub struct KeptHists {
    hists: Vec<[u32; 256]>,
    picks: Option<Vec<u64>>,
}

impl Drop for KeptHists {
    fn drop(&mut self) {
        give_back_hists(std::mem::take(&mut self.hists));
    }
}

impl Model {
    /// The kept histograms, if plane `p` is one whose blocks the encoder chooses tables for.
    fn kept_for(&self, p: usize) -> Option<&KeptHists> {
        match self.planes.get(p)?.tables.is_empty() {
            true => None,
            false => self.kept.as_ref(),
        }
    }

    /// The histogram of plane `p` of global block `g`, when the model kept it.
    pub fn block_hist(&self, g: u64, p: usize) -> Option<&[u32; 256]> {
        let kept = self.kept_for(p)?;
        let i = match &kept.picks {
            None => usize::try_from(g).ok()?,
            Some(picks) => picks.binary_search(&g).ok()?,
        };
        kept.hists
            .get(i.checked_mul(self.planes.len())?.checked_add(p)?)
    }

    /// Whether the model kept the histogram of every block of plane `p`.
    pub fn kept_every_block(&self, p: usize) -> bool {
        self.kept_for(p)
            .is_some_and(|k| k.picks.is_none() && !k.hists.is_empty())
    }

    /// Keeps `hists` (`[i * planes + p]` for sampled block `i`) for the encoder where a plane
    /// has block tables, or hands the buffer back for the next model.
    fn keeping(mut self, sampling: &Sampling, hists: Vec<[u32; 256]>) -> Model {
        self.kept = match self.planes.iter().any(|pm| !pm.tables.is_empty()) {
            false => {
                give_back_hists(hists);
                None
            }
            true => Some(KeptHists {
                hists,
                picks: (sampling.picks.len() as u64 != sampling.n_blocks)
                    .then(|| sampling.picks.clone()),
            }),
        };
        self
    }
}

/// Sampled blocks: global block indices `floor(i * NB / S)` for `i < S`, or all when `NB <= S`.
pub fn sample_indices(n_blocks: u64, s: usize) -> Vec<u64> {
    if n_blocks <= s as u64 {
        (0..n_blocks).collect()
    } else if s == 0 {
        Vec::new()
    } else {
        // Stepped, without a division per pick: floor(i NB / S) = i q + floor(i r / S) with
        // NB = q S + r, and the second term advances by one each time (i r) mod S wraps. Exact for
        // any NB (no product is formed). Before 2026-12-02 a division per pick (128-bit, then
        // 64-bit where the product fit); the GPU encoder computes the picks in its host setup
        // ahead of its first kernel (23-35 us for 8 tensors of 32768 blocks on the H200's host,
        // the divisions' share of it not timed).
        let s = s as u64;
        let (q, r) = (n_blocks / s, n_blocks % s);
        let (mut at, mut rem) = (0u64, 0u64);
        (0..s)
            .map(|_| {
                let pick = at;
                at += q;
                rem += r;
                if rem >= s {
                    at += 1;
                    rem -= s;
                }
                pick
            })
            .collect()
    }
}

/// Where the sampled blocks of a tensor lie (`docs/FORMAT.md`, "Sampling"). Every engine counts the
/// same blocks, so that [`model_from_counts`] gives the same tables.
#[derive(Debug, Clone)]
pub struct Sampling {
    /// Global indices of the sampled blocks, ascending.
    pub picks: Vec<u64>,
    /// Blocks of the whole tensor (per plane).
    pub n_blocks: u64,
    pub blocks_per_chunk: u64,
    pub chunk_units: u64,
    pub block_units: u64,
    pub units: u64,
}

impl Sampling {
    /// The sampled blocks of a tensor with Planes header `header`.
    pub fn new(header: &BlobHeader, opts: &CompressOptions) -> Sampling {
        let units = header.units();
        let cu = header.chunk_units as u64;
        let bu = header.block_units as u64;
        let blocks_per_chunk = cu.div_ceil(bu);
        let n_chunks = header.n_chunks();
        let last_len = units - (n_chunks - 1) * cu;
        let n_blocks = (n_chunks - 1) * blocks_per_chunk + last_len.div_ceil(bu);
        Sampling {
            picks: sample_indices(n_blocks, opts.sample_blocks),
            n_blocks,
            blocks_per_chunk,
            chunk_units: cu,
            block_units: bu,
            units,
        }
    }

    /// Units `start..end` of global block `g`.
    pub fn block_range(&self, g: u64) -> std::ops::Range<u64> {
        let (c, b) = (g / self.blocks_per_chunk, g % self.blocks_per_chunk);
        let start = c * self.chunk_units + b * self.block_units;
        let end = (start + self.block_units).min(((c + 1) * self.chunk_units).min(self.units));
        start..end
    }

    /// The bytes of global block `g` of `data`, a tensor of `us`-byte units.
    pub fn block_bytes<'a>(&self, data: &'a [u8], us: usize, g: u64) -> &'a [u8] {
        let r = self.block_range(g);
        &data[r.start as usize * us..r.end as usize * us]
    }
}

/// Splits sampled block `g` (global block index) of `data`, a tensor of `dtype`, into `scratch`:
/// plane `k` at `k * block_units`; returns the block's length in units.
fn split_sampled(
    sampling: &Sampling,
    dtype: DType,
    data: &[u8],
    g: u64,
    scratch: &mut [u8],
) -> usize {
    let (us, bu) = (dtype.unit_size(), sampling.block_units as usize);
    let src = sampling.block_bytes(data, us, g);
    let len = src.len() / us;
    let mut views: Vec<&mut [u8]> = scratch
        .chunks_mut(bu)
        .take(us)
        .map(|p| &mut p[..len])
        .collect();
    transform::split(dtype.transform(), src, &mut views);
    len
}

/// Builds the model of a tensor (`data` is the whole tensor, `header` its Planes header): the
/// tables of format version 1, and with `opts.pair_exponents` the paired exponent plane of
/// version 2 where [`pair_plane`] finds one.
pub fn build_model(data: &[u8], header: &BlobHeader, opts: &CompressOptions) -> Model {
    let sampling = Sampling::new(header, opts);
    model_of_sample(data, header, opts, &sampling)
}

/// Plane `p`'s histogram summed over the sampled blocks (`hists[i * us + p]`).
#[inline(always)]
fn plane_sum(hists: &[[u32; 256]], us: usize, p: usize) -> [u64; 256] {
    let mut sum = [0u64; 256];
    for h in hists.iter().skip(p).step_by(us) {
        for (a, &c) in sum.iter_mut().zip(h) {
            *a += c as u64;
        }
    }
    sum
}

dispatch_wide! {
    /// Format version 2's paired exponent plane (docs/FORMAT.md, "Version 2", encoder decisions):
    /// for a dtype with one ([`DType::paired_plane`]: bf16) whose plane has version 1 tables, the
    /// pairs of the sampled blocks' [`crate::pairs::TOP_BYTES`] most frequent exponent bytes are
    /// weighed in each non-constant sampled block as if its units were independent (`h[x] h[y]` of
    /// its histogram), and the [`crate::pairs::MAX_PAIRS`] heaviest over all of them make the pair
    /// table. Rank table `j` weighs the ranks the same way over the sampled blocks that choose the
    /// version 1 table `j` (all of them for table 0, as the version 1 search makes its table 0),
    /// every rank `0..=D` forced in. Blocks then choose by their exponent bytes among the version 1
    /// tables, whose code lengths the plane model keeps, and code their ranks with the rank table
    /// of the same index. The plane is paired if the table has at least two pairs and pairing pays
    /// (step 6, `pairing_pays`); it is left as it was otherwise. `hists` are the version 1 model's
    /// histograms of every plane of every sampled block (`[i * planes + p]`): nothing else is read.
    ///
    /// Why independence: adjacent units' exponents of weights are close to independent within a
    /// block (per 65,536 units of all-MiniLM-L6-v2 bf16, 2.588 bits a unit one at a time, 2.585 as
    /// pairs), and weights from histograms need no count of pairs. Until 2026-12-06 the pairs were
    /// counted per sampled block, a second read of every sampled unit once the top bytes were
    /// known: ~6 of MiniLM bf16's 28 ms model pass on one CPU thread, and the GPU's largest model
    /// kernel. Per block, not from the tensor's totals, so that bytes that never share a block do
    /// not make pairs. Ratio on the benchmark files: MiniLM bf16 66.164 -> 66.172%, synthetic bf16
    /// 65.864 -> 65.863% (docs/DESIGN.md, "Version 2's pair model from the exponent counts").
    ///
    /// Compiled for AVX-512F or AVX2 where the CPU has them (`dispatch_wide!`): its loops over
    /// every sampled block's histogram (the plane's sum, each block's length, its pair weights — a
    /// 16 × 16 product of 32-bit counts — and step 6's estimates) vectorise 16 lanes wide where the
    /// baseline target gave them SSE2's 4 (~6% of a one-thread model pass of MiniLM bf16's
    /// matrices). Integer arithmetic only: the same model on every path.
    pub fn pair_plane(
        model: &mut Model,
        header: &BlobHeader,
        opts: &CompressOptions,
        sampling: &Sampling,
        hists: &[[u32; 256]],
    ) = pair_plane_body;
}

#[inline(always)]
fn pair_plane_body(
    model: &mut Model,
    header: &BlobHeader,
    opts: &CompressOptions,
    sampling: &Sampling,
    hists: &[[u32; 256]],
) {
    let Some(o) = header.dtype.paired_plane() else {
        return;
    };
    if model.planes[o].tables.is_empty() {
        return;
    }
    let us = header.planes();
    // Step 1: the top bytes.
    let top = TopBytes::of(&plane_sum(hists, us, o));
    // Step 2: each non-constant sampled block's version 1 choice (table `j` at cost `c`, or
    // raw) and its pair weights, summed with the squares of the blocks' lengths (`L²`) per
    // version 1 table: every such block's in table 0's, and each in that of the table it
    // chooses (tables 1..). Summed per choice first (raw last), then into the tables' sums.
    let v1 = &model.planes[o];
    let threshold = opts.threshold_q16();
    let k = v1.tables.len();
    let mut by_choice = vec![([0u64; 256], 0u64); k + 1];
    // A plain loop, not a `collect` of a `map`: the iterator's `next` was not inlined into
    // `pair_plane`'s AVX-512F build, so the weights ran as SSE2 code.
    let mut chosen: Vec<(&[u32; 256], u64, u8, u64)> = Vec::with_capacity(hists.len() / us);
    for h in hists.iter().skip(o).step_by(us).filter(|h| varied(h)) {
        let len = h.iter().sum::<u32>() as u64;
        let (j, c) = choose(h, len as usize, &v1.costs, threshold);
        let (sum, squares) = &mut by_choice[(j as usize).min(k)];
        top.add_pair_weights(h, sum);
        *squares += len * len;
        chosen.push((h, len, j, c));
    }
    let mut groups = by_choice[..k].to_vec();
    for (sum, squares) in &by_choice[1..] {
        for (a, &x) in groups[0].0.iter_mut().zip(sum) {
            *a += x;
        }
        groups[0].1 += squares;
    }
    // Step 3: the table, from table 0's sums (every non-constant sampled block).
    let Some(coder) = PairCoder::new(top, &groups[0].0) else {
        return;
    };
    // Step 4: the rank tables. Every rank in every table, so that a block may take any of them;
    // a table no sampled block chose is table 0's. (With every rank forced no table can fail to
    // normalise; if one did, the plane would stay version 1.)
    let forced: [bool; 256] = std::array::from_fn(|r| r <= coder.table.escape() as usize);
    let tables: Option<Vec<FreqTable>> = groups
        .iter()
        .map(|(keys, squares)| {
            let (keys, squares) = match *squares {
                0 => (&groups[0].0, groups[0].1),
                s => (keys, s),
            };
            FreqTable::normalize(&coder.rank_weights(keys, squares), Some(&forced))
        })
        .collect();
    let Some(tables) = tables else {
        return;
    };
    if !pairing_pays(&chosen, &tables, &coder, &v1.tables, sampling, threshold) {
        return;
    }
    // The rank tables replace the plane's tables; blocks still choose by the version 1 tables'
    // code lengths (its conditional table is none: a paired plane is the condition plane, not
    // a conditioned one). The kept block histograms stay the exponent bytes', which is what
    // blocks choose by.
    let costs = std::mem::take(&mut model.planes[o].costs);
    model.planes[o] = PlaneModel {
        pairs: Some(Box::new(coder)),
        costs,
        ..PlaneModel::of_tables(tables)
    };
}

/// Format version 2's blob-level check (FORMAT.md section 12, step 6): whether the paired plane,
/// estimated over the sampled blocks `chosen` (`(histogram, units, j, c)` of each non-constant
/// one, `j` and `c` its version 1 choice) and scaled to the plane, with its rank `tables` and pair
/// table, is at most 1/32 larger than the version 1 plane with its tables `v1`.
///
/// A block's paired cost is estimated from its exponent bytes as if its pairs were independent:
/// of its `L²` ordered pairs of units, `h[x] h[y]` hold the pair `(x, y)`, so with `W` the sum of
/// that over the table's pairs and `X` the same weighted by each rank's code length under rank
/// table `j`, its `L / 2` pairs cost `(X + (L² − W) × (escape code length + 16 bits)) / 2L` — an
/// escape pays its rank and its two bytes — and at most the raw cost. It costs raw where it
/// chose raw, or where step 5's rule turns it raw with its expected escape bytes, `(L² − W) / L`.
/// Pairing is for the decoder's speed and may cost a little size, so the check allows 1/32 of the
/// plane: on all-MiniLM-L6-v2 bf16 the 384 x 384 matrices pay ~2% of their exponent plane for
/// their pair and rank tables, and pair; the 1536-element biases would pay 10-15% of their
/// blobs, and do not. Without any check, tensors of scattered exponents came out up to 30% larger than
/// version 1 (a review of 2026-12-05, ~7,500 generated tensors): the per-block rule prices a
/// block's escapes by its version 1 cost, not by the escape rank's code length.
// Inlined into `pair_plane`'s AVX-512F and AVX2 builds (its only caller), its per-block dot
// products with them.
#[inline(always)]
fn pairing_pays(
    chosen: &[(&[u32; 256], u64, u8, u64)],
    tables: &[FreqTable],
    coder: &PairCoder,
    v1: &[FreqTable],
    sampling: &Sampling,
    threshold: u64,
) -> bool {
    let pairs = coder.table.pairs();
    let d = coder.table.escape() as usize;
    // Per rank table: each rank's code length; an escape's with its two bytes.
    let lens: Vec<(Vec<u64>, u64)> = tables
        .iter()
        .map(|t| {
            let c = TableCost::new(t);
            let ranks = (0..d).map(|r| c.code_len(r) as u64).collect();
            (ranks, c.code_len(d) as u64 + raw_cost(2))
        })
        .collect();
    let (mut s1, mut s2) = (0u128, 0u128);
    for &(h, len, j, c) in chosen {
        s1 += c as u128;
        s2 += match j {
            SEL_RAW => raw_cost(len as usize),
            j => {
                let (ranks, escape) = &lens[j as usize];
                // Below 2^60: counts of at most 2^16 (a block), code lengths below 2^20.
                let (mut w, mut x) = (0u64, 0u64);
                for (p, &cl) in pairs.iter().zip(ranks) {
                    let hh = h[p[0] as usize] as u64 * h[p[1] as usize] as u64;
                    w += hh;
                    x += hh * cl;
                }
                // Step 5's rule with the block's expected escape bytes, `(L² − W) / L`.
                let escapes = raw_cost(((len * len - w) / len) as usize);
                match stays_coded(c + escapes, len as usize, threshold) {
                    true => {
                        ((x + (len * len - w) * escape) / (2 * len)).min(raw_cost(len as usize))
                    }
                    false => raw_cost(len as usize),
                }
            }
        } as u128;
    }
    // Q16 bits of the plane and its tables.
    let plane = |s: u128, table_bytes: usize| {
        s * sampling.n_blocks as u128 / sampling.picks.len().max(1) as u128
            + raw_cost(table_bytes) as u128
    };
    let bytes = |ts: &[FreqTable]| ts.iter().map(FreqTable::serialized_len).sum::<usize>();
    let p1 = plane(s1, bytes(v1));
    let p2 = plane(s2, bytes(tables) + coder.table.serialized_len());
    32 * p2 <= 33 * p1
}

/// [`build_model`] of the sampled blocks `sampling`: version 1's model, then, with
/// `opts.pair_exponents`, the paired plane ([`pair_plane`]) from the same sampled histograms.
fn model_of_sample(
    data: &[u8],
    header: &BlobHeader,
    opts: &CompressOptions,
    sampling: &Sampling,
) -> Model {
    let paired = |mut model: Model, hists: &[[u32; 256]]| {
        if opts.pair_exponents {
            pair_plane(&mut model, header, opts, sampling, hists);
        }
        model
    };
    let us = header.planes();
    let bu = sampling.block_units as usize;
    let split_block =
        |g: u64, scratch: &mut [u8]| split_sampled(sampling, header.dtype, data, g, scratch);
    // Where plane `p` of a split block of `len` units lies in the scratch.
    let plane = |p: usize, len: usize| p * bu..p * bu + len;
    // The conditioned plane's joint counts are taken in the same pass as the histograms, which
    // saves splitting every sampled block a second time: they are asked for unless the plane has
    // block tables, which float weights' planes below the exponent almost never have. Fused for
    // four-byte units too since the exponent planes are counted by comparison (`histogram`):
    // one-thread model pass, in one process (2026-12-03, 12 rounds), MiniLM fp32 +18%,
    // synthetic fp32 +7% (+8-10% at two threads); fp32 had been 3% slower fused before.
    // Float tensors without a conditioned plane (fp16 by default, any float with `condition`
    // off) take the same pass without the joint counts, for its flat-plane probes: a flat
    // plane (fp16's low byte) is counted in the probe blocks only, and the histograms go
    // straight into their rows (the per-block pass below collected a vector a block). MiniLM
    // fp16's one-thread model pass 21.7 -> 15.9 ms (2026-12-04, docs/DESIGN.md "Conditioned
    // plane").
    let pq = opts.conditioned_plane(header.dtype);
    let stride = flat_stride(header.dtype, sampling.picks.len());
    if pq.is_some() || stride.is_some() {
        // Blocks are counted straight from the tensor's units where that pays (`joint.rs`,
        // `BlockJoint::count_units`): bf16 and fp32 (whose planes below the top two are counted
        // only in the probe blocks) with their transform, fp16 without.
        let direct = match (pq, us, header.dtype.transform()) {
            (None, _, _) => None,
            (Some(pq), _, _) if pq != (us - 2, us - 1) => None,
            (_, 2, Transform::Identity) => Some(0),
            (_, 2 | 4, Transform::SignBelowExponent { exp_bits: 8 }) => Some(8),
            _ => None,
        };
        let units = |g: u64| sampling.block_bytes(data, us, g);
        let (hists, joint) = fused_counts(
            sampling,
            (bu, us),
            (pq, stride),
            opts.threshold_q16(),
            split_block,
            direct.map(|e| (e, units)),
        );
        let model = model_from_counts(header, opts, sampling, &hists, |_, _| joint);
        return paired(model, &hists).keeping(sampling, hists);
    }
    // Histograms of every sampled block, per plane (integer tensors: no flat-plane rule).
    let hists: Vec<[u32; 256]> = sampling
        .picks
        .par_iter()
        .map_init(
            || (vec![0u8; bu * us], [FewHint::default(); 8]),
            |(scratch, hints), &g| {
                let len = split_block(g, scratch);
                (0..us)
                    .map(|p| {
                        let mut h = [0u32; 256];
                        histogram_hinted(&scratch[plane(p, len)], &mut h, &mut hints[p]);
                        h
                    })
                    .collect::<Vec<_>>()
            },
        )
        .flatten_iter()
        .collect();
    // Without a conditioned plane no conditional table is considered and the joint counts are
    // never asked for (zero counts would choose none).
    let joint = |_: usize, _: usize| JointCounts::default();
    let model = model_from_counts(header, opts, sampling, &hists, joint);
    paired(model, &hists).keeping(sampling, hists)
}

thread_local! {
    /// Buffers for the sampled blocks' histograms of this thread's next models: 4 MiB for a tensor
    /// of 1024 sampled fp32 blocks, which as a new allocation came from pages never touched (or
    /// given back to the kernel since) and faulted in one at a time, on every tensor. Two threads,
    /// 64 MiB fp32 tensors (2026-12-03, Intel VM, 72 tensors each way): the model pass took
    /// 8.6-19.5 ms instead of its usual 5.5-6 for ~12% of the tensors; with the buffer kept,
    /// 8.5-10.3 ms for 4%. Two buffers, since a tensor's encoder holds its model's
    /// ([`KeptHists`]) while the next tensor's model is built (`CpuEngine::compress_seq_into`).
    static SAMPLED_HISTS: std::cell::RefCell<Vec<Vec<[u32; 256]>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The most histogram memory each buffer of [`SAMPLED_HISTS`] keeps between tensors: the default
/// sampling of units of up to 4 bytes (1024 blocks × 4 planes × 1 KiB).
const KEPT_HISTS_BYTES: usize = 4 << 20;

/// Buffers [`SAMPLED_HISTS`] keeps, per thread.
const KEPT_HISTS_BUFFERS: usize = 2;

/// The larger histogram buffer of this thread's [`SAMPLED_HISTS`] (the one least likely to grow
/// into fresh pages), or a new one.
fn take_hists() -> Vec<[u32; 256]> {
    SAMPLED_HISTS
        .try_with(|h| {
            let mut kept = h.try_borrow_mut().ok()?;
            let i = (0..kept.len()).max_by_key(|&i| kept[i].capacity())?;
            Some(kept.swap_remove(i))
        })
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Keeps `hists` in this thread's [`SAMPLED_HISTS`] if it is small enough and there is room (a
/// thread being torn down keeps nothing).
fn give_back_hists(hists: Vec<[u32; 256]>) {
    if hists.capacity() == 0 || hists.capacity() * 1024 > KEPT_HISTS_BYTES {
        return;
    }
    let _ = SAMPLED_HISTS.try_with(|h| {
        if let Ok(mut kept) = h.try_borrow_mut() {
            if kept.len() < KEPT_HISTS_BUFFERS {
                kept.push(hists);
            }
        }
    });
}

/// Sampled blocks per part when joint counts are taken in parallel: one part per worker, at least 64
/// blocks each. Every part zeroes 256 KiB of counters and the parts are summed, which with rayon's
/// adaptive splitting cost more than the counting on a small tensor and made two threads slower
/// than one.
fn joint_part_blocks(n_sampled: usize) -> usize {
    n_sampled.div_ceil(rayon::current_num_threads()).max(64)
}

/// The histograms of every plane of every sampled block of a tensor of `us`-byte units, and the
/// joint counts `J[e][m]` of plane `q` (`e`) and plane `p` (`m`) over the blocks whose plane `p`
/// is not one repeated byte, in one pass (`pq = Some((p, q))`; with `None`, the histograms only).
/// `stride` is the flat-plane rule's probe spacing (`flat_stride`): planes other than `p` and `q`
/// whose probes are flat are counted in the probes only. `split(g, scratch)` splits sampled
/// block `g` into `scratch` (`us * bu` bytes, plane `k` at `k * bu`) and returns its length. With `direct`
/// (`(exponent bits of the transform, units(g))`, units whose top two planes are `q` and `p`),
/// blocks none of whose other planes are counted (2-byte units, or the flat-plane rule's
/// skipped planes) are counted from their units instead while their exponent bytes are few.
fn fused_counts<'a, F, U>(
    sampling: &Sampling,
    (bu, us): (usize, usize),
    (pq, stride): (Option<(usize, usize)>, Option<usize>),
    threshold: u64,
    split: F,
    direct: Option<(u32, U)>,
) -> (Vec<[u32; 256]>, JointCounts)
where
    F: Fn(u64, &mut [u8]) -> usize + Sync,
    U: Fn(u64) -> &'a [u8] + Sync,
{
    let n = sampling.picks.len();
    let per = joint_part_blocks(n);
    // Plane `k` is the conditioned plane or the one it is conditioned on.
    let in_pq = |k: usize| pq.is_some_and(|(p, q)| k == p || k == q);
    // Each part counts into its own rows of the result (the parts' rows were copied together
    // after: ~1% of a one-thread bf16 compress), zeroed here (the joint counts add plane `p`'s).
    let mut hists = take_hists();
    hists.clear();
    hists.resize(us * n, [0u32; 256]);
    // With the flat-plane rule's probes (float tensors of many sampled blocks: `flat_stride`, the
    // caller's dtype has a conditioned plane), the probe blocks are counted first; a plane other
    // than `p` and `q` whose probes are flat gets no tables whatever its other blocks hold, so
    // they are not counted (`skip`, a bit per plane).
    let count = |hists: &mut [[u32; 256]], probes: Option<(usize, bool)>, skip: u32| {
        sampling
            .picks
            .par_chunks(per)
            .zip(hists.par_chunks_mut(us * per))
            .enumerate()
            .map(|(part_index, (part, rows))| {
                let mut joint = JointCounts::default();
                let mut scratch = vec![0u8; us * bu];
                let mut hints = [FewHint::default(); 8];
                let mut block_joint = pq.map(|_| BlockJoint::take());
                // Whether the last block had few enough exponent bytes for the next to be
                // counted from its units (many rows cost more read back than the split saves).
                let mut few_rows = true;
                // Whether planes other than p and q are counted (then the blocks are split).
                let others = (0..us).any(|k| !in_pq(k) && skip >> k & 1 == 0);
                for (j, (&g, h)) in part.iter().zip(rows.chunks_exact_mut(us)).enumerate() {
                    if let Some((s, probe)) = probes {
                        if (part_index * per + j).is_multiple_of(s) != probe {
                            continue;
                        }
                    }
                    let unit_path = direct.as_ref().filter(|_| few_rows && !others);
                    if let (Some((e, units)), Some((p, q)), Some(block_joint)) =
                        (unit_path, pq, block_joint.as_mut())
                    {
                        let src = units(g);
                        if src.len() / us <= crate::joint::PIECE {
                            let [hp, hq] = h
                                .get_disjoint_mut([p, q])
                                .expect("a plane is not conditioned on itself");
                            let rows =
                                block_joint.count_units_of((us, *e), src, hp, hq, &mut joint);
                            few_rows = rows <= crate::joint::FLUSH_ROWS;
                            continue;
                        }
                    }
                    let len = split(g, &mut scratch);
                    let plane = |k: usize| &scratch[k * bu..k * bu + len];
                    // Plane q's histogram first: its bytes are the rows the joint counts touch.
                    for (k, hint) in hints.iter_mut().enumerate().take(us) {
                        if pq.is_none_or(|(p, _)| k != p) && skip >> k & 1 == 0 {
                            histogram_hinted(plane(k), &mut h[k], hint);
                        }
                    }
                    let (Some((p, q)), Some(block_joint)) = (pq, block_joint.as_mut()) else {
                        continue;
                    };
                    let (m, e) = (plane(p), plane(q));
                    // Plane p's histogram comes with the joint counts (`joint.rs`); a block whose
                    // plane p is one repeated byte adds no joint counts and needs no pass.
                    if m.iter().all(|&v| v == m[0]) {
                        h[p][m[0] as usize] = len as u32;
                        continue;
                    }
                    let [hp, hq] = h
                        .get_disjoint_mut([p, q])
                        .expect("a plane is not conditioned on itself");
                    few_rows =
                        block_joint.count(e, m, hq, hp, &mut joint) <= crate::joint::FLUSH_ROWS;
                }
                // The counts still pending in the 16-bit counters go to the part's joint counts.
                if let Some(b) = block_joint {
                    b.give_back(&mut joint);
                }
                joint
            })
            // `reduce_with`: a part's counts are the result as they are where there is one part
            // (one thread), not added into an empty set of rows.
            .reduce_with(|mut acc, j| {
                acc.add(&j);
                acc
            })
            .unwrap_or_default()
    };
    // Only planes other than p and q can be skipped (fp32's two low bytes; none in bf16, which is
    // counted in one pass: two cost it ~1.5%; fp16's low byte when it is not conditioned).
    let skippable = (0..us).any(|k| !in_pq(k));
    let joint = match stride.filter(|_| skippable) {
        None => count(&mut hists, None, 0),
        Some(s) => {
            let mut joint = count(&mut hists, Some((s, true)), 0);
            let flat = |k: usize| {
                let probes = hists.iter().skip(k).step_by(us).step_by(s);
                !in_pq(k) && probes_flat(probes, threshold)
            };
            let skip = (0..us).filter(|&k| flat(k)).fold(0u32, |m, k| m | 1 << k);
            joint.add(&count(&mut hists, Some((s, false)), skip));
            joint
        }
    };
    (hists, joint)
}

/// The model of a tensor from the counts of its sampled blocks: `hists[i * U + p]` is the histogram
/// of plane `p` of sampled block `i`; `joint(p, q)` returns the joint counts `J[e][m]` of
/// condition plane `q` and plane `p` over the sampled blocks whose plane `p` is not one repeated byte
/// (called only when the conditional table is considered). The CPU and GPU engines count on their
/// own and share this, so their tables are identical.
pub fn model_from_counts(
    header: &BlobHeader,
    opts: &CompressOptions,
    sampling: &Sampling,
    hists: &[[u32; 256]],
    joint: impl FnOnce(usize, usize) -> JointCounts,
) -> Model {
    let us = header.planes();
    let n_sampled = sampling.picks.len() as u64;
    let threshold = opts.threshold_q16();
    let flat_stride = flat_stride(header.dtype, sampling.picks.len());
    let mut plane_models: Vec<PlaneModel> = (0..us)
        .into_par_iter()
        .map(|p| {
            let plane: Vec<&[u32; 256]> = hists.iter().skip(p).step_by(us).collect();
            // A plane whose probes are flat has no tables (its other blocks may be uncounted).
            let flat = flat_stride
                .is_some_and(|s| probes_flat(plane.iter().step_by(s).copied(), threshold));
            let tables = match flat {
                true => Vec::new(),
                false => {
                    // Blocks whose plane is one repeated byte cost nothing already.
                    let blocks: Vec<&[u32; 256]> = plane
                        .iter()
                        .enumerate()
                        .filter(|&(i, h)| {
                            prefetch_ahead(&plane, i);
                            varied(h)
                        })
                        .map(|(_, &h)| h)
                        .collect();
                    cluster(
                        &blocks,
                        n_sampled,
                        sampling.n_blocks,
                        opts.max_tables,
                        threshold,
                    )
                }
            };
            PlaneModel::of_tables(tables)
        })
        .collect();
    // Conditioning of the byte below the exponent, when the block model leaves that plane raw.
    if let Some((p, q)) = opts.conditioned_plane(header.dtype) {
        if plane_models[p].tables.is_empty() {
            let joint = joint(p, q);
            let cond = choose_conditional(&joint, n_sampled, sampling.n_blocks);
            let pm = &mut plane_models[p];
            pm.cond_enc = cond.as_ref().map(|(_, t)| t.encode_table());
            pm.cond = cond;
        }
    }
    Model {
        planes: plane_models,
        kept: None,
    }
}

impl Model {
    /// Appends the tables section of a Planes blob (`docs/FORMAT.md`, 3.3).
    pub fn write_tables(&self, out: &mut Vec<u8>) {
        let v2 = self.version() == crate::blob::BLOB_VERSION_PAIRED;
        for pm in &self.planes {
            match v2 {
                true => {
                    let pairs = pm.pairs.as_ref().map(|pc| &pc.table);
                    write_paired_plane_tables(pairs, &pm.tables, pm.cond.as_ref(), out)
                }
                false => write_plane_tables(&pm.tables, pm.cond.as_ref(), out),
            }
        }
    }

    /// The plane the model pairs (format version 2), if any.
    pub fn paired_plane(&self) -> Option<usize> {
        self.planes.iter().position(|pm| pm.pairs.is_some())
    }

    /// The blob version the model's tables need: 2 where a plane is paired, else 1.
    pub fn version(&self) -> u16 {
        match self.paired_plane().is_some() {
            true => crate::blob::BLOB_VERSION_PAIRED,
            false => crate::blob::BLOB_VERSION,
        }
    }
}

/// Appends one plane's part of the tables section: its table count, its tables, and 0 or (1, the
/// condition value, the conditional table). (The GPU encoder writes blob heads from its search's
/// tables with it.)
pub fn write_plane_tables(tables: &[FreqTable], cond: Option<&(u8, FreqTable)>, out: &mut Vec<u8>) {
    out.push(tables.len() as u8);
    for t in tables {
        t.write(out);
    }
    match cond {
        None => out.push(0),
        Some((v, t)) => {
            out.push(1);
            out.push(*v);
            t.write(out);
        }
    }
}

/// Appends one plane's part of a version 2 blob's tables section (FORMAT.md section 12): its pair
/// field (`pairs`' table, or 0 for a plane not paired), then [`write_plane_tables`]. (The GPU
/// encoder writes the heads of the blobs its device model pairs with it.)
pub fn write_paired_plane_tables(
    pairs: Option<&crate::pairs::PairTable>,
    tables: &[FreqTable],
    cond: Option<&(u8, FreqTable)>,
    out: &mut Vec<u8>,
) {
    match pairs {
        Some(t) => t.write(out),
        None => out.push(0),
    }
    write_plane_tables(tables, cond, out);
}

/// Selector of a block whose plane bytes are all `v` (a single-symbol table of `v` if the plane has
/// one — it costs nothing — else the constant selector). A paired plane's rank tables have every
/// rank `0..=D` (at least three symbols), so its constant blocks always take the constant
/// selector, as FORMAT.md section 12 says.
pub fn const_selector(v: u8, tables: &[FreqTable]) -> u8 {
    tables
        .iter()
        .position(|t| t.is_single() && t.single_symbol() == v)
        .map_or(SEL_CONST, |j| j as u8)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The stepped picks are floor(i NB / S), computed here in 128 bits, for block counts around
    /// the sample count, large ones, and ones whose products pass 64 bits.
    #[test]
    fn sample_indices_are_the_formula() {
        let counts = [
            1u64,
            2,
            1023,
            1024,
            1025,
            2047,
            32768,
            1_000_003,
            (1 << 54) + 12345,
            u64::MAX / 3,
            u64::MAX,
        ];
        for &nb in &counts {
            for s in [0usize, 1, 7, 1000, 1024] {
                let got = sample_indices(nb, s);
                let want: Vec<u64> = if nb <= s as u64 {
                    (0..nb).collect()
                } else {
                    (0..s as u128)
                        .map(|i| (i * nb as u128 / s as u128) as u64)
                        .collect()
                };
                assert_eq!(got, want, "{nb} blocks, {s} samples");
            }
        }
    }

    /// A deterministic pseudo-random stream (xorshift), for test inputs.
    pub(crate) fn rng(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// The units of a tensor of `dtype` whose transformed plane `k` holds `byte(k, i)` at unit `i`.
    fn units_from_planes(
        dtype: crate::dtype::DType,
        units: usize,
        mut byte: impl FnMut(usize, usize) -> u8,
    ) -> Vec<u8> {
        let us = dtype.unit_size();
        let planes: Vec<Vec<u8>> = (0..us)
            .map(|k| (0..units).map(|i| byte(k, i)).collect())
            .collect();
        let mut data = vec![0u8; us * units];
        let refs: Vec<&[u8]> = planes.iter().map(|v| v.as_slice()).collect();
        crate::transform::merge(dtype.transform(), &refs, &mut data);
        data
    }

    #[test]
    fn fused_counts_equal_separate_counts_and_the_model_keeps_full_samples() {
        use crate::blob::{BlobHeader, Scheme};
        use crate::dtype::DType;
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let mut r = rng(11);
            let us = dtype.unit_size();
            let (p, q) = dtype.conditioned_plane().unwrap();
            // Planes of float-like units (exponents near 120 in plane q, random bytes elsewhere),
            // with a constant block in plane p and a partial last block, merged into units;
            // chunk and block sizes small enough that 1 and all blocks are sampled in turn.
            let units = 5 * 256 + 77;
            let data = units_from_planes(dtype, units, |k, i| match k {
                _ if k == q => 118 + (r() % 5) as u8,
                _ if k == p && (256..512).contains(&i) => 9,
                _ => r() as u8,
            });
            let opts = CompressOptions {
                chunk_bytes: 256 * us * 2,
                block_units: 256,
                sample_blocks: 1,
                ..Default::default()
            };
            for sample_blocks in [1usize, 1 << 10] {
                let opts = CompressOptions {
                    sample_blocks,
                    ..opts.clone()
                };
                let header = BlobHeader {
                    scheme: Scheme::Planes,
                    dtype,
                    shape: vec![units as u64],
                    chunk_units: 512,
                    block_units: 256,
                };
                let sampling = Sampling::new(&header, &opts);
                // The transformed planes to scratch[256 k..]; returns the length.
                let split =
                    |g: u64, scratch: &mut [u8]| split_sampled(&sampling, dtype, &data, g, scratch);
                // Counted from the units where build_model would (the 2-byte dtypes here: fp32
                // has no flat-plane probes at this size), then split.
                let units = |g: u64| sampling.block_bytes(&data, us, g);
                let e = match dtype.transform() {
                    crate::dtype::Transform::SignBelowExponent { exp_bits } => exp_bits,
                    crate::dtype::Transform::Identity => 0,
                };
                let counted = |direct| {
                    let at = (Some((p, q)), flat_stride(dtype, sampling.picks.len()));
                    fused_counts(&sampling, (256, us), at, 65536, split, direct)
                };
                let (hists, joint) = counted(Some((e, units)));
                let (split_hists, split_joint) = counted(None);
                assert!(hists == split_hists && joint.dense() == split_joint.dense());
                let mut want_joint = vec![0u32; 65536];
                let mut scratch = vec![0u8; 256 * us];
                for (i, &g) in sampling.picks.iter().enumerate() {
                    let len = split(g, &mut scratch);
                    let plane = |k: usize| &scratch[256 * k..256 * k + len];
                    for k in 0..us {
                        let mut h = [0u32; 256];
                        plane(k).iter().for_each(|&v| h[v as usize] += 1);
                        assert_eq!(hists[us * i + k], h, "{dtype:?} block {g} plane {k}");
                    }
                    let (m, e) = (plane(p), plane(q));
                    if m.iter().any(|&v| v != m[0]) {
                        for k in 0..len {
                            want_joint[(e[k] as usize) << 8 | m[k] as usize] += 1;
                        }
                    }
                }
                assert!(joint.dense() == want_joint, "{dtype:?}");
                // The model keeps the histograms of its planes with tables of every sampled
                // block.
                let model = build_model(&data, &header, &opts);
                let all = sampling.picks.len() as u64 == sampling.n_blocks;
                assert_eq!(all, sample_blocks > 1);
                assert_eq!(model.kept_every_block(q), all);
                assert!(!model.planes[q].tables.is_empty());
                for g in 0..sampling.n_blocks {
                    let kept = model.block_hist(g, q);
                    let i = sampling.picks.iter().position(|&x| x == g);
                    assert_eq!(kept.is_some(), i.is_some());
                    if let (Some(h), Some(i)) = (kept, i) {
                        assert_eq!(*h, hists[us * i + q]);
                    }
                }
            }
        }
    }

    /// The flat-plane rule: fp32's planes 0 and 1 are counted only in the probe blocks when the
    /// probes are flat, the model from those counts is the model from every block's counts, and
    /// a plane with flat probes has no tables even where a block between them is compressible.
    #[test]
    fn flat_planes_are_counted_in_their_probes_only_and_decide_alike() {
        use crate::blob::{BlobHeader, Scheme};
        let dtype = DType::F32;
        // Blocks of 4096 units: a block of 256 random bytes is not flat enough for the collision
        // bound (its sample's collision entropy is ~7 bits).
        let (us, bu) = (4usize, 4096usize);
        let (p, q) = dtype.conditioned_plane().unwrap();
        // 66 blocks, the last short, all sampled: probes every 4th (66 / FLAT_PROBES), 17 of them.
        let units = 65 * bu + 77;
        let header = BlobHeader {
            scheme: Scheme::Planes,
            dtype,
            shape: vec![units as u64],
            chunk_units: 4 * bu as u32,
            block_units: bu as u32,
        };
        let opts = CompressOptions {
            chunk_bytes: 4 * bu * us,
            block_units: bu as u32,
            ..Default::default()
        };
        let sampling = Sampling::new(&header, &opts);
        let stride = flat_stride(dtype, sampling.picks.len()).expect("the rule applies");
        assert_eq!(stride, 4);
        // Plane 1 holds four values in block `easy` (none if `None`).
        let run = |easy: Option<usize>| {
            let mut r = rng(5);
            let data = units_from_planes(dtype, units, |k, i| match k {
                _ if k == q => 118 + (r() % 5) as u8,
                1 if easy == Some(i / bu) => (r() % 4) as u8,
                _ => r() as u8,
            });
            let split =
                |g: u64, scratch: &mut [u8]| split_sampled(&sampling, dtype, &data, g, scratch);
            let threshold = opts.threshold_q16();
            // The counts as build_model takes them (the blocks whose planes 0 and 1 are skipped
            // counted from their units), and with every block split: the same counts.
            let units = |g: u64| sampling.block_bytes(&data, us, g);
            let counted = |pq, direct| {
                fused_counts(
                    &sampling,
                    (bu, us),
                    (pq, Some(stride)),
                    threshold,
                    split,
                    direct,
                )
            };
            let (by_units, by_units_joint) = counted(Some((p, q)), Some((8, units)));
            let (hists, joint) = counted(Some((p, q)), None);
            assert!(by_units == hists && by_units_joint.dense() == joint.dense());
            // Every block's counts.
            let mut full = vec![[0u32; 256]; us * sampling.picks.len()];
            let mut scratch = vec![0u8; bu * us];
            for (i, &g) in sampling.picks.iter().enumerate() {
                let len = split(g, &mut scratch);
                for k in 0..us {
                    for &v in &scratch[bu * k..bu * k + len] {
                        full[us * i + k][v as usize] += 1;
                    }
                }
            }
            let tables = |hists: &[[u32; 256]]| {
                let model =
                    model_from_counts(&header, &opts, &sampling, hists, |_, _| joint.clone());
                let mut out = Vec::new();
                model.write_tables(&mut out);
                let n_tables: Vec<usize> = model.planes.iter().map(|pm| pm.tables.len()).collect();
                (out, n_tables)
            };
            let (got, want) = (tables(&hists), tables(&full));
            assert_eq!(got, want, "block {easy:?} compressible");
            // Without the conditioned plane (as fp16 by default, or `Condition::Off`) plane 2 may
            // be skipped too where its probes are flat (it is random here): the model of those
            // counts is still the model of every block's counts.
            let none = counted(None, None);
            let skipped = (0..sampling.picks.len()).any(|i| none.0[us * i + 2] != full[us * i + 2]);
            assert!(skipped, "block {easy:?}: plane 2 was counted everywhere");
            let off = CompressOptions {
                condition: crate::Condition::Off,
                ..opts.clone()
            };
            let no_joint = |_: usize, _: usize| JointCounts::default();
            let mut ours = Vec::new();
            model_from_counts(&header, &off, &sampling, &none.0, no_joint).write_tables(&mut ours);
            let mut all = Vec::new();
            model_from_counts(&header, &off, &sampling, &full, no_joint).write_tables(&mut all);
            assert!(
                ours == all,
                "block {easy:?}: tables without the conditioned plane"
            );
            // The rows counted: every probe's; the others' only for planes 2 and 3.
            let counted = |k: usize| {
                (0..sampling.picks.len())
                    .filter(|i| hists[us * i + k] == full[us * i + k])
                    .count()
            };
            (got.1, counted(0), counted(1), counted(2), counted(3))
        };
        let n = sampling.picks.len();
        let probes = n.div_ceil(stride);
        assert_eq!(probes, 17);
        // Flat probes: planes 0 and 1 counted in the probes only, and raw.
        let (tables, c0, c1, c2, c3) = run(None);
        assert_eq!((c0, c1, c2, c3), (probes, probes, n, n));
        assert_eq!(&tables[..2], &[0, 0]);
        // A compressible block between the probes: plane 1 is still raw (the rule), though its
        // counts alone would give it tables.
        let (tables, _, c1, ..) = run(Some(5));
        assert_eq!((tables[1], c1), (0, probes));
        // A compressible probe: plane 1 is counted everywhere and gets its tables.
        let (tables, c0, c1, ..) = run(Some(8));
        assert_eq!((c0, c1), (probes, n));
        assert!(tables[1] > 0, "plane 1 has tables: {tables:?}");
    }

    /// `choose` picks what its definition picks (FORMAT.md section 7: the covering table of
    /// least cost, the lowest index among ties, raw above the threshold): blocks of few and of
    /// many distinct bytes (both ways of costing), tables of partial and of full support.
    #[test]
    fn choose_is_its_definition() {
        let mut r = rng(5);
        for case in 0..300 {
            let n_tables = 1 + (r() % 6) as usize;
            let tables: Vec<FreqTable> = (0..n_tables)
                .map(|j| {
                    // Support: every byte, or a window of them.
                    let (lo, hi) = match (case + j) % 3 {
                        0 => (0, 256),
                        _ => {
                            let lo = (r() % 200) as usize;
                            (lo, lo + 2 + (r() % 56) as usize)
                        }
                    };
                    let counts: [u64; 256] = std::array::from_fn(|s| {
                        if (lo..hi).contains(&s) {
                            1 + r() % 1000
                        } else {
                            0
                        }
                    });
                    FreqTable::normalize(&counts, None).unwrap()
                })
                .collect();
            let costs: Vec<TableCost> = tables.iter().map(TableCost::new).collect();
            let len = 1 + (r() % 4096) as usize;
            let distinct = if case % 2 == 0 { 256 } else { 1 + r() % 40 };
            let base = r() % 256;
            let mut hist = [0u32; 256];
            for _ in 0..len {
                hist[((base + r() % distinct) % 256) as usize] += 1;
            }
            let threshold = 1 + r() % 65536;
            let mut want: Option<(usize, u64)> = None;
            for (j, t) in tables.iter().enumerate() {
                let covered = (0..256).all(|s| hist[s] == 0 || t.freq[s] != 0);
                let c = t.cost(&hist);
                if covered && want.is_none_or(|(_, b)| c < b) {
                    want = Some((j, c));
                }
            }
            let want = match want {
                Some((j, c)) if stays_coded(c, len, threshold) => (j as u8, c),
                _ => (SEL_RAW, raw_cost(len)),
            };
            assert_eq!(choose(&hist, len, &costs, threshold), want, "case {case}");
            assert_eq!(
                choose_portable(&hist, len, &costs, threshold),
                want,
                "case {case}, portable"
            );
        }
    }

    /// `choose_conditional` without the bound that skips rows (its definition).
    fn choose_conditional_reference(
        joint: &[u32],
        n_sampled: u64,
        n_blocks: u64,
    ) -> Option<(u8, FreqTable)> {
        let cl = code_len_table();
        let mut best: Option<(u8, FreqTable, u128)> = None;
        for e in 0..256usize {
            let row = &joint[e * 256..(e + 1) * 256];
            let n: u64 = row.iter().map(|&c| c as u64).sum();
            if n == 0 {
                continue;
            }
            let counts: [u64; 256] = std::array::from_fn(|m| row[m] as u64);
            let t = FreqTable::normalize(&counts, Some(&[true; 256])).unwrap();
            let raw = (8 * n) << FRAC_BITS;
            let cost: u64 = (0..256)
                .map(|m| row[m] as u64 * cl[t.freq[m] as usize])
                .sum();
            let Some(saving) = raw.checked_sub(cost) else {
                continue;
            };
            let scaled = saving as u128 * n_blocks as u128 / n_sampled as u128;
            let table_cost = ((2 + t.serialized_len()) as u128 * 8) << FRAC_BITS;
            if (saving << COND_MIN_SAVING_SHIFT) >= raw && scaled > table_cost {
                let net = scaled - table_cost;
                if best.as_ref().is_none_or(|b| net > b.2) {
                    best = Some((e as u8, t, net));
                }
            }
        }
        best.map(|(e, t, _)| (e, t))
    }

    #[test]
    fn conditional_choice_equals_its_definition() {
        let mut r = rng(0xC0FF_EE11);
        let mut chosen = 0;
        for case in 0..300 {
            let mut joint = vec![0u32; 65536];
            // Rows from uniform (saves nothing) to peaked (saves much), of every size.
            for e in 0..256 {
                if r().is_multiple_of(3) {
                    continue;
                }
                let n = [1u64, 7, 100, 3000, 70_000, 2_000_000][(r() % 6) as usize];
                if case % 3 == 0 {
                    // A third of the cases: every row nearly uniform over all 256 bytes.
                    let c = 1 + (r() % 5000) as u32;
                    for m in 0..256 {
                        joint[e * 256 + m] = c + (r() % 2) as u32 * (c / 64);
                    }
                    continue;
                }
                let width = 1 + (r() % 256) as usize;
                let peak = (case % 7) as u64;
                for _ in 0..n.min(4000) {
                    let m = if r() % 8 < peak {
                        (r() % 4) as usize
                    } else {
                        (r() as usize) % width
                    };
                    joint[e * 256 + m] += (n / n.min(4000)) as u32;
                }
            }
            let (ns, nb) = (1 + r() % 1024, 1 + r() % 100_000);
            let nb = nb.max(ns);
            let want = choose_conditional_reference(&joint, ns, nb);
            chosen += want.is_some() as usize;
            assert_eq!(
                choose_conditional(&JointCounts::from_dense(&joint), ns, nb),
                want,
                "case {case}"
            );
        }
        assert!(
            chosen > 30 && chosen < 270,
            "{chosen} of 300 cases chose a table"
        );
    }
}
