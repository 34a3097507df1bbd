"""Screenshots of what TensorBoard opens on, as a user sees it, in headless Chromium.

    python bench/tensorboard_view.py          # writes bench/results/tensorboard/*.png

Two short runs that differ (SmallCNN and MLP on digits, 3 epochs each) in a temporary folder,
a TensorBoard server on 127.0.0.1 over them, then Chromium (`apt install chromium`) on the
Time Series page (1400 x 1100) and on HPARAMS (2800 wide, to show its metric columns), no
link state: what `make tensorboard` opens. Headless Chromium often leaves the chart lines
undrawn (axes and legends are there); tests/test_tensorboard.py checks the pages' structure.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "tensorboard"
RUNS = (["model=mlp"], [])
COMMON = ["trainer.max_epochs=3", "data.num_workers=0"]
# page -> (its address, the window): HPARAMS wide enough to show its metric columns
PAGES = {"time_series": ("#timeseries", "1400,1100"), "hparams": ("#hparams", "2800,700")}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def train(log_dir: Path) -> None:
    for extra in RUNS:
        cmd = [sys.executable, "train.py", *COMMON, *extra, f"paths.log_dir={log_dir}"]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=600)


def serve(log_dir: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(log_dir),
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("tensorboard did not answer within 60 s")


def screenshot(url: str, window: str, path: Path) -> None:
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={window}",
         "--virtual-time-budget=20000", f"--screenshot={path}", url],
        check=True, capture_output=True, timeout=180,
    )  # fmt: skip


def main() -> None:
    if shutil.which("chromium") is None:
        sys.exit("needs headless Chromium: apt install chromium")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "logs"
        train(log_dir)
        port = free_port()
        server = serve(log_dir, port)
        try:
            time.sleep(3)  # the server's first load of the event files
            for name, (page, window) in PAGES.items():
                screenshot(f"http://127.0.0.1:{port}/{page}", window, OUT / f"{name}.png")
                print(OUT / f"{name}.png")
        finally:
            server.terminate()
            server.wait(timeout=10)


if __name__ == "__main__":
    main()
