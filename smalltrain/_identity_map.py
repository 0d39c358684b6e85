"""IdentityWeakMap: a value per live object, keyed by its identity, dropped when the object dies.

weakref.WeakKeyDictionary compares keys with ==, which a Tensor answers elementwise, so it cannot hold Tensors.
Used for the gradient slots of the backward engine and for the owners of flattened parameters.
"""
import weakref


class IdentityWeakMap(dict):
    """{id(obj): (weak reference to obj, value)}: `id(obj) in m` and `bool(m)` are a dict's (the backward pass
    asks them of every leaf); set/get/drop take the object itself."""

    def set(self, obj, value):
        key = id(obj)
        super().__setitem__(key, (weakref.ref(obj, lambda _, key=key: self.pop(key, None)), value))

    def get_for(self, obj):
        """The value set for obj while it lives, else None."""
        entry = super().get(id(obj))
        return entry[1] if entry is not None and entry[0]() is obj else None

    def drop(self, obj):
        self.pop(id(obj), None)
