"""nn.Module and nn.Parameter against torch.nn's contract: registration, iteration order, state_dict keys and
load errors, train/eval, hooks, zero_grad, in-place conversion, repr, containers."""
import copy
import re
from collections import OrderedDict

import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain import nn
from smalltrain.testing import assert_close


# ---- the same architectures written against both frameworks ------------------------------------------------
def conv_net(n):
    return n.Sequential(n.Conv2d(3, 4, 3, padding=1), n.BatchNorm2d(4), n.ReLU(), n.Flatten(), n.Linear(4 * 5 * 5, 3))


def nested_net(n):
    class Block(n.Module):
        def __init__(self, c):
            super().__init__()
            self.conv = n.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn = n.BatchNorm2d(c)
            self.register_buffer("scale", torch_or_st(n).ones(c), persistent=False)
            self.act = n.ReLU()

        def forward(self, x):
            return self.act(self.bn(self.conv(x))) + x

    class Net(n.Module):
        def __init__(self):
            super().__init__()
            self.stem = n.Conv2d(2, 4, 3, stride=2)
            self.blocks = n.ModuleList([Block(4), Block(4)])
            self.heads = n.ModuleDict({"cls": n.Linear(4, 3), "aux": n.Linear(4, 1, bias=False)})
            self.register_buffer("step", torch_or_st(n).zeros(1))
            self.register_parameter("unused", None)
            self.temperature = n.Parameter(torch_or_st(n).ones(1))

        def forward(self, x):
            x = self.stem(x)
            for b in self.blocks:
                x = b(x)
            x = x.mean((2, 3))
            return self.heads["cls"](x) * self.temperature

    return Net()


def torch_or_st(n):
    return torch if n is torch.nn else st


def to_torch_state(ours):
    return {k: torch.tensor(np.array(v)) for k, v in ours.state_dict().items()}


# ---- Parameter -----------------------------------------------------------------------------------------------
def test_parameter_is_a_tensor_sharing_memory():
    t = st.tensor([1.0, 2.0])
    p = nn.Parameter(t)
    assert isinstance(p, st.Tensor) and p.requires_grad and p.is_leaf and p.grad_fn is None
    assert p.array is t.array
    assert repr(p).startswith("Parameter containing:\ntensor([1., 2.]") and "requires_grad=True" in repr(p)
    assert not nn.Parameter(t, requires_grad=False).requires_grad
    assert nn.Parameter().shape == (0,)
    with pytest.raises(RuntimeError, match="floating point"):
        nn.Parameter(st.tensor([1, 2]))
    # accepted by ops like any tensor, gradients flow into it
    (p * st.tensor([3.0, 4.0])).sum().backward()
    assert_close(p.grad, np.array([3.0, 4.0]))
    assert type(p.detach()) is st.Tensor and type(p.data) is st.Tensor


# ---- registration ----------------------------------------------------------------------------------------------
def test_setattr_registers_and_none_and_delete():
    m = nn.Module()
    m.w = nn.Parameter(st.ones(2))
    m.register_buffer("b", st.zeros(2))
    m.sub = nn.Linear(2, 2)
    m.plain = 3
    assert list(m._parameters) == ["w"] and list(m._buffers) == ["b"] and list(m._modules) == ["sub"]
    assert m.w is m._parameters["w"] and m.b is m._buffers["b"] and m.sub is m._modules["sub"]
    m.b = st.ones(3)  # reassigning a buffer name with a Tensor keeps it a buffer
    assert m._buffers["b"].shape == (3,)
    m.w = None
    assert m._parameters["w"] is None and m.w is None and [n for n, _ in m.named_parameters()] == \
        ["sub.weight", "sub.bias"]
    m.sub = None
    assert m._modules["sub"] is None and list(m.children()) == []
    m.x = nn.Buffer(st.ones(1), persistent=False)
    assert "x" in m._buffers and "x" not in m.state_dict()
    del m.w, m.b, m.sub, m.plain
    assert not m._parameters and list(m._buffers) == ["x"] and not m._modules and not hasattr(m, "plain")
    assert "x" in dir(m)
    with pytest.raises(AttributeError, match="'Module' object has no attribute 'nope'"):
        _ = m.nope


