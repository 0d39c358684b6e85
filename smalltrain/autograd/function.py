"""`Function`: the one way to define a differentiable op, for our own ops and for users' custom ones.

`forward(ctx, *args)` runs with recording off on Tensors (it may return Tensors or raw arrays);
`backward(ctx, *grads)` gets one gradient Tensor per output and returns one gradient per input.
"""
from . import grad_mode


class Node:
    """The graph node an op leaves behind (`tensor.grad_fn`); it is also the `ctx` that forward fills in."""

    __slots__ = ("fn", "inputs", "needs_input_grad", "to_save", "out_meta", "out_hooks", "non_differentiable",
                 "freed", "materialize", "__dict__")

    def __init__(self, fn):
        self.fn = fn
        self.inputs = ()            # the Tensor inputs that need gradients (None elsewhere), by position
        self.needs_input_grad = ()
        self.to_save = ()
        self.out_meta = ()          # (shape, dtype, device) per output, to materialize missing gradients
        self.out_hooks = None       # {output index: [hooks]} for tensor.register_hook on non-leaves
        self.non_differentiable = ()
        self.freed = False
        self.materialize = True

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
        return tuple((t.grad_fn if t is not None else None, 0) for t in self.inputs)

    def name(self):
        return self.fn.__name__ + "Backward"

    def __repr__(self):
        return f"<{self.name()}>"


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
        ctx = Node(cls)
        prev = grad_mode._state.enabled
        needs = tuple(isinstance(a, Tensor) and a.requires_grad for a in args) if prev else (False,) * len(args)
        record = True in needs
        ctx.needs_input_grad = needs
        grad_mode._state.enabled = False
        try:
            out = cls.forward(ctx, *args, **kwargs)
        finally:
            grad_mode._state.enabled = prev
        single = not isinstance(out, tuple)
        outs = (out,) if single else out
        wrapped = [o if isinstance(o, Tensor) or o is None else Tensor._wrap(o) for o in outs]
        if record:
            ctx.inputs = tuple(a if n else None for a, n in zip(args, needs))
            meta = []
            for i, o in enumerate(wrapped):
                if o is None or (ctx.non_differentiable and id(o) in ctx.non_differentiable):
                    meta.append(None)
                    continue
                if o._ctx is not None or o.requires_grad:
                    # forward handed back an existing tensor: give the output a handle of its own
                    o = wrapped[i] = Tensor._wrap(o.array)
                o._ctx = ctx
                o._out_idx = i
                o.requires_grad = True
                meta.append((o.array.shape, o.array.dtype, type(o.array)))
            ctx.out_meta = tuple(meta)
        return wrapped[0] if single else tuple(wrapped)


from ..tensor import Tensor  # noqa: E402  (tensor.py imports this module first)
