"""Which rank of a failed attempt failed first, and why: the root cause the agent reports.

When a rank fails, the others soon fail too (a gloo/NCCL collective loses its peer, a store times out) or are
stopped by the agent: they are consequences. torchrun ranks the failures of its worker group by their error-file
timestamp and prints the first as "Root Cause", as console text on one node, and only for scripts decorated with
``@record`` (otherwise there is no error file, hence no traceback, and the time is when the agent noticed).

Here each worker's uncaught exception is also written to a small file of the bridge's (``write_failure``: the
exception's type, message and traceback, and its time in nanoseconds) in a directory the agent creates and hands to
the workers it starts (``TORCHELASTIC_OTEL_FAILURE_DIR`` in their environment only: the agent's own ``os.environ``
is left as it was, see ``agent_failure_dir``); ``find`` then ranks an attempt's failures by the most precise time
known for each -- that file's, else torch's error-file timestamp (whole seconds), else when the agent observed the
exit -- and returns the first with its exit code or signal, traceback and the other ranks (failed later, or still
running and so stopped by the agent) as consequences. Two corrections to plain time order: a rank still exiting
with a failure file written counts as failed (it raised before its peers noticed), and a communication error (a peer
lost in a collective) gives way to another rank's own failure close after it (``_first``).

A rank that dies of a CUDA out-of-memory error also writes the allocator's figures for its device (``cuda_memory``:
device, allocated, reserved, peak, total, in bytes; the worker reads them, ``_torch.worker.memory.oom_figures``);
they become the root cause's ``torchelastic.root_cause.cuda_memory.*`` attributes. A value in the file that is no
such figure (not a non-negative integer) is left out and counted (``sanitized``, ``cuda_memory_invalid``).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import _settings
from torchelastic_otel.events._otel import parse_error

__all__ = [
    "FAILURE_DIR_ENV",
    "CUDA_MEMORY_KEYS",
    "RootCause",
    "agent_failure_dir",
    "attributes",
    "discard_failure_dir",
    "failure_dir",
    "find",
    "make_failure_dir",
    "write_failure",
]

FAILURE_DIR_ENV = _settings.FAILURE_DIR.name
#: Bound on what a worker writes and the agent reads (a traceback of a deep recursion is megabytes).
MAX_TEXT = 16384
_NOT_AVAILABLE = "<N/A>"
#: How far after the first failure a rank's own (non-communication) failure still counts as what the first lost.
PEER_LOSS_WINDOW_NS = 10 * 1_000_000_000
_PEER_LOSS_TYPES = frozenset({"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"})
#: A CUDA out-of-memory error's figures in the failure file (``cuda_memory``), and their root-cause attributes.
CUDA_MEMORY_KEYS = {
    "device": names.ROOT_CAUSE_CUDA_DEVICE,
    "allocated": names.ROOT_CAUSE_CUDA_ALLOCATED,
    "reserved": names.ROOT_CAUSE_CUDA_RESERVED,
    "peak": names.ROOT_CAUSE_CUDA_PEAK,
    "total": names.ROOT_CAUSE_CUDA_TOTAL,
}
_MAX_BYTES = 1 << 62  # no device holds more: a larger figure is not one
_PEER_LOSS_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "remote process exited",
    "NCCL communicator was aborted",
)


@dataclass
class RootCause:
    """The first failure of an attempt on one agent."""

    rank: int
    local_rank: int | None
    pid: int | None
    time_unix_nano: int
    time_source: str  # "exception" (the worker's own time), "error_file" (torch's, whole seconds) or "exit_observed"
    exit_code: int | None = None
    signal: str | None = None
    exception_type: str | None = None
    exception_message: str | None = None
    exception_stacktrace: str | None = None
    consequences: list[int] = field(default_factory=list)
    cuda_memory: dict[str, int] | None = None  # a CUDA OOM's figures (``CUDA_MEMORY_KEYS``), bytes

    @property
    def reason(self) -> str:
        """One short word for the cause: the exception type, the signal, or the exit code."""
        if self.exception_type:
            return self.exception_type
        if self.signal:
            return self.signal
        return f"exit {self.exit_code}" if self.exit_code is not None else "unknown"


# ---- worker side ----------------------------------------------------------------------------------------------


def make_failure_dir() -> str:
    """A fresh directory for the workers' failure files (the agent's; removed with the bridge)."""
    return tempfile.mkdtemp(prefix="torchelastic-otel-failures-")


class _MadeDir:
    """The failure directory this process made for the workers of its agents, if any: made once on first use, kept
    for the process, removed at exit (registered once) or when the bridge is uninstalled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.path: str | None = None
        self.exit_hook = False

    def get(self) -> str:
        with self.lock:
            if self.path is None:
                self.path = make_failure_dir()
                if not self.exit_hook:
                    self.exit_hook = True
                    atexit.register(discard_failure_dir)
            return self.path

    def discard(self) -> None:
        with self.lock:
            path, self.path = self.path, None
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)


_made = _MadeDir()


