"""python -m fasttrain.export ckpt_path=PATH [format=onnx]: deployable files, each checked."""

from functools import partial

from fasttrain import tasks
from fasttrain.cli import entry, script

main = partial(entry, "export", tasks.export)
run = partial(script, main)  # the process itself: the fasttrain-export script
if __name__ == "__main__":
    run()
