"""The processes a worker starts pay nothing for the bridge: real torchrun jobs (CPU, gloo, 127.0.0.1).

The worker is ``tests/support/workers/_descendant_worker.py``, a bridge-unaware script with two ranks. Rank 0 runs
``python -c`` through ``subprocess`` three times, a spawn ``multiprocessing.Pool(2).map``, a ``DataLoader`` with
``num_workers=2`` and ``multiprocessing_context="spawn"`` over two epochs, and a child that records an event itself
through ``torchelastic_otel.events.record``; rank 1 the ``subprocess`` and ``record`` steps only (and so imports no
torch until the ranks meet in a gloo ``all_reduce`` at the end). Every process started writes a probe of what it
imported. The same job runs under plain ``torchrun``, and under ``torchelastic-otel run`` with the collector live (an
``OtlpReceiver``) and down (nobody listening on the endpoint), each once per module.

Checked: a descendant imports neither torch nor OpenTelemetry (a DataLoader worker imports torch, which it needs,
and nothing of OpenTelemetry), does not capture its output again, and inherits its worker's mark; the worker
itself did not import torch's elastic modules for the bridge; exit codes and the descendants' console lines are
those of plain torchrun; a descendant's printed line arrives as its worker's output record; the descendant that
records gets its worker's rank resource and the attempt's trace. Speed is ``bench/bench_descendants.py``'s.
About 1.5-2.5 minutes on 2 cores (the jobs); the parts (roles, hooks, a descendant importing torch) are checked
in one process or a bare interpreter.
"""

from __future__ import annotations

import collections
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, WORKERS
from tests.support.env import clean_env, closed_endpoint, otlp_env, plain_env
from tests.support.jobs import TORCHELASTIC_OTEL, TORCHRUN, c10d_args, unique_id
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.procs import run_job

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")

WORKER = WORKERS / "_descendant_worker.py"
JOB_TIMEOUT = 180.0
WAIT = 30.0
OUTPUT_SCOPE = "torchelastic_otel.worker.output"
NOTHING = {"torch": False, "torch_elastic_events": False, "otel_api": False, "otel_sdk": False,
           "bridge_pipeline": False, "bridge_output": False, "otel_any": False}  # fmt: skip
KINDS = ("plain", "live", "down")


@dataclass
class Finished:
    kind: str
    run_id: str
    returncode: int | None
    console: str
    probes: dict[int, dict[str, Any]] = field(default_factory=dict)
    rx: OtlpReceiver | None = None

    def probes_of(self, rank: int, step: str) -> list[dict[str, Any]]:
        return self.probes[rank]["steps"][step]["probes"]


