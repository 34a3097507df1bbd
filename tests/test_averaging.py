"""Averaged weights (callbacks/averaging=ema|swa): the average equals one computed here from the
per-step weights; validation, the best checkpoint, the test and evaluate run on it; checkpoints
carry both it and the raw weights; a resume after a crash is bit-identical; updates never read a
device value on the host."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from torch.optim.swa_utils import AveragedModel
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import CONF, REPO, run_cli
from fasttrain.assemble import build, build_run
from fasttrain.callbacks.averaging import EMA, SWA, Average
from fasttrain.config.errors import UserError

# MLP on digits, batch 128: 10 steps per epoch; 2 epochs. Validation every epoch.
RUN = [
    "model=mlp", "data.num_workers=0", "data.batch_size=128", "trainer.max_epochs=2",
    "trainer.deterministic=true", "callbacks.progress_bar=null", "logger=none",
    "+trainer.enable_model_summary=false",
]  # fmt: skip
STEPS = 20
EMA_RUN = ["callbacks/averaging=ema", "callbacks.averaging.decay=0.8",
           "callbacks.averaging.start_step=3", "callbacks.averaging.every_n_steps=2"]  # fmt: skip


def composed(tmp_path: Path, *overrides: str) -> Any:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=[*RUN, *overrides, f"paths.root_dir={tmp_path}",
                                           f"paths.output_dir={tmp_path}/run"])  # fmt: skip


def raw_params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


class Recorder(L.Callback):
    """The raw weights after each optimizer step; the weights validation and test run on."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []
        self.validated: list[tuple[int, dict[str, torch.Tensor]]] = []
        self.tested: dict[str, torch.Tensor] = {}

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        self.steps.append(raw_params(pl_module))

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self.validated.append((trainer.global_step, raw_params(pl_module)))

    def on_test_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.tested = raw_params(pl_module)


def ema_reference(steps: list[dict[str, torch.Tensor]], decay: float, start: int,
                  every: int) -> dict[str, torch.Tensor]:  # fmt: skip
    """The EMA of the weights after steps start, start+every, ... (first update: a copy)."""
    average: dict[str, torch.Tensor] = {}
    for i, weights in enumerate(steps):
        if i < start or i % every:
            continue
        average = {k: torch.lerp(average[k], w, 1 - decay) if average else w.clone()
                   for k, w in weights.items()}  # fmt: skip
    return average or steps[-1]


def fit(cfg: Any) -> tuple[Any, Any, Recorder]:
    recorder = Recorder()
    trainer, model, datamodule = build_run(cfg, callbacks=[recorder])
    trainer.fit(model, datamodule=datamodule)
    return trainer, model, recorder


def assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert not [k for k in a if not torch.equal(a[k], b[k])]


def test_ema_equals_the_reference_and_validation_runs_on_it(tmp_path: Path) -> None:
    trainer, model, rec = fit(composed(tmp_path, *EMA_RUN))
    assert len(rec.steps) == STEPS
    # Validation after epoch 1 (step 10) and 2 (step 20) saw the average of the steps so far.
    for step, weights in rec.validated:
        assert_equal(weights, ema_reference(rec.steps[:step], 0.8, 3, 2))
    final = ema_reference(rec.steps, 0.8, 3, 2)
    assert_equal(raw_params(model), final)  # after fit the model holds the average
    # last.ckpt: the average in state_dict (what evaluate/export/predict load), the raw weights
    # of the last step in current_model_state, the count of updates (steps 4, 6, ..., 18).
    ckpt = torch.load(Path(cfg_dir(tmp_path)) / "last.ckpt", weights_only=True)
    assert_equal({k: ckpt["state_dict"][k] for k in final}, final)
    assert_equal({k: ckpt["current_model_state"][k] for k in final}, rec.steps[-1])
    assert int(ckpt["averaging_state"]["n_averaged"]) == len(range(4, STEPS, 2))
    # The best checkpoint holds the average as of its validation, and the test runs on it.
    best = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=True)
    trainer.test(model, datamodule=trainer.datamodule, ckpt_path="best", weights_only=True)
    assert_equal(rec.tested, {k: best["state_dict"][k] for k in final})
    name = next(iter(final))
    assert not torch.equal(best["state_dict"][name], best["current_model_state"][name])


