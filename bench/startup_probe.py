"""`python train.py ARGS` with time stamps at its phases (bench/startup.py reads them).

Imports what a training run imports first (torch, Lightning, the entry point and the run's
builders), so `compose` holds only composing and checking. The command-line check builds the
run (fasttrain.cli.build_checked) and the task gets those objects: build_run is wrapped to stamp
when the check calls it (config composed and checked) and when it returns (run built).
"""

import os
import sys
import time

STAMPS = {"probe": time.time()}

import torch  # noqa: E402, F401
from timeline import StartupStamps  # noqa: E402  (bench/ is on the path)

import fasttrain.assemble as assemble  # noqa: E402
from fasttrain.train import run  # noqa: E402

STAMPS["imported"] = time.time()


real_build_run = assemble.build_run


def build_run(cfg, callbacks=(), **kwargs):
    if "composed" in STAMPS:  # the task's call: it gets the run the check built
        return real_build_run(cfg, callbacks, **kwargs)
    STAMPS["composed"] = time.time()
    stamps = StartupStamps(STAMPS, os.environ["STARTUP_STAMPS"])
    built = real_build_run(cfg, [*callbacks, stamps], **kwargs)
    STAMPS["built"] = time.time()
    return built


assemble.build_run = build_run

if __name__ == "__main__":
    sys.argv[0] = "train.py"
    run()  # as train.py does
