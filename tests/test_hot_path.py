"""The hot path: a training step of the default configuration that does not log makes no
device-to-host synchronisation.

Counted at torch's dispatch level, where every `.item()`, `bool(t)`, `float(t)` and `t.tolist()`
of a tensor element arrives as `aten._local_scalar_dense`, together with the ops whose output
size depends on the data (`nonzero`, `masked_select`, `unique`, boolean indexing) and copies to
the host. On the CPU nothing waits, but the calls are the same ones that stall a GPU.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from practices import build_run, compose_train
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that make the host wait for the device (on a GPU): a scalar read, or an output whose size
# depends on the data.
SYNCING = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.equal.default,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_dim.default,
    torch.ops.aten.unique_consecutive.default,
}


class SyncCounter(TorchDispatchMode):
    """Records each syncing call; `ignored` tensors (by id) are host-side counters."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.ignored: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self._syncs(func, args, kwargs):
            self.calls.append(f"{func} at {_caller()}")
        return func(*args, **kwargs)

    def _syncs(self, func: Any, args: Any, kwargs: Any) -> bool:
        if func in SYNCING:
            return not (args and id(args[0]) in self.ignored)
        if func is torch.ops.aten.index.Tensor:  # boolean-mask indexing runs nonzero inside
            return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
        if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            src = args[1] if func is torch.ops.aten.copy_.default else args[0]
            dest = kwargs.get("device") if func is torch.ops.aten._to_copy.default else args[0]
            where = dest if isinstance(dest, torch.device) else getattr(dest, "device", None)
            return src.device.type != "cpu" and str(where).startswith("cpu")
        return False


def _caller() -> str:
    """The innermost frame outside torch and this file: who asked for the value."""
    for frame in reversed(traceback.extract_stack()):
        if "/torch/" not in frame.filename and frame.filename != __file__:
            return f"{Path(frame.filename).name}:{frame.lineno} ({frame.name})"
    return "?"


class CountPerStep(L.Callback):
    """Counts syncs from one training batch's start to the next one's (Lightning's bookkeeping
    after a batch and the next fetch included), for steady-state batches."""

    def __init__(self, first: int) -> None:
        self.first = first
        self.counter = SyncCounter()
        self.per_step: dict[int, list[str]] = {}
        self.logging: set[int] = set()
        self._open: int | None = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, i: int) -> None:
        self._close()
        if trainer.current_epoch == 0 and i >= self.first:
            # AdamW's per-parameter step counters live on the host (never a sync on a GPU).
            optimizer = trainer.optimizers[0]
            self.counter.ignored = {id(s["step"]) for s in optimizer.state.values() if "step" in s}
            self.counter.calls = []
            self.counter.__enter__()
            self._open = i
            if trainer.global_step % trainer.log_every_n_steps == 0:
                self.logging.add(i)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def _close(self) -> None:
        if self._open is not None:
            self.counter.__exit__(None, None, None)
            self.per_step[self._open] = list(self.counter.calls)
            self._open = None


# ema: the weight average updated after every step (fasttrain.callbacks.averaging); Lightning's
# own EMAWeightAveraging fails here with 2 syncs per step (torch's AveragedModel counter).
# lm: the language model on token windows of the default corpus (35 batches of 32 windows).
LM = ("model=gpt", "data=text", "data.windows_per_epoch=1120", "data.block_size=32",
      "model.net.n_layer=1", "model.net.n_embd=32")  # fmt: skip


@pytest.mark.parametrize(
    "extra", [(), ("callbacks/averaging=ema",), LM], ids=["default", "ema", "lm"]
)
def test_default_config_makes_no_sync_on_steps_that_do_not_log(
    tmp_path: Path, extra: tuple[str, ...]
) -> None:
    # The default configuration (callbacks, logger, progress bar, data module: digits), one
    # epoch of 35 batches of 32 on the CPU.
    cfg = compose_train(
        tmp_path, "trainer.accelerator=cpu", "trainer.devices=1", "trainer.max_epochs=1",
        "data.batch_size=32", "test=false", *extra, quick=False,
    )  # fmt: skip
    counter = CountPerStep(first=3)
    trainer, model, datamodule = build_run(cfg, callbacks=[counter])
    trainer.fit(model, datamodule=datamodule)
    batches = trainer.num_training_batches
    quiet = {i: calls for i, calls in counter.per_step.items()
             if i not in counter.logging and i != batches - 1}  # fmt: skip
    assert len(quiet) >= 20, sorted(counter.per_step)
    syncing = {i: calls for i, calls in quiet.items() if calls}
    assert not syncing, f"syncs on non-logging steps: {syncing}"
    # The counter sees them where they happen: logging steps do read values.
    assert any(counter.per_step[i] for i in counter.logging if i in counter.per_step)


