"""The four tasks, each a short flat function a reader can follow top to bottom:

    train     build the run, tune, fit (with resume), test the best checkpoint, report
    evaluate  a checkpoint's test metrics
    export    a checkpoint -> ONNX, TorchScript, int8 and fp16 files, each read back and checked
    predict   a checkpoint's predictions (the task's columns) for the test split or an .npy file
    prepare   a data set's splits as WebDataset shards (data=shards streams them)

fasttrain.cli runs them (command-line check, Hydra, exit codes); tests call them with a composed
config. torch and Lightning load inside the tasks, so `--help` stays fast.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any, cast

from fasttrain.config.errors import UserError


def train(cfg: Any) -> dict[str, float]:
    """python train.py key=value ...: fit, then test the best checkpoint on the test split."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from lightning.pytorch.callbacks import ModelCheckpoint
    from omegaconf import OmegaConf

    from fasttrain import fit
    from fasttrain.assemble import build_run
    from fasttrain.callbacks import board, sessions
    from fasttrain.callbacks.grad_health import check_held_out_metrics
    from fasttrain.checkpoints.resume import checkpoint_to_resume
    from fasttrain.models.protocols import Exportable, missing_methods

    trainer, model, datamodule = build_run(cfg)
    hparams, trial = sessions.session_of(cfg, trainer)
    sessions.start_session(trainer.loggers, hparams, trial)
    for tracker in trackers_of(trainer.loggers):  # MLflow, W&B
        tracker.record_start(hparams)
    fit.set_matmul_precision(cfg.get("matmul_precision"))
    ckpt_path = checkpoint_to_resume(cfg.get("resume"), cfg.paths.output_dir)
    if cfg.get("train", True):
        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            from fasttrain.distributed.multirun import share_job_with_ranks

            share_job_with_ranks()  # DDP ranks of a sweep job run this job, not the sweep
        tuner = cast(dict[str, Any], OmegaConf.to_container(cfg.get("tuner") or {}))
        fit.tune(trainer, model, datamodule, **tuner)
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


def evaluate(cfg: Any) -> dict[str, float]:
    """python -m fasttrain.evaluate ckpt_path=PATH: the checkpoint's test metrics."""
    check_settings(cfg, "eval")  # also here: tests and notebooks call the task directly
    import lightning as L

    from fasttrain.assemble import build
    from fasttrain.assemble.restore import restore

    L.seed_everything(cfg.seed, workers=True)
    model, datamodule = restore(cfg)
    trainer = build(cfg.trainer, "trainer", logger=False)
    results = trainer.test(model, datamodule=datamodule)
    metrics = dict(results[0]) if results else {}
    report(cfg.paths.output_dir, metrics, str(cfg.ckpt_path))
    return metrics


def export(cfg: Any) -> dict[str, Any]:
    """python -m fasttrain.export ckpt_path=PATH [format=onnx]: write each format, read it back,
    check it against the eager net; exit 1 when one misses its target (`strict`)."""
    check_settings(cfg, "export")  # also here: tests and notebooks call the task directly
    import torch

    from fasttrain.assemble import build
    from fasttrain.assemble.restore import restore
    from fasttrain.deploy import export_and_verify, failures, resolve_device, run_dir_of, select
    from fasttrain.deploy.inputs import describe, input_statistics, raw_batches, with_preprocessing
    from fasttrain.models.protocols import Exportable, deploy_module, optional, require

    # Every argument is checked before the checkpoint is read, and that before a file is written.
    exporters = select(str(cfg.format))
    device = resolve_device(str(cfg.device))
    tolerance = build(cfg.tolerance, "tolerance")
    model, datamodule = restore(cfg)
    require(model, Exportable, "export", cfg.ckpt_path)
    # Every file takes raw inputs: the data module's preprocessing is its first layer, and the
    # checks feed it the test split as raw inputs.
    own = optional(model, "export_module")  # a task's own file (token ids in), else raw inputs
    mean, std = input_statistics(datamodule, model)
    if own is not None:
        deployed, metadata = own
    else:
        layer = optional(model, "output_layer")
        deployed = with_preprocessing(deploy_module(model, cfg.ckpt_path), mean, std, layer)
        metadata = describe(mean, std, datamodule.input_shape)

    def checked() -> Any:
        """The test split as the file takes it: the task's own inputs, or raw ones."""
        batches = datamodule.test_dataloader()
        return batches if own is not None else raw_batches(batches, mean, std, model)

    x = next(iter(checked()))[0]
    example = x[torch.arange(max(2, len(x))) % len(x)]  # torch.export needs a batch of >= 2
    out_dir = Path(cfg.output_dir) if cfg.output_dir else run_dir_of(cfg.ckpt_path) / "export"
    result = export_and_verify(
        deployed, model, exporters, example, checked(), out_dir, device, tolerance,
        float(cfg.latency_time), source=str(cfg.ckpt_path), metadata=metadata,
    )  # fmt: skip
    missed = failures(result)
    if missed and cfg.get("strict", True):
        print("error: export check failed:\n  " + "\n  ".join(missed), file=sys.stderr)
        sys.exit(1)
    return result


