"""Worker for DistributedDataParallel tests: `python ddp.py OUT MODE [mpi|nccl]` (under mpiexec -n N or alone).

Each mode trains or backpropagates a small smalltrain.nn model on data that every rank builds from the same seed
(rank r takes its share of each global batch of 128) and writes rank<r>.npz (+ .json) into OUT; the test compares
ranks with each other and with a single-process reference computed here with smalltrain itself.
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import smalltrain as st
import smalltrain.distributed as dist

nn = optim = F = DDP = SmallCnn = Branchy = WithBuffer = None  # imported once the process group exists (main)

GLOBAL_BATCH, STEPS = 128, 5


def data(shape, classes, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((STEPS, GLOBAL_BATCH) + shape).astype(np.float32)
    y = rng.integers(0, classes, (STEPS, GLOBAL_BATCH))
    return x, y


def copy_params(dst, src):
    for a, b in zip(dst.parameters(), src.parameters()):
        a.array[...] = b.array


def grads(model):
    return [None if p.grad is None else p.grad.array.copy() for p in model.parameters()]


def params(model):
    return [p.array.copy() for p in model.parameters()]


def save(out, rank, arrays, info=None):
    flat = {}
    for key, value in arrays.items():
        for i, a in enumerate(value):
            if a is not None:
                flat[f"{key}/{i}"] = np.asarray(a.get() if hasattr(a, "get") else a)
    np.savez(Path(out) / f"rank{rank}.npz", **flat)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(info or {}))


def equivalence(group, device):
    """SGD for STEPS steps: DDP (two wrappers: grads copied back, grads as bucket views) vs one process on the
    whole batch. Ranks seed differently before building their models: the broadcast must make them equal."""
    rank, world = group.rank, group.world_size
    share = GLOBAL_BATCH // world
    x, y = data((1, 8, 8), 10)
    st.manual_seed(1000 + rank)
    models = [SmallCnn().to(device), SmallCnn().to(device)]
    out = {"init_local": params(models[0])}
    wrapped = [DDP(models[0], bucket_cap_mb=0.002), DDP(models[1], gradient_as_bucket_view=True)]
    copy_params(models[1], models[0])
    out["init_wrapped"] = params(models[0])
    ref = SmallCnn().to(device)
    copy_params(ref, models[0])
    opts = [optim.SGD(w.parameters(), lr=0.1, momentum=0.9) for w in wrapped]
    ref_opt = optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        xs, ys = x[step], y[step]
        for k, (w, opt) in enumerate(zip(wrapped, opts)):
            opt.zero_grad(set_to_none=True)
            xb = st.tensor(xs[rank * share:(rank + 1) * share], device=device)
            F.cross_entropy(w(xb), st.tensor(ys[rank * share:(rank + 1) * share], device=device)).backward()
            out[f"grads{k}_step{step}"] = grads(w)
            opt.step()
            out[f"params{k}_step{step}"] = params(w)
        ref_opt.zero_grad(set_to_none=True)
        F.cross_entropy(ref(st.tensor(xs, device=device)), st.tensor(ys, device=device)).backward()
        out[f"ref_grads_step{step}"] = grads(ref)
        ref_opt.step()
        out[f"ref_params_step{step}"] = params(ref)
    info = {"buckets": [len(w.reducer.buckets) for w in wrapped],
            "reduced_during_backward": [w.reducer.last_early for w in wrapped],
            "reduced_at_end": [w.reducer.last_flushed for w in wrapped]}
    return out, info


def no_sync(group, device):
    """Two micro-batches per rank, the first under no_sync (loss / 2 each): the all-reduced sum equals the
    gradient of the mean loss over all 128 samples; during no_sync the gradient is this rank's own."""
    rank, world = group.rank, group.world_size
    share = GLOBAL_BATCH // world
    x, y = data((1, 8, 8), 10)
    st.manual_seed(7)
    model = SmallCnn().to(device)
    ddp = DDP(model, bucket_cap_mb=0.002)
    local, ref = SmallCnn().to(device), SmallCnn().to(device)
    copy_params(local, model)
    copy_params(ref, model)
    xs, ys = x[0][rank * share:(rank + 1) * share], y[0][rank * share:(rank + 1) * share]
    half = share // 2
    batches = [(st.tensor(xs[:half], device=device), st.tensor(ys[:half], device=device)),
               (st.tensor(xs[half:], device=device), st.tensor(ys[half:], device=device))]
    with ddp.no_sync():
        (F.cross_entropy(ddp(batches[0][0]), batches[0][1]) / 2).backward()
    out = {"after_no_sync": grads(model)}
    (F.cross_entropy(local(batches[0][0]), batches[0][1]) / 2).backward()
    out["local_first"] = grads(local)
    (F.cross_entropy(ddp(batches[1][0]), batches[1][1]) / 2).backward()
    out["synced"] = grads(model)
    F.cross_entropy(ref(st.tensor(x[0], device=device)), st.tensor(y[0], device=device)).backward()
    out["ref"] = grads(ref)
    return out, {}


