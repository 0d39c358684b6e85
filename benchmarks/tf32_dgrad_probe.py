"""How fast could LeNet-5's second-layer input gradient be on tensor cores, with float32 accuracy kept (3xTF32)?

A probe, not a path of the package: the one piece of the captured LeNet-5 step that is not bound by latency is the
second convolution's input gradient inside tile_conv_unpool_wgrad (an implicit GEMM of M = N*12*12 positions,
N = 6 channels, K = 16*5*5 taps). This script times that GEMM alone three ways on the same data:
  - tile_conv: the backend's input-gradient kernel (conv.tile_dx, float32 FMAs), as the step runs it minus the
    unpooling and weight-gradient epilogue;
  - mma 3xTF32: warp-level mma.sync m16n8k8 TF32 products of split operands (x = big + small, each a TF32 value;
    big*big + big*small + small*big, the small*small term dropped), whose error is that of float32 FMAs;
  - mma 1xTF32: one TF32 product a term (10-bit mantissas; shown for speed only, its error is ~1e-3 relative).
Each kernel stages an image's padded g (16 channels x 16 x 16) and the weights (split once per block) in shared
memory by cp.async (the first version's plain loads, one latency a loop iteration, took 25 us at batch 64); a warp
computes 1 or 3 tiles of 16 positions x 8 channels (6 live) over the 50 steps of 8 taps.
Errors against a float64 reference are printed beside the times (max |error| / max |reference|).

Run (GPU): python3 benchmarks/tf32_dgrad_probe.py [--batch 64 512]
Each time: GPU microseconds per call from 100 calls captured in one CUDA graph (benchmarks/common.py timed).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import environment, timed  # noqa: E402

C_OUT, C_IN, KS, H_OUT, H_IN = 16, 6, 5, 8, 12   # LeNet-5's second convolution: g [16, N, 8, 8] -> dx [N, 6, 12, 12]

SOURCE = r"""
#define PAD 16          // the padded g plane's side: 8 + 2 * 4
#define PLANE (PAD * PAD)
#define TAPS 400        // 16 channels x 5 x 5
__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned u;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
    return u;
}
__device__ __forceinline__ void mma_tf32(float* d, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void async_copy4(float* dst, const float* src, bool in) {   // 0 where !in
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(d), "l"(src), "r"(in ? 4 : 0) : "memory");
}
// g [16][N][64], w [16][6][25] (the forward's weights), dx [N][6][144]; IMG images a block, MT of an image's 9
// tiles of 16 positions a warp (9 / MT warps an image)
template <int IMG, int PASSES, int MT>
__device__ void dgrad_mma(const float* __restrict__ g, const float* __restrict__ w, float* __restrict__ dx, int N) {
    extern __shared__ float sm[];
    float* gs = sm;                                       // [IMG][16][PAD][PAD]
    float2* bs = reinterpret_cast<float2*>(gs + IMG * 16 * PLANE);   // [TAPS][8]: (big, small)
    int* toff = reinterpret_cast<int*>(bs + TAPS * 8);    // [TAPS]: a tap's offset in the padded planes
    const int n0 = blockIdx.x * IMG;
    // every copy issued before any is waited for (cp.async, zero-filled outside g): one memory latency, not one a
    // thread's loop iteration; the weights land raw in bs's small halves and are split in shared memory after
    for (int e = threadIdx.x; e < IMG * 16 * PLANE; e += blockDim.x) {
        const int im = e / (16 * PLANE), r = e - im * 16 * PLANE, c = r / PLANE, a = (r / PAD) % PAD, b = r % PAD;
        const int y = a - 4, x = b - 4, n = n0 + im;
        const bool in = n < N && y >= 0 && y < 8 && x >= 0 && x < 8;
        async_copy4(gs + e, in ? g + ((size_t)c * N + n) * 64 + y * 8 + x : g, in);
    }
    for (int e = threadIdx.x; e < TAPS * 8; e += blockDim.x) {
        const int k = e / 8, o = e % 8, c = k / 25, ij = k % 25;
        async_copy4(&bs[e].y, o < 6 ? w + (c * 6 + o) * 25 + ij : w, o < 6);
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    for (int e = threadIdx.x; e < TAPS * 8; e += blockDim.x) {
        const float v = bs[e].y, big = __uint_as_float(to_tf32(v));
        bs[e] = make_float2(big, __uint_as_float(to_tf32(v - big)));
    }
    for (int k = threadIdx.x; k < TAPS; k += blockDim.x) {
        const int c = k / 25, i = (k % 25) / 5, j = k % 5;
        toff[k] = c * PLANE - i * PAD - j;
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane >> 2, t = lane & 3;
    constexpr int WPI = 9 / MT;
    const int im = warp / WPI, mt0 = (warp % WPI) * MT;
    const float* gim = gs + im * 16 * PLANE;
    int pb[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int p = (mt0 + m) * 16 + gq + 8 * h, y = p / 12, x = p % 12;
            pb[m][h] = (y + 4) * PAD + x + 4;
        }
    float acc[MT][4] = {};
#pragma unroll 2
    for (int k0 = 0; k0 < TAPS; k0 += 8) {
        const int t0 = toff[k0 + t], t1 = toff[k0 + t + 4];
        const float2 b0 = bs[(k0 + t) * 8 + gq], b1 = bs[(k0 + t + 4) * 8 + gq];
        const unsigned bb[2] = {__float_as_uint(b0.x), __float_as_uint(b1.x)};
        const unsigned bl[2] = {__float_as_uint(b0.y), __float_as_uint(b1.y)};
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const float a[4] = {gim[pb[m][0] + t0], gim[pb[m][1] + t0], gim[pb[m][0] + t1], gim[pb[m][1] + t1]};
            unsigned ab[4], al[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                ab[q] = to_tf32(a[q]);
                al[q] = to_tf32(a[q] - __uint_as_float(ab[q]));
            }
            if (PASSES == 3) {   // the small terms first
                mma_tf32(acc[m], al, bb);
                mma_tf32(acc[m], ab, bl);
            }
            mma_tf32(acc[m], ab, bb);
        }
    }
    const int n = n0 + im;
    if (n >= N) return;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const int o = 2 * t + q, p = (mt0 + m) * 16 + gq + 8 * h;
                if (o < 6) dx[((size_t)n * 6 + o) * 144 + p] = acc[m][2 * h + q];
            }
}
#define PROBE(IMG, PASSES, MT) \
extern "C" __global__ void __launch_bounds__(IMG * 9 / MT * 32) dgrad_mma_##IMG##_##PASSES##_##MT( \
        const float* g, const float* w, float* dx, int N) { dgrad_mma<IMG, PASSES, MT>(g, w, dx, N); }
