"""The GPUs a rank uses, through NVML (``_torch.worker.devices``): names, units and attributes of the
OpenTelemetry hardware conventions, the CUDA-to-NVML mapping, and what happens without NVML.

This machine has no GPU and no NVIDIA driver, so two boundaries are scripted, and only those: ``pynvml`` (a fake
module in ``sys.modules``, answering as NVML does: milliwatts, millijoules, percentages, ``NVMLError`` with NVML's
return codes) and ``torch.cuda`` (a fake module: ``is_initialized``, ``device_count``, ``memory_reserved`` and
``get_device_properties``, numbering the machine's devices as the CUDA runtime does under
``CUDA_VISIBLE_DEVICES``). The SDK, the instruments, their callbacks and the pipeline are real; so is
``nvidia-ml-py`` itself in the test that loads it on this driverless machine. A collection runs on a thread of its
own, as the SDK's reader does: the module never initialises NVML on the main thread, nor in a flush or a shutdown.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.installed import installed as patches_installed
from tests.support.otel import metric_of, points_of
from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import bounded
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import devices

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "collector-config" / "grafana" / "dashboards" / "torchelastic-training.json"
GIB = 1 << 30
ALL = (names.HW_GPU_UTILIZATION, names.HW_GPU_MEMORY_USAGE, names.HW_GPU_MEMORY_LIMIT, names.HW_POWER,
       names.HW_ENERGY, names.HW_TEMPERATURE)  # fmt: skip
# NVML's return codes (nvml.h)
NOT_SUPPORTED, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, GPU_IS_LOST = 3, 9, 12, 15


# ---- the scripted boundaries --------------------------------------------------------------------------------------


@dataclass
class Gpu:
    """One physical GPU of the fake machine, in NVML's own units."""

    index: int  # NVML's (nvidia-smi's) index
    bus: int  # PCI bus number
    uuid: str
    utilization: int = 87  # %
    used: int = 30 * GIB
    total: int = 141 * GIB
    power_mw: int = 412_500
    energy_mj: int = 1_234_567
    temperature: int = 61
    reserved: int = 0  # what this process's CUDA caching allocator holds on it


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


