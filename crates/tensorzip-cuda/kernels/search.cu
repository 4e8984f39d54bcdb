// The table search of the encoder on the GPU: the core crate's `model::cluster` (a plane's
// frequency tables from the histograms of its sampled blocks) and `model::choose_conditional` (the
// conditional table of a plane the tables leave raw), the same integer arithmetic in the same order
// of decisions, so that the tables are bit for bit the CPU engine's. docs/FORMAT.md ("Encoder
// decisions") is the normative description; src/search.rs launches it, and its test compares every
// table with the core's.
//
// A thread block cluster of 1024-thread blocks per plane to search (`SearchJob`; one block where
// the device has no clusters). The attempts of a search are sequential by definition (each seeds
// from the regrets the previous left), so the cluster runs them one after the other, each step
// spread over its threads: every block owns a contiguous share of the sampled blocks (their flags,
// dense rows, cost columns, least costs and choices), the sums, scans and Lloyd sums cross the
// cluster through its blocks' shared memory (`Cl`), and every block normalises the same tables from
// the same sums into its own copy (deterministic warp code, so the copies are equal and no table
// crosses the cluster). Everything a search keeps lives in the job's global scratch, laid out by
// `Layout` (its size is checked against the scratch the host gave); block 0 writes the output.
//
// Written for this project: no published GPU code computes these tables.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define NT 1024
#define NW (NT / 32)
#define FULL 0xffffffffu
#define FRAC_BITS 16
#define PROB_SCALE 4096u
#define ANCHOR 255
#define SEL_RAW 255
#define NO_COST 0xffffffffffffffffull
#define NONE 0xffff
#define CL_ABSENT 0xffffffffu
// The most sampled blocks of a job (src/search.rs `MAX_SAMPLED`; more get status 1): the Lloyd
// step's 32-bit per-lane sums rely on it.
#define MAX_SAMPLED 8192u
// The most thread blocks of a plane's cluster (the portable cluster size; src/search.rs
// `MAX_CLUSTER`).
#define MAX_CLUSTER 8u

struct SearchJob {
    u64 hists;     // u32[256] histogram of the plane in sampled block 0; block i at hists + 4 * i * stride
    u64 scratch;   // this job's scratch (`Layout`)
    u64 scratch_len;
    u64 out;       // this job's output (src/search.rs: `OUT_*`)
    u64 joint;     // u32[65536] joint counts of (condition byte, plane byte), or 0: no conditional
    u64 n_blocks;  // blocks of the plane in the whole tensor
    u32 n_sampled; // sampled blocks (histograms)
    u32 stride;    // u32 from one sampled block's histogram to the next
    u32 flat_stride; // the flat-plane rule's probes: sampled blocks i % flat_stride == 0; 0: no rule
    u32 pad;
};

struct SearchParams {
    u32 max_tables;
    u32 threshold; // passthrough threshold in Q16 (1..=65536)
};

// ---- 128-bit helpers (NVRTC has no device __int128 without a flag; only these few are needed) ----

struct U128 {
    u64 hi, lo;
};
__device__ __forceinline__ U128 mul64(u64 a, u64 b) { return U128{__umul64hi(a, b), a * b}; }
__device__ __forceinline__ bool lt128(U128 a, U128 b) { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo); }
// floor(a * b / c) <= d, exactly: the same as a * b < (d + 1) * c (c > 0).
__device__ __forceinline__ bool scaled_le(u64 a, u64 b, u64 c, u64 d) {
    U128 lhs = mul64(a, b);
    U128 rhs = mul64(d + 1, c);
    if (d == NO_COST) rhs.hi += c; // (2^64) * c
    return lt128(lhs, rhs);
}
// floor(x / d) for a 128-bit x and d > 0 (restoring division, one bit a step: rare calls). Not
// inlined, like `log2_q16_exact`: inlined at every call site (the normaliser's eight unrolled symbols in
// each of its instantiations) they made the cubin 1.46 MB and its NVRTC compile ~37 s on the
// development VM; out of line 0.82 MB and ~14 s.
__device__ __noinline__ U128 div128(U128 x, u64 d) {
    U128 q{0, 0};
    u64 r = 0;
    for (int i = 127; i >= 0; i--) {
        u64 bit = i >= 64 ? (x.hi >> (i - 64)) & 1 : (x.lo >> i) & 1;
        bool carry = r >> 63;
        r = (r << 1) | bit;
        if (carry || r >= d) {
            r -= d;
            if (i >= 64) q.hi |= 1ull << (i - 64); else q.lo |= 1ull << i;
        }
    }
    return q;
}

// ---- the core's integer logarithms and code lengths (src/rans/log2.rs) ----

// floor(log2(v) * 2^16) for v >= 1, by repeated squaring.
__device__ __noinline__ u64 log2_q16_exact(u64 v) {
    u32 ip = 63 - __clzll(v);
    u64 m = ip <= 62 ? v << (62 - ip) : v >> 1; // in [2^62, 2^63): [1, 2)
    u64 frac = 0;
    for (int i = FRAC_BITS - 1; i >= 0; i--) {
        // (m * m) >> 62 of the 126-bit square
        u64 hi = __umul64hi(m, m), lo = m * m;
        m = (hi << 2) | (lo >> 62);
        if (m >> 63) {
            m >>= 1;
            frac |= 1ull << i;
        }
    }
    return ((u64)ip << FRAC_BITS) | frac;
}
// log2_q16 of 0..=65536 (index 0 holds 0), filled once per loaded module by `tz_log2_init`
// (src/search.rs `load` launches it before any search): nearly every logarithm the search takes is
// of a count of at most 65536 (a block's length), and a lookup replaces the ~130 instructions of
// the squaring loop (40% of the search's instructions, 25% of its stall samples, in an ncu profile
// of 1 GiB of bf16 on the H200). The core does the same (`log2::log2_small`).
__device__ u32 LOG2_SMALL[65537];

__device__ __forceinline__ u64 log2_q16(u64 v) { return v <= 65536 ? (u64)LOG2_SMALL[v] : log2_q16_exact(v); }

extern "C" __global__ void __launch_bounds__(1024) tz_log2_init() {
    for (u32 v = blockIdx.x * blockDim.x + threadIdx.x; v <= 65536; v += gridDim.x * blockDim.x)
        LOG2_SMALL[v] = v == 0 ? 0u : (u32)log2_q16_exact(v);
}

// Code length in Q16 bits of frequency f (1..=4096).
__device__ __forceinline__ u32 code_len(u32 f) { return (u32)((12ull << FRAC_BITS) - log2_q16(f)); }

// ---- frequency codes (src/rans/table.rs) ----

__device__ __forceinline__ u32 code_to_freq(u32 c) {
    if (c >= 1 && c <= 127) return c;
    u32 k = c - 128;
    return (16 + (k & 15)) << ((k >> 4) + 3); // 128..=207 only (callers never pass others)
}
__device__ __forceinline__ u32 nearest_code(u32 q) {
    if (q <= 127) return q;
    u32 e = (31 - __clz(q)) - 7;
    u32 step = 8u << e, base = 128u << e;
    u32 m = (q - base + step / 2 - 1) >> (e + 3);
    if (m == 16) {
        if (e == 4) m = 15; else { m = 0; e += 1; }
    }
    return 128 + (e << 4) + m;
}

// ---- model decisions (src/model.rs) ----

__device__ __forceinline__ u64 raw_cost(u64 len) { return (8 * len) << FRAC_BITS; }
// (cost << 16) < threshold * raw_cost(len), in 128 bits.
__device__ __forceinline__ bool stays_coded(u64 cost, u64 len, u32 thr) {
    U128 lhs{cost >> 48, cost << 16};
    return lt128(lhs, mul64(thr, raw_cost(len)));
}

// ---- warp and block reductions ----

__device__ __forceinline__ u64 warp_sum64(u64 v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}
__device__ __forceinline__ u32 warp_sum32(u32 v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}
__device__ __forceinline__ u32 warp_max32(u32 v) {
    for (int o = 16; o; o >>= 1) v = max(v, __shfl_xor_sync(FULL, v, o));
    return v;
}
__device__ __forceinline__ u32 warp_min32(u32 v) {
    for (int o = 16; o; o >>= 1) v = min(v, __shfl_xor_sync(FULL, v, o));
    return v;
}
__device__ __forceinline__ u64 warp_max64(u64 v) {
    for (int o = 16; o; o >>= 1) v = max(v, (u64)__shfl_xor_sync(FULL, v, o));
    return v;
}

struct Shared {
    u64 red[NW];
    u32 scan[NW];
    u64 total[256];    // the support's summed counts (by support column)
    u32 cl[256];       // a table's code lengths over the support
    u8 absent[256];    // whether the table lacks the support symbol
    u8 syms[256];      // the support
    u8 codes[NW][256]; // one normalisation's codes per warp
    u16 col_of[256];   // each symbol's support column, NONE outside the support
    u32 dirty[64];     // tables whose cost columns are to be computed
    u32 bstart[MAX_CLUSTER + 1]; // each block's first compacted block, and nb
    u32 ndirty;
    u32 nsyms;
    u32 nb;
    u32 seed;
    u32 flag;
    u64 v0, v1;
};

// Block-wide sum (every thread gets it).
__device__ u64 block_sum64(Shared& sh, u64 v) {
    v = warp_sum64(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red[threadIdx.x >> 5] = v;
    __syncthreads();
    u64 t = 0;
    for (int w = 0; w < NW; w++) t += sh.red[w];
    __syncthreads();
    return t;
}
__device__ bool block_any(bool v) { return __syncthreads_or(v) != 0; }

// Exclusive block scan of u32 flags/counts (sum < 2^32), and the total.
__device__ u32 block_scan32(Shared& sh, u32 v, u32* total) {
    u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    u32 x = v;
    for (int o = 1; o < 32; o <<= 1) {
        u32 y = __shfl_up_sync(FULL, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) sh.scan[w] = x;
    __syncthreads();
    u32 before = 0, all = 0;
    for (int i = 0; i < NW; i++) {
        u32 s = sh.scan[i];
        if (i < (int)w) before += s;
        all += s;
    }
    __syncthreads();
    *total = all;
    return before + x - v;
}

// ---- the plane's thread block cluster ----
//
// Values cross the cluster by exchanges: each block writes its part into its own slot of shared
// memory, the cluster waits at a barrier (release / acquire at cluster scope), and every block
// reads every block's slot through distributed shared memory (`cl_peer`). Two slots alternate, so a
// slot is written again only after the barrier that follows every block's reads of it. Every
// decision taken from exchanged values is the same in every block, so the blocks take the same
// paths and meet at the same barriers. A launch without clusters (or a device before sm_90) is a
// cluster of one block, whose exchanges read its own slot.

struct Cl {
    u32 rank, size;
    u64* x;     // the two slots, `xw` u64 each
    u32 xw;
    u32 par;    // the slot of the next exchange
};

__device__ __forceinline__ void cl_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    __syncthreads();
#endif
}

// This block's slot for the next exchange.
__device__ __forceinline__ u64* cl_slot(const Cl& c) { return c.x + (u64)c.par * c.xw; }

// Block r's slot of the current exchange (after its `cl_sync`).
__device__ __forceinline__ const u64* cl_peer(const Cl& c, u32 r) {
    const u64* p = c.x + (u64)c.par * c.xw;
#if __CUDA_ARCH__ >= 900
    u64 q;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(q) : "l"(p), "r"(r));
    return (const u64*)q;
#else
    return p;
#endif
}

// Cluster-wide sums of two u64 (every thread of every block gets them), and the sum of the first
// over the blocks before this one.
__device__ void cl_sum2(Shared& sh, Cl& c, u64 a, u64 b, u64* ta, u64* tb, u64* before_a) {
    a = block_sum64(sh, a);
    b = block_sum64(sh, b);
    if (threadIdx.x == 0) {
        u64* my = cl_slot(c);
        my[0] = a;
        my[1] = b;
    }
    cl_sync();
    u64 sa = 0, sb = 0, pre = 0;
    for (u32 r = 0; r < c.size; r++) {
        const u64* p = cl_peer(c, r);
        const u64 pa = p[0];
        if (r == c.rank) pre = sa;
        sa += pa;
        sb += p[1];
    }
    c.par ^= 1;
    *ta = sa;
    *tb = sb;
    *before_a = pre;
}

