"""The weight gradients from x (backend/cuda/conv/wgrad.py: tile_wgrad and the choice among the kernels) and
wgrad_reduce's fixed order. Skips without CuPy or a GPU (or the emulator)."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
import smalltrain  # noqa: E402

if not smalltrain.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)


from smalltrain.backend.cuda import conv as conv_kernels  # noqa: E402
from smalltrain.backend.cuda import ops  # noqa: E402
from smalltrain.backend.cuda.conv import wgrad as conv_wgrad  # noqa: E402
from conv_cases import (DTYPES, TILE_CASES, _check_weight_grads, _pads,  # noqa: E402
                        g)


@pytest.mark.parametrize("plan", ["as planned", "4 channels", "8 channels", "rows split", "one block, 2-row tiles"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TILE_CASES)
def test_tile_wgrad(case, dtype, plan, rng, tune):
    """tile_wgrad's dw and db (and no db without a bias) against the float64 reference on tile_conv's cases, as
    planned and with each choice forced: 4 or 8 channels per thread, the rows of a tile split over 3 thread groups
    (their sums added at the end), one block walking every tile of 2 rows through both staging buffers (the last
    tile of an odd row count partial). The bias is summed by bias threads, or by slices of the other threads where
    that saves a warp (MnistCnn's second layer), and rows are staged 16 or 8 bytes a copy where aligned, an element
    a copy elsewhere (13-wide rows)."""
    shape, o, ks, padding, activation, bias = case
    if plan == "4 channels":
        tune(tile_wg_to8_threads=1 << 30)
    if plan == "8 channels":
        tune(tile_wg_to8_threads=0)
    if plan == "rows split":
        tune(tile_wg_rows=6)
        tune(tile_wg_split=3)
    if plan.endswith("one block, 2-row tiles"):
        tune(tile_wg_rows=2)
        tune(tile_wg_grid=1)
    x = rng.standard_normal(shape).astype(dtype)
    w = (rng.standard_normal((o, shape[1], ks, ks)) * 0.5).astype(dtype)
    b = rng.standard_normal(o).astype(dtype) if bias else None
    _, saved = ops.conv2d_forward(g(x), g(w), None if b is None else g(b), 1, padding, 1, 1, activation)
    tile = conv_wgrad.tile_wgrad_plan(saved, np.dtype(dtype).itemsize)
    if tile is None:   # only MnistCnn's second layer at 4 channels a thread: 8 x 49 threads, over a block's 256
        assert plan == "4 channels" and -(-o // 4) * (shape[1] * ks + 1) > 256
        return
    to, th, rs, threads, grid, _, wb = tile
    assert plan not in ("4 channels", "8 channels") or to == int(plan[0])
    # no bias threads where that saves a warp: MnistCnn's second layer as planned, 4 x 48 threads for 4 x (48 + 1)
    assert plan != "as planned" or shape != (4, 16, 26, 26) or wb == 0
    # the forced split where 3 row groups fit in a block (threads, and their sums in shared memory)
    base, itemsize = threads // rs, np.dtype(dtype).itemsize
    split_fits = 3 * base <= 256 and 3 * base * to * ks * itemsize <= 48 * 1024
    assert plan != "rows split" or (th <= 6 and (rs == 3) == split_fits)
    assert not plan.endswith("one block, 2-row tiles") or (grid == 1 and th <= 2)
    assert conv_wgrad.wgrad_kernel(saved, np.dtype(dtype).itemsize) == "tile"
    _check_weight_grads(x, w, b, saved, ((1, 1), _pads(padding, (ks, ks), (1, 1)), (1, 1), 1), activation, rng)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tile_wgrad_stages_vectors_where_aligned(dtype, rng, monkeypatch):
    """tile_wgrad's bytes a copy (copy_bytes): MnistCnn's second layer's g rows (24 wide) 16 bytes a copy, its x rows
    (26 wide) 8 in float32 and 16 in float64; 13-wide rows one element (its itemsize). test_tile_wgrad checks the
    gradients of these cases."""
    widths = []
    real = conv_wgrad.copy_bytes
    monkeypatch.setattr(conv_wgrad, "copy_bytes", lambda *a: widths.append(real(*a)) or widths[-1])
    for shape, o, ks, padding, activation, bias in TILE_CASES:
        x = g(rng.standard_normal(shape).astype(dtype))
        w = g((rng.standard_normal((o, shape[1], ks, ks)) * 0.5).astype(dtype))
        b = g(rng.standard_normal(o).astype(dtype)) if bias else None
        out, saved = ops.conv2d_forward(x, w, b, 1, padding, 1, 1, activation)
        plan = conv_wgrad.tile_wgrad_plan(saved, np.dtype(dtype).itemsize)
        if plan is None:
            continue
        n, _, ho, wo = out.shape
        grad = g(rng.standard_normal((o, n * ho * wo)).astype(dtype))   # the output's g, [O, N*P]
        widths.clear()
        conv_wgrad.tile_weight_grad(x, grad, saved, bias, plan)
        assert len(widths) == 2, widths   # g's, then x's
        if shape == (4, 16, 26, 26):
            assert widths == [16, 8 if dtype == np.float32 else 16]
        if shape[3] == 13:
            assert widths == [np.dtype(dtype).itemsize] * 2


def test_tile_wgrad_is_bit_repeatable(rng):
    """A fixed tile order per block and a fixed reduction: the same bits on every call (MnistCnn's second layer)."""
    x = cp.asarray(rng.standard_normal((8, 16, 26, 26)), dtype=cp.float32)
    w = cp.asarray(rng.standard_normal((32, 16, 3, 3)), dtype=cp.float32)
    out, saved = ops.conv2d_forward(x, w, cp.zeros(32, dtype=cp.float32), activation="relu")
    dout = cp.asarray(rng.standard_normal(out.shape), dtype=cp.float32)
    assert conv_wgrad.wgrad_kernel(saved, 4) == "tile"
    first = ops.conv2d_backward(dout, saved)
    for _ in range(3):
        again = ops.conv2d_backward(dout, saved)
        assert all(bool(cp.array_equal(a, b)) for a, b in zip(first, again))


@pytest.mark.parametrize("rows", [1, 37, 528, 1100])   # one row; a partial batch; LeNet-5's first layer; 3 batches
def test_wgrad_reduce_sums_the_rows_in_its_fixed_order(rows, rng):
    """wgrad_reduce's sums bit-equal to the order it promises (conv.cu): thread group r adds rows r, r + G, ... in
    order, then the G groups' sums in group order; dw and db split at each channel's K + 1 columns."""
    o, w_shape = 6, (6, 1, 5, 5)
    partial = rng.standard_normal((rows, o * 26)).astype(np.float32)
    dw, db = conv_kernels.reduce_partials(g(partial), g(np.zeros(w_shape, np.float32)), g(np.zeros(o, np.float32)))
    groups = max(1, min(32, -(-rows // conv_kernels.CONV.wr_rows)))
    sums = []
    for r in range(groups):
        acc = np.zeros(o * 26, np.float32)
        for s in range(r, rows, groups):
            acc = acc + partial[s]
        sums.append(acc)
    want = sums[0]
    for extra in sums[1:]:
        want = want + extra
    want = want.reshape(o, 26)
    assert np.array_equal(cp.asnumpy(dw).reshape(o, 25), want[:, :25]) and np.array_equal(cp.asnumpy(db), want[:, 25])
