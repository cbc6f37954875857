"""A torchrun worker's training telemetry, set up by ``worker.install()``: steps, stragglers, stalls, missing ranks.

- ``steps``: torch's global optimizer step post hook marks each step, once the script imports torch's optimizers
  (``imports.when_imported``: installing imports no torch; the watchdog's look registers it too, if it is not);
- ``collectives``: torch's Flight Recorder stays on (``TORCH_FR_BUFFER_SIZE`` defaults to
  ``FLIGHT_RECORDER_ENTRIES`` here, torch's own default for gloo; a value you set wins, ``0`` turns it off; its cost
  a collective is in ``bench/bench_steps.py``), the bridge reads it from its own thread;
- ``stalls``: the watchdog, every second on the drainer's thread (``_export.drainer.add_periodic``);
- the ``torchelastic.worker.terminated`` and ``torchelastic.worker.exception`` records of a stopped rank carry the
  same summary of its collectives as a stalled record (``torchelastic.collectives.<group>.*``): ``worker``'s
  metadata function is wrapped (in ``patches``, undone by ``uninstall()``).

- ``anatomy``: the phases of each step and the goodput ledger (where the rank's time goes); ``checkpoints``: saves
  and loads as spans; ``memory``: the rank's resident set and CUDA allocator gauges. ``TORCHELASTIC_OTEL_GOODPUT=0``
  turns these three off;
- ``frameworks``: Hugging Face ``Trainer`` and Lightning: their logged scalars as gauges, their train / evaluate /
  save phases as spans (``TORCHELASTIC_OTEL_FRAMEWORKS=0`` turns them off);
- the Flight Recorder's last entries are read when the default process group is destroyed and at exit, so a job
  shorter than the read interval gets its arrivals and phases too.

``TORCHELASTIC_OTEL_STEPS=0`` turns all of it off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from torchelastic_otel import _settings
from torchelastic_otel._torch.patches import Patches

__all__ = ["install", "enabled", "FLIGHT_RECORDER_ENTRIES"]

#: The Flight Recorder's size the bridge asks for when the job sets none (torch 2.13's default for gloo).
FLIGHT_RECORDER_ENTRIES = "2000"
_OPTIMIZER_MODULE = "torch.optim.optimizer"
_C10D_MODULE = "torch.distributed.distributed_c10d"
#: Seconds between two looks of the watchdog.
TICK_SECONDS = 1.0


def enabled() -> bool:
    return _settings.STEPS.get()


def install(
    patches: Patches, add_final_metadata: Callable[[Callable[[], dict[str, object]]], Any] | None = None
) -> None:
    """Set up the training telemetry of this torchrun worker (see the module's docstring)."""
    if not enabled():
        return
    if _settings.GOODPUT.get():
        from torchelastic_otel._torch.worker import checkpoints, memory

        memory.install(patches)
        checkpoints.install(patches)
    from torchelastic_otel._torch.worker import devices, frameworks

    devices.install(patches)  # the GPUs through NVML: not goodput, on whenever steps are
    frameworks.install(patches)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FLIGHT_RECORDER_ENTRIES)
    hooked = _hook_optimizers(patches)
    from torchelastic_otel._export import drainer as _drainer
    from torchelastic_otel._torch.worker import anatomy, collectives, stalls, timeline

    watchdog = stalls.Watchdog()

    def tick() -> None:
        hooked()
        anatomy.poll_device()  # once the job has initialised CUDA, its steps on the GPU's clock
        timeline.count_device_misses()
        watchdog.tick()

    patches.on_restore(_drainer.add_periodic(tick, TICK_SECONDS))
    if _settings.GOODPUT.get():
        anatomy.install(patches, collectives.awaiting_read)
    _read_at_exit(patches)
    _read_before_destroy(patches)
    if add_final_metadata is not None:
        # The terminated and exception records carry the Flight Recorder's summary (the collective a rank waits in),
        # and count what the failure threw away (``anatomy``).
        patches.on_restore(add_final_metadata(collectives.summary_attributes))
        patches.on_restore(add_final_metadata(_lost_progress))


