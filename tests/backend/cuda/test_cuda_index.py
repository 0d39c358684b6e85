"""CUDA gather / scatter-add and several copies in one launch (backend/cuda/index.py)."""
import cuda_reference as ref
import numpy as np
import pytest

import smalltrain
from smalltrain.backend.cuda import cupy, device_checks, ops
from smalltrain.testing import assert_close

GPU = smalltrain.cuda.is_available()
cp = cupy() if GPU else None
gpu = pytest.mark.skipif(not GPU, reason="no CUDA device")
DTYPES = [np.float32, np.float64]


def g(a):
    return cp.asarray(a)


GATHER_CASES = [((4, 6, 5), 1, (4, 3, 5)), ((7, 3), 0, (10, 3)), ((3, 4, 5), -1, (3, 4, 9)),
                ((5, 6, 7), 1, (3, 4, 2)), ((300,), 0, (1000,))]


def _region(shape, dim):
    return tuple(slice(None) if d == dim else slice(0, n) for d, n in enumerate(shape))


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", GATHER_CASES)
def test_gather_and_backward(case, dtype, rng):
    x_shape, dim, idx_shape = case
    d = dim % len(x_shape)
    x = rng.standard_normal(x_shape).astype(dtype)
    idx = rng.integers(0, x_shape[d], idx_shape)
    out = ops.gather(g(x), dim, g(idx))
    np.testing.assert_array_equal(out.get(), np.take_along_axis(x[_region(idx_shape, d)], idx, d))
    dout = rng.standard_normal(idx_shape).astype(dtype)
    want = np.zeros(x_shape)
    grids = list(np.indices(idx_shape))
    grids[d] = idx
    np.add.at(want, tuple(grids), dout.astype(np.float64))
    assert_close(ops.gather_backward(g(dout), dim, g(idx), x_shape), want, ref.tol(dtype), name="gather backward")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("idx_shape, inplace", [((5, 20, 4), False), ((3, 10, 2), True)])
def test_scatter_add(idx_shape, inplace, dtype, rng):
    x = rng.standard_normal((5, 8, 4)).astype(dtype)
    idx = rng.integers(0, 8, idx_shape)  # many duplicates: the atomics are exercised
    src = rng.standard_normal((6, 21, 4)).astype(dtype)
    gx = g(x)
    out = ops.scatter_add(gx, 1, g(idx), g(src), inplace=inplace)
    assert (out is gx) == inplace
    want = x.astype(np.float64)
    grids = list(np.indices(idx_shape))
    grids[1] = idx
    np.add.at(want, tuple(grids), src[_region(idx_shape, -1)].astype(np.float64))
    assert_close(out, want, ref.tol(dtype), name="scatter_add")
    if not inplace:
        np.testing.assert_array_equal(gx.get(), x)


@gpu
def test_index_errors():
    x = cp.ones((3, 4), cp.float32)
    with pytest.raises(RuntimeError, match="out of bounds for dimension 1 with size 4"):
        ops.gather(x, 1, g(np.array([[0, 4]])))
        device_checks.raise_pending()   # (found on the GPU, raised at the check)
    with pytest.raises(RuntimeError, match="int64"):
        ops.gather(x, 1, cp.zeros((3, 1), cp.int32))
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        ops.gather(x, 1, cp.zeros(3, cp.int64))
    with pytest.raises(IndexError, match="Dimension out of range"):
        ops.gather(x, 2, cp.zeros((3, 1), cp.int64))
    with pytest.raises(RuntimeError, match="dtype"):
        ops.scatter_add(x, 0, cp.zeros((1, 4), cp.int64), cp.ones((1, 4), cp.float64))
    out = ops.gather(x, 1, g(np.array([[0, 7]])), check_bounds=False).get()
    assert out[0, 0] == 1 and np.isnan(out[0, 1])


