"""Every YAML under conf/ composes, its `_target_`s instantiate, and it smoke-runs (principle 5)."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict

from fasttrain.assemble import build, build_all
from fasttrain.config.errors import UserError
from fasttrain.config.schema import validate
from fasttrain.models.spec import qualname
from fasttrain.models.task import TASK_TARGET_KEY
from fasttrain.testing.cases import (
    CONF,
    DEFAULT_DATA,
    compose_train,
    data_for,
    follows_contract,
    options,
    task_files,
)
from fasttrain.testing.fake_data import write_for

# Configs that ask for a CUDA device: without one they must fail with a clear error instead.
NEEDS_CUDA = {"trainer/gpu.yaml", "debug/nvtx.yaml", "trainer/ddp.yaml", "trainer/fsdp.yaml"}
# Launch processes by re-running `python train.py ...`: an in-process run would re-run pytest.
# tests/test_strategies.py runs them through `python train.py` in a subprocess instead.
LAUNCHES_PROCESSES = {"trainer/ddp_cpu.yaml"}
# Entry configs with a mandatory checkpoint (`ckpt_path: ???`); their own tests run them.
NEEDS_CKPT = {"eval.yaml", "export.yaml", "predict.yaml"}
# Entry configs that train nothing; tests/test_shards.py runs prepare.yaml.
NOT_TRAINING = {"prepare.yaml"}
# Configs that select a Hydra plugin from an extra ([sweep], [cluster]): skipped without it.
NEEDS_PLUGIN = {
    "hparams_search/optuna.yaml": "hydra_plugins.hydra_optuna_sweeper",
    "hydra/launcher/slurm.yaml": "hydra_plugins.hydra_submitit_launcher",
    "data/image_folder.yaml": "PIL",  # the [data] extra
    "data/shards.yaml": "webdataset",
    "logger/mlflow.yaml": "mlflow",  # the [mlflow] and [wandb] extras
    "logger/wandb.yaml": "wandb",
    "logger/many.yaml": "mlflow,wandb",
}
# Every selectable file; `_shared/` holds pieces other configs merge in, not options of a group.
CONFIG_FILES = sorted(
    str(p.relative_to(CONF))
    for p in CONF.rglob("*.yaml")
    if not p.relative_to(CONF).parts[0].startswith("_")
)
NET_FILES = sorted(p.stem for p in (CONF / "model" / "net").glob("*.yaml"))
# Keep each smoke run to a couple of batches; `++` adds or replaces whatever the file set.
SHORT = [
    "++trainer.max_epochs=1", "++trainer.limit_train_batches=2", "++trainer.limit_val_batches=1",
    "++trainer.limit_test_batches=1", "data.num_workers=0",
]  # fmt: skip
# Smoke runs that need more to stay short on 2 CPU cores: the CIFAR recipe compiles ResNet-18
# (minutes here); its own test (test_cifar_recipe.py) runs it at this size too.
SMOKE_EXTRA = {
    # GPT-2 small's 85M parameters (at 256 tokens), a GPU preset: two tiny batches here
    "model/net/gpt2_small.yaml": ["data.batch_size=2", "data.block_size=16", "data.eval_windows=2"],
    "experiment/cifar10_resnet18.yaml": [
        "model.compile=false", "model.net.channels=[8,16,32,64]", "data.batch_size=8",
    ],
}  # fmt: skip


def write_npy(folder: Path, n: int = 60) -> None:
    """x.npy/y.npy as conf/data/npy.yaml expects them (digits-shaped, 10 classes)."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    gen = np.random.default_rng(0)
    np.save(folder / "x.npy", gen.standard_normal((n, 1, 8, 8)).astype(np.float32))
    np.save(folder / "y.npy", np.arange(n) % 10)


