"""fasttrain: a PyTorch Lightning + Hydra template for training models fast on GPUs.

Importing the package is cheap on purpose: torch and Lightning load only when a task runs, so
`python train.py --help` answers in well under a second.
"""

__version__ = "0.3.0"  # the project's version (pyproject.toml); CHANGELOG.md says what changed

import os
import sys
from importlib import import_module
from pathlib import Path
from typing import Any, NoReturn

# The public API: what a project's own code may import, as `from fasttrain import Task`. These
# names keep their meaning across versions (CHANGELOG.md announces any change); everything
# else is internal and may move. Loaded on first use, so `import fasttrain` stays cheap.
PUBLIC = {
    # tasks: LightningModules on one contract; Task is the base a project's own task extends
    "Task": "fasttrain.models.task",
    "Classifier": "fasttrain.models.classifier",
    "Regressor": "fasttrain.models.regressor",
    "LanguageModel": "fasttrain.models.language_model",
    "WarmupCosine": "fasttrain.models.schedules",
    # nets: plain nn.Modules that record their arguments (a checkpoint rebuilds them)
    "MLP": "fasttrain.models.nets.mlp",
    "SmallCNN": "fasttrain.models.nets.cnn",
    "ResNet": "fasttrain.models.nets.resnet",
    "GPT": "fasttrain.models.nets.gpt",
    "init_weights": "fasttrain.models.nets.init",
    # data modules: the bases a project's own data set extends, and the data sets by name
    "TensorDataModule": "fasttrain.data.base",
    "ArrayDataModule": "fasttrain.data.arrays",
    "RegressionArrayDataModule": "fasttrain.data.regression",
    "ImageDataModule": "fasttrain.data.images",
    "ImageFolderDataModule": "fasttrain.data.image_folder",
    "Cifar10DataModule": "fasttrain.data.cifar10",
    "NpyDataModule": "fasttrain.data.npy",
    "ShardsDataModule": "fasttrain.data.shards",
    "TextDataModule": "fasttrain.data.text",
    "DigitsDataModule": "fasttrain.data.digits",
    "WineDataModule": "fasttrain.data.wine",
    "DiabetesDataModule": "fasttrain.data.diabetes",
    "SyntheticDataModule": "fasttrain.data.synthetic",
    # what export and predict need of a plain LightningModule (typing.Protocol: write the methods)
    "Exportable": "fasttrain.models.protocols",
    "Predictable": "fasttrain.models.protocols",
    # one-line errors: raise them for input a user can fix (exit code 2, nothing written)
    "UserError": "fasttrain.config.errors",
    "ConfigError": "fasttrain.config.errors",
    # a project's entry modules: `main, run = entry_points("train", tasks.train)`
    "entry_points": "fasttrain.cli",
}
__all__ = ["__version__", *PUBLIC]


def __getattr__(name: str) -> Any:
    if name == "CONFIG_DIR":  # looked up once, when an entry point first needs it
        globals()["CONFIG_DIR"] = config_dir()
        return globals()["CONFIG_DIR"]
    if name not in PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(PUBLIC[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *PUBLIC})


CONF_ENV = "FASTTRAIN_CONF"  # the project's conf/ folder, where it is not found by itself


def config_dir() -> str:
    """The project's conf/, which the library reads and never ships: FASTTRAIN_CONF where set,
    else the conf/ (holding train.yaml) of the working directory or the nearest folder above it
    (a project is run from its own folder), else that of this checkout when the library runs
    from its own repository, itself a project. Absolute: Hydra would read a relative path as a
    Python package when an entry point is imported as a module (python -m fasttrain.evaluate)."""
    given = os.environ.get(CONF_ENV, "").strip()
    if given:
        if not (Path(given) / "train.yaml").is_file():
            _refuse(f"{CONF_ENV}={given}: no train.yaml there; give the project's conf/ folder")
        return str(Path(given).resolve())
    here = Path.cwd().resolve()
    checkout = Path(__file__).resolve().parents[2]  # src/fasttrain/__init__.py
    for folder in (here, *here.parents, checkout):
        if (folder / "conf" / "train.yaml").is_file():
            return str(folder / "conf")
    _refuse(
        f"no conf/ with train.yaml in {here} or above it: run from the project's folder, "
        f"or set {CONF_ENV}=path/to/conf"
    )


def _refuse(message: str) -> NoReturn:
    """Bad input before any entry point's own error handling exists: one line, exit 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def shown(path: str | Path) -> str:
    """`path` as messages show it: relative to the working directory when it lies below it (so
    a printed command works as printed from there), else absolute."""
    absolute = Path(path).absolute()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


# A folder name holds at most 255 bytes; the time (19 characters) or a sweep job's number and
# "_" come before the overrides.
MAX_OVERRIDES = 200


def _overrides_suffix() -> str:
    """`${overrides_suffix:}` in conf/: "_" + the job's overrides as one folder name, e.g.
    "_data.batch_size=128,seed=1"; "" without overrides, or outside a Hydra app (compose API).
    A group selection like model/net=mlp keeps no "/", so it stays one folder."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return ""
    hydra = HydraConfig.get()
    overrides = _last_of_each_key(hydra.job.override_dirname, list(hydra.overrides.task))
    return f"_{short_overrides(overrides.replace('/', '.'))}" if overrides else ""


