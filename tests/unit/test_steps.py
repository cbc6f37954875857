"""Step marks, their instruments, the worker set-up and the drainer's periodic calls, in this process.

The SDK is real (in-memory exporters, ``conftest.otel``); so are torch's optimizers and its global step post hook.
The marks are put in the step buffer as the hook does, with chosen times where a test needs exact durations.
The jobs that use all of it (stragglers, stalls, missing ranks) are ``tests/stack/test_straggler.py`` and
``tests/stack/test_stall_missing_rank.py``; the Flight Recorder's part is ``tests/jobs/test_steps_compat.py``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import torchelastic_otel
from tests.support.waiting import wait_for
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import anatomy, collectives, stalls, steps, timeline, training
from torchelastic_otel._torch.worker import hooks as worker

torch = pytest.importorskip("torch")
from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

SECOND = 1_000_000_000


@pytest.fixture
def fresh(otel: Any, paused_drainer: Any) -> Iterator[Any]:
    """The step buffer empty and its clock new (module state), the drainer paused: only ``steps.drain()`` moves
    marks; the instruments are the ``otel`` fixture's in-memory SDK."""
    steps.reset()
    try:
        yield otel
    finally:
        steps.reset()


def _optimizer() -> Any:
    parameter = torch.nn.Parameter(torch.zeros(1))
    parameter.grad = torch.zeros(1)
    return torch.optim.SGD([parameter], lr=0.0)


@pytest.fixture
def hooked() -> Iterator[None]:
    handle = register_optimizer_step_post_hook(steps.optimizer_hook)
    try:
        yield
    finally:
        handle.remove()


def _steps_total(otel: Any) -> int:
    return sum(p.value for _, p in otel.metric_points("torchelastic.worker.steps"))


def _durations(otel: Any) -> Any:
    (point,) = [p for _, p in otel.metric_points("torchelastic.worker.step.duration")]
    return point


def test_every_optimizer_step_is_a_step(fresh: Any, hooked: None) -> None:
    optimizer = _optimizer()
    for _ in range(5):
        optimizer.step()
    assert steps.drain() is None and not timeline.timeline
    assert _steps_total(fresh) == 5
    durations = _durations(fresh)
    assert durations.count == 4 and durations.sum >= 0
    count, last = steps.progress()
    assert count == 5 and last is not None and len(steps.recent_marks()) == 5


