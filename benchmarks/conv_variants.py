"""GPU time of the convolution paths (backend/cuda/conv.py) on the layers of the benchmarked models, one path
against another on the same inputs: which kernels each direction takes is decided by conv.py's limits, and this
script sets them per variant.

Run (GPU): python3 benchmarks/conv_variants.py [--layers mnistcnn2:64,lenet2:512] [--variants tile,gather]
     python3 benchmarks/conv_variants.py --pooled [--layers lenet2:64,lenet2:512]
Each figure: GPU microseconds per call from 100 calls captured in one CUDA graph (benchmarks/common.py timed);
forward = conv2d_forward (with the activation fused), backward = conv2d_backward (its activation derivative, dx,
dw, db). --pooled: for a layer whose output a 2x2 max pooling reads (its g a quarter nonzero): its input gradient
into its pooled first layer (LeNet-5's) with that layer's weight and bias gradients, by tile_conv_unpool's compact
g and pooled_wgrad against tile_conv_unpool_wgrad (conv.UNPOOL_WGRAD), compared. (The twenty-first session's
pooled_dx, the input gradient from the maxima, lost to tile_conv's dense one and was removed, the twenty-third
removed pooled_wgrad for a layer that needs its input gradient, the chain's CHAIN_POOLED_WGRAD, and the
twenty-fourth the scatter form of tile_conv's input gradient, TILE_DX_SCATTER; the numbers are in RESULTS.md.)
"""
import argparse
import contextlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import timed  # noqa: E402

LAYERS = {   # name: (input shape at batch 1, weight shape, activation)
    "mnistcnn1": ((1, 28, 28), (16, 1, 3, 3), "relu"),
    "mnistcnn2": ((16, 26, 26), (32, 16, 3, 3), "relu"),
    "lenet1": ((1, 28, 28), (6, 1, 5, 5), "gelu"),
    "lenet2": ((6, 12, 12), (16, 6, 5, 5), "gelu"),
}
BIG = 1 << 40


def NEVER(*args):
    return False