def failure_dir() -> str | None:
    """Where the workers of this process's agents write their failures: the directory this process was handed
    (a launcher above it set ``TORCHELASTIC_OTEL_FAILURE_DIR``), else the one it made; ``None`` before either."""
    return _settings.FAILURE_DIR.get() or _made.path


def agent_failure_dir() -> str:
    """The directory to hand to the workers an agent starts: the one this process was handed, else one made on first
    use and kept for the process (removed at exit, or by ``discard_failure_dir`` when the bridge is uninstalled).
    Made here rather than put in ``os.environ``: a process that launches in-process keeps its environment as it
    was, and only the workers' environment carries it."""
    return _settings.FAILURE_DIR.get() or _made.get()


def discard_failure_dir() -> None:
    """Remove the directory this process made for its workers (nothing if it made none)."""
    _made.discard()


def write_failure(
    exc_type: type[BaseException],
    exc: BaseException,
    tb: TracebackType | None,
    cuda_memory: dict[str, int] | None = None,
) -> None:
    """In a worker, on an uncaught exception: write its type, message, traceback and time for the agent, and for a
    CUDA out-of-memory error the allocator's figures (``cuda_memory``: ``_torch.worker.memory.oom_figures``).

    Written to a temporary name and renamed, so the agent never reads half a file. Nothing happens outside a
    bridged torchrun worker. Never raises (the worker is dying already; its own traceback is what matters).
    """
    directory = _settings.FAILURE_DIR.get()
    if not directory or not os.path.isdir(directory):
        return
    try:
        data = {
            "time_unix_nano": time.time_ns(),
            "pid": os.getpid(),
            "type": exc_type.__qualname__,
            "message": _cut(str(exc)),
            "stacktrace": _cut("".join(traceback.format_exception(exc_type, exc, tb)), keep_end=True),
        }
        if cuda_memory:
            data["cuda_memory"] = {key: value for key, value in cuda_memory.items() if key in CUDA_MEMORY_KEYS}
        path = os.path.join(directory, f"{os.getpid()}.json")
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except Exception:
        pass


def _cut(text: str, keep_end: bool = False) -> str:
    """At most ``MAX_TEXT`` characters; a traceback keeps its end (where the exception was raised)."""
    if len(text) <= MAX_TEXT:
        return text
    return "...\n" + text[-(MAX_TEXT - 4) :] if keep_end else text[: MAX_TEXT - 3] + "..."


# ---- agent side -----------------------------------------------------------------------------------------------


def find(
    failures: dict[int, object],
    running_ranks: list[int],
    failure_dir: str | None,
    running_workers: dict[int, object] | None = None,
) -> RootCause | None:
    """The first of ``failures`` (torch's ``{global_rank: ProcessFailure}``) by time, with the other failed ranks
    and ``running_ranks`` (stopped by the agent after it) as consequences; ``None`` if there are no failures.

    A rank the agent still sees running may have failed first all the same: it raised, wrote its failure file and
    is still exiting (flushing, tearing down its process group) when a peer that lost it in a collective has
    already exited. ``running_workers`` (``{global_rank: Worker}``, torch's, whose ``id`` is the pid) lets such a rank
    be ranked by its own time."""
    observed_ns = time.time_ns()
    causes = [_cause(int(rank), failure, failure_dir, observed_ns) for rank, failure in failures.items()]
    if not causes:
        return None
    causes.extend(_exiting(running_workers or {}, {cause.rank for cause in causes}, failure_dir))
    causes.sort(key=lambda cause: (cause.time_unix_nano, cause.rank))
    first = _first(causes)
    first.consequences = sorted(({cause.rank for cause in causes} | {int(r) for r in running_ranks}) - {first.rank})
    return first


def _first(causes: list[RootCause]) -> RootCause:
    """The earliest of ``causes`` (sorted by time) -- unless it is a communication error (a peer lost in a
    collective, the store gone) and a rank failed otherwise within ``PEER_LOSS_WINDOW_NS`` of it: that rank's failure
    is what the others lost it to. Why: a script that tears down its process group on the way out (``finally:
    destroy_process_group()``, a context manager) closes its connections before its exception reaches the
    excepthook that writes its time, so the peer blocked in a collective may raise, and write, first."""
    earliest = causes[0]
    for cause in causes:
        if cause.time_unix_nano - earliest.time_unix_nano > PEER_LOSS_WINDOW_NS:
            break
        if not _lost_a_peer(cause):
            return cause
    return earliest


def _lost_a_peer(cause: RootCause) -> bool:
    """A failure that reads as a consequence of another rank's: torch's distributed errors, or gloo's and NCCL's
    words for a peer that went away (older torch raises them as plain ``RuntimeError``)."""
    if cause.exception_type in _PEER_LOSS_TYPES:
        return True
    message = cause.exception_message or ""
    return cause.exception_type is not None and any(marker in message for marker in _PEER_LOSS_MARKERS)


