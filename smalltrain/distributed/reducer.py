"""Gradient buckets for DistributedDataParallel: parameters packed (reverse registration order) into flat buffers
per (device, dtype) of at most bucket_cap bytes, each all-reduced and averaged as soon as its gradients are ready.

Why counts: our engine accumulates into a leaf once per edge (a weight used twice fires its hook twice), so a
parameter is ready only when its hook has fired as often as the forward graph uses it. DDP's forward counts the
uses; without a count (forward not through the wrapper) every bucket waits for the end-of-backward flush.
Buckets are reduced strictly in order 0, 1, 2, ... on every rank, so the ranks' collectives always match.
Each buffer ends with one flag per parameter (1 where this rank had a gradient): the all-reduced flags tell
which parameters no rank had a gradient for; their .grad stays None (the others treat a missing gradient as 0).
"""
import warnings
import weakref

from ..autograd import engine
from ..tensor import Tensor
from .reduce_op import ReduceOp


class Bucket:
    def __init__(self, index, params, param_ids):
        from ..ops._util import xp_of
        self.index, self.param_ids = index, param_ids
        first = params[0].array
        self.xp = xp_of(first)
        self.numel = sum(p.array.size for p in params)
        self.buffer = _zeros(self.xp, first, self.numel + len(params))
        self.data, self.flags = self.buffer[:self.numel], self.buffer[self.numel:]
        self.views, off = [], 0
        for p in params:
            n = p.array.size
            self.views.append(self.data[off:off + n].reshape(p.array.shape))
            off += n
        self.pending = 0          # parameters still waiting for gradients in this backward
        self.reduced = False


def _warn_if_flattened(params):
    """The bucket views become the gradients' slots, replacing the flat gradient buffer that flatten_parameters
    registered: the fused optimizers then see the gradients outside that buffer and update one array at a time."""
    from ..nn.utils.flat_parameters import owner
    flat = [i for i, p in enumerate(params) if owner(p) is not None]
    if flat:
        warnings.warn(f"DistributedDataParallel(gradient_as_bucket_view=True): {len(flat)} of {len(params)} "
                      "parameters are flattened (flatten_parameters); their gradients will live in the DDP buckets "
                      "instead of the flat gradient buffer, so the optimizer no longer updates them as one flat "
                      "buffer", stacklevel=4)


def _zeros(xp, like, n):
    if xp.__name__ == "numpy":
        return xp.zeros(n, like.dtype)
    with like.device:
        return xp.zeros(n, like.dtype)


def build_buckets(params, cap_bytes):
    """Buckets over `params` taken in reverse order, split by (device, dtype) and by size."""
    buckets, open_ = [], {}       # open_: (device, dtype) -> [param indices, bytes]
    for i in reversed(range(len(params))):
        a = params[i].array
        key = (str(params[i].device), a.dtype.str)
        cur = open_.get(key)
        if cur is not None and cur[0] and cur[1] + a.nbytes > cap_bytes:
            buckets.append(cur[0])
            cur = None
        if cur is None:
            cur = open_[key] = [[], 0]
        cur[0].append(i)
        cur[1] += a.nbytes
    buckets += [ids for ids, _ in open_.values() if ids]
    return [Bucket(k, [params[i] for i in ids], ids) for k, ids in enumerate(buckets)]


