"""cv_summary.json of a k-fold sweep and its printed table (fasttrain.tools.crossval runs it):
each metric's mean and standard deviation over the folds beside its per-fold values."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

SUMMARY = "cv_summary.json"
FOLD = "data.fold="  # the override a fold sweep varies (as fasttrain.tools.crossval.FOLD)


def write(sweep_dir: Path) -> Path:
    """cv_summary.json in `sweep_dir`, replaced whole (a reader never sees half of it)."""
    file = sweep_dir / SUMMARY
    part = file.with_name(f".{SUMMARY}.{os.getpid()}")
    part.write_text(json.dumps(summarize(sweep_dir), indent=2))
    os.replace(part, file)
    return file


def summarize(sweep_dir: Path) -> dict[str, Any]:
    """{"sweep_dir", "groups": [{"overrides", "monitor", "folds", "runs", "missing", "metrics":
    {name: {"mean", "std", "per_fold"}}}]}: std is the sample standard deviation (n - 1), null
    for one fold; a metric is summarised only where every fold of its group logged it; the
    task's monitored metric (e.g. val/mse) comes first."""
    groups: dict[tuple[str, ...], list[tuple[int, Path]]] = {}
    for file in sorted(sweep_dir.glob("*/.hydra/overrides.yaml")):
        job = [str(o) for o in _yaml_list(file)]
        fold = next((o for o in job if o.lstrip("+").startswith(FOLD)), None)
        value = fold.split("=", 1)[1] if fold else ""
        if fold is None or not value.isdigit():
            continue  # not a fold: `data.fold=null` (the usual split) swept beside the folds
        rest = tuple(o for o in job if o != fold)
        groups.setdefault(rest, []).append((int(value), file.parent.parent))
    return {
        "sweep_dir": str(sweep_dir),
        "groups": [_group(list(k), sorted(v)) for k, v in groups.items()],
    }


def _group(overrides: list[str], jobs: list[tuple[int, Path]]) -> dict[str, Any]:
    done = [(fold, run, _metrics(run)) for fold, run in jobs]
    finished = [(fold, run, m) for fold, run, m in done if m is not None]
    # A fold run twice counts once (its first run): a mean over 0, 0, 1 would weigh fold 0 twice.
    folds = [job for i, job in enumerate(finished) if job[0] not in {f for f, _, _ in finished[:i]}]
    repeated = sorted(
        {fold for fold, _, _ in finished if [f for f, _, _ in finished].count(fold) > 1}
    )
    expected = _num_folds(jobs[0][1]) if jobs else None
    names = set.intersection(*(set(m) for _, _, m in folds)) if folds else set()
    monitor = next((m for _, run, _ in folds if (m := _monitor(run))), None)
    metrics = {}
    # The task's own metric first (its `monitor`, e.g. val/mse), then the rest by name.
    for name in sorted(names, key=lambda n: (n != monitor, n)):
        values = [float(m[name]) for _, _, m in folds]
        std = statistics.stdev(values) if len(values) > 1 else None
        metrics[name] = {"mean": statistics.fmean(values), "std": std, "per_fold": values}
    return {
        "overrides": overrides,
        "monitor": monitor,
        "folds": [fold for fold, _, _ in folds],
        "runs": [run.name for _, run, _ in folds],
        "missing": [run.name for _, run, m in done if m is None],  # no metrics.json: not finished
        "num_folds": expected,
        "folds_not_run": sorted(set(range(expected or 0)) - {f for f, _, _ in folds}),
        "repeated": repeated,
        "metrics": metrics,
    }


def _metrics(run: Path) -> dict[str, float] | None:
    file = run / "metrics.json"
    if not file.is_file():
        return None
    values = json.loads(file.read_text()).get("metrics", {})
    return {k: v for k, v in values.items() if isinstance(v, (int, float))}


def _num_folds(run: Path) -> int | None:
    """data.num_folds of a job, from the config Hydra saved in its folder."""
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.select(OmegaConf.load(run / ".hydra" / "config.yaml"), "data.num_folds")
    except OSError:
        return None
    return value if isinstance(value, int) else None


def _monitor(run: Path) -> str | None:
    """The metric the run's task is judged by, as its metrics.json records it."""
    monitor = json.loads((run / "metrics.json").read_text()).get("monitor")
    return monitor if isinstance(monitor, str) else None


def _yaml_list(file: Path) -> list[Any]:
    from omegaconf import OmegaConf

    return list(OmegaConf.to_container(OmegaConf.load(file)) or [])  # type: ignore[arg-type]


def fold_warnings(group: dict[str, Any]) -> list[str]:
    """What makes a group's mean not that of a full k-fold cross-validation, in words."""
    lines = []
    if group["folds_not_run"]:
        run, total = len(group["folds"]), group["num_folds"]
        absent = ", ".join(map(str, group["folds_not_run"]))
        lines.append(f"{run} of data.num_folds={total} folds finished (not: {absent}): the mean "
                     "is over those only")  # fmt: skip
    if group["repeated"]:
        lines.append(f"fold(s) {', '.join(map(str, group['repeated']))} ran more than once: each "
                     "counted once, its first run")  # fmt: skip
    return lines


def show(summary: dict[str, Any], file: Path) -> None:
    """One table per group: the val/ and test/ metrics, mean ± std, then each fold's value; the
    task's own metric first, in bold."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(soft_wrap=True)
    groups = summary["groups"]
    shared = set.intersection(*(set(g["overrides"]) for g in groups)) if groups else set()
    for group in groups:
        differs = [o for o in group["overrides"] if o not in shared]  # what tells groups apart
        # overrides such as `model.net.hidden=[64,32]`: escaped, not read as rich markup
        title = "cross-validation" + (f" ({escape(', '.join(differs))})" if differs else "")
        table = Table(title=f"{title}: {len(group['folds'])} folds", title_justify="left")
        for column in ("metric", "mean", "std", *(f"fold {f}" for f in group["folds"])):
            table.add_column(column, justify="left" if column == "metric" else "right")
        for name, m in group["metrics"].items():
            if name.startswith(("val/", "test/")):
                std = "-" if m["std"] is None else f"{m['std']:.4f}"
                shown = f"[bold]{name}[/]" if name == group["monitor"] else name
                table.add_row(shown, f"{m['mean']:.4f}", std, *(f"{v:.4f}" for v in m["per_fold"]))
        console.print(table)
        if group["missing"]:
            console.print(f"[bold]not finished[/] {escape(', '.join(group['missing']))}")
        for line in fold_warnings(group):
            console.print(f"[bold]note[/]        {escape(line)}")
    console.print(f"[bold]summary[/]     {escape(str(file))}")
