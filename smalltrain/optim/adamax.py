"""Adamax, Adam's infinity-norm variant (weight decay, maximize), in the operation order of torch's single-tensor
implementation: exp_inf = max(beta2 * exp_inf, |grad| + eps), param -= lr / (1 - beta1^t) * exp_avg / exp_inf."""
from ..ops._util import xp_of
from ..tensor import Tensor
from .optimizer import Optimizer, _step_tensor, adam_checks, check_hyper, decayed_grad, lerp_, switches


class Adamax(Optimizer):
    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, foreach=None, *,
                 maximize=False, differentiable=False, capturable=False):
        check_hyper(*adam_checks(lr, eps, betas, weight_decay))
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "maximize": maximize,
                    **switches("Adamax", foreach=foreach, differentiable=differentiable, capturable=capturable)}
        super().__init__(params, defaults)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns closure()'s loss when given one."""
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            # float(): a NumPy float64 hyperparameter would otherwise promote float32 updates to float64
            beta1, beta2 = (float(b) for b in group["betas"])
            hyper = (float(group["lr"]), beta1, beta2, float(group["eps"]), float(group["weight_decay"]),
                     group["maximize"])
            for param, grad, state in self._params_with_grad(group, _init_state):
                _adamax_update(param, grad, state, *hyper)
        return loss


def _init_state(state, param, group):
    xp = xp_of(param)
    state["step"] = _step_tensor()
    state["exp_avg"] = Tensor._wrap(xp.zeros_like(param))
    state["exp_inf"] = Tensor._wrap(xp.zeros_like(param))


def _adamax_update(param, grad, state, lr, beta1, beta2, eps, wd, maximize):
    xp = xp_of(param)
    grad = decayed_grad(xp, param, grad, wd, maximize)
    step_t = state["step"].array
    step_t += 1
    exp_avg, exp_inf = state["exp_avg"].array, state["exp_inf"].array
    tmp = xp.empty_like(param)
    lerp_(xp, exp_avg, grad, 1 - beta1, tmp)
    # torch.maximum(exp_inf.mul_(beta2), grad.abs().add_(eps), out=exp_inf)
    xp.multiply(exp_inf, beta2, out=exp_inf)
    xp.maximum(exp_inf, xp.add(xp.abs(grad, out=tmp), eps, out=tmp), out=exp_inf)
    clr = lr / (1 - beta1 ** float(step_t))
    # param.addcdiv_(exp_avg, exp_inf, value=-clr) == param + (-clr * exp_avg) / exp_inf
    upd = xp.multiply(exp_avg, -clr, out=tmp)
    xp.add(param, xp.divide(upd, exp_inf, out=upd), out=param)