def run(kind: str, tmp: Path, rx: OtlpReceiver | None) -> Finished:
    base = tmp / kind
    probe_dir = base / "probes"
    probe_dir.mkdir(parents=True)
    run_id = unique_id(f"descendants-{kind}")
    args = [*c10d_args(run_id), "--nproc-per-node", "2", str(WORKER), "--probe-dir", str(probe_dir), "--dist"]
    if kind == "plain":
        # plain torch has no bridge; the record step's child finds torchelastic_otel installed: it exports nothing
        cmd = [str(TORCHRUN), *args]
        env = plain_env(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    else:
        assert rx is not None
        cmd = [str(TORCHELASTIC_OTEL), "run", *args]
        env = otlp_env(closed_endpoint() if kind == "down" else rx)
    job = run_job(cmd, env, ROOT, base / "console.txt", timeout=JOB_TIMEOUT)
    probes = {int(p.stem[4:]): json.loads(p.read_text()) for p in probe_dir.glob("rank?.json")}
    return Finished(kind, run_id, job.returncode, job.output(), probes, rx if kind == "live" else None)


class Runs:
    """Each kind of job once per module; the receivers are stopped at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.done: dict[str, Finished] = {}
        self.receivers = contextlib.ExitStack()

    def get(self, kind: str) -> Finished:
        if kind not in self.done:
            rx = None if kind == "plain" else self.receivers.enter_context(OtlpReceiver())
            self.done[kind] = run(kind, self.tmp, rx)
        return self.done[kind]

    def close(self) -> None:
        self.receivers.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    with contextlib.closing(Runs(tmp_path_factory.mktemp("descendants"))) as runner:
        yield runner


def finished(runs: Runs, kind: str) -> Finished:
    job = runs.get(kind)
    assert job.returncode == 0 and sorted(job.probes) == [0, 1], job.console[-4000:]
    return job


def child_lines(console: str) -> list[str]:
    return sorted(
        line[line.index("descendant_worker") :] for line in console.splitlines() if "descendant_worker" in line
    )


def wait(rx: OtlpReceiver, what: str, condition: Any, job: Finished) -> None:
    if not rx.wait_for(condition, timeout=WAIT, interval=0.2):
        got = collections.Counter(
            (r["scope"], r["event_name"], r["resource"].get("torchelastic.rank")) for r in rx.logs()
        )
        pytest.fail(f"timed out waiting for {what}; received log records {dict(got)}\n{job.console[-3000:]}")


# ---- what the descendants imported -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["live", "down"])
def test_descendants_import_neither_torch_nor_opentelemetry(runs: Runs, kind: str) -> None:
    """``python -c`` children and spawned pool processes import nothing of torch or OpenTelemetry; DataLoader
    workers (two epochs, four processes) import torch, which they need, and nothing of OpenTelemetry. None of
    them captures its output again: they inherit the worker's mark and its capture. As under plain torchrun."""
    plain, job = finished(runs, "plain"), finished(runs, kind)
    for rank in (0, 1):
        worker = job.probes[rank]["worker"]
        assert worker["mark"] == f"{worker['pid']} {rank} 0 {job.run_id}"
        descendants = job.probes_of(rank, "subprocess") + (job.probes_of(0, "pool") if rank == 0 else [])
        assert len(descendants) == (7 if rank == 0 else 3)
        for probe in descendants:
            assert probe["modules"] == NOTHING, probe
            assert (probe["mark"], probe["captured"], probe["rank"]) == (worker["mark"], worker["captured"], str(rank))
        assert {p["ppid"] for p in job.probes_of(rank, "subprocess")} == {worker["pid"]}
    assert job.probes[0]["worker"]["captured"]  # OTLP logs: the worker's output is captured, once
    loaders = job.probes_of(0, "dataloader")
    assert len(loaders) == 8 and len({p["pid"] for p in loaders}) == 4  # a new pair of processes each epoch
    for probe in loaders:
        assert probe["modules"] == {**NOTHING, "torch": True}, probe
        assert probe["mark"] == job.probes[0]["worker"]["mark"]
    for probe in plain.probes_of(0, "subprocess") + plain.probes_of(0, "pool"):
        assert probe["modules"] == NOTHING and probe["mark"] is None


@pytest.mark.parametrize("kind", ["live", "down"])
def test_the_worker_imports_torch_only_when_its_script_does(runs: Runs, kind: str) -> None:
    """Rank 1's script imports no torch before its last step: neither does the bridge. Rank 0's imported torch for
    its DataLoader, not torch's elastic modules: the bridge did not import them either."""
    job = finished(runs, kind)
    assert job.probes[1]["worker"]["modules"]["torch"] is False
    assert job.probes[0]["worker"]["modules"]["torch"] is True
    assert job.probes[0]["worker"]["modules"]["torch_elastic_events"] is False


@pytest.mark.parametrize("kind", ["live", "down"])
def test_exit_codes_and_console_are_those_of_plain_torchrun(runs: Runs, kind: str) -> None:
    plain, job = finished(runs, "plain"), finished(runs, kind)
    assert plain.returncode == job.returncode == 0
    lines = child_lines(job.console)
    assert lines == child_lines(plain.console)
    assert len([line for line in lines if "hello from a descendant" in line]) == 6


# ---- what arrives (collector live) -------------------------------------------------------------------------------


def test_a_descendant_that_records_gets_its_workers_rank_and_trace(runs: Runs) -> None:
    """The child that calls ``torchelastic_otel.events.record(...)`` builds a pipeline of its own on first use:
    its record has the run, role and rank of its worker on the resource (its own ``process.pid``) and the attempt
    span as its trace context, like the worker's own records."""
    job = finished(runs, "live")
    rx = job.rx
    assert rx is not None
    wait(rx, "both descendants' records and the attempt span",
         lambda r: len(r.logs("descendant.recorded")) == 2 and r.spans("torchelastic.attempt"), job)  # fmt: skip
    attempts = [s for s in rx.spans("torchelastic.attempt") if "torchelastic.rank" not in s["resource"]]
    assert len(attempts) == 1
    attempt = attempts[0]
    for record in rx.logs("descendant.recorded"):
        rank = record["resource"]["torchelastic.rank"]
        child = job.probes_of(rank, "record")[0]
        assert record["resource"]["process.pid"] == child["pid"] == record["attributes"]["torchelastic.child_pid"]
        assert child["ppid"] == job.probes[rank]["worker"]["pid"]
        assert record["resource"]["torchelastic.run_id"] == job.run_id
        assert record["resource"]["torchelastic.restart_count"] == 0
        assert record["resource"]["torchelastic.process.kind"] == "worker"
        assert (record["trace_id"], record["span_id"]) == (attempt["trace_id"], attempt["span_id"])
    assert sorted(r["resource"]["torchelastic.rank"] for r in rx.logs("descendant.recorded")) == [0, 1]


def test_a_descendants_output_is_its_workers(runs: Runs) -> None:
    """What a ``python -c`` child prints goes through the fds it inherited: its worker's capture makes it a record
    of that worker (the worker's rank, the worker's records process), never one of its own."""
    job = finished(runs, "live")
    rx = job.rx
    assert rx is not None

    def lines(r: OtlpReceiver) -> list[dict[str, Any]]:
        return [x for x in r.logs() if x["scope"] == OUTPUT_SCOPE and "hello from a descendant" in str(x["body"])]

    wait(rx, "the six descendant lines", lambda r: len(lines(r)) >= 6, job)
    got = lines(rx)
    assert len(got) == 6
    for record in got:
        rank = record["resource"]["torchelastic.rank"]
        assert record["body"].startswith(f"descendant_worker rank {rank} child ")
        assert record["resource"]["process.parent_pid"] == job.probes[rank]["worker"]["pid"]
        assert record["attributes"] == {"log.iostream": "stdout"}


# ---- the parts, in one process -----------------------------------------------------------------------------------

ROLE_CASES = [
    # (RANK, run id, restart count, mark given this process's pid, expected role)
    (None, None, None, None, "other"),
    ("0", "run", "0", None, "worker"),
    ("0", "run", "0", "{pid} 0 0 run", "worker"),  # the worker exec'd itself
    ("0", "run", "0", "{other} 0 0 run", "descendant"),
    ("0", "run", "0", "{other}", "descendant"),  # marked by an elastic_launch worker before torch set RANK
    ("1", "run", "0", "{other} 0 0 run", "worker"),  # a torchrun job started from inside a worker
    ("0", "inner", "0", "{other} 0 0 run", "worker"),
    ("0", "run", "1", "{other} 0 0 run", "worker"),
]


@pytest.mark.parametrize("rank, run_id, restart, mark, expected", ROLE_CASES)
def test_role_from_the_environment(monkeypatch: pytest.MonkeyPatch, rank: str | None, run_id: str | None,
                                   restart: str | None, mark: str | None, expected: str) -> None:  # fmt: skip
    """Which process is the worker (``worker_env``'s docstring): the worker, its exec'd self and the workers of a
    job nested in it are workers; what the worker starts is a descendant; without torchrun's variables, neither."""
    import os

    from torchelastic_otel._torch import worker_env

    for var, value in {"RANK": rank, "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": restart,
                       worker_env.WORKER_ENV: mark}.items():  # fmt: skip
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value.format(pid=os.getpid(), other=os.getpid() + 1))
    assert worker_env.role() == expected
    assert worker_env.is_torchrun_worker() is (expected == "worker")


