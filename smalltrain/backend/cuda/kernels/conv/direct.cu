// conv/direct.cu: the small groups == 1 convolutions (C*KH*KW up to conv CONV.direct_max_k) without a cols matrix,
// float32 (_f32) and float64 (_f64); x [N, C, H, W], w [O, C, KH, KW], g [O, N*OH*OW], all contiguous.
//   direct_fwd: the whole forward: one thread per position and block of OB (8, or 2 for small batches) output
//            channels of out [N, O, OH, OW] = act(sum_k w[o, k] x(...) + b[o]), the weights (and for small batches
//            the image, see "two layouts" below) in shared memory; with an activation it also writes the sum before
//            bias, y [O, N, P], which bias_act_bwd reads.
//   direct_dx: the input gradient without a dcols matrix: one thread per input position and block of CB (8, or 2
//            for small batches) input channels, dx[n, c, h, w] = sum over (o, i, j) of g[o, n, oh, ow] * w[o, c, i, j]
//            where oh*sh = h + ph - i*dh and ow*sw = w + pw - j*dw land on an output; the weights in shared memory
//            as [O*KH*KW][C rounded up to CB]. A gather: no atomics, deterministic.
//   wgrad_partial: dw [O, C*KH*KW] = g @ cols^T and db [O] = g @ 1 without a cols matrix, g the output gradient
//            after the activation's derivative. Each block walks tiles of TQ positions (n, oh, ow): it builds the
//            tile's cols columns and g columns in shared memory from x and g, and each thread accumulates R of the
//            O*(K+1) outputs (k == K is the bias) over its block's tiles; partial [S, M] holds one row per block and
//            wgrad_reduce (epilogue.cu) sums the S rows in a fixed order (deterministic, no atomics).
//   32-bit indices: the launcher takes this path only when every index fits. ph, pw are the top and left padding.
#include "../common.cuh"


// The direct kernels run in one of two layouts. S == 0: a grid-stride loop over every item of the batch, reading
// the input (x, or g for dx) from global memory. S >= 1: S blocks per image, each first staging that image's input
// in shared memory after the weights, then taking every S-th block of the image's items. Staged, the inner loop's
// loads are shared-memory loads instead of a chain of L1/L2 round trips per tap, which is what a small batch's
// few threads wait on; the launcher stages whenever the image fits beside the weights. Staged with CS > 1, each
// item's channel sum is split over CS threads (see the split branches) to shorten each thread's serial chain.

// The OB channel sums of output position (h0, w0) = (oh*sh - ph, ow*sw - pw) from the image xn [C, H, W] and the
// weights ws [K][OP] (taps in padding skipped), over the input channels c0, c0 + cstep, ... (all: 0, 1).
template <typename T, int OB>
__device__ __forceinline__ void direct_point(const T* xn, const T* ws, int C, int H, int W, int KH, int KW, int OP,
                                             int h0, int w0, int dh, int dw, int o0, int c0, int cstep,
                                             T (&acc)[OB]) {
#pragma unroll
    for (int u = 0; u < OB; ++u) acc[u] = T(0);
    for (int c = c0; c < C; c += cstep) {
        int k = c * KH * KW;
        const T* plane = xn + c * H * W;
        for (int i = 0; i < KH; ++i) {
            const int ih = h0 + i * dh;
            if (ih < 0 || ih >= H) { k += KW; continue; }
            const T* row = plane + ih * W;
            for (int j = 0; j < KW; ++j, ++k) {
                const int iw = w0 + j * dw;
                if (iw < 0 || iw >= W) continue;
                const T xv = row[iw];
                const T* wk = ws + k * OP + o0;
#pragma unroll
                for (int u = 0; u < OB; ++u) acc[u] += wk[u] * xv;
            }
        }
    }
}

