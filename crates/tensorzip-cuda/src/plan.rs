//! Host-side planning of a decode launch: blobs validated by the core's parser become per-chunk and
//! per-tensor descriptors, plus every decode table in one array. Everything the kernel indexes with
//! is checked here; what needs the payload bytes is checked by the kernel with bounded reads.

use cudarc::driver::DeviceRepr;
use tensorzip::blob::{BlobHeader, BlobLayout, PlaneMode, Scheme};
use tensorzip::dtype::Transform;

use crate::error::Result;

/// Units per block that fit the per-warp shared-memory buffers; larger blocks use global scratch.
pub const SMEM_BLOCK_UNITS: u32 = 4096;
/// Shared-memory bytes per warp for the ring of stream words, the stash and the merge's two windows
/// (`RING_STASH` in `kernels/decode.cu`).
pub const RING_STASH_BYTES: u32 = 2144;

/// Units one merge group covers (`LANES × GROUP` in decode.cu): every lane of the merge loads its
/// 16 units of a coded plane from the slot whether or not they lie inside the block, so a slot
/// must be at least this long (with 32-unit slots, blocks of 32–128 units, the lanes past the
/// block read up to 416 bytes past the last slot: other warps' buffers or past the block's
/// shared memory).
pub const MERGE_GROUP_UNITS: u32 = 512;

/// One chunk, as the kernel sees it (layout shared with `struct ChunkDesc` in decode.cu).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ChunkDesc {
    pub payload: u64,
    pub out: u64,
    pub payload_len: u32,
    pub rans_len: u32,
    pub sel_len: u32,
    pub len: u32,
    pub tensor: u32,
    /// Position of the chunk in the batch (reported by errors).
    pub index: u32,
    pub modes: [u8; 8],
    pub values: [u8; 8],
}

/// One tensor, as the kernel sees it (layout shared with `struct TensorDesc` in decode.cu).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct TensorDesc {
    pub block_units: u32,
    pub unit_size: u32,
    pub exp_bits: u32,
    pub cond_plane: u32,
    pub cond_src: u32,
    pub cond_value: u32,
    pub cond_table: u32,
    /// The paired plane (format version 2; 255 = none).
    pub pair_plane: u32,
    pub table_base: [u32; 8],
    pub n_tables: [u32; 8],
    /// Shared-memory slot of each plane that has block tables (255 = none).
    pub slot: [u32; 8],
    /// The paired plane's pairs (its escape rank `D`; 0 = none).
    pub pair_d: u32,
    /// Where they start in [`Plan::pairs`].
    pub pair_base: u32,
}

// SAFETY: plain `repr(C)` structs of integers, with the same layout as their CUDA counterparts.
unsafe impl DeviceRepr for ChunkDesc {}
// SAFETY: as above.
unsafe impl DeviceRepr for TensorDesc {}

/// A stored (uncompressed) blob: its bytes are copied as they are (layout shared with `struct
/// CopyDesc` in decode.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Copy {
    pub from: u64,
    pub to: u64,
    pub len: u64,
}

/// The decoder kernels of `kernels/decode.cu`: name, bytes per unit, exponent bits of the
/// transform (0: identity). Each is compiled for its own unit size and transform so that the
/// merge's loops unroll and each gets its own register allocation.
pub const KERNELS: [(&str, u32, u32); 7] = [
    ("tz_decode_1", 1, 0),
    ("tz_decode_2", 2, 0),
    ("tz_decode_2e8", 2, 8),
    ("tz_decode_4", 4, 0),
    ("tz_decode_4e8", 4, 8),
    ("tz_decode_8", 8, 0),
    ("tz_decode_8e11", 8, 11),
];

/// The chunks of one kernel (unit size and transform): one launch.
#[derive(Default, Clone)]
pub struct Group {
    /// Index into [`KERNELS`].
    pub kernel: usize,
    /// Bytes per unit (1, 2, 4 or 8).
    pub unit_size: u32,
    pub chunks: Vec<ChunkDesc>,
    /// Shared-memory slots per warp (planes with block tables), each `slot_units` bytes.
    pub n_slots: u32,
    pub slot_units: u32,
    /// Bytes of per-warp slot and sub-segment buffers.
    pub per_warp: u32,
    /// Whether those buffers must live in global memory (blocks over `SMEM_BLOCK_UNITS` units).
    pub global_scratch: bool,
    /// The most tables one of the group's tensors has for the block's table cache (its
    /// multi-symbol block tables and its conditional table).
    pub cache_tables: u32,
}

