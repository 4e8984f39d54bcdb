//! Joint counts of a conditioned plane: how often each byte `m` of the plane occurs with each
//! condition byte `e` (the exponent), over the model's sampled blocks, from which
//! [`crate::model::choose_conditional`] picks the conditional table.
//!
//! Counted into 16-bit counters (`BlockJoint`): one increment a unit. Blocks counted from their
//! units (`BlockJoint::count_units`, bf16 and fp32 weights) accumulate in them for up to 65,535
//! units (`PIECE`); after each block only the rows between its smallest and largest condition
//! byte are read — their sums, and the sums of their columns, against those after the block
//! before, are the block's histograms of both planes — and the counters are added to the
//! tensor's counts and zeroed once per piece. Blocks counted from split planes
//! (`BlockJoint::count`) are read back, added and zeroed one at a time. This replaced a loop of
//! two 32-bit increments a unit (the joint counter and the plane's histogram), ~21% of a
//! one-thread bf16 compress near the store ports' rate, and a 256 KiB table zeroed for every
//! tensor: [`JointCounts`] keeps only the rows of condition bytes that occur (an exponent plane
//! has a few dozen of 256).

/// Joint counts `J[e][m]`, stored for the condition bytes `e` that occurred.
#[derive(Clone, Default)]
pub struct JointCounts {
    /// `slot[e]`: 1 + the index of `e`'s row in `rows`, or 0 where `e` never occurred.
    slot: Vec<u16>,
    rows: Vec<[u32; 256]>,
}

impl JointCounts {
    /// The counts of a dense table `joint[e * 256 + m]` (65536 entries; the GPU engine's host
    /// path downloads them so). Rows of zeros are not stored.
    pub fn from_dense(joint: &[u32]) -> JointCounts {
        let mut j = JointCounts::default();
        for (e, row) in joint.chunks_exact(256).take(256).enumerate() {
            if row.iter().any(|&c| c != 0) {
                j.row_mut(e as u8).copy_from_slice(row);
            }
        }
        j
    }

    /// The row of condition byte `e`, if it occurred.
    pub fn row(&self, e: u8) -> Option<&[u32; 256]> {
        match self.slot.get(e as usize) {
            Some(&s) if s > 0 => Some(&self.rows[s as usize - 1]),
            _ => None,
        }
    }

    /// The dense table `J[e * 256 + m]`.
    pub fn dense(&self) -> Vec<u32> {
        let mut d = vec![0u32; 65536];
        for e in 0..=255u8 {
            if let Some(r) = self.row(e) {
                d[(e as usize) << 8..][..256].copy_from_slice(r);
            }
        }
        d
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &JointCounts) {
        for e in 0..=255u8 {
            if let Some(r) = other.row(e) {
                self.row_mut(e)
                    .iter_mut()
                    .zip(r)
                    .for_each(|(x, &y)| *x += y);
            }
        }
    }

    /// The row of `e`, made (zeroed) if it was not there.
    fn row_mut(&mut self, e: u8) -> &mut [u32; 256] {
        if self.slot.is_empty() {
            self.slot = vec![0; 256];
            // An exponent plane has a few dozen distinct bytes: room for them from the start, not
            // regrown (each regrowth copied every row: ~2% of a one-thread bf16 model pass).
            self.rows.reserve(ROWS_RESERVED);
        }
        let s = &mut self.slot[e as usize];
        if *s == 0 {
            self.rows.push([0; 256]);
            *s = self.rows.len() as u16;
        }
        &mut self.rows[*s as usize - 1]
    }
}

/// Rows a [`JointCounts`] makes room for with its first row (32 KiB).
const ROWS_RESERVED: usize = 32;

/// Units counted between two flushes of the 16-bit counters (no counter can pass `u16::MAX`).
pub(crate) const PIECE: usize = u16::MAX as usize;

/// 16-bit joint counters of consecutive blocks, with what tells each block's counts from the
/// blocks' before it. All zero when no units are pending (as [`BlockJoint::take`] hands them out
/// and [`BlockJoint::give_back`] keeps them).
pub(crate) struct BlockJoint {
    counts: Box<[u16]>,
    /// Units whose counts are in `counts` and not yet in a [`JointCounts`]; at most [`PIECE`].
    pending: usize,
    /// While units are pending, every counter outside rows `rows.0..=rows.1` is zero.
    rows: (u8, u8),
    /// Each row's sum (`e`) and each column's (`m`) after the last block counted from its units,
    /// over the pending counts.
    row_sums: [u16; 256],
    col_sums: [u16; 256],
}

thread_local! {
    /// The last [`BlockJoint`] this thread gave back ([`BlockJoint::give_back`]), all zero.
    static KEPT: std::cell::Cell<Option<BlockJoint>> = const { std::cell::Cell::new(None) };
}

