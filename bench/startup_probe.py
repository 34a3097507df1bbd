"""`python train.py ARGS` with time stamps at its phases (bench/startup.py reads them).

Imports what a training run imports first (torch, Lightning, the entry point and the run's
builders), so `compose` holds only composing and checking; build_run is wrapped to stamp when
it is called (config composed, checked, run folder claimed) and when it returns.
"""

import os
import sys
import time

STAMPS = {"probe": time.time()}

import torch  # noqa: E402, F401
from timeline import StartupStamps  # noqa: E402  (bench/ is on the path)

import fasttrain.assemble as assemble  # noqa: E402
from fasttrain.train import main  # noqa: E402

STAMPS["imported"] = time.time()


real_build_run = assemble.build_run


def build_run(cfg, callbacks=(), **model_kwargs):
    STAMPS["composed"] = time.time()
    built = real_build_run(
        cfg, [*callbacks, StartupStamps(STAMPS, os.environ["STARTUP_STAMPS"])], **model_kwargs
    )
    STAMPS["built"] = time.time()
    return built


assemble.build_run = build_run

if __name__ == "__main__":
    sys.argv[0] = "train.py"
    main()
