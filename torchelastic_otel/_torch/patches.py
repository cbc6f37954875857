"""Record every change the bridge makes to torch, so ``uninstall()`` restores exactly what was there."""

from __future__ import annotations

from collections.abc import Callable

_MISSING = object()


class Patches:
    """A stack of undo actions; :meth:`restore` runs them in reverse order."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], object]] = []

    def set(self, owner: object, name: str, value: object) -> object:
        """Replace ``owner.name`` (``owner[name]`` for a dict) with ``value``; returns what was there."""
        if isinstance(owner, dict):
            original = dict.get(owner, name, _MISSING) if dict.__contains__(owner, name) else _MISSING
            owner[name] = value

            def undo() -> None:
                if original is _MISSING:
                    dict.pop(owner, name, None)
                else:
                    owner[name] = original

        else:
            # For classes, only what the class itself defines (not inherited) is restored as an attribute.
            source = owner.__dict__ if isinstance(owner, type) else vars(owner) if hasattr(owner, "__dict__") else {}
            original = source.get(name, _MISSING)
            setattr(owner, name, value)

            def undo() -> None:
                if original is _MISSING:
                    try:
                        delattr(owner, name)
                    except AttributeError:
                        pass
                else:
                    setattr(owner, name, original)

        self._undo.append(undo)
        return None if original is _MISSING else original

    def on_restore(self, undo: Callable[[], object]) -> None:
        """Register an arbitrary undo action."""
        self._undo.append(undo)

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __len__(self) -> int:
        return len(self._undo)
