"""A step on the GPU's own clock (``_torch.worker.device_clock``, ``anatomy``, ``timeline``), with no GPU.

This machine has no GPU: the CUDA events are scripted (a mock at the one boundary no real part exists for here).
``_Gpu`` plays a CUDA stream: the host launches work that the GPU runs in order, as soon as it is free; an event
completes once the GPU has done everything launched before it; the host blocks when it is a whole launch queue
ahead, and in a sync until the GPU is done. ``_Event`` answers ``query()`` and ``elapsed_time()`` from that
timeline, as a ``torch.Event`` would; nothing else is asked of it. Each loop below knows its own truth (when the
GPU ran each phase) and the figures the bridge exports (through the real timeline, step clock, ledger and SDK)
must match it. On a real GPU: ``tests/gpu``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.otel import points_of
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._torch.worker import anatomy, device_clock, steps, timeline

MS = 1_000_000  # ns
LAUNCH_QUEUE_S = 0.020  # how far ahead of the GPU the host gets before a launch blocks


class _Event:
    """A scripted CUDA event: complete once the host's clock has passed the GPU's reaching it."""

    def __init__(self, gpu: _Gpu) -> None:
        self.gpu, self.done_ns = gpu, None

    def record(self) -> None:
        self.done_ns = self.gpu.reach()

    def query(self) -> bool:
        return self.done_ns is not None and self.gpu.observed_ns >= self.done_ns

    def elapsed_time(self, end: _Event) -> float:
        assert self.query() and end.query(), "elapsed_time on an event the GPU has not reached"
        return (end.done_ns - self.done_ns) / 1e6  # ms, as torch's


class _Gpu:
    """One stream: ``launch`` enqueues work, ``reach`` is where an event recorded now completes."""

    def __init__(self) -> None:
        self.host_ns = time.time_ns()  # the host's clock: it starts now, after the process (the ledger's start)
        self.free_ns = self.host_ns  # when the GPU has done everything launched so far
        self.observed_ns = 0  # what the drainer may see: events done by then answer query() True
        self.busy: list[tuple[int, int, str]] = []  # (start, end, label) the GPU worked

    def host(self, seconds: float) -> None:
        self.host_ns += int(seconds * 1e9)

    def launch(self, gpu_seconds: float, label: str, host_seconds: float = 5e-6) -> None:
        self.host(host_seconds)
        ahead = self.free_ns - self.host_ns
        if ahead > LAUNCH_QUEUE_S * 1e9:  # the launch queue is full: the host waits
            self.host_ns = self.free_ns - int(LAUNCH_QUEUE_S * 1e9)
        start = max(self.free_ns, self.host_ns)
        self.free_ns = start + int(gpu_seconds * 1e9)
        self.busy.append((start, self.free_ns, label))

    def reach(self) -> int:
        return max(self.free_ns, self.host_ns) + 5_000  # a few µs to reach an event on an idle stream

    def sync(self) -> None:
        self.host_ns = max(self.host_ns, self.free_ns)

    def gpu_seconds(self, label: str, since_ns: int) -> float:
        return sum(b - a for a, b, name in self.busy if name == label and a >= since_ns) / 1e9


class _Job:
    """The scripted GPU, the SDK's in-memory reader, and the loop's marks on the real timeline."""

    def __init__(self, otel: Any, gpu: _Gpu) -> None:
        self.otel, self.gpu = otel, gpu
        self.device = timeline.timeline.device
        self.device.every = 1

    def mark(self, code: int) -> None:
        device = self.device
        event = device.record() if device.armed else None
        timeline.timeline.put(self.gpu.host_ns, code, event)

    def step_end(self) -> None:
        timeline.timeline.put(self.gpu.host_ns, steps.EXPLICIT, self.device.step_ends(steps.EXPLICIT))
        self.last_end_ns = self.gpu.host_ns

    def step(
        self,
        *,
        loader_s: float,
        forward: tuple[float, float],
        backward: tuple[float, float],
        optimizer: tuple[float, float],
        sync: bool,
        python_s: float = 0.0002,
        kernels: int = 20,
    ) -> None:
        """One step: ``(GPU seconds, host launch seconds)`` of each phase, split in ``kernels`` launches."""
        gpu = self.gpu
        self.mark(anatomy.INPUT_ENTER)
        gpu.host(loader_s)
        self.mark(anatomy.INPUT_EXIT)
        for _ in range(kernels):
            gpu.launch(forward[0] / kernels, "forward", forward[1] / kernels)
        self.mark(anatomy.BACKWARD_ENTER)
        for _ in range(kernels):
            gpu.launch(backward[0] / kernels, "backward", backward[1] / kernels)
        self.mark(anatomy.BACKWARD_EXIT)
        for _ in range(kernels):
            gpu.launch(optimizer[0] / kernels, "optimizer", optimizer[1] / kernels)
        self.step_end()
        if sync:
            gpu.sync()  # loss.item()
        gpu.host(python_s)

    def drain(self, everything_done: bool = True) -> None:
        if everything_done:
            self.gpu.observed_ns = self.gpu.host_ns + 10**12
        steps.drain()
        anatomy.resolve(None)

    def points(self, name: str) -> list[tuple[dict, Any]]:
        return points_of(self.otel.reader.get_metrics_data(), name)

    def phases(self, clock: str = "device") -> dict[str, Any]:
        return {attrs["phase"]: p for attrs, p in self.points("torchelastic.worker.step.phase.duration")
                if attrs.get("clock", "host") == clock}  # fmt: skip

    def goodput(self) -> dict[str, float]:
        return {attrs["cause"]: p.value for attrs, p in self.points("torchelastic.goodput.time")}


@pytest.fixture
def job(otel: Any, paused_drainer: Any) -> Iterator[_Job]:
    """A fresh step clock and ledger whose steps are on the GPU's clock, with scripted events (``_Event``)."""
    from torchelastic_otel._torch.patches import Patches

    patches = Patches()
    steps.reset()
    anatomy.install(patches)
    gpu = _Gpu()
    anatomy.start_device_clock(lambda: _Event(gpu))
    try:
        yield _Job(otel, gpu)
    finally:
        patches.restore()
        timeline.timeline.device.reset_after_fork()
        steps.reset()


