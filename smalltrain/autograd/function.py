"""`Function`: the one way to define a differentiable op, for our own ops and for users' custom ones.

`forward(ctx, *args)` runs with recording off on Tensors (it may return Tensors or raw arrays);
`backward(ctx, *grads)` gets one gradient Tensor per output and returns one gradient per input.
"""
from ..backend import hooks
from . import grad_mode, versions


class Node:
    """The graph node an op leaves behind (`tensor.grad_fn`); it is also the `ctx` that forward fills in."""

    __slots__ = ("fn", "inputs", "needs_input_grad", "to_save", "out_meta", "out_hooks", "non_differentiable",
                 "freed", "materialize", "versions", "__dict__")

    def __init__(self, fn):
        self.fn = fn
        self.inputs = ()            # per forward input: a leaf Tensor or an Edge where a gradient is needed, else None
        self.needs_input_grad = ()
        self.to_save = ()
        self.out_meta = ()          # (shape, dtype, device) per output, to materialize missing gradients
        self.out_hooks = None       # {output index: [hooks]} for tensor.register_hook on non-leaves
        self.non_differentiable = ()
        self.freed = False
        self.materialize = True
        self.versions = ()          # (counter, count) per tensor input, checked before backward (versions.py)

    def save_for_backward(self, *tensors):
        self.to_save = tensors

    @property
    def saved_tensors(self):
        if self.freed:
            raise RuntimeError(
                "Trying to backward through the graph a second time (or to read saved tensors after they were "
                "freed). Saved tensors are freed after the first backward; pass retain_graph=True to "
                "backward() the first time if you need to backward twice.")
        return self.to_save

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable = tuple(id(t) for t in tensors)

    def set_materialize_grads(self, value):
        self.materialize = value

    @property
    def next_functions(self):
        return tuple((t._ctx if t is not None else None, t._out_idx if t is not None else 0) for t in self.inputs)

    def name(self):
        return self.fn.__name__ + "Backward"

    def __repr__(self):
        return f"<{self.name()}>"


# [whether any base with views was written in place while recording, the refresh of a stale view]: set by
# ops/inplace.py (torch regenerates such a view's grad_fn from its base's version counter the same way)
stale_views = [False, None]


class Function:
    """Subclass with static `forward(ctx, ...)` and `backward(ctx, ...)`; call with `MyFn.apply(...)`."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        if hooks.held is not None:   # an op runs after the held launch (autograd/held.py)
            held.flush()
        ctx = Node(cls)
        state = grad_mode._state
        prev = state.enabled
        if prev:
            if stale_views[0]:   # a base was written in place while recording: its older views take the write
                for a in args:
                    if isinstance(a, Tensor) and a._view is not None and a._view[2] != a._view[0]._version:
                        stale_views[1](a)
            needs = tuple([isinstance(a, Tensor) and a.requires_grad for a in args])
            record = True in needs
        else:
            needs, record = (False,) * len(args), False
        ctx.needs_input_grad = needs
        state.enabled = False
        try:
            out = cls.forward(ctx, *args, **kwargs)
        finally:
            state.enabled = prev
        if record:
            versions.note_inputs(ctx, args, Tensor)
        if type(out) is not tuple:   # one output: the common case, kept short
            if isinstance(out, Tensor):
                if record and out._ctx is None and not out.requires_grad and any(out is a for a in args):
                    out = Tensor._wrap(out.array)   # an input handed back: never turn the caller's tensor into ours
            elif out is not None:
                out = Tensor._wrap(out)
            if record:
                ctx.inputs = tuple([(a if a._ctx is None else Edge(a)) if n else None for a, n in zip(args, needs)])
                out = _attach(ctx, out, 0)
                ctx.out_meta = (None if out is None or out._ctx is not ctx else
                                (out.array.shape, out.array.dtype, type(out.array)),)
            return out
        outs = [o if isinstance(o, Tensor) or o is None else Tensor._wrap(o) for o in out]
        outs = [Tensor._wrap(o.array) if o is not None and any(o is a for a in args) else o for o in outs]
        if record:
            ctx.inputs = tuple([(a if a._ctx is None else Edge(a)) if n else None for a, n in zip(args, needs)])
            outs = [_attach(ctx, o, i) for i, o in enumerate(outs)]
            ctx.out_meta = tuple(None if o is None or o._ctx is not ctx else (o.array.shape, o.array.dtype,
                                                                              type(o.array)) for o in outs)
        return tuple(outs)


def _attach(ctx, o, i):
    """Make `o` output i of node ctx, unless it is None, marked non-differentiable, or of an integer dtype."""
    if o is None or (ctx.non_differentiable and id(o) in ctx.non_differentiable) or o.array.dtype.kind not in "fc":
        return o
    if o._ctx is not None or o.requires_grad:
        o = Tensor._wrap(o.array)   # forward handed back an existing tensor: give the output a handle of its own
    o._ctx = ctx
    o._out_idx = i
    o.requires_grad = True
    return o


class Edge:
    """What a node keeps of an intermediate input: the node that made it, which output, its shape and dtype.

    Keeping this instead of the Tensor frees intermediate arrays that backward does not need (as torch does), and
    an in-place op that later rebinds the Tensor to a new node cannot reroute this node's gradient. Leaf inputs
    are kept as Tensors: their .grad is where gradients land.
    """

    __slots__ = ("_ctx", "_out_idx", "shape", "dtype")

    def __init__(self, t):
        self._ctx, self._out_idx = t._ctx, t._out_idx
        self.shape, self.dtype = t.array.shape, t.array.dtype

    @property
    def grad_fn(self):
        return self._ctx


from ..tensor import Tensor  # noqa: E402  (tensor.py imports this module first)
from . import held  # noqa: E402  (it subclasses Tensor)
