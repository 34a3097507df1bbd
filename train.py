"""`python train.py key=value ...` from the repository root; the real entry is fasttrain.train."""

from fasttrain.train import main

if __name__ == "__main__":
    main()
