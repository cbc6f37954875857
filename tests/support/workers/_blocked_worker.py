"""A torchrun worker that the agent has to SIGTERM while it is blocked in native code (CPU, gloo).

Used by ``tests/jobs/test_worker_sigterm.py``. It is a plain training script, unaware of the bridge (it never imports
``torchelastic_otel``): it uses torch's own APIs only. Before blocking, every rank records a
``trainer.before_block`` event (``torch.distributed.elastic.events.record``) and a ``worker.before_block`` metric
(``torch.distributed.elastic.metrics.put_metric``) and prints a line; then it blocks where real ranks block when a
peer dies -- in C++, where CPython's Python-level signal handlers cannot run:

``--mode init`` (2 ranks, ``--max-restarts 1``)
    first attempt (``TORCHELASTIC_RESTART_COUNT == 0``): rank 1 exits 1 *before* ``init_process_group``, so rank 0
    waits inside ``dist.init_process_group("gloo")`` for a peer that never comes until the agent SIGTERMs it (with
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` rank 0 hosts the job's ``TCPStore``, whose constructor waits in C++ for
    every rank to connect).
    Second attempt: both ranks init, do one ``all_reduce`` and exit 0.

``--mode allreduce`` (4 ranks, ``--max-restarts 0``)
    all ranks init and create ``g = dist.new_group([0, 2])``; rank 0 calls ``dist.all_reduce(t, group=g)``, which
    blocks in gloo because rank 2 never joins; rank 1 raises a ``RuntimeError``; rank 2 is a slow rank stuck in C++
    too: it waits for a key of a TCP store of its own that nobody sets (so its wait depends on no other rank);
    rank 3 is a slow rank in Python (``time.sleep``). Rank 1's death does not touch the sockets of the {0, 2} group,
    so nothing but the agent's SIGTERM ends ranks 0 and 2. (With a world ``all_reduce`` gloo notices the dead peer
    itself and raises: nothing left to test.)

    Why rank 0's peer in ``g`` must not be the Python sleeper: a rank in ``time.sleep`` runs a Python SIGTERM
    handler at once and dies; its death closes the {0, 2} sockets, gloo raises in rank 0's ``all_reduce``, rank 0
    is back in the interpreter and its Python handler runs too -- so rank 0 ended quickly even with the old
    Python-only handler, and the job could not tell the fix from the bug.

The lines where ranks block carry marker comments (``# BLOCKS: <name>``) so the tests can find their numbers.

Rank 1 fails only once the others are inside their blocking call, so the agent's SIGTERM never races a rank's
start-up (a fixed sleep would, on a loaded machine). It learns that through the job's TCP store at
``MASTER_ADDR:MASTER_PORT``, the store ``init_process_group`` uses:

- ``init``: with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (the tests' setting) rank 0 itself starts that store as
  the first step of ``init_process_group``: rank 1 connecting to it at all means rank 0 is inside. When torch
  shares the agent's store instead (``TORCHELASTIC_USE_AGENT_STORE=True``) rank 0 sets a key right before the call;
- ``allreduce``: ranks 0, 2 and 3 set a key right before their blocking call.

Rank 1 then waits another half second (rank 0 gets from the Python call into the C++ wait) and fails.

A rank that finishes flushes stdout and ends with ``os._exit(0)`` after ``destroy_process_group()``: after gloo use
the interpreter may abort at exit. Option ``--events-to`` is torch's event destination (``otel`` under the bridge;
plain torchrun has no such handler, the baseline passes ``null``, torch's default).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

STORE_TIMEOUT = timedelta(seconds=60)  # bounded: a harness bug fails the job instead of hanging it
SETTLE = 0.5  # seconds rank 1 waits after the others reached their blocking call


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.errors import record as record_errors

    # torch's @record writes the error file the agent reads for its failure report.
    record_errors(_main)(argv)


def _say(rank: int, restart: int, text: str) -> None:
    # One write per line: the ranks share the agent's output, print() would write the newline separately.
    sys.stdout.write(f"blocked_worker rank {rank} restart {restart}: {text}\n")
    sys.stdout.flush()


def _before_block(rank: int, restart: int, mode: str, what: str, destination: str) -> None:
    """What a rank records before it blocks (torch's own event and metric APIs)."""
    from torch.distributed.elastic import events, metrics

    metadata = {"rank": rank, "restart": restart, "mode": mode, "blocks_in": what}
    events.record(events.Event("trainer.before_block", events.EventSource.WORKER, metadata=metadata), destination)
    metrics.put_metric("worker.before_block", 1, "trainer")
    _say(rank, restart, f"about to block in {what}")


def _client_store():
    """A client of the job's TCP store (waits, bounded, until its server is up). Not counted as a worker."""
    import torch.distributed as dist

    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=STORE_TIMEOUT,
        wait_for_workers=False,
    )


