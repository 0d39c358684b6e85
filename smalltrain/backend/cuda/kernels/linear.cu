// linear.cu: small fully connected layers in one launch each way, for float32 (_f32) and float64 (_f64).
//   linear_fwd: out [M, F] = act(x [M, K] @ w [F, K]^T + b), and y = x @ w^T (before bias) when an activation
//            needs it for backward.
//   linear_bwd: one grid, two problems. Blocks [0, BX) compute dx [M, K] = g @ w, blocks [BX, BX + BW) compute
//            dw [F, K] = g^T @ x together with db [F] = g^T @ 1 (the reduction over M of a column of ones, output
//            column K). g = dout * act'(y + b) is formed while loading the tiles, never stored.
// Both are linear_tile.cuh's 16 x 16 output tiles. The launcher takes this path only while every operand is small
// (see linear.py) and all indices fit in 32 bits.
#include "common.cuh"
#include "linear_tile.cuh"

template <typename T>
__device__ void linear_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                           T* __restrict__ out, T* __restrict__ y, int M, int K, int F, int act) {
    const int tiles_j = (F + ST_LT - 1) / ST_LT;
    const int i0 = (blockIdx.x / tiles_j) * ST_LT, j0 = (blockIdx.x % tiles_j) * ST_LT;
    T acc[4];
    tile_gemm<T>(plain(x, K, 1, M, K), plain(w, K, 1, F, K), i0, j0, K, acc);
    const int j = j0 + threadIdx.x % ST_LT;
    if (threadIdx.x >= ST_LGROUP || j >= F) return;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int i = i0 + threadIdx.x / ST_LT + 4 * r;
        if (i >= M) break;
        T v = acc[r];
        if (y != nullptr) y[i * F + j] = v;
        if (b != nullptr) v += b[j];
        out[i * F + j] = act_fwd(v, act);
    }
}

template <typename T>
__device__ void linear_bwd(const T* __restrict__ dout, const T* __restrict__ y, const T* __restrict__ b,
                           const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ dx, T* __restrict__ dw,
                           T* __restrict__ db, int M, int K, int F, int ysm, int ysf, int act, int blocks_dx) {
    if ((int)blockIdx.x < blocks_dx) {   // dx [M, K] = g [M, F] @ w [F, K]
        T acc[4];
        const int tx = threadIdx.x % ST_LT, ty = threadIdx.x / ST_LT;   // used by group 0 (threadIdx.x < 64)
        const int tiles_j = (K + ST_LT - 1) / ST_LT;
        const int i0 = (blockIdx.x / tiles_j) * ST_LT, j0 = (blockIdx.x % tiles_j) * ST_LT;
        const Operand<T> g{dout, F, 1, M, F, -1, y, ysm, ysf, b, 0, act};
        tile_gemm<T>(g, plain(w, 1, K, K, F), i0, j0, F, acc);
        const int j = j0 + tx;
        if (threadIdx.x >= ST_LGROUP || j >= K) return;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int i = i0 + ty + 4 * r;
            if (i < M) dx[i * K + j] = acc[r];
        }
    } else {   // [dw | db] [F, K + 1] = g^T [F, M] @ [x | 1] [M, K + 1]
        const Operand<T> gt{dout, 1, F, F, M, -1, y, ysf, ysm, b, 1, act};
        dw_tile<T>(gt, x, dw, db, M, K, F, blockIdx.x - blocks_dx);
    }
}

#define ST_LINEAR(T, S)                                                                                            \
    extern "C" __global__ void __launch_bounds__(ST_LTHREADS)                                                      \
    linear_fwd_##S(const T* x, const T* w, const T* b, T* out, T* y, int M, int K, int F, int act) {               \
        ST_GRID_WAIT();                                                                                            \
        linear_fwd<T>(x, w, b, out, y, M, K, F, act);                                                              \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(ST_LTHREADS)                                                      \
    linear_bwd_##S(const T* dout, const T* y, const T* b, const T* x, const T* w, T* dx, T* dw, T* db, int M,      \
                   int K, int F, int ysm, int ysf, int act, int blocks_dx) {                                       \
        ST_GRID_WAIT();                                                                                            \
        linear_bwd<T>(dout, y, b, x, w, dx, dw, db, M, K, F, ysm, ysf, act, blocks_dx);                            \
    }
ST_INSTANTIATE(ST_LINEAR)
#undef ST_LINEAR
