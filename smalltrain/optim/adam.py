"""Adam (optionally AMSGrad, L2 or decoupled weight decay) and AdamW, in the operation order of torch's
single-tensor implementation: denom = sqrt(v) / sqrt(1 - beta2^t) + eps, param -= lr / (1 - beta1^t) * m / denom."""
import numpy as np

from ..ops._util import xp_of
from ..tensor import Tensor
from . import fused
from .optimizer import Optimizer, _step_tensor, adam_checks, check_hyper, lerp_, switches


class Adam(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False):
        check_hyper(*adam_checks(lr, eps, betas, weight_decay))
        if not (isinstance(betas[0], float) and isinstance(betas[1], float)):
            # torch also takes a pair of Tensors here; smalltrain takes floats only
            raise ValueError("betas must be either both floats or both Tensors")  # noqa: TRY004 (torch's type)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad,
                    "maximize": maximize, "decoupled_weight_decay": decoupled_weight_decay,
                    **switches(type(self).__name__, foreach=foreach, capturable=capturable,
                               differentiable=differentiable, fused=fused)}
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
            if not group["amsgrad"] and _flat_cpu_step(self, group, hyper):
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
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize, foreach=foreach,
                         capturable=capturable, differentiable=differentiable, fused=fused,
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


def _flat_state(opt, group, live):
    """The group's CPU state as views of three flat buffers (exp_avg, exp_avg_sq, and the step counters), made
    or adopted when the live parameters or their state objects changed: (m, v, steps, params, offsets) or None."""
    cache = opt.__dict__.setdefault("_cpu_flat", {})
    entry = cache.get(id(group))
    if entry is not None and len(entry[3]) == len(live):
        m, v, steps, params, _ = entry
        for i, p in enumerate(live):
            st = opt.state[p]   # the same parameters, each state still our views (load_state_dict replaces them)
            if params[i] is not p or st.get("exp_avg") is not entry[4][i][0] or \
                    st.get("exp_avg_sq") is not entry[4][i][1] or st.get("step") is not entry[4][i][2]:
                break
        else:
            return entry
    dtype = live[0].array.dtype
    states = [opt.state[p] for p in live]
    if dtype.kind != "f" or any(p.array.dtype != dtype or p.grad.array.dtype != dtype for p in live):
        return None
    if any(st and not {"exp_avg", "exp_avg_sq", "step"} <= st.keys() for st in states):
        return None
    counts = {float(st["step"].array) if st else 0.0 for st in states}
    if len(counts) != 1:   # parameters at different steps (some new in the group): the per-parameter loop
        return None
    sizes = [p.array.size for p in live]
    total = sum(sizes)
    m, v = np.zeros(total, dtype), np.zeros(total, dtype)
    steps = np.full(len(live), counts.pop(), dtype=_step_tensor().array.dtype)
    views, off = [], 0
    for i, (p, st, n) in enumerate(zip(live, states, sizes)):
        shape = p.array.shape
        mv, vv = m[off:off + n].reshape(shape), v[off:off + n].reshape(shape)
        if st:
            mv[...], vv[...] = st["exp_avg"].array, st["exp_avg_sq"].array
        st["exp_avg"], st["exp_avg_sq"] = Tensor._wrap(mv), Tensor._wrap(vv)
        st["step"] = Tensor._wrap(steps[i:i + 1].reshape(()))
        views.append((st["exp_avg"], st["exp_avg_sq"], st["step"], off, n))
        off += n
    entry = cache[id(group)] = [m, v, steps, list(live), views]
    return entry


def _flat_cpu_step(opt, group, hyper):
    """Adam over all of a group's NumPy parameters at once: _adam_update's operations (_moments_and_step) in the
    same order, so the same bits, on one flat buffer per state instead of ~15 NumPy calls per parameter (their
    fixed cost, ~1-2 us each, was most of LeNet-5's 330 us optimizer step). False when it does not apply."""
    live = [p for p in group["params"] if p.grad is not None]
    if not live or not all(isinstance(p.array, np.ndarray) for p in live):
        return False
    entry = _flat_state(opt, group, live)
    if entry is None:
        return False
    m, v, steps, _, views = entry
    grad = np.concatenate([p.grad.array.reshape(-1) for p in live])
    lr, beta1, beta2, eps, wd, _, maximize, decoupled = hyper
    steps += 1
    if maximize:
        np.negative(grad, out=grad)
    if wd != 0:
        if decoupled:
            for p in live:
                np.multiply(p.array, 1 - lr * wd, out=p.array)
        else:
            grad += np.concatenate([p.array.reshape(-1) for p in live]) * wd
    upd = _moments_and_step(np, m, v, None, grad, float(steps[0]), lr, beta1, beta2, eps, out=grad)
    for p, (_, _, _, off, n) in zip(live, views):
        a = p.array
        np.add(a, upd[off:off + n].reshape(a.shape), out=a)
    return True


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
    max_sq = state["max_exp_avg_sq"].array if amsgrad else None
    upd = _moments_and_step(xp, exp_avg, exp_avg_sq, max_sq, grad, float(step_t), lr, beta1, beta2, eps)
    xp.add(param, upd, out=param)


def _moments_and_step(xp, exp_avg, exp_avg_sq, max_sq, grad, step, lr, beta1, beta2, eps, out=None):
    """The moments updated in place with grad (and max_sq, AMSGrad's running maximum, unless None), then the step to
    add to the parameter, -lr / (1 - beta1^t) * exp_avg / denom, in torch's operation order; into `out` if given
    (it may be grad: grad is read for the last time before). One definition for the per-parameter update and the
    flat CPU one, which must give the same bits."""
    tmp = xp.empty_like(exp_avg)
    lerp_(xp, exp_avg, grad, 1 - beta1, tmp)
    # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    xp.multiply(exp_avg_sq, beta2, out=exp_avg_sq)
    xp.multiply(grad, 1 - beta2, out=tmp)
    xp.add(exp_avg_sq, xp.multiply(tmp, grad, out=tmp), out=exp_avg_sq)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    if max_sq is not None:
        xp.maximum(max_sq, exp_avg_sq, out=max_sq)
        denom = xp.sqrt(max_sq, out=tmp)
    else:
        denom = xp.sqrt(exp_avg_sq, out=tmp)
    xp.divide(denom, bias_correction2 ** 0.5, out=denom)
    xp.add(denom, eps, out=denom)
    # param.addcdiv_(exp_avg, denom, value=-step_size) == param + (-step_size * exp_avg) / denom
    upd = xp.multiply(exp_avg, -step_size, out=out)
    return xp.divide(upd, denom, out=upd)

