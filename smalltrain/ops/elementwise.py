"""Elementwise ops with NumPy broadcasting: arithmetic, unary math, comparisons, where, clamp, in-place updates.

Each differentiable op is a Function; gradients come back in the broadcast shape and the engine reduces them.
"""
import math

import numpy as np

from ..autograd import grad_mode
from ..autograd.function import Function
from ..tensor import Tensor
from ._util import arr, check_same_device, fix_float, xp_of


class Add(Function):
    @staticmethod
    def forward(ctx, a, b, alpha=1):
        check_same_device("add", a, b)
        ctx.alpha = alpha
        bb = arr(b) if alpha == 1 else arr(b) * alpha
        return fix_float(arr(a) + bb, a, b)

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        return g, (g if ctx.alpha == 1 else g * ctx.alpha)


class Sub(Function):
    @staticmethod
    def forward(ctx, a, b):
        check_same_device("sub", a, b)
        return fix_float(arr(a) - arr(b), a, b)

    @staticmethod
    def backward(ctx, dout):
        return dout.array, -dout.array


class Mul(Function):
    @staticmethod
    def forward(ctx, a, b):
        check_same_device("mul", a, b)
        ctx.a, ctx.b = arr(a), arr(b)
        return fix_float(ctx.a * ctx.b, a, b)

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        da = g * ctx.b if ctx.needs_input_grad[0] else None
        db = g * ctx.a if ctx.needs_input_grad[1] else None
        return da, db


class Div(Function):
    @staticmethod
    def forward(ctx, a, b):
        check_same_device("div", a, b)
        ctx.a, ctx.b = arr(a), arr(b)
        return fix_float(ctx.a / ctx.b, a, b)

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        da = g / ctx.b if ctx.needs_input_grad[0] else None
        db = -g * ctx.a / (ctx.b * ctx.b) if ctx.needs_input_grad[1] else None
        return da, db


class Pow(Function):
    @staticmethod
    def forward(ctx, a, b):
        check_same_device("pow", a, b)
        x, e = arr(a), arr(b)
        out = fix_float(x ** e, a, b)
        ctx.x, ctx.e, ctx.out = x, e, out
        return out

    @staticmethod
    def backward(ctx, dout):
        g, x, e = dout.array, ctx.x, ctx.e
        da = db = None
        if ctx.needs_input_grad[0]:
            # torch: exponent 0 gives gradient 0 even where x ** -1 is inf
            da = g * e * (x ** (e - 1)) if not np.isscalar(e) else (g * 0 if e == 0 else g * e * x ** (e - 1))
            if not np.isscalar(e):
                da = xp_of(g).where(e == 0, 0, da)
        if ctx.needs_input_grad[1]:
            xp = xp_of(g)
            with np.errstate(divide="ignore", invalid="ignore"):
                db = g * ctx.out * xp.log(x)
            db = xp.where((x == 0) & (e >= 0), 0, db)
        return da, db


def _pick(mask_a, mask_tie, g, xp):
    return xp.where(mask_tie, g / 2, xp.where(mask_a, g, 0))


class Maximum(Function):
    @staticmethod
    def forward(ctx, a, b):
        check_same_device("maximum", a, b)
        ctx.a, ctx.b = arr(a), arr(b)
        xp = xp_of(ctx.a)
        return xp.maximum(ctx.a, ctx.b)

    @staticmethod
    def backward(ctx, dout):
        g, xp = dout.array, xp_of(dout.array)
        tie = ctx.a == ctx.b   # torch splits the gradient evenly between tied inputs
        return _pick(ctx.a > ctx.b, tie, g, xp), _pick(ctx.b > ctx.a, tie, g, xp)


