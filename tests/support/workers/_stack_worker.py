"""A torchrun worker for the stack tests (``tests/stack/test_stack_*.py``) that stays alive until the test says so.

It trains a tiny model on CPU with torch's own elastic APIs, as a real training script does, so the bridge
(installed in the worker by the agent) exports it:

- ``@metrics.prof(group="trainer")`` on ``train_step`` (-> ``torchelastic_function_calls_total`` /
  ``torchelastic_function_duration_seconds`` with ``function="__main__.train_step"``);
- ``metrics.put_metric("loss", ..., "trainer")`` (a gauge) and ``metrics.put_metric("samples_total", 16, "trainer")``
  (a counter) every step;
- an event ``trainer.started``, and a span ``trainer.step`` per step with a ``trainer.step`` event (the ``otel``
  destination: a log record and a span event).

After its steps the worker writes what it put (``ready-r{restart}-rank{rank}.json`` in ``--flag-dir``: the last
loss, the samples and steps) and then waits -- at most ``--wait`` seconds -- for the file ``go-r{restart}`` in the
same directory, so that a Prometheus server can scrape it meanwhile. Then a failing rank (``--fail-always-rank``, or
``--fail-once-rank`` in the first attempt) raises; the others flush and end with ``os._exit(0)`` (after torch use the
interpreter may abort at exit).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from _shared import flush_and_exit
from opentelemetry import trace
from torch.distributed.elastic import events, metrics
from torch.distributed.elastic.multiprocessing.errors import record

BATCH = 16


def _wait_for_file(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.05)
    return path.exists()


@metrics.prof(group="trainer")
def train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor, target: torch.Tensor
) -> float:
    """One SGD step; ``@prof`` names it ``__main__.train_step``."""
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(batch), target)
    loss.backward()
    optimizer.step()
    return float(loss.item())


def main(argv: list[str] | None = None) -> None:
    record(_main)(argv)


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--flag-dir", required=True)
    parser.add_argument("--wait", type=float, default=60.0, help="longest wait for the go file, seconds")
    parser.add_argument("--fail-once-rank", type=int, default=-1)
    parser.add_argument("--fail-always-rank", type=int, default=-1)
    args = parser.parse_args(argv)

    rank = int(os.environ["RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    flag_dir = Path(args.flag_dir)

    torch.manual_seed(rank)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    events.record(
        events.Event("trainer.started", events.EventSource.WORKER, metadata={"rank": rank, "restart": restart}),
        destination="otel",
    )
    tracer = trace.get_tracer("stack_worker")
    loss = 0.0
    for step in range(args.steps):
        with tracer.start_as_current_span("trainer.step", attributes={"step": step, "rank": rank}):
            loss = train_step(model, optimizer, torch.randn(BATCH, 8), torch.randn(BATCH, 1))
            metrics.put_metric("loss", loss, "trainer")
            metrics.put_metric("samples_total", BATCH, "trainer")
            events.record(
                events.Event("trainer.step", events.EventSource.WORKER, metadata={"step": step, "loss": loss}),
                destination="otel",
            )

    report = {
        "rank": rank,
        "restart": restart,
        "loss": loss,
        "samples": BATCH * args.steps,
        "steps": args.steps,
        "pid": os.getpid(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
    }
    tmp = flag_dir / f".ready-r{restart}-rank{rank}.json.tmp"
    tmp.write_text(json.dumps(report))
    tmp.replace(flag_dir / f"ready-r{restart}-rank{rank}.json")

    _wait_for_file(flag_dir / f"go-r{restart}", args.wait)

    if rank == args.fail_always_rank or (rank == args.fail_once_rank and restart == 0):
        raise RuntimeError(f"stack worker rank {rank} failed (restart {restart})")

    flush_and_exit()


if __name__ == "__main__":
    main()
