"""Tests that start external servers and tools (Prometheus, promtool, the rotel collector), most of them fed by
real torchrun jobs: all marked ``stack``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.marks import mark_folder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_folder(items, Path(__file__).parent, pytest.mark.stack)
