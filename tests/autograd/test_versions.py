"""Version counters against torch: backward fails where an op saved values that an in-place write changed later
(through the tensor, a view, detach(), or an optimizer's step), and runs where nothing saved was touched."""
import numpy as np
import pytest
import torch

import smalltrain as st


def _outcome(lib, case, device):
    """What backward does in `case`: 'raise' or the gradient of w."""
    dev = {"device": device} if lib is st else {}
    w = lib.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True, **dev)
    try:
        case(lib, w, dev)
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e)
        return "raise"
    return w.grad.tolist()


def saved_input_written(lib, w, dev):
    x = lib.ones(3, **dev)
    y = (x * w).sum()          # mul saved x for w's gradient
    x.add_(1)
    y.backward()


def unsaved_input_written(lib, w, dev):
    x = lib.ones(3, **dev)
    y = (x + w).sum()          # add saved nothing: the write changes no gradient
    x.add_(1)
    y.backward()


def view_of_saved_written(lib, w, dev):
    a = w * 2
    b = (a * a).sum()
    a[1:].mul_(3)              # through a view: the base's counter
    b.backward()


def detached_written(lib, w, dev):
    a = w * 2
    b = (a * a).sum()
    a.detach().zero_()         # detach() shares the counter
    b.backward()


def data_written(lib, w, dev):
    a = w * 2
    b = (a * a).sum()
    a.data.zero_()             # .data does not (torch's escape hatch): the gradient reads the zeros
    b.backward()


def setitem_written(lib, w, dev):
    x = lib.ones(3, **dev)
    y = (x * w).sum()
    x[0] = 5.0
    y.backward()


def inplace_layer_written(lib, w, dev):
    x = lib.ones(3, **dev) - 2
    y = (x * w).sum()
    lib.nn.functional.relu(x, inplace=True)
    y.backward()


def written_after_backward(lib, w, dev):
    x = lib.ones(3, **dev)
    y = (x * w).sum()
    y.backward(retain_graph=True)
    x.fill_(4.0)               # the first backward read the old values; a second one may not
    w.grad = None
    y.backward()


@pytest.mark.parametrize("case", [saved_input_written, unsaved_input_written, view_of_saved_written,
                                  detached_written, data_written, setitem_written, inplace_layer_written,
                                  written_after_backward])
def test_backward_after_an_inplace_write_matches_torch(case, device):
    ours, theirs = _outcome(st, case, device), _outcome(torch, case, "cpu")
    if theirs == "raise":
        assert ours == "raise"
    else:
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_an_optimizer_step_between_forward_and_backward_fails_it(device):
    for lib in (st, torch):
        dev = {"device": device} if lib is st else {}
        lib.manual_seed(0)
        net = lib.nn.Sequential(lib.nn.Linear(3, 4), lib.nn.Tanh(), lib.nn.Linear(4, 1)).to(**dev)
        opt = lib.optim.SGD(net.parameters(), lr=0.1)
        loss = net(lib.ones(2, 3, **dev)).sum()
        loss.backward(retain_graph=True)
        opt.step()             # the second Linear saved its weight for the first one's gradient
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_the_error_names_the_tensor_the_node_and_the_versions():
    x = st.ones(2, 5)
    w = st.ones(5, requires_grad=True)
    y = (x * w).sum()
    x.add_(1)
    x.mul_(2)
    with pytest.raises(RuntimeError, match=r"shape \[2, 5\]\], saved by MulBackward, is at version 2; expected "
                                           r"version 0"):
        y.backward()


def test_a_write_into_an_ops_own_saved_output_keeps_the_gradient_right():
    # torch's exp saves its output and raises here; ours gives its node a copy first, so the gradient is exp(w)
    w = st.tensor([0.0, 1.0], requires_grad=True)
    a = w.exp()
    a.add_(1)
    a.sum().backward()
    np.testing.assert_allclose(w.grad.tolist(), np.exp([0.0, 1.0]), rtol=1e-6)
