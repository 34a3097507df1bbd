"""data=cifar10: the official file formats (python pickles through a restricted unpickler, or
binary), the standard splits, download with its checksum, and one-line errors."""

from __future__ import annotations

import hashlib
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fasttrain.config.errors import UserError
from fasttrain.data import cifar10
from fasttrain.data.cifar10 import Cifar10DataModule
from fasttrain.testing.fake_data import CIFAR_NAMES, write_cifar10


def module(path: Path, **kwargs) -> Cifar10DataModule:
    args = {"num_classes": 10, "input_shape": [3, 32, 32], "num_workers": 0, "batch_size": 16,
            **kwargs}  # fmt: skip
    return Cifar10DataModule(str(path), **args)


def test_python_batches_give_the_standard_splits(tmp_path: Path) -> None:
    dm = module(write_cifar10(tmp_path, per_batch=20, test=30), val_fraction=0.1)
    arrays = dm.load()
    assert {k: len(v[1]) for k, v in arrays.items()} == {"train": 90, "val": 10, "test": 30}
    assert dm.class_names == CIFAR_NAMES
    x, y = arrays["val"]
    assert x.dtype == np.uint8 and x.shape[1:] == (32, 32, 3)
    assert sorted(y.tolist()) == list(range(10))  # stratified: one of each class
    # Pixels of class c are around 20 + 23 c (fake_data): rows are read channel-major right.
    assert np.abs(x.reshape(len(x), -1).mean(1) - (20 + 23 * y)).max() < 3
    dm.setup()
    xb, yb = next(iter(dm.test_dataloader()))
    assert xb.dtype == torch.uint8 and xb.shape == (16, 3, 32, 32) and yb.dtype == torch.int64


def test_channel_order_is_red_green_blue(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    file = tmp_path / "cifar-10-batches-py" / "test_batch"
    planes = np.concatenate([np.full(1024, v, np.uint8) for v in (10, 20, 30)])
    batch = {b"data": np.stack([planes] * 4), b"labels": [0, 1, 2, 3]}
    file.write_bytes(pickle.dumps(batch, protocol=2))
    x, _ = cifar10.read_pickled(file)
    assert x[0, 5, 7].tolist() == [10, 20, 30]


def test_binary_version_reads_the_same_images(tmp_path: Path) -> None:
    py = module(write_cifar10(tmp_path / "py")).load()
    folder = tmp_path / "bin" / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    source = tmp_path / "py" / "cifar-10-batches-py"
    for name in [*cifar10.TRAIN, cifar10.TEST]:
        x, y = cifar10.read_pickled(source / name)
        rows = x.transpose(0, 3, 1, 2).reshape(len(x), -1)
        np.concatenate([y[:, None].astype(np.uint8), rows], 1).tofile(folder / f"{name}.bin")
    binary = module(tmp_path / "bin").load()
    for split in ("train", "val", "test"):
        assert np.array_equal(binary[split][0], py[split][0])
        assert np.array_equal(binary[split][1], py[split][1])


class Evil:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned > /dev/null",))


def test_pickles_naming_other_objects_are_refused_never_run(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    file = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    file.write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}, protocol=2))
    with pytest.raises(UserError, match=r"data_batch_3 is not a CIFAR-10 python batch \(refused"):
        module(tmp_path).load()


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        ("text", r"test_batch is not a CIFAR-10 python batch"),
        ("shape", r"test_batch is not a CIFAR-10 batch \(expected uint8 data \[N, 3072\]"),
        ("labels", r"test_batch is not a CIFAR-10 batch"),
    ],
)
def test_files_of_the_wrong_format_are_one_line(tmp_path: Path, damage: str, says: str) -> None:
    write_cifar10(tmp_path)
    file = tmp_path / "cifar-10-batches-py" / "test_batch"
    if damage == "text":
        file.write_text("hello")
    else:
        data = np.zeros((3, 3072 if damage == "labels" else 100), np.uint8)
        labels = [0, 1, 12] if damage == "labels" else [0, 1, 2]
        file.write_bytes(pickle.dumps({b"data": data, b"labels": labels}, protocol=2))
    with pytest.raises(UserError, match=says) as err:
        module(tmp_path).load()
    assert "\n" not in str(err.value)


def test_missing_files_say_where_to_put_them(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"path=.*: no CIFAR-10 files there: put .*download=true"):
        module(tmp_path)


def archive(tmp_path: Path) -> Path:
    """A cifar-10-python.tar.gz as the official one is laid out, from the fake batches."""
    source = write_cifar10(tmp_path / "src")
    out = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(source / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    return out


def test_download_fetches_checks_and_unpacks(tmp_path: Path, monkeypatch) -> None:
    tar = archive(tmp_path)
    monkeypatch.setattr(cifar10, "URL", tar.as_uri())
    monkeypatch.setattr(cifar10, "MD5", hashlib.md5(tar.read_bytes()).hexdigest())
    dm = module(tmp_path / "data", download=True)
    assert (tmp_path / "data" / "cifar-10-batches-py" / "test_batch").is_file()
    assert len(dm.load()["test"][1]) == 20


def test_download_with_a_wrong_checksum_unpacks_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cifar10, "URL", archive(tmp_path).as_uri())
    with pytest.raises(UserError, match=r"has MD5 [0-9a-f]{32}, not the published c58f3010"):
        module(tmp_path / "data", download=True)
    assert not (tmp_path / "data" / "cifar-10-batches-py").exists()


def test_download_offline_is_one_clear_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cifar10, "URL", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    with pytest.raises(UserError) as err:
        module(tmp_path / "data", download=True)
    text = str(err.value)
    assert text.startswith("data.download=true: could not fetch http://127.0.0.1:9/")
    assert "put the python version's cifar-10-batches-py/" in text and "\n" not in text
    assert not (tmp_path / "data").exists()  # no empty folder, no lock file left behind


def test_download_offline_into_an_existing_folder_leaves_it_as_it_was(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(cifar10, "URL", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("mine")
    with pytest.raises(UserError):
        module(tmp_path / "data", download=True)
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("other", [["image_size", [64, 64]], ["channels", 1]])
def test_on_device_refuses_a_size_it_would_not_honour(tmp_path: Path, other: list) -> None:
    key, value = other
    shape = [1, 32, 32] if key == "channels" else [3, 64, 64]
    with pytest.raises(UserError, match=r"^on_device=True: keeps CIFAR-10 as stored, 32x32 RGB"):
        module(write_cifar10(tmp_path), on_device=True, crop="pad", input_shape=shape,
               **{key: value})  # fmt: skip


def test_pixels_reach_the_net_normalised_by_the_config_statistics(tmp_path: Path) -> None:
    from fasttrain.models import Classifier
    from fasttrain.models.nets import SmallCNN

    dm = module(write_cifar10(tmp_path), mean=[125.31, 122.96, 113.86], std=[62.99, 62.09, 66.7])
    dm.setup()
    x, _ = next(iter(dm.val_dataloader()))
    mean, std = dm.input_statistics()
    net = SmallCNN([3, 32, 32], 10, channels=[4]).eval()
    model = Classifier(net, None, 10, input_mean=dm.mean, input_std=dm.std).eval()
    with torch.no_grad():
        assert torch.allclose(model(x), net((x.float() - mean) / std), atol=1e-5)
