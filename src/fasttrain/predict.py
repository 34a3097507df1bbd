"""python -m fasttrain.predict ckpt_path=PATH [input=x.npy]: predictions.csv."""

from fasttrain import tasks
from fasttrain.cli import entry


def main() -> None:
    entry("predict", tasks.predict)


if __name__ == "__main__":
    main()
