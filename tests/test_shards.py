"""Streaming shards (WebDataset): prepare writes them, data=shards reads them; disjoint
coverage across ranks and workers, equal batches per rank, exact mid-epoch resume."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("webdataset", reason="shards need WebDataset: pip install -e '.[data]'")
pytest.importorskip("PIL", reason="shards need Pillow: pip install -e '.[data]'")
from fasttrain.config.errors import UserError
from fasttrain.data.shards import (
    ShardLoader,
    ShardsDataModule,
    ShardStream,
    plan,
    resume_point,
    write_shards,
)
from fasttrain.testing.fake_data import write_image_folder


class Numbered:
    """A data module stand-in whose image i is 2x1 pixels holding i: (i % 256, i // 256, 0)."""

    class_names = ("a", "b", "c")

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes

    def encoded(self, split: str):
        from PIL import Image

        start = {"train": 0, "val": 10_000, "test": 20_000}[split]
        for i in range(start, start + self.sizes[split]):
            buffer = io.BytesIO()
            Image.fromarray(np.array([[[i % 256, i // 256, 0]] * 2], np.uint8)).save(buffer, "PNG")
            yield "png", buffer.getvalue(), i % 3


def flat(batches: list[list[int]]) -> list[int]:
    return [n for batch in batches for n in batch]


def ident(image) -> torch.Tensor:
    """The transform for Numbered images: the number they hold, as a 1-element tensor."""
    pixel = np.asarray(image.convert("RGB"))[0, 0]
    return torch.tensor([int(pixel[0]) + 256 * int(pixel[1])])


def numbered_shards(tmp_path: Path, train: int, shard_size: int) -> tuple[list[str], list[int]]:
    meta = write_shards(Numbered({"train": train, "val": 5, "test": 5}), tmp_path / "s", shard_size)
    info = meta["splits"]["train"]
    return [str(tmp_path / "s" / n) for n in info["shards"]], info["counts"]


def epoch(urls, counts, rank=0, world=1, workers=2, batch=4, shuffle=True, state=None, e=0):
    """(the numbers served by one rank in one epoch, in order, per batch; the loader)."""
    stream = ShardStream(urls, counts, batch, ident, rank, world, workers, shuffle, seed=3)
    loader = ShardLoader(stream, num_workers=workers)
    loader._epoch = e
    if state is not None:
        loader.load_state_dict(state)
    return [x.flatten().tolist() for x, _ in loader], loader


def test_prepare_writes_every_split_with_labels_and_class_names(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from conftest import CONF
    from fasttrain.tasks import prepare

    root = write_image_folder(tmp_path / "imgs", per_class=10)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("prepare", overrides=[
            f"data.path={root}", "data.num_classes=3", f"output_dir={tmp_path}/shards",
            "shard_size=7", f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path}/run",
        ])  # fmt: skip
    meta = prepare(cfg)
    saved = json.loads((tmp_path / "shards" / "meta.json").read_text())
    assert saved == meta and meta["class_names"] == ["cat", "dog", "fish"]
    from fasttrain.data.image_folder import ImageFolderDataModule

    source = ImageFolderDataModule(str(root), 3, [3, 16, 16], image_size=[16, 16], num_workers=0)
    sizes = [len(source.parts[s]) for s in ("train", "val", "test")]  # the folder's own split
    assert [sum(meta["splits"][s]["counts"]) for s in ("train", "val", "test")] == sizes
    full, rest = divmod(sizes[0], 7)  # shards of shard_size=7, the last one what is left
    assert meta["splits"]["train"]["counts"] == [7] * full + ([rest] if rest else [])
    dm = ShardsDataModule(str(tmp_path / "shards"), 3, [3, 16, 16], image_size=[16, 16],
                          num_workers=0, batch_size=64)  # fmt: skip
    for split in ("train", "val", "test"):
        x, y = next(iter(dm.loader(split, shuffle=False)))
        assert x.dtype == torch.uint8 and x.shape[1:] == (3, 16, 16)
        assert Counter(y.tolist()) == Counter(label for _, label in source.parts[split])


def test_one_process_sees_each_sample_once_per_epoch_in_a_new_order(tmp_path: Path) -> None:
    urls, counts = numbered_shards(tmp_path, train=23, shard_size=4)
    first, _ = epoch(urls, counts, e=0)
    second, _ = epoch(urls, counts, e=1)
    assert sorted(flat(first)) == list(range(23)) == sorted(flat(second))
    assert first != second and epoch(urls, counts, e=0)[0] == first  # fixed by seed and epoch


def test_two_ranks_two_workers_read_disjoint_shards_in_equal_batch_counts(tmp_path: Path) -> None:
    urls, counts = numbered_shards(tmp_path, train=26, shard_size=4)  # 7 shards: 4,4,...,2
    ranks = [epoch(urls, counts, rank=r, world=2, workers=2)[0] for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1])  # DDP: no rank waits on another
    seen = [flat(batches) for batches in ranks]
    own = [set(s) for s in seen]
    assert own[0].isdisjoint(own[1]) and own[0] | own[1] == set(range(26))
    # Whole shards per (rank, worker): each shard's samples come from one rank only.
    shard_of = {n: i // 4 for i, n in enumerate(range(26))}
    for samples in own:
        shards = {shard_of[n] for n in samples}
        assert all(shard_of[n] in shards for n in samples)
    # Padding only repeats a rank's own samples, and only as much as it needs.
    padded = [len(s) - len(set(s)) for s in seen]
    assert min(padded) == 0 and max(padded) < 2 * 4


def test_plan_gives_every_worker_whole_shards_and_ranks_equal_totals() -> None:
    counts = [10, 10, 10, 10, 10, 3]
    layout = plan(counts, world=2, workers=2, batch_size=4, order=list(range(6)))
    shards = sorted(s for rank in layout for mine, _ in rank for s in mine)
    assert shards == list(range(6))
    assert len({sum(b for _, b in rank) for rank in layout}) == 1
    assert resume_point([3, 1, 2], 5) == ([2, 1, 2], 0)
    assert resume_point([3, 1, 2], 4) == ([2, 1, 1], 1)


@pytest.mark.parametrize("workers", [0, 2])
def test_mid_epoch_resume_serves_exactly_the_remaining_batches(tmp_path: Path, workers) -> None:
    # 7 shards (4 samples each, the last 2): with 2 workers, one has 4 batches, the other 3.
    urls, counts = numbered_shards(tmp_path, train=26, shard_size=4)
    full, _ = epoch(urls, counts, workers=workers, e=2)
    for stop in (3, 6):  # at 6 the second worker has served all it had
        stream = ShardStream(urls, counts, 4, ident, 0, 1, workers, True, seed=3)
        loader = ShardLoader(stream, num_workers=workers)
        loader._epoch = 2
        served = []
        for x, _ in loader:
            served.append(x.flatten().tolist())
            if len(served) == stop:
                break
        state = loader.state_dict()
        assert state == {"epoch": 2, "batches": stop, "batch_size": 4}
        rest, _ = epoch(urls, counts, workers=workers, state=state)
        assert served + rest == full, stop


def test_a_path_without_shards_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"path='.*empty': no shards there \(meta\.json unread"):
        ShardsDataModule(str(tmp_path / "empty"), 3, [3, 32, 32], num_workers=0)


def test_prepare_refuses_a_full_output_dir_and_fewer_shards_than_ranks(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "x").write_text("keep me")
    with pytest.raises(UserError, match=r"output_dir=.*exists and is not empty"):
        write_shards(Numbered({"train": 4, "val": 2, "test": 2}), tmp_path / "s", 10)
    assert (tmp_path / "s" / "x").read_text() == "keep me"
    write_shards(Numbered({"train": 4, "val": 2, "test": 2}), tmp_path / "t", 10)
    dm = ShardsDataModule(str(tmp_path / "t"), 3, [3, 32, 32], num_workers=0)

    class Two:
        global_rank, world_size, current_epoch = 0, 2, 0

    dm.trainer = Two()  # type: ignore[assignment]
    with pytest.raises(UserError, match=r"1 train shard\(s\) for 2 processes"):
        dm.train_dataloader()


@pytest.mark.slow  # a process start (~10 s): CI runs it in make test-slow
def test_cli_prepare_into_a_full_folder_is_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    from conftest import run_cli

    root = write_image_folder(tmp_path / "imgs", per_class=3)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    args = ["-m", "fasttrain.prepare", "data=image_folder", f"data.path={root}",
            "data.num_classes=3", f"output_dir={tmp_path}/out"]  # fmt: skip
    proc = run_cli(args, tmp_path / "logs")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == (f"error: output_dir='{tmp_path}/out': exists and is not empty; "
                                   "choose a new folder")  # fmt: skip
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("damage", ["empty", "zeros"])
def test_a_shard_holding_fewer_samples_than_meta_says_stops_naming_it(
    tmp_path: Path, damage: str
) -> None:
    import signal

    urls, counts = numbered_shards(tmp_path, train=12, shard_size=4)
    size = Path(urls[1]).stat().st_size
    Path(urls[1]).write_bytes(b"" if damage == "empty" else bytes(size))

    def hung(*_: object) -> None:
        raise TimeoutError("the reader spins on a shard without samples")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        # An empty file is no tar archive; a zero-filled one is a tar of no samples.
        said = "is not a readable tar" if damage == "empty" else "holds 0 samples, but meta"
        with pytest.raises(UserError, match=rf"train-000001\.tar {said}"):
            epoch(urls, counts, workers=0, shuffle=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def shards_without_counts(tmp_path: Path, split: str) -> Path:
    """Shards whose meta.json gives no sample counts for `split`."""
    numbered_shards(tmp_path, train=8, shard_size=4)
    meta_file = tmp_path / "s" / "meta.json"
    meta = json.loads(meta_file.read_text())
    del meta["splits"][split]["counts"]
    meta_file.write_text(json.dumps(meta))
    return tmp_path / "s"


def test_meta_without_counts_is_one_line(tmp_path: Path) -> None:
    shards_without_counts(tmp_path, "train")
    with pytest.raises(UserError, match=r"gives no sample count \(counts\) for each train shard"):
        ShardsDataModule(str(tmp_path / "s"), 3, [3, 32, 32], num_workers=0)


@pytest.mark.slow  # one process, ~10 s: CI runs it in make test-slow
def test_cli_meta_without_counts_is_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    from conftest import run_cli, run_dirs

    shards = shards_without_counts(tmp_path, "val")
    args = ["train.py", "data=shards", f"data.path={shards}", "data.num_classes=3"]
    proc = run_cli(args, tmp_path / "logs")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: data.path=")
    assert "Traceback" not in proc.stderr
    assert not run_dirs(tmp_path / "logs") and not list((tmp_path / "logs").rglob("*.log"))
