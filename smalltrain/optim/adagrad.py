"""Adagrad (lr decay, initial accumulator value, weight decay, maximize), in the operation order of torch's
single-tensor implementation: param -= lr / (1 + (step - 1) * lr_decay) * grad / (sqrt(sum) + eps)."""
from ..ops._util import xp_of
from ..tensor import Tensor
from .optimizer import Optimizer, _step_tensor, check_hyper, decayed_grad, switches


class Adagrad(Optimizer):
    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 foreach=None, *, maximize=False, differentiable=False, fused=None):
        check_hyper(("learning rate", lr, 0.0 <= lr), ("lr_decay value", lr_decay, 0.0 <= lr_decay),
                    ("weight_decay value", weight_decay, 0.0 <= weight_decay),
                    ("initial_accumulator_value value", initial_accumulator_value, 0.0 <= initial_accumulator_value),
                    ("epsilon value", eps, 0.0 <= eps))
        defaults = {"lr": lr, "lr_decay": lr_decay, "eps": eps, "weight_decay": weight_decay,
                    "initial_accumulator_value": initial_accumulator_value, "maximize": maximize,
                    **switches("Adagrad", foreach=foreach, differentiable=differentiable, fused=fused)}
        super().__init__(params, defaults)
        # torch fills the state of the constructor's parameters at once (a fresh state_dict already holds it)
        for group in self.param_groups:
            for p in group["params"]:
                self._init_state(self.state[p], p.array, group)

    def _init_state(self, state, param, group):
        # the accumulator starts from the constructor's value for every group, as in torch
        state["step"] = _step_tensor()
        state["sum"] = Tensor._wrap(xp_of(param).full_like(param, self.defaults["initial_accumulator_value"]))

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns closure()'s loss when given one."""
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            # float(): a NumPy float64 hyperparameter would otherwise promote float32 updates to float64
            hyper = (float(group["lr"]), float(group["lr_decay"]), float(group["eps"]),
                     float(group["weight_decay"]), group["maximize"])
            for param, grad, state in self._params_with_grad(group, self._init_state):
                _adagrad_update(param, grad, state, *hyper)
        return loss


def _adagrad_update(param, grad, state, lr, lr_decay, eps, wd, maximize):
    xp = xp_of(param)
    step_t = state["step"].array
    step_t += 1
    grad = decayed_grad(xp, param, grad, wd, maximize)
    clr = lr / (1 + (float(step_t) - 1) * lr_decay)
    state_sum = state["sum"].array
    xp.add(state_sum, xp.multiply(grad, grad), out=state_sum)   # state_sum.addcmul_(grad, grad, value=1)
    std = xp.sqrt(state_sum)
    xp.add(std, eps, out=std)
    # param.addcdiv_(grad, std, value=-clr) == param + (-clr * grad) / std
    upd = xp.multiply(grad, -clr)
    xp.add(param, xp.divide(upd, std, out=upd), out=param)