COMMON = {"forward": (0.00407, 0.00158), "backward": (0.00686, 0.00262), "optimizer": (0.00025, 0.00040)}


def test_a_loop_that_syncs_every_step_is_the_model_s_gpu_time_not_other(job: _Job) -> None:
    """The common loop (``loss.item()`` each step): on the host's clock the GPU's time lands in ``other`` (where the
    host waits in the sync); on the GPU's it is the forward's and the backward's, as the GPU ran them."""
    began = job.gpu.host_ns
    for _ in range(30):
        job.step(loader_s=0.0001, sync=True, **COMMON)
    job.drain()
    found = job.phases()
    counted = found["forward"].count
    assert counted == 29  # every step after the first (which began at the first input: no event before it)
    for phase in ("forward", "backward", "optimizer"):
        truth = job.gpu.gpu_seconds(phase, began) / 30
        assert found[phase].sum / counted == pytest.approx(truth, rel=0.02), phase
    assert found["collective_wait"].sum == 0
    # the GPU's only waits: the loader (0.1 ms) and the loop's python after the sync (0.2 ms)
    assert found["input"].sum / counted == pytest.approx(0.0001, rel=0.1)
    assert found["other"].sum / counted == pytest.approx(0.0002, rel=0.1)
    ((_, idle),) = job.points("torchelastic.worker.step.gpu_idle.duration")
    assert idle.count == counted and idle.sum / counted == pytest.approx(0.0003, rel=0.1)
    assert not job.phases("host")  # a CUDA job's phases are on one clock


def test_a_gpu_bound_loop_has_no_idle_time_and_its_phases_are_the_gpu_s(job: _Job) -> None:
    """No sync: the host runs a launch queue ahead; the GPU never waits for it."""
    began = job.gpu.host_ns
    for _ in range(30):
        job.step(loader_s=0.0001, sync=False, **COMMON)
    job.drain()
    found = job.phases()
    counted = found["forward"].count
    for phase in ("forward", "backward", "optimizer"):
        assert found[phase].sum / counted == pytest.approx(job.gpu.gpu_seconds(phase, began) / 30, rel=0.02)
    ((_, idle),) = job.points("torchelastic.worker.step.gpu_idle.duration")
    assert idle.sum / counted < 1e-5
    assert found["input"].sum / counted < 1e-5  # the loader fetched while the GPU computed: no waste
    goodput = job.goodput()
    assert goodput.get("input_wait", 0.0) < 1e-4 * 30
    assert goodput["productive"] > 0


def test_an_input_bound_loop_is_the_gpu_s_wait_for_the_loader(job: _Job) -> None:
    """The loader takes 12 ms; the GPU's work of the step before takes 3 of them (no sync): it idles 9."""
    work = {"forward": (0.001, 0.0003), "backward": (0.0015, 0.0004), "optimizer": (0.0005, 0.0001)}
    host_input = 0.0
    for _ in range(20):
        job.step(loader_s=0.012, sync=False, **work)
        host_input += 0.012
    job.drain()
    found = job.phases()
    counted = found["input"].count
    assert found["input"].sum / counted == pytest.approx(0.012 - 0.0022, rel=0.05)
    goodput = job.goodput()
    assert goodput["input_wait"] < host_input * 0.9  # the GPU computed during the rest of the wait
    assert goodput["input_wait"] == pytest.approx(found["input"].sum + (20 - counted) * found["input"].sum / counted,
                                                  rel=0.1)  # fmt: skip


def test_goodput_still_adds_up_to_the_host_s_time(job: _Job) -> None:
    began = job.gpu.host_ns
    for _ in range(12):
        job.step(loader_s=0.005, sync=True, **COMMON)
    job.drain()
    goodput = job.goodput()
    counted = sum(v for k, v in goodput.items() if k != "startup")
    # from the first step's start (its input) to the last step's end, every host second has one cause
    assert counted == pytest.approx((job.last_end_ns - began) / 1e9, rel=1e-6)
    assert goodput["input_wait"] == pytest.approx(12 * 0.005, rel=0.05)  # the loop syncs: the GPU idles in each


