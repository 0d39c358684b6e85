"""torch.optim.lr_scheduler's namespace: every learning-rate scheduler, by the file of its kind (lr_base: the base
class; lr_schedules: one formula each; lr_cyclic: cycles with momentum; lr_composite: schedulers of schedulers;
lr_plateau: driven by a metric)."""
from .lr_base import EPOCH_DEPRECATION_WARNING, LRScheduler, _LRScheduler  # noqa: F401 (torch's old name)
from .lr_composite import ChainedScheduler, SequentialLR
from .lr_cyclic import CyclicLR, OneCycleLR
from .lr_plateau import ReduceLROnPlateau
from .lr_schedules import (ConstantLR, CosineAnnealingLR, CosineAnnealingWarmRestarts, ExponentialLR, LambdaLR,
                           LinearLR, MultiplicativeLR, MultiStepLR, PolynomialLR, StepLR)


__all__ = [
    "EPOCH_DEPRECATION_WARNING",
    "ChainedScheduler",
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "CyclicLR",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "MultiplicativeLR",
    "OneCycleLR",
    "PolynomialLR",
    "ReduceLROnPlateau",
    "SequentialLR",
    "StepLR",
]
