"""The exporter pipeline: the tracer, meter and logger providers the bridge writes to, configured from ``OTEL_*``.

The public calls (:func:`setup`, :func:`flush`, :func:`shutdown`, :func:`get_pipeline`) and what the adapters use.
The pipeline's life is one state machine (``_export.state``: UNSET, BUILDING, READY, FORKED); importing this
module ties it to the process's own life (``runtime``: fork, SIGTERM and exit hooks), so whoever can build a
pipeline has them.
"""

from __future__ import annotations

from torchelastic_otel._export.providers import DEFAULT_SERVICE_NAME
from torchelastic_otel._export.state import (
    Phase,
    Pipeline,
    _reset_for_tests,
    abandon_build,
    add_listener,
    building,
    flush,
    forked,
    generation,
    get_pipeline,
    prepare,
    ready,
    remove_listener,
    renew,
    setup,
    shutdown,
    start_building,
    state,
    wait_built,
    when_ready,
)
from torchelastic_otel._process import runtime  # noqa: F401 - the process's hooks come with the pipeline
from torchelastic_otel._settings import EXIT_TIMEOUT_MILLIS, sdk_disabled

__all__ = [
    "Phase",
    "Pipeline",
    "get_pipeline",
    "ready",
    "building",
    "forked",
    "generation",
    "start_building",
    "abandon_build",
    "wait_built",
    "when_ready",
    "add_listener",
    "remove_listener",
    "setup",
    "flush",
    "shutdown",
    "renew",
    "prepare",
    "state",
    "DEFAULT_SERVICE_NAME",
    "EXIT_TIMEOUT_MILLIS",
    "sdk_disabled",
    "_reset_for_tests",
]
