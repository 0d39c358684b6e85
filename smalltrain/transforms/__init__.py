"""`smalltrain.transforms`, torchvision.transforms' array subset: ToTensor, Normalize, Compose, Lambda
(transforms.py), the random augmentations RandomCrop, RandomHorizontalFlip, RandomRotation, RandomAffine
(augment.py, geometry in functional.py), and apply_batch, the datasets' vectorized path."""
from . import functional
from .augment import RandomAffine, RandomCrop, RandomHorizontalFlip, RandomRotation
from .transforms import Compose, Lambda, Normalize, ToTensor, apply_batch

__all__ = ["Compose", "Lambda", "Normalize", "RandomAffine", "RandomCrop", "RandomHorizontalFlip",
           "RandomRotation", "ToTensor", "apply_batch", "functional"]
