//! Format version 2's encoder decisions, checked against the text of docs/FORMAT.md.
//!
//! FORMAT.md section 12 ("Version 2: the paired exponent plane", *Encoder decisions*, steps
//! 1-6) is normative: an engine that writes version 2 (the GPU engine, once it does) must make
//! the CPU engine's decisions from the text alone. This test is an implementation of those six
//! steps written from the text, independent of the encoder's: it uses the crate's public API
//! only for what section 7 already defines (`model::choose` with `model::TableCost`, a block's
//! choice among a plane's tables; `FreqTable::cost`, a histogram's cost under a table), for
//! section 4.1's normalisation (`FreqTable::normalize`) and for reading blobs (`BlobView`).
//! For every generated bf16 tensor, compressed by the `CpuEngine` with
//! `CompressOptions::pair_exponents` on, it checks that
//!
//! * the tensor is paired (a version 2 blob) exactly where steps 1-6 pair it;
//! * where it is paired, the blob's pair table (steps 1-3), its rank tables (step 4) and every
//!   plane-1 selector (step 5) are the ones the text gives, and plane 0's tables are version
//!   1's;
//! * where it is not, the blob is byte for byte the one written with the option off;
//! * every blob decodes to its tensor.
//!
//! The version 1 tables that steps 4-6 start from (section 7, not under test here) are read
//! from the blob written with the option off. The tensors are seeded: weights in regions of
//! different scales, per-block scales, widely scattered exponents (escape-heavy), a few
//! exponent values with rare others, NaN/Inf/zero/subnormal mixes, samples that misjudge the
//! tensor, and constant blocks; most of 20,000 units or more, where the tables' bytes weigh
//! little enough in step 6 for many of them to pair. The test requires both outcomes, and
//! step 6's refusal, to occur, so that it can fail in either direction.

use std::ops::Range;
use std::sync::LazyLock;

use tensorzip::blob::{BlobView, PlaneMode};
use tensorzip::model::{choose, TableCost};
use tensorzip::rans::table::FreqTable;
use tensorzip::sample::{f32_to_bf16, Rng};
use tensorzip::{CompressOptions, Condition, CpuEngine, DType, Scheme};

/// Generated tensors.
const CASES: u64 = 1500;

/// Section 3.3's selectors: the block is one repeated byte, or is stored raw.
const SEL_CONST: u8 = 254;
const SEL_RAW: u8 = 255;
/// Section 12, step 1: the most top bytes.
const TOP_BYTES: usize = 16;
/// Section 12, step 3: the most pairs in the table, and the fewest that pair the plane.
const MAX_PAIRS: usize = 128;
const MIN_PAIRS: usize = 2;

static ONE_THREAD: LazyLock<CpuEngine> = LazyLock::new(|| CpuEngine::new(1).unwrap());
static TWO_THREADS: LazyLock<CpuEngine> = LazyLock::new(|| CpuEngine::new(2).unwrap());

/// Section 7: costs are Q16 bits; a block stored raw costs 8 bits a byte.
fn raw_cost(bytes: usize) -> u64 {
    (8 * bytes as u64) << 16
}

/// Section 7's passthrough rule: a block of `len` bytes at `cost` stays coded if
/// `cost × 65536 < threshold × 8 × len × 65536`.
fn stays_coded(cost: u64, len: usize, threshold: u64) -> bool {
    ((cost as u128) << 16) < threshold as u128 * raw_cost(len) as u128
}

/// Section 7: `threshold = round(passthrough_threshold × 65536)` clamped to 1 ..= 65536.
fn threshold_q16(opts: &CompressOptions) -> u64 {
    ((opts.passthrough_threshold * 65536.0).round() as u64).clamp(1, 65536)
}

/// Section 4: a serialised table is `lo`, `hi` and one code per symbol `lo ..= hi`.
fn table_bytes(t: &FreqTable) -> usize {
    let lo = t.freq.iter().position(|&f| f != 0).unwrap();
    let hi = t.freq.iter().rposition(|&f| f != 0).unwrap();
    2 + hi - lo + 1
}

