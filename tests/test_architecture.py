"""The package's folders are its architecture: a bounded top level, layers that import only
downwards (no cycle, nets independent of data), one entry skeleton with the same bad-input
behaviour everywhere, a map (docs/layout.md) that matches the tree, and loud failures where a
private internal of Lightning is used."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, doc, run_cli

PACKAGE = REPO / "src" / "fasttrain"
# a new project's own files (copier.yml renders them), not modules of the library
SCAFFOLD = PACKAGE / "tools" / "scaffold"
# `python -m fasttrain.<name>` keeps working through these (public commands); each is thin.
THIN = {"train.py", "evaluate.py", "export.py", "predict.py", "doctor.py", "prepare.py"}
# Top to bottom; a module imports only from its own entry or from entries further down.
LAYERS = [
    {"testing"},  # the generic tests, a pytest plugin: they run every entry point
    {"train", "evaluate", "export", "predict", "doctor", "prepare"},
    {"cli"},
    {"tasks"},
    {"assemble", "fit"},
    {"checkpoints", "tools", "deploy"},
    {"callbacks", "data", "models"},
    {"config"},
    {"distributed"},
]


def modules() -> dict[str, Path]:
    """ "fasttrain.config.schema" -> its file, for every module of the package."""
    found = {}
    for file in PACKAGE.rglob("*.py"):
        if SCAFFOLD in file.parents:
            continue
        parts = file.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = file
    return found


def imports_of(file: Path, known: set[str]) -> set[str]:
    """fasttrain modules `file` imports anywhere (top level or inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fasttrain")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fasttrain"):
            for alias in node.names:  # `from fasttrain import fit` imports the module fit
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else str(node.module))
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(file, set(mods)) - {name} for name, file in mods.items()}


