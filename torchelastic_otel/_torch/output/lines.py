"""A worker's output cut into lines and admitted at a bounded rate: the pure part of the output capture.

The reader process (``output_reader``) hands every chunk it passed through to :class:`Lines`, which returns the
lines to export. The work per chunk is bounded whatever the worker prints: the newlines are counted in C, only the
lines the rate limit admits are cut apart one by one, and of the others only the last :data:`TAIL_LINES` are kept
-- so a print flood never makes the reader fall behind the worker, and a rank's last lines (the traceback after
the flood) are exported when its output ends, whatever the limit did before.

Lines are what a terminal shows: ``\\r\\n`` ends a line like ``\\n``; a carriage return inside a line (progress bars)
overwrites it, so the text after the last one is the line. Empty lines are not records.

Lines a logging handler printed to the console (:class:`Logged`) are not records here: their logging record is
exported with its level, logger and code location (``worker.log_records``), which announces each such line to the
record process before the handler writes it.
"""

from __future__ import annotations

import collections
import os
import struct
import time
from dataclasses import dataclass

from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import _settings

__all__ = ["Limits", "Line", "Lines", "Logged", "TAIL_LINES", "LOGGED_HEADER", "LOGGED_BYTES", "terminal_line"]

#: The last over-limit lines kept for the end of a worker's output (exported when it ends, never rate-limited).
TAIL_LINES = 100
#: An announcement of lines a logging handler is about to print: stream index, when (ns), length of the text.
LOGGED_HEADER = struct.Struct("<BQI")
#: An announcement is one write of at most this many bytes to a pipe: atomic, whichever thread or process sends it.
LOGGED_BYTES = 4096
#: How long an announced line waits for its line (a handler writes it microseconds later; a console that holds up
#: the worker's writes delays it): older ones are forgotten, and their line, should it come, is exported.
LOGGED_EXPIRY_NS = 10 * 1_000_000_000
#: At most this many announced lines (and bytes of them) are held; the oldest are forgotten first.
LOGGED_MAX = 20_000
LOGGED_MAX_BYTES = 4 * 1024 * 1024
#: The stream index of the worker's announcement that its logging records are out (its exit, its SIGTERM).
LOGGED_END = 255
#: A worker whose output ends without that announcement (killed, crashed) may not have exported the logging
#: records of its last moments: the console lines taken for them in this window before its end are exported after
#: all (at most :data:`TAIL_LINES` of them) -- twice rather than never.
LOGGED_RESCUE_NS = 10 * 1_000_000_000


@dataclass(frozen=True)
class Limits:
    """How much of a worker's output becomes records (``TORCHELASTIC_OTEL_WORKER_OUTPUT_*``)."""

    max_line: int = 8192  # bytes of one line; longer lines are cut (counted as sanitized)
    rate: float = 1000.0  # lines per second, sustained, both streams together; 0: no limit
    burst: int = 10_000  # lines admitted at once above the rate

    @classmethod
    def from_env(cls) -> Limits:
        return cls(
            max_line=_settings.WORKER_OUTPUT_MAX_LINE.get(),
            rate=_settings.WORKER_OUTPUT_RATE.get(),
            burst=_settings.WORKER_OUTPUT_BURST.get(),
        )


@dataclass(frozen=True)
class Line:
    """One line to export: when it was read, its stream and its bytes (without the newline)."""

    time_ns: int
    stream: str
    data: bytes


