// tensorzip GPU decoder: one warp per chunk, or (the `_pair` kernels, for launches of few chunks) a
// decoding and a merging warp per chunk (docs/FORMAT.md, "Planes blob" and "The rANS stream";
// docs/GPU.md, "Two warps per chunk").
//
// Every size and offset in the descriptors was validated on the host; what the host cannot check
// without reading the payloads (selectors, stream words, raw-area sizes) is checked here with bounded
// reads, and a failure is reported through `err` (the output is then garbage and the host returns an
// error). Nothing is read outside the chunk's payload or written outside the chunk's output.
//
// Per block of a chunk:
//   A. the main group's steps: each coded plane's symbols go to a per-warp shared-memory slot; the
//      units whose condition byte selects the conditional table are counted on the way;
//   B. the conditioned sub-segment is decoded into shared memory; at the chunk's last block the
//      stream's end is checked and the stash read from the lane states;
//   C. the merge: each lane completes 16 consecutive units per group of 512, with the raw bytes of a
//      group loaded together (one 16-byte run per plane and lane; the conditioned plane's through
//      a shared window filled one group ahead) and the units stored wide.
// With two warps, A and B run on the decoding warp and C on the merging one, a block apart.
// One kernel per unit size (1, 2, 4, 8 bytes), so that each gets its own register allocation.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define LANES 32
#define STATE_LOWER 65536u
#define RING 512          // words in the per-warp ring buffer of stream words
#define WIN 528           // bytes of one merge window (`window_issue`)
#define RING_STASH 2144   // per-warp shared bytes of the ring (2 * RING), the stash (64) and two windows
#define ALIGN_SLACK 4096  // shared bytes the host adds so that the table cache can be 4096-aligned
#define GROUP 16          // units per lane in the merge
#define SEL_CONST 254
#define SEL_RAW 255
#define MODE_RAW 0
#define MODE_CONST 1
#define MODE_BLOCKS 2
#define MODE_COND 3

// Source of a plane's bytes within a block.
#define SRC_AREA 0        // raw area, one byte per unit
#define SRC_VALUE 1       // one value (constant plane, single-symbol table)
#define SRC_AREA1 2       // raw area, one byte for the block (constant block)
#define SRC_CODED 3       // decoded from the stream (into a slot)
#define SRC_COND 4        // conditioned plane
#define SRC_PAIRED 5      // the paired plane (format version 2): ranks and escapes, expanded into a slot

struct ChunkDesc {
    u64 payload;
    u64 out;
    u32 payload_len;
    u32 rans_len;
    u32 sel_len;
    u32 len;
    u32 tensor;
    u32 index;            // position in the batch, for error reports (padding chunks: len 0)
    u8 modes[8];
    u8 values[8];
};

struct TensorDesc {
    u32 block_units;
    u32 unit_size;
    u32 exp_bits;
    u32 cond_plane;       // 255 = none
    u32 cond_src;
    u32 cond_value;
    u32 cond_table;
    u32 pair_plane;       // the paired plane (format version 2; 255 = none)
    u32 table_base[8];
    u32 n_tables[8];
    u32 slot[8];          // shared-memory slot of each plane that has tables (255 = none)
    u32 pair_d;           // its pairs (the escape rank), 2..=128
    u32 pair_base;        // where they start in `pairs` (one word each: first byte | second << 8)
};

__device__ __forceinline__ u32 lanemask_lt() {
    u32 m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

// The shared-memory accessors (shared_addr, lds8/16/32/64, sts8/16/32) come from smem.cuh, which the
// engine prepends.

__device__ __forceinline__ u32 warp_sum(u32 v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_add_sync(0xFFFFFFFFu, v);
#else
    #pragma unroll
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, d);
    return v;
#endif
}

// A launch's error: one 64-bit word, the code in its low half and the chunk's index in the batch in
// its high half, all ones while no chunk has failed — so the host reads the lowest failing chunk
// with its own code (two separate words could pair one chunk's code with another's index).
__device__ __forceinline__ void fail(u32* err, u32 code, u32 chunk) {
    atomicMin((unsigned long long*)err, ((unsigned long long)chunk << 32) | code);
}

// The stream's words pass through a per-warp ring of RING words in shared memory. Loads are issued
// one block of 256 words ahead, into registers (`pend`), as soon as the ring has room for them, and
// written to the ring only when the decoder needs them: a lone warp (a small model has few chunks)
// then does not wait for global memory at every refill.
//
// The loads are aligned 4-byte words, used untouched until the commit, which shifts them into
// place (the stream starts at any byte). Loading bytes and assembling them at issue made the warp
// wait for global memory right there: ~9% of a whole-model launch's decoding warp (ncu, 20:4x).
// A word that would reach past the chunk's payload is left for the commit to assemble from bytes
// (at most one per chunk, at its end).
struct Stream {
    const u32* w4;        // the 4-byte word holding the stream's first byte
    u32 sh;               // 8 x the stream's offset in that word
    u32 lim;              // bytes from `w4` to the end of the chunk's payload (loads stay below)
    u32 n_words;
    u32 fetched;          // words [0, fetched) are in the ring
    u32 pos;              // words [0, pos) are consumed
    u32 ring;             // shared address of the ring
    u32 x;
    u32 pend[5];          // the aligned words holding this lane's 8 words of the next block
    u32 slow;             // bit k: pend[k] reaches past the payload (assembled at the commit)
    bool pending;
    bool bad;
};

__device__ __forceinline__ void issue(Stream& s, int lane) {
    // This lane's 16 bytes start `sh / 8` bytes into aligned word `b / 4`.
    const u32 b = 2 * (s.fetched + lane * 8);
    s.slow = 0;
    #pragma unroll
    for (int k = 0; k < 5; k++) {
        const u32 at = b + 4 * k;
        if (at + 4 <= s.lim) {
            s.pend[k] = __ldg(s.w4 + at / 4);
        } else {
            s.pend[k] = 0;
            s.slow |= 1u << k;
        }
    }
    s.pending = true;
}

__device__ __forceinline__ void refill(Stream& s, int lane) {
    // Everything here depends only on warp-uniform values. The pending block goes to the ring once
    // fewer than 256 words are buffered: its slots then hold no unread word (at most 256 + 256 words
    // are buffered after), and at least 256 are buffered for the next steps unless the stream ends.
    // The next block's loads are issued as soon as the previous block is in the ring (at the first
    // call, issue and commit come together).
    if (!s.pending && s.fetched < s.n_words) issue(s, lane);
    if (s.pending && s.fetched - s.pos < 256) {
        if (s.slow) {
            // Words reaching past the payload (its end): their bytes below `lim`, then zeros.
            const u32 b = 2 * (s.fetched + lane * 8);
            const u8* p = (const u8*)s.w4;
            #pragma unroll
            for (int k = 0; k < 5; k++) {
                if (!(s.slow >> k & 1)) continue;
                u32 v = 0;
                for (u32 q = 0; q < 4; q++) {
                    const u32 at = b + 4 * k + q;
                    if (at < s.lim) v |= (u32)__ldg(p + at) << (8 * q);
                }
                s.pend[k] = v;
            }
        }
        // The slots written now were last read (by any lane) before this group of steps: order
        // those reads before these writes.
        __syncwarp();
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 w = s.fetched + lane * 8 + 2 * k;
            const u32 v = __funnelshift_r(s.pend[k], s.pend[k + 1], s.sh);
            sts16(s.ring + 2 * (w % RING), v);
            sts16(s.ring + 2 * ((w + 1) % RING), v >> 16);
        }
        __syncwarp();
        s.fetched = min(s.fetched + 256u, s.n_words);
        s.pending = false;
    }
}

// A decode table: in the block's shared-memory cache (compact: symbol of each slot, frequency and
// cumulative frequency of each symbol, at shared addresses `sym` and `fc`) or, if not cached
// (`sym == NOT_CACHED`), its 4096 entries in global memory.
#define NOT_CACHED 0xFFFFFFFFu
struct Table {
    u32 sym;              // shared: 4096 symbols
    u32 fc;               // shared: 256 x (freq | cum << 16)
    const u32* full;      // global: 4096 x (sym | freq << 8 | bias << 20)
};

// The symbol and frequency/cumulative entry of slot `x & 4095` of a table in the block's cache.
// Cached tables start at multiples of 4096 in the shared window, so the symbol's address is
// (x & 4095) | base: one instruction, which does not wait for a separate `x & 4095`.
__device__ __forceinline__ void lookup_cached(u32 x, const Table& t, u32& sym, u32& e) {
    u32 a;
    asm("lop3.b32 %0, %1, 4095, %2, 0xEA;" : "=r"(a) : "r"(x), "r"(t.sym));
    sym = lds8(a);
    e = lds32(t.fc + 4 * sym);
}

// The symbol of state `x` (into `sym`) and the state before renormalisation, from a table in the
// block's cache. (`ahead_step` writes the same state update with its terms in another order; one
// shared helper changes the compiled code of one kind of kernel or the other (NVRTC 13.2, sm_90),
// and each was measured as it stands, so the line is written twice.)
__device__ __forceinline__ u32 next_cached(u32 x, const Table& t, u32& sym) {
    const u32 slot = x & 4095u;
    u32 e;
    lookup_cached(x, t, sym, e);
    return (e & 0xFFFu) * (x >> 12) + slot - (e >> 16);
}

// Where `step` finds a symbol: a table in the block's cache, a table in global memory, or the
// uniform table of a paired plane's escape group (every byte frequency 16: the symbol is the slot's
// top 8 bits, no lookup).
#define TABLE_GLOBAL 0
#define TABLE_CACHED 1
#define TABLE_UNIFORM 2

