"""Grad modes: no_grad / enable_grad / set_grad_enabled / inference_mode as context managers and decorators, nesting,
restoring on exceptions, and per-thread state."""
import threading

import pytest

import smalltrain as st


def recorded():
    x = st.ones(2, requires_grad=True)
    return (x * 2).requires_grad


def test_context_managers_and_nesting():
    assert st.is_grad_enabled() and recorded()
    with st.no_grad():
        assert not st.is_grad_enabled() and not recorded()
        with st.enable_grad():
            assert st.is_grad_enabled() and recorded()
            with st.no_grad():
                assert not recorded()
            assert recorded()
        assert not recorded()
    assert recorded()


def test_one_instance_may_nest():
    ng = st.no_grad()
    with ng:
        with st.enable_grad():
            with ng:
                assert not st.is_grad_enabled()
            assert st.is_grad_enabled()
        assert not st.is_grad_enabled()
    assert st.is_grad_enabled()


# factories: set_grad_enabled(False) takes effect when called (as torch's), so build decorators inside the test
@pytest.mark.parametrize("make", [lambda: st.no_grad, st.no_grad, st.inference_mode, lambda: st.inference_mode,
                                  lambda: st.set_grad_enabled(False)],
                         ids=["@no_grad", "@no_grad()", "@inference_mode()", "@inference_mode",
                              "@set_grad_enabled(False)"])
def test_decorators_disable(make):
    @make()
    def f(x):
        """doc"""
        return (x * 2).requires_grad, st.is_grad_enabled()
    assert st.is_grad_enabled()
    assert f(st.ones(1, requires_grad=True)) == (False, False)
    assert st.is_grad_enabled() and f.__doc__ == "doc"


def test_enable_grad_decorator_inside_no_grad():
    @st.enable_grad
    def bare():
        return recorded()

    @st.enable_grad()
    def called():
        return recorded()
    with st.no_grad():
        assert bare() and called() and not st.is_grad_enabled()


def test_set_grad_enabled_forms():
    st.set_grad_enabled(False)
    try:
        assert not st.is_grad_enabled()
    finally:
        st.set_grad_enabled(True)
    with st.set_grad_enabled(False):
        assert not recorded()
        with st.set_grad_enabled(True):
            assert recorded()
    assert st.is_grad_enabled()
    with st.inference_mode(False):
        assert recorded()


def test_state_restored_after_exceptions():
    with pytest.raises(ValueError), st.no_grad():
        raise ValueError
    assert st.is_grad_enabled()

    @st.no_grad()
    def boom():
        raise KeyError
    with pytest.raises(KeyError):
        boom()
    assert st.is_grad_enabled()


def test_grad_mode_is_per_thread():
    seen = []
    started, release = threading.Event(), threading.Event()

    def worker():
        with st.no_grad():
            started.set()
            release.wait(5)
            seen.append(st.is_grad_enabled())
    t = threading.Thread(target=worker)
    t.start()
    started.wait(5)
    assert st.is_grad_enabled() and recorded()   # the worker's no_grad does not leak into this thread
    release.set()
    t.join()
    assert seen == [False]
