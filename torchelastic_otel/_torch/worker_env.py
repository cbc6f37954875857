"""What a process's environment says about it: the worker torchrun started, one of its descendants, or neither.

Kept free of the rest of the bridge (no buffers, no threads, no torch, no OpenTelemetry, not even ``__future__`` at
import) because every Python process that inherits a bridged worker's environment reads it at interpreter start-up
(the bootstrap ``sitecustomize``), and so do the worker's output processes.

**Which process is the worker.** A bridged agent hands its workers ``TORCHELASTIC_OTEL_AUTO_INSTALL=1`` and the
bootstrap directory on ``PYTHONPATH``; torchrun hands them ``RANK``, ``TORCHELASTIC_RUN_ID`` and the rest. Every
process the worker starts inherits all of that: ``subprocess`` of ``sys.executable``, ``multiprocessing`` spawn and
forkserver pools, DataLoader workers with a spawn context, a compiler's worker pool. They are not the worker, and
must cost nothing (no torch, no SDK, no output capture of their own, no exit path). So the first bridged Python
process of a lineage marks itself in its own environment (:data:`WORKER_ENV`, ``"<pid> <rank> <restart count>
<run id>"``, see :func:`claim`), which everything it starts inherits. At start-up a process is:

- the **worker** (:data:`WORKER`) if torchrun's variables are set and there is no mark, or the mark is its own
  pid (the worker ``exec``-ed a new image of itself), or the mark names another rank, attempt or run (a torchrun job
  started from inside a worker: its workers are workers of their own job);
- a **descendant** (:data:`DESCENDANT`) if torchrun's variables are set and the mark names another process of the
  same rank, attempt and run;
- **neither** (:data:`OTHER`) without torchrun's variables.

The cases this has to get right:

- ``--no-python`` (a shell script as the worker): the shell is no Python process and marks nothing, so the first
  Python it runs is the worker. A script that runs several Pythons one after the other makes each one a worker in
  turn (each has the rank's output and failure records), the closest thing to "the worker" there is.
- fork (``multiprocessing`` fork context, DataLoader's default, ``os.fork``): the child runs no ``sitecustomize``;
  it is a copy of the worker, bridge included (``_process.runtime``'s fork handlers give it state of its own), and the
  mark in its environment names its parent: :func:`is_torchrun_worker` is ``False`` in it, and whatever Python it
  starts is a descendant.
- spawn / forkserver / ``subprocess``: a new interpreter with the worker's environment: a descendant.
- workers started by ``elastic_launch`` with a Python function as entry point: torch starts them with
  ``multiprocessing`` (spawn by default) and sets ``RANK`` and the rest only after the interpreter started, inside
  the child, just before calling the function. At start-up such a process is :data:`OTHER`: it marks itself with
  its pid only, is bridged lazily like a descendant (below) and its records carry the rank (the resource is built
  on first use, after torch set the variables); a function that wants the worker's own set-up (failure and
  terminated records, logging) calls ``torchelastic_otel.install()``, which then finds it is the worker (the mark is
  its own pid). Its own children are descendants.

**What a descendant or other process gets** (:func:`join_lazily`): nothing at start-up but two post-import hooks
(``imports``). If it imports the bridge's API (``torchelastic_otel.events`` / ``.metrics`` / ``.pipeline``), the
worker's attempt span (``TRACEPARENT``, inherited) becomes the current context of the importing thread, so what it
records joins its worker's trace; its pipeline is built on first use from the inherited ``OTEL_*`` and torchrun
variables, so its resource carries the same run, role and ranks (its own ``process.pid``). If it imports torch's
elastic events or metrics modules, they are bridged as in a worker (no agent lifecycle, no rendezvous import). Its
stdout and stderr are its worker's fds, captured by the worker already: it captures nothing itself.
"""

import os

from torchelastic_otel import _settings, resource

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from torchelastic_otel._torch.patches import Patches

__all__ = [
    "is_torchrun_worker",
    "worker_metadata",
    "agent_context",
    "role",
    "claim",
    "claimed",
    "join_lazily",
    "WORKER_ENV",
    "WORKER",
    "DESCENDANT",
    "OTHER",
]

#: The mark of the first bridged Python process of a lineage (see above).
WORKER_ENV = _settings.WORKER.name
WORKER = "worker"
DESCENDANT = "descendant"
OTHER = "other"


class _Process:
    """What this module keeps for the process, in one place: its role as :func:`claim` found it at start-up,
    whether it joined its worker's telemetry lazily, and (in an agent) what the workers it starts get in their
    environment: var -> (value, prepend to a path list), never put in this process's ``os.environ``."""

    def __init__(self) -> None:
        self.claimed: str | None = None
        self.joined = False
        self.for_workers: dict[str, tuple[str, bool]] = {}


_process = _Process()


def _identity() -> tuple[str, str, str] | None:
    """(rank, restart count, run id) from torchrun's variables; ``None`` if this is no torchrun process."""
    env = os.environ
    rank, run_id = env.get("RANK"), env.get("TORCHELASTIC_RUN_ID")
    if rank is None or run_id is None:
        return None
    return rank, env.get("TORCHELASTIC_RESTART_COUNT", ""), run_id


