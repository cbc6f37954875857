"""A job that fails in training (one rank; two for ``accelerate``), for ``tests/jobs/test_console.py``: the console
of its failure, bridged and plain, must be the same. It never imports the bridge.

``CONSOLE_KIND`` picks the job (CPU, gloo, a tiny model, random data, a few steps; the failure is deterministic):

- ``ddp``: a plain ``DistributedDataParallel`` loop whose ``loss.backward()`` raises (a custom autograd
  ``Function`` raising in its backward at step ``FAIL_AT``); ``main`` is torch's ``@record``, so the agent's failure
  report carries the traceback as ``traceback.format_exc()`` wrote it to the error file;
- ``hf``: a Hugging Face ``Trainer`` whose model's forward raises at step ``FAIL_AT`` (inside ``Trainer.train()``);
- ``lightning``: a Lightning ``Trainer`` (DDP strategy) whose ``training_step`` raises at step ``FAIL_AT`` (inside
  ``Trainer.fit()``);
- ``accelerate``: an ``Accelerator`` loop on 2 ranks (``accelerate launch --multi_gpu`` takes no fewer) whose
  checkpoint on rank 0, ``accelerator.save`` (``torch.save``) into a directory that does not exist, raises at step
  ``FAIL_AT``; rank 1 then waits outside any collective (a sleep), so that its end is the same every run: the
  agent's SIGTERM, not a peer's closed connection. ``@record`` as for ``ddp``;
- ``stopped``: a rank that says it is training and sleeps, for the test to stop the job (SIGTERM to the agent, as a
  scheduler or Ctrl-C does): the agent's ``SignalException`` is raised through its ``run``.
"""

from __future__ import annotations

import os
import time

# no network, ever: offline hub, no telemetry (the models are built here)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from torch.distributed.elastic.multiprocessing.errors import record

KIND = os.environ["CONSOLE_KIND"]
OUT = os.environ["CONSOLE_OUT"]
FAIL_AT = 3
#: How long a rank waits for the agent to stop it (``accelerate``'s second rank, ``stopped``).
WAIT_SECONDS = 120.0
FEATURES = 8


class Exploding(torch.autograd.Function):
    """Identity forward; its backward raises once ``Exploding.armed``."""

    armed = False

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        if Exploding.armed:
            raise RuntimeError("the backward exploded on purpose")
        return grad


def _rows(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, FEATURES, generator=generator), torch.randn(n, 1, generator=generator)


@record
def ddp() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(FEATURES, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = _rows(8)
    for step in range(1, 6):
        Exploding.armed = step == FAIL_AT
        loss = torch.nn.functional.mse_loss(Exploding.apply(model(x)), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


def hf() -> None:
    import transformers

    class Regression(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(FEATURES, 1)
            self.calls = 0

        def forward(self, x, labels=None):  # type: ignore[no-untyped-def]
            self.calls += 1
            if self.calls == FAIL_AT:
                raise RuntimeError(f"the forward of step {FAIL_AT} failed on purpose")
            out = self.linear(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    x, y = _rows(32)
    rows = [{"x": x[i], "labels": y[i]} for i in range(len(x))]
    args = transformers.TrainingArguments(
        output_dir=os.path.join(OUT, "hf"), max_steps=5, per_device_train_batch_size=4, learning_rate=1e-2,
        logging_steps=100, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0, ddp_backend="gloo", seed=0,
    )  # fmt: skip
    transformers.Trainer(model=Regression(), args=args, train_dataset=rows).train()


def lightning() -> None:
    import lightning.pytorch as pl

    class Failing(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(FEATURES, 1)

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            if self.global_step == FAIL_AT:
                raise RuntimeError(f"training_step {FAIL_AT} failed on purpose")
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):  # type: ignore[no-untyped-def]
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*_rows(64)), batch_size=4)

    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        accelerator="cpu", strategy="ddp", devices=1, num_nodes=1, max_steps=6, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=os.path.join(OUT, "lightning"),
    )  # fmt: skip
    trainer.fit(Failing())


@record
def accelerate() -> None:
    from accelerate import Accelerator

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = _rows(8)
    for step in range(1, 6):
        if step == FAIL_AT and accelerator.is_main_process:  # a checkpoint into a directory nobody made
            accelerator.save(model.state_dict(), os.path.join(OUT, "missing", f"step-{step}.pt"))
        elif step == FAIL_AT:  # the other rank waits outside any collective: the agent's SIGTERM ends it
            time.sleep(WAIT_SECONDS)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.end_training()


def stopped() -> None:
    print("console_worker: training", flush=True)
    time.sleep(WAIT_SECONDS)


if __name__ == "__main__":
    {"ddp": ddp, "hf": hf, "lightning": lightning, "accelerate": accelerate, "stopped": stopped}[KIND]()
