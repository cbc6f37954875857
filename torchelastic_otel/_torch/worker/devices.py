"""The GPUs a rank uses, as NVML sees them: utilization, memory, power, energy and temperature, per device.

Observable instruments on the worker's meter, named by OpenTelemetry's hardware semantic conventions
(``_names``' hardware block), read only when metrics are collected (the SDK's reader thread, a scrape, a flush),
never on the training path:

- ``hw.gpu.utilization`` (``1``, a gauge; ``hw.gpu.task="general"``): the share of the last sample period in which
  a kernel ran on the device (NVML's utilization rate, a percentage, over 100);
- ``hw.gpu.memory.usage`` / ``hw.gpu.memory.limit`` (``By``, UpDownCounters): the device's memory that is not free,
  and its size (NVML's first memory figures: every process's memory on the device, not only this rank's allocator,
  which ``torchelastic.worker.cuda.memory.*`` report, and the driver's own reservation, which ``nvidia-smi`` leaves
  out of its "used"), so that the limit less the usage is what the job can still allocate;
- ``hw.power`` (``W``, a gauge) and ``hw.energy`` (``J``, a counter: the energy since the driver was loaded, which
  the conventions recommend over power), with ``hw.type="gpu"``;
- ``hw.temperature`` (``Cel``, a gauge): the GPU die's sensor, a component of its own in the conventions (its
  ``hw.parent`` is the GPU's ``hw.id``, ``hw.sensor_location="gpu_die"``).

A GPU's ``hw.id`` is its UUID (unique on the host, stable across processes: ranks sharing a device report the same
id), ``hw.name`` its NVML index (``gpu3``, as ``nvidia-smi`` numbers it); the ``hw.gpu.*`` points also carry
``hw.vendor``, ``hw.model``, ``hw.driver_version`` and, where NVML has them, ``hw.serial_number`` and
``hw.firmware_version`` (the VBIOS).

Which devices: only once the job itself has imported ``torch.cuda`` and initialised CUDA (the bridge never imports
torch nor initialises CUDA), the devices whose caching allocator has reserved memory at some point of the process,
as ``memory`` finds them. A CUDA index is the process's own (``CUDA_VISIBLE_DEVICES`` renumbers the devices, and
CUDA's default order is not NVML's): it is mapped to NVML's device by the PCI address torch reports for it
(``get_device_properties``: ``pci_domain_id``, ``pci_bus_id``, ``pci_device_id``, NVML's ``domain:bus:device.0``),
or by its UUID where torch has no PCI fields.

NVML (the ``pynvml`` module of the ``nvidia-ml-py`` package, the ``nvml`` extra) is imported and initialised once,
lazily, by the first periodic collection (the SDK's reader thread, a Prometheus scrape): initialising NVML opens the
driver, which neither the job's main thread nor a flush waits for -- a flush is most often a process on its way out
(an exit, a SIGTERM, a failure), whose end would wait for the driver to open for one last reading. A process that
ends before its first periodic collection reports no GPU reading. What NVML cannot give is reported as nothing
and counted (``torchelastic_otel.dropped``, signal ``metrics``), never raised:

- ``nvml_missing`` (``pynvml`` not installed) and ``nvml_library_missing`` (no ``libnvidia-ml``): counted once,
  never tried again;
- ``nvml_init_failed``: counted once, tried again after a back-off that doubles up to ``INIT_RETRY_MAX_SECONDS``;
- ``nvml_device_unmapped``: a CUDA device no NVML device matches, counted once and left out;
- ``nvml_unsupported``: a quantity the device does not report (NVML's "not supported", a function the driver
  lacks, no permission), counted once per device and quantity, and not asked again;
- ``nvml_read_failed``: any other failed read (a GPU lost, a timeout), counted each time: that point is lost.

The instruments are created on the current pipeline's meter provider once it is ready and again after every rebuild (a
forked child's own pipeline, a ``setup()``): ``_export.meters.Observed``, as ``memory`` does. A forked child starts
without NVML: CUDA is not usable there (``torch.cuda.is_initialized()`` is false in a child forked after CUDA was
initialised).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry.metrics import Observation

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import bounded
from torchelastic_otel._export.meters import Observed
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import memory

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

__all__ = ["install", "installed", "INIT_RETRY_SECONDS", "INIT_RETRY_MAX_SECONDS"]

#: Seconds before a failed ``nvmlInit`` is tried again (doubling each time, up to the maximum).
INIT_RETRY_SECONDS = 30.0
INIT_RETRY_MAX_SECONDS = 1800.0
VENDOR = "NVIDIA"
GPU = "gpu"  # hw.type
GENERAL = "general"  # hw.gpu.task
GPU_DIE = "gpu_die"  # hw.sensor_location
SIGNAL = "metrics"
# NVML's return codes (nvml.h) that say a quantity will never be read on a device: not supported, no permission,
# a function this driver lacks.
_NOT_SUPPORTED, _NO_PERMISSION, _LIBRARY_NOT_FOUND, _FUNCTION_NOT_FOUND = 3, 4, 12, 13


def _utilization(nvml: Any, handle: object) -> float:
    return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0


def _memory_used(nvml: Any, handle: object) -> int:
    return int(nvml.nvmlDeviceGetMemoryInfo(handle).used)


def _memory_total(nvml: Any, handle: object) -> int:
    return int(nvml.nvmlDeviceGetMemoryInfo(handle).total)


def _power(nvml: Any, handle: object) -> float:
    return float(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0  # mW


def _energy(nvml: Any, handle: object) -> float:
    return float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1000.0  # mJ


def _temperature(nvml: Any, handle: object) -> float:
    return float(nvml.nvmlDeviceGetTemperature(handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)))


@dataclass(frozen=True)
class _Quantity:
    name: str  # the instrument
    kind: str  # gauge | updowncounter | counter
    unit: str
    read: Callable[[object, object], float | int]
    attributes: str  # which of a _Gpu's attribute sets: utilization | gpu | component | sensor
    description: str


_QUANTITIES = (
    _Quantity(names.HW_GPU_UTILIZATION, "gauge", "1", _utilization, "utilization",
              "Fraction of time spent in a specific task (NVML: a kernel running on the GPU)"),
    _Quantity(names.HW_GPU_MEMORY_USAGE, "updowncounter", "By", _memory_used, "gpu",
              "GPU memory used (NVML: not free, by every process on the device and the driver)"),
    _Quantity(names.HW_GPU_MEMORY_LIMIT, "updowncounter", "By", _memory_total, "gpu", "Size of the GPU memory"),
    _Quantity(names.HW_POWER, "gauge", "W", _power, "component", "Instantaneous power consumed by the component"),
    _Quantity(names.HW_ENERGY, "counter", "J", _energy, "component",
              "Energy consumed by the component (NVML: since the driver was loaded)"),
    _Quantity(names.HW_TEMPERATURE, "gauge", "Cel", _temperature, "sensor",
              "Temperature in degrees Celsius (NVML: the GPU die)"),
)  # fmt: skip


@dataclass
class _Gpu:
    """One NVML device as the process uses it: its handle, its attribute sets, what it does not report."""

    handle: object
    hw_id: str
    attributes: dict[str, dict[str, str]]
    unsupported: set[str] = field(default_factory=set)


class _Nvml:
    """NVML in this process: the module once initialised, the back-off of a failed init, the devices mapped."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.module: object = None
        self.given_up = False
        self.retry_at = 0.0
        self.backoff = INIT_RETRY_SECONDS
        self.driver_version: str | None = None
        self.gpus: dict[int, _Gpu | None] = {}  # CUDA index -> its NVML device, None: unmapped
        self.counted: set[tuple[str, ...]] = set()


