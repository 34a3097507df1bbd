"""python -m fasttrain.prepare data=... output_dir=SHARDS: the data set as shards."""

from fasttrain import tasks
from fasttrain.cli import entry_points

main, run = entry_points("prepare", tasks.prepare)  # run: the fasttrain-prepare script
if __name__ == "__main__":
    run()
