"""The CUDA fast path of SGD and Adam/AdamW: one kernel launch over all of a group's parameters.

Used when every parameter of a group that has a gradient is a contiguous CUDA array of one dtype. Adam's
step count and every group's hyperparameters (lr, momentum or betas, eps, weight decay) then live on the device,
so the whole update can be captured in a CUDA graph and replayed: a replay hook copies values a scheduler
changed to the device first and counts the replayed steps, which `flush` adds to the per-parameter host
counters in `state['step']` (for state_dict and the next eager step). Whether momentum or weight decay is used
at all (zero or not) is fixed when the graph is captured.
"""
import numpy as np

from ..backend.cuda import cupy, graphs
from ..backend.cuda import optim as kernels
from ..nn.utils import flat_parameters
from ..tensor import Tensor


def _sgd_values(group):
    return (group["lr"], group["momentum"], group["dampening"], group["weight_decay"])


def _adam_values(group):
    return (group["lr"], *group["betas"], group["eps"], group["weight_decay"])


def _device_hyper(opt, group, values):
    """The group's hyperparameters `values(group)` as a device float64 array, current before every eager call
    and every replay of a graph that captured this step (schedulers change lr and momentum/betas)."""
    cache = opt.__dict__.setdefault("_device_hyper", {})
    entry = cache.get(id(group))
    capturing = graphs.is_current_stream_capturing()
    if entry is None:
        # made during a capture, its write is only recorded: mark the values unknown so the first replay writes them
        entry = cache[id(group)] = [cupy().empty(len(values(group)), dtype=np.float64), None]

    def refresh():
        now = tuple(float(v) for v in values(group))
        if entry[1] != now:
            kernels.set_hyper(entry[0], now)
            entry[1] = now
    if capturing:
        graphs.on_replay(refresh)
    else:
        refresh()
    return entry[0]


def flush(opt):
    """Add the Adam steps that graph replays made to the host counters `state['step']`."""
    for entry in opt.__dict__.get("_device_steps", {}).values():
        if entry[2]:
            for p in entry[3]:
                opt.state[p]["step"].array += entry[2]
            entry[1] += entry[2]
            entry[2] = 0


def eligible(params):
    """The parameters with gradients, if they all qualify for the fused kernels; else None."""
    live = [p for p in params if p.grad is not None]
    if not live or isinstance(live[0].array, np.ndarray):
        return None
    dtype, dev = live[0].array.dtype, live[0].array.device.id
    for p in live:
        a, g = p.array, p.grad.array
        if isinstance(a, np.ndarray) or a.dtype != dtype or a.device.id != dev or g.dtype != dtype or \
                not a.flags.c_contiguous or not g.flags.c_contiguous or a.dtype.kind != "f":
            return None
    return live


def _flat_params(live):
    """The FlatParameters (nn.utils.flatten_parameters) whose parameters `live` are, in its order, every array and
    gradient still its view, else None: the kernels then walk its two flat arrays instead of a table of the
    separate ones (the gaps between the parameters are updated as elements with a zero gradient, and never read)."""
    flat = flat_parameters.owner(live[0])
    if flat is None or len(live) != len(flat.offsets) or not flat.grads_in_place() or \
            any(p is not q for p, q in zip(live, flat.params)):
        return None
    return flat


