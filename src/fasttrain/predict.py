"""python -m fasttrain.predict ckpt_path=PATH [input=x.npy]: predictions.csv."""

from functools import partial

from fasttrain import tasks
from fasttrain.cli import entry, script

main = partial(entry, "predict", tasks.predict)
run = partial(script, main)  # the process itself: the fasttrain-predict script
if __name__ == "__main__":
    run()
