"""Streaming shards: WebDataset tar files for data beyond one disk or one machine.

    python -m fasttrain.prepare data=image_folder data.path=DIR output_dir=SHARDS
    python train.py data=shards data.path=SHARDS          (a folder, or an http(s)/pipe: URL)

`prepare` writes each split of any image data set as `<split>-000000.tar, ...` (WebDataset's
layout: one `<key>.<jpg|png|...>` and `<key>.cls` per sample, images stored as the source has
them) and `meta.json` (class names, every shard's sample count). Reading streams the tars with
WebDataset; decoding and augmentation run in loader workers as for image folders.

Who reads what (a plan every rank computes alike from meta.json, the epoch and the seed):
- Shards go to ranks, then to each rank's workers, round-robin over an order shuffled per epoch
  (training) or kept (val/test): every (rank, worker) reads a disjoint set of whole shards.
- Every rank serves the same number of batches per epoch, so DDP never waits on a rank that ran
  out: a rank whose shards hold fewer samples pads with whole batches that repeat its own
  samples from the start (DistributedSampler pads the same way). Apart from that padding, each
  sample is seen once per epoch; with one process there is no padding at all. A worker's last
  batch may be short.
- Within a worker, samples are shuffled through a buffer (`shuffle_buffer`) seeded by (seed,
  epoch, rank, worker).
- Mid-epoch resume is exact: the checkpoint holds the number of batches served; each worker
  replays its stream (reading, not decoding) past the batches it had served, so the resumed
  epoch serves exactly the batches the interrupted one had left.

Each rank needs a shard at least and each worker one: the workers of a rank are capped at its
number of shards (a log line says so). Workers restart every epoch (persistent_workers is off
here): they take the epoch's plan with them.
"""

from __future__ import annotations

import collections
import io
import itertools
import json
import math
import random
import shutil
import tarfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from fasttrain.config.domains import AtLeast, Shape, check_arguments
from fasttrain.config.errors import ConfigError, UserError
from fasttrain.data.base import Classes, worker_init
from fasttrain.data.images import IMAGE_SUFFIXES, ImageDataModule, pillow, upright_8bit

META = "meta.json"
FORMAT = "fasttrain-shards/1"
SPLITS = ("train", "val", "test")
IMAGE_KEYS = tuple(s.lstrip(".") for s in IMAGE_SUFFIXES)
ShardSize = Annotated[int, AtLeast(1, note="samples per shard")]


def webdataset() -> Any:
    try:
        import webdataset as wds
    except ImportError:
        raise UserError("shards need WebDataset: pip install -e '.[data]'") from None
    return wds


