"""Bridge torch's event destinations and rendezvous events into OpenTelemetry.

- every destination torch knows ("null", "console", and any added before install) also exports: the bridge's
  handler joins torch's destination loggers, so "console" still prints;
- the "otel" destination exists, so ``torchrun --event-log-handler otel`` works;
- rendezvous events: torch drops them while "dynamic_rendezvous" is a NullHandler and otherwise walks
  ``inspect.stack()``, which reads every frame's source lines; either way it first names each after the method
  recording it with ``get_method_name``, which builds ``inspect.stack()`` twice: time taken from the agent's main
  thread at every rendezvous round (docs/performance.md, "Costs that shape the code"). The bridge gives the
  rendezvous module a ``get_method_name`` that reads the same name from the frame, and replaces
  ``construct_and_record_rdzv_event`` in the modules that imported it by name with a frame-based version that
  always exports, and then takes torch's own path: where torch would record the event (its "dynamic_rendezvous"
  handler is not a NullHandler), it calls torch's ``record_rdzv_event`` -- looked up in torch's events module at
  each call, so code that patches or wraps it (a library, torch's own tests) sees every event it saw without the
  bridge, with torch's ``RdzvEvent``.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

from torchelastic_otel import _compat
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel.events import _otel as event_adapter
from torchelastic_otel.events import make_rdzv_event as _make_rdzv_event

_RDZV_MODULES = (
    "torch.distributed.elastic.events",
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
)


def _rdzv_recorder(handler: logging.Handler) -> Callable[..., None]:
    import torch.distributed.elastic.events as torch_events

    def construct_and_record_rdzv_event(*args: Any, **kwargs: Any) -> None:
        """torch's function, with its parameters (those of ``events.make_rdzv_event`` after the caller's frame):
        exports the event to OpenTelemetry, then records it as torch would."""
        try:
            event = _make_rdzv_event(_compat.caller_frame(1), *args, **kwargs)
            event_adapter.export_event(event)
        except Exception as exc:  # a rendezvous must never fail because of telemetry
            if isinstance(exc, TypeError) and not _fits(args, kwargs):
                raise  # a call torch's own function refuses too, as it would
            from torchelastic_otel import _selftelemetry as selftelemetry

            selftelemetry.count(selftelemetry.DROPPED, "logs", "rdzv_event_error")
            return
        torch_handler = torch_events.get_logging_handler("dynamic_rendezvous")
        if torch_handler is not handler and not isinstance(torch_handler, logging.NullHandler):
            torch_events.record_rdzv_event(_torch_event(torch_events, event))

    construct_and_record_rdzv_event.__torchelastic_otel__ = True  # type: ignore[attr-defined]
    return construct_and_record_rdzv_event


def _fits(args: tuple[object, ...], kwargs: dict[str, object]) -> bool:
    """Whether torch's parameters take these arguments (asked only after a ``TypeError``)."""
    import inspect

    try:
        inspect.signature(_make_rdzv_event).bind(None, *args, **kwargs)
    except TypeError:
        return False
    return True


def _torch_event(torch_events: Any, event: object) -> Any:
    """The bridge's ``RdzvEvent`` as torch's (same fields), which is what torch's ``record_rdzv_event`` is given;
    the bridge's own (same JSON) if torch's no longer takes these fields (counted)."""
    try:
        return torch_events.RdzvEvent(**{field: getattr(event, field) for field in _RDZV_FIELDS})
    except Exception:
        from torchelastic_otel import _selftelemetry as selftelemetry

        selftelemetry.count(selftelemetry.FALLBACK, "logs", "torch_rdzv_event")
        return event


_RDZV_FIELDS = (
    "name",
    "run_id",
    "message",
    "hostname",
    "pid",
    "node_state",
    "master_endpoint",
    "rank",
    "local_id",
    "error_trace",
)


def install(patches: Patches, handler: logging.Handler, *, import_rendezvous: bool = True) -> None:
    """Bridge every torch event destination and the rendezvous events to ``handler`` (an OtelLoggingHandler).

    With ``import_rendezvous=False`` (in workers) only the rendezvous modules already imported are patched:
    importing them would lengthen every worker's start-up (docs/performance.md) for events only an agent records.
    One imported later still records through the bridge, as it takes ``construct_and_record_rdzv_event`` from
    torch's (patched) events module.
    """
    destinations = _compat.torch_event_destinations()
    if destinations is not None:
        patches.set(destinations, "otel", handler)
    for destination in list(destinations or ()):
        if destination in ("otel", "dynamic_rendezvous"):
            continue
        logger = _compat.torch_event_logger(destination)
        if handler not in logger.handlers:
            logger.addHandler(handler)
            patches.on_restore(functools.partial(logger.removeHandler, handler))
    recorder = _rdzv_recorder(handler)
    for module_name in _RDZV_MODULES:
        if import_rendezvous:
            try:
                __import__(module_name)
            except Exception:  # e.g. etcd backend without its client library
                continue
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, "construct_and_record_rdzv_event"):
            patches.set(module, "construct_and_record_rdzv_event", recorder)
        if module is not None and hasattr(module, "get_method_name"):
            _name_from_frames(patches, module)


def _name_from_frames(patches: Patches, module: Any) -> None:
    """Give ``module`` (torch's dynamic rendezvous) a ``get_method_name`` that reads the frame instead of building
    ``inspect.stack()`` twice (``_compat.rdzv_method_name``): the same event names, at a fraction of the cost."""
    original = module.get_method_name
    if getattr(original, "__torchelastic_otel__", False):
        return
    faster = _compat.rdzv_method_name(original)
    if faster is not None:
        patches.set(module, "get_method_name", faster)
