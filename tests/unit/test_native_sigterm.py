"""SIGTERM handled in C while a worker loads torch: the pieces (the job: ``tests/jobs/test_sigterm_in_torch_import``).

- ``_torch.imports.around``: callbacks right before and after a module's code runs, in the importing thread;
- ``_process.signals.enter_native`` / ``leave_native``: ``faulthandler`` writes the stacks and the process dies of
  SIGTERM at once; afterwards the watcher's handler is back;
- ``_process.stacks.from_faulthandler``: faulthandler's text read back into the terminated record's stacks;
- ``_torch.final_words``: the file the agent turns into the record, and one it drops (no signal landed).
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from torchelastic_otel._process import stacks as _stacks
from torchelastic_otel._torch import final_words, imports

# ---- around an import ---------------------------------------------------------------------------------------------


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_around_runs_before_and_after_the_modules_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    _module(tmp_path, monkeypatch, "_teo_around_ok", "import sys\nsys._teo_seen.append('code')\n")
    monkeypatch.setattr(sys, "_teo_seen", seen, raising=False)
    assert imports.around("_teo_around_ok", lambda: seen.append("before"), lambda: seen.append("after"))
    importlib.import_module("_teo_around_ok")
    assert seen == ["before", "code", "after"]
    assert "_teo_around_ok" not in imports.pending()
    assert not imports.around("_teo_around_ok", lambda: None, lambda: None)  # imported already: nothing to wrap


def test_around_runs_after_also_when_the_import_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    _module(tmp_path, monkeypatch, "_teo_around_fails", "raise ImportError('broken module')\n")
    imports.around("_teo_around_fails", lambda: seen.append("before"), lambda: seen.append("after"))
    with pytest.raises(ImportError, match="broken module"):
        importlib.import_module("_teo_around_fails")
    assert seen == ["before", "after"]


def test_a_cancelled_pair_does_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    _module(tmp_path, monkeypatch, "_teo_around_cancelled", "")

    def before() -> None:
        seen.append("before")

    imports.around("_teo_around_cancelled", before, lambda: seen.append("after"))
    imports.cancel_around("_teo_around_cancelled", before)
    importlib.import_module("_teo_around_cancelled")
    assert seen == []


# ---- faulthandler's text read back --------------------------------------------------------------------------------


def _dump_here() -> tuple[str, int]:
    """faulthandler's text for this process now (a helper thread waits in an Event); the line that dumped."""
    release = threading.Event()
    helper = threading.Thread(target=release.wait, name="data-loader", daemon=True)
    bridge_own = threading.Thread(target=release.wait, name="torchelastic-otel-drainer", daemon=True)
    helper.start()
    bridge_own.start()
    try:
        with tempfile.TemporaryFile("w+") as fh:
            line = sys._getframe().f_lineno + 1
            faulthandler.dump_traceback(file=fh, all_threads=True)
            fh.seek(0)
            return fh.read(), line
    finally:
        release.set()


#: ``_dump_here`` in a process of its own: its main thread's stack is shallow there, whatever runs the tests (a
#: pytest-xdist worker's main thread is execnet's, deep and with long paths: the stacks' text would be truncated
#: before the helper thread)
_READ_BACK = """
import dataclasses, json, threading
from tests.unit.test_native_sigterm import _dump_here
from torchelastic_otel._process import stacks as _stacks
dump, line = _dump_here()
names = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
main = threading.main_thread().ident
stacks = _stacks.from_faulthandler(dump, main, names)
user = dataclasses.astuple(stacks.user_frame) if stacks.user_frame is not None else None
print(json.dumps({"main": main, "line": line, "text": stacks.text, "threads": stacks.threads, "user": user}))
"""


@pytest.mark.jobs  # a process of its own
def test_faulthandlers_stacks_read_back_as_the_watchers() -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _READ_BACK], cwd=root, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(root)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    text, main, line = found["text"], found["main"], found["line"]
    first = text.splitlines()[0]
    assert first == f'Thread {main} "MainThread" (most recent call last):', text
    assert '"data-loader" (most recent call last):' in text
    assert "torchelastic-otel-drainer" not in text  # the bridge's own threads are not where the job was
    assert f"line {line}, in _dump_here\n    faulthandler.dump_traceback(" in text  # source lines read back
    assert found["threads"] >= 2  # the main thread and the helper
    assert _stacks.UserFrame(*found["user"]) == _stacks.UserFrame(__file__, line, "_dump_here")


@pytest.mark.parametrize("text", ["", "garbage\n", "Thread 0xZZ (most recent call first):\n", "\x00" * 64])
def test_text_without_a_thread_is_no_dump(text: str) -> None:
    assert not _stacks.has_faulthandler_stacks(text)
    assert _stacks.from_faulthandler(text, 1, {}).threads == 0


# ---- a worker's process, stopped in the native stretch -------------------------------------------------------------

#: A process whose SIGTERM the bridge handles (watcher installed), which enters the native stretch with a file and
#: either is stopped there (``stop``) or leaves it first (``leave``: then its handler is the watcher's again).
_CHILD = """
import json, os, signal, sys
from torchelastic_otel._process import signals
signals.install(lambda stacks: None, 1000)
watcher_handler = signal.getsignal(signal.SIGTERM)
fh = open(sys.argv[2], "w")
entered = signals.enter_native(fh)
during = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
if sys.argv[1] == "leave":
    signals.leave_native()
    after = signal.getsignal(signal.SIGTERM) == watcher_handler
    print(json.dumps({"entered": entered, "during": during, "after": after}))
    sys.exit(0)
def stopped_here():
    os.kill(os.getpid(), signal.SIGTERM)
    print("still alive", flush=True)
stopped_here()
"""


@pytest.mark.jobs
def test_stopped_in_the_native_stretch_the_process_dies_at_once_with_its_stacks(tmp_path: Path) -> None:
    dump = tmp_path / "stacks"
    done = subprocess.run([sys.executable, "-c", _CHILD, "stop", str(dump)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stdout, done.stderr)
    assert "still alive" not in done.stdout
    stacks = _stacks.from_faulthandler(dump.read_text(), None, {})
    assert "in stopped_here" in stacks.text, stacks.text


@pytest.mark.jobs
def test_after_the_native_stretch_the_watcher_handles_sigterm_again(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD, "leave", str(tmp_path / "stacks")], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"entered": True, "during": True, "after": True}


# ---- what the agent makes of the file ------------------------------------------------------------------------------


class _Pipeline:
    """Stands in for the agent's pipeline at a boundary with no real part: ``deliver`` must send nothing at all for a
    file without stacks, and any provider it touched would say so (raises)."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the pipeline was used ({name}) for a file without stacks")


def test_a_file_left_without_stacks_is_removed_unsent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker went on past its import (or died another way): no signal landed, so no terminated record."""
    monkeypatch.setenv(final_words.DIR_ENV, str(tmp_path))
    opened = final_words.open_for_native_stop({"state": "TERMINATED"}, None, ("torchelastic.worker.start", 1, 2, {}),
                                              {threading.main_thread().ident or 0: "MainThread"})  # fmt: skip
    assert opened is not None
    path, fh = opened
    fh.close()
    assert os.path.dirname(path) == str(tmp_path) and json.loads(Path(path).read_text())["span"]["span"]
    assert final_words.deliver(str(tmp_path), _Pipeline()) == 0
    assert os.listdir(tmp_path) == []
