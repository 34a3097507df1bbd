"""The check loop every format shares: outputs against eager, agreement, the task's held-out
score (accuracy for a classifier, R^2 for a regressor), latency. What "the same answer" and "the
score" mean comes from the task (fasttrain.models.task: `agreement`, `deviation`, `score`)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol

import torch
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from torch import nn

from fasttrain.config.domains import NonNegative, Range, check_arguments
from fasttrain.config.errors import UserError
from fasttrain.deploy.files import atomic_path
from fasttrain.deploy.formats import Criterion, Runner, torch_runner
from fasttrain.models.protocols import relative_deviation

LATENCY_BATCHES = (1, 64)


class OutputChecks(Protocol):
    """What the checks use (fasttrain.models.protocols.Exportable; `deviation` optional)."""

    def score(self) -> tuple[str, Any]: ...
    def agreement(self, outputs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class Tolerance:
    """What each format must reach to pass (compared with the eager fp32 net).

    Args:
        max_abs_diff: ONNX, TorchScript: largest output difference on the net's own scale
            (logits; target standard deviations for a regressor) and 100% agreement.
        max_acc_drop: int8: the task's test score (accuracy, R^2) may be at most this much below
            fp32's (0.01 = 1 point of accuracy).
        min_agreement: fp16: smallest share of test samples with the same answer (the same
            top-1 class; within 1% of a target's std).
    """

    # NaN would make every format fail its check (exit 1 after the whole export): refused.
    max_abs_diff: Annotated[float, NonNegative] = 1e-4
    max_acc_drop: Annotated[float, NonNegative] = 0.01
    min_agreement: Annotated[float, Range(0, 1, what="a share")] = 0.995

    def __post_init__(self) -> None:
        check_arguments(Tolerance.__init__, vars(self))

    def judge(self, criterion: Criterion, row: dict[str, Any], fp32_score: float,
              score: str = "accuracy") -> tuple[bool, str]:  # fmt: skip
        """(passed, the target in words) for one format's row of the report; `score` names the
        row's score (the task's)."""
        if criterion == "exact":
            ok = row["max_abs_diff"] <= self.max_abs_diff and row["agreement"] == 1.0
            return ok, f"max abs diff <= {self.max_abs_diff:g} and 100% agreement"
        if criterion == "accuracy":
            ok = fp32_score - row[score] <= self.max_acc_drop
            return ok, f"{score} >= fp32 - {self.max_acc_drop:g}"
        return row["agreement"] >= self.min_agreement, f"agreement >= {self.min_agreement:g}"


class _Tally:
    """One candidate's running comparison with the eager net over the held-out batches."""

    def __init__(self, checks: OutputChecks) -> None:
        self.checks = checks
        self.score_name, self.score = checks.score()
        self.max_abs_diff, self.agree, self.answers, self.seen = 0.0, 0, 0, 0

    def add(self, outputs: torch.Tensor, reference: torch.Tensor, target: torch.Tensor) -> None:
        own = getattr(self.checks, "deviation", None)  # a plain module's default: relative
        deviation = (own or relative_deviation)(outputs, reference)
        self.max_abs_diff = max(self.max_abs_diff, deviation.max().item())
        same = self.checks.agreement(outputs, reference)  # per answer: a sample, a position
        self.agree += int(same.sum())
        self.answers += same.numel()
        self.score.update(outputs, target)
        self.seen += len(target)

    def summary(self) -> dict[str, float]:
        return {"max_abs_diff": self.max_abs_diff, "agreement": self.agree / max(1, self.answers),
                self.score_name: float(self.score.compute()), "samples": self.seen}  # fmt: skip


def median_ms(run: Runner, x: torch.Tensor, min_run_time: float) -> float:
    """Median time of `run(x)` in ms; torch's Timer warms up and synchronises CUDA."""
    from torch.utils.benchmark import Timer

    # All threads, as in serving (Timer pins torch to 1 thread by default, which would also
    # make torch formats look slower than ONNX Runtime, which keeps its own thread pool).
    timer = Timer("run(x)", globals={"run": run, "x": x}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def verify(
    net: nn.Module,
    checks: OutputChecks,
    candidates: dict[str, tuple[Runner, torch.device]],
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    latency_time: float = 0.2,
) -> dict[str, dict[str, Any]]:
    """Run `net` (fp32, eager) and every candidate over the held-out `batches` (x, y on CPU),
    compared as the task (`checks`) says.

    Each candidate is compared with the eager net on the device it computes on, so a difference
    measures the export, not CPU against GPU kernels (TF32 convolutions, other reductions).
    Returns, per candidate: max_abs_diff, agreement, the task's score (e.g. accuracy), samples,
    device, and
    latency_ms per batch size.
    """
    devices = {device for _, device in candidates.values()}
    references = {d: torch_runner(copy.deepcopy(net), d) for d in devices}
    tallies = {name: _Tally(checks) for name in candidates}
    head: list[torch.Tensor] = []  # the first inputs, up to the largest latency batch
    for x, y in batches:
        expected = {d: run(x) for d, run in references.items()}
        for name, (run, device) in candidates.items():
            tallies[name].add(run(x), expected[device], y)
        if sum(map(len, head)) < max(LATENCY_BATCHES):
            head.append(x)
    if not head:
        raise UserError("the test split is empty: nothing to check the exports on")
    pool = torch.cat(head)
    # Fewer test samples than a batch: repeat them (latency does not depend on the values).
    inputs = {b: pool[torch.arange(b) % len(pool)].contiguous() for b in LATENCY_BATCHES}
    return {
        name: {**tallies[name].summary(), "device": str(device),
               "latency_ms": {str(b): median_ms(run, inputs[b], latency_time)
                              for b in LATENCY_BATCHES}}
        for name, (run, device) in candidates.items()
    }  # fmt: skip


def write_report(path: Path, report: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(report, indent=2))


def print_report(report: dict[str, Any]) -> None:
    """One table: a row per format, the eager fp32 net first as the baseline."""
    score = report.get("score", "accuracy")
    shown = {"accuracy": "acc"}.get(score, score)
    table = Table(title=f"export check: {report['test_samples']} test samples vs eager fp32",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)  # fmt: skip
    table.add_column("format")
    for column in ("size", "max|Δ|", "agree", shown, *(f"b{b} ms" for b in LATENCY_BATCHES)):
        table.add_column(column, justify="right")
    table.add_column("device")
    table.add_column("check")
    for name, row in report["formats"].items():
        if "skipped" in row:
            table.add_row(name, *[""] * (5 + len(LATENCY_BATCHES)), f"skipped: {row['skipped']}")
            continue
        check = "-" if "passed" not in row else ("[green]pass" if row["passed"] else "[red]FAIL")
        table.add_row(
            name, f"{row['size_bytes'] / 1024:.0f}K", f"{row['max_abs_diff']:.1e}",
            f"{row['agreement']:.1%}",
            f"{row[score]:.1%}" if score == "accuracy" else f"{row[score]:.4f}",
            *[f"{row['latency_ms'][str(b)]:.3g}" for b in LATENCY_BATCHES], row["device"], check,
        )  # fmt: skip
    # Never narrower than the table: a log file or a pipe reports 80 columns, and the table
    # needs ~90 to show every figure whole.
    console = Console(soft_wrap=True, width=max(Console().width, 100))
    console.print(table)
    console.print(f"[bold]export dir[/]  {escape(str(report['output_dir']))}")  # not markup
