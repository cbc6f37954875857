#!/usr/bin/env python3
"""``make test-compat``: the oldest and the newest releases the package declares, each in a venv of its own, running
the tests that bridge real ``torchrun`` jobs, the worker tests, the mapping and the API tests.

Each venv is built once and kept in a cache outside the clone (``TORCHELASTIC_OTEL_COMPAT_CACHE``, default
``~/.cache/torchelastic-otel-compat``), keyed by the Python, torch and OpenTelemetry versions and a hash of what is
installed, so later runs on the same machine reuse it: torch's releases on the registry are CUDA builds (5-7 GB a
venv with their nvidia wheels; they run on the CPU). Venvs of combinations no longer in ``MATRIX`` are deleted
first, so the disk holds one venv per combination. The package itself is installed (editable, no dependencies)
from this clone on every run. Only the standard library is used: this runs before any venv exists.

``COMPAT=oldest,newest`` runs a subset. The last line is ``compat: N passed, N failed`` over every combination.
"""

from __future__ import annotations

import dataclasses
import fcntl
import glob
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("TORCHELASTIC_OTEL_COMPAT_CACHE") or Path.home() / ".cache" / "torchelastic-otel-compat")

#: What every combination runs: real torchrun jobs through the three routes, workers blocked in native code and
#: SIGTERMed, worker set-up, failure reports, the event/metric mapping, both APIs and the pinned internals; the final
#: words of bridge-unaware scripts wherever the signal lands (inside torch's import too), and the processes a worker
#: starts; the hooks of a step's phases on each torch (dynamo's counters included).
TESTS = (
    "tests/jobs/test_torchrun.py",
    "tests/jobs/test_worker_sigterm.py",
    "tests/jobs/test_worker_setup.py",
    "tests/jobs/test_reliability_workers.py",
    "tests/unit/test_mapping.py",
    "tests/unit/test_events_api.py",
    "tests/unit/test_metrics_api.py",
    "tests/unit/test_compat.py",
    "tests/unit/test_compat_releases.py",
    "tests/unit/test_tracebacks.py",
    "tests/unit/test_device_clock.py",
    "tests/jobs/test_final_words.py",
    "tests/jobs/test_sigterm_in_torch_import.py",
    "tests/jobs/test_descendants.py",
    "tests/unit/test_anatomy.py",
)
#: The test tools (the ``test`` extra without the packages whose releases a combination pins).
TEST_TOOLS = ("pytest>=8", "pyyaml>=6", "hypothesis>=6.100", "grpcio>=1.60", "setuptools>=77", "wheel")

INSTALL_TIMEOUT = 30 * 60  # seconds for one venv's pip install (a cold one took ~2 min here)
TEST_TIMEOUT = 30 * 60  # seconds for one combination's tests (docs/versions.md: about 8 min here)
LOCK_TIMEOUT = 60 * 60  # seconds to wait for another run using the cache
FREE_BYTES_NEEDED = 8 << 30  # a CUDA-torch venv is 5.3-6.8 GB, plus pip's unpacking


@dataclasses.dataclass(frozen=True)
class Combination:
    """One venv: a Python, a torch and an OpenTelemetry release (API/SDK/exporters, and the contrib packages of
    the same release train: ``opentelemetry-exporter-prometheus``, ``opentelemetry-instrumentation``)."""

    name: str
    python: str
    torch: str
    otel: str
    contrib: str

    def requirements(self) -> list[str]:
        otel = ("opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp", "opentelemetry-proto")
        contrib = ("opentelemetry-exporter-prometheus", "opentelemetry-instrumentation")
        return [
            f"torch=={self.torch}",
            *(f"{name}=={self.otel}" for name in otel),
            *(f"{name}=={self.contrib}" for name in contrib),
            *TEST_TOOLS,
        ]

    @property
    def key(self) -> str:
        digest = hashlib.sha256("\n".join(self.requirements()).encode()).hexdigest()[:8]
        return f"py{self.python}-torch{self.torch}-otel{self.otel}-{digest}"


