"""A torchrun worker that checkpoints with ``torch.distributed.checkpoint``, for ``tests/jobs/test_checkpoints.py``
(CPU, gloo). Nothing in it knows about the bridge: its checkpoints become spans with no code change.

A tiny DDP model trains ``--steps`` optimizer steps; after every ``--every``-th one, ``dcp.save`` writes the model and
optimizer to ``<dir>/step<n>``; at the end ``dcp.load`` reads the last checkpoint back. The ground truth goes to
``<dir>/rank<r>.json``: per checkpoint its operation, the optimizer steps this rank had taken when it began (``step``)
and its directory; the test compares the bridge's spans with it.

Ends as ``torchrun_worker.py`` does: flush, then ``os._exit(0)`` (after gloo use the interpreter may abort at exit).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from _shared import flush_and_exit


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--every", type=int, default=2)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.nn.parallel import DistributedDataParallel

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    truth: list[dict[str, object]] = []
    taken = 0
    try:
        for _ in range(args.steps):
            optimizer.zero_grad()
            model(torch.randn(8, 16)).pow(2).mean().backward()
            optimizer.step()
            taken += 1
            if taken % args.every == 0:
                directory = args.dir / f"step{taken}"
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                truth.append({"operation": "save", "step": taken, "dir": str(directory)})
                dcp.save(state, checkpoint_id=directory)
        if truth:
            directory = Path(str(truth[-1]["dir"]))
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            truth.append({"operation": "load", "step": taken, "dir": str(directory)})
            dcp.load(state, checkpoint_id=directory)
        (args.dir / f"rank{rank}.json").write_text(json.dumps(truth))
    finally:
        dist.destroy_process_group()

    flush_and_exit()


if __name__ == "__main__":
    main()
