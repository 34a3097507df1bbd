"""The tasks, each a short flat function a reader can follow top to bottom:

    train     build the run, tune, fit (with resume), test the best checkpoint, report (here)
    evaluate  a checkpoint's test metrics                                 (tasks/checkpoint.py)
    export    a checkpoint -> ONNX, TorchScript, int8 and fp16 files, each read back and checked
    predict   a checkpoint's predictions (the task's columns) for the test split or an .npy file
    prepare   a data set's splits as WebDataset shards, for data=shards (tasks/prepare_data.py)

fasttrain.cli runs them (command-line check, Hydra, exit codes); tests call them with a composed
config. torch and Lightning load inside the tasks, so `--help` stays fast; a training run never
loads the other tasks (`from fasttrain.tasks import evaluate` loads its module then).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any, cast


def train(cfg: Any, built: tuple[Any, Any, Any] | None = None) -> dict[str, float]:
    """python train.py key=value ...: fit, then test the best checkpoint on the test split.
    `built`: the (trainer, model, datamodule) the command-line check built from `cfg`
    (fasttrain.cli); tests and notebooks leave it out, and the run is built here. After that,
    each step gets the objects or the values it needs, never `cfg` again."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from lightning.pytorch.callbacks import ModelCheckpoint
    from omegaconf import OmegaConf

    from fasttrain import fit
    from fasttrain.callbacks import board, sessions
    from fasttrain.callbacks.grad_health import check_held_out_metrics
    from fasttrain.checkpoints.resume import checkpoint_to_resume
    from fasttrain.models.protocols import Exportable, missing_methods

    if built is None:
        from fasttrain.assemble import build_run

        built = build_run(cfg)
    trainer, model, datamodule = built
    config = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    hparams, trial = sessions.session_of(config, trainer)
    sessions.start_session(trainer.loggers, hparams, trial)
    for tracker in trackers_of(trainer.loggers):  # MLflow, W&B
        tracker.record_start(hparams)
    fit.set_matmul_precision(cfg.get("matmul_precision"))
    ckpt_path = checkpoint_to_resume(cfg.get("resume"), cfg.paths.output_dir)
    if cfg.get("train", True):
        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            from fasttrain.distributed.multirun import share_job_with_ranks

            share_job_with_ranks()  # DDP ranks of a sweep job run this job, not the sweep
        tuner = config.get("tuner") or {}
        if tuner.get("lr_find") or tuner.get("batch_size") is not None:
            from fasttrain.tasks.tuner import tune

            tune(trainer, model, datamodule, **tuner)
        fit.fit(trainer, model, datamodule, ckpt_path, cfg.get("oom_fallback", False))
    metrics = {
        k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1 and k != "step"
    }  # "step": the x Lightning writes epoch-end values at (Task._log_at_steps_completed)

    # The first ModelCheckpoint's (callbacks.best): trainer.checkpoint_callback is the first
    # Checkpoint of any kind, the crash checkpoint's too where the others are dropped.
    savers = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
    best = savers[0].best_model_path if savers else ""
    if cfg.get("test", True):
        # Test the best checkpoint, not the last weights; without one, the weights as they are.
        results = trainer.test(
            model, datamodule=datamodule, ckpt_path=best or None, weights_only=True
        )
        metrics.update(results[0] if results else {})
    for stage in ("val", "test"):  # also without callbacks.nonfinite, before any report
        check_held_out_metrics(metrics, stage, trainer.global_step)
    final = sessions.final_values(metrics, trainer)
    sessions.end_session(trainer.loggers, final, trainer.global_step)
    shown: dict[str, str] = {}  # what opens each tracker's record of the run
    for tracker in trackers_of(trainer.loggers):
        tracker.record_end(final, trainer.global_step, best or None)
        shown.update(tracker.shown_commands())
    monitor = getattr(model, "monitor", None)
    pinned = board.pinned_tags(monitor, metrics, board.task_group(model))  # of those logged
    report(cfg.paths.output_dir, metrics, best or None, cfg.paths.log_dir, monitor=monitor,
           more=shown, pinned=pinned,
           exportable=not missing_methods(model, Exportable))  # fmt: skip
    return metrics


def trackers_of(loggers: Any) -> list[Any]:
    """The loggers that are trackers (fasttrain.callbacks.trackers.Tracker: MLflow, W&B). A
    tracker's module imports that one, so where it was never imported there is none, and a run
    without one never loads it."""
    module = sys.modules.get("fasttrain.callbacks.trackers")
    return [] if module is None else [lg for lg in loggers if isinstance(lg, module.Tracker)]