def entry_of(module: str) -> str:
    """fasttrain.config.schema -> "config"; the package root -> ""."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_top_level_has_at_most_13_entries_besides_thin_commands() -> None:
    entries = [p for p in PACKAGE.iterdir() if p.name not in {"__init__.py", "__pycache__"}]
    counted = sorted(p.name for p in entries if p.name not in THIN)
    assert len(counted) <= 13, counted
    for name in THIN:
        lines = (PACKAGE / name).read_text().strip().splitlines()
        assert len(lines) <= 10, f"{name} is not thin: {len(lines)} lines"


def test_no_import_cycle() -> None:
    edges = graph()
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])


def test_layers_import_only_downwards() -> None:
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    wrong = []
    for module, targets in graph().items():
        here = entry_of(module)
        for target in targets:
            there = entry_of(target)
            if not here or not there or there == here:
                continue  # the package root (CONFIG_DIR) and a folder's own modules
            if rank[there] <= rank[here]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, wrong


def test_models_and_data_never_import_each_other() -> None:
    crossing = [
        f"{m} -> {t}"
        for m, targets in graph().items()
        for t in targets
        if {entry_of(m), entry_of(t)} == {"models", "data"}
    ]
    assert not crossing, crossing


def test_every_top_level_entry_has_a_layer() -> None:
    named = set().union(*LAYERS)
    entries = {p.stem for p in PACKAGE.iterdir() if p.name not in {"__init__.py", "__pycache__"}}
    assert entries == named


@pytest.mark.parametrize(
    ("command", "typo", "meant"),
    [
        (["train.py"], "seedd=1", "seed"),
        # tens of seconds each on 2 cores: CI runs them in make test-slow
        pytest.param(
            ["-m", "fasttrain.evaluate", "ckpt_path=x.ckpt"],
            "sede=1",
            "seed",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["-m", "fasttrain.export", "ckpt_path=x.ckpt"],
            "formt=onnx",
            "format",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["-m", "fasttrain.predict", "ckpt_path=x.ckpt"],
            "inptu=x.npy",
            "input",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_entry_points_share_bad_input_behaviour(
    command: list[str], typo: str, meant: str, tmp_path: Path
) -> None:
    proc = run_cli([*command, typo], tmp_path / "logs")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert f"did you mean {meant}" in lines[0]
    assert not (tmp_path / "logs").exists()  # no run folder


def test_entry_points_share_one_skeleton() -> None:
    for name in THIN - {"doctor.py"}:
        text = (PACKAGE / name).read_text()
        assert "cli import entry" in text and "tasks." in text and "hydra" not in text, name


def layout_lines() -> list[list[str]]:
    block = re.search(r"```\n(.*?)```", doc("layout"), re.S)
    assert block, "docs/layout.md has no code block"
    return [line.split() for line in block.group(1).splitlines() if line.strip()]


def test_the_layout_page_names_existing_paths_and_every_module() -> None:
    named: set[Path] = set()
    for words in layout_lines():
        head = REPO / words[0]
        assert head.exists(), f"docs/layout.md names {words[0]}, which does not exist"
        named.add(head)
        if head.is_dir():  # `folder/  a.py b.py  what they are`: the files listed must exist
            for word in words[1:]:
                if word.endswith((".py", ".yaml")):
                    assert (head / word).exists(), f"docs/layout.md: {words[0]}{word} is missing"
                    named.add(head / word)
    modules_ = [p for p in modules().values() if p.name != "__init__.py"]
    # A user's own net, data set or task goes into one of these folders with no docs edit.
    unnamed = [str(p.relative_to(REPO)) for p in modules_
               if p not in named and p.parent not in USER_FOLDERS]  # fmt: skip
    assert not unnamed, f"docs/layout.md does not name: {unnamed}"
    assert named >= USER_FOLDERS, "docs/layout.md does not name every folder user code goes into"


# Where a user adds a net, a data set or a task (docs/your-code.md): new files only.
USER_FOLDERS = {PACKAGE / "models", PACKAGE / "models" / "nets", PACKAGE / "data"}


def test_nothing_refers_to_files_outside_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    pattern = re.compile(r"\.\./shared|shared/(DESIGN|PRACTICES|REDESIGN)\.md")
    texts = [f for f in tracked if f.endswith((".py", ".md", ".yaml", ".toml", ".ipynb", ".sh"))]
    hits = [f for f in texts if (REPO / f).is_file() and pattern.search((REPO / f).read_text())]
    assert not hits, hits


def test_private_lightning_internals_still_exist() -> None:
    """Each private attribute fasttrain relies on (a comment names the missing public API at each
    use): if Lightning renames one, this fails instead of a feature quietly degrading."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert hasattr(trainer.fit_loop, "_combined_loader")  # fit.oom._reset_loaders
    assert hasattr(trainer.fit_loop.epoch_loop.val_loop, "_combined_loader")
    assert hasattr(ModelCheckpoint(), "_last_global_step_saved")  # checkpoints.resume
    epochs_only = ModelCheckpoint()  # assemble.skip_unused_step_hooks
    assert epochs_only._every_n_train_steps == 0 and epochs_only._train_time_interval is None
    assert ModelCheckpoint(every_n_train_steps=5)._every_n_train_steps == 5
    assert callable(getattr(L.LightningModule, "_apply_batch_transfer_handler", None))  # dp
    epoch_loop = trainer.fit_loop.epoch_loop
    assert hasattr(epoch_loop, "_on_before_fetch") and hasattr(
        epoch_loop, "_on_after_fetch"
    )  # perf
    from torch.utils.data import DataLoader

    assert isinstance(DataLoader.__dict__.get("_index_sampler"), property)  # data.resumable
    assert isinstance(epoch_loop.batch_progress.current.ready, int)  # data.augment


def test_building_a_run_imports_no_scikit_learn() -> None:
    # ~0.4 s (and pandas): only the data sets that split with it import it, when they split
    code = "import sys, fasttrain.assemble, fasttrain.data; print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_help_and_import_stay_free_of_torch() -> None:
    code = "import sys, fasttrain.cli, fasttrain.tasks; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# The modules a run loads, listed at its exit: the batteries a config does not name stay out.
