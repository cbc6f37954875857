"""The process that carries a torchrun worker's stdout and stderr to where they went before the bridge.

A worker forks it at interpreter start-up (``output``) and writes into pipes (ptys where its output was a
terminal) that this process reads. Why a process rather than a thread of the worker: a thread dies with the
worker, and what the worker wrote last -- the traceback of a crash, gloo's abort message, everything written just
before a SIGKILL -- would still sit in the pipe, lost even from the console. This process lives until the last
writer (the worker, and its children, which inherit the fds) has closed them, whatever they died of:

- it leaves the worker's process group and ignores job-control signals, so the agent's SIGTERM / SIGKILL of the
  worker's group leaves it running to the end of the output;
- every chunk is written to where the worker's output went before (the console, torchrun's ``--redirects`` /
  ``--tee`` files, ``/dev/null`` for ``--local-ranks-filter``) first, whole, blocking as the worker's own write
  would have: bytes, their order within a stream and the back-pressure of a slow console are as without the
  bridge. A destination that closed (``EPIPE``) closes the worker's pipe too: the worker sees the error it would
  have seen;
- it is one thread that runs no telemetry code: it reacts to a write within microseconds, however busy the
  record process (``output_records``) is. It forwards each chunk to that process in frames of at most
  ``PIPE_BUF`` bytes over a non-blocking pipe, so a frame goes whole or not at all: when the record process falls
  behind, frames are dropped and their lines counted, and the worker never waits for telemetry;
- on the worker's request (``sync``: its exit, SIGTERM) it passes through everything written before, then
  answers, so a worker's last lines are on the console before the agent reports its end.

Lines a worker writes to stdout and to stderr within microseconds of each other -- within a millisecond while it
writes thousands of lines a second -- can reach a shared console in the other order: two pipes carry no order
between them (torchrun's own ``--tee`` has the same limit). Within a stream the order is always kept.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import struct
import sys
import time
from dataclasses import dataclass
from typing import NoReturn

__all__ = ["Channel", "serve", "detach", "HEADER", "STREAMS", "MIDLINE"]

#: Frame header: stream index, flags, lines lost before this frame, time read (ns), length of the data after it.
HEADER = struct.Struct("<BBIQI")
#: A pipe write of at most this many bytes is atomic: a frame is written whole or not at all.
FRAME_BYTES = getattr(select, "PIPE_BUF", 4096)
#: Flag: the data lost before this frame ended inside a line (this frame starts in the middle of one).
MIDLINE = 1
STREAMS = ("stdout", "stderr")
#: Bytes read at once from a worker's pipe (the pipe holds up to 1 MiB: ``output``).
CHUNK = 256 * 1024
#: A worker woken for again within this long gets its next writes gathered for this long (see ``run``).
GATHER_SECONDS = 0.001
#: How long the loss counts of the last moments may wait for the record process at the end of the output.
END_WAIT_SECONDS = 5.0


@dataclass
class Channel:
    """One captured stream: its index in :data:`STREAMS`, the end this process reads, and where its bytes went
    before the bridge; what was lost of it since its last frame."""

    index: int
    read_fd: int
    out_fd: int
    lost_lines: int = 0
    midline: bool = False


def serve(channels: list[Channel], control_fd: int, frames_fd: int) -> NoReturn:
    """The forked child's whole life: pass the streams through until every writer closed them, then exit."""
    try:
        try:
            detach("te-otel-output")
        except Exception:
            pass
        PassThrough(channels, control_fd, frames_fd).run()
    finally:
        os._exit(0)


