// dropout.cu: dropout with a counter-based RNG (Philox4x32-10, Salmon et al. 2011), float32 (_f32) and float64 (_f64).
// The mask is a pure function of (seed, offset, element index), so backward recomputes it instead of storing it,
// and the same seed and offset always give the same mask on any GPU and grid size.
//   Element i belongs to group g = i / 4 and takes lane k = i % 4 of philox(counter = (lo(g), hi(g), lo(offset),
//   hi(offset)), key = (lo(seed), hi(seed))). It is dropped iff (r >> 8) < threshold, threshold = round(p * 2^24),
//   i.e. a 24-bit uniform below p.
//   dropout_apply: out[i] = x[i] * (dropped ? 0 : scale) (scale = 1/(1-p); forward on x, backward on dout): torch's
//                  x * mask * scale, so a dropped inf or NaN gives NaN, as in torch and the CPU path.
//   dropout_mask:  mask[i] = dropped ? 0 : 1 (uint8), for tests and for callers that want the mask itself.
// state: device uint64[2] = {seed, offset}, read by the kernel so that a captured CUDA graph can advance it.
#include "common.cuh"

struct u32x4 {
    u32 v[4];
};

__device__ __forceinline__ u32x4 philox4x32_10(u32x4 ctr, u32 k0, u32 k1) {
    const u32 M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        const u32 hi0 = __umulhi(M0, ctr.v[0]), lo0 = M0 * ctr.v[0];
        const u32 hi1 = __umulhi(M1, ctr.v[2]), lo1 = M1 * ctr.v[2];
        u32x4 next;
        next.v[0] = hi1 ^ ctr.v[1] ^ k0;
        next.v[1] = lo1;
        next.v[2] = hi0 ^ ctr.v[3] ^ k1;
        next.v[3] = lo0;
        ctr = next;
        k0 += W0;
        k1 += W1;
    }
    return ctr;
}

__device__ __forceinline__ u32x4 dropout_bits(u64 group, const u64* state) {
    const u64 seed = state[0], offset = state[1];
    u32x4 ctr;
    ctr.v[0] = (u32)group;
    ctr.v[1] = (u32)(group >> 32);
    ctr.v[2] = (u32)offset;
    ctr.v[3] = (u32)(offset >> 32);
    return philox4x32_10(ctr, (u32)seed, (u32)(seed >> 32));
}

template <typename T>
__device__ void dropout_apply(const T* __restrict__ x, T* __restrict__ out, i64 n, u32 threshold, T scale,
                              const u64* __restrict__ state) {
    GRID_STRIDE(g, (n + 3) / 4) {
        const u32x4 r = dropout_bits((u64)g, state);
        for (int k = 0; k < 4; ++k) {
            const i64 i = 4 * g + k;
            if (i < n) out[i] = x[i] * ((r.v[k] >> 8) < threshold ? T(0) : scale);
        }
    }
}

extern "C" __global__ void dropout_mask(unsigned char* __restrict__ mask, i64 n, u32 threshold,
                                        const u64* __restrict__ state) {
    ST_GRID_WAIT();
    GRID_STRIDE(g, (n + 3) / 4) {
        const u32x4 r = dropout_bits((u64)g, state);
        for (int k = 0; k < 4; ++k) {
            const i64 i = 4 * g + k;
            if (i < n) mask[i] = (r.v[k] >> 8) < threshold ? 0 : 1;
        }
    }
}

#define ST_DROPOUT(T, S)                                                                                       \
    extern "C" __global__ void dropout_apply_##S(const T* x, T* out, i64 n, u32 threshold, T scale,           \
                                                 const u64* state) {                                           \
        ST_GRID_WAIT();                                                                                        \
        dropout_apply<T>(x, out, n, threshold, scale, state);                                                  \
    }
ST_INSTANTIATE(ST_DROPOUT)
#undef ST_DROPOUT
