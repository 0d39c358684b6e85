// linear_chain.cu: chains of small layers, act_L(... act_1(x @ w_1^T + b_1) ...) as one launch forward and two
// backward, for float32 (_f32) and float64 (_f64).
// A chain is up to ST_CMAX layers of widths d_0 (the input) .. d_L, each at most a few hundred (LeNet-5's
// 256-120-84-10). Layer l (0-based) has w_l [d_{l+1}, d_l], bias b_l or null, activation code a_l, and writes
// z_l (its pre-activation, bias included; null when no activation needs it) and h_l (its output; for the last
// layer the chain's output).
//   chain_fwd: each block takes R rows through every layer in shared memory (two [R][WMAX] buffers in turn),
//              a warp computing JW outputs (ST_CJW, at most 32 / R) at a time for all R rows (lanes over the
//              reduction, weights read coalesced, the JW * R sums over the lanes at once by warp_sum_spread), so
//              the layers need no launch between them.
//   chain_fwd_ce: chain_fwd with the cross-entropy of its output in its epilogue (cross_entropy.cuh; see below).
//   chain_bwd_rows: the same blocks walk the layers backward: g_{L-1} = dout * act'(z), then for each layer
//              dh = g @ w (one thread per input, the weights read along their rows) times the previous layer's
//              act'; writes every layer's g_l [M, d_{l+1}] and, if asked, dx = the first layer's dh (or, where the
//              input is a pooled convolution's output, that convolution's g: chain_dx_unpooled).
//   chain_bwd_staged: the same, the weights it reads first copied into shared memory (after the row buffers, each
//              layer's from a 16-byte boundary, chain_weight_slots), one cp.async group per layer in the order they
//              are read, so that the copies are all in flight at once and a layer waits only for its own: unstaged,
//              each thread's weight loads are an L2 round trip apiece. (The forward does not stage: its warps already
//              keep 32 coalesced weight loads in flight each.) chain_bwd_rows remains for chains whose weights do
//              not fit the block's shared memory.
//   chain_wgrad: [dw_l | db_l] = g_l^T @ [h_{l-1} | 1] (h_{-1} = x) for every layer in one grid of dw_tile tiles.
// Fixed summation orders everywhere (deterministic). The launcher checks the shapes and that the chain fits.
#include "common.cuh"
#include "cross_entropy.cuh"
#include "linear_tile.cuh"

#define ST_CMAX 4
#ifndef ST_CTHREADS   // (overridable for benchmarks/chain_variants.py)
#define ST_CTHREADS 512
#endif
#ifndef ST_CJW
#define ST_CJW 8      // outputs a warp sums at once (independent loads in flight), at most 32 / R (see chain_fwd)
#endif

template <typename T>
struct ChainLayer {
    const T* w;
    const T* b;
    T* z;
    T* h;
    int k, f, act;
};

#define ST_CHAIN_PARAMS(T)                                                                                         \
    const T *w0, const T *w1, const T *w2, const T *w3, const T *b0, const T *b1, const T *b2, const T *b3,        \
        T *z0, T *z1, T *z2, T *z3, T *h0, T *h1, T *h2, T *h3, int d0, int d1, int d2, int d3, int d4, int a0,   \
        int a1, int a2, int a3
#define ST_CHAIN_ARGS w0, w1, w2, w3, b0, b1, b2, b3, z0, z1, z2, z3, h0, h1, h2, h3, d0, d1, d2, d3, d4, a0, a1, a2, a3
#define ST_CHAIN_LAYERS(T)                                                                                         \
    const ChainLayer<T> layers[ST_CMAX] = {{w0, b0, z0, h0, d0, d1, a0}, {w1, b1, z1, h1, d1, d2, a1},             \
                                           {w2, b2, z2, h2, d2, d3, a2}, {w3, b3, z3, h3, d3, d4, a3}}

// chain_bwd_staged's shared memory after the two row buffers at base: layers L-1 down to lo (the first layer whose
// weights are read), each from a 16-byte boundary (linear.py _chain_staged_smem adds them up the same way); slot[l]
// points at layer l's slot (the other entries are left as they are).
template <typename T>
__device__ __forceinline__ void chain_weight_slots(const ChainLayer<T> (&layers)[ST_CMAX], int L, int lo, T* base,
                                                   int used, T* (&slot)[ST_CMAX]) {
    constexpr int V = 16 / sizeof(T);
#pragma unroll
    for (int l = ST_CMAX - 1; l >= 0; --l) {
        if (l >= L || l < lo) continue;
        used += (V - used % V) % V;
        slot[l] = base + used;
        used += layers[l].f * layers[l].k;
    }
}

