// conv.cu: the pieces of a 2-D convolution around cuBLAS GEMMs (cupy.matmul), for float32 (_f32) and float64 (_f64).
//   im2col:  x [N, C, H, W] (contiguous) -> cols [C*KH*KW, N*OH*OW]; row (c*KH + i)*KW + j, column (n*OH + oh)*OW + ow,
//            value x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] or 0 in the padding. With groups, rows of group g
//            are the contiguous block [g*Cg*KH*KW, (g+1)*Cg*KH*KW), so cols reshapes to [G, Cg*KH*KW, N*OH*OW].
//   col2im:  the adjoint: dx[n, c, h, w] = sum of the dcols entries im2col copied x[n, c, h, w] into (a gather over the
//            kernel offsets, one thread per input element: no atomics, deterministic).
//   bias_act_fwd: the GEMM result y [O, N, P] (P = OH*OW) -> out [N, O, P] = act(y + b[o]) (transpose, bias and
//            activation fused in one pass). bias_act_bwd: dout [N, O, P] -> g [O, N, P] = dout * act'(y + b[o]);
//            bias_act_bwd_rows the same with a block per row (o, n) of g and threads along p, for the convolutions'
//            long rows (P >= 64): one division per row instead of three per element.
//   direct_fwd: the whole forward without a cols matrix, for groups == 1 and a small C*KH*KW: one thread per
//            position and block of OB (8, or 2 for small batches) output channels of
//            out [N, O, OH, OW] = act(sum_k w[o, k] x(...) + b[o]), the weights (and for small batches the image,
//            see "two layouts" below) in shared memory; with an activation it also writes the sum before bias,
//            y [O, N, P], which bias_act_bwd reads.
//   igemm_fwd: the forward as an implicit GEMM (register tiles, x gathered while staging, no cols matrix) for the
//            groups == 1 convolutions direct_fwd does not take; bias, activation and y as direct_fwd.
//   tile_conv: stride-1, undilated, square 3x3 / 5x5 convolutions: the forward (with direct_fwd's epilogue) and,
//            as the correlation of g with the flipped kernel, the input gradient, from an input tile and all the
//            weights staged in shared memory (cp.async), each thread a register tile of TO channels x 4 columns.
//            Epilogues: plain, a following small linear layer (tile_conv_lin) or a 2x2 max pooling (tile_conv_pool);
//            for an input gradient written as the producer's g, also the producer's weight gradient where it has
//            one input channel (tile_conv_wgrad), or through the producer's 2x2 max pooling where it pooled in its
//            epilogue (tile_conv_unpool: its full g, or only the windows' maxima for pooled_wgrad; for a producer
//            of one input channel that needs no input gradient, tile_conv_unpool_wgrad: its weight and bias
//            gradients' partial rows from those maxima, no g written, or with a counter the gradients themselves,
//            the rows added by the block that finishes last).
//   tile_arrange: a convolution's weights in tile_conv's shared-memory layouts (its forward's and its input
//            gradient's), so that tile_conv stages them by 16-byte copies.
//   tile_wgrad: dw and db of the same convolutions into wgrad_reduce's partial rows, persistent blocks walking row
//            tiles of g and x staged into two buffers (the next tile's copies in flight during this one's products).
//   pooled_wgrad: dw and db of a convolution whose output a 2x2 max pooling read, from its g at the windows'
//            maxima only (the rest of its g is 0): a quarter of tile_wgrad's products (tile_conv's compact "into"
//            for a first layer, whose full-resolution g is then never written).
//   direct_dx: the input gradient without a dcols matrix, for the same convolutions: one thread per input position
//            and block of CB (8, or 2 for small batches) input channels, dx[n, c, h, w] = sum over (o, i, j) of
//            g[o, n, oh, ow] * w[o, c, i, j] where oh*sh = h + ph - i*dh and ow*sw = w + pw - j*dw land on an output;
//            the weights in shared memory as [O*KH*KW][C rounded up to CB]. A gather: no atomics, deterministic.
//   wgrad_partial / wgrad_reduce: dw [O, C*KH*KW] = g @ cols^T and db [O] = g @ 1 without a cols matrix, g [O, N*P]
//            the output gradient after the activation's derivative. Each block walks tiles of TQ positions
//            (n, oh, ow): it builds the tile's cols columns and g columns in shared memory from x and g, and each
//            thread accumulates R of the O*(K+1) outputs (k == K is the bias) over its block's tiles; partial [S, M]
//            holds one row per block and wgrad_reduce sums the S rows in a fixed order (deterministic, no
//            atomics).
//            32-bit indices: the launcher takes this path only when every index fits.
//   ph, pw are the top and left padding; bottom/right padding only enters through OH, OW.
#include "common.cuh"
#include "cross_entropy.cuh"

template <typename T, typename I>
__device__ void im2col(const T* __restrict__ x, T* __restrict__ cols, I N, I C, I H, I W, I KH, I KW,
                       I OH, I OW, I sh, I sw, I ph, I pw, I dh, I dw) {
    // one thread per column (n, oh, ow): its position is decomposed once, then the C*KH*KW rows are walked with
    // additions only (divisions by runtime values cost tens of instructions each); writes stay coalesced
    const I P = OH * OW, NP = N * P;
    GRID_STRIDE_I(I, q, NP) {
        const I n = q / P, p = q - n * P, oh = p / OW, ow = p - oh * OW;
        const I h0 = oh * sh - ph, w0 = ow * sw - pw;
        const T* xn = x + n * C * H * W;
        T* out = cols + q;
        for (I c = 0; c < C; ++c) {
            const T* plane = xn + c * H * W;
            for (I i = 0; i < KH; ++i) {
                const I ih = h0 + i * dh;
                const bool row_in = ih >= 0 && ih < H;
                for (I j = 0; j < KW; ++j) {
                    const I iw = w0 + j * dw;
                    *out = (row_in && iw >= 0 && iw < W) ? plane[ih * W + iw] : T(0);
                    out += NP;
                }
            }
        }
    }
}

template <typename T, typename I>
__device__ void col2im(const T* __restrict__ cols, T* __restrict__ dx, I N, I C, I H, I W, I KH, I KW,
                       I OH, I OW, I sh, I sw, I ph, I pw, I dh, I dw) {
    const I P = OH * OW, NP = N * P, total = N * C * H * W;
    GRID_STRIDE_I(I, t, total) {
        const I hw = t / W, iw = t - hw * W, chw = hw / H, ih = hw - chw * H, n = chw / C, c = chw - n * C;
        T acc = T(0);
        for (I i = 0; i < KH; ++i) {
            const I hp = ih + ph - i * dh;
            if (hp < 0) continue;
            I oh = hp;   // stride 1 (the common case) needs no division
            if (sh != 1) {
                if (hp % sh != 0) continue;
                oh = hp / sh;
            }
            if (oh >= OH) continue;
            for (I j = 0; j < KW; ++j) {
                const I wp = iw + pw - j * dw;
                if (wp < 0) continue;
                I ow = wp;
                if (sw != 1) {
                    if (wp % sw != 0) continue;
                    ow = wp / sw;
                }
                if (ow >= OW) continue;
                acc += cols[((c * KH + i) * KW + j) * NP + (n * OH + oh) * OW + ow];
            }
        }
        dx[t] = acc;
    }
}

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

// wgrad_reduce: out[m] = sum over the S rows of partial[s, m], for m = o*(K+1) + k (k == K: db). Blocks of 32
// outputs x G row groups (G = blockDim.x / 32, up to 32; the launcher gives many rows more groups): thread (m, r)
// sums rows r, r + G, ... in order (a warp reads 32 consecutive outputs of a row: coalesced), then the G sums
// are added in group order (deterministic, no atomics). ST_WR_BATCH rows' loads are in flight at once, so that a
// thread's rows (conv.py _WR_ROWS, 16) cost one L2 round trip, not one per 4.
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