impl BlockJoint {
    pub(crate) fn new() -> BlockJoint {
        BlockJoint {
            counts: vec![0u16; 65536].into_boxed_slice(),
            pending: 0,
            rows: (0, 0),
            row_sums: [0; 256],
            col_sums: [0; 256],
        }
    }

    /// This thread's kept counters, or new ones: every part of every tensor's model pass took
    /// 128 KiB of zeroed counters (an allocation and a `memset`, or fresh pages) and freed them.
    pub(crate) fn take() -> BlockJoint {
        KEPT.with(|k| k.take()).unwrap_or_else(BlockJoint::new)
    }

    /// Adds the pending counts to `joint` ([`BlockJoint::flush`]) and keeps the zeroed counters
    /// for this thread's next [`BlockJoint::take`].
    pub(crate) fn give_back(mut self, joint: &mut JointCounts) {
        self.flush(joint);
        debug_assert!(self.counts.iter().all(|&c| c == 0));
        KEPT.with(|k| k.set(Some(self)));
    }

    /// Adds the pending counts to `joint` and zeroes them (and the sums kept beside them).
    pub(crate) fn flush(&mut self, joint: &mut JointCounts) {
        if self.pending == 0 {
            return;
        }
        let counts: &mut [u16; 65536] = (&mut *self.counts).try_into().expect("65536 counters");
        add_rows(counts, self.rows, &self.row_sums, joint);
        self.row_sums = [0; 256];
        self.col_sums = [0; 256];
        self.pending = 0;
    }

    /// Counts the pairs `(e[i], m[i])` of one block into the tensor's joint counts and into
    /// `plane_hist` (the block's histogram of the plane `m`, which must start at zero). `e_hist`
    /// is the histogram of `e` (the rows to read back: any byte of `e` must have a non-zero
    /// count there; more rows cost time, not correctness). Returns the number of rows (distinct
    /// bytes in `e_hist`).
    pub(crate) fn count(
        &mut self,
        e: &[u8],
        m: &[u8],
        e_hist: &[u32; 256],
        plane_hist: &mut [u32; 256],
        joint: &mut JointCounts,
    ) -> usize {
        // This path reads back the rows of one block: nothing may be pending.
        self.flush(joint);
        let rows = e_hist.iter().filter(|&&c| c != 0).count();
        if rows > FLUSH_ROWS {
            count_direct(e, m, e_hist, plane_hist, joint);
            return rows;
        }
        let counts: &mut [u16; 65536] = (&mut *self.counts).try_into().expect("65536 counters");
        for (e, m) in e.chunks(PIECE).zip(m.chunks(PIECE)) {
            count_pairs(counts, e, m);
            for (ev, _) in e_hist.iter().enumerate().filter(|(_, &c)| c != 0) {
                let row: &mut [u16; 256] = (&mut counts[ev << 8..(ev << 8) + 256])
                    .try_into()
                    .expect("a row");
                flush_row(row, plane_hist, joint.row_mut(ev as u8));
            }
        }
        rows
    }
}

impl BlockJoint {
    /// [`BlockJoint::count`] for a block read straight from the tensor's units (`src`, at most
    /// [`PIECE`] units of `US` = 2 or 4 bytes), without splitting it into planes: the top 16
    /// bits of a unit after the transform are the joint index `e << 8 | m` of its top plane
    /// (`e`) and the one below (`m`); for bf16 or fp32 the index is [`transform::fwd16`] of the
    /// unit's top 16 bits (`E` = 8; fp32's top half is a bf16), without a transform the top 16
    /// bits themselves (`E` = 0, fp16). Writes the block's histograms of those two planes into
    /// `hq` (`e`) and `hp` (`m`), which must start at zero, and adds the joint counts unless `m`
    /// is one repeated byte in the block, exactly as a split followed by [`BlockJoint::count`]
    /// would — to `joint` once the pending units would pass [`PIECE`], or at
    /// [`BlockJoint::flush`]. Planes below those two are not looked at. Returns the number of
    /// distinct `e`.
    ///
    /// This saves the split and the histogram of the top plane (~25% of a one-thread bf16 model
    /// pass). The block's histograms are the differences of the row and column sums of the
    /// pending counts before and after it ([`read_back`]): a pass over the rows between the
    /// pending blocks' smallest and largest `e` (the rows of absent bytes are zero), reading
    /// each once, where adding each row to the histogram and the joint counts and zeroing it
    /// after every block was ~11% of the model pass of MiniLM bf16's matrices.
    pub(crate) fn count_units<const US: usize, const E: u32>(
        &mut self,
        src: &[u8],
        hp: &mut [u32; 256],
        hq: &mut [u32; 256],
        joint: &mut JointCounts,
    ) -> usize {
        debug_assert!(src.len() / US <= PIECE);
        let units = &src[..src.len() / US * US];
        let n = units.len() / US;
        if self.pending + n > PIECE {
            self.flush(joint);
        }
        let counts: &mut [u16; 65536] = (&mut *self.counts).try_into().expect("65536 counters");
        #[cfg(target_arch = "x86_64")]
        let span = match crate::cpu::has_avx2() {
            // SAFETY: AVX2 support was checked at run time.
            true => unsafe { count_units_avx2::<US, E>(counts, units) },
            false => count_units_impl::<US, E>(counts, units, None),
        };
        #[cfg(not(target_arch = "x86_64"))]
        let span = count_units_impl::<US, E>(counts, units, None);
        let Some(span) = span else { return 0 };
        let (lo, hi) = ((span.lo >> 8) as u8, (span.hi >> 8) as u8);
        self.rows = match self.pending {
            0 => (lo, hi),
            _ => (self.rows.0.min(lo), self.rows.1.max(hi)),
        };
        self.pending += n;
        let sums = (&mut self.row_sums, &mut self.col_sums);
        let rows = read_back(counts, self.rows, sums, hp, hq);
        if span.m_and == span.m_or {
            // Plane m is one repeated byte: no joint counts. The block's counts, all in column
            // m, are taken out again (`hp` already holds its one byte's count).
            let m = span.m_and as usize;
            for e in lo as usize..=hi as usize {
                let c = hq[e] as u16;
                counts[e << 8 | m] -= c;
                self.row_sums[e] -= c;
            }
            self.col_sums[m] -= n as u16;
            self.pending -= n;
        }
        rows
    }
}

