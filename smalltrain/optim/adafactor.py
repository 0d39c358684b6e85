"""Adafactor (weight decay, maximize), in the operation order of torch's single-tensor implementation: the second
moment of a matrix (or batch of matrices) is kept as its row and column means, a vector's in full; the update is
grad / sqrt(variance), clipped to RMS d and scaled by the parameter's RMS."""
import numpy as np

from ..ops._util import xp_of
from ..tensor import Tensor
from .optimizer import Optimizer, _step_tensor, lerp_, switches


class Adafactor(Optimizer):
    _flat_state = ("row_var", "col_var")   # the factors are shaped like the parameter with one dimension 1

    def __init__(self, params, lr=1e-2, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0, weight_decay=0.0, *,
                 foreach=None, maximize=False):
        checks = [(0.0 <= lr, f"Learning rate should be >= 0 but is: {lr}"),
                  (0.0 >= beta2_decay, f"beta2_decay should be <= 0 but is: {beta2_decay}"),
                  (eps[0] is None or 0.0 <= eps[0], f"epsilon1 should be >= 0 but is: {eps[0]}"),
                  (0.0 <= eps[1], f"epsilon2 should be >= 0 but is: {eps[1]}"),
                  (1.0 <= d, f"Clipping threshold d should be >= 1 but is: {d}"),
                  (0.0 <= weight_decay, f"weight_decay should be >= 0 but is: {weight_decay}")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        defaults = {"lr": lr, "beta2_decay": beta2_decay, "eps": eps, "d": d, "weight_decay": weight_decay,
                    "maximize": maximize, **switches("Adafactor", foreach=foreach)}
        super().__init__(params, defaults)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns closure()'s loss when given one."""
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            eps1, eps2 = group["eps"]
            for param, grad, state in self._params_with_grad(group, _init_state):
                if eps1 is None:   # torch takes the first parameter's machine epsilon for the whole group
                    eps1 = float(np.finfo(param.dtype).eps)
                _adafactor_update(param, grad, state, float(group["lr"]), float(group["beta2_decay"]), float(eps1),
                                  float(eps2), float(group["d"]), float(group["weight_decay"]), group["maximize"])
        return loss


def _init_state(state, param, group):
    xp = xp_of(param)
    state["step"] = _step_tensor()
    if param.ndim > 1:   # the row means (last dimension reduced) and the column means (the one before)
        state["row_var"] = Tensor._wrap(xp.zeros(param.shape[:-1] + (1,), param.dtype))
        state["col_var"] = Tensor._wrap(xp.zeros(param.shape[:-2] + (1, param.shape[-1]), param.dtype))
    else:
        state["variance"] = Tensor._wrap(xp.zeros_like(param))


def _norm(xp, a, axis=None):
    """torch.norm(a, dim=axis, keepdim=True): the square root of the sum of squares."""
    return xp.sqrt(xp.sum(xp.multiply(a, a), axis=axis, keepdims=axis is not None))


def _adafactor_update(param, grad, state, lr, beta2_decay, eps1, eps2, d, wd, maximize):
    xp = xp_of(param)
    if maximize:
        grad = xp.negative(grad)
    step_t = state["step"].array
    step_t += 1
    step = float(step_t)
    one_minus_beta2_t = step ** beta2_decay
    rho_t = min(lr, 1 / (step ** 0.5))
    alpha = max(eps2, float(_norm(xp, param)) / (param.size ** 0.5)) * rho_t
    if wd != 0:
        xp.multiply(param, 1 - lr * wd, out=param)
    if grad.ndim > 1:
        row_var, col_var = state["row_var"].array, state["col_var"].array
        row_mean = xp.divide(xp.square(_norm(xp, grad, -1)), grad.shape[-1])
        lerp_(xp, row_var, row_mean, one_minus_beta2_t, xp.empty_like(row_var))
        col_mean = xp.divide(xp.square(_norm(xp, grad, -2)), grad.shape[-2])
        lerp_(xp, col_var, col_mean, one_minus_beta2_t, xp.empty_like(col_var))
        var_estimate = xp.matmul(row_var, col_var)
        xp.divide(var_estimate, xp.maximum(xp.mean(row_var, axis=-2, keepdims=True), eps1), out=var_estimate)
    else:
        variance = state["variance"].array
        lerp_(xp, variance, xp.multiply(grad, grad), one_minus_beta2_t, xp.empty_like(variance))
        var_estimate = variance.copy()
    # update = grad / sqrt(max(var_estimate, eps1^2)), eps1 squared as the root is taken after
    update = xp.maximum(var_estimate, eps1 * eps1, out=var_estimate)
    xp.divide(1, xp.sqrt(update, out=update), out=update)
    xp.multiply(update, grad, out=update)
    denom = max(1.0, float(_norm(xp, update)) / ((update.size ** 0.5) * d))
    xp.add(param, xp.multiply(update, -alpha / denom, out=update), out=param)
