"""SGD with momentum, dampening, Nesterov, weight decay and maximize, in the operation order of torch's
single-tensor implementation (the first momentum buffer is a copy of the gradient, undampened)."""
from . import fused
from ..ops._util import xp_of
from ..tensor import Tensor
from .optimizer import Optimizer, switches


class SGD(Optimizer):
    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay,
                    "nesterov": nesterov, "maximize": maximize,
                    **switches("SGD", foreach=foreach, differentiable=differentiable, fused=fused)}
        super().__init__(params, defaults)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns closure()'s loss when given one."""
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            # float(): a NumPy float64 hyperparameter would otherwise promote float32 updates to float64
            lr, momentum = float(group["lr"]), float(group["momentum"])
            wd, dampening = float(group["weight_decay"]), float(group["dampening"])
            nesterov, maximize = group["nesterov"], group["maximize"]
            live = fused.eligible(group["params"])
            if live and fused.sgd(self, group, live):
                continue
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p] if momentum != 0 else None
                _sgd_update(p.array, p.grad.array, state, lr, momentum, dampening, wd, nesterov, maximize)
        return loss


def _sgd_update(param, grad, state, lr, momentum, dampening, wd, nesterov, maximize):
    """torch's _single_tensor_sgd for one parameter; `own` says whether `grad` is a temporary we may overwrite."""
    xp = xp_of(param)
    own = False
    if maximize:
        grad, own = xp.negative(grad), True
    if wd != 0:  # grad.add(param, alpha=wd)
        tmp = xp.multiply(param, wd)
        grad, own = xp.add(grad, tmp, out=tmp), True
    if momentum != 0:
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = grad if own else grad.copy()
            state["momentum_buffer"] = Tensor._wrap(buf)
            own = False
        else:
            buf = buf.array
            xp.multiply(buf, momentum, out=buf)
            if dampening == 0:
                xp.add(buf, grad, out=buf)
            else:
                xp.add(buf, xp.multiply(grad, 1 - dampening), out=buf)
        if nesterov:  # grad.add(buf, alpha=momentum)
            tmp = xp.multiply(buf, momentum)
            grad, own = xp.add(grad, tmp, out=tmp), True
        else:
            grad, own = buf, False
    # param.add_(grad, alpha=-lr)
    xp.add(param, xp.multiply(grad, -lr, out=grad if own else None), out=param)
