"""What the bridge costs the Python processes a worker starts: bridged ÷ plain torchrun, per row.

``.venv/bin/python bench/bench_descendants.py [--runs 5]``. A report, not a test: it exits 0 and prints one
PASS/FAIL (MISS) line per row; ~2-3 minutes on a 2-core machine with 5 runs.

The worker is ``tests/support/workers/_descendant_worker.py --bare`` (bridge-unaware), one rank (``--standalone
--nproc-per-node 1``); it times each operation itself (``time.perf_counter`` around it) and writes the times to a
probe file, with the CPU time (user + system) of the children it waited for. It starts the operation
``--settle`` seconds (default 2) after its own start, once its own start-up work (the bridge builds the worker's
exporters in a thread of its own) is over: the rows measure what the processes it starts cost, not the worker's
start-up (``bench_job.py``'s row). Rows:

1. ``subprocess.run([sys.executable, "-c", "pass"])``, 3 times, exporters ``none`` (``OTEL_*_EXPORTER=none``):
   the median time of one run;
2. ``multiprocessing.get_context("spawn").Pool(2).map(abs, [1, 2, 3, 4])`` (pool start, map, close), OTLP/gRPC to
   a 127.0.0.1 port nobody listens on (the collector down): the median time of one pool, over 3 pools.

``plain`` is ``torchrun``, without OpenTelemetry variables and without the bridge's bootstrap; ``bridged`` is
``torchelastic-otel run``. The package's modules are byte-compiled first (``compileall``, into ``__pycache__``), as pip
does when it installs a package: a checkout run with ``PYTHONDONTWRITEBYTECODE=1`` would otherwise compile the
bootstrap's five small modules from source in every process (~3 ms of CPU more a process here); ``--no-compile``
measures with whatever bytecode there is. The ``__pycache__`` directories the benchmark made are removed at the end.
Runs alternate (plain, bridged, plain, ...) so that load from other processes hits both alike; each row prints the
medians of ``--runs`` runs of each and their ratio, target <= 1.1x, and, for information, the children's CPU time
(median per run of the operation): on a loaded machine it shows the bridge's share more steadily than wall time. Each
job is stopped (its whole process tree) after 120 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.procs import stop_tree  # noqa: E402

BIN = Path(sys.executable).parent
TORCHRUN, TORCHELASTIC_OTEL = BIN / "torchrun", BIN / "torchelastic-otel"
WORKER = REPO / "tests" / "support" / "workers" / "_descendant_worker.py"
JOB_TIMEOUT = 120.0
TARGET = 1.1
#: Times the worker repeats the row's operation in one job (its median is the job's figure).
REPEATS = 3


@dataclass(frozen=True)
class Row:
    name: str
    step: str
    exporters: str  # "none" or "down"


ROWS = (
    Row("subprocess python -c pass (each of 3), exporters none", "subprocess", "none"),
    Row("spawn Pool(2).map(abs, 4 items), OTLP, collector down", "pool", "down"),
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(kind: str, row: Row) -> dict[str, str]:
    """This environment without OpenTelemetry, torchrun or bridge state; the bridged kind with the row's exporters."""
    inherited = ("OTEL_", "TORCHELASTIC_", "TRACEPARENT", "TRACESTATE")
    torchrun_vars = {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_NAME"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(inherited) and k not in torchrun_vars}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and "_bootstrap" not in p]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *paths])
    env["PYTHONUNBUFFERED"] = "1"
    if kind == "bridged":
        if row.exporters == "none":
            env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
        else:
            env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{_free_port()}",
                       OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_EXPORTER_OTLP_INSECURE="true")  # fmt: skip
    return env


def run_once(kind: str, row: Row, tmp: Path, n: int, settle: float) -> tuple[float, float] | None:
    """One job: the in-worker time of the row's operation (median over its repetitions) and its children's CPU
    seconds per repetition; ``None`` if it failed."""
    probe_dir = tmp / f"{row.step}-{kind}-{n}"
    probe_dir.mkdir()
    launcher = [str(TORCHRUN)] if kind == "plain" else [str(TORCHELASTIC_OTEL), "run"]
    cmd = [*launcher, "--standalone", "--nproc-per-node", "1", "--monitor-interval", "0.1", str(WORKER),
           "--bare", "--steps", row.step, "--runs", str(REPEATS), "--pool-runs", str(REPEATS), "--settle", str(settle),
           "--probe-dir", str(probe_dir)]  # fmt: skip
    log = probe_dir / "console.txt"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=_env(kind, row), cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        code = proc.wait(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        stop_tree(proc)
    probe = probe_dir / "rank0.json"
    if code != 0 or not probe.exists():
        print(f"  {kind} run {n} failed (exit {code}):\n{log.read_text(errors='replace')[-2000:]}", flush=True)
        return None
    step = json.loads(probe.read_text())["steps"][row.step]
    return statistics.median(step["seconds"]), step["children_cpu_seconds"] / len(step["seconds"])


@dataclass
class Measured:
    wall: list[float]
    cpu: list[float]


def bench_row(row: Row, runs: int, tmp: Path, settle: float) -> dict[str, Measured]:
    got = {"plain": Measured([], []), "bridged": Measured([], [])}
    for n in range(runs):
        for kind in ("plain", "bridged"):
            result = run_once(kind, row, tmp, n, settle)
            if result is not None:
                got[kind].wall.append(result[0])
                got[kind].cpu.append(result[1])
        print(f"  run {n + 1}/{runs}: plain {_fmt(got['plain'].wall[-1:])}  bridged {_fmt(got['bridged'].wall[-1:])}",
              flush=True)  # fmt: skip
    return got


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s" if values else "-"


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms" if values else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each kind per row (alternating)")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds the worker waits before the operation")
    parser.add_argument("--no-compile", action="store_true", help="do not byte-compile the package first")
    args = parser.parse_args()
    package = REPO / "torchelastic_otel"
    caches_before = set(package.rglob("__pycache__"))
    if not args.no_compile:
        import compileall

        compileall.compile_dir(str(package), quiet=1)
    print(f"package byte-compiled first: {not args.no_compile}; worker settles {args.settle} s", flush=True)
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-descendants-") as tmp:
            for row in ROWS:
                print(f"{row.name}:", flush=True)
                started = time.monotonic()
                got = bench_row(row, args.runs, Path(tmp), args.settle)
                print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
                results.append((row, got["plain"], got["bridged"]))
    finally:
        for cache in set(package.rglob("__pycache__")) - caches_before:
            shutil.rmtree(cache, ignore_errors=True)
    print()
    print("| the worker does | plain torchrun | bridged | bridged ÷ plain | target | children's CPU, plain / bridged |")
    print("|---|---|---|---|---|---|")
    verdicts = []
    for row, plain_measured, bridged_measured in results:
        plain, bridged = plain_measured.wall, bridged_measured.wall
        ratio = statistics.median(bridged) / statistics.median(plain) if plain and bridged else float("nan")
        cpu = f"{_ms(plain_measured.cpu)} / {_ms(bridged_measured.cpu)}"
        print(f"| {row.name} | {_fmt(plain)} | {_fmt(bridged)} | {ratio:.2f}x | <= {TARGET}x | {cpu} |")
        ok = ratio <= TARGET and len(plain) == len(bridged) == args.runs
        verdicts.append(f"{'PASS' if ok else 'FAIL (MISS)'}: {row.name}: {ratio:.2f}x (medians of "
                        f"{len(plain)} plain / {len(bridged)} bridged runs)")  # fmt: skip
    print()
    for verdict in verdicts:
        print(verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