def _last_of_each_key(dirname: str, typed: list[str]) -> str:
    """Hydra's `override_dirname` (sorted by value too) with a key given twice on the command
    line named once, by the value that won (the last typed): `seed=1 seed=2` ran with seed=2
    and was named "seed=1,seed=2"."""
    import re

    last = {item.partition("=")[0]: item for item in typed}
    items = re.split(r",(?=[\w.+~@/-]+=)", dirname) if dirname else []
    kept = [item for item in items if last.get(item.partition("=")[0], item) == item]
    return ",".join(dict.fromkeys(kept))


def short_overrides(overrides: str, limit: int = MAX_OVERRIDES) -> str:
    """`overrides` ("key=value,key=value") within `limit` bytes without losing a value: as they
    are when they fit, else each key cut to its shortest dotted ending that no other key shares
    ("model.optimizer.lr=0.01,model.optimizer.weight_decay=0.1" -> "lr=0.01,weight_decay=0.1").
    Only where even that is too long (values of ~200 characters) is the end cut, and a hash of
    the whole then keeps the name unique."""
    import hashlib
    import re

    if len(overrides.encode()) <= limit:
        return overrides
    items = re.split(r",(?=[\w.+~@-]+=)", overrides)  # a value may hold commas: [64,32]
    pairs = [item.partition("=") for item in items]
    keys = [k for k, _, _ in pairs]
    short = ",".join(f"{_unique_ending(k, keys)}={v}" for k, _, v in pairs)
    if len(short.encode()) <= limit:
        return short
    digest = hashlib.sha1(overrides.encode()).hexdigest()[:8]
    return short.encode()[: limit - 9].decode(errors="ignore") + "~" + digest


def _unique_ending(key: str, keys: list[str]) -> str:
    parts = key.split(".")
    for n in range(1, len(parts) + 1):
        ending = ".".join(parts[-n:])
        if sum(k == ending or k.endswith("." + ending) for k in keys) == 1:
            return ending
    return key


def _launch_dir() -> str:
    """`${launch_dir:}` in conf/paths: the folder the command was started from.

    Not `${hydra:runtime.cwd}`: Hydra resolves `hydra.sweep.dir` (which derives from it) before
    it sets its runtime config, so a multirun (`python train.py -m seed=1,2`) would fail with
    "HydraConfig was not set". With `hydra.job.chdir=true` the job runs elsewhere; Hydra's
    record of the launch folder wins whenever it has one.
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if HydraConfig.initialized():
        hydra: Any = HydraConfig.get()
        cwd = OmegaConf.select(hydra, "runtime.cwd", throw_on_missing=False)
        if cwd:
            return str(cwd)
    return os.getcwd()


def _root_dir() -> str:
    """`${root_dir:}` in conf/paths: FASTTRAIN_ROOT when it is set and not empty (fasttrain.cli
    refuses a relative one), else the launch folder. Not `${oc.env:FASTTRAIN_ROOT,...}`: a
    variable set but empty would make the root the filesystem's."""
    return os.environ.get("FASTTRAIN_ROOT", "").strip() or _launch_dir()


def _task_monitor(attribute: str, _root_: Any, name: str | None = None) -> str:
    """`${monitor:}` in conf/: the metric the model's task is judged by (its class's `monitor`,
    e.g. val/mse); `${monitor:mode}` its direction (`monitor_mode`, min), `${monitor:direction}`
    the same in Optuna's words (minimize), `${monitor:short}` its last part (mse).
    `${monitor:file,NAME}`: a checkpoint file name's metric part, `mse{val/mse:.4f}`, of NAME (a
    callback's own monitor) or, where NAME is null, of the task's. One source of truth, the
    task class (fasttrain.models.task); a module without them: val/loss, min."""
    if attribute == "file":
        metric = name or _task_monitor("", _root_)
        return f"{metric.rsplit('/', 1)[-1]}{{{metric}:.4f}}"
    import importlib

    from omegaconf import OmegaConf

    target = str(OmegaConf.select(_root_, "model._target_", default=None) or "")
    module, _, name = target.rpartition(".")
    try:
        task = getattr(importlib.import_module(module), name) if module else None
    except Exception:  # config validation reports a target that cannot be imported, in one line
        task = None
    mode = str(getattr(task, "monitor_mode", "min"))
    if attribute in ("mode", "direction"):  # direction: as Optuna says it
        return mode if attribute == "mode" else f"{mode[:3]}imize"
    monitor = str(getattr(task, "monitor", "val/loss"))
    return monitor.rsplit("/", 1)[-1] if attribute == "short" else monitor


def _class_count(path: str, classes: Any = None) -> int:
    """`${class_count:PATH,CLASSES}`: the classes of an image folder (data/image_folder.py)."""
    from fasttrain.data.image_folder import count_classes

    return count_classes(str(path), list(classes) if classes else None)


def _register_resolvers() -> None:
    # Registered on import, so every entry point and every test that composes conf/ has them.
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("overrides_suffix", _overrides_suffix, replace=True)
    OmegaConf.register_new_resolver("launch_dir", _launch_dir, replace=True)
    OmegaConf.register_new_resolver("root_dir", _root_dir, replace=True)
    OmegaConf.register_new_resolver(
        "monitor",
        lambda attribute="", name=None, *, _root_: _task_monitor(attribute, _root_, name),
        replace=True,
    )
    OmegaConf.register_new_resolver("class_count", _class_count, replace=True)


_register_resolvers()
