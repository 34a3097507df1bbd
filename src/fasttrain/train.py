"""python train.py key=value ...: fit, then test the best checkpoint (fasttrain.tasks.train)."""

from fasttrain import tasks
from fasttrain.cli import entry


def main() -> None:
    entry("train", tasks.train)


if __name__ == "__main__":
    main()