// One rANS step of the warp: every active lane decodes a symbol; lanes whose state fell below 2^16
// read one word each, in lane order. Inactive lanes keep their state.
template <int TABLE>
__device__ __forceinline__ u32 step(Stream& s, const Table& t, bool active, int lane) {
    refill(s, lane);
    u32 sym, nx;
    if (TABLE == TABLE_CACHED) {
        nx = next_cached(s.x, t, sym);
    } else if (TABLE == TABLE_UNIFORM) {
        const u32 slot = s.x & 4095u;
        sym = slot >> 4;
        nx = 16u * (s.x >> 12) + (slot & 15u);
    } else {
        const u32 e = __ldg(t.full + (s.x & 4095u));
        sym = e & 0xFFu;
        nx = ((e >> 8) & 0xFFFu) * (s.x >> 12) + (e >> 20);
    }
    const bool need = active && nx < STATE_LOWER;
    if (active) s.x = nx;
    const u32 mask = __ballot_sync(0xFFFFFFFFu, need);
    const u32 n = __popc(mask);
    if (s.pos + n > s.fetched) {
        s.bad = true;
        return sym;
    }
    if (need) s.x = (nx << 16) | lds16(s.ring + 2 * ((s.pos + __popc(mask & lanemask_lt())) % RING));
    s.pos += n;
    return sym;
}

__device__ __forceinline__ u32 step_any(Stream& s, const Table& t, bool active, int lane) {
    return t.sym != NOT_CACHED ? step<TABLE_CACHED>(s, t, active, lane) : step<TABLE_GLOBAL>(s, t, active, lane);
}

// Full steps `r0 .. r1` of a cached table, all lanes active, symbols stored at shared address
// `out + 32 r + lane`: the lean form of `step`. The ring is topped up once per 8 steps (a step reads
// at most 32 words; after `refill`, 256 are buffered unless the stream ends), and the reads inside
// a group are not checked one by one: ring addresses are taken modulo its size, so a stream that
// runs out reads stale ring words, which `pos > fetched` after the group reveals.
// With `COUNT`, also counts (per lane) the symbols equal to `cv` into `cnt`.
// With `SHFL`, each lane reads word `pos + lane` of the ring while the step's table lookups are in
// flight, and a renormalising lane takes the word of its rank with a shuffle after the ballot:
// two instructions fewer on the step's dependent chain, one shared load more per step. Measured
// in every kernel (H200, 2026-12-01 00:2x, same call, kernel GB/s): MiniLM bf16 whole model
// (two-warp kernels) 114.3 / 113.6 -> 115.7 / 115.6, 1 GiB fp32 684 / 682 -> 700 / 701, but 1 GiB
// bf16 538 / 542 -> 534 / 533 (the most shared-memory bound kernel). So only the two-warp kernels
// and units of 4 and 8 bytes used it: then 1 GiB fp32 682 / 687 -> 706 / 701, bf16 543 / 542 ->
// 543 / 543, MiniLM bf16 115.0 / 116.1 -> 115.8 / 115.0 (within the noise). Since 2026-12-01 the
// two-warp kernels take `ahead_step` (LEAN_AHEAD) instead; the one-warp kernels of 4- and 8-byte
// units keep this one.
template <bool COUNT, bool SHFL>
__device__ __forceinline__ void lean_step(Stream& s, const Table& t, u32& p2, u32 lt, u32 at, u32 cv, u32& cnt) {
    u32 sym;
    u32 mine = 0;
    if (SHFL) mine = lds16(s.ring | ((p2 + 2 * __popc(lt)) & (2 * RING - 2)));
    const u32 nx = next_cached(s.x, t, sym);
    const bool need = nx < STATE_LOWER;
    const u32 mask = __ballot_sync(0xFFFFFFFFu, need);
    const u32 w = SHFL ? __shfl_sync(0xFFFFFFFFu, mine, __popc(mask & lt))
                       : lds16(s.ring | ((p2 + 2 * __popc(mask & lt)) & (2 * RING - 2)));
    s.x = need ? (nx << 16) | w : nx;
    p2 += 2 * __popc(mask);
    sts8(at, sym);
    if (COUNT) cnt += sym == cv;
}

// Ring word `pos + lane` (`p2` = 2 pos) with the symbol and entry its slot would decode to: what
// a lane renormalising into that word decodes next (its state's low 12 bits are the word's).
__device__ __forceinline__ void decorate(const Stream& s, const Table& t, u32 p2, int lane, u32& dw, u32& de) {
    const u32 w = lds16(s.ring | ((p2 + 2 * lane) & (2 * RING - 2)));
    u32 sym;
    lookup_cached(w, t, sym, de);
    dw = w | sym << 16;
}

// The lean step with the next step's lookups done ahead (`LEAN_AHEAD`, the two-warp kernels): the
// step's symbol `sym` and entry `e` were found during the previous step, for both outcomes of its
// renormalisation — the lanes that keep their state look up the slot of the new state right after
// it is known, while the ballot runs, and the ring words a renormalising lane can take were looked
// up one step ahead (`decorate`), so a renormalising lane gets its word, symbol and entry with the
// shuffles. The symbol and entry loads leave the step's chain; the decoration's own chain (ring
// word, symbol, entry, from the ballot's count) and 36 instructions instead of 29 remain. Symbols
// are returned for the caller to store (stores would keep the compiler from moving the next step's
// loads up). Measured (H200, 2026-12-01, same calls, kernel GB/s): MiniLM bf16 whole model
// 121.8-125.0 -> 131.5-136.1, the sample model 97.2-98.4 -> 105.6-107.8, one 128 MiB bf16 tensor
// (two warps, 1024 chunks) unchanged; in the one-warp kernels it was slower (1 GiB bf16 541 -> 502,
// fp32 698 -> 672: with 16 warps per SM the instructions count more than the chain). Tried and
// dropped: decorating the ring's entries at commit (8 bytes each, redone when the table changes)
// instead of one step ahead, MiniLM 129.5-131.8 against 132.7-136.1 (docs/GPU.md).
template <bool COUNT>
__device__ __forceinline__ u32 ahead_step(Stream& s, const Table& t, u32& p2, u32 lt, int lane, u32 cv, u32& cnt,
                                          u32& sym, u32& e, u32& dw, u32& de, bool next) {
    const u32 out = sym;
    const u32 nx = (e & 0xFFFu) * (s.x >> 12) + (s.x & 4095u) - (e >> 16);
    const bool need = nx < STATE_LOWER;
    const u32 mask = __ballot_sync(0xFFFFFFFFu, need);
    u32 s_nr, e_nr;
    lookup_cached(nx, t, s_nr, e_nr);
    const u32 rank = __popc(mask & lt);
    const u32 pk = __shfl_sync(0xFFFFFFFFu, dw, rank);
    const u32 pe = __shfl_sync(0xFFFFFFFFu, de, rank);
    p2 += 2 * __popc(mask);
    if (next) decorate(s, t, p2, lane, dw, de);
    s.x = need ? (nx << 16) | (pk & 0xFFFFu) : nx;
    sym = need ? pk >> 16 : s_nr;
    e = need ? pe : e_nr;
    if (COUNT) cnt += out == cv;
    return out;
}

// Which lean step a kernel uses: `lean_step` without (LEAN_PLAIN) or with (LEAN_SHFL) the ring
// word by shuffle, or `ahead_step` (LEAN_AHEAD).
#define LEAN_PLAIN 0
#define LEAN_SHFL 1
#define LEAN_AHEAD 2

template <bool COUNT, int MODE>
__device__ __forceinline__ void steps_lean(Stream& s, const Table& t, u32 r0, u32 r1, u32 out, int lane, u32 cv, u32& cnt) {
    const u32 lt = lanemask_lt();
    // LEAN_AHEAD: the next step's symbol and entry, carried from group to group (the table
    // does not change inside this call).
    u32 sym = 0, e = 0;
    if (MODE == LEAN_AHEAD && r0 < r1) lookup_cached(s.x, t, sym, e);
    for (u32 r = r0; r < r1; r += 8) {
        refill(s, lane);
        // The read position in bytes; `t.sym` is 4096-aligned and the ring 1024-aligned, so both
        // lookups address by OR.
        u32 p2 = 2 * s.pos;
        const u32 at = out + r * LANES + lane;
        if (MODE == LEAN_AHEAD) {
            // The ring words of the group's first step, after `refill` (a group reads at most
            // 256 words and 256 are buffered, so the decorations inside the group read
            // committed words unless the stream ends, which `pos > fetched` reveals).
            u32 dw, de;
            decorate(s, t, p2, lane, dw, de);
            if (r + 8 <= r1) {
                u32 o[8];
                #pragma unroll
                for (u32 q = 0; q < 8; q++) o[q] = ahead_step<COUNT>(s, t, p2, lt, lane, cv, cnt, sym, e, dw, de, q < 7);
                #pragma unroll
                for (u32 q = 0; q < 8; q++) sts8(at + q * LANES, o[q]);
            } else {
                for (u32 q = 0; q < r1 - r; q++)
                    sts8(at + q * LANES, ahead_step<COUNT>(s, t, p2, lt, lane, cv, cnt, sym, e, dw, de, true));
            }
        } else if (r + 8 <= r1) {
            #pragma unroll
            for (u32 q = 0; q < 8; q++) lean_step<COUNT, MODE == LEAN_SHFL>(s, t, p2, lt, at + q * LANES, cv, cnt);
        } else {
            for (u32 q = 0; q < r1 - r; q++) lean_step<COUNT, MODE == LEAN_SHFL>(s, t, p2, lt, at + q * LANES, cv, cnt);
        }
        s.pos = p2 / 2;
        if (s.pos > s.fetched) {
            s.bad = true;
            return;
        }
    }
}