def predict(cfg: Any) -> Path:
    """python -m fasttrain.predict ckpt_path=PATH [input=x.npy]: predictions.csv, the task's
    columns (fasttrain.models.task). `input=` takes raw inputs (as the exported files do); the
    data module's preprocessing is applied here."""
    check_settings(cfg, "predict")  # also here: tests and notebooks call the task directly
    from rich.console import Console

    from fasttrain.assemble.restore import restore
    from fasttrain.deploy import resolve_device, torch_runner
    from fasttrain.deploy.inputs import input_statistics, with_preprocessing
    from fasttrain.deploy.predict import check_input_task, load_inputs, predict, write_predictions
    from fasttrain.models.protocols import Predictable, deploy_module, optional, require

    device = resolve_device(str(cfg.device))
    if cfg.get("prompt") is not None:
        return generate_text(cfg, device)
    if cfg.input:
        check_input_task(cfg.ckpt_path, cfg.input)  # before the data module is built
    model, datamodule = restore(cfg)
    require(model, Predictable, "predict", cfg.ckpt_path)
    net, rows = model, "the test split"  # the model's forward: its own preprocessing, if any
    if cfg.input:
        x = load_inputs(cfg.input, datamodule.input_shape)
        batches = ((xb, None) for xb in x.split(int(cfg.data.batch_size)))
        stats = input_statistics(datamodule, model)
        layer = optional(model, "output_layer")
        net = with_preprocessing(deploy_module(model, cfg.ckpt_path), *stats, layer)
        rows = str(cfg.input)
    else:
        batches = datamodule.test_dataloader()  # as the model takes them
    out = Path(cfg.output_dir or cfg.paths.output_dir) / "predictions.csv"
    outputs = predict(torch_runner(net, device), batches)
    summary = write_predictions(out, outputs, model, datamodule)
    shown = ", ".join(
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in summary.items()
    )
    Console(soft_wrap=True).print(f"[bold]predictions[/] {out} ({shown}; index = row of {rows})")
    return out


def generate_text(cfg: Any, device: Any) -> Path:
    """predict prompt=...: a language model's continuation, printed and written to
    generation.txt in this run's folder (fasttrain.deploy.generate)."""
    from rich.console import Console

    from fasttrain.checkpoints.load import load_task
    from fasttrain.data.tokenizer import from_json
    from fasttrain.deploy.files import atomic_path
    from fasttrain.deploy.generate import check_prompt, check_sampling, generate

    check_sampling(cfg.max_new_tokens, cfg.temperature, cfg.top_k)  # before the checkpoint
    check_prompt(cfg.prompt)
    model, _ = load_task(cfg.ckpt_path)  # its tokenizer checked (LanguageModel.check_tokenizer)
    if not hasattr(model, "generate") or getattr(model, "tokenizer_json", None) is None:
        raise UserError(f"prompt=: ckpt_path={cfg.ckpt_path} is not a language model's "
                        "checkpoint (no tokenizer); prompt= is for model=gpt")  # fmt: skip
    tokenizer = from_json(model.tokenizer_json, f"ckpt_path={cfg.ckpt_path}: its tokenizer")
    result = generate(model, tokenizer, str(cfg.prompt), int(cfg.max_new_tokens),
                      float(cfg.temperature), cfg.top_k, int(cfg.seed), device,
                      bool(cfg.get("kv_cache", True)))  # fmt: skip
    out = Path(cfg.output_dir or cfg.paths.output_dir) / "generation.txt"
    with atomic_path(out) as tmp:
        tmp.write_text(result.prompt + result.continuation)
    console = Console(soft_wrap=True, highlight=False)
    console.print(result.prompt + result.continuation, markup=False)
    rate = f"{result.tokens_per_sec:,.0f} tokens/s on {device}"
    console.print(
        f"[bold]generation[/] {out} ({len(result.tokens)} tokens, {rate}, seed {cfg.seed})"
    )
    return out


def prepare(cfg: Any) -> dict[str, Any]:
    """python -m fasttrain.prepare data=... output_dir=SHARDS: the data module's train, val and
    test splits as WebDataset shards (fasttrain.data.shards), for data=shards; data=text: its
    token memmaps (no output_dir: they go to data.cache_dir, where training reads them)."""
    from omegaconf import OmegaConf
    from rich.console import Console

    from fasttrain.assemble import build
    from fasttrain.config.schema import validate
    from fasttrain.data.shards import write_shards

    validate(cfg, entry="prepare")  # also here: tests call the task directly
    datamodule = build(cfg.data, "data")
    if hasattr(datamodule, "token_folder"):  # data=text: its token memmaps, in its cache_dir
        folder = datamodule.token_folder()
        Console(soft_wrap=True).print(f"[bold]token memmaps[/] {folder}")
        return {"folder": str(folder)}
    if OmegaConf.is_missing(cfg, "output_dir") or not cfg.output_dir:
        raise UserError(
            "output_dir is required: python -m fasttrain.prepare data=... output_dir=DIR"
        )
    if not hasattr(datamodule, "encoded"):
        raise UserError(f"data: {cfg.data._target_} holds no image files to write as shards; "
                        "prepare takes data=image_folder or data=cifar10")  # fmt: skip
    meta = write_shards(datamodule, Path(cfg.output_dir), int(cfg.shard_size))
    counts = ", ".join(f"{s} {sum(v['counts'])} in {len(v['shards'])}"
                       for s, v in meta["splits"].items())  # fmt: skip
    Console(soft_wrap=True).print(
        f"[bold]shards[/] {cfg.output_dir} ({counts}); train with: python train.py data=shards "
        f"data.path={cfg.output_dir} data.num_classes={len(meta['class_names'])}"
    )
    return meta


def check_settings(cfg: Any, entry: str) -> None:
    """The top-level keys of conf/<entry>.yaml; a checkpoint task needs a checkpoint."""
    from omegaconf import OmegaConf

    from fasttrain.config.schema import check_settings as check

    command = {"eval": "evaluate"}.get(entry, entry)
    if OmegaConf.is_missing(cfg, "ckpt_path") or not cfg.ckpt_path:
        raise UserError(f"ckpt_path is required: python -m fasttrain.{command} ckpt_path=PATH.ckpt")
    check(cfg, entry)


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
