// conv/igemm.cu: the groups == 1 convolutions as implicit GEMMs (x gathered while staging, no cols matrix), float32
// (_f32) and float64 (_f64); x [N, C, H, W], w [O, C, KH, KW], g [O, N*OH*OW], all contiguous, 32-bit indices
// (the launcher checks), tap offsets packed in 16 bits.
//   igemm_fwd: the forward of the convolutions direct_fwd does not take, C*KH*KW up to ST_IGKMAX (its tap table);
//            bias, activation and y (the sum before bias) as direct_fwd.
//   igemm_wgrad: dw and db into partial rows [S, O*(C*KH*KW + 1)] for wgrad_reduce (epilogue.cu).
#include "../common.cuh"


// igemm_fwd: the forward as an implicit GEMM, for the groups == 1 convolutions direct_fwd does not take (MnistCnn's
// second layer: more work than direct_fwd's limit, its image too large for shared memory beside the weights):
// C[o, q] = sum_k w[o, k] X(k, q) over q = (n, oh, ow) and k = (c, i, j), X gathered from x while staging (no cols
// matrix). Block tiles of BO output channels x BQ positions, reduction slices of ST_IGK staged in shared memory
// (the next slice's loads in flight in registers during the products); each thread keeps a 4 x 4 register tile (4
// channels, 4 positions QT apart, so that a warp's stores are coalesced). Bias, activation and y (the sum before
// bias, [O, N, P]) in the epilogue. The taps' offsets in x come from a table built once per block.
#define ST_IGK 16
#define ST_IGKMAX 1024
#define ST_IGTHREADS 256

template <typename T, int BO>
__device__ void igemm_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                          T* __restrict__ out, T* __restrict__ y, int N, int C, int H, int W, int O, int KH, int KW,
                          int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, int act) {
    constexpr int OG = BO / 4, QT = ST_IGTHREADS / OG, BQ = QT * 4;          // channel groups, position threads
    constexpr int A_PER = ST_IGK * BO / ST_IGTHREADS, B_PER = ST_IGK * BQ / ST_IGTHREADS;
    constexpr int B_ROWS = ST_IGTHREADS / BQ;                                  // slice rows one pass of B covers
    static_assert(A_PER >= 1 && B_PER >= 1 && B_ROWS >= 1, "igemm_fwd tile");
    __shared__ T as[ST_IGK][BO];
    __shared__ T bs[ST_IGK][BQ];
    __shared__ int ktab[ST_IGKMAX];   // tap k: its offset in x, (c*H + i*dh)*W + j*dw
    __shared__ int kij[ST_IGKMAX];    // (i*dh) << 16 | j*dw, for the bounds
    const int K = C * KH * KW, P = OH * OW, Q = N * P, KK = KH * KW;
    const int qblocks = (Q + BQ - 1) / BQ, o0 = (blockIdx.x / qblocks) * BO, q0 = (blockIdx.x % qblocks) * BQ;
    for (int k = threadIdx.x; k < K; k += ST_IGTHREADS) {
        const int c = k / KK, r = k - c * KK, i = r / KW, j = r - i * KW;
        ktab[k] = (c * H + i * dh) * W + j * dw;
        kij[k] = ((i * dh) << 16) | (j * dw);
    }
    // this thread's B column (one position for every slice) and its A element(s)
    const int bq = threadIdx.x % BQ, brow = threadIdx.x / BQ, q = q0 + bq;
    int xbase = 0, h0 = 0, w0 = 0;
    const bool q_ok = q < Q;
    if (q_ok) {
        const int n = q / P, p = q - n * P, oh = p / OW, ow = p - oh * OW;
        h0 = oh * sh - ph;
        w0 = ow * sw - pw;
        xbase = n * C * H * W + h0 * W + w0;
    }
    __syncthreads();   // ktab
    T ra[A_PER], rb[B_PER];
    auto fetch = [&](int k0) {
#pragma unroll
        for (int t = 0; t < A_PER; ++t) {   // k fastest: w's rows are contiguous
            const int e = threadIdx.x + t * ST_IGTHREADS, kk = e % ST_IGK, oo = e / ST_IGK;
            ra[t] = o0 + oo < O && k0 + kk < K ? w[(o0 + oo) * K + k0 + kk] : T(0);
        }
#pragma unroll
        for (int t = 0; t < B_PER; ++t) {
            const int k = k0 + brow + t * B_ROWS;
            T v = T(0);
            if (q_ok && k < K) {
                const int ij = kij[k], ih = h0 + (ij >> 16), iw = w0 + (ij & 0xffff);
                if (ih >= 0 && ih < H && iw >= 0 && iw < W) v = x[xbase + ktab[k]];
            }
            rb[t] = v;
        }
    };
    T acc[4][4];
#pragma unroll
    for (int v = 0; v < 4; ++v)
#pragma unroll
        for (int u = 0; u < 4; ++u) acc[v][u] = T(0);
    const int og = threadIdx.x / QT, tq = threadIdx.x % QT;
    fetch(0);
    for (int k0 = 0; k0 < K; k0 += ST_IGK) {
        __syncthreads();   // the previous slice is consumed
#pragma unroll
        for (int t = 0; t < A_PER; ++t) {
            const int e = threadIdx.x + t * ST_IGTHREADS;
            as[e % ST_IGK][e / ST_IGK] = ra[t];
        }
#pragma unroll
        for (int t = 0; t < B_PER; ++t) bs[brow + t * B_ROWS][bq] = rb[t];
        __syncthreads();
        if (k0 + ST_IGK < K) fetch(k0 + ST_IGK);   // in flight during the products
#pragma unroll
        for (int kk = 0; kk < ST_IGK; ++kk) {
            T a[4], bv[4];
#pragma unroll
            for (int v = 0; v < 4; ++v) a[v] = as[kk][og * 4 + v];   // a broadcast: a warp shares og
#pragma unroll
            for (int u = 0; u < 4; ++u) bv[u] = bs[kk][tq + u * QT];
#pragma unroll
            for (int v = 0; v < 4; ++v)
#pragma unroll
                for (int u = 0; u < 4; ++u) acc[v][u] += a[v] * bv[u];
        }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const int qq = q0 + tq + u * QT;
        if (qq >= Q) break;
        const int n = qq / P, p = qq - n * P;
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            const int o = o0 + og * 4 + v;
            if (o >= O) break;
            T val = acc[v][u];
            if (y != nullptr) y[(o * N + n) * P + p] = val;
            if (b != nullptr) val += b[o];
            out[(n * O + o) * P + p] = act_fwd(val, act);
        }
    }
}


