"""Optimizers and learning-rate schedulers with torch.optim's names, arguments, state_dict format and update order."""
from . import lr_scheduler
from .adadelta import Adadelta
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .adamax import Adamax
from .nadam import NAdam
from .optimizer import Optimizer
from .radam import RAdam
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = ["SGD", "Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "NAdam", "Optimizer", "RAdam", "RMSprop",
           "lr_scheduler"]
