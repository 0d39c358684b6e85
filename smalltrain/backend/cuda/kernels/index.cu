// index.cu: gather and scatter-add along one dim, float32 (_f32) and float64 (_f64), int64 indices.
// Layout: the indexed array is [outer, D, inner] contiguous (D = its size along dim); index, src and the gather
// output are [outer, J, inner] contiguous (the launcher makes the other dims match by slicing and copying).
//   gather:      out[o, j, i] = x[o, index[o, j, i], i]; an index outside [0, D) is not read through: out = NaN.
//   scatter_add: out[o, index[o, j, i], i] += src[o, j, i] with atomicAdd (summation order, and so the last bits,
//                vary between runs); an index outside [0, D) is skipped. The launcher checks indices on the host
//                first unless told not to.
//   copy_many:   up to ST_COPY_MAX device-to-device copies in one launch (a compiled step's inputs into its static
//                buffers, compile_.py, as a node at the head of its graph whose sources each call sets): bytes
//                [0, n_k) of src_k to dst_k, as 16-byte vectors where both addresses are 16-byte aligned, byte by
//                byte otherwise (and for the last n_k % 16 bytes); n_k = 0 copies nothing.
#include "common.cuh"

#define ST_COPY_MAX 4

extern "C" __global__ void copy_many(char* d0, const char* s0, i64 n0, char* d1, const char* s1, i64 n1, char* d2,
                                     const char* s2, i64 n2, char* d3, const char* s3, i64 n3) {
    ST_GRID_WAIT();
    char* const dst[ST_COPY_MAX] = {d0, d1, d2, d3};
    const char* const src[ST_COPY_MAX] = {s0, s1, s2, s3};
    const i64 n[ST_COPY_MAX] = {n0, n1, n2, n3};
    const i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x, stride = (i64)gridDim.x * blockDim.x;
#pragma unroll
    for (int k = 0; k < ST_COPY_MAX; ++k) {
        const bool aligned = ((reinterpret_cast<u64>(dst[k]) | reinterpret_cast<u64>(src[k])) & 15) == 0;
        const i64 vectors = aligned ? n[k] / 16 : 0;
        for (i64 i = first; i < vectors; i += stride)   // (a float4 load and store move the bits as they are)
            reinterpret_cast<float4*>(dst[k])[i] = reinterpret_cast<const float4*>(src[k])[i];
        for (i64 i = vectors * 16 + first; i < n[k]; i += stride) dst[k][i] = src[k][i];
    }
}

template <typename T>
__device__ void gather(const T* __restrict__ x, const i64* __restrict__ index, T* __restrict__ out, i64 outer, i64 D,
                       i64 J, i64 inner) {
    GRID_STRIDE(t, outer * J * inner) {
        const i64 i = t % inner, o = t / (J * inner), k = index[t];
        out[t] = (k >= 0 && k < D) ? x[(o * D + k) * inner + i] : st_nan<T>();
    }
}

template <typename T>
__device__ void scatter_add(T* __restrict__ out, const i64* __restrict__ index, const T* __restrict__ src, i64 outer,
                            i64 D, i64 J, i64 inner) {
    GRID_STRIDE(t, outer * J * inner) {
        const i64 i = t % inner, o = t / (J * inner), k = index[t];
        if (k >= 0 && k < D) atomicAdd(out + (o * D + k) * inner + i, src[t]);
    }
}

#define ST_INDEX(T, S)                                                                                           \
    extern "C" __global__ void gather_##S(const T* x, const i64* index, T* out, i64 outer, i64 D, i64 J,         \
                                          i64 inner) {                                                           \
        ST_GRID_WAIT();                                                                                          \
        gather<T>(x, index, out, outer, D, J, inner);                                                            \
    }                                                                                                            \
    extern "C" __global__ void scatter_add_##S(T* out, const i64* index, const T* src, i64 outer, i64 D, i64 J,  \
                                               i64 inner) {                                                      \
        ST_GRID_WAIT();                                                                                          \
        scatter_add<T>(out, index, src, outer, D, J, inner);                                                     \
    }
ST_INSTANTIATE(ST_INDEX)
#undef ST_INDEX
