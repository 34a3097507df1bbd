"""What export and predict need of a model, as small Protocols a plain LightningModule may offer.

Any LightningModule trains, resumes, tests and evaluates (its checkpoints record the config that
built it, fasttrain.checkpoints.load). Export and predict need a little more, and refuse in one
line naming the missing method otherwise:

    Exportable   score() and agreement(): each exported file's outputs are checked against the
                 eager module's on the test split (fasttrain.deploy.verify)
    Predictable  score(), prediction_header() and prediction_rows(): the columns of
                 predictions.csv (fasttrain.deploy.predict)

fasttrain's Task writes deviation() for both, and a task its `output_layer()` and
`export_module()` where it has them. Without export_module() a file holds the module's `net`
(self.net, as lightning-hydra-template's modules keep it) behind the data module's
preprocessing, so it takes raw inputs.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torchmetrics import Metric


class Exportable(Protocol):
    """What export checks each file with."""

    def score(self) -> tuple[str, Metric]:
        """(name, metric) of the held-out score formats are compared by; higher is better."""
        ...

    def agreement(self, outputs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """Per sample [B] bool: the two outputs give the same answer (e.g. the same class)."""
        ...


class Predictable(Protocol):
    """What predict writes predictions.csv with."""

    def score(self) -> tuple[str, Metric]: ...

    def prediction_header(self, datamodule: Any) -> list[str]:
        """The column names of predictions.csv, after the index (and before the label)."""
        ...

    def prediction_rows(self, outputs: torch.Tensor, datamodule: Any) -> list[list[Any]]:
        """One row per sample of `outputs` under `prediction_header`."""
        ...


def relative_deviation(outputs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Elementwise difference that export's max|diff| tolerance is in: absolute where the
    reference is within [-1, 1] (logits), relative beyond (float32 keeps ~7 digits, so an
    output of 150 in its own units cannot match to 1e-4 absolute). A module's own
    `deviation(outputs, reference)` replaces it."""
    return (outputs - reference).abs() / reference.abs().clamp(min=1)


def missing_methods(model: Any, protocol: type) -> list[str]:
    """The methods of `protocol` that `model` lacks (or leaves as Task's unwritten stub)."""
    names = [n for n in vars(protocol) if not n.startswith("_") and callable(vars(protocol)[n])]
    return [n for n in names if not _written(type(model), n)]


def _written(cls: type, name: str) -> bool:
    """Whether cls has a method `name` that does more than raise NotImplementedError (the stubs
    of Task's contract do only that)."""
    owner = next((c for c in cls.__mro__ if name in vars(c)), None)
    method = vars(owner)[name] if owner is not None else None
    code = getattr(method, "__code__", None)
    return callable(method) and (code is None or code.co_names != ("NotImplementedError",))


def require(model: Any, protocol: type, entry: str, ckpt_path: Any) -> None:
    """Refuse, in one line naming each missing method, a model `entry` cannot serve."""
    missing = missing_methods(model, protocol)
    if missing:
        from fasttrain.config.errors import UserError

        names = ", ".join(f"{n}()" for n in missing)
        raise UserError(
            f"ckpt_path={ckpt_path}: {entry} needs {names} of its module "
            f"{type(model).__name__}, which does not define them (fasttrain.{protocol.__name__}: "
            "docs/your-code.md)"
        )


def optional(model: Any, method: str) -> Any:
    """What an optional method of a task returns (output_layer, export_module), None without it."""
    own = getattr(model, method, None)
    return own() if callable(own) else None


def deploy_module(model: Any, ckpt_path: Any) -> torch.nn.Module:
    """The module an export file holds (and predict input= runs), behind the data's
    preprocessing: the model's `net`, as a Task's and lightning-hydra-template's modules keep it
    (a LightningModule itself is not traced: its trainer-bound properties raise)."""
    net = getattr(model, "net", None)
    if isinstance(net, torch.nn.Module):
        return net
    from fasttrain.config.errors import UserError

    raise UserError(
        f"ckpt_path={ckpt_path}: export needs the module's net (self.net, the nn.Module its "
        f"forward runs) or its own export_module(); {type(model).__name__} has neither "
        "(docs/your-code.md)"
    )


def takes_hidden_matrices(factory: Any) -> bool:
    """Whether an optimizer factory (a partial) builds an optimizer that wants the hidden
    matrices' param groups marked (its class says so: Muon's `takes_hidden_matrices`), read
    without importing Muon's battery (fasttrain.models.muon)."""
    return bool(getattr(getattr(factory, "func", factory), "takes_hidden_matrices", False))
