"""python -m fasttrain.predict ckpt_path=PATH [input=x.npy]: predictions.csv."""

from fasttrain import tasks
from fasttrain.cli import entry_points

main, run = entry_points("predict", tasks.predict)  # run: the fasttrain-predict script
if __name__ == "__main__":
    run()