class _State:
    """The CUDA devices seen in use, and NVML."""

    def __init__(self) -> None:
        self.devices: set[int] = set()
        self.nvml = _Nvml()


_state = _State()


def _after_fork_in_child() -> None:
    _state.nvml = _Nvml()  # the parent's handles and init are the parent's
    _state.devices = set()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def installed() -> bool:
    return _observed.active


def _count_once(nvml: _Nvml, reason: str, *key: str) -> None:
    if (reason, *key) not in nvml.counted:
        nvml.counted.add((reason, *key))
        selftelemetry.count(selftelemetry.DROPPED, SIGNAL, reason)


def _code(error: BaseException) -> int | None:
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _module(nvml: _Nvml) -> object:
    """``pynvml``, initialised; ``None`` while it is not (counted; tried again only after the back-off)."""
    if nvml.module is not None:
        return nvml.module
    if nvml.given_up or time.monotonic() < nvml.retry_at:
        return None
    if threading.current_thread() is threading.main_thread() or bounded.flushing():
        return None  # the job's thread, or a flush (a process on its way out): neither waits for the driver to open
    if not nvml.lock.acquire(blocking=False):
        return None  # another collection is initialising it: never wait on it
    try:
        if nvml.module is not None:
            return nvml.module
        try:
            import pynvml
        except Exception:  # ImportError, or a broken install
            nvml.given_up = True
            _count_once(nvml, "nvml_missing")
            return None
        try:
            pynvml.nvmlInit()
        except Exception as error:
            if _code(error) == getattr(pynvml, "NVML_ERROR_LIBRARY_NOT_FOUND", _LIBRARY_NOT_FOUND):
                nvml.given_up = True
                _count_once(nvml, "nvml_library_missing")
            else:
                nvml.retry_at = time.monotonic() + nvml.backoff
                nvml.backoff = min(nvml.backoff * 2, INIT_RETRY_MAX_SECONDS)
                _count_once(nvml, "nvml_init_failed")
            return None
        try:
            nvml.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
        except Exception:
            nvml.driver_version = None  # recommended, not required: the points go without it
        nvml.module = pynvml
        return pynvml
    finally:
        nvml.lock.release()


