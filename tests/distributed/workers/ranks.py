"""Worker: rank, world size and local rank before and after init_process_group; writes rank<r>.json to argv[1]."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import smalltrain
import smalltrain.distributed as dist
from smalltrain.distributed.launch import usable_cores

env_local = dist.get_local_rank()
hook = sys.excepthook
# backend None means 'nccl' when CUDA is available: only where every rank can have a GPU of its own
enough_gpus = smalltrain.cuda.device_count() >= 2
group = dist.init_process_group(None if enough_gpus or not smalltrain.cuda.is_available() else "mpi")
info = {"rank": group.rank, "world": group.world_size, "env_local_rank": env_local,
        "local_rank": dist.get_local_rank(), "backend": group.backend, "hook_installed": sys.excepthook is not hook,
        "expected_backend": "nccl" if enough_gpus else "mpi"}
import threadpoolctl  # noqa: E402
# NumPy's BLAS, the one our ops use (other libraries in the process may bring BLAS builds of their own)
info["blas_threads"] = sorted({i["num_threads"] for i in threadpoolctl.threadpool_info()
                               if i["user_api"] == "blas" and "numpy" in i.get("filepath", "")})
# the cores this rank may run on: all of the node's under mpich, one under Open MPI's default binding (-n <= 2)
info["usable_cores"] = usable_cores()
dist.destroy_process_group()
info["hook_restored"] = sys.excepthook is hook and not dist.is_initialized()
(Path(sys.argv[1]) / f"rank{group.rank}.json").write_text(json.dumps(info))
