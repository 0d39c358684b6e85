"""CUDA pointwise activations (kernels/activation.cu): relu and gelu (erf or tanh approximation), forward and
backward, on any shape (flat over contiguous memory)."""
from . import cupy
from ._common import check_array, check_dtype, check_float, contiguous, i32, i64, launch

_GELU = {"none": 2, "tanh": 3}


def _forward(op, x, act):
    check_array(op, "input", x)
    check_float(op, "input", x)
    with x.device:
        x = contiguous(x)
        out = cupy().empty_like(x)
        launch("activation", "act_fwd", x.dtype, x.size, (x, out, i64(x.size), i32(act)))
    return out


def _backward(op, dout, x, act):
    check_array(op, "grad_output", dout)
    check_array(op, "input", x)
    check_float(op, "input", x)
    check_dtype(op, "grad_output", dout, x.dtype)
    if dout.shape != x.shape:
        raise RuntimeError(f"{op}: expected grad_output of shape {list(x.shape)}, got {list(dout.shape)}")
    if dout.device.id != x.device.id:
        raise RuntimeError(f"{op}: expected all tensors to be on the same device, but found at least two devices, "
                           f"cuda:{x.device.id} and cuda:{dout.device.id}")
    with x.device:
        dout, x = contiguous(dout), contiguous(x)
        dx = cupy().empty_like(x)
        launch("activation", "act_bwd", x.dtype, x.size, (dout, x, dx, i64(x.size), i32(act)))
    return dx


def relu_forward(x):
    """out = max(x, 0) (NaN stays NaN). Returns (out, saved) with saved = out, which relu_backward needs."""
    out = _forward("relu", x, 1)
    return out, out


def relu_backward(dout, saved):
    """dx = dout where the forward output > 0, else 0 (torch's threshold_backward); saved is relu_forward's."""
    return _backward("relu_backward", dout, saved, 1)


def _gelu_code(op, approximate):
    if approximate not in _GELU:
        raise RuntimeError(f"{op}: approximate argument must be either none or tanh, got {approximate!r}")
    return _GELU[approximate]


def gelu_forward(x, approximate="none"):
    """torch's gelu: x * Phi(x) ('none') or 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ('tanh').

    Returns (out, saved) with saved = (x, approximate) for gelu_backward.
    """
    code = _gelu_code("gelu", approximate)
    return _forward("gelu", x, code), (x, approximate)


def gelu_backward(dout, saved):
    """dx = dout * gelu'(x), in the operation order of torch's GeluBackward; saved is gelu_forward's."""
    x, approximate = saved
    return _backward("gelu_backward", dout, x, _gelu_code("gelu_backward", approximate))