def _devices(cuda: object) -> list[int]:
    """The devices in use (``memory``'s rule: ``memory.devices_in_use``)."""
    return memory.devices_in_use(cuda, _state.devices)


def _handle(pynvml: Any, cuda: Any, device: int) -> object:
    """The NVML handle of the process's CUDA device ``device``: by its PCI bus id, else by its UUID."""
    properties = cuda.get_device_properties(device)
    bus = getattr(properties, "pci_bus_id", None)
    if isinstance(bus, int):
        domain = getattr(properties, "pci_domain_id", 0) or 0
        slot = getattr(properties, "pci_device_id", 0) or 0
        return pynvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08x}:{bus:02x}:{slot:02x}.0")
    uuid = str(getattr(properties, "uuid", "") or "")
    if not uuid:
        raise LookupError(f"CUDA device {device} has neither a PCI bus id nor a UUID")
    return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")


def _optional(read: Callable[[], object]) -> str | None:
    """A recommended attribute: its text, ``None`` where NVML has none (the points go without it)."""
    try:
        raw = read()
    except Exception:
        return None
    value = _text(raw).strip() if raw is not None else ""
    return value or None


def _map(nvml: _Nvml, pynvml: Any, cuda: object, device: int) -> _Gpu | None:
    """The NVML device of CUDA device ``device`` and its attributes, looked up once (``None``: unmapped, counted)."""
    if device in nvml.gpus:
        return nvml.gpus[device]
    gpu: _Gpu | None = None
    try:
        handle = _handle(pynvml, cuda, device)
        hw_id = _text(pynvml.nvmlDeviceGetUUID(handle))
        index = _optional(lambda: pynvml.nvmlDeviceGetIndex(handle))
        hw_name = f"gpu{index}" if index is not None else hw_id
        identity = {names.HW_ID: hw_id, names.HW_NAME: hw_name}
        described = {**identity, names.HW_VENDOR: VENDOR}
        for key, read in (
            (names.HW_MODEL, lambda: pynvml.nvmlDeviceGetName(handle)),
            (names.HW_DRIVER_VERSION, lambda: nvml.driver_version),
            (names.HW_FIRMWARE_VERSION, lambda: pynvml.nvmlDeviceGetVbiosVersion(handle)),
            (names.HW_SERIAL_NUMBER, lambda: pynvml.nvmlDeviceGetSerial(handle)),
        ):
            value = _optional(read)
            if value is not None:
                described[key] = value
        sensor = {
            names.HW_ID: f"{hw_id}/temperature",
            names.HW_NAME: f"{hw_name} temperature",
            names.HW_PARENT: hw_id,
            names.HW_SENSOR_LOCATION: GPU_DIE,
        }
        gpu = _Gpu(
            handle,
            hw_id,
            {
                "gpu": described,
                "utilization": {**described, names.HW_GPU_TASK: GENERAL},
                "component": {**identity, names.HW_TYPE: GPU},
                "sensor": sensor,
            },
        )
    except Exception:
        _count_once(nvml, "nvml_device_unmapped", str(device))
    nvml.gpus[device] = gpu
    return gpu