// tile_conv: a stride-1, undilated, groups == 1 correlation with a square KS x KS kernel from a tile of the input
// staged, zero-padded, in shared memory beside all the weights:
//     out[n, o, r, s] = sum over (c, i, j) of wt(o, c, i, j) * in[n, c, r + i - pt, s + j - pl]
// Forward (transposed == 0): in = x [N, C, H, W], wt = w, then igemm_fwd's epilogue (y before bias, bias,
// activation). Input gradient (transposed == 1): in = g [O, N, OH, OW] (in_sn = OH*OW, in_sc = N*OH*OW), wt(c, o, i,
// j) = w[o, c, KS-1-i, KS-1-j] and pt = KS-1-ph, pl = KS-1-pw: the full correlation of g with the flipped kernel,
// which is dx; no bias, activation or y, unless into: then dx is written as the g of the convolution that made
// the input ([C, N, H, W] in this kernel's O, N, Ho, Wo), times that convolution's act'(y + b[o]) with its y
// ([O, N, P], the output before the bias) and b read: its transpose-and-derivative kernel is not run. With into
// and pidx, the producer pooled its output in its own epilogue (POOL below; dx is the pooled output's gradient):
// dx goes through that pooling's backward too, to its maximum's position in each 2x2 window of the producer's g
// [O, N, 4P] (y [O, N, 4P] read there only: common.cuh pooled_act_grad, pidx [N, O, Ho, Wo] its indices) and 0
// elsewhere, so that neither the pooled gradient nor the pooling's backward kernel is needed. vstage (conv.py
// _tile_vec_stage): the input's rows are staged vstage bytes a copy, 16 or 8 where its strides, the left padding and
// the row width are multiples of that many bytes' elements, else sizeof(T) (an element a copy); wrun (conv.py
// _tile_weight_run): the consecutive taps of one weight slot a thread's neighbours stage (below); the ARR instances
// ignore it: their w is already in the shared layout (tile_arrange's copy, conv.py TILE_ARRANGE), staged 16 bytes a
// copy. A block
// takes one image and TH output rows; its threads (cs, og, row, cg), cg fastest, each compute TO channels x ST_TW
// consecutive columns of one row over the input channels of split cs (CS splits: more, shorter chains per output
// where the grid alone leaves the SMs few warps; their sums added in split order through shared memory at the
// end). Per input channel and kernel row a thread
// loads 8 x values (two 4-vectors: the padded row width WP is a multiple of 4) and KS x TO/4 weight vectors (a warp
// shares og: broadcasts) for KS*TO*ST_TW FMAs (igemm_fwd: 8 shared loads per 16), and no bounds are checked inside
// the loop: the padding is zeros in shared memory. The epilogue stores a thread's 4 columns as one vector (or two
// pairs) where the rows allow it. Measured on the H200 (ncu, MnistCnn's second layer at batch 64): ~50% of the issue
// slots busy, L1 64-76% busy; rows padded so that no two threads of a quarter warp share a bank removed 3/4 of the
// shared-load conflicts and changed nothing, the vector stores took the forward from 21.8 to 19.1 us.
#define ST_TW 4

// The epilogues: ST_EPI_PLAIN (tile_conv), ST_EPI_LINEAR (tile_conv_lin), ST_EPI_POOL (tile_conv_pool),
// ST_EPI_WGRAD (tile_conv_wgrad), ST_EPI_UNPOOL (tile_conv_unpool: "into" a producer that pooled, see tile_conv's
// comment; a kernel of its own so that the others' registers stay as they were), ST_EPI_UNPOOL_WGRAD
// (tile_conv_unpool_wgrad: into such a producer's weight gradient), each below.
#define ST_EPI_PLAIN 0
#define ST_EPI_LINEAR 1
#define ST_EPI_POOL 2
#define ST_EPI_WGRAD 3
#define ST_EPI_UNPOOL 4
#define ST_EPI_UNPOOL_WGRAD 5

// The forward's linear epilogue (LIN, the tile_conv_lin kernels; Conv2dActLinear: linear(flatten(act(conv(x))),
// lw, lb) with F <= ST_LF outputs): each thread adds its outputs times lw's matching columns (lw [F, O*Ho*Wo], read
// once per block, no reuse: L2), a warp sum and the block's warps in order give the tile's partial sums
// lpart[n, tile, f], and the block that finishes image n last (a ticket from lcount[n], reset to 0 after) adds the
// tiles' partials in order and the bias into lout[n, f]. A fixed order throughout: deterministic. Needs whole warps
// (blockDim.x a multiple of 32) and dynamic shared memory for [warps][ST_LF] values and the ticket (conv.py checks
// both).
#define ST_LF 16

// linear_sums: this thread's share of the F outputs, lsum[f] = sum over its channels u < nu and columns v < cols of
// val[u][v] * lw[f, (o0 + u)*P + r*Wo + s0 + v] (wp points at u = v = 0 of f = 0). The weights of FB outputs for all
// TO channels are loaded before any is used (predicated, not behind a branch), so that a thread waits on F / FB L2
// round trips rather than F * TO: the epilogue is latency-bound, each weight read once per block.
template <typename T, int TO>
__device__ __forceinline__ void linear_sums(const T (&val)[TO][ST_TW], const T* __restrict__ wp, int K, int P, int nu,
                                            int cols, int F, bool vec, T* lsum) {
    constexpr int FB = TO == 4 ? 2 : 1;   // 32 registers of weights in flight
#pragma unroll
    for (int f0 = 0; f0 < ST_LF; f0 += FB) {
        if (f0 >= F) break;
        T wv[FB][TO][ST_TW];
#pragma unroll
        for (int d = 0; d < FB; ++d)
#pragma unroll
            for (int u = 0; u < TO; ++u) {
                const T* q = wp + (f0 + d) * K + u * P;
                const bool ok = f0 + d < F && u < nu;
                if (vec) {
                    if (ok) load4(q, wv[d][u]);
                    else wv[d][u][0] = wv[d][u][1] = wv[d][u][2] = wv[d][u][3] = T(0);
                } else {
#pragma unroll
                    for (int v = 0; v < ST_TW; ++v) wv[d][u][v] = ok && v < cols ? q[v] : T(0);
                }
            }
#pragma unroll
        for (int d = 0; d < FB; ++d) {
            T s = T(0);
#pragma unroll
            for (int u = 0; u < TO; ++u)
#pragma unroll
                for (int v = 0; v < ST_TW; ++v) s += (u < nu && v < cols ? val[u][v] : T(0)) * wv[d][u][v];
            if (f0 + d < ST_LF) lsum[f0 + d] = s;
        }
    }
}

// The cross-entropy after the linear epilogue (the tile_conv_lin_ce kernels; backend/cuda/_common.py HeldHead):
// the block that adds image n's logits also computes that row's loss, gradient and unit gradient (cross_entropy.cuh
// ce_row, the logits from shared memory), and the last of the N such blocks (a second ticket, from *counter) adds the
// images' losses in image order, as cross_entropy_fwd_reduce does its blocks'. target null: no cross-entropy.
template <typename T>
struct CeArgs {
    const i64* target;
    const T* w;
    T* grad;
    i64 ignore_index;
    T ls;
    int* bad;
    T* partial;
    unsigned* counter;
    int mean;
    T* out;
    T* wsum;
    T* unit;
};

// logits: the row's F values in shared memory, followed by room for one value per warp and the ticket (block_sum,
// ce_reduce_blocks: no static shared memory, which would add to every block's and could cost one on each SM).
template <typename T>
__device__ void linear_cross_entropy(const T* logits, T* scratch, unsigned* ticket, const CeArgs<T>& ce, int F, int n,
                                     int N) {
    const bool unit_mean = ce.unit != nullptr && ce.mean;
    // (block_sum ends with a barrier; the other way, one puts the logits' writes before their reads)
    T all_w = T(0);
    if (unit_mean) all_w = block_sum(ce_weights_share<T>(ce.target, ce.w, N, F, ce.ignore_index), scratch);
    else __syncthreads();
    T val = T(0), w_t = T(0);
    if (threadIdx.x < 32)
        ce_row<T>(logits, 1, ce.target[n], ce.w, F, ce.ignore_index, ce.ls, ce.bad,
                  ce.grad != nullptr ? ce.grad + i64(n) * F : nullptr,
                  ce.unit != nullptr ? ce.unit + i64(n) * F : nullptr, T(1) / (ce.mean ? all_w : T(1)), val, w_t);
    if (threadIdx.x != 0) val = w_t = T(0);
    ce_reduce_blocks<T>(val, w_t, ce.unit != nullptr, all_w, ce.partial, ce.counter, ce.mean, ce.out, ce.wsum, n, N,
                        scratch, ticket);
}