def test_reassigning_moves_between_kinds():
    m = nn.Module()
    m.a = nn.Linear(1, 1)
    m.a = nn.Parameter(st.ones(1))  # a module slot replaced by a parameter
    assert "a" not in m._modules and "a" in m._parameters
    m.a = None  # still a parameter slot
    assert m._parameters["a"] is None


def _tensor_over_parameter(n, m):
    m.w = n.Parameter(torch_or_st(n).ones(1))
    m.w = torch_or_st(n).ones(1)


REGISTRATION_ERRORS = [
    (_tensor_over_parameter, TypeError, r"cannot assign '.*' as parameter 'w'"),
    (lambda n, m: m.register_parameter("a.b", None), KeyError, r"parameter name can.{1,2}t contain \"\.\""),
    (lambda n, m: m.register_parameter("", None), KeyError, r"parameter name can.{1,2}t be empty string"),
    (lambda n, m: m.register_parameter(1, None), TypeError, r"parameter name should be a string. Got int"),
    (lambda n, m: m.register_parameter("training", None), KeyError, r"attribute 'training' already exists"),
    (lambda n, m: m.register_parameter("p", torch_or_st(n).ones(1)), TypeError,
     r"cannot assign '.*' object to parameter 'p'"),
    (lambda n, m: m.register_buffer("a.b", None), KeyError, r"buffer name can.{1,2}t contain \"\.\""),
    (lambda n, m: m.register_buffer("b", 3), TypeError, r"cannot assign 'int' object to buffer 'b'"),
    (lambda n, m: m.add_module("x", 3), TypeError, r"int is not a Module subclass"),
    (lambda n, m: m.add_module("a.b", n.ReLU()), KeyError, r"module name can.{1,2}t contain \"\.\", got: a\.b"),
    (lambda n, m: m.add_module("", n.ReLU()), KeyError, r"module name can.{1,2}t be empty string"),
    (lambda n, m: setattr(m, "c", n.ReLU()) or setattr(m, "c", 3), TypeError,
     r"cannot assign 'int' as child module 'c'"),
    (lambda n, m: m.train("yes"), ValueError, r"training mode is expected to be boolean"),
]


@pytest.mark.parametrize("fn, exc, pattern", REGISTRATION_ERRORS)
def test_registration_errors_match_torch(fn, exc, pattern):
    with pytest.raises(exc, match=pattern):
        fn(torch.nn, torch.nn.Module())
    with pytest.raises(exc, match=pattern):
        fn(nn, nn.Module())


