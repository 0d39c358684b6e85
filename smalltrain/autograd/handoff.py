"""The hand-off protocol between autograd and the backend: autograd's implementations of the hooks the CUDA
launchers call (backend/hooks.py), installed when smalltrain.autograd is imported, so before any launch.

  - claim_grad: a kernel that makes a leaf's gradient writes it into the leaf's gradient slot (engine.py);
  - defer_join: work a launcher queued on a side stream is joined at the end of the backward pass (engine.py);
  - hold / flush / drop: a launch held back for the op after it to take over (held.py; its state is hooks.held).
"""
from ..backend import hooks
from . import engine, held

hooks.install(claim_grad=engine.claim_grad, defer_join=engine.defer_join, hold=held.hold, flush=held.flush,
              drop=held.drop)