LOADED = """
import atexit, json, runpy, sys
def said():
    names = sorted(m for m in sys.modules if m == "fasttrain" or m.startswith("fasttrain."))
    lines = sum(len(open(sys.modules[m].__file__).readlines()) for m in names
                if getattr(sys.modules[m], "__file__", None))
    print("LOADED " + json.dumps({"modules": names, "lines": lines}))
atexit.register(said)
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""
# never in a run that does not name them (or, for the error path and --help, that works)
BATTERIES = {
    "tasks.tuner",
    "fit.oom",
    "models.language_model",
    "models.regressor",
    "models.schedules",
    "models.nets.gpt",
    "models.nets.gpt_blocks",
    "models.nets.resnet",
    "models.nets.mlp",
    "distributed.dp",
    "config.explain",
    "cli.help",
    "data.text",
    "data.corpus",
    "data.tokenizer",
    "data.cifar10",
    "data.images",
    "data.image_folder",
    "data.shards",
    "callbacks.mlflow_run",
    "callbacks.wandb_run",
    "deploy",
}  # fmt: skip  (deploy: all of it)
# today's counts, as a ratchet (issue target: <= 35 modules, <= 6,000 lines); the other tasks
# (fasttrain.tasks.checkpoint, prepare_data), the resume checks (checkpoints.fits) and the
# tuner load on demand
MOST_MODULES, MOST_LINES = 48, 7421


def loaded(tmp_path: Path, *overrides: str) -> tuple[set[str], int]:
    proc = subprocess.run(
        [sys.executable, "-c", LOADED, "debug=fast_dev_run", f"paths.log_dir={tmp_path}",
         "logger=none", *overrides],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("LOADED ")]
    found = __import__("json").loads(line.removeprefix("LOADED "))
    return {m.removeprefix("fasttrain.") for m in found["modules"]}, found["lines"]


def batteries_in(names: set[str]) -> list[str]:
    return sorted(n for n in names if n in BATTERIES or n.split(".")[0] in BATTERIES)


def test_a_run_loads_the_core_and_the_batteries_its_config_names(tmp_path: Path) -> None:
    default, lines = loaded(tmp_path)
    assert not batteries_in(default), batteries_in(default)
    assert len(default) <= MOST_MODULES and lines <= MOST_LINES, (len(default), lines)
    gpt, _ = loaded(tmp_path, "model=gpt", "data=text")
    assert {"models.language_model", "models.nets.gpt", "data.text"} <= gpt
    assert not gpt & {"models.classifier", "models.nets.cnn", "data.digits", "distributed.dp"}
    # the language model's battery and its data set's, nothing else
    added = gpt - default
    assert all(n.startswith(("models.", "data.")) for n in added), sorted(added)


TRIP = """
import atexit, json, runpy, sys
from omegaconf import DictConfig
calls, task = [], []  # (module, in the task); the frame of tasks.train while it runs
def whole(v):
    return isinstance(v, DictConfig) and v._get_parent() is None and "model" in v
def follow(frame, event, arg):
    name = frame.f_globals.get("__name__", "")
    if event == "return" and task and frame is task[0]:
        task.clear()
    if event != "call" or not name.startswith("fasttrain"):
        return
    if name == "fasttrain.tasks" and frame.f_code.co_name == "train":
        task.append(frame)
    if any(whole(v) for v in list(frame.f_locals.values())):
        calls.append((name, bool(task)))
atexit.register(lambda: print("TRIP " + json.dumps(calls)))
sys.setprofile(follow)
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def test_after_the_check_the_run_goes_one_way(tmp_path: Path) -> None:
    """The whole config, followed from the check's build on: each module it reaches, once, in
    the order check -> build -> claim -> task (fasttrain.cli, the skeleton, calls each step);
    inside the task it reaches nothing else (each step is handed objects or values). OmegaConf
    calling the config's own resolvers while it resolves does not count."""
    proc = subprocess.run(
        [sys.executable, "-c", TRIP, "debug=fast_dev_run", f"paths.log_dir={tmp_path}",
         "logger=tensorboard"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("TRIP ")]
    calls = [(m, inside) for m, inside in __import__("json").loads(line[5:])
             if m != "fasttrain.config.resolvers"]  # fmt: skip
    names = [m for m, _ in calls]
    after = names[names.index("fasttrain.cli.build") :]
    stays = [m for i, m in enumerate(after) if i == 0 or after[i - 1] != m]
    steps = [m for m in stays if m != "fasttrain.cli"]
    assert len(steps) == len(set(steps)), stays  # no module reached twice
    assert steps.index("fasttrain.assemble") < steps.index("fasttrain.tasks"), stays
    assert {m for m, inside in calls if inside} == {"fasttrain.tasks"}, stays


OWN_TASK = """
import sys
from fasttrain.cli import entry_points

def own(cfg):  # a project's own training task: the config only, as before `built` existed
    from fasttrain.assemble import build_run

    trainer, model, datamodule = build_run(cfg)
    print("OWN", type(model).__name__, type(datamodule).__name__)
    return {}

_, run = entry_points("train", own)
run()
"""


def test_a_training_task_that_takes_only_the_config_still_runs(tmp_path: Path) -> None:
    """Only a task with a `built` parameter (tasks.train) is handed the run the check built; a
    project's own task of one argument gets the config alone and builds its run itself."""
    from fasttrain.cli import takes_built
    from fasttrain.tasks import evaluate, train

    assert takes_built(train) and not takes_built(evaluate) and not takes_built(max)
    proc = subprocess.run(
        [sys.executable, "-c", OWN_TASK, "debug=fast_dev_run", f"paths.log_dir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OWN Classifier DigitsDataModule" in proc.stdout, proc.stdout[-2000:]