template <typename T>
__device__ void linear_finish(T (&lsum)[ST_LF], const T* __restrict__ lb, T* __restrict__ lout, T* __restrict__ lpart,
                              unsigned* lcount, int F, int n, int tile, int tiles, const CeArgs<T>& ce, int N) {
    extern __shared__ unsigned char st_smem[];
    T* red = reinterpret_cast<T*>(st_smem);   // [warps][ST_LF], then the ticket
    unsigned* ticket = reinterpret_cast<unsigned*>(red + (blockDim.x / 32) * ST_LF);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    __syncthreads();   // every thread is done with the staged tiles (and the splits' sums)
    // the ST_LF sums over the warp at once (those past F are 0)
    const T v = warp_sum_spread(lsum);
    const int f = warp_spread_slot<ST_LF>(lane);
    if (f >= 0 && f < F) red[warp * ST_LF + f] = v;
    __syncthreads();
    if (threadIdx.x < F) {
        T s = T(0);
        for (int k = 0; k < warps; ++k) s += red[k * ST_LF + threadIdx.x];
        lpart[(n * tiles + tile) * F + threadIdx.x] = s;
    }
    // the partials are visible to the block that adds them: st_last_to_arrive fences (one thread, after a barrier)
    if (!st_last_to_arrive(&lcount[n], tiles, ticket)) return;
    if (threadIdx.x < F) {
        T s = T(0);
        for (int k = 0; k < tiles; ++k) s += __ldcg(lpart + (n * tiles + k) * F + threadIdx.x);
        if (lb != nullptr) s += lb[threadIdx.x];
        lout[n * F + threadIdx.x] = s;
        red[threadIdx.x] = s;   // (this thread alone read red's column threadIdx.x above)
    }
    if (threadIdx.x == 0) lcount[n] = 0u;
    // the row's logits in red[0, F), block_sum's one value per warp 16 bytes past red's end (after the ticket;
    // conv.py _tile_conv makes the room)
    if (ce.target != nullptr) linear_cross_entropy<T>(red, red + warps * ST_LF + 16 / sizeof(T), ticket, ce, F, n, N);
}

// The forward's pooling epilogue (POOL, the tile_conv_pool kernels; Conv2dActPool: max_pool2d(act(conv(x)), 2, 2)
// where the 2x2 windows tile the output and TH is even, conv.py _tile_pool_ok): the threads of odd rows pass their
// activated outputs to the row above through shared memory ([threads][TO][ST_TW]), and each thread of an even row
// takes the max of its two 2x2 windows per channel in torch's order (row-major, the first maximum, a NaN wins),
// writing the pooled value to out [N, O, Ho/2, Wo/2] and its flat index h*Wo + w to pidx (int64, as
// max_pool2d_forward's indices); the activated, unpooled output is not written (y, before the bias, still is).

// The input gradient's producer-weight-gradient epilogue (WGRAD, the tile_conv_wgrad kernels; transposed and into,
// conv.py _into_wgrad): where the convolution that made this one's input has one input channel, the same KS x KS
// kernel, stride 1 and groups == 1, the g values this kernel writes for it (its activation's derivative applied)
// also give its weight and bias gradients: dw[o, 0, i, j] = sum over (n, r, s) of g[o, n, r, s] * px[n, 0, r + i -
// ppt, s + j - ppl], db[o] = sum of g[o]. Each thread's sums over its 4 columns go to shared memory
// ([TO][KS*KS + 1][threads of split 0]), then one thread per (channel, tap) adds its channel group's threads in a
// fixed order into wpart [blocks, O*(KS*KS + 1)], wgrad_reduce's partial rows (deterministic, no atomics): the
// producer's tile_wgrad, which would read the g written here again, is not run.

// The pooled producer's weight-gradient epilogue (UNPOOL_WGRAD, the tile_conv_unpool_wgrad kernels; transposed, into
// == 2, conv.py _unpool_wgrad): where the producer pooled in its epilogue, has one input channel and the same KS x KS
// kernel and needs no input gradient (a first layer), its g at the windows' maxima (the compact form, the rest of its
// g being 0) gives its weight and bias gradients as pooled_wgrad computes them (see there, the NaN taps included),
// over this block's windows: the g values and their maxima's positions go to shared memory with the producer's x
// under the block's rows, each of S slices of a channel's windows sums its KS*KS taps and bias in registers, then
// thread m < O*(KS*KS + 1) adds output (channel, tap) m's slices in order into wpart [blocks, O*(KS*KS + 1)],
// wgrad_reduce's partial rows (deterministic, no atomics). Neither the compact g nor pooled_wgrad's pass over it is
// needed.
// UNPOOL_WGRAD's slices of a channel's windows: threads per channel, at most ST_UPW_SLICES (the sums' shared memory,
// conv.py _unpool_wgrad_smem) and at least 1
#define ST_UPW_SLICES 16
__device__ __forceinline__ int st_unpool_wgrad_slices(int threads, int O) {
    return max(1, min(threads / O, ST_UPW_SLICES));
}
// UNPOOL_WGRAD's prefetch, at the start of the shared memory (the tiles after it, 16-byte aligned): the producer's
// pooling indices of the block's rows [O][TH][Wo] (int64) and its x under them [2*TH + KS - 1][2*Wo + KS - 1]
// (conv.py _unpool_wgrad_smem)
template <typename T>
__device__ __forceinline__ int st_unpool_prefetch_bytes(int O, int TH, int Wo, int KS) {
    return (O * TH * Wo * (int)sizeof(i64) + (2 * TH + KS - 1) * (2 * Wo + KS - 1) * (int)sizeof(T) + 15) / 16 * 16;
}

// tile_conv's weights in shared memory, [K][OP]: tap k's channels in groups of TO, each group in TS = TO rounded up
// to 4 slots (aligned vector loads), OP = groups * TS (st_tile_slots). The channel slot `slot` holds, or -1 for a
// zero slot (past TO in its group, or past O); TO is a compile-time constant in tile_conv.
__device__ __forceinline__ int st_tile_slots(int O, int TO) { return (O + TO - 1) / TO * ((TO + 3) / 4 * 4); }
__device__ __forceinline__ int st_tile_slot_channel(int slot, int TO, int O) {
    const int TS = (TO + 3) / 4 * 4, o = TS == TO ? slot : slot / TS * TO + slot % TS;
    return (TS == TO || slot % TS < TO) && o < O ? o : -1;
}
// w's element of tap k (of K = C*KK), channel o, in tile_conv's names: w [O][C][KS][KS], or transposed (the input
// gradient) w [C][O][KS][KS] with the taps flipped
__device__ __forceinline__ int st_tile_weight_index(int k, int o, int O, int K, int KK, bool transposed) {
    if (transposed) {
        const int c = k / KK;   // KK: a compile-time constant in tile_conv
        return (c * O + o) * KK + (KK - 1 - (k - c * KK));
    }
    return o * K + k;
}

