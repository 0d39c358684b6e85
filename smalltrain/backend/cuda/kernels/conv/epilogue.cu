// conv/epilogue.cu: the element-wise epilogues and the weight gradient's reduction every convolution path shares,
// float32 (_f32) and float64 (_f64).
//   bias_act_fwd: the GEMM result y [O, N, P] (P = OH*OW) -> out [N, O, P] = act(y + b[o]) (transpose, bias and
//            activation fused in one pass). bias_act_bwd: dout [N, O, P] -> g [O, N, P] = dout * act'(y + b[o]);
//            bias_act_bwd_rows the same with a block per row (o, n) of g and threads along p, for the convolutions'
//            long rows (P >= 64): one division per row instead of three per element. (linear.py's cuBLAS path
//            uses bias_act_fwd too, with P = 1.)
//   wgrad_reduce: dw [O, C*KH*KW] and db [O] from the partial rows [S, O*(C*KH*KW + 1)] that wgrad_partial,
//            igemm_wgrad, tile_wgrad, pooled_wgrad and tile_conv's producer epilogues write, summed in a fixed order.
#include "../common.cuh"

template <typename T, typename I>
__device__ void bias_act_fwd(const T* __restrict__ y, const T* __restrict__ b, T* __restrict__ out, I N, I O,
                             I P, int act) {
    GRID_STRIDE_I(I, t, N * O * P) {
        const I p = t % P, o = (t / P) % O, n = t / (O * P);
        T v = y[(o * N + n) * P + p];
        if (b != nullptr) v += b[o];
        out[t] = act_fwd(v, act);
    }
}

template <typename T, typename I>
__device__ void bias_act_bwd(const T* __restrict__ dout, const T* __restrict__ y, const T* __restrict__ b,
                             T* __restrict__ g, I N, I O, I P, int act) {
    GRID_STRIDE_I(I, t, N * O * P) {
        const I p = t % P, n = (t / P) % N, o = t / (N * P);
        const T d = dout[(n * O + o) * P + p];
        if (act == ST_ACT_NONE) {
            g[t] = d;
        } else {
            T v = y[t];
            if (b != nullptr) v += b[o];
            g[t] = act_bwd(d, v, act);
        }
    }
}

template <typename T, typename I>
__device__ void bias_act_bwd_rows(const T* __restrict__ dout, const T* __restrict__ y, const T* __restrict__ b,
                                  T* __restrict__ g, I N, I O, I P, int act) {
    for (I r = blockIdx.x; r < O * N; r += gridDim.x) {   // row r = o*N + n of g (and of y)
        const I o = r / N, n = r - o * N;
        const T* d = dout + (n * O + o) * P;
        T* gr = g + r * P;
        if (act == ST_ACT_NONE) {
            for (I p = threadIdx.x; p < P; p += blockDim.x) gr[p] = d[p];
        } else {
            const T* yr = y + r * P;
            const T bo = b != nullptr ? b[o] : T(0);
            for (I p = threadIdx.x; p < P; p += blockDim.x) gr[p] = act_bwd(d[p], yr[p] + bo, act);
        }
    }
}

// wgrad_reduce: out[m] = sum over the S rows of partial[s, m], for m = o*(K+1) + k (k == K: db). Blocks of 32
// outputs x G row groups (G = blockDim.x / 32, up to 32; the launcher gives many rows more groups): thread (m, r)
// sums rows r, r + G, ... in order (a warp reads 32 consecutive outputs of a row: coalesced), then the G sums
// are added in group order (deterministic, no atomics). ST_WR_BATCH rows' loads are in flight at once, so that a
// thread's rows (the conv tuning table's wr_rows, 16) cost one L2 round trip, not one per 4.
#define ST_WR_BATCH 16
// The sum of column m of rows first, first + step, ... (below R) of partial [R][M], added in row order, ST_WR_BATCH
// loads in flight at a time (wgrad_reduce; tile_conv_unpool_wgrad's last block). CG: the loads go to L2 (__ldcg),
// for rows that other blocks of the same launch wrote (an SM's L1 does not see them).
template <typename T, bool CG>
__device__ __forceinline__ T st_rows_sum(const T* __restrict__ partial, int m, int M, int first, int step, int R) {
    T acc = T(0);
    for (int s = first; s < R; s += ST_WR_BATCH * step) {
        T v[ST_WR_BATCH];
#pragma unroll
        for (int u = 0; u < ST_WR_BATCH; ++u) {
            const int r = s + u * step;
            v[u] = r < R ? (CG ? __ldcg(partial + r * M + m) : partial[r * M + m]) : T(0);
        }
#pragma unroll
        for (int u = 0; u < ST_WR_BATCH; ++u)
            if (s + u * step < R) acc += v[u];
    }
    return acc;
}

template <typename T>
__device__ void wgrad_reduce(const T* __restrict__ partial, T* __restrict__ dw, T* __restrict__ db, int S, int O,
                             int K) {
    __shared__ T sums[32][32];
    const int KB = K + 1, M = O * KB, lane = threadIdx.x & 31, r = threadIdx.x >> 5, G = blockDim.x >> 5;
    const int m = blockIdx.x * 32 + lane;
    sums[r][lane] = m < M ? st_rows_sum<T, false>(partial, m, M, r, G, S) : T(0);
    __syncthreads();
    if (r == 0 && m < M) {
        T v = sums[0][lane];
        for (int q = 1; q < G; ++q) v += sums[q][lane];
        const int o = m / KB, k = m - o * KB;
        if (k < K) dw[o * K + k] = v;
        else if (db != nullptr) db[o] = v;
    }
}

#define ST_EPILOGUE(T, S)                                                                                          \
    extern "C" __global__ void bias_act_fwd_##S(const T* y, const T* b, T* out, i64 N, i64 O, i64 P, int act) {     \
        ST_GRID_WAIT();                                                                                             \
        if (st_fits32(N * O * P)) bias_act_fwd<T, int>(y, b, out, N, O, P, act);                                   \
        else bias_act_fwd<T, i64>(y, b, out, N, O, P, act);                                                        \
    }                                                                                                              \
    extern "C" __global__ void bias_act_bwd_##S(const T* dout, const T* y, const T* b, T* g, i64 N, i64 O, i64 P,   \
                                                int act) {                                                         \
        ST_GRID_WAIT();                                                                                            \
        if (st_fits32(N * O * P)) bias_act_bwd<T, int>(dout, y, b, g, N, O, P, act);                               \
        else bias_act_bwd<T, i64>(dout, y, b, g, N, O, P, act);                                                    \
    }                                                                                                              \
    extern "C" __global__ void bias_act_bwd_rows_##S(const T* dout, const T* y, const T* b, T* g, i64 N, i64 O,     \
                                                     i64 P, int act) {                                             \
        ST_GRID_WAIT();                                                                                            \
        if (st_fits32(N * O * P)) bias_act_bwd_rows<T, int>(dout, y, b, g, N, O, P, act);                          \
        else bias_act_bwd_rows<T, i64>(dout, y, b, g, N, O, P, act);                                               \
    }                                                                                                              \
    extern "C" __global__ void wgrad_reduce_##S(const T* partial, T* dw, T* db, int S, int O, int K) {             \
        ST_GRID_WAIT();                                                                                            \
        wgrad_reduce<T>(partial, dw, db, S, O, K);                                                                 \
    }
ST_INSTANTIATE(ST_EPILOGUE)
#undef ST_EPILOGUE
