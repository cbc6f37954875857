"""Shared helpers of the reliability tests (``tests/*/test_reliability_*.py``): child programs
(``tests/support/workers/_rel_child.py``) and torchrun jobs (``tests/support/workers/_rel_worker.py``) that are always
stopped, and receiver views.

Everything binds or targets 127.0.0.1 only. Every process a helper starts is killed (with what it started) when
the helper's context ends, and every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import json
import select
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import ROOT, WORKERS
from tests.support.jobs import TORCHELASTIC_OTEL
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.procs import Job, run_script, start_script, stop_script

__all__ = ["TORCHELASTIC_OTEL", "OtlpReceiver"]  # re-exported for the reliability tests

CHILD = WORKERS / "_rel_child.py"
WORKER = WORKERS / "_rel_worker.py"

RESULT_PREFIX = "REL_RESULT "


def report(title: str, rows: Iterable[tuple[str, Any]]) -> None:
    """Print figures for the docs (``pytest -s`` or ``-rA`` shows them; ``make test`` keeps them in the log)."""
    print(f"\n[reliability] {title}")
    for key, value in rows:
        print(f"[reliability]   {key}: {value}")


# ---- child programs -----------------------------------------------------------------------------------------


@dataclass
class Child:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def result(self) -> dict[str, Any]:
        return self.results[-1] if self.results else {}


def parse_results(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line[len(RESULT_PREFIX) :]) for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]


def run_child(scenario: str, env: dict[str, str], *args: str, timeout: float = 60.0, check: bool = True) -> Child:
    """Run ``tests/support/workers/_rel_child.py SCENARIO ARGS`` to completion (killed if it outlives ``timeout``)."""
    start = time.monotonic()
    proc = run_script(CHILD, scenario, *args, env=env, timeout=timeout)
    child = Child(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start, parse_results(proc.stdout))
    if check:
        assert child.returncode == 0, (
            f"child {scenario} failed ({child.returncode}):\n{child.stdout[-3000:]}\n{child.stderr[-3000:]}"
        )
        assert child.results, f"child {scenario} printed no result:\n{child.stdout[-3000:]}\n{child.stderr[-3000:]}"
    return child


class LiveChild:
    """A running child whose stdout is read line by line (with deadlines) while the test acts on the receiver."""

    def __init__(self, scenario: str, env: dict[str, str], *args: str) -> None:
        self.proc = start_script(CHILD, scenario, *args, env=env)
        self.lines: list[str] = []

    def read_until(self, predicate: Callable[[str], bool], timeout: float) -> str:
        """Read stdout until a line satisfies ``predicate`` (returned); AssertionError after ``timeout``."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"child did not print the expected line within {timeout} s: {self.lines[-5:]}")
            ready, _, _ = select.select([self.proc.stdout], [], [], remaining)
            if not ready:
                continue
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"child exited ({self.proc.wait(timeout=5)}): {self.lines[-5:]}")
            self.lines.append(line.rstrip("\n"))
            if predicate(line):
                return line

    def finish(self, timeout: float = 60.0) -> Child:
        """Release the child (a line on stdin) and wait, bounded, for its exit."""
        out, err = self.proc.communicate("go\n", timeout=timeout)
        stdout = "\n".join(self.lines) + "\n" + out
        return Child(self.proc.returncode, stdout, err, 0.0, parse_results(stdout))

    def kill(self) -> None:
        stop_script(self.proc)


@contextlib.contextmanager
def live_child(scenario: str, env: dict[str, str], *args: str) -> Iterator[LiveChild]:
    child = LiveChild(scenario, env, *args)
    try:
        yield child
    finally:
        child.kill()


# ---- torchrun jobs --------------------------------------------------------------------------------------------


class Jobs:
    """Starts torchrun jobs; :meth:`close` kills every job (and its workers) still running."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[Job] = []

    def start(self, cmd: list[str | Path], env: dict[str, str]) -> Job:
        path = self.directory / f"job{len(self.started)}.log"
        with open(path, "wb") as out:
            start = time.monotonic()
            proc = subprocess.Popen(
                [str(c) for c in cmd], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        job = Job(proc, path, start)
        self.started.append(job)
        return job

    def run(self, cmd: list[str | Path], env: dict[str, str], timeout: float = 120.0) -> Job:
        job = self.start(cmd, env)
        job.wait(timeout)
        return job

    def close(self) -> None:
        for job in self.started:
            job.kill()


@contextlib.contextmanager
def jobs_in(directory: Path) -> Iterator[Jobs]:
    jobs = Jobs(directory)
    try:
        yield jobs
    finally:
        jobs.close()


def standalone(nproc: int = 2, *extra: str) -> list[str]:
    return ["--standalone", "--nproc-per-node", str(nproc), "--monitor-interval", "0.1", *extra]


def marks(output: str, name: str) -> list[dict[str, str]]:
    """``REL_MARK name k=v ...`` lines the worker printed, as dicts."""
    found = []
    for chunk in output.split("REL_MARK ")[1:]:  # lines of two processes may run together
        words = chunk.split("\n", 1)[0].split()
        if words and words[0] == name:
            found.append(dict(word.split("=", 1) for word in words[1:] if "=" in word))
    return found


def median(values: list[float]) -> float:
    return statistics.median(values)


# ---- receiver views ---------------------------------------------------------------------------------------------


def latest_value(rx: OtlpReceiver, name: str, **match: Any) -> Any:
    """The value of the newest point of ``name`` whose resource/attributes contain ``match``."""
    points = [
        p
        for p in rx.metric_points(name)
        if all(p["attributes"].get(k, p["resource"].get(k)) == v for k, v in match.items())
    ]
    return max(points, key=lambda p: p["time_unix_nano"])["value"] if points else None


def dropped(rx: OtlpReceiver, **match: Any) -> dict[tuple[str, str], float]:
    """``torchelastic_otel.dropped`` as received: {(signal, reason): newest value}."""
    out: dict[tuple[str, str], tuple[int, float]] = {}
    for p in rx.metric_points("torchelastic_otel.dropped"):
        if not all(p["resource"].get(k) == v for k, v in match.items()):
            continue
        key = (p["attributes"]["signal"], p["attributes"]["reason"])
        if key not in out or p["time_unix_nano"] >= out[key][0]:
            out[key] = (p["time_unix_nano"], p["value"])
    return {k: v for k, (_t, v) in out.items()}
