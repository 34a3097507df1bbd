"""The language-model recipes side by side: `model=gpt` (GPT-2's, nanoGPT's) against
`model=gpt_modern` and against gpt_modern with each of its pieces switched off alone, on the same
corpus split, model size, batches and token budget, on the CPU.

    taskset -c 1 python bench/lm_recipes.py                 # bench/results/lm_recipes.{json,png}
    python bench/lm_recipes.py --steps 40 --every 20 --out /tmp/quick   # a quick look
    taskset -c 1 python bench/lm_recipes.py --recipes gpt_modern --budget 900
        # one recipe alone for 900 CPU seconds: bench/results/lm_recipes_budget.json

Each recipe is composed from conf/ with the overrides a user types (`model=gpt_modern
model.net.pos=learned`, ...), built by fasttrain.assemble.build, and trained by a plain loop
(forward, cross-entropy, backward, the recipe's optimizer and lr schedule): the recipes' own cost,
not the trainer's, which is the same for all (bench/overhead.py measures that). The recipes take
turns, `--every` steps each (interleaved: a slower moment of the machine falls on all of them).
Every `--every` steps each is scored on the same fixed windows of the held-out test split
(the bytes bench/text_bpb.py scores, gzip -9 next to them); only the training steps are timed
(CPU seconds of this process: one thread, so CPU time is its time on one core).

With `--budget S` each recipe named in `--recipes` trains alone (no gpt baseline) until S CPU
seconds of training steps: its lr schedule runs over the steps that S allows, estimated from
the CPU time of 20 pilot steps on a copy (the run stops at S, or at the schedule's end), and it is
scored every `--every` steps on the same held-out windows, against gzip -9 on them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from text_bpb import baselines, splits  # noqa: E402  # the corpus and gzip's bits/byte

RESULTS = ROOT / "bench" / "results"
MODERN = ["model=gpt_modern"]
# name -> the overrides of `python train.py data=text ...`; each "no_*" switches one piece off
RECIPES: dict[str, list[str]] = {
    "gpt": ["model=gpt"],
    "gpt_modern": MODERN,
    "no_rope": [*MODERN, "model.net.pos=learned"],
    "no_rmsnorm": [*MODERN, "model.net.norm=layer"],
    "no_qk_norm": [*MODERN, "model.net.qk_norm=false"],
    "no_relu2": [*MODERN, "model.net.mlp=gelu"],
    "no_untied": [*MODERN, "model.net.tie_embeddings=true"],
    "no_softcap": [*MODERN, "model.net.softcap=null"],
    # AdamW for every parameter, at model=gpt's lr
    "no_muon": [
        *MODERN,
        "model/optimizer=adamw",
        "model.optimizer.lr=0.001",
        "+model.optimizer.betas=[0.9,0.95]",
    ],
}


class Recipe:
    """One recipe's net, optimizer, schedule and batches, and what it measured."""

    def __init__(self, name: str, overrides: list[str], steps: int, block: int, batch: int,
                 train: np.ndarray) -> None:  # fmt: skip
        self.name, self.overrides = name, overrides
        self.block, self.batch, self.train = block, batch, train
        self.net, self.optimizer, self.schedule = build(overrides, steps, block)
        self.rng = np.random.default_rng(0)  # every recipe gets the same batches
        self.cpu_s, self.steps = 0.0, 0
        self.curve: list[dict[str, float]] = []  # {"step", "cpu_s", "bpb"}

    def batch_of_windows(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.rng.integers(0, len(self.train) - self.block - 1, self.batch)
        windows = np.stack([self.train[s : s + self.block + 1] for s in starts]).astype(np.int64)
        tokens = torch.from_numpy(windows)  # [B, block + 1]
        return tokens[:, :-1], tokens[:, 1:]

    def run(self, steps: int, budget: float = math.inf) -> None:
        """`steps` training steps, or fewer where the CPU seconds reach `budget`."""
        self.net.train()
        for _ in range(steps):
            if self.cpu_s >= budget:
                break
            x, y = self.batch_of_windows()
            start = time.process_time()
            logits = self.net(x)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.schedule.step()
            self.cpu_s += time.process_time() - start
            self.steps += 1

    def score(self, windows: torch.Tensor) -> None:
        self.curve.append({"step": self.steps, "cpu_s": self.cpu_s,
                           "bpb": bits_per_byte(self.net, windows)})  # fmt: skip


def build(overrides: list[str], steps: int, block: int) -> tuple[Any, Any, Any]:
    """The recipe's net, its optimizer on the task's param groups (Muon's marked), and its lr
    schedule over `steps`, as the LanguageModel task builds them."""
    from hydra import compose, initialize_config_dir

    from fasttrain.assemble import build as build_node
    from fasttrain.models.muon import mark_hidden_matrices, takes_hidden_matrices

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["data=text", f"data.block_size={block}", *overrides])
    torch.manual_seed(0)  # the same initial weights where two recipes share a shape
    task = build_node(cfg.model, "model")
    groups = task.param_groups()
    if takes_hidden_matrices(task.optimizer_factory):
        groups = mark_hidden_matrices(groups, task.net)
    optimizer = task.optimizer_factory(groups)
    schedule = task.scheduler_factory(optimizer, total_steps=steps)
    return task.net, optimizer, schedule


