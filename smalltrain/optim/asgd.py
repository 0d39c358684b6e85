"""ASGD, averaged stochastic gradient descent (weight decay, maximize), in torch's single-tensor order: SGD with a
decaying step eta and a running average `ax` of the parameters once the step count passes t0. eta and mu are
per-parameter CPU scalars in torch's scalar dtype, as `step`."""
from ..ops._util import xp_of
from ..tensor import Tensor
from .optimizer import Optimizer, _scalar_np_dtype, _step_tensor, check_hyper, decayed_grad, host_scalar, \
    switches


class ASGD(Optimizer):
    _host_scalars = ("step", "eta", "mu")

    def __init__(self, params, lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0, foreach=None,
                 maximize=False, differentiable=False, capturable=False):
        check_hyper(("learning rate", lr, 0.0 <= lr), ("weight_decay value", weight_decay, 0.0 <= weight_decay))
        defaults = {"lr": lr, "lambd": lambd, "alpha": alpha, "t0": t0, "weight_decay": weight_decay,
                    "maximize": maximize,
                    **switches("ASGD", foreach=foreach, differentiable=differentiable, capturable=capturable)}
        super().__init__(params, defaults)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns closure()'s loss when given one."""
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            # float(): a NumPy float64 hyperparameter would otherwise promote float32 updates to float64
            hyper = (float(group["lr"]), float(group["lambd"]), float(group["alpha"]), float(group["t0"]),
                     float(group["weight_decay"]), group["maximize"])
            for param, grad, state in self._params_with_grad(group, _init_state):
                _asgd_update(param, grad, state, *hyper)
        return loss


def _init_state(state, param, group):
    state["step"] = _step_tensor()
    state["eta"] = host_scalar(group["lr"], _scalar_np_dtype())
    state["mu"] = host_scalar(1.0, _scalar_np_dtype())
    state["ax"] = Tensor._wrap(xp_of(param).zeros_like(param))


def _asgd_update(param, grad, state, lr, lambd, alpha, t0, wd, maximize):
    xp = xp_of(param)
    step_t, eta, mu = state["step"].array, state["eta"].array, state["mu"].array
    step_t += 1
    grad = decayed_grad(xp, param, grad, wd, maximize)
    eta_value = float(eta)
    xp.multiply(param, 1 - lambd * eta_value, out=param)   # decay
    xp.add(param, xp.multiply(grad, -eta_value), out=param)   # param.add_(grad, alpha=-eta)
    ax = state["ax"].array
    if float(mu) != 1:   # ax.add_(param.sub(ax).mul_(mu))
        diff = xp.subtract(param, ax)
        xp.add(ax, xp.multiply(diff, param.dtype.type(float(mu)), out=diff), out=ax)
    else:
        ax[...] = param
    step = float(step_t)
    eta[...] = lr / ((1 + lambd * lr * step) ** alpha)
    mu[...] = 1 / max(1, step - t0)