// Full steps `r0 .. r1` of a block that codes `N` (2 or 3) planes, each with a cached table (`t[k]`,
// symbols to the shared slot at `out[k]`, planes in the format's order within a step): the lean form
// of the general loop, which such blocks took before (2026-12-01). A one-wave launch lasts as long
// as its slowest chunk, and all-MiniLM-L6-v2 fp32's word and position embeddings code two or three
// planes in every block of 19 chunks. Measured (H200, kernel GB/s, same calls): with the block's
// table cache sized for that tensor's 13 tables (src/engine.rs, `MAX_CACHE_TABLES`), the whole
// model 107.7 without this loop, 214.6-215.8 with it (109.9 before either); 1 GiB fp32 and bf16
// unchanged (692.8-698.3 against 694.9-701.5, 541.3-541.5 against 536.0-543.3). Four planes
// (instantiated too) cost the one-warp 4-byte kernel 8 bytes of stack and 1-2% on 1 GiB fp32, so
// blocks coding four or more planes keep the general loop.
// A group is `8 / N` steps, so that it reads at most the 256 words `refill` leaves buffered. With
// `COUNT`, the symbols of plane `cq` (an index into `t`; `N` for none) equal to `cv` are counted.
template <int N, bool COUNT, bool SHFL>
__device__ __forceinline__ void steps_lean_multi(Stream& s, const Table* t, const u32* out, u32 r0, u32 r1, int lane,
                                                 u32 cq, u32 cv, u32& cnt) {
    constexpr u32 G = 8 / N;
    const u32 lt = lanemask_lt();
    // A value no symbol has (symbols are bytes) for the planes that are not counted.
    u32 cvk[N];
    #pragma unroll
    for (int k = 0; k < N; k++) cvk[k] = (u32)k == cq ? cv : 256u;
    for (u32 r = r0; r < r1; r += G) {
        refill(s, lane);
        u32 p2 = 2 * s.pos;
        if (r + G <= r1) {
            #pragma unroll
            for (u32 q = 0; q < G; q++) {
                #pragma unroll
                for (int k = 0; k < N; k++) lean_step<COUNT, SHFL>(s, t[k], p2, lt, out[k] + (r + q) * LANES + lane, cvk[k], cnt);
            }
        } else {
            for (u32 q = 0; q < r1 - r; q++) {
                #pragma unroll
                for (int k = 0; k < N; k++) lean_step<COUNT, SHFL>(s, t[k], p2, lt, out[k] + (r + q) * LANES + lane, cvk[k], cnt);
            }
        }
        s.pos = p2 / 2;
        if (s.pos > s.fetched) {
            s.bad = true;
            return;
        }
    }
}

// The block's table cache: `ids[k]` is the global index of cached table `k`.
#define MAX_CACHED 16     // `MAX_CACHE_TABLES` in src/engine.rs
struct Cache {
    u32 n;
    u32 ids[MAX_CACHED];
    u32 sym;              // shared address: n x 4096 symbols
    u32 fc;               // shared address: n x 256 words
};

__device__ __forceinline__ Table table_of(const Cache& cache, const u32* tables, u32 g) {
    Table t;
    t.sym = NOT_CACHED;
    t.fc = 0;
    t.full = tables + (u64)g * 4096;
    for (u32 k = 0; k < cache.n; k++) {
        if (cache.ids[k] == g) {
            t.sym = cache.sym + k * 4096;
            t.fc = cache.fc + k * 1024;
        }
    }
    return t;
}

template <int U, int E>
__device__ __forceinline__ u64 inverse_transform(u64 t) {
    if (E == 0) return t;
    const u32 bits = 8 * U;
    const u32 mant_bits = bits - 1 - E;
    const u64 exp_old = ((1ull << E) - 1) << mant_bits;
    const u64 mant = (1ull << mant_bits) - 1;
    const u64 sign = 1ull << (bits - 1);
    return ((t >> 1) & exp_old) | ((t << E) & sign) | (t & mant);
}

// The inverse transform of two 16-bit units packed in a word (E = 8: bf16).
template <int E>
__device__ __forceinline__ u32 inverse2(u32 w) {
    if (E == 0) return w;
    return ((w >> 1) & 0x7F807F80u) | ((w << 8) & 0x80008000u) | (w & 0x007F007Fu);
}

// 16 bytes of the raw area from byte `j` (relative to `area`) as four little-endian words, those at
// or past `from_area` taken from the stash; `n` of them are needed (the rest are 0). Reads stay
// inside [area, lim).
__device__ __forceinline__ void load16(u32 (&w)[4], const u8* area, const u8* lim, u32 j, u32 n, u32 from_area, const u8* stash) {
    const u64 a = (u64)(area + j);
    const u32* wp = (const u32*)(a & ~3ull);
    // Bytes past the `n` needed are read too (and ignored) when they lie in the area.
    if (n && j + GROUP <= from_area && (const u8*)(wp + 5) <= lim) {
        const u32 sh = (u32)(a & 3) * 8;
        u32 x[5];
        #pragma unroll
        for (int k = 0; k < 5; k++) x[k] = __ldg(wp + k);
        #pragma unroll
        for (int k = 0; k < 4; k++) w[k] = __funnelshift_r(x[k], x[k + 1], sh);
        return;
    }
    #pragma unroll
    for (int k = 0; k < 4; k++) w[k] = 0;
    #pragma unroll
    for (u32 k = 0; k < GROUP; k++) {
        if (k < n) {
            u32 x = j + k;
            u32 v = x < from_area ? area[x] : stash[x - from_area];
            w[k / 4] |= v << (8 * (k % 4));
        }
    }
}

// Bit 7 of each byte of `w` that equals the same byte of `v4`, the other bits 0: bit 7 of
// ~(((t & 0x7F..) + 0x7F..) | t) is set exactly for the zero bytes of t = w ^ v4.
__device__ __forceinline__ u32 equal_bytes(u32 w, u32 v4) {
    const u32 t = w ^ v4;
    return ~(((t & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) | t) & 0x80808080u;
}

// Bit k set where byte k of the 16 bytes in `w` equals `v`.
__device__ __forceinline__ u32 match16(const u32 (&w)[4], u32 v) {
    const u32 v4 = v * 0x01010101u;
    u32 m = 0;
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        u32 e = __vcmpeq4(w[k], v4) & 0x80808080u;
        m |= ((e * 0x00204081u) >> 28) << (4 * k);
    }
    return m;
}

// Drops the first `c` (0..4) bytes of the 16 bytes in `w` (zeros come in at the top).
// The 16 bytes at shared address `a` (any alignment; the 20 bytes from `a & ~3` must be readable),
// as four little-endian words: five aligned loads and four funnel shifts.
__device__ __forceinline__ void lds16_unaligned(u32 (&w)[4], u32 a) {
    const u32 wa = a & ~3u, sh = (a & 3u) * 8;
    u32 x[5];
    #pragma unroll
    for (int k = 0; k < 5; k++) x[k] = lds32(wa + 4 * k);
    #pragma unroll
    for (int k = 0; k < 4; k++) w[k] = __funnelshift_r(x[k], x[k + 1], sh);
}

__device__ __forceinline__ void shift_bytes(u32 (&w)[4], u32 c) {
    const u32 sel = 0x3210u + c * 0x1111u;
    w[0] = __byte_perm(w[0], w[1], sel);
    w[1] = __byte_perm(w[1], w[2], sel);
    w[2] = __byte_perm(w[2], w[3], sel);
    w[3] = __byte_perm(w[3], 0u, sel);
}

// For a 4-bit mask `m` of units taking their byte from the first word (the others take theirs
// from the second), the `__byte_perm` selector that interleaves the two words' low bytes in order.
__device__ __forceinline__ u32 merge_selector(u32 m) {
    u32 sel = 0, a = 0;
    for (u32 j = 0; j < 4; j++) {
        const u32 from_a = (m >> j) & 1u;
        sel |= (from_a ? a : 4 + j - a) << (4 * j);
        a += from_a;
    }
    return sel;
}

// The E = 8 (bf16, and fp32's top two bytes) inverse transform on plane words, four units at
// once: `m` holds the sign (bit 7) and the mantissa's top 7 bits, `e` the exponent. The unit's high
// byte is sign << 7 | e >> 1 (returned in `hi`), its low byte (e & 1) << 7 | mantissa (in `lo`).
__device__ __forceinline__ void inverse_e8_words(u32 m, u32 e, u32& lo, u32& hi) {
    hi = (m & 0x80808080u) | ((e >> 1) & 0x7F7F7F7Fu);
    lo = ((e << 7) & 0x80808080u) | (m & 0x7F7F7F7Fu);
}

// Stores the 16 units assembled from the plane words `w` at `o`.
template <int U, int E>
__device__ __forceinline__ void store16(u8* o, const u32 (&w)[U][4], u32 n) {
    if (U == 1) {
        if (n == GROUP && (((u64)o) & 15) == 0) {
            *(uint4*)o = make_uint4(w[0][0], w[0][1], w[0][2], w[0][3]);
        } else {
            #pragma unroll
            for (u32 k = 0; k < GROUP; k++)
                if (k < n) o[k] = (u8)(w[0][k / 4] >> (8 * (k % 4)));
        }
    } else if (U == 2) {
        u32 r[8];
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            if (E == 8) {
                // bf16: the inverse transform on the plane words (`inverse_e8_words`: plane 1 the
                // exponent, plane 0 the sign and the mantissa), then the interleave. Two shifts and
                // two 3-input logic operations per four units instead of four operations per two
                // units after the interleave (the inverse transform was 3.9% of a 1 GiB bf16
                // launch's instructions, ncu). With the same for fp32 below and `decode_block`
                // resolving tables for coded planes only (H200, 2026-12-01, same calls, kernel
                // GB/s): 1 GiB bf16 539-541 -> 547-549, fp32 687-694 -> 709-713; MiniLM bf16 and
                // the sample model within the noise.
                u32 lo, hi;
                inverse_e8_words(w[0][k], w[1][k], lo, hi);
                r[2 * k] = __byte_perm(lo, hi, 0x5140);
                r[2 * k + 1] = __byte_perm(lo, hi, 0x7362);
            } else {
                r[2 * k] = inverse2<E>(__byte_perm(w[0][k], w[1][k], 0x5140));
                r[2 * k + 1] = inverse2<E>(__byte_perm(w[0][k], w[1][k], 0x7362));
            }
        }
        if (n == GROUP && (((u64)o) & 15) == 0) {
            ((uint4*)o)[0] = make_uint4(r[0], r[1], r[2], r[3]);
            ((uint4*)o)[1] = make_uint4(r[4], r[5], r[6], r[7]);
        } else {
            // Compile-time indices only (a run-time index would put `r` in local memory).
            #pragma unroll
            for (u32 k = 0; k < GROUP; k++) {
                if (k < n) {
                    const u32 h = r[k / 2] >> (16 * (k % 2));
                    o[2 * k] = (u8)h;
                    o[2 * k + 1] = (u8)(h >> 8);
                }
            }
        }
    } else if (U == 4) {
        u32 r[16];
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            // fp32 (E = 8): the inverse transform on the plane words of the top two bytes, as for
            // bf16 in the U == 2 case (plane 3 the exponent, plane 2 the sign and the mantissa's top
            // 7 bits), before the interleave; the other planes are the mantissa's low bytes as they are.
            u32 w2 = w[2][k], w3 = w[3][k];
            if (E == 8) inverse_e8_words(w[2][k], w[3][k], w2, w3);
            constexpr int EI = E == 8 ? 0 : E;
            u32 a = __byte_perm(w[0][k], w[1][k], 0x5140);
            u32 b = __byte_perm(w[0][k], w[1][k], 0x7362);
            u32 c = __byte_perm(w2, w3, 0x5140);
            u32 d = __byte_perm(w2, w3, 0x7362);
            r[4 * k] = (u32)inverse_transform<4, EI>(__byte_perm(a, c, 0x5410));
            r[4 * k + 1] = (u32)inverse_transform<4, EI>(__byte_perm(a, c, 0x7632));
            r[4 * k + 2] = (u32)inverse_transform<4, EI>(__byte_perm(b, d, 0x5410));
            r[4 * k + 3] = (u32)inverse_transform<4, EI>(__byte_perm(b, d, 0x7632));
        }
        if (n == GROUP && (((u64)o) & 15) == 0) {
            #pragma unroll
            for (int v = 0; v < 4; v++) ((uint4*)o)[v] = make_uint4(r[4 * v], r[4 * v + 1], r[4 * v + 2], r[4 * v + 3]);
        } else {
            #pragma unroll
            for (u32 k = 0; k < GROUP; k++) {
                if (k < n) {
                    #pragma unroll
                    for (int p = 0; p < 4; p++) o[4 * k + p] = (u8)(r[k] >> (8 * p));
                }
            }
        }
    } else {
        for (u32 k = 0; k < GROUP; k++) {
            if (k >= n) break;
            u64 t = 0;
            #pragma unroll
            for (int p = 0; p < U; p++) t |= (u64)((w[p][k / 4] >> (8 * (k % 4))) & 0xFFu) << (8 * p);
            u64 uv = inverse_transform<U, E>(t);
            if ((((u64)o) & 7) == 0) {
                ((u64*)o)[k] = uv;
            } else {
                #pragma unroll
                for (int p = 0; p < U; p++) o[U * k + p] = (u8)(uv >> (8 * p));
            }
        }
    }
}

