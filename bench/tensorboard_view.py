"""Screenshots of what TensorBoard opens on, as a user sees it, in headless Chromium.

    python bench/tensorboard_view.py          # writes bench/results/tensorboard/*.png

Seven short runs of three tasks in a temporary folder (bench/seven_runs.py: SmallCNN on digits
three times, a regressor on diabetes twice, a small GPT on a generated corpus twice, each named
by the override that tells it apart), a TensorBoard server on 127.0.0.1 over them, then
Chromium (`apt install chromium`) on the Time Series page (1400 x 1100) and on HPARAMS (2800
wide, to show its metric columns), no link state: what `make tensorboard` opens (its
server, fasttrain.tools.board). The parallel coordinates are a click away on HPARAMS, so that
one needs Playwright driving the same Chromium (`pip install playwright`, in any Python:
`python bench/tensorboard_view.py` run by that Python trains with the repository's .venv);
without it that screenshot is left out, and Chromium's own `--screenshot` often leaves the
chart lines undrawn (axes and legends are there). tests/test_tensorboard.py checks the pages'
structure.
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

from seven_runs import ROOT, VENV_PYTHON, train

OUT = ROOT / "bench" / "results" / "tensorboard"
# page -> (its address, the window): HPARAMS wide enough to show its metric columns
PAGES = {"time_series": ("", "1400,1100"), "hparams": ("#hparams", "2800,700")}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(log_dir: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable,
         "-m", "fasttrain.tools.board", "--logdir", str(log_dir),
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


def screenshot(url: str, window: str, path: Path, click: str | None = None) -> bool:
    """The page at `url` as Chromium renders it: through Playwright where it is installed (it
    waits for the charts to draw, and can click a tab first), else Chromium's own --screenshot
    (no clicks: False where one is asked for)."""
    width, height = (int(n) for n in window.split(","))
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if click:
            return False
        subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={window}",
             "--virtual-time-budget=20000", f"--screenshot={path}", url],
            check=True, capture_output=True, timeout=180,
        )  # fmt: skip
        return True
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"),
                                     args=["--no-sandbox", "--disable-gpu"])  # fmt: skip
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(url)
        page.wait_for_timeout(6000)
        if click:
            page.get_by_text(click).first.click()
            page.wait_for_timeout(4000)
        page.screenshot(path=str(path))
        browser.close()
    return True


def main() -> None:
    if shutil.which("chromium") is None:
        sys.exit("needs headless Chromium: apt install chromium")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "logs"
        train(log_dir, Path(tmp))
        port = free_port()
        server = serve(log_dir, port)
        try:
            time.sleep(3)  # the server's first load of the event files
            for name, (page, window) in PAGES.items():
                screenshot(f"http://127.0.0.1:{port}/{page}", window, OUT / f"{name}.png")
                print(OUT / f"{name}.png")
            coords = OUT / "parallel_coordinates.png"
            url = f"http://127.0.0.1:{port}/#hparams"
            if screenshot(url, "1600,1000", coords, click="PARALLEL COORDINATES"):
                print(coords)
            else:
                print("parallel coordinates left out: needs Playwright (pip install playwright)")
        finally:
            server.terminate()
            server.wait(timeout=10)


if __name__ == "__main__":
    main()
