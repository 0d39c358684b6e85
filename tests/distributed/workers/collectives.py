"""Worker: every collective on rank-dependent values and every validation error; writes rank<r>.npz and
rank<r>.json into the directory given as argv[1]. Run: mpiexec -n 2 python collectives.py OUT [mpi|nccl]."""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

OPS = ("SUM", "AVG", "MAX", "MIN")


def make_inputs(rank):
    """The arrays rank `rank` contributes (the test rebuilds them to compute the expected results)."""
    rng = np.random.default_rng(100 + rank)
    return {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f64": rng.standard_normal(5),
        "i64": rng.integers(-50, 50, (2, 3)),
        "noncontig": rng.standard_normal((4, 3)).astype(np.float32).T,   # a transposed view
        "scalar": np.array(rank + 0.5, np.float32),
        "gather": np.arange(6, dtype=np.float32).reshape(2, 3) * (rank + 1) - rank,
        "scatter": rng.standard_normal((2, 5, 2)).astype(np.float32),    # world size 2: input_list of 2 x (5, 2)
    }


def collect(dist, st, device, world):
    rank = dist.get_rank()
    x = make_inputs(rank)
    res = {}
    for name in ("f32", "f64", "i64", "noncontig", "scalar"):
        for op in OPS:
            if op == "AVG" and name == "i64":
                continue
            t = st.tensor(x[name], device=device) if name != "noncontig" else \
                st.tensor(np.ascontiguousarray(x[name].T), device=device).t()  # non-contiguous on any device
            assert name != "noncontig" or not t.is_contiguous()
            dist.all_reduce(t, getattr(dist.ReduceOp, op))
            res[f"all_reduce/{name}/{op}"] = t.cpu().numpy()
    for src in range(world):
        for name in ("f32", "i64", "noncontig"):
            t = st.tensor(x[name], device=device) if name != "noncontig" else \
                st.tensor(np.ascontiguousarray(x[name].T), device=device).t()
            dist.broadcast(t, src=src)
            res[f"broadcast/{name}/{src}"] = t.cpu().numpy()
    outs = [st.zeros(2, 3, device=device) for _ in range(world)]
    dist.all_gather(outs, st.tensor(x["gather"], device=device))
    res["all_gather"] = np.stack([o.cpu().numpy() for o in outs])
    for op in ("SUM", "AVG", "MAX"):
        out = st.zeros(5, 2, device=device)
        dist.reduce_scatter(out, [st.tensor(x["scatter"][i % 2], device=device) for i in range(world)],
                            getattr(dist.ReduceOp, op))
        res[f"reduce_scatter/{op}"] = out.cpu().numpy()
    return res


def errors(dist, st, device, world):
    """Each bad call raises on every rank before it communicates; record (type, message)."""
    t = st.ones(3, device=device)
    cases = {
        "all_gather_len": lambda: dist.all_gather([st.zeros(3, device=device)] * (world + 1), t),
        "all_gather_shape": lambda: dist.all_gather([st.zeros(2, device=device)] * world, t),
        "all_gather_dtype": lambda: dist.all_gather([st.zeros(3, dtype=st.float64, device=device)] * world, t),
        "broadcast_src": lambda: dist.broadcast(t, src=world),
        "op_str": lambda: dist.all_reduce(t, op="sum"),
        "not_tensor": lambda: dist.all_reduce([1.0, 2.0]),
        "avg_int": lambda: dist.all_reduce(st.ones(3, dtype=st.int64, device=device), op=dist.ReduceOp.AVG),
        "reduce_scatter_len": lambda: dist.reduce_scatter(st.zeros(3, device=device), [t] * (world + 1)),
        "init_twice": lambda: dist.init_process_group("mpi"),
    }
    found = {}
    for name, fn in cases.items():
        try:
            fn()
            found[name] = ["none", ""]
        except Exception as e:  # noqa: BLE001 - every error type is recorded and checked by the test
            found[name] = [type(e).__name__, str(e)]
    return found


def main(out_dir, backend="mpi"):
    import smalltrain as st
    import smalltrain.distributed as dist
    import cuda_emulator   # tests/tooling, on PYTHONPATH (_launch.py)
    cuda_emulator.install_if_requested()   # the test suite's emulated run: this process's device emulated too
    assert not dist.is_initialized()
    group = dist.init_process_group(backend)
    rank, world = group.rank, group.world_size
    device = f"cuda:{dist.get_local_rank()}" if backend == "nccl" else "cpu"
    res = collect(dist, st, device, world)
    info = {"rank": rank, "world": world, "get_rank": dist.get_rank(), "get_world_size": dist.get_world_size(),
            "local_rank": dist.get_local_rank(), "backend": dist.get_backend(), "initialized": dist.is_initialized(),
            "scalars": group.allreduce_scalars([1.5 * (rank + 1), rank + 1, 10]), "errors": errors(dist, st, device,
                                                                                                  world)}
    info["scalar_types"] = [type(v).__name__ for v in info["scalars"]]
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    lst = [f"from {rank}", rank]
    dist.broadcast_object_list(lst, src=world - 1)
    info["objects"], info["broadcast_objects"] = objs, lst
    dist.barrier()
    np.savez(Path(out_dir) / f"rank{rank}.npz", **res)
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(info))
    dist.destroy_process_group()
    info_after = dist.is_initialized()
    assert not info_after, "destroy_process_group left the group initialized"


if __name__ == "__main__":
    main(*sys.argv[1:])
