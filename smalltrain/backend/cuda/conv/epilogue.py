"""The launches every convolution path shares (kernels/conv/epilogue.cu): the bias + activation epilogue after a
GEMM, the activation's derivative before the backward's kernels, and wgrad_reduce, which sums the weight-gradient
kernels' partial rows into dw and db in a fixed order."""
from .._common import get, grad_array, i32, i64, launch, ptr
from ..loader import MAX_BLOCKS
from .plan import CONV

FAMILY = "conv/epilogue"


def bias_act_forward(y, b, out, n, o, p, act):
    """out [N, O, P] = act(y [O, N, P] + b[o]): the GEMM path's transpose, bias and activation in one pass."""
    launch(FAMILY, "bias_act_fwd", y.dtype, out.size, (y, ptr(b), out, i64(n), i64(o), i64(p), i32(act)))


def bias_act_backward(dout, y, b, g, n, o, p, act):
    """g [O, N, P] = dout [N, O, P] * act'(y + b[o]) (y [O, N, P], b [O] or None; y unread without an activation):
    a block per row of g where the rows are long (CONV.bias_act_rows_min_p), one thread per element otherwise."""
    args = (dout, ptr(y), ptr(b), g, i64(n), i64(o), i64(p), i32(act))
    if p >= CONV.bias_act_rows_min_p:
        get(FAMILY, "bias_act_bwd_rows", g.dtype)((min(n * o, MAX_BLOCKS),), (128,), args)
    else:
        launch(FAMILY, "bias_act_bwd", g.dtype, g.size, args)


def reduce_partials(partial, w, b):
    """dw [O, C, KH, KW] of the weight w and db [O] (None where the bias b is None: none wanted) from partial [S,
    O*(C*KH*KW + 1)]: wgrad_reduce, blocks of 32 outputs x G row groups, the S rows summed in a fixed order; G
    (1..32) gives each thread about CONV.wr_rows rows, so that few outputs over many rows (LeNet-5's first layer: 156
    x 528) still spread over many threads. dw and db are grad_array's (a leaf's gradient slot where offered)."""
    o, cg, kh, kw = w.shape
    k = cg * kh * kw
    dw, db = grad_array(w), grad_array(b) if b is not None else None
    groups = max(1, min(32, -(-partial.shape[0] // CONV.wr_rows)))
    get(FAMILY, "wgrad_reduce", partial.dtype)((-(-o * (k + 1) // 32),), (32 * groups,), (
        partial, dw, ptr(db), i32(partial.shape[0]), i32(o), i32(k)))
    return dw, db
