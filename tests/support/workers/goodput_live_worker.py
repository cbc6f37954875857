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
import sys
import time

from _shared import add_go_options, exit_after_gloo, go_given, sleepy_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", type=float, default=0.04)
    parser.add_argument("--compute", type=float, default=0.06)
    parser.add_argument("--batch", type=int, default=4)
    add_go_options(parser, max_steps=3000)
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

    torch.manual_seed(rank)
    model = DDP(sleepy_model(32, args.compute))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(), batch_size=args.batch, num_workers=0)
    waited = 0.0
    first = last = 0.0
    step = 0
    batches = iter(loader)
    while step < args.max_steps:
        if go_given(step, args):
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
    exit_after_gloo()


if __name__ == "__main__":
    main()