// tile_arrange: a convolution's w [O][C][KS][KS] (KK = KS*KS) in tile_conv's shared-memory layout, so that tile_conv
// stages it by 16-byte copies (its ARR instances) rather than an element a copy (a transpose of w's order):
// fwd [C*KK][OP] for its forward (TO = fto), dx [O*KK][OP] for its input gradient (TO = dto, the taps flipped).
// Either may be null.
template <typename T>
__device__ void tile_arrange(const T* __restrict__ w, T* __restrict__ fwd, int fto, T* __restrict__ dx, int dto,
                             int O, int C, int KK) {
    const int fop = st_tile_slots(O, fto), dop = st_tile_slots(C, dto);
    const int nf = fwd != nullptr ? C * KK * fop : 0, nd = dx != nullptr ? O * KK * dop : 0;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < max(nf, nd); e += gridDim.x * blockDim.x) {
        if (e < nf) {
            const int k = e / fop, o = st_tile_slot_channel(e - k * fop, fto, O);
            fwd[e] = o >= 0 ? w[st_tile_weight_index(k, o, O, C * KK, KK, false)] : T(0);
        }
        if (e < nd) {
            const int k = e / dop, c = st_tile_slot_channel(e - k * dop, dto, C);
            dx[e] = c >= 0 ? w[st_tile_weight_index(k, c, C, O * KK, KK, true)] : T(0);
        }
    }
}

