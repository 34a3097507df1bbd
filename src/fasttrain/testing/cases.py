"""Every task × each of its nets × its data, discovered from conf/ (a task added there is
tested the day it is added, with no edit here).

- A task is a `conf/model/*.yaml` option; options with the same `_target_` are presets of one
  task (cnn.yaml and mlp.yaml of classifier.yaml), and the task's own file is the one whose
  name is its class's.
- Its data is the first data option (the default, digits, then by name) whose composed config
  resolves with it and that the task says it can take (`data_mismatch`); one that needs files or
  an extra it cannot find here is passed over.
- A plain LightningModule there (not a Task) is a case of its own (`plain_cases`): it trains,
  evaluates and resumes; the contract's checks (round trip, export, predict) are a Task's.
- Its nets are the `conf/model/net/*.yaml` options that build for that data's `input_shape` and
  map a batch of it (the task's `example_inputs`: token ids for a language model) to outputs;
  presets of over GPU_PRESET_PARAMS parameters (gpt2_small) are for a GPU and left out here.
"""

from __future__ import annotations

import functools
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from fasttrain.config.project import CONFIG_DIR

# the project's conf/ (fasttrain.CONFIG_DIR): the options tested are the project's own
CONF = Path(CONFIG_DIR)

DEFAULT_DATA = "digits"
GPU_PRESET_PARAMS = 20_000_000
# Keep each run to a few batches: `++` adds or replaces whatever the file set.
SHORT = [
    "++trainer.max_epochs=1", "++trainer.limit_train_batches=3", "++trainer.limit_val_batches=2",
    "++trainer.limit_test_batches=2", "data.num_workers=0", "logger=none",
]  # fmt: skip


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def data_options() -> list[str]:
    rest = [d for d in options("data") if d != DEFAULT_DATA]
    return [DEFAULT_DATA, *rest]


def compose_train(overrides: list[str], tmp_path: Path | None = None) -> DictConfig:
    where = [f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path}/run"] if tmp_path else []
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=[*overrides, *where])


@functools.cache
def task_files() -> dict[str, str]:
    """The model option that is each task's own file -> the task's class name."""
    targets: dict[str, list[str]] = {}
    for option in options("model"):
        target = str(compose_train([f"model={option}"]).model._target_)
        targets.setdefault(target, []).append(option)
    found = {}
    for target, files in targets.items():
        name = target.rsplit(".", 1)[-1]
        own = next((f for f in files if f.replace("_", "") == name.lower()), files[0])
        found[own] = name
    return found


@functools.cache
def data_for(model_option: str) -> str | None:
    """The first data option this model composes with and takes."""
    from fasttrain.assemble import build

    for data in data_options():
        try:
            cfg = compose_train([f"model={model_option}", f"data={data}"])
            OmegaConf.to_container(cfg.model, resolve=True)
            datamodule = build(cfg.data, "data")
            model = build(cfg.model, "model")
        except Exception:  # another kind of data (labels vs targets), or files it lacks here
            continue
        mismatch = getattr(model, "data_mismatch", None)  # a plain LightningModule says nothing
        if mismatch is None or mismatch(datamodule) is None:
            return data
    return None


@functools.cache
def follows_contract(model_option: str) -> bool:
    """Whether the option's class is a Task (fasttrain.models.task), not a plain
    LightningModule: only a Task has the contract's methods (example_inputs, data_mismatch...)."""
    from hydra.utils import get_object

    from fasttrain.models.task import Task

    target = get_object(str(compose_train([f"model={model_option}"]).model._target_))
    return isinstance(target, type) and issubclass(target, Task)


@functools.cache
def nets_for(model_option: str, data: str) -> tuple[str, ...]:
    """The net options that build for the data's input shape and take a batch of it."""
    import torch

    from fasttrain.assemble import build

    fitting = []
    for net in options("model/net"):
        cfg = compose_train([f"model={model_option}", f"data={data}", f"model/net={net}"])
        shape = list(cfg.data.input_shape)
        try:
            model = build(cfg.model, "model").eval()
            with torch.no_grad():
                model(model.example_inputs(2, shape))
        except Exception:  # e.g. a CNN on flat tabular inputs
            continue
        if sum(p.numel() for p in model.parameters()) > GPU_PRESET_PARAMS:
            continue
        fitting.append(net)
    return tuple(fitting)


def cases() -> list[tuple[str, str, str]]:
    """(task option, data option, net option) for every task and each of its nets."""
    found = []
    for task in filter(follows_contract, task_files()):
        data = data_for(task)
        assert data is not None, f"no data option in conf/data fits model={task}"
        nets = nets_for(task, data)
        assert nets, f"no net option in conf/model/net fits model={task} data={data}"
        found += [(task, data, net) for net in nets]
    return found


def plain_cases() -> list[tuple[str, str]]:
    """(model option, data option) for each plain LightningModule in conf/model: it trains,
    evaluates and resumes as any module does; the contract's own checks are a Task's."""
    found = []
    for option in task_files():
        if follows_contract(option):
            continue
        data = data_for(option)
        assert data is not None, f"no data option in conf/data builds with model={option}"
        found.append((option, data))
    return found


def case_id(case: tuple[str, str, str]) -> str:
    return "-".join(case)