fn histogram(bytes: &[u8]) -> [u32; 256] {
    let mut h = [0u32; 256];
    for &b in bytes {
        h[b as usize] += 1;
    }
    h
}

fn one_value(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == bytes[0])
}

/// Section 3.1's chunks and blocks of a tensor of `units` units, and section 7's sampling.
struct Geometry {
    chunk_units: usize,
    block_units: usize,
    units: usize,
}

impl Geometry {
    fn blocks_per_chunk(&self) -> usize {
        self.chunk_units.div_ceil(self.block_units)
    }

    fn n_chunks(&self) -> usize {
        self.units.div_ceil(self.chunk_units)
    }

    fn chunk(&self, c: usize) -> Range<usize> {
        c * self.chunk_units..((c + 1) * self.chunk_units).min(self.units)
    }

    /// `nb(c)`.
    fn blocks_in(&self, c: usize) -> usize {
        self.chunk(c).len().div_ceil(self.block_units)
    }

    /// `NB`: blocks are numbered across chunks, `g = c × blocks_per_chunk + b`; only the last
    /// chunk can have fewer.
    fn n_blocks(&self) -> usize {
        let last = self.n_chunks() - 1;
        last * self.blocks_per_chunk() + self.blocks_in(last)
    }

    /// The units of global block `g`.
    fn block(&self, g: usize) -> Range<usize> {
        let (c, b) = (g / self.blocks_per_chunk(), g % self.blocks_per_chunk());
        let start = c * self.chunk_units + b * self.block_units;
        start..(start + self.block_units).min(self.chunk(c).end)
    }

    /// Section 7, *Sampling*: every block if `NB ≤ S`, else blocks `floor(i × NB / S)`, `i < S`.
    fn sample(&self, s: usize) -> Vec<usize> {
        let nb = self.n_blocks();
        match nb <= s {
            true => (0..nb).collect(),
            false => (0..s).map(|i| i * nb / s).collect(),
        }
    }
}

/// Plane 1 of a bf16 tensor: sections 1 and 2 (sign below exponent, `E = 8`) put the whole
/// exponent in the top byte of the transformed unit.
fn exponent_bytes(units: &[u16]) -> Vec<u8> {
    units.iter().map(|&u| (u >> 7) as u8).collect()
}

/// Plane 1's version 1 tables (section 7), which steps 4-6 start from.
struct Version1 {
    tables: Vec<FreqTable>,
    costs: Vec<TableCost>,
    threshold: u64,
}

impl Version1 {
    /// Section 7's *choose* by a block's plane-1 histogram: table `j` at cost `c`, or raw (255,
    /// at the raw cost).
    fn choose(&self, block: &[u8]) -> (u8, u64) {
        choose(&histogram(block), block.len(), &self.costs, self.threshold)
    }
}

/// A plane the pair table of steps 1-3 and the rank tables of step 4 are made for.
struct Paired {
    pairs: Vec<[u8; 2]>,
    /// The rank of pair `(a, b)` at `256 a + b`: its index in `pairs`, or `D` (the escape).
    rank_of: Vec<u8>,
    rank_tables: Vec<FreqTable>,
}

impl Paired {
    fn new(pairs: Vec<[u8; 2]>) -> Paired {
        let mut rank_of = vec![pairs.len() as u8; 1 << 16];
        for (r, p) in pairs.iter().enumerate() {
            rank_of[(p[0] as usize) << 8 | p[1] as usize] = r as u8;
        }
        Paired {
            pairs,
            rank_of,
            rank_tables: Vec::new(),
        }
    }

    /// `D`, the escape rank.
    fn escape(&self) -> usize {
        self.pairs.len()
    }

