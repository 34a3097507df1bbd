"""How fast images on disk reach the training step.

    python bench/data_loading.py            # CPU: writes bench/results/data_loading.json + a table
    python bench/data_loading.py --smoke    # a few batches: proves the script still works
    python bench/data_loading.py --device cuda   # GPU: data-wait share, uint8 vs float32 batches

CPU, on images this script writes (JPEGs of mixed sizes, ~200-400 px, as photos come; the net
takes 64x64 with a random resized crop and flips), each figure against one made in the same run:
  decode ceiling  one process decoding + augmenting in a loop, no loader (samples/s)
  image folder    data=image_folder's training loader alone, default worker count (samples/s)
  shards          data=shards' loader on the same images, written by fasttrain.prepare
  data wait       a small CNN trained from the image-folder loader: the share of the step loop
                  spent waiting for the next batch (the default worker count)

GPU (--device cuda), ResNet-18 on CIFAR-shaped data (fake CIFAR-10 files, pad-and-crop and
flips in the workers): the data-wait share with batches sent as uint8 and normalised on the
device (what fasttrain does) against the same pipeline normalising to float32 on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]


def write_photos(root: Path, classes: int, per_class: int) -> Path:
    from PIL import Image

    gen = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"class{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = (int(v) for v in gen.integers(200, 400, 2))
            # smooth gradients plus noise: compresses like a photo, not like flat colour
            yy, xx = np.mgrid[0:h, 0:w]
            base = np.stack([xx * 255 // w, yy * 255 // h, np.full_like(xx, 40 * c)], -1)
            pixels = np.clip(base + gen.integers(-25, 25, (h, w, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:04d}.jpg", quality=90)
    return root


def folder_module(root: Path, classes: int, batch: int, workers: object = "auto"):
    from fasttrain.data.image_folder import ImageFolderDataModule

    dm = ImageFolderDataModule(
        str(root), classes, [3, 64, 64], image_size=[64, 64], crop="resized", flip=True,
        batch_size=batch, num_workers=workers, pin_memory=False, val_fraction=0.05,
        test_fraction=0.05,
    )  # fmt: skip
    dm.setup()
    return dm


def rate(batches, limit: int) -> float:
    """Samples/s over `limit` batches, after the first (worker start-up) is excluded."""
    it = iter(batches)
    next(it)
    start, n = time.perf_counter(), 0
    for i, (x, _) in enumerate(it):
        n += len(x)
        if i + 1 >= limit:
            break
    return n / (time.perf_counter() - start)


def decode_ceiling(dm, limit: int) -> float:
    """One process, no loader: open, decode, crop/resize, flip, to tensor, in a loop."""
    from fasttrain.data.images import open_image

    files = [f for f, _ in dm.parts["train"]]
    transform = dm.transform(train=True)
    start, n = time.perf_counter(), 0
    for i in range(limit):
        transform(open_image(files[i % len(files)]))
        n += 1
    return n / (time.perf_counter() - start)


def data_wait_share(loader, net: torch.nn.Module, device: torch.device, steps: int,
                    mean: torch.Tensor, std: torch.Tensor) -> dict[str, float]:  # fmt: skip
    """Train `net` for `steps` batches; the share of wall time spent in next(loader)."""
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    mean, std = mean.to(device), std.to(device)
    waited, it = 0.0, iter(loader)
    next(it)  # worker start-up is not steady state
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    done = 0
    for _ in range(steps):
        t = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        waited += time.perf_counter() - t
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if x.dtype == torch.uint8:  # the model's preprocessing, on the device
            x = (x.float() - mean) / std
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        done += len(y)
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return {"data_wait_share": waited / wall, "samples_per_s": done / wall}


def cpu(args: argparse.Namespace, tmp: Path) -> dict:
    from fasttrain.data.base import resolve_num_workers
    from fasttrain.data.shards import ShardsDataModule, write_shards
    from fasttrain.models.nets import SmallCNN

    classes, per_class = (3, 12) if args.smoke else (4, 150)
    limit = 3 if args.smoke else 25
    root = write_photos(tmp / "photos", classes, per_class)
    dm = folder_module(root, classes, args.batch)
    write_shards(dm, tmp / "shards", shard_size=8 if args.smoke else 50)
    shards = ShardsDataModule(
        str(tmp / "shards"), classes, [3, 64, 64], image_size=[64, 64], crop="resized",
        batch_size=args.batch, num_workers="auto", pin_memory=False, shuffle_buffer=200,
    )  # fmt: skip
    out: dict = {"workers": resolve_num_workers("auto"), "batch_size": args.batch,
                 "train_images": len(dm.parts["train"])}  # fmt: skip
    for _ in range(1 if args.smoke else 3):  # interleaved: drift hits every figure alike
        no_workers = folder_module(root, classes, args.batch, 0)
        row = {
            "decode_ceiling": decode_ceiling(dm, limit * args.batch),
            "image_folder": rate(dm.train_dataloader(), limit),
            "shards": rate(shards.train_dataloader(), limit),
            "image_folder_0_workers": rate(no_workers.train_dataloader(), limit),
        }
        torch.manual_seed(0)
        net = SmallCNN([3, 64, 64], classes)
        row |= data_wait_share(dm.train_dataloader(), net, torch.device("cpu"), limit * 2,
                               *dm.input_statistics())  # fmt: skip
        out.setdefault("runs", []).append(row)
    keys = out["runs"][0].keys()
    out["median"] = {k: float(np.median([r[k] for r in out["runs"]])) for k in keys}
    return out


def gpu(args: argparse.Namespace, tmp: Path) -> dict:
    from fasttrain.data.cifar10 import Cifar10DataModule
    from fasttrain.data.images import Images
    from fasttrain.models.nets import ResNet
    from fasttrain.testing.fake_data import write_cifar10

    # --smoke without a GPU runs this comparison on the CPU: it proves the script still runs
    device = torch.device("cuda" if torch.cuda.is_available() or not args.smoke else "cpu")
    torch.backends.cudnn.benchmark = True
    write_cifar10(tmp / "cifar", per_batch=2000 if not args.smoke else 40, test=100)
    stats = {"mean": [125.31, 122.96, 113.86], "std": [62.99, 62.09, 66.70]}
    dm = Cifar10DataModule(
        str(tmp / "cifar"), 10, [3, 32, 32], crop="pad", flip=True, batch_size=args.batch,
        num_workers="auto", pin_memory=True, **stats,
    )  # fmt: skip
    dm.setup()
    mean, std = dm.input_statistics()
    train = dm.splits["train"]

    def host_float(image: np.ndarray, generator: torch.Generator) -> torch.Tensor:
        # float32 on the host; the generator: the item's position-seeded augmentation
        return (train.transform(image, generator).float() - mean) / std

    float_split = Images(train.items, train.labels, train.load, host_float, train.seed)
    net = ResNet([3, 32, 32], 10, channels=[64, 128, 256, 512], blocks=[2, 2, 2, 2])
    net = net.to(device, memory_format=torch.channels_last)
    steps = 10 if args.smoke else 150
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    out: dict = {"device": name, "batch_size": args.batch,
                 "workers": dm.num_workers}  # fmt: skip
    for _ in range(1 if args.smoke else 2):
        uint8 = data_wait_share(dm.train_dataloader(), net, device, steps, mean, std)
        dm.splits["train"] = float_split
        host = data_wait_share(dm.train_dataloader(), net, device, steps, mean, std)
        dm.splits["train"] = train
        out.setdefault("runs", []).append({"uint8_to_device": uint8, "float32_host": host})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    args.batch = args.batch or (4 if args.smoke else 32 if args.device == "cpu" else 256)
    with tempfile.TemporaryDirectory() as tmp:
        result = (cpu if args.device == "cpu" else gpu)(args, Path(tmp))
    result["machine"] = {"python": platform.python_version(), "torch": torch.__version__,
                         "cpus": os.cpu_count(), "platform": platform.platform()}  # fmt: skip
    default = (
        REPO / "bench" / "results" / f"data_loading{'_gpu' if args.device == 'cuda' else ''}.json"
    )
    path = Path(args.json) if args.json else (None if args.smoke else default)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
    print(json.dumps(result.get("median", result.get("runs")), indent=2))


if __name__ == "__main__":
    main()
