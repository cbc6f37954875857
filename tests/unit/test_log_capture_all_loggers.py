"""Every logging record of a worker becomes one log record, and a console handler's line is not exported twice.

In-process; the real job is ``tests/jobs/test_framework_logs.py``.

- ``worker.log_records``: a record of a logger that does not propagate to the root logger (``transformers`` and
  Lightning give their library logger a console handler of its own) is captured, once, with its level, logger name
  (the instrumentation scope), ``code.*`` and ``exception.*``; a propagating record once; the bridge's, OpenTelemetry's
  and torch's event loggers and the SDK's threads stay out; a record that reaches an OpenTelemetry ``LoggingHandler``
  is left to it (a non-propagating logger's is not: that handler never sees it); uninstall restores logging;
- the console handlers' lines: with the output capture's announcement pipe in place, the bytes a ``StreamHandler``
  on fd 2 printed are announced before they are written, and ``output_lines.Logged`` takes exactly those lines out of
  what the record process would export -- a ``print`` of other text, or of the same text before the handler's
  line, stays; an announcement whose line never comes is forgotten after its expiry.

The records go to the in-memory exporters of the SDK (``conftest.otel``); fd 2 is pytest's capture file (``capfd``),
written through a real ``TextIOWrapper`` on fd 2, and the announcements go through a real pipe.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.logging_capture import otel_handler_on_root
from torchelastic_otel._torch.output import capture as output
from torchelastic_otel._torch.output.lines import (
    LOGGED_BYTES,
    LOGGED_END,
    LOGGED_EXPIRY_NS,
    LOGGED_HEADER,
    LOGGED_RESCUE_NS,
    Limits,
    Line,
    Lines,
    Logged,
)
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import log_records as worker_logging


@pytest.fixture
def announced() -> Iterator[int]:
    """The output capture's announcement pipe, as a captured worker has it (the read end is the test's)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    os.set_blocking(read_end, False)
    output._logged.append((write_end, LOGGED_HEADER, LOGGED_BYTES - LOGGED_HEADER.size))
    try:
        yield read_end
    finally:
        output._logged.clear()
        os.close(read_end)
        os.close(write_end)


def exported(otel: Any) -> list[Any]:
    """``(scope, LogRecord)`` of everything exported, after a flush."""
    otel.log_records()
    return [(r.instrumentation_scope.name, r.log_record) for r in otel.logs.get_finished_logs()]


def library_logger(name: str, stream: Any = None) -> logging.Logger:
    """A library's logger as ``transformers`` sets it up: a console handler of its own, no propagation."""
    logger = logging.getLogger(name)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(f"[{name}] %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def fd2_stream() -> Any:
    """A text stream on fd 2 (as ``sys.stderr`` is in a worker; under pytest fd 2 is ``capfd``'s file)."""
    return open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)


def lines_exported(announced_fd: int, *reads: tuple[int, str]) -> list[bytes]:
    """What the record process would export of fd 2's bytes, read in pieces ``(time read, text)``, after reading
    the announcements."""
    logged = Logged(Limits().max_line)
    logged.read(announced_fd)
    lines = Lines(Limits(rate=0))
    out = [line for time_ns, text in reads for line in lines.feed("stderr", text.encode(), now_ns=time_ns)]
    return [line.data for line in logged.drop(out + lines.finish())]


# ---- every logger's records, once ----------------------------------------------------------------------------------