// a[i] for a run-time `i`, without indexing the array at run time (which would put it in local
// memory: every access in the hot loops would then be a memory load).
template <int U>
__device__ __forceinline__ u32 pick(const u32 (&a)[U], u32 i) {
    u32 r = 0;
    #pragma unroll
    for (int p = 0; p < U; p++) r = (u32)p == i ? a[p] : r;
    return r;
}

// The block's tensor's pair table (format version 2) by rank, each entry its first byte | second
// << 8; ranks from D up (the escape; none above it is coded) read 0. A block decodes the chunks of
// one tensor (`decode_entry` fills it).
__shared__ u16 pair_tab[256];

// The tensor's paired plane, 255 if none.
__device__ __forceinline__ u32 paired_plane(const TensorDesc* tdp) {
    return tdp->pair_d ? tdp->pair_plane : 255u;
}

// What both warps of a chunk need to know about it (`chunk_info`).
template <int U>
struct ChunkInfo {
    const u8* payload;
    const u8* raw;        // the raw area
    u32 raw_len;
    u32 bu, len, nb;      // units per block, units, blocks
    u8* out;
    u32 cp, cq, cvalue;   // conditioned plane, condition plane, conditioning value
    bool cond_chunk;      // the conditioned plane is conditioned in this chunk
    u32 mode[U], cval[U], sel_off[U], slot[U];
};

template <int U>
__device__ __forceinline__ void chunk_info(ChunkInfo<U>& ci, const u8* data, const ChunkDesc* cdp, const TensorDesc* tdp, u8* out) {
    ci.bu = tdp->block_units;
    ci.len = cdp->len;
    ci.nb = (ci.len + ci.bu - 1) / ci.bu;
    ci.payload = data + cdp->payload;
    ci.raw = ci.payload + cdp->sel_len + cdp->rans_len;
    ci.raw_len = cdp->payload_len - cdp->sel_len - cdp->rans_len;
    ci.out = out + cdp->out;
    ci.cp = tdp->cond_plane;
    ci.cq = tdp->cond_src;
    ci.cvalue = tdp->cond_value;
    u32 o = 0;
    #pragma unroll
    for (int p = 0; p < U; p++) {
        ci.mode[p] = cdp->modes[p];
        ci.cval[p] = cdp->values[p];
        ci.slot[p] = tdp->slot[p];
        ci.sel_off[p] = o;
        if (ci.mode[p] == MODE_BLOCKS) o += ci.nb;
    }
    ci.cond_chunk = ci.cp < (u32)U && pick<U>(ci.mode, ci.cp) == MODE_COND;
}

#define PAIR_CODED 256u   // `BlockPlan::val` of a paired plane whose ranks are coded

// Where each plane's bytes come from in one block (`plan_block`).
template <int U>
struct BlockPlan {
    u32 src[U];           // SRC_*
    u32 off[U];           // offset in the block's raw bytes (SRC_AREA, SRC_AREA1)
    u32 val[U];           // the value (SRC_VALUE); SRC_PAIRED: PAIR_CODED, or the rank of a single-symbol table
    u32 tab[U];           // global table index (SRC_CODED, SRC_PAIRED)
    u32 fixed;            // raw bytes of the planes that are not conditioned
};

// The block's plan from the chunk's modes and the block's selectors; false if a selector names no
// table (the plane is then planned as raw, and the caller reports the error).
template <int U>
__device__ __forceinline__ bool plan_block(BlockPlan<U>& bp, const ChunkInfo<U>& ci, const TensorDesc* tdp, const u32* table_info, u32 b, u32 blen) {
    u32 fixed = 0;
    bool ok = true;
    #pragma unroll
    for (int p = 0; p < U; p++) {
        u32 size = 0;
        bp.src[p] = SRC_AREA;
        bp.val[p] = 0;
        bp.tab[p] = 0;
        if (ci.mode[p] == MODE_RAW) {
            size = blen;
        } else if (ci.mode[p] == MODE_CONST) {
            bp.src[p] = SRC_VALUE;
            bp.val[p] = ci.cval[p];
        } else if (ci.mode[p] == MODE_COND) {
            bp.src[p] = SRC_COND;
        } else {
            const u32 v = ci.payload[ci.sel_off[p] + b];
            if (v == SEL_RAW) {
                size = blen;
            } else if (v == SEL_CONST) {
                bp.src[p] = SRC_AREA1;
                size = 1;
            } else if (v >= tdp->n_tables[p] || ci.slot[p] == 255) {
                ok = false;
            } else {
                const u32 g = tdp->table_base[p] + v;
                const u32 info = table_info[g];
                if (U == 2 && (u32)p == paired_plane(tdp)) {
                    // Ranks: from the stream, or every pair the single-symbol table's rank.
                    bp.src[p] = SRC_PAIRED;
                    bp.tab[p] = g;
                    bp.val[p] = info >> 31 ? info & 0xFFu : PAIR_CODED;
                } else if (info >> 31) {
                    bp.src[p] = SRC_VALUE;
                    bp.val[p] = info & 0xFFu;
                } else {
                    bp.src[p] = SRC_CODED;
                    bp.tab[p] = g;
                }
            }
        }
        bp.off[p] = fixed;
        fixed += size;
    }
    bp.fixed = fixed;
    return ok;
}

// One round of a paired plane's expansion (`decode_paired`): the lane's four pairs from `i` (all of
// them with FULL, else those below `np`), their ranks read from `ranks` (or every one `single`)
// and their bytes written to `slot`; escaped pairs appended to `list` (`n_esc` of them so far,
// in pair order), `above` set by a rank past the escape `d`.
template <bool FULL>
__device__ __forceinline__ void expand_round(const u8* ranks, u8* slot, u8* list, u32 i, u32 np, u32 single, u32 d,
                                             u32 ptab, int lane, u32& n_esc, bool& above) {
    const u32 nv = FULL ? 4u : (i < np ? min(4u, np - i) : 0u);
    u32 rk = single * 0x01010101u;
    if (single == PAIR_CODED) {
        if (FULL) {
            rk = *(const u32*)(ranks + i);
        } else {
            rk = 0;
            for (u32 q = 0; q < nv; q++) rk |= (u32)ranks[i + q] << (8 * q);
        }
    }
    // Every lane has read its ranks before any lane writes bytes over earlier ranks' places.
    __syncwarp();
    // Bit 7 of each byte b of ((b | 0x80) - D) | b is set exactly where b >= D (D <= 128, so no
    // byte borrows from the next): the escapes, and forged ranks past them.
    const u32 d4 = d * 0x01010101u;
    u32 esc = (((rk | 0x80808080u) - d4) | rk) & 0x80808080u;
    if (!FULL) esc &= nv ? 0xFFFFFFFFu >> (8 * (4 - nv)) : 0u;
    const u32 w0 = lds16(ptab + 2 * (rk & 0xFFu)) | (u32)lds16(ptab + 2 * (rk >> 8 & 0xFFu)) << 16;
    const u32 w1 = lds16(ptab + 2 * (rk >> 16 & 0xFFu)) | (u32)lds16(ptab + 2 * (rk >> 24)) << 16;
    if (FULL) {
        *(uint2*)(slot + 2 * i) = make_uint2(w0, w1);
    } else {
        #pragma unroll
        for (u32 q = 0; q < 4; q++)
            if (q < nv) *(u16*)(slot + 2 * i + 2 * q) = (u16)((q < 2 ? w0 : w1) >> (16 * (q % 2)));
    }
    if (__any_sync(0xFFFFFFFFu, esc != 0)) {
        // A rank past the escape (which the host's checks of the tables leave to forged plans
        // only): the CPU engine refuses it.
        above = above || (__vcmpgtu4(rk, d4) & esc) != 0;
        // This lane's escapes go after those of the lanes before it.
        const u32 ne = __popc(esc);
        u32 incl = ne;
        #pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u32 v = __shfl_up_sync(0xFFFFFFFFu, incl, o);
            if (lane >= o) incl += v;
        }
        u32 at = n_esc + incl - ne;
        #pragma unroll
        for (u32 q = 0; q < 4; q++)
            if (esc >> (8 * q + 7) & 1u) ((u16*)list)[at++] = (u16)(i + q);
        n_esc += __shfl_sync(0xFFFFFFFFu, incl, 31);
    }
}

