"""Image folders (data=image_folder) and the uint8-to-device path: splits, labels, shapes,
augmentation by stage, on-device normalisation, class names, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fasttrain.checkpoints.load import load_task
from fasttrain.models import Classifier
from fasttrain.models.nets import SmallCNN
from fasttrain.testing.fake_data import write_image_folder

MEAN, STD = [125.3, 123.0, 113.9], [63.0, 62.1, 66.7]


def test_classifier_normalises_uint8_on_the_device_as_the_host_reference(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = SmallCNN([3, 8, 8], 4, channels=[4])
    model = Classifier(net, None, 4, input_mean=MEAN, input_std=STD).eval()
    x = torch.randint(0, 256, (5, 3, 8, 8), dtype=torch.uint8)
    host = (x.float() - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    with torch.no_grad():
        assert torch.allclose(model(x), net(host), atol=1e-5)
    # The checkpoint carries the preprocessing: a reloaded model applies it too.
    ckpt = tmp_path / "m.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, ckpt)
    rebuilt, _ = load_task(ckpt)
    with torch.no_grad():
        assert torch.allclose(rebuilt(x), net(host), atol=1e-5)
    assert rebuilt.hparams["input_mean"] == MEAN


def test_classifier_without_preprocessing_feeds_the_batch_unchanged() -> None:
    net = SmallCNN([1, 8, 8], 3, channels=[4]).eval()
    model = Classifier(net, None, 3).eval()
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(model(x), net(x))
    assert model.input_mean is None and "input_mean" not in model.state_dict()


def folder_module(root: Path, **kwargs):
    from fasttrain.data.image_folder import ImageFolderDataModule

    args = {"num_classes": 3, "input_shape": [3, 16, 16], "image_size": [16, 16],
            "num_workers": 0, "batch_size": 8, **kwargs}  # fmt: skip
    return ImageFolderDataModule(str(root), **args)


def test_flat_folder_splits_disjoint_and_fixed_by_seed(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path / "imgs", per_class=40)
    dm = folder_module(root, val_fraction=0.2, test_fraction=0.2)
    assert dm.class_names == ["cat", "dog", "fish"]  # sorted subfolder names; notes.txt ignored
    files = {s: [f for f, _ in dm.parts[s]] for s in ("train", "val", "test")}
    sizes = [len(files[s]) for s in ("train", "val", "test")]
    assert sum(sizes) == 120 and 48 <= sizes[0] <= 96 and all(12 <= n <= 40 for n in sizes[1:])
    every = [f for s in files.values() for f in s]
    assert len(set(every)) == len(every) == 120
    for split, parts in dm.parts.items():  # classes in proportion (by hash), label = its folder
        assert all(dm.class_names[y] == f.parent.name for f, y in parts)
        assert sorted({y for _, y in parts}) == [0, 1, 2], split
    assert folder_module(root, val_fraction=0.2, test_fraction=0.2).parts == dm.parts
    assert folder_module(root, val_fraction=0.2, test_fraction=0.2, seed=1).parts != dm.parts


def test_split_folders_are_used_and_test_is_carved_from_train(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path / "imgs", per_class=10, splits=("train", "val"))
    dm = folder_module(root, test_fraction=0.2)
    val = {f for f, _ in dm.parts["val"]}
    assert val == {f for f in (root / "val").rglob("*") if f.suffix != ".txt" and f.is_file()}
    # no test/ folder: the test split comes out of train/, never out of val/
    test = {f for f, _ in dm.parts["test"]}
    # 20% of train/'s 30 images by file hash: about 6
    assert 2 <= len(test) <= 12 and all(f.is_relative_to(root / "train") for f in test)
    assert not test & {f for f, _ in dm.parts["train"]}


def test_batches_are_uint8_of_the_input_shape_from_mixed_files(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path / "imgs", per_class=5)  # RGB, L, RGBA, P; jpg/png/gif
    for channels in (3, 1):
        dm = folder_module(root, channels=channels, input_shape=[channels, 16, 16], batch_size=32)
        dm.setup()
        x, y = next(iter(dm.val_dataloader()))
        assert x.dtype == torch.uint8 and x.shape[1:] == (channels, 16, 16)
        assert y.dtype == torch.int64


def test_augmentation_only_in_training(tmp_path: Path) -> None:
    from PIL import Image

    root = write_image_folder(tmp_path / "imgs", per_class=4)
    dm = folder_module(root, crop="resized", flip=True)
    dm.setup()
    file = dm.parts["train"][0][0]
    train, val = dm.transform(train=True), dm.transform(train=False)
    draws = {tuple(train(Image.open(file)).flatten().tolist()) for _ in range(6)}
    assert len(draws) > 1  # random crops and flips
    again = [val(Image.open(file)) for _ in range(3)]
    assert all(torch.equal(again[0], v) for v in again)
    # val/test: the centred crop of the output's aspect, resized (here the whole square image)
    square = Image.new("RGB", (20, 20), (10, 200, 30))
    assert val(square)[:, 0, 0].tolist() == [10, 200, 30]
    assert (
        dm.splits["val"].transform.crop == "none" and dm.splits["train"].transform.crop == "resized"
    )


def test_pad_crop_shifts_and_pads_with_zeros() -> None:
    from fasttrain.data.images import ImageTransform

    t = ImageTransform([8, 8], 3, train=True, crop="pad", padding=2, flip=False)
    pixels = np.full((8, 8, 3), 255, np.uint8)
    outs = [t(pixels) for _ in range(50)]
    assert all(o.shape == (3, 8, 8) for o in outs)
    assert all(bool((o[:, 2:6, 2:6] == 255).all()) for o in outs)  # shifted by 2 at most
    assert len({int((o == 0).sum()) for o in outs}) > 3  # zero borders of varying width


def compose_task(name: str, tmp_path: Path, *overrides: str):
    from hydra import compose, initialize_config_dir

    from conftest import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        paths = [f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path}/{name}"]
        return compose(name, overrides=[*paths, *overrides])


IMAGE_RUN = ["data=image_folder", "data.num_classes=3", "data.image_size=[16,16]",
             "data.num_workers=0", "data.batch_size=8", "model.net.channels=[8]",
             "trainer.max_epochs=2", "logger=none", "callbacks=none",
             "++trainer.enable_progress_bar=false"]  # fmt: skip


@pytest.fixture(scope="module")
def image_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(data folder, last.ckpt) of a short run on a 3-class image folder."""
    from fasttrain.tasks import train

    tmp = tmp_path_factory.mktemp("image_run")
    root = write_image_folder(tmp / "imgs", per_class=10)
    cfg = compose_task("train", tmp, f"data.path={root}", *IMAGE_RUN)
    train(cfg)
    (ckpt,) = (tmp / "train").rglob("*.ckpt")
    return root, ckpt


