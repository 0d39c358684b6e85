// pool.cu: 2-D max and average pooling, float32 (_f32) and float64 (_f64), torch's semantics and index arithmetic.
// Layout: x [B, H, W] contiguous (B = N*C planes), out/indices [B, OH, OW] contiguous. OH, OW come from the launcher
// (torch's pooling_output_shape, ceil_mode included); ph, pw are the symmetric paddings.
//   max_pool2d_fwd: out = max over the dilated window (padding is -inf), NaN wins; indices = ih*W + iw of the first
//                   maximum in row-major window order (the last NaN), int64 as torch returns them.
//   max_pool2d_bwd: dx[b, ih, iw] = sum of dout over the outputs whose index is ih*W + iw. One thread per input
//                   element gathers from the outputs whose window can hold it: deterministic, no atomics.
//   max_pool2d_bwd_act: the same gather, times the derivative of the activation before the pooling, written in the
//                   [C, N, H*W] layout of a convolution's output gradient (conv + activation + pool fused);
//                   max_pool2d_bwd_act_tiled: the same where the windows tile the input, a thread per window.
//   avg_pool2d_fwd: sum over the window clipped to the input, divided by divisor_override if > 0, else by the
//                   window size clipped to the padded input (count_include_pad) or to the input.
//   avg_pool2d_bwd: the same divisors, gathered per input element.
#include "common.cuh"

template <typename T, typename I>
__device__ void max_pool_fwd(const T* __restrict__ x, T* __restrict__ out, i64* __restrict__ idx, I B, I H, I W,
                             I OH, I OW, I kh, I kw, I sh, I sw, I ph, I pw, I dh, I dw) {
    GRID_STRIDE_I(I, t, B * OH * OW) {
        const I ow = t % OW, oh = (t / OW) % OH, b = t / (OH * OW);
        I hstart = oh * sh - ph, wstart = ow * sw - pw;
        const I hend = min(hstart + (kh - 1) * dh + 1, H), wend = min(wstart + (kw - 1) * dw + 1, W);
        while (hstart < 0) hstart += dh;
        while (wstart < 0) wstart += dw;
        const T* plane = x + b * H * W;
        T best = st_neg_inf<T>();
        I at = hstart * W + wstart;
        for (I ih = hstart; ih < hend; ih += dh)
            for (I iw = wstart; iw < wend; iw += dw) st_argmax_step(plane[ih * W + iw], ih * W + iw, best, at);
        out[t] = best;
        idx[t] = at;
    }
}

// With C > 0 the result is a convolution's output gradient instead (max_pool2d_bwd_act): the B = N*C planes are
// (n, c), and g [C, N, H*W] = dx * act'(y + bias[c]) with y [C, N, H*W] the convolution's sum before its bias (the
// layout conv2d_backward takes; kernels/conv.cu). That fuses the pooling's backward with the activation's.
template <typename T, typename I>
__device__ void max_pool_bwd(const T* __restrict__ dout, const i64* __restrict__ idx, T* __restrict__ dx, I B, I H,
                             I W, I OH, I OW, I kh, I kw, I sh, I sw, I ph, I pw, I dh, I dw, I C = 0,
                             const T* __restrict__ y = nullptr, const T* __restrict__ bias = nullptr, int act = 0) {
    const I ext_h = (kh - 1) * dh + 1, ext_w = (kw - 1) * dw + 1;
    GRID_STRIDE_I(I, t, B * H * W) {
        const I iw = t % W, ih = (t / W) % H, b = t / (H * W);
        const I hp = ih + ph, wp = iw + pw;
        const I oh0 = hp < ext_h ? 0 : (hp - ext_h) / sh + 1, oh1 = min(hp / sh + 1, OH);
        const I ow0 = wp < ext_w ? 0 : (wp - ext_w) / sw + 1, ow1 = min(wp / sw + 1, OW);
        const I target = ih * W + iw, base = b * OH * OW;
        T acc = T(0);
        for (I oh = oh0; oh < oh1; ++oh)
            for (I ow = ow0; ow < ow1; ++ow)
                if (idx[base + oh * OW + ow] == target) acc += dout[base + oh * OW + ow];
        if (C == 0) {
            dx[t] = acc;
        } else {
            const I n = b / C, c = b - n * C, o = (c * (B / C) + n) * (H * W) + target;
            if (act != ST_ACT_NONE) {
                T v = y[o];
                if (bias != nullptr) v += bias[c];
                acc = act_bwd(acc, v, act);
            }
            dx[o] = acc;
        }
    }
}