    /// A block's rank histogram (the ranks of its units `2i, 2i + 1`; pairs of other bytes
    /// count as the escape) and the bytes of its escape group, `2e + (L mod 2)`.
    fn ranks(&self, block: &[u8]) -> ([u32; 256], usize) {
        let mut h = [0u32; 256];
        for p in block.chunks_exact(2) {
            h[self.rank_of[(p[0] as usize) << 8 | p[1] as usize] as usize] += 1;
        }
        (h, 2 * h[self.escape()] as usize + block.len() % 2)
    }

    /// Step 5: a block's selector.
    fn select(&self, v1: &Version1, block: &[u8]) -> u8 {
        if one_value(block) {
            return SEL_CONST;
        }
        let (j, c) = v1.choose(block);
        if j == SEL_RAW {
            return SEL_RAW;
        }
        let (_, escape_bytes) = self.ranks(block);
        match stays_coded(c + raw_cost(escape_bytes), block.len(), v1.threshold) {
            true => j,
            false => SEL_RAW,
        }
    }

    /// Step 6: a block's paired cost, estimated from its bytes as if its pairs were
    /// independent (meaningful for a block of more than one value).
    fn estimate(&self, v1: &Version1, block: &[u8]) -> u64 {
        let raw = raw_cost(block.len());
        let (j, c) = v1.choose(block);
        if j == SEL_RAW {
            return raw;
        }
        let h = histogram(block);
        let table = &self.rank_tables[j as usize];
        let code_len = |r: usize| code_len(table.freq[r] as u64);
        let (mut w, mut x) = (0u64, 0u64);
        for (r, p) in self.pairs.iter().enumerate() {
            let hh = h[p[0] as usize] as u64 * h[p[1] as usize] as u64;
            w += hh;
            x += hh * code_len(r);
        }
        let l = block.len() as u64;
        if !stays_coded(
            c + raw_cost(((l * l - w) / l) as usize),
            block.len(),
            v1.threshold,
        ) {
            return raw;
        }
        let escape = code_len(self.escape()) + raw_cost(2);
        ((x + (l * l - w) * escape) / (2 * l)).min(raw)
    }
}

/// Section 7: the code length of frequency `f` (1..=4096) in Q16 bits, `(12 << 16) −
/// log2_q16(f)`, from the fixed-point logarithm's definition.
fn code_len(f: u64) -> u64 {
    let i = 63 - f.leading_zeros();
    let mut m = (f as u128) << (62 - i);
    let mut frac = 0u64;
    for bit in (0..16).rev() {
        m = (m * m) >> 62;
        if m >= 1 << 63 {
            m >>= 1;
            frac |= 1 << bit;
        }
    }
    (12 << 16) - ((i as u64) << 16 | frac)
}

/// What steps 1-6 decide for a tensor's plane 1.
enum Decision {
    Unpaired(Why),
    /// Paired, with step 6's estimates of the version 1 plane (`p1`) and the paired one (`p2`).
    Paired {
        plane: Paired,
        p1: u128,
        p2: u128,
    },
}

/// Why a plane is not paired.
#[derive(Debug, Clone, Copy)]
enum Why {
    /// The plane has no version 1 tables: nothing to pair.
    NoTables,
    /// Step 3: fewer than two pairs.
    FewPairs,
    /// Step 6: the paired plane's estimate `p2` is more than 1/32 above version 1's `p1`.
    DoesNotPay { p1: u128, p2: u128 },
}

