"""A checkpoint carrying pickled code is refused with a clear message, and the code never runs:
for evaluate (ckpt_path=) and for resuming a training run (resume=)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# What the refusal must say: that it refused, that code was found, and why it did not run.
MESSAGE_PARTS = ("refused", "pickled object", "weights_only")


class Payload:
    """Unpickling this runs a shell command: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def evil_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    """A checkpoint that looks like a Lightning one, with a payload among its hyperparameters."""
    marker = tmp_path / "payload_ran"
    ckpt = tmp_path / "evil.ckpt"
    torch.save(
        {"state_dict": {}, "hyper_parameters": {"net": Payload(marker)}, "global_step": 3}, ckpt
    )
    return ckpt, marker


def test_the_payload_is_real(evil_checkpoint: tuple[Path, Path]) -> None:
    # Control: unpickling without weights_only does run it, so the refusals below mean something.
    ckpt, marker = evil_checkpoint
    torch.load(ckpt, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize(
    ("entry", "override"), [("evaluate", "ckpt_path"), ("train", "resume")], ids=["eval", "resume"]
)
def test_pickled_code_is_refused_and_never_runs(
    entry: str, override: str, evil_checkpoint, tmp_path: Path, monkeypatch, capsys
) -> None:
    import importlib

    ckpt, marker = evil_checkpoint
    main = importlib.import_module(f"fasttrain.{entry}").main
    argv = [f"{override}={ckpt}", f"paths.log_dir={tmp_path / 'logs'}", "data.num_workers=0"]
    monkeypatch.setattr(sys, "argv", [entry, *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert err[-1].startswith(f"error: {override}={ckpt}: "), err[-1]
    assert all(part in err[-1] for part in MESSAGE_PARTS), err[-1]
    assert not marker.exists(), "the checkpoint's code ran"
    assert not list((tmp_path / "logs").rglob("*.yaml")), "a run folder was left behind"
