"""Checkpoint spans and metrics (``_torch.worker.checkpoints``), in this process.

torch's own functions are wrapped for real (``install`` on a ``Patches``, undone after each test): ``torch.save`` /
``torch.load`` to files in ``tmp_path`` and ``torch.distributed.checkpoint`` with ``no_dist=True`` (one process, no
process group). The SDK is real too (in-memory exporters, ``conftest.otel``). The job that checks it across ranks in
the attempt's trace is ``tests/jobs/test_checkpoints.py``.
"""

from __future__ import annotations

import inspect
import io
import os
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import anatomy, checkpoints, steps

torch = pytest.importorskip("torch")
from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

from tests.support.lazy import lazy  # noqa: E402

dcp = lazy("torch.distributed.checkpoint")
STATUS_ERROR = "ERROR"


def _dcp_functions() -> dict[Any, tuple[str, ...]]:
    """DCP's modules and the functions of each that the bridge wraps."""
    return {
        dcp.module(): ("save", "async_save", "save_state_dict", "load", "load_state_dict"),
        dcp.state_dict_saver: ("save", "async_save", "save_state_dict"),
        dcp.state_dict_loader: ("load", "load_state_dict"),
    }


@pytest.fixture
def installed(otel: Any, paused_drainer: Any) -> Iterator[Any]:
    """The checkpoint wrappers installed (torch and DCP are imported: at once), the step clock new, the optimizer
    step hook registered as a worker's; all undone after."""
    dcp.module()
    steps.reset()
    handle = register_optimizer_step_post_hook(steps.optimizer_hook)
    patches = Patches()
    checkpoints.install(patches)
    try:
        yield otel
    finally:
        patches.restore()
        handle.remove()
        steps.reset()