def unused(group, device):
    """Branchy: per step every rank writes its DDP gradients and the local gradients of a plain copy."""
    rank = group.rank
    rng = np.random.default_rng(rank)
    st.manual_seed(3)
    model = Branchy(use_branch=rank == 0).to(device)
    ddp = DDP(model, bucket_cap_mb=0.0002)   # ~50 floats: one bucket per parameter or two
    plain = Branchy(use_branch=rank == 0).to(device)
    opt = optim.SGD(ddp.parameters(), lr=0.05)
    out = {}
    for step in range(3):
        copy_params(plain, model)
        xb = st.tensor(rng.standard_normal((16, 6)).astype(np.float32), device=device)
        yb = st.tensor(rng.integers(0, 3, 16), device=device)
        opt.zero_grad(set_to_none=True)
        for p in plain.parameters():
            p.grad = None
        F.cross_entropy(ddp(xb), yb).backward()
        F.cross_entropy(plain(xb), yb).backward()
        out[f"ddp{step}"], out[f"local{step}"] = grads(model), grads(plain)
        opt.step()
        out[f"params{step}"] = params(model)
    names = [n for n, _ in model.named_parameters()]
    return out, {"names": names, "buckets": len(ddp.reducer.buckets), "reduced_at_end": ddp.reducer.last_flushed}


def uneven(group, device):
    """101 samples over the ranks with DistributedSampler (padded as torch pads): same number of steps, no hang."""
    from smalltrain.utils.data import DataLoader, DistributedSampler, TensorDataset
    rank, world = group.rank, group.world_size
    rng = np.random.default_rng(0)
    ds = TensorDataset(st.tensor(rng.standard_normal((101, 6)).astype(np.float32)),
                       st.tensor(rng.integers(0, 3, 101)))
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=16, sampler=sampler)
    st.manual_seed(rank)
    model = Branchy(use_branch=False).to(device)
    ddp = DDP(model)
    opt = optim.SGD(ddp.parameters(), lr=0.05)
    sizes = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            F.cross_entropy(ddp(xb.to(device)), yb.to(device)).backward()
            opt.step()
            sizes.append(int(xb.shape[0]))
    return {"params": params(model)}, {"indices": [int(i) for i in sampler], "sizes": sizes}


def buffers_and_state(group, device):
    """Buffers broadcast at wrap and before each forward with gradients on; the wrapper's names and state_dict."""
    rank = group.rank
    st.manual_seed(rank)
    model = WithBuffer(value=10 + rank).to(device)
    ddp = DDP(model)
    info = {"after_wrap": model.scale.tolist()}
    x = st.ones(3, 4, device=device)
    model.scale.array[...] = 50 + rank
    with st.no_grad():
        ddp(x)
    info["after_no_grad_forward"] = model.scale.tolist()
    ddp(x).sum().backward()
    info["after_forward"] = model.scale.tolist()
    info["state_dict_keys"] = list(ddp.state_dict().keys())
    info["named_parameters"] = [n for n, _ in ddp.named_parameters()]
    info["same_parameters"] = all(a is b for a, b in zip(ddp.parameters(), model.parameters())) and \
        len(list(ddp.parameters())) == len(list(model.parameters()))
    fresh = DDP(WithBuffer(value=0).to(device))
    fresh.load_state_dict(ddp.state_dict())
    info["loaded_equal"] = all(np.array_equal(np.asarray(a.array.tolist()), np.asarray(b.array.tolist()))
                               for a, b in zip(fresh.parameters(), ddp.parameters()))
    ddp.eval()
    info["module_training_after_eval"] = model.training
    return {"grads": grads(model)}, info


MODES = {"equivalence": equivalence, "no_sync": no_sync, "unused": unused, "uneven": uneven,
         "buffers": buffers_and_state}


def main(out_dir, mode, backend="mpi"):
    import cuda_emulator   # tests/tooling, on PYTHONPATH (_launch.py)
    cuda_emulator.install_if_requested()   # the test suite's emulated run: this process's device emulated too
    # the process group first: from here on an exception on one rank (a failing import too) aborts every rank;
    # a rank that dies before joining MPI would leave the others waiting in MPI_Init until the test's timeout
    group = dist.init_process_group(backend)
    global nn, optim, F, DDP, SmallCnn, Branchy, WithBuffer
    from ddp_models import Branchy, SmallCnn, WithBuffer

    from smalltrain import nn, optim
    from smalltrain.nn import functional as F
    from smalltrain.nn.parallel import DistributedDataParallel as DDP
    device = f"cuda:{dist.get_local_rank()}" if backend == "nccl" else "cpu"
    arrays, info = MODES[mode](group, device)
    info.update(rank=group.rank, world=group.world_size)
    save(out_dir, group.rank, arrays, info)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
