"""What a build does to the process it runs in: a background build hands the GIL back often while it runs and
leaves the process's switch interval as it was; no build sets off a garbage collection, and each leaves the collector
on or off as it found it.

(The effects on a real job -- ``init_process_group`` slowed by 0.4-0.7 s under CPython's 5 ms interval while the
build ran beside it; a full collection of a torch process's heap, 70-85 ms, in every build -- are measured in
``bench/``, not timed here.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

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


def _build_after_torch(collector: str) -> dict[str, object]:
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_"))}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:1", OTEL_METRIC_EXPORT_INTERVAL="600000")
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