def test_assign_before_init_raises():
    class Bad(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(st.ones(1))

    with pytest.raises(AttributeError, match="cannot assign parameters before Module.__init__"):
        Bad()


def test_forward_missing_and_init_args():
    with pytest.raises(NotImplementedError, match=r'Module \[Module\] is missing the required "forward"'):
        nn.Module()(1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'x'"):
        nn.Module(x=1)


# ---- iteration and state_dict keys ------------------------------------------------------------------------------
@pytest.mark.parametrize("build", [conv_net, nested_net])
def test_names_and_state_dict_keys_equal_torch(build):
    ours, theirs = build(nn), build(torch.nn)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    assert [n for n, _ in ours.named_parameters(prefix="net", recurse=False)] == \
        [n for n, _ in theirs.named_parameters(prefix="net", recurse=False)]
    assert len(list(ours.parameters())) == len(list(theirs.parameters()))
    assert len(list(ours.modules())) == len(list(theirs.modules()))
    for (k, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        assert tuple(a.shape) == tuple(b.shape) and str(a.dtype).split(".")[1] == str(b.dtype).split(".")[1], k


def test_shared_parameters_and_modules_are_deduplicated_like_torch():
    def build(n):
        m = n.Sequential(n.Linear(2, 2), n.ReLU())
        m.add_module("again", m[0])
        m.extra = n.Linear(2, 2)
        m.extra.weight = m[0].weight
        return m
    ours, theirs = build(nn), build(torch.nn)
    for kw in ({}, {"remove_duplicate": False}):
        assert [n for n, _ in ours.named_parameters(**kw)] == [n for n, _ in theirs.named_parameters(**kw)]
        assert [n for n, _ in ours.named_modules(**kw)] == [n for n, _ in theirs.named_modules(**kw)]
    assert list(ours.state_dict()) == list(theirs.state_dict())


def test_state_dict_values_are_detached_views():
    m = nn.Linear(3, 2)
    sd = m.state_dict()
    assert isinstance(sd, OrderedDict) and type(sd["weight"]) is st.Tensor and not sd["weight"].requires_grad
    assert sd["weight"].array is m.weight.array
    assert m.state_dict(keep_vars=True)["weight"] is m.weight
    assert list(m.state_dict(prefix="fc.")) == ["fc.weight", "fc.bias"]


def test_get_submodule_and_parameter():
    ours = nested_net(nn)
    assert ours.get_submodule("blocks.1.conv") is ours.blocks[1].conv
    assert ours.get_parameter("heads.cls.weight") is ours.heads["cls"].weight
    with pytest.raises(AttributeError, match="has no attribute `nope`"):
        ours.get_submodule("blocks.nope")


# ---- load_state_dict --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("build", [conv_net, nested_net])
def test_state_dict_round_trip_with_torch(build, rng):
    ours, theirs = build(nn), build(torch.nn)
    ours.eval(), theirs.eval()
    theirs.load_state_dict(to_torch_state(ours))
    x = rng.standard_normal((2, 3 if build is conv_net else 2, 5, 5)).astype(np.float32)
    params = {id(p) for p in ours.parameters()}
    ours2 = build(nn).eval()
    result = ours2.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})  # numpy arrays load
    assert result.missing_keys == [] and result.unexpected_keys == [] and repr(result) == \
        "<All keys matched successfully>"
    assert {id(p) for p in ours.parameters()} == params
    with torch.no_grad():
        want = theirs(torch.tensor(x))
    with st.no_grad():
        assert_close(ours(st.tensor(x)), want)
        assert_close(ours2(st.tensor(x)), want)


def test_load_copies_in_place_and_casts():
    m = nn.Linear(2, 2)
    w = m.weight
    arr = w.array
    m.load_state_dict({"weight": np.arange(4.0).reshape(2, 2), "bias": st.tensor([1.0, 2.0], dtype=st.float64)})
    assert m.weight is w and w.array is arr and w.dtype == st.float32
    assert_close(w, np.arange(4.0).reshape(2, 2)) and assert_close(m.bias, np.array([1.0, 2.0]))


def _mismatch_state(n):
    net = n.Sequential(OrderedDict(conv=n.Conv2d(1, 2, 3), fc=n.Linear(4, 3), bn=n.BatchNorm1d(3)))
    sd = {k: v.detach().clone() if n is torch.nn else v for k, v in net.state_dict().items()}
    del sd["fc.bias"], sd["bn.running_var"]
    sd["fc.weight"] = torch_or_st(n).zeros(3, 5)
    sd["conv.bias"] = torch_or_st(n).zeros(3)
    sd["extra"] = torch_or_st(n).zeros(1)
    sd["fc.nope"] = torch_or_st(n).zeros(1)
    sd["head.weight"] = torch_or_st(n).zeros(1)
    return net, sd


def test_load_state_dict_error_lists_every_problem_like_torch():
    theirs, tsd = _mismatch_state(torch.nn)
    ours, osd = _mismatch_state(nn)
    with pytest.raises(RuntimeError) as t_err:
        theirs.load_state_dict(tsd)
    with pytest.raises(RuntimeError) as o_err:
        ours.load_state_dict(osd)
    want = str(t_err.value).replace("torch.Size", "smalltrain.Size")
    assert str(o_err.value) == want
    assert want.startswith("Error(s) in loading state_dict for Sequential:\n\tMissing key(s) in state_dict: ")
    # non-strict: no missing/unexpected error, but size mismatches still raise, as in torch
    with pytest.raises(RuntimeError) as t_err:
        theirs.load_state_dict(tsd, strict=False)
    with pytest.raises(RuntimeError) as o_err:
        ours.load_state_dict(osd, strict=False)
    assert str(o_err.value) == str(t_err.value).replace("torch.Size", "smalltrain.Size")


def test_load_state_dict_non_strict_returns_keys_like_torch():
    def build(n):
        return n.Sequential(n.Linear(2, 2), n.BatchNorm1d(2))
    theirs, ours = build(torch.nn), build(nn)
    tsd = theirs.state_dict()
    del tsd["0.bias"]
    tsd["2.weight"] = torch.zeros(1)
    osd = {k: v.numpy() for k, v in tsd.items()}
    t_res, o_res = theirs.load_state_dict(tsd, strict=False), ours.load_state_dict(osd, strict=False)
    assert o_res.missing_keys == t_res.missing_keys == ["0.bias"]
    assert o_res.unexpected_keys == t_res.unexpected_keys == ["2.weight"]


def test_load_state_dict_bad_values():
    m = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="Expected state_dict to be dict-like"):
        m.load_state_dict([1, 2])
    with pytest.raises(RuntimeError, match='While copying the parameter named "bias", expected'):
        m.load_state_dict({"weight": m.weight.detach(), "bias": "zeros"})


