// tensorzip GPU encoder (docs/FORMAT.md, sections 3-5 and 7 "Encoder decisions").
//
// The bytes written are exactly the CPU engine's: every decision below is the integer algorithm of
// FORMAT.md section 7, and the tables are the core's `model::model_from_counts` decisions, made by
// the table search (kernels/search.cu; the host's own code with TENSORZIP_DEV_HOST_SEARCH=1) from
// the sampled blocks' histograms counted here.
//
// Kernels:
//   tz_hist_*     one thread block per up to 16 sampled blocks of a tensor: per-plane histograms (and
//                 the joint counts of the conditioned plane with its condition plane) for the model;
//   tz_encode_*   one warp per chunk: block selectors, plane modes, raw area, conditioned split and
//                 the 32-lane rANS stream, into a per-chunk scratch slot; reports the chunk's sizes
//                 (to device memory, and to the host's mapped page-locked buffer);
//   tz_place      one thread block per wave: checks the reported sizes and turns them into each
//                 chunk's place in its blob (a prefix sum per tensor, carried from wave to wave);
//   tz_compact    one thread block per chunk: copies the slot's pieces to the chunk's place in the
//                 blob (skipped for the whole wave if tz_place found a size it cannot trust);
//   tz_crc32      one warp per piece: CRC-32 (zlib) of each piece of a buffer.
//   tz_crc32_list one warp per range: CRC-32 of each of a list of device ranges.
//
// Inputs are the tensor's bytes (aligned to the unit size; the host checks) and tables the host
// built. The encoder reads only units of its own chunk and writes only its own slot.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL 0xFFFFFFFFu
#define SEL_CONST 254u
#define SEL_RAW 255u
#define MODE_RAW 0u
#define MODE_CONST 1u
#define MODE_BLOCKS 2u
#define MODE_COND 3u
#define CL_ABSENT 0xFFFFFFFFu

// One tensor of a batch (shared with `EncParams` in src/encode.rs).
struct EncParams {
    u64 units;            // units of the tensor
    u64 blocks_per_chunk;
    u32 chunk_units;
    u32 block_units;
    u32 threshold;        // passthrough threshold, Q16
    u32 cond_plane;       // plane with a conditional table (255 = none)
    u32 cond_src;         // its condition plane
    u32 cond_value;
    u32 cond_table;       // global index of the conditional table
    u32 joint_plane;      // tz_hist: plane whose joint counts are wanted (255 = none)
    u32 joint_src;
    u32 cap_words;        // words a slot holds
    u64 off_sels;         // slot layout (bytes from the slot's start)
    u64 off_coff;
    u64 off_states;
    u64 off_area;
    u64 off_csyms;
    u64 off_words;
    u64 off_stage;        // the block's planes, when they do not fit in shared memory
    u32 table_base[8];
    u32 n_tables[8];
    u64 dst_base;         // tz_place: device address of the tensor's first payload byte in its blob
    u64 dst_cap;          // tz_place: payload bytes its blob has room for
    u64 pair;             // format version 2: device address of the paired plane's `PairBlock`, 0 = none
    u64 off_esc;          // slot layout: a paired block's escape group (block_units bytes)
};

// A paired plane's coding tables (format version 2; written by `tz_pair_table` and
// `tz_pair_decide` in search.cu, or by `pair_model::pair_block` on the host, PAIR_HEAD there): the
// top bytes' index of each byte (16 for others), the rank of each pair of such indices, row a and
// column b at rank[17 a + b] (the escape D where a or b is 16, or for pairs not in the table), the
// model's key ranks (16 a + b, which this kernel does not read), the escape rank D, then the rank
// tables' entries (as `tz_enc_tables` writes a table's: 256 per table, table j's at
// entries[256 j]). The 17 x 17 ranks make a pair's rank three loads and a multiply-add.
struct PairBlock {
    u8 top[256];
    u8 rank[304];
    u8 key_rank[256];
    u32 escape;
    u32 pad[3];
};
#define PAIR_MAPS 560u  // the top map and the ranks: what the kernel copies to shared memory
// Where phase 1 keeps a paired block's 16 top-byte counts in the warp's 4 KiB of histogram space:
// above the histograms of bf16's two planes (2 KiB) and the maps copied after them (PAIR_MAPS).
#define PAIR_TOP_COUNTS (2048u + PAIR_MAPS + 16u)
#define PAIR_ENTRIES_AT 832u

// One chunk of a batch: one warp (shared with `EncJob` in src/encode.rs).
struct EncJob {
    u64 data;             // device address of the tensor (aligned to 16 bytes)
    u64 chunk;            // chunk index in the tensor
    u64 slot;             // byte offset of the chunk's slot in the scratch
    u64 dst;              // tz_compact: device address of the chunk's payload in its blob (by tz_place)
    u32 tensor;           // index of its EncParams
    u32 seg;              // index in its wave of the wave's first job of the same tensor
};

// What the encoder reports per chunk (shared with `ChunkOut` in src/encode.rs).
struct ChunkOut {
    u32 payload_len;
    u32 rans_len;
    u32 sel_len;
    u32 kept;             // raw-area bytes in the payload
    u32 n_words;
    u32 nb;
    u32 pad[2];
    u8 modes[8];
    u8 values[8];
};

__device__ __forceinline__ u32 lanemask_lt() {
    u32 m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}
__device__ __forceinline__ u32 lanemask_gt() {
    u32 m;
    asm("mov.u32 %0, %%lanemask_gt;" : "=r"(m));
    return m;
}

// The forward transform of a unit of U bytes (FORMAT.md section 2); E = 0 is the identity.
template <int U, int E>
__device__ __forceinline__ u64 fwd(u64 u) {
    if constexpr (E == 0) {
        return u;
    } else {
        constexpr u32 M = 8 * U - 1 - E;
        return ((u << 1) & (((1ull << E) - 1) << (M + 1))) | ((u >> E) & (1ull << M)) | (u & ((1ull << M) - 1));
    }
}

// Transformed unit `i` (the input is aligned to U bytes).
template <int U, int E>
__device__ __forceinline__ u64 unit(const u8* __restrict__ src, u64 i) {
    u64 u;
    if (U == 1) u = __ldg(src + i);
    else if (U == 2) u = __ldg((const u16*)src + i);
    else if (U == 4) u = __ldg((const u32*)src + i);
    else u = __ldg((const unsigned long long*)src + i);
    return fwd<U, E>(u);
}

__device__ __forceinline__ u32 byte_of(u64 t, u32 p) { return (u32)(t >> (8 * p)) & 0xFFu; }

// ---------------------------------------------------------------------------------------------
// Sampled-block histograms, for every tensor of a batch in one launch. A thread block takes up to
// PICKS_PER_BLOCK sampled blocks of one tensor (`HistJob`): the histograms of each go out as they
// are; the joint counts of the tensor's conditioned plane are gathered over all of them in shared
// memory as 16-bit counters (65536 x 2 bytes) and added to the tensor's global counts once; with
// larger blocks, or more picks, they go to global memory directly. The 16-bit counters cannot
// overflow: a block adds joint counts only where its conditioned plane is not one repeated byte,
// so no key gets more than 4095 of a block of at most 4096 units, and 16 x 4095 < 65536.

#define PICKS_PER_BLOCK 16

// Shared with `HistJob` in src/encode.rs.
struct HistJob {
    u64 data;             // the tensor (aligned to its unit size)
    u64 first;            // index of its first pick in `picks` and `hists`
    u32 n;                // picks of this job
    u32 tensor;           // index of its EncParams
    u64 joint;            // offset of its joint counts in `joint` (u32 units)
};

// A unit held in a register: 32 bits up to 4-byte units, 64 for 8-byte ones.
template <int U> struct UnitReg { typedef u32 type; };
template <> struct UnitReg<8> { typedef u64 type; };

// The PER = 16 / U units of one 16-byte load, transformed.
template <int U, int E>
__device__ __forceinline__ void units_of(const uint4 v, typename UnitReg<U>::type (&t)[16 / U]) {
    constexpr u32 PER = 16 / U;
    const u32 w[4] = {v.x, v.y, v.z, v.w};
    #pragma unroll
    for (u32 k = 0; k < PER; k++) {
        u64 u;
        if (U == 8) u = (u64)w[2 * k] | ((u64)w[2 * k + 1] << 32);
        else if (U == 4) u = w[k];
        else if (U == 2) u = (w[k / 2] >> (16 * (k & 1))) & 0xFFFFu;
        else u = (w[k / 4] >> (8 * (k & 3))) & 0xFFu;
        t[k] = (typename UnitReg<U>::type)fwd<U, E>(u);
    }
}

// The address of the one 16-byte load that holds units base .. base + 16 / U of a sampled block of
// `len` units from unit `start` of `data`, where they are all inside the block and the address is
// aligned; else null (the caller then reads unit by unit).
template <int U>
__device__ __forceinline__ const uint4* whole_load(const u8* __restrict__ data, u64 start, u32 len, u32 base) {
    constexpr u32 PER = 16 / U;
    if (base >= len || len - base < PER) return nullptr;
    const u8* p = data + (start + base) * U;
    return ((unsigned long long)p & 15) == 0 ? (const uint4*)p : nullptr;
}

// The transformed units base .. base + 16 / U of a sampled block of `len` units from unit `start`
// of `data` (those inside it: the count is returned), with one 16-byte load where `whole_load`
// finds one, else unit by unit.
template <int U, int E>
__device__ __forceinline__ u32 load_units(const u8* __restrict__ data, u64 start, u32 len, u32 base,
                                          typename UnitReg<U>::type (&t)[16 / U]) {
    constexpr u32 PER = 16 / U;
    const u32 n = base < len ? min(PER, len - base) : 0u;
    if (const uint4* p = whole_load<U>(data, start, len, base)) {
        units_of<U, E>(__ldg(p), t);
    } else {
        #pragma unroll
        for (u32 k = 0; k < PER; k++) t[k] = k < n ? (typename UnitReg<U>::type)unit<U, E>(data, start + base + k) : 0;
    }
    return n;
}

