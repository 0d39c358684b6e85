"""autograd/held.py: a launch held back for the op after it runs exactly once, before anything that could read what
it writes (the held tensor's array, any op), or is taken over by the op it was held for. The launches here are
plain Python writes into NumPy arrays, so every rule is checked on the CPU."""
import numpy as np
import pytest

import smalltrain as st
from smalltrain.autograd import held
from smalltrain.tensor import Tensor


@pytest.fixture(autouse=True)
def _nothing_held():
    held.drop()
    yield
    held.drop()


def _held_tensor(values, log):
    """A tensor over an array that a held launch fills with `values` (logging each run)."""
    out = np.zeros(len(values))

    def launch():
        log.append("launch")
        out[:] = values
    held.hold(out, launch, info="fused")
    return held.mark(Tensor._wrap(out)), out


def test_reading_the_held_tensor_runs_the_launch_first_and_once():
    log = []
    t, _ = _held_tensor([1.0, 2.0], log)
    assert type(t) is held.HeldTensor and log == []
    assert t.sum().item() == 3.0   # the read saw the launch's values
    assert log == ["launch"] and type(t) is Tensor and not held.pending()
    assert t.tolist() == [1.0, 2.0] and log == ["launch"]


@pytest.mark.parametrize("read", [lambda t: t.shape, lambda t: t.dtype, lambda t: t.numpy(), lambda t: repr(t)])
def test_any_access_flushes(read):
    log = []
    t, _ = _held_tensor([4.0], log)
    read(t)
    assert log == ["launch"]


def test_any_op_runs_the_held_launch_before_its_own_work():
    log = []
    _, out = _held_tensor([5.0, 6.0], log)
    other = st.tensor([1.0, 1.0])
    # the op's input is not the held tensor, but it runs after the launch all the same
    assert (other * 2).tolist() == [2.0, 2.0]
    assert log == ["launch"] and out.tolist() == [5.0, 6.0]


def test_the_op_it_was_held_for_takes_it_and_nothing_else_runs_it():
    log = []
    t, out = _held_tensor([7.0], log)
    h = held.take(t)
    assert h.info == "fused" and not held.pending() and type(t) is Tensor
    h.done = True   # the taker launched its fused kernel
    out[:] = 8.0
    h.settle()
    held.flush()
    assert log == [] and t.tolist() == [8.0]


def test_a_taker_that_does_not_fuse_settles_it_once():
    log = []
    t, _ = _held_tensor([9.0], log)
    h = held.take(t)
    h.settle()
    h.settle()
    assert log == ["launch"] and t.tolist() == [9.0]


def test_take_of_another_tensor_takes_nothing():
    log = []
    _held_tensor([1.0], log)
    assert held.take(st.tensor([1.0])) is None and held.pending()
    held.flush()
    assert log == ["launch"]


def test_marking_a_tensor_over_another_array_flushes_at_once():
    log = []
    out = np.zeros(1)
    held.hold(out, lambda: log.append("launch"))
    t = held.mark(Tensor._wrap(np.zeros(1)))
    assert log == ["launch"] and type(t) is Tensor


def test_holding_another_launch_runs_the_first():
    log = []
    t, _ = _held_tensor([1.0], log)
    held.hold(np.zeros(1), lambda: log.append("second"))
    assert log == ["launch"] and type(t) is Tensor
    held.flush()
    assert log == ["launch", "second"]


def test_drop_forgets_without_running():
    log = []
    t, _ = _held_tensor([1.0], log)
    held.drop()
    assert not held.pending() and type(t) is Tensor
    t.numpy()
    assert log == []


def test_writing_the_held_tensor_runs_the_launch_before_the_write():
    log = []
    t, _ = _held_tensor([1.0], log)
    t.array = np.array([2.0])
    assert log == ["launch"] and t.tolist() == [2.0]