template <typename T, int KS, int TO, int EPI, bool ARR>
__device__ void tile_conv(const T* __restrict__ in, const T* __restrict__ w, const T* __restrict__ b,
                          T* __restrict__ out, T* __restrict__ y, int N, int C, int Hi, int Wi, int in_sn, int in_sc,
                          int O, int Ho, int Wo, int pt, int pl, int TH, int CS, int transposed, int into,
                          int act, const T* __restrict__ lw, const T* __restrict__ lb, T* __restrict__ lout,
                          T* __restrict__ lpart, unsigned* lcount, int F, i64* __restrict__ pidx,
                          const T* __restrict__ px, int pH, int pW, int ppt, int ppl, T* __restrict__ wpart,
                          int vstage, int wrun, const CeArgs<T>& ce = CeArgs<T>{}) {
    static_assert(KS >= 1 && KS <= 5 && (TO % 4 == 0 || TO == 6),
                  "tile_conv: KS <= 5 (8 x values per row cover TW + KS - 1), TO a multiple of 4 or 6");
    // TS: the shared-memory slots a thread's TO weights of one tap take, a multiple of 4 for aligned vector loads.
    // TO = 6 (six channels, where 4 or 8 a thread would compute 2 dead ones) reads a 4-vector and a 2-vector of 8.
    constexpr int TS = (TO + 3) / 4 * 4;
    // KEEP: the activated outputs (WGRAD: the g values) stay in acc for the epilogue, and every thread reaches its
    // block-wide steps
    constexpr bool LIN = EPI == ST_EPI_LINEAR, POOL = EPI == ST_EPI_POOL, WGRAD = EPI == ST_EPI_WGRAD;
    constexpr bool UNPOOL_WG = EPI == ST_EPI_UNPOOL_WGRAD, UNPOOL = EPI == ST_EPI_UNPOOL || UNPOOL_WG;
    constexpr bool KEEP = LIN || POOL || WGRAD || UNPOOL_WG;
    extern __shared__ unsigned char st_smem[];
    const int CG = (Wo + ST_TW - 1) / ST_TW, OG = (O + TO - 1) / TO, OP = OG * TS, KK = KS * KS, K = C * KK;
    const int WP = CG * ST_TW + 4, RP = TH + KS - 1, tiles = (Ho + TH - 1) / TH;
    const int n = blockIdx.x / tiles, r0 = (blockIdx.x - n * tiles) * TH;
    // UNPOOL_WG: the producer's pooling indices and x that its epilogue reads (see there) are staged with the tiles
    // and land during the main loop, instead of two global round trips after it while the other splits wait at a
    // barrier (the ncu source page at b512: 14% of the kernel's warp samples there); at the start of the shared
    // memory, the rest after them
    const int XR = 2 * TH + KS - 1, XC = 2 * Wo + KS - 1;
    i64* ps = reinterpret_cast<i64*>(st_smem);             // [O][TH][Wo]: the maxima's flat indices
    T* xs2 = reinterpret_cast<T*>(ps + O * TH * Wo);        // [XR][XC]: x under the producer's rows 2*r0 ..
    unsigned char* smem = st_smem + (UNPOOL_WG ? st_unpool_prefetch_bytes<T>(O, TH, Wo, KS) : 0);
    T* ws = reinterpret_cast<T*>(smem);      // [K][OP]: tap k = (c*KS + i)*KS + j, group og's channels at og*TS..
    T* xs = ws + K * OP;                     // [C][RP][WP]: rows r0 - pt .. r0 - pt + RP - 1, columns -pl ..
    // staged by cp.async (common.cuh): the weights in shared memory's order (consecutive threads write consecutive
    // words; their strided reads of w hit L1 after the first), x by rows; coordinates by st_walk3
    auto slot_channel = [&](int slot) { return st_tile_slot_channel(slot, TO, O); };
    auto weight_index = [&](int k, int o) { return st_tile_weight_index(k, o, O, K, KK, transposed); };
    if constexpr (ARR) {   // w arranged in this layout already (tile_arrange; 16-byte aligned): 16-byte copies
        constexpr int V = 16 / sizeof(T);   // (K * OP is a multiple of 4)
        for (int e = threadIdx.x; e < K * OP / V; e += blockDim.x) st_async_copy_vec<16>(ws + e * V, w + e * V, true);
    } else if (blockDim.x % (OP * wrun) == 0) {
        // a thread's slot is the same in every copy, only the tap advances: no carries or slot arithmetic per copy
        // (the general walk's ~36 instructions a copy were 11% of LeNet-5 b512's input-gradient kernel; ncu, H100:
        // 36.7 -> 35.2 us, the second layer's forward 14.3 -> 13.0). Consecutive threads take runs of wrun
        // consecutive taps of one slot (conv.py _tile_weight_run): a tap's slots lie K elements apart in w (the
        // input gradient's: KS*KS), so a warp over 32 slots of one tap reads 32 sectors, one over 32 / wrun slots'
        // runs about that many; the runs' shared-memory words share banks wrun ways where OP is a multiple of 32.
        const int run = OP * wrun, q = threadIdx.x % run, slot = q / wrun, o = slot_channel(slot);
        const int kstep = blockDim.x / OP;
        for (int k = threadIdx.x / run * wrun + q - slot * wrun; k < K; k += kstep)
            st_async_copy(ws + k * OP + slot, w + (o >= 0 ? weight_index(k, o) : 0), o >= 0);
    } else {
        st_walk3 wk(1 << 30, OP);   // (0, k, slot)
        for (int e = threadIdx.x; e < K * OP; e += blockDim.x, wk.next()) {
            const int o = slot_channel(wk.c);
            st_async_copy(ws + e, w + (o >= 0 ? weight_index(wk.b, o) : 0), o >= 0);
        }
    }
    // the input's rows vstage bytes a copy (16, 8 or one element: conv.py _tile_vec_stage)
    st_stage_window_bytes(vstage, xs, in + n * in_sn, C, RP, WP, C, in_sc, Hi, Wi, r0 - pt, -pl);
    if (UNPOOL_WG) {   // the tiles' copies a group waited for now, the prefetch's another, waited for after the loop
        st_async_commit();
        const int rows = min(TH, Ho - r0);
        st_walk3 pw(1 << 30, rows * Wo);   // (0, channel, position in the block's rows)
        for (int e = threadIdx.x; e < O * rows * Wo; e += blockDim.x, pw.next())
            st_async_copy(ps + pw.b * TH * Wo + pw.c, pidx + ((size_t)(n * O + pw.b) * Ho + r0) * Wo + pw.c, true);
        // x[2*r0 - ppt + row, column - ppl], 0 outside
        st_stage_window<int(sizeof(T))>(xs2, px + (size_t)n * pH * pW, 1, XR, XC, 1, 0, pH, pW, 2 * r0 - ppt, -ppl);
        st_async_commit();
        st_async_wait_but_last();
    } else {
        st_async_wait();
    }
    __syncthreads();
    // CS channel splits: thread group cs (whole warps where G is a multiple of 32) sums the input channels
    // [cs*C/CS, (cs+1)*C/CS); the groups' sums are added in cs order at the end
    const int G = CG * TH * OG, cs = threadIdx.x / G, tid = threadIdx.x - cs * G;
    const int cg = tid % CG, rt = tid / CG, row = rt % TH, og = rt / TH, r = r0 + row;
    T acc[TO][ST_TW];
#pragma unroll
    for (int u = 0; u < TO; ++u)
#pragma unroll
        for (int v = 0; v < ST_TW; ++v) acc[u][v] = T(0);
    const T* xrow = xs + row * WP + cg * ST_TW;
    const T* wcol = ws + og * TS;
    for (int c = cs * C / CS, c_end = (cs + 1) * C / CS; c < c_end; ++c) {
#pragma unroll
        for (int i = 0; i < KS; ++i) {
            T xv[8];
            const T* xp = xrow + (c * RP + i) * WP;
            load4(xp, xv);
            if (KS > 1) load4(xp + 4, xv + 4);
#pragma unroll
            for (int j = 0; j < KS; ++j) {
                T wv[TO];
                const T* wk = wcol + ((c * KS + i) * KS + j) * OP;
#pragma unroll
                for (int u = 0; u < TO; u += 4) {
                    if (u + 4 <= TO) load4(wk + u, wv + u);
                    else load2(wk + u, wv + u);
                }
#pragma unroll
                for (int u = 0; u < TO; ++u)
#pragma unroll
                    for (int v = 0; v < ST_TW; ++v) acc[u][v] += wv[u] * xv[v + j];
            }
        }
    }
    if (UNPOOL_WG) st_async_wait();   // the prefetch, published by the barrier below
    if (CS > 1 || UNPOOL_WG) __syncthreads();
    if (CS > 1) {   // the other groups' sums through shared memory (the staged tiles are read by now)
        T* red = reinterpret_cast<T*>(smem);   // [CS - 1][G][TO * ST_TW]
        if (cs > 0) {
#pragma unroll
            for (int u = 0; u < TO; ++u)
#pragma unroll
                for (int v = 0; v < ST_TW; ++v) red[((cs - 1) * G + tid) * TO * ST_TW + u * ST_TW + v] = acc[u][v];
        }
        __syncthreads();
        if (!KEEP && cs > 0) return;
        if (cs == 0) {
            for (int k = 1; k < CS; ++k)
#pragma unroll
                for (int u = 0; u < TO; ++u)
#pragma unroll
                    for (int v = 0; v < ST_TW; ++v)
                        acc[u][v] += red[((k - 1) * G + tid) * TO * ST_TW + u * ST_TW + v];
        }
    }
    // the outputs of the threads of split 0 on rows of the image (the last tile's rows may lie past it); with KEEP no
    // thread returns before the epilogue's block-wide steps
    if (!KEEP && r >= Ho) return;
    const bool live = cs == 0 && r < Ho;
    const int P = Ho * Wo, s0 = cg * ST_TW;
    // the 4 columns in one store where every row starts aligned (Wo a multiple of 4), in two where rows start at even
    // columns, else one by one: a warp's scalar stores 4 columns apart use a quarter of each 32-byte sector
    const int vec = Wo % ST_TW == 0 ? 4 : Wo % 2 == 0 ? 2 : 1;
    const bool lin_vec = LIN && vec == 4 && reinterpret_cast<size_t>(lw) % (4 * sizeof(T)) == 0;
#pragma unroll
    for (int u = 0; u < TO; ++u) {
        const int o = og * TO + u;
        if (UNPOOL_WG || !live || o >= O) break;   // (UNPOOL_WG: below)
        T pre[ST_TW], val[ST_TW];
        const T bo = b != nullptr ? b[o] : T(0);
        T* yrow = y != nullptr ? y + (o * N + n) * P + r * Wo + s0 : nullptr;
        T* orow;
        if (UNPOOL && into == 1) {   // through the producer's pooling: its g at twice the rows and columns
            const int FW = 2 * Wo;
            const T* zp = y != nullptr ? y + (size_t)(o * N + n) * 4 * P : nullptr;
            const i64* ip = pidx + ((n * O + o) * Ho + r) * Wo + s0;
            T top[2 * ST_TW], bot[2 * ST_TW];   // rows 2r and 2r + 1, columns 2*s0 ..
#pragma unroll
            for (int v = 0; v < ST_TW; ++v) {
                const int p = 2 * r * FW + 2 * (s0 + v);   // the window's first position
                const int at = s0 + v < Wo ? (int)ip[v] : -1;   // -1: past the row, zeros (not stored)
                T win[4];
                pooled_act_grads_2x2(acc[u][v], at, p, FW, zp, bo, act, win);
                top[2 * v] = win[0];
                top[2 * v + 1] = win[1];
                bot[2 * v] = win[2];
                bot[2 * v + 1] = win[3];
            }
            T* gp = out + (size_t)(o * N + n) * 4 * P + 2 * r * FW + 2 * s0;
            if (FW % 4 == 0 && s0 + ST_TW <= Wo) {   // 8 columns of each row in two aligned vectors
                store4(gp, top);
                store4(gp + 4, top + 4);
                store4(gp + FW, bot);
                store4(gp + FW + 4, bot + 4);
            } else {
#pragma unroll
                for (int v = 0; v < 2 * ST_TW; ++v) {
                    if (2 * s0 + v >= FW) break;
                    gp[v] = top[v];
                    gp[FW + v] = bot[v];
                }
            }
            continue;
        }
        if (into) {   // the producer's g [O, N*P]: dx * act'(y + b), y and b the producer's (read, not written)
            // UNPOOL, into == 2: compact, the producer's g at its pooling windows' maxima only, [O, N*P] in the
            // pooled positions (y [O, N, 4P] read there), for pooled_wgrad
            const T* zp = UNPOOL && y != nullptr ? y + (size_t)(o * N + n) * 4 * P : nullptr;
            const i64* ip = UNPOOL ? pidx + ((n * O + o) * Ho + r) * Wo + s0 : nullptr;
#pragma unroll
            for (int v = 0; v < ST_TW; ++v) {
                pre[v] = acc[u][v];
                if (ip != nullptr) {
                    bool exact;   // (unused: dw and db are NaN wherever a maximum's z is not finite either way)
                    val[v] = s0 + v < Wo ? pooled_act_max_grad(pre[v], (int)ip[v], zp, bo, act, exact) : pre[v];
                } else {
                    val[v] = act == ST_ACT_NONE || s0 + v >= Wo ? pre[v] : act_bwd(pre[v], yrow[v] + bo, act);
                }
            }
            orow = out + (o * N + n) * P + r * Wo + s0;
            yrow = nullptr;
            if (WGRAD) {   // the producer's g for its weight gradient, 0 past the row
#pragma unroll
                for (int v = 0; v < ST_TW; ++v) acc[u][v] = s0 + v < Wo ? val[v] : T(0);
            }
        } else {
#pragma unroll
            for (int v = 0; v < ST_TW; ++v) {
                pre[v] = acc[u][v];
                val[v] = act_fwd(b != nullptr ? pre[v] + bo : pre[v], act);
            }
            orow = out + ((n * O + o) * Ho + r) * Wo + s0;
            if (KEEP) {   // kept for the linear layer's sums or the pooling
#pragma unroll
                for (int v = 0; v < ST_TW; ++v) acc[u][v] = val[v];
            }
            if (POOL) {   // y only: the pooled values are written below
#pragma unroll
                for (int v = 0; v < ST_TW; ++v)
                    if (yrow != nullptr && s0 + v < Wo) yrow[v] = pre[v];
                continue;
            }
        }
        if (vec == 4) {
            store4(orow, val);
            if (yrow != nullptr) store4(yrow, pre);
            continue;
        }
        if (vec == 2) {   // Wo even: a thread's pairs are whole (s0 + 1 < Wo where s0 < Wo)
#pragma unroll
            for (int v = 0; v < ST_TW; v += 2) {
                if (s0 + v >= Wo) break;
                store2(orow + v, val + v);
                if (yrow != nullptr) store2(yrow + v, pre + v);
            }
            continue;
        }
#pragma unroll
        for (int v = 0; v < ST_TW; ++v) {
            if (s0 + v >= Wo) break;
            orow[v] = val[v];
            if (yrow != nullptr) yrow[v] = pre[v];
        }
    }
    if (UNPOOL_WG) {   // the pooled producer's weight and bias gradients (see above)
        constexpr int KK = KS * KS, KB = KK + 1;
        const int rows = min(TH, Ho - r0), E = TH * Wo, FW = 2 * Wo;
        const int S = st_unpool_wgrad_slices(blockDim.x, O);
        T* gs = reinterpret_cast<T*>(smem);                   // [O][TH][Wo]: the g at the maxima
        T* red = gs + O * E;                                  // [O][S][KB]: the slices' sums
        int* ax = reinterpret_cast<int*>(red + O * S * KB);   // [O][TH][Wo]: a maximum's (row, column) in xs2
        unsigned char* nan_tap = reinterpret_cast<unsigned char*>(ax + O * E);   // [O][KK]
        __syncthreads();   // the staged tiles and the splits' sums are read
        for (int e = threadIdx.x; e < O * KK; e += blockDim.x) nan_tap[e] = 0;
        if (live) {   // the g at the maxima (before the producer's activation)
#pragma unroll
            for (int u = 0; u < TO; ++u)
#pragma unroll
                for (int v = 0; v < ST_TW; ++v)
                    if (og * TO + u < O && s0 + v < Wo) gs[((og * TO + u) * TH + row) * Wo + s0 + v] = acc[u][v];
        }
        __syncthreads();
        // spread over the whole block, ZR windows a thread at a time (their z loads in flight together: one memory
        // latency, not one a window): each maximum's offset in x's tile (ax) and, with an activation, its g through
        // the producer's activation, act_bwd(g, z + b) as pooled_act_max_grad. Split 0's threads did this for their
        // TO x 4 outputs before: every thread of the block ran the 16 act_bwd (GELU: erf and exp) and 16 divisions,
        // a third of them live (LeNet-5 b512: 3 splits; ncu's source page, H100: the epilogue's straight-line part
        // was 30% of the kernel's instructions).
        constexpr int ZR = 8;
        const int WN = rows * Wo;   // the block's windows a channel
        st_walk3 qw(1 << 30, WN);   // (0, channel, window of the block's rows) of e = threadIdx.x, + blockDim.x, ...
        for (int e0 = threadIdx.x; e0 < O * WN; e0 += ZR * blockDim.x) {
            int q[ZR], oc[ZR], at[ZR];
            T z[ZR];
#pragma unroll
            for (int k = 0; k < ZR; ++k, qw.next()) {
                const bool in = e0 + k * blockDim.x < O * WN;
                oc[k] = qw.b;
                q[k] = qw.b * E + qw.c;
                at[k] = in ? (int)ps[q[k]] : 0;
                z[k] = act != ST_ACT_NONE && in ? y[(size_t)(qw.b * N + n) * 4 * P + at[k]] : T(0);
            }
#pragma unroll
            for (int k = 0; k < ZR; ++k) {
                if (e0 + k * blockDim.x >= O * WN) break;
                const int h = at[k] / FW;   // its row in the producer's output, then xs2's offset
                ax[q[k]] = (h - 2 * r0) * XC + at[k] - h * FW;
                if (act != ST_ACT_NONE)
                    gs[q[k]] = act_bwd(gs[q[k]], z[k] + (b != nullptr ? b[oc[k]] : T(0)), act);
            }
        }
        __syncthreads();
        // the taps pairing a non-finite x with a position of the block's rows other than its window's maximum (its g
        // 0; 0 * inf and 0 * NaN are NaN in the dense sum), as pooled_wgrad
        for (int e = threadIdx.x; e < XR * XC; e += blockDim.x) {
            if (isfinite(xs2[e])) continue;
            const int a = e / XC, c = e - a * XC;
            for (int i = 0; i < KS; ++i)
                for (int j = 0; j < KS; ++j) {
                    const int r = a - i, s = c - j;   // the position (rows from 2*r0) whose tap (i, j) reads it
                    if (r < 0 || r >= 2 * rows || s < 0 || s >= FW) continue;
                    for (int oc = 0; oc < O; ++oc)
                        if (ax[(oc * TH + r / 2) * Wo + s / 2] != r * XC + s) nan_tap[oc * KK + i * KS + j] = 1;
                }
        }
        // slice sl of channel oc: the block's windows sl, sl + S, ..., each one g and offset read for its KS*KS taps
        // (immediate offsets from the window's corner) and the bias, KB sums in registers
        for (int q = threadIdx.x; q < O * S; q += blockDim.x) {
            const int oc = q / S, sl = q - oc * S;
            T sum[KB];
#pragma unroll
            for (int k = 0; k < KB; ++k) sum[k] = T(0);
            for (int e = sl; e < rows * Wo; e += S) {
                const T gv = gs[oc * E + e];
                const T* xw = xs2 + ax[oc * E + e];
#pragma unroll
                for (int i = 0; i < KS; ++i)
#pragma unroll
                    for (int j = 0; j < KS; ++j) sum[i * KS + j] += gv * xw[i * XC + j];
                sum[KK] += gv;
            }
#pragma unroll
            for (int k = 0; k < KB; ++k) red[q * KB + k] = sum[k];
        }
        __syncthreads();
        for (int m = threadIdx.x; m < O * KB; m += blockDim.x) {   // the slices in order
            const int oc = m / KB, k = m - oc * KB;
            T sum = T(0);
            for (int sl = 0; sl < S; ++sl) sum += red[(oc * S + sl) * KB + k];
            if (k < KK && nan_tap[oc * KK + k]) sum += T(0) * st_neg_inf<T>();   // NaN
            wpart[(size_t)blockIdx.x * O * KB + m] = sum;
        }
        // With lcount (conv.py UNPOOL_WGRAD_REDUCE_MAX_BLOCKS; the linear epilogue's slots, unused here): the block
        // that finishes last adds the rows itself, dw [O][KK] to lout and db [O] to lpart (where not null), so that
        // no wgrad_reduce launch follows on the step's critical path. G groups of threads take rows g, g + G, ...
        // of each output, in order, and their sums are added in group order (deterministic).
        if (lcount == nullptr) return;
        if (!st_last_to_arrive(lcount, gridDim.x, reinterpret_cast<unsigned*>(ax))) return;   // (ax: read by now)
        // (G <= S: the groups' sums fit the slices' [O][S][KB])
        const int M = O * KB, G = max(1, min((int)blockDim.x / M, S)), R = gridDim.x;
        for (int e = threadIdx.x; e < G * M; e += blockDim.x) {
            const int grp = e / M, m = e - grp * M;
            red[grp * M + m] = st_rows_sum<T, true>(wpart, m, M, grp, G, R);
        }
        __syncthreads();
        for (int m = threadIdx.x; m < M; m += blockDim.x) {
            T sum = red[m];
            for (int grp = 1; grp < G; ++grp) sum += red[grp * M + m];
            const int oc = m / KB, k = m - oc * KB;
            if (k < KK) lout[oc * KK + k] = sum;
            else if (lpart != nullptr) lpart[oc] = sum;
        }
        if (threadIdx.x == 0) *lcount = 0u;
        return;
    }
    if (WGRAD) {   // the producer's weight and bias gradients (see above)
        constexpr int KB = KS * KS + 1, XW = ST_TW + KS - 1;
        const int G0 = CG * TH * OG;   // split 0's threads, those of channel group og at [og*TH*CG, (og+1)*TH*CG)
        T xv[KS][XW];   // the producer's input under this thread's 4 columns, zero outside the image
        const T* pxn = px + (size_t)n * pH * pW;
#pragma unroll
        for (int i = 0; i < KS; ++i)
#pragma unroll
            for (int j = 0; j < XW; ++j) {
                const int rr = r + i - ppt, cc = s0 + j - ppl;
                xv[i][j] = live && rr >= 0 && rr < pH && cc >= 0 && cc < pW ? pxn[rr * pW + cc] : T(0);
            }
        T* red = reinterpret_cast<T*>(st_smem);   // [TO][KB][G0] (the staged tiles and the splits' sums are read)
        __syncthreads();
        if (cs == 0) {
#pragma unroll
            for (int u = 0; u < TO; ++u) {
                const bool on = live && og * TO + u < O;
                T sb = T(0);
#pragma unroll
                for (int v = 0; v < ST_TW; ++v) sb += acc[u][v];
#pragma unroll
                for (int i = 0; i < KS; ++i)
#pragma unroll
                    for (int j = 0; j < KS; ++j) {
                        T sum = T(0);
#pragma unroll
                        for (int v = 0; v < ST_TW; ++v) sum += acc[u][v] * xv[i][j + v];
                        red[(u * KB + i * KS + j) * G0 + tid] = on ? sum : T(0);
                    }
                red[(u * KB + KB - 1) * G0 + tid] = on ? sb : T(0);
            }
        }
        __syncthreads();
        const int per = TH * CG;
        for (int q = threadIdx.x; q < OG * TO * KB; q += blockDim.x) {
            const int g = q / (TO * KB), u = (q - g * TO * KB) / KB, t = q - g * TO * KB - u * KB, o = g * TO + u;
            if (o >= O) continue;
            const T* src = red + (u * KB + t) * G0 + g * per;
            T sum = T(0);
            for (int k = 0; k < per; ++k) sum += src[k];
            wpart[(size_t)blockIdx.x * O * KB + o * KB + t] = sum;
        }
        return;
    }
    if (POOL) {   // odd rows hand their outputs to the row above, even rows pool
        T* xch = reinterpret_cast<T*>(st_smem);   // [G][TO][ST_TW] (split 0's threads; the tiles are read by now)
        __syncthreads();
        if (live && (row & 1)) {
#pragma unroll
            for (int u = 0; u < TO; ++u)
#pragma unroll
                for (int v = 0; v < ST_TW; ++v) xch[(tid * TO + u) * ST_TW + v] = acc[u][v];
        }
        __syncthreads();
        if (!live || (row & 1)) return;
        const T* below = xch + (tid + CG) * TO * ST_TW;   // row r + 1, same columns (TH even: in this tile)
        const int PW = Wo / 2, PH = Ho / 2;
#pragma unroll
        for (int u = 0; u < TO; ++u) {
            const int o = og * TO + u;
            if (o >= O) break;
#pragma unroll
            for (int q = 0; q < ST_TW / 2; ++q) {
                const int s = s0 + 2 * q;
                if (s >= Wo) break;   // Wo even: a window is whole or past the row
                const T win[4] = {acc[u][2 * q], acc[u][2 * q + 1], below[u * ST_TW + 2 * q],
                                  below[u * ST_TW + 2 * q + 1]};
                const int pos[4] = {r * Wo + s, r * Wo + s + 1, (r + 1) * Wo + s, (r + 1) * Wo + s + 1};
                T best = st_neg_inf<T>();
                int at = pos[0];
#pragma unroll
                for (int e = 0; e < 4; ++e) st_argmax_step(win[e], pos[e], best, at);
                const int k = ((n * O + o) * PH + r / 2) * PW + s / 2;
                out[k] = best;
                pidx[k] = at;
            }
        }
        return;
    }
    if (LIN) {   // this thread's outputs times the linear layer's weights, then the block's and the image's sums
        T lsum[ST_LF] = {};   // (linear_sums sets the first F)
        linear_sums<T, TO>(acc, lw + og * TO * P + r * Wo + s0, O * P, P, live ? min(TO, O - og * TO) : 0, Wo - s0,
                           F, lin_vec, lsum);
        linear_finish<T>(lsum, lb, lout, lpart, lcount, F, n, blockIdx.x - n * tiles, tiles, ce, N);
    }
}

