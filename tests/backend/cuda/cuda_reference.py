"""NumPy float64 references for the CUDA kernel tests, written independently of the kernels: convolution by
loops over kernel offsets, activations, softmax, cross-entropy, batch norm, Philox4x32-10, SGD and Adam."""
import math

import numpy as np

M64 = np.uint64(0xFFFFFFFF)


def tol(dtype):
    """The project's float32 rule (max|err| <= 1e-5 * max(1, max|ref|)); float64 kernels must be near exact."""
    return 1e-5 if np.dtype(dtype) == np.float32 else 1e-9


# --- convolution ----------------------------------------------------------------------------------------------

def conv_out_hw(h, w, kernel, stride, pads, dilation):
    return tuple((size + p0 + p1 - d * (k - 1) - 1) // s + 1
                 for size, p0, p1, d, k, s in ((h, pads[0], pads[1], dilation[0], kernel[0], stride[0]),
                                               (w, pads[2], pads[3], dilation[1], kernel[1], stride[1])))


def _windows(xp, i, j, out_hw, stride, dilation):
    """xp[:, :, oh*sh + i*dh, ow*sw + j*dw] for all (oh, ow): the input each output reads at kernel offset (i, j)."""
    (oh, ow), (sh, sw), (dh, dw) = out_hw, stride, dilation
    return xp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]


def conv2d(x, w, b, stride, pads, dilation, groups):
    """Returns (pre-activation output [N, O, OH, OW], padded x) in float64."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    out_hw = conv_out_hw(h, wd, (kh, kw), stride, pads, dilation)
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[1]), (pads[2], pads[3])))
    out = np.zeros((n, o) + out_hw)
    og = o // groups
    for g in range(groups):
        xs, ws = xp[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", _windows(xs, i, j, out_hw, stride,
                                                                                   dilation), ws[:, :, i, j])
    if b is not None:
        out += b.astype(np.float64)[None, :, None, None]
    return out, xp


def conv2d_grads(x, w, dpre, stride, pads, dilation, groups):
    """(dx, dw, db) for the gradient dpre of the pre-activation output (the adjoint of conv2d, by offsets)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    out_hw = dpre.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[1]), (pads[2], pads[3])))
    dxp, dw = np.zeros_like(xp), np.zeros_like(w)
    og = o // groups
    for g in range(groups):
        cs, os_ = slice(g * cg, (g + 1) * cg), slice(g * og, (g + 1) * og)
        for i in range(kh):
            for j in range(kw):
                win = _windows(xp[:, cs], i, j, out_hw, stride, dilation)
                dw[os_, :, i, j] = np.einsum("nohw,nchw->oc", dpre[:, os_], win)
                dwin = _windows(dxp[:, cs], i, j, out_hw, stride, dilation)
                dwin += np.einsum("nohw,oc->nchw", dpre[:, os_], w[os_, :, i, j])  # a view: writes into dxp
    dx = dxp[:, :, pads[0]:pads[0] + h, pads[2]:pads[2] + wd]
    return dx, dw, dpre.sum(axis=(0, 2, 3))


# --- activations ------------------------------------------------------------------------------------------------

_erf = np.vectorize(math.erf)
K_BETA, K_KAPPA = math.sqrt(2 / math.pi), 0.044715


def act(v, name):
    v = v.astype(np.float64)
    if name is None:
        return v
    if name == "relu":
        return np.where(v > 0, v, np.where(np.isnan(v), v, 0.0))
    if name == "gelu":
        return 0.5 * v * (1 + _erf(v / math.sqrt(2)))
    return 0.5 * v * (1 + np.tanh(K_BETA * (v + K_KAPPA * v ** 3)))


def act_grad(dout, v, name):
    """dout * act'(v); relu selects as torch's threshold_backward: 0 where v <= 0, dout elsewhere (NaN included)."""
    v, dout = v.astype(np.float64), dout.astype(np.float64)
    if name is None:
        return dout
    if name == "relu":
        return np.where(v <= 0, 0.0, dout)
    if name == "gelu":
        return dout * (0.5 * (1 + _erf(v / math.sqrt(2))) + v * np.exp(-0.5 * v * v) / math.sqrt(2 * math.pi))
    t = np.tanh(K_BETA * (v + K_KAPPA * v ** 3))
    return dout * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * K_BETA * (1 + 3 * K_KAPPA * v * v))


# --- softmax and cross-entropy ----------------------------------------------------------------------------------

def log_softmax(x, dim):
    x = x.astype(np.float64)
    m = x.max(axis=dim, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=dim, keepdims=True))


