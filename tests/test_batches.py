"""In-memory data served a batch at a time (one gather), on the host or on the device: exactly the
batches of the sample-wise loader it replaces, in the same order, resumed mid-epoch, sharded
per rank; and the bad values of data.on_device refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from conftest import run_cli
from fasttrain.config.errors import ConfigError
from fasttrain.data import DigitsDataModule
from fasttrain.data.resumable import EpochShuffle

BATCH = 48


def sample_wise(dm: DigitsDataModule, split: str, sampler=None) -> list[tuple[torch.Tensor, ...]]:
    """The batches a plain DataLoader over a TensorDataset gives (__getitem__ + collate)."""
    plain = TensorDataset(*dm.splits[split].tensors)
    if split == "train" and sampler is None:
        sampler = EpochShuffle(plain, seed=dm.seed, epoch=0)
    return list(DataLoader(plain, batch_size=BATCH, sampler=sampler))


def assert_same(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)


def module(**kwargs) -> DigitsDataModule:
    dm = DigitsDataModule(batch_size=BATCH, num_workers=0, pin_memory=False, **kwargs)
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "on_device"])
def test_batched_loaders_give_the_sample_wise_batches(on_device: bool) -> None:
    dm = module(on_device=on_device)
    assert_same(list(dm.train_dataloader()), sample_wise(dm, "train"))
    assert_same(list(dm.val_dataloader()), sample_wise(dm, "val"))
    # a batch is one gather, not a collate of samples
    assert type(dm.train_dataloader().dataset).__getitems__ is not None


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "on_device"])
def test_batched_loader_resumes_mid_epoch_where_it_stopped(on_device: bool) -> None:
    dm = module(on_device=on_device)
    full = sample_wise(dm, "train")
    loader = dm.train_dataloader()
    seen = []
    for batch in loader:
        seen.append(batch)
        if len(seen) == 5:
            break
    state = loader.state_dict()
    resumed = module(on_device=on_device).train_dataloader()
    resumed.load_state_dict(state)
    assert_same(seen + list(resumed), full)


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "on_device"])
def test_each_rank_gets_its_shard_as_lightning_injects_it(on_device: bool) -> None:
    # What Lightning does under DDP: re-create the loader with a DistributedSampler.
    from lightning.pytorch.utilities.data import _update_dataloader

    dm = module(on_device=on_device)
    shards = []
    for rank in (0, 1):
        sampler = DistributedSampler(dm.splits["train"], num_replicas=2, rank=rank, seed=7)
        loader = _update_dataloader(dm.train_dataloader(), sampler)
        assert type(loader) is type(dm.train_dataloader())
        expected = sample_wise(dm, "train", DistributedSampler(
            dm.splits["train"], num_replicas=2, rank=rank, seed=7))  # fmt: skip
        got = list(loader)
        assert_same(got, expected)
        shards.append(torch.cat([x for x, _ in got]))
    rows = {tuple(r.tolist()) for r in shards[0].flatten(1)}
    overlap = sum(tuple(r.tolist()) in rows for r in shards[1].flatten(1))
    assert overlap <= 1 + 10  # one padding sample at most, and digits' few duplicate images


def test_auto_workers_are_none_for_data_in_memory() -> None:
    assert DigitsDataModule().num_workers == 0
    assert DigitsDataModule(num_workers=2).num_workers == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"on_device": "yes"}, "expected true or false"),
        ({"on_device": True, "num_workers": 2}, "set data.num_workers=0"),
    ],
)
def test_bad_on_device_values_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DigitsDataModule(**kwargs)


@pytest.mark.slow  # a process start (~10 s); the check itself: test_bad_on_device_values_are_named
def test_on_device_with_workers_fails_in_one_line_before_anything_is_written(
    tmp_path: Path,
) -> None:
    proc = run_cli(["train.py", "data.on_device=true", "data.num_workers=2"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "data.on_device" in lines[0] and "num_workers=0" in lines[0]
    assert not any(tmp_path.rglob("*"))


def test_on_device_too_large_for_the_device_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from fasttrain.config.errors import UserError
    from fasttrain.data import batches

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1000, 10_000))
    dm = module(on_device=True)
    with pytest.raises(UserError, match=r"data.on_device=true: the data set takes .* free"):
        batches.check_fits_on(dm.splits, torch.device("cuda", 0))
