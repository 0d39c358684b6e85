// conv/tile_wgrad.cu: the weight and bias gradients of tile_conv's convolutions (stride 1, undilated, groups == 1,
// square KS x KS kernels, KS in {3, 5}), float32 (_f32) and float64 (_f64), into wgrad_reduce's partial rows
// [blocks, O*(C*KS*KS + 1)] (epilogue.cu sums them in a fixed order).
//   tile_wgrad: persistent blocks walking row tiles of g [O, N*Ho*Wo] and x [N, C, H, W] staged into two buffers
//            (the next tile's copies in flight during this one's products).
//   pooled_wgrad: of a convolution whose output a 2x2 max pooling read, from its g at the windows' maxima only (the
//            rest of its g is 0): a quarter of tile_wgrad's products (tile_conv_unpool's compact g for a first layer,
//            whose full-resolution g is then never written).
#include "tile_common.cuh"


// pooled_wgrad: dw [O, C, KS, KS] and db [O] partial rows (wpart [blocks, O*(C*KS*KS + 1)], wgrad_reduce's) of a
// stride-1 convolution from gw [O, N, P], its g at the P windows of a 2x2 max pooling of its output
// (full-resolution width FW) where pidx [N, O, P] puts their maxima, and x [N, C, H, W] (padding pt, pl):
//     dw[o, c, i, j] = sum over (n, q) of gw[o, n, q] * x[n, c, h + i - pt, w + j - pl], (h, w) = pidx's position,
//     db[o] = sum of gw[o]
// the g's other positions being 0. Their products are 0 too, but where x is not finite (0 * inf, 0 * NaN: NaN in
// the dense sum over every position, as torch's): those taps are flagged while x is staged and come out NaN. (Where
// a maximum's z was not finite, its gw is NaN for GELU, so dw[o] and db[o] are NaN either way; ReLU's 0 * act'(z)
// is 0.) A block takes IPB images, staged in shared memory; blockDim is a multiple of O, thread t sums channel
// t % O over the block's windows q = t / O, t / O + blockDim / O, ..., one input channel after another (KS*KS + 1
// sums in registers); then the block's sums per channel in thread order (deterministic, no atomics).
#define ST_PWG_U 4   // pooled_wgrad's windows per step of a thread (their loads issued together)
template <typename T, int KS>
__device__ void pooled_wgrad(const T* __restrict__ gw, const i64* __restrict__ pidx, const T* __restrict__ x,
                             T* __restrict__ wpart, int N, int C, int O, int H, int W, int FW, int P, int pt, int pl,
                             int IPB) {
    constexpr int KK = KS * KS, KB = KK + 1;
    extern __shared__ unsigned char st_smem[];
    const int n0 = blockIdx.x * IPB, images = min(IPB, N - n0), HW = H * W, CK = C * KK + 1;
    T* xs = reinterpret_cast<T*>(st_smem);   // [IPB][C][H*W]
    T* red = xs + IPB * C * HW;              // [blockDim][KB]: the sums of one input channel
    unsigned char* nan_tap = reinterpret_cast<unsigned char*>(red + blockDim.x * KB);   // [O][C][KK]
    for (int e = threadIdx.x; e < O * C * KK; e += blockDim.x) nan_tap[e] = 0;
    for (int e = threadIdx.x; e < images * C * HW; e += blockDim.x) xs[e] = x[(size_t)n0 * C * HW + e];
    __syncthreads();
    const int PW = FW / 2, FH = 2 * (P / PW);
    for (int e = threadIdx.x; e < images * C * HW; e += blockDim.x) {   // taps pairing x's inf or NaN with a 0
        if (isfinite(xs[e])) continue;
        const int plane = e / HW, img = plane / C, ch = plane - img * C, pr = (e - plane * HW) / W;
        const int pc = e - plane * HW - pr * W, n = n0 + img;
        for (int i = 0; i < KS; ++i)
            for (int j = 0; j < KS; ++j) {
                const int r = pr - i + pt, c = pc - j + pl;   // the output position whose tap (i, j) reads it
                if (r < 0 || r >= FH || c < 0 || c >= FW) continue;
                for (int oc = 0; oc < O; ++oc)
                    if (pidx[((size_t)n * O + oc) * P + (r / 2) * PW + c / 2] != r * FW + c)
                        nan_tap[(oc * C + ch) * KK + i * KS + j] = 1;   // (every writer writes 1)
            }
    }
    const int o = threadIdx.x % O, per = blockDim.x / O;
    for (int ch = 0; ch < C; ++ch) {
        T sum[KB];
#pragma unroll
        for (int k = 0; k < KB; ++k) sum[k] = T(0);
        // PWG_U windows at a time, their maxima's positions and g read first: one after another, each window's two
        // global loads came before its sums (~7 windows a thread at LeNet-5 b512: 12.1 us on the H100, for ~3 us of
        // issue)
        for (int e0 = threadIdx.x / O; e0 < images * P; e0 += ST_PWG_U * per) {
            int at[ST_PWG_U], img[ST_PWG_U];
            T g[ST_PWG_U];
#pragma unroll
            for (int u = 0; u < ST_PWG_U; ++u) {
                const int e = e0 + u * per;
                img[u] = e / P;
                const int q = e - img[u] * P, n = n0 + img[u];
                at[u] = e < images * P ? (int)pidx[((size_t)n * O + o) * P + q] : -1;
                g[u] = e < images * P ? gw[((size_t)o * N + n) * P + q] : T(0);
            }
#pragma unroll
            for (int u = 0; u < ST_PWG_U; ++u) {
                if (at[u] < 0) break;   // past the block's windows (those after it too)
                const int h = at[u] / FW, w = at[u] - h * FW;
                const T* xi = xs + (img[u] * C + ch) * HW;
#pragma unroll
                for (int i = 0; i < KS; ++i) {
                    const int r = h + i - pt;
#pragma unroll
                    for (int j = 0; j < KS; ++j) {
                        const int c = w + j - pl;
                        sum[i * KS + j] += g[u] * (r >= 0 && r < H && c >= 0 && c < W ? xi[r * W + c] : T(0));
                    }
                }
                sum[KK] += g[u];
            }
        }
        // (the first pass's barrier also orders the flags before they are read)
        if (ch > 0) __syncthreads();   // the previous channel's sums are read
#pragma unroll
        for (int k = 0; k < KB; ++k) red[threadIdx.x * KB + k] = sum[k];
        __syncthreads();
        // this channel's taps, and the bias with the first
        for (int m = threadIdx.x; m < O * KB; m += blockDim.x) {
            const int oc = m / KB, k = m - oc * KB;
            if (k == KK && ch > 0) continue;
            T s = T(0);
            for (int t = 0; t < per; ++t) s += red[(t * O + oc) * KB + k];
            if (k < KK && nan_tap[(oc * C + ch) * KK + k]) s += T(0) * st_neg_inf<T>();   // NaN
            wpart[((size_t)blockIdx.x * O + oc) * CK + (k < KK ? ch * KK + k : C * KK)] = s;
        }
    }
}