def compose_for(rel: str, tmp_path: Path, extra: tuple[str, ...] | list[str] = ()) -> DictConfig:
    """Compose the config a user gets when selecting `rel` (a group option or a primary file)."""
    for module in NEEDS_PLUGIN.get(rel, "").split(","):
        if module:
            pytest.importorskip(module)
    if rel == "data/npy.yaml":  # reads files: write small ones where it looks (paths.data_dir)
        write_npy(tmp_path / "data" / "npy")
    parts = Path(rel).with_suffix("").parts
    primary = parts[0] if len(parts) == 1 else "train"
    group, option = "/".join(parts[:-1]), parts[-1]
    overrides = [] if len(parts) == 1 or group in ("hydra", "paths") else [f"{group}={option}"]
    if f"{primary}.yaml" in NEEDS_CKPT:
        overrides.append("ckpt_path=some.ckpt")
    if primary == "prepare":
        overrides.append(f"output_dir={tmp_path}/shards")
    overrides += [f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path}/run"]
    hydra = parts[0] == "hydra"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        # image data sets read files: small fakes where data.path points
        write_for(compose(primary, overrides=overrides, return_hydra_config=hydra))
    if primary == "train":  # after the fakes: the pairing resolves the data's num_classes
        overrides = [*pairing(group, option, tmp_path), *overrides]
    overrides += extra
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(primary, overrides=overrides, return_hydra_config=hydra)
        write_for(cfg)  # the data set the pairing chose
        cnn = "model" in cfg and str(cfg.model.net.get("_target_", "")).endswith("SmallCNN")
        if group == "data" and cnn and not image_shaped(cfg.data.input_shape):
            # A data set declares the input it gives (input_shape); the default net is a CNN on
            # images [C, H, W], so anything else runs with the MLP, which takes any shape.
            cfg = compose(primary, overrides=["model/net=mlp", *overrides])
        return cfg


def pairing(group: str, option: str, tmp_path: Path | None = None) -> list[str]:
    """What a task or a data set runs with when selected alone: a task option with the first data
    set it takes, a data option with the first task whose config resolves on it (tasks are
    discovered from conf/model, fasttrain.testing.cases)."""
    if group == "model":
        data = data_for(option)
        return [] if data in (None, DEFAULT_DATA) else [f"data={data}"]
    if group == "model/optimizer" and not _builds_with([], option):
        # an optimizer some nets cannot take (Muon: hidden Linear layers, which a CNN lacks):
        # with the first model option that takes it
        for model in options("model"):
            chosen = [f"model={model}", *pairing("model", model)]
            if _builds_with(chosen, option):
                return chosen
        return []
    if group == "model/net":  # a net with the first task (and its data) it resolves with
        for task in filter(follows_contract, task_files()):  # its round trip is a Task's
            chosen = [f"model={task}", f"data={data_for(task)}", f"model/net={option}"]
            try:
                OmegaConf.to_container(compose_train(chosen).model, resolve=True)
            except Exception:  # e.g. a transformer's vocab_size asked of class labels
                continue
            return [] if task == "classifier" else chosen[:2]
        return []
    if group != "data" or _takes(None, option, tmp_path):
        return []
    taker = next((t for t in task_files() if _takes(t, option, tmp_path)), None)
    return [f"model={taker}"] if taker else []


def _builds_with(chosen: list[str], optimizer: str) -> bool:
    """Whether the model of `chosen` builds with the optimizer option `optimizer`."""
    try:
        build(compose_train([*chosen, f"model/optimizer={optimizer}"]).model, "model")
    except UserError:
        return False
    return True


def _takes(task: str | None, data: str, tmp_path: Path | None = None) -> bool:
    """Whether the task (None: the default) builds on the data set and takes it."""
    chosen = [f"data={data}", *([f"model={task}"] if task else [])]
    try:
        cfg = compose_train(chosen, tmp_path)
        OmegaConf.to_container(cfg.model, resolve=True)
        model, datamodule = build(cfg.model, "model"), build(cfg.data, "data")
    except Exception:  # e.g. num_classes asked of a data set of regression targets
        return False
    mismatch = getattr(model, "data_mismatch", None)  # a plain LightningModule says nothing
    return mismatch is None or mismatch(datamodule) is None