// OB output channels per thread in direct_fwd: each x value loaded serves OB of them (8; 2 when a batch is small
// and 8 would leave too few threads to hide the loads' latency)
template <typename T, int OB>
__device__ void direct_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                           T* __restrict__ out, T* __restrict__ y, int N, int C, int H, int W, int O, int KH, int KW,
                           int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, int act, int S,
                           int CS) {
    // the weights in shared memory as [K][OP] (OP = O rounded up to OB, zero-padded), so that a thread's OB
    // channels of one tap are adjacent and every lane of a warp reads the same ones (a broadcast)
    extern __shared__ unsigned char st_smem[];
    T* ws = reinterpret_cast<T*>(st_smem);
    const int P = OH * OW, K = C * KH * KW, NB = (O + OB - 1) / OB, OP = NB * OB, CHW = C * H * W;
    for (int e = threadIdx.x; e < K * OP; e += blockDim.x) {
        const int k = e / OP, o = e - k * OP;
        ws[e] = o < O ? w[o * K + k] : T(0);
    }
    T* xs = ws + K * OP;
    const int n_staged = S > 0 ? blockIdx.x / S : 0;
    if (S > 0)
        for (int e = threadIdx.x; e < CHW; e += blockDim.x) xs[e] = x[n_staged * CHW + e];
    __syncthreads();
    if (S > 0 && CS > 1) {
        // CS threads per item, each summing every CS-th input channel; the CS partial sums meet in shared memory
        // (red [CS][IPR][OB] after the image) and the first thread adds them in order: a third to a quarter of
        // the serial taps per thread and CS times the threads, for the few items of a small batch
        T* red = xs + CHW;
        const int ipr = blockDim.x / CS, cs = threadIdx.x / ipr, it = threadIdx.x - cs * ipr;
        for (int base = (blockIdx.x % S) * ipr; base < NB * P; base += S * ipr) {   // the same trips in every thread
            const int t = base + it, p = t % P, ob = t / P, oh = p / OW, ow = p - oh * OW, o0 = ob * OB;
            T acc[OB] = {};
            if (cs < CS && t < NB * P)
                direct_point<T, OB>(xs, ws, C, H, W, KH, KW, OP, oh * sh - ph, ow * sw - pw, dh, dw, o0, cs, CS,
                                    acc);
            if (cs < CS)
#pragma unroll
                for (int u = 0; u < OB; ++u) red[(cs * ipr + it) * OB + u] = acc[u];
            __syncthreads();
            if (cs == 0 && t < NB * P) {
#pragma unroll
                for (int u = 0; u < OB; ++u) {
                    const int o = o0 + u;
                    if (o >= O) break;
                    T v = red[it * OB + u];
                    for (int r = 1; r < CS; ++r) v += red[(r * ipr + it) * OB + u];
                    if (y != nullptr) y[(o * N + n_staged) * P + p] = v;
                    if (b != nullptr) v += b[o];
                    out[(n_staged * O + o) * P + p] = act_fwd(v, act);
                }
            }
            __syncthreads();
        }
        return;
    }
    // one thread per (n, channel block, position), positions fastest: loads of x and stores stay coalesced
    const int items = S > 0 ? NB * P : N * NB * P;
    const int first = S > 0 ? (blockIdx.x % S) * blockDim.x + threadIdx.x : blockIdx.x * blockDim.x + threadIdx.x;
    const int step = S > 0 ? S * blockDim.x : gridDim.x * blockDim.x;
    for (int t = first; t < items; t += step) {
        const int p = t % P, nb = t / P, ob = nb % NB, n = S > 0 ? n_staged : nb / NB, oh = p / OW, ow = p - oh * OW;
        const int h0 = oh * sh - ph, w0 = ow * sw - pw, o0 = ob * OB;
        T acc[OB];
        if (S > 0) direct_point<T, OB>(xs, ws, C, H, W, KH, KW, OP, h0, w0, dh, dw, o0, 0, 1, acc);
        else direct_point<T, OB>(x + n * CHW, ws, C, H, W, KH, KW, OP, h0, w0, dh, dw, o0, 0, 1, acc);
#pragma unroll
        for (int u = 0; u < OB; ++u) {
            const int o = o0 + u;
            if (o >= O) break;
            T v = acc[u];
            if (y != nullptr) y[(o * N + n) * P + p] = v;
            if (b != nullptr) v += b[o];
            out[(n * O + o) * P + p] = act_fwd(v, act);
        }
    }
}

