"""The worker of bench/bench_failonce_stretches.py: the GPU fail-once job (``tests/support/workers/gpu_worker.py``,
``GPU_MODE=failonce``) on CPU tensors, saying when it got where. Knows nothing of the bridge.

2 ranks, gloo: ``init_process_group``, then 60 steps of an all-reduce of 65,536 floats; in the first attempt
(``TORCHELASTIC_RESTART_COUNT`` 0) rank 1 raises at step 20, so rank 0 is in an all-reduce when its peer dies
(gloo raises in it, or the agent's SIGTERM comes first); the next attempt runs its 60 steps and returns.

With ``--cuda`` the all-reduced tensor is on the rank's GPU (ranks share the GPUs there are) and each step waits
for it (``torch.cuda.synchronize``), as the GPU job does; ``cuda`` is stamped once CUDA is initialised.

With ``--records`` it records like a script that uses torch's elastic APIs (an event to the "otel" destination and a
metric at its start, a metric a step), so that a bridged worker has something of its own to export and flush.

Each stage prints one line ``STAMP <stage> rank=R attempt=A t=<time.time()>``: ``process`` (the process's start,
from ``/proc/self/stat``, 10 ms resolution), ``first_line`` (taken before any import), ``imported`` (torch and
``torch.distributed``), ``initialized`` (``init_process_group`` returned), ``first_step``, ``raise`` (rank 1, attempt
0), ``last_step`` and ``end`` (after ``destroy_process_group``); with ``cpu=``, the process's CPU seconds then
(``time.process_time()``: every thread's, the bridge's included).
"""

from __future__ import annotations

import time

FIRST_LINE, FIRST_CPU = time.time(), time.process_time()

import os  # noqa: E402
import sys  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
RECORDS = "--records" in sys.argv[1:]
CUDA = "--cuda" in sys.argv[1:]
STEPS = 60


def stamp(stage: str, seconds: float | None = None, cpu: float | None = None) -> None:
    """One line (one write: the workers share the agent's stdout): the stage, when, and the process's CPU seconds
    so far (all its threads)."""
    at = time.time() if seconds is None else seconds
    used = time.process_time() if cpu is None else cpu
    sys.stdout.write(f"STAMP {stage} rank={RANK} attempt={ATTEMPT} t={at:.6f} cpu={used:.6f}\n")
    sys.stdout.flush()


def process_start() -> float | None:
    """The process's start, as the kernel has it (clock ticks since boot), on ``time.time()``'s clock."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError):
        return None


def main() -> None:
    started = process_start()
    if started is not None:
        stamp("process", started, 0.0)
    stamp("first_line", FIRST_LINE, FIRST_CPU)
    import torch
    import torch.distributed as dist
    from torch.distributed.elastic import events, metrics

    stamp("imported")
    if RECORDS:
        events.record(events.Event("bench.stamped.started", events.EventSource.WORKER, metadata={"rank": RANK}), "otel")
        metrics.put_metric("bench.stamped.attempts", 1, "bench")
    device = "cpu"
    if CUDA:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
        torch.ones(1, device=device)  # the context, before the process group
        stamp("cuda")
    dist.init_process_group("gloo")
    stamp("initialized")
    x = torch.ones(1 << 16, device=device)
    for step in range(STEPS):
        dist.all_reduce(x)
        x.div_(2)
        if CUDA:
            torch.cuda.synchronize()
        if RECORDS:
            metrics.put_metric("bench.stamped.step", step, "bench")
        if step == 0:
            stamp("first_step")
        if ATTEMPT == 0 and RANK == 1 and step == 20:
            stamp("raise")
            raise RuntimeError("rank 1 fails once")
    stamp("last_step")
    dist.destroy_process_group()
    stamp("end")


if __name__ == "__main__":
    main()
