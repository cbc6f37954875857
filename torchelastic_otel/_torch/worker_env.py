"""What a torchrun worker's environment says about it: whether it is one, and the agent's trace context for it.

Kept free of the rest of the bridge (no buffers, no threads, no torch) because a worker reads it at interpreter
start-up, before it forks the process that carries its output (``output``), and that process reads it too.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["is_torchrun_worker", "agent_context"]


def is_torchrun_worker() -> bool:
    """torchrun sets ``RANK`` and ``TORCHELASTIC_RUN_ID`` for every worker it starts."""
    return "RANK" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ


def agent_context() -> Any:
    """The context whose parent span is the agent's attempt (W3C ``TRACEPARENT`` / ``TRACESTATE`` set by the
    bridged agent for the workers of an attempt); ``None`` if there is none or it is not valid."""
    traceparent = os.environ.get("TRACEPARENT")
    if not traceparent:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": traceparent}
    if os.environ.get("TRACESTATE"):
        carrier["tracestate"] = os.environ["TRACESTATE"]
    ctx = TraceContextTextMapPropagator().extract(carrier)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None
