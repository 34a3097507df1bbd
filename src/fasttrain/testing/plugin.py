"""The pytest plugin of the generic tests (fasttrain.testing): their markers, and a clean Hydra
state around each test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "slow: long-running tests (deselect with -m 'not slow')")
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    # pytest-xdist's controller imports the module of each warning category its workers report
    # (Lightning's own); torch imported first there, from that callback, failed half-way
    # ("partially initialized module 'torch'") and crashed the session. The controller runs no
    # test: it imports them here, up front. (Workers do not: imported before the tests, they
    # leave Ctrl-C's handling changed for tests/test_reliability_run_signals.py.)
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        import lightning  # noqa: F401


def pytest_report_header(config: Any) -> str:
    import fasttrain

    return f"fasttrain {fasttrain.__version__}, conf: {fasttrain.CONFIG_DIR}"


@pytest.fixture(autouse=True)
def _no_command_line_left_over() -> Iterator[None]:
    """A test that runs an entry point in this process (main() with a patched argv) leaves
    Hydra's record of that command line set; later tests would read it as theirs (the overrides
    typed, the run's choices). Each test starts without one."""
    yield
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().cfg = None
