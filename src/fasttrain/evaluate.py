"""python -m fasttrain.evaluate ckpt_path=PATH: a checkpoint's test metrics."""

from functools import partial

from fasttrain import tasks
from fasttrain.cli import entry, script

main = partial(entry, "eval", tasks.evaluate)
run = partial(script, main)  # the process itself: the fasttrain-evaluate script
if __name__ == "__main__":
    run()
