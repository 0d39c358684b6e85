// optim.cu: fused multi-tensor optimizer steps (SGD, Adam/AdamW), float32 (_f32) and float64 (_f64): one launch
// updates every parameter of a list in place, in the operation order of torch's single-tensor implementations.
// Layout: `records` is a device int64 array [n_blocks, stride = K + 1], one record per block (grid = n_blocks):
// [element count, the addresses of the K buffers below at the block's first element]. A block reads its whole
// record in one round trip and goes straight to its elements. Buffers are contiguous and all of one dtype.
//   sgd_step:  buffers (param, grad[, momentum_buffer]). g = grad (negated if maximize) + wd * param;
//              with momentum: buf = first ? g : momentum * buf + (1 - dampening) * g; g = nesterov ? g + momentum *
//              buf : buf; param -= lr * g.
//   adam_step: buffers (param, grad, exp_avg, exp_avg_sq[, max_exp_avg_sq]). With t = *step + inc (a device scalar,
//              float32 or float64, counted on the device, so a captured CUDA graph replays correct steps; with
//              counter, the block that finishes last (a ticket, the counter reset after) stores t into *step: no
//              launch of its own for the count, and every block has read the old value before it changes):
//              decoupled wd: param *= 1 - lr * wd, else g += wd * param; m += (1 - beta1) * (g - m);
//              v = v * beta2 + (1 - beta2) * g * g; vmax = max(vmax, v) if amsgrad;
//              param -= lr / (1 - beta1^t) * m / (sqrt(amsgrad ? vmax : v) / sqrt(1 - beta2^t) + eps).
// hyper (a device float64 array) overrides the scalar hyperparameters when not null, so that a captured CUDA graph
// follows a scheduler's changes: sgd [lr, momentum, dampening, weight_decay], adam [lr, beta1, beta2, eps,
// weight_decay]. Whether momentum / weight decay are used at all is still decided by the scalar arguments.
#include "common.cuh"

template <typename T>
__device__ void sgd_step(const i64* __restrict__ records, i64 stride, double lr, const double* __restrict__ hyper,
                         double momentum, double dampening, double wd, int nesterov, int maximize, int first) {
    const bool use_wd = wd != 0.0, use_momentum = momentum != 0.0;
    if (hyper != nullptr) {
        lr = hyper[0];
        momentum = hyper[1];
        dampening = hyper[2];
        wd = hyper[3];
    }
    const i64* rec = records + blockIdx.x * stride;
    const i64 end = rec[0];
    T* p = (T*)rec[1];
    const T* g = (const T*)rec[2];
    T* buf = use_momentum ? (T*)rec[3] : nullptr;
    const T lr_t = (T)lr, mom = (T)momentum, damp = (T)(1.0 - dampening);
    const T wd_t = (T)wd;
    for (i64 i = threadIdx.x; i < end; i += blockDim.x) {
        T gi = maximize ? -g[i] : g[i];
        const T pi = p[i];
        if (use_wd) gi = gi + wd_t * pi;
        if (buf != nullptr) {
            const T b = first ? gi : mom * buf[i] + damp * gi;
            buf[i] = b;
            gi = nesterov ? gi + mom * b : b;
        }
        p[i] = pi - lr_t * gi;
    }
}

template <typename T>
__device__ void adam_step(const i64* __restrict__ records, i64 stride, double lr, const double* __restrict__ hyper,
                          double beta1, double beta2, double eps, double wd, void* __restrict__ step, int step_f64,
                          int inc, unsigned* __restrict__ counter, int amsgrad, int maximize, int decoupled) {
    const bool use_wd = wd != 0.0;
    if (hyper != nullptr) {
        lr = hyper[0];
        beta1 = hyper[1];
        beta2 = hyper[2];
        eps = hyper[3];
        wd = hyper[4];
    }
    const i64* rec = records + blockIdx.x * stride;
    const i64 end = rec[0];
    T* p = (T*)rec[1];
    const T* g = (const T*)rec[2];
    T* m = (T*)rec[3];
    T* v = (T*)rec[4];
    T* vmax = amsgrad ? (T*)rec[5] : nullptr;
    const double t = (step_f64 ? *(const double*)step : (double)*(const float*)step) + inc;
    const double lr_d = lr;
    const T step_size = (T)(lr_d / (1.0 - pow(beta1, t)));
    const T bc2_sqrt = (T)sqrt(1.0 - pow(beta2, t));
    const T decay = (T)(1.0 - lr_d * wd), wd_t = (T)wd, w1 = (T)(1.0 - beta1), b2 = (T)beta2, w2 = (T)(1.0 - beta2);
    const T eps_t = (T)eps;
    for (i64 i = threadIdx.x; i < end; i += blockDim.x) {
        T gi = maximize ? -g[i] : g[i];
        T pi = p[i];
        if (use_wd) {
            if (decoupled) pi = pi * decay;
            else gi = gi + wd_t * pi;
        }
        const T mi = m[i] + w1 * (gi - m[i]);
        const T vi = v[i] * b2 + w2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        T second = vi;
        if (vmax != nullptr) {
            second = st_max_nan(vmax[i], vi);  // NaN propagates, as torch.maximum
            vmax[i] = second;
        }
        const T denom = st_sqrt(second) / bc2_sqrt + eps_t;
        p[i] = pi - step_size * mi / denom;
    }
    // the last block stores the new count (every block used the old one, t, before taking its ticket); no fence
    // (st_last_to_arrive<false>): the last block reads nothing the others wrote
    if (counter != nullptr && st_last_to_arrive<false>(counter, gridDim.x) && threadIdx.x == 0) {
        if (step_f64) *(double*)step = t;
        else *(float*)step = (float)t;
        *counter = 0u;
    }
}

#define ST_OPTIM(T, S)                                                                                             \
    extern "C" __global__ void sgd_step_##S(const i64* records, i64 stride, double lr, const double* hyper,        \
                                            double momentum, double dampening, double wd, int nesterov,            \
                                            int maximize, int first) {                                             \
        ST_GRID_WAIT();                                                                                            \
        sgd_step<T>(records, stride, lr, hyper, momentum, dampening, wd, nesterov, maximize, first);               \
    }                                                                                                              \
    extern "C" __global__ void adam_step_##S(const i64* records, i64 stride, double lr, const double* hyper,       \
                                             double beta1, double beta2, double eps, double wd, void* step,        \
                                             int step_f64, int inc, unsigned* counter, int amsgrad, int maximize,  \
                                             int decoupled) {                                                      \
        ST_GRID_WAIT();                                                                                            \
        adam_step<T>(records, stride, lr, hyper, beta1, beta2, eps, wd, step, step_f64, inc, counter, amsgrad,     \
                     maximize, decoupled);                                                                         \
    }                                                                                                              \
    /* Adam's device-side step count where adam_step cannot store it (no counter yet while a graph is captured) */ \
    extern "C" __global__ void increment_step_##S(T* step) { ST_GRID_WAIT(); *step += (T)1; }
ST_INSTANTIATE(ST_OPTIM)
#undef ST_OPTIM

// Writes up to 5 hyperparameters into the device array `hyper` (values as kernel arguments: no host staging
// buffer and no stream synchronization, unlike a copy from pageable host memory).
extern "C" __global__ void set_hyper(double* hyper, int n, double v0, double v1, double v2, double v3, double v4) {
    ST_GRID_WAIT();
    const double v[5] = {v0, v1, v2, v3, v4};
    for (int i = 0; i < n && i < 5; ++i) hyper[i] = v[i];
}
