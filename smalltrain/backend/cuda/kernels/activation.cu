// activation.cu: pointwise activations over flat contiguous arrays of n elements, float32 (_f32) and float64 (_f64).
//   act_fwd:  out[i] = act(x[i])                 act: 1 relu, 2 gelu (erf), 3 gelu (tanh approximation)
//   act_bwd:  dx[i] = dout[i] * act'(x[i])       for relu, x may be the forward output (same sign, NaN stays NaN):
//                                                dx = x > 0 ? dout : 0, torch's threshold_backward
// The formulas are common.cuh's act_fwd/act_bwd, shared with the convolution epilogue.
#include "common.cuh"

template <typename T>
__device__ void act_forward(const T* __restrict__ x, T* __restrict__ out, i64 n, int act) {
    GRID_STRIDE(i, n) out[i] = act_fwd(x[i], act);
}

template <typename T>
__device__ void act_backward(const T* __restrict__ dout, const T* __restrict__ x, T* __restrict__ dx, i64 n, int act) {
    GRID_STRIDE(i, n) dx[i] = act_bwd(dout[i], x[i], act);
}

#define ST_ACT(T, S)                                                                                  \
    extern "C" __global__ void act_fwd_##S(const T* x, T* out, i64 n, int act) {                      \
        ST_GRID_WAIT();                                                                               \
        act_forward<T>(x, out, n, act);                                                               \
    }                                                                                                 \
    extern "C" __global__ void act_bwd_##S(const T* dout, const T* x, T* dx, i64 n, int act) {        \
        ST_GRID_WAIT();                                                                               \
        act_backward<T>(dout, x, dx, n, act);                                                         \
    }
ST_INSTANTIATE(ST_ACT)
#undef ST_ACT
