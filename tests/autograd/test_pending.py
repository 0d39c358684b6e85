"""autograd/pending.py: a deferred op runs exactly once, with the grad mode it was called under, before anything that
could see its placeholder (any attribute, any op), never when the placeholder died unread; a consumer's rule absorbs
it, and an absorbed placeholder still referenced gets its own op's value. The ops here are NumPy ops deferred by
hand, so every rule is checked on the CPU."""
import pytest

import smalltrain as st
from smalltrain.autograd import held, pending
from smalltrain.tensor import Tensor


@pytest.fixture(autouse=True)
def _nothing_held():
    held.flush()
    yield
    held.flush()


def _deferred(x, log, kind="test_double"):
    """A placeholder for x * 2 (logging each run)."""
    def run(a):
        log.append("run")
        return a * 2
    return pending.defer(kind, run, (x,))


@pending.rule("test_double", "test_add_one")
def _double_then_add_one(args, log):
    x, = args
    log.append("fused")
    return pending.defer("test_fused", lambda a: a * 2 + 1, (x,))


def _add_one(t, log):
    """A consumer: x + 1, absorbing a deferred doubling."""
    if type(t) is pending.PendingTensor:
        out = pending.absorb(t, "test_add_one", log)
        if out is not None:
            return out
    return t + 1


@pytest.mark.parametrize("read", [lambda t: t.shape, lambda t: t.numpy(), lambda t: repr(t), lambda t: t.grad_fn,
                                  lambda t: t.requires_grad, lambda t: t + 0])
def test_any_read_runs_the_op_first_and_once(read):
    log = []
    x = st.tensor([1.0, 2.0])
    t = _deferred(x, log)
    assert type(t) is pending.PendingTensor and log == []
    read(t)
    assert log == ["run"] and type(t) is Tensor
    assert t.tolist() == [2.0, 4.0] and log == ["run"]


def test_another_op_runs_it_before_its_own_work():
    log = []
    t = _deferred(st.tensor([1.0]), log)
    (st.tensor([3.0]) * 2).tolist()
    assert log == ["run"] and type(t) is Tensor and t.tolist() == [2.0]


def test_a_placeholder_that_died_unread_never_runs():
    log = []
    _deferred(st.tensor([1.0]), log)
    held.flush()
    assert log == []


def test_the_grad_mode_it_was_called_under_holds():
    x = st.tensor([1.0, 2.0], requires_grad=True)
    with st.no_grad():
        t = _deferred(x, [])
    assert t.grad_fn is None and not t.requires_grad
    u = _deferred(x, [])
    with st.no_grad():
        assert u.grad_fn is not None
    u.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


def test_a_consumer_absorbs_it_by_its_rule():
    log = []
    x = st.tensor([1.0, 2.0], requires_grad=True)
    y = _add_one(_deferred(x, log), log)
    assert log == ["fused"] and pending.kind(y) == "test_fused"
    y.sum().backward()
    assert y.tolist() == [3.0, 5.0] and x.grad.tolist() == [2.0, 2.0] and log == ["fused"]


def test_an_absorbed_placeholder_still_referenced_gets_its_own_value_and_gradient():
    log = []
    x = st.tensor([1.0, 2.0], requires_grad=True)
    h = _deferred(x, log)
    y = _add_one(h, log)
    z = y + h   # a residual reading the absorbed output: it runs on its own, right after the fused op
    assert log == ["fused", "run"] and z.tolist() == [5.0, 9.0]
    z.sum().backward()
    assert x.grad.tolist() == [4.0, 4.0]


def test_no_rule_declines_and_the_plain_path_runs_it():
    log = []
    t = _deferred(st.tensor([1.0]), log, kind="test_other")
    assert _add_one(t, log).tolist() == [3.0] and log == ["run"]


def test_a_hooked_module_sees_plain_tensors():
    seen = []

    class Double(st.nn.Module):
        def forward(self, x):
            return _deferred(x, [])
    m = Double()
    m.register_forward_hook(lambda mod, args, out: seen.append(type(out)))
    out = m(st.tensor([1.0]))
    assert seen == [Tensor] and type(out) is Tensor and out.tolist() == [2.0]


def test_a_settled_placeholder_takes_every_slot_of_the_op_output():
    assert set(pending.COPIED) == set(Tensor.__slots__) - {"__weakref__"}


@pytest.mark.parametrize("write", [
    lambda x: x.add_(10), lambda x: x.mul_(3), lambda x: x.copy_(st.ones(2)), lambda x: x.fill_(7.0),
    lambda x: x.zero_(), lambda x: x.__setitem__(0, 5.0), lambda x: x.clamp_(max=0.5), lambda x: x.exp_()])
def test_an_unrecorded_in_place_write_into_its_input_runs_it_first(write):
    log = []
    x = st.tensor([1.0, 2.0])
    t = _deferred(x, log)   # x * 2, deferred
    write(x)
    assert log == ["run"] and t.tolist() == [2.0, 4.0]


def test_an_optimizer_step_runs_it_first():
    log = []
    w = st.tensor([1.0, 2.0], requires_grad=True)
    w.grad = st.ones(2)
    with st.no_grad():
        t = _deferred(w, log)
    st.optim.SGD([w], lr=1.0).step()
    assert log == ["run"] and t.tolist() == [2.0, 4.0] and w.tolist() == [0.0, 1.0]


def test_a_cpu_activation_deferred_before_pooling_reads_its_input_as_it_was():
    import numpy as np
    import torch
    x = np.random.default_rng(0).standard_normal((1, 1, 4, 4)).astype(np.float32)
    outs = []
    for lib in (st, torch):
        c = lib.tensor(x) * 1
        with lib.no_grad():
            r = lib.nn.functional.relu(c)   # deferred on our CPU, for a max_pool2d to absorb
            c.add_(10)
            outs.append(lib.nn.functional.max_pool2d(r, 2).flatten().tolist())
    assert outs[0] == outs[1]


def test_replacing_its_inputs_data_runs_it_first():
    log = []
    x = st.tensor([1.0, 2.0])
    t = _deferred(x, log)
    x.data = st.tensor([5.0, 5.0])
    assert log == ["run"] and t.tolist() == [2.0, 4.0]