// A block's paired plane (format version 2, FORMAT.md section 12; the steps come after the main
// group's): its `blen / 2` ranks into the upper half of its slot (`slot`, generic address;
// `slot_sh` its shared address, 0 if in global scratch; `su` bytes), expanded in place into the
// plane's bytes through the pair table, the escaped pairs' indices listed (16-bit) at `list`, then
// the escape group decoded straight into the listed pairs' bytes (and the odd last unit). `single`
// is PAIR_CODED, or the rank every pair has (a single-symbol table). Returns 0 or an error code.
// The conditioned units among the plane's bytes are counted afterwards from the slot, as for a
// coded plane (`decode_block`).
//
// The expansion reads 128 ranks a round (four a lane) and writes their 256 bytes; ranks start at
// `su / 2` and `blen <= su`, so round `r`'s writes (below `256 (r + 1)`) never reach a rank a
// later round reads (at `su / 2 + 128 (r + 1)` or above, `128 (r + 1) <= su / 2`). Its cost
// (`expand_round`) decides whether pairing pays on the GPU: a block's halved steps save ~1,340
// instructions.
template <int U, int MODE>
__device__ __forceinline__ u32 decode_paired(Stream& s, bool& used, const TensorDesc* tdp, u32 tab, u32 single,
                                             const u32* tables, const Cache& cache, u32 blen, u32 rans_len, int lane,
                                             u8* slot, u32 slot_sh, u32 su, u8* list) {
    const u32 np = blen / 2, half = su / 2, d = tdp->pair_d, ptab = shared_addr(pair_tab);
    u8* ranks = slot + half;
    if (single == PAIR_CODED && np) {
        if (!rans_len) return 6;
        used = true;
        const Table t = table_of(cache, tables, tab);
        u32 r_lean = 0;
        if (slot_sh && t.sym != NOT_CACHED) {
            r_lean = np / LANES;
            u32 none = 0;
            steps_lean<false, MODE>(s, t, 0, r_lean, slot_sh + half, lane, 0, none);
            if (s.bad) return 2;
        }
        for (u32 r = r_lean; r * LANES < np; r++) {
            const u32 k = r * LANES + lane;
            const u32 sym = step_any(s, t, k < np, lane);
            if (s.bad) return 2;
            if (k < np) ranks[k] = (u8)sym;
        }
        __syncwarp();
    }
    // Rounds of 128 whole pairs, then a partial one (odd-sized blocks: a tensor's last).
    u32 n_esc = 0;
    bool above = false;
    const u32 full = np / (4 * LANES) * (4 * LANES);
    u32 i0 = 0;
    for (; i0 < full; i0 += 4 * LANES) expand_round<true>(ranks, slot, list, i0 + 4 * lane, np, single, d, ptab, lane, n_esc, above);
    if (i0 < np) expand_round<false>(ranks, slot, list, i0 + 4 * lane, np, single, d, ptab, lane, n_esc, above);
    if (__any_sync(0xFFFFFFFFu, above)) return 7;
    __syncwarp();
    // The escape group: each escaped pair's two bytes in pair order, then an odd last unit's.
    const u32 ne = 2 * n_esc + (blen & 1);
    if (ne) {
        if (!rans_len) return 6;
        used = true;
        const Table none_t = {NOT_CACHED, 0, tables};
        for (u32 r = 0; r * LANES < ne; r++) {
            const u32 k = r * LANES + lane;
            const u32 sym = step<TABLE_UNIFORM>(s, none_t, k < ne, lane);
            if (s.bad) return 2;
            if (k < ne) slot[k < 2 * n_esc ? 2 * (u32)((const u16*)list)[k / 2] + (k & 1) : blen - 1] = (u8)sym;
        }
        __syncwarp();
    }
    return 0;
}

// The stream side of block `b` (raw area at `raw_off`): A, the main group's symbols into the
// slots; the count of conditioned units; B, the sub-segment; at the last block, the end of the
// stream and the stash. Returns 0 or an error code for `fail`; `from_area` gets the number of
// the block's raw bytes in the area (the rest, at the last block, are in the stash).
template <int U, int MODE>
__device__ __forceinline__ u32 decode_block(Stream& s, bool& used, const ChunkInfo<U>& ci, const BlockPlan<U>& bp,
                                            const TensorDesc* tdp, const u32* tables, const Cache& cache, u32 b,
                                            u32 blen, u32 raw_off, u32 rans_len, int lane, u8* slots, u32 su, u8* sub,
                                            u8* stash, u32 slots_shared, u32 sub_shared, u32& from_area) {
    const bool last = b + 1 == ci.nb;
    const u8* area = ci.raw + raw_off;
    const u8* lim = ci.raw + ci.raw_len;
    // The block's raw bytes (at most `U * blen`) are read only in the merge, after the block's
    // steps: ask L2 for them now, one 128-byte line per lane and round.
    {
        const u64 first = (u64)area & ~127ull;
        const u64 end = min((u64)(area + (u64)U * blen), (u64)lim);
        for (u64 a = first + 128ull * lane; a < end; a += 128ull * LANES)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    }
    Table tt[U];
    // Resolved for coded planes only (the search over the cache is per block: 2.6% of a 1 GiB
    // bf16 launch's instructions when every plane took it, ncu 2026-12-01).
    #pragma unroll
    for (int p = 0; p < U; p++) {
        tt[p].sym = NOT_CACHED;
        tt[p].fc = 0;
        tt[p].full = tables;
        if (bp.src[p] == SRC_CODED) tt[p] = table_of(cache, tables, bp.tab[p]);
    }
    // A. Main group, step by step; count the conditioned units.
    u32 coded = 0;
    // The common case, one coded plane with a cached table and slots in shared memory: its full
    // steps take the lean loop, the rest (a partial last step) the general one.
    u32 n_coded = 0, only = 0;
    #pragma unroll
    for (int p = 0; p < U; p++) {
        if (bp.src[p] == SRC_CODED) {
            n_coded++;
            only = p;
        }
    }
    u32 r_start = 0, counted_to = 0;
    if (n_coded == 1 && slots_shared && rans_len) {
        Table t1 = tt[0];
        u32 slot1 = ci.slot[0];
        #pragma unroll
        for (int p = 1; p < U; p++) {
            if ((u32)p == only) {
                t1 = tt[p];
                slot1 = ci.slot[p];
            }
        }
        if (t1.sym != NOT_CACHED) {
            used = true;
            r_start = blen / LANES;
            // The conditioned units are counted on the way when this is the condition plane.
            if (ci.cond_chunk && only == ci.cq) {
                u32 cnt = 0;
                steps_lean<true, MODE>(s, t1, 0, r_start, slots_shared + slot1 * su, lane, ci.cvalue, cnt);
                counted_to = r_start * LANES;
                coded = warp_sum(cnt);
            } else {
                u32 none = 0;
                steps_lean<false, MODE>(s, t1, 0, r_start, slots_shared + slot1 * su, lane, 0, none);
            }
            if (s.bad) return 2;
        }
    } else if (U >= 2 && n_coded >= 2 && n_coded <= 3 && slots_shared && rans_len) {
        // Two or three coded planes: their tables and slots in plane order (indices fixed at
        // compile time, so that everything stays in registers). Arrays of 4 as measured: with
        // arrays of 3 NVRTC 13.2 gave the one-warp 4-byte kernel 24 bytes of stack instead of 0.
        Table tn[4];
        u32 on[4], cq = 4, k = 0;
        bool cached = true;
        #pragma unroll
        for (int p = 0; p < U; p++) {
            if (bp.src[p] == SRC_CODED) {
                #pragma unroll
                for (u32 j = 0; j < 4; j++) {
                    if (k == j) {
                        tn[j] = tt[p];
                        on[j] = slots_shared + ci.slot[p] * su;
                        if ((u32)p == ci.cq) cq = j;
                    }
                }
                cached = cached && tt[p].sym != NOT_CACHED;
                k++;
            }
        }
        if (cached) {
            used = true;
            r_start = blen / LANES;
            constexpr bool SH = MODE != LEAN_PLAIN;
            u32 cnt = 0;
            const bool count = ci.cond_chunk && cq < n_coded;
            if (n_coded == 2) {
                if (count) steps_lean_multi<2, true, SH>(s, tn, on, 0, r_start, lane, cq, ci.cvalue, cnt);
                else steps_lean_multi<2, false, SH>(s, tn, on, 0, r_start, lane, 2, 0, cnt);
            } else if (U >= 4 && n_coded == 3) {
                if (count) steps_lean_multi<3, true, SH>(s, tn, on, 0, r_start, lane, cq, ci.cvalue, cnt);
                else steps_lean_multi<3, false, SH>(s, tn, on, 0, r_start, lane, 3, 0, cnt);
            }
            if (count) {
                counted_to = r_start * LANES;
                coded = warp_sum(cnt);
            }
            if (s.bad) return 2;
        }
    }
    for (u32 r = n_coded ? r_start : blen; r * LANES < blen; r++) {
        u32 i = r * LANES + lane;
        bool in = i < blen;
        #pragma unroll
        for (int p = 0; p < U; p++) {
            if (bp.src[p] != SRC_CODED) continue;
            if (!rans_len) return 6;
            used = true;
            u32 v = step_any(s, tt[p], in, lane);
            if (s.bad) return 2;
            if (in) slots[ci.slot[p] * su + i] = (u8)v;
        }
    }
    __syncwarp();
    // The condition plane's source, offset, value and slot (scalars: see `pick`).
    const u32 q_src = pick<U>(bp.src, ci.cq), q_off = pick<U>(bp.off, ci.cq), q_val = pick<U>(bp.val, ci.cq);
    // The paired plane (only bf16's exponent plane can be one), after the main group.
    const u32 pp = paired_plane(tdp);
    if (U == 2 && pp < (u32)U && pick<U>(bp.src, pp) == SRC_PAIRED) {
        const u32 ps = pick<U>(ci.slot, pp);
        const u32 code = decode_paired<U, MODE>(s, used, tdp, pick<U>(bp.tab, pp), pick<U>(bp.val, pp), tables, cache, blen,
                                                rans_len, lane, slots + ps * su, slots_shared ? slots_shared + ps * su : 0u, su, sub);
        if (code) return code;
    }
    if (ci.cond_chunk && (q_src == SRC_CODED || q_src == SRC_PAIRED)) {
        // Count the conditioned units the lean loop has not counted (none of a paired plane's),
        // from the condition plane's slot.
        const u8* qs = slots + pick<U>(ci.slot, ci.cq) * su;
        const u32 v4 = ci.cvalue * 0x01010101u;
        u32 cnt = 0;
        // 16 bytes per lane and load (a slot holds `su` bytes, a multiple of 32, past `blen`).
        for (u32 j = counted_to + 16 * lane; j < blen; j += 16 * LANES) {
            const uint4 v = *(const uint4*)(qs + j);
            const u32 wv[4] = {v.x, v.y, v.z, v.w};
            #pragma unroll
            for (int k = 0; k < 4; k++) {
                u32 z = equal_bytes(wv[k], v4);
                const u32 at = j + 4 * k;
                // `j + 16 > blen` is implied by `at + 4 > blen`: meant to test the block's end once a
                // load, which NVRTC does not take (ncu 2026-12-06: the line's share unchanged); kept,
                // as dropping it changes every decode kernel's code and no device has timed that.
                if (j + 16 > blen && at + 4 > blen) z = at >= blen ? 0u : z & (0xFFFFFFFFu >> (8 * (at + 4 - blen)));
                cnt += __popc(z);
            }
        }
        coded += warp_sum(cnt);
    }
    if (ci.cond_chunk && q_src != SRC_CODED && q_src != SRC_PAIRED) {
        // Condition bytes not from the stream: raw (never in the stash) or one value.
        if ((q_src == SRC_AREA || q_src == SRC_AREA1) && raw_off + bp.fixed > ci.raw_len) return 4;
        for (u32 r = 0; r * LANES < blen; r++) {
            u32 i = r * LANES + lane;
            u32 e = q_src == SRC_AREA ? (i < blen ? area[q_off + i] : 0u) : (q_src == SRC_AREA1 ? area[q_off] : q_val);
            coded += __popc(__ballot_sync(0xFFFFFFFFu, i < blen && e == ci.cvalue));
        }
    }
    const u32 cond_raw = ci.cond_chunk ? blen - coded : 0;
    const u32 total = bp.fixed + cond_raw;
    u32 stash_len = 0;
    if (last && rans_len) stash_len = min(ci.cond_chunk ? cond_raw : total, 64u);
    from_area = total - stash_len;
    if (raw_off + from_area > ci.raw_len || (last && raw_off + from_area != ci.raw_len)) return 4;
    // B. Conditioned sub-segment; end of the stream at the last block.
    if (coded) {
        if (!rans_len) return 6;
        used = true;
        const Table t = table_of(cache, tables, tdp->cond_table);
        u32 r_sub = 0;
        if (sub_shared && t.sym != NOT_CACHED) {
            r_sub = coded / LANES;
            u32 none = 0;
            steps_lean<false, MODE>(s, t, 0, r_sub, sub_shared, lane, 0, none);
            if (s.bad) return 2;
        }
        for (u32 r = r_sub; r * LANES < coded; r++) {
            u32 k = r * LANES + lane;
            u32 sym = step_any(s, t, k < coded, lane);
            if (s.bad) return 2;
            if (k < coded) sub[k] = (u8)sym;
        }
    }
    if (last && rans_len) {
        u32 carried = stash_len > 2 * (u32)lane ? min(stash_len - 2 * lane, 2u) : 0u;
        u32 v = s.x - STATE_LOWER;
        bool ok = s.x >= STATE_LOWER && v < (1u << (8 * carried)) && s.pos == s.n_words && used;
        if (!__all_sync(0xFFFFFFFFu, ok)) return 5;
        stash[2 * lane] = (u8)v;
        stash[2 * lane + 1] = (u8)(v >> 8);
    }
    __syncwarp();
    return 0;
}