// tile_wgrad's bias sums without bias threads (WB == 0): this thread's slice s = t % S of channel t / S's staged g
// rows [slab] (S = blockDim / OP threads a channel; threads from OP*S on sum nothing): the 4-vectors s, s + S, ... of
// the slab (slab a multiple of 4: the rows are GW wide). Interleaved, so that a quarter warp's 16-byte loads mostly
// fall in different banks (the first version's contiguous slices put a warp's scalar loads in two banks, 16-way
// conflicts; H100, thirty-fourth session: MnistCnn b64 108.1 us against 105.3 with the bias threads)
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
// WB == 0 (conv.py TILE_WG_BIAS_SPREAD, the default where it saves a warp: MnistCnn's second layer): no bias threads
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
    // the copies: GB and XB bytes each (conv.py _copy_bytes: 16 or 8 where the rows allow, else one element)
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

// igemm_wgrad: the weight and bias gradients as an implicit GEMM, for the convolutions igemm_fwd takes:
// partial[s, o*(K+1) + k] = sum over split s's positions q of g[o, q] * X(k, q), X gathered from x while staging
// (no cols matrix; k == K is the bias, X = 1). Block tiles of BO channels x BK taps, (BO/TO) x (BK/TK) threads each
// keeping a TO x TK register tile (TO channels, TK taps BK/TK apart, so that a warp reads consecutive taps); split
// s walks the slices of ST_WGQ positions s, s + S, ... (neighbouring blocks read neighbouring positions at the same
// time), the next slice's loads in flight in registers during the products. wgrad_reduce then sums the S rows in
// a fixed order (deterministic, no atomics). Each thread stages one position of every slice, so its position's
// coordinates are computed once per slice. Tiles (conv.py _WG_TILES): 32 x 64 and 16 x 128 with 4 x 4 per thread
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

