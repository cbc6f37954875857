"""A rank that dies of a CUDA out-of-memory error: the allocator's figures for its device, from the worker's
excepthook to the report's root cause.

The worker side runs in this process: the bridge's real excepthook (``hooks``), writing the real failure file
(``root_cause.write_failure``) and the record kept for the agent (``final_words``). The machine has no GPU, so a fake
``torch.cuda`` module stands in ``sys.modules`` at that boundary (its ``OutOfMemoryError`` class and the allocator's
functions, scripted); the bridge takes the class from there and never imports torch. The agent side is
``root_cause.find`` over that file (torch's ``ProcessFailure`` fields, as the agent hands them), and the report reads
the resulting ``torchelastic.root_cause`` record from OTLP JSON Lines files written by the real file exporter
(``tests/support/report_files.py``), or, for the root cause chosen from the failures, the worker's own exception
record. Bad figures in the file or the records are left out and counted, never raised.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._torch import root_cause
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import hooks
from torchelastic_otel._torch.worker import memory as worker_memory
from torchelastic_otel.report import html, memory, model, otlpjson, terminal, training
from torchelastic_otel.report.records import LogRecord, Proc, Telemetry

GIB = 1 << 30
MIB = 1 << 20
T0 = 1_800_000_000 * 1_000_000_000
OOM_MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.19 GiB of which "
               "1.06 GiB is free. Of the allocated memory 75.50 GiB is allocated by PyTorch")  # fmt: skip


class FakeCuda(types.ModuleType):
    """Stands in for ``torch.cuda`` (no GPU here): the class torch raises on an OOM and the allocator's figures of
    two devices; ``broken`` names the functions that raise; ``calls`` what was called."""

    class OutOfMemoryError(RuntimeError):
        pass

    def __init__(self) -> None:
        super().__init__("torch.cuda")
        self.initialised = True
        self.allocated = {0: 1 * GIB, 1: 75 * GIB + 512 * MIB}
        self.reserved = {0: 2 * GIB, 1: 78 * GIB}
        self.peak = {0: 1 * GIB, 1: 77 * GIB}
        self.total = {0: 80 * GIB, 1: 80 * GIB}
        self.current = 0
        self.broken: set[str] = set()
        self.calls: list[str] = []

    def _read(self, name: str, table: dict[int, int], device: int) -> int:
        self.calls.append(name)
        if name in self.broken:
            raise RuntimeError(f"CUDA error: {name} failed")
        return table[device]

    def is_initialized(self) -> bool:
        self.calls.append("is_initialized")
        return self.initialised

    def device_count(self) -> int:
        return len(self.total)

    def current_device(self) -> int:
        self.calls.append("current_device")
        return self.current

    def memory_allocated(self, device: int) -> int:
        return self._read("memory_allocated", self.allocated, device)

    def memory_reserved(self, device: int) -> int:
        return self._read("memory_reserved", self.reserved, device)

    def max_memory_allocated(self, device: int) -> int:
        return self._read("max_memory_allocated", self.peak, device)

    def get_device_properties(self, device: int) -> Any:
        return types.SimpleNamespace(total_memory=self._read("get_device_properties", self.total, device))


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    fake = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch.cuda", fake)
    try:
        yield fake
    finally:
        worker_memory._state.totals.clear()


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


EXPECTED = {"device": 1, "allocated": 75 * GIB + 512 * MIB, "reserved": 78 * GIB, "peak": 77 * GIB, "total": 80 * GIB}


# ---- the worker -------------------------------------------------------------------------------------------------


def test_the_figures_of_an_oom_are_its_device_s(cuda: FakeCuda) -> None:
    assert worker_memory.oom_figures(cuda.OutOfMemoryError(OOM_MESSAGE)) == EXPECTED  # "GPU 1" in the message
    assert "current_device" not in cuda.calls
    cuda.current = 0
    assert worker_memory.oom_figures(cuda.OutOfMemoryError("CUDA out of memory."))["device"] == 0  # type: ignore[index]


def test_no_figures_for_another_exception_nor_without_cuda(cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    assert worker_memory.oom_figures(RuntimeError(OOM_MESSAGE)) is None  # the class decides, not the words
    assert worker_memory.oom_figures(ValueError("x")) is None
    cuda.initialised = False
    cuda.calls.clear()
    assert worker_memory.oom_figures(cuda.OutOfMemoryError(OOM_MESSAGE)) is None
    assert cuda.calls == ["is_initialized"]  # nothing else asked of an allocator that was never set up
    monkeypatch.delitem(sys.modules, "torch.cuda")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert worker_memory.oom_figures(cuda.OutOfMemoryError(OOM_MESSAGE)) is None
    assert "torch" not in sys.modules and "torch.cuda" not in sys.modules  # never imported


def test_failing_reads_leave_their_figure_out_never_raise(cuda: FakeCuda) -> None:
    cuda.broken = {"memory_reserved", "get_device_properties"}
    figures = worker_memory.oom_figures(cuda.OutOfMemoryError(OOM_MESSAGE))
    assert figures == {"device": 1, "allocated": 75 * GIB + 512 * MIB, "peak": 77 * GIB}
    cuda.broken = {"is_initialized"}

    def broken() -> bool:
        raise RuntimeError("driver gone")

    cuda.is_initialized = broken  # type: ignore[method-assign]
    assert worker_memory.oom_figures(cuda.OutOfMemoryError(OOM_MESSAGE)) is None


def test_the_excepthook_writes_the_figures_to_the_failure_file_and_the_exception_record(
    cuda: FakeCuda, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bridge's excepthook, as a dying rank runs it: the failure file the agent ranks by, and the exception
    record kept for the agent (the one the worker exports), both with the device's figures."""
    monkeypatch.setenv(root_cause.FAILURE_DIR_ENV, str(tmp_path))
    seen: list[type[BaseException]] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, exc, tb: seen.append(kind))  # the interpreter's, called last
    patches = Patches()
    hooks._install_excepthook(patches)
    try:
        exc = _raised(cuda.OutOfMemoryError(OOM_MESSAGE))
        sys.excepthook(type(exc), exc, exc.__traceback__)
    finally:
        patches.restore()
    assert seen == [cuda.OutOfMemoryError]
    import os

    failure = json.loads((tmp_path / f"{os.getpid()}.json").read_text())
    assert failure["type"] == "FakeCuda.OutOfMemoryError" and failure["message"] == OOM_MESSAGE
    assert failure["cuda_memory"] == EXPECTED
    (kept,) = [json.loads(p.read_text()) for p in tmp_path.glob("final-*.json")]
    assert kept["event_name"] == names.WORKER_EXCEPTION
    attrs = kept["attributes"]
    assert {key: attrs[key] for key in worker_memory.OOM_ATTRIBUTES.values()} == {
        names.CUDA_MEMORY_DEVICE: 1, names.CUDA_MEMORY_ALLOCATED: 75 * GIB + 512 * MIB,
        names.CUDA_MEMORY_RESERVED: 78 * GIB, names.CUDA_MEMORY_PEAK: 77 * GIB, names.CUDA_MEMORY_TOTAL: 80 * GIB,
    }  # fmt: skip


