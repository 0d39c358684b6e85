// norm.cu: batch normalization forward (training and eval) and backward, with an optional activation after it
// (0 none, 1 relu, 2 gelu, 3 gelu tanh: common.cuh act_fwd), float32 (_f32) and float64 (_f64).
// Layout: x [N, C, S] contiguous (S = the product of the spatial dims, 1 for [N, C]); per-channel vectors [C].
// A channel's M = N*S values are split into P slices of `chunk` values, one block each (grid C x P), so that a
// few wide channels still fill the GPU; statistics accumulate in double for both dtypes. With P > 1 every block
// writes its slice's partials to `part` and the last block of a channel to arrive (common.cuh st_last_to_arrive,
// its ticket counter reset for the next launch) combines them in a fixed order; with P == 1 the one block does
// everything, the elementwise pass included.
//   bn_stats:    training statistics. A slice's partials: its mean and the sum of squared deviations from it
//                (two passes over the slice); combined: mean = sum(n_p * mean_p) / M, var = sum(m2_p + n_p *
//                (mean_p - mean)^2) / M (biased; exact, no E[x^2] - E[x]^2 cancellation). Saves mean and
//                invstd = 1/sqrt(var + eps); if running_mean != null: running = (1 - momentum) * running + momentum *
//                stat, with the unbiased var * M/(M-1) for running_var (torch's update). P == 1: also applies.
//   bn_eval_stats: eval: mean = running_mean, invstd = 1/sqrt(running_var + eps), per channel.
//   bn_apply:    elementwise: y = act((x - mean[c]) * invstd[c] * w[c] + b[c]).
//   bn_bwd_reduce: g = act'(z) * dy, z the pre-activation recomputed from x; partial sums of g and g * xhat,
//                xhat = (x - mean) * invstd; combined: db = sum(g), dw = sum(g * xhat), and coef = (db/M, dw/M) per
//                channel for bn_bwd_dx. P == 1: also computes dx.
//   bn_bwd_dx:   training: dx = w*invstd * (g - coef0 - xhat * coef1); eval: dx = w*invstd * g.
// w == null means affine=False (w = 1, b = 0); dx, dw, db may each be null.
#include "common.cuh"

// The position in x of value i (of M = N*S) of channel c.
__device__ __forceinline__ i64 bn_at(i64 i, i64 c, i64 C, i64 S) {
    return S == 1 ? i * C + c : ((i / S) * C + c) * S + i % S;
}

// How many of a channel's M values slice q of `chunk` holds (the last slice may hold fewer).
__device__ __forceinline__ double bn_slice_size(i64 q, i64 chunk, i64 M) {
    return (double)(min(M, (q + 1) * chunk) - q * chunk);
}

// Write this block's two partials of channel c (slice p of P) to part; whether it is the last block of the channel
// to arrive, which then reads every slice's pair (through L2: __ldcg) and resets the channel's ticket when done.
__device__ __forceinline__ bool bn_publish(double* part, unsigned* tickets, i64 c, i64 p, i64 P, double a,
                                           double b) {
    if (threadIdx.x == 0) {
        part[2 * (c * P + p)] = a;
        part[2 * (c * P + p) + 1] = b;
    }
    return st_last_to_arrive(&tickets[c], (unsigned)P);
}

template <typename T>
__device__ __forceinline__ T bn_pre(T xv, T m, T scale, T shift) { return (xv - m) * scale + shift; }

