// common.cuh: helpers shared by smalltrain's kernels; loader.read_source inlines it into each .cu file.
// Indices are 64-bit (i64) everywhere, so no tensor size can overflow them. Kernels that take an `n` loop
// grid-stride, so any grid size covers any n. Reductions over warps assume blockDim.x is a multiple of 32.

// The element types a module instantiates its kernels for (ST_INSTANTIATE): 1 float32 (_f32 names), 2 float64
// (_f64), 3 both. loader.py compiles each kernel file once per type its kernels are asked for, so that a float32
// run does not wait for the float64 kernels or the reverse (conv.cu in nvcc for sm_90 on a 2-core machine: 67 s
// for both, 32 s for float32 alone).
#ifndef ST_DTYPES
#define ST_DTYPES 3
#endif
#if ST_DTYPES & 1
#define ST_IF_F32(...) __VA_ARGS__
#else
#define ST_IF_F32(...)
#endif
#if ST_DTYPES & 2
#define ST_IF_F64(...) __VA_ARGS__
#else
#define ST_IF_F64(...)
#endif
#define ST_INSTANTIATE(X) ST_IF_F32(X(float, f32)) ST_IF_F64(X(double, f64))

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;

#define GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)blockDim.x * gridDim.x)

// Index arithmetic in 32 bits where every index fits (see st_fits32): a 64-bit integer division costs several
// times a 32-bit one on the GPU, and im2col-like kernels do a handful per element. Templates over the index type I
// take both; the kernel picks one with a uniform branch.
#define GRID_STRIDE_I(I, i, n) \
    for (I i = (I)((i64)blockIdx.x * blockDim.x + threadIdx.x); i < (I)(n); i += (I)((i64)blockDim.x * gridDim.x))
// below 2^30, so that a grid-stride step (at most 65536 blocks x 1024 threads) never overflows an int either
__device__ __forceinline__ bool st_fits32(i64 a, i64 b = 0) { return a < (1LL << 30) && b < (1LL << 30); }

// The first statement of every kernel: wait until the kernels this one depends on have finished and their writes
// are visible. A no-op unless the launch allowed the kernel to start early (programmatic dependent launch,
// graphs.py: the captured step's kernels go to the GPU while their predecessor still runs, which hides part of
// each dependent launch's latency); then every kernel must wait before it reads or writes memory.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ST_GRID_WAIT() asm volatile("griddepcontrol.wait;\n" ::: "memory")
#else
#define ST_GRID_WAIT() ((void)0)
#endif

// Staging global -> shared memory with every copy in flight at once: cp.async (sm_80 and later) copies without a
// register round trip, so a thread issues all its copies before waiting once (st_async_wait, then the
// __syncthreads that publishes them), instead of paying a memory latency per element as a load-then-store loop does
// (~60 elements per thread of a small block: tens of microseconds). !valid writes a zero (src is then not read, but
// must still be a valid address: pass any pointer into the array). Older GPUs: a plain load and store.
template <typename T>
__device__ __forceinline__ void st_async_copy(T* dst, const T* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(d), "l"(src), "n"(sizeof(T)),
                 "r"(valid ? static_cast<int>(sizeof(T)) : 0));
#elif defined(ST_EMULATOR)   // the CPU emulator (smalltrain/testing): the copy lands at the wait that covers it
    st_emu::async_copy(dst, valid ? src : nullptr, sizeof(T));
#else
    *dst = valid ? *src : T(0);
#endif
}
// B (8 or 16) bytes src -> dst by cp.async, both B-byte aligned (the caller's guarantee; the emulator checks it);
// !valid writes zeros (src is then not read, but must still be a valid, aligned address)
template <int B, typename T>
__device__ __forceinline__ void st_async_copy_vec(T* dst, const T* src, bool valid) {
    static_assert(B == 8 || B == 16, "st_async_copy_vec: 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    if (B == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 8 : 0));
#elif defined(ST_EMULATOR)
    if (reinterpret_cast<size_t>(dst) % B || reinterpret_cast<size_t>(src) % B) __builtin_trap();
    st_emu::async_copy(dst, valid ? src : nullptr, B);
#else
    for (int v = 0; v < int(B / sizeof(T)); ++v) dst[v] = valid ? src[v] : T(0);
#endif
}
__device__ __forceinline__ void st_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#elif defined(ST_EMULATOR)
    st_emu::async_wait(-1);
#endif
}
// Double buffering: st_async_commit closes the copies issued since the last commit into a group;
// st_async_wait_but_last waits for every group but the one committed last (that one: the next tile's, in flight
// while this one is computed).
__device__ __forceinline__ void st_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif defined(ST_EMULATOR)
    st_emu::async_commit();
