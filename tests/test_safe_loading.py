"""A checkpoint never runs code of its choosing. One carrying pickled code is refused with a
clear message, for evaluate (ckpt_path=) and for resuming a training run (resume=); one whose
specs name code outside fasttrain.checkpoints.allow is refused before anything is built
(evaluate, export, predict), and resuming never builds the checkpoint's specs at all."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

# What the refusal must say: that it refused, that code was found, and why it did not run.
MESSAGE_PARTS = ("refused", "pickled object", "weights_only")


class Payload:
    """Unpickling this runs a shell command: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def evil_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    """A checkpoint that looks like a Lightning one, with a payload among its hyperparameters."""
    marker = tmp_path / "payload_ran"
    ckpt = tmp_path / "evil.ckpt"
    torch.save(
        {"state_dict": {}, "hyper_parameters": {"net": Payload(marker)}, "global_step": 3}, ckpt
    )
    return ckpt, marker


def test_the_payload_is_real(evil_checkpoint: tuple[Path, Path]) -> None:
    # Control: unpickling without weights_only does run it, so the refusals below mean something.
    ckpt, marker = evil_checkpoint
    torch.load(ckpt, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize(
    ("entry", "override"), [("evaluate", "ckpt_path"), ("train", "resume")], ids=["eval", "resume"]
)
def test_pickled_code_is_refused_and_never_runs(
    entry: str, override: str, evil_checkpoint, tmp_path: Path, monkeypatch, capsys
) -> None:
    import importlib

    ckpt, marker = evil_checkpoint
    main = importlib.import_module(f"fasttrain.{entry}").main
    argv = [f"{override}={ckpt}", f"paths.log_dir={tmp_path / 'logs'}", "data.num_workers=0"]
    monkeypatch.setattr(sys, "argv", [entry, *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert err[-1].startswith(f"error: {override}={ckpt}: "), err[-1]
    assert all(part in err[-1] for part in MESSAGE_PARTS), err[-1]
    assert not marker.exists(), "the checkpoint's code ran"
    assert not list((tmp_path / "logs").rglob("*.yaml")), "a run folder was left behind"


# --- A checkpoint never chooses what code runs -------------------------------------------------
# weights_only=True keeps pickled code out, but a checkpoint's specs name code by `_target_`:
# building them would call it. Each payload below writes MARKER when built (the control test
# proves it); evaluate, export and predict must refuse it in one line before building anything.

NET = {"_target_": "fasttrain.models.nets.mlp.MLP", "input_shape": [1, 8, 8], "num_classes": 10}
ADAMW = {"_target_": "torch.optim.adamw.AdamW", "_partial_": True, "lr": 0.003}
REFUSAL = (
    "which is not a net or task of this project, a torch optimizer or scheduler, a data module of "
    "this project, or a target in conf/"
)


def payloads(marker: Path) -> dict[str, tuple[str, str, dict]]:
    """case -> (hyper_parameters key, the target the refusal names, the spec there)."""
    savetxt = {"_target_": "numpy.savetxt", "fname": str(marker), "X": [],
               "header": "echo attacker", "comments": ""}  # fmt: skip
    return {
        "numpy.savetxt": ("net", "numpy.savetxt", savetxt),
        "torch.save": (
            "net",
            "torch.save",
            {"_target_": "torch.save", "obj": [], "f": str(marker)},
        ),
        "Path.touch": (
            "net",
            "pathlib.Path.touch",
            {"_target_": "pathlib.Path.touch", "_args_": [str(marker)]},
        ),
        # Hydra builds nested targets first, even inside a _partial_ factory
        "nested in optimizer": ("optimizer", "numpy.savetxt", {**ADAMW, "foreach": savetxt}),
        # a dotted path that starts like the nets package but ends at torch.save
        "via nets module": (
            "net",
            "fasttrain.models.nets.mlp.torch.save",
            {"_target_": "fasttrain.models.nets.mlp.torch.save", "obj": [], "f": str(marker)},
        ),
    }


CASES = list(payloads(Path("x")))


def crafted_checkpoint(tmp_path: Path, case: str) -> tuple[Path, Path, str]:
    """(checkpoint, the file its payload writes, the target the refusal must name). The other
    specs are valid, so building the checkpoint without the gate reaches the payload."""
    marker = tmp_path / "payload_ran"
    key, target, spec = payloads(marker)[case]
    hparams = {"net": NET, "optimizer": ADAMW, "scheduler": None, "num_classes": 10}
    hparams[key] = spec
    ckpt = tmp_path / f"{case.replace(' ', '_')}.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": hparams}, ckpt)
    return ckpt, marker, target


@pytest.mark.parametrize("case", CASES)
def test_the_spec_payloads_are_real(case: str, tmp_path: Path) -> None:
    # Control: building the spec as the old loader did runs the payload.
    from hydra.utils import instantiate

    marker = tmp_path / "payload_ran"
    _, _, spec = payloads(marker)[case]
    with contextlib.suppress(Exception):  # most fail after their side effect, as in the old loader
        instantiate(spec)
    assert marker.exists()


@pytest.mark.parametrize("entry", ["evaluate", "export", "predict"])
@pytest.mark.parametrize("case", CASES)
def test_a_spec_naming_other_code_is_refused_and_never_built(
    entry: str, case: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    import importlib

    ckpt, marker, target = crafted_checkpoint(tmp_path, case)
    key = payloads(marker)[case][0]
    main = importlib.import_module(f"fasttrain.{entry}").main
    argv = [f"ckpt_path={ckpt}", f"paths.log_dir={tmp_path / 'logs'}", "data.num_workers=0"]
    argv += [] if entry == "evaluate" else ["device=cpu"]  # evaluate's device is the trainer's
    monkeypatch.setattr(sys, "argv", [entry, *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert err[-1] == f"error: ckpt_path={ckpt}: refused, its {key} names {target}, {REFUSAL}"
    assert not any("Traceback" in line for line in err)
    assert not marker.exists(), "the checkpoint's payload ran"
    assert not list((tmp_path / "logs").rglob("*.yaml")), "a run folder was left behind"


@pytest.mark.parametrize(
    "entry",
    # the in-process test above runs the same code for all three; one start-up is enough here
    ["evaluate", pytest.param("export", marks=pytest.mark.slow),
     pytest.param("predict", marks=pytest.mark.slow)],
)  # fmt: skip
def test_the_refusal_on_the_command_line(entry: str, tmp_path: Path) -> None:
    from conftest import run_cli

    ckpt, marker, _ = crafted_checkpoint(tmp_path, "numpy.savetxt")
    proc = run_cli(["-m", f"fasttrain.{entry}", f"ckpt_path={ckpt}"], tmp_path / "logs")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert lines[-1].startswith(f"error: ckpt_path={ckpt}: refused, its net names numpy.savetxt")
    assert not any("Traceback" in line for line in lines)
    assert not marker.exists()
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").rglob("*.yaml"))


def test_a_name_is_checked_before_anything_is_imported(tmp_path: Path, monkeypatch) -> None:
    """A target outside the allowed prefixes and conf/ is refused from its name alone: the
    module it names is never imported (importing can run code too)."""
    from fasttrain.checkpoints.allow import is_allowed

    marker = tmp_path / "imported"
    (tmp_path / "sneaky_nets.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nimport torch\nclass Net(torch.nn.Module): pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not is_allowed("sneaky_nets.Net")
    assert not marker.exists()
    assert "sneaky_nets" not in sys.modules


@pytest.mark.parametrize(
    ("target", "allowed"),
    [
        ("fasttrain.models.nets.MLP", True),  # named in conf/model/net/mlp.yaml
        ("fasttrain.models.nets.cnn.SmallCNN", True),  # a net of the nets package
        ("torch.optim.sgd.SGD", True),
        ("torch.optim.lr_scheduler.OneCycleLR", True),
        ("fasttrain.data.npy.NpyDataModule", True),
        ("fasttrain.models.nets.cnn.nn.Linear", False),  # a Module, but defined by torch
        ("fasttrain.models.nets.init.init_weights", False),  # in the package, not a Module
        ("torch.optim.lr_scheduler.os.system", False),
        ("torch.optim.sgd.SGD.step", False),
        ("fasttrain.data.base.torch.save", False),
        ("os.system", False),
        ("fasttrain.models.nets.nothing_here", False),
    ],
)
def test_what_the_gate_allows(target: str, allowed: bool) -> None:
    from fasttrain.checkpoints.allow import is_allowed

    assert is_allowed(target) is allowed


def test_whatever_the_users_conf_names_is_allowed(tmp_path: Path, monkeypatch) -> None:
    from fasttrain.checkpoints.allow import check_specs, conf_targets
    from fasttrain.config.errors import UserError

    package = tmp_path / "src" / "my_project"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text("import torch\nclass MyNet(torch.nn.Module): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    conf = tmp_path / "conf"
    (conf / "model" / "net").mkdir(parents=True)
    spec = {"net": {"_target_": "my_project.nets.MyNet", "width": 8}}
    with pytest.raises(UserError, match=r"its net names my_project\.nets\.MyNet"):
        check_specs(spec, "ckpt_path=x", config_dir=str(conf))
    (conf / "model" / "net" / "my_net.yaml").write_text("_target_: my_project.nets.MyNet\n")
    conf_targets.cache_clear()
    check_specs(spec, "ckpt_path=x", config_dir=str(conf))  # no error: conf/ names it


def test_interpolations_in_a_spec_are_refused(tmp_path: Path) -> None:
    # Building resolves ${...}: a checkpoint could read environment variables into a net's args.
    from fasttrain.checkpoints.allow import check_specs
    from fasttrain.config.errors import UserError

    spec = {"data": {"path": "${oc.env:HOME}"}}
    with pytest.raises(UserError, match=r"its data holds an interpolation \('\$\{oc.env:HOME\}'"):
        check_specs(spec, "ckpt_path=x")


def test_a_data_target_outside_the_allowlist_is_refused(tmp_path: Path) -> None:
    from fasttrain.checkpoints.load import load_task
    from fasttrain.config.errors import UserError

    ckpt = tmp_path / "data.ckpt"
    torch.save({"state_dict": {}, "datamodule_target": "subprocess.Popen",
                "hyper_parameters": {"net": NET, "optimizer": ADAMW, "num_classes": 10}},
               ckpt)  # fmt: skip
    with pytest.raises(UserError, match=r"its data names subprocess\.Popen,"):
        load_task(ckpt)


class OutsideNet(torch.nn.Module):
    """A plain net kept outside fasttrain.models.nets, not named in conf/."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.hparams = {"width": width}
        self.layer = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.flatten(1))


def test_a_caller_can_allow_its_own_net_explicitly(tmp_path: Path) -> None:
    from fasttrain.checkpoints.load import load_task
    from fasttrain.config.errors import UserError
    from fasttrain.models import Classifier

    model = Classifier(net=OutsideNet(), optimizer=None, num_classes=10)
    ckpt = tmp_path / "outside.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, ckpt)
    name = f"{OutsideNet.__module__}.OutsideNet"
    with pytest.raises(UserError, match=f"its net names {name}"):
        load_task(ckpt)
    rebuilt, _ = load_task(ckpt, allow=[name])
    x = torch.randn(3, 1, 8, 8)
    assert torch.equal(rebuilt(x), model.eval()(x))


def test_resume_never_builds_a_spec_of_the_checkpoint(mlp_ckpt: Path, tmp_path: Path) -> None:
    """Resuming takes weights and states from the checkpoint and builds the model from this
    run's config: a payload among the checkpoint's specs is never built."""
    from hydra import compose, initialize_config_dir

    from conftest import CONF
    from fasttrain.tasks import train

    marker = tmp_path / "payload_ran"
    ckpt = torch.load(mlp_ckpt, weights_only=True)
    ckpt["hyper_parameters"]["net"] = payloads(marker)["numpy.savetxt"][2]
    ckpt["hyper_parameters"]["optimizer"] = payloads(marker)["nested in optimizer"][2]
    crafted = tmp_path / "resume.ckpt"
    torch.save(ckpt, crafted)
    overrides = ["model=mlp", "data.num_workers=0", "logger=none", "callbacks=none",
                 "trainer.max_epochs=4", "trainer.limit_train_batches=2",
                 "trainer.limit_val_batches=1", "test=false", f"resume={crafted}",
                 f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path}/run"]  # fmt: skip
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        train(compose("train", overrides=overrides))
    assert not marker.exists()


def _savetxt(marker: Path) -> dict[str, Any]:
    return {"_target_": "numpy.savetxt", "fname": str(marker), "X": [], "header": "echo attacker",
            "comments": ""}  # fmt: skip


@pytest.mark.parametrize("slot", ["task", "data"])
@pytest.mark.parametrize("record", ["model spec", "hyper_parameters"])
def test_an_argument_named_like_a_fixed_slot_is_checked_as_itself(
    slot: str, record: str, tmp_path: Path, monkeypatch
) -> None:
    """An argument named `task` or `data` once replaced the slot of that name in the check: the
    spec's own `_target_` (or the argument) then went unchecked and was built."""
    from fasttrain.checkpoints.io import MODEL_SPEC_KEY
    from fasttrain.checkpoints.load import load_task
    from fasttrain.config.errors import UserError

    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "payload_ran"
    crafted = tmp_path / "crafted.ckpt"
    if record == "model spec":
        # `task`: a plain argument hides the spec's target; `data`: the argument is the payload
        spec = ({"_target_": "numpy.savetxt", **{k: v for k, v in _savetxt(marker).items()
                                                 if k != "_target_"}, "task": 1}
                if slot == "task" else
                {"_target_": "fasttrain.models.Classifier", "net": NET, "optimizer": ADAMW,
                 "num_classes": 10, "data": _savetxt(marker)})  # fmt: skip
        record_ = {"state_dict": {}, "datamodule_hyper_parameters": {}, MODEL_SPEC_KEY: spec}
    else:
        hparams = {"net": NET, "optimizer": ADAMW, "num_classes": 10, slot: _savetxt(marker)}
        record_ = {"state_dict": {}, "task_target": "fasttrain.models.Classifier",
                   "hyper_parameters": hparams}  # fmt: skip
    torch.save(record_, crafted)
    with pytest.raises(UserError, match=r"refused, its (task|data) names numpy\.savetxt"):
        load_task(crafted)
    assert not marker.exists(), "the checkpoint's payload ran"