// The conditioned plane's raw bytes of a merge group, `r` bytes into the block's raw area, copied to
// the shared window at `dst` (WIN bytes, from the 16-byte boundary at or below `area + r`) with
// asynchronous 16-byte copies that hold no registers, one group ahead of their use: loaded by each
// lane for itself when the group's prefix sum was known, they were a wait for L2 at every group
// (11% of a large launch's stall samples; ncu, 2026-11-30). Only whole 16-byte pieces inside the
// chunk's payload are copied (compute-sanitizer counts a partial copy's 16 bytes as read); the
// others are assembled now, bytes outside the block's raw bytes as 0. Bytes past `from_area` (the
// stash holds them, at the last block) are put in place by `window_ready`.
__device__ __forceinline__ void window_issue(u32 dst, const u8* area, u32 r, u32 from_area, const u8* payload, const u8* lim, int lane) {
    const u64 a0 = (u64)(area + r) & ~15ull;
    const u64 end = (u64)(area + from_area);
    for (u32 k = lane; k < WIN / 16; k += LANES) {
        const u64 pa = a0 + 16ull * k;
        if (pa >= (u64)payload && pa + 16 <= (u64)lim) {
            // The whole 16 bytes lie in the chunk's payload: one asynchronous copy (bytes past the
            // block's, from the next block, are not used).
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + 16 * k), "l"(pa) : "memory");
        } else if (pa >= end) {
            sts32(dst + 16 * k, 0u);
            sts32(dst + 16 * k + 4, 0u);
            sts32(dst + 16 * k + 8, 0u);
            sts32(dst + 16 * k + 12, 0u);
        } else {
            // A piece that starts before the chunk's payload or ends past it (at most one each per
            // chunk): byte by byte, the bytes outside the block's raw bytes 0.
            for (u32 q = 0; q < 16; q++) {
                const u64 x = pa + q;
                sts8(dst + 16 * k + q, x >= (u64)area && x < end ? *(const u8*)x : 0u);
            }
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits for the window issued last and, in the chunk's `last` block, puts the stash's bytes
// (those past `from_area`) in place. Only the last block has them: the decoder writes the stash
// when it ends the chunk's stream, and in a pair it does so while its merging warp is still on
// the block before — whose window, had it copied the stash, would have read it as it was being
// written (into positions it never uses, but a race all the same).
__device__ __forceinline__ void window_ready(u32 dst, const u8* area, u32 r, u32 from_area, const u8* stash, int lane,
                                             bool last) {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncwarp();
    if (last) {
        const u64 a0 = (u64)(area + r) & ~15ull;
        #pragma unroll
        for (u32 t = lane; t < 64; t += LANES) {
            const u64 x = (u64)(area + from_area) + t;
            if (x >= a0 && x < a0 + WIN) sts8(dst + (u32)(x - a0), stash[t]);
        }
        __syncwarp();
    }
}

// C. The merge of block `b`: each lane completes 16 consecutive units per group of 512 from the
// slots, the sub-segment and the raw area (`from_area` bytes at `raw_off`, then the stash) and
// stores them.
template <int U, int E>
__device__ __forceinline__ void merge_block(const ChunkInfo<U>& ci, const BlockPlan<U>& bp, u32 b, u32 blen, u32 raw_off,
                                            u32 from_area, int lane, const u8* slots, u32 su, const u8* sub,
                                            const u8* stash, u32 sub_shared, u32 merge_sel, u32 win) {
    const u8* area = ci.raw + raw_off;
    const u8* lim = ci.raw + ci.raw_len;
    const u32 cp = ci.cp, cq = ci.cq, fixed = bp.fixed;
    u8* blk_out = ci.out + (u64)b * ci.bu * U;
    u32 base_c = 0, base_r = 0;
    if (ci.cond_chunk) window_issue(win, area, fixed, from_area, ci.payload, lim, lane);
    for (u32 g0 = 0; g0 < blen; g0 += LANES * GROUP) {
        const u32 i0 = g0 + lane * GROUP;
        const u32 n = i0 < blen ? min((u32)GROUP, blen - i0) : 0u;
        u32 w[U][4];
        #pragma unroll
        for (int p = 0; p < U; p++) {
            if (bp.src[p] == SRC_AREA) {
                load16(w[p], area, lim, bp.off[p] + i0, n, from_area, stash);
            } else if (bp.src[p] == SRC_CODED || bp.src[p] == SRC_PAIRED) {
                const uint4 v = *(const uint4*)(slots + ci.slot[p] * su + i0);
                w[p][0] = v.x;
                w[p][1] = v.y;
                w[p][2] = v.z;
                w[p][3] = v.w;
            } else {
                u32 v = bp.val[p];
                if (bp.src[p] == SRC_AREA1) {
                    u32 j = bp.off[p];
                    v = j < from_area ? area[j] : stash[j - from_area];
                }
                #pragma unroll
                for (int k = 0; k < 4; k++) w[p][k] = v * 0x01010101u;
            }
        }
        if (ci.cond_chunk) {
            u32 cw[4];
            #pragma unroll
            for (int p = 0; p < U; p++) {
                if (p == (int)cq) {
                    #pragma unroll
                    for (int k = 0; k < 4; k++) cw[k] = w[p][k];
                }
            }
            const u32 wbuf = win + ((g0 / (LANES * GROUP)) & 1) * WIN;
            const u32 r = fixed + base_r;
            window_ready(wbuf, area, r, from_area, stash, lane, b + 1 == ci.nb);
            const u32 hits = match16(cw, ci.cvalue) & (n >= GROUP ? 0xFFFFu : ((1u << n) - 1u));
            const u32 mine = __popc(hits);
            u32 incl = mine;
            #pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                u32 o = __shfl_up_sync(0xFFFFFFFFu, incl, d);
                if (lane >= d) incl += o;
            }
            const u32 total_c = __shfl_sync(0xFFFFFFFFu, incl, 31);
            const u32 kc = base_c + incl - mine;
            const u32 group_units = min(blen - g0, (u32)(LANES * GROUP));
            // The next group's window, into the other buffer (read one group ago).
            if (g0 + LANES * GROUP < blen) window_issue(win + (((g0 / (LANES * GROUP)) + 1) & 1) * WIN, area, r + group_units - total_c, from_area, ci.payload, lim, lane);
            // The lane's raw condition bytes are consecutive in the area, its coded ones in the
            // sub-segment: one 16-byte window of each, consumed from the low end, four units
            // at a time: a byte permutation picks each unit's byte from the window it belongs
            // to (`merge_sel`), then each window drops the bytes taken.
            u32 rw[4], aw[4];
            // The lane's first raw byte in the window: the window starts at the 16-byte boundary
            // at or below `area + r` (at most 15 + 496 bytes in, so 20 bytes from there fit).
            lds16_unaligned(rw, wbuf + (u32)((u64)(area + r) & 15ull) + (min(i0, blen) - g0) - (incl - mine));
            if (sub_shared) {
                lds16_unaligned(aw, sub_shared + kc);
            } else {
                #pragma unroll
                for (int k = 0; k < 4; k++) aw[k] = 0;
                #pragma unroll
                for (u32 k = 0; k < GROUP; k++)
                    if (k < mine) aw[k / 4] |= (u32)sub[kc + k] << (8 * (k % 4));
            }
            u32 cb[4];
            #pragma unroll
            for (int q = 0; q < 4; q++) {
                const u32 nib = (hits >> (4 * q)) & 15u;
                const u32 na = __popc(nib);
                cb[q] = __byte_perm(aw[0], rw[0], lds16(merge_sel + 2 * nib));
                shift_bytes(aw, na);
                shift_bytes(rw, 4 - na);
            }
            #pragma unroll
            for (int p = 0; p < U; p++) {
                if (p == (int)cp) {
                    #pragma unroll
                    for (int k = 0; k < 4; k++) w[p][k] = cb[k];
                }
            }
            base_c += total_c;
            base_r += group_units - total_c;
        }
        if (n) store16<U, E>(blk_out + (u64)i0 * U, w, n);
    }
    __syncwarp();
}

