"""The process that turns a torchrun worker's output into OpenTelemetry log records.

A worker forks it at interpreter start-up (``output``), next to the pass-through process
(``output_passthrough``), which forwards every chunk of the worker's stdout and stderr here in frames. Here the
chunks become lines (``output_lines``: cut, rate-limited, the tail kept) and the lines records -- but for lines a
logging handler printed to the console, whose logging records the worker exports itself (announced through a pipe
of their own, read after each read of frames: ``output_lines.Logged``; those of a worker's last seconds are exported
after all when it died without saying its records were out):

- body: the line, without its newline (UTF-8; invalid bytes replaced, counted as ``bytes_decoded``);
- ``log.iostream``: ``stdout`` or ``stderr``; severity INFO for stdout, WARN for stderr (tracebacks, warnings,
  progress bars and logging's console output go there; logging's own records carry their real level);
- timestamp: when the pass-through process read the chunk;
- trace context: the agent's attempt span (``TRACEPARENT``), as the worker's own records;
- scope ``torchelastic_otel.worker.output``; resource: the worker's (run, role, ranks, restart count from
  torchrun's environment), with this process's ``process.pid`` and the worker's as ``process.parent_pid``.

The pipeline is built from ``OTEL_*`` by the bridge's ``_export.providers`` on the first frame, so a worker that prints
nothing costs no exporter. Its meter provider exports the counters of what was dropped here (push exporters
only: a Prometheus port is the worker's). This process is single-threaded: when it falls behind (a burst while its
exporter catches up), the frames wait in the pipe and then are dropped by the pass-through process (counted),
never the worker. Once the output has ended it spends at most :data:`END_SECONDS` on what it still holds, then
flushes within the exit bound and exits; nobody waits for it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

from opentelemetry._logs import SeverityNumber

from torchelastic_otel import _compat
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import bounded as _bounded
from torchelastic_otel._torch.output.lines import Limits, Line, Lines, Logged
from torchelastic_otel._torch.output.passthrough import HEADER, MIDLINE, STREAMS, detach
from torchelastic_otel.version import __version__

__all__ = ["serve", "SCOPE"]

SCOPE = "torchelastic_otel.worker.output"
#: How long this process may spend on what it holds once the worker's output ended.
END_SECONDS = 5.0
#: The longest a record waits for room in the SDK's batch queue while its exports make progress.
ROOM_WAIT_SECONDS = 1.0

_SEVERITY = {"stdout": (SeverityNumber.INFO, "INFO"), "stderr": (SeverityNumber.WARN, "WARN")}


def serve(frames_fd: int, worker_pid: int, limits: Limits, logged_fd: int = -1) -> NoReturn:
    """The forked child's whole life: frames in until the pass-through process closes the pipe, records out."""
    try:
        try:
            detach("te-otel-records")
        except Exception:
            pass
        lines = Lines(limits, STREAMS)
        records = Records(worker_pid)
        logged = Logged(limits.max_line)
        announced = _reader(logged, logged_fd)
        for stream, flags, lost, time_ns, data in frames(frames_fd, announced):
            if lost or flags & MIDLINE:
                lines.lost(stream, lost, bool(flags & MIDLINE))
            if data:
                records.emit(logged.drop(lines.feed(stream, data, time_ns)))
        announced()
        last = logged.drop(lines.finish()) + logged.unexported(time.time_ns())
        records.finish(sorted(last, key=lambda line: line.time_ns))
    finally:
        os._exit(0)


def _reader(logged: Logged, fd: int) -> Callable[[], None]:
    """Reads what the worker announced so far (non-blocking); nothing if there is no pipe."""
    if fd < 0:
        return lambda: None
    try:
        os.set_blocking(fd, False)
    except OSError:
        return lambda: None

    def read() -> None:
        try:
            logged.read(fd)
        except Exception:  # never the end of this process: the lines are exported as they are
            pass

    return read


def frames(fd: int, after_read: Callable[[], None] | None = None) -> Iterator[tuple[str, int, int, int, bytes]]:
    """``(stream, flags, lines lost before, time ns, data)`` of every frame, until the writer closes the pipe;
    ``after_read`` runs after each read, before its frames: the announcements of their lines are in by then."""
    buffer = bytearray()
    while True:
        try:
            chunk = os.read(fd, 1024 * 1024)
        except InterruptedError:  # pragma: no cover - retried by os.read (PEP 475)
            continue
        except OSError:
            chunk = b""
        if not chunk:
            return
        if after_read is not None:
            after_read()
        buffer += chunk
        start = 0
        while len(buffer) - start >= HEADER.size:
            index, flags, lost, time_ns, length = HEADER.unpack_from(buffer, start)
            end = start + HEADER.size + length
            if end > len(buffer):
                break
            yield STREAMS[index], flags, lost, time_ns, bytes(buffer[start + HEADER.size : end])
            start = end
        del buffer[:start]