class _TokenBucket:
    """``rate`` lines a second, at most ``burst`` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.last = time.monotonic()

    def take(self, n: int) -> int:
        """How many of ``n`` lines may go now (taken from the bucket)."""
        if self.rate <= 0:
            return n
        now = time.monotonic()
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.rate)
        self.last = now
        admitted = min(n, int(self.tokens))
        self.tokens -= admitted
        return admitted


class _Stream:
    """The unfinished line of one stream, bounded: a carriage return restarts it, beyond ``max_line`` it is cut."""

    def __init__(self, name: str, max_line: int) -> None:
        self.name = name
        self.max_line = max_line
        self.partial = bytearray()
        self.cut = False  # the unfinished line was cut: its further bytes are left out up to its end

    def extend(self, data: bytes | memoryview) -> None:
        if self.cut:
            return
        self.partial += data
        if len(self.partial) > self.max_line:
            restart = self.partial.rfind(b"\r")
            if restart > 0:
                del self.partial[:restart]
            if len(self.partial) > self.max_line + 1:
                del self.partial[self.max_line + 1 :]  # one byte more than a line may have: it will be cut
                self.cut = True

    def take(self, head: bytes) -> tuple[bytes, bool]:
        """The unfinished line completed by ``head`` (the bytes before a newline)."""
        if self.partial or self.cut:
            self.extend(head)
            line, cut = bytes(self.partial), self.cut
            self.partial.clear()
            self.cut = False
            return line, cut
        return head, False


class Lines:
    """Chunks of a worker's streams in, lines to export out (admitted now, or the tail at the end)."""

    def __init__(self, limits: Limits, streams: tuple[str, ...] = ("stdout", "stderr")) -> None:
        self.limits = limits
        self._bucket = _TokenBucket(limits.rate, limits.burst)
        self._streams = {name: _Stream(name, limits.max_line) for name in streams}
        self._tail: collections.deque[Line] = collections.deque()

    def feed(self, stream: str, data: bytes, now_ns: int | None = None) -> list[Line]:
        """The lines ``data`` completes that the rate limit admits; the others go to the tail or are counted."""
        state = self._streams[stream]
        complete = data.count(b"\n")
        if not complete:
            state.extend(data)
            return []
        now_ns = time.time_ns() if now_ns is None else now_ns
        admitted = self._bucket.take(complete)
        if admitted == complete:
            parts = data.split(b"\n")
            rest: bytes = b""
        else:
            parts = data.split(b"\n", admitted)
            rest = parts.pop()  # the over-limit lines and the unfinished one
            parts.append(b"")  # placeholder: the unfinished line is set below
        lines: list[Line] = []
        for index, raw in enumerate(parts[:-1]):
            raw, cut = state.take(raw) if index == 0 else (raw, False)
            line = self._line(now_ns, stream, raw, cut)
            if line is not None:
                lines.append(line)
        if admitted == complete:
            state.extend(parts[-1])
        else:
            self._over_limit(state, now_ns, rest, complete - admitted, first=admitted == 0)
        return lines

    def lost(self, stream: str, lines: int, midline: bool) -> None:
        """Output of ``stream`` that never reached this process (its reader was behind): ``lines`` complete lines
        (the unfinished one included), counted as dropped; ``midline``: what comes next starts inside a line,
        which is left out up to its end (and counted)."""
        state = self._streams[stream]
        if lines:
            selftelemetry.count(selftelemetry.DROPPED, "logs", "output_backlog_full", lines)
            state.partial.clear()
            state.cut = False
        if midline:
            selftelemetry.count(selftelemetry.DROPPED, "logs", "output_backlog_full")
            state.partial.clear()
            state.cut = True

    def finish(self) -> list[Line]:
        """At the end of the output: every stream's unfinished line (rate limit permitting) and the tail."""
        now_ns = time.time_ns()
        out: list[Line] = []
        for state in self._streams.values():
            if state.partial or state.cut:
                raw, cut = state.take(b"")
                line = self._line(now_ns, state.name, raw, cut)
                if line is None:
                    continue
                if self._bucket.take(1):
                    out.append(line)
                else:
                    self._keep([line])
        tail, self._tail = list(self._tail), collections.deque()
        return sorted(tail + out, key=lambda line: line.time_ns)

    def _over_limit(self, state: _Stream, now_ns: int, rest: bytes, n: int, first: bool) -> None:
        """``rest`` holds ``n`` complete over-limit lines, then the unfinished one: keep the last of them."""
        end = rest.rfind(b"\n")
        complete, unfinished = rest[:end], rest[end + 1 :]
        keep = min(n, TAIL_LINES)
        parts = complete.rsplit(b"\n", keep)
        older = len(parts) - keep  # 1 if the first part holds the lines before the kept ones, joined
        if older:
            selftelemetry.count(selftelemetry.DROPPED, "logs", "rate_limited", n - keep)
            if first:
                state.take(b"")  # the unfinished line was completed by the first dropped line
        kept: list[Line] = []
        for index, raw in enumerate(parts[older:]):
            raw, cut = state.take(raw) if first and not older and index == 0 else (raw, False)
            line = self._line(now_ns, state.name, raw, cut)
            if line is not None:
                kept.append(line)
        self._keep(kept)
        state.extend(unfinished)

    def _keep(self, lines: list[Line]) -> None:
        """Into the tail; what falls out of it is dropped for good (counted)."""
        tail = self._tail
        tail.extend(lines)
        evicted = len(tail) - TAIL_LINES
        if evicted > 0:
            for _ in range(evicted):
                tail.popleft()
            selftelemetry.count(selftelemetry.DROPPED, "logs", "rate_limited", evicted)

    def _line(self, now_ns: int, stream: str, raw: bytes, cut: bool) -> Line | None:
        """A terminal's view of ``raw`` (:func:`terminal_line`), counted when it was cut."""
        raw, was_cut = terminal_line(raw, self.limits.max_line)
        if not raw:
            return None
        if cut or was_cut:
            selftelemetry.count(selftelemetry.SANITIZED, "logs", "line_truncated")
        return Line(now_ns, stream, raw)


def terminal_line(raw: bytes, max_line: int) -> tuple[bytes, bool]:
    """A terminal's view of ``raw`` (the bytes before a newline): ``\\r\\n`` ends it, a carriage return restarts
    it; cut to ``max_line`` (whether it was: the second value). Empty: no line."""
    if b"\r" in raw:
        raw = raw.rstrip(b"\r")
        start = raw.rfind(b"\r")
        if start >= 0:
            raw = raw[start + 1 :]
    if len(raw) > max_line:
        return _cut_utf8(raw, max_line), True
    return raw, False


