"""Debug configs show what they promise: debug=profile's summary table covers training steps."""

from __future__ import annotations

import json
from pathlib import Path

from test_configs import compose_for


def test_profile_summary_covers_training_steps(tmp_path: Path) -> None:
    from fasttrain.tasks import train

    train(compose_for("debug/profile.yaml", tmp_path, ["data.num_workers=0", "test=false",
                                                       "model=mlp", "logger=none"]))  # fmt: skip
    folder = tmp_path / "run" / "profiler"
    summary = (folder / "fit-profile.txt").read_text()
    # The summary's rows are the costliest by total CPU time, whose order a loaded machine
    # shuffles below the step's own rows: those (a step holds every op in it) are always there.
    for row in ("run_training_batch", "Optimizer.step#AdamW.step"):
        assert row in summary, row
    assert "validation_step" not in summary
    # The trace holds every op of the recorded steps: forward (the Linear layers), backward and
    # the optimizer step.
    (trace,) = folder.glob("fit-*.pt.trace.json")
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    for op in ("aten::addmm", "AddmmBackward0", "Optimizer.step#AdamW.step"):
        assert op in names, op