def test_checkpoint_stores_classes_and_the_device_normalisation(image_run) -> None:
    _, ckpt = image_run
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert saved["datamodule_hyper_parameters"]["classes"] == ["cat", "dog", "fish"]
    assert saved["hyper_parameters"]["input_mean"] == 127.5
    model, _ = load_task(ckpt)
    assert float(model.input_std) == 127.5


def test_predict_names_classes_and_matches_the_host_reference(image_run, tmp_path: Path) -> None:
    import csv

    from fasttrain.assemble.restore import restore
    from fasttrain.tasks import predict

    root, ckpt = image_run
    # the folder is typed: a location never comes from the checkpoint
    data = [f"ckpt_path='{ckpt}'", "data=image_folder", f"data.path={root}"]
    out = predict(compose_task("predict", tmp_path, *data, "device=cpu"))
    rows = list(csv.DictReader(out.open()))
    model, dm = restore(compose_task("predict", tmp_path, *data))
    x, _ = next(iter(dm.test_dataloader()))
    host = (x.float() - 127.5) / 127.5  # what the net must see: normalised on the host
    with torch.no_grad():
        expected = model.net(host).argmax(1).tolist()
    assert [int(r["pred"]) for r in rows[: len(x)]] == expected
    assert [r["class"] for r in rows[: len(x)]] == [dm.class_names[i] for i in expected]
    assert {"prob_cat", "prob_dog", "prob_fish"} <= set(rows[0])


@pytest.mark.slow  # ~15 s: evaluate, then a TorchScript export checked on the test split
def test_export_takes_raw_pixels(image_run, tmp_path: Path) -> None:
    from fasttrain.tasks import evaluate, export

    root, ckpt = image_run
    args = [f"ckpt_path='{ckpt}'", "data=image_folder", f"data.path={root}", "data.num_workers=0"]
    metrics = evaluate(compose_task("eval", tmp_path, *args))
    assert 0.0 <= metrics["test/acc"] <= 1.0
    report = export(compose_task("export", tmp_path, *args,
                                 "format=torchscript", f"output_dir={tmp_path}/out",
                                 "device=cpu"))  # fmt: skip
    assert report["formats"]["torchscript"]["passed"]
    assert report["formats"]["eager"]["accuracy"] == pytest.approx(metrics["test/acc"])
    scripted = torch.jit.load(str(tmp_path / "out" / "model.ts"))
    model, _ = load_task(ckpt)
    pixels = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    with torch.no_grad():
        assert torch.allclose(scripted(pixels.float()), model(pixels), atol=1e-4)


