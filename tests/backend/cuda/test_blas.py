"""Direct cuBLAS calls (backend/cuda/blas.py): every operand layout against float64 NumPy, and capture in a graph.
The CUDA tests' float32 tolerances assume full float32 GEMMs: test_tf32_is_off fails where CUPY_TF32 is set."""
import os

import numpy as np
import pytest

import smalltrain

pytestmark = pytest.mark.skipif(not smalltrain.cuda.is_available(), reason="no CUDA device")


def test_tf32_is_off():
    assert os.environ.get("CUPY_TF32", "0") == "0", "CUPY_TF32=1 makes cupy.matmul round float32 inputs to TF32 " \
        "(~1e-3 relative error); unset it for these 1e-5 checks"


def _cp():
    from smalltrain.backend.cuda import cupy
    return cupy()


def _views(rng, shape, dtype, how):
    """A device view of the given logical shape laid out as `how`: row-major, transposed, or a strided slice."""
    cp = _cp()
    if how == "row":
        host = rng.standard_normal(shape)
        return cp.asarray(host.astype(dtype)), host
    if how == "col":   # the transpose of a row-major array of the reversed trailing shape
        host = rng.standard_normal(shape[:-2] + shape[-2:][::-1])
        return cp.asarray(host.astype(dtype)).swapaxes(-1, -2), host.swapaxes(-1, -2)
    host = rng.standard_normal(shape[:-1] + (shape[-1] * 2,))   # every other column: needs a copy
    return cp.asarray(host.astype(dtype))[..., ::2], host[..., ::2]


CASES = [((5, 7), (7, 3)), ((1, 9), (9, 4)), ((6, 1), (1, 8)), ((4, 5, 6), (6, 2)), ((3, 6), (4, 6, 5)),
         ((4, 2, 3), (4, 3, 5)), ((1, 2, 3), (4, 3, 5)), ((64, 256), (256, 120))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("la", ["row", "col", "strided"])
@pytest.mark.parametrize("lb", ["row", "col", "strided"])
@pytest.mark.parametrize("shapes", CASES, ids=str)
def test_gemm_matches_numpy(shapes, la, lb, dtype):
    from smalltrain.backend.cuda import blas
    rng = np.random.default_rng(hash((shapes, la, lb)) % 2 ** 32)
    a, ha = _views(rng, shapes[0], dtype, la)
    b, hb = _views(rng, shapes[1], dtype, lb)
    assert blas.supported(a, b)
    out = blas.gemm(a, b)
    want = np.matmul(ha, hb)
    assert out.shape == want.shape and out.dtype == dtype
    tol = 1e-5 if dtype == np.float32 else 1e-12
    err = np.abs(out.get() - want).max() / max(np.abs(want).max(), 1e-30)
    assert err <= tol, f"relative error {err:.2e}"


def test_gemm_beta_accumulates_and_empty_shapes():
    from smalltrain.backend.cuda import blas
    cp = _cp()
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    c = rng.standard_normal((3, 5))
    out = cp.asarray(c)
    blas.gemm(cp.asarray(a), cp.asarray(b), out=out, beta=1.0)
    np.testing.assert_allclose(out.get(), c + a @ b, rtol=1e-12)
    zero_k = blas.gemm(cp.zeros((3, 0)), cp.zeros((0, 5)))
    assert zero_k.shape == (3, 5) and float(abs(zero_k).max()) == 0.0
    assert blas.gemm(cp.zeros((0, 4)), cp.zeros((4, 5))).shape == (0, 5)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("shape", [(64, 10), (6, 73728), (1, 5), (300000, 3)])
def test_sum_rows_matches_numpy(shape, axis):
    from smalltrain.backend.cuda import blas
    rng = np.random.default_rng(2)
    host = rng.standard_normal(shape).astype(np.float32)
    got = blas.sum_rows(_cp().asarray(host), axis).get()
    want = host.astype(np.float64).sum(axis=axis)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(shape[axis]))


def test_gemm_is_captured_and_replayed_in_a_cuda_graph():
    """CuPy's own matmul raises during capture; ours must record the GEMM and recompute it on every replay."""
    from smalltrain.backend.cuda import blas
    cp = _cp()
    rng = np.random.default_rng(3)
    a = cp.asarray(rng.standard_normal((32, 16)).astype(np.float32))
    b = cp.asarray(rng.standard_normal((16, 8)).astype(np.float32))
    g = cp.asarray(rng.standard_normal((32, 8)).astype(np.float32))
    blas.gemm(a, b)        # warm-up outside the capture: handle creation
    blas.sum_rows(g, 0)
    cp.cuda.Device().synchronize()  # the non-blocking stream below does not wait for the null-stream work above
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out = blas.gemm(a, b)
        db = blas.sum_rows(g, 0)
        graph = stream.end_capture()
        for _ in range(2):
            a[...] = cp.asarray(rng.standard_normal((32, 16)).astype(np.float32))
            g[...] = cp.asarray(rng.standard_normal((32, 8)).astype(np.float32))
            graph.launch(stream)
            stream.synchronize()
            np.testing.assert_allclose(out.get(), a.get().astype(np.float64) @ b.get(), rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(db.get(), g.get().astype(np.float64).sum(0), rtol=1e-4, atol=1e-4)
