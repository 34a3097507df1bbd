"""experiment=cifar10_resnet18 and its pieces: the batched augmentation on the device
(fasttrain.data.augment), data=cifar10 with data.on_device, the one-cycle schedule and label
smoothing; the recipe composes, builds and trains a couple of steps on the CPU (compile off)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from practices import build_run, compose_train, seen_in_training

from conftest import REPO, run_cli
from fasttrain.config.errors import ConfigError
from fasttrain.data.augment import PadCropFlip, augment_training_batch
from fasttrain.data.cifar10 import Cifar10DataModule
from fasttrain.testing.fake_data import write_cifar10

RECIPE = "experiment=cifar10_resnet18"
# The recipe at test size on 2 CPU cores: ResNet-18's 4 stages of 2 blocks at 1/8 of its widths,
# two training steps of 8 images, one batch of validation and test, no compile (minutes for
# ResNet-18 here), nothing written but metrics.
TINY = [
    RECIPE, "model.compile=false", "model.net.channels=[8,16,32,64]", "data.batch_size=8",
    "trainer.accelerator=cpu", "trainer.devices=1", "trainer.max_epochs=1", "trainer.max_steps=2",
    "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "logger=none",
    "+trainer.enable_progress_bar=false", "+trainer.enable_model_summary=false",
    "+trainer.enable_checkpointing=false", "callbacks.checkpoint=null", "callbacks.best=null",
    "callbacks.progress_bar=null",
]  # fmt: skip


def images(b: int = 64, c: int = 3, h: int = 8, w: int = 8) -> torch.Tensor:
    """uint8 [B, C, H, W], every pixel value distinct within an image (so a crop identifies its
    offset and a mirror shows)."""
    ramp = torch.arange(c * h * w).view(1, c, h, w) % 200 + 1
    return (ramp + torch.arange(b).view(b, 1, 1, 1)).to(torch.uint8)


def candidates(image: torch.Tensor, p: int) -> list[torch.Tensor]:
    """Every crop of `image` zero-padded by p, unmirrored and mirrored."""
    _, h, w = image.shape
    padded = F.pad(image, (p, p, p, p))
    crops = [
        padded[:, dy : dy + h, dx : dx + w] for dy in range(2 * p + 1) for dx in range(2 * p + 1)
    ]
    return crops + [crop.flip(-1) for crop in crops]


def test_augmented_images_are_shifted_crops_of_the_padded_image_some_mirrored() -> None:
    x = images()
    out = PadCropFlip(padding=2, flip=True)(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == torch.uint8
    kinds = []
    for image, result in zip(x, out, strict=True):
        matches = [k for k, c in enumerate(candidates(image, 2)) if torch.equal(c, result)]
        assert len(matches) == 1, "not a crop of the padded image (or its mirror)"
        kinds.append(matches[0])
    shifts, mirrored = {k % 25 for k in kinds}, [k >= 25 for k in kinds]
    assert len(shifts) > 10  # per-sample offsets, not one for the batch
    assert 0 < sum(mirrored) < len(mirrored)  # per-sample flips
    assert not torch.equal(out, x)


def test_float_batches_keep_dtype_and_the_same_seed_gives_the_same_batch() -> None:
    x = images().float() / 255
    aug = PadCropFlip(padding=4, flip=True)
    a = aug(x, torch.Generator().manual_seed(3))
    assert a.dtype == torch.float32 and a.shape == x.shape
    assert torch.equal(a, aug(x, torch.Generator().manual_seed(3)))
    assert not torch.equal(a, aug(x, torch.Generator().manual_seed(4)))


def test_no_padding_no_flip_is_the_identity_and_flip_alone_only_mirrors() -> None:
    x = images(b=32)
    assert torch.equal(PadCropFlip(padding=0, flip=False)(x), x)
    out = PadCropFlip(padding=0, flip=True)(x, torch.Generator().manual_seed(0))
    same = [torch.equal(o, i) for o, i in zip(out, x, strict=True)]
    mirrored = [torch.equal(o, i.flip(-1)) for o, i in zip(out, x, strict=True)]
    assert all(s or m for s, m in zip(same, mirrored, strict=True))
    assert any(same) and any(mirrored)


def at(training: bool = True, epoch: int = 0, place: int = 3) -> SimpleNamespace:
    """A data module stand-in whose trainer is at batch `place` of `epoch`."""
    progress = SimpleNamespace(current=SimpleNamespace(ready=place))
    fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress))
    return SimpleNamespace(
        trainer=SimpleNamespace(training=training, current_epoch=epoch, fit_loop=fit_loop)
    )


def test_device_augmentation_is_a_function_of_the_batchs_position() -> None:
    # Not of torch's default generator, which a run resumed mid-epoch sees in another state.
    x, y = images(), torch.arange(64)
    first = augment_training_batch(at(epoch=1, place=5), (x, y), PadCropFlip(4, True), seed=7)[0]
    torch.manual_seed(123)
    again = augment_training_batch(at(epoch=1, place=5), (x, y), PadCropFlip(4, True), seed=7)[0]
    later = augment_training_batch(at(epoch=1, place=6), (x, y), PadCropFlip(4, True), seed=7)[0]
    assert torch.equal(first, again) and not torch.equal(first, later)


@pytest.mark.parametrize("training", [True, False], ids=["training", "evaluation"])
def test_batches_are_augmented_in_training_only(training: bool) -> None:
    x, y = images(), torch.arange(64)
    module = at(training)
    ax, ay = augment_training_batch(module, (x, y), PadCropFlip(4, True))
    assert ay is y
    assert torch.equal(ax, x) is not training
    assert augment_training_batch(SimpleNamespace(trainer=None), (x, y), PadCropFlip())[0] is x


def cifar(path: Path, **kwargs) -> Cifar10DataModule:
    args = {"num_classes": 10, "input_shape": [3, 32, 32], "batch_size": 16, "crop": "pad",
            "num_workers": 0, **kwargs}  # fmt: skip
    return Cifar10DataModule(str(path), **args)


def test_on_device_serves_the_host_paths_images_in_the_same_order(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=20, test=40)
    host, device = cifar(tmp_path), cifar(tmp_path, on_device=True)
    host.setup(), device.setup()
    for split in ("test_dataloader", "val_dataloader"):
        pairs = zip(getattr(host, split)(), getattr(device, split)(), strict=True)
        for (hx, hy), (dx, dy) in pairs:
            assert dx.dtype == torch.uint8 and dx.shape == hx.shape
            assert torch.equal(hx, dx) and torch.equal(hy, dy)
    assert device.device_augment is not None and device.device_augment.padding == 4
    assert cifar(tmp_path, on_device=True, crop="none", flip=False).device_augment is None


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"num_workers": 2}, "data.num_workers=0"),
        ({"crop": "resized"}, "data.crop=pad or none"),
        ({"on_device": "yes"}, "expected true or false"),
    ],
)
def test_on_device_refuses_what_it_cannot_do(tmp_path: Path, kwargs: dict, says: str) -> None:
    write_cifar10(tmp_path)
    with pytest.raises(ConfigError, match=says) as err:
        cifar(tmp_path, **{"on_device": True, **kwargs})
    assert "\n" not in str(err.value)


def test_onecycle_takes_its_peak_from_the_optimizer_and_its_length_from_the_run(
    tmp_path: Path,
) -> None:
    cfg = compose_train(
        tmp_path, "model=mlp", "model/scheduler=onecycle", "model/optimizer=sgd",
        "model.optimizer.lr=0.2", "model.lr_scaling=linear", "model.base_batch_size=16",
        "data.batch_size=32", "data.num_workers=0", "callbacks=none", "logger=none",
        "trainer.max_epochs=1", "trainer.max_steps=8", "trainer.limit_val_batches=1",
        "+trainer.enable_progress_bar=false", "+trainer.enable_checkpointing=false",
        quick=False,
    )  # fmt: skip
    assert cfg.model.scheduler_interval == "step"
    trainer, model, datamodule = build_run(cfg)
    trainer.fit(model, datamodule=datamodule)
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert type(scheduler).__name__ == "OneCycleLR" and scheduler.total_steps == 8
    # linear scaling: 0.2 x 32 / 16 is the peak; the cycle starts at peak / div_factor
    group = trainer.optimizers[0].param_groups[0]
    assert group["max_lr"] == pytest.approx(0.4)
    assert group["initial_lr"] == pytest.approx(0.4 / 25)
    assert scheduler.last_epoch == 8  # stepped once per optimizer step


def test_a_one_step_onecycle_warmup_is_refused_in_one_line(tmp_path: Path) -> None:
    # torch's OneCycleLR divides by zero when pct_start x total_steps is exactly 1.
    from fasttrain.config.errors import UserError

    cfg = compose_train(
        tmp_path, "model=mlp", "model/scheduler=onecycle", "model/optimizer=sgd",
        "data.num_workers=0", "callbacks=none", "logger=none", "trainer.max_epochs=1",
        "trainer.max_steps=4", "+trainer.enable_progress_bar=false",
        "+trainer.enable_checkpointing=false", quick=False,
    )  # fmt: skip
    trainer, model, datamodule = build_run(cfg)
    says = r"model.scheduler.pct_start=0.25: .* exactly 1 of the run.s 4 optimizer steps"
    with pytest.raises(UserError, match=says):
        trainer.fit(model, datamodule=datamodule)


def test_label_smoothing_is_the_training_loss_only() -> None:
    from fasttrain.models import Classifier

    net = torch.nn.Linear(4, 3)
    model = Classifier(net, None, num_classes=3, label_smoothing=0.2)
    x, y = torch.randn(8, 4), torch.arange(8) % 3
    logits = net(x)
    train_loss = model.loss(model.net_outputs(x), y, training=True)
    eval_loss = model.loss(model.net_outputs(x), y, training=False)
    assert float(train_loss) == pytest.approx(
        float(F.cross_entropy(logits, y, label_smoothing=0.2))
    )
    assert float(eval_loss) == pytest.approx(float(F.cross_entropy(logits, y)))
    assert model.hparams["label_smoothing"] == 0.2
    with pytest.raises(ConfigError, match="label_smoothing"):
        Classifier(net, None, num_classes=3, label_smoothing=1.0)


def recipe_run(tmp_path: Path, *extra: str):
    cfg = compose_train(tmp_path, *TINY, *extra, quick=False)
    trainer, model, datamodule = build_run(cfg)
    trainer.fit(model, datamodule=datamodule)
    return cfg, trainer, model, datamodule


def test_recipe_trains_on_cifar_files_held_on_the_device_augmented(
    tmp_path: Path, monkeypatch
) -> None:
    data = write_cifar10(tmp_path / "cifar")
    calls = []
    original = PadCropFlip.__call__
    monkeypatch.setattr(
        PadCropFlip,
        "__call__",
        lambda self, x, g=None: calls.append(x.shape) or original(self, x, g),
    )
    cfg, trainer, model, datamodule = recipe_run(tmp_path, f"data.path={data}")
    assert isinstance(datamodule, Cifar10DataModule) and datamodule.on_device
    assert calls == [(8, 3, 32, 32)] * 2  # the two training batches, not validation's
    assert trainer.global_step == 2 and trainer.precision == "bf16-mixed"
    assert model.label_smoothing == 0.1 and model.channels_last
    assert model.net.features[0][0].weight.is_contiguous(memory_format=torch.channels_last)
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert type(scheduler).__name__ == "OneCycleLR" and scheduler.total_steps == 2
    optimizer = trainer.optimizers[0]
    assert type(optimizer).__name__ == "SGD" and optimizer.defaults["nesterov"]
    assert any(type(c).__name__ == "EMA" for c in trainer.callbacks)
    assert list(cfg.model.net.blocks) == [2, 2, 2, 2]  # ResNet-18
    assert compose_train(tmp_path, RECIPE, quick=False).model.net.channels == [64, 128, 256, 512]


def test_recipe_on_synthetic_cifar_shaped_data_is_an_explicit_override(tmp_path: Path) -> None:
    cfg, trainer, _, datamodule = recipe_run(tmp_path, "data=synthetic", "data.num_samples=64")
    assert type(datamodule).__name__ == "SyntheticDataModule"
    assert list(cfg.data.input_shape) == [3, 32, 32] and datamodule.on_device
    assert trainer.global_step == 2


def test_recipe_without_the_cifar_files_is_one_line_exit_2(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from fasttrain.train import main

    log_dir = tmp_path / "logs"
    argv = [RECIPE, f"data.path={tmp_path / 'nowhere'}", f"paths.log_dir={log_dir}"]
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("error: data.path=") and "no CIFAR-10 files there" in err[0]
    assert not list(log_dir.glob("*/*/*"))  # no run folder


def test_a_refusal_ignores_root_handlers_an_earlier_run_left(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    # An earlier in-process run (a test, a notebook cell) can leave a console handler on a
    # stream since closed; building at DEBUG must not send it every line.
    import io
    import logging

    from fasttrain.train import main

    stream = io.StringIO()
    stale = logging.StreamHandler(stream)
    stream.close()
    root = logging.getLogger()
    root.addHandler(stale)
    try:
        argv = [RECIPE, f"data.path={tmp_path / 'nowhere'}", f"paths.log_dir={tmp_path}"]
        monkeypatch.setattr(sys, "argv", ["train.py", *argv])
        with pytest.raises(SystemExit) as exit_:
            main()
        assert stale in root.handlers  # given back after the hold
    finally:
        root.removeHandler(stale)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Logging error" not in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_recipe_command_line_without_the_files(tmp_path: Path) -> None:
    proc = run_cli([str(REPO / "train.py"), RECIPE, f"data.path={tmp_path}"], tmp_path / "logs")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "no CIFAR-10 files there" in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_recipe_compiled_on_cuda(tmp_path: Path) -> None:
    # The shapes of bench/gpu_bench.py's recipe section (batch 512, training only): its compile
    # then starts from this one's cached graphs.
    cfg = compose_train(
        tmp_path, RECIPE, "data=synthetic", "data.num_samples=4096", "data.batch_size=512",
        "trainer.accelerator=gpu", "trainer.devices=1", "trainer.max_steps=6",
        "trainer.limit_val_batches=0", "+trainer.num_sanity_val_steps=0", "test=false",
        "logger=none", "callbacks.checkpoint=null", "callbacks.best=null", quick=False,
    )  # fmt: skip
    watch = seen_in_training(lambda trainer, model: (
        next(model.parameters()).device.type,
        trainer.datamodule._device_splits["train"].tensors[0].device.type,
    ))  # fmt: skip
    trainer, model, datamodule = build_run(cfg, [watch])
    trainer.fit(model, datamodule=datamodule)
    assert trainer.global_step == 6 and trainer.precision == "bf16-mixed"
    # while it trained: the weights and the training images on the GPU (fit's end moves the
    # module back to the CPU)
    assert model.hparams["compile"] and watch.seen == ("cuda", "cuda")
    assert torch.isfinite(model._train_sums).all()


def test_augmentation_makes_no_device_sync() -> None:
    from test_hot_path import SyncCounter

    module = at(True)
    with SyncCounter() as counter:
        augment_training_batch(module, (images(), torch.arange(64)), PadCropFlip(4, True))
    assert counter.calls == []


@pytest.mark.slow  # ~17 s here: 14 steps of the recipe
def test_recipe_steps_that_do_not_log_make_no_device_sync(tmp_path: Path) -> None:
    from test_hot_path import CountPerStep

    data = write_cifar10(tmp_path / "cifar", per_batch=24)  # 108 training images: 14 steps
    cfg = compose_train(
        tmp_path, *[o for o in TINY if "max_steps" not in o], f"data.path={data}",
        "trainer.log_every_n_steps=5", "test=false", quick=False,
    )  # fmt: skip
    counter = CountPerStep(first=2)
    trainer, model, datamodule = build_run(cfg, callbacks=[counter])
    trainer.fit(model, datamodule=datamodule)
    last = trainer.num_training_batches - 1
    quiet = {i: c for i, c in counter.per_step.items() if i not in counter.logging and i != last}
    assert len(quiet) >= 8, sorted(counter.per_step)
    assert not {i: c for i, c in quiet.items() if c}, "syncs on non-logging steps"