def broken(tmp_path: Path, case: str) -> Path:
    root = tmp_path / "imgs"
    if case == "missing":
        return root
    write_image_folder(root, per_class=3)
    if case == "empty class":
        (root / "emu").mkdir()
    elif case == "one class":
        for name in ("dog", "fish"):
            for f in (root / name).iterdir():
                f.unlink()
            (root / name).rmdir()
    elif case == "corrupt":
        (root / "dog" / "dog_001.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    elif case == "unsupported only":
        for f in (root / "fish").iterdir():
            f.rename(f.with_suffix(".txt"))
    return root


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("missing", r"data\.path='.*imgs': no such folder"),
        ("empty class", r"data\.path=.*class folder .*emu holds no images \(looked for \.jpg"),
        ("one class", r"data\.path=.*1 class folder \(cat\); expected one subfolder per class"),
        ("corrupt", r"data\.path: .*dog_001\.png is not a readable image"),
        ("unsupported only", r"class folder .*fish holds no images"),
        (
            "wrong count",
            r"data\.num_classes=4: .* has 3 class folders \(cat, dog, fish\); set data",
        ),
    ],
)
def test_bad_folders_are_one_line_before_anything_runs(tmp_path: Path, case: str, says: str):
    from fasttrain.assemble import build
    from fasttrain.config.errors import UserError

    root = broken(tmp_path, case)
    count = 4 if case == "wrong count" else 3
    cfg = compose_task("train", tmp_path, "data=image_folder", f"data.path={root}",
                       f"data.num_classes={count}")  # fmt: skip
    with pytest.raises(UserError, match=says) as err:
        build(cfg.data, "data")
    assert "\n" not in str(err.value)


def test_a_truncated_image_is_named_when_it_is_decoded(tmp_path: Path) -> None:
    from fasttrain.config.errors import UserError

    root = write_image_folder(tmp_path / "imgs", per_class=3)
    file = root / "cat" / "cat_001.png"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) * 2 // 3])  # header intact, pixels cut off
    dm = folder_module(root, val_fraction=0.3, test_fraction=0.3)
    dm.setup()
    with pytest.raises(UserError, match=r"cat_001\.png is not a readable image"):
        for split in ("train", "val", "test"):
            list(dm.splits[split])


@pytest.mark.slow  # a process start (~10 s); in process: test_bad_folders_are_one_line_...
def test_cli_refuses_a_bad_folder_with_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    from conftest import run_cli

    root = broken(tmp_path, "one class")
    proc = run_cli(["train.py", "data=image_folder", f"data.path={root}"], tmp_path / "logs")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and "1 class folder (cat)" in proc.stderr
    assert not (tmp_path / "logs").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_uint8_batches_cross_pinned_and_are_normalised_on_the_gpu(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path / "imgs", per_class=6)
    dm = folder_module(root, pin_memory=True, num_workers=1, mean=MEAN, std=STD)
    dm.setup()
    x, _ = next(iter(dm.train_dataloader()))
    assert x.dtype == torch.uint8 and x.is_pinned()  # a quarter of float32's bytes, async copy
    net = SmallCNN([3, 16, 16], 3, channels=[4]).cuda().eval()
    model = Classifier(net, None, 3, input_mean=MEAN, input_std=STD).cuda().eval()
    mean, std = dm.input_statistics()
    with torch.no_grad():
        on_device = model(x.cuda(non_blocking=True))
        host = net(((x.float() - mean) / std).cuda())
    assert torch.allclose(on_device, host, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_image_folder_trains_on_the_gpu_with_the_checkpoint_normalising(tmp_path: Path) -> None:
    from fasttrain.tasks import evaluate, train

    root = write_image_folder(tmp_path / "imgs", per_class=10)
    cfg = compose_task("train", tmp_path, f"data.path={root}", *IMAGE_RUN, "trainer=gpu",
                       "data.device_prefetch=true", "data.pin_memory=true")  # fmt: skip
    metrics = train(cfg)
    assert 0.0 <= metrics["test/acc"] <= 1.0
    (ckpt,) = (tmp_path / "train").rglob("*.ckpt")
    again = evaluate(compose_task("eval", tmp_path, f"ckpt_path='{ckpt}'", "data=image_folder",
                                  f"data.path={root}", "data.num_workers=0"))  # fmt: skip
    assert again["test/acc"] == pytest.approx(metrics["test/acc"])


@pytest.mark.slow
def test_data_loading_benchmark_still_runs() -> None:
    import subprocess
    import sys

    from conftest import REPO

    proc = subprocess.run([sys.executable, "bench/data_loading.py", "--smoke"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"decode_ceiling"' in proc.stdout and '"data_wait_share"' in proc.stdout
    # the GPU comparison (uint8 to the device vs float32 from the host), here on the CPU
    proc = subprocess.run([sys.executable, "bench/data_loading.py", "--smoke", "--device", "cuda"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"uint8_to_device"' in proc.stdout and '"float32_host"' in proc.stdout


@pytest.mark.slow  # a training process with a loader worker (~15 s)
def test_cli_names_an_image_that_fails_to_decode_in_a_worker_in_one_line(tmp_path: Path) -> None:
    from conftest import run_cli

    root = write_image_folder(tmp_path / "imgs", per_class=4)
    file = root / "cat" / "cat_001.png"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) * 2 // 3])  # header intact: found only when decoded
    proc = run_cli(["train.py", "data=image_folder", f"data.path={root}", "data.num_classes=3",
                    "data.num_workers=1", "data.image_size=[16,16]", "trainer.max_epochs=1",
                    "model=cnn", "run_name=bad"], tmp_path / "logs")  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: data.path: ") and "cat_001.png is not a readable image" in last
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "logs" / "train" / "bad").exists()  # the run took back what it wrote
