"""Gradient health: norms to spot exploding/vanishing gradients, and a guard against NaN/inf.

Both run in `on_before_optimizer_step`, which Lightning calls after backward (and after AMP
unscaling) but before gradient clipping: they see the gradients the model really produced.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import grad_norm, rank_zero_warn

from fasttrain.config.errors import ConfigError


class GradNormMonitor(L.Callback):
    """Logs `grad_norm/total` and, with `per_layer`, `grad_norm/<parameter>` every N steps.

    Args:
        every_n_steps: log on optimizer steps that are multiples of this (each costs a device sync).
        norm_type: the p of the p-norm (2.0: Euclidean, the norm clipping uses by default).
        per_layer: also log one norm per parameter tensor, not only the total.
    """

    def __init__(self, every_n_steps: int = 50, norm_type: float = 2.0, per_layer: bool = True):
        super().__init__()
        if every_n_steps < 1:
            raise ConfigError("every_n_steps", every_n_steps, "expected an int >= 1")
        if norm_type <= 0:
            raise ConfigError("norm_type", norm_type, "expected a number > 0")
        self.every_n_steps, self.norm_type, self.per_layer = every_n_steps, norm_type, per_layer

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        if trainer.global_step % self.every_n_steps:
            return
        norms = grad_norm(pl_module, self.norm_type)
        prefix = f"grad_{float(self.norm_type)}_norm"
        logged = {"grad_norm/total": norms.pop(f"{prefix}_total", None)}
        if self.per_layer:
            logged |= {f"grad_norm/{k.removeprefix(prefix + '/')}": v for k, v in norms.items()}
        present = {k: v for k, v in logged.items() if v is not None}
        if present:
            pl_module.log_dict(present, on_step=True, on_epoch=False)


class NonFiniteGradientError(FloatingPointError):
    """A gradient held NaN or inf; the message names the step and the first such parameter."""


class NonFiniteGuard(L.Callback):
    """On a NaN/inf gradient: stop (`action=raise`) or skip that optimizer step (`action=skip`).

    Skipped steps leave the weights untouched (gradients set to None, which optimizers skip) and
    are counted in `nonfinite/skipped`. Under DDP the gradients are already all-reduced, so every
    rank takes the same decision. Costs one device sync per optimizer step.

    Args:
        action: "raise" or "skip" (see above).
        max_consecutive_skips: with "skip", this many non-finite steps in a row stop the run: the
            model no longer learns (e.g. fp16 weights that overflow at every step), and a run that
            skips every step would otherwise end "successfully" with its initial weights.
    """

    def __init__(
        self, action: Literal["raise", "skip"] = "raise", max_consecutive_skips: int = 10
    ) -> None:
        super().__init__()
        if action not in ("raise", "skip"):
            raise ConfigError("action", action, "expected one of 'raise', 'skip'")
        if max_consecutive_skips < 1:
            raise ConfigError(
                "max_consecutive_skips", max_consecutive_skips, "expected an int >= 1"
            )
        self.action, self.max_consecutive_skips = action, max_consecutive_skips
        self.skipped = self.consecutive = 0

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        named = [(n, p.grad) for n, p in pl_module.named_parameters() if p.grad is not None]
        if not named:
            return
        # Common case, all finite: one fused (foreach) norm over every gradient and one sync,
        # not a kernel per tensor. The norm is finite iff every entry is (a finite gradient so
        # large that its norm overflows float32, |g| > 1e19, counts too: that step diverges).
        total = torch.nn.utils.get_total_norm([g for _, g in named], foreach=True)
        if bool(torch.isfinite(total)):
            self.consecutive = 0
            return
        finite = [bool(torch.isfinite(g).all()) for _, g in named]
        first = named[finite.index(False) if False in finite else 0][0]
        where = f"non-finite gradient at step {trainer.global_step} (first in parameter '{first}')"
        if self.action == "raise":
            raise NonFiniteGradientError(
                f"{where}; lower the lr, clip gradients (trainer.gradient_clip_val=1.0) or use "
                "callbacks.nonfinite.action=skip"
            )
        self.consecutive += 1
        if self.consecutive >= self.max_consecutive_skips:
            raise NonFiniteGradientError(
                f"{where}: {self.consecutive} optimizer steps in a row skipped "
                f"(callbacks.nonfinite.max_consecutive_skips={self.max_consecutive_skips}), the "
                "model no longer learns; lower the lr, clip gradients, or use "
                "trainer.precision=16-mixed/bf16-mixed instead of 16-true"
            )
        optimizer.zero_grad(set_to_none=True)
        self.skipped += 1
        rank_zero_warn(f"{where}: optimizer step skipped ({self.skipped} so far)")
        pl_module.log("nonfinite/skipped", float(self.skipped), on_step=True, on_epoch=False)

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = state_dict.get("skipped", 0)
