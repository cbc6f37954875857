"""The environments of the processes the tests start, one definition each.

- ``clean_env``: this process's environment without any OpenTelemetry, torchrun, bridge or rotel state, the
  repository on ``PYTHONPATH`` (children import ``tests.support``);
- ``otlp_env``: that, exporting every signal over OTLP to a receiver (or an endpoint: ``closed_endpoint()`` is a
  collector that is down) at a test's pace;
- ``files_env``: exporting every signal to OTLP JSON Lines files, which ``torchelastic-otel report`` reads;
- ``plain_env``: plain torchrun (no OpenTelemetry, no bridge bootstrap).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support import ROOT
from tests.support.ports import free_port

if TYPE_CHECKING:
    from tests.support.otlp_receiver import OtlpReceiver

#: What a child must not inherit from the test process: its own exporters' settings, torchrun's, the bridge's, a
#: trace context, rotel's.
DROPPED_PREFIXES = ("OTEL_", "TORCHELASTIC_", "TRACEPARENT", "TRACESTATE", "ROTEL_")
TORCHRUN_VARS = frozenset({
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
    "MASTER_PORT", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
})  # fmt: skip
#: A test's pace: metrics exported every second, spans and records batched for 200 ms (the SDK's defaults: 60 s and
#: 5 s, longer than most jobs here live).
PACE = {"OTEL_METRIC_EXPORT_INTERVAL": "1000", "OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_BLRP_SCHEDULE_DELAY": "200"}
#: Every signal to OTLP JSON Lines files (``TORCHELASTIC_OTEL_FILE_DIR``).
FILE_EXPORTERS = {
    "OTEL_TRACES_EXPORTER": "otlp_json_file",
    "OTEL_METRICS_EXPORTER": "otlp_json_file",
    "OTEL_LOGS_EXPORTER": "otlp_json_file",
}


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without OpenTelemetry, torchrun, bridge or rotel state, plus ``extra``: the
    repository first on ``PYTHONPATH``, unbuffered output, and torch's rendezvous store not shared with the workers
    (pytorch#135712: a restarted attempt may read the last attempt's keys)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED_PREFIXES) and k not in TORCHRUN_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.update(extra)
    return env


def otlp_env(
    target: OtlpReceiver | str, protocol: str = "grpc", pace: Mapping[str, str] = PACE, **extra: str
) -> dict[str, str]:
    """``clean_env`` exporting every signal over OTLP (``grpc`` or ``http/protobuf``) to ``target``: a receiver (its
    endpoint for the protocol) or an endpoint URL; at ``pace`` (``{}``: the SDK's own intervals); plus ``extra``."""
    if isinstance(target, str):
        endpoint = target
    else:
        endpoint = target.grpc_endpoint if protocol == "grpc" else target.http_endpoint
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}
    if protocol == "grpc" and endpoint.startswith("http://"):
        otel["OTEL_EXPORTER_OTLP_INSECURE"] = "true"
    return clean_env(**otel, **{**pace, **extra})


def closed_endpoint() -> str:
    """An endpoint nothing listens on (127.0.0.1): a collector that is down."""
    return f"http://127.0.0.1:{free_port()}"


def files_env(files: Path, **extra: str) -> dict[str, str]:
    """``clean_env`` exporting every signal to OTLP JSON Lines files in ``files``, metrics every second."""
    return clean_env(**FILE_EXPORTERS, TORCHELASTIC_OTEL_FILE_DIR=str(files), OTEL_METRIC_EXPORT_INTERVAL="1000",
                     **extra)  # fmt: skip


def plain_env(**extra: str) -> dict[str, str]:
    """``clean_env`` for plain torchrun: no OpenTelemetry and no bridge bootstrap on ``PYTHONPATH``."""
    env = clean_env(**extra)
    bootstrap = os.path.join("torchelastic_otel", "_bootstrap")
    env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep) if bootstrap not in p)
    return env