// Cluster-wide sum of a u64 (every thread of every block gets it).
__device__ u64 cl_sum64(Shared& sh, Cl& c, u64 v) {
    v = block_sum64(sh, v);
    if (threadIdx.x == 0) cl_slot(c)[0] = v;
    cl_sync();
    u64 t = 0;
    for (u32 r = 0; r < c.size; r++) t += cl_peer(c, r)[0];
    c.par ^= 1;
    return t;
}

// Cluster-wide OR of a flag.
__device__ bool cl_any(Cl& c, bool v) {
    const bool any = __syncthreads_or(v) != 0;
    if (threadIdx.x == 0) cl_slot(c)[0] = any;
    cl_sync();
    u64 all = 0;
    for (u32 r = 0; r < c.size; r++) all |= cl_peer(c, r)[0];
    c.par ^= 1;
    return all != 0;
}

// ---- normalisation (`FreqTable::normalize`) on one warp ----

// The table of the counts `count(s)` with the symbols `forced(s)` present whatever their count:
// codes to `codes` (256 bytes, 0 where absent), the anchor's frequency to `*afreq` and the
// serialised length (2 + hi - lo + 1) to `*span`. Returns false, writing no codes, where the counts
// sum to 0 (the core's `None`). Lane l owns symbols l + 32k.
template <typename C, typename F>
__device__ bool warp_normalize(C count, F forced, u8* codes, u32* span, u32* afreq) {
    const u32 lane = threadIdx.x & 31;
    u64 c[8];
    bool pres[8];
    u32 lo = 256, hi = 0;
    u64 n = 0;
    bool any = false;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 s = lane + 32 * k;
        c[k] = count(s);
        pres[k] = c[k] > 0 || forced(s);
        if (pres[k]) { lo = min(lo, s); hi = max(hi, s); any = true; }
        n += c[k];
    }
    lo = warp_min32(lo);
    hi = warp_max32(hi);
    *span = 2 + hi - lo + 1;
    any = __any_sync(FULL, any);
    n = warp_sum64(n);
    if (!any || n == 0) return false;
    // The first symbol of the largest count.
    u64 best_c = 0;
    u32 best_s = 256;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 s = lane + 32 * k;
        if (c[k] > best_c || (c[k] == best_c && best_c > 0 && s < best_s)) { best_c = c[k]; best_s = s; }
    }
    u64 top = warp_max64(best_c);
    u32 anchor = warp_min32(best_c == top ? best_s : 256);
    u32 code[8];
    u32 sum = 0, present = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 s = lane + 32 * k;
        code[k] = 0;
        if (!pres[k]) continue;
        present++;
        if (s == anchor) { code[k] = ANCHOR; continue; }
        u64 q;
        if (n < (1ull << 48)) {
            q = (2 * c[k] * PROB_SCALE + n) / (2 * n);
        } else {
            // (2 c 4096 + n) / (2 n) in 128 bits
            U128 num = mul64(2 * c[k], PROB_SCALE);
            u64 lo2 = num.lo + n;
            num.hi += lo2 < num.lo;
            num.lo = lo2;
            q = div128(num, 2 * n).lo;
        }
        u32 qq = (u32)min(max(q, 1ull), (u64)PROB_SCALE - 1);
        code[k] = nearest_code(qq);
        sum += code_to_freq(code[k]);
    }
    sum = (u32)warp_sum64(sum);
    present = (u32)warp_sum64(present);
    if (present > 1 && sum > PROB_SCALE - 1) {
        // Step the largest frequency down (the smallest symbol among ties), one code at a time.
        while (sum > PROB_SCALE - 1) {
            u32 key = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                u32 s = lane + 32 * k;
                if (code[k] != 0 && s != anchor) key = max(key, (code_to_freq(code[k]) << 8) | (255 - s));
            }
            key = warp_max32(key);
            if (key == 0) break;
            u32 s = 255 - (key & 255), f = key >> 8;
            u32 owner = s & 31, kk = s >> 5;
            u32 below = 0;
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (lane == owner && k == (int)kk) below = code[k] - 1;
            below = __shfl_sync(FULL, below, owner);
            if (below == 0) break;
            u32 nf = code_to_freq(below);
            sum = sum - f + nf;
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (lane == owner && k == (int)kk) code[k] = below;
        }
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 s = lane + 32 * k;
        codes[s] = (u8)code[k];
    }
    *afreq = PROB_SCALE - sum;
    __syncwarp();
    return true;
}

// ---- the job's scratch ----

struct Layout {
    u16* rows;   // [256][n] dense counts over the support, column-major (symbol i of block b at i * n + b);
                 // 16 bits hold them: a non-constant block has two symbols or more and at most
                 // 65536 units, so no count passes 65535 (checked where they are written)
    u32* idx;    // [n] sampled block of each non-constant block
    u32* lens;   // [n]
    u64* ideal;  // [n]
    u64* col[2]; // [T][n] cost columns (NO_COST: not covered), current and trial
    u64* lc[2];  // [n] least cost
    u8* lj[2];   // [n] its column
    u8* cs[2];   // [n] choice: table or SEL_RAW
    u64* cc[2];  // [n] its cost
    u8* rej;     // [n]
    u64* from[2];  // [T][256] the summed counts each table was normalised from
    u8* fromv[2];  // [T] whether it has them
    u8* codes[2];  // [T][256]
    u16* freq[2];  // [T][256]
    u32* span[2];  // [T] serialised lengths
    u32* clen[2];  // [T][256] code lengths over the support (CL_ABSENT: not in the table)
    u64* lsum;     // [T][256] the trial tables' summed counts over the support (Lloyd step)
    // The compacted blocks [b0, b1) this thread block owns (of nb): the per-block arrays above are
    // indexed by compacted block over the whole plane, and each thread block writes only its share
    // (the seed's row and `rej` entry are the only ones another block reads). The table arrays
    // (`from` .. `lsum`) are this thread block's own copy.
    u32 b0, b1;
    u64 bytes;
    // The block's dynamic shared memory not yet given to an array (`to_arena`).
    u8* arena;
    u64 arena_left;
};

// Moves array `p` of `bytes` bytes into the block's shared memory where the arena still has room
// (else it stays in the global scratch `layout` gave it). Every thread of the block calls it alike,
// before any thread touches the array, so all of them use the same copy. Arrays are taken in the
// order the caller gives (its most used first); any mix works, since every access goes through
// these pointers. Measured (src/search.rs `SEARCH_ARENA`): worth little, since the search's steps
// are bound by the SM's issue rate rather than by their loads, and harmful past ~128 KiB, whose
// bytes the L1 cache loses.
template <typename T>
__device__ __forceinline__ void to_arena(Layout& L, T*& p, u64 bytes) {
    const u64 b = (bytes + 15) & ~15ull;
    if (b <= L.arena_left) {
        p = (T*)L.arena;
        L.arena += b;
        L.arena_left -= b;
    }
}

// The scratch of a job of n sampled blocks and t tables for the cluster's block `rank`: the
// per-block arrays (shared by the cluster), then one copy of the table arrays per block of the
// cluster (src/search.rs `scratch_bytes`: the same sizes, each rounded up to 16 bytes). `bytes` is
// where this block's copy ends.
__device__ Layout layout(u8* base, u64 n, u64 t, u32 rank) {
    Layout l;
    u64 at = 0;
    auto take = [&](u64 bytes) {
        u8* p = base + at;
        at += (bytes + 15) & ~15ull;
        return p;
    };
    l.rows = (u16*)take(256 * n * 2);
    l.idx = (u32*)take(n * 4);
    l.lens = (u32*)take(n * 4);
    l.ideal = (u64*)take(n * 8);
    for (int b = 0; b < 2; b++) {
        l.col[b] = (u64*)take(t * n * 8);
        l.lc[b] = (u64*)take(n * 8);
        l.lj[b] = take(n);
        l.cs[b] = take(n);
        l.cc[b] = (u64*)take(n * 8);
    }
    l.rej = take(n);
    const u64 shared_end = at;
    for (int b = 0; b < 2; b++) {
        l.from[b] = (u64*)take(t * 256 * 8);
        l.fromv[b] = take(t);
        l.codes[b] = take(t * 256);
        l.freq[b] = (u16*)take(t * 256 * 2);
        l.span[b] = (u32*)take(t * 4);
        l.clen[b] = (u32*)take(t * 256 * 4);
    }
    l.lsum = (u64*)take(t * 256 * 8);
    const u64 own = at - shared_end;
    at = shared_end + (u64)rank * own;
    for (int b = 0; b < 2; b++) {
        l.from[b] = (u64*)((u8*)l.from[b] + at - shared_end);
        l.fromv[b] += at - shared_end;
        l.codes[b] += at - shared_end;
        l.freq[b] = (u16*)((u8*)l.freq[b] + at - shared_end);
        l.span[b] = (u32*)((u8*)l.span[b] + at - shared_end);
        l.clen[b] = (u32*)((u8*)l.clen[b] + at - shared_end);
    }
    l.lsum = (u64*)((u8*)l.lsum + at - shared_end);
    l.bytes = at + own;
    l.b0 = 0;
    l.b1 = 0;
    l.arena = nullptr;
    l.arena_left = 0;
    return l;
}

// ---- steps of the search ----

// The cost columns of `G` tables (`j[0..G]`, bank k) for block b, in one pass over the block's row,
// by `Q` threads of one warp (consecutive lanes, `q` this thread's), each summing the symbols
// `q, q + Q, ...`; every thread of the warp calls it (`live` false: no block), and lane q = 0 of
// the group writes. Each count is loaded once for all G. A count under an absent symbol
// (`CL_ABSENT`) makes the column NO_COST whatever the sum, so the product is added
// unconditionally (h * l < 2^48, 256 of them fit).
template <int G>
__device__ __forceinline__ void column_group(const Layout& L, int k, const u32 (&j)[4], u32 b, u32 nb, u32 ns,
                                             u32 q, u32 Q, bool live) {
    const u32* cl[G];
    u64 acc[G];
    bool miss[G];
#pragma unroll
    for (int t = 0; t < G; t++) {
        cl[t] = L.clen[k] + (u64)j[t] * 256;
        acc[t] = 0;
        miss[t] = false;
    }
    if (live) {
#pragma unroll 4
        for (u32 i = q; i < ns; i += Q) {
            const u32 h = L.rows[(u64)i * nb + b];
#pragma unroll
            for (int t = 0; t < G; t++) {
                const u32 l = cl[t][i];
                miss[t] |= (l == CL_ABSENT) & (h != 0);
                acc[t] += (u64)h * l;
            }
        }
    }
    for (u32 o = 1; o < Q; o <<= 1) {
#pragma unroll
        for (int t = 0; t < G; t++) {
            acc[t] += __shfl_xor_sync(FULL, acc[t], o);
            miss[t] |= __shfl_xor_sync(FULL, (u32)miss[t], o) != 0;
        }
    }
    if (live && q == 0) {
#pragma unroll
        for (int t = 0; t < G; t++) L.col[k][(u64)j[t] * nb + b] = miss[t] ? NO_COST : acc[t];
    }
}

