// cross_entropy.cuh: the cross-entropy's work on one row and its one-launch 'mean' / 'sum' reduction, shared by
// loss.cu (cross_entropy_fwd, cross_entropy_fwd_reduce) and linear_chain.cu (chain_fwd_ce: the chain of linear layers
// with the cross-entropy of its output in its epilogue). The semantics are those in loss.cu's header. Include it after
// common.cuh.

// One row by one warp: x_r holds its C logits (class c at x_r[c * cs]; global or shared memory), t is its target.
// Writes the row's gradient at grad_r[c * cs], and the same times unit_scale at unit_r, where those are not null.
// Returns the row's loss in val and its target's weight in w_t, on lane 0. A target outside [0, C) that is not
// ignore_index is never read through: val, w_t and the gradient are NaN, and *bad is set to 1 (when bad != null;
// every writer stores the same value, so no atomic is needed). An ignored row gives 0 everywhere.
template <typename T>
__device__ __forceinline__ void ce_row(const T* x_r, i64 cs, i64 t, const T* __restrict__ w, i64 C, i64 ignore_index,
                                       T ls, int* __restrict__ bad, T* grad_r, T* unit_r, T unit_scale, T& val,
                                       T& w_t) {
    const int lane = threadIdx.x & 31;
    const bool ignored = t == ignore_index, valid = !ignored && t >= 0 && t < C;
    if (!valid) {  // warp-uniform branch: t is the same for every lane
        const T fill = ignored ? T(0) : st_nan<T>();
        if (lane == 0 && !ignored && bad != nullptr) *bad = 1;
        if (grad_r != nullptr)
            for (i64 c = lane; c < C; c += 32) {
                grad_r[c * cs] = fill;
                if (unit_r != nullptr) unit_r[c * cs] = ignored ? T(0) : fill * unit_scale;
            }
        val = fill;
        w_t = fill;
        return;
    }
    T m = st_neg_inf<T>();
    for (i64 c = lane; c < C; c += 32) m = st_max_nan(m, x_r[c * cs]);
    m = warp_max(m);
    T s = T(0), wsum = T(0);
    for (i64 c = lane; c < C; c += 32) {
        s += st_exp(x_r[c * cs] - m);
        wsum += w != nullptr ? w[c] : T(1);
    }
    s = warp_sum(s);
    wsum = warp_sum(wsum);
    const T log_s = st_log(s);
    w_t = w != nullptr ? w[t] : T(1);
    // third pass: the smoothing term sum_c w[c] * logp[c] (summed once log-sum-exp is known) and the gradient
    T smooth = T(0);
    if (ls != T(0) || grad_r != nullptr) {
        for (i64 c = lane; c < C; c += 32) {
            const T wc = w != nullptr ? w[c] : T(1);
            const T logp = (x_r[c * cs] - m) - log_s;
            smooth += wc * logp;
            if (grad_r != nullptr) {
                const T p = st_exp(logp);
                T g = (T(1) - ls) * w_t * (p - (c == t ? T(1) : T(0)));
                if (ls != T(0)) g += (ls / T(C)) * (p * wsum - wc);
                grad_r[c * cs] = g;
                if (unit_r != nullptr) unit_r[c * cs] = g * unit_scale;
            }
        }
        smooth = warp_sum(smooth);
    }
    if (lane == 0) {
        const T nll = -w_t * ((x_r[t * cs] - m) - log_s);
        val = (T(1) - ls) * nll;
        if (ls != T(0)) val += (ls / T(C)) * (-smooth);  // guarded: 0 * -inf would be NaN
    }
}

// The rows of layout [outer, C, inner], one warp each, grid-stride by warps: loss[r] and wt[r] per row (where not
// null); loss_sum, wt_sum: lane 0 of each warp adds up the loss and weight of its rows (0 on the other lanes). unit
// (with grad): also grad * unit_scale, 0 where the target is ignored (cross_entropy_bwd's dx for a gradient of 1).
template <typename T>
__device__ void ce_forward(const T* __restrict__ x, const i64* __restrict__ target, const T* __restrict__ w,
                           T* __restrict__ loss, T* __restrict__ wt, T* __restrict__ grad, i64 rows, i64 C, i64 inner,
                           i64 ignore_index, T ls, int* __restrict__ bad, T& loss_sum, T& wt_sum,
                           T* __restrict__ unit = nullptr, T unit_scale = T(0)) {
    const int lane = threadIdx.x & 31;
    const i64 warps = blockDim.x >> 5;
    for (i64 r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += gridDim.x * warps) {
        const i64 base = (r / inner) * C * inner + r % inner;
        T val, w_t;
        ce_row<T>(x + base, inner, target[r], w, C, ignore_index, ls, bad, grad != nullptr ? grad + base : nullptr,
                  unit != nullptr ? unit + base : nullptr, unit_scale, val, w_t);
        if (lane == 0) {
            if (loss != nullptr) loss[r] = val;
            if (wt != nullptr) wt[r] = w_t;
            loss_sum += val;
            wt_sum += w_t;
        }
    }
}

