"""A 4-rank DDP training job on CPU (gloo) with one slow rank: its forward takes half a step longer.

Used by ``tests/stack/test_straggler.py`` and ``tests/jobs/test_follow.py``. A plain training script, unaware of
the bridge (torch's APIs only): under synchronous DDP every rank's step takes the same time -- the fast ranks wait in
the gradient all-reduce for the slow one -- so step time alone cannot name it.

Each rank's forward sleeps ``--base`` seconds (the work of a step); rank ``--slow-rank`` sleeps ``--extra`` more.
Every ``--check-every`` steps from ``--min-steps`` on, the ranks agree (an all-reduce of a flag) whether the file
``--go`` exists: then they stop together (at most ``--max-steps``, so a harness bug ends the job) -- or, with
``--died FILE``, the slow rank writes the time it dies (``time.time_ns()``, its own clock) to ``FILE`` and raises
``ValueError("corrupt batch N")``, and the other rank enters the next step's all-reduce, which its peer never joins.
At the end each rank prints ``straggler_worker rank R: steps N, median step S ms`` and exits 0 (``os._exit`` after
``destroy_process_group``: after gloo use the interpreter may abort at exit).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from _shared import add_go_options, exit_after_gloo, go_given, sleepy_model


def load_batch(step: int) -> None:
    raise ValueError(f"corrupt batch {step}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=float, default=0.2)
    parser.add_argument("--extra", type=float, default=0.1)
    parser.add_argument("--slow-rank", type=int, default=2)
    add_go_options(parser, max_steps=600)
    parser.add_argument("--died", help="the slow rank dies on --go, writing when to this file")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    delay = args.base + (args.extra if rank == args.slow_rank else 0.0)  # the slow rank's forward takes longer

    torch.manual_seed(0)
    model = DDP(sleepy_model(64, delay))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ends: list[float] = []
    step = 0
    while step < args.max_steps:
        if go_given(step, args):
            if args.died is None:
                break
            if rank == args.slow_rank:
                with open(args.died, "w") as out:
                    out.write(str(time.time_ns()))
                load_batch(step)
        optimizer.zero_grad()
        loss = model(torch.randn(16, 64)).pow(2).mean()
        loss.backward()
        optimizer.step()
        ends.append(time.monotonic())
        step += 1
    durations = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    median = statistics.median(durations) * 1000 if durations else 0.0
    sys.stdout.write(f"straggler_worker rank {rank}: steps {step}, median step {median:.1f} ms\n")
    exit_after_gloo()


if __name__ == "__main__":
    main()
