"""`smalltrain.datasets`, in place of torchvision.datasets: MNIST (bundled), FashionMNIST (downloaded), and the
IDX reader/writer they are built on."""
from .idx import IdxFormatError, read_idx, write_idx
from .mnist import MNIST, DatasetNotFoundError, FashionMNIST

__all__ = ["MNIST", "DatasetNotFoundError", "FashionMNIST", "IdxFormatError", "read_idx", "write_idx"]
