"""A torchrun worker whose output the tests of ``tests/jobs/test_worker_output.py`` follow (CPU, gloo).

A plain training script, unaware of the bridge: it writes the way real ranks do -- ``print`` (torchrun runs workers
with ``python -u``: unbuffered), ``sys.stderr``, ``os.write`` on fd 1 as native code does, a child process that
inherits the fds, ``logging`` (configured, and not: then logging's last resort prints to stderr), a traceback --
and tells the tests, in a file of its own (``--probe-dir``; never the console), what its fds 1 and 2 are.

``--mode job`` (2 ranks)
    Rank 0 writes its lines, then blocks in gloo inside a collective call rank 1 never joins
    (``dist.new_group([0, 1])``: rank 0 waits in C++ for rank 1's address) until the agent SIGTERMs it. Rank 1
    waits until rank 0 is done writing (a key rank 0 sets in the job's TCP store, so the ranks' lines never
    interleave on the shared console and both runs print the same lines), writes its own, logs -- one record
    inside a span of its own, one with an exception -- and raises. Job exit code 1; rank 0 ends by SIGTERM.
``--mode flood`` (1 rank)
    ``--lines`` lines as fast as it can (or each after ``--work-us`` microseconds of computation), the eleventh
    ``--long`` characters long, then a last line ``output_worker flood done``; exits 0. Writes its wall time and
    the time it spent writing to the probe file.
``--mode terminal`` (1 rank)
    Imports torch as a training script does, writes a few lines on both streams and its probe; exits 0.

Every line the worker writes itself starts with ``output_worker rank <r> <stream> <n>:`` so a test can tell the
rank and stream of any console line, and is written whole, in one write: the ranks share the console, and
``print(text)`` under ``python -u`` writes the newline separately, so another rank's line could land in the middle
of it (in plain torchrun too: where that happens is timing, which the tests ignore). A rank that finishes ends with
``os._exit`` after flushing: after gloo use the interpreter may abort at exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from datetime import timedelta

STORE_TIMEOUT = timedelta(seconds=60)
RANK0_DONE = "output_worker/rank0/written"


def line(rank: int, stream: str, n: int, text: str) -> str:
    return f"output_worker rank {rank} {stream} {n}: {text}"


def _probe(directory: str | None, rank: int, **extra: object) -> None:
    """What the rank's fds 1 and 2 are, written to a file of its own (the console must stay the job's)."""
    if not directory:
        return
    try:
        size = list(os.get_terminal_size(1))
    except OSError:
        size = None
    data = {
        "pid": os.getpid(),
        "stdout_isatty": os.isatty(1),
        "stderr_isatty": os.isatty(2),
        "line_buffering": sys.stdout.line_buffering,
        "terminal_size": size,
        "captured": bool(os.environ.get("TORCHELASTIC_OTEL_WORKER_OUTPUT_READER")),
        **extra,
    }
    with open(os.path.join(directory, f"rank{rank}.json"), "w") as fh:
        json.dump(data, fh)


def _write_lines(rank: int) -> None:
    """What both ranks write: Python's streams, fd 1 directly, a child process, logging left unconfigured."""
    print(line(rank, "stdout", 0, "print") + "\n", end="")
    sys.stderr.write(line(rank, "stderr", 0, "sys.stderr") + "\n")
    os.write(1, (line(rank, "stdout", 1, "os.write on fd 1, as native code writes") + "\n").encode())
    subprocess.run(
        [
            "sh",
            "-c",
            f"echo '{line(rank, 'stdout', 2, 'child process')}'; echo '{line(rank, 'stderr', 1, 'child process')}' >&2",
        ],
        check=True,
    )
    # No handler configured: logging's last resort prints "<message>" to stderr, with or without the bridge.
    logging.getLogger("output_worker.unconfigured").warning(line(rank, "stderr", 2, "logging, unconfigured"))
    print(line(rank, "stdout", 3, "ünïcödé ✓ and a tab\there") + "\n", end="")


def _client_store():
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=STORE_TIMEOUT, wait_for_workers=False)  # fmt: skip


def _log_and_raise(rank: int) -> None:
    """Rank 1: logging configured by the script, a record in a span of its own, one with an exception."""
    from opentelemetry import trace

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("output_worker.trainer")
    log.info("rank %d: step %d done", rank, 7)
    with trace.get_tracer("output_worker").start_as_current_span("output_worker.step"):
        log.warning("rank %d: loss is %s", rank, "nan")
    try:
        raise ValueError("bad batch")
    except ValueError:
        log.error("rank %d: skipping a batch", rank, exc_info=True)
    print(line(rank, "stdout", 4, "about to raise") + "\n", end="")
    raise RuntimeError(f"output_worker rank {rank} failed")


def _mode_job(rank: int, probe_dir: str | None) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    _probe(probe_dir, rank)
    if rank == 0:
        _write_lines(rank)
        sys.stdout.write(line(rank, "stdout", 4, "blocking in new_group") + "\n")
        sys.stdout.flush()
        _client_store().set(RANK0_DONE, "1")
        dist.new_group([0, 1])  # BLOCKS: rank 1 never joins
        sys.stdout.write(line(rank, "stdout", 5, "new_group returned (unexpected)") + "\n")
        sys.stdout.flush()
        os._exit(3)
    _client_store().wait([RANK0_DONE])
    _write_lines(rank)
    _log_and_raise(rank)


def _mode_flood(rank: int, probe_dir: str | None, lines: int, work_us: float, long: int) -> None:
    """``lines`` lines, each after ``work_us`` microseconds of computation (a training loop that prints), or as
    fast as it can; the probe gets the wall time and the time spent writing."""
    write = sys.stdout.write
    clock = time.perf_counter
    work = work_us / 1e6
    started = clock()
    writing = 0.0
    for n in range(lines):
        if work:
            until = clock() + work
            while clock() < until:  # computation, not a sleep: the worker's own CPU time
                pass
        before = clock()
        write(line(rank, "stdout", n, "x" * long if n == 10 and long else "flood") + "\n")
        writing += clock() - before
    write("output_worker flood done\n")
    sys.stdout.flush()
    _probe(probe_dir, rank, seconds=clock() - started, write_seconds=writing)
    os._exit(0)


def _mode_terminal(rank: int, probe_dir: str | None) -> None:
    import torch  # noqa: F401 - what a training script does first (and its import warnings are the same)

    _probe(probe_dir, rank)
    print(line(rank, "stdout", 0, "on a terminal") + "\n", end="")
    sys.stderr.write(line(rank, "stderr", 0, "on a terminal") + "\n")
    print(line(rank, "stdout", 1, "done") + "\n", end="")
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("job", "flood", "terminal"), required=True)
    parser.add_argument("--probe-dir")
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--work-us", type=float, default=0.0)
    parser.add_argument("--long", type=int, default=0)
    args = parser.parse_args(argv)
    rank = int(os.environ["RANK"])
    if args.mode == "job":
        _mode_job(rank, args.probe_dir)
    elif args.mode == "flood":
        _mode_flood(rank, args.probe_dir, args.lines, args.work_us, args.long)
    else:
        _mode_terminal(rank, args.probe_dir)


if __name__ == "__main__":
    main()
