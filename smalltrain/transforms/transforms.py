"""torchvision.transforms' basic array subset: ToTensor, Normalize, Compose, Lambda (same arithmetic, same reprs).

There is no PIL here: ToTensor takes the uint8 HxW / HxWxC NumPy arrays a dataset hands out. ToTensor,
Normalize and a Compose of them also have a batched form (`apply_batch`) that datasets use in `__getitems__`.
"""
import numpy as np

from .. import _dtype
from ..backend import get_array_module
from ..tensor import Tensor

__all__ = ["Compose", "Lambda", "Normalize", "ToTensor", "apply_batch"]


class Compose:
    """Apply `transforms` one after another."""

    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img

    def _apply_batch(self, batch):
        layout = "nhwc"   # raw samples until ToTensor makes them [N, C, H, W]
        for t in self.transforms:
            batch = t._apply_batch(batch, layout) if _is_augmentation(t) else t._apply_batch(batch)
            if type(t) is ToTensor:
                layout = "chw"
        return batch

    def _batchable(self):
        return all(_batchable(t) for t in self.transforms)

    def __repr__(self):
        lines = "".join(f"\n    {t}" for t in self.transforms)
        return f"{self.__class__.__name__}({lines}\n)"


class ToTensor:
    """uint8 array HxW or HxWxC -> float Tensor CxHxW in [0, 1] (divided by 255); other dtypes keep their values
    and dtype, as torchvision's ToTensor does for non-uint8 arrays."""

    def __call__(self, pic):
        if not isinstance(pic, np.ndarray):
            raise TypeError(f"pic should be PIL Image or ndarray. Got {type(pic)}")
        if pic.ndim not in (2, 3):
            raise ValueError(f"pic should be 2/3 dimensional. Got {pic.ndim} dimensions.")
        return Tensor._wrap(self._convert(pic[None] if pic.ndim == 2 else pic.transpose(2, 0, 1)))

    def _apply_batch(self, batch):
        """[B, H, W] or [B, H, W, C] -> [B, C, H, W], the same values as ToTensor on each sample."""
        if not isinstance(batch, np.ndarray) or batch.ndim not in (3, 4):
            raise ValueError(f"ToTensor: expected a batch of HxW or HxWxC arrays, got {type(batch).__name__} "
                             f"with shape {getattr(batch, 'shape', None)}")
        return self._convert(batch[:, None] if batch.ndim == 3 else batch.transpose(0, 3, 1, 2))

    @staticmethod
    def _convert(chw):
        if chw.dtype != np.uint8:
            return np.ascontiguousarray(chw)
        dtype = _dtype.to_numpy_dtype(_dtype.get_default_dtype())
        out = np.empty(chw.shape, dtype=dtype)   # one pass: convert into the output, then divide in place
        np.copyto(out, chw, casting="unsafe")
        out /= dtype.type(255)
        return out

    def __repr__(self):
        return f"{self.__class__.__name__}()"


class Normalize:
    """(x - mean) / std per channel of a float Tensor [..., C, H, W], in the Tensor's dtype (torchvision's)."""

    def __init__(self, mean, std, inplace=False):
        self.mean, self.std, self.inplace = mean, std, inplace

    def __call__(self, tensor):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"img should be Tensor Image. Got {type(tensor)}")
        if tensor.ndim < 2:
            raise TypeError("Tensor is not a torch image.")
        if not tensor.is_floating_point():
            raise TypeError(f"Input tensor should be a float tensor. Got {tensor.dtype}.")
        if tensor.ndim < 3:
            raise ValueError("Expected tensor to be a tensor image of size (..., C, H, W). Got tensor.size() = "
                             f"{tensor.size()}")
        out = self._normalize(tensor.array, tensor.array if self.inplace else None)
        return tensor if self.inplace else Tensor._wrap(out)

    def _apply_batch(self, batch):
        return self._normalize(batch, batch)      # the batch is a fresh array: normalizing in place is safe

    def _normalize(self, x, out):
        xp = get_array_module(x)
        mean = xp.asarray(self.mean, dtype=x.dtype)
        std = xp.asarray(self.std, dtype=x.dtype)
        if bool((std == 0).any()):
            raise ValueError(f"std evaluated to zero after conversion to {_dtype.from_numpy_dtype(x.dtype)}, "
                             "leading to division by zero.")
        if mean.ndim == 1:
            mean = mean.reshape(-1, 1, 1)
        if std.ndim == 1:
            std = std.reshape(-1, 1, 1)
        out = xp.subtract(x, mean, out=out)
        return xp.divide(out, std, out=out)

    def __repr__(self):
        return f"{self.__class__.__name__}(mean={self.mean}, std={self.std})"


class Lambda:
    """A user function as a transform."""

    def __init__(self, lambd):
        if not callable(lambd):
            raise TypeError(f"Argument lambd should be callable, got {type(lambd).__name__!r}")
        self.lambd = lambd

    def __call__(self, img):
        return self.lambd(img)

    def __repr__(self):
        return f"{self.__class__.__name__}()"


def _is_augmentation(t):
    from .augment import AUGMENTATIONS
    return type(t) in AUGMENTATIONS


def _batchable(t):
    # exact types only: a subclass may override __call__ and no longer match the batched arithmetic
    if type(t) is Compose:
        return t._batchable()
    return type(t) in (ToTensor, Normalize) or _is_augmentation(t)


def apply_batch(transform, batch):
    """`transform` applied to every sample of `batch` ([B, H, W] or [B, H, W, C] uint8) in one vectorized pass,
    stacked into a Tensor [B, C, H, W]; None when `transform` is not made only of ToTensor/Normalize/Compose and
    the random augmentations (each sample then gets its own random parameters, as per-sample calls would).

    A transform without a ToTensor before any Normalize gets float input, so it is left to the per-sample path.
    """
    if transform is None or not _batchable(transform):
        return None
    steps = transform.transforms if type(transform) is Compose else [transform]
    flat = []
    while steps:
        t, steps = steps[0], steps[1:]
        if type(t) is Compose:
            steps = list(t.transforms) + list(steps)
        else:
            flat.append(t)
    first = next((t for t in flat if not _is_augmentation(t)), None)
    if type(first) is not ToTensor:
        return None
    return Tensor._wrap(transform._apply_batch(batch))