// tile_wgrad's bias sums without bias threads (WB == 0): this thread's slice s = t % S of channel t / S's staged g
// rows [slab] (S = blockDim / OP threads a channel; threads from OP*S on sum nothing): the 4-vectors s, s + S, ... of
// the slab (slab a multiple of 4: the rows are GW wide). Interleaved, so that a quarter warp's 16-byte loads mostly
// fall in different banks (the first version's contiguous slices put a warp's scalar loads in two banks, 16-way
// conflicts: slower than the bias threads)
template <typename T>
__device__ __forceinline__ T st_bias_slice(const T* gs, int OP, int slab) {
    const int S = blockDim.x / OP, bo = threadIdx.x / S, U = slab / 4;
    T sum = T(0);
    if (bo < OP) {
        const T* gc = gs + bo * slab;
        for (int u = threadIdx.x - bo * S; u < U; u += S) {
            T v[4];
            load4(gc + 4 * u, v);
            sum += ((v[0] + v[1]) + v[2]) + v[3];
        }
    }
    return sum;
}

// tile_wgrad: the weight and bias gradients of the convolutions tile_conv takes (stride 1, undilated, groups == 1,
// square KS x KS), as partial[s, o*(K+1) + k] (k == K: the bias) like igemm_wgrad's, for wgrad_reduce:
//     dw[o, c, i, j] = sum over (n, r, s) of g[o, n, r, s] * x[n, c, r + i - pt, s + j - pl],  db[o] = sum of g[o]
// A block walks the tiles (image n, TH output rows) blockIdx.x, + gridDim.x, ... (persistent: its partial sums stay in
// registers), staging each tile's g [OP][TH][GW] and x [C][RP][WP] (zero-padded: padded columns and rows of g are 0,
// so they add nothing) by cp.async into one of two buffers while the previous tile is computed. Thread (og, ci, rs):
// TO channels x the KS taps j of input channel c = ci / KS, kernel row i = ci % KS (ci == C*KS: the bias, the sums of
// g), over the rows rs, rs + RS, ... of each tile; per 4 columns it loads 8 x values and TO 4-vectors of g (shared by
// the warp: broadcasts) for TO*KS*4 FMAs. RS > 1 (few channels and taps: LeNet-5's first layer) splits the rows over
// RS threads, whose sums are added in rs order at the end (deterministic, like the fixed tile order).
// WB == 0 (conv/tile_wgrad.py, where it saves a warp: MnistCnn's second layer): no bias threads
// (ci < C*KS only); instead S = blockDim / OP threads per output channel each sum a fixed slice of the channel's
// staged g rows [TH][GW] per tile, and the S sums are added in slice order at the end: a few loads and adds a tile,
// where a bias thread per channel group adds a warp of few live lanes and its branch (MnistCnn's second layer:
// 4 x (48 + 1) = 196 threads, 7 warps, without them 192, 6; ncu's source page, H100: 4 of the 7 warps run the bias
// branch's 32 adds beside the products' 123 instructions each row and 4 columns, 8% of the kernel's instructions).
template <typename T, int KS, int TO>
__device__ void tile_wgrad(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ partial, int N, int C,
                           int H, int W, int O, int Ho, int Wo, int pt, int pl, int TH, int RS, int WB, int GB,
                           int XB) {
    static_assert(KS >= 1 && KS <= 5 && TO % 4 == 0, "tile_wgrad: 8 x values per 4 columns cover 4 + KS - 1");
    extern __shared__ unsigned char st_smem[];
    const int CG = (Wo + ST_TW - 1) / ST_TW, GW = CG * ST_TW, WP = GW + 4, RP = TH + KS - 1, P = Ho * Wo;
    const int OG = (O + TO - 1) / TO, OP = OG * TO, CI = C * KS + WB, K = C * KS * KS;
    const int tiles = (Ho + TH - 1) / TH, total = N * tiles;
    const int GS = OP * TH * GW, XS = C * RP * WP;   // one buffer: g's tile, then x's
    T* buf = reinterpret_cast<T*>(st_smem);
    const int ci = threadIdx.x % CI, rest = threadIdx.x / CI, rs = rest % RS, og = rest / RS;
    const bool bias = ci == C * KS;   // (never where WB == 0)
    const int c = bias ? 0 : ci / KS, i = bias ? 0 : ci - (ci / KS) * KS;
    // WB == 0: thread t < OP*S sums slice t % S (of S) of channel t / S's staged g rows into bsum (st_bias_slice)
    T bsum = T(0);
    T* row_out = partial + blockIdx.x * (O * (K + 1));   // this block's partial row
    // the copies: GB and XB bytes each (conv/tile.py _copy_bytes: 16 or 8 where the rows allow, else one element)
    auto stage = [&](int t, T* gs) {   // by cp.async: g [OP][TH][GW] (channels from O on zeros), then x [C][RP][WP]
        const int n = t / tiles, r0 = (t - n * tiles) * TH;
        st_stage_window_bytes(GB, gs, g + n * P, OP, TH, GW, O, N * P, Ho, Wo, r0, 0);
        st_stage_window_bytes(XB, gs + GS, x + n * C * H * W, C, RP, WP, C, H * W, H, W, r0 - pt, -pl);
        st_async_commit();
    };
    T acc[TO][KS];
#pragma unroll
    for (int u = 0; u < TO; ++u)
#pragma unroll
        for (int j = 0; j < KS; ++j) acc[u][j] = T(0);
    if (blockIdx.x < total) stage(blockIdx.x, buf);
    int cur = 0;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        if (t + gridDim.x < total) stage(t + gridDim.x, buf + (cur ^ 1) * (GS + XS));
        else st_async_commit();   // an empty group: the wait below still leaves exactly one in flight
        st_async_wait_but_last();
        __syncthreads();
        const T* gs = buf + cur * (GS + XS);
        const T* xs = gs + GS;
        if (!WB) bsum += st_bias_slice(gs, OP, TH * GW);
        if (og < OG) {
            for (int row = rs; row < TH; row += RS) {
                const T* grow = gs + (og * TO * TH + row) * GW;
                const T* xrow = xs + (c * RP + row + i) * WP;
                for (int q = 0; q < GW; q += ST_TW) {
                    T gv[TO][ST_TW];
#pragma unroll
                    for (int u = 0; u < TO; ++u) load4(grow + u * TH * GW + q, gv[u]);
                    if (bias) {
#pragma unroll
                        for (int u = 0; u < TO; ++u) acc[u][0] += ((gv[u][0] + gv[u][1]) + gv[u][2]) + gv[u][3];
                    } else {
                        T xv[8];
                        load4(xrow + q, xv);
                        if (KS > 1) load4(xrow + q + 4, xv + 4);
#pragma unroll
                        for (int u = 0; u < TO; ++u)
#pragma unroll
                            for (int j = 0; j < KS; ++j)
#pragma unroll
                                for (int v = 0; v < ST_TW; ++v) acc[u][j] += gv[u][v] * xv[v + j];
                    }
                }
            }
        }
        __syncthreads();   // this buffer is restaged by the next iteration's prefetch
        cur ^= 1;
    }
    if (!WB) {   // channel t / S's S slice sums, added in slice order by its first thread (every copy has landed)
        const int S = blockDim.x / OP, bo = threadIdx.x / S;
        buf[threadIdx.x] = bsum;
        __syncthreads();
        if (threadIdx.x == bo * S && bo < O) {
            T v = buf[threadIdx.x];
            for (int r = 1; r < S; ++r) v += buf[threadIdx.x + r];
            row_out[bo * (K + 1) + K] = v;
        }
        __syncthreads();   // buf is the row groups' reduction below
    }
    if (RS > 1) {   // the RS row groups' sums, added in rs order by the rs == 0 thread
        T* red = buf;   // [threads][TO*KS], the staging buffers' memory (every copy has landed: the last wait)
#pragma unroll
        for (int u = 0; u < TO; ++u)
#pragma unroll
            for (int j = 0; j < KS; ++j) red[threadIdx.x * TO * KS + u * KS + j] = acc[u][j];
        __syncthreads();
        if (rs != 0) return;
        for (int r = 1; r < RS; ++r) {
            const T* other = red + (threadIdx.x + r * CI) * TO * KS;
#pragma unroll
            for (int u = 0; u < TO; ++u)
#pragma unroll
                for (int j = 0; j < KS; ++j) acc[u][j] += other[u * KS + j];
        }
    }
    if (og >= OG) return;
