"""Post-import hooks: run a callback once a module has been imported, without importing it (and callbacks around
a module's import: :func:`around`).

A worker must not pay for torch's import (most of a worker's start-up: docs/performance.md) when its script never
imports torch, yet torch's events and metrics modules must be bridged as soon as the script imports them.
:func:`when_imported` does that: at once if the module is imported already, else right after the module's code has run,
in the thread that imports it.

How: a finder at the front of ``sys.meta_path`` answers only for the module names that have a callback pending.
It asks the other finders for the module's spec (so the module is found exactly as without it) and wraps the
spec's loader: ``exec_module`` hands the spec and the module back their own loader, runs the module's code, then
the callbacks. Every other import costs one dict lookup; once no callback is pending the finder leaves
``sys.meta_path``. A callback that raises is counted and logged at debug level, never raised into the import: the
application's import succeeds whatever the bridge does.

Limits: a module imported by a finder placed in front of this one later (another post-import hook library that
answers for the same name) runs no callback; a module passed to :func:`when_imported` while its own code is still
running (a call made from inside its import) gets the callback at once, partly initialised.

Kept free of the rest of the bridge (builtin modules only: not even ``importlib.abc`` or ``__future__``, whose
imports cost more than all this module does: docs/performance.md): processes that only inherit a worker's
environment import it at start-up.
"""

import _thread
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    Callback = Callable[[ModuleType], object]

__all__ = ["when_imported", "cancel", "pending", "around"]

_lock = _thread.RLock()
_hooks: "dict[str, list[Callback]]" = {}
#: ``(before, after)`` pairs of :func:`around`, by module name.
_around: "dict[str, list[tuple[Callable[[], Any], Callable[[], Any]]]]" = {}


def when_imported(name: str, callback: "Callback") -> None:
    """Run ``callback(module)`` once module ``name`` has been imported (now, if it has)."""
    module = sys.modules.get(name)
    if module is not None:
        _run(name, callback, module)
        return
    with _lock:
        _hooks.setdefault(name, []).append(callback)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


def around(name: str, before: "Callable[[], Any]", after: "Callable[[], Any]") -> bool:
    """Run ``before()`` right before module ``name``'s code runs and ``after()`` right after it, also when it
    raises, both in the thread that imports it; once. ``False`` (nothing registered) if it is imported already."""
    if name in sys.modules:
        return False
    with _lock:
        _around.setdefault(name, []).append((before, after))
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
    return True


def cancel_around(name: str, before: "Callable[[], Any]") -> None:
    """Forget the pair of :func:`around` whose ``before`` is ``before``, if its import has not begun."""
    with _lock:
        pairs = [pair for pair in _around.get(name, []) if pair[0] is not before]
        if pairs:
            _around[name] = pairs
        else:
            _around.pop(name, None)
        _leave_if_idle()


def cancel(name: str, callback: "Callback") -> None:
    """Forget a callback that has not run yet (no-op otherwise)."""
    with _lock:
        callbacks = _hooks.get(name)
        if callbacks and callback in callbacks:
            callbacks.remove(callback)
            if not callbacks:
                del _hooks[name]
        _leave_if_idle()


def pending() -> list[str]:
    """Module names that still have callbacks waiting."""
    with _lock:
        return sorted(_hooks)


def _leave_if_idle() -> None:
    if not _hooks and not _around and _FINDER in sys.meta_path:
        try:
            sys.meta_path.remove(_FINDER)
        except ValueError:
            pass


def _fire(name: str, module: "ModuleType") -> None:
    with _lock:
        callbacks = _hooks.pop(name, [])
        _leave_if_idle()
    for callback in callbacks:
        _run(name, callback, module)


def _run(name: str, callback: "Callback", module: "ModuleType") -> None:
    try:
        callback(module)
    except Exception:
        try:
            import logging

            from torchelastic_otel import _selftelemetry as selftelemetry

            selftelemetry.count(selftelemetry.DROPPED, "all", "import_hook_error")
            logging.getLogger("torchelastic_otel").debug("callback after importing %s failed", name, exc_info=True)
        except Exception:
            pass


def _ignoring_module(call: "Callable[[], Any]") -> "Callback":
    """A callback of :func:`around` (no argument) as :func:`_run` calls one."""

    def callback(_module: "ModuleType") -> None:
        call()

    return callback


class _Finder:
    """Finds nothing itself: wraps the loader of a spec the other finders found for a hooked module."""

    def find_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "Any":
        if fullname not in _hooks and fullname not in _around:
            return None
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec  # a namespace package or a legacy loader: left alone (no callback)
        spec.loader = _Loader(loader, fullname)
        return spec

    def invalidate_caches(self) -> None:
        pass


class _Loader:
    """The module's own loader, then the callbacks."""

    def __init__(self, loader: "Any", name: str) -> None:
        self.loader = loader
        self.name = name

    def create_module(self, spec: "Any") -> "Any":
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: "ModuleType") -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self.loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        with _lock:
            pairs = _around.pop(self.name, [])
            _leave_if_idle()
        for before, _after in pairs:
            _run(self.name, _ignoring_module(before), module)
        try:
            self.loader.exec_module(module)
        except BaseException as exc:
            for _before, after in reversed(pairs):
                _run(self.name, _ignoring_module(after), module)
            try:  # fails as without the bridge (imported on a failure only: this module stays free of the bridge)
                from torchelastic_otel._torch import tracebacks

                tracebacks.drop_own_frame(exc)  # importlib's own frames then go as Python trims them
            except Exception:
                pass
            raise
        for _before, after in reversed(pairs):
            _run(self.name, _ignoring_module(after), module)
        _fire(self.name, sys.modules.get(self.name, module))

    def __getattr__(self, attribute: str) -> "Any":  # get_source, get_filename, is_package, ... of the real loader
        return getattr(self.loader, attribute)


_FINDER = _Finder()
