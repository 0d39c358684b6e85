"""GPU time of the linear-chain kernels (kernels/linear_chain.cu chain_*) against the per-layer kernels they replace,
for LeNet-5's head, over block sizes, outputs per warp (ST_CJW) and rows per block.

Run (GPU): python3 benchmarks/chain_variants.py [--batches 64,512] [--all]
Each figure: GPU time per call from 100 calls captured in one CUDA graph (see timed). --all also sweeps the
shipped kernels' block size and outputs per warp. Not yet run in this form (see RESULTS.md).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import timed  # noqa: E402


# A prototype for Hopper (sm_90) thread-block clusters: 8 blocks share R rows, each computes 1/8 of every layer's
# outputs (reading 1/8 of the weights), and the blocks exchange their slices through distributed shared memory
# between layers (cluster barriers), so the weights are read once per cluster instead of once per block.
CLUSTER_SRC = r"""
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}
__device__ __forceinline__ float ld_remote(const float* p, unsigned rank) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p), ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(ra) : "memory");
    return v;
}
template <int RR, int JW>
__device__ void chainc_fwd(const float* x, const float* w0, const float* w1, const float* w2, const float* b0,
                           const float* b1, const float* b2, float* out, int M, int d0, int d1, int d2, int d3,
                           int a0, int a1, int a2) {
    __shared__ float acts[RR][256];
    __shared__ float part[RR][32];
    const unsigned rank = cluster_rank();
    const int r0 = (blockIdx.x / 8) * RR, nr = min(RR, M - r0);
    for (int e = threadIdx.x; e < RR * d0; e += blockDim.x) {
        const int r = e / d0, k = e - r * d0;
        acts[r][k] = r < nr ? x[(r0 + r) * d0 + k] : 0.f;
    }
    __syncthreads();
    const float* W[3] = {w0, w1, w2};
    const float* B[3] = {b0, b1, b2};
    const int D[4] = {d0, d1, d2, d3}, A[3] = {a0, a1, a2};
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int l = 0; l < 3; ++l) {
        const int K = D[l], F = D[l + 1], per = (F + 7) / 8, jb = rank * per, je = min(F, jb + per);
        for (int j0 = jb + warp * JW; j0 < je; j0 += nwarps * JW) {
            float acc[JW][RR];
#pragma unroll
            for (int u = 0; u < JW; ++u)
#pragma unroll
                for (int r = 0; r < RR; ++r) acc[u][r] = 0.f;
#pragma unroll 4
            for (int k = lane; k < K; k += 32) {
                float wv[JW];
#pragma unroll
                for (int u = 0; u < JW; ++u) wv[u] = j0 + u < je ? W[l][(j0 + u) * K + k] : 0.f;
#pragma unroll
                for (int r = 0; r < RR; ++r) {
                    const float a = acts[r][k];
#pragma unroll
                    for (int u = 0; u < JW; ++u) acc[u][r] += a * wv[u];
                }
            }
            float v = 0.f;
#pragma unroll
            for (int u = 0; u < JW; ++u)
#pragma unroll
                for (int r = 0; r < RR; ++r) {
                    float s = acc[u][r];
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                    if (lane == u * RR + r) v = s;
                }
            const int u = lane / RR, r = lane - u * RR, j = j0 + u;
            if (u < JW && j < je) {
                v = act_fwd(v + B[l][j], A[l]);
                if (l == 2) { if (r < nr) out[(r0 + r) * F + j] = v; }
                else part[r][j - jb] = v;
            }
        }
        if (l == 2) break;
        cluster_sync();   // every slice written
        for (int e = threadIdx.x; e < RR * F; e += blockDim.x) {
            const int r = e / F, j = e - r * F, src = j / per;
            acts[r][j] = ld_remote(&part[r][j - src * per], src);
        }
        cluster_sync();   // every slice read before the next layer overwrites part
    }
}
#define CH(RR, JW) extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(256) \
    chainc_fwd_r##RR##_j##JW(const float* x, const float* w0, const float* w1, const float* w2, const float* b0, \
    const float* b1, const float* b2, float* out, int M, int d0, int d1, int d2, int d3, int a0, int a1, int a2) { \
    chainc_fwd<RR, JW>(x, w0, w1, w2, b0, b1, b2, out, M, d0, d1, d2, d3, a0, a1, a2); }
CH(1, 1) CH(1, 2) CH(2, 1) CH(2, 2) CH(4, 1) CH(4, 2) CH(8, 1) CH(8, 2)

