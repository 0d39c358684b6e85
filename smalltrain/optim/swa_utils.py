"""Stochastic weight averaging and exponential moving averages of a model (torch.optim.swa_utils): AveragedModel,
the averaging functions it takes, update_bn to recompute batch-norm statistics for the averaged weights, and the
SWALR schedule that anneals to a constant SWA learning rate."""
import itertools
import math
from copy import deepcopy

from .. import _dtype, creation
from ..autograd import no_grad
from ..nn import Module
from ..nn.modules.batchnorm import _BatchNorm
from ..ops._util import xp_of
from .lr_base import LRScheduler, _format_param
from .optimizer import lerp_

__all__ = ["SWALR", "AveragedModel", "get_ema_avg_fn", "get_ema_multi_avg_fn", "get_swa_avg_fn",
           "get_swa_multi_avg_fn", "update_bn"]


def _check_decay(decay):
    if decay < 0.0 or decay > 1.0:
        raise ValueError(f"Invalid decay value {decay} provided. Please provide a value in [0,1] range.")


def _lerp_all(averaged, current, weight):
    """averaged[i].lerp_(current[i], weight) for each pair of tensors, in place."""
    for a, c in zip(averaged, current):
        xp = xp_of(a.array)
        lerp_(xp, a.array, c.array, weight, xp.empty_like(a.array))


def get_ema_multi_avg_fn(decay=0.999):
    """An in-place update of lists of tensors: ema = lerp(ema, current, 1 - decay)."""
    _check_decay(decay)

    def ema_update(ema_param_list, current_param_list, _):
        if ema_param_list[0].array.dtype.kind == "f":
            _lerp_all(ema_param_list, current_param_list, 1 - decay)
        else:
            for p_ema, p_model in zip(ema_param_list, current_param_list):
                p_ema.copy_(p_ema * decay + p_model * (1 - decay))
    return ema_update


def get_swa_multi_avg_fn():
    """An in-place update of lists of tensors: the running mean over num_averaged + 1 models."""
    def swa_update(averaged_param_list, current_param_list, num_averaged):
        n = int(num_averaged)
        if averaged_param_list[0].array.dtype.kind == "f":
            _lerp_all(averaged_param_list, current_param_list, 1 / (n + 1))
        else:
            for a, c in zip(averaged_param_list, current_param_list):
                a.copy_(a + (c - a) / (n + 1))
    return swa_update


def get_ema_avg_fn(decay=0.999):
    """avg_fn(ema, current, num_averaged) -> decay * ema + (1 - decay) * current."""
    _check_decay(decay)

    def ema_update(ema_param, current_param, num_averaged):
        with no_grad():
            return decay * ema_param + (1 - decay) * current_param
    return ema_update


def get_swa_avg_fn():
    """avg_fn(averaged, current, num_averaged) -> the running mean over num_averaged + 1 models."""
    def swa_update(averaged_param, current_param, num_averaged):
        with no_grad():
            return averaged_param + (current_param - averaged_param) / (num_averaged + 1)
    return swa_update