// Each thread takes 16 bytes of a sampled block a round (one load); a block of at most one round
// keeps its units in registers for the joint counts. Where every block of the tensor fits half the
// thread block (4096 units of one or two bytes: a bf16 block fills 512 threads, an fp32 one 1024),
// the halves count two sampled blocks at once, each into its own histograms (since 2026-12-02: a
// bf16 block kept only 512 of the 1024 threads busy, and each sampled block was a chain of a load
// and three barriers). Since 2026-12-04 the picks' ranges are read once into shared memory and a
// round's 16-byte loads are issued a round ahead, so that a round no longer waits for its pick,
// then its units, then the block's first unit (for `want`) one after the other: on the H200, 1
// GiB bf16 (8 tensors), the counting step ended at 0.123-0.136 ms of the call's stream against
// 0.152-0.161 (event traces, three each), encode calls 301.7-306.2 against 299.5-304.1 GB/s
// (five alternating rounds; docs/BENCHMARKS.md).
template <int U, int E>
__device__ void hist_entry(const HistJob* __restrict__ jobs, const EncParams* __restrict__ params,
                           const u64* __restrict__ picks, u32* __restrict__ hists, u32* __restrict__ joint_all,
                           u32 joint_smem) {
    constexpr u32 PER = 16 / U;
    typedef typename UnitReg<U>::type UT;
    __shared__ u32 hh[2][U * 256];
    __shared__ u32 any_joint;
    __shared__ u64 pick_start[PICKS_PER_BLOCK];
    __shared__ u32 pick_len[PICKS_PER_BLOCK];
    __shared__ UT first_unit[2];
    extern __shared__ uint4 dyn4[];
    u32* sj4 = (u32*)dyn4;
    const HistJob job = jobs[blockIdx.x];
    const EncParams* P = params + job.tensor;
    const u8* data = (const u8*)job.data;
    const u32 jp = P->joint_plane, jq = P->joint_src;
    u32* joint = joint_all + job.joint;
    const bool use_smem = joint_smem && jp < (u32)U && job.n <= PICKS_PER_BLOCK && P->block_units <= 4096;
    if (use_smem) {
        for (u32 k = threadIdx.x; k < 32768; k += blockDim.x) sj4[k] = 0;
    }
    if (threadIdx.x == 0) any_joint = 0;
    // The sampled block `q`'s first unit and length.
    auto range = [&](u32 q, u64& start, u32& len) {
        const u64 g = picks[job.first + q];
        const u64 c = g / P->blocks_per_chunk, b = g % P->blocks_per_chunk;
        start = c * P->chunk_units + b * P->block_units;
        const u64 chunk_end = min((c + 1) * (u64)P->chunk_units, P->units);
        const u64 end = min(start + P->block_units, chunk_end);
        len = (u32)(end - start);
    };
    // Every pick's range once, in shared memory (the host gives a job at most PICKS_PER_BLOCK
    // picks; a longer job finds its ranges as it goes): each round then waits for no pick.
    const bool staged = job.n <= PICKS_PER_BLOCK;
    if (staged && threadIdx.x < job.n) {
        u64 start;
        u32 len;
        range(threadIdx.x, start, len);
        pick_start[threadIdx.x] = start;
        pick_len[threadIdx.x] = len;
    }
    __syncthreads();
    auto pick = [&](u32 q, u64& start, u32& len) {
        start = 0;
        len = 0;
        if (q >= job.n) return;
        if (staged) {
            start = pick_start[q];
            len = pick_len[q];
        } else {
            range(q, start, len);
        }
    };
    // Groups: two when the longest block (a block, or a chunk shorter than one) fits half the threads.
    const u64 longest = min((u64)P->block_units, (u64)P->chunk_units);
    const u32 ng = longest <= (u64)(blockDim.x / 2) * PER ? 2u : 1u;
    const u32 gsize = blockDim.x / ng, grp = threadIdx.x / gsize, gt = threadIdx.x % gsize;
    u32* h = hh[grp];
    const u32 span = gsize * PER;
    // A thread's 16 bytes of sampled block `q` where the block is one round and `whole_load` finds
    // them: loaded a round ahead, so that a round counts from registers while the next round's
    // load is in flight (else the round loads its units itself, as `load_units` does).
    auto ahead = [&](u32 q, uint4& v) -> bool {
        u64 start;
        u32 len;
        pick(q, start, len);
        if (len > span) return false;
        const uint4* p = whole_load<U>(data, start, len, gt * PER);
        if (!p) return false;
        v = __ldg(p);
        return true;
    };
    uint4 next = make_uint4(0, 0, 0, 0);
    bool next_ok = ahead(grp, next);
    for (u32 q0 = 0; q0 < job.n; q0 += ng) {
        const u32 q = q0 + grp;
        const bool active = q < job.n;
        u64 start;
        u32 len;
        pick(q, start, len);
        const uint4 cur = next;
        const bool cur_ok = next_ok;
        next_ok = ahead(q + ng, next);
        const bool one_round = len <= span;
        for (u32 k = gt; k < U * 256; k += gsize) h[k] = 0;
        __syncthreads();
        // The units a thread holds: the last 16 bytes it counted (all of its units where the
        // block is one round).
        UT kept[PER];
        u32 n_kept = 0;
        // Counts the first `n` of the held units into the group's histograms.
        auto count_kept = [&](u32 n) {
            #pragma unroll
            for (u32 k = 0; k < PER; k++) {
                if (k < n) {
                    #pragma unroll
                    for (int p = 0; p < U; p++) atomicAdd(&h[p * 256 + byte_of(kept[k], p)], 1u);
                }
            }
        };
        if (cur_ok) {
            units_of<U, E>(cur, kept);
            n_kept = PER;
            count_kept(PER);
            if (gt == 0) first_unit[grp] = kept[0];
        } else {
            for (u32 base = gt * PER; base < len; base += span) {
                n_kept = load_units<U, E>(data, start, len, base, kept);
                count_kept(n_kept);
                if (base == 0) first_unit[grp] = kept[0];
            }
        }
        __syncthreads();
        if (active) {
            u32* out = hists + (job.first + q) * U * 256;
            for (u32 k = gt; k < U * 256; k += gsize) out[k] = h[k];
        }
        // Joint counts only where the plane is not one repeated byte (the block's first unit was
        // kept in shared memory by the thread that counted it).
        const bool want = active && len > 0 && jp < (u32)U && h[jp * 256 + byte_of(first_unit[grp], jp)] != len;
        __syncthreads();
        if (!want) continue;
        if (gt == 0) any_joint = 1;
        for (u32 base = gt * PER; base < len; base += span) {
            UT t[PER];
            u32 n = n_kept;
            if (one_round) {
                #pragma unroll
                for (u32 k = 0; k < PER; k++) t[k] = kept[k];
            } else {
                n = load_units<U, E>(data, start, len, base, t);
            }
            #pragma unroll
            for (u32 k = 0; k < PER; k++) {
                if (k >= n) continue;
                const u32 key = (byte_of(t[k], jq) << 8) | byte_of(t[k], jp);
                // 16-bit counter `key` inside a 32-bit word: no carry crosses into the other counter.
                if (use_smem) atomicAdd(&sj4[key >> 1], 1u << (16 * (key & 1)));
                else atomicAdd(&joint[key], 1u);
            }
        }
    }
    __syncthreads();
    if (use_smem && any_joint) {
        for (u32 k = threadIdx.x; k < 32768; k += blockDim.x) {
            const u32 w = sj4[k];
            if (w & 0xFFFFu) atomicAdd(&joint[2 * k], w & 0xFFFFu);
            if (w >> 16) atomicAdd(&joint[2 * k + 1], w >> 16);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Chunk encoder.

__device__ __forceinline__ u64 warp_sum64(u64 v) {
    #pragma unroll
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(FULL, v, d);
    return v;
}

// FORMAT.md section 7, *choose*: the covering table of least cost (lowest index among ties) if its
// cost is below the threshold's fraction of the raw cost, else raw. `h` is the block's histogram of
// the plane (shared memory). This is the general form, in 64-bit sums; `choose` takes it only for
// blocks too long for 32-bit ones.
// With COST, the chosen table's cost (Q16 bits) goes to `*cost` (a paired plane weighs its escapes
// against it).
template <bool COST = false>
__device__ u32 choose64(const u32* h, u32 blen, const u32* __restrict__ cls, u32 base, u32 nt, u32 threshold, int lane,
                        u64* cost_out = nullptr) {
    u32 hv[8];
    #pragma unroll
    for (int k = 0; k < 8; k++) hv[k] = h[lane * 8 + k];
    u64 best = 0;
    u32 bj = SEL_RAW;
    for (u32 j = 0; j < nt; j++) {
        const u32* cl = cls + (u64)(base + j) * 256 + lane * 8;
        u64 cost = 0;
        bool ok = true;
        #pragma unroll
        for (int k = 0; k < 8; k++) {
            if (hv[k]) {
                const u32 l = __ldg(cl + k);
                ok &= l != CL_ABSENT;
                cost += (u64)hv[k] * l;
            }
        }
        ok = __all_sync(FULL, ok);
        cost = warp_sum64(cost);
        if (ok && (bj == SEL_RAW || cost < best)) {
            best = cost;
            bj = j;
        }
    }
    const u64 raw = (u64)(8 * blen) << 16;
    if constexpr (COST) *cost_out = best;
    if (bj != SEL_RAW && (best << 16) < (u64)threshold * raw) return bj;
    return SEL_RAW;
}

// Longest block whose cost under any table fits in 32 bits: a present symbol's code length is at
// most 12 << 16 bits (frequency 1), and 5461 * (12 << 16) < 2^32.
#define CHOOSE32_MAX_LEN 5461u

// Sums of one value per table, 8 tables per lane, over the warp, scattered: lane `l` ends with the
// sum for table ((l >> 4) & 1) * 4 + ((l >> 3) & 1) * 2 + ((l >> 2) & 1) (9 shuffles where 8 plain
// sums take 40). `op` adds or ors.
template <typename Op>
__device__ __forceinline__ u32 scatter_sum8(u32 (&v)[8], int lane, Op op) {
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        const bool up = lane & 16;
        const u32 send = up ? v[i] : v[i + 4], keep = up ? v[i + 4] : v[i];
        v[i] = op(keep, __shfl_xor_sync(FULL, send, 16));
    }
    #pragma unroll
    for (int i = 0; i < 2; i++) {
        const bool up = lane & 8;
        const u32 send = up ? v[i] : v[i + 2], keep = up ? v[i + 2] : v[i];
        v[i] = op(keep, __shfl_xor_sync(FULL, send, 8));
    }
    const bool up = lane & 4;
    const u32 send = up ? v[0] : v[1], keep = up ? v[1] : v[0];
    u32 r = op(keep, __shfl_xor_sync(FULL, send, 4));
    r = op(r, __shfl_xor_sync(FULL, r, 2));
    return op(r, __shfl_xor_sync(FULL, r, 1));
}

// `choose64` for blocks of at most CHOOSE32_MAX_LEN units, the same choice: eight tables at a time,
// each lane's 8 code lengths in two 16-byte loads, 32-bit costs, and a symbol the table lacks
// detected by or-ing the code lengths of the block's present symbols (CL_ABSENT has the top bit,
// no present code length has).
template <bool COST = false>
__device__ u32 choose(const u32* h, u32 blen, const u32* __restrict__ cls, u32 base, u32 nt, u32 threshold, int lane,
                      u64* cost_out = nullptr) {
    if (blen > CHOOSE32_MAX_LEN) return choose64<COST>(h, blen, cls, base, nt, threshold, lane, cost_out);
    u32 hv[8], present[8];
    #pragma unroll
    for (int k = 0; k < 8; k++) {
        hv[k] = h[lane * 8 + k];
        present[k] = hv[k] ? 0xFFFFFFFFu : 0u;
    }
    const u32 slot = ((lane >> 4) & 1) * 4 + ((lane >> 3) & 1) * 2 + ((lane >> 2) & 1);
    u64 best = ~0ull;  // (cost << 8 | table) of the lane's tables
    for (u32 j0 = 0; j0 < nt; j0 += 8) {
        u32 cost[8], absent[8];
        #pragma unroll
        for (int t = 0; t < 8; t++) {
            cost[t] = 0;
            absent[t] = 0;
            if (j0 + t < nt) {
                const uint4* cl = (const uint4*)(cls + (u64)(base + j0 + t) * 256 + lane * 8);
                const uint4 a = __ldg(cl), b = __ldg(cl + 1);
                const u32 l[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                #pragma unroll
                for (int k = 0; k < 8; k++) {
                    cost[t] += hv[k] * l[k];
                    absent[t] |= l[k] & present[k];
                }
            }
        }
        const u32 c = scatter_sum8(cost, lane, [](u32 x, u32 y) { return x + y; });
        const u32 a = scatter_sum8(absent, lane, [](u32 x, u32 y) { return x | y; });
        const u32 j = j0 + slot;
        if (j < nt && !(a >> 31)) best = min(best, (u64)c << 8 | j);
    }
    #pragma unroll
    for (int d = 4; d < 32; d <<= 1) best = min(best, (u64)__shfl_xor_sync(FULL, (long long)best, d));
    const u64 raw = (u64)(8 * blen) << 16;
    if constexpr (COST) *cost_out = best >> 8;
    if (best != ~0ull && ((best >> 8) << 16) < (u64)threshold * raw) return (u32)(best & 0xFF);
    return SEL_RAW;
}

// A symbol's entry in the encoder's tables (`tz_enc_tables` in search.cu writes them):
// `.x`, `.y` the low and high words of m = ceil(2^44 / f) for its frequency f (1..4095), `.z` its
// cumulative frequency c, `.w` 4096 - f; all zero for an absent symbol.
//
// The state after coding the symbol into `x` (already renormalised, so f <= x < f << 20):
// (x / f) << 12 + x % f + c = x + c + (x / f) (4096 - f) (the core's form). The quotient is exact
// from the 45-bit reciprocal: floor(x m / 2^44) = floor(x / f) + floor(r / f + x e / (f 2^44)) with
// r = x mod f <= f - 1 and e = m f - 2^44 < f, and x e < 4095^2 2^20 < 2^44 keeps the second term 0;
// x m / 2^32 = x mh + (x ml) / 2^32 is below 2^32 (x / f < 2^20). A multiply-high, two
// multiply-adds, a shift and an add, without a correction step. (Before 2026-12-02: the 32-bit
// reciprocal floor(2^32 / f), a quotient one short at times and its correction: 8 instructions, 11
// before 29bef39.)
__device__ __forceinline__ u32 push(u32 x, uint4 e) {
    const u32 q = (x * e.y + __umulhi(x, e.x)) >> 12;
    return x + e.z + q * e.w;
}

// The shared-memory accessors (shared_addr, lds8/16/32/128, sts8/16/32) come from smem.cuh, which the
// engine prepends.

// One rANS encoder step of the warp (FORMAT.md 5.3, backwards): active lanes push one symbol; the
// lanes that renormalise emit a word each, highest lane first. The stream (reverse emission order)
// ends at `words + cap`: `down` is the index the next emitted word goes to (cap - 1 at the start,
// so cap - 1 - down words were emitted); a word whose index would fall below 0 is not stored (the
// chunk then does not fit and is stored raw), and `down` keeps counting. `e` is the lane's
// symbol's entry (`push`), zero for inactive lanes; an active lane's symbol has a frequency > 0 (a
// block table is chosen only when it codes every symbol present in the block, the conditional
// table codes all 256). A lane renormalises when x >= f << 20, i.e. (x >> 20) + (4096 - f) >=
// 4096 (never for a zero entry). The emission is predicated and the push selected, without
// branches; `gt` is `lanemask_gt`.
__device__ __forceinline__ void put_entry(u32& x, int& down, bool active, uint4 e, u16* words, u32 gt) {
    const bool emit = active && (x >> 20) + e.w >= 4096u;
    const u32 m = __ballot_sync(FULL, emit);
    const int k = down - __popc(m & gt);
    if (emit && k >= 0) words[k] = (u16)x;
    x = emit ? x >> 16 : x;
    down -= __popc(m);
    const u32 y = push(x, e);
    x = active ? y : x;
}

// `put_entry` with the symbol's entry from the table `fc` in global memory.
__device__ __forceinline__ void put(u32& x, int& down, bool active, u32 sym, const uint4* __restrict__ fc, u16* words) {
    put_entry(x, down, active, active ? __ldg(fc + sym) : make_uint4(0u, 0u, 0u, 0u), words, lanemask_gt());
}

// `n` steps where every lane is active, the r-th symbol (r = n - 1 first, down to 0) `sym(r)`, with
// the table's entries at shared address `fc`. Each step's symbol and entry are loaded before the
// step ahead of it runs: the shared-memory accesses are volatile (smem.cuh) and the steps store
// words, so the compiler keeps them in program order, and loaded in the step itself the entry's
// load waited on the symbol's (13% of the encode kernel's stall samples, ncu 2026-12-02).
template <typename Sym>
__device__ __forceinline__ void put_full(u32& x, int& down, u32 n, Sym sym, u32 fc, u16* words, u32 gt) {
    if (n == 0) return;
    uint4 e = lds128(fc + 16 * sym(n - 1));
    #pragma unroll 4
    for (u32 r = n - 1; r > 0; r--) {
        const uint4 next = lds128(fc + 16 * sym(r - 1));
        put_entry(x, down, true, e, words, gt);
        e = next;
    }
    put_entry(x, down, true, e, words, gt);
}

// Copies a table's 256 entries (4 KiB) to the warp's shared `dst`.
__device__ __forceinline__ void copy_fc(u32* dst, const uint4* __restrict__ fc, int lane) {
    __syncwarp();
    #pragma unroll
    for (int k = 0; k < 8; k++) ((uint4*)dst)[k * 32 + lane] = __ldg(fc + k * 32 + lane);
    __syncwarp();
}

// Shared bytes of a warp's histograms (U KiB), at least 4 KiB for units of two bytes or more,
// whose lean rANS steps keep a table of 256 16-byte entries there (`hist_bytes` in encode.rs).
template <int U>
__host__ __device__ constexpr u32 hist_bytes() {
    return U >= 2 && U < 4 ? 4096u : U * 1024u;
}

// 16-byte loads a lane keeps in flight where a warp reads a block's bytes into shared memory
// (`stage`, and the conditioned symbols' copy in `encode_chunk`).
#define LOADS_IN_FLIGHT 8

// Loads the units bl .. bl + blen of the chunk at `src` into `planes`, transformed
// and split: byte p of unit i at planes[p * bu + i]. 16-byte loads, eight in flight per lane
// (four until 2026-12-04: the first use of each round's loads was the kernel's largest stall, 12%
// of its samples in ncu, and a 4096-unit bf16 block took four rounds of HBM latency; with eight,
// H200, 1 GiB, three alternating rounds of five runs: encode 312.9-314.7 -> 316.3-319.9 GB/s
// (bf16), 328.9-333.4 -> 345.5-351.2 (fp32)).
template <int U, int E>
__device__ __forceinline__ void stage(const u8* __restrict__ src, u32 bl, u32 blen, u8* planes, u32 bu, int lane) {
    constexpr u32 PER = 16 / U;  // units per 16-byte vector
    const uint4* v = (const uint4*)(src + (u64)bl * U);
    // Chunks of a size that is not a multiple of 16 bytes may start unaligned: units one by one.
    const u32 nv = ((u64)v & 15) == 0 ? blen / PER : 0u;
    for (u32 j0 = 0; j0 < nv; j0 += LOADS_IN_FLIGHT * 32) {
        uint4 w[LOADS_IN_FLIGHT];
        #pragma unroll
        for (int k = 0; k < LOADS_IN_FLIGHT; k++) {
            const u32 j = j0 + k * 32 + lane;
            w[k] = j < nv ? __ldg(v + j) : make_uint4(0u, 0u, 0u, 0u);
        }
        #pragma unroll
        for (int k = 0; k < LOADS_IN_FLIGHT; k++) {
            const u32 j = j0 + k * 32 + lane;
            if (j >= nv) continue;
            const u32 i0 = j * PER;
            if (U == 1) {
                *(uint4*)(planes + i0) = w[k];
            } else if constexpr ((U == 2 || U == 4) && (E == 0 || E == 8)) {
                // 32-bit byte permutes: the planes' bytes of these units gathered into words, and
                // the transform (E = 8: the exponent moved into the top byte, the sign below it)
                // applied to the words of the top two bytes, four units at once. Splitting unit by
                // unit in 64-bit arithmetic was 15% of a bf16 encode launch's instructions (ncu).
                // Encode kernel, H200, 2026-12-01, event trace of the same calls (median of 12):
                // 1 GiB bf16 4.25 -> 4.05 ms, fp32 3.65 -> 3.57 ms; blobs equal to the CPU's.
                u32 pw[U][2];
                if constexpr (U == 2) {
                    // Low and high bytes of units 0-3 (words x, y) and 4-7 (z, w).
                    pw[0][0] = __byte_perm(w[k].x, w[k].y, 0x6420);
                    pw[1][0] = __byte_perm(w[k].x, w[k].y, 0x7531);
                    pw[0][1] = __byte_perm(w[k].z, w[k].w, 0x6420);
                    pw[1][1] = __byte_perm(w[k].z, w[k].w, 0x7531);
                } else {
                    const u32 a = __byte_perm(w[k].x, w[k].y, 0x5140), b = __byte_perm(w[k].z, w[k].w, 0x5140);
                    const u32 c = __byte_perm(w[k].x, w[k].y, 0x7362), d = __byte_perm(w[k].z, w[k].w, 0x7362);
                    pw[0][0] = __byte_perm(a, b, 0x5410);
                    pw[1][0] = __byte_perm(a, b, 0x7632);
                    pw[2][0] = __byte_perm(c, d, 0x5410);
                    pw[3][0] = __byte_perm(c, d, 0x7632);
                }
                if constexpr (E == 8) {
                    // Top byte (sign, exponent high bits) h, the one below (exponent low bit,
                    // mantissa) l: the exponent h << 1 | l >> 7 goes on top, the sign above the
                    // mantissa below it.
                    #pragma unroll
                    for (int q = 0; q < (U == 2 ? 2 : 1); q++) {
                        const u32 h = pw[U - 1][q], l = pw[U - 2][q];
                        pw[U - 1][q] = ((h << 1) & 0xFEFEFEFEu) | ((l >> 7) & 0x01010101u);
                        pw[U - 2][q] = (h & 0x80808080u) | (l & 0x7F7F7F7Fu);
                    }
                }
                #pragma unroll
                for (int p = 0; p < U; p++) {
                    u8* d = planes + (u64)p * bu + i0;
                    if constexpr (U == 2) *(uint2*)d = make_uint2(pw[p][0], pw[p][1]);
                    else *(u32*)d = pw[p][0];
                }
            } else {
                u64 lo = (u64)w[k].x | ((u64)w[k].y << 32), hi = (u64)w[k].z | ((u64)w[k].w << 32);
                u64 pb[U];
                #pragma unroll
                for (int p = 0; p < U; p++) pb[p] = 0;
                #pragma unroll
                for (u32 u = 0; u < PER; u++) {
                    const u32 bit = u * U * 8;
                    u64 raw;
                    if (U == 8) raw = u == 0 ? lo : hi;
                    else raw = bit < 64 ? (lo >> bit) : (hi >> (bit - 64));
                    const u64 t = fwd<U, E>(U == 8 ? raw : raw & ((1ull << (8 * U)) - 1));
                    #pragma unroll
                    for (int p = 0; p < U; p++) pb[p] |= (u64)byte_of(t, p) << (8 * u);
                }
                #pragma unroll
                for (int p = 0; p < U; p++) {
                    u8* d = planes + (u64)p * bu + i0;
                    if (U == 2) *(u64*)d = pb[p];
                    else if (U == 4) *(u32*)d = (u32)pb[p];
                    else *(u16*)d = (u16)pb[p];
                }
            }
        }
    }
    for (u32 i = nv * PER + lane; i < blen; i += 32) {
        const u64 t = unit<U, E>(src, bl + i);
        #pragma unroll
        for (int p = 0; p < U; p++) planes[(u64)p * bu + i] = (u8)byte_of(t, p);
    }
    __syncwarp();
}

// Whether the `blen` bytes of a staged plane `pp` (4-byte aligned) all equal `first` (warp-uniform).
// Most blocks differ within their first 128 bytes, so the vote after each step usually ends it there.
__device__ __forceinline__ bool plane_is_const(const u8* pp, u32 blen, u32 first, int lane) {
    const u32 rep = first * 0x01010101u;
    const u32 n4 = blen & ~3u;
    for (u32 i0 = 0; i0 < n4; i0 += 128) {
        const u32 i = i0 + 4 * lane;
        const bool same = i >= n4 || *(const u32*)(pp + i) == rep;
        if (!__all_sync(FULL, same)) return false;
    }
    bool same = true;
    for (u32 i = n4 + lane; i < blen; i += 32) same &= pp[i] == first;
    return __all_sync(FULL, same);
}

// Copies `n` bytes from `src` to `dst` (any alignments; threads `t` of `nt` share the work): the
// bytes up to `dst`'s next 4-byte boundary, then whole 32-bit words, each assembled from the two
// aligned source words that hold its bytes (a funnel shift: it reads only aligned words that hold
// a byte of the range, so at most 3 bytes past the range, inside its last word), then the tail.
__device__ __forceinline__ void copy_bytes(u8* __restrict__ dst, const u8* __restrict__ src, u32 n, u32 t, u32 nt) {
    const u32 head = min(n, (u32)((4 - ((u64)dst & 3)) & 3));
    for (u32 i = t; i < head; i += nt) dst[i] = src[i];
    const u32 nw = (n - head) / 4;
    const u8* s = src + head;
    u32* d = (u32*)(dst + head);
    const u32 sh = (u32)((u64)s & 3) * 8;
    const u32* sw = (const u32*)((u64)s & ~3ull);
    if (sh == 0) {
        for (u32 i = t; i < nw; i += nt) d[i] = sw[i];
    } else {
        for (u32 i = t; i < nw; i += nt) d[i] = __funnelshift_r(sw[i], sw[i + 1], sh);
    }
    for (u32 i = head + nw * 4 + t; i < n; i += nt) dst[i] = src[i];
}

// Appends `n` bytes of a staged plane `from` (shared or global) to `to` (global, any alignment):
// 32-bit stores, one per lane and word (`copy_bytes`; four byte stores per lane and word were
// most of a raw plane's cost in the encoder).
__device__ __forceinline__ void put_bytes(u8* to, const u8* from, u32 n, int lane) {
    copy_bytes(to, from, n, (u32)lane, 32u);
}

// A lane's hit count (0..4, in bits S .. S + 2 of `v`) summed over the warp: `ph` over the lanes
// below this one (`lt` is `lanemask_lt`), `th` over all 32. Three ballots, one per bit of the
// count (S = 3 takes the count times 8, a popcount of byte masks, without shifting it first).
template <int S>
__device__ __forceinline__ void hit_prefix(u32 v, u32 lt, u32& ph, u32& th) {
    const u32 b0 = __ballot_sync(FULL, v & (1u << S)), b1 = __ballot_sync(FULL, v & (2u << S)),
              b2 = __ballot_sync(FULL, v & (4u << S));
    ph = __popc(b0 & lt) + 2 * __popc(b1 & lt) + 4 * __popc(b2 & lt);
    th = __popc(b0) + 2 * __popc(b1) + 4 * __popc(b2);
}

// The whole steps of a block's conditioned split (`area_block`: units 0 .. `whole`, a multiple of
// 128, four consecutive units per lane): the hits from one byte-wise compare, and each byte stored
// once, to the coded side (`csyms`) or the raw side (`area`). Both sides' places are 32-bit offsets
// from `area` (the slot puts `csyms` after it), so that a byte's address is one select and one add
// (64-bit pointers selected per byte were 11% of the kernel's instructions, ncu 2026-12-02); `SH`:
// the planes are staged in shared memory at `planes_sh` (read by shared address), else at `planes`.
template <bool SH>
__device__ __forceinline__ void split_whole(u32& ctot, u32& aoff, const u8* planes, u32 planes_sh, u32 bu, u32 whole,
                                            const EncParams& P, u8* area, const u8* csyms, u32 lt, int lane) {
    const u32 cv4 = P.cond_value * 0x01010101u;
    const u32 dc = (u32)(csyms - area);
    const u32 eo = P.cond_src * bu, mo = P.cond_plane * bu;
    for (u32 r0 = 0; r0 < whole; r0 += 128) {
        const u32 i0 = r0 + 4 * lane;
        u32 ew, mw;
        if constexpr (SH) {
            ew = lds32(planes_sh + eo + i0);
            mw = lds32(planes_sh + mo + i0);
        } else {
            ew = *(const u32*)(planes + eo + i0);
            mw = *(const u32*)(planes + mo + i0);
        }
        const u32 eq = __vcmpeq4(ew, cv4);  // 0xFF in each byte whose exponent is the value
        u32 ph, th;
        hit_prefix<3>(__popc(eq), lt, ph, th);
        u32 c = dc + ctot + ph, a = aoff + (4 * (u32)lane - ph);
        #pragma unroll
        for (u32 k = 0; k < 4; k++) {
            const u32 hit = (eq >> (8 * k)) & 1u;
            area[hit ? c : a] = (u8)(mw >> (8 * k));
            c += hit;
            a += hit ^ 1u;
        }
        ctot += th;
        aoff += 128 - th;
    }
}

// Block `b`'s part of the chunk's raw area (block-major; FORMAT.md 3.3) and of the conditioned
// plane's split into its coded bytes (`csyms`, with per-block offsets `coff`) and raw bytes, from the
// block's staged planes (`planes`; `planes_sh`, when not 0, their shared address). Advances `st`: the
// area's length `aoff`, the coded bytes `ctot`, `any` (a symbol is coded), and `last_start` and
// `last_craw` (for the stash).
template <int U>
struct AreaState {
    u32 aoff, ctot, last_start, last_craw;
    bool any;
};

template <int U>
__device__ __forceinline__ void area_block(AreaState<U>& st, const u8* planes, u32 bu, u32 b, u32 blen, const u32 (&mode)[U],
                                           const u8* sels, u32 nb, const u32* __restrict__ tinfo, const EncParams& P,
                                           bool condc, u8* area, u8* csyms, u32* coff, u32 planes_sh, int lane) {
    st.last_start = st.aoff;
    #pragma unroll
    for (int p = 0; p < U; p++) {
        const u32 sel = mode[p] == MODE_BLOCKS ? (u32)sels[p * nb + b] : 0u;
        if (mode[p] == MODE_RAW || (mode[p] == MODE_BLOCKS && sel == SEL_RAW)) {
            put_bytes(area + st.aoff, planes + (u64)p * bu, blen, lane);
            st.aoff += blen;
        } else if (mode[p] == MODE_BLOCKS && sel == SEL_CONST) {
            if (lane == 0) area[st.aoff] = planes[(u64)p * bu];
            st.aoff += 1;
        } else if (mode[p] == MODE_BLOCKS && !(__ldg(tinfo + P.table_base[p] + sel) >> 31)) {
            st.any = true;
        }
    }
    if (condc) {
        const u8* ep = planes + (u64)P.cond_src * bu;
        const u8* mp = planes + (u64)P.cond_plane * bu;
        if (lane == 0) coff[b] = st.ctot;
        const u32 c0 = st.ctot, a0 = st.aoff;
        const u32 lt = lanemask_lt();
        // Four consecutive units per lane, 128 per warp step (`planes` is 16-byte aligned and
        // `bu` a multiple of 32, so the 32-bit loads are aligned). A lane's hits (0..4) are
        // counted and summed over the lower lanes with three ballots, one per bit of the count;
        // its raw bytes go after the lower lanes' raw bytes, which are their units minus their
        // hits. Then each lane stores its bytes in unit order: the coded ones to `csyms`, the
        // others to the raw area (the same bytes and places as one unit per lane per step).
        // Whole steps (every lane's four units inside the block): `split_whole`; the general step
        // below, for the block's last partial step, tests and stores each byte on both sides.
        const u32 whole = blen & ~127u;
        if (planes_sh) split_whole<true>(st.ctot, st.aoff, planes, planes_sh, bu, whole, P, area, csyms, lt, lane);
        else split_whole<false>(st.ctot, st.aoff, planes, planes_sh, bu, whole, P, area, csyms, lt, lane);
        for (u32 r0 = whole; r0 < blen; r0 += 128) {
            const u32 i0 = r0 + 4 * lane;
            const u32 n_in = i0 >= blen ? 0u : min(blen - i0, 4u);
            u32 ew = 0, mw = 0;
            if (n_in == 4) {
                ew = *(const u32*)(ep + i0);
                mw = *(const u32*)(mp + i0);
            } else {
                for (u32 k = 0; k < n_in; k++) {
                    ew |= (u32)ep[i0 + k] << (8 * k);
                    mw |= (u32)mp[i0 + k] << (8 * k);
                }
            }
            u32 hits = 0;
            #pragma unroll
            for (u32 k = 0; k < 4; k++) hits |= (u32)(k < n_in && ((ew >> (8 * k)) & 0xFFu) == P.cond_value) << k;
            const u32 nh = __popc(hits);
            u32 ph, th;
            hit_prefix<0>(nh, lt, ph, th);
            const u32 before = min(4 * (u32)lane, blen - r0);  // units of the lower lanes
            u32 c = st.ctot + ph, a = st.aoff + (before - ph);
            #pragma unroll
            for (u32 k = 0; k < 4; k++) {
                if (k < n_in) {
                    const u8 m = (u8)(mw >> (8 * k));
                    if ((hits >> k) & 1u) csyms[c++] = m;
                    else area[a++] = m;
                }
            }
            const u32 step = min(128u, blen - r0);
            st.ctot += th;
            st.aoff += step - th;
        }
        const u32 craw = st.aoff - a0;
        st.any |= st.ctot > c0;
        st.last_craw = craw;
    }
}

// ---------------------------------------------------------------------------------------------
// Format version 2's paired exponent plane (FORMAT.md section 12): bf16's plane 1 coded as the
// ranks of its units' pairs (2i, 2i + 1) in the tensor's pair table, the pairs outside it as the
// escape rank D with their bytes in an escape group. The model (pair table, rank tables, the
// PairBlock) is made before this kernel runs: on the device by search.cu's `tz_pair_*` kernels, or
// by the host with the core's code (src/pair_model.rs), the CPU engine's decisions either way.

// The rank of the pair of exponent bytes (a, b), by the plane's maps `m` (the first PAIR_MAPS
// bytes of its PairBlock, copied to the warp's shared memory).
__device__ __forceinline__ u32 pair_rank(const u8* m, u32 a, u32 b) { return m[256 + 17 * (u32)m[a] + m[b]]; }

// Copies the PairBlock's maps (PAIR_MAPS bytes, 35 16-byte pieces) to the warp's shared `dst`.
__device__ __forceinline__ void pair_maps(u8* dst, const PairBlock* __restrict__ pb, int lane) {
    __syncwarp();
    for (u32 k = lane; k < PAIR_MAPS / 16; k += 32) ((uint4*)dst)[k] = __ldg((const uint4*)pb + k);
    __syncwarp();
}

// The ranks of the two pairs of exponent bytes in `w` (bytes 0-1 and 2-3), in bytes 0 and 1.
__device__ __forceinline__ u32 pair_ranks2(u32 w, const u8* m) {
    return pair_rank(m, w & 0xFFu, (w >> 8) & 0xFFu) | pair_rank(m, (w >> 16) & 0xFFu, w >> 24) << 8;
}

// The entry of byte `s` in the escape group's uniform table (frequency 16, cumulative 16 s:
// m = 2^44 / 16 = 2^40).
__device__ __forceinline__ uint4 uniform_entry(u32 s) { return make_uint4(0u, 256u, 16u * s, 4096u - 16u); }

// FORMAT.md section 12, step 5: whether a block that chose a version 1 table at cost `c` (Q16 bits)
// stays coded with `ne` escape-group bytes at 8 bits each.
__device__ __forceinline__ bool pair_stays_coded(u64 c, u32 ne, u32 blen, u32 threshold) {
    return ((c + ((8 * (u64)ne) << 16)) << 16) < (u64)threshold * ((u64)(8 * blen) << 16);
}

// The escape-group bytes of a block's paired plane `pp` (staged, `blen` bytes): two a pair whose
// rank is the escape `d`, and an odd last unit's byte. The warp's sum, on every lane.
__device__ u32 pair_escapes(const u8* pp, const u8* m, u32 d, u32 blen, int lane) {
    u32 n = 0;
    for (u32 i = 4 * lane; i < blen; i += 128) {
        if (i + 4 <= blen) {
            const u32 r = pair_ranks2(*(const u32*)(pp + i), m);
            n += ((r & 0xFFu) == d) + ((r >> 8) == d);
        } else {
            for (u32 k = i; k + 1 < blen; k += 2) n += pair_rank(m, pp[k], pp[k + 1]) == d;
        }
    }
    return 2 * __reduce_add_sync(FULL, n) + (blen & 1);
}

// An upper bound of `pair_escapes` from the block's histogram `h` of the plane (shared) alone: a
// pair escapes only if one of its units holds a byte outside the top 16 (each such unit in one
// pair) or its two top bytes (a, b) are not in the pair table (at most min(h[a], h[b]) such
// pairs), so the escaped pairs are at most the units outside the top 16 plus that minimum summed
// over the top pairs whose rank is `d`. The top bytes' counts go through `ht` (16 words of the
// warp's shared memory: `PAIR_TOP_COUNTS`, above the maps in its 4 KiB of histogram space). For
// weights the bound is far below what turns a block raw, so phase 1 need not look every pair's
// rank up (as it did until 2026-12-06 12:2x; H100, 1 GiB bf16, three rounds against that build in
// one call: encode 292.0-294.6 -> 299.1-301.1 GB/s); the output is the same.
__device__ u32 pair_escape_bound(const u32* h, const u8* m, u32* ht, u32 d, u32 blen, int lane) {
    __syncwarp();
    if (lane < 16) ht[lane] = 0;
    __syncwarp();
    u32 top = 0;
    #pragma unroll
    for (int k = 0; k < 8; k++) {
        const u32 x = 8 * lane + k, i = m[x];
        if (i < 16) {
            ht[i] = h[x];
            top += h[x];
        }
    }
    __syncwarp();
    u32 light = 0;
    #pragma unroll
    for (int k = 0; k < 8; k++) {
        const u32 a = (8 * lane + k) >> 4, b = (8 * lane + k) & 15;
        if (m[256 + 17 * a + b] == d) light += min(ht[a], ht[b]);
    }
    top = __reduce_add_sync(FULL, top);
    light = __reduce_add_sync(FULL, light);
    __syncwarp();  // ht is read before the next block's bound writes it
    const u32 pairs = min(blen - top + light, blen / 2);
    return 2 * pairs + (blen & 1);
}

// A paired block's symbols, backwards (the decoder reads its ranks, then its escape group). First a
// pass over its pairs, 128 a round, with the maps in the warp's shared `hist`: each rank written over
// the block's exponent bytes `pp` (rank i at byte i: a round writes below the bytes any later round
// reads, and after its own reads), each escaped pair's two bytes gathered in pair order into `esc`
// (the chunk's slot, block_units bytes), then an odd last unit's byte. Then the escape group, coded
// with the uniform table, and the ranks with the plane's rank table `sel`: its entries copied to
// `hist` and the lean steps where the block is staged in shared memory (`pp_sh`, else 0).
__device__ void pair_put(u32& x, int& down, u8* pp, u32 pp_sh, u32 blen, u32 sel, const PairBlock* __restrict__ pb,
                         u8* esc, u32* hist, u32 hist_sh, u16* words, int lane) {
    const u32 d = __ldg(&pb->escape);
    const u32 np = blen / 2;
    const u32 lt = lanemask_lt(), gt = lanemask_gt();
    const u8* m = (const u8*)hist;
    pair_maps((u8*)hist, pb, lane);
    // An odd last unit's byte, read before the pass's rank words can cover it (blen 3 or 5).
    const u32 odd = blen & 1 ? (u32)pp[blen - 1] : 0u;
    u32 ne = 0;
    // Four pairs a lane, 128 a round: one 8-byte load, their four ranks stored as one word at
    // byte i (bytes 2i..2i+8 read; i < np <= bu / 2 and i a multiple of 4, so both stay inside the
    // plane). Ranks past np are stored too: no later read takes them, and the next round reads
    // from byte 2 (i0 + 128) up. Escapes are rare: their places are counted only in rounds with one.
    for (u32 i0 = 0; i0 < np; i0 += 128) {
        const u32 i = i0 + 4 * lane;
        u64 w = 0;
        u32 r = 0, em = 0;
        if (i < np) {
            w = *(const u64*)(pp + 2 * i);
            r = pair_ranks2((u32)w, m) | pair_ranks2((u32)(w >> 32), m) << 16;
            // Bit 7 of each byte set where that rank is the escape (ranks are at most D <= 128: the
            // decoder's test), for the pairs below np.
            em = (((r | 0x80808080u) - d * 0x01010101u) | r) & 0x80808080u & (0xFFFFFFFFu >> (8 * (4 - min(np - i, 4u))));
        }
        if (__any_sync(FULL, em != 0)) {
            // Each lane's escapes (0-4) placed by a prefix sum over three ballots of their count's bits.
            const u32 c = __popc(em);
            const u32 b0 = __ballot_sync(FULL, c & 1u), b1 = __ballot_sync(FULL, c & 2u), b2 = __ballot_sync(FULL, c & 4u);
            u32 k = ne + 2 * (__popc(b0 & lt) + 2 * __popc(b1 & lt) + 4 * __popc(b2 & lt));
            #pragma unroll
            for (int j = 0; j < 4; j++) {
                if (em >> (8 * j + 7) & 1u) {
                    esc[k] = (u8)(w >> (16 * j));
                    esc[k + 1] = (u8)(w >> (16 * j + 8));
                    k += 2;
                }
            }
            ne += 2 * (__popc(b0) + 2 * __popc(b1) + 4 * __popc(b2));
        }
        __syncwarp();
        if (i < np) *(u32*)(pp + i) = r;
    }
    if (blen & 1) {
        if (lane == 0) esc[ne] = (u8)odd;
        ne++;
    }
    __syncwarp();
    u32 full = ne / 32, rem = ne % 32;
    if (rem) {
        const bool act = (u32)lane < rem;
        put_entry(x, down, act, act ? uniform_entry(esc[full * 32 + lane]) : make_uint4(0u, 0u, 0u, 0u), words, gt);
    }
    for (u32 r = full; r-- > 0;) put_entry(x, down, true, uniform_entry(esc[r * 32 + lane]), words, gt);
    const uint4* rt = (const uint4*)((const u8*)pb + PAIR_ENTRIES_AT) + (u64)sel * 256;
    full = np / 32;
    rem = np % 32;
    if (rem) {
        const bool act = (u32)lane < rem;
        put(x, down, act, act ? (u32)pp[full * 32 + lane] : 0u, rt, words);
    }
    if (pp_sh) {
        copy_fc(hist, rt, lane);
        const u32 base = pp_sh + lane;
        put_full(x, down, full, [&](u32 r) { return lds8(base + r * 32); }, hist_sh, words, gt);
    } else {
        for (u32 r = full; r-- > 0;) put(x, down, true, pp[r * 32 + lane], rt, words);
    }
    // The next block's escape group reuses `esc`, and the main group's lean steps `hist`.
    __syncwarp();
}

// PAIR: the kernel of bf16 tensors compressed with paired exponents (`tz_encode_2e8p`); a tensor
// whose parameters name no pair block is coded as version 1 by it.
template <int U, int E, bool PAIR>
__device__ void encode_chunk(const EncJob& job, const EncParams& P, const uint4* __restrict__ fcs,
                             const u32* __restrict__ cls, const u32* __restrict__ tinfo, const u8* __restrict__ const_sel,
                             u8* __restrict__ slot, ChunkOut* __restrict__ out, uint4* __restrict__ host_out, int lane,
                             u32* hist, u8* planes, bool stage_in_smem) {
    const u64 start = job.chunk * P.chunk_units;
    const u32 len = (u32)min((u64)P.chunk_units, P.units - start);
    const u32 bu = P.block_units;
    const u32 nb = (len + bu - 1) / bu;
    const u8* src = (const u8*)job.data + start * U;
    u8* sels = slot + P.off_sels;
    u32* coff = (u32*)(slot + P.off_coff);
    u8* states = slot + P.off_states;
    u8* area = slot + P.off_area;
    u8* csyms = slot + P.off_csyms;
    u16* words = (u16*)(slot + P.off_words);
    const u32 cap = P.cap_words;
    const u32 cp = P.cond_plane;
    const u32 planes_sh = stage_in_smem ? shared_addr(planes) : 0u;  // 0: planes in the slot

    // 1. Per block (staged): histograms, constant test, selectors; and, assuming no plane of the
    //    chunk turns out constant (then it is redone below), the raw area and the conditioned split.
    u32 cstate[U], cval[U];
    bool allraw[U];
    u32 smode[U];  // the assumed modes: Cond for the conditioned plane, Blocks for the others
    #pragma unroll
    for (int p = 0; p < U; p++) {
        cstate[p] = 0;  // 0: no block yet, 1: every block is the byte cval, 2: otherwise
        cval[p] = 0;
        allraw[p] = true;
        smode[p] = (u32)p == cp ? MODE_COND : MODE_BLOCKS;
    }
    const bool scond = cp < (u32)U;
    // A paired plane's maps, for each block's escape bytes in step 5 (their bound, or their count),
    // above its histograms (2 KiB of the warp's 4 KiB: bf16's two planes), where phase 1 leaves
    // them.
    u32 pair_d = 0;
    const u8* pmaps = (const u8*)hist + 2048;
    u32* ptop = (u32*)((u8*)hist + PAIR_TOP_COUNTS);  // step 5's bound (`pair_escape_bound`)
    if (PAIR && P.pair) {
        pair_maps((u8*)hist + 2048, (const PairBlock*)P.pair, lane);
        pair_d = __ldg(&((const PairBlock*)P.pair)->escape);
    }
    AreaState<U> st = {0, 0, 0, 0, false};
    for (u32 b = 0; b < nb; b++) {
        const u32 bl = b * bu, blen = min(bu, len - bl);
        stage<U, E>(src, bl, blen, planes, bu, lane);
        // Histograms only of the planes with block tables (their blocks choose a table by cost);
        // the others (raw, conditioned: for bf16 one plane of two, for fp32 three of four) need
        // only the constant test, a warp vote.
        #pragma unroll
        for (int p = 0; p < U; p++)
            if (P.n_tables[p] != 0)
                for (u32 k = lane; k < 256; k += 32) hist[p * 256 + k] = 0;
        __syncwarp();
        #pragma unroll
        for (int p = 0; p < U; p++) {
            if (P.n_tables[p] == 0) continue;
            const u8* pp = planes + (u64)p * bu;
            u32* hp = hist + p * 256;
            for (u32 i = 4 * lane; i < blen; i += 128) {
                if (i + 4 <= blen) {
                    const u32 w = *(const u32*)(pp + i);
                    atomicAdd(&hp[w & 0xFFu], 1u);
                    atomicAdd(&hp[(w >> 8) & 0xFFu], 1u);
                    atomicAdd(&hp[(w >> 16) & 0xFFu], 1u);
                    atomicAdd(&hp[w >> 24], 1u);
                } else {
                    for (u32 k = i; k < blen; k++) atomicAdd(&hp[pp[k]], 1u);
                }
            }
        }
        __syncwarp();
        #pragma unroll
        for (int p = 0; p < U; p++) {
            const u32 first = planes[(u64)p * bu];
            const bool is_const = P.n_tables[p] == 0 ? plane_is_const(planes + (u64)p * bu, blen, first, lane)
                                                     : hist[p * 256 + first] == blen;
            const u32 nt = P.n_tables[p];
            u32 sel;
            if (nt == 0) sel = is_const ? SEL_CONST : SEL_RAW;
            else if (PAIR && p == 1 && P.pair) {
                // FORMAT.md section 12, step 5: a constant block is 254; a block that chose a
                // version 1 table at cost c stays coded only if c plus 8 bits an escape-group
                // byte passes the threshold.
                sel = SEL_CONST;
                if (!is_const) {
                    u64 c = 0;
                    sel = choose<true>(hist + p * 256, blen, cls, P.table_base[p], nt, P.threshold, lane, &c);
                    // The escape bytes: first their bound from the histogram, which settles the
                    // test for most blocks; the exact count only where the bound would not pass.
                    if (sel < SEL_CONST &&
                        !pair_stays_coded(c, pair_escape_bound(hist + 256, pmaps, ptop, pair_d, blen, lane), blen, P.threshold) &&
                        !pair_stays_coded(c, pair_escapes(planes + bu, pmaps, pair_d, blen, lane), blen, P.threshold))
                        sel = SEL_RAW;
                }
            } else if (is_const) sel = const_sel[p * 256 + first];
            else sel = choose(hist + p * 256, blen, cls, P.table_base[p], nt, P.threshold, lane);
            if (lane == 0) sels[p * nb + b] = (u8)sel;
            allraw[p] &= sel == SEL_RAW;
            if (b == 0) {
                cstate[p] = is_const ? 1u : 2u;
                cval[p] = first;
            } else if (cstate[p] == 1 && !(is_const && first == cval[p])) {
                cstate[p] = 2;
            }
        }
        __syncwarp();
        area_block<U>(st, planes, bu, b, blen, smode, sels, nb, tinfo, P, scond, area, csyms, coff, planes_sh, lane);
        __syncwarp();
    }
    u32 mode[U];
    bool some_const = false;
    #pragma unroll
    for (int p = 0; p < U; p++) {
        if (cstate[p] == 1) mode[p] = MODE_CONST;
        else if ((u32)p == cp) mode[p] = MODE_COND;
        else if (allraw[p]) mode[p] = MODE_RAW;
        else mode[p] = MODE_BLOCKS;
        some_const |= mode[p] == MODE_CONST;
    }
    bool condc = false;
    #pragma unroll
    for (int p = 0; p < U; p++) condc |= (u32)p == cp && mode[p] == MODE_COND;

    // 2. A constant plane contributes nothing to the raw area: build it again with the real modes.
    if (some_const) {
        st = {0, 0, 0, 0, false};
        for (u32 b = 0; b < nb; b++) {
            const u32 bl = b * bu, blen = min(bu, len - bl);
            stage<U, E>(src, bl, blen, planes, bu, lane);
            area_block<U>(st, planes, bu, b, blen, mode, sels, nb, tinfo, P, condc, area, csyms, coff, planes_sh, lane);
            __syncwarp();
        }
    }
    if (condc && lane == 0) coff[nb] = st.ctot;
    const u32 aoff = st.aoff;
    const bool any = st.any;
    // The stash: the last raw bytes of the last block travel in the initial states.
    const u32 stash = !any ? 0u : min(condc ? st.last_craw : aoff - st.last_start, 64u);
    const u32 kept = aoff - stash;
    __syncwarp();

    // 3. The rANS stream, walking the decoder's order backwards. The lean steps keep the step's
    //    table in the (now free) histogram space, 4 KiB (`hist_bytes`): units of two bytes or more.
    const bool lean = U >= 2;
    const u32 hist_sh = shared_addr(hist);
    const u32 gt = lanemask_gt();
    // The next word's index (`put_entry`); cap_words <= MAX_CHUNK_BYTES / 2 + 1 fits an int.
    int down = (int)cap - 1;
    if (any) {
        u32 x;
        {
            const u32 lo = 2u * lane < stash ? (u32)area[kept + 2 * lane] : 0u;
            const u32 hi = 2u * lane + 1 < stash ? (u32)area[kept + 2 * lane + 1] : 0u;
            x = 65536u + lo + (hi << 8);
        }
        for (u32 b = nb; b-- > 0;) {
            const u32 bl = b * bu, blen = min(bu, len - bl);
            if (condc) {
                const u32 o = coff[b], T = coff[b + 1] - o;
                if (T) {
                    const uint4* fc = fcs + (u64)P.cond_table * 256;
                    const u32 full = T / 32, rem = T % 32;
                    if (rem) {
                        const bool act = (u32)lane < rem;
                        put(x, down, act, act ? (u32)csyms[o + full * 32 + lane] : 0u, fc, words);
                    }
                    // The full steps' symbols, csyms[o .. o + 32 * full), from the 16-byte line
                    // at or below their start.
                    const u32 a0 = (u32)((u64)(csyms + o) & 15);
                    const u32 nv = (a0 + full * 32 + 15) / 16;
                    if (lean && planes_sh && nv * 16 <= U * bu) {
                        // Copied first into the stage buffer (free until this block is staged
                        // below) with LOADS_IN_FLIGHT 16-byte loads per lane, then read from
                        // shared memory by the steps: read from global memory one step ahead,
                        // each step waited for its symbol's load (8.4% of the kernel's stall
                        // samples, ncu 2026-12-04). The loads read at most 15 bytes either side of
                        // the symbols, inside the slot (`csyms` has 64 bytes of slack and follows
                        // the raw area). Not `__ldg`: this warp wrote the symbols in this launch.
                        // H200, 1 GiB, three alternating rounds (median of five runs each):
                        // encode 303.1-306.5 -> 314.9-321.0 GB/s (bf16), 315.1-316.2 ->
                        // 332.8-334.6 (fp32); an L2 prefetch of the next block before each
                        // stage was no faster (bf16) or slower (fp32), and was not kept.
                        copy_fc(hist, fc, lane);
                        const uint4* s16 = (const uint4*)(csyms + o - a0);
                        for (u32 j0 = 0; j0 < nv; j0 += LOADS_IN_FLIGHT * 32) {
                            uint4 w[LOADS_IN_FLIGHT];
                            #pragma unroll
                            for (int k = 0; k < LOADS_IN_FLIGHT; k++) {
                                const u32 j = j0 + k * 32 + lane;
                                w[k] = j < nv ? s16[j] : make_uint4(0u, 0u, 0u, 0u);
                            }
                            #pragma unroll
                            for (int k = 0; k < LOADS_IN_FLIGHT; k++) {
                                const u32 j = j0 + k * 32 + lane;
                                if (j < nv) ((uint4*)planes)[j] = w[k];
                            }
                        }
                        __syncwarp();
                        const u32 base = planes_sh + a0 + lane;
                        put_full(x, down, full, [&](u32 r) { return lds8(base + r * 32); }, hist_sh, words, gt);
                        // The stage below overwrites the buffer the steps read.
                        __syncwarp();
                    } else if (lean) {
                        copy_fc(hist, fc, lane);
                        const u8* cs = csyms + o + lane;
                        put_full(x, down, full, [&](u32 r) { return (u32)cs[r * 32]; }, hist_sh, words, gt);
                    } else {
                        for (u32 r = full; r-- > 0;) put(x, down, true, csyms[o + r * 32 + lane], fc, words);
                    }
                }
            }
            const uint4* fc[U];
            bool in_main[U];
            bool some = false;
            u32 psel = SEL_RAW;  // the paired plane's selector (version 2)
            #pragma unroll
            for (int p = 0; p < U; p++) {
                const u32 sel = mode[p] == MODE_BLOCKS ? (u32)sels[p * nb + b] : SEL_RAW;
                in_main[p] = sel < SEL_CONST && !(__ldg(tinfo + P.table_base[p] + sel) >> 31);
                if (PAIR && p == 1 && P.pair) {
                    // Not in the main group: its ranks and escape group follow it.
                    psel = sel;
                    in_main[p] = false;
                }
                fc[p] = fcs + (u64)(P.table_base[p] + (in_main[p] ? sel : 0u)) * 256;
                some |= in_main[p];
            }
            if (!some && !(PAIR && psel < SEL_CONST)) continue;
            stage<U, E>(src, bl, blen, planes, bu, lane);
            if (PAIR && psel < SEL_CONST) {
                pair_put(x, down, planes + bu, planes_sh ? planes_sh + bu : 0u, blen, psel, (const PairBlock*)P.pair,
                         slot + P.off_esc, hist, hist_sh, words, lane);
                if (!some) {
                    __syncwarp();
                    continue;
                }
            }
            const u32 full = blen / 32, rem = blen % 32;
            if (rem) {
                const bool act = (u32)lane < rem;
                const u32 i = full * 32 + lane;
                #pragma unroll
                for (int p = U - 1; p >= 0; p--)
                    if (in_main[p]) put(x, down, act, act ? (u32)planes[(u64)p * bu + i] : 0u, fc[p], words);
            }
            // One coded plane, planes staged in shared memory: the lean steps.
            u32 n_main = 0, only = 0;
            #pragma unroll
            for (int p = 0; p < U; p++) {
                if (in_main[p]) {
                    n_main++;
                    only = p;
                }
            }
            if (lean && planes_sh && n_main == 1) {
                const uint4* f1 = fc[0];
                #pragma unroll
                for (int p = 1; p < U; p++)
                    if ((u32)p == only) f1 = fc[p];
                copy_fc(hist, f1, lane);
                const u32 base = planes_sh + only * bu + lane;
                put_full(x, down, full, [&](u32 r) { return lds8(base + r * 32); }, hist_sh, words, gt);
            } else {
                for (u32 r = full; r-- > 0;) {
                    const u32 i = r * 32 + lane;
                    #pragma unroll
                    for (int p = U - 1; p >= 0; p--)
                        if (in_main[p]) put(x, down, true, planes[(u64)p * bu + i], fc[p], words);
                }
            }
            __syncwarp();
        }
        #pragma unroll
        for (int k = 0; k < 4; k++) states[4 * lane + k] = (u8)(x >> (8 * k));
    }

    // 4. Sizes; a chunk whose coding does not make it smaller is stored with its planes raw.
    u32 pos = (u32)((int)cap - 1 - down);  // words emitted
    u32 n_blocks_planes = 0;
    #pragma unroll
    for (int p = 0; p < U; p++) n_blocks_planes += mode[p] == MODE_BLOCKS;
    u32 sel_len = nb * n_blocks_planes;
    u32 rans_len = any ? 128u + 2u * pos : 0u;
    u64 payload = (u64)sel_len + rans_len + kept;
    u32 out_kept = kept;
    if (pos > cap || payload >= (u64)len * U) {
        #pragma unroll
        for (int p = 0; p < U; p++)
            if (mode[p] != MODE_CONST) mode[p] = MODE_RAW;
        __syncwarp();
        u32 o = 0;
        for (u32 b = 0; b < nb; b++) {
            const u32 bl = b * bu, blen = min(bu, len - bl);
            stage<U, E>(src, bl, blen, planes, bu, lane);
            #pragma unroll
            for (int p = 0; p < U; p++) {
                if (mode[p] != MODE_RAW) continue;
                put_bytes(area + o, planes + (u64)p * bu, blen, lane);
                o += blen;
            }
            __syncwarp();
        }
        sel_len = 0;
        rans_len = 0;
        pos = 0;
        out_kept = o;
        payload = o;
    }
    if (lane == 0) {
        ChunkOut co;
        co.payload_len = (u32)payload;
        co.rans_len = rans_len;
        co.sel_len = sel_len;
        co.kept = out_kept;
        co.n_words = pos;
        co.nb = nb;
        co.pad[0] = co.pad[1] = 0;
        #pragma unroll
        for (int p = 0; p < 8; p++) {
            co.modes[p] = p < U ? (u8)mode[p] : 0;
            co.values[p] = p < U && mode[p] == MODE_CONST ? (u8)cval[p] : 0;
        }
        *out = co;
        if (host_out) {
            // The same report into the host's page-locked buffer (mapped: the host reads it after
            // the launch, with no copy on the stream between the kernel and the placement).
            u32 m[2] = {0, 0}, v[2] = {0, 0};
            #pragma unroll
            for (int p = 0; p < 8; p++) {
                m[p / 4] |= (u32)co.modes[p] << (8 * (p % 4));
                v[p / 4] |= (u32)co.values[p] << (8 * (p % 4));
            }
            host_out[0] = make_uint4(co.payload_len, co.rans_len, co.sel_len, co.kept);
            host_out[1] = make_uint4(co.n_words, co.nb, 0u, 0u);
            host_out[2] = make_uint4(m[0], m[1], v[0], v[1]);
        }
    }
}

// Per warp: `hist_bytes` of histograms, then (when `stage_bytes` > 0) its block's planes in shared
// memory; with `stage_bytes` == 0 the planes live in the chunk's slot (blocks too large).
template <int U, int E, bool PAIR>
__device__ __forceinline__ void encode_entry(const EncJob* __restrict__ jobs, u32 n_jobs, const EncParams* __restrict__ params,
                                             const uint4* fcs, const u32* cls, const u32* tinfo, const u8* const_sel,
                                             u8* scratch, ChunkOut* outs, uint4* host_outs, u32 stage_bytes,
                                             u32 warps) {
    extern __shared__ uint4 smem4[];
    const int lane = threadIdx.x & 31;
    const u32 warp = threadIdx.x >> 5;
    const u32 k = blockIdx.x * warps + warp;
    if (k >= n_jobs) return;
    const EncJob job = jobs[k];
    const EncParams P = params[job.tensor];
    u8* mine = (u8*)smem4 + (u64)warp * (hist_bytes<U>() + stage_bytes);
    u8* slot = scratch + job.slot;
    u8* planes = stage_bytes ? mine + hist_bytes<U>() : slot + P.off_stage;
    encode_chunk<U, E, PAIR>(job, P, fcs, cls, tinfo, const_sel + (u64)job.tensor * 2048, slot, outs + k,
                       host_outs ? host_outs + 3 * (u64)k : nullptr, lane, (u32*)mine, planes, stage_bytes > 0);
}

#define ENTRIES(SUFFIX, U, E, LB, PAIR)                                                                     \
    extern "C" __global__ void __launch_bounds__(1024) tz_hist_##SUFFIX(                                     \
        const HistJob* __restrict__ jobs, const EncParams* __restrict__ params, const u64* __restrict__ picks, \
        u32* __restrict__ hists, u32* __restrict__ joint, u32 joint_smem) {                                 \
        hist_entry<U, E>(jobs, params, picks, hists, joint, joint_smem);                                    \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__ LB tz_encode_##SUFFIX(                                     \
        const EncJob* __restrict__ jobs, u32 n_jobs, const EncParams* __restrict__ params,                  \
        const uint4* __restrict__ fcs, const u32* __restrict__ cls, const u32* __restrict__ tinfo,          \
        const u8* __restrict__ const_sel, u8* __restrict__ scratch, ChunkOut* __restrict__ outs,            \
        uint4* __restrict__ host_outs, u32 stage_bytes, u32 warps) {                                        \
        encode_entry<U, E, PAIR>(jobs, n_jobs, params, fcs, cls, tinfo, const_sel, scratch, outs, host_outs,\
                                 stage_bytes, warps);                                                       \
    }
// The encoder's launch bounds: blocks of up to 8 warps for 1- and 2-byte units (compiled as tuned; the
// bounds of the wider kernels made the bf16 one 2-3% slower), up to 11 for 4- and 8-byte units, whose
// 20-40 KiB of shared memory per warp left an SM 8 warps in blocks of 8 at most. The host picks the width
// that keeps the most warps resident (`enc_block_width` in encode.rs, which reads these bounds back from
// the compiled function: they are stated only here). (`(352)` without the minimum of
// one block made NVRTC cap the kernels at 80 registers and spill.)
#if TZ_ALL || TZ_UNIT == 0
ENTRIES(1, 1, 0, (256), false)
#endif
#if TZ_ALL || TZ_UNIT == 1
ENTRIES(2, 2, 0, (256), false)
#endif
#if TZ_ALL || TZ_UNIT == 2
ENTRIES(2e8, 2, 8, (256), false)
#endif
#if TZ_ALL || TZ_UNIT == 3
ENTRIES(4, 4, 0, (352, 1), false)
#endif
#if TZ_ALL || TZ_UNIT == 4
ENTRIES(4e8, 4, 8, (352, 1), false)
#endif
#if TZ_ALL || TZ_UNIT == 5
ENTRIES(8, 8, 0, (352, 1), false)
#endif
#if TZ_ALL || TZ_UNIT == 6
ENTRIES(8e11, 8, 11, (352, 1), false)
#endif
// bf16 with paired exponents (format version 2): its own instantiation, so that version 1's bf16
// kernel keeps its code.
#if TZ_ALL || TZ_UNIT == 7
ENTRIES(2e8p, 2, 8, (256), true)
#endif

// ---------------------------------------------------------------------------------------------
// Compaction: the pieces of each chunk's payload, from its slot to its place in its blob.

// The wave's chunks in order (`jobs`, `outs`, `n` of them; grouped by tensor, each tensor's chunks in
// order): each chunk's reported sizes are checked against its slot and its blob — the checks the
// host repeats on the reports — and its payload placed after the previous chunks of its
// tensor (`placed[t]`: payload bytes tensor t's earlier waves took, updated here). One block of up to
// 1024 threads, blockDim.x a multiple of 32. Any failed check sets `*bad`, and tz_compact then writes
// nothing: a wrong report can never send a copy outside its blob. Each chunk's exclusive prefix
// sum over the wave is kept in its report's `pad` words.
#if TZ_ALL || TZ_UNIT == -1
extern "C" __global__ void tz_place(EncJob* __restrict__ jobs, u32 n, const EncParams* __restrict__ params,
                                    ChunkOut* __restrict__ outs, u64* __restrict__ placed, u32* __restrict__ bad,
                                    u32 us) {
    __shared__ u64 warp_sum[32];
    __shared__ u64 carry;
    __shared__ u32 fail;
    const u32 t = threadIdx.x, lane = t & 31, warp = t >> 5, nw = blockDim.x >> 5;
    if (t == 0) {
        carry = 0;
        fail = 0;
    }
    __syncthreads();
    // 1. Exclusive prefix sums of the payload lengths over the wave, a tile of blockDim.x at a time.
    for (u32 base = 0; base < n; base += blockDim.x) {
        const u32 k = base + t;
        const u64 v = k < n ? outs[k].payload_len : 0;
        u64 incl = v;
        #pragma unroll
        for (u32 d = 1; d < 32; d <<= 1) {
            const u64 o = __shfl_up_sync(FULL, incl, d);
            if (lane >= d) incl += o;
        }
        if (lane == 31) warp_sum[warp] = incl;
        __syncthreads();
        u64 before = carry;
        for (u32 w = 0; w < warp; w++) before += warp_sum[w];
        if (k < n) {
            const u64 excl = before + incl - v;
            outs[k].pad[0] = (u32)excl;
            outs[k].pad[1] = (u32)(excl >> 32);
        }
        __syncthreads();
        if (t == 0) {
            u64 tile = 0;
            for (u32 w = 0; w < nw; w++) tile += warp_sum[w];
            carry += tile;
        }
        __syncthreads();
    }
    // 2. Checks and places.
    for (u32 k = t; k < n; k += blockDim.x) {
        const EncJob j = jobs[k];
        const ChunkOut o = outs[k];
        const EncParams P = params[j.tensor];
        const u64 excl = (u64)o.pad[0] | (u64)o.pad[1] << 32;
        bool ok = j.seg <= k && jobs[j.seg].tensor == j.tensor && us <= 8;
        const u64 first = ok ? ((u64)outs[j.seg].pad[0] | (u64)outs[j.seg].pad[1] << 32) : 0;
        const u64 start = j.chunk * P.chunk_units;
        const u64 len = start < P.units ? min((u64)P.chunk_units, P.units - start) * us : 0;
        // Modes past the tensor's planes must be raw: tz_compact copies selectors for a Blocks
        // mode on any of the 8.
        u32 blocks_planes = 0;
        for (u32 p = 0; p < 8; p++) {
            blocks_planes += o.modes[p] == MODE_BLOCKS;
            ok = ok && o.modes[p] <= (p < us ? MODE_COND : MODE_RAW);
        }
        const u64 off = placed[j.tensor] + excl - first;
        ok = ok && (u64)o.sel_len + o.rans_len + o.kept == o.payload_len && o.payload_len <= len &&
             (o.rans_len == 0 || o.rans_len == 128u + 2ull * o.n_words) && o.n_words <= P.cap_words &&
             (o.sel_len == 0 || (o.nb <= P.blocks_per_chunk && o.sel_len == o.nb * blocks_planes)) &&
             excl >= first && off + o.payload_len <= P.dst_cap;
        if (!ok) atomicOr(&fail, 1u);
        jobs[k].dst = P.dst_base + off;
    }
    __syncthreads();
    // 3. Each tensor's payload bytes so far, from its last chunk in the wave.
    for (u32 k = t; k < n; k += blockDim.x) {
        const EncJob j = jobs[k];
        if (k + 1 < n && jobs[k + 1].tensor == j.tensor) continue;
        const ChunkOut o = outs[k];
        const u64 excl = (u64)o.pad[0] | (u64)o.pad[1] << 32;
        const u64 first = j.seg <= k ? ((u64)outs[j.seg].pad[0] | (u64)outs[j.seg].pad[1] << 32) : excl;
        placed[j.tensor] += excl + o.payload_len - first;
    }
    if (t == 0 && fail) *bad = 1u;
}
#endif

// `copy_bytes` for a whole thread block and long runs (the compaction's pieces, ~64 KiB): the
// stores are 16 bytes each once `dst` is aligned, every one made of two aligned 16-byte loads of
// `src` shifted into place (`copy_vecs<W>`, W = the source's word offset in its 16 bytes). Four-byte
// copies kept too few bytes in flight per SM to stream at memory speed. Reads at most 16 bytes past
// the end of `src` (the scratch is padded for it).
template <int W>
__device__ __forceinline__ void copy_vecs(uint4* __restrict__ d, const uint4* __restrict__ sv, u32 nv, u32 bsh,
                                          u32 t, u32 nt) {
    for (u32 i = t; i < nv; i += nt) {
        const uint4 a = sv[i], b = sv[i + 1];
        const u32 w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        uint4 o;
        o.x = __funnelshift_r(w[W], w[W + 1], bsh);
        o.y = __funnelshift_r(w[W + 1], w[W + 2], bsh);
        o.z = __funnelshift_r(w[W + 2], w[W + 3], bsh);
        o.w = __funnelshift_r(w[W + 3], w[W + 4], bsh);
        d[i] = o;
    }
}

__device__ __forceinline__ void copy_wide(u8* __restrict__ dst, const u8* __restrict__ src, u32 n, u32 t, u32 nt) {
    const u32 head = min(n, (u32)((16 - ((u64)dst & 15)) & 15));
    for (u32 i = t; i < head; i += nt) dst[i] = src[i];
    const u8* s = src + head;
    uint4* d = (uint4*)(dst + head);
    const u32 nv = (n - head) / 16;
    const u32 off = (u32)((u64)s & 15);
    const uint4* sv = (const uint4*)(s - off);
    const u32 bsh = (off & 3) * 8;
    switch (off >> 2) {
    case 0:
        if (bsh == 0) {
            for (u32 i = t; i < nv; i += nt) d[i] = sv[i];
        } else {
            copy_vecs<0>(d, sv, nv, bsh, t, nt);
        }
        break;
    case 1: copy_vecs<1>(d, sv, nv, bsh, t, nt); break;
    case 2: copy_vecs<2>(d, sv, nv, bsh, t, nt); break;
    default: copy_vecs<3>(d, sv, nv, bsh, t, nt); break;
    }
    for (u32 i = head + nv * 16 + t; i < n; i += nt) dst[i] = src[i];
}

#if TZ_ALL || TZ_UNIT == -1
extern "C" __global__ void tz_compact(const u8* __restrict__ scratch, const EncJob* __restrict__ jobs,
                                      const EncParams* __restrict__ params, const ChunkOut* __restrict__ outs, u32 n,
                                      const u32* __restrict__ bad) {
    const u32 k = blockIdx.x;
    if (k >= n || *bad) return;
    const EncJob job = jobs[k];
    const EncParams P = params[job.tensor];
    const ChunkOut o = outs[k];
    const u8* slot = scratch + job.slot;
    u8* dst = (u8*)job.dst;
    u32 w = 0;
    if (o.sel_len) {
        for (int p = 0; p < 8; p++) {
            if (o.modes[p] != MODE_BLOCKS) continue;
            copy_wide(dst + w, slot + P.off_sels + (u64)p * o.nb, o.nb, threadIdx.x, blockDim.x);
            w += o.nb;
        }
    }
    if (o.rans_len) {
        copy_wide(dst + w, slot + P.off_states, 128, threadIdx.x, blockDim.x);
        w += 128;
        copy_wide(dst + w, slot + P.off_words + 2ull * (P.cap_words - o.n_words), 2 * o.n_words, threadIdx.x, blockDim.x);
        w += 2 * o.n_words;
    }
    copy_wide(dst + w, slot + P.off_area, o.kept, threadIdx.x, blockDim.x);
}
#endif

// ---------------------------------------------------------------------------------------------
// CRC-32 (zlib: reflected 0xEDB88320, initial and final XOR 0xFFFFFFFF) of each `piece` bytes.
//
// Each lane of a warp takes a 4-byte-aligned segment of its piece and computes the CRC register of
// that segment from 0 (slicing by 4); the register is linear, so the piece's register is the XOR of
// each lane's register shifted past the bytes that follow it (multiplication by x^(8n) mod P), plus
// the initial value shifted past the whole piece.

#define CRC_POLY 0xEDB88320u

// a * b mod P, in the reflected representation (bit 31 = x^0).
__device__ u32 multmodp(u32 a, u32 b) {
    if (a == 0) return 0;
    u32 m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ CRC_POLY : b >> 1;
    }
    return p;
}

// x^(8 n) mod P, from the table of x^(2^k) mod P.
__device__ u32 x8n(u64 n, const u32* x2n) {
    u32 p = 1u << 31;
    u32 k = 3;
    while (n) {
        if (n & 1) p = multmodp(x2n[k & 31], p);
        n >>= 1;
        k++;
    }
    return p;
}

// The slicing-by-4 tables (T) and x^(2^k) mod P (x2n) in shared memory, built by the block.
__device__ void crc_tables(u32 (&T)[4][256], u32 (&x2n)[32]) {
    for (u32 i = threadIdx.x; i < 256; i += blockDim.x) {
        u32 c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ CRC_POLY : c >> 1;
        T[0][i] = c;
    }
    if (threadIdx.x == 0) {
        u32 p = 1u << 30;  // x^1
        for (int k = 0; k < 32; k++) {
            x2n[k] = p;
            p = multmodp(p, p);
        }
    }
    __syncthreads();
    for (u32 i = threadIdx.x; i < 256; i += blockDim.x) {
        u32 c = T[0][i];
        for (int s = 1; s < 4; s++) {
            c = (c >> 8) ^ T[0][c & 0xFFu];
            T[s][i] = c;
        }
    }
    __syncthreads();
}

// The CRC-32 of the `plen` bytes at `piece`, computed by the whole warp (the result in every lane).
__device__ u32 piece_crc(const u8* piece, u64 plen, int lane, const u32 (&T)[4][256], const u32 (&x2n)[32]) {
    const u64 seg = ((plen + 31) / 32 + 3) & ~3ull;
    const u64 s0 = min(plen, (u64)lane * seg), s1 = min(plen, s0 + seg);
    const u8* q = piece + s0;
    u64 n = s1 - s0;
    u32 crc = 0;
    while (n && ((u64)q & 3)) {
        crc = T[0][(crc ^ *q) & 0xFFu] ^ (crc >> 8);
        q++;
        n--;
    }
    while (n >= 4) {
        crc ^= *(const u32*)q;
        crc = T[3][crc & 0xFFu] ^ T[2][(crc >> 8) & 0xFFu] ^ T[1][(crc >> 16) & 0xFFu] ^ T[0][crc >> 24];
        q += 4;
        n -= 4;
    }
    while (n) {
        crc = T[0][(crc ^ *q) & 0xFFu] ^ (crc >> 8);
        q++;
        n--;
    }
    u32 r = s1 > s0 ? multmodp(x8n(plen - s1, x2n), crc) : 0u;
    if (lane == 0) r ^= multmodp(x8n(plen, x2n), 0xFFFFFFFFu);
    #pragma unroll
    for (int d = 16; d > 0; d >>= 1) r ^= __shfl_xor_sync(FULL, r, d);
    return ~r;
}

// The CRC of each `piece` bytes of one buffer (the last piece may be shorter): one warp per piece.
#if TZ_ALL || TZ_UNIT == -1
extern "C" __global__ void tz_crc32(const u8* __restrict__ data, u64 len, u64 piece, u32* __restrict__ out, u64 n_pieces) {
    __shared__ u32 T[4][256];
    __shared__ u32 x2n[32];
    crc_tables(T, x2n);
    const int lane = threadIdx.x & 31;
    const u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    for (u64 pc = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; pc < n_pieces; pc += warps) {
        const u64 p0 = pc * piece;
        const u32 c = piece_crc(data + p0, min(piece, len - p0), lane, T, x2n);
        if (lane == 0) out[pc] = c;
    }
}
#endif

// One range of `tz_crc32_list` (shared with `CrcRange` in src/checksum.rs).
struct CrcRange {
    u64 addr;
    u64 len;
};

// The CRC of each of `n` ranges anywhere in device memory (the host combines the pieces of a long
// range): one warp per range.
#if TZ_ALL || TZ_UNIT == -1
extern "C" __global__ void tz_crc32_list(const CrcRange* __restrict__ ranges, u64 n, u32* __restrict__ out) {
    __shared__ u32 T[4][256];
    __shared__ u32 x2n[32];
    crc_tables(T, x2n);
    const int lane = threadIdx.x & 31;
    const u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    for (u64 i = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; i < n; i += warps) {
        const CrcRange r = ranges[i];
        const u32 c = piece_crc((const u8*)r.addr, r.len, lane, T, x2n);
        if (lane == 0) out[i] = c;
    }
}
#endif
