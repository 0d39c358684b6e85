"""The layers of smalltrain.nn, one family per file as in torch.nn.modules."""
from .activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from .activation import ELU, Hardswish
from .batchnorm import BatchNorm1d, BatchNorm2d
from .container import ModuleDict, ModuleList, Sequential
from .conv import Conv2d
from .dropout import Dropout
from .dropout import Dropout1d, Dropout2d
from .flatten import Flatten, Unflatten
from .linear import Identity, Linear
from .loss import CrossEntropyLoss, L1Loss, MSELoss, NLLLoss
from .loss import BCELoss, BCEWithLogitsLoss, HuberLoss, KLDivLoss, SmoothL1Loss
from .normalization import LayerNorm
from .pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from .pooling import AdaptiveMaxPool2d, AvgPool1d, MaxPool1d
from .sparse import Embedding

__all__ = [
           "GELU",
           "AdaptiveAvgPool2d",
           "AvgPool2d",
           "BatchNorm1d",
           "BatchNorm2d",
           "Conv2d",
           "CrossEntropyLoss",
           "Dropout",
           "Flatten",
           "Identity",
           "L1Loss",
           "LeakyReLU",
           "Linear",
           "LogSoftmax",
           "MSELoss",
           "MaxPool2d",
           "ModuleDict",
           "ModuleList",
           "NLLLoss",
           "ReLU",
           "Sequential",
           "SiLU",
           "Sigmoid",
           "Softmax",
           "Tanh",
           "Unflatten",
]
__all__ += ["AdaptiveMaxPool2d", "AvgPool1d", "BCELoss", "BCEWithLogitsLoss", "Dropout1d", "Dropout2d", "ELU",
            "Embedding", "Hardswish", "HuberLoss", "KLDivLoss", "LayerNorm", "MaxPool1d", "SmoothL1Loss"]