class LoggedAsBefore(L.Callback):
    """Logs the loss the way the Classifier did before (self.log with on_step and on_epoch,
    Lightning's batch-size-weighted epoch mean) under ref/*, to compare with train/*."""

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, i: int):
        pl_module.log("ref/loss", outputs["loss"], on_step=True, on_epoch=True,
                      batch_size=len(batch[1]))  # fmt: skip


def test_logged_training_values_match_lightnings_own_reductions(tmp_path: Path) -> None:
    import csv

    cfg = compose_train(
        tmp_path, "trainer.accelerator=cpu", "trainer.devices=1", "logger=csv",
        "trainer.log_every_n_steps=1", "trainer.max_epochs=2", "trainer.limit_train_batches=5",
        "data.batch_size=100",  # 5 batches of 100, the last epoch's last one full too
    )  # fmt: skip
    trainer, model, datamodule = build_run(cfg, callbacks=[LoggedAsBefore()])
    trainer.fit(model, datamodule=datamodule)
    rows = list(csv.DictReader((tmp_path / "run" / "csv" / "metrics.csv").open()))
    series = {
        key: [float(r[key]) for r in rows if r.get(key)]
        for key in ("train/loss_step", "ref/loss_step", "train/loss_epoch", "ref/loss_epoch")
    }
    assert len(series["train/loss_step"]) == 10  # every optimizer step, log_every_n_steps=1
    assert series["train/loss_step"] == series["ref/loss_step"]
    assert len(series["train/loss_epoch"]) == 2
    for ours, ref in zip(series["train/loss_epoch"], series["ref/loss_epoch"], strict=True):
        assert abs(ours - ref) < 1e-6 * max(1.0, abs(ref))


class SyncDebugOnQuietSteps(L.Callback):
    """torch.cuda.set_sync_debug_mode("error") from the start of each non-logging steady-state
    step to the start of the next: any device sync there raises."""

    def __init__(self, first: int) -> None:
        self.first, self.quiet_steps = first, 0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, i: int) -> None:
        logging = trainer.global_step % trainer.log_every_n_steps == 0
        last = i == trainer.num_training_batches - 1
        quiet = trainer.current_epoch == 0 and i >= self.first and not logging and not last
        torch.cuda.set_sync_debug_mode("error" if quiet else "default")
        self.quiet_steps += quiet

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    ("on_device", "extra"), [(False, ()), (True, ()), (False, LM), (True, LM)],
    ids=["host_data", "data_on_device", "lm_host_data", "lm_data_on_device"],
)  # fmt: skip
def test_no_sync_on_cuda_steps_that_do_not_log(
    on_device: bool, extra: tuple[str, ...], tmp_path: Path
) -> None:
    cfg = compose_train(
        tmp_path, "trainer.accelerator=gpu", "trainer.devices=1", "trainer.max_epochs=1",
        "data.batch_size=16", "test=false", f"data.on_device={str(on_device).lower()}", *extra,
        quick=False,
    )  # fmt: skip
    watch = SyncDebugOnQuietSteps(first=3)
    trainer, model, datamodule = build_run(cfg, callbacks=[watch])
    try:
        trainer.fit(model, datamodule=datamodule)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert watch.quiet_steps >= 50


class CallsPerStep(L.Callback):
    """Python function calls (and builtin calls) of the main thread from one training batch's
    start to the next one's, for steady-state batches that neither log nor end the epoch."""

    def __init__(self, first: int) -> None:
        self.first, self.counts, self._calls, self._counting = first, [], 0, False

    def _count(self, frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            self._calls += 1

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, i: int) -> None:
        import sys

        if self._counting:
            sys.setprofile(None)
            self.counts.append(self._calls)
        quiet = i >= self.first and i < trainer.num_training_batches - 1
        self._counting = quiet and trainer.global_step % trainer.log_every_n_steps not in (0, 1)
        if self._counting:
            self._calls = 0
            sys.setprofile(self._count)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        import sys

        sys.setprofile(None)
        self._counting = False


