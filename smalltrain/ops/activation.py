"""Activations, each one fused Function (forward and its closed-form derivative side by side): relu, relu6, hardtanh,
leaky_relu, elu, softplus, gelu, silu, hardswish, softmax, log_softmax; sigmoid and tanh come from ops.elementwise.
Also erf.
"""
import math
import warnings

import numpy as np

from ..autograd import grad_mode, pending, versions
from ..autograd.function import Function
from ..backend import cpu
from ..backend.cuda import activation as cuda_activation
from ..tensor import Tensor
from ._util import normalize_dim, xp_of
from .elementwise import sigmoid, tanh  # noqa: F401  (re-exported: torch.nn.functional has both)
from .inplace import recorded

_SQRT1_2 = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_KAPPA = 0.044715


class _Pointwise(Function):
    """y = f(x; params). A subclass sets `name` and gives `fwd(xp, a, *params) -> (y, saved)` and
    `bwd(xp, g, saved, *params) -> dx`; `ints` says whether integer inputs are allowed (no gradient)."""
    name = "pointwise"
    ints = False
    cuda = None   # (forward, backward) launcher names in smalltrain.backend.cuda.activation, if it has kernels

    @staticmethod
    def forward(ctx, x, *params):
        cls = ctx.fn
        expect_tensor(cls.name, x)
        a = x.array
        if a.dtype.kind != "f" and not (cls.ints and a.dtype.kind in "iu"):
            raise NotImplementedError(f'{cls.name}: not implemented for {x.dtype} input; expected a floating '
                                      f'point tensor, got shape {list(a.shape)}')
        if cls.cuda and not isinstance(a, np.ndarray) and a.dtype.kind == "f":
            y, saved = _cuda_launcher(cls.cuda[0])(a, *params)
            ctx.on_kernel = True
        else:
            with np.errstate(all="ignore"):   # inf and NaN inputs give inf and NaN, as in torch, no warnings
                y, saved = cls.fwd(xp_of(a), a, *params)
        if ctx.needs_input_grad[0]:
            ctx.saved, ctx.params = saved, params
        return y

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        if getattr(ctx, "on_kernel", False):
            return _cuda_launcher(ctx.fn.cuda[1])(g, ctx.saved)
        return pointwise_backward(ctx.fn, g, ctx.saved, ctx.params)


def pointwise_backward(fn, g, saved, params):
    """fn.bwd (a _Pointwise subclass) of the gradient g and what its fwd saved, on NumPy or CuPy arrays. On NumPy the
    gradient first takes the layout of what forward saved, so that the backward's passes run contiguous."""
    xp = xp_of(g)
    if xp is np:
        ref = saved[0] if isinstance(saved, tuple) else saved
        g = cpu.in_layout_of(g, ref) if isinstance(ref, np.ndarray) else g
    with np.errstate(all="ignore"):
        return fn.bwd(xp, g, saved, *params)


def _cuda_launcher(name):
    return getattr(cuda_activation, name)


class Relu(_Pointwise):
    # the output is saved, not the input: the next layer usually keeps it anyway
    name, ints = "relu", True
    cuda = ("relu_forward", "relu_backward")

    @staticmethod
    def fwd(xp, a):
        y = xp.maximum(a, 0)
        return y, y

    # torch's threshold_backward(grad, result, 0): blocked where result <= 0, so a NaN input passes its gradient
    @staticmethod
    def bwd(xp, g, y):
        if xp is np and np.isfinite(g).all():   # (inf * 0 would be NaN where torch gives 0)
            # y = max(x, 0) is >= 0 or NaN, so y != 0 is exactly "not y <= 0" (a NaN keeps its gradient). A float
            # mask times g: np.where branches per element and a bool operand is cast per element, each ~2x slower
            keep = (y != 0).astype(g.dtype)
            keep *= g
            return keep
        return xp.where(~(y <= 0), g, 0)


class Hardtanh(_Pointwise):
    name, ints = "hardtanh", True

    @staticmethod
    def fwd(xp, a, lo, hi):
        return xp.clip(a, lo, hi).astype(a.dtype, copy=False), a

    @staticmethod
    def bwd(xp, g, a, lo, hi):
        # torch's formula: no gradient at the bounds or outside. At NaN torch's builds disagree (its scalar and
        # some vector kernels pass the gradient, others block it); we pass it, like relu's threshold_backward
        return xp.where((a <= lo) | (a >= hi), 0, g)