OLD_PATHS = {"TILE_CONV": False, "TILE_WGRAD": False}   # the kernels before tile_conv and tile_wgrad
VARIANTS = {   # name: conv.py limits (and, for NEVER, a rule switched off)
    "as shipped": {},
    "no tile_conv": {"TILE_CONV": False},
    "no tile_wgrad": {"TILE_WGRAD": False},
    "wgrad beside dx": {"WGRAD_BESIDE_MAX_OUTPUTS": BIG},
    "wgrad after dx": {"WGRAD_BESIDE_MAX_OUTPUTS": 0},
    "tile_wgrad, 1 block/SM": {"_TILE_WG_BLOCKS_PER_SM": 1},
    "tile_wgrad, 2 blocks/SM": {"_TILE_WG_BLOCKS_PER_SM": 2},
    "tile_wgrad, 3 blocks/SM": {"_TILE_WG_BLOCKS_PER_SM": 3},
    "tile_wgrad, 4 blocks/SM": {"_TILE_WG_BLOCKS_PER_SM": 4},
    "tile_conv, 4 channels": {"_TILE_TO8_THREADS_PER_SM": BIG},
    "tile_conv, 8 channels": {"_TILE_TO8_THREADS_PER_SM": 0},
    "tile_conv, 1 block/SM": {"_TILE_BLOCKS_PER_SM": 1},
    "tile_conv, 2 channel splits": {"_TILE_SPLITS": 2},
    "tile_conv, 4 channel splits": {"_TILE_SPLITS": 4},
    "tile_conv, splits to 1024 threads/SM": {"_TILE_SPLIT_THREADS_PER_SM": 1024},
    "tile_conv, splits to 2048 threads/SM": {"_TILE_SPLIT_THREADS_PER_SM": 2048},
    "tile_conv, 2 rows": {"_TILE_ROWS": 2},
    "tile_conv, 3 rows": {"_TILE_ROWS": 3},
    "tile_conv, 6 rows": {"_TILE_ROWS": 6},
    "tile_conv, 6 blocks/SM": {"_TILE_BLOCKS_PER_SM": 6, "_TILE_MIN_THREADS": 32},
    "im2col + cuBLAS": {**OLD_PATHS, "DIRECT_MAX_K": 0, "IGEMM_MAX_K": 0},
    "fwd igemm, dx gather, dw cuBLAS": {**OLD_PATHS, "DIRECT_MAX_MACS": 0, "_igemm_wgrad": NEVER},
    "fwd igemm, dx gather, dw igemm": {**OLD_PATHS, "DIRECT_MAX_MACS": 0},
    "direct, dw tiled": {**OLD_PATHS, "IGEMM_WGRAD_MIN_USE": 2},
    "direct, dw igemm 32x64": {**OLD_PATHS, "IGEMM_WGRAD_MIN_USE": 0, "_WG_TILE": (32, 64, 4, 4)},
    "direct, dw igemm 16x128": {**OLD_PATHS, "IGEMM_WGRAD_MIN_USE": 0, "_WG_TILE": (16, 128, 4, 4)},
    "direct, dw igemm 8x32": {**OLD_PATHS, "IGEMM_WGRAD_MIN_USE": 0, "_WG_TILE": (8, 32, 2, 2)},
    "direct, dw igemm, 1024 threads/SM": {**OLD_PATHS, "IGEMM_WGRAD_MIN_USE": 0, "_WG_THREADS_PER_SM": 1024},
    "direct, dx GEMM + col2im": {**OLD_PATHS, "DIRECT_DX_MAX_MACS": 0},
    "direct, dx gather": {**OLD_PATHS, "DIRECT_DX_MIN_THREADS_PER_SM": 0},
    "all direct": {**OLD_PATHS, "DIRECT_MAX_MACS": BIG, "DIRECT_DX_MAX_MACS": BIG, "DIRECT_DX_MIN_THREADS_PER_SM": 0,
                   "IGEMM_WGRAD_MIN_USE": 2},
}


@contextlib.contextmanager
def limits(module, values):
    old = {k: getattr(module, k) for k in values}
    for k, v in values.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)


POOL_2X2 = ((2, 2), (2, 2), (0, 0), (1, 1))   # conv2d_forward's pool: kernel, stride, padding, dilation
PRODUCERS = {"lenet2": "lenet1"}               # the pooled layer whose output a layer reads, in the model