def write_shards(datamodule: Any, out: Path, shard_size: ShardSize = 1000) -> dict[str, Any]:
    """Write every split of `datamodule` (an image data module with `encoded(split)`) as shards
    into `out`, which must not exist or be empty. All or nothing: written beside `out`, then
    renamed into place. Returns the meta data (also in out/meta.json)."""
    check_arguments(write_shards, locals())
    wds = webdataset()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"output_dir={out}: exists and is not empty; choose a new folder")
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        splits = {}
        for split in SPLITS:
            counts: list[int] = []
            pattern = str(tmp / f"{split}-%06d.tar")
            with wds.ShardWriter(pattern, maxcount=shard_size, verbose=0) as sink:
                for i, (fmt, data, label) in enumerate(datamodule.encoded(split)):
                    sink.write({"__key__": f"{split}{i:09d}", fmt: data, "cls": str(label)})
                    if i % shard_size == 0:
                        counts.append(0)
                    counts[-1] += 1
            names = [f"{split}-{k:06d}.tar" for k in range(len(counts))]
            splits[split] = {"shards": names, "counts": counts}
        meta = {"format": FORMAT, "class_names": list(datamodule.class_names), "splits": splits}
        (tmp / META).write_text(json.dumps(meta, indent=1))
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def plan(
    counts: Sequence[int], world: int, workers: int, batch_size: int, order: Sequence[int]
) -> list[list[tuple[list[int], int]]]:
    """plan[rank][worker] = (shard indices in reading order, batches to serve).

    Shards in `order` go round-robin to ranks, then to each rank's workers. A worker serves
    ceil(samples / batch_size) batches; a rank short of the busiest rank's total adds padding
    batches to its workers in turn, so every rank serves the same number.
    """
    shards: list[list[list[int]]] = [[[] for _ in range(workers)] for _ in range(world)]
    for j, shard in enumerate(order):
        shards[j % world][(j // world) % workers].append(shard)
    batches = [[math.ceil(sum(counts[s] for s in mine) / batch_size) for mine in rank]
               for rank in shards]  # fmt: skip
    longest = max(sum(rank) for rank in batches)
    for rank in batches:
        for k in range(longest - sum(rank)):
            rank[k % workers] += 1
    return [list(zip(s, b, strict=True)) for s, b in zip(shards, batches, strict=True)]


def resume_point(batches: Sequence[int], served: int) -> tuple[list[int], int]:
    """(how many of each worker's batches are among a rank's first `served`, the worker whose
    batch comes next). The DataLoader takes one batch from each worker in turn, skipping
    workers that have none left."""
    done, turn = [0] * len(batches), 0
    while served > 0:
        if done[turn] < batches[turn]:
            done[turn] += 1
            served -= 1
        turn = (turn + 1) % len(batches)
    return done, turn


class ShardStream(IterableDataset):
    """One rank's batches (uint8 [B, C, H, W], int64 [B]) of one split, per the plan above.

    `epoch` and `skip` (batches of this epoch already served, on a mid-epoch resume) are set by
    ShardLoader before each pass; workers get them with their copy of this object.
    """

    def __init__(
        self, urls: Sequence[str], counts: Sequence[int], batch_size: int, transform: Any,
        rank: int = 0, world: int = 1, workers: int = 0, shuffle: bool = False, seed: int = 0,
        shuffle_buffer: int = 1000,
    ) -> None:  # fmt: skip
        self.urls, self.counts, self.batch_size = list(urls), list(counts), batch_size
        self.transform, self.shuffle, self.seed = transform, shuffle, seed
        self.rank, self.world, self.workers = rank, world, max(1, workers)
        self.shuffle_buffer = shuffle_buffer
        self.epoch, self.skip = 0, 0

    def plan(self) -> list[tuple[list[int], int]]:
        order = list(range(len(self.urls)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return plan(self.counts, self.world, self.workers, self.batch_size, order)[self.rank]

    def __len__(self) -> int:
        return sum(batches for _, batches in self.plan())

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        mine = self.plan()
        done, turn = resume_point([b for _, b in mine], self.skip)
        # A resumed DataLoader asks its workers in turn from worker 0 again: worker 0 takes the
        # part of the one whose batch came next, and so on, so the order is the original's.
        worker = ((info.id if info is not None else 0) + turn) % self.workers
        shards, total = mine[worker]
        skip = done[worker]
        raw = self._batches_of_raw_samples(shards, worker)
        for i, samples in enumerate(raw):
            if i >= total:
                return
            if i >= skip:  # skipped batches are read, never decoded
                yield self._decoded(samples)

    def _batches_of_raw_samples(self, shards: list[int], worker: int) -> Iterator[list[dict]]:
        """The worker's samples in batches: its shards once (the last batch maybe short), then
        again and again from the start, in whole batches, for as long as padding asks."""
        batch: list[dict] = []
        for rounds in itertools.count():
            seen: collections.Counter[str] = collections.Counter()
            for sample in self._readable(self._samples(shards, worker, rounds)):
                seen[str(sample.get("__url__"))] += 1
                batch.append(sample)
                if len(batch) == self.batch_size:
                    yield batch
                    batch = []
            if rounds == 0:
                # Fewer samples than meta.json promises (an empty or zero-filled shard) would
                # make the padding rounds below spin forever: stop, naming the shard.
                self._check_counts(shards, seen)
            if batch and rounds == 0:
                yield batch  # the short last batch; padding batches are whole
                batch = []

    def _readable(self, samples: Iterator[dict]) -> Iterator[dict]:
        """`samples`, with a shard that is not a tar archive (empty, cut short, overwritten)
        named in one line instead of tarfile's traceback."""
        try:
            yield from samples
        except (tarfile.TarError, OSError) as err:
            url = next((a for a in err.args if isinstance(a, str) and a in self.urls), "a shard")
            raise UserError(
                f"data.path: {url} is not a readable tar archive ({err.args[0]}); write the "
                "shards again with python -m fasttrain.prepare"
            ) from None

    def _check_counts(self, shards: list[int], seen: collections.Counter[str]) -> None:
        for s in shards:
            if seen[self.urls[s]] < self.counts[s]:
                raise UserError(
                    f"data.path: shard {self.urls[s]} holds {seen[self.urls[s]]} samples, but "
                    f"{META} counts {self.counts[s]}: it is damaged or was replaced; write the "
                    "shards again with python -m fasttrain.prepare"
                )

    def _samples(self, shards: list[int], worker: int, rounds: int) -> Iterator[dict]:
        wds = webdataset()
        stream = wds.tariterators.tarfile_samples([{"url": self.urls[s]} for s in shards])
        if not self.shuffle:
            return iter(stream)
        rng = random.Random(hash((self.seed, self.epoch, self.rank, worker, rounds)))
        shuffle = wds.shuffle(self.shuffle_buffer, min(100, self.shuffle_buffer), rng=rng)
        return iter(shuffle(stream))

    def _decoded(self, samples: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        Image = pillow()
        images, labels = [], []
        for sample in samples:
            key = next((k for k in IMAGE_KEYS if k in sample), None)
            if key is None or "cls" not in sample:
                raise UserError(f"data.path: sample {sample.get('__key__')} in "
                                f"{sample.get('__url__')} has no image or no cls")  # fmt: skip
            try:
                image = Image.open(io.BytesIO(sample[key]))
                image.load()
                image = upright_8bit(image, f"sample {sample['__key__']}")
            except (OSError, SyntaxError, ValueError) as err:
                raise UserError(
                    f"data.path: sample {sample['__key__']} in {sample.get('__url__')} is not a "
                    f"readable image ({err})"
                ) from None
            images.append(self.transform(image))
            labels.append(int(sample["cls"]))
        return torch.stack(images), torch.tensor(labels, dtype=torch.long)


class ShardLoader(DataLoader):
    """DataLoader of a ShardStream: hands it the epoch and the resume position before each
    pass, counts the batches served, and implements Lightning's loader state protocol (as
    fasttrain.data.resumable.ResumableLoader does) for an exact mid-epoch resume."""

    def __init__(self, dataset: ShardStream, epoch_of: Callable[[], int] | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(dataset, batch_size=None, **kwargs)
        self.epoch_of, self.samples_per_batch = epoch_of, dataset.batch_size
        self._epoch, self._served, self._skip = 0, 0, 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a counting generator
        stream: ShardStream = self.dataset  # type: ignore[assignment]
        if self.epoch_of is not None:
            self._epoch = self.epoch_of()
        stream.epoch, stream.skip = self._epoch, self._skip
        self._served, self._skip = self._skip, 0
        iterator = super().__iter__()  # workers start here, with this epoch's plan
        return self._count(iterator)

    def _count(self, iterator: Iterator[Any]) -> Iterator[Any]:
        for batch in iterator:
            self._served += 1
            yield batch
        if self.epoch_of is None:
            self._epoch += 1  # without a trainer: the next pass is the next epoch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "batches": self._served, "batch_size": self.samples_per_batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        size = self.samples_per_batch
        if state["batches"] and state.get("batch_size", size) != size:
            raise UserError(
                f"data.batch_size={size}: the checkpoint stopped mid-epoch after "
                f"{state['batches']} batches of {state['batch_size']}; resume with "
                f"data.batch_size={state['batch_size']}, or start over with resume=never"
            )
        self._epoch, self._skip = state["epoch"], state["batches"]


class ShardsDataModule(ImageDataModule):
    """Shards written by `python -m fasttrain.prepare` (see module doc).

    Args:
        path: the shards' folder, or a URL WebDataset opens (http(s)://..., pipe:...).
        num_classes: classes (checked against meta.json; the model interpolates it).
        input_shape: [channels, *image_size] (conf/data/shards.yaml derives it).
        shuffle_buffer: samples each worker shuffles through in training.
        **images: channels, image_size, mean, std, augmentation and loader knobs
            (fasttrain.data.images.ImageDataModule).
    """

    def __init__(
        self,
        path: str,
        num_classes: Classes,
        input_shape: Shape,
        shuffle_buffer: Annotated[int, AtLeast(1)] = 1000,
        **images: Any,
    ) -> None:
        super().__init__(num_classes, input_shape, **images)
        check_arguments(ShardsDataModule.__init__, locals())
        self.path, self.shuffle_buffer = str(path).rstrip("/"), shuffle_buffer
        self.meta = read_meta(self.path)
        self.class_names = list(self.meta["class_names"])
        if len(self.class_names) != num_classes:
            raise ConfigError(
                "num_classes", num_classes,
                f"the shards in {path} hold {len(self.class_names)} classes; set "
                f"data.num_classes={len(self.class_names)}",
            )  # fmt: skip
        self.save_hyperparameters()

    def setup(self, stage: str | None = None) -> None:
        pass  # nothing to hold: every loader streams

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        info = self.meta["splits"][split]
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer else (0, 1)
        shards = len(info["shards"])
        if shards < world:
            raise UserError(
                f"data.path={self.path}: {shards} {split} shard(s) for {world} processes; each "
                "needs one at least: prepare again with a smaller shard_size"
            )
        workers = min(self.num_workers, shards // world)
        if workers < self.num_workers:
            rank_zero_info(f"{split}: {workers} loader workers per process, one per shard")
        stream = ShardStream(
            [f"{self.path}/{name}" for name in info["shards"]], info["counts"], self.batch_size,
            self.transform(split == "train"), rank, world, workers, shuffle, self.seed,
            self.shuffle_buffer,
        )  # fmt: skip
        epoch_of = (lambda: int(trainer.current_epoch)) if trainer is not None else None
        return ShardLoader(
            stream, epoch_of=epoch_of if shuffle else (lambda: 0), num_workers=workers,
            worker_init_fn=worker_init(rank), pin_memory=self.pin_memory,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
        )  # fmt: skip


def read_meta(path: str) -> dict[str, Any]:
    """meta.json of the shards at `path` (a folder or a URL), checked; one line per failure."""
    wds = webdataset()
    where = f"{path}/{META}"
    try:
        if "://" in path or path.startswith("pipe:"):
            with wds.gopen(where, "rb") as f:
                meta = json.loads(f.read())
        else:
            meta = json.loads(Path(where).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(
            "path", path,
            f"no shards there ({META} unreadable: {type(err).__name__}); write them with "
            "python -m fasttrain.prepare data=... output_dir=PATH",
        ) from None  # fmt: skip
    splits = meta.get("splits", {}) if isinstance(meta, dict) else {}
    if meta.get("format") != FORMAT or any(not splits.get(s, {}).get("shards") for s in SPLITS):
        raise ConfigError("path", path, f"{META} does not list train, val and test shards")
    for split in SPLITS:
        counts, shards = splits[split].get("counts"), splits[split]["shards"]
        valid = isinstance(counts, list) and all(isinstance(c, int) and c >= 0 for c in counts)
        if not valid or len(counts) != len(shards):
            why = f"{META} gives no sample count (counts) for each {split} shard"
            raise ConfigError("path", path, f"{why}; write the shards again with fasttrain.prepare")
    if "://" not in path and not path.startswith("pipe:"):
        missing = [n for s in SPLITS for n in splits[s]["shards"] if not Path(path, n).is_file()]
        if missing:
            raise ConfigError("path", path, f"shard {missing[0]} listed in {META} is missing")
    return meta
