// loss.cu: softmax / log_softmax (forward, backward) and fused cross-entropy, float32 (_f32) and float64 (_f64).
// Layout: the input is [outer, C, inner] contiguous and the reduction runs over C; a "row" r = o*inner + s is the C
// values at o*C*inner + c*inner + s (inner == 1 for a last-dim softmax or [N, C] logits). One warp per row: the block
// must be a multiple of 32 threads; rows loop grid-stride by warps.
//   softmax_fwd:  y = exp(x - max) / sum exp(x - max); log: y = x - max - log(sum exp(x - max)). A NaN gives a NaN row.
//   softmax_bwd:  dx = y * (dy - sum(dy * y)); log: dx = dy - exp(y) * sum(dy).
//   cross_entropy_fwd: target [outer*inner] int64 class indices. Per row with t = target[r] != ignore_index:
//       loss[r] = (1 - ls) * (-w[t] * logp[t]) + (ls / C) * (-sum_c w[c] * logp[c]),   wt[r] = w[t]
//       grad[r, c] = (1 - ls) * w[t] * (p[c] - [c == t]) + (ls / C) * (p[c] * sum_k w[k] - w[c])   (if grad != null)
//     (w == null means all weights 1; ls = label_smoothing). Ignored rows give loss 0, wt 0, grad 0. A target outside
//     [0, C) that is not ignore_index is never read through: its loss, wt and grad are NaN, and *bad is set to 1
//     (when bad != null: a device_checks.py flag, read at the next host sync, so no separate check kernel runs).
//   cross_entropy_reduce: one block sums the rows' losses (and weights for 'mean') into the scalar loss.
//   cross_entropy_fwd_reduce: cross_entropy_fwd and the 'mean' / 'sum' reduction in one launch: each block sums
//     the losses (and weights) of the rows it computed into partial[2 * block], and the block that finishes last (a
//     ticket from *counter, which it resets to 0) adds the blocks' sums in block order: deterministic, no atomics on
//     the values. (Another summation order than cross_entropy_reduce's: the same value up to rounding.) With
//     unit (the launcher's choice for small inputs), every block also writes its rows' cross_entropy_bwd dx for a
//     loss gradient of 1, so that `loss.backward()` needs no kernel: each block first adds all the targets' weights
//     itself (the same order in every block), which the mean then divides by.
//   cross_entropy_bwd: dx = grad * scale[r * scale_stride] / (*wsum if wsum else 1) (scale_stride 0: dout), and
//     exactly 0 in rows whose target is ignore_index, as torch, even where the scale is inf or NaN ('mean' with
//     every target ignored divides by a zero total weight).
#include "common.cuh"
#include "cross_entropy.cuh"

template <typename T, bool LOG>
__device__ void softmax_forward(const T* __restrict__ x, T* __restrict__ y, i64 rows, i64 C, i64 inner) {
    const int lane = threadIdx.x & 31;
    const i64 warps = blockDim.x >> 5;
    for (i64 r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += gridDim.x * warps) {
        const i64 base = (r / inner) * C * inner + r % inner;
        T m = st_neg_inf<T>();
        for (i64 c = lane; c < C; c += 32) m = st_max_nan(m, x[base + c * inner]);
        m = warp_max(m);
        T s = T(0);
        for (i64 c = lane; c < C; c += 32) s += st_exp(x[base + c * inner] - m);
        s = warp_sum(s);
        if (LOG) {
            const T log_s = st_log(s);  // (x - max) - log(s): no rounding of max + log(s) first
            for (i64 c = lane; c < C; c += 32) y[base + c * inner] = (x[base + c * inner] - m) - log_s;
        } else {
            for (i64 c = lane; c < C; c += 32) y[base + c * inner] = st_exp(x[base + c * inner] - m) / s;
        }
    }
}

template <typename T, bool LOG>
__device__ void softmax_backward(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx, i64 rows, i64 C,
                                 i64 inner) {
    const int lane = threadIdx.x & 31;
    const i64 warps = blockDim.x >> 5;
    for (i64 r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += gridDim.x * warps) {
        const i64 base = (r / inner) * C * inner + r % inner;
        T s = T(0);
        for (i64 c = lane; c < C; c += 32) {
            const i64 k = base + c * inner;
            s += LOG ? dy[k] : dy[k] * y[k];
        }
        s = warp_sum(s);
        for (i64 c = lane; c < C; c += 32) {
            const i64 k = base + c * inner;
            dx[k] = LOG ? dy[k] - st_exp(y[k]) * s : y[k] * (dy[k] - s);
        }
    }
}