class LeakyRelu(_Pointwise):
    name = "leaky_relu"
    fwd = staticmethod(lambda xp, a, s: (xp.where(a > 0, a, a * s), a))
    bwd = staticmethod(lambda xp, g, a, s: xp.where(a > 0, g, g * s))


class Elu(_Pointwise):
    name = "elu"

    @staticmethod
    def fwd(xp, a, alpha):
        e = xp.exp(xp.minimum(a, 0))   # clamped: exp of large positives would overflow in the unused branch
        return xp.where(a <= 0, (e - 1) * alpha, a), (a, e)

    @staticmethod
    def bwd(xp, g, saved, alpha):
        a, e = saved
        return xp.where(a <= 0, g * (e * alpha), g)   # torch's formula; at NaN the gradient passes (see Hardtanh)


class Softplus(_Pointwise):
    name = "softplus"

    @staticmethod
    def fwd(xp, a, beta, threshold):
        z = a * beta
        linear = z > threshold
        e = xp.exp(xp.minimum(z, threshold))
        return xp.where(linear, a, xp.log1p(e) / beta), (linear, e)

    @staticmethod
    def bwd(xp, g, saved, beta, threshold):
        linear, e = saved
        return xp.where(linear, g, g * (e / (e + 1)))


class Gelu(_Pointwise):
    name = "gelu"
    cuda = ("gelu_forward", "gelu_backward")

    @staticmethod
    def fwd(xp, a, approximate):
        if approximate == "tanh":
            t = xp.tanh(_SQRT_2_OVER_PI * (a + _KAPPA * a * a * a))
            return 0.5 * a * (1 + t), (a, t)
        if xp is np and a.dtype == np.float32:
            cdf, pdf_exp = _normal_cdf_f32(a)
            return a * cdf, (a, cdf, pdf_exp)
        return a * (0.5 * (1 + erf(a * _SQRT1_2))), (a, None, None)

    @staticmethod
    def bwd(xp, g, saved, approximate):
        if approximate == "tanh":   # c is tanh(inner)
            a, c = saved
            right = 0.5 * a * (1 - c * c) * _SQRT_2_OVER_PI * (1 + 3 * _KAPPA * a * a)
            return g * (0.5 * (1 + c) + right)
        a, c, e = saved
        if c is None:   # float64 (and float16) inputs: the exact erf again, no float32 shortcut saved
            c, e = 0.5 * (1 + erf(a * _SQRT1_2)), xp.exp(-0.5 * a * a)
        dx = a * e                  # Phi(a) + a * phi(a), phi(a) = exp(-a^2 / 2) / sqrt(2 pi); in place after
        dx *= dx.dtype.type(_INV_SQRT_2PI)
        dx += c
        dx *= g
        return dx


def _stable_sigmoid(xp, a):
    e = xp.exp(-xp.abs(a))   # exp of non-positive numbers only: no overflow on either tail
    return xp.where(a >= 0, 1 / (1 + e), e / (1 + e)).astype(a.dtype, copy=False)


class Silu(_Pointwise):
    name = "silu"

    @staticmethod
    def fwd(xp, a):
        s = _stable_sigmoid(xp, a)
        return a * s, (a, s)

    @staticmethod
    def bwd(xp, g, saved):
        a, s = saved
        return g * s * (1 + a * (1 - s))


class Hardswish(_Pointwise):
    name = "hardswish"

    @staticmethod
    def fwd(xp, a):
        return a * xp.clip(a + 3, 0, 6) / 6, a   # torch's order: x * relu6(x + 3), then / 6

    @staticmethod
    def bwd(xp, g, a):
        # torch's hardswish_backward: 0 up to -3, x / 3 + 1/2 on (-3, 3), 1 from 3. At NaN its scalar kernel passes
        # the gradient and its vector kernels give NaN; we pass it, as Hardtanh does
        return xp.where(a <= -3, 0, xp.where(a < 3, g * (a / 3 + 0.5), g)).astype(g.dtype, copy=False)


