"""Tests that start real torchrun jobs, worker scripts or other child processes: all marked ``jobs``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.marks import mark_folder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_folder(items, Path(__file__).parent, pytest.mark.jobs)
