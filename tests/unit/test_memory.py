"""Memory per rank: the worker's instruments (``_torch.worker.memory``) and the report's creep (``report.memory``).

The instruments run on the real SDK (the ``otel`` fixture's in-memory reader); the RSS they report is checked
against the kernel's own ``VmRSS`` (``/proc/self/status``), not against the ``statm`` the code reads. The machine has
no GPU: the CUDA branch fakes only the ``torch.cuda`` functions the instruments call (``is_initialized``,
``device_count``, ``memory_allocated`` / ``memory_reserved`` / ``max_memory_allocated``), at that boundary; the
rest (the SDK, the callbacks, the pipeline's generations) is real.

The creep rule runs on synthetic points shaped like the measured ones (``report/memory.py``'s docstring): a steady
leak, a start-up ramp and first-step warm-up followed by a plateau, a noisy plateau, a single jump, a leak freed at
exit. The real job is ``tests/jobs/test_memory.py``.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import torchelastic_otel
from tests.support.otel import KEEP_ALIVE, metric_of, points_of
from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import memory as worker_memory
from torchelastic_otel.report import memory, model
from torchelastic_otel.report.records import Point, Proc, Telemetry

MIB = 1 << 20
S = 1_000_000_000
T0 = 1_800_000_000 * S


# ---- the worker's instruments ---------------------------------------------------------------------------------


@pytest.fixture
def installed(otel: Any) -> Iterator[Any]:
    patches = Patches()
    worker_memory.install(patches)
    try:
        yield otel
    finally:
        patches.restore()
        worker_memory._state.devices.clear()


def _vm_rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_process_memory_usage_is_this_process_s_rss(installed: Any) -> None:
    data = installed.reader.get_metrics_data()
    expected = _vm_rss()
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
    after = selftelemetry.snapshot(selftelemetry.DROPPED)
    for reason in ("process_memory_unreadable", "cuda_memory_error"):
        key = (selftelemetry.DROPPED, "metrics", reason)
        assert after.get(key, 0) == before.get(key, 0) + 1, reason


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
    assert found.seconds == pytest.approx(4.0) and found.growth_bytes == pytest.approx(320 * MIB, rel=1e-6)
    assert found.first_bytes == pytest.approx(336 * MIB, rel=1e-6)  # the window starts at the first step's export
    assert found.r2 > 0.999
    assert found.text == "rank 1 grew 320 MiB in 4 s (+80.0 MiB/s), 2.0x its start"


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
    assert found.text.startswith("rank 1 (restart 1, pid 1011) grew 500 MiB in 10 s (+50.0 MiB/s)")
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