// backward through the rows: block `rank` computes dh for its 1/8 of each layer's inputs (lanes over those
// inputs, the 8 warps over residues of the reduction index, a fixed-order sum in shared memory), the slices
// exchanged through distributed shared memory between layers
template <int RR>
__device__ void chainc_bwd(const float* dout, const float* w0, const float* w1, const float* w2, const float* z0,
                           const float* z1, const float* z2, float* g0, float* g1, float* g2, float* dx, int M,
                           int d0, int d1, int d2, int d3, int a0, int a1, int a2) {
    __shared__ float gfull[RR][256];
    __shared__ float part[RR][32];
    __shared__ float red[8][RR][32];
    const unsigned rank = cluster_rank();
    const int r0 = (blockIdx.x / 8) * RR, nr = min(RR, M - r0);
    const float* W[3] = {w0, w1, w2};
    const float* Z[3] = {z0, z1, z2};
    float* G[3] = {g0, g1, g2};
    const int D[4] = {d0, d1, d2, d3}, A[3] = {a0, a1, a2};
    for (int e = threadIdx.x; e < RR * d3; e += blockDim.x) {
        const int r = e / d3, j = e - r * d3;
        float v = 0.f;
        if (r < nr) {
            v = dout[(r0 + r) * d3 + j];
            if (a2) v = act_bwd(v, z2[(r0 + r) * d3 + j], a2);
            if (rank == 0) g2[(r0 + r) * d3 + j] = v;
        }
        gfull[r][j] = v;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int l = 2; l >= 0; --l) {
        const int K = D[l], F = D[l + 1], per = (K + 7) / 8, kb = rank * per, ke = min(K, kb + per), k = kb + lane;
        float acc[RR];
#pragma unroll
        for (int r = 0; r < RR; ++r) acc[r] = 0.f;
        if (k < ke && lane < per) {
#pragma unroll 8
            for (int j = warp; j < F; j += 8) {
                const float wv = W[l][j * K + k];
#pragma unroll
                for (int r = 0; r < RR; ++r) acc[r] += gfull[r][j] * wv;
            }
        }
#pragma unroll
        for (int r = 0; r < RR; ++r) red[warp][r][lane] = acc[r];
        __syncthreads();
        if (warp == 0 && k < ke && lane < per) {
#pragma unroll
            for (int r = 0; r < RR; ++r) {
                float v = 0.f;
#pragma unroll
                for (int w = 0; w < 8; ++w) v += red[w][r][lane];
                if (l == 0) {
                    if (r < nr) dx[(r0 + r) * K + k] = v;
                } else {
                    if (A[l - 1] && r < nr) v = act_bwd(v, Z[l - 1][(r0 + r) * K + k], A[l - 1]);
                    part[r][lane] = v;
                    if (r < nr) G[l - 1][(r0 + r) * K + k] = v;
                }
            }
        }
        if (l == 0) break;
        cluster_sync();
        for (int e = threadIdx.x; e < RR * K; e += blockDim.x) {
            const int r = e / K, kk = e - r * K, src = kk / per;
            gfull[r][kk] = ld_remote(&part[r][kk - src * per], src);
        }
        cluster_sync();
    }
}
#define CB(RR) extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(256) \
    chainc_bwd_r##RR(const float* dout, const float* w0, const float* w1, const float* w2, const float* z0, \
    const float* z1, const float* z2, float* g0, float* g1, float* g2, float* dx, int M, int d0, int d1, int d2, \
    int d3, int a0, int a1, int a2) { \
    chainc_bwd<RR>(dout, w0, w1, w2, z0, z1, z2, g0, g1, g2, dx, M, d0, d1, d2, d3, a0, a1, a2); }
