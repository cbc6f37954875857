"""A worker's final words (the files ``torchelastic_otel._torch.final_words`` leaves for its agent) delivered by an
agent built in this process: its logger and tracer providers built by the bridge from this process's environment
(``env.use_otlp`` points them at a receiver), as a real agent's are."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def delivered_by_agent(directory: Path) -> Iterator[tuple[int, Any]]:
    """Deliver what workers left in ``directory`` through a new agent's providers, flushed; ``(records and spans
    delivered, the agent's resource)``; the providers are shut down on the way out."""
    from torchelastic_otel._export import providers
    from torchelastic_otel._torch import final_words

    resource = providers.resource()
    agent = types.SimpleNamespace(
        logger_provider=providers.build_logger_provider(resource),
        tracer_provider=providers.build_tracer_provider(resource),
    )
    try:
        delivered = final_words.deliver(str(directory), agent)
        agent.logger_provider.force_flush()
        agent.tracer_provider.force_flush()
        yield delivered, resource
    finally:
        agent.logger_provider.shutdown()
        agent.tracer_provider.shutdown()
