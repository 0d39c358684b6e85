"""CUDA dropout with a counter-based RNG (Philox4x32-10, kernels/dropout.cu): the mask is a function of (seed,
offset, element index), so backward regenerates it instead of storing it, and a seed reproduces it exactly."""
import numpy as np

from . import cupy
from ._common import BLOCK, check_array, check_dtype, check_float, contiguous, i64, launch, same_device, scalar
from .loader import MAX_BLOCKS, kernel, launch_1d


def dropout_state(seed, offset=0):
    """A device uint64 [seed, offset] pair, the RNG state the kernels read (one small host-to-device copy).

    Use one call per dropout application (offset 0, 1, 2, ...): the offset selects an independent stream, so one
    seed serves a whole run. A CUDA-graph step keeps one state array and advances `state[1] += 1` on the device.
    """
    seed, offset = int(seed), int(offset)
    if not (0 <= seed < 2 ** 64 and 0 <= offset < 2 ** 64):
        raise ValueError(f"dropout_state: seed and offset must be in [0, 2**64), got seed={seed}, offset={offset}")
    return cupy().asarray(np.array([seed, offset], dtype=np.uint64))


def _threshold(p):
    # dropped iff a 24-bit uniform r satisfies r < round(p * 2^24): p = 1 drops everything, p = 0 nothing
    return np.uint32(round(p * (1 << 24)))


def _state(op, state, seed, offset, like):
    if state is None:
        if seed is None:
            raise ValueError(f"{op}: pass seed (and offset) or a device state from dropout_state")
        with like.device:
            return dropout_state(seed, offset)
    check_array(op, "state", state)
    check_dtype(op, "state", state, np.uint64)
    if state.shape != (2,):
        raise RuntimeError(f"{op}: expected state of shape [2] (seed, offset), got {list(state.shape)}")
    same_device(op, like, state)
    return state.copy()  # a snapshot: the caller may advance its state before backward runs


def dropout_forward(x, p=0.5, training=True, seed=None, offset=0, state=None):
    """torch's dropout: out = x * mask / (1 - p), mask[i] = 0 with probability p.

    The RNG state is (seed, offset) or `state` (a device uint64 [2] from dropout_state, read on the device so a
    captured graph can advance it). Eval (training=False) returns x itself and saved None.
    Returns (out, saved) with saved = (state snapshot, threshold, scale, dtype): no mask is stored.
    """
    op = "dropout"
    check_array(op, "input", x)
    check_float(op, "input", x)
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training:
        return x, None
    st = _state(op, state, seed, offset, x)
    threshold, scale = _threshold(p), (1.0 / (1.0 - p) if p < 1.0 else 0.0)
    with x.device:
        x = contiguous(x)
        out = cupy().empty_like(x)
        launch("dropout", "dropout_apply", x.dtype, (x.size + 3) // 4,
               (x, out, i64(x.size), threshold, scalar(scale, x.dtype), st))
    return out, (st, threshold, scale, x.dtype)


def dropout_backward(dout, saved):
    """dx = dout * mask / (1 - p), the mask regenerated from the saved RNG state."""
    op = "dropout_backward"
    st, threshold, scale, dtype = saved
    check_array(op, "grad_output", dout)
    check_dtype(op, "grad_output", dout, dtype)
    same_device(op, dout, st)
    with dout.device:
        dout = contiguous(dout)
        dx = cupy().empty_like(dout)
        launch("dropout", "dropout_apply", dtype, (dout.size + 3) // 4,
               (dout, dx, i64(dout.size), threshold, scalar(scale, dtype), st))
    return dx


def dropout_mask(shape, p, seed=None, offset=0, state=None):
    """The uint8 keep-mask (1 kept, 0 dropped) that dropout_forward draws for this shape, p and RNG state."""
    cp = cupy()
    like = state if state is not None else cp.empty(0, dtype=cp.uint8)  # the current device, without a state
    st = _state("dropout_mask", state, seed, offset, like)
    with st.device:
        mask = cp.empty(tuple(shape), dtype=cp.uint8)
        launch_1d(kernel("dropout", "dropout_mask"), (mask.size + 3) // 4,
                  (mask, i64(mask.size), _threshold(float(p)), st), block=BLOCK, max_blocks=MAX_BLOCKS)
    return mask