template <typename T>
__device__ void ce_backward(const T* __restrict__ grad, const i64* __restrict__ target, i64 ignore_index,
                            const T* __restrict__ scale, i64 scale_stride, const T* __restrict__ wsum,
                            T* __restrict__ dx, i64 outer, i64 C, i64 inner) {
    const T div = wsum != nullptr ? *wsum : T(1);
    GRID_STRIDE(k, outer * C * inner) {
        const i64 r = (k / (C * inner)) * inner + k % inner;
        dx[k] = target[r] == ignore_index ? T(0) : grad[k] * (scale[r * scale_stride] / div);
    }
}

// 'sum' / 'mean' reduction of the per-row losses in one single-block launch: out[0] = sum(loss) (divided by
// sum(wt) for mean), wsum[0] = sum(wt) (read by the backward). Replaces two reductions and a division.
template <typename T>
__device__ void ce_reduce(const T* __restrict__ loss, const T* __restrict__ wt, i64 rows, int mean,
                          T* __restrict__ out, T* __restrict__ wsum) {
    T l = T(0), w = T(0);
    for (i64 r = threadIdx.x; r < rows; r += blockDim.x) {
        l += loss[r];
        if (mean) w += wt[r];
    }
    l = block_sum(l);
    if (mean) w = block_sum(w);
    if (threadIdx.x == 0) {
        out[0] = mean ? l / w : l;
        if (mean) wsum[0] = w;
    }
}

#define ST_LOSS(T, S)                                                                                               \
    extern "C" __global__ void softmax_fwd_##S(const T* x, T* y, i64 rows, i64 C, i64 inner) {                      \
        ST_GRID_WAIT();                                                                                             \
        softmax_forward<T, false>(x, y, rows, C, inner);                                                            \
    }                                                                                                               \
    extern "C" __global__ void log_softmax_fwd_##S(const T* x, T* y, i64 rows, i64 C, i64 inner) {                  \
        ST_GRID_WAIT();                                                                                             \
        softmax_forward<T, true>(x, y, rows, C, inner);                                                             \
    }                                                                                                               \
    extern "C" __global__ void softmax_bwd_##S(const T* dy, const T* y, T* dx, i64 rows, i64 C, i64 inner) {        \
        ST_GRID_WAIT();                                                                                             \
        softmax_backward<T, false>(dy, y, dx, rows, C, inner);                                                      \
    }                                                                                                               \
    extern "C" __global__ void log_softmax_bwd_##S(const T* dy, const T* y, T* dx, i64 rows, i64 C, i64 inner) {    \
        ST_GRID_WAIT();                                                                                             \
        softmax_backward<T, true>(dy, y, dx, rows, C, inner);                                                       \
    }                                                                                                               \
    extern "C" __global__ void cross_entropy_fwd_##S(const T* x, const i64* target, const T* w, T* loss, T* wt,     \
                                                     T* grad, i64 rows, i64 C, i64 inner, i64 ignore_index, T ls,   \
                                                     int* bad) {                                                    \
        ST_GRID_WAIT();                                                                                             \
        T l = T(0), wv = T(0);                                                                                      \
        ce_forward<T>(x, target, w, loss, wt, grad, rows, C, inner, ignore_index, ls, bad, l, wv);                  \
    }                                                                                                               \
    extern "C" __global__ void cross_entropy_fwd_reduce_##S(                                                        \
        const T* x, const i64* target, const T* w, T* loss, T* wt, T* grad, i64 rows, i64 C, i64 inner,             \
        i64 ignore_index, T ls, int* bad, T* partial, unsigned* counter, int mean, T* out, T* wsum, T* unit) {      \
        ST_GRID_WAIT();                                                                                             \
        ce_forward_reduce<T>(x, target, w, loss, wt, grad, rows, C, inner, ignore_index, ls, bad, partial, counter, \
                             mean, out, wsum, unit);                                                                \
    }                                                                                                               \
    extern "C" __global__ void cross_entropy_bwd_##S(const T* grad, const i64* target, i64 ignore_index,            \
                                                     const T* scale, i64 scale_stride, const T* wsum, T* dx,        \
                                                     i64 outer, i64 C, i64 inner) {                                 \
        ST_GRID_WAIT();                                                                                             \
        ce_backward<T>(grad, target, ignore_index, scale, scale_stride, wsum, dx, outer, C, inner);                 \
    }                                                                                                               \
    extern "C" __global__ void cross_entropy_reduce_##S(const T* loss, const T* wt, i64 rows, int mean, T* out,     \
                                                        T* wsum) {                                                  \
        ST_GRID_WAIT();                                                                                             \
        ce_reduce<T>(loss, wt, rows, mean, out, wsum);                                                              \
    }
ST_INSTANTIATE(ST_LOSS)
#undef ST_LOSS