def cfg_dir(tmp_path: Path) -> Path:
    return tmp_path / "run" / "checkpoints"


def test_swa_is_the_mean_of_the_weights_from_start_step(tmp_path: Path) -> None:
    overrides = ["callbacks/averaging=swa", "callbacks.averaging.start_step=5"]
    _, model, rec = fit(composed(tmp_path, *overrides))
    mean = {k: torch.stack([s[k] for s in rec.steps[5:]]).mean(0) for k in rec.steps[0]}
    for name, value in raw_params(model).items():
        torch.testing.assert_close(value, mean[name], rtol=0, atol=1e-6)
    # Epoch 1's validation (step 10) averaged steps 5..9.
    step, weights = rec.validated[0]
    assert step == 10
    for name, value in weights.items():
        expected = torch.stack([s[name] for s in rec.steps[5:10]]).mean(0)
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-6)


def test_before_start_step_the_weights_are_used_as_they_are(tmp_path: Path) -> None:
    overrides = ["callbacks/averaging=ema", "callbacks.averaging.start_step=15"]
    _, model, rec = fit(composed(tmp_path, *overrides, "trainer.max_epochs=1"))
    ((step, weights),) = rec.validated  # step 10: nothing averaged yet
    assert_equal(weights, rec.steps[step - 1])
    assert_equal(raw_params(model), rec.steps[-1])
    best = torch.load(next(cfg_dir(tmp_path).glob("epoch000-*.ckpt")), weights_only=True)
    assert_equal({k: best["state_dict"][k] for k in weights}, rec.steps[-1])
    assert_equal({k: best["current_model_state"][k] for k in weights}, rec.steps[-1])


def test_evaluate_loads_the_average(tmp_path: Path) -> None:
    from fasttrain.checkpoints.load import load_task

    _, model, _ = fit(composed(tmp_path, *EMA_RUN))
    loaded, _ = load_task(cfg_dir(tmp_path) / "last.ckpt")
    assert_equal(raw_params(loaded), raw_params(model))


def weights(run: Path) -> dict[str, torch.Tensor]:
    """Everything a resume must restore: average, raw weights, count, optimizer state."""
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == STEPS
    state = {f"avg.{k}": v for k, v in ckpt["state_dict"].items()}
    state.update({f"raw.{k}": v for k, v in ckpt["current_model_state"].items()})
    state["n_averaged"] = ckpt["averaging_state"]["n_averaged"]
    for i, s in ckpt["optimizer_states"][0]["state"].items():
        state.update({f"optim.{i}.{k}": v for k, v in s.items()})
    return state


RESUMABLE = [*EMA_RUN, "callbacks.checkpoint.every_n_train_steps=3", "test=false"]