def test_batchnorm_checkpoint_without_num_batches_tracked_loads_like_torch():
    ours, theirs = nn.BatchNorm1d(2), torch.nn.BatchNorm1d(2)
    sd = {k: v for k, v in ours.state_dict().items() if k != "num_batches_tracked"}  # a plain dict: no metadata
    assert ours.load_state_dict(sd).missing_keys == \
        theirs.load_state_dict({k: torch.tensor(np.array(v)) for k, v in sd.items()}).missing_keys == []
    full = ours.state_dict()   # with metadata (version 2) the key is required, as in torch
    del full["num_batches_tracked"]
    tfull = theirs.state_dict()
    del tfull["num_batches_tracked"]
    assert ours.load_state_dict(full, strict=False).missing_keys == \
        theirs.load_state_dict(tfull, strict=False).missing_keys == ["num_batches_tracked"]


def test_load_state_dict_assign():
    m = nn.Linear(2, 2)
    new = st.ones(2, 2)
    m.load_state_dict({"weight": new, "bias": st.zeros(2)}, assign=True)
    assert isinstance(m.weight, nn.Parameter) and m.weight.array is new.array and m.weight.requires_grad


# ---- modes, gradients, conversion -----------------------------------------------------------------------------
def test_train_eval_recursive():
    m = nested_net(nn)
    assert m.training and all(s.training for s in m.modules())
    assert m.eval() is m and not any(s.training for s in m.modules())
    m.blocks.train()
    assert not m.training and all(s.training for s in m.blocks.modules()) and not m.heads.training


def test_zero_grad_both_modes():
    m = nn.Linear(3, 2)
    m(st.ones(4, 3)).sum().backward()
    grad = m.weight.grad
    m.zero_grad(set_to_none=False)
    assert m.weight.grad is grad and not grad.array.any() and not m.bias.grad.array.any()
    m(st.ones(4, 3)).sum().backward()
    assert m.weight.grad is grad and grad.array.any()  # accumulation continued in the same array
    m.zero_grad()
    assert m.weight.grad is None and m.bias.grad is None


def test_requires_grad_and_apply():
    m = conv_net(nn)
    m.requires_grad_(False)
    assert not any(p.requires_grad for p in m.parameters())
    seen = []
    assert m.apply(lambda mod: seen.append(type(mod).__name__)) is m
    assert seen == ["Conv2d", "BatchNorm2d", "ReLU", "Flatten", "Linear", "Sequential"]


def test_to_converts_in_place_keeping_identity():
    m = conv_net(nn)
    m(st.randn(2, 3, 5, 5)).sum().backward()
    params = list(m.parameters())
    before = [p.array.copy() for p in params]
    assert m.to(st.float64) is m
    assert list(m.parameters()) == params and all(a is b for a, b in zip(m.parameters(), params))
    assert all(p.dtype == st.float64 and p.grad.dtype == st.float64 for p in params)
    assert all(np.array_equal(p.array, b) for p, b in zip(params, before))
    assert m[1].running_mean.dtype == st.float64 and m[1].num_batches_tracked.dtype == st.int64
    m.float()
    assert all(p.dtype == st.float32 for p in params)
    m.double()
    assert params[0].dtype == st.float64
    m.to(st.zeros(1, dtype=st.float32))
    assert params[0].dtype == st.float32
    m.to("cpu", st.float32)
    m.to(device="cpu", dtype=st.float32)
    with pytest.raises(TypeError, match="only accepts floating point or complex dtypes"):
        m.to(st.int64)
    with pytest.raises(TypeError, match="only accepts floating point or complex dtypes"):
        torch.nn.Linear(1, 1).to(torch.int64)