#endif
}
__device__ __forceinline__ void st_async_wait_but_last() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
#elif defined(ST_EMULATOR)
    st_emu::async_wait(1);
#endif
}
// Waits until at most n (0..3, more counts as 3) of this thread's committed groups are still in flight: groups
// committed in the order they are needed are waited for one by one.
__device__ __forceinline__ void st_async_wait_pending(int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (n <= 0) asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    else if (n == 1) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    else if (n == 2) asm volatile("cp.async.wait_group 2;\n" ::: "memory");
    else asm volatile("cp.async.wait_group 3;\n" ::: "memory");
#elif defined(ST_EMULATOR)
    st_emu::async_wait(n <= 0 ? 0 : n >= 3 ? 3 : n);
#endif
}
// n elements src -> dst by the block's threads: 16-byte copies where both ends are 16-byte aligned and n fills
// them, else element by element (no commit, no wait: the caller's).
template <typename T>
__device__ __forceinline__ void st_async_copy_block(T* dst, const T* src, int n) {
    constexpr int V = 16 / sizeof(T);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (n % V == 0 && reinterpret_cast<size_t>(src) % 16 == 0 && __cvta_generic_to_shared(dst) % 16 == 0) {
        for (int e = threadIdx.x * V; e < n; e += blockDim.x * V) {
            const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst + e));
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src + e));
        }
        return;
    }
#endif
    for (int e = threadIdx.x; e < n; e += blockDim.x) st_async_copy(dst + e, src + e, true);
}

// A block-strided walk e = threadIdx.x, + blockDim.x, ... over a [*][D1][D2] index space that keeps e's
// coordinates (a, b, c) by additions and carries: a division by a runtime value costs ~20 instructions, and a
// staging loop takes tens of steps per thread.
struct st_walk3 {
    int a, b, c, D1, D2, da, db, dc;
    __device__ st_walk3(int d1, int d2) : D1(d1), D2(d2) {
        const int line = threadIdx.x / D2, step = blockDim.x / D2;
        c = threadIdx.x - line * D2;
        a = line / D1;
        b = line - a * D1;
        dc = blockDim.x - step * D2;
        da = step / D1;
        db = step - da * D1;
    }
    __device__ __forceinline__ void next() {
        c += dc;
        b += db;
        a += da;
        if (c >= D2) { c -= D2; ++b; }
        if (b >= D1) { b -= D1; ++a; }
    }
};

// Staging a zero-padded window of row planes by cp.async (no commit, no wait: the caller's), B bytes a copy (16, 8
// or sizeof(T): V = B / sizeof(T) elements): dst [planes][R][width] (width a multiple of V) takes src's plane p
// (plane_stride elements apart; planes from valid_planes on are zeros), rows r0 .. r0 + R - 1 and columns c0 .. of
// its rows x cols elements, and zeros wherever a row or a copy's columns lie outside. The launcher picks B so that
// each copy lies wholly inside a row or wholly outside (conv.py _copy_bytes). One loop for every staged window of
// the conv kernels, V a compile-time constant: a runtime width made each element copy pay a branch and the
// multiplications by V.
template <int B, typename T>
__device__ __forceinline__ void st_stage_window(T* dst, const T* src, int planes, int R, int width, int valid_planes,
                                                int plane_stride, int rows, int cols, int r0, int c0) {
    constexpr int V = B / int(sizeof(T));
    static_assert(V >= 1 && B % sizeof(T) == 0 && (V == 1 || B == 8 || B == 16), "st_stage_window: 16, 8 or 1 T");
    st_walk3 w(R, width / V);   // (plane, row, copy)
    for (int e = threadIdx.x; e < planes * R * (width / V); e += blockDim.x, w.next()) {
        const int r = r0 + w.b, c = c0 + w.c * V;
        const bool inside = w.a < valid_planes && r >= 0 && r < rows && c >= 0 && c < cols;
        const T* from = inside ? src + w.a * plane_stride + r * cols + c : src;
        if constexpr (V == 1) st_async_copy(dst + e, from, inside);
        else st_async_copy_vec<B>(dst + e * V, from, inside);
    }
}
// st_stage_window with the copy width `bytes` a runtime argument (16, 8, or else one element): one branch per
// window, each arm its own loop
template <typename T>
__device__ __forceinline__ void st_stage_window_bytes(int bytes, T* dst, const T* src, int planes, int R, int width,
                                                      int valid_planes, int plane_stride, int rows, int cols, int r0,
                                                      int c0) {
    if (bytes == 16)
        st_stage_window<16>(dst, src, planes, R, width, valid_planes, plane_stride, rows, cols, r0, c0);
    else if (bytes == 8)
        st_stage_window<8>(dst, src, planes, R, width, valid_planes, plane_stride, rows, cols, r0, c0);
    else
        st_stage_window<int(sizeof(T))>(dst, src, planes, R, width, valid_planes, plane_stride, rows, cols, r0, c0);
}