def _cut_utf8(raw: bytes, limit: int) -> bytes:
    """``raw`` cut to at most ``limit`` bytes, not inside a UTF-8 sequence."""
    end = limit
    while end > 0 and raw[end] & 0xC0 == 0x80:
        end -= 1
    return raw[: end or limit]


class Logged:
    """Lines that logging handlers printed to the worker's console: each takes the first line of its stream with the
    same bytes that was read after it was announced out of the records (its logging record is exported already).

    The worker announces a line before the handler writes it (``capture.announce``), and this process reads the
    announcements after the frames that might hold it (``records``), so an announcement is always here before its
    line. An announcement whose line never comes (a handler's filter turned the record down) is forgotten after
    :data:`LOGGED_EXPIRY_NS`; until then it would take an identical line printed otherwise, which is the price of
    reading no more than the bytes. A worker that dies without saying its records are out (:data:`LOGGED_END`)
    gets the lines of its last seconds exported after all (:meth:`unexported`).
    """

    def __init__(self, max_line: int, max_held: int = LOGGED_MAX, max_bytes: int = LOGGED_MAX_BYTES) -> None:
        self.max_line = max_line
        self.max_held, self.max_bytes = max_held, max_bytes
        self._order: collections.OrderedDict[int, tuple[int, tuple[str, bytes]]] = collections.OrderedDict()
        self._pending: dict[tuple[str, bytes], collections.deque[int]] = {}
        self._sequence = 0
        self._bytes = 0
        self._unread = bytearray()
        self._taken: collections.deque[Line] = collections.deque(maxlen=TAIL_LINES)
        self.ended = False  # the worker announced its normal end: its logging records are out

    def __len__(self) -> int:
        return len(self._order)

    def read(self, fd: int, max_reads: int = 64) -> None:
        """What the worker announced so far, from the non-blocking pipe ``fd`` (bounded: ``max_reads`` reads)."""
        for _ in range(max_reads):
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                return
            if not data:
                return
            self.feed(data)

    def feed(self, data: bytes) -> None:
        """Announcements as the pipe carries them (:data:`LOGGED_HEADER`, then the text); a cut one waits."""
        unread = self._unread
        unread += data
        start, size = 0, LOGGED_HEADER.size
        while len(unread) - start >= size:
            index, time_ns, length = LOGGED_HEADER.unpack_from(unread, start)
            end = start + size + length
            if end > len(unread):
                break
            if index == LOGGED_END:
                self.ended = True
            elif index < len(STREAM_NAMES):
                self.add(STREAM_NAMES[index], time_ns, bytes(unread[start + size : end]))
            start = end
        del unread[:start]

    def add(self, stream: str, time_ns: int, text: bytes) -> None:
        """The lines of ``text`` (as :class:`Lines` would cut them) are about to be printed to ``stream``."""
        for raw in text.split(b"\n"):
            line, _cut = terminal_line(raw, self.max_line)
            if line:
                self._add((stream, line), time_ns)

    def drop(self, lines: list[Line]) -> list[Line]:
        """``lines`` without those a logging handler printed."""
        if not self._order or not lines:
            return lines
        return [line for line in lines if not self._take(line)]

    def _add(self, key: tuple[str, bytes], time_ns: int) -> None:
        self._sequence += 1
        self._order[self._sequence] = (time_ns, key)
        self._pending.setdefault(key, collections.deque()).append(self._sequence)
        self._bytes += len(key[1])
        while len(self._order) > self.max_held or self._bytes > self.max_bytes:
            self._forget_oldest()

    def _take(self, line: Line) -> bool:
        """Whether ``line`` was announced (after which the announcement is used up)."""
        while self._order and next(iter(self._order.values()))[0] < line.time_ns - LOGGED_EXPIRY_NS:
            self._forget_oldest()
        key = (line.stream, line.data)
        waiting = self._pending.get(key)
        if not waiting:
            return False
        sequence = waiting[0]
        if self._order[sequence][0] > line.time_ns:
            return False  # announced after this line was read: an identical line printed before it
        self._remove(sequence)
        self._taken.append(line)
        return True

    def unexported(self, end_ns: int) -> list[Line]:
        """At the end of the output (``end_ns``): unless the worker announced its logging records out (its exit,
        its SIGTERM), the lines taken in its last :data:`LOGGED_RESCUE_NS` (their records may have died with it:
        SIGKILL, a crash, ``os._exit``)."""
        if self.ended:
            return []
        return [line for line in self._taken if line.time_ns >= end_ns - LOGGED_RESCUE_NS]

    def _forget_oldest(self) -> None:
        self._remove(next(iter(self._order)))

    def _remove(self, sequence: int) -> None:
        _time_ns, key = self._order.pop(sequence)
        waiting = self._pending[key]
        waiting.remove(sequence)  # the oldest of its key, but for announcements that came out of order
        if not waiting:
            del self._pending[key]
        self._bytes -= len(key[1])


#: Stream names by the index an announcement carries (fd 1, fd 2), as in ``passthrough.STREAMS``.
STREAM_NAMES = ("stdout", "stderr")
