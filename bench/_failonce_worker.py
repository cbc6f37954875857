"""The worker of bench/bench_job.py's fail-once job: 2 ranks, ``--max-restarts 1``; knows nothing of the bridge.

Each attempt (``TORCHELASTIC_RESTART_COUNT``) starts by recording an event (destination "otel") and a metric through
torch's own APIs, so that a bridged worker has something to flush when it ends. Attempt 0: rank 1 exits 1 before
``init_process_group``, so rank 0 is still blocked inside gloo's ``init_process_group`` (native code, waiting for
rank 1) when the agent stops it with SIGTERM. Attempt 1: both ranks join, run a few all-reduce steps (a metric
each), record a "finished" event, destroy the group and leave with ``os._exit(0)`` after flushing stdout (after
gloo, the interpreter may abort at exit).

With ``--silent`` it records nothing at all (the common training script, as in issue 15: a bridged worker then
has nothing of its own to flush; what it says goes through its final words and its output).

Lines ``FAILONCE <what> rank=R attempt=A`` on stdout say how far each worker got.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic import events, metrics

STEPS = 5


def mark(what: str, rank: int, attempt: int) -> None:
    # one write per line: the workers share the agent's stdout
    sys.stdout.write(f"FAILONCE {what} rank={rank} attempt={attempt}\n")
    sys.stdout.flush()


SILENT = "--silent" in sys.argv[1:]


def record(name: str, rank: int, attempt: int) -> None:
    if SILENT:
        return
    event = events.Event(name, events.EventSource.WORKER, metadata={"rank": rank, "attempt": attempt})
    events.record(event, "otel")


def main() -> None:
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    record("bench.failonce.started", rank, attempt)
    if not SILENT:
        metrics.put_metric("bench.failonce.attempts", 1, "bench")
    if attempt == 0 and rank == 1:
        mark("failing", rank, attempt)
        sys.exit(1)
    mark("init", rank, attempt)
    dist.init_process_group("gloo")  # attempt 0, rank 0: blocked here until the agent's SIGTERM
    for step in range(STEPS):
        tensor = torch.tensor([float(step + rank)])
        dist.all_reduce(tensor)
        if not SILENT:
            metrics.put_metric("bench.failonce.sum", int(tensor.item()), "bench")
    record("bench.failonce.finished", rank, attempt)
    dist.destroy_process_group()
    mark("done", rank, attempt)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
