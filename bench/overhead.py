"""What the template costs per training step, against the hand-written loop it replaces.

    python bench/overhead.py            # full run: writes bench/results/cpu.json, prints a table
    python bench/overhead.py --smoke    # a few steps: proves the script still works (tested)

    python bench/overhead.py --profile  # cProfile of C and L on the tiny case, by owner
    (every full run also counts each variant's Python calls and torch ops per step: exact
    numbers, where this VM's times move by up to 2x from one run to the next)
    python bench/overhead.py --callbacks  # each default callback's calls and ops per step

In one process, single-threaded (torch.set_num_threads(1)), same net, data, seed and batches:
  A  a hand-written loop: zero_grad, forward, loss, backward, step
  B  fasttrain's Classifier under a lean Lightning Trainer (no logger, bar, checkpoint)
  C  fasttrain's default configuration, composed from conf/ (TensorBoard, progress bar,
     checkpoints, and every default callback) with only the data and net swapped
  D  C without the PerfMonitor callback (its overhead is C/D), when the default has one
  L  a typical Lightning template's defaults, written here: self.log of loss and accuracy
     (torchmetrics) on every step with on_epoch=True and prog_bar=True, a rich progress bar
     updated every step (its defaults), a ModelCheckpoint monitoring val/acc (+ last),
     EarlyStopping, a model summary and a TensorBoard logger
interleaved A B C D L, B C D L A, ... so drift on the machine and the order hit all alike.
Per-step time is taken inside each run over the same window of steps (after warm-up), data
loading included.

Optimizer, the same for every variant: AdamW(lr=1e-3, weight_decay=0.01, fused=True), the
default's kind (conf/model/optimizer/adamw.yaml).

Data path, the same for every variant: the batches come from tensors in memory through a
DataLoader over fasttrain's `Batched` dataset (one gather per batch, no per-sample __getitem__
or collate: fasttrain.data.batches), in order, in the training process. What the sample-wise
loader of a typical template costs on top is the data-wait share of `make train` (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

# Two step sizes: a tiny MLP (framework overhead dominates: ~1 ms by hand on this VM) and an
# MLP on 28x28 inputs whose hand-written step takes ~5 ms on one thread of this VM (measured in
# every run: A's time is in the results), where a per-step overhead is a share of a real step.
CASES = {
    "tiny_mlp": {"input_shape": [1, 8, 8], "hidden": [64], "batch_size": 64},
    "mlp_5ms": {"input_shape": [1, 28, 28], "hidden": [256, 256], "batch_size": 128},
    # A language model (model=gpt data=text): a 2-layer GPT on windows of 64 byte tokens. A is
    # nanoGPT's loop: its get_batch (random starts, one slice a window, stacked) on the same
    # memmap and starts, AdamW with decay on matrices only, betas (0.9, 0.95). L: n/a (the
    # typical template is a classifier's).
    "lm": {"kind": "lm", "block_size": 64, "n_layer": 2, "n_embd": 64, "batch_size": 16},
}
VARIANTS = ("A", "B", "C", "D", "L")
# "cpu" (make bench) or "cuda" (bench/gpu_check.sh: --device cuda, where hidden host work shows
# least and a sync per step shows most).
DEVICE = "cpu"


def accelerator() -> str:
    return "gpu" if DEVICE == "cuda" else "cpu"


def sync() -> None:
    """Wait for the device at the window's ends only: its time then covers the queued work."""
    if DEVICE == "cuda":
        import torch

        torch.cuda.synchronize()


def is_lm(case: dict) -> bool:
    return case.get("kind") == "lm"


def variants_of(case: dict) -> tuple[str, ...]:
    return tuple(v for v in VARIANTS if v != "L" or not is_lm(case))


def make_net(case: dict):
    from fasttrain.models.nets import GPT, MLP

    if is_lm(case):
        return GPT(256, case["block_size"], case["n_layer"], 4, case["n_embd"])
    return MLP(case["input_shape"], 10, hidden=case["hidden"], dropout=0.0)


TOKENS = 200_000  # the lm case's token memmap (random bytes), written once per process