def image_shaped(input_shape) -> bool:
    return len(input_shape) == 3


def test_every_config_file_is_covered() -> None:
    groups = {Path(f).parts[0] for f in CONFIG_FILES if "/" in f}
    assert {
        "data",
        "model",
        "trainer",
        "callbacks",
        "logger",
        "paths",
        "hydra",
        "debug",
        "experiment",
    } <= groups
    assert {"train.yaml", "eval.yaml"} <= set(CONFIG_FILES)


@pytest.mark.parametrize("rel", CONFIG_FILES)
def test_config_composes_and_instantiates(rel: str, tmp_path: Path) -> None:
    cfg = compose_for(rel, tmp_path)
    if rel.startswith("hydra/"):
        # Runs land under the log dir, one folder per run; sweeps one per job.
        assert str(cfg.hydra.run.dir).startswith(f"{tmp_path}/logs/train/")
        sweep = OmegaConf.to_container(cfg.hydra.sweep)  # unresolved: ${hydra.job.num} kept
        assert isinstance(sweep, dict) and str(sweep["subdir"]).startswith("${hydra.job.num}")
        return
    validate(cfg)
    datamodule = build(cfg.data, "data")
    if "model" in cfg:
        model = build(cfg.model, "model")
        mismatch = getattr(model, "data_mismatch", None)  # a plain LightningModule says nothing
        assert mismatch is None or mismatch(datamodule) is None  # the task takes the data
        # Hyperparameters, as a checkpoint records them, are plain containers: it loads with
        # weights_only=True. (A Task's are plain already; a plain module's partials and nets
        # are recorded as their specs.)
        from fasttrain.checkpoints.io import loadable_hparams

        recorded = loadable_hparams({"hyper_parameters": dict(model.hparams)})
        blob = io.BytesIO()
        torch.save(recorded["hyper_parameters"], blob)
        blob.seek(0)
        assert torch.load(blob, weights_only=True) == recorded["hyper_parameters"]
        from fasttrain.models.task import Task

        if isinstance(model, Task):  # records plain values itself
            assert recorded["hyper_parameters"] == dict(model.hparams)
    if rel in NEEDS_CUDA and not torch.cuda.is_available():
        # The CUDA-only piece is the trainer (trainer=gpu) or a callback (debug=nvtx).
        with pytest.raises(UserError, match=r"(?i)gpu"):
            build_all(cfg.get("callbacks"), "callbacks")
            build(cfg.trainer, "trainer")
        return
    callbacks = build_all(cfg.get("callbacks"), "callbacks")
    loggers = build_all(cfg.get("logger"), "logger")
    if "trainer" not in cfg:
        return  # export and predict run the net without a Trainer
    trainer = build(cfg.trainer, "trainer", callbacks=callbacks, logger=loggers or False)
    assert all(any(c is t for t in trainer.callbacks) for c in callbacks)
    assert len(loggers) == len([v for v in (cfg.get("logger") or {}).values() if v])


SMOKE = [
    f
    for f in CONFIG_FILES
    if f.split("/")[0] not in ("hydra", "paths") and f not in NEEDS_CKPT | NOT_TRAINING
]
# ~25 s on a 2-core CPU (a 124M-parameter GPT-2): with the long tests, keeping the default suite
# under 10 minutes; tests/test_language_model.py trains the small GPT by default.
LONG_SMOKE = {"model/net/gpt2_small.yaml"}


