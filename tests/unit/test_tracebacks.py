"""A traceback through the bridge's wrappers is the unwrapped call's (``_torch.tracebacks``), in this process.

Each case calls the same function twice from the same line, wrapped and not, and compares what Python prints of the
exception it raises: ``traceback.format_exception``, ``traceback.format_exc()`` (torch's ``@record`` error file),
``sys.excepthook``'s output. First the idiom itself on every kind of exception (chained by ``raise ... from`` and
by raising while handling, ``KeyboardInterrupt``, ``SystemExit``, one raised in C) and every shape of wrapper;
then every wrapper the bridge puts around a user-facing call, installed as a worker installs it, around real torch,
Hugging Face and Lightning code (unwrapped: after ``patches.restore()``). The consoles of whole ``torchrun`` jobs are
``tests/jobs/test_console.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.installed import installed
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._torch import tracebacks
from torchelastic_otel._torch.patches import Patches

torch = pytest.importorskip("torch")

BRIDGE = str(Path(tracebacks.__file__).resolve().parents[1])


def _call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return function(*args, **kwargs)  # the caller's line: the same for the wrapped call and the unwrapped one


def _raised(function: Callable[..., Any], *args: Any, **kwargs: Any) -> BaseException:
    try:
        _call(function, *args, **kwargs)
    except BaseException as exc:
        return exc
    raise AssertionError(f"{function} raised nothing")


def _printed(function: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """What Python prints of the exception ``function(*args, **kwargs)`` raises, three ways."""
    try:
        _call(function, *args, **kwargs)
    except BaseException as exc:
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            sys.__excepthook__(type(exc), exc, exc.__traceback__)
        return {
            "format_exception": traceback.format_exception(type(exc), exc, exc.__traceback__),
            "format_exc": traceback.format_exc(),
            "excepthook": stderr.getvalue(),
        }
    raise AssertionError(f"{function} raised nothing")


def _assert_same(wrapped: dict[str, Any], plain: dict[str, Any]) -> None:
    assert BRIDGE not in "".join(wrapped["format_exception"]), "".join(wrapped["format_exception"])
    assert wrapped == plain, ("".join(wrapped["format_exception"]), "".join(plain["format_exception"]))


# ---- the idiom ------------------------------------------------------------------------------------------------------


raised_inside: list[BaseException] = []


def _callee(kind: str) -> Any:
    if kind == "error":
        raise ValueError("the callee failed")
    if kind == "cause":
        try:
            raise KeyError("the first failure")
        except KeyError as first:
            raised_inside.append(first)
            raise RuntimeError("the callee failed") from first
    if kind == "context":
        try:
            raise KeyError("the first failure")
        except KeyError as first:
            raised_inside.append(first)
            raise RuntimeError("the callee failed while handling it")  # noqa: B904 (the implicit chain)
    if kind == "interrupt":
        raise KeyboardInterrupt
    if kind == "exit":
        sys.exit(3)
    if kind == "native":
        return int("not a number")  # raised in C: the callee has no frame of its own
    raise AssertionError(kind)


def _except(original: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except BaseException as exc:
            tracebacks.drop_own_frame(exc)
            raise

    return wrapper


def _except_finally(original: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except BaseException as exc:
            tracebacks.drop_own_frame(exc)
            raise
        finally:
            raised_inside.append(KeyError("the finally block ran"))

    return wrapper


@contextlib.contextmanager
def _context() -> Iterator[None]:
    try:
        yield
    finally:
        raised_inside.append(KeyError("the context exited"))


def _with_block(original: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with _context():
                return original(*args, **kwargs)
        except BaseException as exc:
            tracebacks.drop_own_frame(exc)
            raise

    return wrapper


WRAPPERS = {
    "except": _except,
    "except-finally": _except_finally,
    "with-block": _with_block,
    "nested": lambda original: _except(_except_finally(original)),
}


@pytest.mark.parametrize("kind", ["error", "cause", "context", "interrupt", "exit", "native"])
@pytest.mark.parametrize("shape", sorted(WRAPPERS))
def test_a_wrapper_re_raises_with_the_unwrapped_calls_traceback(kind: str, shape: str) -> None:
    wrapped = WRAPPERS[shape](_callee)
    _assert_same(_printed(wrapped, kind), _printed(_callee, kind))
    raised_inside.clear()
    exc = _raised(wrapped, kind)
    assert type(exc) is type(_raised(_callee, kind))
    if kind in ("cause", "context"):  # the chain is the callee's own exception, untouched
        first = raised_inside[0]
        assert (exc.__cause__ if kind == "cause" else exc.__context__) is first
        assert exc.__suppress_context__ is (kind == "cause")
        assert traceback.extract_tb(first.__traceback__)[-1].name == "_callee"


def test_an_exception_the_caller_did_not_catch_keeps_its_traceback() -> None:
    """Where the first entry is not the calling frame's (the call is not in a wrapper's ``except`` block), nothing
    is taken off."""
    exc = _raised(_callee, "error")
    before = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tracebacks.drop_own_frame(exc)
    assert traceback.format_exception(type(exc), exc, exc.__traceback__) == before
    no_traceback = ValueError("never raised")
    tracebacks.drop_own_frame(no_traceback)
    assert no_traceback.__traceback__ is None


def test_the_exception_path_takes_no_fallback() -> None:
    before = selftelemetry.total(selftelemetry.FALLBACK)
    for kind in ("error", "native"):
        _raised(_except(_callee), kind)
    assert selftelemetry.total(selftelemetry.FALLBACK) == before


def test_torchs_record_writes_the_unwrapped_calls_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's ``@record`` error file (``traceback.format_exc()``), which the agent prints in its failure report."""
    from torch.distributed.elastic.multiprocessing.errors import record

    def error_file(name: str, function: Callable[..., Any]) -> str:
        path = tmp_path / f"{name}.json"
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
        with pytest.raises(ValueError):
            _call(record(function), "error")
        return str(json.loads(path.read_text())["message"]["extraInfo"]["py_callstack"])

    wrapped, plain = error_file("wrapped", _except(_callee)), error_file("plain", _callee)
    assert wrapped == plain and "_callee" in plain and BRIDGE not in wrapped, (wrapped, plain)