#define ST_TILE_PARAMS(T)                                                                                          \
    const T *in, const T *w, const T *b, T *out, T *y, int N, int C, int Hi, int Wi, int in_sn, int in_sc, int O,    \
        int Ho, int Wo, int pt, int pl, int TH, int CS, int transposed, int into, int act, const T *lw, const T *lb, \
        T *lout, T *lpart, unsigned *lcount, int F, i64 *pidx, const T *px, int pH, int pW, int ppt, int ppl,        \
        T *wpart, int vstage, int wrun
#define ST_TILE_ARGS                                                                                               \
    in, w, b, out, y, N, C, Hi, Wi, in_sn, in_sc, O, Ho, Wo, pt, pl, TH, CS, transposed, into, act, lw, lb, lout,  \
        lpart, lcount, F, pidx, px, pH, pW, ppt, ppl, wpart, vstage, wrun
// Each in two instances: NAME_kKS_toTO (tile_conv stages w itself) and NAME_kKS_toTO_arr (ARR: w arranged by
// tile_arrange), so that the arranged copies' code does not change the other kernels' (a runtime branch took
// tile_conv_pool_k5_to4_f32 from 56 registers to 70). The _arr instances are a module of their own, compiled with
// ST_ARRANGED defined (loader.py _PARTS) when one of them is first asked for: the module every run compiles is
// without them (half of its tile kernels). ST_TILE_PART(M, args...) is M(args..., SUFFIX, ARR) for the module's part.
#ifndef ST_ARRANGED
#define ST_ARRANGED 0
#endif
#if ST_ARRANGED
#define ST_TILE_PART(M, ...) M(__VA_ARGS__, _arr, true)
#else
#define ST_TILE_PART(M, ...) M(__VA_ARGS__, , false)
#endif
#define ST_TILE_ONE(T, S, KS, TO, NAME, EPI, SUFFIX, ARR)                                                          \
    extern "C" __global__ void NAME##_k##KS##_to##TO##SUFFIX##_##S(ST_TILE_PARAMS(T)) {                            \
        ST_GRID_WAIT();                                                                                            \
        tile_conv<T, KS, TO, EPI, ARR>(ST_TILE_ARGS);                                                              \
    }