// Overloads so that templates call the float or double libm function (expf vs exp) for their T.
__device__ __forceinline__ float st_exp(float x) { return expf(x); }
__device__ __forceinline__ double st_exp(double x) { return exp(x); }
__device__ __forceinline__ float st_log(float x) { return logf(x); }
__device__ __forceinline__ double st_log(double x) { return log(x); }
__device__ __forceinline__ float st_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double st_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float st_erf(float x) { return erff(x); }
__device__ __forceinline__ double st_erf(double x) { return erf(x); }
__device__ __forceinline__ float st_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double st_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ bool st_isnan(float x) { return isnan(x); }
__device__ __forceinline__ bool st_isnan(double x) { return isnan(x); }

template <typename T> __device__ __forceinline__ T st_neg_inf();
template <> __device__ __forceinline__ float st_neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double st_neg_inf<double>() {
    return __longlong_as_double(0xfff0000000000000LL);
}
template <typename T> __device__ __forceinline__ T st_nan();
template <> __device__ __forceinline__ float st_nan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double st_nan<double>() { return __longlong_as_double(0x7ff8000000000000LL); }

// max that propagates NaN, as torch's reductions do
template <typename T> __device__ __forceinline__ T st_max_nan(T a, T b) {
    return (a > b || st_isnan(a)) ? a : b;
}

// One step of a max pooling's argmax (value best at index at), torch's max_pool2d rule: v at pos replaces it where
// v is greater or NaN, so that over a window in row-major order the first maximum wins and a NaN wins (the last
// NaN where there are several). Start from best = -inf and at = the window's first index.
template <typename T, typename I>
__device__ __forceinline__ void st_argmax_step(T v, I pos, T& best, I& at) {
    if (v > best || st_isnan(v)) {
        best = v;
        at = pos;
    }
}

// 4 (or 2) consecutive values as one vector access: float4 / float2, or double2 pairs
template <typename T>
__device__ __forceinline__ void load4(const T* p, T* r) {   // 4 consecutive values, 16 (float) or 32 bytes aligned
    if constexpr (sizeof(T) == 4) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
    } else {
        const double2 a = *reinterpret_cast<const double2*>(p), b = *reinterpret_cast<const double2*>(p + 2);
        r[0] = a.x; r[1] = a.y; r[2] = b.x; r[3] = b.y;
    }
}

template <typename T>
__device__ __forceinline__ void store4(T* p, const T* r) {   // load4's counterpart
    if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
    } else {
        *reinterpret_cast<double2*>(p) = make_double2(r[0], r[1]);
        *reinterpret_cast<double2*>(p + 2) = make_double2(r[2], r[3]);
    }
}

template <typename T>
__device__ __forceinline__ void load2(const T* p, T* r) {   // 2 consecutive values, 8 (float) or 16 bytes aligned
    if constexpr (sizeof(T) == 4) {
        const float2 v = *reinterpret_cast<const float2*>(p);
        r[0] = v.x; r[1] = v.y;
    } else {
        const double2 v = *reinterpret_cast<const double2*>(p);
        r[0] = v.x; r[1] = v.y;
    }
}

template <typename T>
__device__ __forceinline__ void store2(T* p, const T* r) {   // 2 consecutive values, 8 (float) or 16 bytes aligned
    if constexpr (sizeof(T) == 4) *reinterpret_cast<float2*>(p) = make_float2(r[0], r[1]);
    else *reinterpret_cast<double2*>(p) = make_double2(r[0], r[1]);
}

