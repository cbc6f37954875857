"""A small DDP training job on CPU (gloo) that publishes its own metrics and events with torch's elastic APIs.

Run it under the bridge with no code change, e.g.::

    torchelastic-otel run --standalone --nproc-per-node 2 examples/train_ddp.py --steps 20

Options to see failures in the trace: ``--fail-once-rank R`` (rank R raises in the first attempt; run with
``--max-restarts 1``) and ``--fail-always-rank R``. ``--hidden N --batch B`` give the steps real work (two
N-wide hidden layers; the default is a single ``Linear(8, 1)``).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic import events, metrics
from torch.nn.parallel import DistributedDataParallel as DDP


@metrics.prof(group="trainer")
def train_step(model: DDP, optimizer: torch.optim.Optimizer, batch: torch.Tensor, target: torch.Tensor) -> float:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(batch), target)
    loss.backward()
    optimizer.step()
    return loss.item()


def _model(hidden: int) -> torch.nn.Module:
    if hidden <= 0:
        return torch.nn.Linear(8, 1)
    return torch.nn.Sequential(
        torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fail-once-rank", type=int, default=-1)
    parser.add_argument("--fail-always-rank", type=int, default=-1)
    parser.add_argument("--hidden", type=int, default=0, help="width of two hidden layers (0: a single Linear(8, 1))")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--hard-exit", action="store_true", help="flush, then os._exit (avoids gloo exit aborts)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, restart = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = DDP(_model(args.hidden))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    events.record(
        events.Event("trainer.started", events.EventSource.WORKER, metadata={"rank": rank, "restart": restart}),
        destination="otel",
    )
    for step in range(args.steps):
        batch, target = torch.randn(args.batch, 8), torch.randn(args.batch, 1)
        loss = train_step(model, optimizer, batch, target)
        metrics.put_metric("loss", loss, "trainer")
        metrics.put_metric("samples_total", args.batch, "trainer")
        if step == args.steps // 2 and (
            rank == args.fail_always_rank or (rank == args.fail_once_rank and restart == 0)
        ):
            raise RuntimeError(f"rank {rank} failed at step {step} (restart {restart})")
    events.record(
        events.Event("trainer.finished", events.EventSource.WORKER, metadata={"rank": rank, "steps": args.steps}),
        destination="otel",
    )
    dist.destroy_process_group()
    if args.hard_exit:
        import torchelastic_otel

        torchelastic_otel.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
