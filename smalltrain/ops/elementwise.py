"""Elementwise ops with NumPy broadcasting and torch's type promotion: arithmetic, unary math, comparisons, where,
clamp, and the in-place updates optimizers use. Gradients come back in the broadcast shape; the engine reduces them.
"""
import math

import numpy as np

from .._dtype import get_default_dtype, result_type
from ..autograd import grad_mode
from ..autograd.function import Function
from ..tensor import Tensor
from . import inplace as _inplace
from ._util import _cast, arr, broadcast_error, promote, xp_of


def _no_bool(op, what, *operands):
    for o in operands:
        if isinstance(o, bool) or getattr(getattr(o, "array", o), "dtype", None) == np.bool_:
            raise RuntimeError(f"{op}: {what} a bool tensor is not supported. If you are trying to invert a mask, "
                               "use the `~` or `logical_not()` operator instead.")


class Add(Function):
    @staticmethod
    def forward(ctx, a, b, alpha=1):
        x, y, _ = promote("add", a, b)
        ctx.alpha = alpha
        try:
            return x + y if alpha == 1 else x + y * alpha
        except ValueError as e:
            raise (broadcast_error("add", x, y) or e) from None

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        return g, (g if ctx.alpha == 1 else g * ctx.alpha)


class Sub(Function):
    @staticmethod
    def forward(ctx, a, b):
        _no_bool("sub", "Subtraction, the `-` operator, with", a, b)
        x, y, _ = promote("sub", a, b)
        try:
            return x - y
        except ValueError as e:
            raise (broadcast_error("sub", x, y) or e) from None

    @staticmethod
    def backward(ctx, dout):
        return dout.array, -dout.array


class Mul(Function):
    @staticmethod
    def forward(ctx, a, b):
        x, y, _ = promote("mul", a, b)
        need = ctx.needs_input_grad
        ctx.x = x if len(need) > 1 and need[1] else None   # save only what backward reads
        ctx.y = y if need and need[0] else None
        try:
            return x * y
        except ValueError as e:
            raise (broadcast_error("mul", x, y) or e) from None

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        return (g * ctx.y if ctx.y is not None else None), (g * ctx.x if ctx.x is not None else None)


class Div(Function):
    @staticmethod
    def forward(ctx, a, b):
        x, y, _ = promote("div", a, b, floating=True)
        ctx.x, ctx.y = x, y
        try:
            return x / y
        except ValueError as e:
            raise (broadcast_error("div", x, y) or e) from None

    @staticmethod
    def backward(ctx, dout):
        g, x, y = dout.array, ctx.x, ctx.y
        da = g / y if ctx.needs_input_grad[0] else None
        db = -g * x / (y * y) if ctx.needs_input_grad[1] else None
        return da, db


class Pow(Function):
    @staticmethod
    def forward(ctx, a, b):
        x, e, dt = promote("pow", a, b)
        if dt.kind in "iu" and (e < 0 if isinstance(e, int) else bool((e < 0).any())):
            raise RuntimeError("pow: Integers to negative integer powers are not allowed.")
        try:
            out = x ** e
        except ValueError as err:
            raise (broadcast_error("pow", x, e) or err) from None
        ctx.x, ctx.e, ctx.out = x, e, out
        return out

    @staticmethod
    def backward(ctx, dout):
        g, x, e = dout.array, ctx.x, ctx.e
        xp = xp_of(g)
        da = db = None
        if ctx.needs_input_grad[0]:
            # torch: a zero exponent gives a zero gradient even where x ** (e - 1) is inf
            if isinstance(e, (int, float)):
                da = g * 0 if e == 0 else g * e * x ** (e - 1)
            else:
                da = xp.where(e == 0, 0, g * e * x ** (e - 1))
        if ctx.needs_input_grad[1]:
            if isinstance(x, (int, float)):
                log_x = math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)
                db = g * ctx.out * log_x
            else:
                with np.errstate(divide="ignore", invalid="ignore"):
                    db = g * ctx.out * xp.log(x)
            db = xp.where((x == 0) & (e >= 0), 0, db)
        return da, db


