"""`DistributedDataParallel`: one model replica per process; parameters start equal (broadcast from rank 0) and
gradients are averaged over all ranks during backward, in buckets (smalltrain/distributed/reducer.py)."""
import contextlib

from ...autograd import grad_mode
from ...distributed import process_group as _pg
from ...distributed.reducer import Reducer, _tensors, broadcast_arrays, verify_same_shapes
from ..module import Module


class DistributedDataParallel(Module):
    """Wrap `module` (already on its device) after `init_process_group`; call it like the module.

    - Construction broadcasts rank 0's parameters and buffers to every rank (ranks may seed differently) and
      checks that every rank built the same parameters (names, shapes, dtypes).
    - Forward broadcasts rank 0's buffers first (broadcast_buffers=True; only when gradients are enabled, so an
      evaluation under no_grad that only some ranks run cannot hang), then calls `module`.
    - Backward: gradients go into flat buckets (parameters in reverse registration order, at most bucket_cap_mb
      each); a bucket is all-reduced and divided by the world size as soon as all its parameters' gradients
      have arrived, and the averages are copied back into each `p.grad` (or `p.grad` becomes a view of the
      bucket with gradient_as_bucket_view=True). `zero_grad(set_to_none=True)` is safe: nothing holds on to a
      `.grad` between steps. Buckets left incomplete (parameters that got no gradient on some rank) are reduced
      at the end of backward: a missing gradient counts as zeros, and `.grad` stays None where no rank had one.
    - `no_sync()`: forward and backward inside it accumulate gradients locally; the next backward outside
      all-reduces the accumulated sums.
    - Parameters are found unused by walking the forward's graph every step, so find_unused_parameters is not
      needed (accepted for torch compatibility). Every use of a parameter must be inside forward: a gradient
      that reaches a parameter after its bucket was reduced raises RuntimeError instead of desynchronizing.
    - `state_dict()` / `load_state_dict()` of the wrapper use keys prefixed with 'module.' (as torch does);
      save `ddp.module.state_dict()` for a checkpoint that loads into an unwrapped model.
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                 process_group=None, bucket_cap_mb=25, find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: expected an nn.Module, got {type(module).__name__}")
        if bucket_cap_mb is None:
            bucket_cap_mb = 25
        if not bucket_cap_mb > 0:
            raise ValueError(f"DistributedDataParallel: bucket_cap_mb must be > 0, got {bucket_cap_mb}")
        group = _pg.default_group(process_group)
        _check_device_ids(module, device_ids)
        self.module = module
        self.process_group = group
        self.broadcast_buffers = bool(broadcast_buffers)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.device_ids = list(device_ids) if device_ids is not None else None
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        verify_same_shapes(group, [(n, p.array) for n, p in module.named_parameters()], "parameters")
        broadcast_arrays(group, [p.array for p in module.parameters()] + self._buffer_arrays())
        self.reducer = Reducer(named, group, int(bucket_cap_mb * 1024 * 1024), gradient_as_bucket_view)

    def _buffer_arrays(self):
        return [b.array for b in self.module.buffers()]

    @property
    def require_backward_grad_sync(self):
        return self.reducer.sync

    def forward(self, *inputs, **kwargs):
        sync = grad_mode.is_grad_enabled() and self.reducer.sync
        if sync and self.broadcast_buffers and self.process_group.world_size > 1:
            broadcast_arrays(self.process_group, self._buffer_arrays())
        out = self.module(*inputs, **kwargs)
        if sync and any(t.requires_grad for t in _tensors(out)):
            self.reducer.prepare_for_backward(out)
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients of backward passes inside accumulate locally, without communication."""
        old = self.reducer.sync
        self.reducer.sync = False
        try:
            yield
        finally:
            self.reducer.sync = old

    def extra_repr(self):
        g = self.process_group
        return f"world_size={g.world_size}, rank={g.rank}, backend={g.backend!r}, buckets={len(self.reducer.buckets)}"


def _check_device_ids(module, device_ids):
    """device_ids, as in torch, is None or the one device of a single-device module (ints mean CUDA ordinals)."""
    if device_ids is None:
        return
    from ...backend import as_device
    ids = [str(as_device(d)) for d in device_ids]
    devices = sorted({str(p.device) for p in module.parameters()})
    if len(ids) != 1 or devices not in ([], ids):
        raise ValueError(f"DistributedDataParallel: device_ids must list the one device the module is on (move "
                         f"the module there before wrapping it); got device_ids={list(device_ids)} for a module "
                         f"on {devices}")