def test_durations_are_the_time_between_steps(fresh: Any) -> None:
    for at in (10 * SECOND, 10 * SECOND + SECOND // 4, 11 * SECOND - SECOND // 4):
        timeline.timeline.put(at, 0)
    steps.drain()
    durations = _durations(fresh)
    assert (durations.count, durations.sum) == (2, pytest.approx(0.75))
    assert steps.median_step_seconds() == pytest.approx(0.375)
    assert steps.progress() == (3, 11 * SECOND - SECOND // 4)


def test_a_clock_set_back_gives_no_negative_duration(fresh: Any) -> None:
    before = selftelemetry.total(selftelemetry.SANITIZED, reason="step_clock_backwards")
    for at in (20 * SECOND, 19 * SECOND, 21 * SECOND):
        timeline.timeline.put(at, 0)
    steps.drain()
    assert _durations(fresh).count == 1 and _durations(fresh).sum == pytest.approx(2.0)
    assert selftelemetry.total(selftelemetry.SANITIZED, reason="step_clock_backwards") == before + 1
    assert _steps_total(fresh) == 3


def test_explicit_steps_win_over_optimizer_steps(fresh: Any, hooked: None) -> None:
    optimizer = _optimizer()
    optimizer.step()
    optimizer.step()
    torchelastic_otel.step()
    optimizer.step()  # once step() is called, only its calls mark steps
    torchelastic_otel.step()
    steps.drain()
    assert _steps_total(fresh) == 4


def test_with_two_optimizers_the_first_is_the_clock(fresh: Any, hooked: None) -> None:
    generator, discriminator = _optimizer(), _optimizer()
    for _ in range(4):
        generator.step()
        discriminator.step()
    steps.drain()
    assert _steps_total(fresh) == 4


def test_a_replaced_optimizer_takes_over(fresh: Any, hooked: None) -> None:
    first, second = _optimizer(), _optimizer()
    for _ in range(3):
        first.step()
    for _ in range(3):
        second.step()  # its first step is not counted; at its second it is the clock
    steps.drain()
    assert _steps_total(fresh) == 5


def test_a_full_buffer_turns_marks_away_and_counts_them(fresh: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "MAX_PENDING", 3)
    before = selftelemetry.total(selftelemetry.DROPPED, "metrics", "buffer_full")
    for _ in range(5):
        torchelastic_otel.step()
    assert len(timeline.timeline) == 3
    steps.drain()
    assert selftelemetry.total(selftelemetry.DROPPED, "metrics", "buffer_full") == before + 2
    assert _steps_total(fresh) == 3


def test_step_never_raises_and_is_the_package_s(fresh: Any) -> None:
    assert torchelastic_otel.step is steps.step
    assert "step" in torchelastic_otel.__all__
    assert torchelastic_otel.step() is None


def test_arrival_is_the_last_collective_of_each_step() -> None:
    marks = [100, 200, 300, 400]
    created = [150, 190, 250, 300, 401]
    # (100, 200]: last at 190 -> 90 ns; (200, 300]: 300 -> 100 ns; (300, 400]: none
    assert collectives.arrivals_of(marks, created) == [90e-9, 100e-9]
    assert collectives.arrivals_of(marks, created, after_ns=200) == [100e-9]
    assert collectives.arrivals_of(marks, [100]) == []  # created at the step's very start: the previous step's
    assert collectives.arrivals_of([100], created) == []


def test_the_stall_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_OTEL_STALL_SECONDS", raising=False)
    assert stalls.threshold_seconds(None) == 120.0
    assert stalls.threshold_seconds(3.0) == 120.0
    assert stalls.threshold_seconds(30.0) == 300.0  # 10x the median step
    monkeypatch.setenv("TORCHELASTIC_OTEL_STALL_SECONDS", "2.5")
    assert stalls.threshold_seconds(30.0) == 2.5
    monkeypatch.setenv("TORCHELASTIC_OTEL_STALL_SECONDS", "0")
    assert stalls.threshold_seconds(30.0) == 0.0  # off
    before = selftelemetry.total(selftelemetry.SANITIZED, reason="invalid_stall_seconds")
    monkeypatch.setenv("TORCHELASTIC_OTEL_STALL_SECONDS", "soon")
    assert stalls.threshold_seconds(None) == 120.0
    assert selftelemetry.total(selftelemetry.SANITIZED, reason="invalid_stall_seconds") == before + 1


def test_the_watchdog_watches_only_an_initialised_process_group() -> None:
    """This test process has no default process group: the watchdog looks and does nothing (no Flight Recorder
    read, no record); a forked child is not its process either."""
    watchdog = stalls.Watchdog()
    assert not collectives.enabled()
    watchdog.tick()
    assert not watchdog.watching and watchdog.records == 0
    watchdog.pid = -1  # as in a forked child
    watchdog.tick()
    assert not watchdog.watching


# ---- the drainer's periodic calls -------------------------------------------------------------------------------


def test_periodic_callbacks_run_on_the_drainer_thread(otel: Any) -> None:
    calls: list[str] = []
    remove = _drainer.add_periodic(lambda: calls.append(threading.current_thread().name), 0.0)
    try:
        wait_for(lambda: len(calls) >= 2, timeout=10)
    finally:
        remove()
    assert set(calls) == {"torchelastic-otel-drainer"}
    seen = len(calls)
    remove()  # twice: no error
    wait_for(lambda: _drainer.state.thread is not None and _drainer.state.thread.is_alive(), timeout=5)
    assert len(calls) <= seen + 1  # at most one call was in flight when it was removed


def test_a_raising_periodic_callback_is_counted_and_the_drainer_lives_on(otel: Any) -> None:
    before = selftelemetry.total(selftelemetry.DROPPED, "all", "periodic_error")
    after: list[int] = []

    def boom() -> None:
        raise RuntimeError("boom")

    remove_boom = _drainer.add_periodic(boom, 0.0)
    remove_ok = _drainer.add_periodic(lambda: after.append(1), 0.0)
    try:
        wait_for(lambda: selftelemetry.total(selftelemetry.DROPPED, "all", "periodic_error") > before and after,
                 timeout=10)  # fmt: skip
    finally:
        remove_boom()
        remove_ok()


# ---- the worker set-up ----------------------------------------------------------------------------------------


def test_install_hooks_optimizers_registers_the_watchdog_and_undoes_it(
    fresh: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    periodic = len(_drainer.state.periodic)
    extras = list(worker._worker.final_extras)
    patches = Patches()
    training.install(patches, worker.add_final_metadata)
    try:
        assert os.environ["TORCH_FR_BUFFER_SIZE"] == training.FLIGHT_RECORDER_ENTRIES
        assert len(_drainer.state.periodic) == periodic + 1
        # the final records get the collectives' summary and count the lost progress (``anatomy``)
        assert len(worker._worker.final_extras) == len(extras) + 2
        assert "collectives" not in worker._final_metadata()  # (no process group here: nothing to add)
        _optimizer().step()
        assert len(timeline.timeline) == 1
        assert anatomy.installed()  # the phase wrappers (tests/unit/test_anatomy.py)
    finally:
        patches.restore()
    assert len(_drainer.state.periodic) == periodic and worker._worker.final_extras == extras
    assert not anatomy.installed()
    _optimizer().step()
    assert len(timeline.timeline) == 1  # the hook is gone


def test_install_keeps_the_job_s_flight_recorder_size(fresh: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    patches = Patches()
    training.install(patches)
    patches.restore()
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == "0"


def test_torchelastic_otel_steps_0_turns_it_all_off(fresh: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_OTEL_STEPS", "0")
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    patches = Patches()
    training.install(patches)
    assert len(patches) == 0 and "TORCH_FR_BUFFER_SIZE" not in os.environ
    _optimizer().step()
    assert not timeline.timeline
