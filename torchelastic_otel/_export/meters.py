"""What an adapter holds of the current pipeline's providers, made again whenever the pipeline changes.

The pipeline is rebuilt after a fork (the child's own), replaced by ``setup()``, shut down: an adapter that cached
a meter and its instruments, or a logger, would go on writing to the old providers. :class:`PerPipeline` holds one
value made from the current pipeline by the adapter's own function, and makes it again after each change
(``state.generation``); asking for it when nothing changed is two reads and a comparison::

    _instruments = PerPipeline(lambda pipeline: _Instruments(pipeline.meter_provider.get_meter(SCOPE, VERSION)))
    _instruments.get().steps.add(1)

:class:`Observed` is the same for observable instruments, which nobody asks for: it makes them on the pipeline's
meter provider as soon as it is ready, and again on every new one. Their callbacks run when metrics are collected
(the SDK's reader thread, a scrape, a flush); one that raises is counted (``torchelastic_otel.dropped``, signal
``metrics``) and reports nothing. Stopped, they stay on their provider (the SDK cannot drop them) and report
nothing.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import state
from torchelastic_otel.version import __version__

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation

__all__ = ["PerPipeline", "Observed", "SCOPE"]

#: The instrumentation scope of the bridge's own instruments.
SCOPE = "torchelastic_otel"

T = TypeVar("T")


class PerPipeline(Generic[T]):
    """``make(pipeline)``, once per pipeline (see the module's docstring). ``make`` may raise: :meth:`get` then
    raises too, and tries again at the next call."""

    def __init__(self, make: Callable[[state.Pipeline], T]) -> None:
        self._make = make
        self._value: T | None = None
        self._generation = -1
        self._lock = threading.Lock()
        _every.add(self)

    def get(self) -> T:
        value, generation = self._value, state.state.generation[0]
        if value is not None and self._generation == generation:
            return value
        with self._lock:
            value = self._value
            if value is None or self._generation != state.state.generation[0]:
                pipeline = state.get_pipeline()  # (a first use may build it: the generation is read after)
                generation = state.state.generation[0]
                value = self._make(pipeline)
                self._value, self._generation = value, generation
            return value

    def made(self) -> T | None:
        """The value made for the current pipeline, ``None`` if none was (never makes one)."""
        return self._value if self._generation == state.state.generation[0] else None

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork


class Observed:
    """A module's observable instruments (see the module's docstring): ``create(meter)`` makes them on a meter
    provider's meter, once per pipeline and provider (a failure is counted as ``error``); :attr:`active` says
    whether their callbacks report."""

    def __init__(self, create: Callable[[Meter], None], error: str) -> None:
        self.active = False
        self._create = create
        self._error = error
        self._lock = threading.Lock()
        self._generation = -1
        self._providers: weakref.WeakSet[object] = weakref.WeakSet()
        self._provider_ids: set[int] = set()  # providers that cannot be weakly referenced
        _every.add(self)

    def start(self) -> Callable[[], None]:
        """Report from now on: the instruments made on the ready pipeline's provider, now or once it is ready, and
        on every new one. Returns what stops them (for ``Patches.on_restore``)."""
        self.active = True
        self._generation = -1

        def on_phase(phase: state.Phase) -> None:
            if phase is state.Phase.READY:
                self.ensure()

        state.add_listener(on_phase)
        state.when_ready(self.ensure)

        def stop() -> None:
            state.remove_listener(on_phase)
            self.active = False

        return stop

    def ensure(self, *_: object) -> None:
        """Make the instruments on the ready pipeline's meter provider, unless made there already."""
        if not self.active:
            return
        generation = state.generation()
        if generation == self._generation:
            return
        current = state.ready()
        if current is None:
            return
        with self._lock:
            provider = current.meter_provider
            if not self._known(provider):
                try:
                    self._create(provider.get_meter(SCOPE, __version__))
                except Exception:
                    selftelemetry.count(selftelemetry.DROPPED, "metrics", self._error)
                self._remember(provider)
            self._generation = generation

    def callback(
        self, observe: Callable[[], list[Observation]], error: str
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        """An instrument's callback: ``observe()`` while active; nothing, counted as ``error``, where it raises."""

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            if not self.active:
                return []
            try:
                return observe()
            except Exception:
                selftelemetry.count(selftelemetry.DROPPED, "metrics", error)
                return []

        return callback

    def _known(self, provider: object) -> bool:
        try:
            return provider in self._providers
        except TypeError:
            return id(provider) in self._provider_ids

    def _remember(self, provider: object) -> None:
        try:
            self._providers.add(provider)
        except TypeError:
            self._provider_ids.add(id(provider))

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork


_every: weakref.WeakSet[PerPipeline[Any] | Observed] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for cache in list(_every):
        cache.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
