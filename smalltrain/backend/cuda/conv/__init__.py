"""CUDA 2-D convolution: the public entry points (conv2d_forward, conv2d_backward) and the dispatch among the
algorithms, each in a room of its own with its kernels in kernels/conv/:

  tile.py     stride-1, undilated, square 3x3 / 5x5 convolutions (tile_conv): forward and input gradient, an input
              tile and the weights in shared memory; fused.py its pooling / linear / into-the-producer epilogues
  wgrad.py    which kernel takes dw and db from x, and tile_wgrad for tile_conv's geometry
  direct.py   small groups == 1 convolutions (C*KH*KW up to CONV.direct_max_k): direct_fwd, direct_dx, wgrad_partial
  igemm.py    larger groups == 1 convolutions as implicit GEMMs: igemm_fwd, igemm_wgrad
  im2col.py   the rest (groups > 1, large work): im2col / col2im around cuBLAS GEMMs
  epilogue.py bias + activation, its derivative, and wgrad_reduce (every path's weight-gradient rows)
  plan.py     the CONV tuning table, the saved state, the checks and the geometry

The forward tries tile_conv, then direct_fwd, then igemm_fwd, then im2col + GEMM + bias_act_fwd; the input
gradient tile_conv (written as the producer's g where the caller offers one), then direct_dx, then GEMM + col2im;
the weight gradient runs beside the input gradient on a side stream where it is our own kernels and the output is
small enough (CONV.wgrad_beside_max_outputs).
"""
from .. import cupy
from .._common import check_array, check_dtype, check_shape, contiguous, run_beside, same_device
from ..blas import sum_rows
from .direct import direct_dx, direct_forward, direct_ok, direct_weight_grad, direct_wgrad_ok
from .epilogue import bias_act_backward, bias_act_forward, reduce_partials
from .fused import into_ok, producer_output, tile_dx, tile_linear_ok, tile_pool_ok
from .igemm import igemm_forward, igemm_ok, igemm_weight_grad
from .im2col import col2im, gemm_forward, gemm_input_grad, gemm_weight_grad, im2col
from .plan import ACTIVATIONS, CONV, Conv2dSaved, ProducerGrad, check_affine, sm_count, validate
from .tile import tile_arrange, tile_conv, tile_dx_plan, tile_forward_plan
from .wgrad import tile_weight_grad, tile_wgrad_plan, wgrad_kernel

__all__ = ["ACTIVATIONS", "CONV", "Conv2dSaved", "ProducerGrad", "bias_act_backward", "check_affine", "col2im",
           "conv2d_backward", "conv2d_forward", "im2col", "producer_output"]

_sm_count = sm_count   # linear.py and linear_chain.py size their grids by it too


