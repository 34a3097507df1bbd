"""python train.py key=value ...: fit, then test the best checkpoint (fasttrain.tasks.train)."""

from fasttrain import tasks
from fasttrain.cli import entry_points

main, run = entry_points("train", tasks.train)  # run: the fasttrain-train script
if __name__ == "__main__":
    run()
