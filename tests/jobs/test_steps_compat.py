"""The torch internals the training telemetry reads, pinned: these fail when a torch release changes them.

- ``torch._C._distributed_c10d._dump_fr_trace`` (``_compat.flight_recorder``): the Flight Recorder's pickle dump,
  without stack traces, with ``pg_status`` per group name and the ``entries`` fields the bridge reads; on gloo, on
  by default (torch 2.13); ``TORCH_FR_BUFFER_SIZE=0`` turns it off;
- its JSON twin ``_dump_fr_trace_json``, the counted fallback;
- ``torch.optim.optimizer.register_optimizer_step_post_hook`` (public): called after every optimizer's step with
  ``(optimizer, args, kwargs)``.

Each Flight Recorder case runs in its own Python process with a real 1-rank gloo process group on 127.0.0.1 (a
process group is process-wide state this test process must not keep).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.env import clean_env
from tests.support.ports import free_port

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")


_SCRIPT = r"""
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % sys.argv[1], rank=0, world_size=1)
if sys.argv[2] == "no-pickle":
    import torch._C._distributed_c10d as c10d
    del c10d._dump_fr_trace  # as in a release without it
from torchelastic_otel import _compat
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._torch.worker import collectives
t = torch.ones(1)
for _ in range(3):
    dist.all_reduce(t)
# gloo's all_reduce returns before the recorder marks it completed (on a loaded machine, noticeably): wait for that.
deadline = time.monotonic() + 30
while True:
    status = _compat.flight_recorder(False)
    rows = list(((status or {}).get("pg_status") or {}).values())
    if not rows or int(rows[0]["last_completed_collective"]) >= int(rows[0]["last_enqueued_collective"]):
        break  # (no rows: the recorder is off)
    if time.monotonic() >= deadline:
        break
    time.sleep(0.01)
full = _compat.flight_recorder(True)
groups, entries = collectives.read_entries()
out = {
    "status": status,
    "entry_keys": sorted(full["entries"][-1]) if full and full.get("entries") else [],
    "last_entry": full["entries"][-1] if full and full.get("entries") else None,
    "entries": len(full["entries"]) if full and full.get("entries") else 0,
    "groups": [[g.name, g.key, g.last_enqueued, g.last_completed, g.pending] for g in collectives.status()],
    "summary": collectives.summary(),
    "fallbacks": {r: n for (_, _, r), n in selftelemetry.snapshot(selftelemetry.FALLBACK).items()},
}
sys.stdout.write(json.dumps(out, default=str) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
os._exit(0)
"""


def _run(mode: str = "pickle", **env: str) -> dict[str, Any]:
    environ = {k: v for k, v in clean_env().items() if not k.startswith("TORCH_FR")}  # no inherited TORCH_FR_*
    environ.update(OMP_NUM_THREADS="1", **env)
    result = subprocess.run([sys.executable, "-c", _SCRIPT, str(free_port()), mode], env=environ, cwd=ROOT,
                            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_flight_recorder_dump_holds_what_the_bridge_reads() -> None:
    before = time.time_ns()
    out = _run()
    assert out["fallbacks"] == {}, out["fallbacks"]
    (row,) = out["status"]["pg_status"].values()
    assert {"last_enqueued_collective", "last_started_collective", "last_completed_collective"} <= set(row)
    assert {"collective_seq_id", "profiling_name", "process_group", "time_created_ns", "is_p2p"} <= set(
        out["entry_keys"]
    )
    entry = out["last_entry"]
    assert entry["profiling_name"] == "gloo:all_reduce" and list(entry["process_group"]) == ["0", "default_pg"]
    assert before < int(entry["time_created_ns"]) <= time.time_ns()  # the wall clock, as the step marks
    assert "frames" not in entry  # no stack traces asked for: cheaper
    (group,) = out["groups"]
    assert group[:2] == ["0", "default_pg"] and group[2] >= 3
    assert out["summary"] == {"default_pg": {"last_enqueued": group[2], "last_completed": group[3]}}


def test_the_flight_recorder_is_on_by_default_and_can_be_turned_off() -> None:
    assert _run()["entries"] >= 3
    off = _run(TORCH_FR_BUFFER_SIZE="0")
    assert off["entries"] == 0 and off["summary"] == {} and off["groups"] == []


def test_without_the_pickle_dump_the_json_one_is_used_and_counted() -> None:
    out = _run("no-pickle")
    assert out["fallbacks"].get("torch _dump_fr_trace", 0) >= 1, out["fallbacks"]
    assert out["entries"] >= 3 and out["last_entry"]["profiling_name"] == "gloo:all_reduce"
    (group,) = out["groups"]
    assert group[1] == "default_pg" and group[2] >= 3  # the JSON dump's numbers are strings: read as numbers


def test_the_global_optimizer_step_post_hook() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    seen: list[tuple[Any, Any, Any]] = []
    parameter = torch.nn.Parameter(torch.zeros(1))
    parameter.grad = torch.zeros(1)
    for optimizer in (torch.optim.SGD([parameter], lr=0.0), torch.optim.Adam([parameter], lr=0.0)):
        handle = register_optimizer_step_post_hook(lambda o, args, kwargs: seen.append((o, args, kwargs)))
        try:
            optimizer.step()
        finally:
            handle.remove()
        optimizer.step()
        assert len(seen) == 1 and seen[0][0] is optimizer  # (args, kwargs: those of step(); the bridge reads none)
        assert isinstance(seen[0][1], tuple) and isinstance(seen[0][2], dict)
        seen.clear()
