"""A module imported at the first use of one of its attributes, for the heavy imports of a test module (Lightning,
Hugging Face, accelerate, torch's distributed checkpoint).

Every pytest-xdist process collects every test file: what a file imports at its top, each process pays for at
collection, also where none of that file's tests runs in it. Named with :func:`lazy`, the module is imported by the
first test that uses it; a test is skipped where the module is missing, as ``pytest.importorskip`` at the file's
top would skip the file.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

import pytest

__all__ = ["Lazy", "lazy", "require"]


class Lazy:
    """Stands for the module ``name``: an attribute read imports it (once: ``sys.modules`` has it then)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def module(self) -> ModuleType:
        """The module itself (where a function wants the module object, not an attribute of it)."""
        return pytest.importorskip(self._name)

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_") and self._name not in sys.modules:
            # what pytest's collection asks of every name in a file (``__test__``, ``_pytestfixturefunction``...):
            # no reason to import the module
            raise AttributeError(attribute)
        return getattr(self.module(), attribute)


def lazy(name: str) -> Any:
    """The module ``name``, imported when a test first reads an attribute of it."""
    return Lazy(name)


def require(*names: str) -> None:
    """Skip the calling test file unless every module of ``names`` is installed, as ``pytest.importorskip`` does,
    without importing them (a file whose jobs run the frameworks in their own processes needs them installed, not
    imported)."""
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing or broken
            found = False
        if not found:
            pytest.skip(f"could not import {name!r}: not installed", allow_module_level=True)
