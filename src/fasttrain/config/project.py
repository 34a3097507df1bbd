"""The project around a run: its conf/ folder (`CONFIG_DIR`, looked up once, when first asked)
and paths as messages show them. Importing this module registers conf/'s resolvers."""

import os
import sys
from pathlib import Path
from typing import NoReturn

from fasttrain.config import resolvers as _resolvers  # noqa: F401  conf/ interpolates them

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
    checkout = Path(__file__).resolve().parents[3]  # src/fasttrain/config/project.py
    for folder in (here, *here.parents, checkout):
        if (folder / "conf" / "train.yaml").is_file():
            return str(folder / "conf")
    _refuse(
        f"no conf/ with train.yaml in {here} or above it: run from the project's folder, "
        f"or set {CONF_ENV}=path/to/conf"
    )


def load_env_file() -> None:
    """The project's .env (beside its conf/), read into the environment once, at start-up, so
    the trackers find their keys there (.env.example names them). A variable already set wins:
    the shell, a scheduler or CI can always override the file. python-dotenv is imported only
    where there is a .env (a --help stays quick)."""
    global _ENV_LOADED
    if _ENV_LOADED:
        return
    _ENV_LOADED = True
    env = Path(sys.modules[__name__].CONFIG_DIR).parent / ".env"  # the folder holding conf/
    if env.is_file():
        from dotenv import dotenv_values

        for key, value in dotenv_values(env).items():
            if value and key not in os.environ:  # a blank entry (.env.example's) sets nothing
                os.environ[key] = value


_ENV_LOADED = False


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


def __getattr__(name: str) -> str:
    if name == "CONFIG_DIR":  # looked up once, when an entry point first needs it
        globals()["CONFIG_DIR"] = config_dir()
        return str(globals()["CONFIG_DIR"])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
