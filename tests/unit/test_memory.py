"""Memory per rank: the worker's instruments (``_torch.worker.memory``) and the report's creep (``report.memory``).

The instruments run on the real SDK (the ``otel`` fixture's in-memory reader); the RSS they report is checked
against the kernel's own ``VmRSS`` (``/proc/self/status``), not against the ``statm`` the code reads. The machine has
no GPU: the CUDA branch fakes only the ``torch.cuda`` functions the instruments call (``is_initialized``,
``device_count``, ``memory_allocated`` / ``memory_reserved`` / ``max_memory_allocated``,
``get_device_properties``), at that boundary -- patched onto the real ``torch.cuda``, or, for the OOM forecast, a
fake ``torch.cuda`` module put in ``sys.modules`` whose allocated memory follows a script on a scripted clock; the
rest (the SDK, the callbacks, the pipeline's generations) is real.

The creep rule runs on synthetic points shaped like the measured ones (``report/memory.py``'s docstring): a steady
leak, a start-up ramp and first-step warm-up followed by a plateau, a noisy plateau, a single jump, a leak freed at
exit; and a CUDA device's allocated memory: a leak under the activations' swing, with its forecast, beside a flat
resident set; the optimizer's first-step jump then a plateau; a large job on a device with little room left. The
real job is ``tests/jobs/test_memory.py``; a CUDA OOM's figures are ``tests/unit/test_cuda_oom.py``.
"""

from __future__ import annotations

import random
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import torchelastic_otel
from tests.support.installed import installed as patches_installed
from tests.support.otel import KEEP_ALIVE, metric_of, points_of
from tests.support.workers._shared import vm_rss
from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import memory as worker_memory
from torchelastic_otel.report import goodput, html, memory, model, terminal, training
from torchelastic_otel.report.records import Point, Proc, Telemetry

MIB = 1 << 20
S = 1_000_000_000
T0 = 1_800_000_000 * S


# ---- the worker's instruments ---------------------------------------------------------------------------------


@pytest.fixture
def installed(otel: Any) -> Iterator[Any]:
    try:
        with patches_installed(worker_memory.install):
            yield otel
    finally:
        worker_memory._state.devices.clear()
        worker_memory._state.totals.clear()
        worker_memory._state.readings.clear()


def test_process_memory_usage_is_this_process_s_rss(installed: Any) -> None:
    data = installed.reader.get_metrics_data()
    expected = vm_rss()
    metric = metric_of(data, names.PROCESS_MEMORY_USAGE)
    assert metric is not None and metric.unit == "By"
    assert not metric.data.is_monotonic  # an UpDownCounter, as the semantic conventions define it
    ((attrs, point),) = points_of(data, names.PROCESS_MEMORY_USAGE)
    assert attrs == {}
    assert abs(point.value - expected) <= 0.1 * expected, (point.value, expected)


def test_each_collection_reads_the_rss_anew(installed: Any) -> None:
    first = installed.metric_points(names.PROCESS_MEMORY_USAGE)[0][1].value
    kept = bytearray(b"\x01") * (64 * MIB)  # written through: resident
    second = installed.metric_points(names.PROCESS_MEMORY_USAGE)[0][1].value
    assert second - first >= 48 * MIB, (first, second)
    del kept


