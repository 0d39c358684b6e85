"""torchvision.transforms.functional's geometric subset on arrays: pad, crop, hflip, and affine/rotate by inverse
mapping with nearest or bilinear sampling (torchvision's matrices and its grid_sample(align_corners=False) pixel
convention, so results match torchvision's tensor backend).

Every function here works on a batch: arrays [N, C, H, W] (NumPy or CuPy), and `affine` takes one inverse matrix
per sample, so a whole batch with its own parameters per sample is one vectorized call.
"""
import math

import numpy as np

from ..backend import get_array_module

PADDING_MODES = ("constant", "edge", "reflect", "symmetric")


def parse_padding(padding):
    """torchvision's padding forms: int (all sides), (lr, tb), or (left, top, right, bottom)."""
    if isinstance(padding, (int, np.integer)):
        padding = [int(padding)]
    padding = [int(p) for p in padding]
    if len(padding) not in (1, 2, 4):
        raise ValueError(f"Padding must be an int or a 1, 2, or 4 element tuple, not a {len(padding)} element tuple")
    if len(padding) == 1:
        return padding * 4
    if len(padding) == 2:
        return [padding[0], padding[1], padding[0], padding[1]]
    return padding


def pad(batch, padding, fill=0, padding_mode="constant"):
    """Pad the last two dims of [N, C, H, W]: padding (left, top, right, bottom), as torchvision's F.pad."""
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"Padding mode should be either constant, edge, reflect or symmetric, got {padding_mode!r}")
    left, top, right, bottom = parse_padding(padding)
    if min(left, top, right, bottom) < 0:
        raise ValueError(f"pad: negative padding {padding} is not supported")
    xp = get_array_module(batch)
    widths = [(0, 0)] * (batch.ndim - 2) + [(top, bottom), (left, right)]
    if padding_mode == "constant":
        return xp.pad(batch, widths, mode="constant", constant_values=fill)
    return xp.pad(batch, widths, mode=padding_mode)


def crop_each(batch, top, left, height, width):
    """Crop sample k of [N, C, H, W] at (top[k], left[k]) to height x width, in one gather."""
    xp = get_array_module(batch)
    n = batch.shape[0]
    rows = xp.asarray(top)[:, None] + xp.arange(height)[None, :]      # [N, h]
    cols = xp.asarray(left)[:, None] + xp.arange(width)[None, :]      # [N, w]
    out = batch[xp.arange(n)[:, None, None], :, rows[:, :, None], cols[:, None, :]]   # [N, h, w, C]
    return xp.ascontiguousarray(xp.moveaxis(out, -1, 1))


def hflip_where(batch, flip):
    """Mirror left-right the samples of [N, C, H, W] where flip[k] is True."""
    xp = get_array_module(batch)
    flip = xp.asarray(flip).reshape((-1,) + (1,) * (batch.ndim - 1))
    return xp.where(flip, batch[..., ::-1], batch)


def inverse_affine_matrix(angle, translate, scale, shear, center=(0.0, 0.0)):
    """torchvision's _get_inverse_affine_matrix: output pixel (centered coords) -> input pixel, as 6 numbers."""
    rot = math.radians(angle)
    sx, sy = math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [v / scale for v in (d, -b, 0.0, -c, a, 0.0)]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return m


def affine(batch, matrices, interpolation="nearest", fill=0):
    """Warp [N, C, H, W] by per-sample inverse matrices [N, 6] (torchvision's, centered pixel coordinates).

    Pixels that map outside the input take `fill` (a number or one per channel); bilinear blends toward it at the
    border as torchvision does (a mask channel sampled alongside). uint8 input is rounded back to uint8.
    """
    if interpolation not in ("nearest", "bilinear"):
        raise ValueError(f"affine: interpolation must be 'nearest' or 'bilinear', got {interpolation!r}")
    xp = get_array_module(batch)
    n, c, h, w = batch.shape
    m = xp.asarray(np.asarray(matrices, dtype=np.float64).reshape(n, 6))
    yc = xp.arange(h, dtype=np.float64)[:, None] - (h - 1) / 2    # output pixel centres, image centre at 0
    xc = xp.arange(w, dtype=np.float64)[None, :] - (w - 1) / 2
    sx = m[:, 0, None, None] * xc + m[:, 1, None, None] * yc + m[:, 2, None, None] + (w - 1) / 2   # [N, H, W]
    sy = m[:, 3, None, None] * xc + m[:, 4, None, None] * yc + m[:, 5, None, None] + (h - 1) / 2
    src = batch.astype(np.float64 if batch.dtype == np.float64 else np.float32, copy=False)
    fill_v = xp.asarray(np.broadcast_to(np.asarray(fill, dtype=src.dtype).reshape(-1), (c,)))[None, :, None, None]
    if interpolation == "nearest":
        ix, iy = xp.rint(sx).astype(np.int64), xp.rint(sy).astype(np.int64)
        inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
        picked = _gather(src, xp.clip(iy, 0, h - 1), xp.clip(ix, 0, w - 1))
        out = xp.where(inside[:, None], picked, fill_v)
    else:
        x0, y0 = xp.floor(sx), xp.floor(sy)
        out = xp.zeros(src.shape, src.dtype)
        mask = xp.zeros((n, 1, h, w), src.dtype)
        for dy in (0, 1):
            for dx in (0, 1):
                ix, iy = x0 + dx, y0 + dy
                wgt = ((1 - xp.abs(sx - ix)) * (1 - xp.abs(sy - iy))).astype(src.dtype)
                inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
                wgt = xp.where(inside, wgt, 0)[:, None]
                ii, jj = xp.clip(iy, 0, h - 1).astype(np.int64), xp.clip(ix, 0, w - 1).astype(np.int64)
                out += wgt * _gather(src, ii, jj)
                mask += wgt
        out = out * mask + (1 - mask) * fill_v
    if batch.dtype == np.uint8:
        return xp.clip(xp.rint(out), 0, 255).astype(np.uint8)
    return out.astype(batch.dtype, copy=False)


def _gather(src, rows, cols):
    """src[k, :, rows[k], cols[k]] for every sample k: [N, C, H, W] from per-sample [N, H, W] index maps."""
    xp = get_array_module(src)
    n = src.shape[0]
    out = src[xp.arange(n)[:, None, None], :, rows, cols]   # [N, H, W, C]
    return xp.moveaxis(out, -1, 1)