// The CB channel sums of dx at input position (ih, iw) from gn (g of one image: element (o, oh, ow) at
// gn[o*gstride + oh*OW + ow]) and the weights ws [O*KH*KW][CP].
template <typename T, int CB>
__device__ __forceinline__ void direct_dx_point(const T* gn, int gstride, const T* ws, int O, int KH, int KW,
                                                int OH, int OW, int CP, int ih, int iw, int sh, int sw, int ph,
                                                int pw, int dh, int dw, int c0, T (&acc)[CB]) {
    const int KK = KH * KW;
#pragma unroll
    for (int u = 0; u < CB; ++u) acc[u] = T(0);
    for (int i = 0; i < KH; ++i) {
        const int hp = ih + ph - i * dh;
        if (hp < 0 || hp % sh != 0) continue;
        const int oh = hp / sh;
        if (oh >= OH) continue;
        for (int j = 0; j < KW; ++j) {
            const int wp = iw + pw - j * dw;
            if (wp < 0 || wp % sw != 0) continue;
            const int ow = wp / sw;
            if (ow >= OW) continue;
            const T* gq = gn + oh * OW + ow;
            const T* wk = ws + (i * KW + j) * CP + c0;
#pragma unroll 4
            for (int o = 0; o < O; ++o, gq += gstride, wk += KK * CP) {   // unrolled: 4 loads of g in flight
                const T gv = *gq;
#pragma unroll
                for (int u = 0; u < CB; ++u) acc[u] += wk[u] * gv;
            }
        }
    }
}

template <typename T, int CB>
__device__ void direct_dx(const T* __restrict__ g, const T* __restrict__ w, T* __restrict__ dx, int N, int C, int H,
                          int W, int O, int KH, int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh,
                          int dw, int S) {
    extern __shared__ unsigned char st_smem[];
    T* ws = reinterpret_cast<T*>(st_smem);
    const int KK = KH * KW, NB = (C + CB - 1) / CB, CP = NB * CB, HW = H * W, P = OH * OW, NP = N * P;
    for (int e = threadIdx.x; e < O * KK * CP; e += blockDim.x) {
        const int ok = e / CP, c = e - ok * CP, o = ok / KK, r = ok - o * KK;
        ws[e] = c < C ? w[(o * C + c) * KK + r] : T(0);
    }
    T* gs = ws + O * KK * CP;   // staged: the image's g as [O][P]
    const int n_staged = S > 0 ? blockIdx.x / S : 0;
    if (S > 0)
        for (int e = threadIdx.x; e < O * P; e += blockDim.x) {
            const int o = e / P;
            gs[e] = g[o * NP + n_staged * P + (e - o * P)];
        }
    __syncthreads();
    // one thread per (n, channel block, h, w), positions fastest: the g loads of a warp are mostly adjacent
    const int items = S > 0 ? NB * HW : N * NB * HW;
    const int first = S > 0 ? (blockIdx.x % S) * blockDim.x + threadIdx.x : blockIdx.x * blockDim.x + threadIdx.x;
    const int step = S > 0 ? S * blockDim.x : gridDim.x * blockDim.x;
    for (int t = first; t < items; t += step) {
        const int hw = t % HW, nb = t / HW, cb = nb % NB, n = S > 0 ? n_staged : nb / NB, ih = hw / W;
        const int iw = hw - ih * W;
        T acc[CB];
        if (S > 0)
            direct_dx_point<T, CB>(gs, P, ws, O, KH, KW, OH, OW, CP, ih, iw, sh, sw, ph, pw, dh, dw, cb * CB, acc);
        else
            direct_dx_point<T, CB>(g + n * P, NP, ws, O, KH, KW, OH, OW, CP, ih, iw, sh, sw, ph, pw, dh, dw, cb * CB,
                                   acc);
        T* out = dx + (n * C + cb * CB) * HW + hw;
#pragma unroll
        for (int u = 0; u < CB; ++u) {
            if (cb * CB + u >= C) break;
            out[u * HW] = acc[u];
        }
    }
}

