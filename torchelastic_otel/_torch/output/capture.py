"""Every line a torchrun worker writes to stdout and stderr becomes an OpenTelemetry log record.

Started at the worker's interpreter start-up (the bridge's ``sitecustomize``), before the training script and
torch's import print anything. Fds 1 and 2 become pipes -- ptys where they were a terminal, so ``isatty()``, the
terminal size, colours and C stdio's line buffering stay what they were -- and two small processes are forked:

- the pass-through process (``output_passthrough``) reads the pipes and writes every byte to where fds 1 and 2
  pointed before, at once and first; it outlives the worker until every writer has closed the pipes, so nothing
  the worker wrote is lost from the console, whatever it died of;
- the record process (``output_records``) gets the bytes from it and turns lines into records
  (``output_lines``: cut, rate-limited, the last lines kept) -- but for the lines a logging handler printed to the
  console: the worker's logging capture (``worker.log_records``) exports their records, and announces each such
  line to the record process (:func:`announce`: one non-blocking write to a pipe of its own) before the handler
  writes it, so the line is not exported a second time.

So the capture sits beneath whatever torchrun set up for the worker: the console, ``--tee`` / ``--redirects`` /
``--log-dir`` files and ``--local-ranks-filter`` behave as without the bridge, and output of native code (gloo,
C++ warnings) and of child processes, which write to the same fds, is captured too.

Why not torchrun's ``--logs-specs`` plug-in in the agent: a ``LogsSpecs`` can only name files for a worker's
streams, so capturing through it turns a worker's terminal into a file or FIFO (``isatty()`` false: no colours,
progress bars change; C stdio block-buffers native code's output, which then shows up late and dies with a
crashed worker), it is one launcher route's only (not ``opentelemetry-instrument``'s or a custom launcher's), and
the agent's one process, its monitor loop included, would do every worker's line work.

The worker's exit and its SIGTERM (``runtime``'s signal hook) first let the pass-through process catch up with
everything written so far (:func:`sync`), so a worker's last lines are on the console before the agent reports its
end. A worker that ends with ``os._exit`` or SIGKILL loses nothing either: the pipes are drained to their end.

``TORCHELASTIC_OTEL_WORKER_OUTPUT=0`` turns it off; ``output_lines.Limits`` lists the bounds.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import socket
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchelastic_otel import _settings
from torchelastic_otel._process import runtime
from torchelastic_otel._process import stacks as _stacks
from torchelastic_otel._settings import EXIT_TIMEOUT_MILLIS, sdk_disabled
from torchelastic_otel._torch.worker_env import is_torchrun_worker

if TYPE_CHECKING:
    from torchelastic_otel._torch.output.lines import Limits

__all__ = ["start", "sync", "capturing", "announce", "announcing", "console_stream", "ENABLE_ENV", "CAPTURED_ENV"]

ENABLE_ENV = _settings.WORKER_OUTPUT.name
#: Set in a captured worker's environment (the pids of its two output processes): its child processes inherit the
#: captured fds, so their output is the worker's already and they do not capture it again.
CAPTURED_ENV = _settings.OUTPUT_READER.name
#: How long a worker waits at exit or SIGTERM for its output to be on its way (a reader keeping up answers at once).
SYNC_MILLIS = min(500, EXIT_TIMEOUT_MILLIS)
#: A worker's pipes hold this much before a write waits for the reader (Linux's limit for unprivileged users).
PIPE_BYTES = 1024 * 1024


@dataclass
class _Capture:
    """The worker's end of a running capture: the pass-through process's pid and the socket that syncs with it."""

    pid: int
    passthrough_pid: int
    control: socket.socket
    lock: threading.Lock = field(default_factory=threading.Lock)
    token: int = 0


_capture: list[_Capture] = []
#: The worker's end of the pipe of announced lines (:func:`announce`), with the header that frames them: kept by
#: forked children too (their fds 1 and 2 are the worker's pipes), and the text one announcement carries at most.
#: Empty while nothing is captured.
_logged: list[tuple[int, Any, int]] = []


def capturing() -> bool:
    """Whether this process's output is being captured by a reader it started."""
    return bool(_capture) and _capture[0].pid == os.getpid()


def wanted() -> bool:
    """A torchrun worker, capture not turned off, not captured by a parent already, and log records exported
    somewhere but the console (records of console lines printed to the console would be the console twice)."""
    exporters = _settings.logs_exporters()
    return (
        is_torchrun_worker()
        and _settings.WORKER_OUTPUT.get()
        and not _settings.OUTPUT_READER.get()
        and not sdk_disabled()
        and bool(exporters - {"none", "console"})
        and hasattr(os, "fork")
    )


