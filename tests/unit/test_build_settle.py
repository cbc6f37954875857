"""A deferred build that waited for the main thread's imports waits a while after them too (``state._await_imports``
with ``settle_seconds``): the rest of the script's start-up -- its model, device and process group, its first steps --
runs without the build beside it, and a rank that fails in it builds nothing. An import meanwhile starts the wait
again; a build asked for or wanted (what is buffered outgrew the hand-over) starts at once; the whole wait is bounded.

(What it saves a real job is measured in ``bench/bench_failonce_stretches.py``, not timed here.)
"""

from __future__ import annotations

import importlib
import threading
import time
from typing import Any

import pytest

from torchelastic_otel._export import state

#: Top level of a module the main thread imports: a waiter thread starts while the import goes on; the module
#: returns (the import ends) once the waiter was seen waiting.
_WAITER = """
import threading
from torchelastic_otel._export import state
GO = threading.Event()
WANTED = threading.Event()
waiter = threading.Thread(target=state._await_imports, args=(GO, TIMEOUT, SETTLE, WANTED.is_set), daemon=True)
waiter.start()
waiter.join(0.2)
WAITING_DURING_IMPORT = waiter.is_alive()
"""


def _import_with_waiter(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, name: str, settle: float,
                        timeout: float = 30.0) -> Any:  # fmt: skip
    (tmp_path / f"{name}.py").write_text(f"SETTLE = {settle}\nTIMEOUT = {timeout}\n" + _WAITER)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


def _ends_within(thread: threading.Thread, seconds: float) -> float | None:
    """Seconds until ``thread`` ended (``None``: still alive after ``seconds``)."""
    began = time.monotonic()
    thread.join(seconds)
    return None if thread.is_alive() else time.monotonic() - began


def test_a_deferred_build_waits_a_while_after_the_imports(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _import_with_waiter(tmp_path, monkeypatch, "_teo_settle_after", settle=0.5)
    assert module.WAITING_DURING_IMPORT
    assert module.waiter.is_alive()  # the import is over: the rest of the start-up goes on without the build
    took = _ends_within(module.waiter, 20.0)
    assert took is not None and took >= 0.25, took


def test_an_import_meanwhile_starts_the_settling_again(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _import_with_waiter(tmp_path, monkeypatch, "_teo_settle_again", settle=0.5)
    (tmp_path / "_teo_settle_second.py").write_text("import time\ntime.sleep(0.8)  # a long import\n")
    importlib.import_module("_teo_settle_second")  # longer than the settling: the waiter waited through it
    assert module.waiter.is_alive()
    took = _ends_within(module.waiter, 20.0)
    assert took is not None and took >= 0.25, took


def test_asked_or_wanted_it_starts_at_once(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _import_with_waiter(tmp_path, monkeypatch, "_teo_settle_wanted", settle=30.0)
    assert module.waiter.is_alive()
    module.WANTED.set()  # what is buffered outgrew the hand-over
    assert _ends_within(module.waiter, 5.0) is not None
    asked = _import_with_waiter(tmp_path, monkeypatch, "_teo_settle_asked", settle=30.0)
    asked.GO.set()  # a provider was asked for
    assert _ends_within(asked.waiter, 5.0) is not None


def test_the_wait_is_bounded(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _import_with_waiter(tmp_path, monkeypatch, "_teo_settle_bounded", settle=30.0, timeout=0.5)
    assert _ends_within(module.waiter, 10.0) is not None


def test_without_settling_the_end_of_the_imports_lets_it_go(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build that is not deferred (a worker of an agent that is not bridged) waits for the imports only."""
    module = _import_with_waiter(tmp_path, monkeypatch, "_teo_settle_none", settle=0.0)
    assert module.WAITING_DURING_IMPORT
    assert _ends_within(module.waiter, 5.0) is not None


def test_not_importing_when_due_it_starts_at_once() -> None:
    waiter = threading.Thread(target=state._await_imports, args=(threading.Event(), 30.0, 30.0), daemon=True)
    waiter.start()
    assert _ends_within(waiter, 5.0) is not None
