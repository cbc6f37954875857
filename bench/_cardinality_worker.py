"""The training loop of ``bench/cardinality.py``: 2-rank DDP on CPU (gloo), bridge-unaware (torch's APIs only).

It touches everything a worker can export, so that the job's files hold every series a rank adds: a ``DataLoader``
(the input phase), forward / backward / optimizer steps with one gradient all-reduce each (steps, step phases,
arrival at the last collective, the collective sequence), a ``torch.distributed.checkpoint`` save every
``--save-every`` steps and a load at the end (checkpoint duration and step), ``@metrics.prof`` on the step
(function calls and duration) and ``put_metric`` of a gauge (``loss``) and a counter (``samples_total``): the kinds
of user metric. With ``--fail-once-rank R`` rank R raises half-way through the first attempt, so that the agent
restarts the group (``--max-restarts 1``) and exports its failure series too. Each step's forward sleeps
``--compute`` seconds so the job lasts a few metric export intervals; ``--linger`` keeps the ranks alive after their
last step, their final values exported again at each interval (a collector aggregating over an interval sees
every rank's final value in one interval).
Ends with ``os._exit(0)`` after ``destroy_process_group`` (after gloo use the interpreter may abort at exit).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--compute", type=float, default=0.05)
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--linger", type=float, default=0.0, help="seconds to stay alive after the last step")
    parser.add_argument("--fail-once-rank", type=int, default=-1, help="this rank raises mid-way in the first attempt")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.elastic import metrics
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = torch.nn.Linear(32, 32)
            self.out = torch.nn.Linear(32, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(args.compute)  # the forward's work
            return self.out(torch.relu(self.hidden(x)))

    model = DDP(Model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(64, 32)), batch_size=8, num_workers=0)

    @metrics.prof(group="trainer")
    def train_step(batch: torch.Tensor) -> float:
        optimizer.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        return float(loss.item())

    batches = iter(loader)
    for step in range(1, args.steps + 1):
        try:
            (batch,) = next(batches)
        except StopIteration:
            batches = iter(loader)
            (batch,) = next(batches)
        if rank == args.fail_once_rank and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            if step == args.steps // 2:
                raise RuntimeError(f"cardinality_worker: rank {rank} fails once, at step {step}")
        loss = train_step(batch)
        metrics.put_metric("loss", loss, "trainer")
        metrics.put_metric("samples_total", len(batch), "trainer")
        if step % args.save_every == 0:
            dcp.save({"model": model.state_dict()}, checkpoint_id=args.dir / f"step{step}")
    last_save = args.dir / f"step{args.steps // args.save_every * args.save_every}"
    dcp.load({"model": model.state_dict()}, checkpoint_id=last_save)
    time.sleep(args.linger)  # the periodic exports repeat the final values meanwhile
    sys.stdout.write(f"cardinality_worker rank {rank}: {args.steps} steps\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
