"""python -m fasttrain.evaluate ckpt_path=PATH: a checkpoint's test metrics."""

from fasttrain import tasks
from fasttrain.cli import entry


def main() -> None:
    entry("eval", tasks.evaluate)


if __name__ == "__main__":
    main()