def test_default_callbacks_add_little_python_work_per_step(tmp_path: Path) -> None:
    """The default configuration (all its callbacks, logger and progress bar) against the same
    module under a lean Lightning Trainer (no logger, bar, checkpoint or summary): the Python
    calls a quiet step adds. Lightning calls every hook of every callback each step, each in a
    profiler context; before fasttrain.assemble.Trainer skipped the hooks that do nothing (and
    NoProfiler), the default added ~1,100 calls a step to the lean trainer's ~1,500."""
    import statistics

    from fasttrain.assemble import build_model

    cfg = compose_train(
        tmp_path, "trainer.accelerator=cpu", "trainer.devices=1", "trainer.max_epochs=1",
        "data.batch_size=16", "test=false", "data.num_workers=0", quick=False,
    )  # fmt: skip
    default = CallsPerStep(first=3)
    trainer, model, datamodule = build_run(cfg, callbacks=[default])
    trainer.fit(model, datamodule=datamodule)

    lean = CallsPerStep(first=3)
    L.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[lean],
        log_every_n_steps=cfg.trainer.log_every_n_steps,
    ).fit(build_model(cfg.model), datamodule=datamodule)  # fmt: skip

    assert len(default.counts) >= 50 and len(lean.counts) >= 50
    added = statistics.median(default.counts) - statistics.median(lean.counts)
    assert added < 250, f"{added} Python calls a step over a lean Trainer"


def test_trainer_skips_the_step_hooks_a_callback_does_not_implement() -> None:
    from fasttrain.assemble import STEP_HOOKS, NoProfiler, Trainer

    calls: list[str] = []

    class OneHook(L.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            calls.append("end")

    class Extended(OneHook):  # a subclass calling super() on a hook its parent left out
        def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
            super().on_before_backward(trainer, pl_module, loss)
            calls.append("before_backward")

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            return self.layer(batch[0]).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_before_zero_grad(self, optimizer: Any) -> None:
            calls.append("module_before_zero_grad")

    class OnInstance(L.Callback):  # a hook set on the instance, not defined by the class
        def __init__(self) -> None:
            self.on_after_backward = lambda trainer, module: calls.append("instance")

    one, extended = OneHook(), Extended()
    trainer = Trainer(
        accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, callbacks=[one, extended, OnInstance()],
    )  # fmt: skip
    assert isinstance(trainer.profiler, NoProfiler)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(6, 2)), 2)
    module = Tiny()
    trainer.fit(module, train_dataloaders=data)
    assert calls.count("end") == 6 and calls.count("before_backward") == 3
    assert calls.count("instance") == 3
    # The module's no-op step hooks are skipped too (in fit), its own one still runs.
    assert calls.count("module_before_zero_grad") == 3
    assert [h for h in STEP_HOOKS if getattr(module, h) is not None] == ["on_before_zero_grad"]
    assert [h for h in STEP_HOOKS if getattr(one, h) is not None] == ["on_train_batch_end"]
    assert extended.on_before_backward is not None
    # Lightning's own model summary callback is trimmed too; the classes keep their methods.
    summary = next(c for c in trainer.callbacks if "ModelSummary" in type(c).__name__)
    assert all(getattr(summary, h) is None for h in STEP_HOOKS)
    assert callable(L.Callback.on_train_batch_start) and callable(OneHook.on_before_backward)
    chosen = Trainer(accelerator="cpu", logger=False, profiler="simple")
    assert type(chosen.profiler).__name__ == "SimpleProfiler"


def test_only_a_checkpoint_that_saves_at_epoch_ends_skips_its_batch_end_check() -> None:
    from datetime import timedelta

    from lightning.pytorch.callbacks import ModelCheckpoint

    from fasttrain.assemble import skip_unused_step_hooks

    class OwnBatchEnd(ModelCheckpoint):
        def on_train_batch_end(self, *args: Any) -> None:
            pass

    epochs = ModelCheckpoint()
    others = [ModelCheckpoint(every_n_train_steps=5), OwnBatchEnd(),
              ModelCheckpoint(train_time_interval=timedelta(minutes=5))]  # fmt: skip
    for callback in (epochs, *others):
        skip_unused_step_hooks(callback)
    assert epochs.on_train_batch_end is None
    assert all(c.on_train_batch_end is not None for c in others)
