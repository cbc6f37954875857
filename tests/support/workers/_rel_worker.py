"""A torchrun worker for the reliability tests (``tests/*/test_reliability_*.py``), CPU only, using torch's own APIs.

The bridge is installed in the worker by the agent (``torchelastic-otel run``). Lines ``REL_MARK <name> k=v ...``
on stdout tell the test what the worker did and when (``t`` is ``time.monotonic()``, comparable across the
processes of one machine).

Modes (``--mode``):

- ``steps``: gloo, ``--steps`` all-reduce steps with an event, a metric and a ``@prof`` call each, like a training
  loop; then ``REL_MARK done``, ``torchelastic_otel.flush()`` and ``os._exit(0)`` (after gloo, the interpreter may
  abort at exit).
- ``faults``: no collective. Rank 0 records a heartbeat event ``rel.heartbeat`` {seq} every 20 ms (each printed
  after it was recorded) until the agent stops it with SIGTERM (bounded: 60 s). Rank 1 records ``rel.early``
  {seq} events and a counter, waits ``--quiet`` seconds, records ``rel.late`` events and dies, depending on the
  attempt (``TORCHELASTIC_RESTART_COUNT``): 0 raises ``RuntimeError`` (torch's ``@record`` writes the error file,
  the bridge's excepthook exports and flushes), 1 ``os._exit(1)`` without any flush, 2 SIGKILLs itself.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from _shared import timed_all_reduce

EARLY = 5


def mark(name: str, **fields: object) -> None:
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    # one write per line: the workers share the agent's stdout, and print() writes the newline separately
    sys.stdout.write(f"REL_MARK {name} t={time.monotonic():.6f} pid={os.getpid()} {text}\n")
    sys.stdout.flush()


def steps(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.distributed.elastic import events, metrics

    train_step = timed_all_reduce()

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    for step in range(args.steps):
        loss = train_step(1.0 / (step + 1))
        metrics.put_metric("worker.loss", int(loss * 1000), "trainer")
        events.record(
            events.Event("trainer.step", events.EventSource.WORKER, metadata={"rank": rank, "step": step}), "otel"
        )
    dist.destroy_process_group()
    mark("done", rank=rank)
    import torchelastic_otel

    ok = torchelastic_otel.flush()
    mark("flushed", rank=rank, ok=ok)
    sys.stdout.flush()
    os._exit(0)


def faults(args: argparse.Namespace) -> None:
    from torch.distributed.elastic import events, metrics

    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def record(name: str, seq: int) -> None:
        events.record(
            events.Event(name, events.EventSource.WORKER, metadata={"rank": rank, "attempt": attempt, "seq": seq}),
            "otel",
        )

    if rank == 0:
        deadline = time.monotonic() + 60
        seq = 0
        while time.monotonic() < deadline:  # until the agent's SIGTERM
            record("rel.heartbeat", seq)
            mark("recorded", rank=rank, attempt=attempt, seq=seq)
            seq += 1
            time.sleep(0.02)
        raise SystemExit("rank 0 was never stopped")

    for seq in range(EARLY):
        record("rel.early", seq)
        metrics.put_metric("rel.early.count", 1, "rel")
    mark("early", rank=rank, attempt=attempt)
    time.sleep(args.quiet)  # longer than the drain interval + the batch delay: the early records are exported
    for seq in range(3):
        record("rel.late", seq)
    mark("dying", rank=rank, attempt=attempt)
    if attempt == 0:
        raise RuntimeError(f"rel_worker rank {rank} failed in attempt {attempt}")
    if attempt == 1:
        os._exit(1)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["steps", "faults"], default="steps")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--quiet", type=float, default=1.5)
    args = parser.parse_args()
    if args.mode == "steps":
        steps(args)
    else:
        from torch.distributed.elastic.multiprocessing.errors import record as record_errors

        # torch's @record writes the error file the agent reads: its failure event carries the error from it
        record_errors(faults)(args)


if __name__ == "__main__":
    main()