dispatch_wide! {
    /// The block's histograms from the pending counts (rows `rows.0..=rows.1`) after it: for each
    /// row its sum against `sums.0` (the rows' sums before the block) into `hq`, for each column
    /// its sum against `sums.1` into `hp`; the new sums are kept in `sums`. Returns the number of
    /// rows whose sum changed: the block's distinct `e`. A hot loop of the model's rayon task:
    /// there it was compiled as SSE2 code.
    fn read_back(
        counts: &[u16; 65536],
        rows: (u8, u8),
        sums: (&mut [u16; 256], &mut [u16; 256]),
        hp: &mut [u32; 256],
        hq: &mut [u32; 256],
    ) -> usize = read_back_impl;
}

/// The loop of [`read_back`], vectorised for the target features of its caller. Sums of the
/// pending counts fit 16 bits (at most [`PIECE`] units), and so do their differences.
#[inline(always)]
fn read_back_impl(
    counts: &[u16; 65536],
    (lo, hi): (u8, u8),
    (row_sums, col_sums): (&mut [u16; 256], &mut [u16; 256]),
    hp: &mut [u32; 256],
    hq: &mut [u32; 256],
) -> usize {
    let mut cols = [0u16; 256];
    let mut rows = 0;
    for e in lo as usize..=hi as usize {
        let row: &[u16; 256] = counts[e << 8..(e << 8) + 256].try_into().expect("a row");
        let sum = row_sum(row);
        if sum == 0 {
            continue;
        }
        let d = sum.wrapping_sub(row_sums[e]);
        row_sums[e] = sum;
        hq[e] = d as u32;
        rows += (d != 0) as usize;
        for (c, &v) in cols.iter_mut().zip(row) {
            *c = c.wrapping_add(v);
        }
    }
    for ((h, &c), s) in hp.iter_mut().zip(&cols).zip(col_sums.iter_mut()) {
        *h = c.wrapping_sub(*s) as u32;
        *s = c;
    }
    rows
}

dispatch_wide! {
    /// Adds the non-zero rows among `rows.0..=rows.1` (those with a non-zero sum in `row_sums`)
    /// to `joint` and zeroes them.
    fn add_rows(
        counts: &mut [u16; 65536],
        rows: (u8, u8),
        row_sums: &[u16; 256],
        joint: &mut JointCounts,
    ) = add_rows_impl;
}

/// The loop of [`add_rows`], vectorised for the target features of its caller.
#[inline(always)]
fn add_rows_impl(
    counts: &mut [u16; 65536],
    (lo, hi): (u8, u8),
    row_sums: &[u16; 256],
    joint: &mut JointCounts,
) {
    for e in lo as usize..=hi as usize {
        if row_sums[e] == 0 {
            continue;
        }
        let row = &mut counts[e << 8..(e << 8) + 256];
        for (j, c) in joint.row_mut(e as u8).iter_mut().zip(row.iter_mut()) {
            *j += *c as u32;
            *c = 0;
        }
    }
}