/// Steps 1-6 for the plane-1 bytes `exps` of a tensor laid out as `geo`, sampled blocks
/// `picks`.
fn decide(exps: &[u8], geo: &Geometry, picks: &[usize], v1: &Version1) -> Decision {
    if v1.tables.is_empty() {
        return Decision::Unpaired(Why::NoTables);
    }
    let sampled = || picks.iter().map(|&g| &exps[geo.block(g)]);

    // Step 1: the (at most) 16 most frequent bytes over the sampled blocks, larger count
    // first, smaller byte among ties, bytes with a count only.
    let mut counts = [0u64; 256];
    for block in sampled() {
        for &b in block {
            counts[b as usize] += 1;
        }
    }
    let mut top: Vec<usize> = (0..256).filter(|&b| counts[b] > 0).collect();
    top.sort_by_key(|&b| (std::cmp::Reverse(counts[b]), b));
    top.truncate(TOP_BYTES);

    // Step 2: every sampled block of more than one value chooses among the version 1 tables
    // and weighs each pair of top bytes `(a, b)` by `h[a] × h[b]` (its byte counts `h`);
    // group `j` sums the weights, and the squares of the lengths, of the blocks that chose
    // table `j`, group 0 of every such block, whatever it chose.
    let mut groups = vec![(vec![0u64; 1 << 16], 0u64); v1.tables.len()];
    for block in sampled().filter(|b| !one_value(b)) {
        let (j, _) = v1.choose(block);
        let h = histogram(block);
        let mut add = |t: usize| {
            for &a in &top {
                for &b in &top {
                    groups[t].0[a << 8 | b] += h[a] as u64 * h[b] as u64;
                }
            }
            groups[t].1 += (block.len() * block.len()) as u64;
        };
        add(0);
        if j != 0 && j != SEL_RAW {
            add(j as usize);
        }
    }

    // Step 3: the pairs with a weight in group 0, larger weight first, then smaller `a`, then
    // smaller `b` (the key `256 a + b` orders them so); the first 128; fewer than 2 do not pair.
    let weights = &groups[0].0;
    let mut keys: Vec<usize> = (0..1 << 16).filter(|&k| weights[k] > 0).collect();
    keys.sort_by_key(|&k| (std::cmp::Reverse(weights[k]), k));
    keys.truncate(MAX_PAIRS);
    if keys.len() < MIN_PAIRS {
        return Decision::Unpaired(Why::FewPairs);
    }
    let mut plane = Paired::new(keys.iter().map(|&k| [(k >> 8) as u8, k as u8]).collect());

    // Step 4: rank table `j` weighs rank `r` by its pair's weight in group `j` and the escape
    // by the group's squares less the ranks' weights (a group no block chose is group 0),
    // normalised with every rank `0 ..= D` forced.
    let forced: [bool; 256] = std::array::from_fn(|r| r <= plane.escape());
    plane.rank_tables = groups
        .iter()
        .map(|g| {
            let (g, squares) = if g.1 > 0 { g } else { &groups[0] };
            let mut w = [0u64; 256];
            for (r, p) in plane.pairs.iter().enumerate() {
                w[r] = g[(p[0] as usize) << 8 | p[1] as usize];
            }
            w[plane.escape()] = squares - w.iter().sum::<u64>();
            FreqTable::normalize(&w, Some(&forced)).expect("every rank is forced")
        })
        .collect();

    // Step 6: over the sampled blocks of more than one value, `S1` sums their version 1 costs
    // (step 5's `c`, or raw) and `S2` their estimated paired costs; both are scaled to the
    // plane's `NB` blocks (`S` sampled, the division truncating) and given their tables'
    // bytes, the paired plane its rank tables and its pair field (`u8 D` and `D` pairs).
    let (mut s1, mut s2) = (0u128, 0u128);
    for block in sampled().filter(|b| !one_value(b)) {
        s1 += v1.choose(block).1 as u128;
        s2 += plane.estimate(v1, block) as u128;
    }
    let (nb, s) = (geo.n_blocks() as u128, picks.len() as u128);
    let v1_bytes: usize = v1.tables.iter().map(table_bytes).sum();
    let rank_bytes: usize = plane.rank_tables.iter().map(table_bytes).sum();
    let pair_field = 1 + 2 * plane.pairs.len();
    let p1 = s1 * nb / s + raw_cost(v1_bytes) as u128;
    let p2 = s2 * nb / s + raw_cost(rank_bytes + pair_field) as u128;
    match 32 * p2 <= 33 * p1 {
        true => Decision::Paired { plane, p1, p2 },
        false => Decision::Unpaired(Why::DoesNotPay { p1, p2 }),
    }
}