@functools.cache
def token_memmap():
    import tempfile

    import numpy as np

    path = Path(tempfile.mkdtemp()) / "train.bin"
    np.random.default_rng(0).integers(0, 256, TOKENS, dtype=np.uint16).tofile(path)
    return np.memmap(path, dtype=np.uint16, mode="r")


def lm_windows(case: dict, steps: int, seed: int):
    """fasttrain's training windows of the memmap (fasttrain.data.text.TokenWindows)."""
    from fasttrain.data.text import TokenWindows

    return TokenWindows(token_memmap(), case["block_size"], steps * case["batch_size"], seed)


def nanogpt_batches(case: dict, steps: int, seed: int):
    """nanoGPT's get_batch on the same memmap and window starts: one slice per window, stacked."""
    import numpy as np
    import torch

    data, block, size = token_memmap(), case["block_size"], case["batch_size"]
    starts = lm_windows(case, steps, seed).window_starts(list(range(steps * size)))
    for step in range(steps):
        ix = starts[step * size : (step + 1) * size]
        x = torch.stack([torch.from_numpy(data[i : i + block].astype(np.int64)) for i in ix])
        y = torch.stack(
            [torch.from_numpy(data[i + 1 : i + 1 + block].astype(np.int64)) for i in ix]
        )
        yield x, y


def lm_param_groups(net, weight_decay: float = 0.01):
    params = list(net.parameters())
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]  # fmt: skip


class StepTimer:
    """Times steps [warmup, warmup + measured) from inside the loop, the same way for A, B, C."""

    def __init__(self, warmup: int, measured: int) -> None:
        self.warmup, self.measured = warmup, measured
        self.start = self.end = self.cpu_start = self.cpu_end = 0.0

    def at_step_start(self, step: int) -> None:
        if step == self.warmup:
            # Each window starts from a collected heap: the garbage of earlier runs in this
            # process (a full collection can take tens of ms) is not charged to this one.
            gc.collect()
            sync()
            self.start, self.cpu_start = time.perf_counter(), time.thread_time()

    def at_step_end(self, step: int) -> None:
        if step == self.warmup + self.measured - 1:
            sync()
            self.end, self.cpu_end = time.perf_counter(), time.thread_time()

    @property
    def us_per_step(self) -> float:
        return (self.end - self.start) / self.measured * 1e6

    @property
    def cpu_us_per_step(self) -> float:
        """CPU time of the training thread alone: less sensitive to other load on the machine,
        blind to work in other threads (TensorBoard's writer, the bar's redraws)."""
        return (self.cpu_end - self.cpu_start) / self.measured * 1e6


def loader(case: dict, steps: int, seed: int):
    import torch
    from torch.utils.data import DataLoader

    from fasttrain.data.batches import Batched, as_batch

    if is_lm(case):  # in order (no shuffle): every variant gets the same windows
        return DataLoader(lm_windows(case, steps, seed), batch_size=case["batch_size"],
                          collate_fn=as_batch)  # fmt: skip

    gen = torch.Generator().manual_seed(seed)
    n = steps * case["batch_size"]
    x = torch.randn(n, *case["input_shape"], generator=gen)
    y = torch.randint(0, 10, (n,), generator=gen)
    # No shuffle, no workers: every variant sees the same batches in the same order.
    return DataLoader(Batched(x, y), batch_size=case["batch_size"], collate_fn=as_batch)


def final_loss(net, case: dict) -> float:
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(123)
    net.eval()
    device = next(net.parameters()).device
    if is_lm(case):
        x, y = next(iter(loader(case, 1, seed=123)))
        with torch.no_grad():
            logits = net(x.to(device))
            return F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten()).item()
    x = torch.randn(256, *case["input_shape"], generator=gen)
    y = torch.randint(0, 10, (256,), generator=gen)
    with torch.no_grad():
        return F.cross_entropy(net(x.to(device)), y.to(device)).item()


