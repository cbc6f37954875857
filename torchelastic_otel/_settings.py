"""The bridge's own settings (``TORCHELASTIC_OTEL_*``); everything else is configured by ``OTEL_*``."""

from __future__ import annotations

import os


def env_millis(name: str, default: int) -> int:
    """A non-negative number of milliseconds from the environment; ``default`` when unset or not a number."""
    try:
        return max(0, int(os.environ.get(name, "") or default))
    except ValueError:
        return default


def sdk_disabled() -> bool:
    """``OTEL_SDK_DISABLED`` as the specification reads it (case-insensitive ``true``)."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


#: Total time the exit paths (end of an agent run, SIGTERM or an uncaught exception in a worker, interpreter exit,
#: a user's flush or shutdown of the bridge's providers with the collector down) may spend delivering what is left:
#: a dead backend must not hold the job up.
EXIT_TIMEOUT_MILLIS = env_millis("TORCHELASTIC_OTEL_EXIT_TIMEOUT_MILLIS", 1000)
#: How long a flush waits once the backend is known to be down.
DOWN_WAIT_MILLIS = 100
