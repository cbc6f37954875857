"""What a build does to the process it runs in: a background build that is due waits for the main thread's imports,
hands the GIL back often while it runs and leaves the process's switch interval as it was; the agent's is done before
it imports torch; no build sets off a garbage collection, and each leaves the collector on or off as it found it.

(The effects on a real job -- ``init_process_group`` slowed by 0.4-0.7 s under CPython's 5 ms interval while the
build ran beside it; a full collection of a torch process's heap, 70-85 ms, in every build -- are measured in
``bench/``, not timed here.)
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.env import otlp_env
from torchelastic_otel._export import state


@pytest.fixture(autouse=True)
def _interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_the_interval_is_short_during_the_build_and_restored_after() -> None:
    sys.setswitchinterval(0.005)
    with state._yielding():
        assert sys.getswitchinterval() == pytest.approx(state.BUILD_SWITCH_INTERVAL)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_an_interval_changed_meanwhile_is_left_as_it_was_changed() -> None:
    sys.setswitchinterval(0.005)
    with state._yielding():
        sys.setswitchinterval(0.002)  # the application's own choice, made during the build
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_a_shorter_interval_is_not_lengthened() -> None:
    sys.setswitchinterval(0.0001)
    with state._yielding():
        assert sys.getswitchinterval() == pytest.approx(0.0001)
    assert sys.getswitchinterval() == pytest.approx(0.0001)


# ---- the garbage collector --------------------------------------------------------------------------------------

#: A process that has imported torch builds the pipeline from OTEL_* (OTLP/gRPC to a port nobody listens on: a build
#: connects to nothing) and says which generations were collected meanwhile and whether the collector is on after.
_BUILD_AFTER_TORCH = """
import gc, json, sys
import torch.distributed.run
if sys.argv[1] == "off":
    gc.disable()
from torchelastic_otel import pipeline
started = []
gc.callbacks.append(lambda phase, info: phase == "start" and started.append(info["generation"]))
pipeline.get_pipeline()
print(json.dumps({"collections": started, "enabled": gc.isenabled()}))
"""


#: A collector that is down, and no periodic export while the process lives: the build is all that is measured.
NO_EXPORT_BEFORE_EXIT = {"OTEL_METRIC_EXPORT_INTERVAL": "600000"}


def _build_after_torch(collector: str) -> dict[str, object]:
    pytest.importorskip("torch")
    env = otlp_env("http://127.0.0.1:1", pace=NO_EXPORT_BEFORE_EXIT)
    done = subprocess.run([sys.executable, "-c", _BUILD_AFTER_TORCH, collector], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.jobs
def test_a_build_in_a_torch_process_sets_off_no_full_collection() -> None:
    """Without the pause, the build's objects set off some 30 collections there, a full one (70-85 ms) among them.
    With it, the young generation may be collected once, as the collector comes back on."""
    outcome = _build_after_torch("on")
    assert outcome["enabled"] is True
    assert outcome["collections"] in ([], [0]), outcome


@pytest.mark.jobs
def test_a_collector_turned_off_stays_off() -> None:
    assert _build_after_torch("off") == {"collections": [], "enabled": False}


# ---- the agent's build -----------------------------------------------------------------------------------------

#: What ``torchelastic-otel run --standalone ...`` does before it imports torch; then where the build is.
_AGENT_START = """
import json, sys, threading
from torchelastic_otel import pipeline, run
run._build_early(run._early_run_id(["--standalone", "--nproc-per-node", "2", "train.py"])[0])
print(json.dumps({
    "ready": pipeline.ready() is not None,
    "building": [t.name for t in threading.enumerate() if t.name == "torchelastic-otel-setup"],
    "torch": "torch" in sys.modules,
}))
"""


@pytest.mark.jobs
def test_the_agent_is_built_before_torch_is_imported_not_beside_it() -> None:
    """Side by side with ``import torch`` (CPU-bound Python under one GIL, both), the agent's build cost its start-up
    0.40 s against 0.20 s one after the other (medians of 8 on a 2-core machine): the launcher waits for it."""
    env = otlp_env("http://127.0.0.1:1", pace=NO_EXPORT_BEFORE_EXIT)
    done = subprocess.run([sys.executable, "-c", _AGENT_START], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"ready": True, "building": [], "torch": False}


# ---- a build that is due waits for the main thread's imports ----------------------------------------------------


def _import_module_running(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> Any:
    """Import a module whose top level is ``body`` (in this, the main thread); the module."""
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


def test_the_main_thread_is_importing_only_inside_an_import(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _import_module_running(tmp_path, monkeypatch, "_teo_probe_importing", (
        "from torchelastic_otel._export import state\n"
        "DURING = state._main_thread_importing()\n"
    ))  # fmt: skip
    assert module.DURING is True
    assert state._main_thread_importing() is False


#: Top level of a module imported by the main thread: a due build waits in another thread while the import goes on.
_IMPORT_WHILE_DUE = """
import threading, time
from torchelastic_otel._export import state
GO = threading.Event()
if ASKED:
    GO.set()
waiter = threading.Thread(target=state._await_imports, args=(GO, 30.0), daemon=True)
waiter.start()
waiter.join(0.5)
WAITING_DURING_IMPORT = waiter.is_alive()
"""


@pytest.mark.parametrize("asked", [False, True])
def test_a_due_build_waits_for_the_import_unless_asked_for(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, asked: bool
) -> None:
    """Due (the delay is over), it waits while the main thread imports and goes on once the import is over; asked for
    (a provider, :func:`wait_built`), at once."""
    name = f"_teo_probe_due_{int(asked)}"
    module = _import_module_running(tmp_path, monkeypatch, name, f"ASKED = {asked}\n" + _IMPORT_WHILE_DUE)
    assert module.WAITING_DURING_IMPORT is (not asked)
    module.waiter.join(10.0)  # its own bound is 30 s: returning sooner means the end of the import let it go
    assert not module.waiter.is_alive()
