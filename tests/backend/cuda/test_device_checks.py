"""Value checks run on the GPU, raised at the next host synchronization (backend/cuda/device_checks.py): eagerly and
from the replays of a captured step, through every op that checks values on the device."""
import numpy as np
import pytest

import smalltrain
import smalltrain.nn.functional as F
from smalltrain.backend.cuda import cupy, device_checks

GPU = smalltrain.cuda.is_available()
cp = cupy() if GPU else None
gpu = pytest.mark.skipif(not GPU, reason="no CUDA device")


@pytest.fixture(autouse=True)
def _no_check_left_over():
    """Each test here reads what it flags: one left pending fails it (conftest.py drops leftovers of others)."""
    yield
    if GPU:
        device_checks.raise_pending()


@gpu
def test_a_flag_set_on_the_device_raises_at_the_next_check_once():
    f = device_checks.flag(lambda: ValueError("op: expected a, got b"))
    f.fill(3)
    with pytest.raises(ValueError, match="op: expected a, got b"):
        device_checks.raise_pending()
    device_checks.raise_pending()   # cleared: nothing raised twice
    assert int(f.get()[0]) == 0


@gpu
def test_expect_none_flags_only_when_an_element_is_bad():
    device_checks.expect_none(cp.asarray(np.array([False, False])), lambda: RuntimeError("never"))
    device_checks.raise_pending()
    device_checks.expect_none(cp.asarray(np.array([False, True])), lambda: RuntimeError("one is bad"))
    with pytest.raises(RuntimeError, match="one is bad"):
        device_checks.raise_pending()


@gpu
def test_checked_flags_are_handed_out_again():
    """An eager loop that checks after each call reuses one flag rather than allocating more."""
    first = device_checks.flag(lambda: RuntimeError("x"))
    device_checks.raise_pending()
    again = device_checks.flag(lambda: RuntimeError("x"))
    assert again.data.ptr == first.data.ptr


@gpu
def test_a_loop_that_never_synchronizes_is_checked_every_max_pending_flags():
    f = device_checks.flag(lambda: RuntimeError("found without a sync"))
    f.fill(1)
    with pytest.raises(RuntimeError, match="found without a sync"):
        for _ in range(device_checks.MAX_PENDING):
            device_checks.flag(lambda: RuntimeError("unset"))


def _logits(n=4, c=5):
    return smalltrain.tensor(np.random.default_rng(0).standard_normal((n, c)).astype(np.float32), device="cuda")


def _target(values):
    return smalltrain.tensor(np.array(values, np.int64), device="cuda")


# each op that checks values on the GPU: (call, the error the next sync raises)
BAD_VALUES = {
    "cross_entropy": (lambda: F.cross_entropy(_logits(), _target([0, 7, 1, 2])),
                      IndexError, r"cross_entropy: Target 7 is out of bounds \(classes 0..4, ignore_index=-100\)"),
    "cross_entropy 3-d": (lambda: F.cross_entropy(_logits().reshape(2, 5, 2), _target([[0, 1], [-3, 2]])),
                          IndexError, r"cross_entropy: Target -3 is out of bounds"),
    "nll_loss": (lambda: F.nll_loss(F.log_softmax(_logits(), 1), _target([0, 1, 5, 2])),
                 IndexError, r"nll_loss: Target 5 is out of bounds \(classes 0..4, ignore_index=-100\)"),
    "embedding": (lambda: F.embedding(_target([[0, 9]]), _logits(6, 3)),
                  IndexError, r"embedding: index out of range in self \(index 9, num_embeddings 6\)"),
    "indexing": (lambda: _logits()[_target([0, 4])],
                 IndexError, r"index 4 is out of bounds for dimension 0 with size 4"),
    "gather": (lambda: _logits().gather(1, _target([[0], [5], [1], [2]])),
               RuntimeError, r"gather: index 5 is out of bounds for dimension 1 with size 5"),
    "binary_cross_entropy": (lambda: F.binary_cross_entropy(_logits(), _logits().sigmoid()),
                             RuntimeError, "binary_cross_entropy: all elements of input should be between 0 and 1"),
}


@gpu
@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_a_bad_value_raises_at_the_next_sync_with_a_message(case):
    call, exc, match = BAD_VALUES[case]
    out = call()   # queued: no host read inside the op
    with pytest.raises(exc, match=match):
        out.sum().item()
    out.sum().item()   # reported once: the next sync passes


@gpu
@pytest.mark.parametrize("sync", ["item", "numpy", "cpu", "repr", "synchronize"])
def test_every_host_synchronization_reports(sync):
    F.cross_entropy(_logits(), _target([0, 1, 2, 5]))
    x = smalltrain.ones(2, device="cuda")
    do = {"item": lambda: x.sum().item(), "numpy": lambda: x.cpu().numpy(), "cpu": x.cpu, "repr": lambda: repr(x),
          "synchronize": smalltrain.cuda.synchronize}[sync]
    with pytest.raises(IndexError, match="Target 5 is out of bounds"):
        do()


@gpu
def test_a_captured_step_reports_a_bad_target_of_any_replay():
    """The step's graph owns its flag: a replay with a bad target in the static input raises at the sync after it;
    replays with good targets before and after it do not."""
    net = smalltrain.nn.Linear(5, 5).to("cuda")
    opt = smalltrain.optim.SGD(net.parameters(), lr=0.1)

    @smalltrain.compile
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss

    x, good, bad = _logits(), _target([0, 1, 2, 3]), _target([0, 1, 9, 3])
    for _ in range(5):
        assert np.isfinite(step(x, good).item())
    assert step.stats["captures"] == 1 and step.stats["replays"] >= 1
    step(x, bad)
    with pytest.raises(IndexError, match="cross_entropy: Target 9 is out of bounds"):
        smalltrain.cuda.synchronize()
    assert step.stats["eager"] == 3   # the bad step was a replay, not an eager fallback
    step(x, good)   # good targets again (the weights are NaN now): nothing to report
    smalltrain.cuda.synchronize()