template <typename T, int R>
__device__ void wgrad_partial(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ partial, int N,
                              int C, int H, int W, int O, int KH, int KW, int OH, int OW, int sh, int sw, int ph,
                              int pw, int dh, int dw, int TQ, int with_bias) {
    extern __shared__ unsigned char st_smem[];
    const int P = OH * OW, NP = N * P, KK = KH * KW, K = C * KK, KB = K + 1, M = O * KB, TS = TQ + 1;
    T* gs = reinterpret_cast<T*>(st_smem);             // [O][TS]: the tile's g columns (row stride TQ + 1: no
    T* cs = gs + O * TS;                                // [K][TS]: its cols columns      bank conflicts across k)
    int* koff = reinterpret_cast<int*>(cs + K * TS);    // [K]: c*H*W + i*dh*W + j*dw, the offset of row k in x
    int* kih = koff + K;                                // [K]: i*dh
    int* kiw = kih + K;                                 // [K]: j*dw
    int* qbase = kiw + K;                               // [TQ]: n*C*H*W + h0*W + w0 of each position
    int* qh = qbase + TQ;                               // [TQ]: h0
    int* qw = qh + TQ;                                  // [TQ]: w0
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        const int c = k / KK, r = k - c * KK, i = r / KW, j = r - i * KW;
        kih[k] = i * dh;
        kiw[k] = j * dw;
        koff[k] = c * H * W + i * dh * W + j * dw;
    }
    T acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = T(0);
    for (int q0 = blockIdx.x * TQ; q0 < NP; q0 += gridDim.x * TQ) {
        __syncthreads();   // the previous tile is consumed (and koff is written, the first time)
        for (int qq = threadIdx.x; qq < TQ; qq += blockDim.x) {
            const int q = q0 + qq;
            if (q < NP) {
                const int n = q / P, p = q - n * P, oh = p / OW, ow = p - oh * OW;
                qh[qq] = oh * sh - ph;
                qw[qq] = ow * sw - pw;
                qbase[qq] = n * C * H * W + qh[qq] * W + qw[qq];
            } else {   // past the end: a row far above the input, so every tap reads as padding (0)
                qh[qq] = -(1 << 29);
                qw[qq] = 0;
                qbase[qq] = 0;
            }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < O * TQ; e += blockDim.x) {
            const int o = e / TQ, qq = e - o * TQ, q = q0 + qq;
            gs[o * TS + qq] = q < NP ? g[o * NP + q] : T(0);
        }
        for (int e = threadIdx.x; e < K * TQ; e += blockDim.x) {
            const int k = e / TQ, qq = e - k * TQ;
            const int ih = qh[qq] + kih[k], iw = qw[qq] + kiw[k];
            cs[k * TS + qq] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[qbase[qq] + koff[k]] : T(0);
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int m = threadIdx.x + r * blockDim.x;
            if (m < M) {
                const int o = m / KB, k = m - o * KB;
                const T* gr = gs + o * TS;
                T a = acc[r];
                if (k < K) {
                    const T* cr = cs + k * TS;
                    for (int qq = 0; qq < TQ; ++qq) a += gr[qq] * cr[qq];
                } else if (with_bias) {
                    for (int qq = 0; qq < TQ; ++qq) a += gr[qq];
                }
                acc[r] = a;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int m = threadIdx.x + r * blockDim.x;
        if (m < M) partial[blockIdx.x * M + m] = acc[r];
    }
}

#define ST_DIRECT(T, S, OB)                                                                                        \
    extern "C" __global__ void direct_fwd_ob##OB##_##S(const T* x, const T* w, const T* b, T* out, T* y, int N,    \
                                                       int C, int H, int W, int O, int KH, int KW, int OH, int OW, \
                                                       int sh, int sw, int ph, int pw, int dh, int dw, int act,    \
                                                       int S, int CS) {                                            \
        ST_GRID_WAIT();                                                                                            \
        direct_fwd<T, OB>(x, w, b, out, y, N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, act, S, CS);     \
    }

#define ST_DIRECT_DX(T, S, CB)                                                                                     \
    extern "C" __global__ void direct_dx_cb##CB##_##S(const T* g, const T* w, T* dx, int N, int C, int H, int W,    \
                                                      int O, int KH, int KW, int OH, int OW, int sh, int sw,       \
                                                      int ph, int pw, int dh, int dw, int S) {                     \
        ST_GRID_WAIT();                                                                                            \
        direct_dx<T, CB>(g, w, dx, N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, S);                      \
    }

#define ST_WGRAD(T, S, R)                                                                                          \
    extern "C" __global__ void __launch_bounds__(1024)                                                             \
    wgrad_partial_r##R##_##S(const T* x, const T* g, T* partial, int N, int C, int H, int W, int O, int KH,        \
                             int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, int TQ,       \
                             int with_bias) {                                                                      \
        ST_GRID_WAIT();                                                                                            \
        wgrad_partial<T, R>(x, g, partial, N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, TQ, with_bias);  \
    }


#define ST_DIRECT_ALL(T, S)                                                                                        \
    ST_DIRECT(T, S, 2) ST_DIRECT(T, S, 8) ST_DIRECT_DX(T, S, 2) ST_DIRECT_DX(T, S, 8)                              \
    ST_WGRAD(T, S, 1) ST_WGRAD(T, S, 2) ST_WGRAD(T, S, 4) ST_WGRAD(T, S, 8)
ST_INSTANTIATE(ST_DIRECT_ALL)
#undef ST_DIRECT_ALL
#undef ST_DIRECT
#undef ST_DIRECT_DX
#undef ST_WGRAD