/// The sum of a row of 16-bit counters, added lane-wise in 16 bits: neither a lane nor the sum
/// can wrap, since all pending counters together hold at most [`PIECE`] (`u16::MAX`) units.
#[inline(always)]
fn row_sum(row: &[u16; 256]) -> u16 {
    let mut acc = [0u16; 32];
    for c in row.chunks_exact(32) {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(v);
        }
    }
    acc.iter().fold(0u16, |s, &a| s.wrapping_add(a))
}

impl BlockJoint {
    /// [`BlockJoint::count_units`] for units of `us` bytes (2 or 4) and a transform of `e`
    /// exponent bits (8, or 0 for none; only 2-byte units go untransformed), chosen at run time.
    pub(crate) fn count_units_of(
        &mut self,
        (us, e): (usize, u32),
        src: &[u8],
        hp: &mut [u32; 256],
        hq: &mut [u32; 256],
        joint: &mut JointCounts,
    ) -> usize {
        match (us, e) {
            (2, 8) => self.count_units::<2, 8>(src, hp, hq, joint),
            (2, _) => self.count_units::<2, 0>(src, hp, hq, joint),
            _ => self.count_units::<4, 8>(src, hp, hq, joint),
        }
    }
}

/// What the unit counting loops saw of a block: the smallest and largest joint index (so the
/// rows `lo >> 8 ..= hi >> 8` hold its counts), and the AND and OR of its `m` bytes (equal where
/// they are one repeated byte).
struct Span {
    lo: u16,
    hi: u16,
    m_and: u8,
    m_or: u8,
}

/// The joint index of a unit of `US` bytes (little-endian; see [`BlockJoint::count_units`]).
#[inline(always)]
fn unit_index<const US: usize, const E: u32>(unit: &[u8]) -> u16 {
    crate::transform::fwd16::<E>(u16::from_le_bytes([unit[US - 2], unit[US - 1]]))
}

/// Adds one to `counts[unit_index(u)]` for every unit `u` of `src` (whole units of `US` bytes)
/// and returns the span of the block so far (`from`: what its units before `src` gave; `None`
/// for no units at all).
#[inline(always)]
fn count_units_impl<const US: usize, const E: u32>(
    counts: &mut [u16; 65536],
    src: &[u8],
    from: Option<Span>,
) -> Option<Span> {
    let mut units = src.chunks_exact(US);
    let mut s = match from {
        Some(s) => s,
        None => {
            let k = unit_index::<US, E>(units.next()?);
            counts[k as usize] += 1;
            Span {
                lo: k,
                hi: k,
                m_and: k as u8,
                m_or: k as u8,
            }
        }
    };
    for c in units {
        let k = unit_index::<US, E>(c);
        counts[k as usize] += 1;
        s.lo = s.lo.min(k);
        s.hi = s.hi.max(k);
        s.m_and &= k as u8;
        s.m_or |= k as u8;
    }
    Some(s)
}

/// [`count_units_impl`] in steps of 32 units: the units' top halves (for 4-byte units, shifted
/// down and packed to 16 bits) transformed on 16-bit lanes ([`crate::transform::fwd16_wide`]) are
/// the indices, stored and read back four to a load ([`add_stored`]; the packs
/// interleave 128-bit halves: the order does not matter to a count); the span is kept in vectors
/// (unsigned minimum and maximum, AND, OR). The source is prefetched ahead as the split does
/// (this is where a sampled block is first read).
///
/// # Safety
/// AVX2 required.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn count_units_avx2<const US: usize, const E: u32>(
    counts: &mut [u16; 65536],
    src: &[u8],
) -> Option<Span> {
    use std::arch::x86_64::*;
    let n = src.len() / US;
    let mut idx = [0u64; 8];
    let mut i = 0;
    let mut span = None;
    if n >= 32 {
        // SAFETY: 32-byte loads at src[US i..US (i + 32)] with i + 32 <= n, 32-byte stores into
        // the 64-byte `idx`, register operations; a prefetch never faults.
        unsafe {
            let (mut lo, mut hi) = (_mm256_set1_epi16(-1), _mm256_setzero_si256());
            let (mut and, mut or) = (_mm256_set1_epi16(-1), _mm256_setzero_si256());
            // Sixteen units' top halves from `US / 2` loads at unit `at`.
            let halves = |at: usize| {
                let s = src.as_ptr().add(US * at) as *const __m256i;
                match US {
                    2 => _mm256_loadu_si256(s),
                    _ => _mm256_packus_epi32(
                        _mm256_srli_epi32::<16>(_mm256_loadu_si256(s)),
                        _mm256_srli_epi32::<16>(_mm256_loadu_si256(s.add(1))),
                    ),
                }
            };
            while i + 32 <= n {
                let ahead = src.as_ptr().wrapping_add(US * i + PREFETCH_BYTES) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(ahead);
                if US == 4 {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
                }
                let a = crate::transform::fwd16_wide::<E>(halves(i));
                let b = crate::transform::fwd16_wide::<E>(halves(i + 16));
                let ip = idx.as_mut_ptr() as *mut __m256i;
                _mm256_storeu_si256(ip, a);
                _mm256_storeu_si256(ip.add(1), b);
                lo = _mm256_min_epu16(lo, _mm256_min_epu16(a, b));
                hi = _mm256_max_epu16(hi, _mm256_max_epu16(a, b));
                and = _mm256_and_si256(and, _mm256_and_si256(a, b));
                or = _mm256_or_si256(or, _mm256_or_si256(a, b));
                add_stored(counts, &mut idx);
                i += 32;
            }
            let lanes = |v: __m256i| {
                let mut l = [0u16; 16];
                _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, v);
                l
            };
            let (lo, hi, and, or) = (lanes(lo), lanes(hi), lanes(and), lanes(or));
            span = Some(Span {
                lo: lo.into_iter().fold(u16::MAX, u16::min),
                hi: hi.into_iter().fold(0, u16::max),
                m_and: and.into_iter().fold(0xFF, |x, y| x & y as u8),
                m_or: or.into_iter().fold(0, |x, y| x | y as u8),
            });
        }
    }
    count_units_impl::<US, E>(counts, &src[US * i..US * n], span)
}

