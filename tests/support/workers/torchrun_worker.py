"""A tiny torchrun worker for ``tests/jobs/test_torchrun.py`` (CPU, gloo), using torch's own elastic APIs.

It does what a real training script does with torch's telemetry APIs, so the tests can check that the bridge
(installed in the worker at start-up by the agent) exports it:

- ``torch.distributed.init_process_group("gloo")`` and an ``all_reduce`` per step;
- ``torch.distributed.elastic.metrics.put_metric("worker.loss", ..., "trainer")`` and a ``@metrics.prof(group=
  "trainer")`` function;
- ``torch.distributed.elastic.events.record(Event("trainer.step", EventSource.WORKER, ...), "otel")``;
- a span ``worker.step`` from the global OpenTelemetry tracer provider (set by the bridge).

Options: ``--steps N``, ``--fail-once-rank R`` (rank R raises in the first attempt only,
``TORCHELASTIC_RESTART_COUNT == 0``), ``--fail-always-rank R``. A failing rank raises a ``RuntimeError`` (its
message names the rank and the restart count); torch's ``@record`` writes it to the error file the agent reads,
and the bridge's excepthook exports and flushes it. A worker that
finishes flushes explicitly and ends with ``os._exit(0)``: after gloo use the interpreter may abort at exit.
"""

from __future__ import annotations

import argparse
import os

from _shared import flush_and_exit, timed_all_reduce


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.errors import record as record_errors

    # torch's @record writes the error file the agent reads (its FAILED events carry the error from it).
    record_errors(_main)(argv)


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fail-once-rank", type=int, default=-1)
    parser.add_argument("--fail-always-rank", type=int, default=-1)
    args = parser.parse_args(argv)

    import torch.distributed as dist
    from opentelemetry import trace
    from torch.distributed.elastic import events, metrics

    train_step = timed_all_reduce()

    rank = int(os.environ["RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    failing = rank == args.fail_always_rank or (rank == args.fail_once_rank and restart == 0)

    dist.init_process_group("gloo")
    try:
        tracer = trace.get_tracer("torchrun_worker")
        for step in range(args.steps):
            with tracer.start_as_current_span("worker.step", attributes={"step": step, "rank": rank}):
                loss = train_step(1.0 / (step + 1))
                metrics.put_metric("worker.loss", int(loss * 1000), "trainer")
                events.record(
                    events.Event(
                        "trainer.step",
                        events.EventSource.WORKER,
                        metadata={"rank": rank, "step": step, "restart": restart},
                    ),
                    "otel",
                )
        if failing:
            # Raised outside the span on purpose: the bridge's excepthook must report it on its own.
            raise RuntimeError(f"torchrun_worker rank {rank} failed (restart {restart})")
    finally:
        dist.destroy_process_group()

    flush_and_exit()


if __name__ == "__main__":
    main()
