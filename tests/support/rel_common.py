"""Shared helpers of the reliability tests (``tests/*/test_reliability_*.py``): clean environments, child programs
(``tests/support/workers/_rel_child.py``) and torchrun jobs (``tests/support/workers/_rel_worker.py``) that are always
stopped, and receiver views.

Everything binds or targets 127.0.0.1 only. Every process a helper starts is killed (with what it started) when
the helper's context ends, and every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import ROOT, WORKERS
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.ports import free_port
from tests.support.procs import Job

__all__ = ["OtlpReceiver"]

CHILD = WORKERS / "_rel_child.py"
WORKER = WORKERS / "_rel_worker.py"
BIN = Path(sys.executable).parent
TORCHELASTIC_OTEL = BIN / "torchelastic-otel"
TORCHRUN = BIN / "torchrun"

RESULT_PREFIX = "REL_RESULT "
TORCHRUN_VARS = {
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_NAME",
    "MASTER_ADDR", "MASTER_PORT", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
}  # fmt: skip


def report(title: str, rows: Iterable[tuple[str, Any]]) -> None:
    """Print figures for the docs (``pytest -s`` or ``-rA`` shows them; ``make test`` keeps them in the log)."""
    print(f"\n[reliability] {title}")
    for key, value in rows:
        print(f"[reliability]   {key}: {value}")


# ---- environments -------------------------------------------------------------------------------------------


def clean_env(**overrides: str) -> dict[str, str]:
    """This process's environment without OTEL_*, torchrun or bridge state; the repo on PYTHONPATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "TORCHELASTIC_", "TRACEPARENT", "TRACESTATE")) and k not in TORCHRUN_VARS
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    return env


def otlp_env(endpoint: str, protocol: str = "grpc", **overrides: str) -> dict[str, str]:
    """Every signal over OTLP to ``endpoint`` (``grpc`` or ``http/protobuf``), short batch delays."""
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_BLRP_SCHEDULE_DELAY": "200",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    if protocol == "grpc" and endpoint.startswith("http://"):
        otel["OTEL_EXPORTER_OTLP_INSECURE"] = "true"
    otel.update(overrides)
    return clean_env(**otel)


def closed_endpoint() -> str:
    return f"http://127.0.0.1:{free_port()}"


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
    proc = subprocess.run(
        [sys.executable, str(CHILD), scenario, *args],
        env=env,
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
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
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), scenario, *args],
            env=env,
            cwd=str(ROOT),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
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
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.communicate(timeout=5)


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


def job_env(endpoint: str, **extra: str) -> dict[str, str]:
    """A torchrun job exporting OTLP/gRPC to ``endpoint`` with short intervals."""
    return otlp_env(
        endpoint,
        "grpc",
        OTEL_METRIC_EXPORT_INTERVAL="1000",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",  # pytorch#135712: stale store keys on restart
        **extra,
    )


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