/// How far ahead of its loads [`count_units_avx2`] prefetches (as the split it replaces did,
/// before `cpu::split_prefetch_bytes` took 3072 on AMD). 3072 here measured no clear change on the
/// Zen 4 VM (2026-12-07, one-thread model pass, eight alternating rounds: paired medians
/// 0.94-1.00 with rounds from 0.76 to 1.38), so it stays.
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 1024;

/// Adds one to `counts[e[i] << 8 | m[i]]` for every `i` of the shorter of `e` and `m`.
#[inline]
fn count_pairs(counts: &mut [u16; 65536], e: &[u8], m: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2() {
        // SAFETY: AVX2 support was checked at run time.
        return unsafe { count_pairs_avx2(counts, e, m) };
    }
    count_pairs_impl(counts, e, m)
}

/// [`count_pairs`] with the indices of 32 units made by two byte unpacks (`m` low, `e` high),
/// stored, and read back four to a 64-bit load: the shifts and masks of [`count_pairs_impl`]
/// took as many instructions as the increments themselves. The unpacks interleave within
/// 128-bit halves, so the indices come out of order, which a count does not see. In a C model of
/// the loop (one 4096-unit block of bf16-like exponents, Zen 4 VM): 0.84 ns a unit by shifts,
/// 0.55 with the indices read back one by one, 0.48 four at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn count_pairs_avx2(counts: &mut [u16; 65536], e: &[u8], m: &[u8]) {
    use std::arch::x86_64::*;
    let n = e.len().min(m.len());
    let mut idx = [0u64; 8];
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: 32-byte loads at e[i..], m[i..] with i + 32 <= n, and 32-byte stores into the
        // 64-byte `idx`.
        unsafe {
            let ev = _mm256_loadu_si256(e.as_ptr().add(i) as *const __m256i);
            let mv = _mm256_loadu_si256(m.as_ptr().add(i) as *const __m256i);
            let ip = idx.as_mut_ptr() as *mut __m256i;
            _mm256_storeu_si256(ip, _mm256_unpacklo_epi8(mv, ev));
            _mm256_storeu_si256(ip.add(1), _mm256_unpackhi_epi8(mv, ev));
        }
        add_stored(counts, &mut idx);
        i += 32;
    }
    count_pairs_impl(counts, &e[i..n], &m[i..n]);
}

/// Adds one to `counts[k]` for each of the 32 16-bit indices `k` stored in `idx`, read back from
/// memory four to a 64-bit load: without the `black_box` the compiler takes them out of the vector
/// registers they were stored from with `vpextrw`, two micro-ops each on Zen 4 where a load is one.
#[inline(always)]
fn add_stored(counts: &mut [u16; 65536], idx: &mut [u64; 8]) {
    std::hint::black_box(&mut *idx);
    for &w in idx.iter() {
        for k in 0..4 {
            counts[(w >> (16 * k)) as u16 as usize] += 1;
        }
    }
}

/// [`count_pairs`] without SIMD: eight units from two 64-bit loads, their indices by shifts.
#[inline(always)]
fn count_pairs_impl(counts: &mut [u16; 65536], e: &[u8], m: &[u8]) {
    let n = e.len().min(m.len());
    let (e8, m8) = (e[..n].chunks_exact(8), m[..n].chunks_exact(8));
    let tail = n - n % 8;
    for (a, b) in e8.zip(m8) {
        let ev = u64::from_le_bytes(a.try_into().expect("8 bytes"));
        let mv = u64::from_le_bytes(b.try_into().expect("8 bytes"));
        for k in 0..8 {
            let idx = ((ev >> (8 * k)) & 0xFF) << 8 | ((mv >> (8 * k)) & 0xFF);
            counts[idx as usize & 0xFFFF] += 1;
        }
    }
    for (&ev, &mv) in e[tail..n].iter().zip(&m[tail..n]) {
        counts[(ev as usize) << 8 | mv as usize] += 1;
    }
}

