"""Debug configs show what they promise: debug=profile's summary table covers training steps."""

from __future__ import annotations

from pathlib import Path

from test_configs import compose_for


def test_profile_summary_covers_training_steps(tmp_path: Path) -> None:
    from fasttrain.tasks import train

    train(compose_for("debug/profile.yaml", tmp_path, ["data.num_workers=0", "test=false",
                                                       "model=mlp", "logger=none"]))  # fmt: skip
    summary = (tmp_path / "run" / "profiler" / "fit-profile.txt").read_text()
    # forward (the Linear layers), backward and the optimizer step of training steps
    for op in ("aten::addmm", "AddmmBackward0", "Optimizer.step#AdamW.step"):
        assert op in summary, op
    assert "validation_step" not in summary