/// Everything one decode needs: a launch per unit size, the tensors' descriptors and every table.
#[derive(Default)]
pub struct Plan {
    pub groups: Vec<Group>,
    pub tensors: Vec<TensorDesc>,
    /// Every table in its serialised form (`lo`, `hi`, the codes of `lo..=hi`; docs/FORMAT.md,
    /// validated when its blob was parsed), back to back; the device expands each into a
    /// 4096-entry decoder table (`tz_build_tables`). A bf16 table is ~40 bytes this way, against 512
    /// as 256 frequencies and 16 KiB expanded: the upload was a tenth of a small model's decode call.
    pub table_bytes: Vec<u8>,
    /// Where each table starts in `table_bytes`.
    pub table_offsets: Vec<u32>,
    /// Per table: bit 31 set for a single-symbol table, whose symbol is in the low byte.
    pub table_info: Vec<u32>,
    /// The pair tables of paired planes (format version 2), back to back: per rank, its pair's
    /// first byte | second byte << 8.
    pub pairs: Vec<u32>,
    pub copies: Vec<Copy>,
}

/// One blob of a batch: its validated layout, where its bytes start in the device buffer, and where
/// its decoded bytes go in the output buffer.
pub struct Job<'a> {
    pub layout: &'a BlobLayout,
    pub data_offset: u64,
    pub out_offset: u64,
}

/// Exponent bits of the header's transform (0: identity).
fn exp_bits_of(h: &BlobHeader) -> u32 {
    match h.dtype.transform() {
        Transform::Identity => 0,
        Transform::SignBelowExponent { exp_bits } => exp_bits,
    }
}

/// The index in [`KERNELS`] of the kernel that decodes blobs with this header.
fn kernel_of(h: &BlobHeader) -> Option<usize> {
    let (us, e) = (h.planes() as u32, exp_bits_of(h));
    KERNELS.iter().position(|&(_, u, x)| u == us && x == e)
}

