"""The backward engine: iterative reverse topological order, gradient accumulation, unbroadcasting, graph freeing."""
import numpy as np

from .._identity_map import IdentityWeakMap
from . import grad_mode, versions
from .function import Tensor   # the Tensor class, bound once tensor.py has loaded (function.py imports it)


def unbroadcast(grad, shape):
    """Sum `grad` down to `shape`, undoing NumPy broadcasting (leading dims added, size-1 dims expanded)."""
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra > 0:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    if grad.shape != shape:
        raise RuntimeError(f"autograd: gradient of shape {list(grad.shape)} cannot be reduced to the input's "
                           f"shape {list(shape)}")
    return grad


def _topological_order(roots):
    """Nodes reachable from `roots`, each after every node that consumes its outputs (no recursion)."""
    order, visited = [], set()
    stack = [(r, False) for r in roots]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for t in node.inputs:
            if t is not None and t._ctx is not None and id(t._ctx) not in visited:
                stack.append((t._ctx, False))
    order.reverse()
    return order


def _filled(meta, kind):
    """An array of an output's (shape, dtype, array type) meta, made by the array module's `kind` ('zeros' for a
    missing gradient, 'ones' for the unit seed)."""
    shape, dtype, array_type = meta
    if array_type is np.ndarray:
        return getattr(np, kind)(shape, dtype)
    from ..backend import cuda
    return getattr(cuda.cupy(), kind)(shape, dtype)


class _UnitSeed:
    """The seed of `loss.backward()` without a gradient: ones of the loss's shape, not made yet. A node whose
    function has `backward_unit(ctx)` (the gradients of its inputs for an output gradient of ones, or
    NotImplemented) is asked for those directly, so neither the ones nor, where the op prepared them in its
    forward, the scaling kernel runs (cross-entropy on CUDA); any other node gets the ones materialized."""

    __slots__ = ()

    def __repr__(self):
        return "UNIT_SEED"


UNIT_SEED = _UnitSeed()


class Prepared:
    """A gradient handed to the node that produced a tensor in a form that node defines (`kind`), instead of an
    array of the tensor's shape: a backward may return one for input i only where the engine offered that kind in
    `ctx.prepared_for[i]`, i.e. where the producer's function names it (`prepared_kind(producer_ctx)`) and the
    tensor has no other consumer in this pass and no hooks (nothing else may see or add to its gradient). The
    producer's backward then receives it as its output gradient. Example: a convolution's input gradient written
    directly as the previous convolution's g (its activation's derivative applied, in its kernels' layout)."""

    __slots__ = ("kind", "value")

    def __init__(self, kind, value):
        self.kind, self.value = kind, value

    def __repr__(self):
        return f"Prepared({self.kind!r})"


def _offer_prepared(order, roots_out):
    """Set ctx.prepared_for on the nodes whose functions make prepared gradients (`makes_prepared`): per input,
    the kind its producer takes where this node is the tensor's only consumer in this pass, else None."""
    if not any(getattr(node.fn, "makes_prepared", False) for node in order):
        return
    uses = {}   # (id(producer), output index) -> gradient contributions this pass
    for key in roots_out:
        uses[key] = uses.get(key, 0) + 1
    for node in order:
        for t in node.inputs:
            if t is not None and t._ctx is not None:
                key = (id(t._ctx), t._out_idx)
                uses[key] = uses.get(key, 0) + 1
    for node in order:
        if not getattr(node.fn, "makes_prepared", False):
            continue
        kinds = []
        for t in node.inputs:
            kind = None
            if t is not None and t._ctx is not None and uses.get((id(t._ctx), t._out_idx)) == 1:
                producer = t._ctx
                taker = getattr(producer.fn, "prepared_kind", None)
                if taker is not None and not (producer.out_hooks and producer.out_hooks.get(t._out_idx)):
                    kind = taker(producer)
            kinds.append(kind)
        node.prepared_for = tuple(kinds)