// Copies layer l's weights into its slot as one cp.async group (chain_weight_slots; st_async_wait_pending waits).
template <typename T>
__device__ __forceinline__ void chain_stage_layer(const ChainLayer<T>& layer, T* slot) {
    st_async_copy_block(slot, layer.w, layer.f * layer.k);
    st_async_commit();
}

template <typename T, int R>
__device__ void chain_fwd(const T* __restrict__ x, ST_CHAIN_PARAMS(T), int M, int L, int WMAX) {
    ST_CHAIN_LAYERS(T);
    extern __shared__ unsigned char st_smem[];
    T* buf[2] = {reinterpret_cast<T*>(st_smem), reinterpret_cast<T*>(st_smem) + R * WMAX};
    const int r0 = blockIdx.x * R, nr = min(R, M - r0);
    for (int e = threadIdx.x; e < R * d0; e += blockDim.x) {
        const int r = e / d0, k = e - r * d0;
        buf[0][r * WMAX + k] = r < nr ? x[(r0 + r) * d0 + k] : T(0);
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    // more outputs a warp (independent loads in flight) win while its lanes can keep the JW * R sums: JW <= 32 / R
    constexpr int JW = ST_CJW * R <= 32 ? ST_CJW : 32 / R;
#pragma unroll
    for (int l = 0; l < ST_CMAX; ++l) {
        if (l >= L) break;
        const ChainLayer<T> c = layers[l];
        const T* in = buf[l & 1];
        T* out = buf[(l + 1) & 1];
        for (int j0 = warp * JW; j0 < c.f; j0 += nwarps * JW) {
            T acc[JW][R];
#pragma unroll
            for (int u = 0; u < JW; ++u)
#pragma unroll
                for (int r = 0; r < R; ++r) acc[u][r] = T(0);
#pragma unroll 4
            for (int k = lane; k < c.k; k += 32) {   // unrolled: 16 weight loads in flight per lane
                T wv[JW];
#pragma unroll
                for (int u = 0; u < JW; ++u) wv[u] = j0 + u < c.f ? c.w[(j0 + u) * c.k + k] : T(0);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const T a = in[r * WMAX + k];
#pragma unroll
                    for (int u = 0; u < JW; ++u) acc[u][r] += a * wv[u];
                }
            }
            // the JW * R sums at once (<= 32): sum u * R + r is output (row r, j0 + u)
            T sums[JW * R];
#pragma unroll
            for (int u = 0; u < JW; ++u)
#pragma unroll
                for (int r = 0; r < R; ++r) sums[u * R + r] = acc[u][r];
            T v = warp_sum_spread(sums);
            const int slot = warp_spread_slot<JW * R>(lane), u = slot / R, r = slot - u * R, j = j0 + u;
            if (slot >= 0 && j < c.f) {
                if (c.b != nullptr) v += c.b[j];
                const T hv = act_fwd(v, c.act);
                out[r * WMAX + j] = hv;
                if (r < nr) {
                    if (c.z != nullptr) c.z[(r0 + r) * c.f + j] = v;
                    if (c.h != nullptr) c.h[(r0 + r) * c.f + j] = hv;
                }
            }
        }
        __syncthreads();
    }
}