def run_a(case: dict, net0, steps: int, timer: StepTimer) -> float:
    import torch
    import torch.nn.functional as F

    net = copy.deepcopy(net0).to(DEVICE).train()
    if is_lm(case):
        return run_a_lm(case, net, steps, timer)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=True)
    for step, (x, y) in enumerate(loader(case, steps, seed=0)):
        timer.at_step_start(step)
        x, y = x.to(DEVICE), y.to(DEVICE)  # as Lightning moves each batch
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        timer.at_step_end(step)
    return final_loss(net, case)


def run_a_lm(case: dict, net, steps: int, timer: StepTimer) -> float:
    """nanoGPT's loop (train.py, one process, no accumulation, no scaler in fp32)."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.AdamW(lm_param_groups(net), lr=1e-3, betas=(0.9, 0.95), fused=True)
    for step, (x, y) in enumerate(nanogpt_batches(case, steps, seed=0)):
        timer.at_step_start(step)
        x, y = x.to(DEVICE), y.to(DEVICE)
        logits = net(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        timer.at_step_end(step)
    return final_loss(net, case)


def timer_callback(timer: StepTimer):
    import lightning as L

    class _Timer(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            timer.at_step_start(batch_idx)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            timer.at_step_end(batch_idx)

    return _Timer()


def run_b(case: dict, net0, steps: int, timer: StepTimer) -> float:
    import lightning as L
    import torch

    from fasttrain.models import Classifier, LanguageModel

    optimizer = functools.partial(torch.optim.AdamW, lr=1e-3, fused=True)
    if is_lm(case):
        optimizer = functools.partial(optimizer, betas=(0.9, 0.95))
        model = LanguageModel(copy.deepcopy(net0), optimizer, 256, weight_decay=0.01)
    else:
        model = Classifier(copy.deepcopy(net0), optimizer, 10)
    trainer = L.Trainer(
        accelerator=accelerator(), devices=1, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[timer_callback(timer)],
    )  # fmt: skip
    trainer.fit(model, train_dataloaders=loader(case, steps, seed=0))
    return final_loss(model.net, case)


def compose_default(case: dict, steps: int, out: Path, with_perf: bool, drop: str = ""):
    from hydra import compose, initialize_config_dir

    from fasttrain import CONFIG_DIR

    overrides = [
        f"paths.root_dir={out}", f"paths.output_dir={out}", f"trainer.accelerator={accelerator()}",
        "trainer.max_epochs=1", f"++trainer.limit_train_batches={steps}", "model.scheduler=null",
        "model.optimizer._target_=torch.optim.AdamW", "model.optimizer.lr=0.001",
        "model.optimizer.weight_decay=0.01", "model.optimizer.fused=true",
    ]  # fmt: skip
    if is_lm(case):  # the data module goes unused (the bench feeds its batches): a small corpus
        corpus = out / "corpus.txt"
        corpus.parent.mkdir(parents=True, exist_ok=True)
        corpus.write_text("def f(x):\n    return x\n" * 2000)
        block = f"data.block_size={case['block_size']}"
        overrides += ["model=gpt", "data=text", f"data.path={corpus}", block,
                      "model.weight_decay=0.01"]  # fmt: skip
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    if not with_perf:
        cfg.callbacks.perf = None
    if drop == "model_summary":
        from omegaconf import open_dict

        with open_dict(cfg):
            cfg.trainer.enable_model_summary = False
    elif drop:
        cfg.callbacks[drop] = None
    return cfg


def run_c(
    case: dict, net0, steps: int, timer: StepTimer, out: Path, with_perf: bool, drop: str = ""
) -> float:
    from fasttrain.assemble import build_run

    cfg = compose_default(case, steps, out, with_perf, drop)
    # Built exactly as `python train.py` builds it (ResumeState, atomic checkpoint IO included);
    # the bench feeds its own batches, so the data module goes unused.
    trainer, model, _ = build_run(cfg, [timer_callback(timer)], net=copy.deepcopy(net0))
    # Validation every epoch as in the default, on a copy of the batches (runs after the window).
    trainer.fit(model, train_dataloaders=loader(case, steps, 0), val_dataloaders=loader(case, 2, 1))
    return final_loss(model.net, case)


def template_module(net, lr: float = 1e-3):
    """A LightningModule as typical templates write it (the L variant)."""
    import lightning as L
    import torch
    import torch.nn.functional as F
    from torchmetrics.classification import MulticlassAccuracy

    class TemplateModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net
            self.train_acc = MulticlassAccuracy(10, average="micro")
            self.val_acc = MulticlassAccuracy(10, average="micro")

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            loss = F.cross_entropy(logits, y)
            self.train_acc(logits, y)
            self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
            self.log("train/acc", self.train_acc, on_step=True, on_epoch=True, prog_bar=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            self.val_acc(logits, y)
            self.log("val/loss", F.cross_entropy(logits, y), prog_bar=True)
            self.log("val/acc", self.val_acc, prog_bar=True)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=0.01, fused=True)

    return TemplateModule()


def run_l(case: dict, net0, steps: int, timer: StepTimer, out: Path) -> float:
    import lightning as L
    from lightning.pytorch.callbacks import (
        EarlyStopping,
        ModelCheckpoint,
        RichModelSummary,
        RichProgressBar,
    )
    from lightning.pytorch.loggers import TensorBoardLogger

    model = template_module(copy.deepcopy(net0))
    callbacks = [
        ModelCheckpoint(dirpath=out / "checkpoints", monitor="val/acc", mode="max", save_last=True),
        EarlyStopping(monitor="val/acc", mode="max", patience=100),
        RichModelSummary(),
        RichProgressBar(),  # its defaults: updated after every batch, drawn 100 times a second
        timer_callback(timer),
    ]
    trainer = L.Trainer(
        accelerator=accelerator(), devices=1, max_epochs=1, callbacks=callbacks,
        logger=TensorBoardLogger(out, name="tb"), default_root_dir=out, log_every_n_steps=10,
    )  # fmt: skip
    trainer.fit(model, train_dataloaders=loader(case, steps, 0), val_dataloaders=loader(case, 2, 1))
    return final_loss(model.net, case)


class CountingTimer(StepTimer):
    """Counts, for each step of the window (one batch's start to the next one's), either the
    Python function and builtin calls of the training thread ("calls") or the torch ops
    dispatched ("ops"; one at a time: counting ops makes Python calls). Exact and repeatable,
    unlike times on a shared machine; slow, so in runs of their own."""

    def __init__(self, warmup: int, measured: int, what: str) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        super().__init__(warmup, measured)
        self.what, self.counts, self._n = what, [], 0
        timer = self

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                timer._n += 1
                return func(*args, **(kwargs or {}))

        self._mode = Ops()

    def _count(self, frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            self._n += 1

    def _start(self, on: bool) -> None:
        if self.what == "calls":
            sys.setprofile(self._count if on else None)
        elif on:
            self._mode.__enter__()
        else:
            self._mode.__exit__(None, None, None)

    def at_step_start(self, step: int) -> None:
        end = self.warmup + self.measured
        if self.warmup < step <= end:
            self._start(False)
            self.counts.append(self._n)
        if self.warmup <= step < end:
            self._n = 0
            self._start(True)

    def at_step_end(self, step: int) -> None:
        pass


def work_per_step(measured: int, out: Path) -> dict[str, Any]:
    """Median Python calls and torch ops per step of each variant, each case (see CountingTimer).
    A step that logs or redraws the bar does more: the median is the quiet step's."""
    import lightning as L
    import torch

    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for name, case in CASES.items():
        L.seed_everything(0, verbose=False)
        net0 = make_net(case)
        results[name] = {
            v: counted(measured, functools.partial(run_variant, v, case, net0), out / f"work_{v}")
            for v in variants_of(case)
        }
    return results


