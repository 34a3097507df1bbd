"""python train.py key=value ...: fit, then test the best checkpoint (fasttrain.tasks.train)."""

from functools import partial

from fasttrain import tasks
from fasttrain.cli import entry

main = partial(entry, "train", tasks.train)  # also the fasttrain-train script
if __name__ == "__main__":
    main()