// The cost columns (bank k) of the tables listed in `sh.dirty` over this thread block's share:
// each block's row summed for a group of up to four tables at once, by Q threads (a power of two up
// to 8, as many as the threads allow: a thread block's share of a cluster is a few hundred blocks),
// the tables' code lengths read by the threads of a group alike (broadcast). All threads run the
// same number of rounds (the groups' shuffles need the whole warp).
__device__ void columns(Shared& sh, const Layout& L, int k, u32 nb) {
    __syncthreads();
    const u32 ns = sh.nsyms, nd = sh.ndirty;
    const u32 share = L.b1 - L.b0, groups = (nd + 3) / 4, items = share * groups;
    u32 Q = 1;
    while (Q < 8 && items * Q * 2 <= NT) Q *= 2;
    const u32 q = threadIdx.x & (Q - 1);
    for (u32 base = 0; base < items * Q; base += NT) {
        const u32 w = (base + threadIdx.x) / Q;
        const bool live = w < items;
        const u32 b = live ? L.b0 + w % share : 0, d = live ? 4 * (w / share) : 0;
        u32 j[4];
#pragma unroll
        for (int t = 0; t < 4; t++) j[t] = sh.dirty[min(d + t, nd - 1)];
        // The group's size is the same for every thread of a warp only where the warp's items
        // are of one group; the tail group's threads take the one-table pass per table.
        const u32 left = nd - d;
        if (__all_sync(FULL, !live || left >= 4)) {
            column_group<4>(L, k, j, b, nb, ns, q, Q, live);
        } else {
            for (u32 t = 0; t < 4; t++) {
                const bool mine = live && t < left;
                u32 jj[4] = {j[t < 4 ? t : 0], 0, 0, 0};
                if (__any_sync(FULL, mine)) column_group<1>(L, k, jj, b, nb, ns, q, Q, mine);
            }
        }
    }
    __syncthreads();
}

// The cost column of table j of bank k alone.
__device__ void column(Shared& sh, const Layout& L, int k, u32 j, u32 nb) {
    __syncthreads();
    if (threadIdx.x == 0) {
        sh.dirty[0] = j;
        sh.ndirty = 1;
    }
    columns(sh, L, k, nb);
}

// The least cost over columns 0..nt of bank k and the choices from it (this thread block's share).
__device__ void least_and_choice(const Layout& L, int k, u32 nt, u32 nb, u32 thr) {
    for (u32 b = L.b0 + threadIdx.x; b < L.b1; b += NT) {
        u64 best = NO_COST;
        u32 bj = 0;
#pragma unroll 4
        for (u32 j = 0; j < nt; j++) {
            u64 c = L.col[k][(u64)j * nb + b];
            if (c < best) { best = c; bj = j; }
        }
        L.lc[k][b] = best;
        L.lj[k][b] = (u8)bj;
        if (best != NO_COST && stays_coded(best, L.lens[b], thr)) {
            L.cs[k][b] = (u8)bj;
            L.cc[k][b] = best;
        } else {
            L.cs[k][b] = SEL_RAW;
            L.cc[k][b] = raw_cost(L.lens[b]);
        }
    }
    __syncthreads();
}

// The table of the support counts `sum` (u64 per support column) with every support symbol
// present, normalised by the calling warp into its codes row `sh.codes[warp]`; `*span`, `*afreq`
// as `warp_normalize`. False (nothing written) for a zero sum.
__device__ bool warp_support_table(Shared& sh, const u64* sum, u32* span, u32* afreq) {
    return warp_normalize(
        [&](u32 s) {
            u32 c = sh.col_of[s];
            return c == NONE ? 0ull : sum[c];
        },
        [&](u32 s) { return sh.col_of[s] != NONE; }, sh.codes[threadIdx.x >> 5], span, afreq);
}

// Stores the calling warp's codes row as table j of bank k: codes, frequencies, code lengths over
// the support, serialised length.
__device__ void warp_commit(Shared& sh, const Layout& L, u32 span, u32 afreq, int k, u32 j) {
    const u32 lane = threadIdx.x & 31;
    const u8* tmp = sh.codes[threadIdx.x >> 5];
    u8* codes = L.codes[k] + (u64)j * 256;
    u16* freq = L.freq[k] + (u64)j * 256;
    u32* clen = L.clen[k] + (u64)j * 256;
    for (u32 s = lane; s < 256; s += 32) {
        u32 c = tmp[s];
        codes[s] = (u8)c;
        freq[s] = (u16)(c == 0 ? 0 : c == ANCHOR ? afreq : code_to_freq(c));
    }
    for (u32 i = lane; i < sh.nsyms; i += 32) {
        u32 c = tmp[sh.syms[i]];
        u32 f = c == 0 ? 0 : c == ANCHOR ? afreq : code_to_freq(c);
        clen[i] = f == 0 ? CL_ABSENT : code_len(f);
    }
    if (lane == 0) L.span[k][j] = span;
    __syncwarp();
}

// Table j of bank k from the support counts `sum`, on warp 0 (the block waits); false for a zero
// sum.
__device__ bool support_table(Shared& sh, const Layout& L, const u64* sum, int k, u32 j) {
    __syncthreads();
    if (threadIdx.x < 32) {
        u32 span = 0, afreq = 0;
        bool ok = warp_support_table(sh, sum, &span, &afreq);
        if (ok) warp_commit(sh, L, span, afreq, k, j);
        if (threadIdx.x == 0) sh.flag = ok;
    }
    __syncthreads();
    bool ok = sh.flag != 0;
    __syncthreads();
    return ok;
}

// Serialised bytes of tables 0..nt of bank k.
__device__ u32 table_bytes(const Layout& L, int k, u32 nt) {
    u32 total = 0;
    for (u32 j = 0; j < nt; j++) total += L.span[k][j];
    return total;
}
// Copies bank `from` to bank `to` (tables 0..nt, and the per-block state of this thread block's
// share) on the threads t0, t0 + stride, ... (no barrier).
__device__ void copy_bank(const Layout& L, int from, int to, u32 nt, u32 nb, u32 t0, u32 stride) {
    const u32 share = L.b1 - L.b0;
    for (u32 i = t0; i < nt * share; i += stride) {
        const u64 at = (u64)(i / share) * nb + L.b0 + i % share;
        L.col[to][at] = L.col[from][at];
    }
    for (u32 b = L.b0 + t0; b < L.b1; b += stride) {
        L.lc[to][b] = L.lc[from][b];
        L.lj[to][b] = L.lj[from][b];
        L.cs[to][b] = L.cs[from][b];
        L.cc[to][b] = L.cc[from][b];
    }
    for (u32 i = t0; i < nt * 256; i += stride) {
        L.from[to][i] = L.from[from][i];
        L.codes[to][i] = L.codes[from][i];
        L.freq[to][i] = L.freq[from][i];
        L.clen[to][i] = L.clen[from][i];
    }
    for (u32 j = t0; j < nt; j += stride) {
        L.fromv[to][j] = L.fromv[from][j];
        L.span[to][j] = L.span[from][j];
    }
}

// The output of a job (u32 words, then bytes): [0] tables kept, [1] conditional (0x100 | e, or 0),
// [2] status (0 ok, 1 scratch too small); from byte 16 the kept tables, then the conditional
// one, each serialised (lo, hi, codes lo..=hi).
#define OUT_HEAD 16

// The lowest and highest symbols whose code in `c` (256 bytes) is not 0, on the calling warp (every
// lane gets them); (256, 0) if there is none.
__device__ void warp_present_range(const u8* c, u32* lo, u32* hi) {
    const u32 lane = threadIdx.x & 31;
    u32 l = 256, h = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const u32 sym = lane + 32 * k;
        if (c[sym] != 0) {
            l = min(l, sym);
            h = max(h, sym);
        }
    }
    *lo = warp_min32(l);
    *hi = warp_max32(h);
}