// How the warps of a chunk share its work. ROLE_BOTH: one warp decodes and merges each block in
// turn. With two warps per chunk (the `_pair` kernels), ROLE_DECODE decodes block t into buffer
// t % 2 while ROLE_MERGE merges block t - 1 from the other, and the two meet at a named barrier
// (one per pair: barrier 1 + pair, 64 threads) after each step. A chunk then takes about as long
// as its stream's dependent chain alone, which is what a batch of few chunks waits for (a small
// model is one wave, each SM holding a few chunks). Two words of shared memory per pair (`sync`)
// carry each buffer's `from_area`; the barrier itself carries the decoder's abort (a reduction).
#define ROLE_BOTH 0
#define ROLE_DECODE 1
#define ROLE_MERGE 2

// The pair's barrier; true if either warp arrived with `abort` set.
__device__ __forceinline__ bool pair_barrier(u32 id, bool abort) {
    u32 r;
    asm volatile("{ .reg .pred p, q; setp.ne.u32 q, %2, 0; bar.red.or.pred p, %1, 64, q; selp.u32 %0, 1, 0, p; }"
                 : "=r"(r)
                 : "r"(id), "r"((u32)abort)
                 : "memory");
    return r != 0;
}

template <int U, int E, bool PAIR>
__device__ void decode_chunk(const u8* __restrict__ data, const ChunkDesc* __restrict__ cdp, const TensorDesc* __restrict__ tdp,
                             const u32* __restrict__ tables, const u32* __restrict__ table_info, u8* __restrict__ out,
                             u32* err, u32 c, int lane, u8* slots, u32 su, u8* sub, u32 ring, u8* stash,
                             const Cache& cache, u32 slots_shared, u32 sub_shared, u32 merge_sel, u32 role, u32 sync,
                             u32 barrier, u32 buf_stride, u32 win) {
    ChunkInfo<U> ci;
    chunk_info<U>(ci, data, cdp, tdp, out);
    const u32 rans_len = cdp->rans_len;
    Stream s;
    {
        // The words follow the lanes' 32 initial states. `lim` is only used with a stream
        // (rans_len >= 128: the payload then holds sel_len + rans_len bytes).
        const u8* words = ci.payload + cdp->sel_len + 128;
        const u32 off = (u32)((u64)words & 3);
        s.w4 = (const u32*)(words - off);
        s.sh = 8 * off;
        s.lim = rans_len ? cdp->payload_len - cdp->sel_len - 128 + off : 0u;
    }
    s.slow = 0;
    s.n_words = rans_len ? (rans_len - 128) / 2 : 0;
    s.fetched = 0;
    s.pos = 0;
    s.ring = ring;
    s.bad = false;
    s.pending = false;
    s.x = 0;
    u32 code = 0;
    if (rans_len && role != ROLE_MERGE) {
        const u8* st = ci.payload + cdp->sel_len + 4 * lane;
        s.x = (u32)st[0] | ((u32)st[1] << 8) | ((u32)st[2] << 16) | ((u32)st[3] << 24);
        if (__any_sync(0xFFFFFFFFu, s.x < STATE_LOWER)) code = 3;
    }
    bool used = false;
    // This warp's position in the raw area: of the next block to decode (ROLE_DECODE) or to
    // merge (ROLE_BOTH, ROLE_MERGE).
    u32 raw_off = 0;
    const bool pair = role != ROLE_BOTH;
    // A pair takes one step more: the merge of the last block.
    const u32 steps = ci.nb + (pair ? 1u : 0u);
    for (u32 t = 0; t < steps; t++) {
        BlockPlan<U> bp;
        u32 from_area = 0;
        bool merge = false;
        if (role != ROLE_MERGE && t < ci.nb && !code) {
            // Decode block t (into buffer t % 2 of a pair).
            const u32 k = pair ? (t & 1) * buf_stride : 0u;
            const u32 blen = min(ci.bu, ci.len - t * ci.bu);
            code = plan_block<U>(bp, ci, tdp, table_info, t, blen) ? 0u : 1u;
            if (!code)
                code = decode_block<U, PAIR ? LEAN_AHEAD : (U >= 4 ? LEAN_SHFL : LEAN_PLAIN)>(s, used, ci, bp, tdp, tables, cache, t, blen, raw_off, rans_len, lane,
                                       slots + k, su, sub + k, stash, slots_shared ? slots_shared + k : 0u,
                                       sub_shared ? sub_shared + k : 0u, from_area);
            if (!code && role == ROLE_DECODE) {
                if (lane == 0) sts32(sync + 4 * (t & 1), from_area);
                raw_off += from_area;
            }
            merge = !code && role == ROLE_BOTH;
        }
        if (role == ROLE_MERGE && t >= 1) {
            // Block t - 1, which the decoding warp finished before the last barrier.
            const u32 b = t - 1;
            plan_block<U>(bp, ci, tdp, table_info, b, min(ci.bu, ci.len - b * ci.bu));
            from_area = lds32(sync + 4 * (b & 1));
            merge = true;
        }
        if (merge) {
            const u32 b = role == ROLE_BOTH ? t : t - 1;
            const u32 k = pair ? (b & 1) * buf_stride : 0u;
            merge_block<U, E>(ci, bp, b, min(ci.bu, ci.len - b * ci.bu), raw_off, from_area, lane, slots + k, su,
                              sub + k, stash, sub_shared ? sub_shared + k : 0u, merge_sel, win);
            raw_off += from_area;
        }
        if (pair) {
            if (pair_barrier(barrier, code != 0)) break;
        } else if (code) {
            break;
        }
    }
    if (role == ROLE_MERGE) return;
    if (!code && rans_len && !used) code = 6;
    if (code && lane == 0) fail(err, code, c);
}

