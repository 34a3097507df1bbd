"""trainer.accumulate_grad_batches and trainer.gradient_clip_val/algorithm change the optimizer
steps: fewer steps, the same update as one big batch, and gradients within the clip bound."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from practices import build_run, compose_train

# A linear model (no hidden layer, no dropout) trained by plain SGD: one step is w - lr * grad,
# so equal weights after one step mean equal gradients.
LINEAR = ["model.net.hidden=[]", "model.net.dropout=0.0", "model/optimizer=sgd",
          "model.optimizer.momentum=0.0", "model.optimizer.nesterov=false",
          "model.optimizer.weight_decay=0.0",
          "trainer.accelerator=cpu", "trainer.devices=1"]  # fmt: skip


def test_optimizer_steps_are_batches_over_n(tmp_path: Path) -> None:
    cfg = compose_train(tmp_path, *LINEAR, "trainer.accumulate_grad_batches=4",
                        "trainer.limit_train_batches=8")  # fmt: skip
    trainer, model, datamodule = build_run(cfg)
    trainer.fit(model, datamodule=datamodule)
    assert trainer.global_step == 8 // 4


def weights_after_one_step(tmp_path: Path, batch_size: int, accumulate: int) -> torch.Tensor:
    cfg = compose_train(tmp_path, *LINEAR, f"data.batch_size={batch_size}",
                        f"trainer.accumulate_grad_batches={accumulate}", "trainer.max_steps=1",
                        "trainer.limit_val_batches=0")  # fmt: skip
    trainer, model, datamodule = build_run(cfg)
    trainer.fit(model, datamodule=datamodule)
    assert trainer.global_step == 1
    return torch.cat([p.detach().flatten() for p in model.net.parameters()])


def test_accumulated_step_equals_one_big_batch(tmp_path: Path) -> None:
    # 4 micro-batches of 8 vs one batch of 32: same samples (the shuffle order does not depend on
    # the batch size), same start weights (same seed), so the same update within float error.
    accumulated = weights_after_one_step(tmp_path / "a", batch_size=8, accumulate=4)
    big = weights_after_one_step(tmp_path / "b", batch_size=32, accumulate=1)
    L.seed_everything(42)
    start = weights_after_one_step(tmp_path / "c", batch_size=8, accumulate=1)
    assert torch.allclose(accumulated, big, atol=1e-6)
    assert not torch.allclose(accumulated, start, atol=1e-4)  # a different update is detectable


class GradRecorder(L.Callback):
    """Gradients as produced (before clipping) and as applied by the optimizer (after).

    With plain SGD (no momentum, no weight decay) the update is w_after = w_before - lr * g, so
    the gradient the optimizer applied is (w_before - w_after) / lr.
    """

    def __init__(self) -> None:
        self.before: list[tuple[float, float]] = []
        self.after: list[tuple[float, float]] = []

    @staticmethod
    def stats(grads: list[torch.Tensor]) -> tuple[float, float]:
        """(total 2-norm, max |element|)."""
        total = torch.linalg.vector_norm(torch.cat([g.float().flatten() for g in grads]))
        return float(total), max(float(g.abs().max()) for g in grads)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        # Lightning clips right after this hook, then steps.
        params = list(pl_module.parameters())
        self.before.append(self.stats([p.grad for p in params]))
        self.weights = [p.detach().clone() for p in params]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        applied = [
            (w - p.detach()) / lr for w, p in zip(self.weights, pl_module.parameters(), strict=True)
        ]
        self.after.append(self.stats(applied))


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize(("algorithm", "index"), [("norm", 0), ("value", 1)])
def test_clipping_bounds_gradients(
    tmp_path: Path, precision: str, algorithm: str, index: int
) -> None:
    clip = 0.01
    cfg = compose_train(tmp_path, *LINEAR, f"trainer.precision={precision}",
                        f"trainer.gradient_clip_val={clip}",
                        f"trainer.gradient_clip_algorithm={algorithm}")  # fmt: skip
    recorder = GradRecorder()
    trainer, model, datamodule = build_run(cfg, callbacks=[recorder])
    trainer.fit(model, datamodule=datamodule)
    assert len(recorder.after) == trainer.global_step > 0
    # Clipping was needed (the raw gradients exceed the bound) and applied (they no longer do).
    assert all(before[index] > clip for before in recorder.before)
    assert all(after[index] <= clip * (1 + 1e-3) for after in recorder.after)
