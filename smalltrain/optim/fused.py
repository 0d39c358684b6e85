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


def sgd(opt, group, live):
    momentum = float(group["momentum"])
    bufs, first = None, False
    if momentum != 0:
        have = [opt.state[p].get("momentum_buffer") is not None for p in live]
        if any(have) and not all(have):
            return False   # mixed first and later steps: the array code handles that
        first = not have[0]
        if first:
            for p in live:
                # the kernel fills it with the gradient (torch's first step: a copy, no dampening)
                opt.state[p]["momentum_buffer"] = Tensor._wrap(kernels.cupy().empty_like(p.array))
        bufs = [opt.state[p]["momentum_buffer"].array for p in live]
    kernels.sgd_step([p.array for p in live], [p.grad.array for p in live], bufs, lr=float(group["lr"]),
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
    kernels.adam_step([p.array for p in live], [p.grad.array for p in live], [s["exp_avg"].array for s in st],
                      [s["exp_avg_sq"].array for s in st],
                      [s["max_exp_avg_sq"].array for s in st] if group["amsgrad"] else None,
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