def test_a_non_propagating_loggers_record_is_captured_once_with_level_name_code_and_exception(captured: Any) -> None:
    logger = library_logger("lib.transformers.trainer", stream=io.StringIO())
    logger.info("training %d steps", 20)
    try:
        raise KeyError("missing column")
    except KeyError:
        logger.error("could not collate", exc_info=True)
    logger.debug("below the logger's level: never a record")
    records = exported(captured)
    assert [(scope, r.body, r.severity_text) for scope, r in records] == [
        ("lib.transformers.trainer", "training 20 steps", "INFO"),
        ("lib.transformers.trainer", "could not collate", "ERROR"),
    ]
    info, error = (r for _scope, r in records)
    for record in (info, error):
        assert record.attributes["code.file.path"] == __file__
        assert record.attributes["code.function.name"] == (
            "test_a_non_propagating_loggers_record_is_captured_once_with_level_name_code_and_exception"
        )
        assert isinstance(record.attributes["code.line.number"], int)
    assert error.attributes["exception.type"] == "KeyError"
    assert error.attributes["exception.message"] == "missing column"
    assert 'raise KeyError("missing column")' in error.attributes["exception.stacktrace"]
    assert "exception.type" not in info.attributes


def test_a_record_that_reaches_the_root_and_a_library_handler_is_captured_once(captured: Any) -> None:
    """``transformers`` under ``CI=1`` propagates as well: its handler and the root's both print; one record."""
    devnull = io.StringIO()
    logging.basicConfig(stream=devnull, level=logging.INFO, force=True)
    logger = library_logger("lib.both", stream=devnull)
    logger.propagate = True
    logger.warning("printed twice, exported once")
    logging.getLogger("lib.script").info("the script's")
    assert [(s, r.body) for s, r in exported(captured)] == [
        ("lib.both", "printed twice, exported once"),
        ("lib.script", "the script's"),
    ]


def test_excluded_loggers_and_threads_stay_out_also_when_they_do_not_propagate(captured: Any) -> None:
    devnull = io.StringIO()
    for name in ("torchelastic_otel.lib", "opentelemetry.lib", "torchelastic-events-lib"):
        quiet = logging.getLogger(name)
        quiet.addHandler(logging.NullHandler())
        quiet.propagate = False
        try:
            quiet.warning("excluded %s", name)
        finally:
            quiet.handlers.clear()
            quiet.propagate = True
    logger = library_logger("lib.threads", stream=devnull)
    thread = threading.Thread(
        target=lambda: logger.warning("from an exporter thread"), name="OtelBatchLogRecordProcessor"
    )
    thread.start()
    thread.join()
    logger.warning("from the script's thread")
    assert [r.body for _s, r in exported(captured)] == ["from the script's thread"]


def test_records_that_reach_opentelemetrys_handler_are_left_to_it_and_the_others_captured(captured: Any) -> None:
    """Auto-instrumentation's handler on the root exports what reaches the root; a non-propagating library logger's
    records never reach it, so the bridge captures them."""
    with otel_handler_on_root(captured.logger_provider):
        logging.getLogger("lib.script").warning("exported by the root's handler")
        library_logger("lib.quiet", stream=io.StringIO()).warning("exported by the bridge")
    bodies = sorted(r.body for _s, r in exported(captured))
    assert bodies == ["exported by the bridge", "exported by the root's handler"]


def test_uninstall_restores_call_handlers_and_captures_nothing_more(otel: Any) -> None:
    original = logging.Logger.__dict__["callHandlers"]
    patches = Patches()
    worker_logging.install(patches, lambda: None)
    assert logging.Logger.__dict__["callHandlers"] is not original
    patches.restore()
    assert logging.Logger.__dict__["callHandlers"] is original
    library_logger("lib.after", stream=io.StringIO()).warning("after uninstall")
    assert exported(otel) == []