def test_no_cuda_series_without_cuda_and_nothing_imported(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch.cuda", raising=False)
    data = installed.reader.get_metrics_data()
    assert "torch.cuda" not in sys.modules  # the instruments never import it
    for name in (names.WORKER_CUDA_MEMORY_ALLOCATED, names.WORKER_CUDA_MEMORY_RESERVED, names.WORKER_CUDA_MEMORY_PEAK):
        assert points_of(data, name) == []


class FakeDevices:
    """What torch.cuda's caching allocator would say, per device (bytes)."""

    def __init__(self) -> None:
        self.initialised = True
        self.reserved = {0: 6 << 30, 1: 0}
        self.allocated = {0: 4 << 30, 1: 0}
        self.peak = {0: 5 << 30, 1: 0}
        self.total = {0: 80 << 30, 1: 80 << 30}
        self.calls: list[str] = []

    def patch(self, cuda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        def reader(name: str, table: dict[int, int]) -> Any:
            def read(device: int) -> int:
                self.calls.append(name)
                return table[device]

            return read

        monkeypatch.setattr(cuda, "is_initialized", lambda: self.initialised)
        monkeypatch.setattr(cuda, "device_count", lambda: len(self.reserved))
        monkeypatch.setattr(cuda, "memory_reserved", reader("memory_reserved", self.reserved))
        monkeypatch.setattr(cuda, "memory_allocated", reader("memory_allocated", self.allocated))
        monkeypatch.setattr(cuda, "max_memory_allocated", reader("max_memory_allocated", self.peak))
        total = reader("get_device_properties", self.total)
        monkeypatch.setattr(
            cuda, "get_device_properties", lambda device: types.SimpleNamespace(total_memory=total(device))
        )


def _cuda_values(data: Any) -> dict[str, dict[int, int]]:
    out = {}
    for name in (names.WORKER_CUDA_MEMORY_ALLOCATED, names.WORKER_CUDA_MEMORY_RESERVED, names.WORKER_CUDA_MEMORY_PEAK):
        out[name] = {attrs["device"]: point.value for attrs, point in points_of(data, name)}
        metric = metric_of(data, name)
        assert metric is None or metric.unit == "By"
    return out


def test_cuda_memory_per_device_in_use(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake stands in for torch.cuda's functions only (no GPU here); the instruments, SDK and reader are real."""
    torch = pytest.importorskip("torch")
    devices = FakeDevices()
    devices.patch(torch.cuda, monkeypatch)
    assert _cuda_values(installed.reader.get_metrics_data()) == {
        names.WORKER_CUDA_MEMORY_ALLOCATED: {0: 4 << 30},
        names.WORKER_CUDA_MEMORY_RESERVED: {0: 6 << 30},
        names.WORKER_CUDA_MEMORY_PEAK: {0: 5 << 30},
    }  # device 1 was never used: no series (and no context made for it)
    devices.reserved[1], devices.allocated[1], devices.peak[1] = 2 << 30, 1 << 30, 1 << 30
    devices.allocated[0] = 3 << 30
    values = _cuda_values(installed.reader.get_metrics_data())
    assert values[names.WORKER_CUDA_MEMORY_ALLOCATED] == {0: 3 << 30, 1: 1 << 30}
    devices.reserved[1] = devices.allocated[1] = 0  # emptied: the series goes on, at 0
    assert _cuda_values(installed.reader.get_metrics_data())[names.WORKER_CUDA_MEMORY_RESERVED] == {0: 6 << 30, 1: 0}
    devices.initialised, devices.calls = False, []
    assert all(values == {} for values in _cuda_values(installed.reader.get_metrics_data()).values())
    assert devices.calls == []  # not initialised: not one call into torch.cuda's allocator


def test_the_device_total_is_read_once(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    devices = FakeDevices()
    devices.patch(torch.cuda, monkeypatch)
    for _ in range(3):
        data = installed.reader.get_metrics_data()
        assert {attrs["device"]: p.value for attrs, p in points_of(data, names.WORKER_CUDA_MEMORY_TOTAL)} == {
            0: 80 << 30}  # fmt: skip
        metric = metric_of(data, names.WORKER_CUDA_MEMORY_TOTAL)
        assert metric is not None and metric.unit == "By"
    assert devices.calls.count("get_device_properties") == 1


def test_a_failing_read_never_raises_and_is_counted(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    devices = FakeDevices()
    devices.patch(torch.cuda, monkeypatch)

    def broken(device: int) -> int:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "memory_allocated", broken)
    monkeypatch.setattr(worker_memory, "STATM", "/nonexistent/statm")
    before = selftelemetry.snapshot(selftelemetry.DROPPED)
    data = installed.reader.get_metrics_data()
    assert points_of(data, names.PROCESS_MEMORY_USAGE) == []  # no /proc: nothing, never getrusage's peak
    assert points_of(data, names.WORKER_CUDA_MEMORY_ALLOCATED) == []
    assert len(points_of(data, names.WORKER_CUDA_MEMORY_RESERVED)) == 1  # the others go on
    assert len(points_of(data, names.WORKER_CUDA_MEMORY_TOTAL)) == 1
    after = selftelemetry.snapshot(selftelemetry.DROPPED)
    # the allocated gauge's callback and the forecast's, which reads allocated too
    for reason, count in (("process_memory_unreadable", 1), ("cuda_memory_error", 2)):
        key = (selftelemetry.DROPPED, "metrics", reason)
        assert after.get(key, 0) == before.get(key, 0) + count, reason


def test_a_new_pipeline_gets_the_instruments_too(installed: Any) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    KEEP_ALIVE.append(provider)
    torchelastic_otel.setup(meter_provider=provider, tracer_provider=installed.tracer_provider,
                            logger_provider=installed.logger_provider)  # fmt: skip
    assert len(points_of(reader.get_metrics_data(), names.PROCESS_MEMORY_USAGE)) == 1


def test_installing_twice_registers_once_and_uninstalling_stops_it(otel: Any) -> None:
    patches = Patches()
    worker_memory.install(patches)
    worker_memory.install(patches)
    assert worker_memory.installed()
    assert len(otel.metric_points(names.PROCESS_MEMORY_USAGE)) == 1
    patches.restore()
    assert not worker_memory.installed()
    assert otel.metric_points(names.PROCESS_MEMORY_USAGE) == []


# ---- the report: creep ----------------------------------------------------------------------------------------


def _proc(rank: int, restart: int = 0, pid: int | None = None) -> Proc:
    return Proc("worker", "node0", pid or 1000 + 10 * restart + rank, "run", rank, rank, restart, "torchelastic")


def _points(proc: Proc, series: list[tuple[float, float]], steps: list[tuple[float, int]] | None = None) -> list[Point]:
    """``series``: (seconds after T0, MiB); ``steps``: (seconds after T0, cumulative steps)."""
    out = [Point(names.PROCESS_MEMORY_USAGE, "sum", "By", T0 + int(t * S), mib * MIB, {}, proc) for t, mib in series]
    for t, count in steps or []:
        out.append(Point(names.WORKER_STEPS, "sum", "{step}", T0 + int(t * S), float(count), {}, proc, True))
    return out


def _job(*points: list[Point]) -> model.Job:
    (job,) = model.build(Telemetry(points=[p for group in points for p in group]))
    return job


def _every(start: float, end: float, interval: float) -> list[float]:
    return [start + i * interval for i in range(int(round((end - start) / interval)) + 1)]


def _start_up(seconds: float = 5.0) -> list[tuple[float, float]]:
    """A worker's import and set-up ramp, as measured: 230 -> 320 MiB, nearly linear."""
    return [(t, 230 + 90 * t / seconds) for t in _every(0, seconds, 0.2)]


def _steps(start: float, end: float, every: float = 0.2, per_second: float = 10) -> list[tuple[float, int]]:
    return [(t, round((t - start) * per_second) + 1) for t in _every(start, end, every)]


def test_a_steady_leak_is_named_with_its_growth() -> None:
    leak = _start_up() + [(t, 320 + 80 * (t - 5)) for t in _every(5.2, 9.2, 0.2)]  # 80 MiB/s for 4 s
    flat = _start_up() + [(t, 320.0) for t in _every(5.2, 9.2, 0.2)]
    job = _job(_points(_proc(0), flat, _steps(5.2, 9.2)), _points(_proc(1), leak, _steps(5.2, 9.2)))
    (found,) = memory.creep(job)
    assert (found.rank, found.restart, found.host, found.pid) == (1, 0, "node0", 1001)
    assert found.growth_bytes_per_s == pytest.approx(80 * MIB, rel=1e-6)
    # the window: from the first step's export to the one before the export that counted the last step (9.0 s)
    assert found.seconds == pytest.approx(3.8) and found.growth_bytes == pytest.approx(304 * MIB, rel=1e-6)
    assert found.first_bytes == pytest.approx(336 * MIB, rel=1e-6)  # the window starts at the first step's export
    assert found.r2 > 0.999
    assert found.text == "rank 1 grew 304 MiB in 4 s (+80.0 MiB/s), 1.9x its start"


def test_a_slow_leak_of_a_long_run_reads_per_minute() -> None:
    leak = [(t, 1000 + t / 60 * 2.0) for t in _every(0, 3 * 3600, 60)]  # 2 MiB a minute for 3 hours, no steps
    (found,) = memory.creep(_job(_points(_proc(3), leak)))
    assert found.text.startswith("rank 3 grew ") and "(+2.0 MiB/min)" in found.text and " in 2.2 h " in found.text


def test_warm_up_then_flat_is_no_creep() -> None:
    """The start-up ramp (+42 %), then the first steps' warm-up (+74 MiB: grads, DDP's buckets, allocator), then
    not a byte more, as measured on a healthy DDP job -- with and without the steps counter."""
    warm = [(5.2, 362.0), (5.4, 378.0), (5.6, 394.0)] + [(t, 394.0) for t in _every(5.8, 14.0, 0.2)]
    assert memory.creep(_job(_points(_proc(0), _start_up() + warm, _steps(5.2, 14.0)))) == []
    assert memory.creep(_job(_points(_proc(0), _start_up() + warm))) == []
    # without steps, a run barely longer than its start-up: the 20 % left out do not hold all of the ramp
    short = _start_up(5.0) + [(t, 320.0) for t in _every(5.2, 8.0, 0.2)]
    assert memory.creep(_job(_points(_proc(0), short))) == []


def test_a_noisy_plateau_is_no_creep() -> None:
    rng = random.Random(28)
    noisy = [(t, 2048 + rng.gauss(0, 40)) for t in _every(0, 600, 1)]
    assert memory.creep(_job(_points(_proc(0), noisy, _steps(1, 600, every=1)))) == []


def test_one_jump_is_no_creep_wherever_it_lies() -> None:
    for at in (100, 300, 500):
        jump = [(t, 1000.0 if t < at else 1600.0) for t in _every(0, 600, 5)]
        assert memory.creep(_job(_points(_proc(0), jump, _steps(1, 600, every=5)))) == [], at


def test_a_leak_freed_at_exit_is_still_named() -> None:
    """At exit Python frees what the loop kept: the points after the last step are not the run."""
    leak = _start_up() + [(t, 320 + 80 * (t - 5)) for t in _every(5.2, 9.2, 0.2)] + [(9.4, 312.0), (9.5, 312.0)]
    steps = _steps(5.2, 9.2) + [(9.4, 41), (9.5, 41)]  # the last step's export at 9.2 s
    (found,) = memory.creep(_job(_points(_proc(1), leak, steps)))
    assert found.growth_bytes_per_s == pytest.approx(80 * MIB, rel=1e-6)


def test_small_or_short_growth_is_no_creep() -> None:
    small = [(t, 300 + 10 * t) for t in _every(0, 5, 0.5)]  # +50 MiB: under 64 MiB
    assert memory.creep(_job(_points(_proc(0), small, _steps(0, 5, every=0.5)))) == []
    big = [(t, 8000 + 20 * t) for t in _every(0, 10, 1)]  # +200 MiB of 8 GB: under 20 %
    assert memory.creep(_job(_points(_proc(0), big, _steps(0, 10, every=1)))) == []
    few = [(0.0, 300.0), (1.0, 400.0), (2.0, 500.0), (3.0, 600.0)]  # 4 points
    assert memory.creep(_job(_points(_proc(0), few, [(t, int(t) + 1) for t, _ in few]))) == []


def test_restarts_and_helper_processes_are_told_apart() -> None:
    leak = [(t, 300 + 50 * t) for t in _every(20, 30, 0.5)]
    flat = [(t, 300.0) for t in _every(0, 10, 0.5)]
    main, helper = _proc(1, 1), _proc(1, 1, pid=4242)
    job = _job(_points(_proc(1, 0), flat, _steps(0, 10)), _points(main, leak, _steps(20, 30)),
               _points(helper, [(t, 100.0) for t in _every(20, 30, 0.5)]))  # fmt: skip
    (found,) = memory.creep(job)
    assert (found.rank, found.restart, found.pid) == (1, 1, 1011)
    assert found.text.startswith("rank 1 (restart 1, pid 1011) grew 475 MiB in 10 s (+50.0 MiB/s)")
    labels = [(s.label, s.restart, s.pid, len(s.points)) for s in memory.memory_series(job)]
    assert labels == [("rank 1, restart 0", 0, 1001, 21), ("rank 1, restart 1, pid 1011", 1, 1011, 21),
                      ("rank 1, restart 1, pid 4242", 1, 4242, 21)]  # fmt: skip


def test_memory_series_is_per_process_in_time_order_and_thinned() -> None:
    series = [(t, 300 + t) for t in _every(0, 100, 0.2)]  # 501 points
    (line,) = memory.memory_series(_job(_points(_proc(0), list(reversed(series)))), max_points=100)
    assert len(line.points) == 100 and line.label == "rank 0, restart 0"
    assert line.points[0] == (T0, 300 * MIB) and line.points[-1] == (T0 + 100 * S, 400 * MIB)
    assert [t for t, _ in line.points] == sorted(t for t, _ in line.points)


def test_a_job_without_memory_points_has_no_creep_and_no_series() -> None:
    other = [Point("loss", "gauge", "", T0 + i * S, 1.0, {}, _proc(0)) for i in range(10)]
    job = _job(other)
    assert memory.creep(job) == [] and memory.memory_series(job) == []


def test_fit_is_least_squares() -> None:
    slope, first, r2 = memory.fit([(T0, 10.0), (T0 + S, 12.0), (T0 + 2 * S, 14.0)])
    assert (slope, first, r2) == pytest.approx((2.0, 10.0, 1.0))
    assert memory.fit([(T0, 5.0), (T0 + S, 5.0)]) == (0.0, 5.0, 0.0)


# ---- the worker's OOM forecast ----------------------------------------------------------------------------------


class ScriptedCuda(types.ModuleType):
    """Stands in for ``torch.cuda`` in ``sys.modules`` (no GPU here): device 0's allocated memory is ``script(t)``
    at the scripted clock's ``t``; its total is 80 GiB."""

    def __init__(self, script: Any) -> None:
        super().__init__("torch.cuda")
        self.script = script
        self.now = 0.0

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def memory_allocated(self, device: int) -> int:
        return int(self.script(self.now))

    def memory_reserved(self, device: int) -> int:
        return int(self.script(self.now)) + (1 << 30)

    def max_memory_allocated(self, device: int) -> int:
        return int(self.script(self.now))

    def get_device_properties(self, device: int) -> Any:
        return types.SimpleNamespace(total_memory=80 << 30)


def _forecasts(installed: Any, monkeypatch: pytest.MonkeyPatch, script: Any, times: list[float]) -> list[Any]:
    """The forecast gauge's value (``None``: no point) at each collection, one at each of ``times`` (s)."""
    cuda = ScriptedCuda(script)
    monkeypatch.setitem(sys.modules, "torch.cuda", cuda)
    monkeypatch.setattr(worker_memory, "_clock", lambda: cuda.now)
    out = []
    for t in times:
        cuda.now = t
        points = points_of(installed.reader.get_metrics_data(), names.WORKER_CUDA_MEMORY_FULL_IN)
        assert all(attrs == {"device": 0} for attrs, _ in points)
        out.append(points[0][1].value if points else None)
    return out


def test_the_forecast_is_the_time_left_at_a_steady_leak_s_rate(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """32 MiB a second from 2 GiB, read every 10 s: from the fifth reading, the seconds until 80 GiB."""
    values = _forecasts(installed, monkeypatch, lambda t: (2 << 30) + 32 * MIB * t, _every(0, 100, 10))
    assert values[:4] == [None] * 4  # fewer than five readings: no forecast yet
    for t, value in zip(_every(40, 100, 10), values[4:], strict=True):
        assert value == pytest.approx(((80 << 30) - (2 << 30) - 32 * MIB * t) / (32 * MIB), rel=1e-9), t
    data = installed.reader.get_metrics_data()
    metric = metric_of(data, names.WORKER_CUDA_MEMORY_FULL_IN)
    assert metric is not None and metric.unit == "s"


def test_no_forecast_for_a_warm_up_then_a_plateau(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The optimizer's states at the first step (a jump of 4 GiB), then the activations' swing (+-1 GiB, sampled
    anywhere in the step) around a level that does not move."""
    rng = random.Random(7)

    def script(t: float) -> float:
        return (2 << 30) + (4 << 30 if t >= 15 else 0) + rng.uniform(0, 2 << 30)

    assert _forecasts(installed, monkeypatch, script, _every(0, 1200, 10)) == [None] * 121


def test_a_leak_that_stops_loses_its_forecast(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    values = _forecasts(installed, monkeypatch, lambda t: (2 << 30) + 32 * MIB * min(t, 300), _every(0, 900, 10))
    assert all(v is not None for v in values[4:31])  # leaking for 300 s
    assert values[31] < values[32] < values[33]  # stopped: the fitted rate falls, the time left grows
    assert all(v is None for v in values[45:])  # from 150 s after the stop: the window's second half is flat


def test_the_forecast_keeps_a_bounded_window(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _forecasts(installed, monkeypatch, lambda t: (2 << 30) + MIB * t, _every(0, 3000, 2))
    (readings,) = worker_memory._state.readings.values()
    assert len(readings) <= worker_memory.FORECAST_READINGS
    assert readings[-1][0] - readings[0][0] <= worker_memory.FORECAST_WINDOW_S


def test_forecast_rule() -> None:
    line = [(float(t), (2 << 30) + 100 * MIB * t) for t in range(5)]
    assert worker_memory.forecast(line, 80 << 30) == pytest.approx(((80 << 30) - (2 << 30) - 400 * MIB) / (100 * MIB))
    assert worker_memory.forecast(line[:4], 80 << 30) is None  # too few
    assert worker_memory.forecast(line, 1 << 30) == 0.0  # the line is past it
    assert worker_memory.forecast([(float(t), 1000.0 * t) for t in range(10)], 80 << 30) is None  # under 64 MiB
    falling = [(t, (80 << 30) - v) for t, v in line]
    assert worker_memory.forecast(falling, 80 << 30) is None
    assert worker_memory.forecast(line, 0) is None


# ---- the report: a CUDA device's creep and forecast -----------------------------------------------------------


def _cuda_points(
    proc: Proc, device: int, series: list[tuple[float, float]], total_gib: float | None = None
) -> list[Point]:
    """``series``: (seconds after T0, MiB allocated on ``device``); its total (once, as the worker exports it)."""
    out = [Point(names.WORKER_CUDA_MEMORY_ALLOCATED, "gauge", "By", T0 + int(t * S), mib * MIB, {"device": device},
                 proc) for t, mib in series]  # fmt: skip
    if total_gib is not None:
        out += [Point(names.WORKER_CUDA_MEMORY_TOTAL, "gauge", "By", T0 + int(t * S), total_gib * 1024 * MIB,
                      {"device": device}, proc) for t, _ in series]  # fmt: skip
    return out


def _swing(rng: random.Random, mib: float) -> float:
    """The activations, sampled anywhere in a step: 0 to ``mib``."""
    return rng.uniform(0, mib)


def test_a_cuda_leak_beside_a_flat_rss_is_named_with_its_device_and_forecast() -> None:
    """A bf16 MLP keeping 32 MiB a step at 7 steps a second (+224 MiB/s) from 2.4 GiB, under a 512 MiB swing, RSS
    flat; cuda:1 of the same rank is flat under its swing."""
    rng = random.Random(3)
    times = _every(0, 40, 0.5)
    leak = [(t, 2.4 * 1024 + 224 * t + _swing(rng, 512)) for t in times]
    flat = [(t, 3 * 1024 + _swing(rng, 512)) for t in times]
    steps = _steps(0, 40, every=0.5, per_second=7)
    rss = [(t, 900.0) for t in times]
    job = _job(_points(_proc(1), rss, steps), _cuda_points(_proc(1), 0, leak, 80), _cuda_points(_proc(1), 1, flat, 80),
               _points(_proc(0), rss, steps), _cuda_points(_proc(0), 0, flat, 80))  # fmt: skip
    (found,) = memory.creep(job)
    assert (found.rank, found.memory, found.device, found.total_bytes) == (1, "cuda", 0, 80 * 1024 * MIB)
    assert found.growth_bytes_per_s == pytest.approx(224 * MIB, rel=0.02) and found.r2 > 0.95
    expected_full_in = (80 * 1024 * MIB - found.last_bytes) / found.growth_bytes_per_s
    assert found.full_in_s == pytest.approx(expected_full_in) and 5 * 60 < expected_full_in < 6 * 60
    assert found.text.startswith("rank 1 cuda:0 allocated grew 8.7 GiB in 40 s (+22")
    assert found.text.endswith("x its start; at this rate cuda:0 is full in 5 min"), found.text
    verdict = goodput.assess(job, training.analyze(job)).verdict
    assert (verdict.verdict, verdict.reason) == ("memory-creep", found.text)
    (run,) = training.summary([job])["runs"]
    (creep,) = run["memory_creep"]
    assert creep["memory"] == "cuda" and creep["device"] == 0 and creep["rank"] == 1
    assert creep["full_in_seconds"] == pytest.approx(expected_full_in, abs=0.1) and creep["text"] == found.text
    assert creep["total_bytes"] == 80 * 1024 * MIB and run["verdict"]["reason"] == found.text


def test_the_report_s_memory_section_names_the_cuda_creep() -> None:
    times = _every(0, 40, 0.5)
    leak = [(t, 2.4 * 1024 + 224 * t) for t in times]
    job = _job(_points(_proc(1), [(t, 900.0) for t in times], _steps(0, 40, every=0.5)),
               _cuda_points(_proc(1), 0, leak, 80))  # fmt: skip
    tel = Telemetry(points=job.points)
    (found,) = memory.creep(job)
    text = terminal.render(tel, [job])
    assert "MEMORY\n" in text and f"memory creeps: {found.text}" in text.split("MEMORY", 1)[1]
    page = html.render(tel, [job])
    assert (f'<li class=creep data-rank="1" data-memory="cuda" data-device="0" data-full-in="{found.full_in_s:.0f}">'
            f"memory creeps: {found.text}</li>") in page  # fmt: skip


def test_a_cuda_warm_up_then_plateau_is_no_creep() -> None:
    """The model moved to the device before the first step, the optimizer's states at the first step (+4 GiB),
    then the activations' swing around a level that does not move -- with and without the steps counter."""
    rng = random.Random(5)
    series = [(t, 1024.0) for t in _every(0, 5, 0.5)] + [(t, 3 * 1024 + _swing(rng, 1024)) for t in _every(5.5, 6, 0.5)]
    series += [(t, 7 * 1024 + _swing(rng, 1024)) for t in _every(6.5, 60, 0.5)]
    assert memory.creep(_job(_cuda_points(_proc(0), 0, series, 80), _points(_proc(0), [], _steps(5.5, 60, 0.5)))) == []
    assert memory.creep(_job(_cuda_points(_proc(0), 0, series, 80))) == []


def test_a_large_job_on_a_full_device_creeps_by_the_room_it_had_left() -> None:
    """60 GiB at the start, +10 GiB steadily: 17 % of its start (under 20 %), but half the room the 80 GiB device
    had left -- a creep with the device's total, none in files without it (and then no forecast either)."""
    series = [(t, 60 * 1024 + 10 * 1024 * t / 100) for t in _every(0, 100, 1)]
    steps = _steps(0, 100, every=1)
    (found,) = memory.creep(_job(_cuda_points(_proc(0), 0, series, 80), _points(_proc(0), [], steps)))
    assert found.full_in_s == pytest.approx(101.0, rel=1e-6)  # 10.1 GiB left at 99 s (the window's end), 0.1 GiB/s
    assert found.text.endswith("1.2x its start; at this rate cuda:0 is full in 101 s")
    assert memory.creep(_job(_cuda_points(_proc(0), 0, series), _points(_proc(0), [], steps))) == []


def test_a_creep_without_the_device_total_has_no_forecast() -> None:
    series = [(t, 2 * 1024 + 200 * t) for t in _every(0, 40, 0.5)]
    (found,) = memory.creep(_job(_cuda_points(_proc(0), 0, series), _points(_proc(0), [], _steps(0, 40, 0.5))))
    assert found.device == 0 and found.total_bytes is None and found.full_in_s is None
    assert "at this rate" not in found.text and found.text.startswith("rank 0 cuda:0 allocated grew ")
    assert memory.creep_json([found])[0]["full_in_seconds"] is None


def test_a_line_past_the_total_is_full_now() -> None:
    series = [(t, 70 * 1024 + 400 * t) for t in _every(0, 40, 0.5)]  # the line ends at 85.6 GiB
    (found,) = memory.creep(_job(_cuda_points(_proc(0), 0, series, 80), _points(_proc(0), [], _steps(0, 40, 0.5))))
    assert found.full_in_s == 0.0 and found.text.endswith("at this rate cuda:0 is full now")


def test_bad_memory_points_are_left_out_and_counted() -> None:
    times = _every(0, 40, 0.5)
    good = _cuda_points(_proc(0), 0, [(t, 2 * 1024 + 200 * t) for t in times], 80)
    bad = [Point(names.WORKER_CUDA_MEMORY_ALLOCATED, "gauge", "By", T0 + int(t * S), value, {"device": device},
                 _proc(0)) for t, value, device in ((1.1, float("nan"), 0), (1.2, -5.0, 0), (1.3, float("inf"), 0),
                                                    (1.4, 1.0, "gpu"), (1.5, 1.0, -1), (1.6, 1.0, True))]  # fmt: skip
    bad.append(Point(names.PROCESS_MEMORY_USAGE, "sum", "By", T0 + S, float("nan"), {}, _proc(0)))
    bad.append(Point(names.WORKER_CUDA_MEMORY_TOTAL, "gauge", "By", T0 + S, -1.0, {"device": 0}, _proc(0)))
    job = _job(good, bad, _points(_proc(0), [], _steps(0, 40, 0.5)))
    (found,) = memory.creep(job)
    assert found.growth_bytes_per_s == pytest.approx(200 * MIB, rel=1e-6) and found.total_bytes == 80 * 1024 * MIB
    assert memory.left_out(job) == 8
    text = terminal.render(Telemetry(points=job.points), [job])
    assert "8 memory points left out: not a memory size" in text


def test_a_real_gpu_leak_is_named_though_its_last_export_came_after_the_loop_let_go(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real bridged job on an NVIDIA H200 (``gpu_worker.py``, ``GPU_MODE=leak``: 32 MiB more CUDA memory kept
    each of 1,000 steps, 1 s exports), its rank's metric lines as the bridge wrote them (the other metrics left
    out). Its last export, at exit, counted the last step after the job had let go of what it kept (68 MiB
    allocated): a window that ended there saw no line and called the job healthy."""
    import json
    import shutil

    from tests.support import ROOT
    from torchelastic_otel.report import cli

    data = ROOT / "tests" / "support" / "data" / "h200-cuda-leak-metrics-rank0.jsonl"
    shutil.copy(data, tmp_path / "metrics-vm-rank0-restart0-2249.jsonl")
    assert cli.main([str(tmp_path), "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["verdict"]["verdict"] == "memory-creep", run["verdict"]
    (creep,) = run["memory_creep"]
    assert creep["memory"] == "cuda" and creep["device"] == 0
    assert creep["growth_bytes"] > 25 * 2**30 and creep["full_in_seconds"] is not None
