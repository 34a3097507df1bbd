"""callbacks.grad_monitor logs gradient norms (before clipping); callbacks.nonfinite stops or skips
a step whose gradients hold NaN; nets' `init=` changes the initial weights."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch
from practices import build_run, compose_train

from conftest import scalars
from fasttrain.callbacks.grad_health import NonFiniteGradientError
from fasttrain.models.nets import MLP

CPU = ["trainer.accelerator=cpu", "trainer.devices=1"]


def test_grad_norms_in_event_file_before_clipping(tmp_path: Path) -> None:
    cfg = compose_train(
        tmp_path, *CPU, "logger=tensorboard", "+callbacks@callbacks.grad_monitor=none",
        "+callbacks.grad_monitor._target_=fasttrain.callbacks.grad_health.GradNormMonitor",
        "+callbacks.grad_monitor.every_n_steps=1", "+callbacks.grad_monitor.per_layer=true",
        "trainer.gradient_clip_val=0.001",
        "trainer.log_every_n_steps=1",
    )  # fmt: skip
    trainer, model, datamodule = build_run(cfg)
    trainer.fit(model, datamodule=datamodule)
    tags = scalars(tmp_path / "run")
    assert [t for t in tags if t.startswith("grad_norm/")] == ["grad_norm/total"]
    # Per layer in a group of their own; a container position gets the module's type.
    layers = {t for t in tags if t.startswith("grad_norm_layers/")}
    assert {"grad_norm_layers/net.layers.1.weight (Linear)",
            "grad_norm_layers/net.layers.1.bias (Linear)"} <= layers  # fmt: skip
    assert len(tags["grad_norm/total"]) == trainer.global_step
    # Logged before clipping: larger than the clip bound the optimizer then applied.
    assert min(tags["grad_norm/total"]) > 0.001


class NaNAt(MLP):
    """Produces NaN logits on its `bad_call`-th training forward (0-based)."""

    def __init__(self, *args, bad_call: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.bad_call, self.calls = bad_call, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.training:
            self.calls += 1
            if self.calls - 1 == self.bad_call:
                out = out * float("nan")
        return out


def nan_run(tmp_path: Path, action: str, *extra: str, bad_call: int | None = 2, callbacks=()):
    cfg = compose_train(
        tmp_path, *CPU, "+callbacks@callbacks.nonfinite=none",
        "+callbacks.nonfinite._target_=fasttrain.callbacks.grad_health.NonFiniteGuard",
        f"+callbacks.nonfinite.action={action}", "trainer.limit_val_batches=0", *extra,
    )  # fmt: skip
    torch.manual_seed(0)  # the same initial weights in every run
    net = NaNAt(
        [1, 8, 8], 10, hidden=[16], dropout=0.0, bad_call=-1 if bad_call is None else bad_call
    )
    return build_run(cfg, list(callbacks), net=net)


def test_nonfinite_raise_names_step_and_parameter(tmp_path: Path) -> None:
    trainer, model, datamodule = nan_run(tmp_path, "raise")
    with pytest.raises(
        NonFiniteGradientError, match=r"step 2 \(first in parameter 'net\.layers\.1\.weight'\)"
    ):
        trainer.fit(model, datamodule=datamodule)


def test_nonfinite_raise_reports_the_first_bad_step_late_but_saves_nothing_after_it(
    tmp_path: Path,
) -> None:
    # Logging every 10 steps and a checkpoint every 3: the verdict is read at step 3's save,
    # which it refuses; the run names step 2 and last.ckpt stays the finite one of step... none
    # before 3 here, so no checkpoint at all.
    cfg = compose_train(
        tmp_path, *CPU, "callbacks=default", "callbacks.best=null", "callbacks.perf=null",
        "callbacks.grad_monitor=null", "callbacks.progress_bar=null", "callbacks.lr_monitor=null",
        "callbacks.checkpoint.every_n_train_steps=3", "trainer.enable_checkpointing=true",
        "trainer.log_every_n_steps=10", "trainer.limit_train_batches=8",
        "trainer.limit_val_batches=0",
    )  # fmt: skip
    net = NaNAt([1, 8, 8], 10, hidden=[16], dropout=0.0, bad_call=2)
    trainer, model, datamodule = build_run(cfg, net=net)
    with pytest.raises(NonFiniteGradientError, match=r"at step 2 "):
        trainer.fit(model, datamodule=datamodule)
    assert trainer.global_step == 3  # it went on until the check before the first save
    assert not list((tmp_path / "run").rglob("*.ckpt"))


def test_nonfinite_skip_skips_the_step_and_counts_it(tmp_path: Path) -> None:
    trainer, model, datamodule = nan_run(tmp_path, "skip", "logger=csv")
    guard = next(c for c in trainer.callbacks if type(c).__name__ == "NonFiniteGuard")
    with pytest.warns(UserWarning, match="non-finite gradient at step 2"):
        trainer.fit(model, datamodule=datamodule)
    assert guard.skipped == 1
    logged = (tmp_path / "run" / "csv" / "metrics.csv").read_text()
    assert "nonfinite/skipped" in logged.splitlines()[0]
    # Training went on past the bad step and the weights stayed finite.
    assert model.net.calls == 4
    assert all(torch.isfinite(p).all() for p in model.parameters())


class DropStep(L.Callback):
    """What skipping a step means: that batch's gradients never reach the optimizer."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.global_step == self.step:
            optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("fused", [True, False], ids=["fused_adamw_on_device", "adamw_syncs"])