def test_steps_wait_for_the_gpu_and_are_never_waited_for(job: _Job) -> None:
    """A drain before the GPU reached the sampled steps' events records nothing of them, blocks on nothing; the
    next one, after, records them all."""
    for _ in range(10):
        job.step(loader_s=0.0001, sync=False, **COMMON)
    job.gpu.observed_ns = 0  # the GPU has reached none of the events yet
    job.drain(everything_done=False)
    assert not job.phases()
    first = job.goodput()["productive"]  # the first step's alone (it had no event: before the first sampled mark)
    assert first < 0.02
    job.drain()
    assert job.phases()["forward"].count > 0  # (a fast loop: an even sample of its steps, _sample)
    assert job.goodput()["productive"] > first + 9 * 0.005


def test_one_step_in_every_few_is_sampled_and_the_rest_borrow_its_input_share(job: _Job) -> None:
    job.device.every = 4
    for _ in range(41):
        job.step(loader_s=0.004, sync=True, **COMMON)
    job.drain()
    found = job.phases()
    assert found["forward"].count == 10  # steps 4, 8, ... 40 of 41 (each from the 4th mark of the step clock)
    goodput = job.goodput()
    # every step's input wait is the GPU's idle share of it (here all of it: the loop syncs before the loader)
    assert goodput["input_wait"] == pytest.approx(40 * 0.004, rel=0.05)


def test_a_pool_the_gpu_outruns_is_counted_and_its_steps_skipped(job: _Job) -> None:
    before = selftelemetry.total(selftelemetry.DROPPED, "metrics", "device_event_missed")
    job.device.limit = job.device.made + 3  # three events more in all: the fourth sampled mark gets none
    for _ in range(6):
        job.step(loader_s=0.0001, sync=False, **COMMON)
    timeline.count_device_misses()
    assert selftelemetry.total(selftelemetry.DROPPED, "metrics", "device_event_missed") > before
    job.drain()
    assert not job.phases()  # no step had an event at each mark: none is on the GPU's clock
    assert job.goodput()["productive"] > 0  # its seconds are counted all the same


def test_no_event_is_recorded_or_queried_while_a_cuda_graph_is_captured(job: _Job) -> None:
    job.step(loader_s=0.0001, sync=True, **COMMON)
    job.device.capture_begins()
    try:
        made = job.device.made
        for _ in range(3):
            job.step(loader_s=0.0001, sync=True, **COMMON)
        assert job.device.made == made and not job.device.free or True
        job.drain()
        assert not job.phases()  # nothing recorded during the capture: no step on the GPU's clock
    finally:
        job.device.capture_ends()


def test_events_on_different_streams_make_a_step_unusable_not_wrong(job: _Job) -> None:
    before = selftelemetry.total(selftelemetry.SANITIZED, "metrics", "device_step_unusable")
    job.step(loader_s=0.0001, sync=True, **COMMON)
    job.step(loader_s=0.0001, sync=True, **COMMON)
    job.gpu.observed_ns = 0
    job.drain(everything_done=False)  # the sampled step waits for the GPU
    (waiting,) = anatomy.ledger().on_device
    # its backward's start reached after its end: not one stream's order (events recorded on two streams)
    waiting.bounds[3][1].done_ns += 10**9
    job.drain()
    assert selftelemetry.total(selftelemetry.SANITIZED, "metrics", "device_step_unusable") == before + 1


def test_the_arrival_at_a_collective_is_the_gpu_s() -> None:
    """A collective enqueued on the host while the GPU still ran the forward: the GPU reached it later."""
    hosts = [0, 2 * MS, 4 * MS, 5 * MS]
    events = [_Fixed(t) for t in (0, 8 * MS, 14 * MS, 15 * MS)]
    found = device_clock.figures(list(zip(hosts, events, strict=True)),
                                 [("forward", 0, 2 * MS), ("backward", 2 * MS, 4 * MS), ("optimizer", 4 * MS, 5 * MS)],
                                 anatomy.PHASES)  # fmt: skip
    assert found is not None
    assert found.phases["forward"] == pytest.approx(0.008) and found.phases["backward"] == pytest.approx(0.006)
    # enqueued at 3 ms (host), in the backward: no earlier than the backward's start on the GPU (8 ms)
    assert found.arrival(3 * MS) == pytest.approx(0.008)
    # with NCCL's own GPU time of the collective: the backward's end less it
    assert found.arrival(3 * MS, 0.002) == pytest.approx(0.012)
    found.carve(3 * MS, 0.002)
    assert found.phases["collective_wait"] == pytest.approx(0.002)
    assert found.phases["backward"] == pytest.approx(0.004)


class _Fixed:
    def __init__(self, done_ns: int) -> None:
        self.done_ns = done_ns

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _Fixed) -> float:
        return (end.done_ns - self.done_ns) / 1e6
