"""The final words of a stopped worker never wait long on a lock the interrupted thread may hold.

A SIGTERM lands anywhere: inside a drain (holding a buffer's lock) or inside a phase change of the pipeline
(holding its lock). The hand-over to the agent and the abandoning of a build then give up after a short wait and
keep what they could not take, instead of spending the exit bound. The locks are held here by another thread, as
the interrupted main thread would hold them (the final words run in a helper thread).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from torchelastic_otel._export import drainer
from torchelastic_otel._export import state as pipeline
from torchelastic_otel.events import _otel as event_adapter
from torchelastic_otel.events.api import Event, EventSource


@contextmanager
def held_elsewhere(lock: Any) -> Iterator[None]:
    """``lock`` held by another thread until the block ends."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            release.wait(30)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(10)
    try:
        yield
    finally:
        release.set()
        thread.join(10)


@pytest.fixture
def buffer() -> Iterator[Any]:
    """The events' own buffer holding three events, with the periodic drain paused: only the test takes them."""
    with drainer.paused():
        events = event_adapter._EventBuffer(16)
        for i in range(3):
            events.submit((Event(f"e{i}", EventSource.WORKER), None, 0, None))
        yield events
        events.discard("test")


def test_a_hand_over_gives_up_on_a_held_buffer_and_keeps_its_items(buffer: Any) -> None:
    kept: list[Any] = []
    with held_elsewhere(buffer._lock):
        assert buffer.hand_over(lambda fields, ctx: kept.append(fields) or "path") is False
    assert kept == [] and len(buffer._pending) == 3  # nothing taken, nothing lost
    assert buffer.hand_over(lambda fields, ctx: kept.append(fields) or "path") is True
    assert [f["event_name"] for f in kept] == ["e0", "e1", "e2"] and not buffer._pending


def test_a_hand_over_stops_at_the_first_item_that_could_not_be_kept(buffer: Any) -> None:
    answers = iter(["path", None])
    assert buffer.hand_over(lambda fields, ctx: next(answers)) is False
    assert [item[0].name for item in buffer._pending] == ["e1", "e2"]  # the one not kept stays buffered


def test_abandoning_a_build_gives_up_on_a_held_pipeline_lock() -> None:
    before = pipeline.state.phase
    pipeline.state.phase = pipeline.Phase.BUILDING  # no builder thread: only the phase matters here
    try:
        with held_elsewhere(pipeline.state.lock):
            assert pipeline.abandon_build(0.05) is False
        assert pipeline.state.phase is pipeline.Phase.BUILDING
    finally:
        pipeline.state.phase = before
