"""NAdam, Adam with Nesterov momentum (momentum decay, L2 or decoupled weight decay, maximize), in the operation
order of torch's single-tensor implementation. The running product of the momentum coefficients, `mu_product`, is
a CPU scalar in torch's scalar dtype, as torch keeps it."""
from ..ops._util import xp_of
from ..tensor import Tensor
from .optimizer import Optimizer, _scalar_np_dtype, _step_tensor, adam_checks, check_hyper, decayed_grad, ema_square_, \
    host_scalar, lerp_, switches


class NAdam(Optimizer):
    _host_scalars = ("step", "mu_product")

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, momentum_decay=4e-3,
                 decoupled_weight_decay=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False):
        check_hyper(*adam_checks(lr, eps, betas, weight_decay),
                    ("momentum_decay value", momentum_decay, 0.0 <= momentum_decay))
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "momentum_decay": momentum_decay, "decoupled_weight_decay": decoupled_weight_decay,
                    "maximize": maximize,
                    **switches("NAdam", foreach=foreach, capturable=capturable, differentiable=differentiable)}
        super().__init__(params, defaults)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns closure()'s loss when given one."""
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            # float(): a NumPy float64 hyperparameter would otherwise promote float32 updates to float64
            beta1, beta2 = (float(b) for b in group["betas"])
            hyper = (float(group["lr"]), beta1, beta2, float(group["eps"]), float(group["weight_decay"]),
                     float(group["momentum_decay"]), group["decoupled_weight_decay"], group["maximize"])
            for param, grad, state in self._params_with_grad(group, _init_state):
                _nadam_update(param, grad, state, *hyper)
        return loss


def _init_state(state, param, group):
    xp = xp_of(param)
    state["step"] = _step_tensor()
    state["mu_product"] = host_scalar(1.0, _scalar_np_dtype())
    state["exp_avg"] = Tensor._wrap(xp.zeros_like(param))
    state["exp_avg_sq"] = Tensor._wrap(xp.zeros_like(param))


def _nadam_update(param, grad, state, lr, beta1, beta2, eps, wd, momentum_decay, decoupled, maximize):
    xp = xp_of(param)
    step_t = state["step"].array
    step_t += 1
    step = float(step_t)
    bias_correction2 = 1 - beta2 ** step
    if decoupled and wd != 0:
        xp.multiply(param, 1 - lr * wd, out=param)
        wd = 0
    grad = decayed_grad(xp, param, grad, wd, maximize)
    # the momentum coefficients mu_t and mu_{t+1}
    mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
    mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
    mu_product = state["mu_product"].array
    mu_product *= mu    # rounded in its own dtype, as torch's `mu_product *= mu` on a float32 tensor
    exp_avg, exp_avg_sq = state["exp_avg"].array, state["exp_avg_sq"].array
    tmp = xp.empty_like(param)
    lerp_(xp, exp_avg, grad, 1 - beta1, tmp)
    ema_square_(xp, exp_avg_sq, grad, beta2, tmp)
    denom = xp.sqrt(xp.divide(exp_avg_sq, bias_correction2, out=tmp), out=tmp)
    xp.add(denom, eps, out=denom)
    # param.addcdiv_(grad, denom, value=c) == param + (c * grad) / denom, first for grad, then for exp_avg
    product = float(mu_product)
    upd = xp.multiply(grad, -lr * (1.0 - mu) / (1.0 - product))
    xp.add(param, xp.divide(upd, denom, out=upd), out=param)
    product_next = product * mu_next
    xp.multiply(exp_avg, (-lr * mu_next) / (1.0 - product_next), out=upd)
    xp.add(param, xp.divide(upd, denom, out=upd), out=param)