def _exclusive(g, taken):
    """True when g's memory belongs to g alone and no other leaf took it in this pass, so .grad may be g itself.

    Backward functions return fresh arrays (or whole-buffer reshapes of one); the seed gradient and views of
    other arrays are never taken. Taking instead of copying saves one copy kernel per parameter and step.
    """
    base = g.base
    if base is not None and (base.base is not None or base.nbytes != g.nbytes):
        return False
    if not g.flags.c_contiguous or not getattr(g.flags, "writeable", True):   # e.g. NumPy's broadcast_to
        return False
    owner = id(base if base is not None else g)
    if owner in taken:
        return False
    taken.add(owner)
    return True


# Gradient slots: the memory a leaf's .grad is to live in (nn.utils.flatten_parameters registers views into one
# flat buffer). While a node's backward runs, _slot_offers holds (array, slot) for its leaf inputs whose .grad is
# None, so a kernel that makes such a leaf's gradient may write it into the slot directly (claim_grad); a gradient
# made anywhere else is copied into the slot (grad_slot_copies counts those copies). _slots_paused: autograd.grad
# returns gradients instead of accumulating them, so none may land in a slot.
_grad_slots = IdentityWeakMap()   # leaf -> slot
_slot_offers = []
_slots_paused = [0]
grad_slot_copies = [0]


def set_grad_slot(leaf, slot):
    """Make `slot` (an array of the leaf's shape, dtype and device, or None to drop it) the memory of leaf.grad."""
    if slot is None:
        _grad_slots.drop(leaf)
    else:
        _grad_slots.set(leaf, slot)


def grad_slot(leaf):
    """The leaf's gradient slot while it still fits the leaf's array (it may have been replaced since), else None."""
    slot = _grad_slots.get_for(leaf) if _grad_slots and not _slots_paused[0] else None
    if slot is None:
        return None
    a = leaf.array
    if type(slot) is not type(a) or slot.shape != a.shape or slot.dtype != a.dtype or \
            (type(a) is not np.ndarray and slot.device.id != a.device.id):
        return None
    return slot


def claim_grad(array):
    """The slot to write the gradient of `array` (a leaf input's array of the running backward, by identity) into,
    once per pass, or None: the caller then allocates as usual. See _slot_offers."""
    for i, (a, slot) in enumerate(_slot_offers):
        if a is array:
            del _slot_offers[i]
            return slot
    return None


def _used_once(order):
    """The ids of the leaves with a gradient slot that exactly one input edge of the pass's nodes reaches: only their
    slots are offered, so a claimed slot is the one gradient its leaf gets in the pass (a leaf used twice has its
    first gradient copied into the slot and the second added)."""
    uses = {}
    for node in order:
        for t in node.inputs:
            if t is not None and t._ctx is None and id(t) in _grad_slots:
                uses[id(t)] = uses.get(id(t), 0) + 1
    return {k for k, n in uses.items() if n == 1}


def _offer_slots(node, once, only):
    """Fill _slot_offers for node's backward: its leaf inputs', and, where it makes a prepared gradient for an input
    (a convolution's input gradient that also sums the producer's weight gradient), that producer's leaf inputs';
    of those used once in the pass (`once`) and still without a .grad."""
    _slot_offers.clear()
    prepared = node.__dict__.get("prepared_for") or ()
    owners = [node] + [t._ctx for t, kind in zip(node.inputs, prepared) if kind is not None]
    for owner in owners:
        for t in owner.inputs:
            if t is not None and id(t) in once and t.grad is None and not t._hooks and t.requires_grad and \
                    (only is None or id(t) in only):
                slot = grad_slot(t)
                if slot is not None:
                    _slot_offers.append((t.array, slot))


class slots_paused:
    """Within: no gradient is written into or copied to a slot (autograd.grad)."""

    def __enter__(self):
        _slots_paused[0] += 1

    def __exit__(self, *exc):
        _slots_paused[0] -= 1


