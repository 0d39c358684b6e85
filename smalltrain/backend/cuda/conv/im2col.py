"""The cols-matrix path (kernels/conv/im2col.cu + cuBLAS GEMMs over the whole batch, blas.py): the forward, input
gradient and weight gradient of the convolutions no direct, implicit-GEMM or tile kernel takes (groups > 1, large
C*KH*KW, large work). Layouts: x [N, C, H, W]; cols [C*KH*KW, N*OH*OW] (row (c*KH + i)*KW + j, column
(n*OH + oh)*OW + ow); g [O, N*OH*OW]."""
from .. import cupy
from .._common import contiguous, launch
from ..blas import gemm
from .plan import geometry_args

FAMILY = "conv/im2col"


def im2col(x, kernel_size, stride, pads, dilation, out_hw):
    """x [N, C, H, W] -> cols [C*KH*KW, N*OH*OW] (row (c*KH + i)*KW + j, column (n*OH + oh)*OW + ow).

    pads = (top, bottom, left, right); arguments already validated (conv2d_forward does that).
    """
    x = contiguous(x)
    n, c, h, w = x.shape
    kh, kw = kernel_size
    cols = cupy().empty((c * kh * kw, n * out_hw[0] * out_hw[1]), dtype=x.dtype)
    launch(FAMILY, "im2col", x.dtype, n * out_hw[0] * out_hw[1],   # one thread per column
           (x, cols) + geometry_args(n, c, h, w, kh, kw, out_hw, stride, pads, dilation))
    return cols


def col2im(cols, x_shape, kernel_size, stride, pads, dilation, out_hw):
    """The adjoint of im2col: dcols [C*KH*KW, N*OH*OW] -> dx [N, C, H, W] (overlaps summed, deterministic)."""
    cols = contiguous(cols)
    n, c, h, w = x_shape
    kh, kw = kernel_size
    dx = cupy().empty(tuple(x_shape), dtype=cols.dtype)
    launch(FAMILY, "col2im", cols.dtype, dx.size,
           (cols, dx) + geometry_args(n, c, h, w, kh, kw, out_hw, stride, pads, dilation))
    return dx


def gemm_forward(w, cols, groups):
    """y [O, N*OH*OW] = w @ cols (per group), before the bias and activation."""
    o, cg, kh, kw = w.shape
    q = cols.shape[1]
    if groups == 1:
        y = gemm(w.reshape(o, cg * kh * kw), cols)
    else:
        y = gemm(w.reshape(groups, o // groups, cg * kh * kw), cols.reshape(groups, cg * kh * kw, q))
    return contiguous(y.reshape(o, q))


def gemm_weight_grad(g, cols, w_shape, groups):
    """dw [O, C/groups, KH, KW] = g @ cols^T (per group)."""
    o, cg, kh, kw = w_shape
    k, q = cg * kh * kw, g.shape[1]
    if groups == 1:
        dw = gemm(g, cols.T)
    else:
        dw = gemm(g.reshape(groups, o // groups, q), cols.reshape(groups, k, q).transpose(0, 2, 1))
    return dw.reshape(o, cg, kh, kw)


def gemm_input_grad(g, saved):
    """dx [N, C, H, W] = col2im(w^T @ g) (per group)."""
    w, groups = saved.weight, saved.groups
    o, cg, kh, kw = w.shape
    k, q = cg * kh * kw, g.shape[1]
    if groups == 1:
        dcols = gemm(w.reshape(o, k).T, g)
    else:
        dcols = gemm(w.reshape(groups, o // groups, k).transpose(0, 2, 1), g.reshape(groups, o // groups, q))
    c = saved.x_shape[1]
    return col2im(dcols.reshape(c * kh * kw, q), tuple(saved.x_shape), (kh, kw), saved.stride, saved.pads,
                  saved.dilation, saved.out_hw)
