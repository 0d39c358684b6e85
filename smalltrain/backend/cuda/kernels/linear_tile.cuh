// linear_tile.cuh: the 16 x 16 output tiles of C[i, j] = sum_l A(i, l) * Bt(j, l) that linear.cu's small layers and
// linear_chain.cu's weight gradients are made of. A block's 256 threads are 4 groups of 64, each group taking every
// 4th 32-long slice of l (staged in its own shared memory, the next one prefetched into registers while this one is
// used) with 4 outputs per thread; the 4 partial sums are added in a fixed order at the end. These layers are tiny
// (tens of thousands of outputs): splitting the reduction inside the block gives 4x the blocks of a 32 x 32 tiling
// and a quarter of its serial steps, which is what their latency is made of. Every output is summed in a fixed
// order: deterministic, no atomics, no split-K pass. Include it after common.cuh.
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
