"""What the template costs per training step, against the hand-written loop it replaces.

    python bench/overhead.py            # full run: writes bench/results/cpu.json, prints a table
    python bench/overhead.py --smoke    # a few steps: proves the script still works (tested)

In one process, single-threaded (torch.set_num_threads(1)), same net, data, seed and batches:
  A  the seeds' loop: zero_grad, forward, loss, backward, step
  B  fasttrain's Classifier under a lean Lightning Trainer (no logger, bar, checkpoint)
  C  fasttrain's default configuration, composed from conf/ (TensorBoard, progress bar,
     checkpoints, and every default callback) with only the data and net swapped
  D  C without the PerfMonitor callback (its overhead is C/D), when the default has one
interleaved A B C D A B C D ... so drift on the machine hits all alike. Per-step time is taken
inside each run over the same window of steps (after warm-up), data loading included.
"""

from __future__ import annotations

import argparse
import copy
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

# Two step sizes: a tiny MLP (framework overhead dominates) and a conv net whose step takes
# >= 5 ms on one thread (the realistic case the targets are set for).
CASES = {
    "tiny_mlp": {"net": "mlp", "input_shape": [1, 8, 8], "batch_size": 64},
    "conv_5ms": {"net": "small_cnn", "input_shape": [3, 32, 32], "batch_size": 64},
}


def make_net(kind: str, input_shape: list[int]):
    from fasttrain.models.nets import MLP, SmallCNN

    if kind == "mlp":
        return MLP(input_shape, 10, hidden=[64], dropout=0.0)
    return SmallCNN(input_shape, 10, channels=[16, 32], dropout=0.0)


class StepTimer:
    """Times steps [warmup, warmup + measured) from inside the loop, the same way for A, B, C."""

    def __init__(self, warmup: int, measured: int) -> None:
        self.warmup, self.measured = warmup, measured
        self.start = self.end = 0.0

    def at_step_start(self, step: int) -> None:
        if step == self.warmup:
            self.start = time.perf_counter()

    def at_step_end(self, step: int) -> None:
        if step == self.warmup + self.measured - 1:
            self.end = time.perf_counter()

    @property
    def us_per_step(self) -> float:
        return (self.end - self.start) / self.measured * 1e6


def loader(case: dict, steps: int, seed: int):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    gen = torch.Generator().manual_seed(seed)
    n = steps * case["batch_size"]
    x = torch.randn(n, *case["input_shape"], generator=gen)
    y = torch.randint(0, 10, (n,), generator=gen)
    # No shuffle, no workers: A, B and C see the same batches in the same order.
    return DataLoader(TensorDataset(x, y), batch_size=case["batch_size"], shuffle=False)


def final_loss(net, case: dict) -> float:
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(123)
    x = torch.randn(256, *case["input_shape"], generator=gen)
    y = torch.randint(0, 10, (256,), generator=gen)
    net.eval()
    with torch.no_grad():
        return F.cross_entropy(net(x), y).item()


def run_a(case: dict, net0, steps: int, timer: StepTimer) -> float:
    import torch
    import torch.nn.functional as F

    net = copy.deepcopy(net0).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(loader(case, steps, seed=0)):
        timer.at_step_start(step)
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
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
    import functools

    import lightning as L
    import torch

    from fasttrain.models import Classifier

    model = Classifier(copy.deepcopy(net0), functools.partial(torch.optim.AdamW, lr=1e-3), 10)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[timer_callback(timer)],
    )  # fmt: skip
    trainer.fit(model, train_dataloaders=loader(case, steps, seed=0))
    return final_loss(model.net, case)


def compose_default(case: dict, steps: int, out: Path, with_perf: bool):
    from hydra import compose, initialize_config_dir

    from fasttrain import CONFIG_DIR

    overrides = [
        f"paths.root_dir={out}", f"paths.output_dir={out}", "trainer.accelerator=cpu",
        "trainer.max_epochs=1", f"++trainer.limit_train_batches={steps}", "model.scheduler=null",
        "model.optimizer._target_=torch.optim.AdamW", "model.optimizer.lr=0.001",
        "model.optimizer.weight_decay=0.01",
    ]  # fmt: skip
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    if not with_perf:
        cfg.callbacks.perf = None
    return cfg