// The search of one plane (`model::cluster`) by the cluster `c`; returns the number of tables
// written (the same in every block; block 0 writes them).
__device__ u32 cluster(Shared& sh, Cl& cl, const SearchJob& job, Layout& L, u32 max_tables, u32 thr, u8* out) {
    const u32* hists = (const u32*)job.hists;
    const u32 n = job.n_sampled;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // This block's sampled blocks [i0, i1): its compacted share below is made of them.
    const u32 per_block = (n + cl.size - 1) / cl.size;
    const u32 i0 = min(cl.rank * per_block, n), i1 = min(i0 + per_block, n);
    // 1. Non-constant blocks (at least two symbols), in order, and their lengths; and whether
    //    every one of them is raw by the collision bound. One warp per histogram.
    //    First pass: flags into `lens` (the length, or 0 for constant blocks) and the bound.
    bool all_raw_local = true;
    // The flat-plane rule (model::flat_stride, cluster::probes_flat): whether a probe block of this
    // thread's warp is constant or not shown raw by the bound.
    bool probe_fails_local = false;
    // The largest passing sum of squares for the last length seen (the same on every lane of a
    // warp; most blocks have the same length, so the search for it runs about once per warp).
    u64 last_n = 0, last_limit = 0;
    bool last_some = false;
    for (u32 i = i0 + warp; i < i1; i += NW) {
        const u32* h = hists + (u64)i * job.stride;
        u64 sum = 0, sq = 0;
        u32 nz = 0;
        for (u32 s = lane; s < 256; s += 32) {
            u64 c = h[s];
            sum += c;
            sq += c * c;
            nz += c != 0;
        }
        sum = warp_sum64(sum);
        sq = warp_sum64(sq);
        nz = (u32)warp_sum64(nz);
        bool nonconst = nz >= 2;
        if (lane == 0) L.lens[i] = nonconst ? (u32)max(sum, 1ull) : 0;
        bool raw = false;
        if (nonconst) {
            // CollisionTest::raw. Everything here is the same on every lane (warp sums).
            if (sum != 0 && sum <= (1ull << 16)) {
                u64 nn = sum;
                const u64 base = 2 * nn * log2_q16(nn);
                auto bound = [&](u64 s) {
                    u64 sub = nn * (log2_q16(s) + 2) + 2 * nn;
                    return base > sub ? base - sub : 0;
                };
                auto fails = [&](u64 s) { return !stays_coded(bound(s), nn, thr); };
                if (nn != last_n) {
                    last_n = nn;
                    last_some = fails(1);
                    if (last_some) {
                        // The largest s in 1..=nn^2 that fails (the core bisects; `fails` is
                        // monotone, so any search finds the same s): 32 candidates a round, one
                        // per lane, ~7 rounds instead of ~32 sequential logarithms of large
                        // values (13% of the search's instructions when lane 0 bisected).
                        u64 lo = 1, hi = nn * nn;
                        while (lo < hi) {
                            const u64 span = hi - lo; // < 2^32: the lanes' points need no 128 bits
                            const u64 p = lo + (span * (lane + 1) + 31) / 32;
                            const u32 m = __ballot_sync(FULL, fails(p));
                            // Monotone: the failing lanes are a prefix.
                            const u64 p0 = __shfl_sync(FULL, p, 0);
                            if (m == 0) {
                                hi = p0 - 1;
                            } else {
                                const u32 j = 31 - __clz(m);
                                const u64 pj = __shfl_sync(FULL, p, j);
                                const u64 pn = __shfl_sync(FULL, p, min(j + 1, 31u));
                                lo = pj;
                                if (j < 31) hi = pn - 1;
                            }
                        }
                        last_limit = lo;
                    }
                }
                raw = last_some && sq <= last_limit;
            }
            if (!raw) all_raw_local = false;
        }
        if (job.flat_stride != 0 && i % job.flat_stride == 0 && !(nonconst && raw)) probe_fails_local = true;
    }
    bool not_all_raw = cl_any(cl, !all_raw_local);
    // Flat probes: no tables, whatever the other blocks hold.
    if (job.flat_stride != 0 && !cl_any(cl, probe_fails_local)) return 0;
    // Compaction: the non-constant blocks' indices in order; this block's go after those of the
    // blocks before it (their counts crossed the cluster).
    {
        u32 mine = 0;
        for (u32 i = i0 + threadIdx.x; i < i1; i += NT) mine += L.lens[i] != 0;
        const u64 m = block_sum64(sh, mine);
        if (threadIdx.x == 0) cl_slot(cl)[0] = m;
        cl_sync();
        if (threadIdx.x == 0) {
            u32 at = 0;
            for (u32 r = 0; r < cl.size; r++) {
                sh.bstart[r] = at;
                at += (u32)cl_peer(cl, r)[0];
            }
            for (u32 r = cl.size; r <= MAX_CLUSTER; r++) sh.bstart[r] = at;
        }
        cl.par ^= 1;
        __syncthreads();
    }
    const u32 nb = sh.bstart[MAX_CLUSTER];
    L.b0 = sh.bstart[cl.rank];
    L.b1 = sh.bstart[cl.rank + 1];
    {
        u32 at0 = L.b0;
        for (u32 base = i0; base < i1; base += NT) {
            u32 i = base + threadIdx.x;
            u32 len = i < i1 ? L.lens[i] : 0;
            u32 tot;
            u32 at = block_scan32(sh, len != 0, &tot);
            if (len != 0) L.idx[at0 + at] = i;
            at0 += tot;
        }
    }
    __syncthreads();
    if (nb == 0 || !not_all_raw) return 0;
    // Lengths by compacted index (the flags pass wrote them by sampled index). A block's compacted
    // share may lie in sampled blocks another block read its lengths from: the cluster waits
    // between the reads and the writes.
    for (u32 b = L.b0 + threadIdx.x; b < L.b1; b += NT) L.ideal[b] = L.lens[L.idx[b]];
    cl_sync();
    for (u32 b = L.b0 + threadIdx.x; b < L.b1; b += NT) L.lens[b] = (u32)L.ideal[b];
    __syncthreads();
    // 2. The support: symbols some non-constant block has, and their totals.
    {
        u32 s = threadIdx.x & 255, part = threadIdx.x >> 8; // four threads per symbol
        u64 t = 0;
#pragma unroll 8
        for (u32 b = L.b0 + part; b < L.b1; b += 4) t += hists[(u64)L.idx[b] * job.stride + s];
        if (part == 0) sh.total[s] = 0;
        __syncthreads();
        atomicAdd(&sh.total[s], t);
        __syncthreads();
        // The blocks' totals summed (in every block alike).
        if (threadIdx.x < 256) cl_slot(cl)[threadIdx.x] = sh.total[threadIdx.x];
        cl_sync();
        if (threadIdx.x < 256) {
            u64 all = 0;
            for (u32 r = 0; r < cl.size; r++) all += cl_peer(cl, r)[threadIdx.x];
            sh.total[threadIdx.x] = all;
        }
        cl.par ^= 1;
        __syncthreads();
    }
    // Whether each symbol was seen (a total > 0: counts are non-negative), compacted in order.
    {
        u32 s = threadIdx.x;
        bool seen = s < 256 && sh.total[s] != 0;
        u32 tot;
        u32 at = block_scan32(sh, seen, &tot);
        u64 t = s < 256 ? sh.total[s] : 0;
        __syncthreads();
        if (seen) sh.syms[at] = (u8)s;
        __syncthreads();
        if (seen) sh.total[at] = t;
        if (s < 256) sh.col_of[s] = seen ? (u16)at : (u16)NONE;
        if (threadIdx.x == 0) sh.nsyms = tot;
        __syncthreads();
    }
    const u32 ns = sh.nsyms;
    // What the attempts below read most, into shared memory as far as it fits (after the per-block
    // arrays, `tz_search`): the dense rows, the tables' code lengths, the cost columns, the Lloyd
    // sums. In a cluster of several blocks only this block's own arrays (its tables' code lengths
    // and Lloyd sums): the dense rows and cost columns are indexed over the whole plane, and
    // another block reads the seed's row.
    if (cl.size == 1) to_arena(L, L.rows, (u64)ns * nb * 2);
    to_arena(L, L.clen[0], (u64)max_tables * 256 * 4);
    to_arena(L, L.clen[1], (u64)max_tables * 256 * 4);
    if (cl.size == 1) {
        to_arena(L, L.col[0], (u64)max_tables * nb * 8);
        to_arena(L, L.col[1], (u64)max_tables * nb * 8);
    }
    to_arena(L, L.lsum, (u64)max_tables * 256 * 8);
    // Dense rows, column-major (a thread per block and symbol, so that a small share keeps the
    // threads busy); ideal costs.
    const u32 share = L.b1 - L.b0;
    bool wide = false;
    for (u32 w = threadIdx.x; w < share * ns; w += NT) {
        const u32 b = L.b0 + w % share, i = w / share;
        const u32 v = hists[(u64)L.idx[b] * job.stride + sh.syms[i]];
        wide |= v > 0xFFFFu;
        L.rows[(u64)i * nb + b] = (u16)v;
    }
    // Counts from blocks longer than the format allows (not from this engine's histograms): the
    // plane is refused (status 2; the host reports it) rather than searched on truncated rows.
    if (cl_any(cl, wide)) {
        if (threadIdx.x == 0 && cl.rank == 0) ((u32*)out)[2] = 2;
        return 0;
    }
    for (u32 b = L.b0 + threadIdx.x; b < L.b1; b += NT) {
        u64 nn = 0, shl = 0;
#pragma unroll 4
        for (u32 i = 0; i < ns; i++) {
            u64 v = L.rows[(u64)i * nb + b];
            nn += v;
            if (v) shl += v * log2_q16(v);
        }
        L.ideal[b] = nn * log2_q16(nn) - shl;
    }
    __syncthreads();
    // No block stays coded even at its entropy: nothing to search.
    {
        bool coded = false;
        for (u32 b = L.b0 + threadIdx.x; b < L.b1; b += NT) coded |= stays_coded(L.ideal[b], L.lens[b], thr);
        if (!cl_any(cl, coded)) return 0;
    }
    // 3. Table 0 from the totals; its column; the choice.
    int cur = 0;
    u32 nt = 1;
    support_table(sh, L, sh.total, cur, 0);
    if (threadIdx.x == 0) L.fromv[cur][0] = 0;
    column(sh, L, cur, 0, nb);
    least_and_choice(L, cur, 1, nb, thr);
    for (u32 b = L.b0 + threadIdx.x; b < L.b1; b += NT) L.rej[b] = 0;
    __syncthreads();
    // The block of the cluster that owns compacted block b (b < nb).
    auto owner = [&](u32 b) {
        u32 r = 0;
        while (r + 1 < cl.size && sh.bstart[r + 1] <= b) r++;
        return r;
    };
    // The seed's row and `rej` entry are read by every block: from global memory past the L1
    // cache (another SM wrote them) where the cluster has several blocks.
    auto row_at = [&](u32 i, u32 b) -> u32 {
        const u16* p = L.rows + (u64)i * nb + b;
        return cl.size > 1 ? (u32)__ldcg((const unsigned short*)p) : (u32)*p;
    };
    u64 attempt = 0;
    while (nt < max_tables && attempt < 2ull * max_tables) {
        attempt++;
        // Regrets and their sum; the blocks' cost under their choices (a trial's `before`
        // below: `cur` does not change within an attempt).
        u64 part = 0, cost = 0;
        for (u32 b = L.b0 + threadIdx.x; b < L.b1; b += NT) {
            u64 c = L.cc[cur][b], id = L.ideal[b];
            part += c > id ? c - id : 0;
            cost += c;
        }
        u64 sum, before_me;
        cl_sum2(sh, cl, part, cost, &sum, &cost, &before_me);
        if (sum == 0) break;
        // The CPU's stop (cluster.rs, REGRET_STOP): no later table can save more than the
        // regrets' sum, so the search ends once 200 times it is under the blocks' cost under their
        // choices (FORMAT.md section 7).
        if (lt128(mul64(sum, 200), U128{0, cost})) break;
        U128 prod = mul64(sum, (attempt * 0x9E3779B9ull) & 0xFFFFFFFFull);
        u64 target = (prod.hi << 32) | (prod.lo >> 32);
        // The seed: the first block whose running sum of regrets passes the target. Threads take
        // contiguous runs of this block's share, after the regrets of the blocks before it.
        u32 per = (share + NT - 1) / NT;
        u32 b0 = min(L.b0 + threadIdx.x * per, L.b1), b1 = min(b0 + per, L.b1);
        u64 local = 0;
        for (u32 b = b0; b < b1; b++) {
            u64 c = L.cc[cur][b], id = L.ideal[b];
            local += c > id ? c - id : 0;
        }
        // Exclusive prefix of `local` over threads (64-bit: warp scan, then warps).
        u64 x = local;
        for (int o = 1; o < 32; o <<= 1) {
            u64 y = __shfl_up_sync(FULL, x, o);
            if (lane >= (u32)o) x += y;
        }
        if (threadIdx.x == 0) sh.seed = 0xFFFFFFFFu;
        __syncthreads();
        if (lane == 31) sh.red[warp] = x;
        __syncthreads();
        u64 acc = before_me + x - local;
        for (u32 w = 0; w < warp; w++) acc += sh.red[w];
        for (u32 b = b0; b < b1; b++) {
            u64 c = L.cc[cur][b], id = L.ideal[b];
            acc += c > id ? c - id : 0;
            if (acc > target) { atomicMin(&sh.seed, b); break; }
        }
        __syncthreads();
        // The first over the cluster (the last block where none passes).
        if (threadIdx.x == 0) cl_slot(cl)[0] = sh.seed;
        cl_sync();
        u32 seed = 0xFFFFFFFFu;
        for (u32 r = 0; r < cl.size; r++) seed = min(seed, (u32)cl_peer(cl, r)[0]);
        cl.par ^= 1;
        if (seed == 0xFFFFFFFFu) seed = nb - 1;
        const u32 seed_owner = owner(seed);
        const bool own_seed = seed_owner == cl.rank;
        if (cl.size > 1 ? __ldcg(L.rej + seed) : L.rej[seed]) continue;
        // The candidate: the seed's counts; it must improve its own block first.
        int tr = 1 - cur;
        if (warp == 0) {
            // The seed's row over the support, kept in the trial bank's free `from` slot (the
            // candidate's own: it was made from no sums yet), and the candidate from it, on warp 0
            // while the other warps copy the bank: the copy touches tables 0..nt only, the
            // candidate is table nt (its codes, frequencies, lengths, span, `from` row and flag).
            // Before 2026-12-04 the copy, the row and the table (warp 0, the block waiting at a
            // barrier) ran one after another. H200, 1 GiB, three alternating rounds of five runs:
            // encode 317.6-319.7 -> 322.3-325.4 GB/s (bf16), 345.1-349.7 -> 347.4-351.2 (fp32);
            // the search's step of the event trace 0.417 -> 0.393 ms (one trace each).
            u64* seed_counts = L.from[tr] + (u64)nt * 256;
            for (u32 i = lane; i < ns; i += 32) seed_counts[i] = row_at(i, seed);
            __syncwarp();
            u32 span = 0, afreq = 0;
            if (warp_support_table(sh, seed_counts, &span, &afreq)) warp_commit(sh, L, span, afreq, tr, nt);
            if (lane == 0) L.fromv[tr][nt] = 0;
        } else {
            copy_bank(L, cur, tr, nt, nb, threadIdx.x - 32, NT - 32);
        }
        __syncthreads();
        column(sh, L, tr, nt, nb);
        u32 tn = nt + 1;
        // The candidate's column against the current least costs (it wins only if strictly less).
        // Made before the seed's own test below (on a rejection the trial bank is dropped), so
        // that the test's verdict crosses the cluster with the Lloyd sums.
        for (u32 b = L.b0 + threadIdx.x; b < L.b1; b += NT) {
            u64 c = L.col[tr][(u64)nt * nb + b];
            if (c < L.lc[tr][b]) { L.lc[tr][b] = c; L.lj[tr][b] = (u8)nt; }
            u64 best = L.lc[tr][b];
            if (best != NO_COST && stays_coded(best, L.lens[b], thr)) {
                L.cs[tr][b] = L.lj[tr][b];
                L.cc[tr][b] = best;
            } else {
                L.cs[tr][b] = SEL_RAW;
                L.cc[tr][b] = raw_cost(L.lens[b]);
            }
        }
        __syncthreads();
        // Lloyd step(s): each table (but 0) renormalised from the summed counts of the blocks
        // that chose it. The sums of every table in one pass (one warp per support column, eight
        // tables at a time in registers); then one warp per table: a table whose sums are those it
        // was made from stays as it is, one whose sums are zero too; a changed one gets its
        // column again. In a cluster of several blocks each block sums its share into its
        // exchange slot (32-bit words from the slot's second u64) and every block adds the
        // blocks' sums alike.
        u64* xslot = cl_slot(cl);
        u32* xsums = (u32*)(xslot + 1);
        bool rejected = false;
        for (int it = 0; it < 1; it++) {
            for (u32 g = 1; g < tn; g += 8) {
                for (u32 i = warp; i < ns; i += NW) {
                    // A lane sums at most ceil(nb / 32) counts below 2^16: 32 bits hold them (nb
                    // is at most MAX_SAMPLED, checked at the kernel's start).
                    u32 acc[8];
#pragma unroll
                    for (int t = 0; t < 8; t++) acc[t] = 0;
#pragma unroll 4
                    for (u32 b = L.b0 + lane; b < L.b1; b += 32) {
                        const u32 d = (u32)L.cs[tr][b] - g;
                        const u32 v = L.rows[(u64)i * nb + b];
#pragma unroll
                        for (int t = 0; t < 8; t++) acc[t] += d == (u32)t ? v : 0u;
                    }
#pragma unroll
                    for (int t = 0; t < 8; t++) {
                        // The warp's sum is below nb * 2^16 <= 2^29: 32-bit shuffles suffice.
                        u32 a = warp_sum32(acc[t]);
                        if (lane == 0 && g + t < tn) {
                            if (cl.size == 1) {
                                L.lsum[(u64)(g + t) * 256 + i] = a;
                            } else {
                                xsums[(g + t - 1) * ns + i] = a;
                            }
                        }
                    }
                }
            }
            // The candidate must improve its own block first: the seed's owner tests it.
            if (threadIdx.x == 0 && own_seed) {
                u64 c = L.col[tr][(u64)nt * nb + seed];
                u64 seed_cost = c != NO_COST && stays_coded(c, L.lens[seed], thr) ? c : raw_cost(L.lens[seed]);
                xslot[0] = seed_cost >= L.cc[cur][seed];
            }
            cl_sync();
            rejected = cl_peer(cl, seed_owner)[0] != 0;
            if (!rejected && cl.size > 1) {
                for (u32 w = threadIdx.x; w < (tn - 1) * ns; w += NT) {
                    u64 all = 0;
                    for (u32 r = 0; r < cl.size; r++) all += ((const u32*)(cl_peer(cl, r) + 1))[w];
                    L.lsum[(u64)(1 + w / ns) * 256 + w % ns] = all;
                }
            }
            cl.par ^= 1;
            if (rejected) break;
            if (threadIdx.x == 0) sh.ndirty = 0;
            __syncthreads();
            for (u32 j = 1 + warp; j < tn; j += NW) {
                const u64* sum = L.lsum + (u64)j * 256;
                u64* made = L.from[tr] + (u64)j * 256;
                if (L.fromv[tr][j]) {
                    bool diff = false;
                    for (u32 i = lane; i < ns; i += 32) diff |= made[i] != sum[i];
                    if (!__any_sync(FULL, diff)) continue;
                }
                u32 span = 0, afreq = 0;
                if (!warp_support_table(sh, sum, &span, &afreq)) continue;
                bool diff = false;
                for (u32 s = lane; s < 256; s += 32) diff |= sh.codes[warp][s] != L.codes[tr][(u64)j * 256 + s];
                if (__any_sync(FULL, diff)) {
                    warp_commit(sh, L, span, afreq, tr, j);
                    if (lane == 0) sh.dirty[atomicAdd(&sh.ndirty, 1)] = j;
                }
                for (u32 i = lane; i < ns; i += 32) made[i] = sum[i];
                if (lane == 0) L.fromv[tr][j] = 1;
            }
            __syncthreads();
            if (sh.ndirty == 0) break;
            columns(sh, L, tr, nb);
            least_and_choice(L, tr, tn, nb, thr);
        }
        if (rejected) {
            if (threadIdx.x == 0 && own_seed) L.rej[seed] = 1;
            __syncthreads();
            continue;
        }
        // Accept if the saving, scaled to the plane, beats the added table bytes.
        u64 pa = 0;
        for (u32 b = L.b0 + threadIdx.x; b < L.b1; b += NT) pa += L.cc[tr][b];
        u64 before = cost, after = cl_sum64(sh, cl, pa);
        u64 added = ((u64)(table_bytes(L, tr, tn) - table_bytes(L, cur, nt)) * 8) << FRAC_BITS;
        u64 gain = before > after ? before - after : 0;
        if (scaled_le(gain, job.n_blocks, n, added)) {
            if (threadIdx.x == 0 && own_seed) L.rej[seed] = 1;
            __syncthreads();
            continue;
        }
        cur = tr;
        nt = tn;
        for (u32 b = L.b0 + threadIdx.x; b < L.b1; b += NT) L.rej[b] = 0;
        __syncthreads();
    }
    // The tables must pay for themselves.
    u64 part = 0;
    for (u32 b = L.b0 + threadIdx.x; b < L.b1; b += NT)
        if (L.cs[cur][b] != SEL_RAW) part += raw_cost(L.lens[b]) - L.cc[cur][b];
    u64 saving = cl_sum64(sh, cl, part);
    u64 tb = ((u64)table_bytes(L, cur, nt) * 8) << FRAC_BITS;
    if (scaled_le(saving, job.n_blocks, n, tb)) return 0;
    // Keep table 0 and every table some block chose (the blocks' choices ORed over the cluster,
    // a bit per table: at most 64); block 0 serialises them in order.
    __shared__ u32 used[64];
    if (threadIdx.x < 64) used[threadIdx.x] = threadIdx.x == 0;
    __syncthreads();
    for (u32 b = L.b0 + threadIdx.x; b < L.b1; b += NT)
        if (L.cs[cur][b] != SEL_RAW) used[L.cs[cur][b]] = 1;
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 mask = 0;
        for (u32 j = 0; j < nt; j++) mask |= (u64)(used[j] != 0) << j;
        cl_slot(cl)[0] = mask;
    }
    cl_sync();
    if (threadIdx.x < nt) {
        u64 mask = 0;
        for (u32 r = 0; r < cl.size; r++) mask |= cl_peer(cl, r)[0];
        used[threadIdx.x] = (u32)(mask >> threadIdx.x) & 1;
    }
    cl.par ^= 1;
    __syncthreads();
    u32 kept = 0;
    for (u32 j = 0; j < nt; j++) kept += used[j] != 0;
    if (cl.rank != 0) return kept;
    // One warp per table: its lowest and highest present symbols by ballot, its serialised length
    // (0 if unused); then each warp finds its table's place from the lengths before it and writes
    // its bytes, one lane per byte. (Thread 0 alone, one dependent global load per code, was 9% of
    // the search's stall samples in an ncu profile of 1 GiB bf16: the block waited for it.)
    // The first pass keeps each table's range in `slo` / `shi` for the second.
    __shared__ u32 slen[64], slo[64], shi[64];
    for (u32 j = warp; j < nt; j += NW) {
        const u8* c = L.codes[cur] + (u64)j * 256;
        u32 lo, hi;
        warp_present_range(c, &lo, &hi);
        // An all-zero row (never kept: a table has its anchor) would serialise as (0, 0), no codes.
        if (lane == 0) {
            slen[j] = used[j] ? 2 + (lo <= hi ? hi - lo + 1 : 0) : 0;
            slo[j] = lo;
            shi[j] = hi;
        }
    }
    __syncthreads();
    for (u32 j = warp; j < nt; j += NW) {
        if (!used[j]) continue;
        u32 at = OUT_HEAD;
        for (u32 i = 0; i < j; i++) at += slen[i];
        const u8* c = L.codes[cur] + (u64)j * 256;
        const u32 lo = slo[j], hi = shi[j];
        if (lane == 0) {
            out[at] = (u8)lo;
            out[at + 1] = (u8)hi;
        }
        for (u32 sym = lo + lane; sym <= hi; sym += 32) out[at + 2 + sym - lo] = c[sym];
    }
    u32 at = OUT_HEAD;
    for (u32 j = 0; j < nt; j++) at += slen[j];
    if (threadIdx.x == 0) ((u32*)out)[3] = at;
    __syncthreads();
    return kept;
}