// igemm_wgrad: the weight and bias gradients as an implicit GEMM, for the convolutions igemm_fwd takes:
// partial[s, o*(K+1) + k] = sum over split s's positions q of g[o, q] * X(k, q), X gathered from x while staging
// (no cols matrix; k == K is the bias, X = 1). Block tiles of BO channels x BK taps, (BO/TO) x (BK/TK) threads each
// keeping a TO x TK register tile (TO channels, TK taps BK/TK apart, so that a warp reads consecutive taps); split
// s walks the slices of ST_WGQ positions s, s + S, ... (neighbouring blocks read neighbouring positions at the same
// time), the next slice's loads in flight in registers during the products. wgrad_reduce then sums the S rows in
// a fixed order (deterministic, no atomics). Each thread stages one position of every slice, so its position's
// coordinates are computed once per slice. Tiles (conv/igemm.py _WG_TILES): 32 x 64 and 16 x 128 with 4 x 4 per thread
// (128 threads), 8 x 32 with 2 x 2 (64 threads) for the layers with few channels and taps (LeNet-5's first).
#define ST_WGQ 16
#define ST_WG_BIAS (-1)   // a tap-table entry: the bias column (X = 1)
#define ST_WG_NONE (-2)   // a tap-table entry past K + 1 (X = 0)

