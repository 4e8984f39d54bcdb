// tensorzip GPU decoder: one warp per chunk (docs/FORMAT.md, "Planes blob" and "The rANS stream").
//
// Every size and offset in the descriptors was validated on the host; what the host cannot check
// without reading the payloads (selectors, stream words, raw-area sizes) is checked here with bounded
// reads, and a failure is reported through `err` (the output is then garbage and the host returns an
// error). Nothing is read outside the chunk's payload or written outside the chunk's output.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define LANES 32
#define STATE_LOWER 65536u
#define RING 512          // words in the per-warp ring buffer of stream words
#define SEL_CONST 254
#define SEL_RAW 255
#define MODE_RAW 0
#define MODE_CONST 1
#define MODE_BLOCKS 2
#define MODE_COND 3

// Error codes (first error wins): 1 selector, 2 stream short, 3 state, 4 raw area, 5 stream end,
// 6 stream presence.
struct ChunkDesc {
    u64 payload;          // offset of the payload in `data`
    u64 out;              // offset of the chunk's bytes in `out`
    u32 payload_len;
    u32 rans_len;
    u32 sel_len;          // bytes of selectors
    u32 len;              // units
    u32 tensor;           // index of its TensorDesc
    u32 pad;
    u8 modes[8];
    u8 values[8];
};

struct TensorDesc {
    u32 block_units;
    u32 unit_size;        // planes
    u32 exp_bits;         // transform: 0 identity, else sign below an exponent of this many bits
    u32 cond_plane;       // 255 = none
    u32 cond_src;
    u32 cond_value;
    u32 cond_table;       // global table index
    u32 pad;
    u32 table_base[8];    // global index of each plane's table 0
    u32 n_tables[8];
};

__device__ __forceinline__ u32 lanemask_lt() {
    u32 m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

__device__ __forceinline__ void fail(u32* err, u32 code, u32 chunk) {
    atomicCAS(err, 0u, code);
    atomicCAS(err + 1, 0xFFFFFFFFu, chunk);
}

// Stream state of a warp: lane states and the ring of words.
struct Stream {
    const u8* words;      // stream words in global memory (may be unaligned)
    u32 n_words;
    u32 fetched;          // words copied into the ring so far
    u32 pos;              // words consumed
    u16* ring;
    u32 x;                // this lane's state
    bool bad;
};

// Makes sure at least 32 unconsumed words are in the ring (or all that remain).
__device__ __forceinline__ void refill(Stream& s, int lane) {
    if (s.fetched - s.pos >= LANES || s.fetched >= s.n_words) return;
    // 256 words: 8 per lane, read bytewise (the stream may be unaligned).
    u32 base = s.fetched;
    #pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 w = base + lane * 8 + k;
        u16 v = 0;
        if (w < s.n_words) v = (u16)s.words[2 * w] | ((u16)s.words[2 * w + 1] << 8);
        s.ring[w % RING] = v;
    }
    __syncwarp();
    s.fetched = min(base + 256u, s.n_words);
}

// Decodes one symbol in each active lane with table `t`; returns the symbol.
__device__ __forceinline__ u32 step(Stream& s, const u32* __restrict__ t, bool active, int lane) {
    refill(s, lane);
    u32 sym = 0;
    bool need = false;
    if (active) {
        u32 e = __ldg(t + (s.x & 4095u));
        sym = e & 0xFFu;
        s.x = ((e >> 8) & 0xFFFu) * (s.x >> 12) + (e >> 20);
        need = s.x < STATE_LOWER;
    }
    u32 mask = __ballot_sync(0xFFFFFFFFu, need);
    u32 n = __popc(mask);
    if (s.pos + n > s.fetched) {
        s.bad = true;
        return sym;
    }
    if (need) s.x = (s.x << 16) | s.ring[(s.pos + __popc(mask & lanemask_lt())) % RING];
    s.pos += n;
    return sym;
}

__device__ __forceinline__ u64 inverse_transform(u64 t, u32 bits, u32 e) {
    if (e == 0) return t;
    u32 mant_bits = bits - 1 - e;
    u64 exp_old = ((1ull << e) - 1) << mant_bits;
    u64 mant = (1ull << mant_bits) - 1;
    u64 sign = 1ull << (bits - 1);
    return ((t >> 1) & exp_old) | ((t << e) & sign) | (t & mant);
}