@dataclass
class Machine:
    """The fake ``pynvml`` and ``torch.cuda`` of one host; ``fail`` scripts errors, ``calls`` records NVML calls."""

    gpus: list[Gpu]
    initialised: bool = True
    pci_fields: bool = True
    init_errors: list[int] = field(default_factory=list)  # nvmlInit raises these codes, one a call
    fail: dict[str, int] = field(default_factory=dict)  # NVML function -> the code it raises
    calls: list[tuple[str, str]] = field(default_factory=list)  # (function, thread name)

    def _call(self, function: str) -> None:
        self.calls.append((function, threading.current_thread().name))
        if function in self.fail:
            raise NVMLError(self.fail[function])

    def called(self, function: str) -> int:
        return sum(1 for f, _ in self.calls if f == function)

    def pynvml(self) -> types.ModuleType:
        module = types.ModuleType("pynvml")
        by_bus = {f"{0:08x}:{g.bus:02x}:{0:02x}.0": g for g in self.gpus}
        by_uuid = {g.uuid: g for g in self.gpus}

        def init() -> None:
            self._call("nvmlInit")
            if self.init_errors:
                raise NVMLError(self.init_errors.pop(0))

        def handle_by_bus(bus_id: str) -> Gpu:
            self._call("nvmlDeviceGetHandleByPciBusId")
            if bus_id not in by_bus:
                raise NVMLError(6)  # NVML_ERROR_NOT_FOUND
            return by_bus[bus_id]

        def handle_by_uuid(uuid: str) -> Gpu:
            self._call("nvmlDeviceGetHandleByUUID")
            if uuid not in by_uuid:
                raise NVMLError(6)
            return by_uuid[uuid]

        def reader(function: str, read: Callable[[Gpu], Any]) -> Callable[..., Any]:
            def call(gpu: Gpu, *args: Any) -> Any:
                self._call(function)
                return read(gpu)

            return call

        module.NVMLError = NVMLError  # type: ignore[attr-defined]
        module.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
        module.nvmlInit = init  # type: ignore[attr-defined]
        module.nvmlSystemGetDriverVersion = lambda: b"570.86.15"  # type: ignore[attr-defined]  # old releases: bytes
        module.nvmlDeviceGetHandleByPciBusId = handle_by_bus  # type: ignore[attr-defined]
        module.nvmlDeviceGetHandleByUUID = handle_by_uuid  # type: ignore[attr-defined]
        functions = {
            "nvmlDeviceGetUUID": lambda g: g.uuid,
            "nvmlDeviceGetIndex": lambda g: g.index,
            "nvmlDeviceGetName": lambda g: "NVIDIA H200",
            "nvmlDeviceGetVbiosVersion": lambda g: "96.00.99.00.01",
            "nvmlDeviceGetSerial": lambda g: f"165432{g.index:07d}",
            "nvmlDeviceGetUtilizationRates": lambda g: types.SimpleNamespace(gpu=g.utilization, memory=12),
            "nvmlDeviceGetMemoryInfo": lambda g: types.SimpleNamespace(total=g.total, used=g.used,
                                                                       free=g.total - g.used),
            "nvmlDeviceGetPowerUsage": lambda g: g.power_mw,
            "nvmlDeviceGetTotalEnergyConsumption": lambda g: g.energy_mj,
            "nvmlDeviceGetTemperature": lambda g: g.temperature,
        }  # fmt: skip
        for function, read in functions.items():
            setattr(module, function, reader(function, read))
        return module

    def cuda(self, visible: str | None) -> types.ModuleType:
        """The CUDA runtime's view: ``CUDA_VISIBLE_DEVICES`` (NVML indices) picks and orders the devices."""
        order = list(self.gpus) if visible is None else [self.gpus[int(i)] for i in visible.split(",")]
        module = types.ModuleType("torch.cuda")

        def properties(device: int) -> Any:
            gpu = order[device]
            fields: dict[str, Any] = {"name": "NVIDIA H200", "uuid": gpu.uuid.removeprefix("GPU-")}
            if self.pci_fields:
                fields.update(pci_bus_id=gpu.bus, pci_device_id=0, pci_domain_id=0)
            return types.SimpleNamespace(**fields)

        module.is_initialized = lambda: self.initialised  # type: ignore[attr-defined]
        module.device_count = lambda: len(order)  # type: ignore[attr-defined]
        module.memory_reserved = lambda device: order[device].reserved  # type: ignore[attr-defined]
        module.get_device_properties = properties  # type: ignore[attr-defined]
        return module


def _machine(count: int = 2) -> Machine:
    return Machine([Gpu(i, 0x19 + 0x10 * i, f"GPU-{i:08x}-1111-2222-3333-444455556666") for i in range(count)])


@pytest.fixture
def installed(otel: Any) -> Iterator[Any]:
    with patches_installed(devices.install):
        yield otel


def _plug(monkeypatch: pytest.MonkeyPatch, machine: Machine, visible: str | None = None) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setitem(sys.modules, "pynvml", machine.pynvml())
    monkeypatch.setitem(sys.modules, "torch.cuda", machine.cuda(os.environ.get("CUDA_VISIBLE_DEVICES")))