template <typename T, int BO, int BK, int TO, int TK>
__device__ void igemm_wgrad(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ partial, int N, int C,
                            int H, int W, int O, int KH, int KW, int OH, int OW, int sh, int sw, int ph, int pw,
                            int dh, int dw, int S, int with_bias) {
    constexpr int KT = BK / TK, THREADS = (BO / TO) * KT;                       // tap threads, all threads
    constexpr int ROWS = THREADS / ST_WGQ;                                     // rows one staging pass covers
    constexpr int G_PER = BO / ROWS, X_PER = BK / ROWS;
    static_assert(G_PER >= 1 && X_PER >= 1 && G_PER * ROWS == BO && X_PER * ROWS == BK, "igemm_wgrad tile");
    __shared__ T gs[ST_WGQ][BO + 1];   // +1: the staging stores (16 positions, one column each) hit 16 banks
    __shared__ T xs[ST_WGQ][BK + 1];
    __shared__ int ktab[BK];           // tap k0 + kk: its offset in x, (c*H + i*dh)*W + j*dw
    __shared__ int kij[BK];            // (i*dh) << 16 | j*dw for the bounds, or ST_WG_BIAS / ST_WG_NONE
    const int K = C * KH * KW, KB = K + 1, P = OH * OW, Q = N * P, KK = KH * KW;
    const int ktiles = (KB + BK - 1) / BK, tiles = ktiles * ((O + BO - 1) / BO);
    const int tile = blockIdx.x % tiles, split = blockIdx.x / tiles;
    const int o0 = (tile / ktiles) * BO, k0 = (tile % ktiles) * BK;
    for (int kk = threadIdx.x; kk < BK; kk += THREADS) {
        const int k = k0 + kk;
        if (k < K) {
            const int c = k / KK, r = k - c * KK, i = r / KW, j = r - i * KW;
            ktab[kk] = (c * H + i * dh) * W + j * dw;
            kij[kk] = ((i * dh) << 16) | (j * dw);
        } else {
            ktab[kk] = 0;
            kij[kk] = k == K && with_bias ? ST_WG_BIAS : ST_WG_NONE;
        }
    }
    __syncthreads();   // the tap table
    const int qq = threadIdx.x % ST_WGQ, row = threadIdx.x / ST_WGQ;   // this thread's staged position and rows
    const int slices = (Q + ST_WGQ - 1) / ST_WGQ;
    T rg[G_PER], rx[X_PER];
    auto fetch = [&](int sl) {
        const int q = sl * ST_WGQ + qq;
        const bool ok = q < Q;
        int h0 = 0, w0 = 0, xbase = 0;
        if (ok) {
            const int n = q / P, p = q - n * P, oh = p / OW, ow = p - oh * OW;
            h0 = oh * sh - ph;
            w0 = ow * sw - pw;
            xbase = n * C * H * W + h0 * W + w0;
        }
#pragma unroll
        for (int t = 0; t < G_PER; ++t) {
            const int o = o0 + row + t * ROWS;
            rg[t] = ok && o < O ? g[o * Q + q] : T(0);
        }
#pragma unroll
        for (int t = 0; t < X_PER; ++t) {
            const int kk = row + t * ROWS, ij = kij[kk];
            T v = T(0);
            if (ok) {
                if (ij >= 0) {
                    const int ih = h0 + (ij >> 16), iw = w0 + (ij & 0xffff);
                    if (ih >= 0 && ih < H && iw >= 0 && iw < W) v = x[xbase + ktab[kk]];
                } else if (ij == ST_WG_BIAS) {
                    v = T(1);
                }
            }
            rx[t] = v;
        }
    };
    T acc[TO][TK];
#pragma unroll
    for (int v = 0; v < TO; ++v)
#pragma unroll
        for (int u = 0; u < TK; ++u) acc[v][u] = T(0);
    const int og = threadIdx.x / KT, kt = threadIdx.x % KT;
    if (split < slices) fetch(split);
    for (int sl = split; sl < slices; sl += S) {
        __syncthreads();   // the previous slice is consumed
#pragma unroll
        for (int t = 0; t < G_PER; ++t) gs[qq][row + t * ROWS] = rg[t];
#pragma unroll
        for (int t = 0; t < X_PER; ++t) xs[qq][row + t * ROWS] = rx[t];
        __syncthreads();
        if (sl + S < slices) fetch(sl + S);   // in flight during the products
#pragma unroll
        for (int p = 0; p < ST_WGQ; ++p) {
            T a[TO], b[TK];
#pragma unroll
            for (int v = 0; v < TO; ++v) a[v] = gs[p][og * TO + v];   // a broadcast: a warp shares few og
#pragma unroll
            for (int u = 0; u < TK; ++u) b[u] = xs[p][kt + u * KT];
#pragma unroll
            for (int v = 0; v < TO; ++v)
#pragma unroll
                for (int u = 0; u < TK; ++u) acc[v][u] += a[v] * b[u];
        }
    }
    T* row_out = partial + static_cast<size_t>(split) * O * KB;
#pragma unroll
    for (int v = 0; v < TO; ++v) {
        const int o = o0 + og * TO + v;
        if (o >= O) break;
#pragma unroll
        for (int u = 0; u < TK; ++u) {
            const int k = k0 + kt + u * KT;
            if (k < KB) row_out[o * KB + k] = acc[v][u];
        }
    }
}

#define ST_IGEMM_WGRAD(T, S, BO, BK, TO, TK)                                                                      \
    extern "C" __global__ void __launch_bounds__((BO / TO) * (BK / TK))                                           \
    igemm_wgrad_##BO##x##BK##_##S(const T* x, const T* g, T* partial, int N, int C, int H, int W, int O, int KH,   \
                                  int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, int S,  \
                                  int with_bias) {                                                                 \
        ST_GRID_WAIT();                                                                                            \
        igemm_wgrad<T, BO, BK, TO, TK>(x, g, partial, N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, S,    \
                                       with_bias);                                                                 \
    }

#define ST_IGEMM(T, S, BO)                                                                                         \
    extern "C" __global__ void __launch_bounds__(ST_IGTHREADS)                                                     \
    igemm_fwd_bo##BO##_##S(const T* x, const T* w, const T* b, T* out, T* y, int N, int C, int H, int W, int O,    \
                           int KH, int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw,         \
                           int act) {                                                                              \
        ST_GRID_WAIT();                                                                                            \
        igemm_fwd<T, BO>(x, w, b, out, y, N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, act);             \
    }


#define ST_IGEMM_ALL(T, S)                                                                                         \
    ST_IGEMM(T, S, 16) ST_IGEMM(T, S, 32)                                                                          \
    ST_IGEMM_WGRAD(T, S, 32, 64, 4, 4) ST_IGEMM_WGRAD(T, S, 16, 128, 4, 4) ST_IGEMM_WGRAD(T, S, 8, 32, 2, 2)
ST_INSTANTIATE(ST_IGEMM_ALL)
#undef ST_IGEMM_ALL
#undef ST_IGEMM
#undef ST_IGEMM_WGRAD
