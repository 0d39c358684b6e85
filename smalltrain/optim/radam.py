"""RAdam, Adam with the variance rectification term (L2 or decoupled weight decay, maximize), in the operation
order of torch's single-tensor implementation: the first steps (rho_t <= 5) take a plain bias-corrected momentum
step, later ones the adaptive step scaled by the rectification term."""
from ..ops._util import xp_of
from ..tensor import Tensor
from .optimizer import Optimizer, _step_tensor, adam_checks, check_hyper, decayed_grad, ema_square_, lerp_, switches


class RAdam(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, decoupled_weight_decay=False,
                 *, foreach=None, maximize=False, capturable=False, differentiable=False):
        check_hyper(*adam_checks(lr, eps, betas, weight_decay))
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "maximize": maximize,
                    "decoupled_weight_decay": decoupled_weight_decay,
                    **switches("RAdam", foreach=foreach, capturable=capturable, differentiable=differentiable)}
        super().__init__(params, defaults)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns closure()'s loss when given one."""
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            # float(): a NumPy float64 hyperparameter would otherwise promote float32 updates to float64
            beta1, beta2 = (float(b) for b in group["betas"])
            hyper = (float(group["lr"]), beta1, beta2, float(group["eps"]), float(group["weight_decay"]),
                     group["decoupled_weight_decay"], group["maximize"])
            for param, grad, state in self._params_with_grad(group, _init_state):
                _radam_update(param, grad, state, *hyper)
        return loss


def _init_state(state, param, group):
    xp = xp_of(param)
    state["step"] = _step_tensor()
    state["exp_avg"] = Tensor._wrap(xp.zeros_like(param))
    state["exp_avg_sq"] = Tensor._wrap(xp.zeros_like(param))


def _radam_update(param, grad, state, lr, beta1, beta2, eps, wd, decoupled, maximize):
    xp = xp_of(param)
    step_t = state["step"].array
    step_t += 1
    step = float(step_t)
    if decoupled and wd != 0:
        xp.multiply(param, 1 - lr * wd, out=param)
        wd = 0
    grad = decayed_grad(xp, param, grad, wd, maximize)
    exp_avg, exp_avg_sq = state["exp_avg"].array, state["exp_avg_sq"].array
    tmp = xp.empty_like(param)
    lerp_(xp, exp_avg, grad, 1 - beta1, tmp)
    ema_square_(xp, exp_avg_sq, grad, beta2, tmp)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    # the maximum and the current length of the approximated simple moving average
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * step * (beta2 ** step) / bias_correction2
    upd = xp.multiply(xp.divide(exp_avg, bias_correction1), lr)   # bias_corrected_exp_avg * lr
    if rho_t > 5.0:
        # (bias_correction2 ** 0.5) / (sqrt(v) + eps): torch's scalar / tensor is reciprocal(tensor) * scalar
        adaptive = xp.sqrt(exp_avg_sq, out=tmp)
        xp.add(adaptive, eps, out=adaptive)
        xp.reciprocal(adaptive, out=adaptive)
        xp.multiply(adaptive, bias_correction2 ** 0.5, out=adaptive)
        rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
        xp.multiply(xp.multiply(upd, adaptive, out=upd), rect, out=upd)
    xp.subtract(param, upd, out=param)   # param.add_(update, alpha=-1.0)
