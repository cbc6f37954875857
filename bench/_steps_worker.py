"""The training loop of ``bench/bench_steps.py``: 2-rank DDP on CPU (gloo), bridge-unaware (torch's APIs only).

A model with two ``--hidden``-wide hidden layers, batch ``--batch``: ~50 ms of compute a step on one core with the
defaults, one gradient all-reduce a step (DDP's default 25 MB bucket; ``--bucket-mb`` smaller gives more
collectives a step). Each rank prints ``steps_worker rank <r> loop <seconds> cpu <seconds>``: the wall time of the
training loop alone (from after the first steps to the end) and the CPU time its process (every thread of it: the
bridge's too) spent meanwhile; then it exits with ``os._exit(0)`` after ``destroy_process_group``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 1),
    )  # fmt: skip
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    started = cpu = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            started, cpu = time.perf_counter(), time.process_time()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(torch.randn(args.batch, 8)), torch.randn(args.batch, 1))
        loss.backward()
        optimizer.step()
    loop, cpu = time.perf_counter() - started, time.process_time() - cpu
    sys.stdout.write(f"steps_worker rank {dist.get_rank()} loop {loop:.4f} cpu {cpu:.4f}\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
