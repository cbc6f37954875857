"""A worker of ``many_runs_launcher.py``'s launches: gloo, ``init_process_group``, one ``all_reduce``; with the
argument ``fail``, rank 1 then exits with code 3 (its launch fails)."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
assert int(total.item()) == dist.get_world_size(), total
dist.destroy_process_group()
if sys.argv[1:] == ["fail"] and os.environ["RANK"] == "1":
    sys.exit(3)
