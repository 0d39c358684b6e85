"""Reverse-mode automatic differentiation: Function (custom ops), the backward engine, grad modes."""
from .function import Function, Node
from .grad_mode import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from . import handoff  # noqa: F401  (installs autograd's backend hooks before anything can launch a kernel)


def backward(tensors, grad_tensors=None, retain_graph=False):
    """Backpropagate from several tensors at once (torch.autograd.backward)."""
    from ..tensor import Tensor
    if isinstance(tensors, Tensor):
        tensors = (tensors,)
    if grad_tensors is None or isinstance(grad_tensors, Tensor):
        grad_tensors = (grad_tensors,) * len(tensors) if grad_tensors is None else (grad_tensors,)
    from .engine import run_backward
    seeds = [t._seed_grad(g) for t, g in zip(tensors, grad_tensors)]
    run_backward(tensors, seeds, retain_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=False, allow_unused=False):
    """Gradients of `outputs` with respect to `inputs`, returned instead of accumulated into .grad."""
    from ..tensor import Tensor
    outputs = (outputs,) if isinstance(outputs, Tensor) else tuple(outputs)
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    saved = [(t.grad, t._hooks, t._post_hooks) for t in inputs]
    captured = {}
    try:
        for t in inputs:
            t.grad, t._post_hooks = None, None
            t._hooks = None
        if grad_outputs is None:
            grad_outputs = (None,) * len(outputs)
        elif isinstance(grad_outputs, Tensor):
            grad_outputs = (grad_outputs,)
        from .engine import slots_paused
        with slots_paused():   # the results are returned, so none may land in a gradient slot's memory
            backward(outputs, grad_outputs, retain_graph)
        for t in inputs:
            captured[id(t)] = t.grad
    finally:
        for t, (g, h, ph) in zip(inputs, saved):
            t.grad, t._hooks, t._post_hooks = g, h, ph
    result = tuple(captured.get(id(t)) for t in inputs)
    if not allow_unused and any(r is None for r in result):
        raise RuntimeError("grad: one of the differentiated tensors was not used in the graph; "
                           "pass allow_unused=True if this is expected")
    return result


__all__ = ["Function", "Node", "backward", "grad", "no_grad", "enable_grad", "set_grad_enabled",
           "is_grad_enabled", "inference_mode"]
