"""The floor for bench/startup.py: the default run's work written by hand in one file, with
Hydra and Lightning (no template): digits, a small CNN, TensorBoard, a checkpoint, fit."""

import os
import time

STAMPS = {"probe": time.time()}

import hydra  # noqa: E402
import lightning as L  # noqa: E402
import torch  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from timeline import StartupStamps  # noqa: E402  (bench/ is on the path)
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

STAMPS["imported"] = time.time()
ConfigStore.instance().store(name="floor", node={"batch_size": 64, "lr": 3e-3, "seed": 42})


class Digits(L.LightningDataModule):
    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x, dtype=torch.float32).view(-1, 1, 8, 8) / 16
        y = torch.tensor(y)
        xt, xv, yt, yv = train_test_split(x, y, test_size=0.2, stratify=y, random_state=0)
        self.train, self.val = TensorDataset(xt, yt), TensorDataset(xv, yv)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size)


class Net(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
        )  # fmt: skip

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx) -> None:
        x, y = batch
        self.log("val/acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


@hydra.main(version_base="1.3", config_path=None, config_name="floor")
def main(cfg) -> None:
    STAMPS["composed"] = time.time()
    L.seed_everything(cfg.seed)
    out = hydra.core.hydra_config.HydraConfig.get().runtime.output_dir
    trainer = L.Trainer(
        max_epochs=1, limit_train_batches=1, limit_val_batches=1, enable_progress_bar=False,
        logger=L.pytorch.loggers.TensorBoardLogger(out, name="", version=""),
        callbacks=[L.pytorch.callbacks.ModelCheckpoint(monitor="val/acc", mode="max"),
                   StartupStamps(STAMPS, os.environ["STARTUP_STAMPS"])],
    )  # fmt: skip
    data, model = Digits(cfg.batch_size), Net(cfg.lr)
    STAMPS["built"] = time.time()
    trainer.fit(model, datamodule=data)


if __name__ == "__main__":
    main()