def test_claim_marks_the_first_process_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from torchelastic_otel._torch import worker_env

    monkeypatch.setattr(worker_env._process, "claimed", None)
    monkeypatch.delenv(worker_env.WORKER_ENV, raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "my run")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert worker_env.claim() == "worker" and worker_env.claimed() == "worker"
    assert os.environ[worker_env.WORKER_ENV] == f"{os.getpid()} 3 2 my run"
    monkeypatch.setenv(worker_env.WORKER_ENV, f"{os.getpid() + 1} 3 2 my run")
    assert worker_env.claim() == "descendant"
    assert os.environ[worker_env.WORKER_ENV] == f"{os.getpid() + 1} 3 2 my run"  # a descendant leaves it
    for var in ("RANK", "TORCHELASTIC_RUN_ID", worker_env.WORKER_ENV):
        monkeypatch.delenv(var)
    assert worker_env.claim() == "other" and os.environ[worker_env.WORKER_ENV] == str(os.getpid())


_HOOKED = """
import sys
FLAG = "ran"
sys.modules[__name__].order = getattr(sys, "_hook_order", []) + ["module"]
"""


def test_a_callback_runs_once_the_module_has_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``imports.when_imported``: the callback runs after the module's code, in the importing thread, once; the
    module keeps its own loader (its source is readable); the finder leaves ``sys.meta_path`` once idle; a module
    imported already gets the callback at once; a cancelled callback never runs."""
    import inspect

    from torchelastic_otel._torch import imports

    package = tmp_path / "hookpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "target.py").write_text(_HOOKED)
    (package / "other.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[tuple[str, bool]] = []
    imports.when_imported("hookpkg.target", lambda m: seen.append((m.__name__, getattr(m, "FLAG", None) == "ran")))
    cancelled: list[object] = []

    def never(module: object) -> None:
        cancelled.append(module)

    imports.when_imported("hookpkg.other", never)
    imports.cancel("hookpkg.other", never)
    assert imports.pending() == ["hookpkg.target"]
    import hookpkg.other
    import hookpkg.target

    assert seen == [("hookpkg.target", True)] and cancelled == []
    assert type(hookpkg.target.__loader__).__name__ == "SourceFileLoader"
    assert hookpkg.target.__spec__.loader is hookpkg.target.__loader__
    assert "FLAG" in inspect.getsource(hookpkg.target)
    assert imports.pending() == [] and imports._FINDER not in sys.meta_path
    imports.when_imported("hookpkg.target", lambda m: seen.append(("again", True)))
    assert seen[-1] == ("again", True)
    for name in ("hookpkg.target", "hookpkg.other", "hookpkg"):
        sys.modules.pop(name, None)


def test_a_failing_callback_never_fails_the_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchelastic_otel import _selftelemetry as selftelemetry
    from torchelastic_otel._torch import imports

    (tmp_path / "hooked_failing.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = selftelemetry.snapshot().get((selftelemetry.DROPPED, "all", "import_hook_error"), 0)

    def broken(module: object) -> None:
        raise RuntimeError("callback bug")

    imports.when_imported("hooked_failing", broken)
    import hooked_failing

    assert hooked_failing.VALUE == 42
    assert selftelemetry.snapshot().get((selftelemetry.DROPPED, "all", "import_hook_error"), 0) == before + 1
    sys.modules.pop("hooked_failing", None)


_LIGHT_CHILD = r"""
import json, os, sys
out = {"at_start": sorted(m for m in ("torch", "opentelemetry.sdk", "torchelastic_otel.pipeline") if m in sys.modules)}
from torch.distributed.elastic.metrics import api as torch_metrics
from torch.distributed.elastic.events import handlers as torch_handlers
add_value = torch_metrics.MetricStream.add_value
out["light_bridged"] = [getattr(add_value, "__torchelastic_otel__", False), "otel" in torch_handlers._log_handlers]
from torchelastic_otel import _compat
from torchelastic_otel.events._otel import OtelLoggingHandler