// chain_fwd_ce: chain_fwd, then the cross-entropy of the chain's output with class-index targets [M] (as
// cross_entropy_fwd_reduce with inner 1 and no per-row loss arrays; cw the class weights or null): each block's
// warps take its rows from shared memory, where the last layer left them, and the block that finishes last adds
// the loss. One launch for the head and its loss instead of two, each a chain of dependent round trips
// (_common.py HeldHead). C, the classes, is the last layer's width.
template <typename T, int R>
__device__ void chain_fwd_ce(const T* __restrict__ x, ST_CHAIN_PARAMS(T), int M, int L, int WMAX,
                             const i64* __restrict__ target, const T* __restrict__ cw, T* __restrict__ grad,
                             i64 ignore_index, T ls, int* __restrict__ bad, T* __restrict__ partial,
                             unsigned* __restrict__ counter, int mean, T* __restrict__ out, T* __restrict__ wsum,
                             T* __restrict__ unit) {
    const int C = L == 1 ? d1 : L == 2 ? d2 : L == 3 ? d3 : d4;
    const bool unit_mean = unit != nullptr && mean;
    // the targets' weights loaded before the layers, so that the loads are in flight while they run
    T all_w = unit_mean ? ce_weights_share<T>(target, cw, M, C, ignore_index) : T(0);
    chain_fwd<T, R>(x, ST_CHAIN_ARGS, M, L, WMAX);   // (ends with a barrier)
    __shared__ T scratch[32];
    __shared__ unsigned ticket;
    if (unit_mean) all_w = block_sum(all_w, scratch);
    extern __shared__ unsigned char st_smem[];
    const T* logits = reinterpret_cast<const T*>(st_smem) + (L & 1) * R * WMAX;   // the last layer's output buffer
    const int r0 = blockIdx.x * R, nr = min(R, M - r0), lane = threadIdx.x & 31;
    const T unit_scale = T(1) / (mean ? all_w : T(1));
    T l = T(0), wv = T(0);
    for (int r = threadIdx.x >> 5; r < nr; r += blockDim.x >> 5) {
        const i64 row = r0 + r;
        T val, w_t;
        ce_row<T>(logits + r * WMAX, 1, target[row], cw, C, ignore_index, ls, bad,
                  grad != nullptr ? grad + row * C : nullptr, unit != nullptr ? unit + row * C : nullptr, unit_scale,
                  val, w_t);
        if (lane == 0) {
            l += val;
            wv += w_t;
        }
    }
    ce_reduce_blocks<T>(l, wv, unit != nullptr, all_w, partial, counter, mean, out, wsum, blockIdx.x, gridDim.x,
                        scratch, &ticket);
}

// With pidx, dx goes to the convolution whose output, 2x2 max pooled in its epilogue (conv.cu POOL) and flattened,
// is the chain's input: through that pooling's and its activation's backward as its g [pc, M, 4P] (P = d0 / pc
// pooled positions per channel, pw per row; pidx [M, d0] the pooling's indices, py [pc, M, 4P] the convolution's
// output before its bias pb, pact its activation), as conv.cu's tile_conv writes a pooled producer's g: the
// pooling's backward kernel does not run.
template <typename T>
__device__ __forceinline__ void chain_dx_unpooled(T d, int row, int k, int K, int M, const i64* __restrict__ pidx,
                                                  const T* __restrict__ py, const T* __restrict__ pb, int pact,
                                                  int pc, int pw, T* __restrict__ g) {
    const int P = K / pc, ch = k / P, q = k - ch * P, qh = q / pw, fw = 2 * pw;
    const size_t plane = ((size_t)ch * M + row) * 4 * P;
    const T* zp = py != nullptr ? py + plane : nullptr;
    const T bc = pb != nullptr ? pb[ch] : T(0);
    const int at = (int)pidx[(size_t)row * K + k], p = 2 * qh * fw + 2 * (q - qh * pw);
    T win[4];
    pooled_act_grads_2x2(d, at, p, fw, zp, bc, pact, win);
    g[plane + p] = win[0];
    g[plane + p + 1] = win[1];
    g[plane + p + fw] = win[2];
    g[plane + p + fw + 1] = win[3];
}