class Minimum(Function):
    @staticmethod
    def forward(ctx, a, b):
        check_same_device("minimum", a, b)
        ctx.a, ctx.b = arr(a), arr(b)
        return xp_of(ctx.a).minimum(ctx.a, ctx.b)

    @staticmethod
    def backward(ctx, dout):
        g, xp = dout.array, xp_of(dout.array)
        tie = ctx.a == ctx.b
        return _pick(ctx.a < ctx.b, tie, g, xp), _pick(ctx.b < ctx.a, tie, g, xp)


def _unary(name, forward, backward, doc, needs_float=True):
    """Build a Function for y = f(x) from `forward(xp, x)` and `backward(xp, x, y, dout) -> dx`."""

    def fwd(ctx, x):
        a = x.array
        if needs_float and a.dtype.kind not in "fc":
            a = a.astype(np.float32)
        xp = xp_of(a)
        y = forward(xp, a)
        ctx.x, ctx.y = a, y
        return y

    def bwd(ctx, dout):
        return backward(xp_of(ctx.x), ctx.x, ctx.y, dout.array)

    return type(name, (Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd), "__doc__": doc})


Neg = _unary("Neg", lambda xp, x: -x, lambda xp, x, y, g: -g, "-x", needs_float=False)
Exp = _unary("Exp", lambda xp, x: xp.exp(x), lambda xp, x, y, g: g * y, "e**x")
Log = _unary("Log", lambda xp, x: xp.log(x), lambda xp, x, y, g: g / x, "natural log")
Log1p = _unary("Log1p", lambda xp, x: xp.log1p(x), lambda xp, x, y, g: g / (1 + x), "log(1 + x)")
Sqrt = _unary("Sqrt", lambda xp, x: xp.sqrt(x), lambda xp, x, y, g: g / (2 * y), "square root")
Rsqrt = _unary("Rsqrt", lambda xp, x: 1 / xp.sqrt(x), lambda xp, x, y, g: -0.5 * g * y * y * y, "1 / sqrt(x)")
Abs = _unary("Abs", lambda xp, x: xp.abs(x), lambda xp, x, y, g: g * xp.sign(x), "|x| (gradient 0 at 0)",
             needs_float=False)
Sin = _unary("Sin", lambda xp, x: xp.sin(x), lambda xp, x, y, g: g * xp.cos(x), "sine")
Cos = _unary("Cos", lambda xp, x: xp.cos(x), lambda xp, x, y, g: -g * xp.sin(x), "cosine")
Tanh = _unary("Tanh", lambda xp, x: xp.tanh(x), lambda xp, x, y, g: g * (1 - y * y), "hyperbolic tangent")
Cosh = _unary("Cosh", lambda xp, x: xp.cosh(x), lambda xp, x, y, g: g * xp.sinh(x), "hyperbolic cosine")
Sinh = _unary("Sinh", lambda xp, x: xp.sinh(x), lambda xp, x, y, g: g * xp.cosh(x), "hyperbolic sine")


def _sigmoid(xp, x):
    # numerically stable on both tails: exp of a non-positive number only
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


Sigmoid = _unary("Sigmoid", _sigmoid, lambda xp, x, y, g: g * y * (1 - y), "logistic sigmoid")


class Clamp(Function):
    @staticmethod
    def forward(ctx, x, min=None, max=None):
        a = x.array
        xp = xp_of(a)
        if min is None and max is None:
            raise RuntimeError("clamp: at least one of 'min' or 'max' must not be None")
        lo, hi = arr(min), arr(max)
        out = a
        if lo is not None:
            out = xp.maximum(out, lo)
        if hi is not None:
            out = xp.minimum(out, hi)
        ctx.a, ctx.lo, ctx.hi = a, lo, hi
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, dout):
        g, a = dout.array, ctx.a
        mask = True
        if ctx.lo is not None:
            mask = a >= ctx.lo
        if ctx.hi is not None:
            mask = mask & (a <= ctx.hi)
        return xp_of(g).where(mask, g, 0).astype(g.dtype, copy=False), None, None


