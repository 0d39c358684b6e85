// linear_wide.cu: wide layers, few outputs over a long reduction (MnistCnn's Linear(18432, 10)), one launch each
// way, for float32 (_f32) and float64 (_f64).
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
#include "common.cuh"

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

// wide_bwd asks for three resident blocks per SM in float32 (80 registers, a little spill): it is latency-bound on
// the 18432-wide MnistCnn head, and the extra blocks hide more of it than the spill costs. float64 keeps the plain
// bound (its registers double).
#define ST_WIDE_BWD_MIN_BLOCKS(T) (sizeof(T) == 4 ? 3 : 1)
#define ST_WIDE(T, S)                                                                                              \
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
ST_INSTANTIATE(ST_WIDE)
#undef ST_WIDE
#undef ST_WIDE_BWD_MIN_BLOCKS