def role() -> str:
    """:data:`WORKER`, :data:`DESCENDANT` or :data:`OTHER`, from the environment as it is now (see above)."""
    identity = _identity()
    if identity is None:
        return OTHER
    mark = os.environ.get(WORKER_ENV)
    if not mark:
        return WORKER
    pid, _, marked_identity = mark.partition(" ")
    if pid == str(os.getpid()):
        return WORKER
    if marked_identity and tuple(marked_identity.split(" ", 2)) != identity:
        return WORKER  # a worker of a torchrun job started from inside another job's worker
    return DESCENDANT


def is_torchrun_worker() -> bool:
    """Whether this process is the worker torchrun started (not one of its descendants, not a forked copy)."""
    return role() == WORKER


def claim() -> str:
    """At interpreter start-up: this process's :func:`role`, and the mark in its environment for what it starts.

    The worker marks itself with its pid and identity; a process that is neither worker nor descendant and finds
    no mark marks itself with its pid alone (whatever it starts is a descendant, even once torch set ``RANK`` in
    it). A descendant leaves the mark as it is.
    """
    current = role()
    identity = _identity()
    if current == WORKER and identity is not None:
        os.environ[WORKER_ENV] = " ".join((str(os.getpid()), *identity))
        resource.remember()
    elif current == OTHER and not os.environ.get(WORKER_ENV):
        os.environ[WORKER_ENV] = str(os.getpid())
    _process.claimed = current
    return current


def claimed() -> str | None:
    """What :func:`claim` found at start-up; ``None`` if it did not run in this process."""
    return _process.claimed


def agent_context() -> "Any":
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


# ---- a process that is not the worker --------------------------------------------------------------------------

#: Importing one of these means the process records through the bridge: it joins its worker's trace then.
BRIDGE_API_MODULES = ("torchelastic_otel.pipeline",)
#: torch's modules the bridge bridges, if the process imports them.
TORCH_MODULES = ("torch.distributed.elastic.metrics", "torch.distributed.elastic.events")


def span_parent() -> "Any":
    """The context a worker's own span belongs in (a checkpoint, a framework's phase): the agent's attempt
    (:func:`agent_context`), or the current context where its span belongs to the attempt's trace (a span of the
    user's own around the call); the current context where there is no agent."""
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    current = otel_context.get_current()
    agent = agent_context()
    if agent is None:
        return current
    span_context = trace.get_current_span(current).get_span_context()
    if span_context.is_valid and span_context.trace_id == trace.get_current_span(agent).get_span_context().trace_id:
        return current
    return agent


def join_lazily() -> None:
    """A descendant (or other process that inherited a bridged environment) joins its worker's telemetry on first
    use only (see above). Costs two dict entries and a finder now; idempotent."""
    if _process.joined:
        return
    _process.joined = True
    from torchelastic_otel._torch import imports

    for name in BRIDGE_API_MODULES:
        imports.when_imported(name, _enter_worker_trace)
    for name in TORCH_MODULES:
        imports.when_imported(name, _bridge_torch_module)


def _enter_worker_trace(_module: "Any") -> None:
    """The worker's attempt span becomes the current context of the thread that imported the bridge's API."""
    ctx = agent_context()
    if ctx is None:
        return
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    if not trace.get_current_span().get_span_context().is_valid:
        otel_context.attach(ctx)


def _bridge_torch_module(module: "Any") -> None:
    from torchelastic_otel._torch import torch_bridge

    torch_bridge.bridge_torch_module(module)


def worker_metadata() -> "dict[str, Any]":
    """Who this worker is, as torchrun's environment says (the metadata of the worker's own records)."""
    env = os.environ
    return {
        "run_id": env.get("TORCHELASTIC_RUN_ID"),
        "role": env.get("ROLE_NAME"),
        "global_rank": env.get("RANK"),
        "local_rank": env.get("LOCAL_RANK"),
        "group_rank": env.get("GROUP_RANK"),
        "restart_count": env.get("TORCHELASTIC_RESTART_COUNT"),
        "worker_pid": os.getpid(),
    }


# ---- what the workers an agent of this process starts get in their environment ------------------------------

#: What the workers an agent of this process starts get in their environment: var -> (value, prepend to a path list).
#: Never put in this process's ``os.environ``: the agent's wrapper of ``_start_workers`` applies it only while the
#: workers start (``worker_environ``), so a process that launches in-process keeps its environment as it was.


def prepend_env_path(patches: "Patches", var: str, entry: str) -> None:
    """The workers get ``entry`` first on the path list ``var`` (their own value of it, from this process's)."""
    _process.for_workers[var] = (entry, True)
    patches.on_restore(lambda: _process.for_workers.pop(var, None))


def set_env(patches: "Patches", var: str, value: str) -> None:
    """The workers get ``var=value``."""
    _process.for_workers[var] = (value, False)
    patches.on_restore(lambda: _process.for_workers.pop(var, None))


def worker_environ() -> dict[str, str]:
    """The variables to give the workers starting now, against this process's environment as it is now (a path
    entry goes first, also where it is further down: e.g. behind OpenTelemetry's auto-instrumentation directory,
    which ``opentelemetry-instrument`` puts back in front of ``PYTHONPATH``)."""
    out: dict[str, str] = {}
    for var, (value, prepend) in list(_process.for_workers.items()):
        if prepend:
            current = os.environ.get(var)
            parts = [part for part in (current.split(os.pathsep) if current else []) if part != value]
            out[var] = os.pathsep.join([value, *parts])
        else:
            out[var] = value
    return out