extern "C" __global__ void tz_decode(const u8* __restrict__ data, const ChunkDesc* __restrict__ chunks, u32 n_chunks,
                                     const TensorDesc* __restrict__ tensors, const u32* __restrict__ tables,
                                     const u32* __restrict__ table_info, u8* __restrict__ out, u32* err,
                                     u8* __restrict__ scratch, u32 scratch_per_warp, u32 warps_per_block) {
    extern __shared__ u8 smem[];
    const int lane = threadIdx.x & 31;
    const u32 warp = threadIdx.x >> 5;
    const u32 c = blockIdx.x * warps_per_block + warp;
    if (c >= n_chunks) return;
    const ChunkDesc cd = chunks[c];
    const TensorDesc td = tensors[cd.tensor];
    const u32 U = td.unit_size;
    const u32 bu = td.block_units;
    const u32 nb = (cd.len + bu - 1) / bu;
    // Per-warp buffers: U planes of a block, the conditioned sub-segment, the word ring, the stash.
    u8* buf = scratch ? scratch + (u64)c * scratch_per_warp : smem + warp * scratch_per_warp;
    u8* sub = buf + U * bu;
    u16* ring = (u16*)(sub + bu + 8);
    u8* stash = (u8*)(ring + RING);
    const u8* payload = data + cd.payload;
    const u8* sels = payload;
    const u8* raw = payload + cd.sel_len + cd.rans_len;
    const u32 raw_len = cd.payload_len - cd.sel_len - cd.rans_len;
    u32 sel_off[8];
    {
        u32 o = 0;
        for (u32 p = 0; p < U; p++) {
            sel_off[p] = o;
            if (cd.modes[p] == MODE_BLOCKS) o += nb;
        }
    }
    Stream s;
    s.words = payload + cd.sel_len + 128;
    s.n_words = cd.rans_len ? (cd.rans_len - 128) / 2 : 0;
    s.fetched = 0;
    s.pos = 0;
    s.ring = ring;
    s.bad = false;
    s.x = 0;
    if (cd.rans_len) {
        const u8* st = payload + cd.sel_len + 4 * lane;
        s.x = (u32)st[0] | ((u32)st[1] << 8) | ((u32)st[2] << 16) | ((u32)st[3] << 24);
        if (__any_sync(0xFFFFFFFFu, s.x < STATE_LOWER)) { if (lane == 0) fail(err, 3, c); return; }
    }
    bool used = false;
    bool has_cond = td.cond_plane < 8 && cd.modes[td.cond_plane] == MODE_COND;
    u32 raw_off = 0;
    for (u32 b = 0; b < nb; b++) {
        const u32 blen = min(bu, cd.len - b * bu);
        // Selectors of this block, validated; the block's raw layout (but for the conditioned plane).
        u32 off[8], size[8], fixed = 0;
        u32 sel[8];
        for (u32 p = 0; p < U; p++) {
            u32 m = cd.modes[p];
            sel[p] = SEL_RAW;
            size[p] = 0;
            if (m == MODE_RAW) size[p] = blen;
            if (m == MODE_BLOCKS) {
                u32 v = sels[sel_off[p] + b];
                if (v != SEL_RAW && v != SEL_CONST && v >= td.n_tables[p]) { if (lane == 0) fail(err, 1, c); return; }
                sel[p] = v;
                size[p] = v == SEL_RAW ? blen : (v == SEL_CONST ? 1 : 0);
            }
            off[p] = fixed;
            fixed += size[p];
        }
        // Main group: coded planes, step by step.
        for (u32 r = 0; r * LANES < blen; r++) {
            u32 i = r * LANES + lane;
            for (u32 p = 0; p < U; p++) {
                if (cd.modes[p] != MODE_BLOCKS || sel[p] >= SEL_CONST) continue;
                u32 g = td.table_base[p] + sel[p];
                if (table_info[g] >> 31) continue;  // single-symbol table: nothing in the stream
                if (!cd.rans_len) { if (lane == 0) fail(err, 6, c); return; }
                used = true;
                u32 sym = step(s, tables + (u64)g * 4096, i < blen, lane);
                if (s.bad) { if (lane == 0) fail(err, 2, c); return; }
                if (i < blen) buf[p * bu + i] = (u8)sym;
            }
        }
        __syncwarp();
        // The block's bytes of every plane that is not read from the raw area at merge time.
        for (u32 p = 0; p < U; p++) {
            u32 m = cd.modes[p];
            u8 fillv = 0;
            bool fill = false;
            if (m == MODE_CONST) { fill = true; fillv = cd.values[p]; }
            if (m == MODE_BLOCKS && sel[p] < SEL_CONST && (table_info[td.table_base[p] + sel[p]] >> 31)) {
                fill = true;
                fillv = (u8)table_info[td.table_base[p] + sel[p]];
            }
            if (m == MODE_BLOCKS && sel[p] == SEL_CONST) { fill = true; fillv = 0; }  // placed at merge
            if (fill && !(m == MODE_BLOCKS && sel[p] == SEL_CONST))
                for (u32 i = lane; i < blen; i += LANES) buf[p * bu + i] = fillv;
        }
        // Conditioned plane: coded units are those whose condition byte equals the value.
        u32 coded = 0;
        if (has_cond) {
            u32 q = td.cond_src;
            bool q_raw = cd.modes[q] == MODE_RAW || (cd.modes[q] == MODE_BLOCKS && sel[q] == SEL_RAW);
            bool q_const_blk = cd.modes[q] == MODE_BLOCKS && sel[q] == SEL_CONST;
            // The condition bytes are never in the stash (it holds only the conditioned plane's).
            if (raw_off + off[q] + size[q] > raw_len) { if (lane == 0) fail(err, 4, c); return; }
            for (u32 r = 0; r * LANES < blen; r++) {
                u32 i = r * LANES + lane;
                bool hit = false;
                if (i < blen) {
                    u8 e = q_raw ? raw[raw_off + off[q] + i] : (q_const_blk ? raw[raw_off + off[q]] : buf[q * bu + i]);
                    hit = e == (u8)td.cond_value;
                }
                coded += __popc(__ballot_sync(0xFFFFFFFFu, hit));
            }
        }
        const u32 cond_raw = has_cond ? blen - coded : 0;
        const u32 total = fixed + cond_raw;
        const bool last = b + 1 == nb;
        u32 stash_len = 0;
        if (last && cd.rans_len) stash_len = min(has_cond ? cond_raw : total, 64u);
        const u32 from_area = total - stash_len;
        if (raw_off + from_area > raw_len || (last && raw_off + from_area != raw_len)) { if (lane == 0) fail(err, 4, c); return; }
        // Sub-segment of the conditioned plane.
        if (coded) {
            if (!cd.rans_len) { if (lane == 0) fail(err, 6, c); return; }
            used = true;
            const u32* t = tables + (u64)td.cond_table * 4096;
            for (u32 r = 0; r * LANES < coded; r++) {
                u32 k = r * LANES + lane;
                u32 sym = step(s, t, k < coded, lane);
                if (s.bad) { if (lane == 0) fail(err, 2, c); return; }
                if (k < coded) sub[k] = (u8)sym;
            }
        }
        // End of the stream at the last block: every word read, states back at 2^16 + stash.
        if (last && cd.rans_len) {
            u32 carried = stash_len > 2 * (u32)lane ? min(stash_len - 2 * lane, 2u) : 0u;
            u32 v = s.x - STATE_LOWER;
            bool ok = s.x >= STATE_LOWER && v < (1u << (8 * carried)) && s.pos == s.n_words && used;
            if (!__all_sync(0xFFFFFFFFu, ok)) { if (lane == 0) fail(err, 5, c); return; }
            stash[2 * lane] = (u8)v;
            stash[2 * lane + 1] = (u8)(v >> 8);
        }
        __syncwarp();
        // Merge: each lane builds units lane, lane + 32, ...
        u32 base_c = 0, base_r = 0;
        const u8* area = raw + raw_off;
        for (u32 r = 0; r * LANES < blen; r++) {
            u32 i = r * LANES + lane;
            bool in = i < blen;
            bool hit = false;
            if (has_cond && in) {
                u32 q = td.cond_src;
                bool q_raw = cd.modes[q] == MODE_RAW || (cd.modes[q] == MODE_BLOCKS && sel[q] == SEL_RAW);
                bool q_const_blk = cd.modes[q] == MODE_BLOCKS && sel[q] == SEL_CONST;
                u8 e = q_raw ? area[off[q] + i] : (q_const_blk ? area[off[q]] : buf[q * bu + i]);
                hit = e == (u8)td.cond_value;
            }
            u32 mask = has_cond ? __ballot_sync(0xFFFFFFFFu, hit) : 0u;
            u32 below = __popc(mask & lanemask_lt());
            if (in) {
                u64 t = 0;
                for (u32 p = 0; p < U; p++) {
                    u32 m = cd.modes[p];
                    u32 v;
                    if (m == MODE_RAW || (m == MODE_BLOCKS && sel[p] == SEL_RAW)) {
                        u32 j = off[p] + i;
                        v = j < from_area ? area[j] : stash[j - from_area];
                    } else if (m == MODE_BLOCKS && sel[p] == SEL_CONST) {
                        u32 j = off[p];
                        v = j < from_area ? area[j] : stash[j - from_area];
                    } else if (m == MODE_COND) {
                        if (hit) {
                            v = sub[base_c + below];
                        } else {
                            u32 j = fixed + base_r + (i - r * LANES - below);
                            v = j < from_area ? area[j] : stash[j - from_area];
                        }
                    } else {
                        v = buf[p * bu + i];
                    }
                    t |= (u64)v << (8 * p);
                }
                u64 u = inverse_transform(t, 8 * U, td.exp_bits);
                u8* o = out + cd.out + (u64)(b * bu + i) * U;
                for (u32 p = 0; p < U; p++) o[p] = (u8)(u >> (8 * p));
            }
            u32 n = __popc(mask);
            u32 active = min(32u, blen - r * LANES);
            base_c += n;
            base_r += active - n;
        }
        __syncwarp();
        raw_off += from_area;
    }
    if (cd.rans_len && !used) { if (lane == 0) fail(err, 6, c); }
}
