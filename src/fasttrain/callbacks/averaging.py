"""Averaged weights: an exponential moving average (EMA) or an equal average (SWA) of the
weights after each optimizer step, on Lightning's EMAWeightAveraging / WeightAveraging.

    python train.py callbacks/averaging=ema callbacks.averaging.decay=0.998
    python train.py callbacks/averaging=swa callbacks.averaging.start_step=2000

Validation runs on the averaged weights, so the task's validation metrics, the best checkpoint
and the test after fit are the average's; checkpoints hold the average in `state_dict` (what
evaluate, export and predict load) and the raw weights in `current_model_state`, with the
average's count in `averaging_state`, so a resume continues both exactly.

What this adds to Lightning's callbacks:
- no device-to-host sync per update: torch's AveragedModel reads its step counter `n_averaged`
  (a device tensor) on the host at every update (`bool(n_averaged == 0)`); `Average` keeps the
  count on the host as well and reads the tensor once, when a checkpoint is loaded;
- the average lives on the model's device (Lightning builds it in `setup`, before the model is
  moved, and keeps it on the CPU: a device-to-host copy of every weight at every update) and in
  the precision it was built in (fp32 under bf16-true, where an EMA step of 1e-3 would round
  away);
- until the first update (`start_step`), validation and checkpoints use the weights as they are;
- after fit the model holds the average and a checkpoint saved then still records the raw
  weights to resume from; a test/validate/predict stage that loads a checkpoint keeps its
  averaged `state_dict` (Lightning would load the raw weights over it).
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EMAWeightAveraging, WeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn, get_swa_multi_avg_fn

from fasttrain.config.domains import AtLeast, Range, check_arguments


class Average(AveragedModel):
    """AveragedModel of parameters and buffers (use_buffers) with the count on the host too.

    `decay`: EMA (avg <- avg + (1 - decay) * (w - avg)); None: the equal average of every
    update (avg <- avg + (w - avg) / (n + 1)). The first update copies the weights.
    """

    def __init__(self, model: torch.nn.Module, decay: float | None) -> None:
        multi = get_swa_multi_avg_fn() if decay is None else get_ema_multi_avg_fn(decay)
        super().__init__(model, multi_avg_fn=multi, use_buffers=True)
        self.count = 0  # == n_averaged, on the host
        self.register_load_state_dict_post_hook(_recount)

    def tensors(self, model: torch.nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        """(name, averaged, current) of each parameter, then each buffer (BatchNorm statistics):
        the AveragedModel is a deep copy of `model`, so the orders match."""
        mine = itertools.chain(self.module.parameters(), self.module.buffers())
        theirs = itertools.chain(model.named_parameters(), model.named_buffers())
        return [(n, a.detach(), b.detach()) for a, (n, b) in zip(mine, theirs, strict=True)]

    @torch.no_grad()
    def update_parameters(self, model: torch.nn.Module) -> None:
        groups: dict[tuple[torch.device, torch.dtype], tuple[list[Any], list[Any]]] = {}
        for _, avg, cur in self.tensors(model):
            if self.count == 0 or not avg.is_floating_point():
                avg.copy_(cur)  # the first update; integer buffers (BatchNorm's step count)
            else:
                mine, theirs = groups.setdefault((avg.device, avg.dtype), ([], []))
                mine.append(avg)
                theirs.append(cur.to(avg.dtype))  # a bf16-true model into its fp32 average
        assert self.multi_avg_fn is not None
        for mine, theirs in groups.values():
            self.multi_avg_fn(mine, theirs, self.count)  # a host int: no sync
        self.n_averaged += 1  # on the device, no sync; what a checkpoint stores
        self.count += 1


def _recount(module: torch.nn.Module, incompatible: Any) -> None:
    """After load_state_dict: the host count from the loaded tensor (the one read of it)."""
    assert isinstance(module, Average)
    module.count = int(module.n_averaged)


class _Averaging(WeightAveraging):
    """What EMA and SWA share: see the module doc."""

    decay: float | None = None
    _average_model: Average | None
    # The raw weights by name while the model holds the average (validation, after fit).
    _raw: dict[str, torch.Tensor] | None = None
    _after_fit = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == TrainerFn.FITTING:
            # A second fit (the OOM fallback's retry) goes on from the raw weights, not from an
            # average left in the model by the first.
            self._use_raw(pl_module)
            # Built here (a resume loads into it before the model moves to its device)...
            self._average_model = Average(pl_module, self.decay)
            self._raw, self._after_fit = None, False

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # ...and moved once the model is on its device; dtype kept (fp32 under bf16-true).
        assert self._average_model is not None
        self._average_model.to(device=pl_module.device)

    def _averaging(self) -> bool:
        return self._average_model is not None and self._average_model.count > 0

    def _use_average(self, pl_module: L.LightningModule) -> None:
        """Put the average into the model, the raw weights aside (the average stays as it is:
        a swap would round an fp32 average to a bf16 model's precision at every validation)."""
        if not self._averaging() or self._raw is not None:
            return
        assert self._average_model is not None
        tensors = self._average_model.tensors(pl_module)
        self._raw = {name: cur.clone() for name, _, cur in tensors}
        for _, avg, cur in tensors:
            cur.copy_(avg)

    def _use_raw(self, pl_module: L.LightningModule) -> None:
        if self._raw is None:
            return
        assert self._average_model is not None
        for name, _, cur in self._average_model.tensors(pl_module):
            cur.copy_(self._raw[name])
        self._raw = None

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._use_average(pl_module)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._after_fit:  # a trainer.validate after fit: the model keeps the average
            self._use_raw(pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The raw weights stay aside for a checkpoint saved after this (the last one,
        # fasttrain.checkpoints.state.ResumeState), to resume from.
        self._use_average(pl_module)
        self._after_fit = True

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        average = self._average_model
        if average is None:
            return  # outside fit: the weights as they are
        state = average.state_dict()
        checkpoint["averaging_state"] = {"n_averaged": state["n_averaged"]}
        weights = checkpoint["state_dict"]
        raw = self._raw
        checkpoint["current_model_state"] = weights if raw is None else {
            name: raw.get(name, value) for name, value in weights.items()
        }  # fmt: skip
        if self._averaging():  # before the first update the weights are their own average
            checkpoint["state_dict"] = {
                k.removeprefix("module."): v for k, v in state.items() if k != "n_averaged"
            }

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Only a resumed fit restores the raw weights and the average; test/validate/predict
        # keep the averaged state_dict that Lightning has just loaded.
        if self._average_model is not None and trainer.state.fn == TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)


StartStep = Annotated[int, AtLeast(0)]
EveryNSteps = Annotated[int, AtLeast(1)]


class EMA(_Averaging, EMAWeightAveraging):
    """Exponential moving average of the weights.

    Args:
        decay: weight of the old average per update, in (0, 1): 0.999 averages over ~1,000
            updates, 0.9999 over ~10,000 (long runs).
        start_step: first optimizer step (0-based) that updates the average; before it,
            validation and checkpoints use the weights as they are.
        every_n_steps: update after every N-th optimizer step (steps divisible by N); the decay
            applies per update.
    """

    def __init__(
        self,
        decay: Annotated[float, Range(0, 1, low_open=True, high_open=True)] = 0.999,
        start_step: StartStep = 0,
        every_n_steps: EveryNSteps = 1,
    ) -> None:
        check_arguments(EMA.__init__, locals())
        super().__init__(
            decay=decay, update_every_n_steps=every_n_steps, update_starting_at_step=start_step
        )
        self.decay = decay


class SWA(_Averaging):
    """Equal average of the weights from `start_step` on (stochastic weight averaging).

    Args:
        start_step: first optimizer step (0-based) that enters the average: typically late in
            training, once the loss has plateaued; before it, validation and checkpoints use the
            weights as they are.
        every_n_steps: average after every N-th optimizer step (steps divisible by N), e.g.
            once per epoch's worth of steps.
    """

    def __init__(self, start_step: StartStep = 0, every_n_steps: EveryNSteps = 1) -> None:
        check_arguments(SWA.__init__, locals())
        super().__init__()
        self.start_step, self.every_n_steps = start_step, every_n_steps

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return (
            step_idx is not None
            and step_idx >= self.start_step
            and (step_idx % self.every_n_steps == 0)
        )
