"""Worker: a group with timeout=2 s; rank 1 never enters the all-reduce rank 0 waits in (it sleeps, as a stopped
or stuck rank would). Rank 0 must name the collective and abort the job; argv[1] gets a file only on a hang."""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import smalltrain as st
import smalltrain.distributed as dist

group = dist.init_process_group("mpi", timeout=float(sys.argv[2]))
if group.rank == 1:
    time.sleep(60)
else:
    dist.all_reduce(st.ones(3))
(Path(sys.argv[1]) / f"rank{group.rank}_finished").write_text("should not happen")
