"""Deferred ops: a fusable producer returns a placeholder, and the op after it may absorb it into one fused op.

An op cannot know what reads its output next, so the fusable producers on CUDA (a convolution, a linear layer,
log_softmax: ops/conv.py, ops/matmul.py, ops/activation.py) do not run: `defer` records the op and its inputs and
returns a PendingTensor. A consumer that finds one (an activation, max_pool2d, flatten, linear, nll_loss) asks
`absorb` for a rule registered by the producer's file for the pair (`rule`); a rule returns the fused op, itself
deferred, so that a third op may absorb it in turn (conv -> relu -> max_pool2d -> flatten -> linear chain). This
finds fusion in an ordinary model, written with modules or F.* calls, instead of in the model's code.

Semantics never change, because anything else that could see the placeholder runs the recorded op first
("settles" it), with the grad mode it was called under:
  - any attribute of the placeholder (its array, and so shape, dtype and data; requires_grad, grad_fn, hooks):
    PendingTensor turns every slot of Tensor into a property that settles first;
  - any op (Function.apply), any kernel launch, the end of a capture: the deferred op is held as autograd/held.py
    holds a launch (hooks.held), and these flush what is held;
  - a placeholder absorbed but still referenced (a residual reading the convolution's output) is settled on its
    own, with its own recorded op, right after the fused op that absorbed it runs (`sources`: weak references, so
    the common case, a temporary that died, costs nothing).
A placeholder that died before anything read it is never run, unless its op has effects beyond its output (a
training batch_norm updates its running statistics: `effects`). One deferred op is held at a time, except that one
whose input is the output of a held launch keeps that launch held beneath it (`prev`: log_softmax after the linear
chain, whose loss head cross_entropy takes over).
"""
import weakref

from ..backend import hooks
from ..tensor import Tensor
from . import grad_mode, held

_RULES = {}   # (producer kind, consumer name) -> rule(args, *consumer args) -> placeholder, or None to decline


def rule(kind, consumer):
    """Register fn as the fusion of a deferred op of `kind` followed by `consumer` (a decorator)."""
    def register(fn):
        _RULES[kind, consumer] = fn
        return fn
    return register


class Pending:
    """A deferred op: run(*args) makes its output; `placeholder` (a weak reference) the PendingTensor standing for
    it; `enabled` the grad mode it was called under. `tensor` is None for held.py, which resets the class of the
    tensors of held launches (a placeholder turns itself into a Tensor when settled)."""

    __slots__ = ("kind", "run", "args", "enabled", "placeholder", "prev", "sources", "tensor", "effects")

    def __init__(self, kind, run, args, enabled, sources, effects=False):
        self.kind, self.run, self.args, self.enabled, self.sources = kind, run, args, enabled, sources
        self.placeholder = self.prev = self.tensor = None
        self.effects = effects

    def settle(self):
        """Run the op into its placeholder (unless that died unread), then settle the absorbed placeholders still
        referenced."""
        if hooks.held is self:
            hooks.held = None
        prev, self.prev = self.prev, None
        if prev is not None:   # its launch stays held for our op, which may take it over (cross_entropy)
            held.flush()
            hooks.held = prev
        t = self.placeholder()
        alive = t is not None and type(t) is PendingTensor
        if alive or (self.effects and t is None):
            state = grad_mode._state
            before, state.enabled = state.enabled, self.enabled
            try:
                out = self.run(*self.args)
            finally:
                state.enabled = before
            if alive:
                _become(t, out)
        for ref in self.sources:
            s = ref()
            if s is not None and type(s) is PendingTensor:
                _ARRAY.__get__(s).settle()


def defer(kind, run, args, sources=(), effects=False):
    """A placeholder for run(*args), held (hooks.held) until a consumer absorbs it or anything else settles it.
    effects: run(*args) does more than make its output, so it runs even if the placeholder dies unread."""
    p = Pending(kind, run, args, grad_mode._state.enabled, sources, effects)
    h = hooks.held
    if h is not None:
        if h.tensor is not None and any(a is h.tensor for a in args):
            hooks.held, p.prev = None, h   # our input is the held launch's output: keep it held beneath us
        else:
            held.flush()
    t = Tensor.__new__(PendingTensor)
    _ARRAY.__set__(t, p)
    p.placeholder = weakref.ref(t)
    hooks.held = p
    return t


def absorb(t, consumer, *args):
    """The fused op of placeholder t's op and `consumer` (given its arguments) where a rule takes them, else None
    (the caller then runs its plain path, which settles t)."""
    p = _ARRAY.__get__(t)
    fn = _RULES.get((p.kind, consumer))
    if fn is None or p.enabled != grad_mode._state.enabled:
        return None
    if hooks.held is p:   # taken: what it held beneath it is held again
        hooks.held, p.prev = p.prev, None
    elif p.prev is not None:
        held.flush()
    out = fn(p.args, *args)
    if out is not None and type(out) is PendingTensor:
        _ARRAY.__get__(out).sources = p.sources + (weakref.ref(t),)
    return out


def kind(t):
    """The kind of deferred op placeholder t stands for, or None for any other value."""
    return _ARRAY.__get__(t).kind if type(t) is PendingTensor else None


def resolve(t):
    """t with its deferred op run, if it is a placeholder (any other value as it is)."""
    if type(t) is PendingTensor:
        _ARRAY.__get__(t).settle()
    return t


def raw_array(t):
    """t's array without running a held launch that writes it (its shape and dtype are already right); a placeholder
    is settled first."""
    return _ARRAY.__get__(resolve(t))


def _become(t, out):
    """Turn placeholder t into the tensor `out` (every slot copied), held where `out` is a held launch's output.
    (The slots by name, as a Tensor now: a loop over descriptors cost ~1 us more per deferred op; COPIED lists
    them, and a test checks it against Tensor.__slots__.)"""
    t.__class__ = Tensor
    t.array = _ARRAY.__get__(out)   # (not out.array: a held launch's output would run it)
    t.grad, t.requires_grad, t._ctx, t._out_idx = out.grad, out.requires_grad, out._ctx, out._out_idx
    t._hooks, t._post_hooks, t._retain, t._view, t._version, t._vc = (out._hooks, out._post_hooks, out._retain,
                                                                       out._view, out._version, out._vc)
    h = hooks.held
    if h is not None and h.tensor is out:
        h.tensor = t
        t.__class__ = held.HeldTensor


COPIED = ("array", "grad", "requires_grad", "_ctx", "_out_idx", "_hooks", "_post_hooks", "_retain", "_view",
          "_version", "_vc")
_ARRAY = Tensor.__dict__["array"]   # the slot's own descriptor: a placeholder keeps its Pending record in it
_SLOTS = [name for name in Tensor.__slots__ if name != "__weakref__"]


class PendingTensor(Tensor):
    """A Tensor whose op has not run: reading or writing any of its attributes runs it first (see the docstring)."""

    __slots__ = ()


def _settling(name):
    def get(self):
        _ARRAY.__get__(self).settle()
        return getattr(self, name)

    def set(self, value):
        _ARRAY.__get__(self).settle()
        setattr(self, name, value)
    return property(get, set)


for _name in _SLOTS:
    setattr(PendingTensor, _name, _settling(_name))