class Maximum(Function):
    @staticmethod
    def forward(ctx, a, b):
        x, y, _ = promote("maximum", a, b)
        ctx.x, ctx.y = x, y
        try:
            return xp_of(x).maximum(x, y)
        except ValueError as e:
            raise (broadcast_error("maximum", x, y) or e) from None

    @staticmethod
    def backward(ctx, dout):
        # torch's formula: ties split the gradient; a NaN on either side passes it to both
        g, x, y = dout.array, ctx.x, ctx.y
        xp = xp_of(g)
        half = xp.where(x == y, g / 2, g)
        return xp.where(x < y, 0, half), xp.where(x > y, 0, half)


class Minimum(Function):
    @staticmethod
    def forward(ctx, a, b):
        x, y, _ = promote("minimum", a, b)
        ctx.x, ctx.y = x, y
        try:
            return xp_of(x).minimum(x, y)
        except ValueError as e:
            raise (broadcast_error("minimum", x, y) or e) from None

    @staticmethod
    def backward(ctx, dout):
        g, x, y = dout.array, ctx.x, ctx.y
        xp = xp_of(g)
        half = xp.where(x == y, g / 2, g)
        return xp.where(x > y, 0, half), xp.where(x < y, 0, half)


def _unary(name, forward, backward, doc, needs_float=True):
    """Build a Function for y = f(x) from `forward(xp, x)` and `backward(xp, x, y, dout) -> dx`."""

    def fwd(ctx, x):
        a = x.array
        if needs_float and a.dtype.kind != "f":
            a = a.astype(get_default_dtype().np)  # torch computes math on integers in the default float
        y = forward(xp_of(a), a)
        ctx.x, ctx.y = a, y
        return y

    def bwd(ctx, dout):
        return backward(xp_of(ctx.x), ctx.x, ctx.y, dout.array)

    return type(name, (Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd), "__doc__": doc})


def _neg(xp, x):
    if x.dtype == np.bool_:
        _no_bool("neg", "Negation, the `-` operator, on", x)
    return -x


def _sigmoid(xp, x):
    # numerically stable on both tails: exp of a non-positive number only
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


Neg = _unary("Neg", _neg, lambda xp, x, y, g: -g, "-x", needs_float=False)
Exp = _unary("Exp", lambda xp, x: xp.exp(x), lambda xp, x, y, g: g * y, "e**x")
Log = _unary("Log", lambda xp, x: xp.log(x), lambda xp, x, y, g: g / x, "natural log")
Log1p = _unary("Log1p", lambda xp, x: xp.log1p(x), lambda xp, x, y, g: g / (1 + x), "log(1 + x)")
Sqrt = _unary("Sqrt", lambda xp, x: xp.sqrt(x), lambda xp, x, y, g: g / (2 * y), "square root")
Rsqrt = _unary("Rsqrt", lambda xp, x: 1 / xp.sqrt(x), lambda xp, x, y, g: -0.5 * g * y * y * y, "1 / sqrt(x)")
Abs = _unary("Abs", lambda xp, x: xp.abs(x), lambda xp, x, y, g: xp.where(x > 0, g, xp.where(x < 0, -g, 0)),
             "|x| (gradient 0 at 0 and at NaN, as torch's sgn)", needs_float=False)
Sin = _unary("Sin", lambda xp, x: xp.sin(x), lambda xp, x, y, g: g * xp.cos(x), "sine")
Cos = _unary("Cos", lambda xp, x: xp.cos(x), lambda xp, x, y, g: -g * xp.sin(x), "cosine")
Tanh = _unary("Tanh", lambda xp, x: xp.tanh(x), lambda xp, x, y, g: g * (1 - y * y), "hyperbolic tangent")
Cosh = _unary("Cosh", lambda xp, x: xp.cosh(x), lambda xp, x, y, g: g * xp.sinh(x), "hyperbolic cosine")
Sinh = _unary("Sinh", lambda xp, x: xp.sinh(x), lambda xp, x, y, g: g * xp.cosh(x), "hyperbolic sine")
Sigmoid = _unary("Sigmoid", _sigmoid, lambda xp, x, y, g: g * y * (1 - y), "logistic sigmoid")


