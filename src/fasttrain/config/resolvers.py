"""The resolvers conf/ interpolates: `${overrides_prefix:}` and `${overrides_suffix:}` (a run's
name, a sweep job's), `${launch_dir:}`, `${root_dir:}`, `${monitor:...}` and
`${class_count:...}`. Registered when fasttrain.config is
first imported, so every entry point and every test that composes conf/ has them."""

import os
from importlib import import_module
from typing import Any

# A folder name holds at most 255 bytes; the overrides come with "_" and the time (11
# characters) or a sweep job's number and "_".
MAX_OVERRIDES = 200


def _overrides_prefix(_root_: Any = None) -> str:
    """`${overrides_prefix:}` in conf/train.yaml: the job's overrides as one folder name, then
    "_", e.g. "batch_size=128,seed=1_" (the time follows); "" without overrides, or outside a
    Hydra app (compose API). Keys as short as the run's config allows (`_config_keys`)."""
    overrides = _job_overrides(_root_)
    return f"{overrides}_" if overrides else ""


def _overrides_suffix(_root_: Any = None) -> str:
    """`${overrides_suffix:}` in conf/: "_" + the job's overrides as one folder name, e.g.
    "_batch_size=128,seed=1" (a sweep job's folder: `<job number>_<overrides>`); "" without
    overrides, or outside a Hydra app (compose API)."""
    overrides = _job_overrides(_root_)
    return f"_{overrides}" if overrides else ""


def _job_overrides(root: Any) -> str:
    """The job's overrides that differ from the defaults, as they name its folder: a key given
    twice by the value that won, a group selection like model/net=mlp without its "/" (one
    folder), each key by its shortest dotted ending that names one setting of the run's config
    (`short_keys`), the whole within MAX_OVERRIDES bytes (`short_overrides`)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return ""
    hydra = HydraConfig.get()
    overrides = _last_of_each_key(hydra.job.override_dirname, list(hydra.overrides.task))
    if not overrides:
        return ""
    return short_overrides(short_keys(overrides.replace("/", "."), _config_keys(root)))


def _config_keys(root: Any) -> list[str]:
    """Every key of the run's config (dotted, nodes and leaves), less Hydra's own; read
    without resolving a value."""
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(root, DictConfig):
        return []
    tree = OmegaConf.to_container(root, resolve=False)
    keys: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if not prefix and key == "hydra":
                    continue
                keys.append(f"{prefix}{key}")
                walk(value, f"{prefix}{key}.")

    walk(tree, "")
    return keys


def short_keys(overrides: str, config_keys: list[str]) -> str:
    """Each override's key cut to its shortest dotted ending that no other key of the config
    ends with (`model.optimizer.lr=0.01` -> `lr=0.01` where the config has one `lr`): TensorBoard's
    run list and MLflow's runs table show a name's first ~25 characters, and those say what
    differs. The name still tells any two sets of overrides apart: within the run's config each
    ending names one setting. A top-level key (seed, model) stays whole, so does a key the
    config lacks (`+callbacks.extra...`) and one typed with a prefix (`+`, `~`, `++`)."""
    import re

    if not overrides or not config_keys:
        return overrides
    items = re.split(r",(?=[\w.+~@-]+=)", overrides)  # a value may hold commas: [64,32]
    shortened = []
    for item in items:
        key, eq, value = item.partition("=")
        shortened.append(f"{_config_ending(key, config_keys)}{eq}{value}" if eq else item)
    return ",".join(shortened)


def _config_ending(key: str, config_keys: list[str]) -> str:
    if key not in config_keys:  # a prefix (+, ~), a new key, a list index: as typed
        return key
    parts = key.split(".")
    for n in range(1, len(parts)):
        ending = ".".join(parts[-n:])
        if sum(k == ending or k.endswith("." + ending) for k in config_keys) == 1:
            return ending
    return key


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
    from omegaconf import OmegaConf

    target = str(OmegaConf.select(_root_, "model._target_", default=None) or "")
    module, _, name = target.rpartition(".")
    try:
        task = getattr(import_module(module), name) if module else None
    except Exception:  # config validation reports a target that cannot be imported, in one line
        task = None
    mode = str(getattr(task, "monitor_mode", "min"))
    if attribute in ("mode", "direction"):  # direction: as Optuna says it
        return mode if attribute == "mode" else f"{mode[:3]}imize"
    monitor = str(getattr(task, "monitor", "val/loss"))
    return monitor.rsplit("/", 1)[-1] if attribute == "short" else monitor


def _class_count(path: str, classes: Any = None) -> int:
    """`${class_count:PATH,CLASSES}`: the classes of an image folder. The image-folder battery
    counts them; it is imported by name, as a `_target_` is, only when a config asks."""
    count_classes = import_module("fasttrain.data.image_folder").count_classes
    return int(count_classes(str(path), list(classes) if classes else None))


def _register_resolvers() -> None:
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver(
        "overrides_prefix", lambda *, _root_: _overrides_prefix(_root_), replace=True
    )
    OmegaConf.register_new_resolver(
        "overrides_suffix", lambda *, _root_: _overrides_suffix(_root_), replace=True
    )
    OmegaConf.register_new_resolver("launch_dir", _launch_dir, replace=True)
    OmegaConf.register_new_resolver("root_dir", _root_dir, replace=True)
    OmegaConf.register_new_resolver(
        "monitor",
        lambda attribute="", name=None, *, _root_: _task_monitor(attribute, _root_, name),
        replace=True,
    )
    OmegaConf.register_new_resolver("class_count", _class_count, replace=True)


_register_resolvers()
