"""torchvision's random augmentations on arrays and Tensors: RandomCrop, RandomHorizontalFlip, RandomRotation and
RandomAffine, with torchvision's arguments, parameter draws and geometry (transforms/functional.py).

Calling one on an image applies it as torchvision does: an HxW / HxWxC array (what a dataset hands out, in place of
a PIL image) or a Tensor [..., C, H, W] (a leading batch shares one draw, as torchvision's). `per_sample(batch)`
gives every sample of a batch its own draw in one vectorized call; datasets' batched path (apply_batch) uses it.
Random numbers come from smalltrain's global generator (manual_seed) or a `generator=` passed to per_sample.
"""
import numbers

import numpy as np

from .. import random as _random
from ..tensor import Tensor
from . import functional as F


def _pair(value, name):
    """(-v, v) for a number, (lo, hi) for a pair, as torchvision's _setup_angle/shear ranges."""
    if isinstance(value, numbers.Number):
        if value < 0:
            raise ValueError(f"If {name} is a single number, it must be positive.")
        return (-float(value), float(value))
    if len(value) != 2:
        raise ValueError(f"If {name} is a sequence, it must be of len 2.")
    return (float(value[0]), float(value[1]))


def _size(size):
    if isinstance(size, numbers.Number):
        return (int(size), int(size))
    if len(size) == 1:
        return (int(size[0]), int(size[0]))
    if len(size) != 2:
        raise ValueError("Please provide only two dimensions (h, w) for size.")
    return (int(size[0]), int(size[1]))


def _to_nchw(img, layout):
    """The image or batch as [N, C, H, W] and a function turning a result back into the input's form."""
    if isinstance(img, Tensor):
        a = img.array
        if a.ndim < 2:
            raise TypeError(f"Tensor image should have at least 2 dimensions, got {a.ndim}")
        lead = a.shape[:-3] if a.ndim >= 3 else ()
        c = a.shape[-3] if a.ndim >= 3 else 1
        n = int(np.prod(lead)) if lead else 1
        flat = a.reshape((n, c) + a.shape[-2:])
        return flat, lambda out: Tensor._wrap(out.reshape(a.shape[:-2] + out.shape[-2:]))
    if not hasattr(img, "ndim"):
        raise TypeError(f"img should be an ndarray or a Tensor. Got {type(img)}")
    if layout == "chw":                    # a batch after ToTensor: [N, C, H, W]
        return img, lambda out: out
    if img.ndim == 2:                      # one HxW image
        return img[None, None], lambda out: out[0, 0]
    if img.ndim == 3 and layout == "hwc":  # one HxWxC image
        return img.transpose(2, 0, 1)[None], lambda out: out[0].transpose(1, 2, 0)
    if img.ndim == 3:                      # a batch [N, H, W]
        return img[:, None], lambda out: out[:, 0]
    if img.ndim == 4:                      # a batch [N, H, W, C]
        return img.transpose(0, 3, 1, 2), lambda out: out.transpose(0, 2, 3, 1)
    raise ValueError(f"expected an image HxW or HxWxC, got an array of shape {img.shape}")


class _Augmentation:
    """The shared calls: one image (one draw), and per_sample (one draw per sample, vectorized)."""

    def __call__(self, img):
        batch, back = _to_nchw(img, "hwc")
        return back(self._apply(batch, _random.default_generator(), shared=True))

    def per_sample(self, batch, generator=None):
        """Every sample of `batch` (an array [N, H, W] / [N, H, W, C], or a Tensor [N, C, H, W]) transformed with
        its own random parameters, in one call."""
        layout = "chw" if isinstance(batch, Tensor) else "nhwc"
        nchw, back = _to_nchw(batch, layout)
        return back(self._apply(nchw, generator or _random.default_generator(), shared=False))

    def _apply_batch(self, batch, layout="nhwc"):
        """The datasets' batched path: a raw array batch, channel-last before ToTensor, [N, C, H, W] after."""
        nchw, back = _to_nchw(batch, "chw" if layout == "chw" else "nhwc")
        return back(self._apply(nchw, _random.default_generator(), shared=False))

    @staticmethod
    def _count(batch, shared):
        return 1 if shared else batch.shape[0]


class RandomHorizontalFlip(_Augmentation):
    def __init__(self, p=0.5):
        self.p = p

    def _apply(self, batch, rng, shared):
        flip = rng.random(self._count(batch, shared)) < self.p
        if shared:
            return batch[..., ::-1].copy() if flip[0] else batch
        return F.hflip_where(batch, flip)

    def __repr__(self):
        return f"{type(self).__name__}(p={self.p})"