class Clamp(Function):
    @staticmethod
    def forward(ctx, x, min=None, max=None):  # noqa: A002
        if min is None and max is None:
            raise RuntimeError("clamp: At least one of 'min' or 'max' must not be None")
        dt = result_type(x, min, max)
        a, lo, hi = (_cast(v, dt) for v in (x.array, arr(min), arr(max)))
        xp = xp_of(a)
        try:
            out = a if lo is None else xp.maximum(a, lo)
            out = out if hi is None else xp.minimum(out, hi)
        except ValueError as e:
            raise (broadcast_error("clamp", a, lo if lo is not None else hi) or
                   broadcast_error("clamp", a, hi) or e) from None
        ctx.a, ctx.lo, ctx.hi = a, lo, hi
        return out.astype(dt, copy=False)

    @staticmethod
    def backward(ctx, dout):
        # torch's clamp_backward_min_max: a tensor bound takes the gradient where it decided the output
        g, a, lo, hi = dout.array, ctx.a, ctx.lo, ctx.hi
        xp = xp_of(g)
        need = ctx.needs_input_grad
        mask = True
        if lo is not None:
            mask = a >= lo
        if hi is not None:
            mask = mask & (a <= hi)
        dx = xp.where(mask, g, 0) if need[0] else None
        dlo = dhi = None
        if len(need) > 1 and need[1]:
            dlo = xp.where((a < lo) & (lo < hi) if hi is not None else a < lo, g, 0)
        if len(need) > 2 and need[2]:
            dhi = xp.where((a > hi) | (hi < lo) if lo is not None else a > hi, g, 0)
        return dx, dlo, dhi


class Where(Function):
    @staticmethod
    def forward(ctx, cond, a, b):
        c = arr(cond)
        if getattr(c, "dtype", None) != np.bool_:
            raise RuntimeError(f"where: expected condition to be a boolean tensor, but got a tensor with dtype "
                               f"{getattr(c, 'dtype', type(c).__name__)}")
        x, y, dt = promote("where", a, b)
        ctx.c = c
        try:
            out = xp_of(c).where(c, x, y)
        except ValueError as e:
            raise (broadcast_error("where", c, x) or broadcast_error("where", c, y) or
                   broadcast_error("where", x, y) or e) from None
        return out if out.dtype == dt else out.astype(dt)

    @staticmethod
    def backward(ctx, dout):
        g, xp = dout.array, xp_of(dout.array)
        da = xp.where(ctx.c, g, 0) if ctx.needs_input_grad[1] else None
        db = xp.where(ctx.c, 0, g) if ctx.needs_input_grad[2] else None
        return None, da, db


# ---- functional spellings -------------------------------------------------------------------------------------

def add(a, b, alpha=1):
    return Add.apply(a, b, alpha)