PROBE(1, 3, 3)
PROBE(2, 3, 3)
PROBE(4, 3, 3)
PROBE(1, 3, 1)
PROBE(2, 3, 1)

PROBE(2, 1, 3)
PROBE(2, 1, 1)
"""


def reference(g64, w64, n):
    """dx in float64: the full correlation of g with the flipped kernel, by shifted slices of the padded g."""
    cp = _cupy()
    gp = cp.zeros((C_OUT, n, H_OUT + 8, H_OUT + 8), dtype=cp.float64)
    gp[:, :, 4:4 + H_OUT, 4:4 + H_OUT] = g64.reshape(C_OUT, n, H_OUT, H_OUT)
    dx = cp.zeros((n, C_IN, H_IN, H_IN), dtype=cp.float64)
    for i in range(KS):
        for j in range(KS):
            dx += cp.einsum("cnyx,co->noyx", gp[:, :, 4 - i:4 - i + H_IN, 4 - j:4 - j + H_IN], w64[:, :, i, j])
    return dx


def _cupy():
    from smalltrain.backend.cuda import cupy
    return cupy()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[64, 512])
    args = p.parse_args(argv)
    cp = _cupy()
    from smalltrain.backend.cuda import conv
    from smalltrain.backend.cuda.tuning import override
    # tile_conv at every batch (the step's plans take it at 64 and 512)
    tuned = override(conv.CONV, tile_dx_min_threads_per_sm=0)
    tuned.__enter__()
    print(environment(None, "cuda"))
    module = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    rows = []
    for n in args.batch:
        rng = np.random.default_rng(0)
        x = cp.asarray(rng.standard_normal((n, C_IN, H_IN, H_IN)).astype(np.float32))
        w = cp.asarray((rng.standard_normal((C_OUT, C_IN, KS, KS)) * 0.1).astype(np.float32))
        _, saved = conv.conv2d_forward(x, w, None, needs_input_grad=(True, True, False))
        g = cp.asarray(rng.standard_normal((C_OUT, n * H_OUT * H_OUT)).astype(np.float32))
        ref = reference(g.astype(cp.float64), w.astype(cp.float64), n)
        scale = float(cp.abs(ref).max())

        def error(dx):
            return float(cp.abs(dx.astype(cp.float64).reshape(ref.shape) - ref).max()) / scale

        dx_tile = conv.tile_dx(g, saved)
        rows.append((n, "tile_conv (float32 FMAs)", timed(cp, lambda: conv.tile_dx(g, saved)), error(dx_tile)))
        for img, passes, mt in ((1, 3, 3), (2, 3, 3), (4, 3, 3), (1, 3, 1), (2, 3, 1), (2, 1, 3),
                                (2, 1, 1)):
            kern = module.get_function(f"dgrad_mma_{img}_{passes}_{mt}")
            smem = (img * 16 * 256 + 400 * 8 * 2 + 400) * 4
            kern.max_dynamic_shared_size_bytes = smem
            dx = cp.empty((n, C_IN, H_IN, H_IN), dtype=cp.float32)
            blocks = (n + img - 1) // img

            def launch(kern=kern, dx=dx, blocks=blocks, threads=img * 9 // mt * 32, smem=smem):
                kern((blocks,), (threads,), (g, w, dx, np.int32(n)), shared_mem=smem)
            launch()
            rows.append((n, f"mma {passes}xTF32, {img} image(s), {mt} tile(s) a warp", timed(cp, launch),
                         error(dx)))
    print(f"{'batch':>5}  {'kernel':<44} {'us':>8}  {'max error / max |dx|':>20}")
    for n, name, us, err in rows:
        print(f"{n:>5}  {name:<44} {us:>8.2f}  {err:>20.2e}")


if __name__ == "__main__":
    main()