// The conditional table (`model::choose_conditional`), one warp per condition value (spread over
// the cluster's blocks); block 0 writes it after the plane's output.
__device__ void conditional(Shared& sh, Cl& cl, const SearchJob& job, u8* out) {
    const u32* joint = (const u32*)job.joint;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u64 table_cost = ((u64)(2 + 2 + 256) * 8) << FRAC_BITS;
    const u64 ns = job.n_sampled, nbk = job.n_blocks;
    __shared__ u64 sc_hi[256], sc_lo[256];
    __shared__ u8 ok[256];
    // This block's values: e = NW (rank + size k) + warp.
    auto mine = [&](u32 e) { return (e / NW) % cl.size == cl.rank; };
    for (u32 e = cl.rank * NW + warp; e < 256; e += cl.size * NW) {
        const u32* row = joint + e * 256;
        u64 c[8];
        u64 nn = 0, shl = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            c[k] = row[lane + 32 * k];
            nn += c[k];
            if (c[k]) shl += c[k] * log2_q16(c[k]);
        }
        nn = warp_sum64(nn);
        shl = warp_sum64(shl);
        bool good = false;
        U128 scaled{0, 0};
        if (nn != 0) {
            u64 raw = (8 * nn) << FRAC_BITS;
            u64 ideal = nn * log2_q16(nn) - shl;
            u64 b1 = raw + nn;
            u64 bound = b1 > ideal ? b1 - ideal : 0;
            bool skip = (bound << 6) < raw || scaled_le(bound, nbk, ns, table_cost);
            if (!skip) {
                u8* codes = sh.codes[warp];
                u32 span, afreq;
                warp_normalize([&](u32 s) { return (u64)row[s]; }, [](u32) { return true; }, codes, &span, &afreq);
                // the cost of the row under its table
                u64 cost = 0;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    u32 cd = codes[lane + 32 * k];
                    u32 f = cd == ANCHOR ? afreq : code_to_freq(cd);
                    cost += c[k] * code_len(f);
                }
                cost = warp_sum64(cost);
                if (cost <= raw) {
                    u64 saving = raw - cost;
                    scaled = div128(mul64(saving, nbk), ns);
                    bool over = scaled.hi != 0 || scaled.lo > table_cost;
                    good = (saving << 6) >= raw && over;
                }
            }
        }
        if (lane == 0) {
            ok[e] = good;
            sc_hi[e] = scaled.hi;
            sc_lo[e] = scaled.lo;
        }
    }
    __syncthreads();
    // The first value of the largest saving: this block's, then over the cluster (a later value
    // wins only with a larger saving).
    if (threadIdx.x == 0) {
        int best = -1;
        for (int e = 0; e < 256; e++) {
            if (!mine(e) || !ok[e]) continue;
            if (best < 0 || lt128(U128{sc_hi[best], sc_lo[best]}, U128{sc_hi[e], sc_lo[e]})) best = e;
        }
        u64* my = cl_slot(cl);
        my[0] = best < 0 ? 0 : 0x100 | best;
        my[1] = best < 0 ? 0 : sc_hi[best];
        my[2] = best < 0 ? 0 : sc_lo[best];
    }
    cl_sync();
    if (threadIdx.x == 0) {
        u64 pick = 0;
        U128 top{0, 0};
        for (u32 r = 0; r < cl.size; r++) {
            const u64* p = cl_peer(cl, r);
            const u64 e = p[0];
            const U128 v{p[1], p[2]};
            if (e == 0) continue;
            if (pick == 0 || lt128(top, v) || (!lt128(v, top) && e < pick)) {
                pick = e;
                top = v;
            }
        }
        sh.seed = (u32)pick;
    }
    cl.par ^= 1;
    __syncthreads();
    u32 pick = sh.seed;
    if (pick && warp == 0 && cl.rank == 0) {
        u32 e = pick & 255;
        const u32* row = joint + e * 256;
        u8* codes = sh.codes[0];
        u32 span, afreq;
        warp_normalize([&](u32 s) { return (u64)row[s]; }, [](u32) { return true; }, codes, &span, &afreq);
        if (lane == 0) {
            u32 at = ((u32*)out)[3];
            out[at++] = 0;
            out[at++] = 255;
            for (int s = 0; s < 256; s++) out[at++] = codes[s];
            ((u32*)out)[3] = at;
            ((u32*)out)[1] = pick;
        }
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(NT, 1) tz_search(const SearchJob* __restrict__ jobs, SearchParams params) {
    __shared__ Shared sh;
    extern __shared__ __align__(16) u8 arena[];
    Cl cl;
#if __CUDA_ARCH__ >= 900
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(cl.rank));
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(cl.size));
#else
    cl.rank = 0;
    cl.size = 1;
