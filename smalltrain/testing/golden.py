"""The golden helper: run the same op in smalltrain and in PyTorch on the same inputs; compare values and grads."""
import numpy as np

from .compare import assert_close


def golden(ours, theirs, *inputs, rtol=1e-5, grad=True, device="cpu", seed=0, grad_rtol=None, requires_grad=None):
    """Compare `ours(*inputs)` (smalltrain) with `theirs(*inputs)` (torch), forward and backward.

    `inputs` are NumPy arrays (float arrays require grad unless `requires_grad` says otherwise, a tuple of
    bools by position) or plain values passed to both unchanged. The backward pass seeds every float output
    with the same random upstream gradient. Returns {name: max error} for reporting.
    """
    import torch

    import smalltrain

    rng = np.random.default_rng(seed)
    ts, tt = [], []
    for k, x in enumerate(inputs):
        if isinstance(x, np.ndarray):
            rg = grad and x.dtype.kind == "f" if requires_grad is None else bool(requires_grad[k])
            ts.append(smalltrain.tensor(x, device=device, requires_grad=rg))
            tt.append(torch.tensor(x, requires_grad=rg))
        else:
            ts.append(x)
            tt.append(x)
    out_s, out_t = ours(*ts), theirs(*tt)
    out_s = out_s if isinstance(out_s, (tuple, list)) else (out_s,)
    out_t = out_t if isinstance(out_t, (tuple, list)) else (out_t,)
    if len(out_s) != len(out_t):
        raise AssertionError(f"golden: {len(out_s)} outputs, torch gave {len(out_t)}")
    errors = {}
    for i, (a, b) in enumerate(zip(out_s, out_t)):
        if str(a.dtype).split(".")[-1] != str(b.dtype).split(".")[-1]:
            raise AssertionError(f"golden: output {i} dtype {a.dtype}, torch gave {b.dtype}")
        errors[f"out{i}"] = assert_close(a, b, rtol, name=f"output {i}")
        if grad and bool(a.requires_grad) != bool(b.requires_grad):
            raise AssertionError(f"golden: output {i} requires_grad={a.requires_grad}, torch's "
                                 f"{b.requires_grad}")
    if not grad:
        return errors
    seeds = [(a, b, rng.standard_normal(tuple(b.shape)).astype(b.detach().numpy().dtype))
             for a, b in zip(out_s, out_t) if b.requires_grad]
    if not seeds:
        return errors
    total_s = sum((a * smalltrain.tensor(g, device=device)).sum() for a, b, g in seeds)
    total_t = sum((b * torch.tensor(g)).sum() for a, b, g in seeds)
    total_s.backward()
    total_t.backward()
    for k, (a, b) in enumerate(zip(ts, tt)):
        if isinstance(b, torch.Tensor) and b.requires_grad:
            if b.grad is None:
                if a.grad is not None and np.abs(_host(a.grad.array)).max() > 0:
                    raise AssertionError(f"golden: input {k} got a gradient, torch gave none")
                continue
            if a.grad is None:
                raise AssertionError(f"golden: input {k} got no gradient, torch gave one")
            errors[f"grad{k}"] = assert_close(a.grad, b.grad, grad_rtol or rtol, name=f"gradient of input {k}")
    return errors


def golden_error(ours, theirs, *inputs, match=None, device="cpu"):
    """Assert that `theirs(*inputs)` (torch) raises, and `ours(*inputs)` raises the same exception type (or a
    subclass) with a message matching the regex `match`. NumPy arrays become tensors; other values pass as-is.

    Returns the exception type torch raised.
    """
    import re

    import torch

    import smalltrain

    tt = [torch.tensor(x) if isinstance(x, np.ndarray) else x for x in inputs]
    ts = [smalltrain.tensor(x, device=device) if isinstance(x, np.ndarray) else x for x in inputs]
    try:
        theirs(*tt)
    except Exception as e:  # noqa: BLE001 - any exception type is what we compare against
        expected = type(e)
    else:
        raise AssertionError("golden_error: torch raised nothing for this call")
    try:
        ours(*ts)
        if device != "cpu":
            smalltrain.cuda.synchronize()   # errors found on the GPU are raised at the next sync, as torch's
    except expected as e:
        if match is not None and not re.search(match, str(e)):
            raise AssertionError(f"golden_error: message {str(e)!r} does not match {match!r}") from e
        return expected
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"golden_error: torch raised {expected.__name__}, we raised "
                             f"{type(e).__name__}: {e}") from e
    raise AssertionError(f"golden_error: torch raised {expected.__name__}, we raised nothing")


def _host(a):
    return a if isinstance(a, np.ndarray) else a.get()
