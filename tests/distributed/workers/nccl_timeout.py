"""Worker: an NCCL group with timeout=argv[2] s whose all-reduce cannot complete: with two ranks, rank 1 never
enters it (it sleeps, as a stopped or stuck rank would); alone on one GPU, a kernel queued before it spins for
30 s. Rank 0 then waits on the GPU, as a training step's sync would: the watchdog must name the collective and
abort the job. argv[1] gets a file only on a hang."""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import smalltrain as st
import smalltrain.distributed as dist
from smalltrain.backend.cuda import cupy

group = dist.init_process_group("nccl", timeout=float(sys.argv[2]))
x = st.ones(3, device=f"cuda:{group.nccl.device_id}")
if group.rank == 1:
    time.sleep(60)
else:
    if group.world_size == 1:   # a busy stream in place of a missing rank: the collective waits behind it
        spin = cupy().RawKernel('extern "C" __global__ void spin(long long cycles) { long long t = clock64(); '
                                'while (clock64() - t < cycles) {} }', "spin")
        spin((1,), (1,), (cupy().int64(30 * 2_000_000_000),))
    dist.all_reduce(x)
    st.cuda.synchronize()
(Path(sys.argv[1]) / f"rank{group.rank}_finished").write_text("should not happen")
