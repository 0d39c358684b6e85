// conv/im2col.cu: the cols matrix of a 2-D convolution around cuBLAS GEMMs (cupy.matmul), float32 (_f32) and
// float64 (_f64); the path of the convolutions no direct, implicit-GEMM or tile kernel takes (groups > 1, large
// C*KH*KW).
//   im2col:  x [N, C, H, W] (contiguous) -> cols [C*KH*KW, N*OH*OW]; row (c*KH + i)*KW + j, column (n*OH + oh)*OW + ow,
//            value x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] or 0 in the padding. With groups, rows of group g
//            are the contiguous block [g*Cg*KH*KW, (g+1)*Cg*KH*KW), so cols reshapes to [G, Cg*KH*KW, N*OH*OW].
//   col2im:  the adjoint: dx[n, c, h, w] = sum of the dcols entries im2col copied x[n, c, h, w] into (a gather over the
//            kernel offsets, one thread per input element: no atomics, deterministic).
//   ph, pw are the top and left padding; bottom/right padding only enters through OH, OW. 64-bit geometry arguments;
//   each kernel runs on 32-bit indices where every index fits.
#include "../common.cuh"

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

#define ST_IM2COL(T, S)                                                                                            \
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
    }
ST_INSTANTIATE(ST_IM2COL)
#undef ST_IM2COL
