"""`python train.py key=value ...` from the repository root; the real entry is fasttrain.train."""

from fasttrain.train import run

if __name__ == "__main__":
    run()