@pytest.mark.parametrize(
    "rel", [pytest.param(f, marks=pytest.mark.slow) if f in LONG_SMOKE else f for f in SMOKE]
)
def test_config_smoke_runs(rel: str, tmp_path: Path) -> None:
    if rel in NEEDS_CUDA and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (the instantiate test checks the error without one)")
    if rel in LAUNCHES_PROCESSES:
        # fasttrain's own suite runs these through python train.py (its test_strategies.py)
        pytest.skip("launches processes (DDP): composed and instantiated here, not run")
    from fasttrain.tasks import train

    cfg = compose_for(rel, tmp_path, [*SHORT, *SMOKE_EXTRA.get(rel, [])])
    metrics = train(cfg)
    # The task's own metric (its monitor's test twin: test/acc, test/mse, ...) was measured.
    monitor = OmegaConf.select(cfg, "callbacks.best.monitor") or "val/loss"
    assert math.isfinite(metrics["test/" + str(monitor).split("/", 1)[1]])
    assert (tmp_path / "run" / "metrics.json").is_file()
    if rel.startswith("logger/") and not rel.endswith("none.yaml"):
        # TensorBoard's events go into the run folder itself (its name is the run's in the UI);
        # MLflow's database into logs/, shared by the runs.
        stem = Path(rel).stem
        events, database = "run/events.out.tfevents.*", "logs/mlflow.db"
        written = {"tensorboard": [events], "mlflow": [database],
                   "many": [events, database, "run/wandb/*"]}  # fmt: skip
        for pattern in written.get(stem, [f"run/{stem}/*"]):
            assert any(tmp_path.glob(pattern)), f"the logger wrote nothing: {pattern}"


def test_model_interpolates_data_shape(tmp_path: Path) -> None:
    # One source of truth: the net's shape and class count follow the data group.
    cfg = compose_for(
        "data/synthetic.yaml", tmp_path, ["data.num_classes=7", "data.input_shape=[3,16,16]"]
    )
    assert OmegaConf.to_container(cfg.model.net.input_shape, resolve=True) == [3, 16, 16]
    assert cfg.model.num_classes == 7 and cfg.model.net.num_classes == 7


@pytest.mark.parametrize("net", NET_FILES)
def test_every_net_config_round_trips_through_a_checkpoint(net: str, tmp_path: Path) -> None:
    """Any net config: the checkpoint holds its spec, and load_task rebuilds the same
    function from it."""
    from fasttrain.assemble import build_model
    from fasttrain.checkpoints.load import load_task

    paired = pairing("model/net", net)  # a net of another task (gpt: the language model)
    if paired:
        cfg = compose_for(f"model/net/{net}.yaml", tmp_path)
        shape = list(cfg.data.input_shape)
    else:
        extra = [f"model/net={net}", "data.input_shape=[3,8,8]"]
        cfg = compose_for("data/synthetic.yaml", tmp_path, extra)
        shape = [3, 8, 8]
    model = build_model(cfg.model).eval()
    ckpt = tmp_path / "net.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
                TASK_TARGET_KEY: qualname(type(model))}, ckpt)  # fmt: skip
    rebuilt, _ = load_task(ckpt)
    x = model.example_inputs(4, shape)
    with torch.no_grad():
        assert torch.equal(rebuilt(x), model(x))


def test_a_plain_module_net_is_recorded_from_its_config(tmp_path: Path) -> None:
    """A net that records no arguments of its own (any nn.Module) gets its config's spec."""
    from fasttrain.assemble import build_model

    cfg = compose_for("data/synthetic.yaml", tmp_path, ["data.input_shape=[3,8,8]"])
    plain = {"_target_": "torch.nn.Flatten", "start_dim": 1}
    with open_dict(cfg):
        cfg.model.net = plain
    model = build_model(cfg.model)
    assert model.hparams["net"] == plain


def test_a_nested_node_error_names_its_path_once(tmp_path: Path) -> None:
    # Hydra reports the failing node from the config's root (trainer.profiler); the builder must
    # not prefix it again (trainer.trainer.profiler).
    cfg = compose_for("debug/profile.yaml", tmp_path, ["+trainer.profiler.sort_by_key=nope"])
    with pytest.raises(UserError) as err:
        build(cfg.trainer, "trainer")
    assert str(err.value).startswith("trainer.profiler: ") and "trainer.trainer" not in str(
        err.value
    )