// tile_conv_lin_ce: tile_conv_lin with the cross-entropy of its logits after it (CeArgs), its arguments in
// cross_entropy_fwd_reduce's order. Its float32 4-channel kernels are held to 96 registers a thread: 3 blocks of 192
// threads an SM (MnistCnn's plan at b64, 384 blocks in one wave on 132 SMs) need at most 5 warps of each
// scheduler's 16,384 registers, and registers are given in steps of 8. Unbounded, the device's compiler gave it 102
// (tile_conv_lin: 94): 2 blocks an SM, 1.45 waves, 49.3 us against 26.1 (H100, ncu, twenty-eighth session).
// (ST_TILE_LIN_CE_BOUND_<S>_<TO>: the bound of each instance; the others are left to the compiler.)
#define ST_TILE_LIN_CE_BOUND_f32_4 __maxnreg__(96)
#define ST_TILE_LIN_CE_BOUND_f32_6
#define ST_TILE_LIN_CE_BOUND_f32_8
#define ST_TILE_LIN_CE_BOUND_f64_4
#define ST_TILE_LIN_CE_BOUND_f64_6
#define ST_TILE_LIN_CE_BOUND_f64_8
#define ST_TILE_LIN_CE_ONE(T, S, KS, TO, SUFFIX, ARR)                                                              \
    extern "C" __global__ void ST_TILE_LIN_CE_BOUND_##S##_##TO                                                     \
    tile_conv_lin_ce_k##KS##_to##TO##SUFFIX##_##S(                                                                 \
        ST_TILE_PARAMS(T), const i64* target, const T* cw, T* grad, i64 ignore_index, T ls, int* bad, T* partial,  \
        unsigned* counter, int mean, T* loss, T* wsum, T* unit) {                                                  \
        ST_GRID_WAIT();                                                                                            \
        tile_conv<T, KS, TO, ST_EPI_LINEAR, ARR>(                                                                  \
            ST_TILE_ARGS,                                                                                          \
            CeArgs<T>{target, cw, grad, ignore_index, ls, bad, partial, counter, mean, loss, wsum, unit});         \
    }
#define ST_TILE_ARRANGE(T, S)                                                                                      \
    extern "C" __global__ void tile_arrange_##S(const T* w, T* fwd, int fto, T* dx, int dto, int O, int C, int KK) { \
        ST_GRID_WAIT();                                                                                            \
        tile_arrange<T>(w, fwd, fto, dx, dto, O, C, KK);                                                           \
    }
#define ST_TILE(T, S, KS, TO)                                                                                      \
    ST_TILE_PART(ST_TILE_ONE, T, S, KS, TO, tile_conv, ST_EPI_PLAIN)                                               \
    ST_TILE_PART(ST_TILE_ONE, T, S, KS, TO, tile_conv_lin, ST_EPI_LINEAR)                                          \
    ST_TILE_PART(ST_TILE_LIN_CE_ONE, T, S, KS, TO)                                                                 \
    ST_TILE_PART(ST_TILE_ONE, T, S, KS, TO, tile_conv_pool, ST_EPI_POOL)                                           \
    ST_TILE_PART(ST_TILE_ONE, T, S, KS, TO, tile_conv_wgrad, ST_EPI_WGRAD)                                         \
    ST_TILE_PART(ST_TILE_ONE, T, S, KS, TO, tile_conv_unpool, ST_EPI_UNPOOL)                                       \
    ST_TILE_PART(ST_TILE_ONE, T, S, KS, TO, tile_conv_unpool_wgrad, ST_EPI_UNPOOL_WGRAD)
#define ST_TILES(T, S)                                                                                             \
    ST_TILE(T, S, 3, 4) ST_TILE(T, S, 3, 8) ST_TILE(T, S, 5, 4) ST_TILE(T, S, 5, 6) ST_TILE(T, S, 5, 8)

// tile_wgrad's blocks have at most ST_TILE_WG_THREADS threads (conv.py _TILE_WG_THREADS); in float32 the compiler
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

#define ST_CONV(T, S)                                                                                              \
    extern "C" __global__ void im2col_##S(const T* x, T* cols, i64 N, i64 C, i64 H, i64 W, i64 KH, i64 KW, i64 OH,  \
                                          i64 OW, i64 sh, i64 sw, i64 ph, i64 pw, i64 dh, i64 dw) {                \
        ST_GRID_WAIT();                                                                                            \
        if (st_fits32(N * C * H * W, C * KH * KW * N * OH * OW))                                                   \
            im2col<T, int>(x, cols, N, C, H, W, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw);                           \
        else                                                                                                       \
            im2col<T, i64>(x, cols, N, C, H, W, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw);                           \
    }                                                                                                              \
    extern "C" __global__ void col2im_##S(const T* cols, T* dx, i64 N, i64 C, i64 H, i64 W, i64 KH, i64 KW, i64 OH, \
                                          i64 OW, i64 sh, i64 sw, i64 ph, i64 pw, i64 dh, i64 dw) {                \
        ST_GRID_WAIT();                                                                                            \
        if (st_fits32(N * C * H * W, C * KH * KW * N * OH * OW))                                                   \
            col2im<T, int>(cols, dx, N, C, H, W, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw);                          \
        else                                                                                                       \
            col2im<T, i64>(cols, dx, N, C, H, W, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw);                          \
    }                                                                                                              \
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
    ST_DIRECT(T, S, 2) ST_DIRECT(T, S, 8) ST_DIRECT_DX(T, S, 2) ST_DIRECT_DX(T, S, 8)                              \
    ST_IGEMM(T, S, 16) ST_IGEMM(T, S, 32)                                                                          \
    ST_TILE_ARRANGE(T, S)                                                                                          \
    ST_TILES(T, S)                                                                                                 \
    ST_TILE_WGRAD(T, S, 3, 4) ST_TILE_WGRAD(T, S, 3, 8) ST_TILE_WGRAD(T, S, 5, 4) ST_TILE_WGRAD(T, S, 5, 8)      \
    ST_IGEMM_WGRAD(T, S, 32, 64, 4, 4) ST_IGEMM_WGRAD(T, S, 16, 128, 4, 4) ST_IGEMM_WGRAD(T, S, 8, 32, 2, 2)       \
    extern "C" __global__ void wgrad_reduce_##S(const T* partial, T* dw, T* db, int S, int O, int K) {             \
        ST_GRID_WAIT();                                                                                            \
        wgrad_reduce<T>(partial, dw, db, S, O, K);                                                                 \
    }                                                                                                              \
    ST_POOLED_WGRAD(T, S, 3) ST_POOLED_WGRAD(T, S, 5)                                                              \
    ST_WGRAD(T, S, 1) ST_WGRAD(T, S, 2) ST_WGRAD(T, S, 4) ST_WGRAD(T, S, 8)
#if ST_ARRANGED
ST_INSTANTIATE(ST_TILES)
#else
ST_INSTANTIATE(ST_CONV)
#endif
#undef ST_CONV
#undef ST_TILES
#undef ST_TILE_PART
#undef ST_WGRAD
#undef ST_IGEMM_WGRAD
#undef ST_DIRECT
#undef ST_DIRECT_DX
#undef ST_TILE
#undef ST_TILE_ONE
#undef ST_TILE_LIN_CE_ONE
#undef ST_TILE_LIN_CE_BOUND_f32_4
#undef ST_TILE_LIN_CE_BOUND_f32_6
#undef ST_TILE_LIN_CE_BOUND_f32_8
#undef ST_TILE_LIN_CE_BOUND_f64_4
#undef ST_TILE_LIN_CE_BOUND_f64_6
#undef ST_TILE_LIN_CE_BOUND_f64_8
#undef ST_TILE_ARRANGE
#undef ST_TILE_WGRAD
#undef ST_POOLED_WGRAD