def _marker(restart: int, rank: int) -> str:
    return f"blocked_worker/{restart}/rank{rank}/blocking"


def _agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _finish(rank: int, restart: int) -> None:
    import torch.distributed as dist

    dist.destroy_process_group()
    _say(rank, restart, "done")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _mode_init(rank: int, restart: int, destination: str) -> None:
    import torch
    import torch.distributed as dist

    if restart > 0:  # the second attempt: a healthy job
        dist.init_process_group("gloo")
        t = torch.ones(1)
        dist.all_reduce(t)
        _say(rank, restart, f"all_reduce -> {t.item()}")
        _finish(rank, restart)

    if rank == 1:
        _before_block(rank, restart, "init", "exit", destination)
        store = _client_store()  # with rank 0 hosting the store: it is up once rank 0 is in init_process_group
        if _agent_store():
            store.wait([_marker(restart, 0)])
        time.sleep(SETTLE)
        _say(rank, restart, "exiting 1 before init_process_group")
        sys.stdout.flush()
        sys.exit(1)

    _before_block(rank, restart, "init", "init_process_group", destination)
    if _agent_store():
        _client_store().set(_marker(restart, rank), "1")
    dist.init_process_group("gloo")  # BLOCKS: init
    _say(rank, restart, "init_process_group returned (unexpected in the first attempt)")
    _finish(rank, restart)


def _mode_allreduce(rank: int, restart: int, destination: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    g = dist.new_group([0, 2])
    store = _client_store()
    if rank == 1:
        _before_block(rank, restart, "allreduce", "raise", destination)
        store.wait([_marker(restart, 0), _marker(restart, 2), _marker(restart, 3)])
        time.sleep(SETTLE)
        _say(rank, restart, "raising RuntimeError")
        raise RuntimeError(f"blocked_worker rank {rank} failed (restart {restart})")
    if rank == 2:
        # A store of its own: nobody sets the key, and no other rank's death ends the wait (bounded by its timeout).
        local = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
        _before_block(rank, restart, "allreduce", "store_wait", destination)
        store.set(_marker(restart, rank), "1")
        local.wait(["blocked_worker/never"])  # BLOCKS: store_wait
        _say(rank, restart, "store wait returned (unexpected)")
        _finish(rank, restart)
    if rank == 3:
        _before_block(rank, restart, "allreduce", "sleep", destination)
        store.set(_marker(restart, rank), "1")
        time.sleep(120)  # BLOCKS: sleep
        _say(rank, restart, "slept (unexpected)")
        _finish(rank, restart)

    t = torch.ones(1)
    _before_block(rank, restart, "allreduce", "all_reduce", destination)
    store.set(_marker(restart, rank), "1")
    dist.all_reduce(t, group=g)  # BLOCKS: all_reduce
    _say(rank, restart, "all_reduce returned (unexpected)")
    _finish(rank, restart)


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("init", "allreduce"), required=True)
    parser.add_argument("--events-to", default="otel", help="torch's event destination")
    args = parser.parse_args(argv)

    rank = int(os.environ["RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    _say(rank, restart, f"pid {os.getpid()} started, mode {args.mode}")
    if args.mode == "init":
        _mode_init(rank, restart, args.events_to)
    else:
        _mode_allreduce(rank, restart, args.events_to)


if __name__ == "__main__":
    main()
