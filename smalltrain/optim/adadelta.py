"""Adadelta (weight decay, maximize), in the operation order of torch's single-tensor implementation: the step is
sqrt(acc_delta + eps) / sqrt(square_avg + eps) * grad, scaled by lr."""
from ..ops._util import xp_of
from ..tensor import Tensor
from .optimizer import Optimizer, _step_tensor, check_hyper, decayed_grad, ema_square_, switches


class Adadelta(Optimizer):
    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, foreach=None, *, capturable=False,
                 maximize=False, differentiable=False):
        check_hyper(("learning rate", lr, 0.0 <= lr), ("rho value", rho, 0.0 <= rho <= 1.0),
                    ("epsilon value", eps, 0.0 <= eps), ("weight_decay value", weight_decay, 0.0 <= weight_decay))
        defaults = {"lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay, "maximize": maximize,
                    **switches("Adadelta", capturable=capturable, foreach=foreach, differentiable=differentiable)}
        super().__init__(params, defaults)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns closure()'s loss when given one."""
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            # float(): a NumPy float64 hyperparameter would otherwise promote float32 updates to float64
            hyper = (float(group["lr"]), float(group["rho"]), float(group["eps"]), float(group["weight_decay"]),
                     group["maximize"])
            for param, grad, state in self._params_with_grad(group, _init_state):
                _adadelta_update(param, grad, state, *hyper)
        return loss


def _init_state(state, param, group):
    xp = xp_of(param)
    state["step"] = _step_tensor()
    state["square_avg"] = Tensor._wrap(xp.zeros_like(param))
    state["acc_delta"] = Tensor._wrap(xp.zeros_like(param))


def _adadelta_update(param, grad, state, lr, rho, eps, wd, maximize):
    xp = xp_of(param)
    state["step"].array += 1
    grad = decayed_grad(xp, param, grad, wd, maximize)
    square_avg, acc_delta = state["square_avg"].array, state["acc_delta"].array
    tmp = xp.empty_like(param)
    ema_square_(xp, square_avg, grad, rho, tmp)
    std = xp.sqrt(xp.add(square_avg, eps, out=tmp), out=tmp)
    delta = xp.sqrt(xp.add(acc_delta, eps))
    xp.divide(delta, std, out=delta)
    xp.multiply(delta, grad, out=delta)
    ema_square_(xp, acc_delta, delta, rho, tmp)
    # param.add_(delta, alpha=-lr)
    xp.add(param, xp.multiply(delta, -lr, out=delta), out=param)