def detach(name: str) -> None:
    """Out of the worker's process group, deaf to job-control signals, own fds 0-2 on ``/dev/null`` (nothing
    this process does itself reaches the job's output), and a name of its own for ``ps`` / ``top`` (its command
    line is the worker's: it is a fork of it)."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        with open("/proc/self/comm", "w") as comm:
            comm.write(name[:15])
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGPIPE", "SIGUSR1", "SIGUSR2"):
        try:
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        except (AttributeError, OSError, ValueError):
            pass
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    sys.stdout = sys.stderr = None  # nothing to write to


class PassThrough:
    """Reads the worker's streams as bytes arrive and writes them where they went before, first thing."""

    def __init__(self, channels: list[Channel], control_fd: int, frames_fd: int) -> None:
        self.channels = {c.read_fd: c for c in channels}
        self.control_fd = control_fd
        self.frames_fd = frames_fd
        self.poller = select.poll()
        for fd in self.channels:
            os.set_blocking(fd, False)
            self.poller.register(fd, select.POLLIN)
        if control_fd >= 0:
            self.poller.register(control_fd, select.POLLIN)
        if frames_fd >= 0:
            os.set_blocking(frames_fd, False)
        self.ended: list[Channel] = []

    def run(self) -> None:
        """Until every stream has ended. The destinations are closed as each ends, so whoever waits for the end
        of torchrun's output never waits for this process; then the last loss counts go to the record process.

        A worker that writes often (woken again within :data:`GATHER_SECONDS`) gets its writes gathered: this
        process waits that long before it reads again, so the worker's next writes wake nobody. Each wake-up of a
        sleeping reader costs the writing worker several microseconds in its ``write`` call (the reader often runs
        on the worker's core at once); gathered, 10,000 lines a second cost about 1,000 wake-ups, not 10,000."""
        woken = 0.0
        while self.channels:
            ready = self.poller.poll()
            now = time.monotonic()
            if now - woken < GATHER_SECONDS:
                time.sleep(GATHER_SECONDS)
                ready = self.poller.poll(0)
            woken = now
            for fd, _events in ready:
                if fd == self.control_fd:
                    self._control()
                elif fd in self.channels:
                    self._pump(self.channels[fd])
        _close(self.control_fd)
        self._report_losses(time.monotonic() + END_WAIT_SECONDS)
        _close(self.frames_fd)

    def _pump(self, channel: Channel) -> None:
        """Pass through what the stream holds now (until it would block, or ends)."""
        while channel.read_fd in self.channels:
            try:
                data = os.read(channel.read_fd, CHUNK)
            except BlockingIOError:
                return
            except OSError:  # EIO: a pty whose every writer closed it
                data = b""
            if not data or not self._write(channel, data):
                self._end(channel)  # a closed destination: the worker's next write fails, as it would have
                return
            self._forward(channel, data)

    def _write(self, channel: Channel, data: bytes) -> bool:
        """All of ``data`` to the destination, waiting for it as the worker would have; ``False`` if it closed."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(channel.out_fd, view) :]
            except BlockingIOError:  # a non-blocking destination (shared with another program): wait for it
                select.select([], [channel.out_fd], [], 1.0)
            except BrokenPipeError:
                return False
            except OSError:
                return True  # e.g. EIO of a hung-up terminal: the bytes are lost, as they would have been
        return True

    def _forward(self, channel: Channel, data: bytes) -> None:
        """``data`` to the record process in whole frames; what does not fit now is lost (counted there)."""
        now = time.time_ns()
        step = FRAME_BYTES - HEADER.size
        for offset in range(0, len(data), step):
            if not self._send(channel, data[offset : offset + step], now):
                rest = data[offset:]
                channel.lost_lines += rest.count(b"\n")
                channel.midline = not rest.endswith(b"\n")
                return

    def _send(self, channel: Channel, part: bytes, now: int) -> bool:
        """One frame, with what was lost of the stream before it; ``False`` if there was no room for it."""
        if self.frames_fd < 0:
            return True  # the record process is gone: pass-through only
        header = HEADER.pack(channel.index, MIDLINE if channel.midline else 0, channel.lost_lines, now, len(part))
        try:
            os.write(self.frames_fd, header + part)
        except BlockingIOError:
            return False
        except OSError:
            _close(self.frames_fd)
            self.frames_fd = -1
            return True
        channel.lost_lines, channel.midline = 0, False
        return True

    def _report_losses(self, deadline: float) -> None:
        """Empty frames carrying what was lost last, waiting (bounded) for room in the record process's pipe."""
        for channel in self.ended:
            while (channel.lost_lines or channel.midline) and not self._send(channel, b"", time.time_ns()):
                if time.monotonic() >= deadline:
                    return
                select.select([], [self.frames_fd], [], 0.05)

    def _end(self, channel: Channel) -> None:
        self.poller.unregister(channel.read_fd)
        del self.channels[channel.read_fd]
        _close(channel.read_fd)
        _close(channel.out_fd)
        self.ended.append(channel)

    def _control(self) -> None:
        """A sync request (one byte): pass through everything written before it, then echo the byte."""
        try:
            request = os.read(self.control_fd, 64)
        except OSError:
            request = b""
        if not request:  # every process that had the socket is gone; its streams may still go on (children)
            self.poller.unregister(self.control_fd)
            _close(self.control_fd)
            self.control_fd = -1
            return
        for channel in list(self.channels.values()):
            self._pump(channel)
        try:
            os.write(self.control_fd, request[-1:])
        except OSError:
            pass


def _close(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)