/// How a generated tensor's values are drawn.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Gaussian weights in 1-6 contiguous regions, each at its own power-of-two scale.
    Regions,
    /// Gaussian weights, every block at its own scale near a common one.
    BlockScales,
    /// Gaussian weights times a per-element log-normal factor: the wider it is, the more
    /// exponent values, and the more escapes.
    Scattered,
    /// A few common exponent values, and rare ones from anywhere.
    RareExponents,
    /// Small weights mixed with NaN, ±Inf, ±0 and subnormals.
    Specials,
    /// Sampled blocks of a few exponent values, the others mostly of any: a sample that
    /// misjudges the tensor.
    Unrepresentative,
    /// Blocks of one exponent value (selector 254) and of a few, between blocks of weights.
    ConstantBlocks,
    /// Two exponent values in a fixed pattern (as few as one pair: step 3), now and then
    /// another.
    Patterned,
}

const KINDS: [Kind; 8] = [
    Kind::Regions,
    Kind::BlockScales,
    Kind::Scattered,
    Kind::RareExponents,
    Kind::Specials,
    Kind::Unrepresentative,
    Kind::ConstantBlocks,
    Kind::Patterned,
];

/// Uniform in `0..n`.
fn below(rng: &mut Rng, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

fn pick<T: Copy>(rng: &mut Rng, of: &[T]) -> T {
    of[below(rng, of.len())]
}

/// A bf16 unit of exponent `e`, random sign and mantissa.
fn with_exponent(rng: &mut Rng, e: u8) -> u16 {
    let bits = rng.next_u64();
    (bits as u16 & 0x807F) | (e as u16) << 7
}

fn weight(rng: &mut Rng, scale: f64) -> u16 {
    f32_to_bf16((rng.normal() * scale) as f32)
}

/// The `geo.units` bf16 units of a tensor of `kind` whose sampled blocks are `picks`.
fn generate(kind: Kind, geo: &Geometry, picks: &[usize], rng: &mut Rng) -> Vec<u16> {
    let n = geo.units;
    let mut units = Vec::with_capacity(n);
    match kind {
        Kind::Regions => {
            let regions = 1 + below(rng, 6);
            let base = below(rng, 40) as i32 - 30;
            let spread = pick(rng, &[1, 3, 16, 64]);
            let scales: Vec<f64> = (0..regions)
                .map(|_| 2f64.powi(base + below(rng, spread) as i32))
                .collect();
            for i in 0..n {
                units.push(weight(rng, scales[i * regions / n]));
            }
        }
        Kind::BlockScales => {
            let base = below(rng, 30) as i32 - 20;
            let spread = pick(rng, &[1, 2, 4, 8, 16]);
            for g in 0..geo.n_blocks() {
                let scale = 2f64.powi(base + below(rng, spread) as i32);
                for _ in geo.block(g) {
                    units.push(weight(rng, scale));
                }
            }
        }
        Kind::Scattered => {
            let sigma = pick(rng, &[0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]);
            for _ in 0..n {
                let scale = 0.02 * (sigma * rng.normal()).exp();
                units.push(weight(rng, scale));
            }
        }
        Kind::RareExponents => {
            let first = below(rng, 250) as u8;
            let common: Vec<u8> = match below(rng, 2) {
                0 => (first..first + 2 + below(rng, 4) as u8).collect(),
                _ => (0..2 + below(rng, 4))
                    .map(|_| below(rng, 256) as u8)
                    .collect(),
            };
            let rare = pick(rng, &[0.0005, 0.002, 0.01, 0.03, 0.1, 0.25]);
            for _ in 0..n {
                let e = match rng.uniform() < rare {
                    true => below(rng, 256) as u8,
                    false => pick(rng, &common),
                };
                units.push(with_exponent(rng, e));
            }
        }
        Kind::Specials => {
            let rate = pick(rng, &[0.001, 0.01, 0.05, 0.2]);
            for _ in 0..n {
                let u = match rng.uniform() < rate {
                    false => weight(rng, 0.02),
                    true => match below(rng, 7) {
                        0 => 0x7FC0,
                        1 => 0xFFC1,
                        2 => 0x7F80,
                        3 => 0xFF80,
                        4 => 0x0000,
                        5 => 0x8000,
                        _ => with_exponent(rng, 0),
                    },
                };
                units.push(u);
            }
        }
        Kind::Unrepresentative => {
            let narrow: Vec<u8> = (0..1 + below(rng, 4))
                .map(|_| below(rng, 256) as u8)
                .collect();
            let elsewhere = pick(rng, &[0.97, 0.8, 0.5, 0.0]);
            for g in 0..geo.n_blocks() {
                let p = if picks.binary_search(&g).is_ok() {
                    1.0
                } else {
                    elsewhere
                };
                for _ in geo.block(g) {
                    let e = match rng.uniform() < p {
                        true => pick(rng, &narrow),
                        false => below(rng, 256) as u8,
                    };
                    units.push(with_exponent(rng, e));
                }
            }
        }
        Kind::ConstantBlocks => {
            let values: Vec<u8> = (0..1 + below(rng, 3))
                .map(|_| below(rng, 250) as u8)
                .collect();
            for g in 0..geo.n_blocks() {
                let e0 = pick(rng, &values);
                let how = below(rng, 3);
                for _ in geo.block(g) {
                    let u = match how {
                        0 => with_exponent(rng, e0),
                        1 => {
                            let e = e0 + below(rng, 3) as u8;
                            with_exponent(rng, e)
                        }
                        _ => weight(rng, 0.05),
                    };
                    units.push(u);
                }
            }
        }
        Kind::Patterned => {
            let (a, b) = (below(rng, 256) as u8, below(rng, 256) as u8);
            let period = pick(rng, &[1, 2, 3]);
            let other = pick(rng, &[0.0, 0.0, 0.001, 0.02]);
            for i in 0..n {
                let e = match rng.uniform() < other {
                    true => below(rng, 256) as u8,
                    false => [a, b][(i / period) % 2],
                };
                units.push(with_exponent(rng, e));
            }
        }
    }
    units
}

/// What the cases came to.
#[derive(Default, Debug)]
struct Tally {
    paired: u64,
    no_tables: u64,
    few_pairs: u64,
    does_not_pay: u64,
    /// Paired by steps 1-6, but the paired Planes blob was no smaller than the Stored blob
    /// (section 7), which the blob then is.
    paired_but_stored: u64,
    /// Both blobs Stored (section 7: the Planes blob would not be smaller).
    both_stored: u64,
    /// The blob with the option off is Stored, the other a paired Planes blob: the version 1
    /// tables that steps 4-6 start from are unknown.
    unchecked: u64,
    /// Paired tensors whose `p2` is within the last 1/64 of step 6's allowance (`64 p2 > 65
    /// p1`): an allowance of 1/64 would not pair them.
    paired_near: u64,
    /// Tensors step 6 refuses whose `p2` is at most 1/16 above `p1`: an allowance of 1/16
    /// would pair them.
    refused_near: u64,
    multi_table: u64,
    selectors: u64,
}

/// One generated tensor: its options, data and the checks of the module's doc.
fn check_case(index: u64, tally: &mut Tally) {
    let mut rng = Rng::new(0x7A1E_D000 + index);
    let opts = CompressOptions {
        chunk_bytes: pick(&mut rng, &[8192, 65536, 128 << 10, 1 << 20]),
        block_units: pick(&mut rng, &[64, 128, 256, 512, 1024, 2048, 4096]),
        passthrough_threshold: pick(&mut rng, &[1.0, 0.95, 0.95, 0.8, 0.5]),
        min_compress_bytes: 0,
        max_tables: pick(&mut rng, &[1, 2, 8]),
        sample_blocks: pick(&mut rng, &[1, 2, 5, 16, 64, 256, 1024]),
        condition: pick(&mut rng, &[Condition::Auto, Condition::Off]),
        pair_exponents: true,
    };
    let kind = pick(&mut rng, &KINDS);
    let n = match below(&mut rng, 8) {
        0 => 1 + below(&mut rng, 2_000),
        1 => 2_000 + below(&mut rng, 18_000),
        _ => 20_000 + below(&mut rng, 230_000),
    };
    let geo = Geometry {
        chunk_units: opts.chunk_bytes / 2,
        block_units: opts.block_units as usize,
        units: n,
    };
    let picks = geo.sample(opts.sample_blocks);
    let units = generate(kind, &geo, &picks, &mut rng);
    let data: Vec<u8> = units.iter().flat_map(|u| u.to_le_bytes()).collect();
    let shape = [n as u64];
    let ctx = format!("case {index}: {kind:?}, {n} units, {opts:?}");

    let blob = TWO_THREADS
        .compress(&data, DType::BF16, &shape, &opts)
        .unwrap_or_else(|e| panic!("{ctx}: compress: {e}"));
    let back = TWO_THREADS
        .decompress(&blob)
        .unwrap_or_else(|e| panic!("{ctx}: decompress: {e}"));
    assert!(back.data == data, "{ctx}: the round trip differs");
    if index.is_multiple_of(8) {
        let again = ONE_THREAD
            .compress(&data, DType::BF16, &shape, &opts)
            .unwrap();
        assert!(again == blob, "{ctx}: the thread count changed the blob");
    }
    let v1_opts = CompressOptions {
        pair_exponents: false,
        ..opts.clone()
    };
    let v1_blob = TWO_THREADS
        .compress(&data, DType::BF16, &shape, &v1_opts)
        .unwrap();

    let view = BlobView::parse(&blob).unwrap();
    let version = u16::from_le_bytes([blob[4], blob[5]]);
    assert_eq!(
        version == 2,
        view.pairs.iter().any(Option::is_some),
        "{ctx}: version {version} and its pair fields"
    );
    let v1_view = BlobView::parse(&v1_blob).unwrap();
    if v1_view.header.scheme == Scheme::Stored {
        match view.header.scheme {
            Scheme::Stored => {
                tally.both_stored += 1;
                assert!(blob == v1_blob, "{ctx}: the Stored blobs differ");
            }
            // Unpaired, it would have been version 1's blob, which is Stored.
            _ => {
                tally.unchecked += 1;
                assert_eq!(
                    version, 2,
                    "{ctx}: a version 1 Planes blob where version 1's is Stored"
                );
            }
        }
        return;
    }
    let v1 = Version1 {
        tables: v1_view.tables[1].clone(),
        costs: v1_view.tables[1].iter().map(TableCost::new).collect(),
        threshold: threshold_q16(&opts),
    };
    let exps = exponent_bytes(&units);
    let (plane, p1, p2) = match decide(&exps, &geo, &picks, &v1) {
        Decision::Paired { plane, p1, p2 } => (plane, p1, p2),
        Decision::Unpaired(why) => {
            match why {
                Why::NoTables => tally.no_tables += 1,
                Why::FewPairs => tally.few_pairs += 1,
                Why::DoesNotPay { p1, p2 } => {
                    tally.does_not_pay += 1;
                    tally.refused_near += (16 * p2 <= 17 * p1) as u64;
                }
            }
            assert_eq!(version, 1, "{ctx}: paired where steps 1-6 do not pair");
            assert!(
                blob == v1_blob,
                "{ctx}: not paired, yet not version 1's blob"
            );
            return;
        }
    };
    tally.paired_near += (64 * p2 > 65 * p1) as u64;
    if view.header.scheme == Scheme::Stored {
        tally.paired_but_stored += 1;
        assert_eq!(version, 1, "{ctx}: a Stored blob of version 2");
        return;
    }
    tally.paired += 1;
    assert_eq!(
        version, 2,
        "{ctx}: not paired where steps 1-6 pair (p1 {p1}, p2 {p2})"
    );

    // Steps 1-3: the pair table, as its field serialises it (`u8 D`, then the pairs).
    let mut field = Vec::new();
    view.pairs[1]
        .as_ref()
        .expect("plane 1 is the paired plane")
        .write(&mut field);
    let got: Vec<[u8; 2]> = field[1..].chunks_exact(2).map(|p| [p[0], p[1]]).collect();
    assert_eq!(got, plane.pairs, "{ctx}: the pair table");
    // Step 4: the rank tables; plane 0 is as in version 1.
    assert_eq!(view.tables[1], plane.rank_tables, "{ctx}: the rank tables");
    assert_eq!(view.tables[0], v1_view.tables[0], "{ctx}: plane 0's tables");
    assert_eq!(
        view.cond[0], v1_view.cond[0],
        "{ctx}: plane 0's conditional table"
    );
    tally.multi_table += (plane.rank_tables.len() > 1) as u64;

    // Step 5: every block's selector, and the plane's mode per chunk (section 7: Const where
    // the chunk is one value, else Raw where every selector is 255, else Blocks; a chunk whose
    // payload would not be smaller than its raw size is all Raw and Const, without a stream).
    for c in 0..geo.n_chunks() {
        let entry = view.entries[c];
        let first = c * geo.blocks_per_chunk();
        let want: Vec<u8> = (0..geo.blocks_in(c))
            .map(|b| plane.select(&v1, &exps[geo.block(first + b)]))
            .collect();
        let chunk = &exps[geo.chunk(c)];
        let want_mode = match () {
            _ if one_value(chunk) => PlaneMode::Const(chunk[0]),
            _ if want.iter().all(|&s| s == SEL_RAW) => PlaneMode::Raw,
            _ => PlaneMode::Blocks,
        };
        match (want_mode, entry.modes[1]) {
            (PlaneMode::Blocks, PlaneMode::Blocks) => {
                let at = match entry.modes[0] {
                    PlaneMode::Blocks => want.len(),
                    _ => 0,
                };
                let got = &view.payload(c)[at..at + want.len()];
                for (b, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g, w, "{ctx}: chunk {c}, block {b}: the selector");
                }
                tally.selectors += want.len() as u64;
            }
            (PlaneMode::Blocks, PlaneMode::Raw) => {
                let stored = entry.modes[..2]
                    .iter()
                    .all(|m| matches!(m, PlaneMode::Raw | PlaneMode::Const(_)));
                assert!(
                    stored && entry.rans_len == 0,
                    "{ctx}: chunk {c}: plane 1 Raw where blocks are coded"
                );
            }
            (want, got) => assert_eq!(got, want, "{ctx}: chunk {c}: plane 1's mode"),
        }
    }
}

