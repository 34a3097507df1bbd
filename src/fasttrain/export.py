"""python -m fasttrain.export ckpt_path=PATH [format=onnx]: deployable files, each checked."""

from functools import partial

from fasttrain import tasks
from fasttrain.cli import entry

main = partial(entry, "export", tasks.export)  # also the fasttrain-export script
if __name__ == "__main__":
    main()
