"""`python train.py ARGS` with time stamps at its phases (bench/startup.py reads them).

Imports what a training run imports first (torch, Lightning, the entry point and the run's
builders), so `compose` holds only composing and checking; build_run is wrapped to stamp when
it is called (config composed, checked, run folder claimed) and when it returns.
"""

import json
import os
import sys
import time

STAMPS = {"probe": time.time()}

import lightning as L  # noqa: E402
import torch  # noqa: E402, F401

import fasttrain.assemble as assemble  # noqa: E402
from fasttrain.train import main  # noqa: E402

STAMPS["imported"] = time.time()


class Stamps(L.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        STAMPS["train_start"] = time.time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if "first_step_end" not in STAMPS:
            STAMPS["first_step_end"] = time.time()
            with open(os.environ["STARTUP_STAMPS"], "w") as f:
                json.dump(STAMPS, f)


real_build_run = assemble.build_run


def build_run(cfg, callbacks=(), **model_kwargs):
    STAMPS["composed"] = time.time()
    built = real_build_run(cfg, [*callbacks, Stamps()], **model_kwargs)
    STAMPS["built"] = time.time()
    return built


assemble.build_run = build_run

if __name__ == "__main__":
    sys.argv[0] = "train.py"
    main()