def _accumulate_leaf(leaf, g, taken=None):
    if leaf._hooks or leaf._post_hooks or leaf.grad is not None:
        settle()   # each reads g (or adds to .grad) on the current stream: work queued beside must be done
    if leaf._hooks:
        for hook in leaf._hooks:
            r = hook(Tensor._wrap(g))
            if r is not None:
                g = r.array
                taken = None   # a hook's result may be anything the hook keeps
    slot = grad_slot(leaf) if leaf.grad is None and _grad_slots else None
    if slot is not None:
        if g is not slot:   # made elsewhere than in the slot (an op that does not claim, a hook, a seed)
            settle()   # the copy reads g
            slot[...] = g
            grad_slot_copies[0] += 1
        leaf.grad = Tensor._wrap(slot)
    elif leaf.grad is None:
        # the same upstream array may feed several leaves, and .grad is updated in place later: copy unless
        # the array is exclusively this gradient's
        if taken is not None and _exclusive(g, taken):
            leaf.grad = Tensor._wrap(g)
        else:
            settle()   # the copy reads g
            leaf.grad = Tensor._wrap(g.copy())
    else:
        leaf.grad.array += g
    if leaf._post_hooks:
        for hook in leaf._post_hooks:
            hook(leaf)


_callbacks = []
# Work an op queued beside the pass (backend/cuda/_common.py run_beside with defer: a CUDA side stream) that makes
# gradients of leaves: its joins (the current stream waits for it), run by settle() before anything reads such a
# gradient and at the end of the pass. _pass_only: the `inputs` filter of each pass in progress, innermost last.
_joins = []
_pass_only = []


def defer_join(join):
    """Queue join() for the next settle() (see _joins)."""
    _joins.append(join)


def settle():
    """Run the joins of the work queued beside the pass so far (nothing where there is none)."""
    while _joins:
        _joins.pop(0)()


def takes_plainly(ctx, indices):
    """Whether ctx's inputs `indices` (None entries and inputs that need no gradient aside) are all leaves, during a
    backward pass: their gradients then go only to _accumulate_leaf, which reads nothing of them before settle(),
    so an op may make them beside the rest of the pass and join later (defer_join) rather than at once."""
    if not _pass_only:
        return False
    for i in indices:
        t = ctx.inputs[i]
        if t is not None and t._ctx is not None:   # a non-leaf: the next node reads its gradient
            return False
    return True


def queue_callback(fn):
    """Run `fn()` once the backward pass in progress has finished (DDP flushes its last buckets this way)."""
    _callbacks.append(fn)


def run_backward(tensors, grad_tensors, retain_graph=False, inputs=None):
    """Backpropagate from `tensors` seeded with `grad_tensors` (raw arrays), accumulating into leaves' .grad.

    With `inputs`, only those leaves accumulate. Without `retain_graph`, what each node saved is dropped as soon
    as its backward ran, and the graph keeps only shapes of intermediate tensors (not their memory).
    """
    only = None if inputs is None else {id(t) for t in inputs}
    # memory a leaf may not take as its .grad: the caller's seed gradients (and, as the pass goes, taken ones)
    taken = {id(g.base if g.base is not None else g) for g in grad_tensors if hasattr(g, "base")}
    pending = {}   # id(node) -> list of output gradients (arrays, UNIT_SEED or None)
    roots = []
    for t, g in zip(tensors, grad_tensors):
        # only a lone root made by a one-output function keeps it unmade
        if g is UNIT_SEED and (t._ctx is None or len(tensors) > 1 or len(t._ctx.out_meta) != 1):
            g = _filled((t.array.shape, t.array.dtype, type(t.array)), "ones")
        if t._ctx is None:
            if t.requires_grad and (only is None or id(t) in only):
                _accumulate_leaf(t, g)
            continue
        node = t._ctx
        slot = pending.setdefault(id(node), [None] * len(node.out_meta))
        i = t._out_idx
        slot[i] = g if slot[i] is None else slot[i] + g
        roots.append(node)
    prev = grad_mode._state.enabled
    grad_mode._state.enabled = False
    _pass_only.append(only)
    try:
        order = _topological_order(roots)
        _offer_prepared(order, [(id(t._ctx), t._out_idx) for t in tensors if t._ctx is not None])
        once = _used_once(order) if _grad_slots and not _slots_paused[0] else None
        for node in order:
            grads = pending.pop(id(node), None)
            if grads is None:
                continue
            if node.freed:
                _ = node.saved_tensors   # raises the torch-style "backward through the graph a second time"
            in_grads = NotImplemented
            if once:
                _offer_slots(node, once, only)
            if grads[0] is UNIT_SEED:   # a hook sees the ones; else the function's prepared gradients if it has any
                if not node.out_hooks and getattr(node.fn, "backward_unit", None) is not None:
                    in_grads = node.fn.backward_unit(node)
                if in_grads is NotImplemented:
                    grads[0] = _filled(node.out_meta[0], "ones")
            if node.out_hooks:
                _run_tensor_hooks(node, grads)
            in_grads = _call_backward(node, grads) if in_grads is NotImplemented else _check_in_grads(node, in_grads)
            _slot_offers.clear()
            offered = node.__dict__.get("prepared_for") or (None,) * len(node.inputs)   # read before _free clears it
            if not retain_graph:
                _free(node)
            for i, (t, g) in enumerate(zip(node.inputs, in_grads)):
                if t is None or g is None:
                    continue
                if isinstance(g, Prepared):   # offered above: this node is the tensor's only consumer
                    if offered[i] != g.kind:
                        raise RuntimeError(f"{node.name()}: backward returned a Prepared({g.kind!r}) gradient for "
                                           f"input {i}, but the engine offered {offered[i]!r}")
                    pending.setdefault(id(t._ctx), [None] * len(t._ctx.out_meta))[t._out_idx] = g
                    continue
                g = g.array if isinstance(g, Tensor) else g
                leaf = t._ctx is None
                a = t.array if leaf else t   # an Edge carries shape and dtype itself
                if g.shape != a.shape or g.dtype != a.dtype:
                    settle()   # both read g
                if g.shape != a.shape:
                    g = unbroadcast(g, a.shape)
                if g.dtype != a.dtype:
                    g = g.astype(a.dtype)
                if leaf:
                    if only is None or id(t) in only:
                        _accumulate_leaf(t, g, taken)
                else:
                    slot = pending.setdefault(id(t._ctx), [None] * len(t._ctx.out_meta))
                    i = t._out_idx
                    slot[i] = g if slot[i] is None else slot[i] + g
    finally:
        grad_mode._state.enabled = prev
        _pass_only.pop()
        _slot_offers.clear()
        settle()   # the gradients are the caller's (and the callbacks') to read
    while _callbacks:
        _callbacks.pop(0)()


