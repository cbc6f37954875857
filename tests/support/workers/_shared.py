"""What the worker scripts here share, as real training scripts would share a small library: the go file their
ranks agree on, a model whose forward sleeps (the work of a step), a step that torch's own metrics time, the
process's resident memory, and how a worker ends after gloo. The framework workers' settings are in
``_framework.py``.

A worker imports it as a sibling (``from _shared import ...``: the folder of a script run by path is first on its
``sys.path``), so no ``PYTHONPATH`` is needed; a test imports it as ``tests.support.workers._shared``. Nothing here
imports the bridge, except ``flush_and_exit`` (a bridged worker's last words, as ``torchrun_worker.py`` documents);
torch is imported where it is used, after a worker has parsed its arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any


def add_go_options(parser: argparse.ArgumentParser, max_steps: int) -> None:
    """``--min-steps``, ``--max-steps`` (a harness bug still ends the job), ``--check-every`` and ``--go`` (the file
    whose appearance stops the job)."""
    parser.add_argument("--min-steps", type=int, default=20)
    parser.add_argument("--max-steps", type=int, default=max_steps)
    parser.add_argument("--check-every", type=int, default=10)
    parser.add_argument("--go", required=True)


def go_given(step: int, args: argparse.Namespace) -> bool:
    """Every ``--check-every`` steps from ``--min-steps`` on, whether any rank sees the ``--go`` file: an all-reduce
    of a flag, so that every rank gets the same answer at the same step."""
    if step < args.min_steps or step % args.check_every:
        return False
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if os.path.exists(args.go) else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0


def sleepy_model(width: int, seconds: float) -> Any:
    """A 2-layer model (``width`` features in, one out) whose forward sleeps ``seconds``: the work of a step."""
    import time

    import torch

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = torch.nn.Linear(width, width)
            self.out = torch.nn.Linear(width, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(seconds)
            return self.out(torch.relu(self.hidden(x)))

    return Model()


def timed_all_reduce() -> Callable[[float], float]:
    """``train_step(value)``: an all-reduce of one value, timed by torch's own ``@metrics.prof(group="trainer")``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.elastic import metrics

    @metrics.prof(group="trainer")
    def train_step(value: float) -> float:
        tensor = torch.tensor([value])
        dist.all_reduce(tensor)
        return float(tensor.item())

    return train_step


def vm_rss() -> int:
    """This process's resident memory in bytes (``VmRSS`` of ``/proc/self/status``)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def exit_after_gloo() -> None:
    """Leave the process group and exit 0 with the output flushed (``os._exit``: after gloo use the interpreter may
    abort at exit)."""
    import torch.distributed as dist

    sys.stdout.flush()
    dist.destroy_process_group()
    sys.stderr.flush()
    os._exit(0)


def flush_and_exit() -> None:
    """A bridged worker's end: the bridge's telemetry flushed, then the output, then ``os._exit(0)``."""
    import torchelastic_otel

    torchelastic_otel.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