// max_pool2d_bwd_act_tiled: the same result where the windows tile the input exactly (kernel == stride, no padding
// or dilation, H = OH * kh, W = OW * kw: LeNet-5's 2x2 poolings). A thread per output element writes its whole
// window, dout at the argmax and 0 elsewhere, each times act'(y + bias[c]): no search over the windows covering an
// input and 1 / (kh * kw) of the threads and their index arithmetic (the gather above is instruction-bound there);
// y is read at the maximum only (common.cuh pooled_act_grad).
template <typename T>
__device__ void max_pool_bwd_act_tiled(const T* __restrict__ dout, const i64* __restrict__ idx, T* __restrict__ g,
                                       const T* __restrict__ y, const T* __restrict__ bias, int B, int C, int OH,
                                       int OW, int kh, int kw, int act) {
    const int W = OW * kw, HW = OH * kh * W, images = B / C;
    GRID_STRIDE_I(int, t, B * OH * OW) {
        const int ow = t % OW, rest = t / OW, oh = rest % OH, b = rest / OH, n = b / C, c = b - n * C;
        const int target = (int)idx[t];
        const T bc = bias != nullptr ? bias[c] : T(0);
        const int plane = (c * images + n) * HW;
        // z read where act: at the maximum, and at the others only where that is not finite (pooled_act_grad)
        const T* zp = y != nullptr ? y + plane : nullptr;
        bool exact;
        const T gw = pooled_act_max_grad(dout[t], target, zp, bc, act, exact);
        for (int i = 0; i < kh; ++i)
            for (int j = 0; j < kw; ++j) {
                const int p = (oh * kh + i) * W + ow * kw + j;
                g[plane + p] = pooled_act_grad(p, target, gw, exact, zp, bc, act);
            }
    }
}

// The window of output (oh, ow) clipped to the input, and its divisor; false if the clipped window is empty.
__device__ __forceinline__ bool avg_window(i64 oh, i64 ow, i64 H, i64 W, i64 kh, i64 kw, i64 sh, i64 sw, i64 ph,
                                           i64 pw, int count_include_pad, i64 divisor_override, i64* h0, i64* h1,
                                           i64* w0, i64* w1, i64* divisor) {
    i64 hstart = oh * sh - ph, wstart = ow * sw - pw;
    i64 hend = min(hstart + kh, H + ph), wend = min(wstart + kw, W + pw);
    const i64 pool_size = (hend - hstart) * (wend - wstart);
    hstart = max(hstart, (i64)0);
    wstart = max(wstart, (i64)0);
    hend = min(hend, H);
    wend = min(wend, W);
    *h0 = hstart; *h1 = hend; *w0 = wstart; *w1 = wend;
    if (hstart >= hend || wstart >= wend) return false;
    *divisor = divisor_override > 0 ? divisor_override
                                    : (count_include_pad ? pool_size : (hend - hstart) * (wend - wstart));
    return true;
}

template <typename T>
__device__ void avg_pool_fwd(const T* __restrict__ x, T* __restrict__ out, i64 B, i64 H, i64 W, i64 OH, i64 OW,
                             i64 kh, i64 kw, i64 sh, i64 sw, i64 ph, i64 pw, int count_include_pad,
                             i64 divisor_override) {
    GRID_STRIDE(t, B * OH * OW) {
        const i64 ow = t % OW, oh = (t / OW) % OH, b = t / (OH * OW);
        i64 h0, h1, w0, w1, divisor;
        if (!avg_window(oh, ow, H, W, kh, kw, sh, sw, ph, pw, count_include_pad, divisor_override, &h0, &h1, &w0,
                        &w1, &divisor)) {
            out[t] = T(0);
            continue;
        }
        const T* plane = x + b * H * W;
        T acc = T(0);
        for (i64 ih = h0; ih < h1; ++ih)
            for (i64 iw = w0; iw < w1; ++iw) acc += plane[ih * W + iw];
        out[t] = acc / T(divisor);
    }
}