@torch.no_grad()
def bits_per_byte(net: Any, windows: torch.Tensor) -> float:
    """Mean bits per byte of the next byte over the fixed held-out windows [N, block + 1]."""
    net.eval()
    losses = [F.cross_entropy(net(w[:, :-1]).flatten(0, 1).float(), w[:, 1:].flatten())
              for w in windows.split(64)]  # fmt: skip
    return float(torch.stack(losses).mean()) / math.log(2)


def held_out(test: np.ndarray, block: int, count: int) -> torch.Tensor:
    """`count` windows spread evenly over the test split: [count, block + 1]."""
    starts = np.linspace(0, len(test) - block - 2, count).astype(np.int64)
    return torch.from_numpy(np.stack([test[s : s + block + 1] for s in starts]).astype(np.int64))


def at_time(curve: list[dict[str, float]], cpu_s: float) -> float | None:
    """bits/byte at `cpu_s` CPU seconds, linear between the scored points (None: not reached)."""
    points = [(p["cpu_s"], p["bpb"]) for p in curve]  # the first: the untrained net's, at 0 s
    for (t0, b0), (t1, b1) in itertools.pairwise(points):
        if t0 <= cpu_s <= t1:
            return b0 + (b1 - b0) * (cpu_s - t0) / max(t1 - t0, 1e-9)
    return None


def time_to(curve: list[dict[str, float]], bpb: float) -> float | None:
    """CPU seconds at which the curve first reaches `bpb`, linear between points (None: never)."""
    for before, point in itertools.pairwise(curve):
        if point["bpb"] <= bpb:
            share = (before["bpb"] - bpb) / max(before["bpb"] - point["bpb"], 1e-9)
            return before["cpu_s"] + share * (point["cpu_s"] - before["cpu_s"])
    return None


def summary(recipes: list[Recipe], gzip_bpb: float) -> dict[str, Any]:
    base = recipes[0]
    equal_time = min(r.cpu_s for r in recipes)  # every recipe has run this long
    target = base.curve[-1]["bpb"]
    rows = {}
    for r in recipes:
        per_step = r.cpu_s / r.steps
        reached, gzip_at = time_to(r.curve, target), time_to(r.curve, gzip_bpb)
        rows[r.name] = {
            "overrides": " ".join(r.overrides),
            "bpb_at_equal_steps": round(r.curve[-1]["bpb"], 4),
            "bpb_at_equal_cpu_s": round(at_time(r.curve, equal_time) or float("nan"), 4),
            "cpu_s_per_step": round(per_step, 4),
            "step_cost_vs_gpt": round(per_step / (base.cpu_s / base.steps), 3),
            "tokens_per_s": round(r.batch * r.block / per_step),
            "cpu_s_to_gpt_final": None if reached is None else round(reached, 1),
            "share_of_gpt_cpu_s": None if reached is None else round(reached / base.cpu_s, 3),
            "cpu_s_to_gzip": None if gzip_at is None else round(gzip_at, 1),
            "curve": [{k: round(v, 4) for k, v in p.items()} for p in r.curve],
        }
    return {"equal_cpu_s": round(equal_time, 1), "recipes": rows}


def table(result: dict[str, Any]) -> str:
    head = ("| recipe | bits/byte at equal steps | at equal CPU time | CPU s/step | vs gpt | "
            "tokens/s | CPU s to gpt's final (share) |\n|---|---|---|---|---|---|---|")  # fmt: skip
    lines = [head]
    for name, r in result["recipes"].items():
        reached = ("not reached" if r["cpu_s_to_gpt_final"] is None
                   else f"{r['cpu_s_to_gpt_final']} ({r['share_of_gpt_cpu_s']:.0%})")  # fmt: skip
        lines.append(f"| {name} | {r['bpb_at_equal_steps']:.3f} | {r['bpb_at_equal_cpu_s']:.3f} | "
                     f"{r['cpu_s_per_step']:.3f} | {r['step_cost_vs_gpt']:.2f}x | "
                     f"{r['tokens_per_s']:,} | {reached} |")  # fmt: skip
    return "\n".join(lines)