#endif
    // The cluster's blocks are consecutive (a one-dimensional cluster), `size` per job.
    const SearchJob job = jobs[blockIdx.x / cl.size];
    u8* out = (u8*)job.out;
    if (threadIdx.x == 0 && cl.rank == 0) {
        ((u32*)out)[0] = 0;
        ((u32*)out)[1] = 0;
        ((u32*)out)[2] = 0;
        ((u32*)out)[3] = OUT_HEAD;
    }
    // The exchange slots lead the launch's dynamic shared memory (src/search.rs `exchange_words`:
    // room for the Lloyd sums of a cluster of several blocks, 256 u64 otherwise).
    cl.xw = cl.size > 1 ? max(256u, 1 + 128 * params.max_tables) : 256u;
    cl.par = 0;
    cl.x = (u64*)arena;
    u32 arena_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(arena_bytes));
    Layout L = layout((u8*)job.scratch, job.n_sampled, params.max_tables, cl.rank);
    // Every check here is the same in every block of a cluster (the same job, launch and sizes),
    // so they return together, before any exchange.
    if (L.bytes > job.scratch_len || params.max_tables > 64 || params.max_tables == 0 || job.n_sampled == 0 ||
        job.n_sampled > MAX_SAMPLED || cl.size > MAX_CLUSTER || (u64)arena_bytes < 16ull * cl.xw) {
        if (threadIdx.x == 0 && cl.rank == 0) ((u32*)out)[2] = 1;
        return;
    }
    // The rest of the launch's dynamic shared memory (src/search.rs `SEARCH_ARENA`: 128 KiB where
    // the device has it) takes the per-block arrays first, the attempts' most used, then `cluster`
    // gives what is left to the arrays sized by the support. In a cluster of several blocks the
    // per-block arrays stay in global memory (indexed over the whole plane).
    L.arena = arena + 16ull * cl.xw;
    L.arena_left = arena_bytes - 16ull * cl.xw;
    if (cl.size == 1) {
        const u64 n = job.n_sampled;
        for (int k = 0; k < 2; k++) {
            to_arena(L, L.cs[k], n);
            to_arena(L, L.cc[k], n * 8);
            to_arena(L, L.lc[k], n * 8);
            to_arena(L, L.lj[k], n);
        }
        to_arena(L, L.lens, n * 4);
        to_arena(L, L.ideal, n * 8);
        to_arena(L, L.idx, n * 4);
        to_arena(L, L.rej, n);
    }
    __syncthreads();
    u32 kept = cluster(sh, cl, job, L, params.max_tables, params.threshold, out);
    if (threadIdx.x == 0 && cl.rank == 0) ((u32*)out)[0] = kept;
    __syncthreads();
    if (kept == 0 && job.joint != 0) conditional(sh, cl, job, out);
    // No block leaves while another may still read its exchange slots.
    cl_sync();
}

// ---- the encoder's tables from the search's outputs (`tz_enc_tables`) ----
//
// One block of 256 threads per plane reads the plane's output (the search's, or the host's in the
// same layout where the host searched: src/search.rs `write_out`) and writes its tables in the
// encode kernel's form into their fixed slots, so that the encode kernel follows the search on the
// stream with no host round trip in between. Every check of the format's table parser
// (`FreqTable::parse`) and of the host's `parse_out` is made again: a plane whose output fails one
// gets no tables (the plane is coded raw) and adds nothing to its blob's head, and the host, which
// parses the same bytes while the encoder runs, refuses the call (and compares what this kernel
// wrote into the tensors' parameters with its own parse).

#define SEL_CONST 254u

struct TablesJob {
    u64 out;         // the plane's output (`out_bytes` bytes)
    u64 n_tables;    // u32*: its tensor's EncParams.n_tables[plane]
    u64 cond_plane;  // u32*: EncParams.cond_plane (written only where the plane gets a conditional table)
    u64 cond_value;  // u32*: EncParams.cond_value (likewise)
    u64 head;        // u64*: EncParams.dst_base, to which the plane's serialised tables' bytes are added
    u64 const_sel;   // u8[256]: the plane's selector of a constant block of each byte value
    u32 table;       // the plane's first table slot; its conditional table's is table + max_tables
    u32 plane;       // the plane's index in its tensor
    u32 conditioned; // whether the plane may have a conditional table
    u32 pad;
};

struct TablesParams {
    u32 max_tables;
    u32 out_bytes; // bytes of one plane's output
};

// Exclusive prefix sum of one value per thread of a 256-thread block; `*total` gets the sum.
__device__ u32 scan256_excl(u32 v, u32* total) {
    __shared__ u32 warp_tot[8];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 x = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        u32 y = __shfl_up_sync(FULL, x, d);
        if (lane >= (u32)d) x += y;
    }
    __syncthreads();
    if (lane == 31) warp_tot[warp] = x;
    __syncthreads();
    u32 before = 0, all = 0;
#pragma unroll
    for (u32 w = 0; w < 8; w++) {
        before += w < warp ? warp_tot[w] : 0;
        all += warp_tot[w];
    }
    *total = all;
    return before + x - v;
}

// Checks and expands the table serialised at out[at..end) into slot `slot`: per symbol its encoder
// entry (ceil(2^44 / f) in two words, the cumulative frequency, 4096 - f; zero for an absent
// symbol; `push` in encode.cu) and its code length, and the table's
// info word (1 << 31 | symbol for a one-symbol table). `all_present`: a conditional table, which
// must have every symbol. Returns the serialised length, or 0 if the table is invalid (the same
// outputs as `FreqTable::parse`), and the one symbol of a one-symbol table in `*single` (else -1).
// Called by all threads with the same arguments.
__device__ u32 expand_table(const u8* out, u32 at, u32 end, u32 slot, bool all_present, uint4* fcs, u32* cls,
                            u32* info, int* single) {
    if (at + 2 > end) return 0;
    const u32 lo = out[at], hi = out[at + 1];
    if (lo > hi) return 0;
    const u32 len = 3 + hi - lo;
    if (at + len > end) return 0;
    const u32 s = threadIdx.x;
    const u32 code = (s >= lo && s <= hi) ? (u32)out[at + 2 + s - lo] : 0u;
    bool bad = code > 207 && code != ANCHOR;
    bad |= (s == lo || s == hi || all_present) && code == 0;
    const int n_bad = __syncthreads_count(bad);
    const int n_anchor = __syncthreads_count(code == ANCHOR);
    if (n_bad != 0 || n_anchor != 1) return 0;
    u32 f = (code == 0 || code == ANCHOR) ? 0u : code_to_freq(code);
    u32 sum;
    scan256_excl(f, &sum);
    if (sum >= PROB_SCALE) return 0;
    if (code == ANCHOR) f = PROB_SCALE - sum;
    const u32 cum = scan256_excl(f, &sum);
    const u64 m = f == 0 ? 0ull : ((1ull << 44) + f - 1) / f;
    fcs[(u64)slot * 256 + s] = f == 0 ? make_uint4(0u, 0u, 0u, 0u)
                                      : make_uint4((u32)m, (u32)(m >> 32), cum, PROB_SCALE - f);
    cls[(u64)slot * 256 + s] = f == 0 ? CL_ABSENT : code_len(f);
    if (s == 0) {
        info[slot] = lo == hi ? (1u << 31 | lo) : 0u;
        *single = lo == hi ? (int)lo : -1;
    }
    __syncthreads();
    return len;
}

extern "C" __global__ void __launch_bounds__(256) tz_enc_tables(const TablesJob* __restrict__ jobs, TablesParams P,
                                                                uint4* __restrict__ fcs, u32* __restrict__ cls,
                                                                u32* __restrict__ info) {
    __shared__ int single[64];
    const TablesJob job = jobs[blockIdx.x];
    const u8* out = (const u8*)job.out;
    const u32* head = (const u32*)job.out;
    const u32 kept = head[0], cond = head[1], status = head[2], end = head[3];
    bool ok = status == 0 && kept <= P.max_tables && P.max_tables <= 64 && end >= 16 && end <= P.out_bytes;
    u32 at = 16;
    for (u32 k = 0; ok && k < kept; k++) {
        const u32 len = expand_table(out, at, end, job.table + k, false, fcs, cls, info, &single[k]);
        ok = len != 0;
        at += len;
    }
    bool has_cond = false;
    if (ok && cond != 0) {
        ok = (cond >> 8) == 1 && job.conditioned && kept == 0;
        int unused;
        const u32 len = ok ? expand_table(out, at, end, job.table + P.max_tables, true, fcs, cls, info, &unused) : 0u;
        ok = len != 0;
        at += len;
        has_cond = ok;
    }
    ok = ok && at == end;
    has_cond = has_cond && ok;
    __syncthreads();
    // The selector of a constant block of byte value v: the first one-symbol table of v, else the
    // constant mode (`model::const_selector`).
    u32 pick = SEL_CONST;
    for (u32 k = 0; ok && k < kept; k++)
        if (single[k] == (int)threadIdx.x) {
            pick = k;
            break;
        }
    ((u8*)job.const_sel)[threadIdx.x] = (u8)pick;
    if (threadIdx.x == 0) {
        *(u32*)job.n_tables = ok ? kept : 0u;
        if (has_cond) {
            *(u32*)job.cond_plane = job.plane;
            *(u32*)job.cond_value = cond & 255u;
        }
        // The plane's bytes in the blob's head: its table count, its tables, and 0 or (1, value)
        // before the conditional table (`Model::write_tables`).
        if (ok) atomicAdd((unsigned long long*)job.head, (unsigned long long)(1 + (end - 16) + (has_cond ? 2 : 1)));
    }
}

// ---------------------------------------------------------------------------------------------
// Format version 2's pair model on the device (FORMAT.md section 12; the core's `model::pair_plane`,
// decision for decision), for each bf16 tensor a call may pair, on the stream after `tz_enc_tables`
// (whose code lengths of plane 1's version 1 tables the blocks choose by): per tensor `tz_pair_top`
// (step 1), per batch of sampled blocks `tz_pair_groups` (each block's version 1 choice, and
// step 2: the pair weights h[a] h[b] of each block's histogram, summed per table), per tensor
// `tz_pair_table` (step 3), per tensor `tz_pair_tables` and per (tensor, table) `tz_pair_expand`
// (step 4), per sampled block `tz_pair_cost` (step 6's sums), per tensor `tz_pair_decide` (step 6;
// the encode kernel's `PairBlock`, the output for the host's blob head, the tensor's parameters).
// Nothing reads the tensor's units: the model is made of the sampled blocks' histograms. Per-block
// work spread over the GPU: one thread block per tensor walking its sampled blocks took ~1.3 ms for
// 1 GiB of bf16 (H100). Histogram counts fit 32 bits (a tensor samples at most MAX_SAMPLED blocks
// of at most 65536 units, 2^29 units); the pair weights and squares are summed in 64 bits (a
// block's at most 2^32 each).

struct PairJob {
    u64 hists;      // u32: plane 1's histogram of sampled block 0; block i's at hists + i * stride
    u64 top;        // u8[256]: the top map (tz_pair_top writes it); then u32[256] totals and a u32
                    // ticket for tz_pair_top, zeroed by the host (`pair_model::TOP_BYTES` in all)
    u64 cls;        // u32: the code lengths of plane 1's version 1 tables (tz_enc_tables), 256 a table
    u64 n_tables;   // u32*: EncParams.n_tables[1] (tz_enc_tables wrote it)
    u64 pair;       // u64*: EncParams.pair (written where the plane pairs)
    u64 head;       // u64*: EncParams.dst_base (the head's length change added)
    u64 v1_out;     // plane 1's search output (its version 1 tables, serialised)
    u64 area;       // 16-byte aligned, `pair_area` below: the PairBlock, then for max_tables tables
                    // their entries, code lengths and info words, then the model's scratch
    u64 out;        // for the host: u32 [paired, tables, end, 0], then the pair field (D, D pairs)
                    // and the rank tables, serialised
    u64 n_blocks;
    u32 stride;     // u32 between two sampled blocks' histograms
    u32 n_sampled;
    u32 planes;     // the tensor's planes (a version 2 head has a pair field for each)
    u32 threshold;  // Q16
};