CB(1) CB(2) CB(4) CB(8)
"""


def cluster_variants(cp, common, x, ws, bs, codes, widths, m, ref, dout=None, cs=None):
    from smalltrain.backend.cuda._common import i32
    try:
        mod = cp.RawModule(code=common + CLUSTER_SRC, options=("-std=c++17",))
        mod.get_function("chainc_fwd_r1_j1")
    except Exception as e:   # noqa: BLE001 - report and go on
        print(f"cluster prototype did not compile/load: {type(e).__name__}: {str(e)[:400]}")
        return
    for rows in (1, 4, 8):
        for jw in (2,):
            out = cp.empty((m, widths[-1]), cp.float32)
            fn = mod.get_function(f"chainc_fwd_r{rows}_j{jw}")
            grid = (-(-m // rows) * 8,)
            args = (x, *ws, *bs, out, i32(m), *(i32(d) for d in widths), *(i32(c) for c in codes))
            try:
                t = timed(cp, lambda: fn(grid, (256,), args))
            except Exception as e:   # noqa: BLE001
                print(f"cluster r{rows} j{jw}: launch failed: {type(e).__name__}: {str(e)[:300]}")
                return
            err = float(cp.abs(out - ref).max())
            print(f"M={m} cluster rows={rows} jw={jw} blocks={grid[0]}: fwd {t:.2f} us (max err vs chain {err:.1e})")
    from smalltrain.backend.cuda import linear_chain as C
    dx_ref, _ = C.linear_chain_backward(dout, cs)
    for rows in (1, 4, 8):
        fn = mod.get_function(f"chainc_bwd_r{rows}")
        gs = [cp.empty((m, widths[i + 1]), cp.float32) for i in range(3)]
        dx = cp.empty((m, widths[0]), cp.float32)
        zs = [cs.z[0], cs.z[1], cs.z[0]]
        args = (dout, *ws, *zs, *gs, dx, i32(m), *(i32(d) for d in widths), *(i32(c) for c in codes))
        t = timed(cp, lambda: fn((-(-m // rows) * 8,), (256,), args))
        err = float(cp.abs(dx - dx_ref).max())
        print(f"M={m} cluster bwd rows={rows}: {t:.2f} us (max dx err vs chain {err:.1e})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="64,512")
    p.add_argument("--all", action="store_true")
    args = p.parse_args()
    import cupy as cp

    from smalltrain.backend.cuda import linear as L
    from smalltrain.backend.cuda import linear_chain as C
    from smalltrain.backend.cuda._common import i32, ptr
    from smalltrain.backend.cuda.loader import KERNEL_DIR, read_source
    src = read_source(os.path.join(KERNEL_DIR, "linear_chain.cu"))
    widths = (256, 120, 84, 10)
    acts = ["gelu", "gelu", None]
    rng = np.random.default_rng(0)
    ws = [cp.asarray(rng.standard_normal((widths[i + 1], widths[i])).astype(np.float32) * 0.05) for i in range(3)]
    bs = [cp.asarray(rng.standard_normal(widths[i + 1]).astype(np.float32)) for i in range(3)]
    codes = [L.ACTIVATIONS[a] for a in acts]
    for m in (int(b) for b in args.batches.split(",")):
        x = cp.asarray(rng.standard_normal((m, widths[0])).astype(np.float32))
        dout = cp.asarray(rng.standard_normal((m, widths[-1])).astype(np.float32))
        # the per-layer path (what the chain replaces): 3 linear_fwd, 3 linear_bwd
        saved = []
        h = x
        for w, b, a in zip(ws, bs, acts):
            h, s = L.linear_act_forward(h, w, b, a)
            saved.append(s)

        def layers_fwd():
            v = x
            for w, b, a in zip(ws, bs, acts):
                v, _ = L.linear_act_forward(v, w, b, a)

        def layers_bwd():
            g = dout
            for s in reversed(saved):
                g, _, _ = L.linear_act_backward(g, s)
        print(f"M={m}: layers fwd {timed(cp, layers_fwd):.2f} us, layers bwd {timed(cp, layers_bwd):.2f} us")
        out, cs = C.linear_chain_forward(x, list(zip(ws, bs, acts)))
        print(f"M={m}: chain (as shipped, {C.chain_rows(m, widths, 4)} rows) fwd "
              f"{timed(cp, lambda: C.linear_chain_forward(x, list(zip(ws, bs, acts)))):.2f} us, bwd "
              f"{timed(cp, lambda: C.linear_chain_backward(dout, cs)):.2f} us")
        cluster_variants(cp, read_source(os.path.join(KERNEL_DIR, "common.cuh")), x, ws, bs, codes, widths, m, out,
                         dout, cs)
        zs, hs = cs.z, cs.h
        gs = [cp.empty((m, widths[i + 1]), cp.float32) for i in range(3)]
        dx = cp.empty((m, widths[0]), cp.float32)
        sweep = ((256, 4), (512, 4), (1024, 4), (512, 2), (512, 8), (1024, 2), (1024, 1)) if args.all else ()
        for threads, jw in sweep:
            mod = cp.RawModule(code=src, options=("-std=c++17", f"-DST_CTHREADS={threads}", f"-DST_CJW={jw}"))
            for rows in (1, 2, 4, 8):
                if rows * jw > 32:
                    continue
                grid = (-(-m // rows),)
                smem = 2 * rows * 256 * 4
                params = C._chain_params(ws, bs, zs, hs, widths, codes)
                fwd = mod.get_function(f"chain_fwd_r{rows}_f32")
                bwd = mod.get_function(f"chain_bwd_rows_r{rows}_f32")
                tf = timed(cp, lambda: fwd(grid, (threads,), (x,) + params + (i32(m), i32(3), i32(256)),
                                           shared_mem=smem))
                tb = timed(cp, lambda: bwd(grid, (threads,), (dout,) + params + tuple(ptr(g) for g in gs + [None])
                                           + (ptr(dx), i32(m), i32(3), i32(256)) + (ptr(None),) * 3
                                           + (i32(0),) * 3, shared_mem=smem))   # no pooled producer
                print(f"M={m} threads={threads} jw={jw} rows={rows} blocks={grid[0]}: fwd {tf:.2f} us, "
                      f"bwd_rows {tb:.2f} us")


if __name__ == "__main__":
    main()