def pooled_paths(cp, conv, specs, rng):
    """Per layer whose output a 2x2 max pooling reads: its input gradient into its pooled first layer with that
    layer's weight gradient, pooled_wgrad's way against tile_conv_unpool_wgrad's (see the header)."""
    for spec in specs:
        name, batch = spec.split(":")
        shape, w_shape, act = LAYERS[name]
        x = cp.asarray(rng.standard_normal((int(batch),) + shape).astype(np.float32))
        w = cp.asarray((rng.standard_normal(w_shape) * 0.2).astype(np.float32))
        _, saved = conv.conv2d_forward(x, w, None, activation=act, pool=POOL_2X2)
        pidx = saved.pool[0]
        n, o, ph, pw = pidx.shape
        fw = saved.out_hw[1]
        gc = cp.asarray(rng.standard_normal((o, n * ph * pw)).astype(np.float32))
        full = cp.zeros((o, n, saved.out_hw[0] * fw), dtype=cp.float32)   # g: gc at the maxima, 0 elsewhere
        oi, ni = cp.meshgrid(cp.arange(o), cp.arange(n), indexing="ij")
        full[oi[..., None], ni[..., None], pidx.transpose(1, 0, 2, 3).reshape(o, n, -1)] = gc.reshape(o, n, -1)
        full = full.reshape(o, -1)
        pairs = []   # (what, one way's name and call, the other's)
        if name in PRODUCERS:   # dx into that producer pooled in its epilogue as a first layer (the step's path)
            p_shape, p_w_shape, p_act = LAYERS[PRODUCERS[name]]
            px = cp.asarray(rng.standard_normal((int(batch),) + p_shape).astype(np.float32))
            pw_ = cp.asarray((rng.standard_normal(p_w_shape) * 0.2).astype(np.float32))
            pb = cp.asarray(rng.standard_normal(p_w_shape[0]).astype(np.float32))
            _, into = conv.conv2d_forward(px, pw_, pb, activation=p_act, pool=POOL_2X2,
                                          needs_input_grad=(False, True, True))

            def into_grads(fused):
                def run():
                    with limits(conv, {"UNPOOL_WGRAD": fused}):
                        handed = conv._tile_dx(full, saved, into)   # (None where tile_conv does not take it)
                    return None if handed is None else conv._reduce_partials(handed.wpartial, into.weight, into.bias)
                return run
            pairs.append(("dx into layer 1, its dw, db", "tile_conv_unpool + pooled_wgrad", into_grads(False),
                          "tile_conv_unpool_wgrad", into_grads(True)))
        for label, one_name, one, other_name, other in pairs:
            a, b = one(), other()
            if a is None or b is None:
                print(f"{spec:<14} {label}: not compared ({one_name} {a is not None}, {other_name} "
                      f"{b is not None})")
                continue
            err = max(float(cp.abs(u - v).max()) for u, v in zip(a, b)) if isinstance(a, tuple) \
                else float(cp.abs(a - b).max())
            print(f"{spec:<14} {label}: {one_name} {timed(cp, one):7.2f} us  {other_name} "
                  f"{timed(cp, other):7.2f} us  (max diff {err:.1e})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="mnistcnn2:64,mnistcnn1:64,lenet2:64,lenet1:64,lenet1:512,lenet2:512")
    p.add_argument("--variants", default="", help="comma-separated names (or parts of names) of VARIANTS to run "
                   "(default: all)")
    p.add_argument("--pooled", action="store_true", help="time the gradients of a pooled layer each two ways "
                   "instead (default layers lenet2:64,lenet2:512; see the header)")
    args = p.parse_args()
    if args.pooled:
        import cupy as cp

        from smalltrain.backend.cuda import conv
        layers = args.layers if "--layers" in sys.argv else "lenet2:64,lenet2:512"
        return pooled_paths(cp, conv, layers.split(","), np.random.default_rng(0))
    wanted = [v for v in args.variants.split(",") if v]
    import cupy as cp

    from smalltrain.backend.cuda import conv
    rng = np.random.default_rng(0)
    for spec in args.layers.split(","):
        name, batch = spec.split(":")
        shape, w_shape, act = LAYERS[name]
        x = cp.asarray(rng.standard_normal((int(batch),) + shape).astype(np.float32))
        w = cp.asarray((rng.standard_normal(w_shape) * 0.2).astype(np.float32))
        b = cp.asarray(rng.standard_normal(w_shape[0]).astype(np.float32))
        ref = None
        for variant, values in VARIANTS.items():
            if wanted and variant != "as shipped" and not any(v in variant for v in wanted):
                continue
            with limits(conv, values):
                out, saved = conv.conv2d_forward(x, w, b, activation=act)
                dout = cp.asarray(rng.standard_normal(out.shape).astype(np.float32)) if ref is None else ref[1]
                grads = conv.conv2d_backward(dout, saved)
                if ref is None:
                    ref = (out, dout, grads)
                err = max(float(cp.abs(a - r).max()) for a, r in zip((out,) + grads, (ref[0],) + ref[2]))
                tf = timed(cp, lambda: conv.conv2d_forward(x, w, b, activation=act))
                tb = timed(cp, lambda: conv.conv2d_backward(dout, saved))
            print(f"{spec:<14} {variant:<35} fwd {tf:7.2f} us  bwd {tb:7.2f} us  (max diff vs as shipped {err:.1e})")


if __name__ == "__main__":
    main()
