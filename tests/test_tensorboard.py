"""Short runs read back through a real TensorBoard server over its HTTP data API, as a user's
browser reads them: run names, scalars and their steps, the Custom Scalars layout, HPARAMS; and
the pages as headless Chromium renders them (where it is installed).

Where TensorBoard holds a run (fasttrain.callbacks.board): the run folder (its curves, training and
validation, under the names logged in the task's group `classifier/`, run health in `vitals/`),
`<run>/hparams` (the HPARAMS session, `verdict/`)."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from conftest import CONF, run_cli, run_dirs, wait_for

# mlp on digits: 5 optimizer steps an epoch at batch 256. Values logged every 2 steps (loss,
# lr, throughput), gradient norms every 3: their steps show the convention apart.
EVERY, GRAD_EVERY = 2, 3
BASE = ["model=mlp", "trainer.max_epochs=2", "data.num_workers=0", "data.batch_size=256",
        f"trainer.log_every_n_steps={EVERY}",
        f"callbacks.grad_monitor.every_n_steps={GRAD_EVERY}"]  # fmt: skip
RUN_A = ["seed=7", "callbacks.grad_monitor.per_layer=true"]  # per-layer norms: off by default
RUN_B = ["model.optimizer.lr=0.01", "trainer.deterministic=true"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str, body: dict | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    # TensorBoard refuses POSTs without this header (its XSRF guard).
    headers = {"X-XSRF-Protected": "1", "Content-Type": "application/json"}
    req = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def train_in_process(output_dir: Path, *overrides: str) -> None:
    from fasttrain.tasks import train

    args = [*BASE, f"paths.output_dir={output_dir}", *overrides]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        train(compose("train", overrides=args))


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two command-line runs with different overrides, and one run resumed once (1 epoch, then
    continued to 2 in the same folder)."""
    logs = tmp_path_factory.mktemp("tb") / "logs"
    for extra in (RUN_A, RUN_B):
        proc = run_cli(["train.py", *BASE, *extra], logs)
        assert proc.returncode == 0, proc.stderr[-3000:]
        PRINTED.append(proc.stdout)
    resumed = logs / "train" / "resumed"
    train_in_process(resumed, "trainer.max_epochs=1")
    # continued by a process of its own, as a user resumes: TensorBoard reads a folder's event
    # files in the order of their names (.<time>.<host>.<pid>.<n>), and two parts written by
    # one process in one second can sort out of order (n=10 before n=9), which it takes for a
    # restart and drops the first part's later steps
    proc = run_cli(["train.py", *BASE, "run_name=resumed"], logs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return logs


PRINTED: list[str] = []


@pytest.fixture(scope="module")
def server(log_dir: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fasttrain.tools.board", "--logdir", str(log_dir),
         "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        # TensorBoard answers while it is still reading the event files: wait until it serves
        # all that they hold, not only the runs' names (a half-read run shows steps [0, 3] of
        # [0, 3, 6, 9], a session its resumed start with its first end)
        curves, ends = written(log_dir)
        wait_for(lambda: serves(url, curves, ends), 120, "TensorBoard serving every event", proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def written(log_dir: Path) -> tuple[dict[str, dict[str, list[int]]], dict[str, float]]:
    """What the event files under log_dir hold: each TensorBoard run -> its scalar tags -> their
    steps, and each HPARAMS session's run -> the end time of its first session end (the one
    TensorBoard keeps)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata

    files = [(f, list(EventFileLoader(str(f)).Load())) for f in log_dir.rglob("events.out.*")]
    files.sort(key=lambda file: file[1][0].wall_time)  # the order they were written in
    curves: dict[str, dict[str, list[int]]] = {}
    ends: dict[str, float] = {}
    for file, events in files:
        run = file.parent.relative_to(log_dir).as_posix()
        scalar_tags: set[str] = set()  # a tag's metadata comes with its first value in a file
        for event in events:
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "scalars":
                    scalar_tags.add(value.tag)
                if value.tag in scalar_tags:
                    curves.setdefault(run, {}).setdefault(value.tag, []).append(event.step)
                elif value.tag == metadata.SESSION_END_INFO_TAG and run not in ends:
                    content = value.metadata.plugin_data.content
                    ends[run] = metadata.parse_session_end_info_plugin_data(content).end_time_secs
    return curves, ends


def serves(url: str, curves: dict[str, dict[str, list[int]]], ends: dict[str, float]) -> bool:
    """The server at `url` shows every curve point and every session end that was written."""
    tags = get_json(f"{url}/data/plugin/scalars/tags")
    if {run: set(t) for run, t in tags.items()} != {run: set(t) for run, t in curves.items()}:
        return False
    for run, by_tag in curves.items():
        for tag, written_steps in by_tag.items():
            if steps(url, run, tag) != sorted(written_steps):
                return False
    served = {g["sessions"][0]["name"]: g["sessions"][0] for g in session_groups(url)}
    return set(served) == set(ends) and all(
        abs(served[run].get("endTimeSecs", 0) - end) < 1e-3 for run, end in ends.items()
    )


def test_the_bare_address_opens_unsmoothed_and_the_rest_is_tensorboards(server: str) -> None:
    """`make tensorboard` (fasttrain.tools.board, this module's server): the bare address is
    sent on to TensorBoard's own link state with smoothing 0; a link with a state keeps it."""
    host, port = urllib.parse.urlparse(server).netloc.split(":")
    for path in ("/", "/?smoothing=0.3", "/data/runs"):
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read().decode()
        conn.close()
        assert response.status == 200 and body, path
        landing = re.search(r'location\.replace\("([^"]+)" \+ location\.hash\)', body)
        assert bool(landing) == (path == "/"), (path, body[:300])  # TensorBoard's own page else
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", "/")
    target = re.search(r'location\.replace\("([^"]+)"', conn.getresponse().read().decode())[1]
    conn.close()
    state = urllib.parse.parse_qs(urllib.parse.urlparse(target).query)
    assert state == {"smoothing": ["0"], "runColorGroup": ["regex:^(.+?)(?:/hparams)?$"]}
    from fasttrain.callbacks import board
    from fasttrain.tools.board import COLOUR_BY_RUN

    assert COLOUR_BY_RUN == board.COLOUR_BY_RUN  # the landing's copy of the run's own
    assert "<tb-webapp" in urllib.request.urlopen(server + target).read().decode()


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the page's script")
def test_the_landing_keeps_the_users_own_settings() -> None:
    """The landing page's script, run by Node.js over a stand-in for the browser's storage:
    TensorBoard's settings key gets the wider run list and the closed settings pane only where
    the user has not set them (their own width stays), a stored value that is not an object is
    replaced, and the page goes on to the unsmoothed link state with the fragment asked for."""
    from fasttrain.tools.board import DEFAULTS, LANDING, landing_page

    script = re.search(r"<script>(.*)</script>", landing_page().decode(), re.S)[1]
    stand_in = """
    const stored = process.argv[1] === "null" ? null : process.argv[1];
    const store = new Map(stored === null ? [] : [["_tb_global_settings", stored]]);
    globalThis.localStorage = {getItem: (k) => store.has(k) ? store.get(k) : null,
                               setItem: (k, v) => store.set(k, v)};
    globalThis.location = {hash: "#hparams", replace: (url) => { globalThis.went = url; }};
    """
    said = """
    console.log(JSON.stringify({settings: JSON.parse(store.get("_tb_global_settings")),
                                went: globalThis.went}));
    """
    harness = stand_in + script + said

    def landed(stored: str) -> dict[str, Any]:
        proc = subprocess.run(["node", "-e", harness, stored], capture_output=True, text=True,
                              timeout=30)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    fresh = landed("null")
    assert fresh == {"settings": DEFAULTS, "went": "/" + LANDING + "#hparams"}
    own = landed(json.dumps({"sideBarWidthInPercent": 50, "scalarSmoothing": 0.3}))["settings"]
    assert own == {**DEFAULTS, "sideBarWidthInPercent": 50, "scalarSmoothing": 0.3}
    for junk in ("5", "[1]", "{not json"):
        assert landed(junk)["settings"] == DEFAULTS


def steps(server: str, run: str, tag: str) -> list[int]:
    query = urllib.parse.urlencode({"run": run, "tag": tag})
    return [step for _, step, _ in get_json(f"{server}/data/plugin/scalars/scalars?{query}")]


SUBRUNS = ("/hparams",)
GROUP = "classifier"  # the task's group: model=mlp is a Classifier


def runs(server: str) -> list[str]:
    """The training runs TensorBoard lists (their hparams/ runs left out)."""
    return sorted(r for r in get_json(f"{server}/data/plugin/scalars/tags")
                  if not r.endswith(SUBRUNS))  # fmt: skip


def cli_runs(server: str) -> list[str]:
    return [r for r in runs(server) if "resumed" not in r]


def tags_of(server: str, run: str) -> set[str]:
    return set(get_json(f"{server}/data/plugin/scalars/tags").get(run, {}))


def test_runs_are_listed_as_task_time_overrides(server: str, log_dir: Path) -> None:
    listed = sorted(get_json(f"{server}/data/plugin/scalars/tags"))
    names = [d.name for d in run_dirs(log_dir) if d.name != "resumed"]
    # No /tensorboard or version_0 below the run folder, no
    # val/ run (validation curves are the run's own, in its colour); its HPARAMS session a run
    # below it.
    expected = [f"train/{n}" for n in [*names, "resumed"]]
    assert listed == sorted(f"{r}{sub}" for r in expected for sub in ("", *SUBRUNS))
    # The overrides first, keys cut to the ending that names one setting, then the time.
    time_ = r"\d{4}-\d{6}"
    # callbacks.grad_monitor.every_n_steps is the config's one every_n_steps; the data
    # module's batch_size is not its only one (tuner.batch_size): kept whole.
    for named in ("every_n_steps=3,per_layer=true,data.batch_size=256,num_workers=0,model=mlp,"
                  "seed=7,log_every_n_steps=2,max_epochs=2",
                  "every_n_steps=3,data.batch_size=256,num_workers=0,lr=0.01,model=mlp,"
                  "deterministic=true,log_every_n_steps=2,max_epochs=2"):  # fmt: skip
        assert any(re.fullmatch(f"{re.escape(named)}_{time_}", n) for n in names), (named, names)
    # The run list shows the last path component first (TensorBoard's truncated path): its
    # first 20 characters tell two runs apart.
    a, b = (r.rsplit("/", 1)[1][:20] for r in cli_runs(server))
    assert a != b


def test_one_step_convention_and_every_n_exactly(server: str) -> None:
    for tags in get_json(f"{server}/data/plugin/scalars/tags").values():
        assert "epoch" not in tags and not any(t.startswith(("hp/", "lr-")) for t in tags)
    for run in runs(server):
        # One point at the run's last optimizer step (2 epochs x 5); the resumed run has one
        # for each part it ran.
        last = steps(server, f"{run}/hparams", f"verdict/task/{GROUP}/test/acc")
        assert last == ([5, 10] if run.endswith("/resumed") else [10])
        end = last[-1]
        # Every N optimizer steps exactly, epoch ends included (none dropped, none late).
        assert steps(server, run, "vitals/grad_norm/total") == list(range(0, end, GRAD_EVERY))
        assert steps(server, run, f"{GROUP}/train/loss_step") == list(range(0, end, EVERY))
        assert steps(server, run, "vitals/lr") == list(range(0, end, EVERY))
        # Throughput over the N steps that end at N, 2N, ...: the same x.
        throughput = steps(server, run, "vitals/perf/samples_per_sec")
        assert throughput == list(range(EVERY, end + 1, EVERY))
        # Per epoch: at the optimizer steps completed when validation ran.
        assert steps(server, run, f"{GROUP}/val/acc") == [5, 10]
        assert steps(server, run, f"{GROUP}/train/acc") == [5, 10]
        assert steps(server, run, f"{GROUP}/train/loss_epoch") == [5, 10]


def test_custom_scalars_layout_opens_on_train_vs_val(server: str) -> None:
    layout = get_json(f"{server}/data/plugin/custom_scalars/layout")
    charts = {c["title"]: c["multiline"]["tag"] for cat in layout["category"] for c in cat["chart"]}
    first = layout["category"][0]["chart"][0]
    assert first["title"] == "loss: train vs val"
    run = cli_runs(server)[0]
    tags = tags_of(server, run)

    def shown(title: str) -> set[str]:
        return {t for t in tags if any(re.search(rx, t) for rx in charts[title])}

    # training vs validation on one chart, the names as logged (the task's charts too)
    assert shown("loss: train vs val") == {f"{GROUP}/train/loss_step", f"{GROUP}/val/loss",
                                          f"{GROUP}/train/loss_epoch"}  # fmt: skip
    assert shown("accuracy: train vs val") == {f"{GROUP}/train/acc", f"{GROUP}/val/acc",
                                              f"{GROUP}/val/acc_best"}  # fmt: skip
    assert shown("learning rate") == {"vitals/lr"}
    assert shown("gradient norm (total, before clipping)") == {"vitals/grad_norm/total"}
    assert shown("throughput (samples/s)") == {"vitals/perf/samples_per_sec"}
    assert shown("share of step time waiting for data") == {"vitals/perf/data_wait_share"}


def test_grad_norm_total_comes_first_and_layers_say_their_type(server: str) -> None:
    per_layer = next(r for r in cli_runs(server) if "per_layer=true" in r)
    tags = sorted(tags_of(server, per_layer))
    grads = [t for t in tags if t.startswith("vitals/grad_norm")]
    assert grads[0] == "vitals/grad_norm/total"
    assert "vitals/grad_norm_layers/net.layers.1.weight (Linear)" in grads
    default = next(r for r in cli_runs(server) if "per_layer" not in r)
    grads = [t for t in tags_of(server, default) if t.startswith("vitals/grad_norm")]
    assert grads == ["vitals/grad_norm/total"]  # per layer only when asked for


def session_groups(server: str) -> list[dict]:
    body = {"experimentName": "", "allowedStatuses": ["STATUS_SUCCESS", "STATUS_UNKNOWN",
            "STATUS_FAILURE", "STATUS_RUNNING"], "startIndex": 0, "sliceSize": 100}  # fmt: skip
    return get_json(f"{server}/data/plugin/hparams/session_groups", body)["sessionGroups"]


def test_hparams_one_typed_session_per_run(server: str) -> None:
    exp = get_json(f"{server}/data/plugin/hparams/experiment", {"experimentName": ""})
    infos = {h["name"]: h for h in exp["hparamInfos"]}
    assert len(infos) <= 25 and not any("_target_" in n or "dir" in n for n in infos)
    assert {"model.optimizer.lr", "trainer.deterministic", "seed", "data.batch_size",
            "effective_batch_size", "trainer.precision", "model.net",
            "model.optimizer"} <= set(infos)  # fmt: skip
    # The keys that differ between the runs come first (TensorBoard shows the first five).
    differing = [h["name"] for h in exp["hparamInfos"] if h.get("differs")]
    assert {"model.optimizer.lr", "seed"} <= set(differing)
    assert [h["name"] for h in exp["hparamInfos"]][: len(differing)] == differing
    assert infos["trainer.deterministic"]["type"] == "DATA_TYPE_BOOL"
    assert infos["model.optimizer.lr"]["type"] == "DATA_TYPE_FLOAT64"
    assert infos["trainer.precision"]["type"] == "DATA_TYPE_STRING"
    # The chosen results only, in the order TensorBoard shows them (it ticks the first five
    # and draws parallel coordinates through the sessions that have all five): what every task
    # has (the loss, the performance summary), then the task's own. No curves, no layer norms.
    metrics = [m["name"]["tag"] for m in exp["metricInfos"]]
    assert all(m["name"]["group"] == "" for m in exp["metricInfos"])
    assert metrics[:2] == ["verdict/loss/test", "verdict/loss/val"]
    perf = [m for m in metrics if m.startswith("verdict/perf/")]
    assert metrics[2 : 2 + len(perf)] == perf and len(perf) >= 3
    assert {"verdict/perf/samples_per_sec", "verdict/perf/data_wait_share",
            "verdict/perf/host_peak_rss_gb"} <= set(perf)  # fmt: skip
    own = metrics[2 + len(perf) :]
    assert {f"verdict/task/{GROUP}/val/acc_best", f"verdict/task/{GROUP}/test/acc",
            f"verdict/task/{GROUP}/val/acc"} <= set(own)  # fmt: skip
    assert all(m.startswith(f"verdict/task/{GROUP}/") for m in own)

    groups = session_groups(server)
    assert len(groups) == 3 and all(len(g["sessions"]) == 1 for g in groups)  # resumed: once
    by_run = {g["sessions"][0]["name"]: g for g in groups}
    assert set(by_run) == {f"{r}/hparams" for r in runs(server)}
    # RUN_A's, RUN_B's (names sort by their overrides now, not by when the run started)
    a, b = (
        by_run[f"{r}/hparams"] for r in sorted(cli_runs(server), key=lambda r: "seed=7" not in r)
    )
    assert (a["hparams"]["seed"], b["hparams"]["seed"]) == (7, 42)
    assert (
        b["hparams"]["model.optimizer.lr"] == 0.01 and b["hparams"]["trainer.deterministic"] is True
    )
    assert a["hparams"]["trainer.max_epochs"] == 2 and a["hparams"]["model.net"] == "MLP"
    # Trial IDs: the run folders' names, what the run list shows (overrides first, no date).
    assert a["name"] != b["name"] and not re.match(r"\d{4}-\d\d-\d\d", a["name"])
    assert {a["name"], b["name"]} == {r.rsplit("/", 1)[1] for r in cli_runs(server)}
    for group in groups:
        session = group["sessions"][0]
        assert session["status"] == "STATUS_SUCCESS"
        assert 0 < session["startTimeSecs"] < session["endTimeSecs"]
        values = {m["name"]["tag"]: m["value"] for m in session["metricValues"]}
        assert 0 <= values[f"verdict/task/{GROUP}/test/acc"] <= 1
        assert values["verdict/loss/test"] > 0 and values["verdict/loss/val"] > 0
        assert values["verdict/perf/samples_per_sec"] > 0


@pytest.mark.slow  # 10-15 s of processes: CI runs it in make test-slow
def test_printed_commands_work_as_printed(log_dir: Path) -> None:
    lines = {ln.split(maxsplit=1)[0]: ln.split(maxsplit=1)[1] for ln in PRINTED[0].splitlines()
             if ln.startswith(("evaluate ", "export ", "resume ", "TensorBoard "))}  # fmt: skip
    assert set(lines) == {"evaluate", "export", "resume", "TensorBoard"}
    # The checkpoint path holds `=` and `,`: pasted into a shell, Hydra takes it as one value.
    evaluate = lines["evaluate"].replace(
        " -m fasttrain.evaluate ", " -m fasttrain.evaluate --cfg job "
    )
    proc = subprocess.run(["bash", "-c", evaluate], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    ckpt = re.search(r"^ckpt_path: (.*)$", proc.stdout, re.M)
    assert ckpt and Path(ckpt[1]).is_file() and "=" in ckpt[1] and "," in ckpt[1]


def pinned_in(printed: str) -> list[str]:
    """The tags the printed `view` link pins."""
    (url,) = [ln.split()[1] for ln in printed.splitlines() if ln.startswith("view ")]
    query = urllib.parse.urlparse(url).query
    assert urllib.parse.parse_qs(query)["smoothing"] == ["0"]  # a few val points as they are
    assert urllib.parse.parse_qs(query)["runColorGroup"] == ["regex:^(.+?)(?:/hparams)?$"]
    cards = json.loads(urllib.parse.parse_qs(query)["pinnedCards"][0])
    assert all(card["plugin"] == "scalars" for card in cards)
    return [card["tag"] for card in cards]


def test_the_printed_view_pins_the_monitor_and_the_loss_first(server: str) -> None:
    # the monitored metric, then the loss, as logged in the task's group
    pinned = pinned_in(PRINTED[0])
    assert pinned == [f"{GROUP}/val/acc", f"{GROUP}/val/loss"]
    assert all(set(pinned) <= tags_of(server, run) for run in runs(server))


def rendered(url: str) -> str:
    """The page at `url` as headless Chromium renders it (1400 x 1100), its DOM as text."""
    proc = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1100",
         "--virtual-time-budget=15000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return proc.stdout


def cards_and_runs(page: str) -> list[tuple[str, list[str]]]:
    """The scalar cards the Time Series page drew, in page order, each with the runs of its
    data table (one row per line drawn)."""
    found = []
    for card in re.split(r'(?=<tb-truncated-path[^>]*class="tag")', page)[1:]:
        tag = re.search(r'title="([^"]+)"', card)
        rows = re.findall(r'class="cell extra-right-padding ng-star-inserted"> (\S+) <', card)
        found.append((tag[1] if tag else "", [r for r in rows if r.startswith("train/")]))
    return found


needs_chromium = pytest.mark.skipif(shutil.which("chromium") is None,
                                    reason="needs headless Chromium (apt)")  # fmt: skip


@pytest.mark.slow  # a headless browser (seconds): CI runs it in make test-slow
@needs_chromium
def test_time_series_opens_on_the_tasks_own_charts(server: str) -> None:
    page = rendered(server + "/#timeseries")  # as `make tensorboard` opens it: no link state
    groups = re.findall(r'class="group-title" title="([^"]+)"', page)
    assert groups == [GROUP, "verdict", "vitals"], page[-2000:]
    # The task's group opens first: its training and validation curves under the names logged,
    # each card a line per run (no val/ run beside it: one colour per run on every card).
    cards = cards_and_runs(page)
    tags = [tag for tag, _ in cards]
    wanted = ["train/loss_step", "val/loss", "val/acc", "train/acc", "val/acc_best"]
    assert {f"{GROUP}/{name}" for name in wanted} <= set(tags), tags
    for tag, rows in cards:
        if tag.startswith(f"{GROUP}/"):
            assert sorted(rows) == sorted(runs(server)), (tag, rows)


def run_list(page: str) -> dict[str, str]:
    """The runs of the Time Series run list, each with the colour of its swatch."""
    rows = re.split(r"<tb-data-table-content-row", page)[1:]
    found = {}
    for row in rows:
        name = re.search(r'class="cell extra-right-padding ng-star-inserted"> (train/\S+) <', row)
        colour = re.search(r'class="run-color-swatch" style="background: ([^;"]+)', row)
        if name and colour:
            found[name[1]] = colour[1]
    return found


@pytest.mark.slow  # a headless browser (seconds): CI runs it in make test-slow
@needs_chromium
def test_the_landing_pairs_a_runs_colours_and_widens_its_list(server: str) -> None:
    """The bare address (as `make tensorboard` opens it): a run and its HPARAMS session's run
    (the `verdict/` points) in one colour, each run its own; the run list at RUN_LIST_PERCENT
    of the page, not TensorBoard's 20 %, where a name is cut within its date."""
    from fasttrain.tools.board import RUN_LIST_PERCENT

    page = rendered(server + "/")
    assert f'class="sidebar ng-star-inserted" style="width: {RUN_LIST_PERCENT}%' in page
    colours = run_list(page)
    assert sorted(colours) == sorted([*runs(server), *(r + "/hparams" for r in runs(server))])
    assert all(colours[run] == colours[run + "/hparams"] for run in runs(server)), colours
    assert len({colours[run] for run in runs(server)}) == len(runs(server)), colours


@pytest.mark.slow  # a headless browser (seconds): CI runs it in make test-slow
@needs_chromium
def test_a_tabs_own_address_opens_that_tab(server: str) -> None:
    """The bare address's redirect carries no #fragment, so the browser keeps the one asked for:
    `/#hparams` opens HPARAMS (through the unsmoothed landing), not Time Series."""
    page = rendered(server + "/#hparams")
    assert "<tf-hparams-dashboard" in page and 'class="group-title"' not in page, page[-2000:]


@pytest.mark.slow  # a headless browser (seconds): CI runs it in make test-slow
@needs_chromium
def test_the_view_opens_on_the_pinned_charts_in_a_browser(server: str) -> None:
    (link,) = [ln.split()[1] for ln in PRINTED[0].splitlines() if ln.startswith("view ")]
    page = rendered(server + link.removeprefix("http://127.0.0.1:6006"))  # this test's server
    assert ">Pinned<" in page, page[-2000:]
    # The Time Series page as rendered: the pinned group first, its cards in the link's order.
    pinned_group = page[page.index(">Pinned<") : page.index('class="group-title" title=')]
    titles = [t for t in re.findall(r'title="([^"]+)"', pinned_group) if "/" in t]
    assert titles == pinned_in(PRINTED[0])


def test_long_overrides_keep_every_value() -> None:
    from fasttrain.config.resolvers import MAX_OVERRIDES, short_overrides

    given = ",".join([
        "data.batch_size=64", "model.net.hidden=[256,128,64]",
        "model.optimizer.lr=0.0012345678901234",
        "model.optimizer.weight_decay=0.00012345678901234", "model.scheduler.eta_min=0.000001",
        "trainer.gradient_clip_val=0.5", "trainer.max_epochs=30", "trainer.precision=bf16-mixed",
    ])  # fmt: skip
    assert len(given) > MAX_OVERRIDES  # cut at 150 characters, the sweep's lr was lost
    short = short_overrides(given)
    assert len(short) <= MAX_OVERRIDES and short.startswith("batch_size=64,hidden=[256,128,64],")
    assert "lr=0.0012345678901234" in short and short.endswith(",precision=bf16-mixed")
    assert short_overrides("seed=1,trainer.max_epochs=3") == "seed=1,trainer.max_epochs=3"
    # Keys that share an ending keep as much as tells them apart.
    assert short_overrides("a.x.lr=1,b.x.lr=2,c.y=3", limit=22) == "a.x.lr=1,b.x.lr=2,y=3"
    huge = [short_overrides(f"x={'1' * 300}{i}") for i in range(2)]
    assert all(len(h) <= MAX_OVERRIDES for h in huge) and huge[0] != huge[1]


def test_trial_ids_are_short_and_unique_across_sweeps() -> None:
    from fasttrain.callbacks.sessions import trial_id

    logs = Path("/logs/train")
    assert trial_id(logs / "seed=1_0131-120000") == "seed=1_0131-120000"  # short already
    assert trial_id(logs / "2026-01-31_12-00-00_seed=1") == "12-00-00_seed=1"  # an older folder
    assert trial_id(logs / "R") == "R"  # a run_name of the user's own
    # Each sweep's job 0 is a trial of its own (one ID would be one row of averaged results).
    sweeps = [logs / "multirun" / f"0131-120{m}00" / "0_seed=1" for m in (0, 5)]
    assert [trial_id(job) for job in sweeps] == ["0131-120000/0_seed=1", "0131-120500/0_seed=1"]
    old = [logs / "multirun" / f"2026-01-31_12-0{m}-00" / "0_seed=1" for m in (0, 5)]
    assert [trial_id(job) for job in old] == ["12-00-00/0_seed=1", "12-05-00/0_seed=1"]


def test_compared_hparams_typed_without_plumbing() -> None:
    from fasttrain.callbacks.sessions import MAX_HPARAMS, compared_hparams

    config = {
        "seed": 1, "data": {"_target_": "a.DigitsDataModule", "batch_size": 64, "data_dir": "/d"},
        "model": {"net": {"_target_": "n.MLP", "hidden": [64, 32]},
                  "optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.01}},
        "trainer": {"precision": "bf16-mixed", "deterministic": True, "gradient_clip_val": None},
        "callbacks": {"best": {"dirpath": "/x", "mode": "max"}},
    }  # fmt: skip
    overrides = ["model/net=mlp", "trainer.deterministic=true", "model.net.hidden=[64,32]",
                 "data.data_dir=/d", "callbacks.best.dirpath=/x", "~trainer.precision",
                 "model=mlp"]  # fmt: skip
    got = compared_hparams(config, overrides, {"effective_batch_size": 128})
    assert got == {
        "effective_batch_size": 128, "model/net": "mlp", "trainer.deterministic": True,
        "model": "mlp",  # a top-level group by its option's name, not its whole config
        "model.net.hidden": "[64, 32]", "data": "DigitsDataModule", "data.batch_size": 64,
        "model.net": "MLP", "model.optimizer": "AdamW", "model.optimizer.lr": 0.01,
        "trainer.precision": "bf16-mixed", "seed": 1,
    }  # fmt: skip
    many = compared_hparams({f"k{i}": i for i in range(40)}, [f"k{i}={i}" for i in range(40)])
    assert len(many) == MAX_HPARAMS


def test_tensorboard_names_are_the_names_logged() -> None:
    from fasttrain.callbacks.board import (
        logged_name,
        task_group,
        tensorboard_pattern,
        tensorboard_tag,
    )
    from fasttrain.models import Classifier, LanguageModel

    names = ("train/loss_step", "val/loss", "train/mse", "val/mse", "val/mse_best",
             "train/loss_epoch", "val/r2", "lr", "lr/1", "perf/samples_per_sec",
             "grad_norm/total", "grad_norm_layers/net.fc.weight", "debug/mine")  # fmt: skip
    shown = {name: tensorboard_tag(name, "regressor") for name in names}
    assert shown["val/mse"] == "regressor/val/mse" and shown["debug/mine"] == "regressor/debug/mine"
    assert shown["lr/1"] == "vitals/lr/1" and shown["grad_norm/total"] == "vitals/grad_norm/total"
    assert all(logged_name(tag) == name for name, tag in shown.items() if tag)
    assert tensorboard_tag("test/mse", "regressor") is None
    assert tensorboard_tag("final/val/mse", "regressor") is None
    assert re.search(tensorboard_pattern(r"^val/mse(_best)?$"), "regressor/val/mse_best")
    assert not re.search(tensorboard_pattern(r"^val/mse$"), "regressor/train/mse")
    # The task's group: its class in snake case, whoever wrote it.
    assert (
        task_group(Classifier.__new__(Classifier)),
        task_group(LanguageModel.__new__(LanguageModel)),
    ) == ("classifier", "language_model")
    MNISTLitModule = type("MNISTLitModule", (), {})
    assert task_group(MNISTLitModule()) == "mnist_lit_module"


def test_results_every_task_has_come_first_in_a_folder_of_mixed_tasks() -> None:
    from fasttrain.callbacks.board import verdict_tag

    logged = {
        "classifier": ["val/loss", "val/acc", "val/acc_best", "test/loss", "test/acc"],
        "regressor": ["val/loss", "val/mse", "val/mse_best", "val/r2", "test/loss", "test/mse"],
        "language_model": ["val/loss", "val/bpb", "val/bpb_best", "test/loss", "test/acc"],
    }  # fmt: skip
    perf = ["final/perf/samples_per_sec", "final/perf/data_wait_share",
            "final/perf/step_time_ms_median", "final/perf/host_peak_rss_gb"]  # fmt: skip
    sessions = {task: {verdict_tag(n, task) for n in [*names, *perf]} - {None}
                for task, names in logged.items()}  # fmt: skip
    columns = sorted(set().union(*sessions.values()))
    # TensorBoard shows the first five columns and draws a session only if it has all five.
    assert all(set(columns[:5]) <= tags for tags in sessions.values()), columns[:5]
    assert columns[:2] == ["verdict/loss/test", "verdict/loss/val"]
    # Same name, other meaning: a classifier's test/acc and a language model's token accuracy.
    assert {"verdict/task/classifier/test/acc", "verdict/task/language_model/test/acc"} <= set(
        columns
    )
    assert verdict_tag("val/acc") == "verdict/task/task/val/acc"  # outside a run: a plain group
    assert verdict_tag("perf/samples_per_sec") is None  # a window's value, not the summary
    assert verdict_tag("train/loss_step", "classifier") is None


def test_a_run_writes_one_event_file_per_tensorboard_run(log_dir: Path) -> None:
    """One file for the curves, one for the HPARAMS session, whatever stages the run has (fit,
    then test): TensorBoard reads a folder's files in the order of their names, which a
    per-process counter ends (.9, .10, ...) and it sorts as text, so files of one run written
    in one second by a process that wrote others before (a sweep's jobs) read out of order,
    and it drops what it takes for a restart."""
    from fasttrain.callbacks.board import SESSION_RUN

    for run in run_dirs(log_dir):
        for folder in (run, run / SESSION_RUN):
            files = sorted(p.name for p in folder.glob("events.out.tfevents.*"))
            # the resumed run: one per process that wrote it (two)
            assert len(files) == (2 if run.name == "resumed" else 1), (folder, files)