class Reducer:
    """Owns the buckets and the per-backward state; DDP calls prepare_for_backward from its forward."""

    def __init__(self, named_params, group, bucket_cap_bytes, gradient_as_bucket_view=False):
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.group = group
        self.as_view = gradient_as_bucket_view
        self.sync = True          # False inside DistributedDataParallel.no_sync()
        # buckets of the last backward reduced during it (as gradients arrived) and at its end (the flush)
        self.last_early, self.last_flushed = 0, 0
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.buckets = build_buckets(self.params, bucket_cap_bytes) if self.params else []
        self.bucket_of = [0] * len(self.params)
        for b in self.buckets:
            for i in b.param_ids:
                self.bucket_of[i] = b.index
        if gradient_as_bucket_view:   # each gradient made in its bucket view where the op can (engine's slots)
            _warn_if_flattened(self.params)
            for b in self.buckets:
                for slot, i in enumerate(b.param_ids):
                    engine.set_grad_slot(self.params[i], b.views[slot])
        me = weakref.ref(self)  # the hooks must not keep a discarded wrapper's reducer alive
        self.handles = [p.register_post_accumulate_grad_hook(lambda p, me=me: (me() or _Dead).on_grad(p))
                        for p in self.params]
        self._reset()

    def _reset(self):
        self.armed = False
        self.expected = None
        self.arrived = [0] * len(self.params)
        self.next_bucket = 0
        self.flush_queued = False
        for b in self.buckets:
            b.reduced = False

    def _arm(self, expected):
        self.armed, self.expected = True, expected
        self.last_early = self.last_flushed = 0

    def _queue_flush(self):
        if not self.flush_queued:
            self.flush_queued = True
            engine.queue_callback(self._flush)

    def prepare_for_backward(self, outputs):
        """Arm the reducer for the next backward, counting how often the graph of `outputs` uses each parameter."""
        counts = count_uses(outputs, self.index, len(self.params))
        if not self.armed:
            self._arm([0] * len(self.params))
        if self.expected is not None:
            self.expected = [e + c for e, c in zip(self.expected, counts)]
            for b in self.buckets:
                b.pending = sum(1 for i in b.param_ids if self.arrived[i] < self.expected[i])
        self._queue_flush()

    def on_grad(self, p):
        """Post-accumulate hook: count the arrival; reduce every consecutive bucket that became complete."""
        i = self.index[id(p)]
        if not self.armed:
            if not self.sync:
                return  # inside no_sync(): the gradient just accumulates locally
            self._arm(None)
            self._queue_flush()
        b = self.buckets[self.bucket_of[i]]
        if b.reduced:
            raise RuntimeError(f"DistributedDataParallel: parameter '{self.names[i]}' received a gradient after its "
                               "bucket was already all-reduced in this backward; it is used outside the wrapped "
                               "module's forward output (compute every use of a parameter inside forward)")
        self.arrived[i] += 1
        if self.expected is not None and self.arrived[i] == self.expected[i]:
            b.pending -= 1
            while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].pending <= 0:
                self._reduce(self.buckets[self.next_bucket])
                self.next_bucket += 1
                self.last_early += 1

    def _flush(self):
        """End of backward: reduce the buckets still open (missing gradients count as zeros), then disarm."""
        self.flush_queued = False
        if not self.armed:
            return
        rest = self.buckets[self.next_bucket:]
        self.last_flushed = len(rest)
        try:
            for b in rest:
                self._reduce(b)
        finally:
            self._reset()

    def _reduce(self, b):
        missing = False
        for slot, i in enumerate(b.param_ids):
            g, view = self.params[i].grad, b.views[slot]
            if g is None:
                view[...] = 0
                missing = True
            elif g.array is not view:
                view[...] = g.array
        if missing:
            for slot, i in enumerate(b.param_ids):
                b.flags[slot] = 0 if self.params[i].grad is None else 1
        else:
            b.flags.fill(1)  # one operation, not one per parameter (each is a kernel launch on CUDA)
        self.group.all_reduce_array(b.buffer, ReduceOp.SUM)
        b.data /= self.group.world_size
        # reading the flags syncs with the GPU: only needed when this rank lacked a gradient
        counts = (b.flags.get() if hasattr(b.flags, "get") else b.flags) if missing else None
        for slot, i in enumerate(b.param_ids):
            p, view = self.params[i], b.views[slot]
            if p.grad is None:
                if counts[slot] == 0:
                    continue  # no rank had a gradient: leave None, as a single process would
                p.grad = Tensor._wrap(view if self.as_view else view.copy())
            elif self.as_view:
                p.grad = Tensor._wrap(view)
            elif p.grad.array is not view:
                p.grad.array[...] = view
        b.reduced = True


class _Dead:
    @staticmethod
    def on_grad(p):
        pass


def count_uses(outputs, index, n):
    """How many gradients each parameter (by `index`: id -> position) receives when backpropagating `outputs`."""
    counts = [0] * n
    stack, seen = [], set()
    for t in _tensors(outputs):
        if t._ctx is not None:
            stack.append(t._ctx)
        elif t.requires_grad and id(t) in index:
            counts[index[id(t)]] += 1
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for t in node.inputs:
            if t is None:
                continue
            if t._ctx is not None:
                stack.append(t._ctx)
            else:
                i = index.get(id(t))
                if i is not None:
                    counts[i] += 1
    return counts


def _tensors(obj):
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def broadcast_arrays(group, arrays, src=0):
    """Overwrite every array, in place, with rank `src`'s values: one broadcast per (device, dtype), not per array."""
    if group.world_size == 1 or not arrays:
        return
    from ..ops._util import xp_of
    by_key = {}
    for a in arrays:
        by_key.setdefault((str(type(a)), getattr(a, "device", None) and str(a.device), a.dtype.str), []).append(a)
    for group_arrays in by_key.values():
        xp = xp_of(group_arrays[0])
        flat = xp.concatenate([a.reshape(-1) for a in group_arrays])
        group.broadcast_array(flat, src)
        if group.rank != src:
            off = 0
            for a in group_arrays:
                a[...] = flat[off:off + a.size].reshape(a.shape)
                off += a.size


def verify_same_shapes(group, named_arrays, what):
    """RuntimeError on every rank (consistently) when the ranks' models differ in names, shapes or dtypes."""
    if group.world_size == 1:
        return
    mine = [(n, tuple(a.shape), a.dtype.str) for n, a in named_arrays]
    everyone = group.host.allgather_object(mine)
    for r, theirs in enumerate(everyone):
        if theirs != everyone[0]:
            diff = next(((a, b) for a, b in zip(everyone[0], theirs) if a != b), (len(everyone[0]), len(theirs)))
            raise RuntimeError(f"DistributedDataParallel: the {what} differ between rank 0 and rank {r}: "
                               f"{diff[0]} vs {diff[1]}; every rank must build the same model")
