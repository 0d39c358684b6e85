"""Worker: rank 1 raises while rank 0 waits in an all-reduce; the job must end non-zero with rank 1's traceback."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import smalltrain as st
import smalltrain.distributed as dist

group = dist.init_process_group("mpi")
dist.barrier()
if group.rank == 1:
    raise ValueError("deliberate failure on rank 1")
dist.all_reduce(st.ones(3))   # never completes: rank 1 is gone
(Path(sys.argv[1]) / "rank0_finished").write_text("should not happen")
