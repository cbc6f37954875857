"""A torchrun worker that starts Python processes of its own, as real ranks do (``tests/jobs/test_descendants.py``,
``bench/bench_descendants.py``). CPU, gloo, bridge-unaware.

Each step (``--steps``, comma-separated, in this order) is timed in the worker and every process it starts writes
what it imported to a probe (``--probe-dir``, never the console):

``subprocess``
    ``subprocess.run([sys.executable, "-c", ...])`` three times (``--runs``); the child prints one line to its
    inherited stdout and writes its probe (with ``--bare``: ``-c pass``, no probe).
``pool``
    ``multiprocessing.get_context("spawn").Pool(2).map(probe, range(4))`` (with ``--bare``: ``map(abs, [1, 2, 3,
    4])``, no probes), ``--pool-runs`` times (a new pool each time).
``dataloader``
    a ``DataLoader`` with ``num_workers=2`` and ``multiprocessing_context="spawn"`` over two epochs (a fresh pair
    of worker processes each epoch); each item is the probe of the process that loaded it.
``record``
    a child that records an event itself through ``torchelastic_otel.events.record(..., destination="otel")``.

Then the ranks meet in a gloo ``all_reduce`` (``--dist``) and the worker writes its own probe: its pid, which
modules it imported, the duration of each step and the CPU time of the children it waited for in it. Every line the
worker or a child writes starts with ``descendant_worker rank <r> ``. The worker never imports torch unless a step needs
it (``dataloader``, ``--dist``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

#: Modules whose presence a probe reports.
WATCHED = {
    "torch": "torch",
    "torch_elastic_events": "torch.distributed.elastic.events",
    "otel_api": "opentelemetry.trace",
    "otel_sdk": "opentelemetry.sdk",
    "bridge_pipeline": "torchelastic_otel.pipeline",
    "bridge_output": "torchelastic_otel._torch.output.capture",
}
MARK_ENV = "TORCHELASTIC_OTEL_WORKER"
CAPTURED_ENV = "TORCHELASTIC_OTEL_WORKER_OUTPUT_READER"

CHILD = r"""
import json, os, sys
sys.path.insert(0, {here!r})
from _descendant_worker import probe_dict
os.write(1, b"descendant_worker rank {rank} child {n}: hello from a descendant\n")  # one write: ranks share a console
with open({path!r}, "w") as fh:
    json.dump(probe_dict("subprocess"), fh)
"""

RECORD_CHILD = r"""
import json, os, sys
sys.path.insert(0, {here!r})
from _descendant_worker import probe_dict
from torchelastic_otel import events
events.record(events.Event("descendant.recorded", events.EventSource.WORKER, metadata={{"child_pid": os.getpid()}}),
              destination="otel")
with open({path!r}, "w") as fh:
    json.dump(probe_dict("record"), fh)
"""


def probe_dict(kind: str) -> dict[str, object]:
    """What this process imported and inherited."""
    modules = {key: name in sys.modules for key, name in WATCHED.items()}
    modules["otel_any"] = any(m == "opentelemetry" or m.startswith("opentelemetry.") for m in sys.modules)
    return {"kind": kind, "pid": os.getpid(), "ppid": os.getppid(), "modules": modules,
            "mark": os.environ.get(MARK_ENV), "captured": os.environ.get(CAPTURED_ENV),
            "rank": os.environ.get("RANK")}  # fmt: skip


def pool_probe(_n: int) -> dict[str, object]:
    time.sleep(0.05)  # both pool processes take part
    return probe_dict("pool")


class _Probes:
    """A map-style dataset whose items are the probes of the processes that load them (as JSON bytes)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> str:
        time.sleep(0.05)
        return json.dumps(probe_dict("dataloader"))


def _as_list(items: list[str]) -> list[str]:
    return items


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that ended and were waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_subprocess(args: argparse.Namespace, rank: int, probes: list[dict], times: list[float]) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for n in range(args.runs):
        path = os.path.join(args.probe_dir, f"rank{rank}-subprocess{n}.json")
        code = "pass" if args.bare else CHILD.format(here=here, rank=rank, n=n, path=path)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], timeout=120)
        times.append(time.perf_counter() - started)
        assert done.returncode == 0, done
        if not args.bare:
            with open(path) as fh:
                probes.append(json.load(fh))


def _run_pool(args: argparse.Namespace, probes: list[dict], times: list[float]) -> None:
    import multiprocessing

    for _ in range(args.pool_runs):
        started = time.perf_counter()
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            if args.bare:
                pool.map(abs, [1, 2, 3, 4])
            else:
                probes.extend(pool.map(pool_probe, range(4)))
        times.append(time.perf_counter() - started)


def _run_dataloader(probes: list[dict], times: list[float]) -> None:
    from torch.utils.data import DataLoader

    loader = DataLoader(_Probes(), batch_size=1, num_workers=2, multiprocessing_context="spawn",
                        collate_fn=_as_list)  # fmt: skip
    for _epoch in range(2):
        started = time.perf_counter()
        for batch in loader:
            probes.extend(json.loads(item) for item in batch)
        times.append(time.perf_counter() - started)


def _run_record(args: argparse.Namespace, rank: int, probes: list[dict], times: list[float]) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(args.probe_dir, f"rank{rank}-record.json")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", RECORD_CHILD.format(here=here, path=path)], timeout=120)
    times.append(time.perf_counter() - started)
    assert done.returncode == 0, done
    with open(path) as fh:
        probes.append(json.load(fh))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", default="subprocess,pool,dataloader,record")
    parser.add_argument("--runs", type=int, default=3, help="subprocess runs")
    parser.add_argument("--pool-runs", type=int, default=1, help="pools, one after the other")
    parser.add_argument("--probe-dir", required=True)
    parser.add_argument("--dist", action="store_true", help="meet the other ranks in a gloo all_reduce at the end")
    parser.add_argument("--rank0-only", default="pool,dataloader", help="steps only rank 0 runs")
    parser.add_argument("--settle", type=float, default=0.0, help="seconds to wait before the first step")
    parser.add_argument(
        "--bare",
        action="store_true",
        help="children do nothing but start: `python -c pass`, `Pool(2).map(abs, ...)` (benchmark)",
    )
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    rank0_only = set(filter(None, args.rank0_only.split(",")))
    started_ns = time.time_ns()
    results: dict[str, dict[str, list]] = {}
    runners = {
        "subprocess": lambda p, t: _run_subprocess(args, rank, p, t),
        "pool": lambda p, t: _run_pool(args, p, t),
        "dataloader": _run_dataloader,
        "record": lambda p, t: _run_record(args, rank, p, t),
    }
    time.sleep(args.settle)
    for step in filter(None, args.steps.split(",")):
        if rank != 0 and step in rank0_only:
            continue
        probes: list[dict] = []
        times: list[float] = []
        cpu = children_cpu()
        runners[step](probes, times)
        results[step] = {"probes": probes, "seconds": times, "children_cpu_seconds": children_cpu() - cpu}
    worker = probe_dict("worker")  # before --dist imports torch
    if args.dist:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        dist.all_reduce(torch.ones(1))
        dist.destroy_process_group()
    os.write(1, f"descendant_worker rank {rank} worker: done\n".encode())
    with open(os.path.join(args.probe_dir, f"rank{rank}.json"), "w") as fh:
        json.dump({"worker": worker, "started_ns": started_ns, "steps": results}, fh)
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    main()
