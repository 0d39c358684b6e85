// linear.cu: small fully connected layers in one launch each way, for float32 (_f32) and float64 (_f64).
//   linear_fwd: out [M, F] = act(x [M, K] @ w [F, K]^T + b), and y = x @ w^T (before bias) when an activation
//            needs it for backward.
//   linear_bwd: one grid, two problems. Blocks [0, BX) compute dx [M, K] = g @ w, blocks [BX, BX + BW) compute
//            dw [F, K] = g^T @ x together with db [F] = g^T @ 1 (the reduction over M of a column of ones, output
//            column K). g = dout * act'(y + b) is formed while loading the tiles, never stored.
// Both are C[i, j] = sum_l A(i, l) * Bt(j, l) over 16 x 16 output tiles. A block's 256 threads are 4 groups of 64,
// each group taking every 4th 32-long slice of l (staged in its own shared memory, the next one prefetched into
// registers while this one is used) with 4 outputs per thread; the 4 partial sums are added in a fixed order at the
// end. These layers are tiny (tens of thousands of outputs): splitting the reduction inside the block gives 4x the
// blocks of a 32 x 32 tiling and a quarter of its serial steps, which is what their latency is made of.
// Every output is summed in a fixed order: deterministic, no atomics, no split-K pass. The launcher takes this path
// only while every operand is small (see linear.py) and all indices fit in 32 bits.
#include "common.cuh"
#include "cross_entropy.cuh"

#define ST_LT 16        // output tile side
#define ST_LK 32        // reduction slice
#define ST_LGROUPS 4    // thread groups splitting the reduction
#define ST_LGROUP 64    // threads per group (ST_LT * ST_LT / 4 outputs each)
#define ST_LTHREADS (ST_LGROUPS * ST_LGROUP)
#define ST_LPER (ST_LT * ST_LK / ST_LGROUP)   // elements of each operand a thread stages per slice

// One GEMM operand as a function of (outer index i, reduction index l): p[i*si + l*sl] for i < ni and l < nl,
// 1 at i == ones (a column of ones, for the bias gradient), 0 elsewhere; with act != 0 the value is the gradient
// dout * act'(y[i*ysi + l*ysl] + b[bias index]), the bias indexed by i (bias_on_i) or by l.
template <typename T>
struct Operand {
    const T* p;
    int si, sl, ni, nl, ones;
    const T* y;
    int ysi, ysl;
    const T* b;
    int bias_on_i, act;

    __device__ __forceinline__ T operator()(int i, int l) const {
        if (l >= nl) return T(0);
        if (i == ones) return T(1);
        if (i >= ni) return T(0);
        T v = p[i * si + l * sl];
        if (act != ST_ACT_NONE) {
            T z = y[i * ysi + l * ysl];
            if (b != nullptr) z += b[bias_on_i ? i : l];
            v = act_bwd(v, z, act);
        }
        return v;
    }
};

template <typename T>
__device__ __forceinline__ Operand<T> plain(const T* p, int si, int sl, int ni, int nl) {
    return Operand<T>{p, si, sl, ni, nl, -1, nullptr, 0, 0, nullptr, 0, ST_ACT_NONE};
}

// Element e of a slice (ST_LT outer x ST_LK reduction), as (outer, reduction) offsets: the reduction index
// fastest when it is the contiguous one, so that a warp's loads are coalesced either way.
__device__ __forceinline__ void slice_pos(int e, bool l_fast, int& di, int& dl) {
    if (l_fast) { di = e / ST_LK; dl = e - di * ST_LK; }
    else { dl = e / ST_LT; di = e - dl * ST_LT; }
}