class Records:
    """Lines to log records through this process's own pipeline (built on first use)."""

    def __init__(self, worker_pid: int) -> None:
        self.worker_pid = worker_pid
        self._pipeline: _Pipeline | None = None
        self._unavailable = False

    def emit(self, lines: list[Line], deadline: float | None = None) -> int:
        """Export ``lines``; the number done before ``deadline`` (the rest is the caller's to count)."""
        if not lines:
            return 0
        pipeline = self._get()
        if pipeline is None:
            selftelemetry.count(selftelemetry.DROPPED, "logs", "pipeline_unavailable", len(lines))
            return len(lines)
        for done, line in enumerate(lines):
            if deadline is not None and time.monotonic() >= deadline:
                return done
            pipeline.wait_for_room(deadline)
            try:
                pipeline.emit(line)
            except Exception:
                selftelemetry.count(selftelemetry.DROPPED, "logs", "conversion_error")
        return len(lines)

    def finish(self, tail: list[Line]) -> None:
        """The output has ended: ``tail`` (the last lines, never rate-limited) within :data:`END_SECONDS`, then
        records and counters flushed and the providers shut down, each within the exit bound."""
        done = self.emit(tail, time.monotonic() + END_SECONDS)
        if done < len(tail):
            selftelemetry.count(selftelemetry.DROPPED, "logs", "exit_timeout", len(tail) - done)
        if self._pipeline is not None:
            self._pipeline.shutdown()

    def _get(self) -> _Pipeline | None:
        if self._pipeline is None and not self._unavailable:
            try:
                self._pipeline = _Pipeline(self.worker_pid)
            except Exception:
                self._unavailable = True
        return self._pipeline


class _Pipeline:
    """This process's logger and meter providers, built by the bridge's ``_export.providers`` from ``OTEL_*``."""

    def __init__(self, worker_pid: int) -> None:
        from opentelemetry.sdk.resources import Resource

        from torchelastic_otel._export import providers as _providers
        from torchelastic_otel._torch.worker_env import agent_context

        resource = _providers.resource().merge(Resource({"process.parent_pid": worker_pid}))
        self.logger_provider = _providers.build_logger_provider(resource)
        self.meter_provider = _providers.build_meter_provider(resource, pull=False)
        selftelemetry.instrument(self.meter_provider)
        self.logger = self.logger_provider.get_logger(SCOPE, __version__)
        self.context = agent_context()
        self.processors = list(_providers.processors(self.logger_provider))

    def wait_for_room(self, deadline: float | None) -> None:
        """While the SDK's batch queue is full and its exports make progress, wait (bounded) rather than have the
        record dropped there: a burst of lines then goes out as fast as the collector takes it."""
        limit = time.monotonic() + ROOM_WAIT_SECONDS
        if deadline is not None:
            limit = min(limit, deadline)
        while any(_full(p) for p in self.processors) and not _bounded.backend_down() and time.monotonic() < limit:
            time.sleep(0.002)

    def emit(self, line: Line) -> None:
        try:
            body = line.data.decode("utf-8")
        except UnicodeDecodeError:
            selftelemetry.count(selftelemetry.SANITIZED, "logs", "bytes_decoded")
            body = line.data.decode("utf-8", "replace")
        severity_number, severity_text = _SEVERITY[line.stream]
        self.logger.emit(
            timestamp=line.time_ns,
            observed_timestamp=line.time_ns,
            context=self.context,
            severity_number=severity_number,
            severity_text=severity_text,
            body=body,
            attributes={"log.iostream": line.stream},
        )

    def shutdown(self) -> None:
        """Records first, then the counters, so those include what happened to the records."""
        for provider in (self.logger_provider, self.meter_provider):
            try:
                provider.shutdown()
            except Exception:
                pass


def _full(processor: object) -> bool:
    state = _compat.batch_queue(processor)
    return state is not None and not state.shut_down and state.length >= state.limit - 1
