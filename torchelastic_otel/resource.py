"""Resource attributes that identify a process of a torchrun job (run, role, ranks, restart count, host).

torchrun exports these to every worker's environment; the agent knows the run id from its own arguments
(``TORCHELASTIC_RUN_ID`` is set for it by the bridge's launcher routes). They go on the resource, not on each
record, so every signal of a worker carries them once and backends can group a job's processes.
"""

from __future__ import annotations

import os

from torchelastic_otel import _names as names

__all__ = ["torchrun_attributes", "remember", "RESOURCE_ENV"]

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


#: torchrun's variables as a worker found them at start-up (``remember``). A library may empty ``os.environ`` for a
#: moment on the main thread (accelerate's ``KwargsHandler.to_kwargs``, which Hugging Face's Trainer calls): a
#: pipeline built on another thread meanwhile would otherwise name no rank.
_REMEMBERED: dict[str, str] = {}


def remember() -> None:
    """Keep torchrun's variables as they are now (a worker's start-up): ``torchrun_attributes`` falls back on
    them for a variable ``os.environ`` lacks when it is read."""
    _REMEMBERED.clear()
    _REMEMBERED.update({var: os.environ[var] for var, _ in RESOURCE_ENV.values() if os.environ.get(var)})


def torchrun_attributes(environ: os._Environ[str] | dict[str, str] | None = None) -> dict[str, str | int]:
    """Attributes from torchrun's environment (only those present, or remembered at start-up), plus ``host.name``
    and ``process.pid``."""
    env: os._Environ[str] | dict[str, str] = os.environ if environ is None else environ
    if environ is None and _REMEMBERED:
        env = {**_REMEMBERED, **{k: v for k, v in os.environ.items() if v}}
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
    import socket  # here: a worker's start-up imports this module (``remember``), and needs no socket

    attrs["host.name"] = socket.gethostname()
    attrs["process.pid"] = os.getpid()
    return attrs
