"""A 2-rank DDP training job on CPU (gloo) whose DataLoader waits a known share of every step.

Used by ``tests/stack/test_goodput_rule.py``. A plain training script, unaware of the bridge (torch's APIs only).
Each step takes a batch from a ``DataLoader`` (``num_workers=0``: the loop waits in ``__next__``) whose dataset sleeps
``--input`` seconds per batch, then a forward that sleeps ``--compute`` seconds (the work of a step), a backward and
an optimizer step. The job times its own steps and its own waits in ``next()``.

Every ``--check-every`` steps from ``--min-steps`` on, the ranks agree (an all-reduce of a flag) whether the file
``--go`` exists: then they stop together (at most ``--max-steps``, so a harness bug ends the job). At the end each
rank prints ``goodput_live rank R: steps N, input S s, steps T s`` -- the seconds it waited in ``next()`` and the
seconds of its steps (from its first input to its last optimizer step) -- and exits 0 (``os._exit`` after
``destroy_process_group``: after gloo use the interpreter may abort at exit).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", type=float, default=0.04)
    parser.add_argument("--compute", type=float, default=0.06)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--min-steps", type=int, default=20)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--check-every", type=int, default=10)
    parser.add_argument("--go", required=True)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    class SlowDataset(Dataset):
        """Random samples, each ``--input / --batch`` seconds to read."""

        def __len__(self) -> int:
            return 64 * args.batch

        def __getitem__(self, index: int) -> torch.Tensor:
            time.sleep(args.input / args.batch)
            return torch.randn(32)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = torch.nn.Linear(32, 32)
            self.out = torch.nn.Linear(32, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(args.compute)  # the forward's work
            return self.out(torch.relu(self.hidden(x)))

    torch.manual_seed(rank)
    model = DDP(Model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(), batch_size=args.batch, num_workers=0)
    waited = 0.0
    first = last = 0.0
    step = 0
    batches = iter(loader)
    while step < args.max_steps:
        if step >= args.min_steps and step % args.check_every == 0:
            flag = torch.tensor([1.0 if os.path.exists(args.go) else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                break
        began = time.monotonic()
        first = first or began
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(loader)
            batch = next(batches)
        waited += time.monotonic() - began
        optimizer.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        last = time.monotonic()
        step += 1
    sys.stdout.write(f"goodput_live rank {rank}: steps {step}, input {waited:.3f} s, steps {last - first:.3f} s\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