def _lost_progress() -> dict[str, object]:
    """A final record's source (called once a failing worker's final words are written): count the lost progress
    once; its seconds go on the record too (``torchelastic.goodput.lost_seconds``)."""
    from torchelastic_otel._torch.worker import anatomy

    lost = anatomy.lost_progress()
    return {"goodput": {"lost_seconds": round(lost, 3)}} if lost else {}


def _read_before_destroy(patches: Patches) -> None:
    """Before the default process group is destroyed (a script's last call to torch.distributed, often followed by
    ``os._exit``, which skips ``atexit``): the Flight Recorder's last entries, as at exit. A job shorter than the
    recorder's read interval has none read before."""
    from torchelastic_otel._torch import imports, tracebacks

    def wrap(original: Callable[..., object]) -> Callable[..., object]:
        import functools

        @functools.wraps(original)
        def destroy_process_group(group: object = None, *args: object, **kwargs: object) -> object:
            if group is None:
                _read_and_export()
            try:
                return original(group, *args, **kwargs)
            except BaseException as exc:
                tracebacks.drop_own_frame(exc)
                raise

        destroy_process_group.__torchelastic_otel_original__ = original  # type: ignore[attr-defined]
        return destroy_process_group

    def hook(c10d: object) -> None:
        original = getattr(c10d, "destroy_process_group", None)
        if not callable(original) or hasattr(original, "__torchelastic_otel_original__"):
            return
        wrapped = wrap(original)
        patches.set(c10d, "destroy_process_group", wrapped)
        package = sys.modules.get("torch.distributed")
        if package is not None and getattr(package, "destroy_process_group", None) is original:
            patches.set(package, "destroy_process_group", wrapped)  # imported already: its name too

    imports.when_imported(_C10D_MODULE, hook)
    patches.on_restore(lambda: imports.cancel(_C10D_MODULE, hook))


#: How long the flush after the last read may hold ``destroy_process_group`` (once, at the job's end).
DESTROY_FLUSH_MILLIS = 300


def _read_and_export() -> None:
    """The recorder's last entries, and everything exported (bounded): a script that ends with ``os._exit`` after
    ``destroy_process_group`` skips every exit hook, and the batch processors hold spans and records for up to 5 s
    (its worker span, its checkpoints' spans). Where the pipeline is not READY yet (a short job's deferred build
    still under way), the entries are kept for the exit's read: the group is gone by then."""
    from torchelastic_otel import pipeline
    from torchelastic_otel._torch.worker import collectives

    current = pipeline.ready()
    if current is None:
        collectives.keep_before_destroy()
        return
    collectives.read_at_exit()
    current.flush(DESTROY_FLUSH_MILLIS)  # bounded, never raises: spans and records too (the batch's 5 s delay)


def _read_at_exit(patches: Patches) -> None:
    """At exit, before the bridge's own exit hook shuts the providers down (``atexit`` runs the later registered
    first): the Flight Recorder's last entries, so a job shorter than its read interval gets its arrivals and
    phases. Only where the pipeline is READY: an exit never builds one."""
    import atexit

    def at_exit() -> None:
        from torchelastic_otel import pipeline
        from torchelastic_otel._torch.worker import collectives

        if pipeline.ready() is not None:
            collectives.read_at_exit()

    atexit.register(at_exit)
    patches.on_restore(lambda: atexit.unregister(at_exit))


def _hook_optimizers(patches: Patches) -> Callable[[], None]:
    """Register the step hook once torch's optimizers are imported (a post-import hook, ``imports``); where the
    bridge has none, at the watchdog's first look after the import. Returns that look."""
    from torchelastic_otel._torch.worker import steps

    handles: list[Any] = []

    def hook(module: Any) -> None:
        if not handles:
            handles.append(module.register_optimizer_step_post_hook(steps.optimizer_hook))

    def look() -> None:
        module = sys.modules.get(_OPTIMIZER_MODULE)
        if not handles and module is not None:
            hook(module)

    try:
        from torchelastic_otel._torch import imports
    except ImportError:
        imports = None  # type: ignore[assignment]
    if imports is not None:
        imports.when_imported(_OPTIMIZER_MODULE, hook)
    else:
        look()

    def undo() -> None:
        if imports is not None:
            imports.cancel(_OPTIMIZER_MODULE, hook)
        while handles:
            handles.pop().remove()

    patches.on_restore(undo)
    return look