class AveragedModel(Module):
    """A copy of `model` whose parameters (and buffers, with use_buffers) are averaged over update_parameters(model)
    calls: the running mean (SWA) by default, or avg_fn / multi_avg_fn (e.g. an EMA)."""

    def __init__(self, model, device=None, avg_fn=None, multi_avg_fn=None, use_buffers=False):
        super().__init__()
        if avg_fn is not None and multi_avg_fn is not None:
            raise AssertionError("Only one of avg_fn and multi_avg_fn should be provided")
        self.module = deepcopy(model)
        if device is not None:
            self.module = self.module.to(device)
        self.register_buffer("n_averaged", creation.tensor(0, dtype=_dtype.int64, device=device))
        self.avg_fn = avg_fn
        self.multi_avg_fn = multi_avg_fn
        self.use_buffers = use_buffers

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def update_parameters(self, model):
        """Fold `model`'s current weights into the average (the first call copies them)."""
        with no_grad():
            self._update(model)

    def _update(self, model):
        if self.use_buffers:
            averaged = itertools.chain(self.module.parameters(), self.module.buffers())
            current = itertools.chain(model.parameters(), model.buffers())
        else:
            averaged, current = self.parameters(), model.parameters()
        pairs = [(a.detach(), c.detach().to(a.device)) for a, c in zip(averaged, current)]
        if int(self.n_averaged) == 0:
            for a, c in pairs:
                a.copy_(c)
        elif self.multi_avg_fn is not None:
            for group in _by_device_and_dtype(pairs):
                self.multi_avg_fn([a for a, _ in group], [c for _, c in group], self.n_averaged)
        else:
            # torch's CPU path (its CUDA one lerps, which rounds differently in the last bit)
            avg_fn = self.avg_fn or get_swa_avg_fn()
            for a, c in pairs:
                a.copy_(avg_fn(a, c, self.n_averaged.to(a.device)))
        if not self.use_buffers:   # the buffers follow the source model
            for b_swa, b_model in zip(self.module.buffers(), model.buffers()):
                b_swa.detach().copy_(b_model.detach().to(b_swa.device))
        self.n_averaged += 1


def _by_device_and_dtype(pairs):
    groups = {}
    for a, c in pairs:
        groups.setdefault((str(a.device), a.dtype), []).append((a, c))
    return list(groups.values())


def update_bn(loader, model, device=None):
    """Recompute every batch norm's running statistics as the plain average over one pass of `loader` (its items,
    or their first element, are the model's input)."""
    momenta = {}
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            module.reset_running_stats()
            momenta[module] = module.momentum
    if not momenta:
        return
    was_training = model.training
    model.train()
    for module in momenta:
        module.momentum = None
    with no_grad():
        for batch in loader:
            if isinstance(batch, (list, tuple)):
                batch = batch[0]
            if device is not None:
                batch = batch.to(device)
            model(batch)
    for module, momentum in momenta.items():
        module.momentum = momentum
    model.train(was_training)


class SWALR(LRScheduler):
    """Anneals each group's lr from its value to swa_lr over anneal_epochs ('cos' or 'linear'), then holds it."""

    def __init__(self, optimizer, swa_lr, anneal_epochs=10, anneal_strategy="cos", last_epoch=-1):
        swa_lrs = _format_param("swa_lr", optimizer, swa_lr)
        for lr, group in zip(swa_lrs, optimizer.param_groups):
            group["swa_lr"] = lr
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
        self._set_anneal_func(anneal_strategy)
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"anneal_epochs must be equal or greater than 0, got {anneal_epochs}")
        self.anneal_epochs = anneal_epochs
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _linear_anneal(t):
        return t

    @staticmethod
    def _cosine_anneal(t):
        return (1 - math.cos(math.pi * t)) / 2

    @staticmethod
    def _get_initial_lr(lr, swa_lr, alpha):
        if alpha == 1:
            return swa_lr
        return (lr - alpha * swa_lr) / (1 - alpha)

    def get_lr(self):
        self._warn_get_lr()
        # the lr before this step's annealing is recovered from the current one, so other changes to it carry on
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        prev_t = max(0, min(1, (step - 1) / max(1, self.anneal_epochs)))
        prev_alpha = self.anneal_func(prev_t)
        prev_lrs = [self._get_initial_lr(group["lr"], group["swa_lr"], prev_alpha)
                    for group in self.optimizer.param_groups]
        t = max(0, min(1, step / max(1, self.anneal_epochs)))
        alpha = self.anneal_func(t)
        return [group["swa_lr"] * alpha + lr * (1 - alpha) for group, lr in zip(self.optimizer.param_groups, prev_lrs)]

    def _set_anneal_func(self, anneal_strategy):
        self._anneal_strategy = anneal_strategy
        self.anneal_func = self._cosine_anneal if anneal_strategy == "cos" else self._linear_anneal

    def state_dict(self):
        return {key: value for key, value in self.__dict__.items() if key not in ("optimizer", "anneal_func")}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)
        self._set_anneal_func(self._anneal_strategy)
