// index.cu: gather and scatter-add along one dim, float32 (_f32) and float64 (_f64), int64 indices.
// Layout: the indexed array is [outer, D, inner] contiguous (D = its size along dim); index, src and the gather
// output are [outer, J, inner] contiguous (the launcher makes the other dims match by slicing and copying).
//   gather:      out[o, j, i] = x[o, index[o, j, i], i]; an index outside [0, D) is not read through: out = NaN.
//   scatter_add: out[o, index[o, j, i], i] += src[o, j, i] with atomicAdd (summation order, and so the last bits,
//                vary between runs); an index outside [0, D) is skipped. The launcher checks indices on the host
//                first unless told not to.
#include "common.cuh"

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