@gpu
def test_copy_many_copies_every_pair_in_launches_of_four(rng):
    """Six copies, so two launches: float32 and int64 arrays, sizes with a tail of fewer than 16 bytes, bytes at an
    odd offset (no 16-byte vectors there), an empty pair and NaNs with payloads: each destination equals its source
    bit for bit, and the bytes around the offset one stay as they were."""
    from smalltrain.backend.cuda import index
    nan_bits = np.array([0x7FC00001, 0xFFFFFFFF, 0x7F800001], np.uint32).view(np.float32)
    raw_src = g(rng.integers(0, 256, 1001).astype(np.uint8))
    raw_dst = cp.zeros(1001, np.uint8)
    srcs = [g(rng.standard_normal((64, 1, 28, 28)).astype(np.float32)), g(rng.integers(0, 10, 64)), g(nan_bits),
            raw_src[1:], g(np.zeros(0)), g(rng.standard_normal(33))]
    dsts = [cp.zeros(s.shape, s.dtype) for s in srcs[:3]] + [raw_dst[1:]] + \
        [cp.zeros(s.shape, s.dtype) for s in srcs[4:]]
    index.copy_many(list(zip(dsts, srcs)))
    for d, s in zip(dsts, srcs):
        np.testing.assert_array_equal(d.view(np.uint8).get(), s.view(np.uint8).get())
    assert int(raw_dst[0]) == 0


@gpu
def test_copy_many_errors():
    from smalltrain.backend.cuda import index
    a = cp.zeros((4, 4), np.float32)
    with pytest.raises(RuntimeError, match=r"expected C-contiguous arrays, got src\[0\] of shape \[4, 2\]"):
        index.copy_many([(cp.zeros((4, 2), np.float32), a[:, ::2])])
    with pytest.raises(RuntimeError, match=r"dst\[1\] and src\[1\] of the same size in bytes, got 64 and 32"):
        index.copy_many([(a, a.copy()), (a, cp.zeros(4, np.float64))])
    with pytest.raises(TypeError, match=r"expected src\[0\] to be a cupy.ndarray on a CUDA device, got ndarray"):
        index.copy_many([(a, np.zeros((4, 4), np.float32))])
    assert index.copy_many([(a, a.copy() + 1)], updatable=True) is None   # outside a capture: nothing launched
    assert float(a.sum()) == 0


@gpu
def test_copy_many_as_graph_nodes_copies_the_sources_each_replay_was_given(rng):
    """copy_many(updatable=True) captured at a graph's head: five pairs, so two nodes; before each replay
    copy_sources sets new sources (a float32 batch, int64 targets, bytes at an odd offset, float64 values, an empty
    pair) or None (nothing copied into that slot). Each replay's destinations equal its own sources bit for bit;
    three replays queued without a sync add their own batches into an accumulator."""
    from smalltrain.backend.cuda import graphs, index

    def sources():
        raw = g(rng.integers(0, 256, 1001).astype(np.uint8))
        return [g(rng.standard_normal((64, 1, 28, 28)).astype(np.float32)), g(rng.integers(0, 10, 64)), raw[1:],
                g(rng.standard_normal(33)), g(np.zeros(0))]
    first = sources()
    raw_dst = cp.zeros(1001, np.uint8)
    dsts = [cp.zeros_like(s) for s in first[:2]] + [raw_dst[1:]] + [cp.zeros_like(s) for s in first[3:]]
    acc = cp.zeros_like(dsts[0])
    cuda_graph = graphs.CUDAGraph()
    with graphs.graph(cuda_graph):
        nodes = index.copy_many([(d, d) for d in dsts], updatable=True)
        with pytest.raises(RuntimeError, match="capture has not ended"):
            index.copy_sources(nodes[0], first[:4])
        acc += dsts[0]
    assert len(nodes) == 2
    before = [d.copy() for d in dsts]
    for srcs, skip in ((first, None), (sources(), 2), (sources(), 0)):
        given = [None if k == skip else s for k, s in enumerate(srcs)]
        index.copy_sources(nodes[0], given[:4])
        index.copy_sources(nodes[1], given[4:])
        cuda_graph.replay()
        cp.cuda.get_current_stream().synchronize()
        for k, (d, s) in enumerate(zip(dsts, given)):
            want = before[k] if s is None else s
            np.testing.assert_array_equal(d.view(np.uint8).get(), want.view(np.uint8).get())
        before = [d.copy() for d in dsts]
        assert int(raw_dst[0]) == 0
    acc[...] = 0
    batches = [sources() for _ in range(3)]
    for srcs in batches:
        index.copy_sources(nodes[0], srcs[:4])
        cuda_graph.replay()
    np.testing.assert_array_equal(acc.get(), sum(b[0] for b in batches).get())