// acc[r] = sum_l A(i0 + ty + 4r, l) * Bt(j0 + tx, l) over l < L for the threads of group 0 (u = threadIdx.x < 64,
// tx = u % 16, ty = u / 16); the other groups' acc is scratch.
template <typename T>
__device__ void tile_gemm(const Operand<T>& A, const Operand<T>& Bt, int i0, int j0, int L, T (&acc)[4]) {
    __shared__ T as[ST_LGROUPS][ST_LK][ST_LT + 1];
    __shared__ T bs[ST_LGROUPS][ST_LK][ST_LT + 1];
    __shared__ T red[ST_LGROUPS - 1][4][ST_LGROUP];
    const int grp = threadIdx.x / ST_LGROUP, u = threadIdx.x % ST_LGROUP, tx = u % ST_LT, ty = u / ST_LT;
    const bool a_lfast = A.sl == 1, b_lfast = Bt.sl == 1;
    const int slices = (L + ST_LK - 1) / ST_LK, rounds = (slices + ST_LGROUPS - 1) / ST_LGROUPS;
    T ra[ST_LPER], rb[ST_LPER];
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[r] = T(0);
    auto fetch = [&](int l0) {   // l0 past L reads zeros (Operand bounds), so every group runs every round
#pragma unroll
        for (int e = 0; e < ST_LPER; ++e) {
            int di, dl;
            slice_pos(u + e * ST_LGROUP, a_lfast, di, dl);
            ra[e] = A(i0 + di, l0 + dl);
            slice_pos(u + e * ST_LGROUP, b_lfast, di, dl);
            rb[e] = Bt(j0 + di, l0 + dl);
        }
    };
    fetch(grp * ST_LK);
    for (int round = 0; round < rounds; ++round) {
        __syncthreads();   // the previous slice is consumed
#pragma unroll
        for (int e = 0; e < ST_LPER; ++e) {
            int di, dl;
            slice_pos(u + e * ST_LGROUP, a_lfast, di, dl);
            as[grp][dl][di] = ra[e];
            slice_pos(u + e * ST_LGROUP, b_lfast, di, dl);
            bs[grp][dl][di] = rb[e];
        }
        __syncthreads();
        if (round + 1 < rounds) fetch(((round + 1) * ST_LGROUPS + grp) * ST_LK);   // in flight during the products
#pragma unroll 8
        for (int l = 0; l < ST_LK; ++l) {
            const T bv = bs[grp][l][tx];
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[r] += as[grp][l][ty + 4 * r] * bv;   // as: a broadcast per 16 lanes
        }
    }
    if (grp > 0) {
#pragma unroll
        for (int r = 0; r < 4; ++r) red[grp - 1][r][u] = acc[r];
    }
    __syncthreads();
    if (grp == 0) {
#pragma unroll
        for (int r = 0; r < 4; ++r)
            for (int g = 0; g < ST_LGROUPS - 1; ++g) acc[r] += red[g][r][u];
    }
}

// Tile `bid` of [dw | db] [F, K + 1] = gt [F, M] @ [x | 1] [M, K + 1] (x [M, K] row-major; db as the bias
// column K). Without dw (frozen weight) only the tiles of column K are counted, without db column K is left out:
// dw_tiles(F, K, ...) tiles in all.
template <typename T>
__device__ void dw_tile(const Operand<T>& gt, const T* __restrict__ x, T* __restrict__ dw, T* __restrict__ db,
                        int M, int K, int F, int bid) {
    const int KB = db != nullptr ? K + 1 : K, first = dw != nullptr ? 0 : K;
    const int tiles_j = (KB - first + ST_LT - 1) / ST_LT;
    const int i0 = (bid / tiles_j) * ST_LT, j0 = first + (bid % tiles_j) * ST_LT;
    Operand<T> xt = plain(x, 1, K, K, M);
    if (db != nullptr) xt.ones = K;
    T acc[4];
    tile_gemm<T>(gt, xt, i0, j0, M, acc);
    const int j = j0 + threadIdx.x % ST_LT;
    if (threadIdx.x >= ST_LGROUP || j >= KB) return;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int i = i0 + threadIdx.x / ST_LT + 4 * r;
        if (i >= F) break;
        if (j < K) dw[i * K + j] = acc[r];   // j < K only when dw is wanted (first == 0)
        else db[i] = acc[r];
    }
}

template <typename T>
__device__ void linear_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                           T* __restrict__ out, T* __restrict__ y, int M, int K, int F, int act) {
    const int tiles_j = (F + ST_LT - 1) / ST_LT;
    const int i0 = (blockIdx.x / tiles_j) * ST_LT, j0 = (blockIdx.x % tiles_j) * ST_LT;
    T acc[4];
    tile_gemm<T>(plain(x, K, 1, M, K), plain(w, K, 1, F, K), i0, j0, K, acc);
    const int j = j0 + threadIdx.x % ST_LT;
    if (threadIdx.x >= ST_LGROUP || j >= F) return;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int i = i0 + threadIdx.x / ST_LT + 4 * r;
        if (i >= M) break;
        T v = acc[r];
        if (y != nullptr) y[i * F + j] = v;
        if (b != nullptr) v += b[j];
        out[i * F + j] = act_fwd(v, act);
    }
}