def collect(otel: Any) -> Any:
    """One collection on a thread of its own, as the SDK's reader thread does."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(otel.reader.get_metrics_data()), name="reader")
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and len(out) == 1
    return out[0]


def _values(data: Any, name: str) -> dict[str, float]:
    return {attrs[names.HW_ID]: point.value for attrs, point in points_of(data, name)}


def _dropped(reason: str) -> int:
    return selftelemetry.snapshot(selftelemetry.DROPPED).get((selftelemetry.DROPPED, "metrics", reason), 0)


# ---- what is reported -------------------------------------------------------------------------------------------


def test_the_gpu_in_use_reports_the_conventions_names_units_and_attributes(
    installed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = _machine()
    machine.gpus[0].reserved = 2 * GIB  # the process uses cuda:0 only
    _plug(monkeypatch, machine)
    data = collect(installed)
    gpu = machine.gpus[0].uuid
    kinds = {}
    for name in ALL:
        metric = metric_of(data, name)
        assert metric is not None, name
        kinds[name] = (metric.unit, type(metric.data).__name__, getattr(metric.data, "is_monotonic", None))
        assert list(_values(data, name)) == [gpu if name != names.HW_TEMPERATURE else f"{gpu}/temperature"], name
    assert kinds == {
        names.HW_GPU_UTILIZATION: ("1", "Gauge", None),
        names.HW_GPU_MEMORY_USAGE: ("By", "Sum", False),  # UpDownCounters, as the conventions define them
        names.HW_GPU_MEMORY_LIMIT: ("By", "Sum", False),
        names.HW_POWER: ("W", "Gauge", None),
        names.HW_ENERGY: ("J", "Sum", True),
        names.HW_TEMPERATURE: ("Cel", "Gauge", None),
    }
    ((utilization_attrs, utilization),) = points_of(data, names.HW_GPU_UTILIZATION)
    described = {"hw.id": gpu, "hw.name": "gpu0", "hw.vendor": "NVIDIA", "hw.model": "NVIDIA H200",
                 "hw.driver_version": "570.86.15", "hw.firmware_version": "96.00.99.00.01",
                 "hw.serial_number": "1654320000000"}  # fmt: skip
    assert utilization_attrs == {**described, "hw.gpu.task": "general"}
    assert utilization.value == pytest.approx(0.87)  # NVML's 87 %, as a fraction
    ((memory_attrs, used),) = points_of(data, names.HW_GPU_MEMORY_USAGE)
    assert memory_attrs == described and used.value == 30 * GIB
    assert points_of(data, names.HW_GPU_MEMORY_LIMIT)[0][1].value == 141 * GIB
    ((power_attrs, power),) = points_of(data, names.HW_POWER)
    assert power_attrs == {"hw.id": gpu, "hw.name": "gpu0", "hw.type": "gpu"}
    assert power.value == pytest.approx(412.5)  # 412,500 mW
    ((energy_attrs, energy),) = points_of(data, names.HW_ENERGY)
    assert energy_attrs == power_attrs and energy.value == pytest.approx(1234.567)  # mJ
    ((sensor_attrs, temperature),) = points_of(data, names.HW_TEMPERATURE)
    assert sensor_attrs == {"hw.id": f"{gpu}/temperature", "hw.name": "gpu0 temperature", "hw.parent": gpu,
                            "hw.sensor_location": "gpu_die"}  # fmt: skip
    assert temperature.value == 61.0
    machine.gpus[0].power_mw, machine.gpus[0].utilization = 98_000, 3
    data = collect(installed)  # each collection reads anew
    assert _values(data, names.HW_POWER) == {gpu: pytest.approx(98.0)}
    assert _values(data, names.HW_GPU_UTILIZATION) == {gpu: pytest.approx(0.03)}
    assert machine.called("nvmlInit") == 1


def test_the_names_are_the_semantic_conventions_own() -> None:
    """Cross-checked with OpenTelemetry's generated constants, where the installed release has them."""
    metrics = pytest.importorskip("opentelemetry.semconv._incubating.metrics.hw_metrics")
    attributes = pytest.importorskip("opentelemetry.semconv._incubating.attributes.hw_attributes")
    for constant in ("HW_GPU_UTILIZATION", "HW_GPU_MEMORY_USAGE", "HW_GPU_MEMORY_LIMIT", "HW_POWER", "HW_ENERGY",
                     "HW_TEMPERATURE"):  # fmt: skip
        assert getattr(names, constant) == getattr(metrics, constant), constant
    for constant in ("HW_ID", "HW_NAME", "HW_PARENT", "HW_TYPE", "HW_VENDOR", "HW_MODEL", "HW_DRIVER_VERSION",
                     "HW_FIRMWARE_VERSION", "HW_SERIAL_NUMBER", "HW_GPU_TASK", "HW_SENSOR_LOCATION"):  # fmt: skip
        assert getattr(names, constant) == getattr(attributes, constant), constant
    assert attributes.HwTypeValues.GPU.value == devices.GPU
    assert attributes.HwGpuTaskValues.GENERAL.value == devices.GENERAL