#pragma unroll
    for (int u = 0; u < TO; ++u) {
        const int o = og * TO + u;
        if (o >= O) break;
        if (bias) {
            row_out[o * (K + 1) + K] = acc[u][0];
            continue;
        }
#pragma unroll
        for (int j = 0; j < KS; ++j) row_out[o * (K + 1) + (c * KS + i) * KS + j] = acc[u][j];
    }
}

// tile_wgrad's blocks have at most ST_TILE_WG_THREADS threads (conv/tile_wgrad.py's limit); in float32 the compiler
// keeps three such blocks' registers on an SM (MnistCnn's second layer at batch 64: 384 blocks in one wave on 132
// SMs, not 2 per SM at 96 registers a thread) where that spills nothing (5x5 taps of 8 channels would)
#define ST_TILE_WG_THREADS 256
#define ST_TILE_WGRAD(T, S, KS, TO)                                                                                \
    extern "C" __global__ void __launch_bounds__(ST_TILE_WG_THREADS, sizeof(T) == 4 && KS * TO <= 24 ? 3 : 1)    \
    tile_wgrad_k##KS##_to##TO##_##S(const T* x, const T* g, T* partial, int N, int C,                              \
                                                             int H, int W, int O, int Ho, int Wo, int pt, int pl,  \
                                                             int TH, int RS, int WB, int GB, int XB) {             \
        ST_GRID_WAIT();                                                                                            \
        tile_wgrad<T, KS, TO>(x, g, partial, N, C, H, W, O, Ho, Wo, pt, pl, TH, RS, WB, GB, XB);                   \
    }

#define ST_POOLED_WGRAD(T, S, KS)                                                                                  \
    extern "C" __global__ void pooled_wgrad_k##KS##_##S(const T* gw, const i64* pidx, const T* x, T* wpart, int N,  \
                                                       int C, int O, int H, int W, int FW, int P, int pt, int pl,  \
                                                       int IPB) {                                                  \
        ST_GRID_WAIT();                                                                                            \
        pooled_wgrad<T, KS>(gw, pidx, x, wpart, N, C, O, H, W, FW, P, pt, pl, IPB);                                \
    }

#define ST_TILE_WGRAD_ALL(T, S)                                                                                    \
    ST_TILE_WGRAD(T, S, 3, 4) ST_TILE_WGRAD(T, S, 3, 8) ST_TILE_WGRAD(T, S, 5, 4) ST_TILE_WGRAD(T, S, 5, 8)      \
    ST_POOLED_WGRAD(T, S, 3) ST_POOLED_WGRAD(T, S, 5)
ST_INSTANTIATE(ST_TILE_WGRAD_ALL)
#undef ST_TILE_WGRAD_ALL
#undef ST_TILE_WGRAD
#undef ST_POOLED_WGRAD