def _as_tensor_like(x, other):
    """A non-Tensor operand as a Tensor on `other`'s device (kept for callers; ops take scalars directly)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float)):
        dt = result_type(x)
        return Tensor._wrap(xp_of(other.array).asarray(x, dtype=dt))
    return Tensor._wrap(xp_of(other.array).asarray(x))


def sub(a, b, alpha=1):
    return Sub.apply(a, b if alpha == 1 else b * alpha)


def mul(a, b):
    return Mul.apply(a, b)


def div(a, b, rounding_mode=None):
    if rounding_mode is None:
        return Div.apply(a, b)
    if rounding_mode not in ("trunc", "floor"):
        raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
                         f"'{rounding_mode}'")
    x, y, dt = promote("div", a, b)
    xp = xp_of(x if hasattr(x, "dtype") else y)
    if dt.kind in "iu":
        check_int_divisor(y)
    if dt.kind in "iu" and rounding_mode == "floor":
        return Tensor._wrap(xp.floor_divide(x, y))
    with np.errstate(divide="ignore", invalid="ignore"):
        q = xp.true_divide(x, y)
    q = xp.floor(q) if rounding_mode == "floor" else xp.trunc(q)
    return Tensor._wrap(q.astype(dt, copy=False))


def check_int_divisor(y):
    """torch's CPU kernels raise for an integer `//`, `%` or rounding division by zero (CUDA's give garbage and no
    error: checking there would cost a host sync, so only the CPU checks, as torch)."""
    if isinstance(y, (int, np.integer)) and not isinstance(y, bool):
        if y == 0:
            raise RuntimeError("ZeroDivisionError")
    elif isinstance(y, np.ndarray) and y.dtype.kind in "iub" and not y.all():
        raise RuntimeError("ZeroDivisionError")


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
    return Where.apply(condition, input, other)


def _compare(name, ufunc_name):
    def cmp(a, b):
        if b is None and name in ("eq", "ne"):
            return name == "ne"   # `t == None` is False, as in torch (so `t in [None, ...]` works)
        x, y = arr(a), arr(b)
        xp = xp_of(x if isinstance(a, Tensor) else y)
        try:
            return Tensor._wrap(getattr(xp, ufunc_name)(x, y))
        except ValueError as e:
            raise (broadcast_error(name, x, y) or e) from None
    cmp.__name__ = name
    cmp.__doc__ = f"Elementwise {ufunc_name} (a bool tensor; not differentiable)."
    return cmp


eq, ne, lt, le, gt, ge = (_compare(n, u) for n, u in (("eq", "equal"), ("ne", "not_equal"), ("lt", "less"),
                                                        ("le", "less_equal"), ("gt", "greater"),
                                                        ("ge", "greater_equal")))
logical_and, logical_or, logical_xor = (_compare(n, n) for n in ("logical_and", "logical_or", "logical_xor"))
bitwise_and, bitwise_or, bitwise_xor = (_compare(n, n) for n in ("bitwise_and", "bitwise_or", "bitwise_xor"))


def _elementwise(ufunc_name, doc):
    def fn(x):
        return Tensor._wrap(getattr(xp_of(x.array), ufunc_name)(x.array))
    fn.__name__, fn.__doc__ = ufunc_name, doc
    return fn


logical_not = _elementwise("logical_not", "Elementwise not (a bool tensor).")
bitwise_not = _elementwise("invert", "`~x`: logical not for bool tensors, bitwise not for integers.")
isnan = _elementwise("isnan", "True where x is NaN.")
isinf = _elementwise("isinf", "True where x is +-inf.")
isfinite = _elementwise("isfinite", "True where x is neither NaN nor +-inf.")
sign = _elementwise("sign", "-1, 0 or 1 (not differentiable here).")
floor = _elementwise("floor", "Round down (not differentiable here).")
ceil = _elementwise("ceil", "Round up (not differentiable here).")
round = _elementwise("round", "Round half to even, as torch does (not differentiable here).")  # noqa: A001


def allclose(a, b, rtol=1e-5, atol=1e-8, equal_nan=False):
    return bool(xp_of(arr(a)).allclose(arr(a), arr(b), rtol=rtol, atol=atol, equal_nan=equal_nan))


def equal(a, b):
    return a.shape == b.shape and bool((a.array == b.array).all())


# ---- in-place updates: written into the tensor's memory; recorded through ops/inplace.py while grad mode is on ----

def check_inplace(t, op):
    """In-place writes while recording are refused on a leaf that requires grad (and on views of one), as in torch."""
    if grad_mode._state.enabled:
        _inplace.check_leaf(t, op)


def _operand(t, op, other, floating=False):
    """The raw `other` of an in-place op on t, after torch's checks: device, castability."""
    o = other.array if isinstance(other, Tensor) else other
    a = t.array
    od = getattr(o, "dtype", None)
    if od is not None and type(o) is not type(a):
        raise RuntimeError(f"{op}: expected all tensors to be on the same device, got {t.device} and "
                           f"{getattr(other, 'device', type(o).__name__)}")
    if od != a.dtype or floating:
        r = result_type(t, other)
        if floating and r.kind != "f":
            r = get_default_dtype().np
        if (r.kind == "f" and a.dtype.kind != "f") or (r.kind != "b" and a.dtype.kind == "b"):
            raise RuntimeError(f"{op}: result type {r} can't be cast to the desired output type {a.dtype}")
    return o


def _apply_inplace(t, op, ufunc, value):
    _inplace.before_write()
    a = t.array
    try:
        ufunc(a, value, out=a, casting="unsafe")
    except ValueError as e:
        raise RuntimeError(f"{op}: cannot update a tensor of shape {list(a.shape)} in place with an operand of "
                           f"shape {list(getattr(value, 'shape', ()))} ({e})") from None
    _inplace.versions.bump(t)
    return t


def add_(t, other, alpha=1):
    if _inplace.recording(t, other):
        _operand(t, "add_", other)
        return _inplace.recorded(t, "add_", lambda x: add(x, other, alpha), saves_input=False)
    o = _operand(t, "add_", other)
    return _apply_inplace(t, "add_", xp_of(t.array).add, o if alpha == 1 else o * alpha)


