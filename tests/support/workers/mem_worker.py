"""A torchrun worker for the memory tests: a small DDP loop on gloo, one step every ``--step-seconds``, in which
``--leak-rank`` keeps ``--leak-mib`` MiB more each step (bytearrays written through, so every page is resident).

Every rank writes its own ground truth to ``--out``/rank<r>-restart<n>.jsonl, one JSON object a line:
``{"time_ns", "rss", "step"}``, read from ``/proc/self/status`` (``VmRSS``) after each step and once before the
first. A plain script: it never imports the bridge (its memory telemetry comes from the worker set-up alone).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from _shared import vm_rss
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--leak-rank", type=int, default=-1)
    parser.add_argument("--leak-mib", type=float, default=8.0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()

    rank, restart = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(rank)
    dist.init_process_group("gloo")
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    args.out.mkdir(parents=True, exist_ok=True)
    kept: list[bytearray] = []
    chunk = int(args.leak_mib * (1 << 20))
    with open(args.out / f"rank{rank}-restart{restart}.jsonl", "w") as fh:

        def note(step: int) -> None:
            fh.write(json.dumps({"time_ns": time.time_ns(), "rss": vm_rss(), "step": step}) + "\n")
            fh.flush()

        note(0)
        next_step = time.monotonic()
        for step in range(1, args.steps + 1):
            x = torch.randn(32, args.width)
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces the gradients
            optimizer.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            if rank == args.leak_rank:
                kept.append(bytearray(b"\x01") * chunk)  # written through: resident
            note(step)
            next_step += args.step_seconds
            time.sleep(max(0.0, next_step - time.monotonic()))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