#[test]
fn version_2_decisions_follow_the_format_text() {
    let mut tally = Tally::default();
    for index in 0..CASES {
        check_case(index, &mut tally);
    }
    eprintln!("{CASES} tensors: {tally:?}");
    let unpaired = tally.no_tables + tally.few_pairs + tally.does_not_pay;
    assert!(
        tally.paired >= CASES / 5,
        "too few paired tensors: {tally:?}"
    );
    assert!(unpaired >= CASES / 5, "too few unpaired tensors: {tally:?}");
    assert!(
        tally.does_not_pay >= CASES / 20,
        "step 6 refuses too rarely: {tally:?}"
    );
    // A plane with version 1 tables has a block of two bytes or more, so four pairs or more.
    assert_eq!(tally.few_pairs, 0, "step 3 found too few pairs: {tally:?}");
    assert!(
        tally.multi_table > 0,
        "no paired plane with several rank tables: {tally:?}"
    );
    assert!(
        tally.paired_near > 0,
        "no paired tensor near step 6's line: {tally:?}"
    );
    assert!(
        tally.refused_near > 0,
        "no refused tensor near step 6's line: {tally:?}"
    );
    assert!(
        tally.both_stored + tally.unchecked <= CASES / 10,
        "too many Stored: {tally:?}"
    );
}