class Where(Function):
    @staticmethod
    def forward(ctx, cond, a, b):
        check_same_device("where", cond, a, b)
        c = arr(cond)
        ctx.c = c
        xa, xb = arr(a), arr(b)
        xp = xp_of(c)
        return fix_float(xp.where(c, xa, xb), a, b)

    @staticmethod
    def backward(ctx, dout):
        g, xp = dout.array, xp_of(dout.array)
        da = xp.where(ctx.c, g, 0).astype(g.dtype) if ctx.needs_input_grad[1] else None
        db = xp.where(ctx.c, 0, g).astype(g.dtype) if ctx.needs_input_grad[2] else None
        return None, da, db


# ---- functional spellings -------------------------------------------------------------------------------------

def add(a, b, alpha=1):
    return Add.apply(a, b, alpha) if isinstance(a, Tensor) else Add.apply(_as_tensor_like(a, b), b, alpha)


def _as_tensor_like(x, other):
    """Scalars on the left of a binary op (`2 - t`) become tensors of the right operand's kind."""
    if isinstance(x, Tensor):
        return x
    xp = xp_of(other.array)
    return Tensor._wrap(xp.asarray(x, dtype=other.array.dtype if isinstance(x, float) and
                                   other.array.dtype.kind == "f" else None))


def sub(a, b, alpha=1):
    return Sub.apply(a, b if alpha == 1 else b * alpha)


def mul(a, b):
    return Mul.apply(a, b)


def div(a, b, rounding_mode=None):
    if rounding_mode is None:
        return Div.apply(a, b)
    xp = xp_of(arr(a) if isinstance(a, Tensor) else arr(b))
    q = xp.true_divide(arr(a), arr(b))
    q = xp.floor(q) if rounding_mode == "floor" else xp.trunc(q)
    out = q.astype(xp.result_type(arr(a), arr(b))) if q.dtype.kind == "f" and \
        xp.result_type(arr(a), arr(b)).kind in "iu" else q
    return Tensor._wrap(fix_float(out, a, b))


def pow(a, b):  # noqa: A001
    return Pow.apply(a, b)


def maximum(a, b):
    return Maximum.apply(a, b)


def minimum(a, b):
    return Minimum.apply(a, b)


def neg(x):
    return Neg.apply(x)


def exp(x):
    return Exp.apply(x)


def log(x):
    return Log.apply(x)


def log1p(x):
    return Log1p.apply(x)


def sqrt(x):
    return Sqrt.apply(x)


def rsqrt(x):
    return Rsqrt.apply(x)


def abs(x):  # noqa: A001
    return Abs.apply(x)


def sin(x):
    return Sin.apply(x)


def cos(x):
    return Cos.apply(x)


def tanh(x):
    return Tanh.apply(x)


def cosh(x):
    return Cosh.apply(x)


def sinh(x):
    return Sinh.apply(x)


def sigmoid(x):
    return Sigmoid.apply(x)


def clamp(x, min=None, max=None):  # noqa: A002
    return Clamp.apply(x, min, max)


clip = clamp


def where(condition, input=None, other=None):  # noqa: A002
    if input is None and other is None:
        return tuple(Tensor._wrap(i) for i in xp_of(arr(condition)).nonzero(arr(condition)))
    if not isinstance(input, Tensor) and not isinstance(other, Tensor):
        xp = xp_of(arr(condition))
        input = Tensor._wrap(xp.asarray(input, dtype=np.float32 if isinstance(input, float) else None))
    return Where.apply(condition, input, other)


def _compare(ufunc_name):
    def cmp(a, b):
        check_same_device(ufunc_name, a, b)
        x = arr(a)
        xp = xp_of(x if isinstance(a, Tensor) else arr(b))
        return Tensor._wrap(getattr(xp, ufunc_name)(x, arr(b)))
    cmp.__name__ = ufunc_name
    cmp.__doc__ = f"Elementwise {ufunc_name} (a bool tensor; not differentiable)."
    return cmp


