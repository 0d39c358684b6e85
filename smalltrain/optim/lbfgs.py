"""L-BFGS (fixed step or strong-Wolfe line search), as torch.optim.LBFGS: one parameter group, a closure that
re-evaluates the loss, and its whole state (flat direction, history, step) under the first parameter. Flat vectors
are xp arrays; scalars are host NumPy scalars of the parameters' dtype (torch's 0-d tensors), stored as 0-d
tensors."""
import numpy as np

from ..ops._util import xp_of
from ..tensor import Tensor
from .line_search import _host, strong_wolfe
from .optimizer import Optimizer, check_hyper


class LBFGS(Optimizer):
    _flat_state = ("d", "prev_flat_grad", "old_dirs", "old_stps")   # flat vectors, not shaped like parameter 0

    def __init__(self, params, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7, tolerance_change=1e-9,
                 history_size=100, line_search_fn=None):
        check_hyper(("learning rate", lr, 0.0 <= lr))
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        defaults = {"lr": lr, "max_iter": max_iter, "max_eval": max_eval, "tolerance_grad": tolerance_grad,
                    "tolerance_change": tolerance_change, "history_size": history_size,
                    "line_search_fn": line_search_fn}
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]

    def _gather_flat_grad(self):
        xp = xp_of(self._params[0].array)
        return xp.concatenate([xp.zeros(p.array.size, p.array.dtype) if p.grad is None else p.grad.array.reshape(-1)
                               for p in self._params])

    def _add_grad(self, step_size, update):
        """params += step_size * update (torch's p.add_(update, alpha=step_size))."""
        offset = 0
        for p in self._params:
            a, n = p.array, p.array.size
            xp_of(a).add(a, update[offset:offset + n].reshape(a.shape) * step_size, out=a)
            offset += n

    def _directional_evaluate(self, closure, x, t, d):
        self._add_grad(t, d)
        loss = float(self._closure_loss(closure))
        flat_grad = self._gather_flat_grad()
        for p, saved in zip(self._params, x):
            p.array[...] = saved
        return loss, flat_grad

    def step(self, closure):
        """Up to max_iter L-BFGS iterations, each re-evaluating the closure; returns the closure's first loss."""
        group = self.param_groups[0]
        lr, max_iter, max_eval = float(group["lr"]), group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        line_search_fn, history_size = group["line_search_fn"], group["history_size"]
        # the state is global; it sits under the first parameter, as in torch, for load_state_dict's casting
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        orig_loss = self._closure_loss(closure)
        loss = float(orig_loss)
        current_evals = 1
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()
        xp = xp_of(flat_grad)

        def dot(a, b):
            return _host(xp.dot(a, b))

        def abs_max(a):
            return _host(xp.abs(a).max())
        if abs_max(flat_grad) <= tolerance_grad:
            return orig_loss
        d, t, old_dirs, old_stps, ro, H_diag, prev_flat_grad, prev_loss = _load(state)
        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            # the descent direction
            if state["n_iter"] == 1:
                d = -flat_grad
                old_dirs, old_stps, ro, H_diag = [], [], [], 1
            else:
                al = state.setdefault("al", [None] * history_size)
                d, H_diag = _direction(dot, flat_grad, prev_flat_grad, d * t, old_dirs, old_stps, ro, H_diag, al,
                                       history_size)
            prev_flat_grad = flat_grad.copy()
            prev_loss = loss
            # the step length: the first iteration's is scaled by the gradient's 1-norm
            t = min(1.0, 1.0 / _host(xp.abs(flat_grad).sum())) * lr if state["n_iter"] == 1 else lr
            gtd = dot(flat_grad, d)
            if gtd > -tolerance_change:   # the directional derivative is below tolerance
                break
            ls_func_evals = 0
            if line_search_fn is not None:
                if line_search_fn != "strong_wolfe":
                    raise RuntimeError("only 'strong_wolfe' is supported")
                x_init = [p.array.copy() for p in self._params]
                loss, flat_grad, t, ls_func_evals = strong_wolfe(
                    lambda x, t, d: self._directional_evaluate(closure, x, t, d), dot, x_init, t, d, loss, flat_grad,
                    gtd, max_ls=max_eval - current_evals)
                self._add_grad(t, d)
                opt_cond = abs_max(flat_grad) <= tolerance_grad
            else:
                self._add_grad(t, d)
                opt_cond = False
                if n_iter != max_iter:   # re-evaluate, except after the last iteration
                    loss = float(self._closure_loss(closure))
                    flat_grad = self._gather_flat_grad()
                    opt_cond = abs_max(flat_grad) <= tolerance_grad
                    ls_func_evals = 1
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals
            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if abs_max(d * t) <= tolerance_change or abs(loss - prev_loss) < tolerance_change:   # no progress
                break
        _store(state, d, t, old_dirs, old_stps, ro, H_diag, prev_flat_grad, prev_loss)
        return orig_loss


def _direction(dot, flat_grad, prev_flat_grad, s, old_dirs, old_stps, ro, H_diag, al, history_size):
    """The next direction -H grad by the two-loop recursion, with one buffer, after the last step s and its change of
    gradient join the memory (old_dirs, old_stps, ro: changed in place; the oldest pair dropped once full) when their
    curvature is positive: (direction, H_diag, the scale of the initial inverse Hessian)."""
    y = flat_grad - prev_flat_grad
    ys = dot(y, s)
    if ys > 1e-10:
        if len(old_dirs) == history_size:
            old_dirs.pop(0)
            old_stps.pop(0)
            ro.pop(0)
        old_dirs.append(y)
        old_stps.append(s)
        ro.append(1.0 / ys)
        H_diag = ys / dot(y, y)
    q = -flat_grad
    for i in range(len(old_dirs) - 1, -1, -1):
        al[i] = dot(old_stps[i], q) * ro[i]
        q += old_dirs[i] * -_unwrap(al[i])
    r = q * H_diag
    for i in range(len(old_dirs)):
        be_i = dot(old_dirs[i], r) * ro[i]
        r += old_stps[i] * (_unwrap(al[i]) - be_i)
    return r, H_diag


def _unwrap(v):
    """A state entry as step() uses it: xp arrays and host scalars, lists item by item (None stays None)."""
    if isinstance(v, list):
        return [_unwrap(x) for x in v]
    if isinstance(v, Tensor):
        return v.array if v.array.ndim else _host(v.array)
    return v


def _wrap(v):
    """The inverse: arrays as tensors and NumPy scalars as 0-d CPU tensors, as torch's state holds them."""
    if isinstance(v, list):
        return [_wrap(x) for x in v]
    if isinstance(v, np.generic):
        return Tensor._wrap(np.asarray(v))
    return v if v is None or isinstance(v, (int, float, Tensor)) else Tensor._wrap(v)


_KEYS = ("d", "t", "old_dirs", "old_stps", "ro", "H_diag", "prev_flat_grad", "prev_loss")


def _load(state):
    return tuple(_unwrap(state.get(key)) for key in _KEYS)


def _store(state, *values):
    state.update({key: _wrap(v) for key, v in zip(_KEYS, values)})
    if "al" in state:
        state["al"] = _wrap(state["al"])