impl Plan {
    /// Plans the decoding of `jobs`.
    pub fn new(jobs: &[Job<'_>]) -> Result<Plan> {
        let mut plan = Plan::default();
        let mut groups: [Group; KERNELS.len()] = Default::default();
        for (k, g) in groups.iter_mut().enumerate() {
            g.kernel = k;
            g.unit_size = KERNELS[k].1;
            g.slot_units = MERGE_GROUP_UNITS;
        }
        let mut n_chunks = 0u32;
        // Room for every chunk in the group of its kernel, so that no vector grows while planning
        // (a model's plan holds thousands of descriptors).
        let mut want = [0usize; KERNELS.len()];
        for job in jobs {
            if let Some(k) = kernel_of(&job.layout.header) {
                want[k] += job.layout.entries.len();
            }
        }
        for (g, &n) in groups.iter_mut().zip(&want) {
            g.chunks.reserve_exact(n);
        }
        for job in jobs {
            let l = job.layout;
            let h = &l.header;
            if h.scheme == Scheme::Stored {
                plan.copies.push(Copy {
                    from: job.data_offset + l.payload_start as u64,
                    to: job.out_offset,
                    len: h.nbytes(),
                });
                continue;
            }
            let us = h.planes();
            let exp_bits = exp_bits_of(h);
            let Some(k) = kernel_of(h) else {
                return Err(crate::error::Error::Unsupported(format!(
                    "no decoder kernel for {us}-byte units with a {exp_bits}-bit exponent transform"
                )));
            };
            let group = &mut groups[k];
            // A slot holds the longest block of this tensor's chunks — the block size, unless the
            // chunks or the tensor are shorter — in whole merge groups. (Sized by the block size
            // alone, a forged blob of 65536-unit blocks in one-unit chunks, ~10 bytes a chunk,
            // asked for 64 KiB of global scratch per chunk: 61 GiB for a 10 MB blob.)
            let longest = (h.block_units as u64)
                .min(h.chunk_units as u64)
                .min(h.units()) as u32;
            group.slot_units = group
                .slot_units
                .max(longest.next_multiple_of(MERGE_GROUP_UNITS));
            let mut td = TensorDesc {
                block_units: h.block_units,
                unit_size: us as u32,
                exp_bits,
                cond_plane: 255,
                pair_plane: 255,
                slot: [255; 8],
                ..Default::default()
            };
            // Format version 2: the paired plane's pairs (the parser allows bf16's plane 1 only,
            // 2..=128 distinct pairs), which the kernel looks ranks up in.
            if let Some((p, Some(pt))) = l.paired_plane().map(|p| (p, l.pairs[p].as_ref())) {
                td.pair_plane = p as u32;
                td.pair_d = pt.escape() as u32;
                td.pair_base = plan.pairs.len() as u32;
                plan.pairs
                    .extend(pt.pairs().iter().map(|&[a, b]| a as u32 | (b as u32) << 8));
            }
            let mut n_slots = 0;
            for p in 0..us {
                td.table_base[p] = plan.table_info.len() as u32;
                td.n_tables[p] = l.tables[p].len() as u32;
                if !l.tables[p].is_empty() {
                    td.slot[p] = n_slots;
                    n_slots += 1;
                }
                for t in &l.tables[p] {
                    plan.push_table(t);
                }
            }
            group.n_slots = group.n_slots.max(n_slots);
            let mut cacheable = l.tables[..us]
                .iter()
                .flatten()
                .filter(|t| !t.is_single())
                .count() as u32;
            if let Some((p, q)) = h.dtype.conditioned_plane() {
                if let Some((v, t)) = &l.cond[p] {
                    td.cond_plane = p as u32;
                    td.cond_src = q as u32;
                    td.cond_value = *v as u32;
                    td.cond_table = plan.table_info.len() as u32;
                    plan.push_table(t);
                    cacheable += 1;
                }
            }
            group.cache_tables = group.cache_tables.max(cacheable);
            let tensor = plan.tensors.len() as u32;
            plan.tensors.push(td);
            // Per chunk, only what differs (a 1 GiB tensor has 8192 chunks, and this loop runs on
            // every batch decode call before the launch).
            let (cu, bu, units) = (h.chunk_units as u64, h.block_units as u64, h.units());
            for (c, (e, &off)) in l.entries.iter().zip(&l.offsets).enumerate() {
                let len = units.saturating_sub(c as u64 * cu).min(cu);
                let nb = len.div_ceil(bu) as u32;
                let mut d = ChunkDesc {
                    payload: job.data_offset + off as u64,
                    out: job.out_offset + c as u64 * cu * us as u64,
                    payload_len: e.payload_len,
                    rans_len: e.rans_len,
                    sel_len: 0,
                    len: len as u32,
                    tensor,
                    index: n_chunks,
                    ..Default::default()
                };
                let mut blocks_planes = 0u32;
                for p in 0..us {
                    let (m, v) = match e.modes[p] {
                        PlaneMode::Raw => (0, 0),
                        PlaneMode::Const(v) => (1, v),
                        PlaneMode::Blocks => (2, 0),
                        PlaneMode::Cond => (3, 0),
                    };
                    d.modes[p] = m;
                    d.values[p] = v;
                    blocks_planes += (m == 2) as u32;
                }
                d.sel_len = nb * blocks_planes;
                if (e.payload_len as u64) < d.sel_len as u64 + e.rans_len as u64 {
                    return Err(tensorzip::Error::Corrupt(format!(
                        "chunk {c}: payload shorter than its selectors and stream"
                    ))
                    .into());
                }
                n_chunks += 1;
                group.chunks.push(d);
            }
        }
        for mut g in groups {
            if g.chunks.is_empty() {
                continue;
            }
            // Per warp: the slots and the sub-segment (+32: the merge reads 20 bytes from any
            // offset below `slot_units`); the word ring and the stash are always in shared memory
            // (`RING_STASH_BYTES`).
            let per = g.n_slots * g.slot_units + g.slot_units + 32;
            g.per_warp = per.div_ceil(16) * 16;
            g.global_scratch = g.slot_units > SMEM_BLOCK_UNITS;
            plan.groups.push(g);
        }
        Ok(plan)
    }

    fn push_table(&mut self, t: &tensorzip::rans::table::FreqTable) {
        if t.is_single() {
            self.table_info.push(1 << 31 | t.single_symbol() as u32);
        } else {
            self.table_info.push(0);
        }
        self.table_offsets.push(self.table_bytes.len() as u32);
        t.write(&mut self.table_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensorzip::{compress, sample, CompressOptions, DType};

    /// 16-bit units whose two byte planes drift every 4096 units: several tables per plane.
    fn drifting_i16(n: usize) -> Vec<u8> {
        let mut rng = sample::Rng::new(5);
        (0..2 * n)
            .map(|k| {
                let m = 3 + 5 * (k as u64 % 2) + 6 * ((k / 2 / 4096) % 8) as u64;
                let r = rng.next_u64();
                ((r % m) + ((r >> 32) % m)) as u8
            })
            .collect()
    }

    /// Tables the kernel's block cache takes for a blob: multi-symbol block tables and the
    /// conditional table.
    fn cacheable(l: &BlobLayout) -> u32 {
        let blocks = l.tables.iter().flatten().filter(|t| !t.is_single()).count();
        (blocks + l.cond.iter().flatten().count()) as u32
    }

    /// The plan of one blob.
    fn plan_of(blob: &[u8]) -> Plan {
        let layout = BlobLayout::parse(blob, blob.len()).unwrap();
        let job = Job {
            layout: &layout,
            data_offset: 0,
            out_offset: 0,
        };
        Plan::new(&[job]).unwrap()
    }

    /// A blob with a paired exponent plane (format version 2) is planned with its pair table,
    /// which the kernel looks ranks up in; the option that asks the GPU encoder for one is refused
    /// (it writes version 1 only so far).
    #[test]
    fn paired_planes_carry_their_pairs() {
        let data = sample::weights(64, 1024, DType::BF16, 3);
        let opts = CompressOptions {
            pair_exponents: true,
            ..CompressOptions::default()
        };
        let blob = tensorzip::compress(&data, DType::BF16, &[64, 1024], &opts).unwrap();
        let layout = BlobLayout::parse(&blob, blob.len()).unwrap();
        let pt = layout.pairs[1]
            .as_ref()
            .expect("the blob pairs its exponents");
        let plan = plan_of(&blob);
        let td = &plan.tensors[0];
        assert_eq!(
            (td.pair_plane, td.pair_d, td.pair_base),
            (1, pt.escape() as u32, 0)
        );
        let want: Vec<u32> = pt
            .pairs()
            .iter()
            .map(|&[a, b]| a as u32 | (b as u32) << 8)
            .collect();
        assert_eq!(plan.pairs, want);
        // A second paired tensor's pairs follow the first's; an unpaired one has none.
        let v1_opts = CompressOptions {
            pair_exponents: false,
            ..CompressOptions::default()
        };
        let v1 = tensorzip::compress(&data, DType::BF16, &[64, 1024], &v1_opts).unwrap();
        let (l2, l3) = (
            BlobLayout::parse(&blob, blob.len()).unwrap(),
            BlobLayout::parse(&v1, v1.len()).unwrap(),
        );
        let job = |l, at| Job {
            layout: l,
            data_offset: at,
            out_offset: at,
        };
        let plan = Plan::new(&[job(&layout, 0), job(&l3, 1 << 20), job(&l2, 2 << 20)]).unwrap();
        let d = pt.escape() as u32;
        assert_eq!(plan.tensors[1].pair_plane, 255);
        assert_eq!(plan.tensors[1].pair_d, 0);
        assert_eq!((plan.tensors[2].pair_d, plan.tensors[2].pair_base), (d, d));
        assert_eq!(plan.pairs.len(), 2 * d as usize);
    }

    /// The merge's loads stay inside the warp's buffer for blobs of small blocks too.
    #[test]
    fn slots_hold_a_merge_group_whatever_the_blocks() {
        let data = sample::weights(1, 10_001, DType::BF16, 7);
        for block_units in [32, 64, 128, 256, 512, 1024] {
            let opts = CompressOptions {
                block_units,
                ..CompressOptions::default()
            };
            let blob = compress(&data, DType::BF16, &[10_001], &opts).unwrap();
            let plan = plan_of(&blob);
            for g in &plan.groups {
                assert!(g.slot_units >= MERGE_GROUP_UNITS.max(block_units));
                assert_eq!(g.slot_units % MERGE_GROUP_UNITS, 0);
                // The last slot's merge reads end inside the warp's buffer.
                let last = g.n_slots.max(1) - 1;
                assert!(last * g.slot_units + MERGE_GROUP_UNITS <= g.per_warp);
            }
        }
    }

    /// Slots are as long as the longest block a chunk has, not the block size: a blob of large
    /// blocks in short chunks (or a short tensor) needs no scratch for blocks it cannot have.
    #[test]
    fn slots_hold_the_longest_block_not_the_block_size() {
        let data = sample::weights(1, 20_000, DType::BF16, 9);
        // (block units, chunk bytes, elements) -> slot units.
        for (block_units, chunk_bytes, n, want) in [
            (65536, 2048, 20_000, 1024),      // chunks of 1024 units
            (65536, 1 << 20, 20_000, 20_480), // the tensor, 20,000 units
            (65536, 1 << 20, 1000, 1024),     // a short tensor
            (4096, 2048, 20_000, 1024),
            (1024, 1 << 20, 20_000, 1024),
        ] {
            let opts = CompressOptions {
                block_units,
                chunk_bytes,
                min_compress_bytes: 0,
                ..CompressOptions::default()
            };
            let blob = compress(&data[..2 * n], DType::BF16, &[n as u64], &opts).unwrap();
            let plan = plan_of(&blob);
            assert_eq!(plan.groups.len(), 1, "{block_units} {chunk_bytes} {n}");
            assert_eq!(
                plan.groups[0].slot_units, want,
                "{block_units} {chunk_bytes} {n}"
            );
        }
    }

    #[test]
    fn groups_know_the_most_tables_one_tensor_caches() {
        let opts = CompressOptions::default();
        let many = compress(&drifting_i16(70_001), DType::I16, &[70_001], &opts).unwrap();
        let few = compress(
            &sample::weights(1, 70_001, DType::BF16, 3),
            DType::BF16,
            &[70_001],
            &opts,
        )
        .unwrap();
        let weights32 = sample::weights(1, 70_001, DType::F32, 4);
        let cond = compress(&weights32, DType::F32, &[70_001], &opts).unwrap();
        let lay = |b: &[u8]| BlobLayout::parse(b, b.len()).unwrap();
        let (lm, lf, lc) = (lay(&many), lay(&few), lay(&cond));
        // The drifting tensor needs more than the cache's floor of 10 tables; the fp32 weights
        // have a conditional table.
        assert!(cacheable(&lm) > 10, "{}", cacheable(&lm));
        assert!(lc.cond.iter().flatten().count() == 1);
        let job = |l, at| Job {
            layout: l,
            data_offset: at,
            out_offset: at,
        };
        // I16 and BF16 share no kernel (the transform differs): one group each.
        let plan = Plan::new(&[job(&lf, 0), job(&lm, 1 << 20), job(&lc, 2 << 20)]).unwrap();
        let of = |k: &str| {
            plan.groups
                .iter()
                .find(|g| KERNELS[g.kernel].0 == k)
                .unwrap()
                .cache_tables
        };
        assert_eq!(of("tz_decode_2"), cacheable(&lm));
        assert_eq!(of("tz_decode_2e8"), cacheable(&lf));
        assert_eq!(of("tz_decode_4e8"), cacheable(&lc));
        // Two tensors of one kernel: the larger count, whichever comes first.
        let small = compress(&drifting_i16(4096), DType::I16, &[4096], &opts).unwrap();
        let ls = lay(&small);
        assert!(cacheable(&ls) < cacheable(&lm));
        for jobs in [
            [job(&ls, 0), job(&lm, 1 << 20)],
            [job(&lm, 0), job(&ls, 1 << 20)],
        ] {
            let plan = Plan::new(&jobs).unwrap();
            assert_eq!(plan.groups[0].cache_tables, cacheable(&lm));
        }
    }
}