/// Blocks with more distinct condition bytes than this are counted straight into the joint rows
/// (two increments a unit): reading back and zeroing 256 counters a row costs more than it saves
/// there. An exponent plane of bf16 or fp32 weights has 14-20 distinct bytes in a 4096-unit
/// block (all-MiniLM-L6-v2, synthetic data), fp16's high byte ~90 (which this keeps as fast as
/// the two-increment loop was: with every block flushed, fp16's model pass lost ~8%).
pub(crate) const FLUSH_ROWS: usize = 32;

/// [`BlockJoint::count`] for blocks of many condition bytes. Not inlined: inlined into the
/// model pass's parallel loop its loop reloaded its pointers from the stack at every unit
/// (MiniLM fp16 one-thread warm compress +10.5% out of line, 2026-12-03, six alternating rounds).
#[inline(never)]
fn count_direct(
    e: &[u8],
    m: &[u8],
    e_hist: &[u32; 256],
    plane_hist: &mut [u32; 256],
    joint: &mut JointCounts,
) {
    let mut at = [0u32; 256];
    for (ev, _) in e_hist.iter().enumerate().filter(|(_, &c)| c != 0) {
        joint.row_mut(ev as u8);
        at[ev] = (joint.slot[ev] as u32 - 1) << 8;
    }
    let flat = joint.rows.as_flattened_mut();
    for (&ev, &mv) in e.iter().zip(m) {
        flat[at[ev as usize] as usize | mv as usize] += 1;
        plane_hist[mv as usize] += 1;
    }
}

dispatch_wide! {
    /// Adds a row of 16-bit counters to the plane's histogram and the joint row, and zeroes it.
    fn flush_row(
        row: &mut [u16; 256],
        hist: &mut [u32; 256],
        joint: &mut [u32; 256],
    ) = flush_row_impl;
}

