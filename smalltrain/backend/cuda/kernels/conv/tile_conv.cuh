// conv/tile_conv.cuh: the tile_conv template (stride-1, undilated, groups == 1, square 3x3 / 5x5 convolutions from
// an input tile and all the weights staged in shared memory), instantiated by tile.cu (w staged by the kernel) and
// tile_arranged.cu (w arranged beforehand by tile_arrange). See tile_common.cuh for its layouts and epilogues.
#include "tile_common.cuh"

template <typename T, int KS, int TO, int EPI, bool ARR>
__device__ void tile_conv(const T* __restrict__ in, const T* __restrict__ w, const T* __restrict__ b,
                          T* __restrict__ out, T* __restrict__ y, int N, int C, int Hi, int Wi, int in_sn, int in_sc,
                          int O, int Ho, int Wo, int pt, int pl, int TH, int CS, int transposed, int into,
                          int act, const T* __restrict__ lw, const T* __restrict__ lb, T* __restrict__ lout,
                          T* __restrict__ lpart, unsigned* lcount, int F, i64* __restrict__ pidx,
                          const T* __restrict__ px, int pH, int pW, int ppt, int ppl, T* __restrict__ wpart,
                          int vstage, int wrun) {
    static_assert(KS >= 1 && KS <= 5 && (TO % 4 == 0 || TO == 6),
                  "tile_conv: KS <= 5 (8 x values per row cover TW + KS - 1), TO a multiple of 4 or 6");
    // TS: the shared-memory slots a thread's TO weights of one tap take, a multiple of 4 for aligned vector loads.
    // TO = 6 (six channels, where 4 or 8 a thread would compute 2 dead ones) reads a 4-vector and a 2-vector of 8.
    constexpr int TS = (TO + 3) / 4 * 4;
    // KEEP: the activated outputs (WGRAD: the g values) stay in acc for the epilogue, and every thread reaches its
    // block-wide steps
    constexpr bool LIN = EPI == ST_EPI_LINEAR, POOL = EPI == ST_EPI_POOL, WGRAD = EPI == ST_EPI_WGRAD;
    constexpr bool UNPOOL_WG = EPI == ST_EPI_UNPOOL_WGRAD, UNPOOL = EPI == ST_EPI_UNPOOL || UNPOOL_WG;
    constexpr bool KEEP = LIN || POOL || WGRAD || UNPOOL_WG;
    extern __shared__ unsigned char st_smem[];
    const int CG = (Wo + ST_TW - 1) / ST_TW, OG = (O + TO - 1) / TO, OP = OG * TS, KK = KS * KS, K = C * KK;
    const int WP = CG * ST_TW + 4, RP = TH + KS - 1, tiles = (Ho + TH - 1) / TH;
    const int n = blockIdx.x / tiles, r0 = (blockIdx.x - n * tiles) * TH;
    // UNPOOL_WG: the producer's pooling indices and x that its epilogue reads (see there) are staged with the tiles
    // and land during the main loop, instead of two global round trips after it while the other splits wait at a
    // barrier (the ncu source page at b512: 14% of the kernel's warp samples there); at the start of the shared
    // memory, the rest after them
    const int XR = 2 * TH + KS - 1, XC = 2 * Wo + KS - 1;
    i64* ps = reinterpret_cast<i64*>(st_smem);             // [O][TH][Wo]: the maxima's flat indices
    T* xs2 = reinterpret_cast<T*>(ps + O * TH * Wo);        // [XR][XC]: x under the producer's rows 2*r0 ..
    unsigned char* smem = st_smem + (UNPOOL_WG ? st_unpool_prefetch_bytes<T>(O, TH, Wo, KS) : 0);
    T* ws = reinterpret_cast<T*>(smem);      // [K][OP]: tap k = (c*KS + i)*KS + j, group og's channels at og*TS..
    T* xs = ws + K * OP;                     // [C][RP][WP]: rows r0 - pt .. r0 - pt + RP - 1, columns -pl ..
    // staged by cp.async (common.cuh): the weights in shared memory's order (consecutive threads write consecutive
    // words; their strided reads of w hit L1 after the first), x by rows; coordinates by st_walk3
    auto slot_channel = [&](int slot) { return st_tile_slot_channel(slot, TO, O); };
    auto weight_index = [&](int k, int o) { return st_tile_weight_index(k, o, O, K, KK, transposed); };
    if constexpr (ARR) {   // w arranged in this layout already (tile_arrange; 16-byte aligned): 16-byte copies
        constexpr int V = 16 / sizeof(T);   // (K * OP is a multiple of 4)
        for (int e = threadIdx.x; e < K * OP / V; e += blockDim.x) st_async_copy_vec<16>(ws + e * V, w + e * V, true);
    } else if (blockDim.x % (OP * wrun) == 0) {
        // a thread's slot is the same in every copy, only the tap advances: no carries or slot arithmetic per copy
        // (the general walk's ~36 instructions a copy were 11% of LeNet-5 b512's input-gradient kernel; ncu, H100:
        // 36.7 -> 35.2 us, the second layer's forward 14.3 -> 13.0). Consecutive threads take runs of wrun
        // consecutive taps of one slot (conv/tile.py _tile_weight_run): a tap's slots lie K elements apart in w (the
        // input gradient's: KS*KS), so a warp over 32 slots of one tap reads 32 sectors, one over 32 / wrun slots'
        // runs about that many; the runs' shared-memory words share banks wrun ways where OP is a multiple of 32.
        const int run = OP * wrun, q = threadIdx.x % run, slot = q / wrun, o = slot_channel(slot);
        const int kstep = blockDim.x / OP;
        for (int k = threadIdx.x / run * wrun + q - slot * wrun; k < K; k += kstep)
            st_async_copy(ws + k * OP + slot, w + (o >= 0 ? weight_index(k, o) : 0), o >= 0);
    } else {
        st_walk3 wk(1 << 30, OP);   // (0, k, slot)
        for (int e = threadIdx.x; e < K * OP; e += blockDim.x, wk.next()) {
            const int o = slot_channel(wk.c);
            st_async_copy(ws + e, w + (o >= 0 ? weight_index(wk.b, o) : 0), o >= 0);
        }
    }
    // the input's rows vstage bytes a copy (16, 8 or one element: conv/tile.py _tile_vec_stage)
    st_stage_window_bytes(vstage, xs, in + n * in_sn, C, RP, WP, C, in_sc, Hi, Wi, r0 - pt, -pl);
    if (UNPOOL_WG) {   // the tiles' copies a group waited for now, the prefetch's another, waited for after the loop
        st_async_commit();
        const int rows = min(TH, Ho - r0);
        st_walk3 pw(1 << 30, rows * Wo);   // (0, channel, position in the block's rows)
        for (int e = threadIdx.x; e < O * rows * Wo; e += blockDim.x, pw.next())
            st_async_copy(ps + pw.b * TH * Wo + pw.c, pidx + ((size_t)(n * O + pw.b) * Ho + r0) * Wo + pw.c, true);
        // x[2*r0 - ppt + row, column - ppl], 0 outside
        st_stage_window<int(sizeof(T))>(xs2, px + (size_t)n * pH * pW, 1, XR, XC, 1, 0, pH, pW, 2 * r0 - ppt, -ppl);
        st_async_commit();
        st_async_wait_but_last();
    } else {
        st_async_wait();
    }
    __syncthreads();
    // CS channel splits: thread group cs (whole warps where G is a multiple of 32) sums the input channels
    // [cs*C/CS, (cs+1)*C/CS); the groups' sums are added in cs order at the end
    const int G = CG * TH * OG, cs = threadIdx.x / G, tid = threadIdx.x - cs * G;
    const int cg = tid % CG, rt = tid / CG, row = rt % TH, og = rt / TH, r = r0 + row;
    T acc[TO][ST_TW];
#pragma unroll
    for (int u = 0; u < TO; ++u)
#pragma unroll
        for (int v = 0; v < ST_TW; ++v) acc[u][v] = T(0);
    const T* xrow = xs + row * WP + cg * ST_TW;
    const T* wcol = ws + og * TS;
    for (int c = cs * C / CS, c_end = (cs + 1) * C / CS; c < c_end; ++c) {
#pragma unroll
        for (int i = 0; i < KS; ++i) {
            T xv[8];
            const T* xp = xrow + (c * RP + i) * WP;
            load4(xp, xv);
            if (KS > 1) load4(xp + 4, xv + 4);
#pragma unroll
            for (int j = 0; j < KS; ++j) {
                T wv[TO];
                const T* wk = wcol + ((c * KS + i) * KS + j) * OP;
#pragma unroll
                for (int u = 0; u < TO; u += 4) {
                    if (u + 4 <= TO) load4(wk + u, wv + u);
                    else load2(wk + u, wv + u);
                }
#pragma unroll
                for (int u = 0; u < TO; ++u)
#pragma unroll
                    for (int v = 0; v < ST_TW; ++v) acc[u][v] += wv[u] * xv[v + j];
            }
        }
    }
    if (UNPOOL_WG) st_async_wait();   // the prefetch, published by the barrier below
    if (CS > 1 || UNPOOL_WG) __syncthreads();
    if (CS > 1) {   // the other groups' sums through shared memory (the staged tiles are read by now)
        T* red = reinterpret_cast<T*>(smem);   // [CS - 1][G][TO * ST_TW]
        if (cs > 0) {
#pragma unroll
            for (int u = 0; u < TO; ++u)
#pragma unroll
                for (int v = 0; v < ST_TW; ++v) red[((cs - 1) * G + tid) * TO * ST_TW + u * ST_TW + v] = acc[u][v];
        }
        __syncthreads();
        if (!KEEP && cs > 0) return;
        if (cs == 0) {
            for (int k = 1; k < CS; ++k)
#pragma unroll
                for (int u = 0; u < TO; ++u)
#pragma unroll
                    for (int v = 0; v < ST_TW; ++v)
                        acc[u][v] += red[((k - 1) * G + tid) * TO * ST_TW + u * ST_TW + v];
        }
    }
    // the outputs of the threads of split 0 on rows of the image (the last tile's rows may lie past it); with KEEP no
    // thread returns before the epilogue's block-wide steps
    if (!KEEP && r >= Ho) return;
    const bool live = cs == 0 && r < Ho;
    const int P = Ho * Wo, s0 = cg * ST_TW;
    // the 4 columns in one store where every row starts aligned (Wo a multiple of 4), in two where rows start at even
    // columns, else one by one: a warp's scalar stores 4 columns apart use a quarter of each 32-byte sector
    const int vec = Wo % ST_TW == 0 ? 4 : Wo % 2 == 0 ? 2 : 1;
    const bool lin_vec = LIN && vec == 4 && reinterpret_cast<size_t>(lw) % (4 * sizeof(T)) == 0;
#pragma unroll
    for (int u = 0; u < TO; ++u) {
        const int o = og * TO + u;
        if (UNPOOL_WG || !live || o >= O) break;   // (UNPOOL_WG: below)
        T pre[ST_TW], val[ST_TW];
        const T bo = b != nullptr ? b[o] : T(0);
        T* yrow = y != nullptr ? y + (o * N + n) * P + r * Wo + s0 : nullptr;
        T* orow;
        if (UNPOOL && into == 1) {   // through the producer's pooling: its g at twice the rows and columns
            const int FW = 2 * Wo;
            const T* zp = y != nullptr ? y + (size_t)(o * N + n) * 4 * P : nullptr;
            const i64* ip = pidx + ((n * O + o) * Ho + r) * Wo + s0;
            T top[2 * ST_TW], bot[2 * ST_TW];   // rows 2r and 2r + 1, columns 2*s0 ..
#pragma unroll
            for (int v = 0; v < ST_TW; ++v) {
                const int p = 2 * r * FW + 2 * (s0 + v);   // the window's first position
                const int at = s0 + v < Wo ? (int)ip[v] : -1;   // -1: past the row, zeros (not stored)
                T win[4];
                pooled_act_grads_2x2(acc[u][v], at, p, FW, zp, bo, act, win);
                top[2 * v] = win[0];
                top[2 * v + 1] = win[1];
                bot[2 * v] = win[2];
                bot[2 * v + 1] = win[3];
            }
            T* gp = out + (size_t)(o * N + n) * 4 * P + 2 * r * FW + 2 * s0;
            if (FW % 4 == 0 && s0 + ST_TW <= Wo) {   // 8 columns of each row in two aligned vectors
                store4(gp, top);
                store4(gp + 4, top + 4);
                store4(gp + FW, bot);
                store4(gp + FW + 4, bot + 4);
            } else {
#pragma unroll
                for (int v = 0; v < 2 * ST_TW; ++v) {
                    if (2 * s0 + v >= FW) break;
                    gp[v] = top[v];
                    gp[FW + v] = bot[v];
                }
            }
            continue;
        }
        if (into) {   // the producer's g [O, N*P]: dx * act'(y + b), y and b the producer's (read, not written)
            // UNPOOL, into == 2: compact, the producer's g at its pooling windows' maxima only, [O, N*P] in the
            // pooled positions (y [O, N, 4P] read there), for pooled_wgrad
            const T* zp = UNPOOL && y != nullptr ? y + (size_t)(o * N + n) * 4 * P : nullptr;
            const i64* ip = UNPOOL ? pidx + ((n * O + o) * Ho + r) * Wo + s0 : nullptr;
#pragma unroll
            for (int v = 0; v < ST_TW; ++v) {
                pre[v] = acc[u][v];
                if (ip != nullptr) {
                    bool exact;   // (unused: dw and db are NaN wherever a maximum's z is not finite either way)
                    val[v] = s0 + v < Wo ? pooled_act_max_grad(pre[v], (int)ip[v], zp, bo, act, exact) : pre[v];
                } else {
                    val[v] = act == ST_ACT_NONE || s0 + v >= Wo ? pre[v] : act_bwd(pre[v], yrow[v] + bo, act);
                }
            }
            orow = out + (o * N + n) * P + r * Wo + s0;
            yrow = nullptr;
            if (WGRAD) {   // the producer's g for its weight gradient, 0 past the row
#pragma unroll
                for (int v = 0; v < ST_TW; ++v) acc[u][v] = s0 + v < Wo ? val[v] : T(0);
            }
        } else {
#pragma unroll
            for (int v = 0; v < ST_TW; ++v) {
                pre[v] = acc[u][v];
                val[v] = act_fwd(b != nullptr ? pre[v] + bo : pre[v], act);
            }
            orow = out + ((n * O + o) * Ho + r) * Wo + s0;
            if (KEEP) {   // kept for the linear layer's sums or the pooling
#pragma unroll
                for (int v = 0; v < ST_TW; ++v) acc[u][v] = val[v];
            }
            if (POOL) {   // y only: the pooled values are written below
#pragma unroll
                for (int v = 0; v < ST_TW; ++v)
                    if (yrow != nullptr && s0 + v < Wo) yrow[v] = pre[v];
                continue;
            }
        }
        if (vec == 4) {
            store4(orow, val);
            if (yrow != nullptr) store4(yrow, pre);
            continue;
        }
        if (vec == 2) {   // Wo even: a thread's pairs are whole (s0 + 1 < Wo where s0 < Wo)
#pragma unroll
            for (int v = 0; v < ST_TW; v += 2) {
                if (s0 + v >= Wo) break;
                store2(orow + v, val + v);
                if (yrow != nullptr) store2(yrow + v, pre + v);
            }
            continue;
        }
#pragma unroll
        for (int v = 0; v < ST_TW; ++v) {
            if (s0 + v >= Wo) break;
            orow[v] = val[v];
            if (yrow != nullptr) yrow[v] = pre[v];
        }
    }
    if (UNPOOL_WG) {   // the pooled producer's weight and bias gradients (see above)
        constexpr int KK = KS * KS, KB = KK + 1;
        const int rows = min(TH, Ho - r0), E = TH * Wo, FW = 2 * Wo;
        const int S = st_unpool_wgrad_slices(blockDim.x, O);
        T* gs = reinterpret_cast<T*>(smem);                   // [O][TH][Wo]: the g at the maxima
        T* red = gs + O * E;                                  // [O][S][KB]: the slices' sums
        int* ax = reinterpret_cast<int*>(red + O * S * KB);   // [O][TH][Wo]: a maximum's (row, column) in xs2
        unsigned char* nan_tap = reinterpret_cast<unsigned char*>(ax + O * E);   // [O][KK]
        __syncthreads();   // the staged tiles and the splits' sums are read
        for (int e = threadIdx.x; e < O * KK; e += blockDim.x) nan_tap[e] = 0;
        if (live) {   // the g at the maxima (before the producer's activation)
#pragma unroll
            for (int u = 0; u < TO; ++u)
#pragma unroll
                for (int v = 0; v < ST_TW; ++v)
                    if (og * TO + u < O && s0 + v < Wo) gs[((og * TO + u) * TH + row) * Wo + s0 + v] = acc[u][v];
        }
        __syncthreads();
        // spread over the whole block, ZR windows a thread at a time (their z loads in flight together: one memory
        // latency, not one a window): each maximum's offset in x's tile (ax) and, with an activation, its g through
        // the producer's activation, act_bwd(g, z + b) as pooled_act_max_grad. Split 0's threads did this for their
        // TO x 4 outputs before: every thread of the block ran the 16 act_bwd (GELU: erf and exp) and 16 divisions,
        // a third of them live (LeNet-5 b512: 3 splits; ncu's source page, H100: the epilogue's straight-line part
        // was 30% of the kernel's instructions).
        constexpr int ZR = 8;
        const int WN = rows * Wo;   // the block's windows a channel
        st_walk3 qw(1 << 30, WN);   // (0, channel, window of the block's rows) of e = threadIdx.x, + blockDim.x, ...
        for (int e0 = threadIdx.x; e0 < O * WN; e0 += ZR * blockDim.x) {
            int q[ZR], oc[ZR], at[ZR];
            T z[ZR];
#pragma unroll
            for (int k = 0; k < ZR; ++k, qw.next()) {
                const bool in = e0 + k * blockDim.x < O * WN;
                oc[k] = qw.b;
                q[k] = qw.b * E + qw.c;
                at[k] = in ? (int)ps[q[k]] : 0;
                z[k] = act != ST_ACT_NONE && in ? y[(size_t)(qw.b * N + n) * 4 * P + at[k]] : T(0);
            }
#pragma unroll
            for (int k = 0; k < ZR; ++k) {
                if (e0 + k * blockDim.x >= O * WN) break;
                const int h = at[k] / FW;   // its row in the producer's output, then xs2's offset
                ax[q[k]] = (h - 2 * r0) * XC + at[k] - h * FW;
                if (act != ST_ACT_NONE)
                    gs[q[k]] = act_bwd(gs[q[k]], z[k] + (b != nullptr ? b[oc[k]] : T(0)), act);
            }
        }
        __syncthreads();
        // the taps pairing a non-finite x with a position of the block's rows other than its window's maximum (its g
        // 0; 0 * inf and 0 * NaN are NaN in the dense sum), as pooled_wgrad
        for (int e = threadIdx.x; e < XR * XC; e += blockDim.x) {
            if (isfinite(xs2[e])) continue;
            const int a = e / XC, c = e - a * XC;
            for (int i = 0; i < KS; ++i)
                for (int j = 0; j < KS; ++j) {
                    const int r = a - i, s = c - j;   // the position (rows from 2*r0) whose tap (i, j) reads it
                    if (r < 0 || r >= 2 * rows || s < 0 || s >= FW) continue;
                    for (int oc = 0; oc < O; ++oc)
                        if (ax[(oc * TH + r / 2) * Wo + s / 2] != r * XC + s) nan_tap[oc * KK + i * KS + j] = 1;
                }
        }
        // slice sl of channel oc: the block's windows sl, sl + S, ..., each one g and offset read for its KS*KS taps
        // (immediate offsets from the window's corner) and the bias, KB sums in registers
        for (int q = threadIdx.x; q < O * S; q += blockDim.x) {
            const int oc = q / S, sl = q - oc * S;
            T sum[KB];
#pragma unroll
            for (int k = 0; k < KB; ++k) sum[k] = T(0);
            for (int e = sl; e < rows * Wo; e += S) {
                const T gv = gs[oc * E + e];
                const T* xw = xs2 + ax[oc * E + e];
#pragma unroll
                for (int i = 0; i < KS; ++i)
#pragma unroll
                    for (int j = 0; j < KS; ++j) sum[i * KS + j] += gv * xw[i * XC + j];
                sum[KK] += gv;
            }
#pragma unroll
            for (int k = 0; k < KB; ++k) red[q * KB + k] = sum[k];
        }
        __syncthreads();
        for (int m = threadIdx.x; m < O * KB; m += blockDim.x) {   // the slices in order
            const int oc = m / KB, k = m - oc * KB;
            T sum = T(0);
            for (int sl = 0; sl < S; ++sl) sum += red[(oc * S + sl) * KB + k];
            if (k < KK && nan_tap[oc * KK + k]) sum += T(0) * st_neg_inf<T>();   // NaN
            wpart[(size_t)blockIdx.x * O * KB + m] = sum;
        }
        return;
    }
    if (WGRAD) {   // the producer's weight and bias gradients (see above)
        constexpr int KB = KS * KS + 1, XW = ST_TW + KS - 1;
        const int G0 = CG * TH * OG;   // split 0's threads, those of channel group og at [og*TH*CG, (og+1)*TH*CG)
        T xv[KS][XW];   // the producer's input under this thread's 4 columns, zero outside the image
        const T* pxn = px + (size_t)n * pH * pW;
#pragma unroll
        for (int i = 0; i < KS; ++i)
#pragma unroll
            for (int j = 0; j < XW; ++j) {
                const int rr = r + i - ppt, cc = s0 + j - ppl;
                xv[i][j] = live && rr >= 0 && rr < pH && cc >= 0 && cc < pW ? pxn[rr * pW + cc] : T(0);
            }
        T* red = reinterpret_cast<T*>(st_smem);   // [TO][KB][G0] (the staged tiles and the splits' sums are read)
        __syncthreads();
        if (cs == 0) {
#pragma unroll
            for (int u = 0; u < TO; ++u) {
                const bool on = live && og * TO + u < O;
                T sb = T(0);
#pragma unroll
                for (int v = 0; v < ST_TW; ++v) sb += acc[u][v];
#pragma unroll
                for (int i = 0; i < KS; ++i)
#pragma unroll
                    for (int j = 0; j < KS; ++j) {
                        T sum = T(0);
#pragma unroll
                        for (int v = 0; v < ST_TW; ++v) sum += acc[u][v] * xv[i][j + v];
                        red[(u * KB + i * KS + j) * G0 + tid] = on ? sum : T(0);
                    }
                red[(u * KB + KB - 1) * G0 + tid] = on ? sb : T(0);
            }
        }
        __syncthreads();
        const int per = TH * CG;
        for (int q = threadIdx.x; q < OG * TO * KB; q += blockDim.x) {
            const int g = q / (TO * KB), u = (q - g * TO * KB) / KB, t = q - g * TO * KB - u * KB, o = g * TO + u;
            if (o >= O) continue;
            const T* src = red + (u * KB + t) * G0 + g * per;
            T sum = T(0);
            for (int k = 0; k < per; ++k) sum += src[k];
            wpart[(size_t)blockIdx.x * O * KB + o * KB + t] = sum;
        }
        return;
    }
    if (POOL) {   // odd rows hand their outputs to the row above, even rows pool
        T* xch = reinterpret_cast<T*>(st_smem);   // [G][TO][ST_TW] (split 0's threads; the tiles are read by now)
        __syncthreads();
        if (live && (row & 1)) {
#pragma unroll
            for (int u = 0; u < TO; ++u)
#pragma unroll
                for (int v = 0; v < ST_TW; ++v) xch[(tid * TO + u) * ST_TW + v] = acc[u][v];
        }
        __syncthreads();
        if (!live || (row & 1)) return;
        const T* below = xch + (tid + CG) * TO * ST_TW;   // row r + 1, same columns (TH even: in this tile)
        const int PW = Wo / 2, PH = Ho / 2;
#pragma unroll
        for (int u = 0; u < TO; ++u) {
            const int o = og * TO + u;
            if (o >= O) break;
#pragma unroll
            for (int q = 0; q < ST_TW / 2; ++q) {
                const int s = s0 + 2 * q;
                if (s >= Wo) break;   // Wo even: a window is whole or past the row
                const T win[4] = {acc[u][2 * q], acc[u][2 * q + 1], below[u * ST_TW + 2 * q],
                                  below[u * ST_TW + 2 * q + 1]};
                const int pos[4] = {r * Wo + s, r * Wo + s + 1, (r + 1) * Wo + s, (r + 1) * Wo + s + 1};
                T best = st_neg_inf<T>();
                int at = pos[0];
#pragma unroll
                for (int e = 0; e < 4; ++e) st_argmax_step(win[e], pos[e], best, at);
                const int k = ((n * O + o) * PH + r / 2) * PW + s / 2;
                out[k] = best;
                pidx[k] = at;
            }
        }
        return;
    }
    if (LIN) {   // this thread's outputs times the linear layer's weights, then the block's and the image's sums
        T lsum[ST_LF] = {};   // (linear_sums sets the first F)
        linear_sums<T, TO>(acc, lw + og * TO * P + r * Wo + s0, O * P, P, live ? min(TO, O - og * TO) : 0, Wo - s0,
                           F, lin_vec, lsum);
        linear_finish<T>(lsum, lb, lout, lpart, lcount, F, n, blockIdx.x - n * tiles, tiles);
    }
}