def test_to_device_keeps_identity(device, rng):
    m = conv_net(nn)
    params = list(m.parameters())
    m.to(device)
    assert all(a is b for a, b in zip(m.parameters(), params))
    assert all(str(t.device) == str(st.device(device)) for t in m.state_dict().values())
    x = st.tensor(rng.standard_normal((2, 3, 5, 5)).astype(np.float32), device=device)
    m(x).sum().backward()
    assert all(str(p.grad.device) == str(st.device(device)) for p in params)
    m.cpu()
    assert all(p.device == st.device("cpu") and p.grad.device == st.device("cpu") for p in params)


def test_to_keeps_optimizer_working():
    m = nn.Linear(3, 1)
    params = list(m.parameters())
    m.double()
    m(st.ones(2, 3, dtype=st.float64)).sum().backward()
    with st.no_grad():
        for p in params:  # what an optimizer holding the original objects does
            p.sub_(p.grad * 0.1)
    assert m.weight.dtype == st.float64 and m.weight is params[0]


def test_deepcopy():
    m = conv_net(nn)
    c = copy.deepcopy(m)
    assert list(c.state_dict()) == list(m.state_dict())
    for a, b in zip(c.parameters(), m.parameters()):
        assert a is not b and isinstance(a, nn.Parameter) and a.array is not b.array and np.array_equal(a, b)
    assert c[1].running_mean is not m[1].running_mean


# ---- hooks -----------------------------------------------------------------------------------------------------
def test_forward_hooks_replace_args_and_output_and_remove():
    m = nn.Identity()
    calls = []
    h1 = m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    h2 = m.register_forward_hook(lambda mod, args, out: out + 1)
    h3 = m.register_forward_hook(lambda mod, args, out: calls.append(("second", out.item())))
    m.register_forward_hook(lambda mod, args, out: calls.append(("first", out.item())), prepend=True)
    assert m(st.tensor(3.0)).item() == 7.0
    assert calls == [("first", 6.0), ("second", 7.0)]
    h1.remove(), h2.remove(), h3.remove()
    assert m(st.tensor(3.0)).item() == 3.0
    with m.register_forward_pre_hook(lambda mod, args: st.tensor(10.0)):  # a non-tuple return is wrapped
        assert m(st.tensor(3.0)).item() == 10.0
    assert m(st.tensor(3.0)).item() == 3.0


def test_forward_hooks_with_kwargs_and_always_call():
    class Scale(nn.Module):
        def forward(self, x, scale=1.0):
            if scale < 0:
                raise ValueError("negative")
            return x * scale

    m = Scale()
    m.register_forward_pre_hook(lambda mod, args, kwargs: (args, {"scale": kwargs.get("scale", 1.0) * 3}),
                                with_kwargs=True)
    seen = []
    m.register_forward_hook(lambda mod, args, kwargs, out: seen.append(kwargs["scale"]), with_kwargs=True,
                            always_call=True)
    assert m(st.tensor(2.0), scale=2.0).item() == 12.0 and seen == [6.0]
    with pytest.raises(ValueError, match="negative"):
        m(st.tensor(2.0), scale=-1.0)
    assert seen == [6.0, -3.0]