def test_cuda_indices_are_mapped_to_nvml_devices_by_pci_bus_id(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``CUDA_VISIBLE_DEVICES=2,0`` the process's cuda:0 is NVML's device 2 and cuda:1 its device 0."""
    machine = _machine(4)
    for gpu, used in zip(machine.gpus, (10, 11, 12, 13), strict=True):
        gpu.used = used * GIB
    machine.gpus[2].reserved = machine.gpus[0].reserved = GIB
    _plug(monkeypatch, machine, visible="2,0")
    data = collect(installed)
    by_name = {attrs["hw.name"]: (attrs["hw.id"], point.value) for attrs, point in
               points_of(data, names.HW_GPU_MEMORY_USAGE)}  # fmt: skip
    assert by_name == {"gpu2": (machine.gpus[2].uuid, 12 * GIB), "gpu0": (machine.gpus[0].uuid, 10 * GIB)}
    assert machine.called("nvmlDeviceGetHandleByPciBusId") == 2  # mapped once each, not at every collection
    collect(installed)
    assert machine.called("nvmlDeviceGetHandleByPciBusId") == 2


def test_without_pci_fields_the_uuid_maps_the_device(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    machine = _machine(4)
    machine.pci_fields = False
    machine.gpus[3].reserved = GIB
    _plug(monkeypatch, machine, visible="3")
    data = collect(installed)
    assert list(_values(data, names.HW_GPU_MEMORY_LIMIT)) == [machine.gpus[3].uuid]
    assert machine.called("nvmlDeviceGetHandleByUUID") == 1


def test_only_devices_the_process_used_and_only_once_cuda_is_initialised(
    installed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = _machine()
    machine.initialised = False
    machine.gpus[0].reserved = GIB
    _plug(monkeypatch, machine)
    data = collect(installed)
    assert all(points_of(data, name) == [] for name in ALL)
    assert machine.calls == []  # not initialised: NVML not even loaded
    machine.initialised = True
    machine.gpus[0].reserved = 0
    assert all(points_of(collect(installed), name) == [] for name in ALL)
    assert machine.calls == []  # initialised, but no device used yet: still nothing loaded
    machine.gpus[1].reserved = GIB  # the process touches cuda:1 only
    assert list(_values(collect(installed), names.HW_POWER)) == [machine.gpus[1].uuid]
    monkeypatch.delitem(sys.modules, "torch.cuda")
    assert all(points_of(collect(installed), name) == [] for name in ALL)  # the job never imported torch.cuda


def test_the_main_thread_never_initialises_nvml(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A collection on the job's thread (a flush at ``destroy_process_group``) reports what an initialised NVML reads,
    and never opens the driver itself."""
    machine = _machine()
    machine.gpus[0].reserved = GIB
    _plug(monkeypatch, machine)
    assert threading.current_thread() is threading.main_thread()
    assert installed.metric_points(names.HW_POWER) == [] and machine.calls == []
    collect(installed)
    assert [thread for function, thread in machine.calls if function == "nvmlInit"] == ["reader"]
    assert len(installed.metric_points(names.HW_POWER)) == 1  # once initialised, the main thread reads too


def test_a_flush_never_initialises_nvml(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A collection in a bounded flush (an exit, a SIGTERM's final words) off the main thread reads nothing rather
    than wait for the driver to open: a process on its way out is not held up for one last reading."""
    machine = _machine()
    machine.gpus[0].reserved = GIB
    _plug(monkeypatch, machine)
    out: list[Any] = []
    assert bounded.run_bounded(lambda: out.append(installed.reader.get_metrics_data()) or True, 30_000) is True
    assert len(out) == 1 and points_of(out[0], names.HW_POWER) == [] and machine.calls == []
    assert not bounded.flushing()  # the flush is over: its mark is gone with it
    collect(installed)  # the next periodic collection opens it
    assert [thread for function, thread in machine.calls if function == "nvmlInit"] == ["reader"]


def test_a_shutdown_s_last_collection_never_initialises_nvml(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's periodic reader collects a last time on its own thread when its provider shuts down; while the
    bridge shuts its pipeline down, that collection does not open the driver either."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, PeriodicExportingMetricReader

    class Exporter(MetricExporter):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.threads: list[str] = []

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
            self.threads.append(threading.current_thread().name)
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            pass

    def shut_down(inside: bool) -> tuple[list[tuple[str, str]], list[str]]:
        """A provider with the GPU instruments and a periodic reader that never ticks, shut down; NVML's calls and the
        exports' threads."""
        machine = _machine()
        machine.gpus[0].reserved = GIB
        _plug(monkeypatch, machine)
        exporter = Exporter()
        provider = MeterProvider(metric_readers=[PeriodicExportingMetricReader(exporter, 3_600_000)])
        devices._create(provider.get_meter("test"))  # the instruments the bridge makes on its pipeline's provider
        provider.get_meter("test").create_counter("c").add(1)  # something to export in any case
        if inside:
            with bounded.shutting_down():
                provider.shutdown()
        else:
            provider.shutdown()
        return machine.calls, exporter.threads

    calls, threads = shut_down(inside=True)
    assert threads and threading.current_thread().name not in threads  # the last collection: the reader's thread
    assert calls == []
    assert not bounded.flushing()
    calls, threads = shut_down(inside=False)  # the same, not inside the bridge's shutdown: it would open the driver
    assert [function for function, _ in calls].count("nvmlInit") == 1


# ---- without NVML ---------------------------------------------------------------------------------------------------


def test_without_nvidia_ml_py_nothing_is_reported_and_it_is_counted_once(
    installed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = _machine()
    machine.gpus[0].reserved = GIB
    _plug(monkeypatch, machine)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    before = _dropped("nvml_missing")
    for _ in range(3):
        assert all(points_of(collect(installed), name) == [] for name in ALL)
    assert _dropped("nvml_missing") == before + 1


def test_the_real_nvidia_ml_py_on_a_machine_without_the_driver(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ``pynvml``: ``nvmlInit`` finds no ``libnvidia-ml``; nothing reported, counted once, never retried."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        if error.value != LIBRARY_NOT_FOUND:
            pytest.skip(f"NVML here fails otherwise: {error}")
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML")
    machine = _machine()
    machine.gpus[0].reserved = GIB
    _plug(monkeypatch, machine)
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    init = pynvml.nvmlInit
    calls: list[int] = []

    def counted_init() -> None:
        calls.append(1)
        init()

    monkeypatch.setattr(pynvml, "nvmlInit", counted_init)
    before = _dropped("nvml_library_missing")
    for _ in range(3):
        assert all(points_of(collect(installed), name) == [] for name in ALL)
    assert _dropped("nvml_library_missing") == before + 1 and calls == [1]


def test_a_failed_init_is_counted_once_and_retried_after_a_back_off(
    installed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = _machine()
    machine.gpus[0].reserved = GIB
    machine.init_errors = [DRIVER_NOT_LOADED, DRIVER_NOT_LOADED]
    _plug(monkeypatch, machine)
    before = _dropped("nvml_init_failed")
    for _ in range(3):
        assert points_of(collect(installed), names.HW_POWER) == []
    assert machine.called("nvmlInit") == 1  # not at every collection: backing off
    assert _dropped("nvml_init_failed") == before + 1


def test_after_the_back_off_init_is_tried_again(otel: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "INIT_RETRY_SECONDS", 0.05)
    patches = Patches()
    devices.install(patches)
    try:
        machine = _machine()
        machine.gpus[0].reserved = GIB
        machine.init_errors = [DRIVER_NOT_LOADED, DRIVER_NOT_LOADED]  # then it works
        _plug(monkeypatch, machine)
        before = _dropped("nvml_init_failed")
        deadline = time.monotonic() + 20
        found: list[Any] = []
        while not found and time.monotonic() < deadline:
            found = points_of(collect(otel), names.HW_POWER)
        assert len(found) == 1, machine.calls
        assert machine.called("nvmlInit") == 3  # failed, failed after 0.05 s, worked after 0.1 s more
        assert _dropped("nvml_init_failed") == before + 1  # one reason, counted once
    finally:
        patches.restore()


def test_a_read_that_raises_is_counted_and_leaves_no_point(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    machine = _machine()
    machine.gpus[0].reserved = GIB
    machine.fail = {"nvmlDeviceGetPowerUsage": GPU_IS_LOST, "nvmlDeviceGetTemperature": NOT_SUPPORTED}
    _plug(monkeypatch, machine)
    failed, unsupported = _dropped("nvml_read_failed"), _dropped("nvml_unsupported")
    for _ in range(2):
        data = collect(installed)
        assert points_of(data, names.HW_POWER) == [] and points_of(data, names.HW_TEMPERATURE) == []
        assert len(points_of(data, names.HW_GPU_UTILIZATION)) == 1 and len(points_of(data, names.HW_ENERGY)) == 1
    assert _dropped("nvml_read_failed") == failed + 2  # a lost point each time
    assert _dropped("nvml_unsupported") == unsupported + 1  # the device has no such sensor: counted once...
    assert machine.called("nvmlDeviceGetTemperature") == 1  # ...and not asked again
    del machine.fail["nvmlDeviceGetPowerUsage"]
    assert len(points_of(collect(installed), names.HW_POWER)) == 1  # the GPU is back: so is its power


def test_a_device_nvml_does_not_know_is_left_out_and_counted_once(
    installed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = _machine()
    machine.gpus[0].reserved = machine.gpus[1].reserved = GIB
    _plug(monkeypatch, machine)
    machine.fail = {"nvmlDeviceGetHandleByPciBusId": 6}  # NVML_ERROR_NOT_FOUND
    before = _dropped("nvml_device_unmapped")
    for _ in range(2):
        assert points_of(collect(installed), names.HW_POWER) == []
    assert _dropped("nvml_device_unmapped") == before + 2  # once per device, not per collection


def test_uninstalling_stops_it(otel: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    patches = Patches()
    devices.install(patches)
    devices.install(patches)
    assert devices.installed()
    machine = _machine()
    machine.gpus[0].reserved = GIB
    _plug(monkeypatch, machine)
    assert len(points_of(collect(otel), names.HW_POWER)) == 1  # installed twice: one instrument
    patches.restore()
    assert not devices.installed()
    assert points_of(collect(otel), names.HW_POWER) == []


# ---- installed by the worker; named in the docs and the training dashboard ----------------------------------------


def test_the_worker_installs_it_with_the_steps_even_without_goodput(otel: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchelastic_otel import _settings
    from torchelastic_otel._torch.worker import training

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")  # set: install leaves it as it is
    monkeypatch.setenv(_settings.GOODPUT.name, "0")
    patches = Patches()
    training.install(patches)
    try:
        assert devices.installed()
    finally:
        patches.restore()
    assert not devices.installed()
    monkeypatch.setenv(_settings.STEPS.name, "0")
    patches = Patches()
    training.install(patches)
    assert not devices.installed() and len(patches) == 0


#: (instrument, unit, Prometheus kind: an UpDownCounter is a gauge there), as the first test collects them.
PROMETHEUS_KINDS = (
    (names.HW_GPU_UTILIZATION, "1", "gauge"), (names.HW_GPU_MEMORY_USAGE, "By", "gauge"),
    (names.HW_GPU_MEMORY_LIMIT, "By", "gauge"), (names.HW_POWER, "W", "gauge"), (names.HW_ENERGY, "J", "counter"),
    (names.HW_TEMPERATURE, "Cel", "gauge"),
)  # fmt: skip


@pytest.fixture(scope="module")
def bench() -> types.ModuleType:
    """bench/cardinality.py, whose ``prometheus_name`` spells names as the exporters do."""
    spec = importlib.util.spec_from_file_location("bench_cardinality", ROOT / "bench" / "cardinality.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_prometheus_exporter_spells_them_as_the_dashboard_does(otel: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real Prometheus exporter (a scrape on a thread of its own, as its HTTP server does) names the series as
    the training dashboard queries them."""
    prometheus = pytest.importorskip("opentelemetry.exporter.prometheus")
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest

    import torchelastic_otel
    from tests.support.otel import KEEP_ALIVE

    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[prometheus.PrometheusMetricReader(registry=registry)])
    KEEP_ALIVE.append(provider)
    torchelastic_otel.setup(meter_provider=provider, tracer_provider=otel.tracer_provider,
                            logger_provider=otel.logger_provider)  # fmt: skip
    patches = Patches()
    devices.install(patches)
    try:
        machine = _machine()
        machine.gpus[0].reserved = GIB
        _plug(monkeypatch, machine)
        out: list[bytes] = []
        thread = threading.Thread(target=lambda: out.append(generate_latest(registry)), name="scrape")
        thread.start()
        thread.join(30)
    finally:
        patches.restore()
    samples = {line.split("{")[0] for line in out[0].decode().splitlines() if line.startswith("hw_")}
    assert samples == {"hw_gpu_utilization", "hw_gpu_memory_usage_bytes", "hw_gpu_memory_limit_bytes",
                       "hw_power_watts", "hw_energy_joules_total", "hw_temperature_celsius"}  # fmt: skip
    assert 'hw_power_watts{hw_id="GPU-00000000-1111-2222-3333-444455556666",hw_name="gpu0",hw_type="gpu"' in (
        out[0].decode()
    )
    board = DASHBOARD.read_text()
    assert all(name in board for name in samples)


def test_the_docs_and_the_training_dashboard_spell_the_prometheus_names(bench: types.ModuleType) -> None:
    """The Prometheus names (bench/cardinality.py's rules, the exporters') are in docs/goodput.md and the training
    dashboard's devices row; each of its GPU panels shows ranks beside the step time panel of the same row."""
    expected = {
        names.HW_GPU_UTILIZATION: "hw_gpu_utilization",  # unit 1: the Collector's exporter adds _ratio to a gauge
        names.HW_GPU_MEMORY_USAGE: "hw_gpu_memory_usage_bytes",
        names.HW_GPU_MEMORY_LIMIT: "hw_gpu_memory_limit_bytes",
        names.HW_POWER: "hw_power_watts",
        names.HW_ENERGY: "hw_energy_joules_total",
        names.HW_TEMPERATURE: "hw_temperature_celsius",
    }
    assert {name: bench.prometheus_name(name, unit, kind) for name, unit, kind in PROMETHEUS_KINDS} == expected
    goodput = (ROOT / "docs" / "goodput.md").read_text()
    board = json.loads(DASHBOARD.read_text())
    exprs: dict[str, list[str]] = {}
    row: str | None = None
    for panel in board["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
        elif row is not None and row.startswith("Devices"):
            exprs[panel["title"]] = [t["expr"] for t in panel.get("targets", [])]
    text = "\n".join(e for found in exprs.values() for e in found)
    for otel_name, prometheus in expected.items():
        assert f"`{otel_name}`" in goodput and prometheus in goodput, otel_name
        assert prometheus in text, prometheus
    assert "hw_gpu_utilization(_ratio)?" in text  # either exporter's spelling
    assert any("torchelastic_worker_step_duration_seconds_sum" in e for e in text.splitlines())
    assert all("torchelastic_rank" in e for found in exprs.values() for e in found), exprs
