"""Marking tests by the folder they are in (each folder's ``conftest.py``); the markers are registered in
``pyproject.toml`` (``[tool.pytest.ini_options] markers``, with ``--strict-markers``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchelastic_otel import _compat

#: What a test in ``tests/unit`` may not do unless it is marked: the marks that say it starts processes or servers.
PROCESS_MARKS = ("jobs", "stack", "browser")


def mark_folder(items: list[pytest.Item], folder: Path, mark: pytest.MarkDecorator) -> None:
    """Add ``mark`` to every collected test under ``folder`` (``pytest_collection_modifyitems`` sees every item of
    the session, whichever ``conftest.py`` it is in)."""
    for item in items:
        if item.path.is_relative_to(folder):
            item.add_marker(mark)


#: CPython 3.12.0-3.12.1 start no thread while the interpreter exits: there a worker builds at once, in its main
#: thread (``_compat.threads_start_at_exit``), so that an exit can still start its exporters -- nothing is deferred.
needs_a_deferred_build = pytest.mark.skipif(
    not _compat.threads_start_at_exit(), reason="this Python builds a worker's pipeline at once (3.12.0-3.12.1)"
)
