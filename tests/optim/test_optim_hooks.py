"""Optimizer hooks against torch's: what step pre/post hooks (per optimizer and global) and state_dict /
load_state_dict hooks see, in which order, what their results replace, and handle removal."""
import pytest
import torch
import torch.optim.optimizer as torch_optimizer

import smalltrain
from smalltrain.optim import optimizer as smalltrain_optimizer


def _hooks_module(lib):
    return torch_optimizer if lib is torch else smalltrain_optimizer


def _trace(lib):
    """The calls the hooks of an SGD see over two steps, a state_dict and a load, as comparable tuples."""
    calls = []
    p = lib.ones(2, requires_grad=True)
    opt = lib.optim.SGD([p], lr=0.5)

    def pre(o, args, kwargs):
        calls.append(("pre", o is opt, len(args), args[0] is opt, dict(kwargs)))
        return (args, {"closure": None})   # a replacement for step's arguments
    handles = [opt.register_step_pre_hook(pre),
               opt.register_step_post_hook(lambda o, a, k: calls.append(("post", dict(k)))),
               _hooks_module(lib).register_optimizer_step_pre_hook(lambda o, a, k: calls.append(("global-pre",))),
               _hooks_module(lib).register_optimizer_step_post_hook(lambda o, a, k: calls.append(("global-post",)))]
    try:
        for _ in range(2):
            p.grad = lib.ones(2)
            opt.step()
        handles[0].remove()
        opt.step()
    finally:
        for h in handles:
            h.remove()
    opt.step()   # every hook removed: nothing recorded
    opt.register_state_dict_pre_hook(lambda o: calls.append(("sd-pre",)))
    opt.register_state_dict_pre_hook(lambda o: calls.append(("sd-pre-first",)), prepend=True)
    opt.register_state_dict_post_hook(lambda o, sd: dict(sd, extra=1))
    sd = opt.state_dict()
    calls.append(("sd", sd["extra"]))

    def load_pre(o, sd):
        calls.append(("load-pre", "extra" in sd))
        sd = dict(sd)
        sd["param_groups"] = [dict(g, lr=0.25) for g in sd["param_groups"]]
        return sd
    opt.register_load_state_dict_pre_hook(load_pre)
    opt.register_load_state_dict_post_hook(lambda o: calls.append(("load-post", o.param_groups[0]["lr"])))
    opt.load_state_dict(sd)
    calls.append(("p", [round(float(v), 6) for v in p.detach().tolist()]))
    return calls


def test_hooks_like_torch():
    assert _trace(smalltrain) == _trace(torch)


def test_bad_pre_hook_result_raises_like_torch():
    for lib in (torch, smalltrain):
        p = lib.ones(2, requires_grad=True)
        opt = lib.optim.Adam([p])
        opt.register_step_pre_hook(lambda o, a, k: 3)
        with pytest.raises(RuntimeError, match="must return None or a tuple of \\(new_args, new_kwargs\\), but got 3"):
            opt.step()
