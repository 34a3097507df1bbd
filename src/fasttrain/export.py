"""python -m fasttrain.export ckpt_path=PATH [format=onnx]: deployable files, each checked."""

from fasttrain import tasks
from fasttrain.cli import entry


def main() -> None:
    entry("export", tasks.export)


if __name__ == "__main__":
    main()
