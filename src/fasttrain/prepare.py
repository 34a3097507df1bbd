"""python -m fasttrain.prepare data=... output_dir=SHARDS: the data set as shards."""

from functools import partial

from fasttrain import tasks
from fasttrain.cli import entry, script

main = partial(entry, "prepare", tasks.prepare)
run = partial(script, main)  # the process itself: the fasttrain-prepare script
if __name__ == "__main__":
    run()