def otel_handlers():
    return sum(isinstance(h, OtelLoggingHandler) for h in _compat.torch_event_logger("null").handlers)

out["light_handlers"] = otel_handlers()
import torchelastic_otel
out["installed"] = torchelastic_otel.install(propagate_to_workers=False)
wrapped = torch_metrics.MetricStream.add_value
out["bridged_once"] = [getattr(wrapped, "__torchelastic_otel__", False) and wrapped is not add_value, otel_handlers()]
torchelastic_otel.uninstall()
out["restored"] = [not getattr(torch_metrics.MetricStream.add_value, "__torchelastic_otel__", False), otel_handlers()]
print(json.dumps(out))
"""


def test_a_descendant_that_imports_torchs_modules_gets_them_bridged_then_install_bridges_once() -> None:
    """A descendant (the mark names another process of its rank) that imports torch's metrics and events modules
    gets them bridged by its start-up hooks (nothing imported before that); an explicit ``install()`` afterwards
    undoes that first and bridges them once; ``uninstall()`` leaves torch as it was."""
    import os

    from torchelastic_otel._install import AUTO_INSTALL_ENV, BOOTSTRAP_DIR

    env = clean_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", TORCHELASTIC_RUN_ID="light",
                    TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_OTEL_WORKER=f"{os.getpid()} 0 0 light",
                    OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
                    **{AUTO_INSTALL_ENV: "1"})  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, env["PYTHONPATH"]])
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _LIGHT_CHILD], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"at_start": [], "light_bridged": [True, True], "light_handlers": 1, "installed": True,
                   "bridged_once": [True, 1], "restored": [True, 0]}  # fmt: skip
