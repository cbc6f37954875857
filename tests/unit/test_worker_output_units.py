"""The pure parts of the worker output capture, and the logging bridge's promise to leave logging as it was.

In-process and fast; the real jobs are in ``tests/jobs/test_worker_output.py``.

- ``output_lines``: lines as a terminal shows them (``\\r\\n``, progress bars' carriage returns), cut on a UTF-8
  boundary, rate-limited with the tail kept and every line either returned or counted -- also when a chunk
  boundary falls inside a line, and when output was lost before it reached the record process;
- ``worker_logging``: with the bridge's capture installed, ``logging.basicConfig()`` still configures the root
  logger and logging's last resort still prints an unconfigured script's warning (a handler on the root logger
  would break both); records of the bridge's and OpenTelemetry's loggers and of the SDK's threads are left out
  (non-propagating loggers: ``test_log_capture_all_loggers.py``); a record's message is the one at the time of
  the call; uninstall restores ``Logger.callHandlers``. The records go to in-memory exporters of the SDK
  (``conftest.otel``): the test is about what reaches the SDK, the wire is covered by the job tests.
"""

from __future__ import annotations

import io
import logging
import threading
from typing import Any

import pytest

from tests.support.logging_capture import otel_handler_on_root
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._torch.output.lines import TAIL_LINES, Limits, Lines
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import log_records as worker_logging


def data(lines: list[Any]) -> list[bytes]:
    return [line.data for line in lines]


def counted(kind: str, reason: str) -> int:
    return selftelemetry.total(kind, "logs", reason)


# ---- output_lines ----------------------------------------------------------------------------------------------


def test_lines_are_what_a_terminal_shows() -> None:
    lines = Lines(Limits(max_line=64, rate=0))
    assert data(lines.feed("stdout", b"par")) == []
    got = lines.feed("stdout", b"tial\r\nnext\n\n  \nprogress 10%\rprogress 90%\rdone\nunfinished")
    assert data(got) == [b"partial", b"next", b"  ", b"done"]
    assert {line.stream for line in got} == {"stdout"}
    assert data(lines.feed("stderr", b"other stream\n")) == [b"other stream"]
    assert data(lines.finish()) == [b"unfinished"]


def test_long_lines_are_cut_on_a_character_boundary_and_counted() -> None:
    before = counted(selftelemetry.SANITIZED, "line_truncated")
    lines = Lines(Limits(max_line=16, rate=0))
    text = "é" * 20  # 2 bytes a character: byte 16 is the start of one
    got = lines.feed("stdout", ("x" + text + "\n").encode())
    assert data(got) == [("x" + "é" * 7).encode()]  # 15 bytes: the 8th "é" would end at byte 17
    # a line longer than the limit that arrives in pieces is bounded while it is unfinished, and cut once
    for _ in range(100):
        assert lines.feed("stdout", b"y" * 10) == []
    assert data(lines.feed("stdout", b"end\nnext\n")) == [b"y" * 16, b"next"]
    assert counted(selftelemetry.SANITIZED, "line_truncated") == before + 2


def test_the_rate_limit_keeps_the_tail_and_counts_every_other_line() -> None:
    before = counted(selftelemetry.DROPPED, "rate_limited")
    lines = Lines(Limits(rate=0.001, burst=5))  # 5 lines, then (practically) none
    chunk = b"".join(b"line %d\n" % n for n in range(1000))
    admitted = lines.feed("stdout", b"first " + chunk[:3])  # the unfinished line joins the first admitted one
    assert admitted == []
    admitted = lines.feed("stdout", chunk[3:] + b"last, unfinished")
    tail = lines.finish()
    assert data(admitted) == [b"first line 0", b"line 1", b"line 2", b"line 3", b"line 4"]
    assert len(tail) == TAIL_LINES and data(tail)[-1] == b"last, unfinished"
    assert data(tail)[0] == b"line %d" % (1000 - TAIL_LINES + 1)
    dropped = counted(selftelemetry.DROPPED, "rate_limited") - before
    assert len(admitted) + len(tail) + dropped == 1001  # every line returned or counted


def test_when_no_line_is_admitted_the_unfinished_line_joins_the_first_dropped_one() -> None:
    lines = Lines(Limits(rate=0.001, burst=1))
    assert data(lines.feed("stdout", b"a\n")) == [b"a"]
    lines.feed("stdout", b"pre")
    lines.feed("stdout", b"fix\nb\n")
    assert data(lines.finish()) == [b"prefix", b"b"]


def test_output_lost_before_the_record_process_is_counted_and_never_glued() -> None:
    before = counted(selftelemetry.DROPPED, "output_backlog_full")
    lines = Lines(Limits(rate=0))
    lines.feed("stdout", b"start of a line whose end was lost")
    lines.lost("stdout", 3, midline=True)  # 3 lines lost, and what comes next starts inside a line
    assert data(lines.feed("stdout", b"rest of a line\nwhole\n")) == [b"whole"]
    assert counted(selftelemetry.DROPPED, "output_backlog_full") == before + 4


# ---- worker_logging --------------------------------------------------------------------------------------------


def bodies(otel: Any) -> list[str]:
    return [r.body for r in otel.log_records()]


def test_logging_stays_as_it_was_for_the_console(captured: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Not a root handler: the last resort still prints an unconfigured script's warning, and ``basicConfig``
    still configures the root logger (it does nothing once the root logger has a handler)."""
    root = logging.getLogger()
    root.handlers.clear()  # pytest's own capture handler too: the root logger of an unconfigured script
    logging.getLogger("script").warning("unconfigured warning")
    assert capsys.readouterr().err == "unconfigured warning\n"
    stream = io.StringIO()
    logging.basicConfig(stream=stream, level=logging.INFO, format="%(levelname)s:%(message)s")
    logging.getLogger("script").info("configured %s", "info")
    assert stream.getvalue() == "INFO:configured info\n"
    assert bodies(captured) == ["unconfigured warning", "configured info"]


def test_the_message_is_the_one_at_the_time_of_the_call(captured: Any) -> None:
    items = ["a"]
    logging.getLogger("script").warning("items %s", items)
    items.append("b")  # changed before the drainer converts the record
    assert bodies(captured) == ["items ['a']"]


def test_no_feedback_loops(captured: Any) -> None:
    logging.getLogger("torchelastic_otel").warning("the bridge's own")
    logging.getLogger("opentelemetry.sdk").warning("the SDK's own")
    thread = threading.Thread(target=lambda: logging.getLogger("x").warning("from an exporter thread"),
                              name="OtelBatchLogRecordProcessor")  # fmt: skip
    thread.start()
    thread.join()
    logging.getLogger("script").warning("the script's")
    assert bodies(captured) == ["the script's"]


def test_uninstall_restores_call_handlers(otel: Any) -> None:
    original = logging.Logger.__dict__["callHandlers"]
    patches = Patches()
    worker_logging.install(patches, lambda: None)
    assert logging.Logger.__dict__["callHandlers"] is not original
    patches.restore()
    assert logging.Logger.__dict__["callHandlers"] is original


def test_nothing_is_captured_while_opentelemetrys_handler_is_on_the_root(captured: Any) -> None:
    """Logging auto-instrumentation puts OpenTelemetry's ``LoggingHandler`` on the root logger: each record would
    otherwise be exported twice."""
    with otel_handler_on_root(captured.logger_provider):
        logging.getLogger("script").warning("exported by the root's handler")
    logging.getLogger("script").warning("exported by the bridge")
    assert bodies(captured) == ["exported by the root's handler", "exported by the bridge"]
