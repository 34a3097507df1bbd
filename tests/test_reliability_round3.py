"""Reliability, round three: restored checkpoint state that names files outside the run, ..."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import run_cli
from fasttrain.testing.cases import compose_train

RUN = ["model=mlp", "data=wine", "data.num_workers=0", "logger=none", "trainer.max_epochs=1"]


def craft_escaping_state(ckpt: Path, victim: Path) -> None:
    """Every ModelCheckpoint state of `ckpt` names `victim` through `<dirpath>/../..`."""
    state = torch.load(ckpt, weights_only=True)
    for key, value in state["callbacks"].items():
        if key.startswith("ModelCheckpoint") and value.get("dirpath"):
            depth = len(Path(value["dirpath"]).relative_to(victim.parent).parts)
            escaping = str(Path(value["dirpath"], *[".."] * depth, victim.name))
            for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
                value[key] = escaping
            value["best_k_models"] = {escaping: torch.tensor(0.0)}
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


def test_resuming_with_another_split_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    from fasttrain.config.errors import UserError
    from fasttrain.tasks import train

    train(compose_train([*RUN, "run_name=r", "seed=1"], tmp_path))
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    for changed in ("seed=2", "data.val_fraction=0.3", "data.fold=1"):
        longer = [*RUN, "run_name=r", "seed=1", changed, "trainer.max_epochs=2"]
        with pytest.raises(UserError, match=r"differs from the checkpoint's data\.\w+=\S+, which "):
            train(compose_train(longer, tmp_path))
    assert last.read_bytes() == before


def test_a_changed_model_setting_is_said_to_apply_or_to_be_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fasttrain.tasks import train

    train(compose_train([*RUN, "run_name=r"], tmp_path))
    changed = ["model.optimizer.lr=0.01", "model.net.dropout=0.3", "trainer.max_epochs=2"]
    train(compose_train([*RUN, "run_name=r", *changed], tmp_path))
    said = " | ".join(r.getMessage() for r in caplog.records)
    assert "model.optimizer.lr=0.01 (the checkpoint's: 0.003) is ignored" in said
    assert "model.net.dropout=0.3 (the checkpoint's: 0.1) applies from here on" in said
    assert (
        torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 1
    )


@pytest.mark.slow  # two processes, ~25 s: CI runs it in make test-slow
def test_cli_resume_with_another_seed_is_one_line_exit_2(tmp_path: Path) -> None:
    args = ["train.py", "data=wine", "model=mlp", "run_name=r", "logger=none"]
    first = run_cli([*args, "seed=1", "trainer.max_epochs=1"], tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    proc = run_cli([*args, "seed=2", "trainer.max_epochs=2"], tmp_path)
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert "data.seed=2 (set by seed=) differs from the checkpoint's data.seed=1" in line, line


def _image_folder_module(root: Path, **kwargs: object):
    from fasttrain.data.image_folder import ImageFolderDataModule

    args = {"num_classes": 2, "input_shape": [1, 8, 8], "channels": 1, "image_size": [8, 8],
            "crop": "none", "flip": False, "num_workers": 0, **kwargs}  # fmt: skip
    return ImageFolderDataModule(str(root), **args)


def test_16_bit_images_are_scaled_not_saturated(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    import numpy as np
    from PIL import Image

    from fasttrain.data.images import open_image

    ramp = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1024).astype(np.uint16)  # 0..64512
    Image.fromarray(ramp).save(tmp_path / "ramp.png")
    assert Image.open(tmp_path / "ramp.png").mode.startswith("I")
    pixels = np.asarray(open_image(tmp_path / "ramp.png"))
    assert pixels.dtype == np.uint8 and pixels.shape == (8, 8)
    assert np.array_equal(pixels, np.round(ramp / 257).astype(np.uint8))  # not 255 almost all


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    import numpy as np
    from PIL import Image

    from fasttrain.data.images import open_image

    wide = np.zeros((4, 8, 3), np.uint8)
    wide[:, :4] = 255  # left half white, as stored: 8 wide, 4 high
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to display"
    Image.fromarray(wide).save(tmp_path / "phone.jpg", exif=exif, quality=100)
    shown = np.asarray(open_image(tmp_path / "phone.jpg"))
    assert shown.shape[:2] == (8, 4)  # upright: 4 wide, 8 high
    assert shown[:3].mean() > 200 and shown[-3:].mean() < 50  # the white half now on top


def test_hidden_files_in_class_folders_are_not_images(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    from fasttrain.testing.fake_data import write_image_folder

    root = write_image_folder(tmp_path / "imgs", ("a", "b"), per_class=5)
    (root / "a" / "._a_000.jpg").write_bytes(b"\x00\x05\x16\x07 resource fork")
    (root / "b" / ".hidden").mkdir()
    (root / "b" / ".hidden" / "x.png").write_bytes(b"not png")
    dm = _image_folder_module(root)
    files = [f for part in dm.parts.values() for f, _ in part]
    assert len(files) == 10 and not [f for f in files if "/." in str(f)]


def test_image_folder_classes_are_counted_when_the_config_resolves(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    from fasttrain.assemble import build_run
    from fasttrain.config.errors import UserError
    from fasttrain.config.schema import validate
    from fasttrain.testing.fake_data import write_image_folder

    root = write_image_folder(tmp_path / "imgs", ("a", "b", "c"), per_class=4)
    chosen = ["data=image_folder", f"data.path={root}", "data.image_size=[8,8]"]
    cfg = compose_train(chosen, tmp_path)
    assert cfg.data.num_classes == 3 and cfg.model.num_classes == 3  # no data.num_classes typed
    _, model, datamodule = build_run(cfg)
    assert model.num_classes == datamodule.num_classes == 3
    with pytest.raises(UserError, match=r"^data\.path='.*nowhere': no such folder$"):
        validate(compose_train(["data=image_folder", f"data.path={tmp_path}/nowhere"]), "", "train")


def test_image_folder_splits_do_not_move_when_files_are_added_or_removed(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    from fasttrain.testing.fake_data import image, write_image_folder

    root = write_image_folder(tmp_path / "imgs", ("a", "b"), per_class=30)
    dm = _image_folder_module(root)

    def split_of(module) -> dict[str, str]:
        return {f.name: s for s, part in module.parts.items() for f, _ in part}

    before = split_of(dm)
    image(root / "a" / "new.png", (20, 20), "L", 40)
    gone = sorted((root / "b").glob("b_007.*"))[0]
    gone.unlink()
    after_dm = _image_folder_module(root)
    after = split_of(after_dm)
    moved = [name for name in before.keys() & after.keys() if before[name] != after[name]]
    assert not moved and "new.png" in after and gone.name not in after
    assert dm.hparams["split_record"] != after_dm.hparams["split_record"]
    assert dm.hparams["split_record"]["test"]["files"] == len(dm.parts["test"])


def test_evaluate_says_when_the_image_files_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("PIL")
    from hydra import compose, initialize_config_dir

    from conftest import CONF
    from fasttrain.assemble.restore import restore
    from fasttrain.tasks import train
    from fasttrain.testing.fake_data import image, write_image_folder

    root = write_image_folder(tmp_path / "imgs", ("a", "b"), per_class=12)
    run = ["data=image_folder", f"data.path={root}", "data.image_size=[8,8]", "model=mlp",
           "data.num_workers=0", "logger=none", "trainer.max_epochs=1", "run_name=r"]  # fmt: skip
    train(compose_train(run, tmp_path))
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert "split_record" in torch.load(ckpt, weights_only=True)["datamodule_hyper_parameters"]
    for i in range(5):
        image(root / "b" / f"more_{i}.png", (20, 20), "L", 120)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("eval", overrides=[f"ckpt_path={ckpt}", f"paths.root_dir={tmp_path}/e",
                                         f"paths.output_dir={tmp_path}/e/run",
                                         "data=image_folder", f"data.path={root}"])  # fmt: skip
    restore(cfg)  # the folder typed: a location never comes from the checkpoint
    said = [r.getMessage() for r in caplog.records if "data files changed" in r.getMessage()]
    assert said and said[0].startswith(f"ckpt_path={ckpt}: the data files changed since the ")
    caplog.clear()
    train(compose_train([*run, "trainer.max_epochs=2"], tmp_path))  # resume=auto: said too
    assert [r for r in caplog.records if "data files changed" in r.getMessage()]


def test_an_error_naming_its_override_gets_no_second_prefix(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    from fasttrain.assemble import build
    from fasttrain.config.errors import UserError
    from fasttrain.testing.fake_data import write_image_folder

    root = write_image_folder(tmp_path / "imgs", ("a", "b"), per_class=3)
    (root / "a" / "broken.png").write_bytes(b"\x89PNG not really")
    cfg = compose_train(["data=image_folder", f"data.path={root}"], tmp_path)
    with pytest.raises(UserError) as err:
        build(cfg.data, "data")
    assert str(err.value).startswith("data.path: ") and "broken.png" in str(err.value)


def test_resuming_an_averaged_run_without_averaging_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fasttrain.tasks import train

    train(compose_train([*RUN, "run_name=r", "callbacks/averaging=ema"], tmp_path))
    train(compose_train([*RUN, "run_name=r", "trainer.max_epochs=2"], tmp_path))
    said = [r.getMessage() for r in caplog.records if "weight averaging" in r.getMessage()]
    assert said and "training goes on from the averaged weights" in said[0]


AUGMENTED = [
    "data=image_folder", "data.image_size=[8,8]", "data.crop=resized", "data.flip=true",
    "model=mlp", "data.batch_size=8", "trainer.max_epochs=2", "trainer.deterministic=true",
    "callbacks.checkpoint.every_n_train_steps=3", "callbacks.progress_bar=null", "test=false",
    "logger=none",
]  # fmt: skip


def _final_state(run: Path) -> dict[str, torch.Tensor]:
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    state = dict(ckpt["state_dict"])
    for i, s in ckpt["optimizer_states"][0]["state"].items():
        state.update({f"optim.{i}.{k}": v for k, v in s.items()})
    return {"step": torch.tensor(ckpt["global_step"]), **state}


@pytest.mark.slow  # a reference run and two killed processes, ~40 s: CI runs it in make test-slow
@pytest.mark.parametrize("workers", [0, 2])
def test_sigkill_mid_epoch_with_augmentation_resumes_bit_exact(
    workers: int, tmp_path: Path
) -> None:
    pytest.importorskip("PIL")
    from conftest import REPO
    from fasttrain.tasks import train
    from fasttrain.testing.fake_data import write_image_folder

    root = write_image_folder(tmp_path / "imgs", ("a", "b", "c"), per_class=16)
    run = [*AUGMENTED, f"data.path={root}", f"data.num_workers={workers}"]
    train(compose_train([*run, "run_name=ref"], tmp_path / "ref"))  # uninterrupted, in process
    reference = _final_state(tmp_path / "ref" / "run")
    killer = ["+callbacks.killer._target_=killer.Killer", "+callbacks.killer.at_step=4"]
    proc = run_cli([str(REPO / "train.py"), *run, "run_name=k", *killer], tmp_path / "logs",
                   PYTHONPATH=str(REPO / "tests"))  # fmt: skip
    assert proc.returncode == -9, proc.stderr[-2000:]
    killed_run = tmp_path / "logs" / "train" / "k"
    assert (
        torch.load(killed_run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    )  # mid-epoch 0
    again = run_cli([str(REPO / "train.py"), *run, "run_name=k"], tmp_path / "logs")
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = _final_state(killed_run)
    assert resumed.keys() == reference.keys()
    differ = [k for k in reference if not torch.equal(reference[k], resumed[k])]
    assert not differ, f"not bit-identical: {differ[:5]}"


@pytest.mark.slow  # one process each, ~8 s: CI runs it in make test-slow
@pytest.mark.parametrize(
    ("choice", "printed"),
    [("experiment=cifar10_resnet18", "Cifar10DataModule"),
     # its class count is a resolver that reads the folder: left unresolved when printed
     ("data=image_folder", "num_classes: ${class_count:")],
)  # fmt: skip
def test_printing_a_config_needs_no_data(choice: str, printed: str, tmp_path: Path) -> None:
    args = ["train.py", "--cfg", "job", choice, f"paths.data_dir={tmp_path}/none"]
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert printed in proc.stdout and not (tmp_path / "none").exists()
