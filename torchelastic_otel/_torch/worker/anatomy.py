"""The anatomy of a step and where a rank's time goes (goodput): phase events on the training path. STUB (lead)."""

from __future__ import annotations

__all__ = ["checkpoint_enter", "checkpoint_exit", "checkpoint_committed"]


def checkpoint_enter(kind: str) -> None:
    """A checkpoint ``kind`` ("save" | "load") begins its blocking part on this thread."""


def checkpoint_exit(kind: str) -> None:
    """The blocking part of checkpoint ``kind`` ended (completed or raised)."""


def checkpoint_committed() -> None:
    """A save is durably complete: the steps before it are kept whatever happens next."""
