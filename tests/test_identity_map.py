"""IdentityWeakMap: values keyed by a Tensor's identity (its == is elementwise), gone when the Tensor dies."""
import gc

import smalltrain as st
from smalltrain._identity_map import IdentityWeakMap


def test_values_by_identity_dropped_with_their_object():
    m = IdentityWeakMap()
    a, b = st.zeros(3), st.zeros(3)   # equal values, two objects
    m.set(a, "a")
    assert m.get_for(a) == "a" and m.get_for(b) is None and id(a) in m and id(b) not in m
    m.set(b, "b")
    m.set(a, "a2")
    assert (m.get_for(a), m.get_for(b), len(m)) == ("a2", "b", 2)
    m.drop(b)
    assert m.get_for(b) is None and len(m) == 1
    del a
    gc.collect()
    assert not m