// This thread's share of the sum of every target's weight (block_sum adds the shares up): the 'mean' divisor a unit
// gradient is scaled by, summed by each block itself in the same order (a few hundred loads), so that each can write
// its rows' unit gradient while it computes them.
template <typename T>
__device__ __forceinline__ T ce_weights_share(const i64* __restrict__ target, const T* __restrict__ w, i64 rows,
                                              i64 C, i64 ignore_index) {
    T s = T(0);
    for (i64 r = threadIdx.x; r < rows; r += blockDim.x) {
        const i64 t = target[r];
        s += t == ignore_index ? T(0) : t < 0 || t >= C ? st_nan<T>() : w != nullptr ? w[t] : T(1);
    }
    return s;
}

// The end of a one-launch reduction over `slots` blocks (a block per slot): l and wv are this thread's shares of the
// block's loss and weight sums, which go to partial[2 * slot]; the block that finishes last (a ticket from *counter,
// which it resets to 0) adds the slots' sums in slot order into out[0], divided for 'mean' by the total weight,
// which goes to wsum[0] (with a unit gradient, the total all_w it was scaled by). Every thread of the block must call
// it. scratch (one value per warp) and ticket: shared memory, the caller's (block_sum).
template <typename T>
__device__ void ce_reduce_blocks(T l, T wv, bool unit, T all_w, T* __restrict__ partial,
                                 unsigned* __restrict__ counter, int mean, T* __restrict__ out, T* __restrict__ wsum,
                                 unsigned slot, unsigned slots, T* scratch, unsigned* ticket) {
    l = block_sum(l, scratch);
    wv = block_sum(wv, scratch);
    if (threadIdx.x == 0) {
        partial[2 * slot] = l;
        partial[2 * slot + 1] = wv;
    }
    // (its fence makes the sums visible to the last block)
    if (!st_last_to_arrive(counter, slots, ticket)) return;
    l = T(0);
    wv = T(0);
    for (unsigned b = threadIdx.x; b < slots; b += blockDim.x) {   // L2 reads: other blocks wrote them
        l += __ldcg(partial + 2 * b);
        wv += __ldcg(partial + 2 * b + 1);
    }
    l = block_sum(l, scratch);
    wv = block_sum(wv, scratch);
    if (unit) wv = all_w;   // the divisor the unit gradient used: the backward's too
    if (threadIdx.x == 0) {
        out[0] = mean ? l / wv : l;
        if (mean) wsum[0] = wv;
        *counter = 0u;
    }
}

// cross_entropy_fwd_reduce: ce_forward over the grid and the reduction in one launch.
template <typename T>
__device__ void ce_forward_reduce(const T* __restrict__ x, const i64* __restrict__ target, const T* __restrict__ w,
                                  T* __restrict__ loss, T* __restrict__ wt, T* __restrict__ grad, i64 rows, i64 C,
                                  i64 inner, i64 ignore_index, T ls, int* __restrict__ bad, T* __restrict__ partial,
                                  unsigned* __restrict__ counter, int mean, T* __restrict__ out,
                                  T* __restrict__ wsum, T* __restrict__ unit) {
    __shared__ T scratch[32];
    __shared__ unsigned ticket;
    T all_w = T(0);
    if (unit != nullptr && mean) all_w = block_sum(ce_weights_share<T>(target, w, rows, C, ignore_index), scratch);
    T l = T(0), wv = T(0);
    ce_forward<T>(x, target, w, loss, wt, grad, rows, C, inner, ignore_index, ls, bad, l, wv, unit,
                  T(1) / (mean ? all_w : T(1)));
    ce_reduce_blocks<T>(l, wv, unit != nullptr, all_w, partial, counter, mean, out, wsum, blockIdx.x, gridDim.x,
                        scratch, &ticket);
}