# ---- softmax family -------------------------------------------------------------------------------------------

def _shifted(a, axis):
    """x - max(x) along axis; NaN rows stay NaN and a row of -inf gives NaN, as in torch's kernels."""
    with np.errstate(invalid="ignore"):
        return a - a.max(axis=axis, keepdims=True)


class Softmax(Function):
    @staticmethod
    def forward(ctx, x, dim):
        a = x.array
        xp = xp_of(a)
        if a.size == 0:   # NumPy cannot take the max of an empty dim
            e = a.copy()
        else:
            e = xp.exp(_shifted(a, dim))
            e /= e.sum(axis=dim, keepdims=True)
        ctx.y, ctx.dim = e, dim
        return e

    @staticmethod
    def backward(ctx, dout):
        g, y = dout.array, ctx.y
        return y * (g - (g * y).sum(axis=ctx.dim, keepdims=True)), None


class LogSoftmax(Function):
    @staticmethod
    def forward(ctx, x, dim):
        a = x.array
        xp = xp_of(a)
        if a.size == 0:
            s = a.copy()
        else:
            s = _shifted(a, dim)
            s -= xp.log(xp.exp(s).sum(axis=dim, keepdims=True))
        ctx.y, ctx.dim = s, dim
        return s

    @staticmethod
    def backward(ctx, dout):
        g, y = dout.array, ctx.y
        return g - xp_of(g).exp(y) * g.sum(axis=ctx.dim, keepdims=True), None


def expect_tensor(op, t, name="input", pos=1):
    """torch's TypeError for a non-Tensor argument (before anything reads `.array`)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}(): argument '{name}' (position {pos}) must be Tensor, not {type(t).__name__}")


def _softmax_input(op, x, dim, dtype, stacklevel):
    expect_tensor(op, x)
    if dim is None:
        dim = 0 if x.array.ndim in (0, 1, 3) else 1
        warnings.warn(f"Implicit dimension choice for {op} has been deprecated. Change the call to include dim=X "
                      "as an argument.", UserWarning, stacklevel=stacklevel)
    if dtype is not None:
        x = x.to(dtype)
    if x.array.dtype.kind != "f":
        raise NotImplementedError(f"{op}: not implemented for {x.dtype} input of shape {list(x.array.shape)}; "
                                  "expected a floating point tensor (or pass dtype=)")
    dim = normalize_dim(op, dim, x.array.ndim)
    if x.array.ndim == 0:
        return x.reshape(1), 0, True
    return x, dim, False


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    x, d, scalar = _softmax_input("softmax", input, dim, dtype, _stacklevel)
    y = Softmax.apply(x, d)
    return y.reshape(()) if scalar else y


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dtype is None and (dim == 1 or dim == -1) and isinstance(input, Tensor):
        a = pending.raw_array(input)   # (not running a held launch that writes it: log_softmax keeps it held)
        if type(a) is not np.ndarray and a.ndim == 2 and a.dtype.kind == "f":
            # on CUDA nll_loss after it may absorb it: cross_entropy, one fused op (ops/fusion.py)
            return pending.defer("log_softmax", LogSoftmax.apply, (input, 1))
    x, d, scalar = _softmax_input("log_softmax", input, dim, dtype, _stacklevel)
    y = LogSoftmax.apply(x, d)
    return y.reshape(()) if scalar else y


# ---- the functional spellings ---------------------------------------------------------------------------------

def apply_inplace(x, op, fn):
    """torch's `inplace=True`: x is overwritten with fn(x) and returned; while recording, x (and its base, for a
    view) takes the op's history, as the other in-place ops (ops/inplace.py recorded)."""
    if grad_mode._state.enabled and x.requires_grad:
        return recorded(x, op, fn)
    y = fn(x).array
    if x.array.ndim and getattr(x.array.flags, "writeable", True):
        x.array[...] = y
    else:
        x.array = y
    versions.bump(x)
    return x


def _maybe_inplace(x, op, fn, inplace):
    return apply_inplace(x, op, fn) if inplace else fn(x)


