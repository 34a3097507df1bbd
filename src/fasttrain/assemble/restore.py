"""`restore(cfg)`: the (model, datamodule) of a checkpoint, for the entry points that start from
one (evaluate, export, predict). The task is the one the checkpoint was trained as, the data
module the one it was trained on, with the checkpoint's split and this machine's locations."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from fasttrain import assemble
from fasttrain.config.errors import UserError
from fasttrain.config.schema import validate
from fasttrain.models.spec import plain


def restore(cfg: DictConfig) -> tuple[Any, Any]:
    """(task in eval mode, set-up data module) for `cfg.ckpt_path`: the entry points that start
    from a checkpoint (evaluate, export, predict) share it. The task is the one the checkpoint
    was trained as (fasttrain.models.task). The data module must be the one the checkpoint was
    trained on (checkpoints record it; older ones did not, and then only the shapes are
    compared). The data split comes from the checkpoint (seed, fractions, tokenizer, ...), so
    the test set is the one the run was tested on; loader knobs and every location (path,
    cache_dir, ...: fasttrain.data.base.is_location) stay this machine's, from the command line
    and conf/, and a location other than the checkpoint's is said in one line."""
    from fasttrain.checkpoints.load import load_task
    from fasttrain.data.base import LOADER_ARGS, SPLIT_RECORD, is_location, split_change

    if "model" in cfg:  # +model=... or +model.net.x=...: composed, but never used here
        raise UserError(
            f"model: {cfg.get('task_name', 'this entry')} rebuilds the model the checkpoint "
            f"holds (ckpt_path={cfg.ckpt_path}: its net, recipe and task), and takes no model "
            "settings; drop the +model... overrides (another model: train it with train.py)"
        )
    model, data_spec = load_task(cfg.ckpt_path)
    trained_on = data_spec.pop("_target_", None)
    if trained_on is not None:
        _select_data(cfg, trained_on)
    given = _given_data_keys()
    with open_dict(cfg.data):
        for key, value in data_spec.items():
            if key not in cfg.data or key in LOADER_ARGS:
                continue
            if key in given:  # typed on the command line: used, and said so where it differs
                if plain(cfg.data[key]) != plain(value):
                    logging.getLogger(__name__).warning(
                        f"data.{key}={cfg.data[key]}: used instead of the checkpoint's "
                        f"data.{key}={value}"
                    )
                continue
            if is_location(key):  # this machine's, from conf/: never the checkpoint's
                if "cache" not in key:
                    _note_other_location(cfg, key, value)
                continue
            cfg.data[key] = value
    validate(cfg)
    datamodule = assemble.build(cfg.data, "data")
    change = split_change(data_spec.get(SPLIT_RECORD), getattr(datamodule, "hparams", {}).get(
        SPLIT_RECORD))  # fmt: skip
    if change:  # evaluate and predict then run on other files than the run was tested on
        logging.getLogger(__name__).warning(f"ckpt_path={cfg.ckpt_path}: {change}")
    net_spec = getattr(model, "hparams", {}).get("net")  # a Task's (a plain module's: any)
    net_shape = net_spec.get("input_shape") if isinstance(net_spec, dict) else None
    data_shape = getattr(datamodule, "input_shape", None)
    if net_shape is not None and data_shape is not None and list(net_shape) != list(data_shape):
        raise UserError(
            f"ckpt_path={cfg.ckpt_path}: its net takes inputs {list(net_shape)} but "
            f"data ({cfg.data._target_}) gives {list(data_shape)}; select the data group the "
            "checkpoint was trained on (data=...)"
        )
    mismatch = getattr(model, "data_mismatch", lambda _: None)(datamodule)  # Task's data-fit
    if mismatch:
        raise UserError(f"ckpt_path={cfg.ckpt_path}: {mismatch}; select the data group the "
                        "checkpoint was trained on (data=...)")  # fmt: skip
    # what the checkpoint recorded for it (a language model's tokenizer)
    getattr(model, "configure_data", lambda _: None)(datamodule)
    datamodule.prepare_data()
    datamodule.setup("test")
    return model, datamodule


def _note_other_location(cfg: DictConfig, key: str, trained: Any) -> None:
    """One line where this run reads other files than the checkpoint was trained on."""
    here = plain(cfg.data.get(key))
    if trained is not None and here != plain(trained):
        logging.getLogger(__name__).warning(
            f"ckpt_path={cfg.ckpt_path}: trained with data.{key}={trained}; this run uses "
            f"data.{key}={here} (locations never come from a checkpoint: give data.{key}= to "
            "use others)"
        )


def _select_data(cfg: DictConfig, trained_on: str) -> None:
    """The checkpoint's data group in `cfg.data`: kept when data= selects it, taken from conf/
    when no data= was given (`python -m fasttrain.evaluate ckpt_path=X` works for any data set),
    refused in one line naming the group when data= selects another data module. `trained_on`
    passed fasttrain.checkpoints.allow, so resolving it is safe."""
    from hydra.utils import get_object

    from fasttrain.checkpoints.allow import conf_targets

    selected = str(cfg.data._target_)
    trained = get_object(trained_on)
    if _resolves_to(selected, trained):
        return
    groups = sorted(
        Path(file).stem
        for target, files in conf_targets().items()
        for file in files
        if file.startswith("data/") and _resolves_to(target, trained)
    )
    if groups and not _given_on_command_line("data"):
        typed = {key: cfg.data[key] for key in _given_data_keys() if key in cfg.data}
        with open_dict(cfg):
            cfg.data = _data_group(groups[0])
        with open_dict(cfg.data):
            cfg.data.update(typed)  # data.num_workers=0 and the like, as typed
        return
    how = (
        f"select its data group: {' or '.join(f'data={g}' for g in groups)} (its split "
        "settings come from the checkpoint, its paths from this command line and conf/)"
        if groups
        else "add a config for it in conf/data/ and select it (data=...)"
    )
    raise UserError(
        f"ckpt_path={cfg.ckpt_path}: trained on {trained_on} data, but data= selects "
        f"{selected}; {how}"
    )


def _data_group(option: str) -> DictConfig:
    """conf/data/<option>.yaml as composed (with its shared parts); its interpolations resolve
    against the config it is put into."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from fasttrain.config.project import CONFIG_DIR

    overrides = [f"data={option}"]
    if GlobalHydra.instance().is_initialized():  # inside an entry point: Hydra's own search path
        return compose("train", overrides=overrides).data
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("train", overrides=overrides).data


def _command_line_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _given_on_command_line(key: str) -> bool:
    return any(o.lstrip("+~").split("=", 1)[0] == key for o in _command_line_overrides())


def _given_data_keys() -> set[str]:
    """The data.<key> values typed on the command line (none where no command line ran)."""
    keys = (o.lstrip("+~").split("=", 1)[0] for o in _command_line_overrides())
    return {k.split(".")[1] for k in keys if k.startswith("data.") and k.count(".") >= 1}


def _resolves_to(target: str, obj: Any) -> bool:
    from hydra.utils import get_object

    try:
        return get_object(target) is obj
    except Exception:  # a broken config file elsewhere is not this check's business
        return False