def report(output_dir: str, metrics: dict[str, float], ckpt: str | None,
           log_dir: str | None = None, monitor: str | None = None,
           more: dict[str, str] | None = None,
           pinned: list[str] | None = None, exportable: bool = True) -> None:  # fmt: skip
    """Write metrics.json in the run dir (with the task's `monitor`, the metric the run is
    judged by, for a training run); print the final metrics, where the run went and, for
    a training run (`log_dir` given), the commands that open it in TensorBoard (the link with
    the `pinned` charts first) and in `more` (MLflow, W&B), evaluate and export its checkpoint,
    and continue it (export only for a model it can check: `exportable`)."""
    from lightning.pytorch.utilities import rank_zero_only
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if getattr(rank_zero_only, "rank", 0) != 0:
        return
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"metrics": metrics, "checkpoint": ckpt}
    if monitor:
        record["monitor"] = monitor
    (out / "metrics.json").write_text(json.dumps(record, indent=2))
    shown = {k: v for k, v in metrics.items() if k.startswith(("test/", "val/"))}
    table = Table(title="final metrics", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name in sorted(shown):
        table.add_row(name, f"{shown[name]:.4f}")
    console = Console(soft_wrap=True)  # long paths stay on one line, easy to copy
    console.print(table)
    # Paths and commands hold overrides like `tags=[a,b]`: escaped, not read as rich markup.
    console.print(f"[bold]run dir[/]     {escape(str(output_dir))}")
    if ckpt:
        console.print(f"[bold]checkpoint[/]  {escape(ckpt)}")
    if log_dir:  # a training run: what to do next, each command ready to paste
        commands = next_commands(out, ckpt, log_dir, pinned or [], exportable)
        for name, command in {**(more or {}), **commands}.items():
            console.print(f"[bold]{name:<11}[/] {escape(command)}", markup=True, highlight=False)


def next_commands(run_dir: Path, ckpt: str | None, log_dir: str, pinned: list[str] | None = None,
                  exportable: bool = True) -> dict[str, str]:  # fmt: skip
    """Commands that work exactly as printed from where the run was started: the run folder's
    name holds `=` and `,`, so a path in an override is quoted for Hydra, and the override for
    the shell."""
    from hydra.core.hydra_config import HydraConfig

    from fasttrain.checkpoints.resume import checkpoint_to_resume, how_to_continue
    from fasttrain.config.overrides import quote
    from fasttrain.config.project import shown

    commands = {}
    if list(run_dir.glob("events.out.tfevents.*")):
        commands["TensorBoard"] = tensorboard_command(log_dir)
        if pinned:  # then this link: the loss and the task's metric pinned first
            from fasttrain.callbacks.board import view_url

            commands["view"] = view_url(pinned)
    python = shown(sys.executable)
    if ckpt:
        # The data group and split come from the checkpoint (fasttrain.assemble.restore), its
        # locations from the command line: the ones this run was given are repeated.
        arg = " ".join([shell_word(f"ckpt_path={quote(shown(ckpt))}"), *data_locations()])
        commands["evaluate"] = f"{python} -m fasttrain.evaluate {arg}"
        if exportable:  # (fasttrain.models.protocols.Exportable)
            commands["export"] = f"{python} -m fasttrain.export {arg}"
    newest = checkpoint_to_resume("auto", str(run_dir))
    if newest and HydraConfig.initialized():  # the command line to repeat is Hydra's record
        command = how_to_continue(newest).partition("continue with: ")[2]
        commands["resume"] = " ".join(shell_word(word) for word in shlex.split(command))
    return {name: command for name, command in commands.items() if command}


def data_locations() -> list[str]:
    """The data group and the data locations (data.path=..., fasttrain.data.base.is_location)
    this run's command line gave, as shell words; none when it gave no location."""
    from hydra.core.hydra_config import HydraConfig

    from fasttrain.data.base import is_location

    if not HydraConfig.initialized():
        return []
    typed = [o for o in HydraConfig.get().overrides.task if o.startswith("data.")]
    located = [o for o in typed if is_location(o.partition("=")[0].removeprefix("data."))]
    if not located:
        return []
    group = HydraConfig.get().runtime.choices.get("data")
    return [shell_word(o) for o in ([f"data={group}"] if group else []) + located]


def shell_word(arg: str) -> str:
    """`arg` as one shell word, quoted only as much as needed: "ckpt_path='a=1,b/x.ckpt'"."""
    if shlex.quote(arg) == arg or re.search(r'["$`\\!]', arg):
        return shlex.quote(arg)
    return f'"{arg}"'


def tensorboard_command(log_dir: str) -> str:
    """A command that works as printed from where the run was started: TensorBoard through
    fasttrain.tools.board (its landing page unsmoothed) in this very environment's Python (a
    bare `python` or `tensorboard` is this one only with the venv activated)."""
    exe = _shown(Path(sys.executable))
    return f"{exe} -m fasttrain.tools.board --logdir {_shown(Path(log_dir))} --host 127.0.0.1"


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it lies below it, else absolute."""
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# The tasks of the other entry points, in the modules they load from (module __getattr__,
# PEP 562: `tasks.evaluate` and `from fasttrain.tasks import evaluate` both work). No module
# is named after a task: once imported, it would be the package's attribute instead.
ELSEWHERE = {
    **dict.fromkeys(("evaluate", "export", "predict", "generate_text", "check_settings"),
                    "checkpoint"),
    "prepare": "prepare_data",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in ELSEWHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{ELSEWHERE[name]}"), name)