template <typename T>
__device__ void linear_bwd(const T* __restrict__ dout, const T* __restrict__ y, const T* __restrict__ b,
                           const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ dx, T* __restrict__ dw,
                           T* __restrict__ db, int M, int K, int F, int ysm, int ysf, int act, int blocks_dx) {
    if ((int)blockIdx.x < blocks_dx) {   // dx [M, K] = g [M, F] @ w [F, K]
        T acc[4];
        const int tx = threadIdx.x % ST_LT, ty = threadIdx.x / ST_LT;   // used by group 0 (threadIdx.x < 64)
        const int tiles_j = (K + ST_LT - 1) / ST_LT;
        const int i0 = (blockIdx.x / tiles_j) * ST_LT, j0 = (blockIdx.x % tiles_j) * ST_LT;
        const Operand<T> g{dout, F, 1, M, F, -1, y, ysm, ysf, b, 0, act};
        tile_gemm<T>(g, plain(w, 1, K, K, F), i0, j0, F, acc);
        const int j = j0 + tx;
        if (threadIdx.x >= ST_LGROUP || j >= K) return;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int i = i0 + ty + 4 * r;
            if (i < M) dx[i * K + j] = acc[r];
        }
    } else {   // [dw | db] [F, K + 1] = g^T [F, M] @ [x | 1] [M, K + 1]
        const Operand<T> gt{dout, 1, F, F, M, -1, y, ysf, ysm, b, 1, act};
        dw_tile<T>(gt, x, dw, db, M, K, F, blockIdx.x - blocks_dx);
    }
}

// ---- chains of small layers: act_L(... act_1(x @ w_1^T + b_1) ...) as one launch forward, two backward ----
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
//              are read, so that the copies are all in flight at once and a layer waits only for its own. H200,
//              LeNet-5's head at batch 512 (4 rows per block): chain_bwd_rows 26.6 us (ncu), 8% of the issue slots
//              busy, each thread's weight loads an L2 round trip per 16; chain_bwd_staged 13.2 us. (The forward
//              staged the same way lost: 8.1 -> 8.5 us at batch 64, 12.4 -> 14.0 at 512; its warps already keep
//              32 coalesced weight loads in flight each.)
//   chain_wgrad: [dw_l | db_l] = g_l^T @ [h_{l-1} | 1] (h_{-1} = x) for every layer in one grid of dw_tile tiles.
// Fixed summation orders everywhere (deterministic). The launcher checks the shapes and that the chain fits.
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
    // H200, LeNet-5's head at batch 64 (1 row per block): 8 outputs per warp 6.8 us, 4: 10.6 us
    // (benchmarks/chain_variants.py); a warp's lanes keep the JW * R sums, hence JW <= 32 / R
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

// ---- wide layers: few outputs over a long reduction (MnistCnn's Linear(18432, 10)), one launch each way ----
//   wide_fwd: grid (chunks, row groups). Block (c, g) sums x[r, k] * w[f, k] over its chunk of k for the
//            ST_WROWS rows of group g and every f < F (w's chunk staged in shared memory ST_WK columns at a time,
//            each warp taking ST_WROWS / 8 rows, lanes over k, a butterfly sum per output), and writes the partial
//            sums part[c, r, f]. The block that finishes its group last (a ticket from counters[g]) adds the
//            partials in chunk order, adds the bias, applies the activation and writes out (and y, the sum before
//            the bias, where the backward needs it), then resets counters[g] to 0 for the next launch. Partial sums
//            in a fixed order: deterministic, no atomics on the values; one launch instead of cuBLAS's GEMM,
//            split-K reduction and the epilogue.
//   wide_bwd: one thread per column k (ST_WBC per block, ST_WBG groups of rows): g = dout * act'(y + b) is staged
//            ST_WBM rows at a time in shared memory, each thread writes dx[m, k] = sum_f g[m, f] * w[f, k] for its
//            rows and accumulates dw[f, k] = sum_m g[m, f] * x[m, k]; the groups' sums are added in a fixed order.
//            db is column K, a column of ones (as in linear_bwd). x and dx are read and written once, coalesced.
//            With P > 0 the input x [M, K] is a convolution's output [M, O, P] flattened, and dx is written as that
//            convolution's g [O, M * P] = dx * actc'(yc + bc[o]) (yc [O, M * P] its output before the bias):
//            conv2d_backward's input, so the transpose and derivative kernel between the two layers disappears.
//            For relu the derivative comes from x itself (x > 0 where yc + bc > 0; yc may then be null).
// F <= ST_WF; the launcher checks the shapes, the limits and that the indices fit in 32 bits.
#define ST_WF 16
#define ST_WK 256
#define ST_WROWS 32
#define ST_WTHREADS 256
#define ST_WBC 64
#define ST_WBG (ST_WTHREADS / ST_WBC)
#define ST_WBM 64

