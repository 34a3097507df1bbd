"""Gradient health: norms to spot exploding/vanishing gradients, and a guard against NaN/inf.

Both run in `on_before_optimizer_step`, which Lightning calls after backward (and after AMP
unscaling) but before gradient clipping: they see the gradients the model really produced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from fasttrain.config.domains import AtLeast, Positive, check_arguments
from fasttrain.config.errors import DivergedError


def layer_names(module: torch.nn.Module, parameters: list[str]) -> list[str]:
    """Parameter names as the per-layer charts show them: the path, plus the owning module's
    type where a container position makes the path alone ambiguous ("net.features.0.weight"
    -> "net.features.0.weight (Conv2d)"; "net.fc.weight" stays)."""
    shown = []
    for name in parameters:
        path = name.rpartition(".")[0]
        if any(part.isdigit() for part in path.split(".")):
            name = f"{name} ({type(module.get_submodule(path)).__name__})"
        shown.append(name)
    return shown


class GradNormMonitor(L.Callback):
    """Logs `grad_norm/total` and, with `per_layer`, `grad_norm_layers/<parameter>` every N
    optimizer steps (a group of their own, so the total is the first card of the Time Series
    page's gradient groups).

    Args:
        every_n_steps: log on optimizer steps that are multiples of this (each costs a device sync).
        norm_type: the p of the p-norm (2.0: Euclidean, the norm clipping uses by default).
        per_layer: also log one norm per parameter tensor, not only the total.
    """

    def __init__(
        self,
        every_n_steps: Annotated[int, AtLeast(1)] = 50,
        norm_type: Annotated[float, Positive] = 2.0,
        per_layer: bool = False,
    ):
        super().__init__()
        check_arguments(GradNormMonitor.__init__, locals())
        self.every_n_steps, self.norm_type, self.per_layer = every_n_steps, norm_type, per_layer

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        # Exactly every N optimizer steps (x = steps completed before this one): written to the
        # loggers here, not through self.log, which Lightning would hold until its own logging
        # step (or drop at an epoch's end).
        if trainer.global_step % self.every_n_steps:
            return
        named = [(n, p.grad) for n, p in pl_module.named_parameters() if p.grad is not None]
        if not named:
            return
        # One fused norm per gradient and one read of them all (the only sync, on these steps).
        norms = torch.stack(torch._foreach_norm([g for _, g in named], self.norm_type))
        total = torch.linalg.vector_norm(norms, self.norm_type)
        values = torch.cat((total[None], norms)).float().tolist() if self.per_layer else [
            float(total)]  # fmt: skip
        logged = {"grad_norm/total": values[0]}
        names = layer_names(pl_module, [n for n, _ in named])
        logged |= {f"grad_norm_layers/{n}": v for n, v in zip(names, values[1:], strict=False)}
        for logger in trainer.loggers:
            logger.log_metrics(logged, step=trainer.global_step)


class NonFiniteGradientError(DivergedError):
    """A gradient held NaN or inf; the message names the step and the first such parameter."""


class NonFiniteGuard(L.Callback):
    """On a NaN/inf gradient: stop (`action=raise`) or skip that optimizer step (`action=skip`).

    The verdict stays on the device: each step computes one fused norm per gradient and keeps
    the step's [parameters] norms in a list; the host reads their finiteness only on logging
    steps (`trainer.log_every_n_steps`), before every checkpoint is written, and at each epoch's
    and the fit's end. So:
    - `raise` may stop up to one logging interval after the bad step, but it names that first
      bad step and parameter, and no checkpoint with weights from that step on is ever written
      (the check runs before every save): `last.ckpt` holds the last finite weights.
    - `skip` never applies a bad step (no moment, weight-decay or step-count update). With a
      fused optimizer (Adam, AdamW, SGD with `model.optimizer.fused=true`, the shipped default)
      the optimizer reads the verdict on the device (`found_inf`, as GradScaler passes it) and
      nothing syncs; with any other the guard reads the verdict every step (one sync) and drops
      the bad step's gradients (`None` gradients are skipped by torch optimizers). Skipped steps
      are counted in `nonfinite/skipped`. Under DDP the gradients are already all-reduced, so
      every rank takes the same decision.

    Args:
        action: "raise" or "skip" (see above).
        max_consecutive_skips: with "skip", this many non-finite steps in a row stop the run: the
            model no longer learns (e.g. fp16 weights that overflow at every step), and a run that
            skips every step would otherwise end "successfully" with its initial weights.
    """

    def __init__(
        self,
        action: Literal["raise", "skip"] = "raise",
        max_consecutive_skips: Annotated[int, AtLeast(1)] = 10,
    ) -> None:
        super().__init__()
        check_arguments(NonFiniteGuard.__init__, locals())
        self.action, self.max_consecutive_skips = action, max_consecutive_skips
        self.skipped = self.consecutive = 0
        self._reported = 0  # skipped steps already warned about
        # Since the last check: (optimizer step, names of the parameters with a gradient, their
        # gradients' norms [P] on the device).
        self._window: list[tuple[int, list[str], torch.Tensor]] = []
        self._params: list[torch.nn.Parameter] = []
        self._names: list[str] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._window, self._reported = [], self.skipped
        # Walked once, not every step (named_parameters visits every submodule each call).
        named = list(pl_module.named_parameters())
        self._names, self._params = [n for n, _ in named], [p for _, p in named]

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        grads = [p.grad for p in self._params if p.grad is not None]
        if not grads:
            return
        names = self._names  # a frozen parameter has no gradient: name the others
        if len(grads) < len(self._params):
            pairs = zip(self._names, self._params, strict=True)
            names = [n for n, p in pairs if p.grad is not None]
        # One fused norm per gradient: non-finite iff some entry is (a finite gradient so large
        # that its norm overflows, |g| > 1e19 in float32, counts too: that step diverges). Their
        # finiteness is computed at the check, for the whole window at once: two kernels a step.
        norms = torch.stack(torch._foreach_norm(grads))  # [P]
        self._window.append((trainer.global_step, names, norms))
        if self.action == "skip" and not _fused(optimizer):
            # No device-side skip: read the verdict now (one sync) and drop a bad step's
            # gradients (torch optimizers skip parameters whose gradient is None).
            if self._check(trainer):
                optimizer.zero_grad(set_to_none=True)
            return
        if self.action == "skip":
            # Fused Adam/AdamW/SGD skip the whole update where found_inf is non-zero, on the
            # device, as under GradScaler (which, under 16-mixed, passes its own: NaN included).
            _inner(optimizer).found_inf = (~torch.isfinite(norms).all()).float()
        every = max(1, trainer.log_every_n_steps)  # type: ignore[attr-defined]
        if trainer.global_step % every == 0:
            self._check(trainer)

    def _check(self, trainer: L.Trainer) -> bool:
        """Read the window's flags on the host (one sync): raise, or count and report skipped
        steps. True when the newest step in it was non-finite."""
        if not self._window:
            return False
        window, self._window = self._window, []
        finite = torch.isfinite(torch.cat([norms for _, _, norms in window])).tolist()
        first: tuple[int, str] | None = None
        at, newest_bad = 0, False
        for step, names, norms in window:
            row, at = finite[at : at + len(norms)], at + len(norms)
            newest_bad = not all(row)
            if not newest_bad:
                self.consecutive = 0
                continue
            first = first or (step, names[row.index(False)])
            self.skipped += 1
            self.consecutive += 1
        if first is not None:
            self._act_on(trainer, *first)
        return newest_bad

    def _act_on(self, trainer: L.Trainer, step: int, name: str) -> None:
        where = f"non-finite gradient at step {step} (first in parameter '{name}')"
        if self.action == "raise":
            raise NonFiniteGradientError(
                f"{where}; lower the lr, clip gradients (trainer.gradient_clip_val=1.0) or use "
                "callbacks.nonfinite.action=skip"
            )
        if self.consecutive >= self.max_consecutive_skips:
            raise NonFiniteGradientError(
                f"{where}: {self.consecutive} optimizer steps in a row skipped "
                f"(callbacks.nonfinite.max_consecutive_skips={self.max_consecutive_skips}), the "
                "model no longer learns; lower the lr, clip gradients, or use "
                "trainer.precision=16-mixed/bf16-mixed instead of 16-true"
            )
        new, self._reported = self.skipped - self._reported, self.skipped
        what = "optimizer step skipped" if new == 1 else f"{new} optimizer steps skipped"
        rank_zero_warn(f"{where}: {what} ({self.skipped} so far)")
        for logger in trainer.loggers:
            logger.log_metrics({"nonfinite/skipped": float(self.skipped)}, trainer.global_step)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Before the checkpoint callbacks (Lightning runs them last): no checkpoint is kept as
        # the "best" of a run whose validation loss is NaN. One read, at an epoch's end.
        if not trainer.sanity_checking:
            check_held_out_metrics(trainer.callback_metrics, "val", trainer.global_step)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        check_held_out_metrics(trainer.callback_metrics, "test", trainer.global_step)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Before the file is written: a raise here writes nothing, so no checkpoint ever holds
        # weights updated by a non-finite step.
        self._check(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = state_dict.get("skipped", 0)


def check_held_out_metrics(metrics: Mapping[str, Any], stage: str, step: int) -> None:
    """DivergedError when a `stage` metric (val/loss, test/ppl, ...) among `metrics` is NaN or
    inf: the weights are not a trained model, whatever else the run reports. Every metric, not
    only the loss: a finite loss above ~88 still gives an inf perplexity."""
    for name, value in metrics.items():
        if not name.startswith(f"{stage}/") or torch.isfinite(torch.as_tensor(value)).all():
            continue
        raise DivergedError(
            f"{name}={float(value)} at step {step}: the run diverged and has "
            "not trained; lower the lr (model.optimizer.lr) or weight decay, clip gradients "
            "(trainer.gradient_clip_val=1.0) or use callbacks.nonfinite.action=skip"
        )


def _inner(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer)  # a LightningOptimizer wraps torch's


def _fused(optimizer: Any) -> bool:
    """Whether every parameter group runs torch's fused kernel (which accepts `found_inf`)."""
    return all(group.get("fused") for group in _inner(optimizer).param_groups)
