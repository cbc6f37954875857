"""A torchrun worker whose group fails: one rank raises, the others are inside a gloo collective (CPU).

Used by ``tests/jobs/test_root_cause.py``. A plain training script, unaware of the bridge (torch's APIs only). Every
rank joins the gloo group and does one ``all_reduce``. Then the rank ``--fail-rank`` prints a line to stdout and one to
stderr, logs a warning and raises ``ValueError("corrupt batch 7")`` from ``load_batch``; every other rank enters a
second ``all_reduce`` that cannot complete without it, so it is blocked in C++ when its peer dies: gloo then raises in
it (a consequence), or its agent stops it with SIGTERM. With ``--record`` the entry point is decorated with torch's
``@record`` (torch then writes the error file torchrun ranks failures by); with ``--destroy`` every rank destroys its
process group in a ``finally`` block, so the failing rank's peers lose it before its exception reaches the excepthook.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def load_batch(index: int) -> None:
    raise ValueError(f"corrupt batch {index}")


def train(fail_rank: int, destroy: bool) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        steps(fail_rank)
    finally:
        if destroy:  # the common tidy exit: the failing rank closes its connections before its excepthook runs
            dist.destroy_process_group()


def steps(fail_rank: int) -> None:
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    tensor = torch.ones(1)
    dist.all_reduce(tensor)  # everyone is in
    if rank == fail_rank:
        print(f"rank {rank}: about to load batch 7", flush=True)
        print(f"rank {rank}: batch 7 checksum mismatch", file=sys.stderr, flush=True)
        logging.getLogger("trainer").warning("rank %d: giving up on batch 7", rank)
        load_batch(7)
    print(f"rank {rank}: waiting in all_reduce", flush=True)
    dist.all_reduce(tensor)  # blocks in gloo: the failing rank never joins
    print(f"rank {rank}: unexpectedly done", flush=True)
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--destroy", action="store_true", help="destroy the process group in a finally block")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    if args.record:
        from torch.distributed.elastic.multiprocessing.errors import record

        record(train)(args.fail_rank, args.destroy)
    else:
        train(args.fail_rank, args.destroy)


if __name__ == "__main__":
    main()