def cross_entropy(x, target, weight, ignore_index, label_smoothing, reduction):
    """torch's cross_entropy with class indices, from its definition (LossNLL.cpp's label-smoothing branch)."""
    x = x.astype(np.float64)
    if x.ndim == 1:
        x, target = x[None], np.asarray(target)[None]
    c = x.shape[1]
    logp = np.moveaxis(log_softmax(x, 1), 1, -1).reshape(-1, c)
    t = target.reshape(-1)
    w = np.ones(c) if weight is None else weight.astype(np.float64)
    valid = t != ignore_index
    tc = np.where(valid, t, 0)
    nll = -w[tc] * logp[np.arange(t.size), tc] * valid
    smooth = -(logp * w).sum(axis=1) * valid
    rows = (1 - label_smoothing) * nll + label_smoothing / c * smooth
    if reduction == "none":
        return rows.reshape(target.shape)
    if reduction == "sum":
        return rows.sum()
    return rows.sum() / (w[tc] * valid).sum()


# --- batch norm -------------------------------------------------------------------------------------------------

def batch_norm(x, rm, rv, w, b, training, momentum, eps):
    """(y, new running mean, new running var) in float64; running stats None stay None."""
    x = x.astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if training:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
        m = x.size // x.shape[1]
        if rm is not None:
            rm = (1 - momentum) * rm.astype(np.float64) + momentum * mean
            rv = (1 - momentum) * rv.astype(np.float64) + momentum * var * m / (m - 1)
    else:
        mean, var = rm.astype(np.float64), rv.astype(np.float64)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    if w is not None:
        y = y * w.astype(np.float64).reshape(shape) + b.astype(np.float64).reshape(shape)
    return y, rm, rv


# --- Philox4x32-10 and the dropout mask ----------------------------------------------------------------------

def philox4x32_10(ctr, key):
    """ctr: uint64 array [4, n] of 32-bit words, key: [2, n]; returns [4, n] (Random123's philox4x32, 10 rounds)."""
    c = [np.asarray(v, dtype=np.uint64) & M64 for v in ctr]
    k0, k1 = (np.asarray(v, dtype=np.uint64) & M64 for v in key)
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    w0, w1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
    for _ in range(10):
        p0, p1 = m0 * c[0], m1 * c[2]   # 32 x 32 -> 64 bits: no overflow in uint64
        hi0, lo0, hi1, lo1 = p0 >> np.uint64(32), p0 & M64, p1 >> np.uint64(32), p1 & M64
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        k0, k1 = (k0 + w0) & M64, (k1 + w1) & M64
    return np.stack(c)


def dropout_mask(n, p, seed, offset):
    """The keep-mask dropout.cu draws: element i uses word i % 4 of philox((i//4, offset), seed); dropped iff its
    top 24 bits are below round(p * 2^24)."""
    groups = np.arange((n + 3) // 4, dtype=np.uint64)
    ctr = [groups & M64, groups >> np.uint64(32), np.full_like(groups, offset & 0xFFFFFFFF),
           np.full_like(groups, offset >> 32)]
    key = [np.full_like(groups, seed & 0xFFFFFFFF), np.full_like(groups, seed >> 32)]
    bits = philox4x32_10(ctr, key).T.reshape(-1)[:n]
    return ((bits >> np.uint64(8)) >= np.uint64(round(p * (1 << 24)))).astype(np.uint8)


# --- optimizers (torch's single-tensor algorithms, float64) --------------------------------------------------

def sgd(p, g, buf, lr, momentum, dampening, wd, nesterov, maximize, first):
    """One step; returns (p, buf)."""
    g = -g if maximize else g
    if wd:
        g = g + wd * p
    if momentum:
        buf = g.copy() if first else momentum * buf + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf
    return p - lr * g, buf


def adam(p, g, m, v, vmax, step, lr, beta1, beta2, eps, wd, amsgrad, maximize, decoupled):
    """One step at step count `step` (already incremented); returns (p, m, v, vmax)."""
    g = -g if maximize else g
    if wd:
        if decoupled:
            p = p * (1 - lr * wd)
        else:
            g = g + wd * p
    m = m + (1 - beta1) * (g - m)
    v = v * beta2 + (1 - beta2) * g * g
    second = v
    if amsgrad:
        vmax = np.maximum(vmax, v)
        second = vmax
    denom = np.sqrt(second) / math.sqrt(1 - beta2 ** step) + eps
    return p - lr / (1 - beta1 ** step) * m / denom, m, v, vmax
