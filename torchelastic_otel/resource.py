"""Resource attributes that identify a process of a torchrun job (run, role, ranks, restart count, host).

torchrun exports these to every worker's environment; the agent knows the run id from its own arguments
(``TORCHELASTIC_RUN_ID`` is set for it by the bridge's launcher routes). They go on the resource, not on each
record, so every signal of a worker carries them once and backends can group a job's processes.
"""

from __future__ import annotations

import os
import socket

from torchelastic_otel import _names as names

__all__ = ["torchrun_attributes", "RESOURCE_ENV"]

#: resource attribute -> (environment variable, type)
RESOURCE_ENV: dict[str, tuple[str, type]] = {
    names.RUN_ID: ("TORCHELASTIC_RUN_ID", str),
    names.ROLE: ("ROLE_NAME", str),
    names.RANK: ("RANK", int),
    names.LOCAL_RANK: ("LOCAL_RANK", int),
    names.GROUP_RANK: ("GROUP_RANK", int),
    names.ROLE_RANK: ("ROLE_RANK", int),
    names.WORLD_SIZE: ("WORLD_SIZE", int),
    names.LOCAL_WORLD_SIZE: ("LOCAL_WORLD_SIZE", int),
    names.RESTART_COUNT: ("TORCHELASTIC_RESTART_COUNT", int),
    names.MAX_RESTARTS: ("TORCHELASTIC_MAX_RESTARTS", int),
}


def torchrun_attributes(environ: os._Environ[str] | dict[str, str] | None = None) -> dict[str, str | int]:
    """Attributes from torchrun's environment (only those present), plus ``host.name`` and ``process.pid``."""
    env = os.environ if environ is None else environ
    attrs: dict[str, str | int] = {}
    for key, (var, kind) in RESOURCE_ENV.items():
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        if kind is int:
            try:
                attrs[key] = int(raw)
            except ValueError:
                continue
        else:
            attrs[key] = raw[:256]
    if attrs:
        attrs[names.PROCESS_KIND] = "worker" if "RANK" in env else "agent"
    attrs["host.name"] = socket.gethostname()
    attrs["process.pid"] = os.getpid()
    return attrs