def test_nonfinite_skip_equals_a_run_without_that_step(fused: bool, tmp_path: Path) -> None:
    # AdamW with weight decay: a skipped step must move neither the weights (decay included)
    # nor the moments or the step counts.
    opt = ["model.optimizer.weight_decay=0.1", f"model.optimizer.fused={str(fused).lower()}",
           "trainer.limit_train_batches=6"]  # fmt: skip
    trainer, model, datamodule = nan_run(tmp_path / "skip", "skip", *opt)
    with pytest.warns(UserWarning, match="step 2"):
        trainer.fit(model, datamodule=datamodule)
    ref_trainer, ref, ref_data = nan_run(
        tmp_path / "ref", "skip", *opt, bad_call=None, callbacks=[DropStep(2)]
    )
    ref_trainer.fit(ref, datamodule=ref_data)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q), name
    state, ref_state = trainer.optimizers[0].state, ref_trainer.optimizers[0].state
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(state[p][key], ref_state[q][key]), key
    assert float(state[next(model.parameters())]["step"]) == 5  # 6 batches, 1 skipped


@pytest.mark.parametrize("init", ["kaiming", "xavier"])
def test_init_scheme_takes_effect(tmp_path: Path, init: str) -> None:
    from fasttrain.assemble import build

    cfg = compose_train(tmp_path, "model.net.hidden=[512]", f"model.net.init={init}")
    net = build(cfg.model.net, "model.net")
    w = net.layers[1].weight  # [512, 64]
    fan_in, fan_out = w.shape[1], w.shape[0]
    expected = math.sqrt(2 / fan_in) if init == "kaiming" else math.sqrt(2 / (fan_in + fan_out))
    assert w.std().item() == pytest.approx(expected, rel=0.05)
    assert torch.count_nonzero(net.layers[1].bias) == 0
    default = build(compose_train(tmp_path).model.net, "model.net").layers[1].weight
    assert default.std().item() != pytest.approx(expected, rel=0.05)


def test_gradient_norms_follow_the_logging_cadence_by_default(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from conftest import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["trainer.log_every_n_steps=7",
                                          f"paths.output_dir={tmp_path}"])  # fmt: skip
    assert cfg.callbacks.grad_monitor.every_n_steps == 7  # as many points as the loss's chart