def conv2d_forward(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, activation=None,
                   needs_input_grad=(True, True, True), keep_pre_activation=True, linear=None, pool=None):
    """out = act(conv2d(x, w, b)), torch's conv2d followed by the activation: one tile, direct or implicit-GEMM
    kernel where they take the convolution, else im2col + GEMM + epilogue.

    x [N, C, H, W], w [O, C/groups, KH, KW], b [O] or None: cupy float32/float64 arrays of one dtype on one device
    (non-contiguous inputs are copied). padding: int, (ph, pw), (top, bottom, left, right), 'valid' or 'same'.
    activation: None, 'relu', 'gelu' (erf) or 'gelu_tanh'. needs_input_grad (input, weight, bias) decides what is
    saved; keep_pre_activation=False: the output before the activation is not kept where a kernel writes it only for
    the backward (a caller that derives the activation's derivative otherwise; conv2d_backward then takes g only).
    Returns (out [N, O, OH, OW], Conv2dSaved). float32 GEMMs are full float32 unless CUPY_TF32=1 is set.
    linear=(lw [F, O*OH*OW], lb [F] or None) of x's dtype and device (the caller checks them): returns (out, saved,
    logits) with logits = flatten(out) @ lw^T + lb [N, F] where tile_conv's epilogue computes it (tile_linear_ok),
    else None (the caller runs the linear layer).
    pool=(kernel, stride, padding, dilation) pairs of a max pooling after the activation: where tile_conv's epilogue
    takes it (tile_pool_ok) `out` is the pooled output [N, O, OH/2, OW/2] and saved.pool what
    pool.max_pool2d_backward_act reads (max_pool2d_forward's saved); else saved.pool is None and out unpooled.
    """
    stride, pads, dilation, groups, out_hw = validate(x, w, b, stride, padding, dilation, groups, activation)
    needs = tuple(bool(v) for v in needs_input_grad) + (True,) * (3 - len(needs_input_grad))
    cp = cupy()
    with x.device:
        x, w, b = contiguous(x), contiguous(w), contiguous(b)
        n = x.shape[0]
        o, cg, kh, kw = w.shape
        p = out_hw[0] * out_hw[1]
        act = ACTIVATIONS[activation]
        keep_y = act and keep_pre_activation
        itemsize = x.dtype.itemsize
        plan_args = (x.shape, w.shape, out_hw, stride, pads, dilation, groups, itemsize)
        # the pooling in tile_conv's epilogue where it takes it (a plan of even rows): out is then the pooled output
        # and pool_saved max_pool2d_forward's saved, its indices written by the epilogue; else the plain plan
        tile = tile_forward_plan(*plan_args, even_rows=True) if pool is not None and tile_pool_ok(pool, out_hw) \
            else None
        pool_saved = None
        if tile is not None:
            pool_hw = (out_hw[0] // 2, out_hw[1] // 2)
            out = cp.empty((n, o) + pool_hw, dtype=x.dtype)
            pool_saved = (cp.empty((n, o) + pool_hw, dtype=cp.int64), (n, o) + tuple(out_hw), x.dtype,
                          ((2, 2), (2, 2), (0, 0), (1, 1), pool_hw))
        else:
            tile = tile_forward_plan(*plan_args)
            out = cp.empty((n, o, out_hw[0], out_hw[1]), dtype=x.dtype)
        arranged_dx = None
        direct = tile is None and direct_ok(x.shape, w.shape, out_hw, groups, itemsize)
        igemm = tile is None and not direct and igemm_ok(x.shape, w.shape, out_hw, groups, dilation)
        # x is kept (cols not) where a weight-gradient kernel reads it or no cols matrix is made
        keep_x = tile is not None or direct or igemm or direct_wgrad_ok(x.shape, w.shape, out_hw, groups, itemsize)
        y = cp.empty((o, n * p), dtype=x.dtype) if keep_y and (tile is not None or direct or igemm) else None
        cols, logits = None, None
        if tile is not None:
            lin = None
            if linear is not None and (counters := tile_linear_ok(tile, n, linear[0])) is not None:
                f = linear[0].shape[0]
                logits = cp.empty((n, f), dtype=x.dtype)
                lin = (contiguous(linear[0]), contiguous(linear[1]), logits, cp.empty((tile[3], f), dtype=x.dtype),
                       counters, f)
            dx_plan = tile_dx_plan(x.shape, w.shape, stride, dilation, groups, out_hw, itemsize) if needs[0] else None
            arranged, arranged_dx = tile_arrange(w, tile, dx_plan)
            strides = (x.shape[1] * x.shape[2] * x.shape[3], x.shape[2] * x.shape[3])
            tile_conv(tile, x, w, b, out, y, x.shape[1:], strides, pads, False, act, lin=lin,
                      pool_idx=None if pool_saved is None else pool_saved[0], arranged=arranged)
        elif direct:
            direct_forward(x, w, b, out, y, out_hw, stride, pads, dilation, act)
        elif igemm:
            igemm_forward(x, w, b, out, y, out_hw, stride, pads, dilation, act)
        else:
            cols = im2col(x, (kh, kw), stride, pads, dilation, out_hw)
            y = gemm_forward(w, cols, groups)
            bias_act_forward(y, b, out, n, o, p, act)
    saved = Conv2dSaved(tuple(x.shape), w, b, cols if needs[1] and not keep_x else None,
                        y if keep_y else None, stride, pads, dilation, groups, out_hw, activation, needs[:3],
                        x if keep_x and needs[1] else None, pool_saved, arranged_dx)
    return (out, saved) if linear is None else (out, saved, logits)


def conv2d_backward(dout, saved, g=None, into=None, wpartial=None, wgrad_beside=False, dpool=None):
    """Gradients of conv2d_forward's output: dout [N, O, OH, OW] -> (dx, dw, db); or, with dout None, from g
    [O, N*OH*OW], the gradient after the activation's derivative, already in the kernels' layout (a fused pooling's
    backward computes it: pool.max_pool2d_backward_act).

    Each is None where saved.needs says it is not needed (db also when there was no bias). The activation's
    derivative is applied first (fused with the [N, O] -> [O, N] transpose), then db = sum over N, OH, OW, dw = g @
    cols^T (where the forward kept x, both from x by one of three kernels, wgrad_kernel) and dx = col2im(w^T @ g),
    all over the whole batch; on the tile and direct paths dx is one kernel. into: the Conv2dSaved of the
    convolution that made x; where tile_conv takes dx (and into_ok), dx is returned as a ProducerGrad instead: that
    convolution's g [C, N*H*W] (its activation's derivative applied), maybe with its weight gradient's partial rows,
    for its conv2d_backward(None, into, g=..., wpartial=...); else as usual [N, C, H, W]. wpartial: this
    convolution's weight and bias gradients' partial rows, already summed over the batch by the next convolution's
    input gradient (ProducerGrad): only wgrad_reduce runs for dw and db; g may then be None where no input gradient
    is needed. wgrad_beside: dw and db may be made beside the rest of the backward pass, joined by the pass
    (autograd.engine.takes_plainly said so). dpool (dout, g and wpartial None): the gradient of the output pooled in
    the epilogue (saved.pool), [N, O, PH, PW]; g is made from it by the pooling's backward
    (pool.max_pool2d_backward_act).
    """
    op = "conv2d_backward"
    n, c, h, wd = saved.x_shape
    w = saved.weight
    o, cg, kh, kw = w.shape
    p = saved.out_hw[0] * saved.out_hw[1]
    dtype = w.dtype
    if dpool is not None:
        if dout is not None or g is not None or wpartial is not None or saved.pool is None:
            raise RuntimeError(f"{op}: dpool comes alone (no grad_output, g or wpartial), for a convolution that "
                               f"pooled in its epilogue")
        check_array(op, "dpool", dpool, 4)
        check_shape(op, "dpool", dpool, (n, o) + tuple(saved.pool[3][4]))
        check_dtype(op, "dpool", dpool, dtype)
        given = dpool
    elif dout is None and g is None:   # the weight and bias gradients' partial rows alone (ProducerGrad)
        if wpartial is None or saved.needs[0]:
            raise RuntimeError(f"{op}: expected grad_output or g (g may be None only with wpartial and no input "
                               f"gradient needed)")
        check_dtype(op, "wpartial", wpartial, dtype)
        given = wpartial
    elif dout is None:
        check_array(op, "g", g, 2)
        check_shape(op, "g", g, (o, n * p))
        check_dtype(op, "g", g, dtype)
        if not g.flags.c_contiguous:
            raise RuntimeError(f"{op}: expected a C-contiguous g, got strides {list(g.strides)}")
        given = g
    else:
        check_array(op, "grad_output", dout, 4)
        expected = (n, o) + tuple(saved.out_hw)
        if tuple(dout.shape) != expected:
            raise RuntimeError(f"{op}: expected grad_output of shape {list(expected)}, got {list(dout.shape)}")
        check_dtype(op, "grad_output", dout, dtype)
        if saved.activation is not None and saved.y is None:
            raise RuntimeError(f"{op}: the forward did not keep the output before the activation "
                               f"(keep_pre_activation=False); pass g instead of grad_output")
        given = dout
    same_device(op, given, w)
    need_x, need_w, need_b = saved.needs
    with given.device:
        if dout is not None:
            dout = contiguous(dout)
            g = cupy().empty((o, n * p), dtype=dtype)
            bias_act_backward(dout, saved.y, saved.bias, g, n, o, p, ACTIVATIONS[saved.activation])
        if dpool is not None:
            from ..pool import max_pool2d_backward_act   # (pool.py imports this package)
            g = max_pool2d_backward_act(contiguous(dpool), saved.pool, saved.y, saved.bias, saved.activation)
        want_b = need_b and saved.bias is not None
        wgrad = "given" if wpartial is not None else wgrad_kernel(saved, dtype.itemsize) if need_w else None

        def weight_grads():
            bias = saved.bias if want_b else None
            if wgrad == "given":
                return reduce_partials(wpartial, w, bias)
            if wgrad == "tile":   # dw and db from x in one kernel and its reduction
                return tile_weight_grad(saved.x, g, saved, want_b, tile_wgrad_plan(saved, dtype.itemsize))
            if wgrad == "igemm":
                return igemm_weight_grad(saved.x, g, saved, want_b)
            if wgrad == "tiled":
                return direct_weight_grad(saved.x, g, saved, want_b)
            db = sum_rows(g, 1) if want_b else None
            if not need_w:
                return None, db
            # cols: kept by the forward, or made now from x where no dw kernel takes it
            cols = saved.cols if saved.x is None else im2col(saved.x, (kh, kw), saved.stride, saved.pads,
                                                             saved.dilation, saved.out_hw)
            return gemm_weight_grad(g, cols, w.shape, saved.groups), db

        def input_grad():
            if not need_x:
                return None
            if into_ok(saved, into, dtype):
                dx = tile_dx(g, saved, into)
                if dx is not None:
                    return dx
            dx = tile_dx(g, saved)
            if dx is None:
                dx = direct_dx(g, saved)
            if dx is None:
                dx = gemm_input_grad(g, saved)
            return dx

        # the weight gradient's kernels beside the input gradient's where there are both; our own kernels only: the
        # input gradient may run cuBLAS, and one cuBLAS handle's workspace must not serve two streams at once
        beside = need_x and wgrad in ("tile", "igemm", "tiled") and n * o * p <= CONV.wgrad_beside_max_outputs
        (dw, db), dx = run_beside(weight_grads, input_grad, beside, defer=wgrad_beside)
    return dx, dw, db