// One sampled block of a tensor that may pair (`tz_pair_groups`, `tz_pair_cost`).
struct PairSampleJob {
    u32 tensor;  // its PairJob
    u32 block;   // its index among the tensor's sampled blocks
};

#define PAIR_MAX 128u
// The PairBlock (encode.cu): the top map (16 for others), the 17 x 17 ranks, the key ranks, the
// escape rank.
#define PAIR_RANK17 256u
#define PAIR_KEY_RANKS 560u
#define PAIR_ESCAPE 816u
#define PAIR_HEAD 832u
#define PAIR_TABLES_MAX 64u

// A tensor's area (its bytes: `pair_model::area_bytes`).
struct PairArea {
    u8* block;      // the PairBlock: top map, ranks, key ranks, escape (PAIR_HEAD bytes)
    uint4* entries; // the rank tables' entries, 256 a table
    u32* cls;       // their code lengths, 256 a table
    u32* info;      // their info words
    u64* groups;    // step 2's sums, 257 a table: the pair weights by key 16 a + b, then the squares
    u64* s12;       // step 6's sums
    u8* pairs;      // the table's pairs (2 PAIR_MAX bytes)
    u32* state;     // D (0: no table), whether the rank tables were made
    u8* choice;     // per sampled block: its version 1 choice (SEL_CONST: constant)
    u64* cost;      // and its cost
};

__device__ __forceinline__ u64 r16(u64 x) { return (x + 15) & ~15ull; }

__device__ PairArea pair_area(const PairJob& job, u32 max_tables) {
    u8* a = (u8*)job.area;
    PairArea A;
    u64 at = PAIR_HEAD;
    A.block = a;
    A.entries = (uint4*)(a + at);
    at += (u64)max_tables * 4096;
    A.cls = (u32*)(a + at);
    at += (u64)max_tables * 1024;
    A.info = (u32*)(a + at);
    at += (u64)max_tables * 16;
    A.groups = (u64*)(a + at);
    at += r16((u64)max_tables * 257 * 8);
    A.s12 = (u64*)(a + at);
    at += 16;
    A.pairs = a + at;
    at += 2 * PAIR_MAX;
    A.state = (u32*)(a + at);
    at += 16;
    A.choice = a + at;
    at += r16(job.n_sampled);
    A.cost = (u64*)(a + at);
    return A;
}

// The table count the model may use (0: the plane does not pair).
__device__ __forceinline__ u32 pair_tables(const PairJob& job, u32 max_tables) {
    const u32 K = *(const u32*)job.n_tables;
    return K <= max_tables && max_tables <= PAIR_TABLES_MAX ? K : 0u;
}

// Where rank table j of a tensor with D ranks starts in its output (FORMAT.md section 12's pair
// field after the 16-byte head: D, the 2 D pair bytes, then tables of 3 + D bytes: lo 0, hi D and
// the codes of ranks 0..=D); rank_table_at(D, K) is the end of K tables. `tz_pair_tables` writes
// them there, `tz_pair_expand` reads them, `tz_pair_decide` ends the head there.
__device__ __forceinline__ u32 rank_table_at(u32 D, u32 j) { return 16 + 1 + 2 * D + j * (3 + D); }

// Step 1: the (at most) 16 most frequent bytes of plane 1 over the sampled blocks (larger count
// first, smaller byte among ties; bytes with a count only): each byte's index among them, or 255.
// Also the tensor's starting state: not paired, its sums zero. Thread blocks (tensor, slice):
// each sums every PAIR_TOP_SLICES-th group of 8 sampled blocks (a warp a block) into the tensor's
// totals after its top map (`job.top` + 256, zeroed by the host, as the ticket after them); the
// last slice to finish ranks the totals. One thread block per tensor took ~96 us for 1 GiB of
// bf16 (1024 sampled blocks a tensor on 8 of 132 SMs; H100).
#define PAIR_TOP_SLICES 16u
extern "C" __global__ void __launch_bounds__(256) tz_pair_top(const PairJob* __restrict__ jobs, u32 max_tables) {
    __shared__ u32 c[256];
    __shared__ bool last;
    const PairJob job = jobs[blockIdx.x];
    u8* top = (u8*)job.top;
    u32* total = (u32*)(top + 256);
    u32* ticket = total + 256;
    const u32 s = threadIdx.x, lane = s & 31, warp = s >> 5;
    const u32* h = (const u32*)job.hists;
    c[s] = 0;
    __syncthreads();
    u32 part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (u32 i = blockIdx.y * 8 + warp; i < job.n_sampled; i += 8 * gridDim.y)
#pragma unroll
        for (int k = 0; k < 8; k++) part[k] += h[(u64)i * job.stride + lane + 32 * k];
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (part[k]) atomicAdd(&c[lane + 32 * k], part[k]);
    __syncthreads();
    if (c[s]) atomicAdd(&total[s], c[s]);
    // The totals visible before the ticket is taken; the last slice reads them after.
    __threadfence();
    __syncthreads();
    if (s == 0) last = atomicAdd(ticket, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const PairArea A = pair_area(job, max_tables);
    for (u32 k = s; k < max_tables * 257; k += 256) A.groups[k] = 0;
    if (s < 2) A.s12[s] = 0;
    if (s < 4) A.state[s] = 0;
    if (s == 0) {
        u32* head = (u32*)job.out;
        head[0] = head[1] = head[3] = 0;
        head[2] = 16;
    }
    const u32 sum = __ldcg(total + s);
    c[s] = sum;
    __syncthreads();
    u32 rank = 0;
    for (u32 t = 0; t < 256; t++) rank += c[t] > sum || (c[t] == sum && t < s);
    top[s] = sum > 0 && rank < 16 ? (u8)rank : (u8)255;
}

// A sampled block's version 1 choice, by one warp: where its plane-1 bytes are not one value, table
// j at cost c, or raw at its raw cost, by the code lengths the encode kernel chooses by, the lowest
// index among equal costs (the core's `model::choose`), else SEL_CONST; written to the area (lane 0)
// and returned.
__device__ u32 pair_choose(const PairJob& job, const PairArea& A, u32 block, u32 lane, u32 K) {
    const u32* hp = (const u32*)job.hists + (u64)block * job.stride;
    u32 hv[8];
    u32 nz = 0, len = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        hv[k] = hp[lane * 8 + k];
        nz += hv[k] != 0;
        len += hv[k];
    }
    nz = warp_sum32(nz);
    len = warp_sum32(len);
    if (nz < 2) {
        if (lane == 0) A.choice[block] = (u8)SEL_CONST;
        return SEL_CONST;
    }
    u64 best = NO_COST;
    u32 bj = SEL_RAW;
    for (u32 j = 0; j < K; j++) {
        const u32* cl = (const u32*)job.cls + (u64)j * 256 + lane * 8;
        u64 c = 0;
        bool ok = true;
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (hv[k]) {
                ok &= cl[k] != CL_ABSENT;
                c += (u64)hv[k] * cl[k];
            }
        ok = __all_sync(FULL, ok);
        c = warp_sum64(c);
        if (ok && c < best) {
            best = c;
            bj = j;
        }
    }
    if (bj == SEL_RAW || !stays_coded(best, len, job.threshold)) {
        bj = SEL_RAW;
        best = raw_cost(len);
    }
    if (lane == 0) {
        A.choice[block] = (u8)bj;
        A.cost[block] = best;
    }
    return bj;
}

// Step 2's sums: each non-constant sampled block weighs the pair of top bytes (x, y) of indices
// (a, b) by h[x] h[y] (its histogram h: of its L^2 ordered pairs of units, those holding x then y),
// key 16 a + b; table j sums the weights and the squares L^2 of the blocks that chose version 1
// table j, table 0 those of every such block. A thread block takes PAIR_GROUP_BATCH consecutive
// sampled blocks: first each warp makes the version 1 choice of two of them (`pair_choose`; a
// kernel of its own until 2026-12-06, 17 us of 1 GiB's model on an H200), then thread t sums key
// t per table in shared memory and adds the sums to the tensor's when the tensor changes and at
// the end (tensors of more than PAIR_GROUP_TABLES tables add each block's weights at once). A thread block per sampled block, adding each block's counts, took ~97 us
// for 1 GiB of bf16 (H100): 8192 blocks' atomics on each tensor's few hot keys.
#define PAIR_GROUP_BATCH 16u
#define PAIR_GROUP_TABLES 16u
extern "C" __global__ void __launch_bounds__(256) tz_pair_groups(const PairSampleJob* __restrict__ sjobs, u32 n_sjobs,
                                                                 const PairJob* __restrict__ jobs, u32 max_tables) {
    __shared__ u64 acc[PAIR_GROUP_TABLES][256];
    __shared__ u64 acc_sq[PAIR_GROUP_TABLES];
    __shared__ u8 topb[16];  // the top bytes by index
    __shared__ u32 th[16];   // the block's count of each
    __shared__ u32 blen;     // and its units
    __shared__ u8 sel[PAIR_GROUP_BATCH];  // the batch's version 1 choices
    const u32 t = threadIdx.x, lane = t & 31, ta = t >> 4, tb = t & 15;
    const u32 k0 = blockIdx.x * PAIR_GROUP_BATCH, k1 = min(k0 + PAIR_GROUP_BATCH, n_sjobs);
    for (u32 k = k0 + (t >> 5); k < k1; k += 8) {
        const PairSampleJob sj = sjobs[k];
        const PairJob cj = jobs[sj.tensor];
        const u32 j = pair_choose(cj, pair_area(cj, max_tables), sj.block, lane, pair_tables(cj, max_tables));
        if (lane == 0) sel[k - k0] = (u8)j;
    }
    for (u32 j = 0; j < PAIR_GROUP_TABLES; j++) acc[j][t] = 0;
    if (t < PAIR_GROUP_TABLES) acc_sq[t] = 0;
    // The sums' tensor (none yet), its area, job, top bytes and tables, whether their sums fit `acc`.
    u32 cur = 0xFFFFFFFFu, K = 0, ntop = 0;
    bool batch = false;
    PairArea A;
    PairJob job;
    const auto flush = [&]() {
        if (!batch) return;
        for (u32 j = 0; j < K; j++) {
            u64* gj = A.groups + j * 257;
            if (acc[j][t]) atomicAdd((unsigned long long*)&gj[t], (unsigned long long)acc[j][t]);
            acc[j][t] = 0;
            if (t == 0 && acc_sq[j]) atomicAdd((unsigned long long*)&gj[256], (unsigned long long)acc_sq[j]);
            if (t == 0) acc_sq[j] = 0;
        }
    };
    for (u32 k = k0; k < k1; k++) {
        const PairSampleJob sj = sjobs[k];
        if (sj.tensor != cur) {
            flush();
            __syncthreads();
            cur = sj.tensor;
            job = jobs[cur];
            A = pair_area(job, max_tables);
            K = pair_tables(job, max_tables);
            batch = K <= PAIR_GROUP_TABLES;
            const u8 idx = ((const u8*)job.top)[t];
            if (idx < 16) topb[idx] = (u8)t;
            ntop = __syncthreads_count(idx < 16);
        }
        const u32 j = sel[k - k0];
        if (K == 0 || j == SEL_CONST) continue;
        const u32* hp = (const u32*)job.hists + (u64)sj.block * job.stride;
        if (t < ntop) th[t] = hp[topb[t]];
        if (t < 32) {
            u32 len = 0;
#pragma unroll
            for (int q = 0; q < 8; q++) len += hp[lane * 8 + q];
            len = warp_sum32(len);
            if (lane == 0) blen = len;
        }
        __syncthreads();
        const u64 w = ta < ntop && tb < ntop ? (u64)th[ta] * th[tb] : 0ull;
        const u64 sq = (u64)blen * blen;
        const bool also = j != 0 && j != SEL_RAW;
        if (batch) {
            acc[0][t] += w;
            if (also) acc[j][t] += w;
            if (t == 0) {
                acc_sq[0] += sq;
                if (also) acc_sq[j] += sq;
            }
        } else {
            if (w) {
                atomicAdd((unsigned long long*)&A.groups[t], (unsigned long long)w);
                if (also) atomicAdd((unsigned long long*)&A.groups[j * 257 + t], (unsigned long long)w);
            }
            if (t == 0) {
                atomicAdd((unsigned long long*)&A.groups[256], (unsigned long long)sq);
                if (also) atomicAdd((unsigned long long*)&A.groups[j * 257 + 256], (unsigned long long)sq);
            }
        }
        // `th` and `blen` are read before the next block writes them.
        __syncthreads();
    }
    flush();
}

