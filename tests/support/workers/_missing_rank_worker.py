"""A 4-rank job on CPU (gloo) where rank 1 never comes to a collective: it stays in Python (sleeping) while ranks 0,
2 and 3 wait for it inside ``dist.all_reduce``.

Used by ``tests/stack/test_stall_missing_rank.py``. A plain training script, unaware of the bridge (torch's APIs only).
All ranks train ``--steps`` DDP steps (``--step-seconds`` each); then rank 1 sleeps until the file ``--go`` exists
(bounded by ``--max-wait``) and raises ``RuntimeError`` -- a rank that hung, then crashed -- while the others are
blocked in an ``all_reduce`` of the default group (in gloo's C++). The job's collective timeout (``--timeout``) is
set above the whole wait: nothing but rank 1's failure ends it. The lines where ranks wait carry marker comments
(``# BLOCKS: <name>``) so the tests can find their numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta


def _say(rank: int, text: str) -> None:
    sys.stdout.write(f"missing_rank_worker rank {rank}: {text}\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--go", required=True)
    parser.add_argument("--max-wait", type=float, default=150.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        time.sleep(args.step_seconds)
    if rank == 1:
        _say(rank, "about to sleep")
        deadline = time.monotonic() + args.max_wait
        # one line: wherever the stack is taken (the sleep, the check), it is this one
        # fmt: off
        while not os.path.exists(args.go) and time.monotonic() < deadline: time.sleep(0.2)  # noqa: E701  # BLOCKS: sleep
        # fmt: on
        _say(rank, "raising RuntimeError")
        raise RuntimeError("rank 1 never came to the all_reduce")
    t = torch.ones(1)
    _say(rank, "about to block in all_reduce")
    dist.all_reduce(t)  # BLOCKS: all_reduce
    _say(rank, "all_reduce returned (unexpected)")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