// The sum over the warp, returned to every lane (a butterfly: the same fixed order in every lane and call).
template <typename T> __device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// N sums over the warp at once (N a power of 2, at most 32): returns the sum of a[i] over the warp's lanes for i =
// lane >> (5 - log2 N), so that lane L of a full warp (N == 32) holds sum L. Each step halves the values a lane
// keeps: lanes with the step's lane bit set keep the upper half, the others the lower, and each adds its partner's
// copy of the half it keeps (N - 1 shuffles in all, against 5 N for N warp_sums; LeNet-5's chain_fwd sums 32
// values a warp at once); the rest of the warp then adds by warp_sum's butterfly. A fixed order in every lane and
// call: deterministic. a is scratch afterwards.
template <int n, int off, typename T> __device__ __forceinline__ void warp_sum_halves(T* a, int lane) {
    if constexpr (n > 1) {   // (recursion, not a loop: every index a compile-time constant, a in registers)
        const bool up = (lane & off) != 0;
#pragma unroll
        for (int i = 0; i < n / 2; ++i) {
            const T keep = up ? a[i + n / 2] : a[i], send = up ? a[i] : a[i + n / 2];
            a[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
        warp_sum_halves<n / 2, off / 2>(a, lane);
    }
}
template <typename T, int N> __device__ __forceinline__ T warp_sum_spread(T (&a)[N]) {
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "warp_sum_spread: N a power of 2 up to 32");
    warp_sum_halves<N, 16>(a, threadIdx.x & 31);
    T v = a[0];
#pragma unroll
    for (int off = 32 / N / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
// The sum that lane `lane` holds after warp_sum_spread over N values, where it is the first of the 32 / N lanes
// holding it (the one to write it), else -1.
template <int N> __device__ __forceinline__ int warp_spread_slot(int lane) {
    return lane % (32 / N) == 0 ? lane / (32 / N) : -1;
}

template <typename T> __device__ __forceinline__ T warp_max(T v) {
    for (int off = 16; off > 0; off >>= 1) v = st_max_nan(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// Sum over the whole block, returned to every thread. Every thread of the block must call it (it has
// barriers); it ends with a barrier, so calls may follow one another. partial: shared memory for one value per warp
// (the overload below declares it; a kernel whose blocks per SM its dynamic shared memory decides passes some of
// that instead, since static shared memory adds to every block's).
template <typename T> __device__ T block_sum(T v, T* partial) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? partial[lane] : T(0);
        v = warp_sum(v);
        if (lane == 0) partial[0] = v;
    }
    __syncthreads();
    v = partial[0];
    __syncthreads();
    return v;
}
template <typename T> __device__ T block_sum(T v) {
    __shared__ T partial[32];
    return block_sum(v, partial);
}

// "The last block to arrive": whether this block is the last of `expected` blocks to draw a ticket from *counter
// (atomicAdd's old value; the last draws expected - 1), the same answer in every thread of the block, so that the
// last block can combine what all of them wrote in one launch and a fixed order (deterministic, no atomics on the
// values). Every thread of the block must call it: it has barriers (the first puts the block's earlier work before
// thread 0's ticket, the second hands the ticket to every thread). PUBLISH (the default): thread 0 runs
// __threadfence before its atomicAdd, so that the block's global writes before the call, every thread's (the
// barrier puts them before the fence, which is cumulative; cooperative_groups' grid sync relies on the same), are
// visible GPU-wide before its ticket is, and so to the block that draws the last ticket. That block must read them
// from L2 (__ldcg): its L1 is not coherent with other SMs' writes. PUBLISH = false where the last block reads
// nothing the others wrote (a fence per block saved). The counter must be 0 at the launch: resetting it (the last
// block, once done, for the next launch) is the caller's. ticket: a shared memory word for the ticket (the
// overload below declares one).
template <bool PUBLISH = true>
__device__ __forceinline__ bool st_last_to_arrive(unsigned* counter, unsigned expected, unsigned* ticket) {
    __syncthreads();
    if (threadIdx.x == 0) {
        if (PUBLISH) __threadfence();
        *ticket = atomicAdd(counter, 1u);
    }
    __syncthreads();
    return *ticket == expected - 1u;
}
template <bool PUBLISH = true>
__device__ __forceinline__ bool st_last_to_arrive(unsigned* counter, unsigned expected) {
    __shared__ unsigned ticket;
    return st_last_to_arrive<PUBLISH>(counter, expected, &ticket);
}

// Activations shared by activation.cu and the conv epilogue. Codes: 0 none, 1 relu, 2 gelu (erf), 3 gelu (tanh).
#define ST_ACT_NONE 0
#define ST_ACT_RELU 1
#define ST_ACT_GELU 2
#define ST_ACT_GELU_TANH 3

template <typename T> __device__ __forceinline__ T gelu_erf(T x) {
    return T(0.5) * x * (T(1) + st_erf(x * T(0.70710678118654752440)));
}

template <typename T> __device__ __forceinline__ T gelu_erf_grad(T x) {
    // d/dx x*Phi(x) = Phi(x) + x*phi(x), as torch's GeluBackward (none)
    const T cdf = T(0.5) * (T(1) + st_erf(x * T(0.70710678118654752440)));
    const T pdf = st_exp(T(-0.5) * x * x) * T(0.39894228040143267794);
    return cdf + x * pdf;
}

template <typename T> __device__ __forceinline__ T gelu_tanh(T x) {
    const T inner = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
    return T(0.5) * x * (T(1) + st_tanh(inner));
}

template <typename T> __device__ __forceinline__ T gelu_tanh_grad(T x) {
    // the operation order of torch's GeluBackward (tanh)
    const T x_sq = x * x;
    const T inner = T(0.79788456080286535588) * (x + T(0.044715) * x_sq * x);
    const T t = st_tanh(inner);
    const T left = T(0.5) * x, right = T(1) + t;
    const T left_derivative = T(0.5) * right;
    const T right_derivative = left * (T(1) - t * t) * T(0.79788456080286535588) * (T(1) + T(3) * T(0.044715) * x_sq);
    return left_derivative + right_derivative;
}

template <typename T> __device__ __forceinline__ T act_fwd(T v, int act) {
    switch (act) {
        case ST_ACT_RELU: return v <= T(0) ? T(0) : v;  // NaN stays NaN, as torch.relu
        case ST_ACT_GELU: return gelu_erf(v);
        case ST_ACT_GELU_TANH: return gelu_tanh(v);
        default: return v;
    }
}

// dout * act'(v), v the pre-activation. ReLU as torch's threshold_backward: 0 where v <= 0, else dout (so NaN passes).
template <typename T> __device__ __forceinline__ T act_bwd(T dout, T v, int act) {
    switch (act) {
        case ST_ACT_RELU: return v <= T(0) ? T(0) : dout;
        case ST_ACT_GELU: return dout * gelu_erf_grad(v);
        case ST_ACT_GELU_TANH: return dout * gelu_tanh_grad(v);
        default: return dout;
    }
}

// The backward of act then a max pooling, at position p of a window whose maximum, at `target`, received d:
// gw = act_bwd(d, z[target]) there, 0 elsewhere. Torch's unfused backward gives act_bwd(0, z) elsewhere, which is 0
// wherever the maximum's z is finite (the other activated values then lie below it, none NaN, their z finite or,
// for ReLU, -inf); `exact` (the maximum's z not finite: a NaN or an inf in the window) reads every z and gives
// torch's NaNs. So a window's other pre-activations are read only there. (GELU-tanh's derivative overflows to NaN
// past |z| ~ 1e19, which the fast path does not reproduce at the other positions.)
// pooled_act_max_grad: gw = act_bwd(d, z[target]) and `exact`, for pooled_act_grad (zplane: the window's plane of
// z before the bias).
template <typename T>
__device__ __forceinline__ T pooled_act_max_grad(T d, int target, const T* zplane, T bias, int act, bool& exact) {
    exact = false;
    if (act == ST_ACT_NONE) return d;
    const T zw = zplane[target] + bias;
    exact = !isfinite(zw);
    return act_bwd(d, zw, act);
}
template <typename T>
__device__ __forceinline__ T pooled_act_grad(int p, int target, T gw, bool exact, const T* zplane, T bias, int act) {
    if (p == target) return gw;
    return exact ? act_bwd(T(0), zplane[p] + bias, act) : T(0);
}
// A 2x2 window's four values, its first position p in a plane fw wide: v = {p, p + 1, p + fw, p + fw + 1}'s. A
// target < 0 (no window: past a row) gives zeros without reading.
template <typename T>
__device__ __forceinline__ void pooled_act_grads_2x2(T d, int target, int p, int fw, const T* zplane, T bias,
                                                     int act, T (&v)[4]) {
    bool exact = false;
    const T gw = target >= 0 ? pooled_act_max_grad(d, target, zplane, bias, act, exact) : T(0);
    v[0] = pooled_act_grad(p, target, gw, exact, zplane, bias, act);
    v[1] = pooled_act_grad(p + 1, target, gw, exact, zplane, bias, act);
    v[2] = pooled_act_grad(p + fw, target, gw, exact, zplane, bias, act);
    v[3] = pooled_act_grad(p + fw + 1, target, gw, exact, zplane, bias, act);
}