def _flat_state(opt, group, live, names, flat):
    """The state `names` (e.g. exp_avg, exp_avg_sq) of the live parameters as views into one flat array per name,
    laid out as the FlatParameters `flat`, the flat arrays returned in that order; where opt.state holds other
    arrays (the first step, a loaded state dict), new flat arrays take their values (zeros where a parameter has
    none yet) and opt.state their views. None while a CUDA graph is captured and they would have to be made: the
    capture would record the copies, and every replay would redo them."""
    cache = opt.__dict__.setdefault("_flat_state", {})
    entry = cache.get(id(group))
    if entry is not None and entry[0] == names and len(entry[1]) == len(live) and all(
            p is q and all(opt.state[p].get(name) is view for name, view in zip(names, views))
            for p, q, views in zip(live, entry[1], entry[3])):
        return entry[2]
    if graphs.is_current_stream_capturing():
        return None
    cp = cupy()
    with live[0].array.device:
        flats = [cp.zeros_like(flat.data) for _ in names]
    views = []
    for p, off in zip(live, flat.offsets):
        n, st = p.array.size, opt.state[p]
        per = []
        for name, buf in zip(names, flats):
            view = buf[off:off + n].reshape(p.array.shape)
            if st.get(name) is not None:
                view[...] = st[name].array
            st[name] = Tensor._wrap(view)
            per.append(st[name])
        views.append(per)
    cache[id(group)] = (names, list(live), flats, views)
    return flats


def sgd(opt, group, live):
    momentum = float(group["momentum"])
    bufs, first = None, False
    flat = _flat_params(live)
    if momentum != 0:
        have = [opt.state[p].get("momentum_buffer") is not None for p in live]
        if any(have) and not all(have):
            return False   # mixed first and later steps: the array code handles that
        first = not have[0]
        bufs = _flat_state(opt, group, live, ("momentum_buffer",), flat) if flat is not None else None
        if bufs is None:
            flat = None
            if first:
                for p in live:
                    # the kernel fills it with the gradient (torch's first step: a copy, no dampening)
                    opt.state[p]["momentum_buffer"] = Tensor._wrap(kernels.cupy().empty_like(p.array))
            bufs = [opt.state[p]["momentum_buffer"].array for p in live]
    params, grads = ([flat.data], [flat.grad]) if flat is not None else \
        ([p.array for p in live], [p.grad.array for p in live])
    kernels.sgd_step(params, grads, bufs, lr=float(group["lr"]),
                     momentum=momentum, dampening=float(group["dampening"]),
                     weight_decay=float(group["weight_decay"]), nesterov=group["nesterov"],
                     maximize=group["maximize"], first_step=first, hyper=_device_hyper(opt, group, _sgd_values))
    return True


def adam(opt, group, live, init_state):
    cp = kernels.cupy()
    flush(opt)
    for p in live:
        if not opt.state[p]:
            init_state(opt.state[p], p.array, group["amsgrad"])
    steps = {float(opt.state[p]["step"].array) for p in live}
    if len(steps) != 1:
        return False
    host_step = steps.pop()
    cache = opt.__dict__.setdefault("_device_steps", {})
    key = id(group)
    entry = cache.get(key)
    if entry is None or entry[1] != host_step:   # first use, or state loaded since: seed from the host count
        # [device step, host step it matches, steps replayed since, the params it counts for]
        entry = [cp.full(1, host_step, dtype=np.float64), host_step, 0, live]
        cache[key] = entry
    entry[3] = live
    beta1, beta2 = (float(b) for b in group["betas"])
    st = [opt.state[p] for p in live]
    names = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())
    flat = _flat_params(live)
    state = _flat_state(opt, group, live, names, flat) if flat is not None else None
    if state is not None:
        params, grads, moments = [flat.data], [flat.grad], [[a] for a in state]
    else:
        params, grads = [p.array for p in live], [p.grad.array for p in live]
        moments = [[s[name].array for s in st] for name in names]
    kernels.adam_step(params, grads, moments[0], moments[1], moments[2] if group["amsgrad"] else None,
                      step=entry[0], lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=float(group["eps"]),
                      weight_decay=float(group["weight_decay"]), amsgrad=group["amsgrad"],
                      maximize=group["maximize"], decoupled_weight_decay=group["decoupled_weight_decay"],
                      hyper=_device_hyper(opt, group, _adam_values))

    def replayed():
        entry[2] += 1
    if not graphs.on_replay(replayed):   # captured: nothing ran yet, each replay counts one step
        entry[1] = host_step + 1
        for s in st:
            s["step"].array += 1
    return True