template <typename T>
__device__ void wide_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                         T* __restrict__ out, T* __restrict__ y, T* __restrict__ part, unsigned* counters, int M,
                         int K, int F, int act, int kchunk) {
    constexpr int RW = ST_WROWS / (ST_WTHREADS / 32);   // rows per warp
    constexpr int CPL = ST_WK / 32;                      // columns per lane and slice
    __shared__ T ws[ST_WF][ST_WK];
    const int chunk = blockIdx.x, chunks = gridDim.x, r0 = blockIdx.y * ST_WROWS;
    const int lane = threadIdx.x % 32, rw = r0 + (threadIdx.x / 32) * RW;
    const int k_begin = chunk * kchunk, k_end = min(K, k_begin + kchunk);
    T acc[RW][ST_WF];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr)
#pragma unroll
        for (int f = 0; f < ST_WF; ++f) acc[rr][f] = T(0);
    for (int k0 = k_begin; k0 < k_end; k0 += ST_WK) {
        const int n = min(ST_WK, k_end - k0);
        // this slice's x first (HBM latency), all of a lane's columns at once, then w's slice while they load
        T xv[RW][CPL];
#pragma unroll
        for (int j = 0; j < CPL; ++j) {
            const int c = lane + 32 * j;
#pragma unroll
            for (int rr = 0; rr < RW; ++rr) xv[rr][j] = c < n && rw + rr < M ? x[(rw + rr) * K + k0 + c] : T(0);
        }
        __syncthreads();   // the previous slice is consumed
        for (int e = threadIdx.x; e < F * ST_WK; e += ST_WTHREADS) {
            const int f = e / ST_WK, c = e - f * ST_WK;
            ws[f][c] = c < n ? w[f * K + k0 + c] : T(0);
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < CPL; ++j) {
#pragma unroll
            for (int f = 0; f < ST_WF; ++f) {
                if (f < F) {
                    const T wv = ws[f][lane + 32 * j];   // 0 past the slice, as xv
#pragma unroll
                    for (int rr = 0; rr < RW; ++rr) acc[rr][f] += xv[rr][j] * wv;
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
#pragma unroll
        for (int f = 0; f < ST_WF; ++f) {
            if (f < F) {
                const T v = warp_sum(acc[rr][f]);
                if (lane == f && rw + rr < M) part[(chunk * M + rw + rr) * F + f] = v;
            }
        }
    }
    // (st_last_to_arrive's fence makes the partials visible to the block that adds them)
    if (!st_last_to_arrive(&counters[blockIdx.y], chunks)) return;
    // each thread adds up to PER of the group's outputs (e = threadIdx.x + j * ST_WTHREADS; part[c] holds the
    // group's rows contiguous from r0 * F), in chunk order, U chunks of each at a time: PER * U loads in flight (L2:
    // the other blocks wrote them), so that the last block waits on few round trips
    constexpr int PER = (ST_WROWS * ST_WF + ST_WTHREADS - 1) / ST_WTHREADS, U = 16;
    const int outputs = min(ST_WROWS, M - r0) * F, stride = M * F;
    const T* p = part + r0 * F;
    T v[PER];
    bool live[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        live[j] = threadIdx.x + j * ST_WTHREADS < outputs;
        v[j] = T(0);
    }
    int c = 0;
    for (; c + U <= chunks; c += U) {
        T t[PER][U];
#pragma unroll
        for (int j = 0; j < PER; ++j)
#pragma unroll
            for (int u = 0; u < U; ++u)
                t[j][u] = live[j] ? __ldcg(p + (c + u) * stride + threadIdx.x + j * ST_WTHREADS) : T(0);
#pragma unroll
        for (int j = 0; j < PER; ++j)
#pragma unroll
            for (int u = 0; u < U; ++u) v[j] += t[j][u];
    }
    for (; c < chunks; ++c) {
#pragma unroll
        for (int j = 0; j < PER; ++j)
            if (live[j]) v[j] += __ldcg(p + c * stride + threadIdx.x + j * ST_WTHREADS);
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        if (!live[j]) continue;
        const int e = r0 * F + threadIdx.x + j * ST_WTHREADS, f = e % F;
        T val = v[j];
        if (y != nullptr) y[e] = val;
        if (b != nullptr) val += b[f];
        out[e] = act_fwd(val, act);
    }
    if (threadIdx.x == 0) counters[blockIdx.y] = 0u;
}

template <typename T>
__device__ void wide_bwd(const T* __restrict__ dout, const T* __restrict__ y, const T* __restrict__ b,
                         const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ dx, T* __restrict__ dw,
                         T* __restrict__ db, int M, int K, int F, int ysm, int ysf, int act, int P,
                         const T* __restrict__ yc, const T* __restrict__ bc, int actc) {
    __shared__ __align__(32) T gs[ST_WBM][ST_WF];   // rows read 4 outputs at a time (load4)
    __shared__ T red[ST_WBG - 1][ST_WF][ST_WBC];
    const int col = threadIdx.x % ST_WBC, grp = threadIdx.x / ST_WBC, k = blockIdx.x * ST_WBC + col;
    const bool ones = k == K && db != nullptr, in_x = k < K;   // column K: the bias gradient
    // where this column's dx[m] goes: m * K + k, or in the convolution's layout (k = o * P + p) o * M * P + m * P + p
    const int co = P > 0 ? k / P : 0, dx_row = P > 0 ? P : K;
    const int dx_col = P > 0 ? co * M * P + (k - co * P) : k;
    const T cb = P > 0 && in_x && bc != nullptr ? bc[co] : T(0);
    const bool relu_x = actc == ST_ACT_RELU, read_x = in_x && (dw != nullptr || (relu_x && dx != nullptr));
    const bool read_y = actc != ST_ACT_NONE && !relu_x && in_x && dx != nullptr;
    T wv[ST_WF], acc[ST_WF];
#pragma unroll
    for (int f = 0; f < ST_WF; ++f) {
        wv[f] = f < F && in_x && dx != nullptr ? w[f * K + k] : T(0);
        acc[f] = T(0);
    }
    constexpr int RT = ST_WBM / ST_WBG;   // rows per thread and stage
    for (int m0 = 0; m0 < M; m0 += ST_WBM) {
        const int n = min(ST_WBM, M - m0);
        T xv[RT], yv[RT];   // this stage's x (and yc) first, all at once (memory latency), then g's rows
#pragma unroll
        for (int t = 0; t < RT; ++t) {
            const int i = grp + t * ST_WBG;
            xv[t] = i >= n ? T(0) : ones ? T(1) : read_x ? x[(m0 + i) * K + k] : T(0);
            yv[t] = read_y && i < n ? yc[(m0 + i) * dx_row + dx_col] : T(0);
        }
        __syncthreads();   // the previous rows are consumed
        for (int e = threadIdx.x; e < ST_WBM * ST_WF; e += ST_WTHREADS) {
            const int i = e / ST_WF, f = e - i * ST_WF, m = m0 + i;
            T v = T(0);
            if (m < M && f < F) {
                v = dout[m * F + f];
                if (act != ST_ACT_NONE) v = act_bwd(v, y[m * ysm + f * ysf] + (b != nullptr ? b[f] : T(0)), act);
            }
            gs[i][f] = v;
        }
        __syncthreads();
#pragma unroll
        for (int t = 0; t < RT; ++t) {
            const int i = grp + t * ST_WBG;
            T s = T(0);
#pragma unroll
            for (int f = 0; f < ST_WF; f += 4) {   // the outputs up to F rounded up to 4 (gs is 0 past M and F)
                if (f >= F) break;
                T g[4];
                load4(&gs[i][f], g);
#pragma unroll
                for (int d = 0; d < 4; ++d) {
                    acc[f + d] += g[d] * xv[t];
                    s += g[d] * wv[f + d];
                }
            }
            if (dx != nullptr && in_x && i < n) {
                const int at = (m0 + i) * dx_row + dx_col;
                dx[at] = relu_x ? (xv[t] <= T(0) ? T(0) : s) : read_y ? act_bwd(s, yv[t] + cb, actc) : s;
            }
        }
    }
    if (dw == nullptr && db == nullptr) return;
    if (grp > 0) {
#pragma unroll
        for (int f = 0; f < ST_WF; ++f) red[grp - 1][f][col] = acc[f];
    }
    __syncthreads();
    if (grp != 0 || !(ones || (in_x && dw != nullptr))) return;
#pragma unroll
    for (int f = 0; f < ST_WF; ++f) {
        if (f >= F) break;
        T v = acc[f];
#pragma unroll
        for (int g = 0; g < ST_WBG - 1; ++g) v += red[g][f][col];
        if (ones) db[f] = v;
        else dw[f * K + k] = v;
    }
}

// wide_bwd asks for three resident blocks per SM in float32 (80 registers, 32 bytes of spill): it is latency-bound
// on the 18432-wide MnistCnn head, and the extra blocks hide more of it than the spill costs (H200, ncu, MnistCnn
// b64: 13.0 -> 10.1 us; captured step 137.8 -> 133.0 us). float64 keeps the plain bound (its registers double).
#define ST_WIDE_BWD_MIN_BLOCKS(T) (sizeof(T) == 4 ? 3 : 1)
#define ST_LINEAR(T, S)                                                                                            \
    extern "C" __global__ void __launch_bounds__(ST_LTHREADS)                                                      \
    linear_fwd_##S(const T* x, const T* w, const T* b, T* out, T* y, int M, int K, int F, int act) {               \
        ST_GRID_WAIT();                                                                                            \
        linear_fwd<T>(x, w, b, out, y, M, K, F, act);                                                              \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(ST_LTHREADS)                                                      \
    linear_bwd_##S(const T* dout, const T* y, const T* b, const T* x, const T* w, T* dx, T* dw, T* db, int M,      \
                   int K, int F, int ysm, int ysf, int act, int blocks_dx) {                                       \
        ST_GRID_WAIT();                                                                                            \
        linear_bwd<T>(dout, y, b, x, w, dx, dw, db, M, K, F, ysm, ysf, act, blocks_dx);                            \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(ST_LTHREADS)                                                      \
    chain_wgrad_##S(const T* g0, const T* g1, const T* g2, const T* g3, const T* x0, const T* x1, const T* x2,     \
                    const T* x3, T* dw0, T* dw1, T* dw2, T* dw3, T* db0, T* db1, T* db2, T* db3, int d0, int d1,   \
                    int d2, int d3, int d4, int t1, int t2, int t3, int M) {                                       \
        ST_GRID_WAIT();                                                                                            \
        chain_wgrad<T>(g0, g1, g2, g3, x0, x1, x2, x3, dw0, dw1, dw2, dw3, db0, db1, db2, db3, d0, d1, d2, d3, d4, \
                       t1, t2, t3, M);                                                                             \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(ST_WTHREADS)                                                      \
    wide_fwd_##S(const T* x, const T* w, const T* b, T* out, T* y, T* part, unsigned* counters, int M, int K,      \
                 int F, int act, int kchunk) {                                                                     \
        ST_GRID_WAIT();                                                                                            \
        wide_fwd<T>(x, w, b, out, y, part, counters, M, K, F, act, kchunk);                                        \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(ST_WTHREADS, ST_WIDE_BWD_MIN_BLOCKS(T))                          \
    wide_bwd_##S(const T* dout, const T* y, const T* b, const T* x, const T* w, T* dx, T* dw, T* db, int M, int K, \
                 int F, int ysm, int ysf, int act, int P, const T* yc, const T* bc, int actc) {                    \
        ST_GRID_WAIT();                                                                                            \
        wide_bwd<T>(dout, y, b, x, w, dx, dw, db, M, K, F, ysm, ysf, act, P, yc, bc, actc);                        \
    }
ST_INSTANTIATE(ST_LINEAR)
#undef ST_LINEAR
#undef ST_WIDE_BWD_MIN_BLOCKS

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