@pytest.fixture
def heard(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """What the anatomy of a step is told (its functions are stubs the lead fills: the calls are recorded)."""
    calls: list[tuple[str, ...]] = []
    for function in ("checkpoint_enter", "checkpoint_exit", "checkpoint_committed"):
        monkeypatch.setattr(anatomy, function, lambda *args, _f=function: calls.append((_f, *args)))
    return calls


def _model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Linear(8, 4)


def _train(model: Any, n: int) -> None:
    """``n`` steps of the model's one optimizer (a second optimizer would not be the step clock at once)."""
    optimizer = model.__dict__.setdefault("optimizer", torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(n):
        optimizer.zero_grad()
        model(torch.ones(2, 8)).sum().backward()
        optimizer.step()


def _spans(otel: Any, name: str | None = None) -> list[Any]:
    """The spans exported so far (the checkpoint calls are made spans by the drainer: drained here first)."""
    checkpoints.drain()
    return [s for s in otel.spans.get_finished_spans() if name is None or s.name == name]


def _durations(otel: Any) -> dict[str, int]:
    return {attrs[names.OPERATION]: p.count for attrs, p in otel.metric_points(names.CHECKPOINT_DURATION)}


def _checkpoint_step(otel: Any) -> list[int]:
    return [p.value for _, p in otel.metric_points(names.WORKER_CHECKPOINT_STEP)]


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.fixture(autouse=True)
def _dcp_quietly() -> Iterator[None]:
    """DCP warns that it saves in a single process (``no_dist``); the warning is not what is tested."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


# ---- torch.save / torch.load ---------------------------------------------------------------------------------------


def test_torch_save_to_a_path_is_one_span_with_the_file_size_and_the_step(installed: Any, tmp_path: Path) -> None:
    model = _model()
    _train(model, 3)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    (span,) = _spans(installed)
    assert span.name == names.CHECKPOINT_SAVE
    assert span.attributes[names.CHECKPOINT_API] == "torch.save"
    assert span.attributes[names.CHECKPOINT_BYTES] == path.stat().st_size > 0
    assert span.attributes[names.CHECKPOINT_STEP] == 3
    assert span.attributes[names.CHECKPOINT_ASYNC] is False
    assert span.status.status_code.name != STATUS_ERROR
    assert span.end_time >= span.start_time
    assert _durations(installed) == {"save": 1}
    assert _checkpoint_step(installed) == [3]

    _train(model, 2)
    loaded = torch.load(str(path), weights_only=True)
    assert torch.equal(loaded["weight"], _model().state_dict()["weight"]) is False  # trained weights came back
    load = _spans(installed, names.CHECKPOINT_LOAD)[0]
    assert load.attributes[names.CHECKPOINT_API] == "torch.load"
    assert load.attributes[names.CHECKPOINT_BYTES] == path.stat().st_size
    assert load.attributes[names.CHECKPOINT_STEP] == 5
    assert names.CHECKPOINT_ASYNC not in load.attributes
    assert _durations(installed) == {"save": 1, "load": 1}
    assert _checkpoint_step(installed) == [3]  # a load is no save


def test_torch_save_to_a_named_file_object_counts_the_bytes_written(installed: Any, tmp_path: Path) -> None:
    path = tmp_path / "opt.pt"
    with open(path, "wb") as fh:
        fh.write(b"header")
        torch.save({"x": torch.arange(100)}, fh)
    (span,) = _spans(installed)
    assert span.attributes[names.CHECKPOINT_BYTES] == path.stat().st_size - len(b"header")
    with open(path, "rb") as fh:
        fh.seek(len(b"header"))
        assert torch.equal(torch.load(fh)["x"], torch.arange(100))
    assert [s.name for s in _spans(installed)] == [names.CHECKPOINT_SAVE, names.CHECKPOINT_LOAD]


def test_an_in_memory_buffer_is_no_checkpoint(installed: Any, heard: list[tuple[str, ...]]) -> None:
    buffer = io.BytesIO()
    torch.save({"x": torch.ones(3)}, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer)["x"], torch.ones(3))
    assert _spans(installed) == [] and heard == []
    assert _durations(installed) == {}


def test_nested_saves_count_once(installed: Any, tmp_path: Path, heard: list[tuple[str, ...]]) -> None:
    """A ``torch.save`` to a file inside another one (an object whose pickling saves a side file) is one save."""

    class SavesASideFile:
        def __reduce__(self) -> Any:
            torch.save(torch.zeros(2), tmp_path / "side.pt")
            return (list, ())

    torch.save({"nested": SavesASideFile()}, tmp_path / "outer.pt")
    assert (tmp_path / "side.pt").exists()
    (span,) = _spans(installed)
    assert span.attributes[names.CHECKPOINT_BYTES] == (tmp_path / "outer.pt").stat().st_size
    assert heard == [("checkpoint_enter", "save"), ("checkpoint_exit", "save"), ("checkpoint_committed",)]


def test_an_exception_is_raised_unchanged_and_marks_the_span(
    installed: Any, tmp_path: Path, heard: list[tuple[str, ...]]
) -> None:
    raised = ValueError("cannot pickle this")

    class Unpicklable:
        def __reduce__(self) -> Any:
            raise raised

    with pytest.raises(ValueError) as info:
        torch.save(Unpicklable(), tmp_path / "bad.pt")
    assert info.value is raised
    (span,) = _spans(installed)
    assert span.status.status_code.name == STATUS_ERROR
    assert "ValueError" in (span.status.description or "")
    assert [e.name for e in span.events] == ["exception"]
    assert names.CHECKPOINT_BYTES not in span.attributes
    ((attributes, point),) = installed.metric_points(names.CHECKPOINT_DURATION)
    assert attributes == {names.OPERATION: "save", "error.type": "ValueError"} and point.count == 1
    assert _checkpoint_step(installed) == []  # not a completed save
    assert heard == [("checkpoint_enter", "save"), ("checkpoint_exit", "save")]  # not committed

    with pytest.raises(FileNotFoundError):
        torch.load(tmp_path / "missing.pt")
    assert _spans(installed)[-1].status.status_code.name == STATUS_ERROR


def test_the_bridges_own_failure_never_reaches_the_call(
    installed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("the bridge broke")

    monkeypatch.setattr(checkpoints, "_emit", broken)
    monkeypatch.setattr(checkpoints.worker_env, "span_parent", broken)
    monkeypatch.setattr(anatomy, "checkpoint_enter", broken)
    before = selftelemetry.total(selftelemetry.DROPPED, reason="checkpoint_error")
    torch.save({"x": torch.ones(1)}, tmp_path / "a.pt")
    assert torch.load(tmp_path / "a.pt")["x"].item() == 1.0
    assert selftelemetry.total(selftelemetry.DROPPED, reason="checkpoint_error") >= before + 4
    assert _spans(installed) == []


def test_the_span_joins_the_agents_attempt(installed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace_id, attempt_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    monkeypatch.setenv("TRACEPARENT", f"00-{trace_id}-{attempt_id}-01")
    torch.save({"x": 1}, tmp_path / "a.pt")
    (span,) = _spans(installed)
    assert f"{span.context.trace_id:032x}" == trace_id
    assert f"{span.parent.span_id:016x}" == attempt_id

    with installed.tracer.start_as_current_span("user.checkpoint") as mine:  # another trace: the attempt's wins
        torch.save({"x": 1}, tmp_path / "b.pt")
    assert f"{_spans(installed, names.CHECKPOINT_SAVE)[-1].parent.span_id:016x}" == attempt_id
    assert mine.get_span_context().trace_id != int(trace_id, 16)


# ---- torch.distributed.checkpoint ---------------------------------------------------------------------------------


def test_dcp_save_and_load_are_one_span_each(installed: Any, tmp_path: Path, heard: list[tuple[str, ...]]) -> None:
    """DCP writes each tensor with ``torch.save`` to its files: inside the save, not a checkpoint of its own."""
    model = _model()
    _train(model, 4)
    directory = tmp_path / "step4"
    dcp.save({"model": model.state_dict()}, checkpoint_id=directory, no_dist=True)
    restored = {"model": _model().state_dict()}
    dcp.state_dict_loader.load(restored, checkpoint_id=str(directory), no_dist=True)
    assert torch.equal(restored["model"]["weight"], model.state_dict()["weight"])
    save, load = _spans(installed)
    assert (save.name, load.name) == (names.CHECKPOINT_SAVE, names.CHECKPOINT_LOAD)
    assert save.attributes[names.CHECKPOINT_API] == "torch.distributed.checkpoint.save"
    assert load.attributes[names.CHECKPOINT_API] == "torch.distributed.checkpoint.load"
    assert save.attributes[names.CHECKPOINT_STEP] == load.attributes[names.CHECKPOINT_STEP] == 4
    assert save.attributes[names.CHECKPOINT_BYTES] == load.attributes[names.CHECKPOINT_BYTES] == _dir_bytes(directory)
    assert heard == [
        ("checkpoint_enter", "save"),
        ("checkpoint_exit", "save"),
        ("checkpoint_committed",),
        ("checkpoint_enter", "load"),
        ("checkpoint_exit", "load"),
    ]
    assert _checkpoint_step(installed) == [4]


def test_dcp_writer_threads_are_inside_the_save(installed: Any, tmp_path: Path) -> None:
    """``FileSystemWriter(thread_count=3)`` calls ``torch.save`` to real files from its own threads."""
    tensors = {f"t{i}": torch.full((64,), float(i)) for i in range(6)}
    writer = dcp.FileSystemWriter(tmp_path / "ckpt", thread_count=3)
    dcp.save(tensors, storage_writer=writer, no_dist=True)
    (span,) = _spans(installed)
    assert span.attributes[names.CHECKPOINT_BYTES] == _dir_bytes(tmp_path / "ckpt")
    assert len(list((tmp_path / "ckpt").glob("*.distcp"))) == 3  # three writer threads did write


def test_async_save_is_committed_when_its_future_completes(
    installed: Any, tmp_path: Path, heard: list[tuple[str, ...]]
) -> None:
    model = _model()
    _train(model, 2)
    result = dcp.async_save({"model": model.state_dict()}, checkpoint_id=tmp_path / "async", no_dist=True)
    getattr(result, "upload_completion", result).result(timeout=60)
    (span,) = _spans(installed)  # the background save is inside it
    assert span.attributes[names.CHECKPOINT_API] == "torch.distributed.checkpoint.async_save"
    assert span.attributes[names.CHECKPOINT_ASYNC] is True
    assert span.attributes[names.CHECKPOINT_STEP] == 2
    assert heard[:2] == [("checkpoint_enter", "save"), ("checkpoint_exit", "save")]
    assert _wait(lambda: ("checkpoint_committed",) in heard)
    assert _wait(lambda: _checkpoint_step(installed) == [2])
    assert (tmp_path / "async" / ".metadata").exists()


def _wait(predicate: Any, timeout: float = 10.0) -> bool:
    from tests.support.waiting import wait_for

    return bool(wait_for(predicate, timeout=timeout))


# ---- keeping torch as it is -----------------------------------------------------------------------------------------


def test_install_wraps_with_the_same_signature_and_uninstall_restores_torch(otel: Any) -> None:
    originals = {(m, a): m.__dict__[a] for m, attributes in _dcp_functions().items() for a in attributes}
    originals.update({(torch, "save"): torch.save, (torch, "load"): torch.load})
    originals.update({(torch.serialization, "save"): torch.save, (torch.serialization, "load"): torch.load})
    patches = Patches()
    checkpoints.install(patches)
    try:
        for (module, attribute), original in originals.items():
            wrapper = module.__dict__[attribute]
            assert wrapper is not original and wrapper.__wrapped__ is original, (module, attribute)
            assert wrapper.__name__ == original.__name__ and wrapper.__doc__ == original.__doc__
            assert inspect.signature(wrapper) == inspect.signature(original)
        assert dcp.save is dcp.state_dict_saver.save  # one wrapper for both names
        assert torch.save is torch.serialization.save and torch.load is torch.serialization.load
        for function in (torch.save, torch.load, dcp.save, dcp.async_save, dcp.load):
            assert pickle.loads(pickle.dumps(function)) is function  # pickled by name (a process pool's target)
        checkpoints.install(Patches())  # a second install wraps nothing twice
        assert torch.save.__wrapped__ is originals[(torch, "save")]
    finally:
        patches.restore()
    for (module, attribute), original in originals.items():
        assert module.__dict__[attribute] is original, (module, attribute)


def test_a_module_not_imported_yet_is_wrapped_by_its_import_hook(otel: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installing imports nothing: DCP's wrappers wait for the script's own import (a post-import hook, ``imports``),
    which uninstalling cancels."""
    import sys

    from torchelastic_otel._torch import imports

    package = dcp.module()  # the package object, held while sys.modules is without it
    monkeypatch.delitem(sys.modules, checkpoints.DCP)
    patches = Patches()
    checkpoints.install(patches)
    try:
        assert checkpoints.DCP in imports.pending()
        assert not getattr(package.save, "__torchelastic_otel__", False)
        checkpoints._patch_dcp(patches, package)  # what the import hook does once the package ran
        assert package.save.__torchelastic_otel__ and package.state_dict_loader.load.__torchelastic_otel__
    finally:
        patches.restore()
    assert checkpoints.DCP not in imports.pending()
    assert not getattr(package.save, "__torchelastic_otel__", False)


def test_torch_internals_the_wrappers_rely_on() -> None:
    """Pinned: DCP's functions are defined in ``state_dict_saver`` / ``state_dict_loader`` and re-exported by the
    package (else only the package's names are wrapped, counted); ``async_save``'s background ``save`` and DCP's
    writer threads call from torch's own modules (else they would be counted as checkpoints of their own)."""
    assert dcp.save is dcp.state_dict_saver.save and dcp.load is dcp.state_dict_loader.load
    assert dcp.async_save is dcp.state_dict_saver.async_save
    executor = __import__("torch.distributed.checkpoint._async_thread_executor", fromlist=["x"])
    assert "state_dict_saver import save" in inspect.getsource(executor)
    assert callable(torch.compiler.is_compiling) and torch.compiler.is_compiling() is False
    assert os.path.basename(inspect.getfile(dcp.filesystem)) == "filesystem.py"
    assert "torch.save(" in inspect.getsource(dcp.filesystem)


def test_the_calling_thread_only_buffers_the_span_is_made_by_the_drainer(installed: Any, tmp_path: Path) -> None:
    torch.save({"x": 1}, tmp_path / "a.pt")
    assert installed.spans.get_finished_spans() == ()  # the drainer is paused: nothing was made on this thread
    assert [s.name for s in _spans(installed)] == [names.CHECKPOINT_SAVE]


def test_inside_a_compiled_region_the_call_goes_straight_to_torch(installed: Any, tmp_path: Path) -> None:
    original = torch.save.__wrapped__
    compiling = checkpoints._wrap(original, "save", "torch.save", checkpoints._torch_save_target, lambda: True)
    compiling({"x": 1}, tmp_path / "a.pt")
    assert (tmp_path / "a.pt").exists() and _spans(installed) == []
