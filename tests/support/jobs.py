"""Real torchrun jobs: the launchers, a clean environment exporting to a receiver (or to nothing: plain torchrun),
rendezvous arguments, and reading what a job sent and printed."""

from __future__ import annotations

import os
import re
import sys
import types
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support.ports import free_port

if TYPE_CHECKING:
    from tests.support.otlp_receiver import OtlpReceiver

BIN = Path(sys.executable).parent
TORCHELASTIC_OTEL = BIN / "torchelastic-otel"
TORCHRUN = BIN / "torchrun"
OTEL_INSTRUMENT = BIN / "opentelemetry-instrument"

SEVERITY_INFO, SEVERITY_WARN, SEVERITY_ERROR = 9, 13, 17


def unique_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


def job_env(rx: OtlpReceiver, **extra: str) -> dict[str, str]:
    """This process's environment without any OTEL_*/torchrun/bridge state, exporting to ``rx`` over gRPC."""
    inherited = ("TORCHELASTIC_", "TRACEPARENT", "TRACESTATE")
    torchrun_vars = {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_NAME"}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OTEL_") and not k.startswith(inherited) and k not in torchrun_vars
    }
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=rx.grpc_endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_METRIC_EXPORT_INTERVAL="1000",
        OTEL_BSP_SCHEDULE_DELAY="200",
        OTEL_BLRP_SCHEDULE_DELAY="200",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",  # pytorch#135712: stale store keys on restart
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def plain_env() -> dict[str, str]:
    """job_env without OpenTelemetry and without the bridge's bootstrap on PYTHONPATH: plain torchrun."""
    env = job_env(types.SimpleNamespace(grpc_endpoint="http://127.0.0.1:1"))  # type: ignore[arg-type]
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    if "PYTHONPATH" in env:
        kept = [p for p in env["PYTHONPATH"].split(":") if p and "torchelastic_otel" not in p]
        env["PYTHONPATH"] = ":".join(kept)
    return env


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


def report_run(files: Path) -> dict[str, Any]:
    """The one run of ``torchelastic-otel report --json`` on a job's OTLP JSON Lines files (a real subprocess)."""
    import json
    import subprocess

    from tests.support import ROOT

    done = subprocess.run([sys.executable, "-m", "torchelastic_otel.report", str(files), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = json.loads(done.stdout)["runs"]
    return run
