"""Reliability, round three: restored checkpoint state that names files outside the run, ..."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import run_cli
from task_cases import compose_train

RUN = ["model=mlp", "data=wine", "data.num_workers=0", "logger=none", "trainer.max_epochs=1"]


def craft_escaping_state(ckpt: Path, victim: Path) -> None:
    """Every ModelCheckpoint state of `ckpt` names `victim` through `<dirpath>/../..`."""
    state = torch.load(ckpt, weights_only=True)
    for key, value in state["callbacks"].items():
        if key.startswith("ModelCheckpoint") and value.get("dirpath"):
            depth = len(Path(value["dirpath"]).relative_to(victim.parent).parts)
            escaping = str(Path(value["dirpath"], *[".."] * depth, victim.name))
            value.update(best_model_path=escaping, kth_best_model_path=escaping,
                         last_model_path=escaping, best_k_models={escaping: torch.tensor(0.0)})  # fmt: skip
    torch.save(state, ckpt)


@pytest.mark.parametrize("resume", ["auto", "path"])
def test_a_crafted_checkpoint_never_deletes_a_file_outside_the_run(
    resume: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fasttrain.tasks import train

    train(compose_train([*RUN, "run_name=r"], tmp_path))
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    craft_escaping_state(last, victim)
    chosen = "resume=auto" if resume == "auto" else f"resume={last}"
    # Two more epochs: Lightning replaces its best and last files (and removes "old" ones).
    train(compose_train([*RUN, "run_name=r", chosen, "trainer.max_epochs=3"], tmp_path))
    assert victim.read_text() == "keep me"
    said = [r.getMessage() for r in caplog.records if "outside this run's checkpoint" in r.message]
    assert said and "victim.txt" in said[0]
    assert torch.load(last, weights_only=True)["epoch"] == 2  # the run went on