# ---- repr ------------------------------------------------------------------------------------------------------
def _repr_archs(n):
    return [
        conv_net(n),
        n.Sequential(OrderedDict(c=n.Conv2d(1, 6, 5, stride=2, padding=2, dilation=2, bias=False,
                                            padding_mode="reflect"),
                                 pool=n.MaxPool2d(2), avg=n.AvgPool2d(3, stride=1, padding=1),
                                 ada=n.AdaptiveAvgPool2d((1, 1)), drop=n.Dropout(0.25),
                                 g=n.GELU(approximate="tanh"), lr=n.LeakyReLU(0.2, inplace=True),
                                 r=n.ReLU(inplace=True), s=n.SiLU(), sg=n.Sigmoid(), t=n.Tanh(), sm=n.Softmax(dim=1),
                                 lsm=n.LogSoftmax(1), un=n.Unflatten(1, (2, 3)), fl=n.Flatten(0, 2),
                                 bn=n.BatchNorm1d(4, eps=1e-3, momentum=None, affine=False),
                                 i=n.Identity(), ce=n.CrossEntropyLoss(label_smoothing=0.1), mse=n.MSELoss())),
        nested_net(n),
        n.ModuleList([n.Linear(2, 2), n.Linear(2, 2), n.ReLU(), n.Linear(2, 2)]),
        n.ModuleList(),
        n.Sequential(),
        n.Conv2d(4, 8, (3, 5), stride=(2, 1), padding=(1, 2), groups=4),
        n.Conv2d(2, 2, 3, padding="same"),
    ]


def test_repr_equals_torch(torch_repr):
    for ours, theirs in zip(_repr_archs(nn), _repr_archs(torch.nn)):
        assert torch_repr(ours) == repr(theirs)


# ---- containers ------------------------------------------------------------------------------------------------
def test_sequential_indexing_like_torch():
    layers = [nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)]
    s = nn.Sequential(*layers)
    assert len(s) == 3 and s[0] is layers[0] and s[-1] is layers[2] and list(s) == layers
    sub = s[1:]
    assert isinstance(sub, nn.Sequential) and list(sub) == layers[1:] and list(sub._modules) == ["1", "2"]
    with pytest.raises(IndexError, match="index 3 is out of range"):
        s[3]
    s.append(nn.Tanh())
    assert list(s._modules) == ["0", "1", "2", "3"] and isinstance(s[3], nn.Tanh)
    del s[1]
    assert list(s._modules) == ["0", "1", "2"] and s[1] is layers[2]
    s[0] = nn.Identity()
    assert isinstance(s[0], nn.Identity)
    named = nn.Sequential(OrderedDict(first=nn.Linear(2, 2), act=nn.ReLU()))
    assert list(named._modules) == ["first", "act"] and named.first is named[0]
    out = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))(st.ones(4, 2))
    assert out.shape == (4, 1)
    both = s + named
    assert len(both) == 5 and len(s * 2) == 6
    s.insert(0, nn.ReLU())
    assert isinstance(s[0], nn.ReLU) and len(s) == 4


def test_module_list_and_dict():
    ml = nn.ModuleList([nn.Linear(1, 1) for _ in range(3)])
    ml.append(nn.ReLU())
    ml.extend([nn.Tanh()])
    assert len(ml) == 5 and isinstance(ml[-1], nn.Tanh) and isinstance(ml[1:3], nn.ModuleList)
    assert len(list(ml.parameters())) == 6
    del ml[0]
    assert list(ml._modules) == ["0", "1", "2", "3"]
    with pytest.raises(IndexError):
        ml[10]
    with pytest.raises(TypeError, match="ModuleList.extend should be called with an iterable"):
        ml.extend(3)
    md = nn.ModuleDict([("a", nn.ReLU()), ("b", nn.Linear(1, 1))])
    md["c"] = nn.Tanh()
    assert list(md) == ["a", "b", "c"] and "b" in md and len(md) == 3
    assert [k for k, _ in md.items()] == ["a", "b", "c"] and isinstance(md.pop("a"), nn.ReLU)
    assert list(md.keys()) == ["b", "c"]
    with pytest.raises(ValueError, match="has length 1; 2 is required"):
        md.update([("x",)])
    assert re.search(r"\(b\): Linear", repr(md))


@pytest.mark.parametrize("name, args", [("Linear", (3, 2)), ("Conv2d", (1, 1, 3)), ("ReLU", ())])
def test_numpy_input_raises_type_error_like_torch(name, args):
    x = np.ones((1, 1, 3, 3), np.float32)
    with pytest.raises(TypeError):
        getattr(torch.nn, name)(*args)(x)
    with pytest.raises(TypeError, match="must be Tensor, not (numpy.)?ndarray"):
        getattr(nn, name)(*args)(x)
