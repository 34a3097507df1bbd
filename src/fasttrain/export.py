"""python -m fasttrain.export ckpt_path=PATH [format=onnx]: deployable files, each checked."""

from fasttrain import tasks
from fasttrain.cli import entry_points

main, run = entry_points("export", tasks.export)  # run: the fasttrain-export script
if __name__ == "__main__":
    run()
