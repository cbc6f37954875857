"""Tests in one process: no torchrun job, worker script, child process, server or browser. A test here that starts
a process is marked for it (``@pytest.mark.jobs``) and so left out of ``make test-fast``; an unmarked test that
tries fails, naming what it started. A tool that runs and exits at once is fine (``TOOLS``: openssl making a test
certificate)."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.marks import PROCESS_MARKS

TOOLS = {"openssl"}


@pytest.fixture(autouse=True)
def _no_process(request: pytest.FixtureRequest) -> Iterator[None]:
    if any(request.node.get_closest_marker(name) for name in PROCESS_MARKS):
        yield
        return
    started: list[str] = []

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            started.append(what)
            raise RuntimeError(f"a test in tests/unit started a process ({what}): mark it @pytest.mark.jobs")

        return refused

    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def tool_or_refused(popen: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> Any:
        program = args if isinstance(args, (str, bytes, os.PathLike)) else args[0]
        if os.path.basename(os.fsdecode(program)) in TOOLS:
            return execute_child(popen, args, *rest, **kwargs)
        return refuse(f"subprocess {os.fsdecode(program)}")()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", tool_or_refused)
        patch.setattr(multiprocessing.process.BaseProcess, "start", refuse("multiprocessing"))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            if hasattr(os, name):
                patch.setattr(os, name, refuse(f"os.{name}"))
        yield
    assert not started, f"a test in tests/unit started a process ({', '.join(started)}): mark it @pytest.mark.jobs"


@pytest.fixture
def captured(otel: Any) -> Iterator[Any]:
    """The workers' logging capture installed with the in-memory pipeline (``otel``); the root logger and the tests'
    ``lib.*`` loggers restored after."""
    from tests.support.logging_capture import logging_captured  # the bridge's worker modules: only where asked for

    with logging_captured():
        yield otel


@pytest.fixture
def frameworks_installed(otel: Any, paused_drainer: Any) -> Iterator[Any]:
    """The workers' framework instrumentation (Hugging Face, Lightning) installed with the in-memory pipeline and
    the drainer paused; its patches (``Patches``), restored and drained after."""
    from tests.support.installed import installed
    from torchelastic_otel._torch.worker import frameworks
    from torchelastic_otel._torch.worker.frameworks import instruments

    try:
        with installed(frameworks.install) as patches:
            yield patches
    finally:
        instruments.drain()