def _deferred_on_cpu(input, name):
    """On the CPU, ReLU or GELU of a batched float image is deferred: a max_pool2d after it pools first and runs
    the activation on the pooled values (ops/fusion.py, ops/pool.py ActMaxPool2d); anything else runs it."""
    a = input.array
    if type(a) is np.ndarray and a.ndim == 4 and a.dtype.kind == "f" and a.size:
        return pending.defer("act_cpu", apply_named, (input, name))
    return None


def relu(input, inplace=False):
    if type(input) is pending.PendingTensor and not inplace:   # a deferred layer may take it (ops/fusion.py)
        out = pending.absorb(input, "act", "relu")
        if out is not None:
            return out
    if not inplace and type(input) is Tensor:
        out = _deferred_on_cpu(input, "relu")
        if out is not None:
            return out
    return _maybe_inplace(input, "relu", Relu.apply, inplace)


def relu_(input):
    return apply_inplace(input, "relu_", Relu.apply)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val cannot be greater than max_val (got min_val={min_val}, "
                         f"max_val={max_val})")
    return _maybe_inplace(input, "hardtanh", lambda t: Hardtanh.apply(t, min_val, max_val), inplace)


def relu6(input, inplace=False):
    return _maybe_inplace(input, "relu6", lambda t: Hardtanh.apply(t, 0.0, 6.0), inplace)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    return _maybe_inplace(input, "leaky_relu", lambda t: LeakyRelu.apply(t, negative_slope), inplace)


def elu(input, alpha=1.0, inplace=False):
    return _maybe_inplace(input, "elu", lambda t: Elu.apply(t, alpha), inplace)


def softplus(input, beta=1.0, threshold=20.0):
    return Softplus.apply(input, beta, threshold)


def gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"gelu: approximate argument must be either none or tanh, got {approximate!r}")
    if type(input) is pending.PendingTensor:   # a deferred layer may take it (ops/fusion.py)
        out = pending.absorb(input, "act", "gelu" if approximate == "none" else "gelu_tanh")
        if out is not None:
            return out
    if type(input) is Tensor:
        out = _deferred_on_cpu(input, "gelu" if approximate == "none" else "gelu_tanh")
        if out is not None:
            return out
    return Gelu.apply(input, approximate)


def silu(input, inplace=False):
    return _maybe_inplace(input, "silu", Silu.apply, inplace)


def hardswish(input, inplace=False):
    return _maybe_inplace(input, "hardswish", Hardswish.apply, inplace)


# ---- erf: W. J. Cody's rational approximations (Math. Comp. 1969), the three intervals of CALERF -------------

_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02, 3.20937758913846947e03,
      1.85777706184603153e-1)
_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03, 2.84423683343917062e03)
_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01, 2.98635138197400131e02,
      8.81952221241769090e02, 1.71204761263407058e03, 2.05107837782607147e03, 1.23033935479799725e03,
      2.15311535474403846e-8)
_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02, 1.62138957456669019e03,
      3.29079923573345963e03, 4.36261909014324716e03, 3.43936767414372164e03, 1.23033935480374942e03)
_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1, 1.60837851487422766e-2,
      6.58749161529837803e-4, 1.63153871373020978e-2)
_Q = (2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1, 6.05183413124413191e-2,
      2.33520497626869185e-3)


def _ratio(z, num, den, n):
    """Cody's nested form (((num[-1] z + num[0]) z + ...) + num[n]) / ((z + den[0]) z + ... + den[n]), computed
    in place: two temporaries whatever the degree (allocation, not arithmetic, dominates these passes)."""
    xnum, xden = z * num[-1], z.copy()
    for i in range(n):
        xnum += num[i]
        xnum *= z
        xden += den[i]
        xden *= z
    xnum += num[n]
    xden += den[n]
    xnum /= xden
    return xnum


def _erfc_tail(y):
    """erfc(y) for float64 y > 0.46875 (NaN stays NaN); y is overwritten. exp(-y^2) is split as Cody does so that
    its rounding error stays small."""
    xp = xp_of(y)
    xp.minimum(y, 27.0, out=y)    # erfc underflows to 0 beyond ~26.5; the clamp keeps inf out of y - ysq
    r = _ratio(y, _C, _D, 7)
    big = y > 4.0
    if big.any():
        yb = y[big]
        z = 1 / (yb * yb)
        r[big] = (1 / math.sqrt(math.pi) - z * _ratio(z, _P, _Q, 4)) / yb
    ysq = xp.trunc(y * 16)
    ysq /= 16
    d = y - ysq
    y += ysq
    d *= y          # (y - ysq) * (y + ysq) = y^2 - ysq^2
    r *= xp.exp(-d, out=d)
    ysq *= ysq
    r *= xp.exp(-ysq, out=ysq)
    return r