template <typename T>
__device__ void avg_pool_bwd(const T* __restrict__ dout, T* __restrict__ dx, i64 B, i64 H, i64 W, i64 OH, i64 OW,
                             i64 kh, i64 kw, i64 sh, i64 sw, i64 ph, i64 pw, int count_include_pad,
                             i64 divisor_override) {
    GRID_STRIDE(t, B * H * W) {
        const i64 iw = t % W, ih = (t / W) % H, b = t / (H * W);
        const i64 hp = ih + ph, wp = iw + pw;
        const i64 oh0 = hp < kh ? 0 : (hp - kh) / sh + 1, oh1 = min(hp / sh + 1, OH);
        const i64 ow0 = wp < kw ? 0 : (wp - kw) / sw + 1, ow1 = min(wp / sw + 1, OW);
        const T* g = dout + b * OH * OW;
        T acc = T(0);
        for (i64 oh = oh0; oh < oh1; ++oh) {
            for (i64 ow = ow0; ow < ow1; ++ow) {
                i64 h0, h1, w0, w1, divisor;
                if (avg_window(oh, ow, H, W, kh, kw, sh, sw, ph, pw, count_include_pad, divisor_override, &h0, &h1,
                               &w0, &w1, &divisor))
                    acc += g[oh * OW + ow] / T(divisor);
            }
        }
        dx[t] = acc;
    }
}

#define ST_POOL(T, S)                                                                                                \
    extern "C" __global__ void max_pool2d_fwd_##S(const T* x, T* out, i64* idx, i64 B, i64 H, i64 W, i64 OH, i64 OW, \
                                                  i64 kh, i64 kw, i64 sh, i64 sw, i64 ph, i64 pw, i64 dh, i64 dw) {  \
        ST_GRID_WAIT();                                                                                              \
        if (st_fits32(B * H * W, B * OH * OW))                                                                       \
            max_pool_fwd<T, int>(x, out, idx, B, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw);                      \
        else                                                                                                         \
            max_pool_fwd<T, i64>(x, out, idx, B, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw);                      \
    }                                                                                                                \
    extern "C" __global__ void max_pool2d_bwd_##S(const T* dout, const i64* idx, T* dx, i64 B, i64 H, i64 W, i64 OH, \
                                                  i64 OW, i64 kh, i64 kw, i64 sh, i64 sw, i64 ph, i64 pw, i64 dh,    \
                                                  i64 dw) {                                                          \
        ST_GRID_WAIT();                                                                                              \
        if (st_fits32(B * H * W, B * OH * OW))                                                                       \
            max_pool_bwd<T, int>(dout, idx, dx, B, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw);                    \
        else                                                                                                         \
            max_pool_bwd<T, i64>(dout, idx, dx, B, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw);                    \
    }                                                                                                                \
    extern "C" __global__ void max_pool2d_bwd_act_##S(const T* dout, const i64* idx, T* g, const T* y, const T* bias, \
                                                      i64 B, i64 C, i64 H, i64 W, i64 OH, i64 OW, i64 kh, i64 kw,    \
                                                      i64 sh, i64 sw, i64 ph, i64 pw, i64 dh, i64 dw, int act) {     \
        ST_GRID_WAIT();                                                                                              \
        if (st_fits32(B * H * W, B * OH * OW))                                                                       \
            max_pool_bwd<T, int>(dout, idx, g, B, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, C, y, bias, act);    \
        else                                                                                                         \
            max_pool_bwd<T, i64>(dout, idx, g, B, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, C, y, bias, act);    \
    }                                                                                                                \
    extern "C" __global__ void max_pool2d_bwd_act_tiled_##S(const T* dout, const i64* idx, T* g, const T* y,          \
                                                            const T* bias, int B, int C, int OH, int OW, int kh,   \
                                                            int kw, int act) {                                     \
        ST_GRID_WAIT();                                                                                            \
        max_pool_bwd_act_tiled<T>(dout, idx, g, y, bias, B, C, OH, OW, kh, kw, act);                                 \
    }                                                                                                                \
    extern "C" __global__ void avg_pool2d_fwd_##S(const T* x, T* out, i64 B, i64 H, i64 W, i64 OH, i64 OW, i64 kh,   \
                                                  i64 kw, i64 sh, i64 sw, i64 ph, i64 pw, int cip, i64 divisor) {    \
        ST_GRID_WAIT();                                                                                              \
        avg_pool_fwd<T>(x, out, B, H, W, OH, OW, kh, kw, sh, sw, ph, pw, cip, divisor);                              \
    }                                                                                                                \
    extern "C" __global__ void avg_pool2d_bwd_##S(const T* dout, T* dx, i64 B, i64 H, i64 W, i64 OH, i64 OW, i64 kh, \
                                                  i64 kw, i64 sh, i64 sw, i64 ph, i64 pw, int cip, i64 divisor) {    \
        ST_GRID_WAIT();                                                                                              \
        avg_pool_bwd<T>(dout, dx, B, H, W, OH, OW, kh, kw, sh, sw, ph, pw, cip, divisor);                            \
    }
ST_INSTANTIATE(ST_POOL)
#undef ST_POOL