// Step 3: the table — the pairs with a weight in table 0's sums, larger weight first, then smaller
// first byte, then smaller second byte; the first 128 (D of them); at least two, else D = 0 (not
// paired). The ranks go to the PairBlock's key ranks and 17 x 17 ranks (every other key, and the
// 17th row and column of the latter: the escape D).
extern "C" __global__ void __launch_bounds__(256) tz_pair_table(const PairJob* __restrict__ jobs, u32 max_tables) {
    __shared__ u8 topb[16];
    // Every key's weight and bytes, for the ranking (each thread read all 256 weights from global
    // memory before).
    __shared__ u64 weight[256];
    __shared__ u32 key_ab[256];
    const PairJob job = jobs[blockIdx.x];
    const PairArea A = pair_area(job, max_tables);
    const u32 t = threadIdx.x;
    const u8* top = (const u8*)job.top;
    if (t < 16) topb[t] = 0;
    __syncthreads();
    if (top[t] < 16) topb[top[t]] = (u8)t;
    __syncthreads();
    const bool any_tables = pair_tables(job, max_tables) != 0;
    const u64 mine = any_tables ? A.groups[t] : 0ull;
    const u32 my_ab = (u32)topb[t >> 4] << 8 | topb[t & 15];
    // Each thread reads all 256 weights from global memory (the same word across the block at
    // each step). Staged in shared memory instead they took this kernel from 10.8 to 20.8 us
    // (ncu, 1 GiB of bf16 as 8 tensors, H100, 2026-12-07).
    u32 rank = 0;
    for (u32 k = 0; k < 256; k++) {
        const u64 c = any_tables ? A.groups[k] : 0ull;
        const u32 ab = (u32)topb[k >> 4] << 8 | topb[k & 15];
        rank += c > 0 && (c > mine || (c == mine && ab < my_ab));
    }
    const u32 n = __syncthreads_count(mine > 0);
    const u32 D = n < 2 || !any_tables ? 0u : min(n, PAIR_MAX);
    const bool kept = mine > 0 && rank < PAIR_MAX;
    A.block[PAIR_KEY_RANKS + t] = kept ? (u8)rank : (u8)D;
    A.block[PAIR_RANK17 + 17 * (t >> 4) + (t & 15)] = kept ? (u8)rank : (u8)D;
    if (t < 17) A.block[PAIR_RANK17 + 17 * 16 + t] = (u8)D;
    else if (t < 33) A.block[PAIR_RANK17 + 17 * (t - 17) + 16] = (u8)D;
    if (kept) {
        A.pairs[2 * rank] = topb[t >> 4];
        A.pairs[2 * rank + 1] = topb[t & 15];
    }
    if (t == 0) A.state[0] = D;
}

// Step 4's tables: rank table j weighs rank r < D by its pair's weight in table j's sums and the
// escape D by the sums' squares less the ranks' weights (a table no block chose is table 0's sums),
// normalised with every rank 0..=D forced, a warp a table, serialised into the output after the
// pair field (lo 0, hi D: 3 + D bytes each); `tz_pair_expand` expands them, as the version 1
// tables are, into the area's entries and code lengths. The state's "made" word is set where every
// table normalised.
extern "C" __global__ void __launch_bounds__(256) tz_pair_tables(const PairJob* __restrict__ jobs, u32 max_tables) {
    __shared__ u8 codes[8][256];
    __shared__ u8 rank_key[PAIR_MAX];
    const PairJob job = jobs[blockIdx.x];
    const PairArea A = pair_area(job, max_tables);
    const u32 t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const u32 D = A.state[0], K = pair_tables(job, max_tables);
    if (D == 0) return;
    const u32 r = A.block[PAIR_KEY_RANKS + t];
    if (r < D) rank_key[r] = (u8)t;
    __syncthreads();
    u8* out = (u8*)job.out;
    bool normal = true;
    for (u32 j = warp; j < K; j += 8) {
        const u64* g = A.groups + j * 257;
        if (g[256] == 0) g = A.groups;
        u64 paired = 0;
        for (u32 q = lane; q < D; q += 32) paired += g[rank_key[q]];
        paired = warp_sum64(paired);
        const u64 escape = g[256] - paired;
        u32 span = 0, afreq = 0;
        const bool ok = warp_normalize(
            [&](u32 s) { return s < D ? g[rank_key[s]] : s == D ? escape : 0ull; },
            [&](u32 s) { return s <= D; }, codes[warp], &span, &afreq);
        normal &= ok;
        const u32 at = rank_table_at(D, j);
        if (ok)
            for (u32 s = lane; s <= D; s += 32) out[at + 2 + s] = codes[warp][s];
        if (ok && lane == 0) {
            out[at] = 0;
            out[at + 1] = (u8)D;
        }
    }
    if (__syncthreads_count(!normal) != 0) return;
    if (t == 0) A.state[1] = 1;
}

// Step 4's expansion, a thread block per (tensor, rank table `blockIdx.y`): the table
// `tz_pair_tables` serialised, expanded into the area's entries and code lengths. A table that
// does not expand to its serialised length (none of ours should) takes back the "made" state that
// `tz_pair_tables` set, so the tensor is not paired. (Until 2026-12-07 `tz_pair_tables` expanded
// the K tables one after another, each a block-wide pass with four barriers.)
extern "C" __global__ void __launch_bounds__(256) tz_pair_expand(const PairJob* __restrict__ jobs, u32 max_tables) {
    __shared__ int single;
    const PairJob job = jobs[blockIdx.x];
    const PairArea A = pair_area(job, max_tables);
    const u32 D = A.state[0], K = pair_tables(job, max_tables), j = blockIdx.y;
    if (D == 0 || j >= K || A.state[1] == 0) return;
    const u8* out = (const u8*)job.out;
    const u32 at = rank_table_at(D, j);
    if (expand_table(out, at, at + 3 + D, j, false, A.entries, A.cls, A.info, &single) != 3 + D && threadIdx.x == 0)
        A.state[1] = 0;
}

// Step 6's sums, a warp per sampled block: its version 1 cost (S1) and its estimated paired cost
// (S2). With h its histogram, L its units, W the sum of h[x] h[y] over the table's pairs (x, y) and
// X the same times each rank's code length under rank table j: raw where it chose raw or where the
// per-block rule with its expected escape bytes (L^2 - W) / L turns it raw, else
// min((X + (L^2 - W) (escape's code length + 16 bits)) / 2L, raw).
extern "C" __global__ void __launch_bounds__(256) tz_pair_cost(const PairSampleJob* __restrict__ sjobs, u32 n_sjobs,
                                                               const PairJob* __restrict__ jobs, u32 max_tables) {
    const u32 lane = threadIdx.x & 31, b = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (b >= n_sjobs) return;
    const PairSampleJob sj = sjobs[b];
    const PairJob job = jobs[sj.tensor];
    const PairArea A = pair_area(job, max_tables);
    const u32 D = A.state[0], j = A.choice[sj.block];
    if (D == 0 || A.state[1] == 0 || j == SEL_CONST) return;
    const u32* cl = A.cls + (u64)(j == SEL_RAW ? 0 : j) * 256;
    const u32* hp = (const u32*)job.hists + (u64)sj.block * job.stride;
    u64 w = 0, x = 0;
    u32 len = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) len += hp[lane * 8 + k];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const u32 r = lane + 32 * k;
        if (r < D) {
            const u64 hh = (u64)hp[A.pairs[2 * r]] * hp[A.pairs[2 * r + 1]];
            w += hh;
            x += hh * cl[r];
        }
    }
    len = warp_sum32(len);
    w = warp_sum64(w);
    x = warp_sum64(x);
    if (lane == 0) {
        const u64 c = A.cost[sj.block], L = len, rest = L * L - w;
        u64 s2 = raw_cost(L);
        if (j != SEL_RAW && stays_coded(c + raw_cost(rest / L), L, job.threshold)) {
            const u64 est = (x + rest * ((u64)cl[D] + raw_cost(2))) / (2 * L);
            s2 = min(est, s2);
        }
        atomicAdd((unsigned long long*)&A.s12[0], (unsigned long long)c);
        atomicAdd((unsigned long long*)&A.s12[1], (unsigned long long)s2);
    }
}

// a + b and a << k (0 < k < 64) in 128 bits.
__device__ __forceinline__ U128 add128(U128 a, U128 b) {
    const u64 lo = a.lo + b.lo;
    return U128{a.hi + b.hi + (lo < a.lo), lo};
}
__device__ __forceinline__ U128 shl128(U128 a, int k) { return U128{(a.hi << k) | (a.lo >> (64 - k)), a.lo << k}; }

// Step 6: P1 = S1 NB / S plus the version 1 tables' bits, P2 = S2 NB / S plus the rank tables' and
// the pair field's; paired only if 32 P2 <= 33 P1. Paired: the PairBlock's top map and escape, the
// host's output (the pair field; the rank tables are in place), the parameters: `pair`, and the
// head's tables section grown by a pair field per plane (1 byte; 1 + 2 D for plane 1) with plane
// 1's rank tables in place of its version 1 tables.
extern "C" __global__ void __launch_bounds__(256) tz_pair_decide(const PairJob* __restrict__ jobs, u32 max_tables) {
    __shared__ bool paired;
    const PairJob job = jobs[blockIdx.x];
    const PairArea A = pair_area(job, max_tables);
    const u32 t = threadIdx.x, D = A.state[0], K = pair_tables(job, max_tables);
    if (D == 0 || A.state[1] == 0) return;
    // The pair field's bytes in the blob head: its count byte, the D pairs and the K rank tables
    // (`rank_table_at` less the output's 16-byte head).
    const u32 pair_bytes = rank_table_at(D, K) - 16;
    u8* out = (u8*)job.out;
    if (t == 0) {
        const u64 ns = job.n_sampled;
        // Plane 1's version 1 tables' serialised bytes: its search output's end word less the
        // head. K > 0 only where `tz_enc_tables` found exactly K tables ending there and no
        // conditional table (plane 1 is no conditioned plane). (Until 2026-12-07 this walked the
        // K tables' lengths: a chain of K dependent global loads on one thread.)
        const u32 v1_bytes = ((const u32*)job.v1_out)[3] - 16;
        const U128 p1 = add128(div128(mul64(A.s12[0], job.n_blocks), ns), U128{0, raw_cost(v1_bytes)});
        const U128 p2 = add128(div128(mul64(A.s12[1], job.n_blocks), ns), U128{0, raw_cost(pair_bytes)});
        paired = !lt128(add128(shl128(p1, 5), p1), shl128(p2, 5));
        if (paired) {
            u32* head = (u32*)out;
            out[16] = (u8)D;
            head[0] = 1;
            head[1] = K;
            head[2] = 16 + pair_bytes;
            *(u32*)(A.block + PAIR_ESCAPE) = D;
            *(u64*)job.pair = job.area;
            // A version 2 head has every plane's `u8 D` (this one's among them) and this plane's
            // pairs and rank tables: the field less its count byte, and a byte per plane.
            const u64 grow = (u64)job.planes + pair_bytes - 1;
            atomicAdd((unsigned long long*)job.head, (unsigned long long)(grow - v1_bytes));
        }
    }
    __syncthreads();
    if (!paired) return;
    A.block[t] = (u8)min((u32)((const u8*)job.top)[t], 16u);
    for (u32 k = t; k < 2 * D; k += 256) out[17 + k] = A.pairs[k];
}
