"""Data modules: deterministic splits, normalisation, loader settings, clear errors."""

from __future__ import annotations

import pytest
import torch

from fasttrain.config.errors import ConfigError
from fasttrain.data import DigitsDataModule, SyntheticDataModule, resolve_num_workers
from fasttrain.data import base as data_base


def splits(dm) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    dm.setup("fit")
    return {name: ds.tensors for name, ds in dm.splits.items()}


def test_digits_split_is_deterministic_disjoint_and_normalised() -> None:
    a, b = splits(DigitsDataModule(seed=3)), splits(DigitsDataModule(seed=3))
    other = splits(DigitsDataModule(seed=4))
    assert all(torch.equal(a[k][0], b[k][0]) for k in a)
    assert not torch.equal(a["test"][0], other["test"][0])
    sizes = {k: len(v[1]) for k, v in a.items()}
    assert sum(sizes.values()) == 1797
    assert sizes["test"] == pytest.approx(0.2 * 1797, abs=2)
    assert sizes["val"] == pytest.approx(0.15 * 1797, abs=2)
    # no sample in two splits (digits has a few duplicate images, so compare by count)
    rows = torch.cat([v[0].flatten(1) for v in a.values()])
    assert torch.unique(rows, dim=0).shape[0] >= 1797 - 20
    x_train = a["train"][0]
    assert x_train.shape[1:] == (1, 8, 8) and x_train.dtype == torch.float32
    assert x_train.mean().item() == pytest.approx(0.0, abs=1e-4)
    assert x_train.std().item() == pytest.approx(1.0, abs=1e-3)
    # stratified: every class is present in every split
    assert all(torch.unique(v[1]).numel() == 10 for v in a.values())


def test_loaders_apply_the_configured_settings() -> None:
    dm = DigitsDataModule(batch_size=16, num_workers=2, pin_memory=False, prefetch_factor=3)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.batch_size == 16 and loader.num_workers == 2 and loader.prefetch_factor == 3
    assert loader.persistent_workers and not loader.pin_memory
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (16, 1, 8, 8) and y.dtype == torch.long


def test_without_workers_the_worker_only_options_are_dropped() -> None:
    dm = DigitsDataModule(num_workers=0, persistent_workers=True, prefetch_factor=4)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert (
        loader.num_workers == 0 and not loader.persistent_workers and loader.prefetch_factor is None
    )


def test_auto_workers_follow_thecpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    for cpus, expected in ((1, 0), (2, 1), (16, 8), (64, 8)):
        monkeypatch.setattr(data_base, "cpu_count", lambda n=cpus: n)
        assert resolve_num_workers("auto") == expected
    assert resolve_num_workers(3) == 3


def test_auto_pin_memory_follows_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    for available in (True, False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda a=available: a)
        assert DigitsDataModule(num_workers=0).pin_memory is available
    assert DigitsDataModule(num_workers=0, pin_memory=False).pin_memory is False


def test_synthetic_shapes_classes_and_determinism() -> None:
    dm = SyntheticDataModule(num_samples=200, input_shape=[2, 5, 7], num_classes=4, seed=1)
    s = splits(dm)
    assert s["train"][0].shape == (160, 2, 5, 7)
    assert sum(len(v[1]) for v in s.values()) == 200
    assert int(torch.cat([v[1] for v in s.values()]).min()) >= 0
    assert int(torch.cat([v[1] for v in s.values()]).max()) <= 3
    again = splits(
        SyntheticDataModule(num_samples=200, input_shape=[2, 5, 7], num_classes=4, seed=1)
    )
    assert torch.equal(s["test"][0], again["test"][0])


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"val_fraction": 1.5}, "val_fraction"),
        ({"test_fraction": 0.0}, "test_fraction"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "val_fraction"),
        ({"prefetch_factor": 0}, "prefetch_factor"),
        ({"input_shape": [1, 28, 28]}, "input_shape"),
    ],
)
def test_digits_rejects_bad_values(kwargs: dict, arg: str) -> None:
    with pytest.raises(ConfigError) as err:
        DigitsDataModule(**kwargs)
    assert err.value.arg == arg


def test_digits_rejects_too_few_classes() -> None:
    with pytest.raises(ConfigError) as err:
        DigitsDataModule(num_classes=5)  # labels go up to 9: checked when built, before any run
    assert err.value.arg == "num_classes"


@pytest.mark.slow  # a process start (~10 s): CI runs it in make test-slow
def test_a_process_exits_while_a_loader_worker_is_still_serving(tmp_path) -> None:
    """Workers ignore SIGTERM (fasttrain.fit saves last.ckpt on it); multiprocessing stops
    daemonic children at exit with SIGTERM and then joins them, so an iterator left open (an
    error mid-epoch) made the interpreter wait forever at exit."""
    import subprocess
    import sys

    script = tmp_path / "open_iterator.py"
    script.write_text(
        "from fasttrain.data import DigitsDataModule\n"
        "dm = DigitsDataModule(batch_size=16, num_workers=1, persistent_workers=True)\n"
        "dm.setup('fit')\n"
        "it = iter(dm.train_dataloader())\n"
        "next(it)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