# ---- the bridge's wrappers ------------------------------------------------------------------------------------------


class _Phase:
    def work(self, kind: str) -> Any:
        return _callee(kind)


def test_a_framework_phase_span(otel: Any, paused_drainer: Any) -> None:
    """``instruments.phase_method`` (Hugging Face's train / evaluate / save, Lightning's fit / save): the span ends
    with status ERROR, the exception goes on without the wrapper's frame."""
    from torchelastic_otel._torch.worker.frameworks import instruments

    wrapped = instruments.phase_method(_Phase.work, "torchelastic.framework.test", lambda *_: {})
    for kind in ("error", "interrupt"):
        _assert_same(_printed(wrapped, _Phase(), kind), _printed(_Phase.work, _Phase(), kind))
    instruments.drain()
    spans = [s for s in otel.spans.get_finished_spans() if s.name == "torchelastic.framework.test"]
    assert len(spans) == 2 and {s.status.status_code.name for s in spans} == {"ERROR"}
    assert instruments.open_tokens() == []


def _bridged_and_plain(patches: Patches, run: Callable[[], Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``run()`` raises with the wrappers installed, then with ``patches`` restored."""
    bridged = _printed(run)
    patches.restore()
    return bridged, _printed(run)


def test_hugging_face_trainer(frameworks_installed: Patches, tmp_path: Path) -> None:
    """``Trainer.__init__`` (a ``Trainer`` without a model) and ``Trainer.train`` (a callback raising at step 2)."""
    transformers = pytest.importorskip("transformers")
    from tests.support.tiny_models import Regression, regression_rows

    class Boom(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:
                raise RuntimeError("the callback failed at step 2")

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), max_steps=4, per_device_train_batch_size=4, report_to=[], use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, save_strategy="no", logging_steps=100,
    )  # fmt: skip
    rows = regression_rows(16)

    def train() -> None:
        transformers.Trainer(model=Regression(), args=args, train_dataset=rows, callbacks=[Boom()]).train()

    def build_without_a_model() -> None:
        transformers.Trainer(model=None, args=args)

    patches = frameworks_installed
    bridged = [_printed(build_without_a_model), _printed(train)]
    patches.restore()
    for wrapped, plain in zip(bridged, [_printed(build_without_a_model), _printed(train)], strict=True):
        _assert_same(wrapped, plain)


def test_lightning_trainer(frameworks_installed: Patches, tmp_path: Path) -> None:
    """``Trainer.__init__`` (an accelerator that does not exist), ``Trainer.fit`` (a ``training_step`` raising) and
    the logger connector's ``log_metrics`` (the user's logger raising)."""
    pl = pytest.importorskip("lightning.pytorch")

    class Module(pl.LightningModule):  # type: ignore[misc]
        def __init__(self, fail_at: int | None) -> None:
            super().__init__()
            self.net, self.fail_at = torch.nn.Linear(4, 1), fail_at

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == self.fail_at:
                raise RuntimeError(f"training_step {batch_idx} failed")
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> Any:
            data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
            return torch.utils.data.DataLoader(data, batch_size=4)

    class FailingLogger(pl.loggers.Logger):  # type: ignore[misc]
        name, version = "failing", 0

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            pass

        def log_metrics(self, metrics: Any, step: Any = None) -> None:
            raise RuntimeError("the user's logger failed")

    def trainer(**overrides: Any) -> Any:
        arguments: dict[str, Any] = dict(
            accelerator="cpu", devices=1, max_steps=4, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
            log_every_n_steps=1,
        )  # fmt: skip
        return pl.Trainer(**{**arguments, **overrides})

    runs = [
        lambda: trainer(accelerator="no-such-accelerator"),
        lambda: trainer().fit(Module(fail_at=2)),
        lambda: trainer(logger=FailingLogger()).fit(Module(fail_at=None)),
    ]
    quiet = logging.getLogger("lightning.pytorch")
    level, quiet.level = quiet.level, logging.ERROR
    try:
        patches = frameworks_installed
        bridged = [_printed(run) for run in runs]
        patches.restore()
        plain = [_printed(run) for run in runs]
    finally:
        quiet.setLevel(level)
    for wrapped, unwrapped in zip(bridged, plain, strict=True):
        _assert_same(wrapped, unwrapped)


def test_checkpoint_saves(otel: Any, paused_drainer: Any, tmp_path: Path) -> None:
    """``torch.save``: into a directory that does not exist (a checkpoint span) and, straight through, into a
    buffer (an object pickle refuses)."""
    from torchelastic_otel._torch.worker import checkpoints

    patches = Patches()
    checkpoints.install(patches)
    runs = [
        lambda: torch.save({"w": torch.zeros(2)}, str(tmp_path / "missing" / "step.pt")),
        lambda: torch.save(lambda: None, io.BytesIO()),
    ]
    try:
        bridged = [_printed(run) for run in runs]
    finally:
        patches.restore()
    for wrapped, plain in zip(bridged, [_printed(run) for run in runs], strict=True):
        _assert_same(wrapped, plain)


def test_logging_handlers(otel: Any) -> None:
    """``Logger.callHandlers`` (the worker's log records): a handler whose filter raises."""
    from torchelastic_otel._torch.worker import log_records

    def refuse(record: logging.LogRecord) -> bool:
        raise RuntimeError("the filter failed")

    logger = logging.getLogger("tests.tracebacks")
    handler = logging.StreamHandler(io.StringIO())
    handler.addFilter(refuse)
    logger.addHandler(handler)
    logger.propagate = False
    patches = Patches()
    log_records.install(patches, lambda: None)
    try:
        bridged = _printed(logger.warning, "a record")
    finally:
        patches.restore()
    try:
        _assert_same(bridged, _printed(logger.warning, "a record"))
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


@pytest.mark.parametrize("failure", ["raise ValueError('the module failed')", "import no_such_module_anywhere"])
def test_a_hooked_modules_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    """A module the bridge waits for (``imports.when_imported``: torch's, the frameworks') that fails to import:
    the loader's frame goes, and importlib's frames then go as Python trims them without the bridge."""
    import importlib

    from torchelastic_otel._torch import imports

    name = "tracebacks_failing_module"
    (tmp_path / f"{name}.py").write_text(failure + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def load() -> None:
        sys.modules.pop(name, None)
        importlib.import_module(name)

    def callback(module: Any) -> None:
        raise AssertionError("a module that failed to import has no callback")

    plain = _printed(load)
    imports.when_imported(name, callback)
    try:
        assert name in imports.pending()
        _assert_same(_printed(load), plain)
    finally:
        imports.cancel(name, callback)
        sys.modules.pop(name, None)


class _Exploding(torch.autograd.Function):  # type: ignore[misc]
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        raise RuntimeError("the backward failed")


class _Failing(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        raise RuntimeError(f"item {i} failed")


@pytest.fixture
def training_installed(otel: Any, paused_drainer: Any) -> Iterator[Patches]:
    """The worker's training set-up: steps, step phases (``anatomy``), checkpoints, ``destroy_process_group``."""
    from torchelastic_otel._torch.worker import steps, training

    steps.reset()
    try:
        with installed(training.install) as patches:
            yield patches
    finally:
        steps.reset()


def test_destroy_process_group(training_installed: Patches) -> None:
    """``destroy_process_group`` with no process group (torch raises)."""
    import torch.distributed as dist

    bridged, plain = _bridged_and_plain(training_installed, dist.destroy_process_group)
    _assert_same(bridged, plain)


def test_backward(training_installed: Patches) -> None:
    """``loss.backward()`` through the step phases' wrapper of ``torch.autograd.backward`` (``anatomy._around``)."""

    def backward() -> None:
        _Exploding.apply(torch.ones(2, requires_grad=True)).sum().backward()

    bridged, plain = _bridged_and_plain(training_installed, backward)
    _assert_same(bridged, plain)


def test_a_data_loaders_next(training_installed: Patches) -> None:
    """``next(iterator)`` of a ``DataLoader`` through the step phases' wrapper (``anatomy._around_next``)."""
    loader = torch.utils.data.DataLoader(_Failing(), batch_size=2)
    bridged, plain = _bridged_and_plain(training_installed, lambda: next(iter(loader)))
    _assert_same(bridged, plain)
