"""More than one machine, on this one: two "nodes" of one CPU process each, started as two
torchrun processes with a c10d rendezvous on 127.0.0.1, train from shards into one run folder
and reach the same final loss as a 2-process single-node run (trainer=ddp_cpu)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("webdataset", reason="shards need WebDataset: pip install -e '.[data]'")
pytest.importorskip("PIL", reason="shards need Pillow: pip install -e '.[data]'")
from conftest import REPO, final_metrics, run_cli, run_dirs
from fasttrain.data.image_folder import ImageFolderDataModule
from fasttrain.data.shards import write_shards
from fasttrain.testing.fake_data import write_image_folder

RUN = ["train.py", "data=shards", "data.num_classes=3", "data.image_size=[16,16]",
       "data.num_workers=0", "data.batch_size=4", "model.net.channels=[8]", "trainer.max_epochs=2",
       "logger=none", "model.scheduler=null", "callbacks=none"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def two_nodes_run(run: list[str], logs: Path) -> tuple[list[int], list[str]]:
    """Two torchrun "nodes" of one process each: their exit codes and outputs, each worker's
    own output included (torchrun's --tee), so a failure shows what each rank printed."""
    port = free_port()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=two_nodes",
        "--tee=3",
    ]
    node_run = [*run, "trainer=ddp_cpu", "trainer.devices=1", "++trainer.num_nodes=2",
                "run_name=two_nodes", f"paths.log_dir={logs}"]  # fmt: skip
    nodes = [start(torchrun + node_run, env) for _ in range(2)]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    return [n.returncode for n in nodes], outputs


@pytest.mark.slow
def test_two_torchrun_nodes_train_like_one_node_with_two_processes(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path / "imgs", per_class=12)
    # 20% held out each (about 7 images): two processes need two shards of every split
    source = ImageFolderDataModule(str(root), 3, [3, 16, 16], image_size=[16, 16], num_workers=0,
                                   val_fraction=0.2, test_fraction=0.2)  # fmt: skip
    assert min(len(source.parts[s]) for s in ("val", "test")) >= 4
    write_shards(source, tmp_path / "shards", shard_size=2)  # several per process, every split
    run = [*RUN, f"data.path={tmp_path}/shards"]

    for attempt in range(2):
        logs = tmp_path / f"logs{attempt}"
        codes, outputs = two_nodes_run(run, logs)
        # gloo's TCP transport can abort a process (std::terminate: "terminate called ...",
        # SIGABRT) when a connection closes while its listener reads the peer's address
        # (pytorch/pytorch#188266, open upstream): seen once on a loaded 2-core CI machine, never
        # in 18 runs here. Only that abort earns one more try; anything else fails at once.
        if codes == [0, 0] or not any("terminate called" in o for o in outputs):
            break
        print(f"attempt {attempt}: gloo aborted a process (upstream race); trying again")
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    (two_nodes,) = run_dirs(logs)  # one run folder for both nodes
    assert two_nodes.name == "two_nodes"

    proc = run_cli([*run, "trainer=ddp_cpu", "trainer.devices=2", "run_name=one_node"], logs,
                   timeout=600, OMP_NUM_THREADS="1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = final_metrics(two_nodes), final_metrics(logs / "train" / "one_node")
    assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5, abs=1e-6)
    assert a["val/loss"] == pytest.approx(b["val/loss"], rel=1e-5, abs=1e-6)
    assert sorted(p.name for p in (two_nodes / "checkpoints").iterdir()) == sorted(
        p.name for p in (logs / "train" / "one_node" / "checkpoints").iterdir()
    )
