"""A worker's resource names its rank even when a library empties ``os.environ`` for a moment.

accelerate's ``KwargsHandler.to_kwargs`` (which Hugging Face's Trainer calls while it sets up) runs inside
``accelerate.utils.clear_environment()``: ``os.environ`` is empty on the main thread meanwhile. A pipeline that the
bridge builds on its own thread at that moment read no torchrun variable, and the worker's telemetry carried no
rank, restart or run id (seen in ``tests/jobs/test_framework_metrics.py``: one rank of one attempt missing). The
worker's start-up (``worker_env.claim``) remembers torchrun's variables; ``torchrun_attributes`` falls back on them.
The real ``clear_environment`` is used here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.lazy import lazy
from torchelastic_otel import _names as names
from torchelastic_otel import resource

environment = lazy("accelerate.utils.environment")

TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_RUN_ID": "run-42",
}


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var, value in TORCHRUN.items():
        monkeypatch.setenv(var, value)
    yield
    resource._REMEMBERED.clear()


def test_a_cleared_environment_still_names_the_rank(worker: None) -> None:
    resource.remember()
    with environment.clear_environment():
        attrs = resource.torchrun_attributes()
    assert attrs[names.RANK] == 3 and attrs[names.LOCAL_RANK] == 1 and attrs[names.WORLD_SIZE] == 4
    assert attrs[names.RESTART_COUNT] == 2 and attrs[names.RUN_ID] == "run-42"
    assert attrs[names.PROCESS_KIND] == "worker"


def test_without_the_start_up_snapshot_a_cleared_environment_names_nothing(worker: None) -> None:
    """What the snapshot prevents: the same read, nothing remembered."""
    with environment.clear_environment():
        attrs = resource.torchrun_attributes()
    assert names.RANK not in attrs and names.PROCESS_KIND not in attrs


def test_the_environment_of_the_moment_wins_over_the_snapshot(worker: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable set later (the launcher's run id in an agent) is read as it is now."""
    resource.remember()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-43")
    assert resource.torchrun_attributes()[names.RUN_ID] == "run-43"
    assert resource.torchrun_attributes({"RANK": "0"})[names.RANK] == 0  # an explicit environment is read alone