def run_c(case: dict, net0, steps: int, timer: StepTimer, out: Path, with_perf: bool) -> float:
    from fasttrain.assemble import build_run

    cfg = compose_default(case, steps, out, with_perf)
    # Built exactly as `python train.py` builds it (ResumeState, atomic checkpoint IO included);
    # the bench feeds its own batches, so the data module goes unused.
    trainer, model, _ = build_run(cfg, [timer_callback(timer)], net=copy.deepcopy(net0))
    # Validation every epoch as in the default, on a copy of the batches (runs after the window).
    trainer.fit(model, train_dataloaders=loader(case, steps, 0), val_dataloaders=loader(case, 2, 1))
    return final_loss(model.net, case)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def bench_steps(reps: int, warmup: int, measured: int, out: Path) -> dict[str, Any]:
    import lightning as L
    import torch

    torch.set_num_threads(1)
    has_perf = "perf" in compose_default(CASES["tiny_mlp"], 1, out, True).callbacks
    results: dict[str, Any] = {}
    for name, case in CASES.items():
        L.seed_everything(0, verbose=False)
        net0 = make_net(case["net"], case["input_shape"])
        steps = warmup + measured
        times: dict[str, list[float]] = {k: [] for k in ("A", "B", "C", "D")}
        losses: dict[str, float] = {}
        for rep in range(reps):
            for variant in ("A", "B", "C", "D"):
                if variant == "D" and not has_perf:
                    continue
                timer = StepTimer(warmup, measured)
                if variant == "A":
                    losses["A"] = run_a(case, net0, steps, timer)
                elif variant == "B":
                    losses["B"] = run_b(case, net0, steps, timer)
                else:
                    run_dir = out / f"{name}_{variant}_{rep}"
                    losses[variant] = run_c(case, net0, steps, timer, run_dir, variant == "C")
                times[variant].append(timer.us_per_step)
        a = times["A"]
        entry: dict[str, Any] = {
            "us_per_step": {k: spread(v) for k, v in times.items() if v},
            "ratio_B_over_A": spread([b / x for b, x in zip(times["B"], a, strict=True)]),
            "ratio_C_over_A": spread([c / x for c, x in zip(times["C"], a, strict=True)]),
            "overhead_C_minus_A_ms": statistics.median(times["C"]) / 1e3
            - statistics.median(a) / 1e3,
            "final_loss": losses,
            "A_and_B_same_loss_5dp": round(losses["A"], 5) == round(losses["B"], 5),
        }
        if times["D"]:
            entry["ratio_C_over_D_perfmonitor"] = spread(
                [c / d for c, d in zip(times["C"], times["D"], strict=True)]
            )
        results[name] = entry
    return results


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
    }  # fmt: skip


def table(results: dict[str, Any]) -> str:
    head = "| case | A µs/step | B µs/step | C µs/step | B/A (min–max) | C/A (min–max) | C−A ms |"
    lines = [head + " PerfMonitor C/D |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results["steps"].items():
        us = r["us_per_step"]
        ba, ca = r["ratio_B_over_A"], r["ratio_C_over_A"]
        cd = r.get("ratio_C_over_D_perfmonitor")
        perf = f"{cd['median']:.3f}" if cd else "n/a"
        a, b, c = (us[k]["median"] for k in "ABC")
        lines.append(
            f"| {name} | {a:.0f} | {b:.0f} | {c:.0f} "
            f"| {ba['median']:.3f} ({ba['min']:.3f}–{ba['max']:.3f}) "
            f"| {ca['median']:.3f} ({ca['min']:.3f}–{ca['max']:.3f}) "
            f"| {r['overhead_C_minus_A_ms']:.3f} | {perf} |"
        )
    p = results["process"]
    med = {k: v["median"] for k, v in p.items()}
    lines += [
        "",
        f"`python train.py --help`: {med['help_wall_s']:.2f} s (median); start to first step: "
        f"imports+compose {med['imports_and_compose_s']:.2f} s, setup {med['setup_s']:.2f} s, "
        f"first step {med['first_step_s']:.2f} s",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="a few steps, no results written")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="scratch dir for the runs")
    args = parser.parse_args()
    import tempfile

    reps, warmup, measured = (1, 2, 3) if args.smoke else (args.reps, 10, 60)
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        results = {
            "machine": machine(),
            "settings": {"reps": reps, "warmup_steps": warmup, "measured_steps": measured},
            "steps": bench_steps(reps, warmup, measured, out),
            "process": process_times(1 if args.smoke else reps, out),
        }
    print(json.dumps(results, indent=2) if args.smoke else table(results))
    if not args.smoke:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "cpu.json").write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {RESULTS / 'cpu.json'}")


if __name__ == "__main__":
    main()
