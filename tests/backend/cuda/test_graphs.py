"""CUDA graphs' driver plumbing (backend/cuda/graphs.py) that needs no GPU."""
import numpy as np
import pytest


def test_programmatic_launch_packs_arguments_as_cupy_does():
    import ctypes

    from smalltrain.backend.cuda import graphs

    class Array:   # a device array: its address is data.ptr
        data = type("Pointer", (), {"ptr": 0x7F0000001000})()

    args = (Array(), None, np.int32(-3), np.int64(1 << 40), np.uint64(0), np.float32(0.1), np.float64(0.1), 7, 2.5,
            True)
    values, params = graphs.pack_arguments(args, Array)
    assert [type(v) for v in values] == [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64,
                                         ctypes.c_uint64, ctypes.c_float, ctypes.c_double, ctypes.c_int64,
                                         ctypes.c_double, ctypes.c_bool]
    assert [v.value for v in values] == [0x7F0000001000, None, -3, 1 << 40, 0, np.float32(0.1), 0.1, 7, 2.5, True]
    assert [params[i] for i in range(len(values))] == [ctypes.addressof(v) for v in values]
    with pytest.raises(TypeError, match="expected device arrays.*got str"):
        graphs.pack_arguments(("x",), Array)
