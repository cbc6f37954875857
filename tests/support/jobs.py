"""Real torchrun jobs: the launchers, rendezvous arguments, and reading what a job sent and printed (their
environments: ``tests.support.env``)."""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.support import ROOT
from tests.support.env import clean_env
from tests.support.ports import free_port
from tests.support.procs import Job, run_job

BIN = Path(sys.executable).parent
TORCHELASTIC_OTEL = BIN / "torchelastic-otel"
TORCHRUN = BIN / "torchrun"
OTEL_INSTRUMENT = BIN / "opentelemetry-instrument"
#: The demo (a real ``torchelastic-otel run`` job whose rank 1 fails once): its files, its report.
DEMO = ROOT / "examples" / "demo.py"

SEVERITY_INFO, SEVERITY_WARN, SEVERITY_ERROR = 9, 13, 17


def launcher(bridged: bool) -> list[str]:
    """The command that starts a job: the bridge's ``torchelastic_otel.run``, or plain ``torch.distributed.run``."""
    return [sys.executable, "-m", "torchelastic_otel.run" if bridged else "torch.distributed.run"]


def unique_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


def rank_1_fails_after(marker: str, poll: float = 0.005) -> str:
    """Lines of a worker script (which imports ``os``, ``sys`` and ``time`` before them): ``flag`` is
    ``$FLAG_DIR/<marker>``; rank 1 waits (at most 60 s) until rank 0 has created it, then exits 1, so that the agent
    stops rank 0 right where it is then."""
    return (
        f'flag = os.path.join(os.environ["FLAG_DIR"], "{marker}")\n'
        'if os.environ["RANK"] == "1":\n'
        "    deadline = time.monotonic() + 60\n"
        "    while not os.path.exists(flag) and time.monotonic() < deadline:\n"
        f"        time.sleep({poll})\n"
        "    sys.exit(1)\n"
    )


def c10d_args(run_id: str, port: int | None = None) -> list[str]:
    return [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port or free_port()}",
        "--rdzv-id",
        run_id,
        "--monitor-interval",
        "0.1",
    ]


def is_worker(item: dict[str, Any]) -> bool:
    """A record, span or point a worker sent (its resource names its rank), not the agent."""
    return "torchelastic.rank" in item["resource"]


_REPORT_ENTRY = re.compile(
    r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)([^\n]*)"
)


def failure_report(output: str) -> dict[int, tuple[int, int, str]]:
    """rank -> (exit code, pid, the rest of the line, e.g. ``(SIGTERM)``) from torch's ChildFailedError report."""
    return {int(r): (int(code), int(pid), rest.strip()) for r, code, pid, rest in _REPORT_ENTRY.findall(output)}


#: The stamp of torch's agent log lines: ``W1124 00:23:26.067000 <pid> <file>:<line>] ...``.
_AGENT_STAMP = r"[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) "
#: The agent stops the other workers of a failed group, then reports the failure once they are gone.
SIGTERM_SENT = r"Sending process \d+ closing signal SIGTERM"
FAILURE_REPORTED = r"failed \(exitcode"


def agent_log_seconds(output: str, first: str, then: str) -> float | None:
    """Seconds between the first agent log line matching ``first`` and the next one matching ``then`` (by the
    lines' own time stamps); ``None`` if either is missing."""
    a = re.search(_AGENT_STAMP + r".*" + first, output)
    b = re.compile(_AGENT_STAMP + r".*" + then).search(output, a.end()) if a else None
    if a is None or b is None:
        return None
    start, end = (int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)) for m in (a, b))
    return end - start


def run_demo(out: Path, log: Path, timeout: float, **env: str) -> Job:
    """``examples/demo.py --out OUT`` to its end (its OTLP JSON Lines files in ``OUT/telemetry``, its report in
    ``OUT/report.html``, its console in ``log``); stopped with everything it started if it outlives ``timeout``."""
    cmd = [sys.executable, str(DEMO), "--out", str(out), "--timeout", "150"]
    return run_job(cmd, clean_env(**env), ROOT, log, timeout=timeout)


def report_run(files: Path) -> dict[str, Any]:
    """The one run of ``torchelastic-otel report --json`` on a job's OTLP JSON Lines files (a real subprocess)."""
    import json
    import subprocess

    done = subprocess.run([sys.executable, "-m", "torchelastic_otel.report", str(files), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = json.loads(done.stdout)["runs"]
    return run