def counted(measured: int, run: Any, out: Path, *extra: Any) -> dict[str, float]:
    """Median Python calls and torch ops per step of `run(steps, timer, out, *extra)`, one run
    for each count."""
    counts = {}
    for what, key in (("calls", "python_calls"), ("ops", "torch_ops")):
        timer = CountingTimer(10, measured, what)
        # One step more than the window: its start closes the window's last step.
        run(10 + measured + 1, timer, Path(f"{out}_{what}"), *extra)
        counts[key] = statistics.median(timer.counts)
    return counts


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def rotated(items: list[str], shift: int) -> list[str]:
    shift %= len(items)
    return items[shift:] + items[:shift]


def run_variant(variant: str, case: dict, net0, steps: int, timer: StepTimer, out: Path) -> float:
    if variant == "A":
        return run_a(case, net0, steps, timer)
    if variant == "B":
        return run_b(case, net0, steps, timer)
    if variant == "L":
        return run_l(case, net0, steps, timer, out)
    return run_c(case, net0, steps, timer, out, with_perf=variant == "C")


def bench_steps(reps: int, warmup: int, measured: int, out: Path) -> dict[str, Any]:
    import lightning as L
    import torch

    torch.set_num_threads(1)
    has_perf = "perf" in compose_default(next(iter(CASES.values())), 1, out, True).callbacks
    results: dict[str, Any] = {}
    for name, case in CASES.items():
        L.seed_everything(0, verbose=False)
        net0 = make_net(case)
        steps = warmup + measured
        variants = [v for v in variants_of(case) if v != "D" or has_perf]
        times: dict[str, list[float]] = {k: [] for k in variants}
        cpu_times: dict[str, list[float]] = {k: [] for k in variants}
        losses: dict[str, float] = {}
        for rep in range(reps):
            # Each repetition starts at another variant: a position effect (the first run in a
            # process is slower) then hits every variant alike.
            for variant in rotated(variants, rep):
                timer = StepTimer(warmup, measured)
                run_dir = out / f"{name}_{variant}_{rep}"
                losses[variant] = run_variant(variant, case, net0, steps, timer, run_dir)
                times[variant].append(timer.us_per_step)
                cpu_times[variant].append(timer.cpu_us_per_step)
        results[name] = summarize(times, losses)
        results[name]["thread_cpu"] = summarize(cpu_times, losses)
        results[name]["samples_per_sec"] = {
            k: case["batch_size"] * 1e6 / statistics.median(v) for k, v in times.items() if v
        }
        if is_lm(case):
            results[name]["tokens_per_sec"] = {
                k: v * case["block_size"] for k, v in results[name]["samples_per_sec"].items()
            }
    return results


