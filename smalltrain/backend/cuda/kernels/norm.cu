// norm.cu: batch normalization forward (training and eval) and backward, float32 (_f32) and float64 (_f64).
// Layout: x [N, C, S] contiguous (S = the product of the spatial dims, 1 for [N, C]); per-channel vectors [C].
// Statistics accumulate in double for both dtypes.
//   bn_fwd_train: one block per channel c (grid = C). mean = sum(x)/M, var = sum((x - mean)^2)/M (biased, two
//                 passes), M = N*S; y = (x - mean) * invstd * w + b, invstd = 1/sqrt(var + eps); saves mean and
//                 invstd; if running_mean != null: running = (1 - momentum) * running + momentum * stat, with the
//                 unbiased var * M/(M-1) for running_var (torch's update).
//   bn_fwd_eval:  elementwise over N*C*S: y = (x - rm[c]) / sqrt(rv[c] + eps) * w[c] + b[c].
//   bn_bwd:       one block per channel: db = sum(dy), dw = sum(dy * xhat), xhat = (x - mean) * invstd;
//                 training: dx = w*invstd * (dy - db/M - xhat * dw/M); eval (mean, invstd from running stats):
//                 dx = w*invstd * dy. w == null means affine=False (w = 1, b = 0); dx, dw, db may each be null.
#include "common.cuh"

template <typename T>
__device__ void bn_forward_train(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                 T* __restrict__ y, T* __restrict__ save_mean, T* __restrict__ save_invstd,
                                 T* __restrict__ running_mean, T* __restrict__ running_var, i64 N, i64 C, i64 S,
                                 double eps, double momentum) {
    const i64 c = blockIdx.x, M = N * S;
    double sum = 0.0;
    for (i64 i = threadIdx.x; i < M; i += blockDim.x) sum += (double)x[((i / S) * C + c) * S + i % S];
    const double mean = block_sum(sum) / (double)M;
    double sq = 0.0;
    for (i64 i = threadIdx.x; i < M; i += blockDim.x) {
        const double d = (double)x[((i / S) * C + c) * S + i % S] - mean;
        sq += d * d;
    }
    const double var = block_sum(sq) / (double)M;
    const double invstd = 1.0 / sqrt(var + eps);
    if (threadIdx.x == 0) {
        save_mean[c] = (T)mean;
        save_invstd[c] = (T)invstd;
        if (running_mean != nullptr) {
            const double unbiased = M > 1 ? var * (double)M / (double)(M - 1) : var;
            running_mean[c] = (T)((1.0 - momentum) * (double)running_mean[c] + momentum * mean);
            running_var[c] = (T)((1.0 - momentum) * (double)running_var[c] + momentum * unbiased);
        }
    }
    const T m = (T)mean, scale = (T)invstd * (w != nullptr ? w[c] : T(1)), shift = b != nullptr ? b[c] : T(0);
    for (i64 i = threadIdx.x; i < M; i += blockDim.x) {
        const i64 k = ((i / S) * C + c) * S + i % S;
        y[k] = (x[k] - m) * scale + shift;
    }
}

template <typename T>
__device__ void bn_forward_eval(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                const T* __restrict__ running_mean, const T* __restrict__ running_var,
                                T* __restrict__ y, i64 N, i64 C, i64 S, double eps) {
    GRID_STRIDE(k, N * C * S) {
        const i64 c = (k / S) % C;
        const T invstd = T(1) / st_sqrt(running_var[c] + T(eps));
        const T scale = invstd * (w != nullptr ? w[c] : T(1)), shift = b != nullptr ? b[c] : T(0);
        y[k] = (x[k] - running_mean[c]) * scale + shift;
    }
}

template <typename T>
__device__ void bn_backward(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                            const T* __restrict__ mean, const T* __restrict__ invstd, T* __restrict__ dx,
                            T* __restrict__ dw, T* __restrict__ db, i64 N, i64 C, i64 S, int training) {
    const i64 c = blockIdx.x, M = N * S;
    const double mu = (double)mean[c], is = (double)invstd[c];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (i64 i = threadIdx.x; i < M; i += blockDim.x) {
        const i64 k = ((i / S) * C + c) * S + i % S;
        const double g = (double)dy[k];
        sum_dy += g;
        sum_dy_xhat += g * ((double)x[k] - mu) * is;
    }
    sum_dy = block_sum(sum_dy);
    sum_dy_xhat = block_sum(sum_dy_xhat);
    if (threadIdx.x == 0) {
        if (db != nullptr) db[c] = (T)sum_dy;
        if (dw != nullptr) dw[c] = (T)sum_dy_xhat;
    }
    if (dx == nullptr) return;
    const T k_scale = (T)is * (w != nullptr ? w[c] : T(1));
    const T mean_dy = (T)(sum_dy / (double)M), mean_dy_xhat = (T)(sum_dy_xhat / (double)M);
    const T m = (T)mu, inv = (T)is;
    for (i64 i = threadIdx.x; i < M; i += blockDim.x) {
        const i64 k = ((i / S) * C + c) * S + i % S;
        if (training) {
            const T xhat = (x[k] - m) * inv;
            dx[k] = k_scale * (dy[k] - mean_dy - xhat * mean_dy_xhat);
        } else {
            dx[k] = k_scale * dy[k];
        }
    }
}

#define ST_NORM(T, S)                                                                                              \
    extern "C" __global__ void bn_fwd_train_##S(const T* x, const T* w, const T* b, T* y, T* save_mean,            \
                                                T* save_invstd, T* running_mean, T* running_var, i64 N, i64 C,     \
                                                i64 Sp, double eps, double momentum) {                             \
        ST_GRID_WAIT();                                                                                            \
        bn_forward_train<T>(x, w, b, y, save_mean, save_invstd, running_mean, running_var, N, C, Sp, eps,         \
                            momentum);                                                                             \
    }                                                                                                              \
    extern "C" __global__ void bn_fwd_eval_##S(const T* x, const T* w, const T* b, const T* running_mean,          \
                                               const T* running_var, T* y, i64 N, i64 C, i64 Sp, double eps) {     \
        ST_GRID_WAIT();                                                                                            \
        bn_forward_eval<T>(x, w, b, running_mean, running_var, y, N, C, Sp, eps);                                  \
    }                                                                                                              \
    extern "C" __global__ void bn_bwd_##S(const T* dy, const T* x, const T* w, const T* mean, const T* invstd,     \
                                          T* dx, T* dw, T* db, i64 N, i64 C, i64 Sp, int training) {               \
        ST_GRID_WAIT();                                                                                            \
        bn_backward<T>(dy, x, w, mean, invstd, dx, dw, db, N, C, Sp, training);                                    \
    }
ST_INSTANTIATE(ST_NORM)
#undef ST_NORM