def _read(nvml: _Nvml, pynvml: object, gpu: _Gpu, quantity: _Quantity) -> float | int | None:
    if quantity.name in gpu.unsupported:
        return None
    try:
        return quantity.read(pynvml, gpu.handle)
    except Exception as error:
        permanent = {
            getattr(pynvml, "NVML_ERROR_NOT_SUPPORTED", _NOT_SUPPORTED),
            getattr(pynvml, "NVML_ERROR_NO_PERMISSION", _NO_PERMISSION),
            getattr(pynvml, "NVML_ERROR_FUNCTION_NOT_FOUND", _FUNCTION_NOT_FOUND),
        }
        if _code(error) in permanent:
            gpu.unsupported.add(quantity.name)
            _count_once(nvml, "nvml_unsupported", gpu.hw_id, quantity.name)
        else:
            selftelemetry.count(selftelemetry.DROPPED, SIGNAL, "nvml_read_failed")
        return None


def _readings(quantity: _Quantity) -> Callable[[], list[Observation]]:
    """The observations of ``quantity``, one per GPU in use."""

    def observe() -> list[Observation]:
        cuda = memory.cuda_in_use()
        if cuda is None:
            return []
        devices = _devices(cuda)
        if not devices:
            return []
        nvml = _state.nvml
        pynvml = _module(nvml)
        if pynvml is None:
            return []
        seen: set[str] = set()
        observations = []
        for device in devices:
            gpu = _map(nvml, pynvml, cuda, device)
            if gpu is None or gpu.hw_id in seen:  # two CUDA devices on one GPU (MIG): one series
                continue
            seen.add(gpu.hw_id)
            value = _read(nvml, pynvml, gpu, quantity)
            if value is not None:
                observations.append(Observation(value, gpu.attributes[quantity.attributes]))
        return observations

    return observe


def _create(meter: Meter) -> None:
    create = {
        "gauge": meter.create_observable_gauge,
        "counter": meter.create_observable_counter,
        "updowncounter": meter.create_observable_up_down_counter,
    }
    for quantity in _QUANTITIES:
        callback = _observed.callback(_readings(quantity), "device_metrics_error")
        create[quantity.kind](quantity.name, callbacks=[callback], unit=quantity.unit, description=quantity.description)


_observed = Observed(_create, "device_instruments_error")


def install(patches: Patches) -> None:
    """Report the devices this worker uses (see the module's docstring); ``patches.restore()`` stops it. Idempotent."""
    if _observed.active:
        return
    _state.devices, _state.nvml = set(), _Nvml()  # installed anew (after an uninstall): NVML looked for anew
    patches.on_restore(_observed.start())