template <int U, int E, bool PAIR>
__device__ __forceinline__ void decode_entry(const u8* data, const ChunkDesc* chunks, u32 n_chunks, const TensorDesc* tensors,
                                             const u32* tables, const u32* table_info, const u32* pairs, u8* out, u32* err,
                                             u8* scratch, u32 per_warp, u32 warps_per_block, u32 n_slots, u32 su,
                                             u32 cache_tables) {
    extern __shared__ uint4 smem4[];
    u8* smem = (u8*)smem4;
    const int lane = threadIdx.x & 31;
    const u32 warp = threadIdx.x >> 5;
    const u32 first = blockIdx.x * warps_per_block;
    if (first >= n_chunks) return;
    // With `PAIR`, the block has two warps per chunk: warp w decodes chunk w and warp
    // `warps_per_block + w` merges it (ROLE_DECODE, ROLE_MERGE), with two buffers per chunk.
    // Without, `role` is a constant and the kernel has no hand-over code.
    const u32 wi = PAIR ? warp % warps_per_block : warp;
    const u32 role = PAIR ? (warp < warps_per_block ? ROLE_DECODE : ROLE_MERGE) : ROLE_BOTH;
    const u32 nbuf = PAIR ? 2 : 1;
    // The block's table cache: the multi-symbol tables of its tensor, compacted (the host gives
    // each block the chunks of one tensor only, padding with empty chunks).
    // Shared memory (the host adds ALIGN_SLACK bytes to what this needs): the table cache, at the
    // first 4096-byte boundary of the shared window (each table's 4096 symbols then start at a
    // multiple of 4096, so a step's lookup address is one OR); per chunk the word ring (1024
    // bytes, so 1024-aligned), the stash (64) and the merge's two windows (2 * WIN, 16-aligned);
    // per chunk `nbuf` buffers of the slots and the sub-segment (`per_warp` bytes each) unless
    // they are in global scratch.
    __shared__ Cache cache;
    // Selectors of the conditioned plane's merge (`merge_selector`), one per 4-bit mask.
    __shared__ u16 merge_sel[16];
    // Per pair of warps, the words they hand over (`decode_chunk`); 8 pairs at most (512 threads).
    __shared__ u32 sync_words[8 * 2];
    if (threadIdx.x < 16) merge_sel[threadIdx.x] = (u16)merge_selector(threadIdx.x);
    {
        const TensorDesc* td = tensors + chunks[first].tensor;
        const u32 d = td->pair_d;  // at most 128, its pairs inside `pairs` (checked on the host)
        for (u32 j = threadIdx.x; j < 256; j += blockDim.x) pair_tab[j] = j < d ? (u16)pairs[td->pair_base + j] : (u16)0;
    }
    const u32 base = shared_addr(smem);
    u8* cache_mem = smem + (((base + ALIGN_SLACK - 1) & ~(ALIGN_SLACK - 1)) - base);
    u8* rings = cache_mem + cache_tables * (4096 + 1024);
    u8* stashes = rings + warps_per_block * 2 * RING;
    u8* wins = stashes + warps_per_block * 64;
    u8* bufs = wins + warps_per_block * 2 * WIN;
    u8* cache_sym = cache_mem;
    u32* cache_fc = (u32*)(cache_mem + cache_tables * 4096);
    if (threadIdx.x == 0) {
        // The host sizes the cache for the launch's largest set of tables (up to MAX_CACHED). Past
        // that, the conditional table first (every block with conditioned units uses it), then the
        // planes from the top down (a float's exponent plane, coded in every block, is its top
        // plane).
        const TensorDesc* td = tensors + chunks[first].tensor;
        const u32 room = min(cache_tables, (u32)MAX_CACHED);
        cache.n = 0;
        cache.sym = shared_addr(cache_sym);
        cache.fc = shared_addr(cache_fc);
        if (td->cond_plane < 8 && cache.n < room) cache.ids[cache.n++] = td->cond_table;
        for (u32 p = td->unit_size; p-- > 0;) {
            for (u32 j = 0; j < td->n_tables[p]; j++) {
                u32 g = td->table_base[p] + j;
                if (cache.n < room && !(table_info[g] >> 31)) cache.ids[cache.n++] = g;
            }
        }
    }
    __syncthreads();
    // The cached tables' entries, 4 per 16-byte load and 4 loads in flight per thread: with one
    // dependent load per entry, filling the cache took ~16 us of a whole-model launch of ~470 us
    // (blocks of 512 threads), longer in narrower blocks.
    {
        const u32 total = cache.n * 1024;
        for (u32 j0 = threadIdx.x; j0 < total; j0 += 4 * blockDim.x) {
            uint4 v[4];
            #pragma unroll
            for (int m = 0; m < 4; m++) {
                const u32 j = j0 + m * blockDim.x;
                if (j < total) v[m] = __ldg((const uint4*)(tables + (u64)cache.ids[j >> 10] * 4096) + (j & 1023));
            }
            #pragma unroll
            for (int m = 0; m < 4; m++) {
                const u32 j = j0 + m * blockDim.x;
                if (j >= total) continue;
                const u32 k = j >> 10, slot = (j & 1023) * 4;
                const u32 e[4] = {v[m].x, v[m].y, v[m].z, v[m].w};
                u32 syms = 0;
                #pragma unroll
                for (int q = 0; q < 4; q++) {
                    const u32 sym = e[q] & 0xFFu;
                    syms |= sym << (8 * q);
                    if ((e[q] >> 20) == 0) cache_fc[k * 256 + sym] = ((e[q] >> 8) & 0xFFFu) | ((slot + q) << 16);
                }
                *(u32*)(cache_sym + k * 4096 + slot) = syms;
            }
        }
    }
    __syncthreads();
    const u32 c = first + wi;
    if (c >= n_chunks) return;
    const ChunkDesc* cd = chunks + c;
    const TensorDesc* td = tensors + cd->tensor;
    // Per-chunk buffers: slots of `su` units and the sub-segment (su + 32), `nbuf` times; the
    // ring and the stash.
    u8* buf = scratch ? scratch + (u64)c * nbuf * per_warp : bufs + wi * nbuf * per_warp;
    u8* sub = buf + n_slots * su;
    u8* ring = rings + wi * 2 * RING;
    u8* stash = stashes + wi * 64;
    // Shared addresses of the slots and the sub-segment (0: they are in global scratch).
    const u32 slots_shared = scratch ? 0u : shared_addr(buf);
    const u32 sub_shared = scratch ? 0u : shared_addr(sub);
    decode_chunk<U, E, PAIR>(data, cd, td, tables, table_info, out, err, cd->index, lane, buf, su, sub, shared_addr(ring), stash,
                       cache, slots_shared, sub_shared, shared_addr(merge_sel), role,
                       shared_addr(sync_words + 2 * (wi % 8)), 1 + wi % 8, per_warp, shared_addr(wins + wi * 2 * WIN));
}

#define ENTRY1(NAME, U, E, PAIR)                                                                              \
    extern "C" __global__ void __launch_bounds__(512) NAME(                                                   \
        const u8* __restrict__ data, const ChunkDesc* __restrict__ chunks, u32 n_chunks,                     \
        const TensorDesc* __restrict__ tensors, const u32* __restrict__ tables,                              \
        const u32* __restrict__ table_info, const u32* __restrict__ pairs, u8* __restrict__ out, u32* err,   \
        u8* __restrict__ scratch, u32 per_warp, u32 warps_per_block, u32 n_slots, u32 su, u32 cache_tables) { \
        decode_entry<U, E, PAIR>(data, chunks, n_chunks, tensors, tables, table_info, pairs, out, err,        \
                                 scratch, per_warp, warps_per_block, n_slots, su, cache_tables);             \
    }
#define ENTRY(NAME, U, E) ENTRY1(NAME, U, E, false) ENTRY1(NAME##_pair, U, E, true)
// One kernel per unit size and transform, and each with two warps per chunk (`_pair`).
#if TZ_ALL || TZ_UNIT == 0
ENTRY(tz_decode_1, 1, 0)
#endif
#if TZ_ALL || TZ_UNIT == 1
ENTRY(tz_decode_2, 2, 0)
#endif
#if TZ_ALL || TZ_UNIT == 2
ENTRY(tz_decode_2e8, 2, 8)
#endif
#if TZ_ALL || TZ_UNIT == 3
ENTRY(tz_decode_4, 4, 0)
#endif
#if TZ_ALL || TZ_UNIT == 4
ENTRY(tz_decode_4e8, 4, 8)
#endif
#if TZ_ALL || TZ_UNIT == 5
ENTRY(tz_decode_8, 8, 0)
#endif
#if TZ_ALL || TZ_UNIT == 6
ENTRY(tz_decode_8e11, 8, 11)
#endif

// Frequency of a table's code byte (docs/FORMAT.md, "Frequency tables"): 0 for an absent symbol
// and for the anchor (whose frequency is what the others leave of 4096). Codes were validated on
// the host (1..=207 or 255 in `lo..=hi`).
__device__ __forceinline__ u32 code_freq(u32 c) {
    if (c == 0u || c == 255u) return 0u;
    if (c < 128u) return c;
    const u32 k = c - 128u;
    return (16u + (k & 15u)) << ((k >> 4) + 3u);
}

// Inclusive scan of one value per thread into cum[1..=256] (cum[0] = 0; Hillis-Steele over 256
// threads). Every thread of the block must call it.
__device__ __forceinline__ void scan256(u32* cum, u32 f, u32 s) {
    __syncthreads();
    cum[s + 1] = f;
    if (s == 0) cum[0] = 0;
    __syncthreads();
    for (u32 d = 1; d < 256; d <<= 1) {
        const u32 v = s >= d ? cum[s + 1 - d] : 0u;
        __syncthreads();
        cum[s + 1] += v;
        __syncthreads();
    }
}

// Decoder tables from serialised frequency tables: block `t` expands table `t` (`lo`, `hi`, the
// codes of `lo..=hi`, from byte `offsets[t]` of `ser`; validated on the host) into its 4096 entries
// `sym | freq << 8 | bias << 20`, where `bias` is the slot's offset within its symbol's range
// (`FreqTable::decode_table` on the CPU). One scan sums the frequencies other than the anchor's,
// a second the cumulative frequencies; then each thread finds the symbol of 16 slots by binary
// search over them.
#if TZ_ALL || TZ_UNIT == -1
extern "C" __global__ void __launch_bounds__(256) tz_build_tables(const u8* __restrict__ ser, const u32* __restrict__ offsets, u32* __restrict__ tables) {
    __shared__ u32 cum[257];
    const u32 t = blockIdx.x, s = threadIdx.x;
    const u8* tb = ser + offsets[t];
    const u32 first = tb[0], last = tb[1];
    const u32 code = (s >= first && s <= last) ? (u32)tb[2 + s - first] : 0u;
    u32 f = code_freq(code);
    scan256(cum, f, s);
    if (code == 255u) f = 4096u - cum[256];
    scan256(cum, f, s);
    for (u32 slot = s; slot < 4096; slot += 256) {
        // The symbol whose range [cum[sym], cum[sym + 1]) holds `slot`.
        u32 lo = 0, hi = 256;
        while (hi - lo > 1) {
            const u32 mid = (lo + hi) / 2;
            if (cum[mid] <= slot) lo = mid; else hi = mid;
        }
        const u32 fr = cum[lo + 1] - cum[lo];
        tables[(u64)t * 4096 + slot] = lo | (fr << 8) | ((slot - cum[lo]) << 20);
    }
}
#endif

// Byte copies, one thread block per copy (`struct Copy` in plan.rs: `from` relative to `data`, `to`
// relative to `out`, `len` bytes). Used for the stored blobs of a decode batch — a model has many
// small stored tensors (57 of MiniLM's 104 in bf16: norms and biases under min_compress_bytes), and
// one launch replaces a copy call each; blobs over 1 MiB go to the copy engine (KERNEL_COPY_MAX in
// engine.rs) — and to gather device ranges for the host (`GpuEngine::read_ranges`).
struct CopyDesc {
    u64 from;
    u64 to;
    u64 len;
};

#if TZ_ALL || TZ_UNIT == -1
extern "C" __global__ void __launch_bounds__(256) tz_copy(const CopyDesc* __restrict__ copies, u32 n, u64 data, u64 out) {
    if (blockIdx.x >= n) return;
    CopyDesc c = copies[blockIdx.x];
    c.from += data;
    c.to += out;
    const u8* src = (const u8*)c.from;
    u8* dst = (u8*)c.to;
    u64 head = 0;
    if (((c.from ^ c.to) & 15) == 0) {
        // Same alignment: bytes up to the first 16-byte boundary, then 16 bytes per load.
        head = (16 - (c.from & 15)) & 15;
        if (head > c.len) head = c.len;
        const u64 vecs = (c.len - head) / 16;
        const uint4* s4 = (const uint4*)(src + head);
        uint4* d4 = (uint4*)(dst + head);
        for (u64 i = threadIdx.x; i < vecs; i += blockDim.x) d4[i] = s4[i];
        for (u64 i = head + vecs * 16 + threadIdx.x; i < c.len; i += blockDim.x) dst[i] = src[i];
    } else {
        head = c.len;
    }
    for (u64 i = threadIdx.x; i < head; i += blockDim.x) dst[i] = src[i];
}
#endif