template <typename T, int R, bool STAGE>
__device__ void chain_bwd_rows(const T* __restrict__ dout, ST_CHAIN_PARAMS(T), T* g0, T* g1, T* g2, T* g3,
                               T* __restrict__ dx, int M, int L, int WMAX, const i64* __restrict__ pidx,
                               const T* __restrict__ py, const T* __restrict__ pb, int pact, int pc, int pw) {
    ST_CHAIN_LAYERS(T);
    T* const gs[ST_CMAX] = {g0, g1, g2, g3};
    extern __shared__ unsigned char st_smem[];
    T* buf[2] = {reinterpret_cast<T*>(st_smem), reinterpret_cast<T*>(st_smem) + R * WMAX};
    const int r0 = blockIdx.x * R, nr = min(R, M - r0);
    const T* wl[ST_CMAX] = {w0, w1, w2, w3};   // where each layer's weights are read (global or shared memory)
    const int lo = dx != nullptr ? 0 : 1;      // the first layer whose weights are read
    if (STAGE) {   // every weight the walk reads into shared memory (chain_bwd_staged), the last layer's first
        T* slot[ST_CMAX] = {};
        chain_weight_slots(layers, L, lo, buf[0], 2 * R * WMAX, slot);
#pragma unroll
        for (int l = ST_CMAX - 1; l >= 0; --l)
            if (l < L && l >= lo) {
                chain_stage_layer(layers[l], slot[l]);
                wl[l] = slot[l];   // read from shared memory from now on
            }
    }
    {   // the last layer's g = dout * act'(z)
        const ChainLayer<T> c = layers[0];
        int f = c.f, act = c.act;
        const T* z = c.z;
        T* g = gs[0];
#pragma unroll
        for (int l = 1; l < ST_CMAX; ++l)
            if (l < L) f = layers[l].f, act = layers[l].act, z = layers[l].z, g = gs[l];
        for (int e = threadIdx.x; e < R * f; e += blockDim.x) {
            const int r = e / f, j = e - r * f;
            T v = T(0);
            if (r < nr) {
                v = dout[(r0 + r) * f + j];
                if (act != ST_ACT_NONE) v = act_bwd(v, z[(r0 + r) * f + j], act);
                g[(r0 + r) * f + j] = v;
            }
            ((L - 1) & 1 ? buf[1] : buf[0])[r * WMAX + j] = v;   // (not buf[(L - 1) & 1]: a stack array)
        }
    }
    __syncthreads();
#pragma unroll
    for (int l = ST_CMAX - 1; l >= 0; --l) {   // layer l's g (in buf[l & 1]) -> dh of its input
        if (l >= L) continue;
        if (l == 0 && dx == nullptr) break;
        const ChainLayer<T> c = layers[l];
        const T* in = buf[l & 1];
        T* out = buf[(l + 1) & 1];
        const ChainLayer<T> prev = layers[l > 0 ? l - 1 : 0];
        const T* w = wl[l];
        if (STAGE) {   // this layer's copies (groups of the layers read later may still be in flight)
            st_async_wait_pending(l - lo);
            __syncthreads();
        }
        for (int k = threadIdx.x; k < c.k; k += blockDim.x) {
            T acc[R];
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r] = T(0);
#pragma unroll 16
            for (int j = 0; j < c.f; ++j) {   // unrolled: the weight loads (L2 latency unless staged) overlap
                const T wv = w[j * c.k + k];
#pragma unroll
                for (int r = 0; r < R; ++r) acc[r] += in[r * WMAX + j] * wv;
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (r >= nr) break;
                const int row = r0 + r;
                if (l == 0) {
                    if (pidx != nullptr) chain_dx_unpooled(acc[r], row, k, c.k, M, pidx, py, pb, pact, pc, pw, dx);
                    else dx[row * c.k + k] = acc[r];
                } else {
                    const T v = prev.act != ST_ACT_NONE ? act_bwd(acc[r], prev.z[row * c.k + k], prev.act) : acc[r];
                    out[r * WMAX + k] = v;
                    gs[l - 1][row * c.k + k] = v;
                }
            }
        }
        __syncthreads();
    }
}

// blocks [t_l, t_{l+1}) are layer l's dw_tile tiles (t0 = 0); x_l is layer l's input (x, then h_0, h_1, ...)
template <typename T>
__device__ void chain_wgrad(const T* g0, const T* g1, const T* g2, const T* g3, const T* x0, const T* x1,
                            const T* x2, const T* x3, T* dw0, T* dw1, T* dw2, T* dw3, T* db0, T* db1, T* db2, T* db3,
                            int d0, int d1, int d2, int d3, int d4, int t1, int t2, int t3, int M) {
    const T* gs[ST_CMAX] = {g0, g1, g2, g3};
    const T* xs[ST_CMAX] = {x0, x1, x2, x3};
    T* dws[ST_CMAX] = {dw0, dw1, dw2, dw3};
    T* dbs[ST_CMAX] = {db0, db1, db2, db3};
    const int ds[ST_CMAX + 1] = {d0, d1, d2, d3, d4}, ts[ST_CMAX] = {0, t1, t2, t3};
    int l = 0;
#pragma unroll
    for (int i = 1; i < ST_CMAX; ++i)
        if ((int)blockIdx.x >= ts[i]) l = i;
    // the same selection written out, so that the arrays stay in registers (no dynamic indexing)
    const T *g = gs[0], *xl = xs[0];
    T *dw = dws[0], *db = dbs[0];
    int k = ds[0], f = ds[1], t = 0;
#pragma unroll
    for (int i = 1; i < ST_CMAX; ++i)
        if (l == i) g = gs[i], xl = xs[i], dw = dws[i], db = dbs[i], k = ds[i], f = ds[i + 1], t = ts[i];
    dw_tile<T>(plain(g, 1, f, f, M), xl, dw, db, M, k, f, blockIdx.x - t);
}