/// The loop of [`flush_row`], which the compiler vectorises for the target features of its
/// caller.
#[inline(always)]
fn flush_row_impl(row: &mut [u16; 256], hist: &mut [u32; 256], joint: &mut [u32; 256]) {
    for ((c, h), j) in row.iter().zip(hist.iter_mut()).zip(joint.iter_mut()) {
        *h += *c as u32;
        *j += *c as u32;
    }
    *row = [0; 256];
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The number of condition bytes whose row `j` keeps.
    fn stored_rows(j: &JointCounts) -> usize {
        (0..=255u8).filter(|&e| j.row(e).is_some()).count()
    }

    /// Counts of `pairs` the plain way.
    fn reference(e: &[u8], m: &[u8]) -> (Vec<u32>, [u32; 256]) {
        let mut j = vec![0u32; 65536];
        let mut h = [0u32; 256];
        for (&a, &b) in e.iter().zip(m) {
            j[(a as usize) << 8 | b as usize] += 1;
            h[b as usize] += 1;
        }
        (j, h)
    }

    fn hist(bytes: &[u8]) -> [u32; 256] {
        let mut h = [0u32; 256];
        bytes.iter().for_each(|&b| h[b as usize] += 1);
        h
    }

    /// The pair counting loops (the scalar one, and the one `count_pairs` takes on this CPU) add
    /// the plain counts for every length around their steps of 8 and 32 units.
    #[test]
    fn pair_loops_count_every_pair() {
        let mut r = crate::model::tests::rng(5);
        for n in [0usize, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 4096, 4099] {
            let e: Vec<u8> = (0..n).map(|_| 100 + (r() % 40) as u8).collect();
            let m: Vec<u8> = (0..n).map(|_| r() as u8).collect();
            let (want, _) = reference(&e, &m);
            let mut scalar = vec![0u16; 65536];
            count_pairs_impl((&mut scalar[..]).try_into().unwrap(), &e, &m);
            let mut chosen = vec![0u16; 65536];
            count_pairs((&mut chosen[..]).try_into().unwrap(), &e, &m);
            for (name, got) in [("scalar", &scalar), ("chosen", &chosen)] {
                assert!(
                    got.iter().zip(&want).all(|(&g, &w)| g as u32 == w),
                    "{name} loop, {n} units"
                );
            }
        }
    }

    /// The portable unit loop and the AVX2 one (where this CPU has it) count alike and see the
    /// same span, for every length around the 32-unit step (the portable loop otherwise runs
    /// only the AVX2 loop's tails on such a CPU).
    #[test]
    fn unit_loops_count_alike() {
        let mut r = crate::model::tests::rng(13);
        for n in [0usize, 1, 31, 32, 33, 64, 100, 4096, 4099] {
            let src: Vec<u8> = (0..4 * n).map(|_| r() as u8).collect();
            let span = |s: Option<Span>| s.map(|s| (s.lo, s.hi, s.m_and, s.m_or));
            let mut portable = Box::new([0u16; 65536]);
            let mut wide = Box::new([0u16; 65536]);
            let (a, b) = (
                span(count_units_impl::<2, 8>(&mut portable, &src[..2 * n], None)),
                span(count_units_impl::<4, 8>(&mut portable, &src, None)),
            );
            #[cfg(target_arch = "x86_64")]
            if crate::cpu::has_avx2() {
                // SAFETY: AVX2 support was checked at run time.
                let (c, d) = unsafe {
                    (
                        span(count_units_avx2::<2, 8>(&mut wide, &src[..2 * n])),
                        span(count_units_avx2::<4, 8>(&mut wide, &src)),
                    )
                };
                assert_eq!((a, b), (c, d), "{n} units");
                assert!(portable == wide, "{n} units");
            }
            assert_eq!((a.is_some(), b.is_some()), (n > 0, n > 0), "{n} units");
            assert_eq!(portable.iter().map(|&c| c as usize).sum::<usize>(), 2 * n);
        }
    }

    /// Blocks of 2- and 4-byte units counted from the units (`count_units`) give what a split
    /// and `count` give for the top two planes — both planes' histograms, the joint counts
    /// (none where the lower plane is one repeated byte, and no rows made for them), and the
    /// number of rows — for bf16's transform and none, and fp32 units, at lengths around the
    /// 32-unit steps up to the largest piece, with few and many exponent bytes, a zero among
    /// large exponents (a wide span of mostly absent rows), and the lower plane constant. Each
    /// block alone, and all of them in sequence with their counts pending across blocks (more
    /// than a piece in all, so that pending counts are added on the way; every fifth block
    /// counted again from split planes in between, which adds what is pending first): the same
    /// histograms block by block and, at the end, the same joint counts.
    #[test]
    fn units_count_as_split_planes() {
        let mut r = crate::model::tests::rng(9);
        let mut cases: Vec<Vec<u16>> = Vec::new();
        for n in [1usize, 2, 31, 32, 33, 64, 95, 4096, 4097, PIECE] {
            cases.push((0..n).map(|_| 0x3C00 + (r() % 0x300) as u16).collect());
            cases.push((0..n).map(|_| r() as u16).collect());
        }
        let mut wide: Vec<u16> = (0..4096).map(|_| 0x3F00 | (r() % 256) as u16).collect();
        wide[17] = 0;
        cases.push(wide);
        // Plane 0 constant after bf16's transform (sign 0, mantissa 0x25) and without one.
        cases.push(
            (0..5000)
                .map(|_| ((r() % 9) as u16 + 120) << 7 | 0x25)
                .collect(),
        );
        cases.push(
            (0..5000)
                .map(|_| ((r() % 9) as u16 + 60) << 8 | 0x25)
                .collect(),
        );
        cases.push(vec![0xBF80; 300]);
        let mut unit_joint = BlockJoint::new();
        let mut split_joint = BlockJoint::new();
        let sbe = crate::dtype::Transform::SignBelowExponent { exp_bits: 8 };
        let configs = [
            (2, 8, sbe),
            (2, 0, crate::dtype::Transform::Identity),
            (4, 8, sbe),
        ];
        // Per configuration: the counters of the blocks in sequence, their joint counts, and
        // the joint counts wanted.
        let mut seq: Vec<(BlockJoint, JointCounts, JointCounts)> = configs
            .iter()
            .map(|_| Default::default())
            .map(|(a, b)| (BlockJoint::new(), a, b))
            .collect();
        for (i, units) in cases.iter().enumerate() {
            // As 2-byte units (bf16's transform, none), and as the top halves of fp32 units
            // below which random bytes lie.
            let src2: Vec<u8> = units.iter().flat_map(|u| u.to_le_bytes()).collect();
            let src4: Vec<u8> = units
                .iter()
                .flat_map(|&u| ((u as u32) << 16 | (r() as u32 & 0xFFFF)).to_le_bytes())
                .collect();
            for (c, &(us, e, t)) in configs.iter().enumerate() {
                let src = if us == 2 { &src2 } else { &src4 };
                let (mut hp, mut hq, mut joint) =
                    ([0u32; 256], [0u32; 256], JointCounts::default());
                let rows = unit_joint.count_units_of((us, e), src, &mut hp, &mut hq, &mut joint);
                unit_joint.flush(&mut joint);
                let n = units.len();
                let mut planes = vec![vec![0u8; n]; us];
                let mut views: Vec<&mut [u8]> = planes.iter_mut().map(|v| &mut v[..]).collect();
                crate::transform::split(t, src, &mut views);
                let (p0, p1) = (&planes[us - 2], &planes[us - 1]);
                let (wq, mut wp, mut wj) = (hist(p1), [0u32; 256], JointCounts::default());
                let want_rows = wq.iter().filter(|&&c| c != 0).count();
                if p0.iter().all(|&v| v == p0[0]) {
                    wp[p0[0] as usize] = n as u32;
                } else {
                    split_joint.count(p1, p0, &wq, &mut wp, &mut wj);
                }
                let what = format!("case {i}, {n} units of {us} bytes, exponent bits {e}");
                assert_eq!((hq, hp, rows), (wq, wp, want_rows), "{what}");
                assert!(joint.dense() == wj.dense(), "{what}");
                assert_eq!(stored_rows(&joint), stored_rows(&wj), "{what}");
                assert!(unit_joint.counts.iter().all(|&c| c == 0), "{what}");
                // In sequence, after the blocks before it.
                let (bj, got, want) = &mut seq[c];
                let (mut hp, mut hq) = ([0u32; 256], [0u32; 256]);
                let rows = bj.count_units_of((us, e), src, &mut hp, &mut hq, got);
                assert_eq!((hq, hp, rows), (wq, wp, want_rows), "{what}, in sequence");
                want.add(&wj);
                if i % 5 == 4 && p0.iter().any(|&v| v != p0[0]) {
                    let mut hp = [0u32; 256];
                    bj.count(p1, p0, &wq, &mut hp, got);
                    assert_eq!(hp, wp, "{what}, split in sequence");
                    want.add(&wj);
                }
            }
        }
        for (c, (mut bj, mut got, want)) in seq.into_iter().enumerate() {
            bj.flush(&mut got);
            assert!(bj.counts.iter().all(|&c| c == 0), "configuration {c}");
            assert!(got.dense() == want.dense(), "configuration {c}");
            assert_eq!(stored_rows(&got), stored_rows(&want), "configuration {c}");
        }
    }

    /// Block by block the counts equal the plain ones, the counters are zero again after every
    /// block (so that the next block starts clean), blocks of many condition bytes (counted
    /// straight into the rows) count alike, and one pair repeated 65536 times (the largest
    /// block) does not wrap the 16-bit counters.
    #[test]
    fn block_counts_equal_plain_counts() {
        let mut r = crate::model::tests::rng(3);
        let mut bj = BlockJoint::new();
        let mut total = JointCounts::default();
        let mut want = vec![0u32; 65536];
        let blocks: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (vec![7; 65536], vec![200; 65536]),
            (
                (0..4096).map(|_| 118 + (r() % 9) as u8).collect(),
                (0..4096).map(|_| r() as u8).collect(),
            ),
            ((0..1).map(|_| 255).collect(), vec![0]),
            (
                (0..70000).map(|_| 40 + (r() % 5) as u8).collect(),
                (0..70000).map(|_| (r() % 3) as u8).collect(),
            ),
            (
                (0..5000).map(|_| r() as u8).collect(),
                (0..5000).map(|_| r() as u8).collect(),
            ),
            (
                (0..4096).map(|i| (i % FLUSH_ROWS) as u8).collect(),
                (0..4096).map(|_| r() as u8).collect(),
            ),
            (
                (0..4096)
                    .map(|i| (i % (FLUSH_ROWS + 1)) as u8 * 7)
                    .collect(),
                (0..4096).map(|_| r() as u8).collect(),
            ),
            (
                (0..333).map(|_| (r() % 2) as u8).collect(),
                (0..333).map(|_| 255 - (r() % 2) as u8).collect(),
            ),
        ];
        for (i, (e, m)) in blocks.iter().enumerate() {
            let (j, h) = reference(e, m);
            let mut got = [0u32; 256];
            bj.count(e, m, &hist(e), &mut got, &mut total);
            assert_eq!(got, h, "block {i}");
            want.iter_mut().zip(&j).for_each(|(w, &x)| *w += x);
            assert!(bj.counts.iter().all(|&c| c == 0), "block {i}");
            assert!(total.dense() == want, "block {i}");
        }
        // Rows are kept for the condition bytes that occurred only, and survive the round trip
        // through the dense form; adding counts adds them.
        let stored = stored_rows(&total);
        let present = (0..256)
            .filter(|&e| want[e << 8..][..256].iter().any(|&c| c != 0))
            .count();
        assert_eq!(stored, present);
        assert!(JointCounts::from_dense(&want).dense() == want);
        let mut twice = total.clone();
        twice.add(&total);
        assert!(twice.dense().iter().zip(&want).all(|(&a, &b)| a == 2 * b));
    }
}
