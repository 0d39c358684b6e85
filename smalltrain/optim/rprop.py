"""Rprop, resilient backpropagation (maximize): each element's step size grows by etaplus while its gradient keeps
its sign and shrinks by etaminus when it flips (that step then skipped), in torch's single-tensor order."""
from ..ops._util import xp_of
from ..tensor import Tensor
from .optimizer import Optimizer, _step_tensor, check_hyper, switches


class Rprop(Optimizer):
    def __init__(self, params, lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), *, capturable=False, foreach=None,
                 maximize=False, differentiable=False):
        check_hyper(("learning rate", lr, 0.0 <= lr),
                    ("eta values", f"{etas[0]}, {etas[1]}", 0.0 < etas[0] < 1.0 < etas[1]))
        defaults = {"lr": lr, "etas": etas, "step_sizes": step_sizes, "maximize": maximize,
                    **switches("Rprop", capturable=capturable, foreach=foreach, differentiable=differentiable)}
        super().__init__(params, defaults)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns closure()'s loss when given one."""
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            # float(): a NumPy float64 hyperparameter would otherwise promote float32 updates to float64
            etaminus, etaplus = (float(e) for e in group["etas"])
            step_size_min, step_size_max = (float(s) for s in group["step_sizes"])
            for param, grad, state in self._params_with_grad(group, _init_state):
                _rprop_update(param, grad, state, etaminus, etaplus, step_size_min, step_size_max, group["maximize"])
        return loss


def _init_state(state, param, group):
    xp = xp_of(param)
    state["step"] = _step_tensor()
    state["prev"] = Tensor._wrap(xp.zeros_like(param))
    state["step_size"] = Tensor._wrap(xp.full_like(param, float(group["lr"])))


def _rprop_update(param, grad, state, etaminus, etaplus, step_size_min, step_size_max, maximize):
    xp = xp_of(param)
    state["step"].array += 1
    if maximize:
        grad = xp.negative(grad)
    prev, step_size = state["prev"].array, state["step_size"].array
    # sign = grad.mul(prev).sign(), then etaplus where > 0, etaminus where < 0, 1 where 0 (NaN stays NaN); xp.where
    # with scalars of the arrays' type, not masked stores, which would synchronize a GPU
    one, plus, minus = (param.dtype.type(v) for v in (1, etaplus, etaminus))
    sign = xp.sign(xp.multiply(grad, prev))
    factor = xp.where(sign > 0, plus, xp.where(sign < 0, minus, xp.where(sign == 0, one, sign)))
    xp.multiply(step_size, factor, out=step_size)
    xp.clip(step_size, step_size_min, step_size_max, out=step_size)
    # where the gradient changed sign, this step does not move and the next one sees no previous sign
    grad = xp.where(factor == minus, param.dtype.type(0), grad)
    # param.addcmul_(grad.sign(), step_size, value=-1) == param + (-1 * sign(grad)) * step_size
    upd = xp.negative(xp.sign(grad))
    xp.add(param, xp.multiply(upd, step_size, out=upd), out=param)
    prev[...] = grad
