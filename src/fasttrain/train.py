"""python train.py key=value ...: fit, then test the best checkpoint (fasttrain.tasks.train)."""

from functools import partial

from fasttrain import tasks
from fasttrain.cli import entry, script

main = partial(entry, "train", tasks.train)
run = partial(script, main)  # the process itself: the fasttrain-train script
if __name__ == "__main__":
    run()
