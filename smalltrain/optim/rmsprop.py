"""RMSprop (optionally centered, with momentum, weight decay, maximize), in the operation order of torch's
single-tensor implementation: eps is added after the square root."""
from ..ops._util import xp_of
from ..tensor import Tensor
from .optimizer import Optimizer, _step_tensor, lerp_, switches


class RMSprop(Optimizer):
    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False,
                 capturable=False, foreach=None, maximize=False, differentiable=False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        defaults = {"lr": lr, "momentum": momentum, "alpha": alpha, "eps": eps, "centered": centered,
                    "weight_decay": weight_decay, "maximize": maximize,
                    **switches("RMSprop", capturable=capturable, foreach=foreach, differentiable=differentiable)}
        super().__init__(params, defaults)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns closure()'s loss when given one."""
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            hyper = (float(group["lr"]), float(group["alpha"]), float(group["eps"]), float(group["weight_decay"]),
                     float(group["momentum"]), group["centered"], group["maximize"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    _init_state(state, p.array, group["momentum"], group["centered"])
                _rmsprop_update(p.array, p.grad.array, state, *hyper)
        return loss


def _init_state(state, param, momentum, centered):
    xp = xp_of(param)
    state["step"] = _step_tensor()
    state["square_avg"] = Tensor._wrap(xp.zeros_like(param))
    if momentum > 0:
        state["momentum_buffer"] = Tensor._wrap(xp.zeros_like(param))
    if centered:
        state["grad_avg"] = Tensor._wrap(xp.zeros_like(param))


def _rmsprop_update(param, grad, state, lr, alpha, eps, wd, momentum, centered, maximize):
    xp = xp_of(param)
    state["step"].array += 1
    if maximize:
        grad = xp.negative(grad)
    if wd != 0:  # grad.add(param, alpha=wd)
        grad = xp.add(grad, xp.multiply(param, wd))
    square_avg = state["square_avg"].array
    tmp = xp.empty_like(param)
    # square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
    xp.multiply(square_avg, alpha, out=square_avg)
    xp.multiply(grad, 1 - alpha, out=tmp)
    xp.add(square_avg, xp.multiply(tmp, grad, out=tmp), out=square_avg)
    if centered:
        grad_avg = state["grad_avg"].array
        lerp_(xp, grad_avg, grad, 1 - alpha, tmp)
        # square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_(): (-1 * g) * g is exactly -(g * g)
        avg = xp.sqrt(xp.subtract(square_avg, xp.multiply(grad_avg, grad_avg, out=tmp), out=tmp), out=tmp)
    else:
        avg = xp.sqrt(square_avg, out=tmp)
    xp.add(avg, eps, out=avg)
    if momentum > 0:
        buf = state["momentum_buffer"].array
        # buf.mul_(momentum).addcdiv_(grad, avg); param.add_(buf, alpha=-lr)
        xp.multiply(buf, momentum, out=buf)
        xp.add(buf, xp.divide(grad, avg, out=avg), out=buf)
        xp.add(param, xp.multiply(buf, -lr, out=avg), out=param)
    else:
        # param.addcdiv_(grad, avg, value=-lr) == param + (-lr * grad) / avg
        upd = xp.multiply(grad, -lr)
        xp.add(param, xp.divide(upd, avg, out=upd), out=param)
