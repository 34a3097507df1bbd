"""python -m fasttrain.evaluate ckpt_path=PATH: a checkpoint's test metrics."""

from fasttrain import tasks
from fasttrain.cli import entry_points

main, run = entry_points("eval", tasks.evaluate)  # run: the fasttrain-evaluate script
if __name__ == "__main__":
    run()