template <typename T>
__device__ void bn_stats(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                         T* __restrict__ y, T* __restrict__ save_mean, T* __restrict__ save_invstd,
                         T* __restrict__ running_mean, T* __restrict__ running_var, double* __restrict__ part,
                         unsigned* __restrict__ tickets, i64 N, i64 C, i64 S, i64 chunk, double eps,
                         double momentum, int act) {
    __shared__ double stat[2];
    const i64 c = blockIdx.x, p = blockIdx.y, P = gridDim.y, M = N * S;
    const i64 lo = p * chunk, hi = min(M, lo + chunk), n = hi - lo;
    double sum = 0.0;
    for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) sum += (double)x[bn_at(i, c, C, S)];
    const double local_mean = block_sum(sum) / (double)n;
    double sq = 0.0;
    for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const double d = (double)x[bn_at(i, c, C, S)] - local_mean;
        sq += d * d;
    }
    sq = block_sum(sq);
    double mean = local_mean, m2 = sq;
    if (P > 1) {
        if (!bn_publish(part, tickets, c, p, P, local_mean, sq)) return;
        const double* cp = part + 2 * c * P;
        double s = 0.0;
        for (i64 q = threadIdx.x; q < P; q += blockDim.x) s += bn_slice_size(q, chunk, M) * __ldcg(cp + 2 * q);
        mean = block_sum(s) / (double)M;
        double s2 = 0.0;
        for (i64 q = threadIdx.x; q < P; q += blockDim.x) {
            const double d = __ldcg(cp + 2 * q) - mean;
            s2 += __ldcg(cp + 2 * q + 1) + bn_slice_size(q, chunk, M) * d * d;
        }
        m2 = block_sum(s2);
        if (threadIdx.x == 0) tickets[c] = 0u;
    }
    if (threadIdx.x == 0) {
        const double var = m2 / (double)M;
        const double invstd = 1.0 / sqrt(var + eps);
        save_mean[c] = (T)mean;
        save_invstd[c] = (T)invstd;
        stat[0] = mean;
        stat[1] = invstd;
        if (running_mean != nullptr) {
            const double unbiased = M > 1 ? var * (double)M / (double)(M - 1) : var;
            running_mean[c] = (T)((1.0 - momentum) * (double)running_mean[c] + momentum * mean);
            running_var[c] = (T)((1.0 - momentum) * (double)running_var[c] + momentum * unbiased);
        }
    }
    if (P > 1) return;   // bn_apply follows
    __syncthreads();
    const T m = (T)stat[0], scale = (T)stat[1] * (w != nullptr ? w[c] : T(1)), shift = b != nullptr ? b[c] : T(0);
    for (i64 i = threadIdx.x; i < M; i += blockDim.x) {
        const i64 k = bn_at(i, c, C, S);
        y[k] = act_fwd(bn_pre(x[k], m, scale, shift), act);
    }
}

template <typename T>
__device__ void bn_eval_stats(const T* __restrict__ running_mean, const T* __restrict__ running_var,
                              T* __restrict__ save_mean, T* __restrict__ save_invstd, i64 C, double eps) {
    GRID_STRIDE(c, C) {
        save_mean[c] = running_mean[c];
        save_invstd[c] = T(1) / st_sqrt(running_var[c] + T(eps));
    }
}

template <typename T>
__device__ void bn_apply(const T* __restrict__ x, const T* __restrict__ mean, const T* __restrict__ invstd,
                         const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y, i64 N, i64 C, i64 S,
                         int act) {
    GRID_STRIDE(k, N * C * S) {
        const i64 c = S == 1 ? k % C : (k / S) % C;
        const T scale = invstd[c] * (w != nullptr ? w[c] : T(1)), shift = b != nullptr ? b[c] : T(0);
        y[k] = act_fwd(bn_pre(x[k], mean[c], scale, shift), act);
    }
}

template <typename T>
__device__ __forceinline__ T bn_dx(T g, T xv, T m, T inv, T k_scale, T coef0, T coef1, int training) {
    return training ? k_scale * (g - coef0 - (xv - m) * inv * coef1) : k_scale * g;
}

template <typename T>
__device__ void bn_bwd_reduce(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                              const T* __restrict__ b, const T* __restrict__ mean, const T* __restrict__ invstd,
                              T* __restrict__ dx, T* __restrict__ dw, T* __restrict__ db, T* __restrict__ coef,
                              double* __restrict__ part, unsigned* __restrict__ tickets, i64 N, i64 C, i64 S,
                              i64 chunk, int training, int act) {
    const i64 c = blockIdx.x, p = blockIdx.y, P = gridDim.y, M = N * S;
    const i64 lo = p * chunk, hi = min(M, lo + chunk);
    const T m = mean[c], inv = invstd[c];
    const T wc = w != nullptr ? w[c] : T(1), scale = inv * wc, shift = b != nullptr ? b[c] : T(0);
    double sum_g = 0.0, sum_gx = 0.0;
    for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const i64 k = bn_at(i, c, C, S);
        const T xv = x[k];
        const double g = (double)act_bwd(dy[k], bn_pre(xv, m, scale, shift), act);
        sum_g += g;
        sum_gx += g * ((double)xv - (double)m) * (double)inv;
    }
    sum_g = block_sum(sum_g);
    sum_gx = block_sum(sum_gx);
    if (P > 1) {
        if (!bn_publish(part, tickets, c, p, P, sum_g, sum_gx)) return;
        const double* cp = part + 2 * c * P;
        double s = 0.0, sx = 0.0;
        for (i64 q = threadIdx.x; q < P; q += blockDim.x) {
            s += __ldcg(cp + 2 * q);
            sx += __ldcg(cp + 2 * q + 1);
        }
        sum_g = block_sum(s);
        sum_gx = block_sum(sx);
        if (threadIdx.x == 0) tickets[c] = 0u;
    }
    if (threadIdx.x == 0) {
        if (db != nullptr) db[c] = (T)sum_g;
        if (dw != nullptr) dw[c] = (T)sum_gx;
        if (coef != nullptr) {
            coef[2 * c] = (T)(sum_g / (double)M);
            coef[2 * c + 1] = (T)(sum_gx / (double)M);
        }
    }
    if (P > 1 || dx == nullptr) return;   // bn_bwd_dx follows
    const T coef0 = (T)(sum_g / (double)M), coef1 = (T)(sum_gx / (double)M);
    for (i64 i = threadIdx.x; i < M; i += blockDim.x) {
        const i64 k = bn_at(i, c, C, S);
        const T xv = x[k];
        const T g = act_bwd(dy[k], bn_pre(xv, m, scale, shift), act);
        dx[k] = bn_dx(g, xv, m, inv, scale, coef0, coef1, training);
    }
}

