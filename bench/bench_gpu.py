"""What the bridge costs a CUDA job, against plain torchrun on the same job (needs an NVIDIA GPU: ``make test-gpu``).

Alternating rounds, bridged and plain, of ``tests/support/workers/gpu_worker.py`` (which times its own steps):

- ``launch``: a launch-bound loop (4 x 1024² fp32, batch 512, synced each step): the median wall time of a step;
- ``gpu-bound``: the bf16 MLP that syncs every 50 steps: the median wall time of a step;
- ``fail-once``: 2 ranks, gloo all-reduces of CUDA tensors, rank 1 fails in the first attempt (``--max-restarts
  1``): the whole job's wall time.

And the cost of the step timeline's CUDA events on the training thread (``torch.Event.record()``, what a sampled
step's five or six marks each add). Prints ratios; asserts nothing (the targets are in docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.gpu.test_gpu_truth import run_job, truth_of


def _event_cost() -> None:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return
    events = [torch.Event(device="cuda", enable_timing=True) for _ in range(20000)]
    for event in events:
        event.record()  # created at their first record
    torch.cuda.synchronize()
    began = time.perf_counter_ns()
    for event in events:
        event.record()
    per = (time.perf_counter_ns() - began) / len(events)
    torch.cuda.synchronize()
    marks = 6  # a sampled step's marks: its start, input in and out, backward in and out, its end
    print(f"torch.Event.record(): {per / 1e3:.2f} us; a sampled step ({marks} marks) {marks * per / 1e3:.1f} us, "
          f"one in 8 steps sampled: {marks * per / 8 / 1e3:.2f} us a step")  # fmt: skip


def _rounds(name: str, env: dict[str, str], rounds: int, measure: str, **kwargs: object) -> None:
    out: dict[bool, list[float]] = {True: [], False: []}
    codes: dict[bool, set[int]] = {True: set(), False: set()}
    with tempfile.TemporaryDirectory() as directory:
        for i in range(rounds):
            for bridged in (i % 2 == 0, i % 2 != 0):
                began = time.perf_counter()
                done, _, truth = run_job(f"{name}-{i}-{bridged}", env, Path(directory), bridged=bridged, **kwargs)
                wall = time.perf_counter() - began
                print(f"  {name} round {i} {'bridged' if bridged else 'plain  '} exit {done.returncode} {wall:.2f} s",
                      flush=True)  # fmt: skip
                codes[bridged].add(done.returncode)
                if measure == "job":
                    out[bridged].append(wall)
                else:
                    out[bridged].append(truth_of(truth)["wall_step_median"])
    plain, bridged = statistics.median(out[False]), statistics.median(out[True])
    unit, scale = ("s", 1.0) if measure == "job" else ("ms a step", 1e3)
    print(f"{name:<10} plain {plain * scale:9.3f} {unit}   bridged {bridged * scale:9.3f} {unit}   "
          f"ratio {bridged / plain:.3f}   (+{(bridged - plain) * scale:.3f})   exit codes plain {sorted(codes[False])} "
          f"bridged {sorted(codes[True])}   [median of {rounds} alternating rounds each]")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["events", "launch", "gpu-bound", "fail-once"], action="append",
                        help="measure only these (repeatable); default: all")  # fmt: skip
    args = parser.parse_args()
    chosen = set(args.only or ["events", "launch", "gpu-bound", "fail-once"])
    if "events" in chosen:
        _event_cost()
    if "launch" in chosen:
        _rounds("launch", {"GPU_MODE": "launch", "GPU_STEPS": "1500"}, args.rounds, "step")
    if "gpu-bound" in chosen:
        _rounds("gpu-bound", {"GPU_MODE": "compute", "GPU_SYNC_EVERY": "50", "GPU_STEPS": "300"},
                max(2, args.rounds - 1), "step")  # fmt: skip
    if "fail-once" in chosen:
        _rounds("fail-once", {"GPU_MODE": "failonce", "GPU_STEPS": "60"}, args.rounds, "job", nproc=2, restarts=1)


if __name__ == "__main__":
    main()