def _exiting(running_workers: dict[int, object], failed: set[int], failure_dir: str | None) -> list[RootCause]:
    """The running ranks that have written a failure file: they raised and are on their way out."""
    causes = []
    for rank, worker in running_workers.items():
        pid = _int_or_none(getattr(worker, "id", None))
        own = _read_failure(failure_dir, pid) if int(rank) not in failed else None
        if own is None:
            continue
        local_rank = _int_or_none(getattr(worker, "local_rank", None))
        causes.append(_from_failure_file(RootCause(int(rank), local_rank, pid, 0, "exception"), own))
    return causes


def _from_failure_file(cause: RootCause, own: dict[str, Any]) -> RootCause:
    """``cause`` timed and explained by the worker's own failure file (``write_failure``)."""
    cause.time_unix_nano, cause.time_source = own["time_unix_nano"], "exception"
    cause.exception_type, cause.exception_message = own.get("type"), own.get("message")
    cause.exception_stacktrace = own.get("stacktrace")
    cause.cuda_memory = _cuda_memory(own.get("cuda_memory"))
    return cause


def _cuda_memory(raw: object) -> dict[str, int] | None:
    """The figures of the failure file's ``cuda_memory``: the known keys whose value is a non-negative integer
    (a float with no fraction too); anything else is left out and counted. ``None`` without a device."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        selftelemetry.count(selftelemetry.SANITIZED, "logs", "cuda_memory_invalid")
        return None
    out = {}
    for key, value in raw.items():
        number = value if isinstance(value, int) and not isinstance(value, bool) else None
        if isinstance(value, float) and value.is_integer():
            number = int(value)
        if key in CUDA_MEMORY_KEYS and number is not None and 0 <= number <= _MAX_BYTES:
            out[key] = number
        else:
            selftelemetry.count(selftelemetry.SANITIZED, "logs", "cuda_memory_invalid")
    return out if "device" in out else None


def _cause(rank: int, failure: object, failure_dir: str | None, observed_ns: int) -> RootCause:
    pid = _int_or_none(getattr(failure, "pid", None))
    exit_code = _int_or_none(getattr(failure, "exitcode", None))
    cause = RootCause(rank, _int_or_none(getattr(failure, "local_rank", None)), pid, observed_ns, "exit_observed")
    if exit_code is not None and exit_code < 0:
        cause.signal = _signal_name(-exit_code)
    else:
        cause.exit_code = exit_code
    own = _read_failure(failure_dir, pid)
    if own is not None:
        return _from_failure_file(cause, own)
    _from_error_file(cause, failure)
    return cause


def _from_error_file(cause: RootCause, failure: object) -> None:
    """torch's error file (a script decorated with ``@record``): its timestamp (whole seconds) and the exception,
    read as the event mapping reads it (``events._otel.parse_error``)."""
    if getattr(failure, "error_file", _NOT_AVAILABLE) in ("", _NOT_AVAILABLE):
        return
    timestamp = _int_or_none(getattr(failure, "timestamp", None))
    if timestamp:
        cause.time_unix_nano, cause.time_source = timestamp * 1_000_000_000, "error_file"
    data = getattr(failure, "error_file_data", None)
    parsed = parse_error(json.dumps(data)) if isinstance(data, dict) else None
    if parsed is None:
        return
    kind, message, stack = parsed
    cause.exception_type = kind
    cause.exception_message = _cut(message) if message else None
    cause.exception_stacktrace = _cut(stack, keep_end=True) if stack else None


def _read_failure(failure_dir: str | None, pid: int | None) -> dict[str, object] | None:
    if not failure_dir or pid is None:
        return None
    try:
        with open(os.path.join(failure_dir, f"{pid}.json")) as fh:
            data = json.loads(fh.read(4 * MAX_TEXT))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("time_unix_nano"), int):
        return None
    return {key: (_cut(value) if isinstance(value, str) else value) for key, value in data.items()}


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def attributes(cause: RootCause) -> dict[str, object]:
    """The root cause as OpenTelemetry attributes (semantic conventions where there is one)."""
    out: dict[str, object] = {
        names.ROOT_CAUSE_RANK: cause.rank,
        names.ROOT_CAUSE_TIME_UNIX_NANO: cause.time_unix_nano,
        names.ROOT_CAUSE_TIME_SOURCE: cause.time_source,
        names.ROOT_CAUSE_REASON: cause.reason,
        names.ROOT_CAUSE_CONSEQUENCES: cause.consequences,
    }
    optional = {
        names.ROOT_CAUSE_LOCAL_RANK: cause.local_rank,
        "process.pid": cause.pid,
        "process.exit.code": cause.exit_code,
        names.ROOT_CAUSE_SIGNAL: cause.signal,
        "exception.type": cause.exception_type,
        "exception.message": cause.exception_message,
        "exception.stacktrace": cause.exception_stacktrace,
    }
    out.update({key: value for key, value in optional.items() if value is not None})
    out.update({CUDA_MEMORY_KEYS[key]: value for key, value in (cause.cuda_memory or {}).items()})
    return out
