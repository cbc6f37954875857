"""Checks on a real NVIDIA GPU (``make test-gpu``): marked ``gpu``, skipped where torch sees no CUDA device.

Here the machine's own Python runs them, with its own CUDA build of torch; OpenTelemetry and this package come from
wheels (``make test-gpu``). Every job is a real ``torchelastic-otel run`` (or plain ``torchrun``) of
``tests/support/workers/gpu_worker.py``, which times itself with CUDA events: the bridge's figures must match.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.marks import mark_folder


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    mark_folder(items, here, pytest.mark.gpu)
    mark_folder(items, here, pytest.mark.jobs)
    if not _cuda():
        mark_folder(items, here, pytest.mark.skip(reason="no CUDA device: tests/gpu runs on a GPU (make test-gpu)"))
