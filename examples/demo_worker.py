"""The training script of ``make demo``: a small DDP job on CPU (gloo) with its own telemetry, and one failure.

``examples/demo.py`` runs it under ``torchelastic-otel run`` with 2 workers and ``--max-restarts 1``. It uses only
torch's and OpenTelemetry's own APIs -- the bridge needs no change to it:

- metrics with torch's ``torch.distributed.elastic.metrics``: ``@prof`` on the training step (``train_ddp.py``'s),
  ``put_metric`` of the loss (a gauge), the samples seen (``samples_total``: a counter) and the step time
  (``step_time_ms``: a histogram);
- events with torch's ``events.record(Event(...), destination="otel")``: ``trainer.started``,
  ``checkpoint.saved``, ``trainer.finished``;
- spans with OpenTelemetry's API: ``train`` around the loop and ``train.step`` for each step, children of the
  attempt the agent started the worker in;
- output: a line per few steps on stdout, Python ``logging`` on stderr.

``--fail-once-rank R`` makes rank R fail at step ``--fail-at`` of the first attempt only (``ValueError``: a bad
batch), so the agent restarts the group and the second attempt succeeds.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch
import torch.distributed as dist
from opentelemetry import trace
from torch.distributed.elastic import events, metrics
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_ddp import train_step  # the @prof-decorated step of the other example

log = logging.getLogger("demo.trainer")
tracer = trace.get_tracer("demo.trainer")


def record(name: str, **metadata: object) -> None:
    events.record(events.Event(name, events.EventSource.WORKER, metadata=dict(metadata)), destination="otel")


def train(args: argparse.Namespace, rank: int, restart: int) -> None:
    torch.manual_seed(rank)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    weights = torch.randn(16, 1)
    record("trainer.started", rank=rank, restart=restart, steps=args.steps)
    with tracer.start_as_current_span("train", attributes={"rank": rank, "restart": restart}):
        for step in range(args.steps):
            with tracer.start_as_current_span("train.step", attributes={"step": step}):
                started = time.perf_counter()
                batch = torch.randn(args.batch, 16)
                if rank == args.fail_once_rank and restart == 0 and step == args.fail_at:
                    log.error("rank %d: batch %d holds NaN inputs", rank, step)
                    raise ValueError(f"batch {step} of rank {rank} holds NaN inputs (simulated data corruption)")
                loss = train_step(model, optimizer, batch, batch @ weights)
                metrics.put_metric("loss", loss, "trainer")
                metrics.put_metric("samples_total", args.batch, "trainer")
                metrics.put_metric("step_time_ms", (time.perf_counter() - started) * 1000, "trainer")
            if step % 10 == 0:
                print(f"rank {rank} restart {restart} step {step} loss {loss:.4f}", flush=True)
            if step and step % args.checkpoint_every == 0:
                record("checkpoint.saved", rank=rank, step=step)
                log.info("rank %d: checkpoint at step %d", rank, step)
            time.sleep(args.pause)
    record("trainer.finished", rank=rank, restart=restart, steps=args.steps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--fail-once-rank", type=int, default=-1)
    parser.add_argument("--fail-at", type=int, default=25)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--pause", type=float, default=0.03, help="seconds between steps (a data loader's wait)")
    parser.add_argument("--checkpoint-every", type=int, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    dist.init_process_group("gloo")
    rank, restart = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    train(args, rank, restart)
    dist.destroy_process_group()
    # torch 2.13 with gloo aborts at interpreter exit now and then ("terminate called without an active
    # exception"), which would count as a second failure: deliver the telemetry, then leave at once.
    import torchelastic_otel

    torchelastic_otel.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
