"""A training script that knows nothing of the bridge and records nothing before it fails (the common case).

Modes (``--mode``), each a way a real job fails while other ranks are somewhere a signal can find them:

- ``import``: rank 1 exits 1 at its first line, before importing torch (once rank 0's script has begun); rank 0
  is still starting (importing torch) or already in ``init_process_group`` waiting for rank 1 when the agent
  SIGTERMs it.
- ``allreduce``: the example of issue 15: rank 1 logs a warning and raises after ``init_process_group``; rank 0
  is in a world ``all_reduce`` (gloo raises in it, or the agent's SIGTERM comes first).
- ``subgroup``: 4 ranks; rank 1 raises; rank 0 blocks in ``all_reduce`` on the subgroup {0, 2} while rank 2 blocks
  in a TCP store wait (both in C++: no peer of theirs dies) and rank 3 in a world ``all_reduce``.
- ``excepthook``: rank 1 raises, and a timer thread SIGTERMs it 20 ms later: inside the bridge's excepthook and
  its flush; rank 0 in a world ``all_reduce``.
- ``failonce``: the job of the benchmark: in the first attempt rank 1 exits 1 at its first line and rank 0 is
  stopped while starting or in ``init_process_group``; the next attempt does one ``all_reduce`` and ends well.
- ``atexit``: rank 1 raises; rank 0 returns from ``main`` and SIGTERMs itself from an ``atexit`` handler of its own
  (which runs before the bridge's): a signal at interpreter exit.

Every rank prints one line before it blocks or fails, so the output shows how far it got.
"""

from __future__ import annotations

import argparse
import os
import sys

RANK = int(os.environ["RANK"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True)
    mode = parser.parse_args().mode
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if mode == "import":
        _rank_0_started()
    if mode == "import" and RANK == 1 or mode == "failonce" and RANK == 1 and first_attempt:
        sys.exit(1)  # before torch is even imported
    import logging
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    logging.basicConfig(level=logging.INFO)
    print(f"rank {RANK}: init_process_group", flush=True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    if mode == "subgroup":
        _subgroup(dist, torch)
        return
    print(f"line from rank {RANK}", flush=True)
    if RANK == 1 and mode != "failonce":
        logging.getLogger("trainer").warning("about to fail")
        if mode == "excepthook":
            _sigterm_soon(0.02)
        raise RuntimeError(f"boom on rank {RANK}")
    if mode == "atexit":
        _sigterm_at_exit()
        return
    dist.all_reduce(torch.ones(4))
    if mode == "failonce":
        dist.destroy_process_group()


def _rank_0_started() -> None:
    """Rank 0 says its script has begun; rank 1 waits for that (at most 30 s) before it fails, so rank 0 is stopped
    in the script (importing torch, in ``init_process_group``), not in the interpreter's start-up: on a loaded
    machine rank 1's whole life could otherwise pass before rank 0 ran a line of its own."""
    import tempfile
    import time

    flag = os.path.join(tempfile.gettempdir(), f"silent-worker-{os.environ.get('TORCHELASTIC_RUN_ID', '')}-started")
    if RANK == 0:
        open(flag, "w").close()
        return
    deadline = time.monotonic() + 30
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        os.unlink(flag)
    except OSError:
        pass


def _subgroup(dist, torch) -> None:  # type: ignore[no-untyped-def]
    group = dist.new_group([0, 2])
    print(f"rank {RANK}: blocking", flush=True)
    if RANK == 1:
        raise RuntimeError("boom on rank 1")
    if RANK == 0:
        dist.all_reduce(torch.ones(4), group=group)
    elif RANK == 2:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta_s(120)
        )
        store.wait(["never-set"])
    else:
        dist.all_reduce(torch.ones(4))


def timedelta_s(seconds: float):  # type: ignore[no-untyped-def]
    from datetime import timedelta

    return timedelta(seconds=seconds)


def _sigterm_soon(delay: float) -> None:
    import signal
    import threading

    threading.Timer(delay, os.kill, (os.getpid(), signal.SIGTERM)).start()


def _sigterm_at_exit() -> None:
    import atexit
    import signal

    print(f"rank {RANK}: exiting", flush=True)
    atexit.register(os.kill, os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    main()