def start() -> bool:
    """Capture fds 1 and 2 of this process (see above); ``True`` if started. Never raises: on any failure the
    worker's output is left exactly as it was."""
    if _capture or not wanted():
        return False
    try:
        return _start()
    except Exception as exc:
        sys.stderr.write(f"torchelastic_otel: worker output not captured: {exc}\n")
        return False


def _start() -> bool:
    from torchelastic_otel._torch.output.lines import Limits

    limits = Limits.from_env()
    opened: list[int] = []
    try:
        channels = [(index, fd, *_channel(fd, opened)) for index, fd in enumerate((1, 2)) if _is_open(fd)]
        if not channels:
            return False
        frames_read, frames_write = os.pipe()
        opened += [frames_read, frames_write]
        _grow(frames_write)
        logged_read, logged_write = os.pipe()
        opened += [logged_read, logged_write]
        _grow(logged_write)
        control, passthrough_control = socket.socketpair()
    except OSError:
        for fd in opened:
            os.close(fd)
        raise
    worker_pid = os.getpid()
    sockets = (control, passthrough_control)
    try:
        records_pid = _fork(lambda: _run_records(opened, sockets, (frames_read, logged_read), worker_pid, limits))
        passthrough_pid = _fork(lambda: _run_passthrough(channels, opened, sockets, frames_write))
    except OSError:  # no process could be started: the worker's fds stay as they are (a record process ends)
        for fd in opened:
            os.close(fd)
        for sock in sockets:
            sock.close()
        raise
    passthrough_control.close()
    os.close(frames_read)
    os.close(frames_write)
    os.close(logged_read)
    os.set_blocking(logged_write, False)  # an announcement never waits: when the pipe is full, it is not sent
    for _index, fd, reader_end, worker_end in channels:
        os.close(reader_end)
        os.dup2(worker_end, fd)  # inheritable, as fds 1 and 2 are
        os.close(worker_end)
    _capture.append(_Capture(worker_pid, passthrough_pid, control))
    from torchelastic_otel._torch.output.lines import LOGGED_BYTES, LOGGED_HEADER

    _logged.append((logged_write, LOGGED_HEADER, LOGGED_BYTES - LOGGED_HEADER.size))
    os.environ[CAPTURED_ENV] = f"{passthrough_pid},{records_pid}"
    atexit.register(_at_exit)  # registered first: runs after the bridge's own exit handler
    runtime.add_signal_hook(_on_signal)
    return True


def _fork(child: Callable[[], object]) -> int:
    """Fork; the child runs ``child`` and ends with ``os._exit`` whatever happens."""
    pid = os.fork()
    if pid == 0:
        try:
            child()
        finally:
            os._exit(0)
    return pid


def _run_records(
    opened: list[int],
    sockets: tuple[socket.socket, socket.socket],
    reads: tuple[int, int],
    worker_pid: int,
    limits: Limits,
) -> None:
    """The record process keeps only the read ends of the frames pipe and of the announced lines' pipe."""
    from torchelastic_otel._torch.output.records import serve

    for sock in sockets:
        sock.close()
    for fd in opened:
        if fd not in reads:
            os.close(fd)
    frames_read, logged_read = reads
    serve(frames_read, worker_pid, limits, logged_read)