eq, ne, lt, le, gt, ge = (_compare(n) for n in ("equal", "not_equal", "less", "less_equal", "greater",
                                                 "greater_equal"))
logical_and, logical_or, logical_xor = (_compare(n) for n in ("logical_and", "logical_or", "logical_xor"))


def logical_not(x):
    return Tensor._wrap(xp_of(x.array).logical_not(x.array))


def isnan(x):
    return Tensor._wrap(xp_of(x.array).isnan(x.array))


def isinf(x):
    return Tensor._wrap(xp_of(x.array).isinf(x.array))


def isfinite(x):
    return Tensor._wrap(xp_of(x.array).isfinite(x.array))


def sign(x):
    return Tensor._wrap(xp_of(x.array).sign(x.array))


def floor(x):
    return Tensor._wrap(xp_of(x.array).floor(x.array))


def ceil(x):
    return Tensor._wrap(xp_of(x.array).ceil(x.array))


def round(x):  # noqa: A001
    return Tensor._wrap(xp_of(x.array).round(x.array))


def allclose(a, b, rtol=1e-5, atol=1e-8, equal_nan=False):
    return bool(xp_of(arr(a)).allclose(arr(a), arr(b), rtol=rtol, atol=atol, equal_nan=equal_nan))


def equal(a, b):
    return a.shape == b.shape and bool((a.array == b.array).all())


# ---- in-place updates (optimizers, initializers): no graph, checked like torch -------------------------------

def check_inplace(t, op):
    if grad_mode._state.enabled and t.requires_grad and t._ctx is None:
        raise RuntimeError(f"{op}: a leaf Variable that requires grad is being used in an in-place operation "
                           "(wrap the update in smalltrain.no_grad())")


def inplace(t, op, value):
    """Write `value` (array or scalar) into t's array, keeping t's dtype and identity."""
    check_inplace(t, op)
    a = t.array
    if a.shape == () or not a.flags.writeable:
        t.array = xp_of(a).asarray(value, dtype=a.dtype).reshape(a.shape).copy()
    else:
        a[...] = value
    return t


def add_(t, other, alpha=1):
    check_inplace(t, "add_")
    o = arr(other)
    t.array += o if alpha == 1 else o * alpha
    return t


def sub_(t, other, alpha=1):
    check_inplace(t, "sub_")
    o = arr(other)
    t.array -= o if alpha == 1 else o * alpha
    return t


def mul_(t, other):
    check_inplace(t, "mul_")
    t.array *= arr(other)
    return t


def div_(t, other):
    check_inplace(t, "div_")
    t.array /= arr(other)
    return t


def addcmul_(t, t1, t2, value=1):
    check_inplace(t, "addcmul_")
    t.array += value * (arr(t1) * arr(t2)) if value != 1 else arr(t1) * arr(t2)
    return t


def addcdiv_(t, t1, t2, value=1):
    check_inplace(t, "addcdiv_")
    t.array += value * (arr(t1) / arr(t2)) if value != 1 else arr(t1) / arr(t2)
    return t


def clamp_(t, min=None, max=None):  # noqa: A002
    check_inplace(t, "clamp_")
    xp = xp_of(t.array)
    xp.clip(t.array, arr(min), arr(max), out=t.array)
    return t


def copy_(t, src):
    check_inplace(t, "copy_")
    s = arr(src)
    if isinstance(src, Tensor) and type(s) is not type(t.array):
        from ..backend import to_device
        s = to_device(s, t.device)
    t.array[...] = s
    return t


def fill_(t, value):
    check_inplace(t, "fill_")
    t.array.fill(arr(value).item() if isinstance(value, Tensor) else value)
    return t


def zero_(t):
    check_inplace(t, "zero_")
    t.array.fill(0)
    return t


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("math", "np", "grad_mode", "Function",
                                                                      "Tensor", "arr", "check_same_device",
                                                                      "fix_float", "xp_of")]
_ = math
