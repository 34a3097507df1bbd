"""python -m fasttrain.prepare data=... output_dir=SHARDS: the data set as shards."""

from functools import partial

from fasttrain import tasks
from fasttrain.cli import entry

main = partial(entry, "prepare", tasks.prepare)  # also the fasttrain-prepare script
if __name__ == "__main__":
    main()
