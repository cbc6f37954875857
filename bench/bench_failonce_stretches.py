"""Where a fail-once job's time goes, plain torchrun vs bridged: its wall time cut into stretches by time stamps.

``.venv/bin/python bench/bench_failonce_stretches.py [--rounds 5] [--records] [--cuda] [--kinds plain,live,down]``.
A report, not a test: it exits 0 and prints PASS/MISS for the target (live - plain <= 0.5 s, medians).

The job: ``bench/_stamped_failonce_worker.py`` (the GPU fail-once job of ``tests/support/workers/gpu_worker.py`` on
CPU tensors; bridge-unaware), 2 workers, ``--standalone --max-restarts 1 --monitor-interval 0.1``, gloo, with
``LOGLEVEL=INFO`` so that torch's agent logs (and time-stamps) each of its steps, in plain and bridged runs alike.
In attempt 0 rank 1 raises at its 20th all-reduce; attempt 1 runs 60 and ends well. ``--records``: the workers
also record through torch's elastic APIs (an event and a metric a step), so that a bridged worker has its own data
to export.

Kinds, alternating in every round so that load from other processes hits them alike: ``plain`` (``python -m
torch.distributed.run``), ``live`` (``python -m torchelastic_otel.run`` exporting OTLP/gRPC to an ``OtlpReceiver``
on 127.0.0.1), ``down`` (the same towards a 127.0.0.1 port nothing listens on).

The stretches, from the launcher's start (this process's clock just before it starts the job) to its end (just
after it is reaped), by the workers' own ``time.time()`` stamps (``STAMP`` lines; the last rank to get there) and
the agent's log lines (their own time stamps, millisecond resolution):

- ``launcher start``: launcher start -> torch's first agent line ("Starting elastic_operator"): the interpreter,
  the bridge's imports and early pipeline build, ``import torch``;
- ``agent start``: -> "[default] Starting worker group" (attempt 0): torch's own set-up, the bridge's install;
- ``a0 spawn``: -> the workers' processes exist (``/proc`` start time); ``a0 interp``: -> their first line
  (interpreter, ``sitecustomize``); ``a0 import``: -> torch imported; ``a0 init``: -> ``init_process_group``
  returned; ``a0 run``: -> rank 1 raises;
- ``failure``: raise -> "closing signal SIGTERM" (rank 1's exception handling and exit, the agent noticing);
  ``stop``: -> "failed (exitcode" (rank 0 dies of the SIGTERM); ``restart``: -> "Starting worker group" (attempt
  1: the agent's failure handling and rendezvous);
- ``a1 spawn`` / ``a1 interp`` / ``a1 import`` / ``a1 init``: as for attempt 0; ``a1 run``: -> both ranks' ``end``;
- ``worker exit``: -> "worker group successfully finished" (interpreter exit, exit hooks, the agent noticing);
  ``agent end``: -> the launcher reaped (the agent's and launcher's exit).

The package's modules are byte-compiled first (``compileall``, into ``__pycache__``), as pip does when it installs
a package: with ``PYTHONDONTWRITEBYTECODE=1`` every bridged process would otherwise compile the modules it imports
(some 0.1 s a worker, 0.13 s the agent) -- and so would OpenTelemetry's and protobuf's, installed with ``pip install
--no-compile`` (0.3 s more a process that builds a pipeline).

Also printed: each kind's CPU seconds (the job's whole process tree, ``wait4``), which the other agents' load
distorts less than wall time.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.env import otlp_env  # noqa: E402
from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.support.procs import stop_tree  # noqa: E402

WORKER = REPO / "bench" / "_stamped_failonce_worker.py"
ARGS = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1"]
JOB_TIMEOUT = 120.0
TARGET = 0.5  # seconds: live - plain, medians

_AGENT_LINE = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) +\d+ \S+\] (.*)$", re.M)
_STAMP = re.compile(r"STAMP (\w+) rank=(\d+) attempt=(\d+) t=([\d.]+)(?: cpu=([\d.]+))?")

#: (stretch, the mark it ends at); each starts where the one before ended.
STRETCHES = [
    ("launcher start", "agent_first"),
    ("agent start", "group0"),
    ("a0 spawn", "a0.process"),
    ("a0 interp", "a0.first_line"),
    ("a0 import", "a0.imported"),
    ("a0 cuda", "a0.cuda"),
    ("a0 init", "a0.initialized"),
    ("a0 run", "a0.raise"),
    ("failure", "sigterm"),
    ("stop", "failed"),
    ("restart", "group1"),
    ("a1 spawn", "a1.process"),
    ("a1 interp", "a1.first_line"),
    ("a1 import", "a1.imported"),
    ("a1 cuda", "a1.cuda"),
    ("a1 init", "a1.initialized"),
    ("a1 run", "a1.end"),
    ("worker exit", "finished"),
    ("agent end", "reaped"),
]
_AGENT_MARKS = {
    "agent_first": "Starting elastic_operator",
    "group0": r"\[default\] Starting worker group",
    "sigterm": r"closing signal SIGTERM",
    "failed": r"failed \(exitcode",
    "finished": r"worker group successfully finished",
}


def _agent_marks(output: str, day: datetime.date) -> dict[str, float]:
    """The agent's log lines' time stamps (today's date, local time) by mark; ``group1``: the second start."""
    marks: dict[str, float] = {}
    midnight = datetime.datetime.combine(day, datetime.time()).timestamp()
    for m in _AGENT_LINE.finditer(output):
        seconds = midnight + int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
        text = m.group(4)
        for mark, pattern in _AGENT_MARKS.items():
            if re.search(pattern, text):
                if mark == "group0" and "group0" in marks:
                    marks.setdefault("group1", seconds)
                else:
                    marks.setdefault(mark, seconds)
    return marks


def marks_of(output: str, started: float, reaped: float) -> dict[str, float]:
    """Every mark of one job's output: the agent's, and each worker stage's latest rank (``a0.first_line``, ...)."""
    marks = _agent_marks(output, datetime.date.fromtimestamp(started))
    for m in _STAMP.finditer(output):
        key = f"a{m.group(3)}.{m.group(1)}"
        marks[key] = max(marks.get(key, 0.0), float(m.group(4)))
    marks["start"], marks["reaped"] = started, reaped
    return marks


def worker_cpu(output: str) -> dict[str, float]:
    """CPU seconds of the workers' stretches (``a0 interp`` ...: every rank's, added up), from their stamps."""
    cpu: dict[tuple[str, str], float] = {}
    for m in _STAMP.finditer(output):
        if m.group(5) is not None:
            cpu[(f"a{m.group(3)}.{m.group(1)}", m.group(2))] = float(m.group(5))
    out: dict[str, float] = {}
    before = ""
    for name, end in STRETCHES:
        if before.split(".")[0] == end.split(".")[0] and before.startswith("a"):
            ranks = {rank for (mark, rank) in cpu if mark == end}
            pairs = [(cpu[(before, r)], cpu[(end, r)]) for r in ranks if (before, r) in cpu]
            if pairs:
                out[name] = sum(b - a for a, b in pairs)
        before = end
    return out


def stretches(marks: dict[str, float]) -> dict[str, float]:
    """Seconds of each stretch whose two ends are known."""
    out: dict[str, float] = {}
    before = "start"
    for name, end in STRETCHES:
        if before in marks and end in marks:
            out[name] = marks[end] - marks[before]
        if end in marks:
            before = end
    return out


def run_job(
    kind: str, env: dict[str, str], log: Path, worker_args: list[str]
) -> tuple[float, float, float, int | None, str]:
    """Start and end (``time.time()``), CPU seconds of the process tree that was reaped (the launcher, the agent,
    the workers), exit code (None: stopped after JOB_TIMEOUT) and output of one job."""
    launcher = "torch.distributed.run" if kind == "plain" else "torchelastic_otel.run"
    env = dict(env)
    cmd = [sys.executable, "-m", launcher, *ARGS, str(WORKER), *worker_args]
    with open(log, "wb") as out:
        started = time.time()
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + JOB_TIMEOUT
        code: int | None = None
        cpu = float("nan")
        while time.monotonic() < deadline:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
                proc.returncode = code
                cpu = usage.ru_utime + usage.ru_stime
                break
            time.sleep(0.005)
        reaped = time.time()
        stop_tree(proc)
    output = log.read_text(errors="replace")
    return started, reaped, cpu, code, output


def envs(rx: OtlpReceiver, variants: list[str]) -> dict[str, dict[str, str]]:
    """Each kind's environment; a variant ``NAME:VAR=VALUE,...`` is ``live`` with those variables."""
    live = otlp_env(rx, LOGLEVEL="INFO")
    plain = {k: v for k, v in live.items() if not k.startswith("OTEL_")}
    down = dict(live, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    out = {"plain": plain, "live": live, "down": down}
    for variant in variants:
        name, _, assignments = variant.partition(":")
        out[name] = dict(live, **dict(a.split("=", 1) for a in assignments.split(",") if a))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", action="store_true", help="the workers record through torch's elastic APIs")
    parser.add_argument("--cuda", action="store_true", help="all-reduce CUDA tensors (needs a GPU)")
    parser.add_argument("--kinds", default="plain,live,down")
    parser.add_argument("--keep", help="a folder to keep each job's output in")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:VAR=VALUE,...: live with these variables (name it in --kinds)")  # fmt: skip
    opts = parser.parse_args()
    kinds = [k for k in opts.kinds.split(",") if k]
    rounds = max(1, opts.rounds)
    walls: dict[str, list[float]] = {k: [] for k in kinds}
    cpus: dict[str, list[float]] = {k: [] for k in kinds}
    parts: dict[str, dict[str, list[float]]] = {k: {name: [] for name, _ in STRETCHES} for k in kinds}
    cpu_parts: dict[str, dict[str, list[float]]] = {k: {name: [] for name, _ in STRETCHES} for k in kinds}
    bad: list[str] = []
    compileall.compile_dir(str(REPO / "torchelastic_otel"), quiet=1)  # as pip does (see the docstring)
    worker_args = (["--records"] if opts.records else []) + (["--cuda"] if opts.cuda else [])
    print(f"fail-once job: {' '.join([WORKER.name, *worker_args])}, {' '.join(ARGS)}; "
          f"{rounds} rounds of {', '.join(kinds)}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, OtlpReceiver() as rx:
        folder = Path(opts.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        environments = envs(rx, opts.variant)
        for round_ in range(rounds):
            for kind in kinds:
                log = folder / f"{kind}-{round_}.log"
                started, reaped, cpu, code, output = run_job(kind, environments[kind], log, worker_args)
                with open(log, "a") as fh:
                    fh.write(f"LAUNCH start={started:.6f} reaped={reaped:.6f} code={code}\n")
                if code != 0:
                    bad.append(f"{kind} round {round_ + 1}: exit {code} ({log})")
                walls[kind].append(reaped - started)
                cpus[kind].append(cpu)
                for name, seconds in stretches(marks_of(output, started, reaped)).items():
                    parts[kind][name].append(seconds)
                for name, seconds in worker_cpu(output).items():
                    cpu_parts[kind][name].append(seconds)
                print(f"  round {round_ + 1}/{rounds} {kind:<6} {reaped - started:6.2f} s  exit {code}", flush=True)
    med = {k: statistics.median(v) for k, v in walls.items()}
    print()
    header = (
        f"  {'stretch':<15}"
        + "".join(f"{k:>9}" for k in kinds)
        + "".join(f"{k + '-' + kinds[0]:>12}" for k in kinds[1:])
    )
    print(header + "   workers' CPU: " + "".join(f"{k:>9}" for k in kinds))
    for name, _ in STRETCHES:
        values = {k: _median(parts[k][name]) for k in kinds}
        row = f"  {name:<15}" + "".join(f"{values[k]:9.3f}" for k in kinds)
        row += "".join(f"{values[k] - values[kinds[0]]:+12.3f}" for k in kinds[1:])
        if any(cpu_parts[k][name] for k in kinds):
            row += "                 " + "".join(f"{_median(cpu_parts[k][name]):9.3f}" for k in kinds)
        print(row)
    row = f"  {'job (wall)':<15}" + "".join(f"{med[k]:9.3f}" for k in kinds)
    print(row + "".join(f"{med[k] - med[kinds[0]]:+12.3f}" for k in kinds[1:]))
    cpu_med = {k: statistics.median(v) for k, v in cpus.items()}
    row = f"  {'job (CPU)':<15}" + "".join(f"{cpu_med[k]:9.3f}" for k in kinds)
    print(row + "".join(f"{cpu_med[k] - cpu_med[kinds[0]]:+12.3f}" for k in kinds[1:]))
    print()
    if "plain" in kinds:
        for kind in kinds:
            if kind == "plain":
                continue
            diffs = [a - b for a, b in zip(walls[kind], walls["plain"], strict=True)]
            print(f"  {kind} - plain, round by round: median {statistics.median(diffs):+.2f} s  "
                  f"{[round(d, 2) for d in diffs]}")  # fmt: skip
        if "live" in kinds:
            ok = med["live"] - med["plain"] <= TARGET
            print(f"  {'PASS' if ok else 'MISS'}  live - plain <= {TARGET} s (medians)")
    for line in bad:
        print(f"  (job) {line}")
    return 0


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