class RandomCrop(_Augmentation):
    """Pad (padding, and pad_if_needed up to size), then crop a random size window (torchvision's order)."""

    def __init__(self, size, padding=None, pad_if_needed=False, fill=0, padding_mode="constant"):
        self.size = _size(size)
        self.padding, self.pad_if_needed, self.fill, self.padding_mode = padding, pad_if_needed, fill, padding_mode
        if padding_mode not in F.PADDING_MODES:
            raise ValueError(f"Padding mode should be either constant, edge, reflect or symmetric, got "
                             f"{padding_mode!r}")
        if padding is not None:
            F.parse_padding(padding)

    def _apply(self, batch, rng, shared):
        if self.padding is not None:
            batch = F.pad(batch, self.padding, self.fill, self.padding_mode)
        th, tw = self.size
        h, w = batch.shape[-2:]
        if self.pad_if_needed and (w < tw or h < th):
            batch = F.pad(batch, [max(tw - w, 0), max(th - h, 0), max(tw - w, 0), max(th - h, 0)], self.fill,
                          self.padding_mode)
            h, w = batch.shape[-2:]
        if h < th or w < tw:
            raise ValueError(f"Required crop size {(th, tw)} is larger than input image size {(h, w)}")
        k = self._count(batch, shared)
        top = rng.integers(0, h - th + 1, size=k)
        left = rng.integers(0, w - tw + 1, size=k)
        if shared:
            return batch[..., top[0]:top[0] + th, left[0]:left[0] + tw]
        return F.crop_each(batch, top, left, th, tw)

    def __repr__(self):
        return f"{type(self).__name__}(size={self.size}, padding={self.padding})"


class RandomAffine(_Augmentation):
    """Rotation (degrees), translation (fractions of width/height, whole pixels), scale and shear, drawn as
    torchvision's RandomAffine.get_params draws them, applied about the image centre."""

    def __init__(self, degrees, translate=None, scale=None, shear=None, interpolation="nearest", fill=0, center=None):
        self.degrees = _pair(degrees, "degrees")
        if translate is not None:
            if len(translate) != 2 or not all(0.0 <= t <= 1.0 for t in translate):
                raise ValueError("translate should be a sequence of length 2 with values between 0 and 1")
        if scale is not None:
            if len(scale) != 2 or any(s <= 0 for s in scale):
                raise ValueError("scale values should be positive")
        if shear is not None:
            shear = _pair(shear, "shear") if isinstance(shear, numbers.Number) or len(shear) == 2 else \
                tuple(float(s) for s in shear)
            if len(shear) not in (2, 4):
                raise ValueError("shear should be a single number or a sequence of length 2 or 4")
        if center is not None:
            raise NotImplementedError("RandomAffine: center= is not supported; transforms turn about the centre")
        self.translate, self.scale, self.shear = translate, scale, shear
        self.interpolation, self.fill = _interpolation(interpolation), fill

    def _draw(self, rng, k, width, height):
        angle = rng.uniform(self.degrees[0], self.degrees[1], k)
        tx = ty = np.zeros(k)
        if self.translate is not None:
            max_dx, max_dy = self.translate[0] * width, self.translate[1] * height
            tx, ty = np.round(rng.uniform(-max_dx, max_dx, k)), np.round(rng.uniform(-max_dy, max_dy, k))
        scale = rng.uniform(self.scale[0], self.scale[1], k) if self.scale is not None else np.ones(k)
        shx = shy = np.zeros(k)
        if self.shear is not None:
            shx = rng.uniform(self.shear[0], self.shear[1], k)
            if len(self.shear) == 4:
                shy = rng.uniform(self.shear[2], self.shear[3], k)
        return angle, tx, ty, scale, shx, shy

    def _apply(self, batch, rng, shared):
        k = self._count(batch, shared)
        angle, tx, ty, scale, shx, shy = self._draw(rng, k, batch.shape[-1], batch.shape[-2])
        mats = [F.inverse_affine_matrix(angle[i], (tx[i], ty[i]), scale[i], (shx[i], shy[i])) for i in range(k)]
        if shared:
            mats = mats * batch.shape[0]
        return F.affine(batch, mats, self.interpolation, self.fill)

    def __repr__(self):
        return f"{type(self).__name__}(degrees={list(self.degrees)}, translate={self.translate}, " \
               f"scale={self.scale}, shear={self.shear})"


class RandomRotation(RandomAffine):
    """Rotate by an angle drawn from degrees, counter-clockwise, about the centre (torchvision's rotate)."""

    def __init__(self, degrees, interpolation="nearest", expand=False, center=None, fill=0):
        if expand:
            raise NotImplementedError("RandomRotation: expand=True is not supported")
        super().__init__(degrees, interpolation=interpolation, fill=fill, center=center)

    def _apply(self, batch, rng, shared):
        k = self._count(batch, shared)
        angle = rng.uniform(self.degrees[0], self.degrees[1], k)
        mats = [F.inverse_affine_matrix(-a, (0.0, 0.0), 1.0, (0.0, 0.0)) for a in angle]   # rotate's sign
        if shared:
            mats = mats * batch.shape[0]
        return F.affine(batch, mats, self.interpolation, self.fill)

    def __repr__(self):
        return f"{type(self).__name__}(degrees={list(self.degrees)}, interpolation={self.interpolation})"


def _interpolation(mode):
    """'nearest'/'bilinear', or torchvision's InterpolationMode-like objects (their .value)."""
    mode = getattr(mode, "value", mode)
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"interpolation must be 'nearest' or 'bilinear', got {mode!r}")
    return mode


AUGMENTATIONS = (RandomCrop, RandomHorizontalFlip, RandomRotation, RandomAffine)