def summarize(times: dict[str, list[float]], losses: dict[str, float]) -> dict[str, Any]:
    def ratio(top: str, bottom: str) -> dict[str, float]:
        return spread([t / b for t, b in zip(times[top], times[bottom], strict=True)])

    def minus_ms(top: str, bottom: str) -> float:
        return (statistics.median(times[top]) - statistics.median(times[bottom])) / 1e3

    entry: dict[str, Any] = {
        "us_per_step": {k: spread(v) for k, v in times.items() if v},
        "ratio_B_over_A": ratio("B", "A"),
        "ratio_C_over_A": ratio("C", "A"),
        "overhead_C_minus_A_ms": minus_ms("C", "A"),
        "overhead_C_minus_B_ms": minus_ms("C", "B"),
        "overhead_B_minus_A_ms": minus_ms("B", "A"),
        "final_loss": losses,
        "A_and_B_same_loss_5dp": round(losses["A"], 5) == round(losses["B"], 5),
    }
    if times.get("L"):  # the typical template: classifier cases only
        entry.update(ratio_L_over_A=ratio("L", "A"), ratio_C_over_L=ratio("C", "L"),
                     overhead_L_minus_A_ms=minus_ms("L", "A"))  # fmt: skip
    if times.get("D"):
        entry["ratio_C_over_D_perfmonitor"] = ratio("C", "D")
    return entry


