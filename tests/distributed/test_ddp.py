"""Tests for DistributedDataParallel on real processes (mpiexec -n 2, and one process without a launcher):
gradients and SGD trajectories equal one process on the whole batch, parameters start and stay identical across
ranks, no_sync accumulation, unused/conditionally used/shared parameters, uneven data, buffers, state_dict."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workers._launch import requires_mpi, run_worker

import smalltrain

pytestmark = pytest.mark.filterwarnings("ignore")


def load(out, world):
    """Per rank: ({key: [array or None per parameter]}, info)."""
    ranks = []
    for r in range(world):
        z = np.load(out / f"rank{r}.npz")
        d = {}
        for k in z.files:
            key, i = k.rsplit("/", 1)
            d.setdefault(key, {})[int(i)] = z[k]
        n = max(len(v) for v in d.values()) if d else 0
        n = max([n] + [max(v) + 1 for v in d.values()])
        ranks.append(({key: [v.get(i) for i in range(n)] for key, v in d.items()},
                      json.loads((out / f"rank{r}.json").read_text())))
    return ranks


def max_diff(a, b):
    assert len(a) == len(b)
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def bitwise_equal(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def run(tmp_path, mode, n=2, launcher=True, backend="mpi"):
    run_worker("ddp.py", tmp_path, mode, backend, n=n, launcher=launcher)
    return load(tmp_path, n if launcher else 1)


def check_equivalence(ranks, world):
    (r0, info0) = ranks[0]
    assert info0["buckets"] == [3, 1]   # 2 KB buckets split the model; 25 MB do not
    # every bucket was all-reduced while backward was still running, none left for the end-of-backward flush
    assert info0["reduced_during_backward"] == [3, 1] and info0["reduced_at_end"] == [0, 0]
    if world > 1:
        # seeded differently, the ranks built different models; the wrapper made them rank 0's
        assert not bitwise_equal(r0["init_local"], ranks[1][0]["init_local"])
    for d, _ in ranks:
        assert bitwise_equal(d["init_wrapped"], r0["init_local"])
    for k in (0, 1):
        # 2 processes x 64 samples give the gradients of 1 process x 128 samples
        for d, _ in ranks:
            assert max_diff(d[f"grads{k}_step0"], r0["ref_grads_step0"]) <= 1e-6
        for step in range(5):
            for d, _ in ranks[1:]:
                assert bitwise_equal(d[f"params{k}_step{step}"], r0[f"params{k}_step{step}"]), (k, step)
                assert bitwise_equal(d[f"grads{k}_step{step}"], r0[f"grads{k}_step{step}"]), (k, step)
            assert max_diff(r0[f"params{k}_step{step}"], r0[f"ref_params_step{step}"]) <= 1e-5, (k, step)
            assert max_diff(r0[f"grads{k}_step{step}"], r0[f"ref_grads_step{step}"]) <= 1e-5, (k, step)
        # the trajectory moved: a test of equal parameters that never changed would prove nothing
        assert max_diff(r0[f"params{k}_step4"], r0["init_wrapped"]) > 1e-2


@requires_mpi
def test_two_processes_match_one_process_on_the_whole_batch(tmp_path):
    check_equivalence(run(tmp_path, "equivalence"), 2)


@requires_mpi
def test_world_size_one_without_launcher(tmp_path):
    check_equivalence(run(tmp_path, "equivalence", launcher=False), 1)


@requires_mpi
def test_no_sync_accumulates_locally_then_all_reduces_the_sum(tmp_path):
    ranks = run(tmp_path, "no_sync")
    for d, _ in ranks:
        assert bitwise_equal(d["after_no_sync"], d["local_first"])   # no communication inside no_sync
        assert max_diff(d["synced"], d["ref"]) <= 1e-6                # half-loss sums over 4 micro-batches
    assert max_diff(ranks[0][0]["after_no_sync"], ranks[1][0]["after_no_sync"]) > 1e-4
    assert bitwise_equal(ranks[0][0]["synced"], ranks[1][0]["synced"])


@requires_mpi
def test_unused_shared_and_rank_dependent_parameters(tmp_path):
    ranks = run(tmp_path, "unused")
    names = ranks[0][1]["names"]
    assert ranks[0][1]["buckets"] >= 5
    assert ranks[0][1]["reduced_at_end"] == 0   # unused parameters do not hold buckets back until the end
    for step in range(3):
        locals_ = [d[f"local{step}"] for d, _ in ranks]
        for i, name in enumerate(names):
            got = [d[f"ddp{step}"][i] for d, _ in ranks]
            if name.startswith("unused"):
                # no rank had a gradient: .grad stays None everywhere, as in one process
                assert all(g is None for g in got) and all(loc[i] is None for loc in locals_), name
                continue
            if name.startswith("branch"):
                assert locals_[0][i] is not None and locals_[1][i] is None
            # a missing gradient counts as zeros in the average
            want = sum(loc[i] for loc in locals_ if loc[i] is not None) / len(ranks)
            for g in got:
                np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-7, err_msg=f"step {step}: {name}")
        assert bitwise_equal(ranks[0][0][f"params{step}"], ranks[1][0][f"params{step}"])


@requires_mpi
def test_uneven_dataset_does_not_hang(tmp_path):
    ranks = run(tmp_path, "uneven")
    (d0, i0), (d1, i1) = ranks
    assert i0["sizes"] == i1["sizes"] == [16, 16, 16, 3] * 2     # 101 samples padded to 2 x 51
    assert len(i0["indices"]) == len(i1["indices"]) == 51
    assert sorted(set(i0["indices"]) | set(i1["indices"])) == list(range(101))
    assert bitwise_equal(d0["params"], d1["params"])


@requires_mpi
def test_buffers_names_and_state_dict(tmp_path):
    ranks = run(tmp_path, "buffers")
    for r, (d, info) in enumerate(ranks):
        assert info["after_wrap"] == [10.0, 10.0]                 # rank 0's buffer
        assert info["after_no_grad_forward"] == [50.0 + r] * 2    # no broadcast without gradients
        assert info["after_forward"] == [50.0, 50.0]              # broadcast before a training forward
        assert info["state_dict_keys"] == ["module.scale", "module.lin.weight", "module.lin.bias"]  # torch order
        assert info["named_parameters"] == ["module.lin.weight", "module.lin.bias"]
        assert info["same_parameters"] and info["loaded_equal"]
        assert info["module_training_after_eval"] is False
    assert bitwise_equal(ranks[0][0]["grads"], ranks[1][0]["grads"])


cuda = pytest.mark.skipif(not smalltrain.cuda.is_available(), reason="no CUDA device")


@cuda
def test_nccl_ddp_world_size_one_without_launcher(tmp_path):
    check_equivalence(run(tmp_path, "equivalence", launcher=False, backend="nccl"), 1)


@cuda
@requires_mpi
def test_nccl_ddp_under_mpiexec_one_process(tmp_path):
    check_equivalence(run(tmp_path, "equivalence", n=1, backend="nccl"), 1)


@pytest.mark.skipif(smalltrain.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@requires_mpi
def test_nccl_ddp_two_processes(tmp_path):
    check_equivalence(run(tmp_path, "equivalence", n=2, backend="nccl"), 2)


# ---- in this process, without MPI: argument errors, bucket layout, use counting, the late-gradient error --------
class FakeGroup:
    """A world of one that records the all-reduces (enough for the reducer's bookkeeping)."""
    rank, world_size, backend = 0, 1, "fake"

    def __init__(self):
        self.reduced = []

    def all_reduce_array(self, buf, op=None):
        self.reduced.append(buf.size)

    def broadcast_array(self, buf, src=0):
        pass


def test_constructor_errors():
    from smalltrain import nn
    from smalltrain.nn.parallel import DistributedDataParallel as DDP
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        DDP(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="expected an nn.Module, got int"):
        DDP(3, process_group=FakeGroup())
    with pytest.raises(ValueError, match="bucket_cap_mb must be > 0, got 0"):
        DDP(nn.Linear(2, 2), process_group=FakeGroup(), bucket_cap_mb=0)
    with pytest.raises(ValueError, match=r"device_ids must list the one device the module is on.*\['cpu'\]"):
        DDP(nn.Linear(2, 2), process_group=FakeGroup(), device_ids=[0])


def test_buckets_reverse_order_split_by_size_and_dtype():
    from smalltrain.distributed.reducer import build_buckets
    from smalltrain.nn import Parameter
    shapes = [(10,), (3, 4), (5,), (2,), (6,)]
    params = [Parameter(np.zeros(s, np.float32)) for s in shapes]
    params[3] = Parameter(np.zeros(2, np.float64))
    buckets = build_buckets(params, cap_bytes=12 * 4)
    # float32 from the last parameter back: [4](6) + [2](5) = 11 floats, [1](12) alone, [0](10); float64: [3]
    assert [b.param_ids for b in buckets] == [[4, 2], [1], [0], [3]]
    assert [b.numel for b in buckets] == [11, 12, 10, 2]
    assert [b.buffer.size for b in buckets] == [13, 13, 11, 3]     # one flag per parameter at the end
    assert [b.buffer.dtype for b in buckets] == [np.float32] * 3 + [np.float64]


def test_count_uses_counts_every_edge_to_a_parameter():
    import smalltrain as st
    from smalltrain import nn
    from smalltrain.distributed.reducer import count_uses
    lin, other = nn.Linear(3, 3), nn.Linear(3, 3)
    params = list(lin.parameters()) + list(other.parameters())
    index = {id(p): i for i, p in enumerate(params)}
    x = st.ones(2, 3)
    out = lin(lin(x).relu()) * 2
    assert count_uses(out, index, len(params)) == [2, 2, 0, 0]
    assert count_uses((out, {"aux": other(x)}), index, len(params)) == [2, 2, 1, 1]


def test_a_gradient_from_outside_forward_raises_instead_of_desynchronizing():
    import smalltrain as st
    from smalltrain import nn
    from smalltrain.nn.parallel import DistributedDataParallel as DDP
    lin = nn.Linear(3, 2)
    ddp = DDP(lin, process_group=FakeGroup(), bucket_cap_mb=1e-6)   # one bucket per parameter
    loss = ddp(st.ones(4, 3)).sum() + (lin.bias * 3).sum()           # bias used again outside forward
    with pytest.raises(RuntimeError, match="parameter 'bias' received a gradient after its bucket was already "
                                           "all-reduced"):
        loss.backward()
    from smalltrain.autograd import engine
    engine._callbacks.clear()   # the aborted backward left its flush queued


def test_single_process_steps_with_set_to_none_and_bucket_views(device):
    """With gradient_as_bucket_view each .grad is its bucket's view; on CUDA the linear kernel writes it there
    itself (no copy: the engine's gradient slots)."""
    import smalltrain as st
    from smalltrain import nn
    from smalltrain.autograd import engine
    from smalltrain.nn.parallel import DistributedDataParallel as DDP
    rng = np.random.default_rng(0)
    for as_view in (False, True):
        a, b = nn.Linear(4, 3).to(device), nn.Linear(4, 3).to(device)
        b.load_state_dict(a.state_dict())
        group = FakeGroup()
        ddp = DDP(a, process_group=group, gradient_as_bucket_view=as_view)
        copies = engine.grad_slot_copies[0]
        for step in range(3):
            x = st.tensor(rng.standard_normal((5, 4)).astype(np.float32), device=device)
            ddp.zero_grad(set_to_none=True)
            b.zero_grad(set_to_none=True)
            (ddp(x) ** 2).sum().backward()
            (b(x) ** 2).sum().backward()
            for p, q, view in zip(a.parameters(), b.parameters(), ddp.reducer.buckets[0].views[::-1]):
                np.testing.assert_array_equal(p.grad.cpu().numpy(), q.grad.cpu().numpy())
                assert (p.grad.array is view) == as_view
                p.array -= 0.1 * p.grad.array
                q.array -= 0.1 * q.grad.array
        assert group.reduced == [4 * 3 + 3 + 2] * 3                      # one bucket (+2 flags) per step
        assert ddp.reducer.last_early == 1 and ddp.reducer.last_flushed == 0
        assert engine.grad_slot_copies[0] - copies == (2 * 3 if as_view and device == "cpu" else 0)


def test_bucket_views_over_flattened_parameters_warn_and_take_the_slots():
    """gradient_as_bucket_view on flattened parameters: the bucket views replace the flat gradient buffer as the
    gradients' home, which the constructor says; without bucket views nothing is said and the buffer stays."""
    import warnings

    import smalltrain as st
    from smalltrain import nn
    from smalltrain.nn.parallel import DistributedDataParallel as DDP
    from smalltrain.nn.utils import flatten_parameters
    x = st.tensor(np.ones((2, 4), np.float32))
    for as_view in (False, True):
        model = nn.Linear(4, 3)
        flat = flatten_parameters(model.parameters())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ddp = DDP(model, process_group=FakeGroup(), gradient_as_bucket_view=as_view)
        said = [str(w.message) for w in caught if "flattened" in str(w.message)]
        assert said == ([] if not as_view else [
            "DistributedDataParallel(gradient_as_bucket_view=True): 2 of 2 parameters are flattened "
            "(flatten_parameters); their gradients will live in the DDP buckets instead of the flat gradient "
            "buffer, so the optimizer no longer updates them as one flat buffer"])
        ddp(x).sum().backward()
        assert flat.grads_in_place() == (not as_view)