#define ST_CHAIN_WGRAD(T, S)                                                                                       \
    extern "C" __global__ void __launch_bounds__(ST_LTHREADS)                                                      \
    chain_wgrad_##S(const T* g0, const T* g1, const T* g2, const T* g3, const T* x0, const T* x1, const T* x2,     \
                    const T* x3, T* dw0, T* dw1, T* dw2, T* dw3, T* db0, T* db1, T* db2, T* db3, int d0, int d1,   \
                    int d2, int d3, int d4, int t1, int t2, int t3, int M) {                                       \
        ST_GRID_WAIT();                                                                                            \
        chain_wgrad<T>(g0, g1, g2, g3, x0, x1, x2, x3, dw0, dw1, dw2, dw3, db0, db1, db2, db3, d0, d1, d2, d3, d4, \
                       t1, t2, t3, M);                                                                             \
    }
ST_INSTANTIATE(ST_CHAIN_WGRAD)
#undef ST_CHAIN_WGRAD

// chain_fwd_r{R}, chain_bwd_rows_r{R} and chain_bwd_staged_r{R}: R rows per block (the launcher picks R from the
// batch)
#define ST_CHAIN(T, S, R)                                                                                          \
    extern "C" __global__ void __launch_bounds__(ST_CTHREADS)                                                      \
    chain_fwd_r##R##_##S(const T* x, ST_CHAIN_PARAMS(T), int M, int L, int WMAX) {                                 \
        ST_GRID_WAIT();                                                                                            \
        chain_fwd<T, R>(x, ST_CHAIN_ARGS, M, L, WMAX);                                                             \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(ST_CTHREADS)                                                      \
    chain_fwd_ce_r##R##_##S(const T* x, ST_CHAIN_PARAMS(T), int M, int L, int WMAX, const i64* target, const T* cw, \
                            T* grad, i64 ignore_index, T ls, int* bad, T* partial, unsigned* counter, int mean,    \
                            T* out, T* wsum, T* unit) {                                                            \
        ST_GRID_WAIT();                                                                                            \
        chain_fwd_ce<T, R>(x, ST_CHAIN_ARGS, M, L, WMAX, target, cw, grad, ignore_index, ls, bad, partial, counter, \
                           mean, out, wsum, unit);                                                                 \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(ST_CTHREADS)                                                      \
    chain_bwd_rows_r##R##_##S(const T* dout, ST_CHAIN_PARAMS(T), T* g0, T* g1, T* g2, T* g3, T* dx, int M, int L,  \
                              int WMAX, const i64* pidx, const T* py, const T* pb, int pact, int pc, int pw) {     \
        ST_GRID_WAIT();                                                                                            \
        chain_bwd_rows<T, R, false>(dout, ST_CHAIN_ARGS, g0, g1, g2, g3, dx, M, L, WMAX, pidx, py, pb, pact, pc,   \
                                    pw);                                                                           \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(ST_CTHREADS)                                                      \
    chain_bwd_staged_r##R##_##S(const T* dout, ST_CHAIN_PARAMS(T), T* g0, T* g1, T* g2, T* g3, T* dx, int M,       \
                                int L, int WMAX, const i64* pidx, const T* py, const T* pb, int pact, int pc,      \
                                int pw) {                                                                          \
        ST_GRID_WAIT();                                                                                            \
        chain_bwd_rows<T, R, true>(dout, ST_CHAIN_ARGS, g0, g1, g2, g3, dx, M, L, WMAX, pidx, py, pb, pact, pc,    \
                                   pw);                                                                            \
    }
#define ST_CHAINS(T, S) ST_CHAIN(T, S, 1) ST_CHAIN(T, S, 2) ST_CHAIN(T, S, 4) ST_CHAIN(T, S, 8)
ST_INSTANTIATE(ST_CHAINS)
#undef ST_CHAINS
#undef ST_CHAIN