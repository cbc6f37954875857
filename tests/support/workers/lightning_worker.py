"""A tiny Lightning job (2 ranks under torchrun, CPU, gloo, DDP strategy) that writes its own ground truth.

A small MLP regressor on random data; Lightning detects torchrun's environment (``TorchElasticEnvironment``) and
runs ``FRAMEWORK_STEPS`` optimizer steps, with a ``ModelCheckpoint`` every ``FRAMEWORK_SAVE_EVERY`` steps (rank 0
writes it through its checkpoint IO, ``torch.save``). It never imports the bridge. A callback writes
``<FRAMEWORK_OUT>/rank<R>.json`` at the end of training: the batches it trained on this rank
(``on_train_batch_end``), the trainer's ``global_step``, the ``global_step`` of each checkpoint saved (every rank
builds the checkpoint), whether this rank writes it (``writes``: only the global zero rank does, and its files are
on disk after training) and, where it does, each save's file with its size (``files``).

The module logs its training loss every step (``self.log("train_loss", ...)``; Lightning hands it on every
``log_every_n_steps``) and writes what it logged, ``[global_step, value]`` pairs, to
``<FRAMEWORK_OUT>/logged-rank<R>-attempt<A>.json`` (``TORCHELASTIC_RESTART_COUNT``). ``FRAMEWORK_EVAL=1`` validates
every ``FRAMEWORK_SAVE_EVERY`` steps; ``FRAMEWORK_FAIL_ONCE=<marker path>``: rank 1 raises at step
``FRAMEWORK_FAIL_AT`` (default 7) unless the marker exists, which it creates first (one failure).
"""

from __future__ import annotations

import os
import re

# no network, ever (Lightning checks nothing online, but a dependency might)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import lightning.pytorch as pl
import torch
from _framework import ATTEMPT, EVALUATE, OUT, RANK, SAVE_EVERY, STEPS, fail_once, write
from lightning.pytorch.callbacks import ModelCheckpoint

FEATURES = 32


class RandomRows(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, FEATURES, generator=generator)
        self.y = torch.randn(size, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
            torch.nn.Linear(64, 1),
        )  # fmt: skip
        self.logged: list[list[float]] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        self.logged.append([self.global_step, float(loss.item())])
        write(f"logged-rank{RANK}-attempt{ATTEMPT}.json", {"train_loss": self.logged})
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(RandomRows(1024), batch_size=8, num_workers=0)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(RandomRows(32), batch_size=8, num_workers=0)


class GroundTruth(pl.Callback):
    """What the Lightning ``Trainer`` itself says it did on this rank."""

    def __init__(self) -> None:
        self.batches = 0
        self.saves: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
        self.batches += 1
        fail_once(trainer.global_step)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):  # type: ignore[no-untyped-def]
        self.saves.append(trainer.global_step)

    def on_train_end(self, trainer, pl_module):  # type: ignore[no-untyped-def]
        files: dict[int, dict[str, int]] = {}
        if trainer.is_global_zero:  # ModelCheckpoint names its files "epoch=E-step=S.ckpt"
            directory = trainer.checkpoint_callback.dirpath
            for name in sorted(os.listdir(directory)):
                found = re.search(r"step=(\d+)", name)
                if found is not None:
                    files.setdefault(int(found.group(1)), {})[name] = os.path.getsize(os.path.join(directory, name))
        writes = trainer.is_global_zero and sorted(files) == self.saves
        record = {"rank": RANK, "steps": self.batches, "global_step": trainer.global_step, "saves": self.saves,
                  "writes": writes, "files": files}  # fmt: skip
        write(f"rank{RANK}.json", record)


def main() -> None:
    pl.seed_everything(0, verbose=False)
    checkpoint = ModelCheckpoint(
        dirpath=os.path.join(OUT, "checkpoints"), every_n_train_steps=SAVE_EVERY, save_top_k=-1, save_last=False
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=1,
        max_steps=STEPS,
        callbacks=[checkpoint, GroundTruth()],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        log_every_n_steps=5,
        limit_val_batches=4 if EVALUATE else 0,
        val_check_interval=SAVE_EVERY if EVALUATE else None,
        num_sanity_val_steps=0,
    )
    trainer.fit(Regressor())


if __name__ == "__main__":
    main()