def process_times(reps: int, out: Path) -> dict[str, Any]:
    """`train.py --help` wall time, and start-to-first-step of `python train.py`, split in three."""
    helps = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, check=True
        )
        helps.append(time.perf_counter() - t0)
    phases: dict[str, list[float]] = {
        "imports_and_compose_s": [],
        "setup_s": [],
        "first_step_s": [],
    }
    for rep in range(max(1, reps // 2)):
        stamps = out / f"timeline_{rep}.json"
        t0 = time.time()
        cmd = [
            sys.executable, "train.py", f"paths.log_dir={out}/proc", f"run_name=t{rep}",
            "trainer.max_epochs=1", "++trainer.limit_train_batches=2",
            "++trainer.limit_val_batches=1",
            "test=false", "+callbacks.timeline._target_=timeline.Timeline",
            f"+callbacks.timeline.path={stamps}",
        ]  # fmt: skip
        # bench/ on the path for the Timeline callback; the rest as the caller has it.
        path = os.pathsep.join(filter(None, [str(ROOT / "bench"), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""}
        subprocess.run(cmd, cwd=ROOT, capture_output=True, check=True, env=env)
        t = json.loads(stamps.read_text())
        phases["imports_and_compose_s"].append(t["built"] - t0)
        phases["setup_s"].append(t["train_start"] - t["built"])
        phases["first_step_s"].append(t["first_step_end"] - t["train_start"])
    return {"help_wall_s": spread(helps), **{k: spread(v) for k, v in phases.items()}}


def machine() -> dict[str, Any]:
    import lightning
    import torch

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())  # fmt: skip
    return {
        "cpu": cpu, "logical_cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(), "torch": torch.__version__,
        "lightning": lightning.__version__, "threads": 1,
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else None,
    }  # fmt: skip


def table(results: dict[str, Any]) -> str:
    head = ("| case | A µs/step | B | C | L | C/A (min–max) | L/A | C−A ms | C−B ms | B−A ms "
            "| PerfMonitor C/D |")  # fmt: skip
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["steps"].items():
        us = {k: v["median"] for k, v in r["us_per_step"].items()}
        ca, la = r["ratio_C_over_A"], r.get("ratio_L_over_A")
        cd = r.get("ratio_C_over_D_perfmonitor")
        perf = f"{cd['median']:.3f}" if cd else "n/a"
        l_us = f"{us['L']:.0f}" if "L" in us else "n/a"
        l_ratio = f"{la['median']:.3f}" if la else "n/a"
        lines.append(
            f"| {name} | {us['A']:.0f} | {us['B']:.0f} | {us['C']:.0f} | {l_us} "
            f"| {ca['median']:.3f} ({ca['min']:.3f}–{ca['max']:.3f}) | {l_ratio} "
            f"| {r['overhead_C_minus_A_ms']:.3f} | {r['overhead_C_minus_B_ms']:.3f} "
            f"| {r['overhead_B_minus_A_ms']:.3f} | {perf} |"
        )
    work = results.get("work_per_step")
    if work:
        lines += ["", "| per quiet step | " + " | ".join(VARIANTS) + " |",
                  "|---|" + "---|" * len(VARIANTS)]  # fmt: skip
        for name, w in work.items():
            for key, label in (("python_calls", "Python calls"), ("torch_ops", "torch ops")):
                cells = " | ".join(f"{w[v][key]:.0f}" if v in w else "n/a" for v in VARIANTS)
                lines.append(f"| {name}: {label} | {cells} |")
    p = results.get("process")
    if p:
        med = {k: v["median"] for k, v in p.items()}
        lines += [
            "",
            f"`python train.py --help`: {med['help_wall_s']:.2f} s (median); start to first "
            f"step: imports+compose {med['imports_and_compose_s']:.2f} s, setup "
            f"{med['setup_s']:.2f} s, first step {med['first_step_s']:.2f} s",
        ]
    return "\n".join(lines)


OWNERS = (  # path fragment -> owner, first match wins
    ("/fasttrain/", "fasttrain"), ("/lightning/", "Lightning"), ("/torchmetrics/", "torchmetrics"),
    ("/rich/", "rich (progress bar)"), ("/tensorboard", "TensorBoard"), ("/torch/", "torch"),
)  # fmt: skip


def callback_costs(out: Path, measured: int = 50) -> dict[str, Any]:
    """What each default callback (and Lightning's model summary) costs per quiet step of the
    first case: the Python calls and torch ops of C less those of C without it
    (exact counts; times of a single callback are below this VM's resolution)."""
    import lightning as L
    import torch

    torch.set_num_threads(1)
    case = next(iter(CASES.values()))  # the first of --cases: tiny_mlp by default
    names = [n for n, c in compose_default(case, 1, out, True).callbacks.items() if c is not None]
    drops = ["", *names, "model_summary"]
    L.seed_everything(0, verbose=False)
    net0 = make_net(case)
    run = functools.partial(run_c, case, net0)
    counts = {d: counted(measured, run, out / f"cb_{d}", True, d) for d in drops}
    full = counts[""]
    return {
        "default_per_step": full,
        "saved_per_step_without": {
            d: {k: full[k] - v for k, v in counts[d].items()} for d in drops if d
        },
    }


class ProfiledTimer(StepTimer):
    """A StepTimer that profiles exactly its window of steps."""

    def __init__(self, warmup: int, measured: int) -> None:
        import cProfile

        super().__init__(warmup, measured)
        self.profiler = cProfile.Profile()

    def at_step_start(self, step: int) -> None:
        super().at_step_start(step)
        if step == self.warmup:
            self.profiler.enable()

    def at_step_end(self, step: int) -> None:
        if step == self.warmup + self.measured - 1:
            self.profiler.disable()
        super().at_step_end(step)


def profile(warmup: int, measured: int, out: Path) -> dict[str, dict[str, float]]:
    """µs per step by owner over the timed window of the tiny case (cProfile's own time per
    function, summed by the package it lives in; C functions called from Python: "builtins")."""
    import pstats

    import lightning as L
    import torch

    torch.set_num_threads(1)
    case = CASES["tiny_mlp"]
    L.seed_everything(0, verbose=False)
    net0 = make_net(case)
    owners: dict[str, dict[str, float]] = {}
    for variant in ("A", "B", "C", "L"):
        timer = ProfiledTimer(warmup, measured)
        run_variant(variant, case, net0, warmup + measured, timer, out / f"profile_{variant}")
        by_owner: dict[str, float] = {}
        stats = pstats.Stats(timer.profiler).stats  # type: ignore[attr-defined]
        for (path, _, _), row in stats.items():
            owner = next((o for frag, o in OWNERS if frag in path), None)
            owner = owner or ("builtins (C calls)" if path == "~" else "other Python")
            by_owner[owner] = by_owner.get(owner, 0.0) + row[2]  # tottime, seconds
        owners[variant] = {k: round(1e6 * v / measured, 1) for k, v in sorted(by_owner.items())}
        owners[variant]["total (profiled)"] = round(sum(owners[variant].values()), 1)
    return owners


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="a few steps, no results written")
    parser.add_argument("--profile", action="store_true", help="cProfile by owner, tiny case")
    parser.add_argument("--callbacks", action="store_true", help="each default callback's cost")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--json", type=Path, default=None, help="results file (default: cpu.json)")
    parser.add_argument("--out", type=Path, default=None, help="scratch dir for the runs")
    args = parser.parse_args()
    import tempfile

    global DEVICE
    DEVICE = args.device
    for name in [c for c in CASES if c not in args.cases]:
        del CASES[name]

    reps, warmup, measured = (1, 2, 3) if args.smoke else (args.reps, 10, 200)
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        if args.callbacks:
            costs = callback_costs(out, 5 if args.smoke else 50)
            print(json.dumps(costs, indent=2))
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / "cpu_callbacks.json").write_text(json.dumps(costs, indent=2) + "\n")
            return
        if args.profile:
            owners = profile(warmup, measured * 3, out)
            print(json.dumps(owners, indent=2))
            path = args.json or RESULTS / "cpu_profile.json"  # gpu_check.sh names its own
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(owners, indent=2) + "\n")
            return
        results = {
            "machine": machine(),
            "settings": {"reps": reps, "warmup_steps": warmup, "measured_steps": measured},
            "device": DEVICE,
            "steps": bench_steps(reps, warmup, measured, out),
            "work_per_step": work_per_step(5 if args.smoke else 50, out),
        }
        if DEVICE == "cpu":
            results["process"] = process_times(1 if args.smoke else reps, out)
    print(json.dumps(results, indent=2) if args.smoke else table(results))
    if not args.smoke:
        target = args.json or RESULTS / "cpu.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {target}")


if __name__ == "__main__":
    main()