def test_turned_off_nothing_is_installed(otel: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(worker_logging.ENABLE_ENV, "0")
    original = logging.Logger.__dict__["callHandlers"]
    patches = Patches()
    worker_logging.install(patches, lambda: None)
    assert logging.Logger.__dict__["callHandlers"] is original
    patches.restore()


# ---- a console handler's line is not exported twice ---------------------------------------------------------------


def test_console_handler_lines_are_announced_and_left_out_of_the_line_records(
    captured: Any, announced: int, capfd: pytest.CaptureFixture[str]
) -> None:
    """What a library's handler and ``basicConfig``'s handler print on fd 2 -- a traceback included -- is taken out
    of the lines; ``print``-like writes of other text, and of the same text written before the log call, stay."""
    stream = fd2_stream()
    logging.basicConfig(stream=stream, level=logging.INFO, format="%(levelname)s:%(name)s:%(message)s", force=True)
    library = library_logger("lib.hf", stream=stream)
    stream.write("[lib.hf] WARNING loading weights\n")  # the same text as a log line, printed before it
    stream.write("progress 10%\rprogress 100%\n")
    stream.flush()
    before = capfd.readouterr().err, time.time_ns()  # read before the log calls, as the pass-through would
    library.warning("loading weights")
    logging.getLogger("lib.script").info("epoch %d", 1)
    try:
        raise ValueError("bad batch")
    except ValueError:
        logging.getLogger("lib.script").exception("skipping")
    stream.write("native: done\n")
    stream.flush()
    err = capfd.readouterr().err
    assert before[0] == "[lib.hf] WARNING loading weights\nprogress 10%\rprogress 100%\n"
    assert err.startswith("[lib.hf] WARNING loading weights\nINFO:lib.script:epoch 1\nERROR:lib.script:skipping\n")
    assert "ValueError: bad batch" in err
    exported_lines = lines_exported(announced, (before[1], before[0]), (time.time_ns(), err))
    assert exported_lines == [b"[lib.hf] WARNING loading weights", b"progress 100%", b"native: done"]
    assert sorted(r.body for _s, r in exported(captured)) == ["epoch 1", "loading weights", "skipping"]


def test_logging_last_resort_line_is_announced(
    captured: Any, announced: int, capfd: pytest.CaptureFixture[str]
) -> None:
    """An unconfigured script: logging's last resort prints the warning to ``sys.stderr``."""
    saved = sys.stderr
    sys.stderr = fd2_stream()
    logging.getLogger().handlers.clear()  # pytest's own capture handler too: the root logger of an unconfigured script
    try:
        logging.getLogger("lib.unconfigured").warning("no handler anywhere")
        sys.stderr.flush()
    finally:
        sys.stderr = saved
    err = capfd.readouterr().err
    assert err == "no handler anywhere\n"
    assert lines_exported(announced, (time.time_ns(), err)) == []
    assert [r.body for _s, r in exported(captured)] == ["no handler anywhere"]


def test_lines_of_excluded_or_unexported_records_are_not_announced(
    captured: Any, announced: int, capfd: pytest.CaptureFixture[str]
) -> None:
    """A record that is not exported keeps its console line as a line record: the bridge's own, and a record that
    reaches an OpenTelemetry handler whose level turns it down."""
    from opentelemetry.sdk._logs import LoggingHandler

    stream = fd2_stream()
    own = library_logger("torchelastic_otel.lib", stream=stream)
    own.warning("the bridge's own")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        handler = LoggingHandler(level=logging.ERROR, logger_provider=captured.logger_provider)
    logger = library_logger("lib.instrumented", stream=stream)
    logger.addHandler(handler)
    try:
        logger.warning("below the OpenTelemetry handler's level")
        logger.error("taken by the OpenTelemetry handler")
    finally:
        logger.removeHandler(handler)
        own.handlers.clear()
        own.propagate = True
    stream.flush()
    err = capfd.readouterr().err
    assert lines_exported(announced, (time.time_ns(), err)) == [
        b"[torchelastic_otel.lib] WARNING the bridge's own",
        b"[lib.instrumented] WARNING below the OpenTelemetry handler's level",
    ]
    assert [r.body for _s, r in exported(captured)] == ["taken by the OpenTelemetry handler"]


def test_nothing_is_announced_without_the_output_capture(captured: Any, capfd: pytest.CaptureFixture[str]) -> None:
    assert not output._logged
    assert output.announce(1, b"x\n") is False
    library_logger("lib.plain", stream=fd2_stream()).warning("only the console")
    assert capfd.readouterr().err == "[lib.plain] WARNING only the console\n"
    assert [r.body for _s, r in exported(captured)] == ["only the console"]


def test_long_texts_are_announced_in_atomic_pieces_and_overlong_lines_are_left_as_lines(announced: int) -> None:
    room = LOGGED_BYTES - LOGGED_HEADER.size
    text = b"".join(b"line %04d " % n + b"x" * 90 + b"\n" for n in range(100))  # ~10 KB of 100-byte lines
    assert output.announce(1, text) is True
    overlong = b"y" * (room + 10)
    assert output.announce(1, b"before\n" + overlong + b"\nafter\n") is False
    wire = os.read(announced, 1 << 20)
    sizes, offset = [], 0
    while offset < len(wire):
        _index, _time_ns, length = LOGGED_HEADER.unpack_from(wire, offset)
        sizes.append(LOGGED_HEADER.size + length)
        offset += LOGGED_HEADER.size + length
    assert offset == len(wire) and max(sizes) <= LOGGED_BYTES and len(sizes) >= 4
    logged = Logged(max_line=100_000)
    logged.feed(wire)
    now = time.time_ns() + 1
    lines = [Line(now, "stderr", raw) for raw in text.splitlines() + [b"before", overlong, b"after"]]
    assert [line.data for line in logged.drop(lines)] == [overlong]


# ---- output_lines.Logged: the record process's side ----------------------------------------------------------------


def line(time_ns: int, data: bytes, stream: str = "stderr") -> Line:
    return Line(time_ns, stream, data)


def test_an_announcement_takes_one_line_of_its_stream_read_after_it() -> None:
    logged = Logged(max_line=64)
    logged.add("stderr", 1000, b"INFO:a:hello\nTraceback\r\n  frame\n")
    kept = logged.drop([
        line(999, b"INFO:a:hello"),  # read before the announcement: printed otherwise
        line(1001, b"INFO:a:hello", "stdout"),  # the other stream
        line(1002, b"INFO:a:hello"),
        line(1003, b"INFO:a:hello"),  # a second one: announced once, taken once
        line(1004, b"Traceback"),
        line(1005, b"  frame"),
    ])  # fmt: skip
    assert [(x.time_ns, x.data) for x in kept] == [(999, b"INFO:a:hello"), (1001, b"INFO:a:hello"),
                                                   (1003, b"INFO:a:hello")]  # fmt: skip
    assert len(logged) == 0


def test_an_announcement_whose_line_never_comes_is_forgotten() -> None:
    logged = Logged(max_line=64)
    logged.add("stderr", 1000, b"filtered out\n")
    late = 1000 + LOGGED_EXPIRY_NS + 1
    assert [x.data for x in logged.drop([line(late, b"filtered out")])] == [b"filtered out"]
    assert len(logged) == 0


def test_announcements_cut_across_reads_and_long_lines_cut_as_lines_are() -> None:
    logged = Logged(max_line=16)
    text = "é" * 20 + "\n"  # cut at 16 bytes as ``Lines`` cuts it
    wire = LOGGED_HEADER.pack(1, 5, len(text.encode())) + text.encode()
    logged.feed(wire[:7])
    logged.feed(wire[7:])
    lines = Lines(Limits(max_line=16, rate=0))
    out = lines.feed("stderr", text.encode(), now_ns=6)
    assert len(out) == 1 and logged.drop(out) == []


def test_a_worker_that_dies_without_its_records_out_gets_its_last_lines_exported_after_all() -> None:
    """SIGKILL, a crash, ``os._exit``: the logging records of the worker's last seconds may have died with it, so
    the lines taken for them then are exported at the end; after the worker said its records are out (its exit
    handler, its SIGTERM: ``capture.LOGGED_END``) none are."""
    assert output.LOGGED_END == LOGGED_END
    end = 100 * LOGGED_RESCUE_NS
    for said_out in (False, True):
        logged = Logged(max_line=64)
        logged.add("stderr", 1, b"INFO: long ago\n")
        logged.add("stderr", end - 1000, b"INFO: last words\n")
        lines = [line(2, b"INFO: long ago"), line(end - 999, b"INFO: last words"), line(end - 998, b"native")]
        assert [x.data for x in logged.drop(lines)] == [b"native"]
        if said_out:
            logged.feed(LOGGED_HEADER.pack(LOGGED_END, end, 0))
        assert [x.data for x in logged.unexported(end)] == ([] if said_out else [b"INFO: last words"])


def test_what_is_held_is_bounded() -> None:
    logged = Logged(max_line=2000, max_held=200, max_bytes=2000)
    for n in range(300):
        logged.add("stdout", n, b"line %d\n" % n)
    assert len(logged) == 200  # "line 100" to "line 299": 1,600 bytes
    assert logged.drop([line(10**6, b"line 0", "stdout")]) != []  # the oldest were forgotten first
    logged.add("stdout", 10**6, b"z" * 990 + b"\n")  # over the bytes: the oldest make room for it
    assert 100 < len(logged) < 200
    assert logged.drop([line(10**6, b"line 100", "stdout")]) != []
    assert logged.drop([line(10**6, b"line 299", "stdout"), line(10**6, b"z" * 990, "stdout")]) == []


# ---- the pass-through writes every byte once ------------------------------------------------------------------------


def test_the_pass_through_writes_every_byte_once_through_syncs_and_partial_writes() -> None:
    """The pass-through process's loop (run here in a thread: the same code, without the fork) under what the
    worker does at its end: sync requests (exit, SIGTERM) while it writes, to a destination that takes only part
    of a write at a time (a non-blocking pipe of one page, read slowly). The destination gets exactly the bytes
    written, in order, once: no chunk is sent again by a sync, no partial write is retried whole."""
    import fcntl
    import random
    import socket

    from torchelastic_otel._torch.output.passthrough import Channel, PassThrough

    source_read, source_write = os.pipe()
    dest_read, dest_write = os.pipe()
    frames_read, frames_write = os.pipe()
    fcntl.fcntl(dest_write, fcntl.F_SETPIPE_SZ, 4096)
    os.set_blocking(dest_write, False)  # a destination shared with a program that made it non-blocking
    worker_control, passthrough_control = socket.socketpair()
    passthrough = PassThrough([Channel(1, source_read, dest_write)], passthrough_control.detach(), frames_write)
    generator = random.Random(7)
    written = b"".join(b"line %05d %s\n" % (n, b"x" * generator.randrange(0, 6000)) for n in range(600))
    received = bytearray()
    answers: list[int] = []

    def read_slowly() -> None:
        while True:
            chunk = os.read(dest_read, 1000)
            if not chunk:
                return
            received.extend(chunk)
            time.sleep(0.0001)

    def drain_frames() -> None:
        while os.read(frames_read, 1 << 20):
            pass

    def write() -> None:
        """The worker: writes of any size, a sync request (answered once passed through) after every few."""
        worker_control.settimeout(10.0)
        view, token = memoryview(written), 0
        while view:
            size = generator.randrange(1, 20_000)
            os.write(source_write, view[:size])
            view = view[size:]
            if generator.random() < 0.3:
                token = token % 255 + 1
                worker_control.sendall(bytes([token]))
                while bytes([token]) not in worker_control.recv(64):
                    pass
                answers.append(token)
        os.close(source_write)

    threads = [threading.Thread(target=f) for f in (passthrough.run, read_slowly, drain_frames, write)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60.0)
    worker_control.close()
    assert not any(thread.is_alive() for thread in threads)
    assert len(answers) > 20
    assert len(received) == len(written) and bytes(received) == written
    os.close(dest_read)
    os.close(frames_read)
