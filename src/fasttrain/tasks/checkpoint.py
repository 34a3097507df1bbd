"""The tasks that start from a checkpoint: evaluate (its test metrics), export (its files, each
read back and checked) and predict (its predictions; with prompt=, a language model's
continuation). Each checks its top-level keys first: tests and notebooks call them directly."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fasttrain.config.errors import UserError
from fasttrain.tasks import report


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
    exporters = select(cfg.format)
    device = resolve_device(cfg.device)
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

    device = resolve_device(cfg.device)
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


def check_settings(cfg: Any, entry: str) -> None:
    """The top-level keys of conf/<entry>.yaml; a checkpoint task needs a checkpoint."""
    from omegaconf import OmegaConf

    from fasttrain.config.schema import check_settings as check

    command = {"eval": "evaluate"}.get(entry, entry)
    if OmegaConf.is_missing(cfg, "ckpt_path") or not cfg.ckpt_path:
        raise UserError(f"ckpt_path is required: python -m fasttrain.{command} ckpt_path=PATH.ckpt")
    check(cfg, entry)
