"""python -m fasttrain.evaluate ckpt_path=PATH: a checkpoint's test metrics."""

from functools import partial

from fasttrain import tasks
from fasttrain.cli import entry

main = partial(entry, "eval", tasks.evaluate)  # also the fasttrain-evaluate script
if __name__ == "__main__":
    main()