def plot(result: dict[str, Any], gzip_bpb: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, r in result["recipes"].items():
        style = "-" if name in ("gpt", "gpt_modern") else ":"
        ax.plot([p["cpu_s"] for p in r["curve"]], [p["bpb"] for p in r["curve"]], style,
                label=name, linewidth=2 if style == "-" else 1)  # fmt: skip
    ax.axhline(gzip_bpb, color="grey", linestyle="--", label="gzip -9")
    ax.set(xlabel="CPU seconds of training (one thread)", ylabel="held-out bits per byte",
           title="Language-model recipes on the same bytes")  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report(r: Recipe) -> None:
    print(f"{r.name:>11} step {r.steps:5d}  {r.cpu_s:7.1f} CPU s  "
          f"{r.curve[-1]['bpb']:.3f} bits/byte", flush=True)  # fmt: skip


def pilot_cpu_s_per_step(name: str, block: int, batch: int, train: np.ndarray) -> float:
    """CPU seconds a training step of `name` takes, from 20 steps after 3 on a copy."""
    pilot = Recipe(name, RECIPES[name], 1000, block, batch, train)
    pilot.run(3)
    pilot.cpu_s = 0.0
    pilot.run(20)
    return pilot.cpu_s / 20


def budget_runs(args: argparse.Namespace, train: np.ndarray, windows: torch.Tensor,
                gzip_bpb: float, context: dict[str, Any]) -> None:  # fmt: skip
    """Each recipe of --recipes alone for --budget CPU seconds: lm_recipes_budget.json."""
    rows = {}
    for name in args.recipes:
        per_step = pilot_cpu_s_per_step(name, args.block, args.batch, train)
        steps = max(1, int(args.budget / per_step))
        r = Recipe(name, RECIPES[name], steps, args.block, args.batch, train)
        r.score(windows)
        while r.steps < steps and r.cpu_s < args.budget:
            r.run(min(args.every, steps - r.steps), args.budget)
            r.score(windows)
            report(r)
        gzip_at = time_to(r.curve, gzip_bpb)
        best = min(r.curve, key=lambda p: p["bpb"])
        rows[name] = {
            "overrides": " ".join(r.overrides),
            "pilot_cpu_s_per_step": round(per_step, 4),
            "schedule_steps": steps,
            "steps": r.steps,
            "cpu_s": round(r.cpu_s, 1),
            "final_bpb": round(r.curve[-1]["bpb"], 4),
            "best_bpb": round(best["bpb"], 4),
            "beats_gzip_9": r.curve[-1]["bpb"] < gzip_bpb,
            "cpu_s_to_gzip": None if gzip_at is None else round(gzip_at, 1),
            "curve": [{k: round(v, 4) for k, v in p.items()} for p in r.curve],
        }
        print(f"{name}: {rows[name]['final_bpb']:.3f} bits/byte after {r.cpu_s:.0f} CPU s "
              f"({r.steps} steps); gzip -9 {gzip_bpb:.3f}, reached at "
              f"{rows[name]['cpu_s_to_gzip']} CPU s", flush=True)  # fmt: skip
    result = {**context, "budget_cpu_s": args.budget, "every": args.every, "recipes": rows}
    (args.out / "lm_recipes_budget.json").write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps per recipe")
    parser.add_argument("--every", type=int, default=100, help="steps per turn, then a score")
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--eval-windows", type=int, default=256)
    parser.add_argument("--recipes", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--budget", type=float, default=None,
                        help="CPU seconds: train each of --recipes alone this long "
                             "(lm_recipes_budget.json)")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)  # CPU time per step is one core's, whatever the machine
    parts = splits()
    gzip_bpb = baselines(parts)["gzip_9"]
    train, test = (np.frombuffer(parts[s], dtype=np.uint8) for s in ("train", "test"))
    windows = held_out(test, args.block, args.eval_windows)
    context = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, torch threads 1",
        "torch": torch.__version__,
        "corpus": "this Python's standard library .py sources (bench/text_bpb.py's split)",
        "sizes": "tiny: 4 layers, 4 heads, width 128",
        "block": args.block, "batch": args.batch,
        "eval": f"{args.eval_windows} fixed windows of the test split",
        "gzip_9": round(gzip_bpb, 4),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    if args.budget is not None:
        budget_runs(args, train, windows, gzip_bpb, context)
        return
    names = ["gpt", *(n for n in args.recipes if n != "gpt")]  # the baseline first
    recipes = [Recipe(n, RECIPES[n], args.steps, args.block, args.batch, train) for n in names]
    for r in recipes:
        r.score(windows)
    for start in range(0, args.steps, args.every):
        for r in recipes:
            r.run(min(args.every, args.steps - start))
            r.score(windows)
            report(r)
    result = {**context, "steps": args.steps, **summary(recipes, gzip_bpb)}
    (args.out / "lm_recipes.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, gzip_bpb, args.out / "lm_recipes.png")
    print(table(result))


if __name__ == "__main__":
    main()