_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_AS_SCALE = np.float32(_AS_P * _SQRT1_2)                  # t = 1 / (1 + p |a| / sqrt 2)
_AS_HALF = tuple(np.float32(0.5 * c) for c in _AS_A)      # halved: the polynomial gives Phi(-|a|) directly
_SIGN_BIT = np.int32(-2 ** 31)


def _normal_cdf_f32(a):
    """(Phi(a), exp(-a^2 / 2)) for float32 GELU, in float32 with Abramowitz & Stegun 7.1.26 (|erf error| <= 1.5e-7,
    below float32's resolution of Phi near 1): ~60x faster than the exact float64 erf, which float64 inputs (and
    gradcheck) still use. The exponential is the backward's phi(a) up to 1 / sqrt(2 pi), so it is returned too.

    Each step is one in-place NumPy pass over the array (about 20 of them, 3 arrays allocated). The sign is put
    back with integer bit operations: np.where on a random sign pattern and np.copysign each cost more than the
    whole polynomial on this data (a branch per element; no SIMD loop)."""
    if a.ndim == 0:
        c, e = _normal_cdf_f32(a.reshape(1))
        return c.reshape(()), e.reshape(())
    t = np.abs(a)
    t *= _AS_SCALE
    t += 1
    np.reciprocal(t, out=t)
    r = t * _AS_HALF[4]
    for c in _AS_HALF[3::-1]:      # Horner: t * (a1 + t * (a2 + ...)) / 2
        r += c
        r *= t
    e = np.multiply(a, a, out=t)
    e *= np.float32(-0.5)
    np.exp(e, out=e)
    r *= e                          # Phi(-|a|) = erfc(|a| / sqrt 2) / 2
    np.subtract(np.float32(0.5), r, out=r)        # |Phi(a) - 1/2|, non-negative: its sign bit is clear
    bits = r.view(np.int32)
    np.bitwise_or(bits, np.bitwise_and(a.view(np.int32), _SIGN_BIT), out=bits)   # takes a's sign (-0 too)
    r += np.float32(0.5)
    return r, e


def erf(a):
    """The error function of a float array, elementwise: ~2 ulp in float64 (checked against math.erf); float16
    and float32 inputs are evaluated in float64 and rounded once, which makes them correctly rounded."""
    xp = xp_of(a)
    if xp is not np:
        from cupyx.scipy.special import erf as cupy_erf
        return cupy_erf(a)
    if a.dtype != np.float64:
        return erf(a.astype(np.float64)).astype(a.dtype)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        small = np.abs(a) <= 0.46875
        if small.all():
            return a * _ratio(a * a, _A, _B, 3)
        out = np.empty_like(a)
        ys = a[small]
        out[small] = ys * _ratio(ys * ys, _A, _B, 3)
        tail = ~small
        at = a[tail]
        r = _erfc_tail(np.abs(at))
        np.subtract(0.5, r, out=r)   # erf = (0.5 - erfc) + 0.5, Cody's order
        r += 0.5
        out[tail] = np.copysign(r, at, out=r)
    return out


_NAMED = {"relu": (Relu, ()), "gelu": (Gelu, ("none",)), "gelu_tanh": (Gelu, ("tanh",))}


def named_pointwise(activation):
    """(Function class, its parameters) of a fused layer's activation name: 'relu', 'gelu' (erf) or 'gelu_tanh'."""
    found = _NAMED.get(activation) if isinstance(activation, str) else None
    if found is None:
        raise ValueError(f"activation must be None, 'relu', 'gelu' or 'gelu_tanh', got {activation!r}")
    return found


def apply_named(x, activation):
    """x through the activation of a fused layer's name: None, 'relu', 'gelu' (erf) or 'gelu_tanh'."""
    if activation is None:
        return x
    cls, params = named_pointwise(activation)
    return cls.apply(x, *params)