def sub_(t, other, alpha=1):
    if _inplace.recording(t, other):
        _operand(t, "sub_", other)
        return _inplace.recorded(t, "sub_", lambda x: sub(x, other, alpha), saves_input=False)
    o = _operand(t, "sub_", other)
    return _apply_inplace(t, "sub_", xp_of(t.array).subtract, o if alpha == 1 else o * alpha)


def mul_(t, other):
    if _inplace.recording(t, other):
        _operand(t, "mul_", other)
        return _inplace.recorded(t, "mul_", lambda x: mul(x, other))
    return _apply_inplace(t, "mul_", xp_of(t.array).multiply, _operand(t, "mul_", other))


def div_(t, other, rounding_mode=None):
    if rounding_mode is not None:
        return _inplace.write(t, div(t.detach(), other, rounding_mode=rounding_mode).array) \
            if not _inplace.recording(t, other) else _inplace.recorded(t, "div_", lambda x: div(x, other,
                                                                                                 rounding_mode))
    if _inplace.recording(t, other):
        _operand(t, "div_", other, floating=True)
        return _inplace.recorded(t, "div_", lambda x: div(x, other))
    return _apply_inplace(t, "div_", xp_of(t.array).true_divide, _operand(t, "div_", other, floating=True))


def addcmul_(t, t1, t2, value=1):
    if _inplace.recording(t, t1, t2):
        return _inplace.recorded(t, "addcmul_", lambda x: add(x, mul(t1, t2) if value == 1 else mul(t1, t2) * value),
                                 saves_input=False)
    _operand(t, "addcmul_", t1)
    p = arr(t1) * arr(t2)
    return _apply_inplace(t, "addcmul_", xp_of(t.array).add, p if value == 1 else value * p)


def addcdiv_(t, t1, t2, value=1):
    if _inplace.recording(t, t1, t2):
        return _inplace.recorded(t, "addcdiv_", lambda x: add(x, div(t1, t2) if value == 1 else div(t1, t2) * value),
                                 saves_input=False)
    _operand(t, "addcdiv_", t1, floating=True)
    q = arr(t1) / arr(t2)
    return _apply_inplace(t, "addcdiv_", xp_of(t.array).add, q if value == 1 else value * q)


def clamp_(t, min=None, max=None):  # noqa: A002
    if min is None and max is None:
        raise RuntimeError("clamp_: At least one of 'min' or 'max' must not be None")
    if _inplace.recording(t, min, max):
        return _inplace.recorded(t, "clamp_", lambda x: clamp(x, min, max))
    xp = xp_of(t.array)
    if min is not None:
        _apply_inplace(t, "clamp_", xp.maximum, _operand(t, "clamp_", min))
    if max is not None:
        _apply_inplace(t, "clamp_", xp.minimum, _operand(t, "clamp_", max))
    return t


clip_ = clamp_


def copy_(t, src, non_blocking=False):
    if _inplace.recording(t, src):
        if isinstance(src, Tensor) and src.device != t.device:
            src = src.to(t.device)
        return _inplace.recorded(t, "copy_", lambda x: _inplace.Overwrite.apply(x, src), saves_input=False)
    _inplace.before_write()
    s = arr(src)
    if isinstance(src, Tensor) and type(s) is not type(t.array):
        from ..backend import to_device
        s = to_device(s, t.device)
    try:
        t.array[...] = s
    except ValueError as e:
        raise RuntimeError(f"copy_: cannot copy a tensor of shape {list(getattr(s, 'shape', ()))} into one of "
                           f"shape {list(t.array.shape)} ({e})") from None
    _inplace.versions.bump(t)
    return t


def fill_(t, value):
    if _inplace.recording(t, value):
        return _inplace.recorded(t, "fill_", lambda x: _inplace.Overwrite.apply(x, value), saves_input=False)
    _inplace.before_write()
    t.array.fill(value.item() if isinstance(value, Tensor) else value)
    _inplace.versions.bump(t)
    return t


def zero_(t):
    if _inplace.recording(t):
        return _inplace.recorded(t, "zero_", lambda x: _inplace.Overwrite.apply(x, 0), saves_input=False)
    _inplace.before_write()
    t.array.fill(0)
    _inplace.versions.bump(t)
    return t


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("math", "np", "grad_mode", "Function",
                                                                      "Tensor", "arr", "broadcast_error",
                                                                      "promote", "xp_of", "get_default_dtype",
                                                                      "result_type")]
