// Shared-memory accesses by 32-bit shared address, for the decoder's and the encoder's hot loops:
// they compile to LDS/STS instead of generic 64-bit loads and stores. `volatile` keeps them ordered
// with the barriers. Prepended to `decode.cu` and `encode.cu` by the engine (`src/compile.rs`), so
// it uses no type of theirs.
//
// Both sources are compiled in units (`Units` in src/compile.rs): with TZ_UNIT = -1 only their
// common kernels, with TZ_UNIT = k only the kernels of variant k (unit size and transform, in the
// order of `KERNELS` in src/plan.rs and `VARIANTS` in src/encode.rs); without TZ_UNIT, everything.
#ifndef TZ_UNIT
#define TZ_ALL 1
#define TZ_UNIT -2
#else
#define TZ_ALL 0
#endif

__device__ __forceinline__ unsigned int shared_addr(const void* p) {
    unsigned int r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ unsigned int lds8(unsigned int a) {
    unsigned int v;
    asm volatile("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ unsigned int lds16(unsigned int a) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ unsigned int lds32(unsigned int a) {
    unsigned int v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ uint4 lds128(unsigned int a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ void sts8(unsigned int a, unsigned int v) {
    asm volatile("st.shared.u8 [%0], %1;" ::"r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void sts16(unsigned int a, unsigned int v) {
    asm volatile("st.shared.u16 [%0], %1;" ::"r"(a), "h"((unsigned short)v) : "memory");
}
__device__ __forceinline__ void sts32(unsigned int a, unsigned int v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(a), "r"(v) : "memory");
}

