"""Adam (optionally AMSGrad, L2 or decoupled weight decay) and AdamW, in the operation order of torch's
single-tensor implementation: denom = sqrt(v) / sqrt(1 - beta2^t) + eps, param -= lr / (1 - beta1^t) * m / denom."""
from . import fused
from ..ops._util import xp_of
from ..tensor import Tensor
from .optimizer import Optimizer, _step_tensor


class Adam(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 maximize=False, decoupled_weight_decay=False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not (isinstance(betas[0], float) and isinstance(betas[1], float)):
            # torch also takes a pair of Tensors here; smalltrain takes floats only
            raise ValueError("betas must be either both floats or both Tensors")  # noqa: TRY004 (torch's type)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad,
                    "maximize": maximize, "decoupled_weight_decay": decoupled_weight_decay}
        super().__init__(params, defaults)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns closure()'s loss when given one."""
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            beta1, beta2 = (float(b) for b in group["betas"])
            hyper = (float(group["lr"]), beta1, beta2, float(group["eps"]), float(group["weight_decay"]),
                     group["amsgrad"], group["maximize"], group["decoupled_weight_decay"])
            live = fused.eligible(group["params"])
            if live and fused.adam(self, group, live, _init_state):
                continue
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    _init_state(state, p.array, group["amsgrad"])
                _adam_update(p.array, p.grad.array, state, *hyper)
        return loss


class AdamW(Adam):
    """Adam with decoupled weight decay: param *= 1 - lr * weight_decay before the Adam update."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True)

    def _fill_group_defaults(self):
        super()._fill_group_defaults()
        for group in self.param_groups:  # an AdamW always decays decoupled, whatever the loaded dict says
            group["decoupled_weight_decay"] = True


def _init_state(state, param, amsgrad):
    xp = xp_of(param)
    state["step"] = _step_tensor()
    state["exp_avg"] = Tensor._wrap(xp.zeros_like(param))
    state["exp_avg_sq"] = Tensor._wrap(xp.zeros_like(param))
    if amsgrad:
        state["max_exp_avg_sq"] = Tensor._wrap(xp.zeros_like(param))


def lerp_(xp, start, end, weight, tmp):
    """start.lerp_(end, weight) with torch's two branches (the small-weight form is exact at weight 0)."""
    w = start.dtype.type(weight)  # torch rounds the weight to the tensor's type before both branches
    xp.subtract(end, start, out=tmp)
    if abs(w) < 0.5:
        xp.add(start, xp.multiply(tmp, w, out=tmp), out=start)
    else:
        xp.subtract(end, xp.multiply(tmp, start.dtype.type(1) - w, out=tmp), out=start)


def _adam_update(param, grad, state, lr, beta1, beta2, eps, wd, amsgrad, maximize, decoupled):
    xp = xp_of(param)
    exp_avg, exp_avg_sq = state["exp_avg"].array, state["exp_avg_sq"].array
    step_t = state["step"].array
    step_t += 1
    if maximize:
        grad = xp.negative(grad)
    if wd != 0:
        if decoupled:
            xp.multiply(param, 1 - lr * wd, out=param)
        else:  # grad.add(param, alpha=wd)
            grad = xp.add(grad, xp.multiply(param, wd))
    tmp = xp.empty_like(param)
    lerp_(xp, exp_avg, grad, 1 - beta1, tmp)
    # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    xp.multiply(exp_avg_sq, beta2, out=exp_avg_sq)
    xp.multiply(grad, 1 - beta2, out=tmp)
    xp.add(exp_avg_sq, xp.multiply(tmp, grad, out=tmp), out=exp_avg_sq)

    step = float(step_t)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    bias_correction2_sqrt = bias_correction2 ** 0.5
    if amsgrad:
        max_sq = state["max_exp_avg_sq"].array
        xp.maximum(max_sq, exp_avg_sq, out=max_sq)
        denom = xp.sqrt(max_sq, out=tmp)
    else:
        denom = xp.sqrt(exp_avg_sq, out=tmp)
    xp.divide(denom, bias_correction2_sqrt, out=denom)
    xp.add(denom, eps, out=denom)
    # param.addcdiv_(exp_avg, denom, value=-step_size) == param + (-step_size * exp_avg) / denom
    upd = xp.multiply(exp_avg, -step_size)
    xp.add(param, xp.divide(upd, denom, out=upd), out=param)

