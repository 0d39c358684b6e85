"""`smalltrain.distributed`, torch.distributed's subset: process groups over MPI (CPU arrays, bootstrap) and NCCL
(CUDA arrays), collectives on Tensors, and the helpers DistributedDataParallel builds on.

Start a job with `mpiexec -n N python script.py` or `srun python script.py`; without a launcher a script runs as
a job of one process. Nothing here imports MPI or CuPy until init_process_group is called.
"""
from .collectives import (
                          Work,
                          all_gather,
                          all_gather_object,
                          all_reduce,
                          broadcast,
                          broadcast_object_list,
                          reduce_scatter,
)
from .process_group import (
                          ProcessGroup,
                          barrier,
                          destroy_process_group,
                          get_backend,
                          get_local_rank,
                          get_rank,
                          get_world_size,
                          init_process_group,
                          is_available,
                          is_initialized,
)
from .reduce_op import ReduceOp

__all__ = ["ProcessGroup", "ReduceOp", "Work", "all_gather", "all_gather_object", "all_reduce", "barrier",
           "broadcast", "broadcast_object_list", "destroy_process_group", "get_backend", "get_local_rank",
           "get_rank", "get_world_size", "init_process_group", "is_available", "is_initialized", "reduce_scatter"]