def test_another_exception_writes_no_figures(cuda: FakeCuda, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(root_cause.FAILURE_DIR_ENV, str(tmp_path))
    exc = _raised(ValueError("NaN loss"))
    root_cause.write_failure(type(exc), exc, exc.__traceback__, worker_memory.oom_figures(exc))
    (written,) = tmp_path.glob("*.json")
    assert "cuda_memory" not in json.loads(written.read_text())


# ---- the agent --------------------------------------------------------------------------------------------------


def _failure(pid: int) -> Any:
    """What torch's agent hands over for a failed rank (``ProcessFailure``'s fields), without torch's error file."""
    return types.SimpleNamespace(pid=pid, exitcode=1, local_rank=1, error_file="<N/A>", timestamp=0,
                                 error_file_data={})  # fmt: skip


def _write(directory: Path, pid: int, cuda_memory: Any) -> None:
    data = {
        "time_unix_nano": T0,
        "pid": pid,
        "type": "OutOfMemoryError",
        "message": OOM_MESSAGE,
        "stacktrace": "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory.\n",
        "cuda_memory": cuda_memory,
    }
    (directory / f"{pid}.json").write_text(json.dumps(data))


def test_the_agent_turns_the_figures_into_the_root_cause_s_attributes(tmp_path: Path) -> None:
    _write(tmp_path, 4242, EXPECTED)
    cause = root_cause.find({1: _failure(4242)}, [0], str(tmp_path))
    assert cause is not None and cause.cuda_memory == EXPECTED and cause.reason == "OutOfMemoryError"
    attrs = root_cause.attributes(cause)
    assert {k: v for k, v in attrs.items() if k.startswith(names.ROOT_CAUSE_PREFIX + "cuda_memory.")} == {
        names.ROOT_CAUSE_CUDA_DEVICE: 1, names.ROOT_CAUSE_CUDA_ALLOCATED: 75 * GIB + 512 * MIB,
        names.ROOT_CAUSE_CUDA_RESERVED: 78 * GIB, names.ROOT_CAUSE_CUDA_PEAK: 77 * GIB,
        names.ROOT_CAUSE_CUDA_TOTAL: 80 * GIB,
    }  # fmt: skip
    _write(tmp_path, 4243, None)
    plain = root_cause.find({1: _failure(4243)}, [0], str(tmp_path))
    assert plain is not None and plain.cuda_memory is None
    assert not any(k.startswith(names.ROOT_CAUSE_PREFIX + "cuda_memory.") for k in root_cause.attributes(plain))


@pytest.mark.parametrize(
    ("raw", "kept", "invalid"),
    [
        ({"device": 0, "allocated": -5, "reserved": "lots", "peak": 1.5, "total": True, "nonsense": 3},
         {"device": 0}, 5),
        ({"device": "zero", "allocated": 7}, None, 1),
        ({"device": 2, "allocated": 2.0**70, "total": 80.0 * GIB}, {"device": 2, "total": 80 * GIB}, 1),
        ("not a mapping", None, 1),
        ([1, 2], None, 1),
    ],
)  # fmt: skip
def test_bad_figures_in_the_file_are_left_out_and_counted(
    tmp_path: Path, raw: Any, kept: dict[str, int] | None, invalid: int
) -> None:
    _write(tmp_path, 4244, raw)
    key = (selftelemetry.SANITIZED, "logs", "cuda_memory_invalid")
    before = selftelemetry.snapshot(selftelemetry.SANITIZED).get(key, 0)
    cause = root_cause.find({1: _failure(4244)}, [], str(tmp_path))
    assert cause is not None and cause.cuda_memory == kept
    assert cause.exception_type == "OutOfMemoryError"  # the rest of the file is read as ever
    assert selftelemetry.snapshot(selftelemetry.SANITIZED).get(key, 0) == before + invalid


# ---- the report -------------------------------------------------------------------------------------------------


def _root_cause_files(directory: Path, attrs: dict[str, Any]) -> None:
    """A job whose attempt 0 failed (rank 1), as the real exporter writes it, and the agent's root-cause record."""
    from opentelemetry._logs import SeverityNumber

    from tests.support.report_files import MS, Process, Shape, write_job

    facts = write_job(directory, Shape())
    agent = Process(directory, "agent-verdict", {"torchelastic.run_id": facts.run_id,
                                                 "torchelastic.process.kind": "agent", "host.name": "node0",
                                                 "process.pid": 100})  # fmt: skip
    agent.record(names.ROOT_CAUSE, facts.start + 3000 * MS, SeverityNumber.ERROR, **{
        **attrs, names.RESTART_COUNT: 0, names.RUN_ID: facts.run_id, "torchelastic.state": "FAILED"})  # fmt: skip
    agent.close()


def test_the_report_shows_the_root_cause_s_figures(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.json.file")
    failures = tmp_path / "failures"
    failures.mkdir()
    _write(failures, 4242, EXPECTED)
    cause = root_cause.find({1: _failure(4242)}, [0], str(failures))
    assert cause is not None
    _root_cause_files(tmp_path / "files", {**root_cause.attributes(cause), "host.name": "node0"})
    tel = otlpjson.read([tmp_path / "files"])
    jobs = model.build(tel)
    (found,) = jobs[0].root_causes
    assert found.source == "record" and found.cuda_memory == model.CudaMemory(1, 75 * GIB + 512 * MIB, 78 * GIB,
                                                                               77 * GIB, 80 * GIB)  # fmt: skip
    line = "cuda:1 when it died: 75.5 GiB allocated, 78.0 GiB reserved, peak 77.0 GiB, of 80.0 GiB"
    assert memory.oom_text(found.cuda_memory) == line
    text = terminal.render(tel, jobs)
    assert "  " + line in text.split("ROOT CAUSE", 1)[1]
    page = html.render(tel, jobs)
    assert f'<p class=oom data-device="1">{line}</p>' in page
    (run,) = training.summary(jobs)["runs"]
    assert run["root_cause"]["cuda_memory"] == {"device": 1, "allocated_bytes": 75 * GIB + 512 * MIB,
                                                "reserved_bytes": 78 * GIB, "peak_bytes": 77 * GIB,
                                                "total_bytes": 80 * GIB, "invalid": 0}  # fmt: skip
    assert run["root_cause"]["exception_type"] == "OutOfMemoryError"


def test_a_root_cause_without_figures_has_null_cuda_memory(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.json.file")
    from tests.support.report_files import write_job

    write_job(tmp_path / "plain")
    tel = otlpjson.read([tmp_path / "plain"])
    jobs = model.build(tel)
    (run,) = training.summary(jobs)["runs"]
    assert run["root_cause"]["cuda_memory"] is None and run["memory_creep"] == []
    assert "when it died" not in terminal.render(tel, jobs) and "class=oom" not in html.render(tel, jobs)


def _worker_proc(rank: int) -> Proc:
    return Proc("worker", "node0", 1000 + rank, "run", rank, rank, 0, "torchelastic")


def _log(name: str, time: int, proc: Proc, **attrs: Any) -> LogRecord:
    return LogRecord(time, 17, "ERROR", name, name, attrs, "", "", proc)


def _derived_job(figures: dict[str, Any]) -> model.Job:
    """No root-cause record: the agent's failure records and rank 1's own exception record, with ``figures``."""
    agent = Proc("agent", "node0", 100, "run", None, None, None, "torchelastic")
    logs = [
        _log(names.WORKER_EXCEPTION, T0, _worker_proc(1), **{"exception.type": "OutOfMemoryError",
                                                             "exception.message": OOM_MESSAGE, **figures}),
        _log(names.WORKER_FAILURE, T0 + 10**9, agent, **{names.GLOBAL_RANK: "1", names.EXIT_CODE: "1"}),
        _log(names.WORKER_FAILURE, T0 + 10**9, agent, **{names.GLOBAL_RANK: "0", names.EXIT_CODE: "-15",
                                                         names.SIGNAL: "SIGTERM"}),
    ]  # fmt: skip
    (job,) = model.build(Telemetry(logs=logs))
    return job


def test_a_root_cause_chosen_from_the_failures_takes_the_rank_s_own_figures() -> None:
    job = _derived_job({names.CUDA_MEMORY_DEVICE: 1, names.CUDA_MEMORY_ALLOCATED: str(75 * GIB),
                        names.CUDA_MEMORY_TOTAL: 80 * GIB})  # fmt: skip
    (cause,) = job.root_causes
    assert cause.source == "derived" and cause.rank == 1
    assert cause.cuda_memory == model.CudaMemory(1, allocated=75 * GIB, total=80 * GIB)
    assert memory.oom_text(cause.cuda_memory) == "cuda:1 when it died: 75.0 GiB allocated, of 80.0 GiB"


def test_bad_figures_in_a_record_are_left_out_and_counted() -> None:
    job = _derived_job({names.CUDA_MEMORY_DEVICE: 0, names.CUDA_MEMORY_ALLOCATED: -1, names.CUDA_MEMORY_RESERVED: "x",
                        names.CUDA_MEMORY_PEAK: float("nan"), names.CUDA_MEMORY_TOTAL: [1, 2]})  # fmt: skip
    (cause,) = job.root_causes
    assert cause.cuda_memory == model.CudaMemory(0, invalid=4)
    assert (
        memory.oom_text(cause.cuda_memory) == "cuda:0 when it died: no allocator figures (4 unreadable values left out)"
    )
    assert memory.cuda_memory_json(cause.cuda_memory)["invalid"] == 4  # type: ignore[index]
    assert _derived_job({names.CUDA_MEMORY_DEVICE: True}).root_causes[0].cuda_memory is None  # no device: none
