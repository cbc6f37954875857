"""A tiny ``accelerate`` training script for ``tests/jobs/test_accelerate.py``: what a user runs with
``accelerate launch``, never importing the bridge.

``Accelerator()`` (on a CPU-only machine the launch sets ``ACCELERATE_USE_CPU=1``: gloo), a tiny linear model,
random data, ``accelerator.backward`` and an optimizer step for ``ACCEL_STEPS`` steps (default 3). It prints one
line a rank when it starts (with the world size it sees) and one when it is done, so that the bridged and plain
runs' consoles can be compared.

An injected failure: where ``ACCEL_FAIL_RANK`` names this rank and the marker file ``ACCEL_FAIL_MARKER`` does not
exist yet, the rank creates the marker (so that only the first attempt fails) and raises a ``RuntimeError`` after its
steps. torch's ``@record`` writes the error file the agent reads, as a ``torchrun`` script would.
"""

from __future__ import annotations

import os
import sys


def _should_fail(rank: int) -> bool:
    """Fail once: the first attempt of the named rank creates the marker, the next ones find it."""
    marker = os.environ.get("ACCEL_FAIL_MARKER", "")
    if not marker or os.environ.get("ACCEL_FAIL_RANK", "") != str(rank):
        return False
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _say(line: str) -> None:
    """One line in one write: ``print`` writes the text and its newline apart, and the ranks' lines interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _train() -> None:
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    rank = accelerator.process_index
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    _say(f"accelerate_worker rank {rank} of {accelerator.num_processes} on {accelerator.device.type} starts")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(int(os.environ.get("ACCEL_STEPS", "3"))):
        inputs, targets = torch.randn(4, 8), torch.randn(4, 1)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.wait_for_everyone()
    if _should_fail(rank):
        raise RuntimeError(f"accelerate_worker rank {rank} failed on purpose (restart {restart})")
    _say(f"accelerate_worker rank {rank} done")
    accelerator.end_training()


def main() -> None:
    from torch.distributed.elastic.multiprocessing.errors import record

    record(_train)()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