def train_in_process(log_dir: Path, run_name: str, extra: Sequence[str] = ()) -> Path:
    from fasttrain.tasks import train

    run = log_dir / "train" / run_name
    paths = [f"paths.root_dir={log_dir}", f"paths.log_dir={log_dir}", f"paths.output_dir={run}"]
    overrides = [*RUN, *RESUMABLE, *extra, *paths, f"run_name={run_name}"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        train(compose("train", overrides=overrides))
    return run


def test_resume_after_a_crash_restores_the_average_exactly(tmp_path: Path) -> None:
    reference = weights(train_in_process(tmp_path / "ref", "ref"))
    crash = ["+callbacks.killer._target_=killer.Killer", "+callbacks.killer.at_step=11",
             "+callbacks.killer.mode=raise"]  # fmt: skip
    with pytest.raises(RuntimeError, match="injected failure"):
        train_in_process(tmp_path, "run", crash)  # dies at step 11; last.ckpt is step 9's
    run = train_in_process(tmp_path, "run")
    resumed = weights(run)
    assert resumed.keys() == reference.keys()
    assert not [k for k in reference if not torch.equal(resumed[k], reference[k])]


@pytest.mark.slow  # a subprocess run, killed, then resumed: ~25 s on 2 cores
def test_resume_after_sigkill_is_bit_identical(tmp_path: Path) -> None:
    reference = weights(train_in_process(tmp_path / "ref", "ref"))
    args = [str(REPO / "train.py"), *RUN, *RESUMABLE, "run_name=run",
            "+callbacks.killer._target_=killer.Killer", "+callbacks.killer.at_step=14"]  # fmt: skip
    proc = run_cli(args, tmp_path, PYTHONPATH=str(Path(__file__).parent))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    resumed = weights(train_in_process(tmp_path, "run"))  # from step 12
    assert not [k for k in reference if not torch.equal(resumed[k], reference[k])]


class ScalarReads(TorchDispatchMode):
    """Counts reads of a tensor's value on the host (a device sync on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("decay", [0.9, None])
def test_updates_read_nothing_on_the_host(decay: float | None) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    ours = Average(net, decay)
    theirs = AveragedModel(net, use_buffers=True)
    ours.update_parameters(net)  # the first update copies
    theirs.update_parameters(net)
    with ScalarReads() as reads:
        ours.update_parameters(net)
    assert reads.count == 0
    with ScalarReads() as reads:
        theirs.update_parameters(net)
    assert reads.count > 0  # torch's own: what the test would catch
    # The count survives a checkpoint: read once, on load.
    copy = Average(net, decay)
    copy.load_state_dict(ours.state_dict())
    assert copy.count == ours.count == 2


def test_a_bf16_model_keeps_an_fp32_average() -> None:
    net = torch.nn.Linear(4, 4)
    average = Average(net, 0.999)
    net.to(torch.bfloat16)
    average.update_parameters(net)
    before = net.weight.float()
    with torch.no_grad():
        net.weight.add_(1.0)
    average.update_parameters(net)
    assert average.module.weight.dtype == torch.float32
    # 1e-3 of the step survives in fp32 (in bf16, x + 0.001 rounds back to x near 1)
    moved = average.module.weight - before
    expected = 0.001 * (net.weight.float() - before)
    torch.testing.assert_close(moved, expected, rtol=1e-3, atol=1e-7)
    assert moved.abs().min() > 5e-4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["callbacks/averaging=ema", "callbacks.averaging.decay=1"],
         "callbacks.averaging.decay=1: expected a number strictly between 0 and 1"),
        (["callbacks/averaging=ema", "callbacks.averaging.every_n_steps=0"],
         "callbacks.averaging.every_n_steps=0: expected an int >= 1"),
        (["callbacks/averaging=swa", "callbacks.averaging.start_step=-1"],
         "callbacks.averaging.start_step=-1: expected an int >= 0"),
    ],
)  # fmt: skip
def test_bad_settings_fail_in_one_line(tmp_path: Path, overrides: list[str], message: str) -> None:
    cfg = composed(tmp_path, *overrides)
    with pytest.raises(UserError) as err:
        build(cfg.callbacks.averaging, "callbacks.averaging")
    assert str(err.value) == message


def test_the_classes_build_from_their_configs(tmp_path: Path) -> None:
    for name, cls in (("ema", EMA), ("swa", SWA)):
        cfg = composed(tmp_path, f"callbacks/averaging={name}")
        assert isinstance(build(cfg.callbacks.averaging, "callbacks.averaging"), cls)


def test_a_second_fit_starts_from_the_raw_weights(tmp_path: Path) -> None:
    # fasttrain.fit's OOM fallback calls trainer.fit again on the same trainer and model.
    trainer, model, rec = fit(composed(tmp_path, *EMA_RUN, "trainer.max_epochs=1"))
    assert not torch.equal(raw_params(model)[next(iter(rec.steps[-1]))],
                           rec.steps[-1][next(iter(rec.steps[-1]))])  # fmt: skip
    trainer.fit(model, datamodule=trainer.datamodule)  # max_epochs reached: no step
    assert_equal(raw_params(model), rec.steps[-1])