def _run_passthrough(
    channels: list[tuple[int, int, int, int]],
    opened: list[int],
    sockets: tuple[socket.socket, socket.socket],
    frames_write: int,
) -> None:
    """The pass-through process keeps the reading ends, copies of the original fds 1 and 2, its end of the
    control socket and the write end of the frames pipe."""
    from torchelastic_otel._torch.output.passthrough import Channel, serve

    control, passthrough_control = sockets
    control.close()
    ours = [Channel(index, reader_end, os.dup(fd)) for index, fd, reader_end, _worker_end in channels]
    keep = {frames_write, *(c.read_fd for c in ours)}
    for fd in opened:
        if fd not in keep:
            os.close(fd)
    serve(ours, passthrough_control.detach(), frames_write)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _channel(fd: int, opened: list[int]) -> tuple[int, int]:
    """(reader's end, worker's end) for ``fd``: a pty in raw mode with the terminal's size where ``fd`` is a
    terminal, else a pipe of :data:`PIPE_BYTES`."""
    if os.isatty(fd):
        reader_end, worker_end = os.openpty()  # glibc opens the pty with O_NOCTTY: no controlling terminal
        opened += [reader_end, worker_end]
        tty.setraw(worker_end)  # bytes unchanged ("\n" stays "\n": the real terminal translates it)
        try:
            fcntl.ioctl(worker_end, termios.TIOCSWINSZ, fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
        except OSError:
            pass
        return reader_end, worker_end
    reader_end, worker_end = os.pipe()
    opened += [reader_end, worker_end]
    _grow(worker_end)
    return reader_end, worker_end


def _grow(fd: int) -> None:
    """Make the pipe of ``fd`` hold :data:`PIPE_BYTES` (the default, 64 KiB, where that is not allowed)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (AttributeError, OSError):
        pass


def announcing() -> bool:
    """Whether lines printed to fds 1 and 2 of this process can be announced (:func:`announce`)."""
    return bool(_logged)


def console_stream(fd: int) -> int:
    """The stream index (0: stdout, 1: stderr) of ``fd`` if it is one of the captured fds and lines printed to it
    can be announced, else -1."""
    return fd - 1 if _logged and fd in (1, 2) else -1


def announce(stream: int, text: bytes) -> bool:
    """Tell the record process that ``text`` (whole lines) is about to be printed to ``stream`` (0: stdout,
    1: stderr) by a logging handler whose record is exported: its lines are left out of the line records.

    Called in the logging thread, right before the handler writes: one non-blocking write of at most
    ``lines.LOGGED_BYTES`` (atomic on a pipe, whichever thread or forked child sends it) for a short text, nothing that
    waits. ``False`` if not (all) sent -- the pipe is full or gone, or a line is too long to announce: those lines
    are then exported as line records too, never lost. Never raises."""
    if not _logged:
        return False
    fd, header, room = _logged[0]
    try:
        now = time.time_ns()
        if len(text) <= room:
            os.write(fd, header.pack(stream, now, len(text)) + text)
            return True
        sent = True
        for part in _parts(text, room):
            if part is None:
                sent = False
            else:
                os.write(fd, header.pack(stream, now, len(part)) + part)
        return sent
    except OSError:  # BlockingIOError: the record process is behind; others: it is gone
        return False


def _parts(text: bytes, room: int) -> Iterator[bytes | None]:
    """``text`` in pieces of at most ``room`` bytes cut after a newline; ``None`` for a line longer than that."""
    start = 0
    while start < len(text):
        end = start + room
        if end >= len(text):
            yield text[start:]
            return
        cut = text.rfind(b"\n", start, end)
        if cut < 0:  # one line longer than an announcement: left out (exported as a line record as well)
            nxt = text.find(b"\n", end)
            yield None
            start = len(text) if nxt < 0 else nxt + 1
            continue
        yield text[start : cut + 1]
        start = cut + 1


def sync(timeout_millis: int = SYNC_MILLIS) -> bool:
    """Wait (at most ``timeout_millis``) until the reader has passed through everything written before this call.

    ``True`` once it has; ``False`` if it is gone, slow, or this is a forked child (whose parent owns the reader).
    """
    if not capturing():
        return False
    capture = _capture[0]
    deadline = time.monotonic() + max(0, timeout_millis) / 1000
    if not capture.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
        return False
    try:
        capture.token = capture.token % 255 + 1
        token = bytes([capture.token])
        control = capture.control
        control.settimeout(max(0.001, deadline - time.monotonic()))
        control.sendall(token)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            control.settimeout(remaining)
            answer = control.recv(64)
            if not answer:
                return False  # the reader is gone
            if token in answer:
                return True  # an older answer that came late is skipped
    except OSError:
        return False
    finally:
        capture.lock.release()


def _at_exit() -> None:
    """What Python still buffers goes out now rather than after the exit handlers, then through the reader; and
    the record process learns that the worker's logging records went out (the bridge's exit handler, which runs
    before this one, flushed them): it need not export their console lines after all (``lines.Logged``)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass
    if capturing():
        announce(LOGGED_END, b"")
    sync()


#: The stream index of the announcement that the worker's logging records are out (``lines.LOGGED_END``).
LOGGED_END = 255


def _on_signal(signum: int, stacks: _stacks.Stacks) -> Callable[[bool], None]:
    """SIGTERM: what the worker wrote is on the console before it dies (Python's buffers are lost, as without
    the bridge); once the final flush (or the hand-over to the agent) is done, the record process learns that the
    worker's logging records are out, as at a normal exit."""
    sync()

    def records_out(delivered: bool) -> None:
        if capturing():
            announce(LOGGED_END, b"")

    return records_out
