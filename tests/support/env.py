"""The environments of the processes the tests start, one definition each.

- ``clean_env``: this process's environment without any OpenTelemetry, torchrun, bridge or rotel state, the
  repository on ``PYTHONPATH`` (children import ``tests.support``);
- ``otlp_env``: that, exporting every signal over OTLP to a receiver (or an endpoint: ``closed_endpoint()`` is a
  collector that is down) at a test's pace;
- ``use_otlp``: this process exporting as such a child would (providers a test builds in-process);
- ``files_env``: exporting every signal to OTLP JSON Lines files, which ``torchelastic-otel report`` reads;
- ``prometheus_env``: metrics only, served for Prometheus to scrape;
- ``plain_env``: plain torchrun (no OpenTelemetry, no bridge bootstrap).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support import ROOT
from tests.support.ports import HOST, free_port

if TYPE_CHECKING:
    import pytest

    from tests.support.otlp_receiver import OtlpReceiver

#: What a child must not inherit from the test process: its own exporters' settings, torchrun's, the bridge's, a
#: trace context, rotel's.
DROPPED_PREFIXES = ("OTEL_", "TORCHELASTIC_", "TRACEPARENT", "TRACESTATE", "ROTEL_")
TORCHRUN_VARS = frozenset({
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
    "MASTER_PORT", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
})  # fmt: skip
#: Spans and records batched for 200 ms (the SDK's default: 5 s), metrics at the SDK's own interval: what a child
#: program that measures its own export at exit wants.
BATCHES = {"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_BLRP_SCHEDULE_DELAY": "200"}
#: A test's pace: metrics exported every second, spans and records batched for 200 ms (the SDK's defaults: 60 s and
#: 5 s, longer than most jobs here live).
PACE = {"OTEL_METRIC_EXPORT_INTERVAL": "1000", **BATCHES}
#: Metrics every second, spans and records at the SDK's own pace: what the jobs that write files for the report use.
EVERY_SECOND = {"OTEL_METRIC_EXPORT_INTERVAL": "1000"}
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
    endpoint for the protocol) or an endpoint URL; at ``pace`` (``{}``: the SDK's own intervals); plus ``extra``
    (which wins over both)."""
    if isinstance(target, str):
        endpoint = target
    else:
        endpoint = target.grpc_endpoint if protocol == "grpc" else target.http_endpoint
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}
    if protocol == "grpc" and endpoint.startswith("http://"):
        otel["OTEL_EXPORTER_OTLP_INSECURE"] = "true"
    return clean_env(**{**otel, **pace, **extra})


def use_otlp(
    monkeypatch: pytest.MonkeyPatch,
    target: OtlpReceiver | str,
    protocol: str = "grpc",
    pace: Mapping[str, str] = PACE,
    **extra: str,
) -> None:
    """This process exporting as an ``otlp_env`` child would, for providers a test builds in-process: its own
    OpenTelemetry, bridge, trace-context and rotel variables replaced by ``otlp_env``'s, plus ``extra``
    (``monkeypatch`` restores them)."""
    for key in [k for k in os.environ if k.startswith(DROPPED_PREFIXES)]:
        monkeypatch.delenv(key)
    for key, value in otlp_env(target, protocol, pace, **extra).items():
        if key.startswith(DROPPED_PREFIXES) or key in extra:
            monkeypatch.setenv(key, value)


def closed_endpoint() -> str:
    """An endpoint nothing listens on (127.0.0.1): a collector that is down."""
    return f"http://127.0.0.1:{free_port()}"


def files_env(files: Path, pace: Mapping[str, str] = EVERY_SECOND, **extra: str) -> dict[str, str]:
    """``clean_env`` exporting every signal to OTLP JSON Lines files in ``files``, at ``pace`` (metrics every second;
    ``{}``: the SDK's own intervals); plus ``extra`` (which wins over both)."""
    return clean_env(**{**FILE_EXPORTERS, "TORCHELASTIC_OTEL_FILE_DIR": str(files), **pace, **extra})


def prometheus_env(port: int, **extra: str) -> dict[str, str]:
    """``clean_env`` exporting metrics only, served for Prometheus on 127.0.0.1:``port`` (a worker's: ``port`` + 1 +
    its local rank); plus ``extra``."""
    metrics_only = {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_TRACES_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
    served = {"OTEL_EXPORTER_PROMETHEUS_HOST": HOST, "OTEL_EXPORTER_PROMETHEUS_PORT": str(port)}
    return clean_env(**{**metrics_only, **served, **extra})


def plain_env(**extra: str) -> dict[str, str]:
    """``clean_env`` for plain torchrun: no OpenTelemetry and no bridge bootstrap on ``PYTHONPATH``."""
    env = clean_env(**extra)
    bootstrap = os.path.join("torchelastic_otel", "_bootstrap")
    env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep) if bootstrap not in p)
    return env