def _run_tensor_hooks(node, grads):
    for i, hooks in node.out_hooks.items():
        for hook in list(hooks):
            if grads[i] is not None:
                r = hook(Tensor._wrap(grads[i]))
                if r is not None:
                    grads[i] = r.array if isinstance(r, Tensor) else r


def _call_backward(node, grads):
    if node.versions:
        versions.check(node)
    if node.materialize:
        grads = [(g if isinstance(g, Prepared) else Tensor._wrap(g if g is not None else _filled(m, "zeros")))
                 if m is not None else None for g, m in zip(grads, node.out_meta)]
    else:
        grads = [g if g is None or isinstance(g, Prepared) else Tensor._wrap(g) for g in grads]
    return _check_in_grads(node, node.fn.backward(node, *grads))


def _check_in_grads(node, in_grads):
    """A backward's result as a tuple of one gradient per forward input (torch's errors otherwise)."""
    if not isinstance(in_grads, (tuple, list)):
        in_grads = (in_grads,)
    n = len(node.inputs)
    if len(in_grads) != n:
        if len(in_grads) < n and any(t is not None for t in node.inputs[len(in_grads):]):
            raise RuntimeError(f"{node.name()}: backward returned {len(in_grads)} gradients, expected {n} (one "
                               "per forward input)")
        if len(in_grads) > n and any(g is not None for g in in_grads[n:]):
            raise RuntimeError(f"{node.name()}: function backward returned an incorrect number of gradients "
                               f"(expected {n}, got {len(in_grads)})")
    return in_grads


def _holds_data(node):
    if node.to_save:
        return True
    for v in node.__dict__.values():
        if hasattr(v, "shape") or (isinstance(v, (tuple, list)) and any(hasattr(u, "shape") for u in v)):
            return True
    return False


def _free(node):
    """Drop what forward saved; the structure stays walkable (grad_fn chains)."""
    if _holds_data(node):
        # a second backward through this node must fail loudly, as torch's does; nodes that saved nothing
        # (add, sum, reshape) stay usable, as torch's are
        node.to_save = ()
        node.freed = True
        node.__dict__.clear()