template <typename T>
__device__ void bn_bwd_dx(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                          const T* __restrict__ b, const T* __restrict__ mean, const T* __restrict__ invstd,
                          const T* __restrict__ coef, T* __restrict__ dx, i64 N, i64 C, i64 S, int training,
                          int act) {
    GRID_STRIDE(k, N * C * S) {
        const i64 c = S == 1 ? k % C : (k / S) % C;
        const T m = mean[c], inv = invstd[c];
        const T scale = inv * (w != nullptr ? w[c] : T(1)), shift = b != nullptr ? b[c] : T(0);
        const T xv = x[k];
        const T g = act_bwd(dy[k], bn_pre(xv, m, scale, shift), act);
        dx[k] = bn_dx(g, xv, m, inv, scale, training ? coef[2 * c] : T(0), training ? coef[2 * c + 1] : T(0),
                      training);
    }
}

#define ST_NORM(T, S)                                                                                              \
    extern "C" __global__ void bn_stats_##S(const T* x, const T* w, const T* b, T* y, T* save_mean,                \
                                            T* save_invstd, T* running_mean, T* running_var, double* part,         \
                                            unsigned* tickets, i64 N, i64 C, i64 Sp, i64 chunk, double eps,        \
                                            double momentum, int act) {                                            \
        ST_GRID_WAIT();                                                                                            \
        bn_stats<T>(x, w, b, y, save_mean, save_invstd, running_mean, running_var, part, tickets, N, C, Sp, chunk, \
                    eps, momentum, act);                                                                           \
    }                                                                                                              \
    extern "C" __global__ void bn_eval_stats_##S(const T* running_mean, const T* running_var, T* save_mean,        \
                                                 T* save_invstd, i64 C, double eps) {                              \
        ST_GRID_WAIT();                                                                                            \
        bn_eval_stats<T>(running_mean, running_var, save_mean, save_invstd, C, eps);                               \
    }                                                                                                              \
    extern "C" __global__ void bn_apply_##S(const T* x, const T* mean, const T* invstd, const T* w, const T* b,    \
                                            T* y, i64 N, i64 C, i64 Sp, int act) {                                 \
        ST_GRID_WAIT();                                                                                            \
        bn_apply<T>(x, mean, invstd, w, b, y, N, C, Sp, act);                                                      \
    }                                                                                                              \
    extern "C" __global__ void bn_bwd_reduce_##S(const T* dy, const T* x, const T* w, const T* b, const T* mean,   \
                                                 const T* invstd, T* dx, T* dw, T* db, T* coef, double* part,      \
                                                 unsigned* tickets, i64 N, i64 C, i64 Sp, i64 chunk, int training, \
                                                 int act) {                                                        \
        ST_GRID_WAIT();                                                                                            \
        bn_bwd_reduce<T>(dy, x, w, b, mean, invstd, dx, dw, db, coef, part, tickets, N, C, Sp, chunk, training,   \
                         act);                                                                                     \
    }                                                                                                              \
    extern "C" __global__ void bn_bwd_dx_##S(const T* dy, const T* x, const T* w, const T* b, const T* mean,       \
                                             const T* invstd, const T* coef, T* dx, i64 N, i64 C, i64 Sp,          \
                                             int training, int act) {                                              \
        ST_GRID_WAIT();                                                                                            \
        bn_bwd_dx<T>(dy, x, w, b, mean, invstd, coef, dx, N, C, Sp, training, act);                                \
    }
ST_INSTANTIATE(ST_NORM)
#undef ST_NORM