#: Each end of every declared range (pyproject.toml): the oldest Python with the oldest torch and OpenTelemetry,
#: the newest with the newest, and Python 3.12 with releases from the middle (torch 2.10: the first whose worker
#: events carry ``exit_code``; contrib 0.63b0: the first whose ``opentelemetry-instrument`` reaches subprocesses).
#: ``make test`` adds Python 3.11, torch 2.13 (CPU) and the newest OpenTelemetry.
MATRIX = (
    Combination("oldest", python="3.10", torch="2.8.0", otel="1.39.1", contrib="0.60b1"),
    Combination("middle", python="3.12", torch="2.10.0", otel="1.42.1", contrib="0.63b1"),
    Combination("newest", python="3.13", torch="2.15.0", otel="1.45.2", contrib="0.66b2"),
)


@dataclasses.dataclass
class Result:
    combination: Combination
    install: str = "-"
    size: str = "-"
    passed: int = 0
    failed: int = 0
    summary: str = "not run"


# ---- processes -------------------------------------------------------------------------------------------------


def run(cmd: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` with its output appended to ``log``; its whole process group is killed at ``timeout``."""
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            out.write(f"\n[compat] killed after {timeout:.0f} s\n".encode())
            return -signal.SIGKILL


def clean_env() -> dict[str, str]:
    """This environment without another venv's or Python's settings."""
    drop = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def pip_env(empty_constraints: Path) -> dict[str, str]:
    """pip without its download cache (the venvs are the cache; torch's wheels would double the disk used) and
    without a machine-wide constraints file: some machines cap torch below the releases tested here
    (``/etc/xdg/pip``); ``PIP_CONSTRAINT`` overrides the configured one for these installs only."""
    return {**clean_env(), "PIP_NO_CACHE_DIR": "1", "PIP_CONSTRAINT": str(empty_constraints)}


def find_python(version: str) -> str | None:
    """An interpreter of ``version`` (e.g. ``3.10``) that runs: in pyenv's versions, else on ``PATH`` (a pyenv shim
    on ``PATH`` may name a version it will not run)."""
    pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    candidates = sorted(glob.glob(os.path.join(pyenv_root, "versions", f"{version}.*", "bin", "python")), reverse=True)
    on_path = shutil.which(f"python{version}")
    for candidate in [*candidates, *([on_path] if on_path else [])]:
        probe = [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]
        try:
            done = subprocess.run(probe, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip() == version:
            return candidate
    return None


def failures(log: Path, lines: int = 40) -> str:
    """What failed, from the log: pytest's FAILED/ERROR lines, else the log's last lines (an install's error)."""
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    failed = [line for line in text if line.startswith(("FAILED ", "ERROR "))]
    return "\n".join(failed or text[-lines:])


def size_of(path: Path) -> str:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for filename in filenames:
            full = os.path.join(dirpath, filename)
            if not os.path.islink(full):
                total += os.path.getsize(full)
    return f"{total / (1 << 30):.1f} GB"


# ---- the cache -------------------------------------------------------------------------------------------------


class CacheLock:
    """One run at a time uses the cache (a venv is rebuilt or reinstalled from a clone); waits a bounded time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle = None

    def __enter__(self) -> CacheLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = self.path.open("w")
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"compat: {self.path} still locked after {LOCK_TIMEOUT} s") from None
                time.sleep(5)

    def __exit__(self, *exc: object) -> None:
        assert self.handle is not None
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


_KEY = re.compile(r"^py[0-9.]+-torch[^-]+-otel[^-]+-[0-9a-f]{8}$")


def prune(keep: set[str]) -> None:
    """Delete the cached venvs of combinations no longer tested (only directories named like ours)."""
    for entry in CACHE.iterdir():
        if entry.is_dir() and _KEY.match(entry.name) and entry.name not in keep:
            print(f"compat: removing the stale venv {entry}", flush=True)
            shutil.rmtree(entry, ignore_errors=True)


def build(combination: Combination, venv: Path, log: Path, result: Result) -> bool:
    """Create ``venv`` with the combination's releases, unless a complete one is cached (``.ready``)."""
    if (venv / ".ready").exists():
        result.install = "cached"
        return True
    shutil.rmtree(venv, ignore_errors=True)
    python = find_python(combination.python)
    if python is None:
        result.summary = f"no Python {combination.python} on this machine (PATH or pyenv)"
        return False
    free = shutil.disk_usage(CACHE).free
    if free < FREE_BYTES_NEEDED:
        result.summary = f"only {free >> 30} GB free in {CACHE}, {FREE_BYTES_NEEDED >> 30} GB needed"
        return False
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        empty = Path(scratch) / "constraints.txt"
        empty.write_text("")
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text("\n".join(combination.requirements()) + "\n")
        ok = (
            run([python, "-m", "venv", str(venv)], log, INSTALL_TIMEOUT) == 0
            and run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "-r", str(requirements)],
                log,
                INSTALL_TIMEOUT,
                pip_env(empty),
            )
            == 0
        )
    if not ok:
        result.summary = "install failed"
        shutil.rmtree(venv, ignore_errors=True)
        return False
    (venv / ".ready").write_text("\n".join(combination.requirements()) + "\n")
    result.install = f"{time.monotonic() - started:.0f} s"
    return True


# ---- one combination -------------------------------------------------------------------------------------------

_COUNT = re.compile(r"(\d+) (passed|failed|error|errors)\b")


def test(combination: Combination, log: Path) -> Result:
    """Build or reuse the combination's venv, install this clone into it and run ``TESTS``."""
    result = Result(combination)
    venv = CACHE / combination.key
    if not build(combination, venv, log, result):
        result.failed = 1
        return result
    result.size = size_of(venv)
    python = str(venv / "bin" / "python")
    install = [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", str(ROOT)]
    if run(install, log, INSTALL_TIMEOUT, clean_env()) != 0:
        result.failed, result.summary = 1, "installing this clone failed"
        return result
    # The package's bytecode, as pip writes it for a regular install (an editable one writes none, and under
    # PYTHONDONTWRITEBYTECODE every bridged worker would compile the bridge's modules again at start-up).
    run([python, "-m", "compileall", "-q", str(ROOT / "torchelastic_otel")], log, INSTALL_TIMEOUT, clean_env())
    start = log.stat().st_size
    # --durations: the slowest tests, in the log; one process: most of the time is the files marked ``solo``, which
    # compare a job's time with plain torchrun's and must run alone (pytest-xdist on the others saved nothing)
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=10", *TESTS]
    code = run(pytest, log, TEST_TIMEOUT, clean_env())
    with log.open("rb") as fh:
        fh.seek(start)
        output = fh.read().decode(errors="replace")
    last = [line for line in output.splitlines() if _COUNT.search(line)]
    result.summary = last[-1].strip("= ") if last else f"pytest exited {code}"
    counts = {kind: int(n) for n, kind in _COUNT.findall(last[-1])} if last else {}
    result.passed = counts.get("passed", 0)
    result.failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    if code != 0 and result.failed == 0:
        result.failed = 1
    return result


def selected() -> tuple[Combination, ...]:
    names = [n.strip() for n in os.environ.get("COMPAT", "").split(",") if n.strip()]
    unknown = set(names) - {c.name for c in MATRIX}
    if unknown:
        raise SystemExit(f"compat: unknown COMPAT names {sorted(unknown)}; known: {[c.name for c in MATRIX]}")
    return tuple(c for c in MATRIX if not names or c.name in names)


def report(results: list[Result]) -> None:
    print("\ncompat results:")
    print(f"  {'name':8} {'python':6} {'torch':7} {'otel':7} {'contrib':7} {'install':8} {'venv':7} tests")
    for r in results:
        c = r.combination
        print(f"  {c.name:8} {c.python:6} {c.torch:7} {c.otel:7} {c.contrib:7} {r.install:8} {r.size:7} {r.summary}")
    passed, failed = sum(r.passed for r in results), sum(r.failed for r in results)
    print(f"compat: {passed} passed, {failed} failed", flush=True)


def main() -> int:
    combinations = selected()
    CACHE.mkdir(parents=True, exist_ok=True)
    logs = CACHE / "logs"
    logs.mkdir(exist_ok=True)
    results = []
    with CacheLock(CACHE / ".lock"):
        prune({c.key for c in MATRIX})
        for combination in combinations:
            log = logs / f"{combination.name}.log"
            log.write_text("")
            print(
                f"compat: {combination.name}: Python {combination.python}, torch {combination.torch}, "
                f"OpenTelemetry {combination.otel} / {combination.contrib} (log: {log})",
                flush=True,
            )
            result = test(combination, log)
            print(
                f"compat: {combination.name}: install {result.install}, venv {result.size}, {result.summary}",
                flush=True,
            )
            if result.failed:
                print(failures(log), flush=True)
            results.append(result)
    report(results)
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
