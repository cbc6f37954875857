"""SIGTERM reaches the bridge while the main thread is blocked in native code (``torchelastic_otel._process.signals``).

The child (tests/support/workers/_signal_child.py) is a worker under the bridge that blocks in a C call no signal
interrupts (a second ``pthread_mutex_lock``, through ctypes, GIL released): to CPython that is what a rank inside a
gloo/NCCL collective looks like. Real collectives under torchrun are in tests/jobs/test_worker_sigterm.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from tests.support import ROOT, WORKERS
from tests.support.env import clean_env
from tests.support.waiting import wait_for

CHILD = WORKERS / "_signal_child.py"


class Child:
    """The child process, its output lines read by a thread (so a blocked child never blocks the test)."""

    def __init__(self, *args: str, **env: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            cwd=ROOT,
            env=clean_env(**env),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, predicate: Any, what: str, timeout: float = 30.0) -> None:
        """Until ``predicate()``, or the child is gone with all it printed read: then it must hold."""
        wait_for(lambda: predicate() or (self.proc.poll() is not None and not self._reader.is_alive()), timeout,
                 what, interval=0.01, on_timeout=self.output)  # fmt: skip
        assert predicate(), f"{what} did not happen; output:\n" + self.output()

    def output(self) -> str:
        return "\n".join(self.lines[-60:])

    def printed(self, text: str) -> bool:
        """Whether a line holds ``text``: the watcher thread's lines and the main thread's may run together
        (``print`` writes a line and its newline in two calls)."""
        return any(text in line for line in list(self.lines))

    def wait_blocked(self, native: bool) -> None:
        """Until the child printed BLOCKING and (native) its main thread sleeps in the kernel on the mutex."""
        self.wait_for(lambda: "BLOCKING" in self.lines, "BLOCKING")
        if native:
            self.wait_for(lambda: _in_futex_wait(self.proc.pid), "the native block", timeout=10)

    def exit_code(self, timeout: float = 15.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the child did not exit:\n" + "\n".join(self.lines[-60:])) from None

    def records(self, event_name: str) -> list[dict[str, Any]]:
        prefix = f"LOG {event_name} "
        return [json.loads(line[len(prefix) :]) for line in list(self.lines) if line.startswith(prefix)]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._reader.join(5)


def _in_futex_wait(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/wchan") as fh:
            wchan = fh.read()
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state == "S" and ("futex" in wchan or wchan in ("", "0"))


@pytest.fixture
def child() -> Any:
    started: list[Child] = []

    def start(*args: str, **env: str) -> Child:
        started.append(Child(*args, **env))
        return started[-1]

    yield start
    for c in started:
        c.close()


def _blocked_line() -> int:
    return next(i for i, line in enumerate(CHILD.read_text().splitlines(), 1) if "BLOCKED-HERE" in line)


def test_sigterm_ends_a_worker_blocked_in_native_code_with_its_stack(child: Any) -> None:
    """The watcher thread gets the signal while the main thread never returns to the interpreter: the terminated
    record carries every thread's stack (main thread first, ending in the blocked call) and the user's line, it is
    exported, and the process dies of SIGTERM (-15), as it would without the bridge -- not 30 s later by SIGKILL."""
    c = child("--block", "native")
    c.wait_blocked(native=True)
    c.proc.send_signal(signal.SIGTERM)
    assert c.exit_code() == -signal.SIGTERM
    assert c.records("before.block"), "the worker's records from before the signal"
    (terminated,) = c.records("torchelastic.worker.terminated")
    assert terminated["torchelastic.signal"] == "SIGTERM" and terminated["torchelastic.state"] == "TERMINATED"
    stack = terminated["torchelastic.stack"]
    assert stack.startswith("Thread ") and '"MainThread"' in stack.splitlines()[0]
    main_stack = stack.split("\nThread ")[0]
    assert main_stack.rstrip().endswith(
        "libc.pthread_mutex_lock(mutex)  # BLOCKED-HERE: never returns, no signal interrupts it"
    )
    assert terminated["code.file.path"] == str(CHILD)
    assert terminated["code.line.number"] == _blocked_line()
    assert terminated["code.function.name"] == "block_natively"
    assert "UNBLOCKED" not in c.lines


def test_sigterm_in_python_code_is_handled_once(child: Any) -> None:
    """Main thread in Python: its handler and the watcher both see the signal; one terminated record, exit -15."""
    c = child("--block", "python")
    c.wait_blocked(native=False)
    c.proc.send_signal(signal.SIGTERM)
    assert c.exit_code() == -signal.SIGTERM
    assert len(c.records("torchelastic.worker.terminated")) == 1
    assert c.records("torchelastic.worker.terminated")[0]["code.function.name"] == "block_in_python"


def test_two_sigterms_give_one_record_and_one_death(child: Any) -> None:
    c = child("--block", "native")
    c.wait_blocked(native=True)
    c.proc.send_signal(signal.SIGTERM)
    c.proc.send_signal(signal.SIGTERM)
    assert c.exit_code() == -signal.SIGTERM
    assert len(c.records("torchelastic.worker.terminated")) == 1


def test_a_handler_installed_before_the_bridge_is_chained(child: Any) -> None:
    """The application's (or torch's) own SIGTERM handler still runs, in the main thread, after the record."""
    c = child("--block", "python", "--user-handler", "before")
    c.wait_blocked(native=False)
    c.proc.send_signal(signal.SIGTERM)
    assert c.exit_code() == 7
    assert c.printed("USER_HANDLER")
    assert len(c.records("torchelastic.worker.terminated")) == 1
    assert c.lines.index("USER_HANDLER") > max(i for i, line in enumerate(c.lines) if "worker.terminated" in line)


def test_a_chained_handler_in_a_natively_blocked_worker_keeps_the_process_alive(child: Any) -> None:
    """With a handler of its own the application decides when to die: while its main thread is blocked, CPython
    cannot run that handler (as without the bridge), so the bridge does not kill the process -- but its telemetry,
    the terminated record included, is delivered at once, before an eventual SIGKILL."""
    c = child("--block", "native", "--user-handler", "before")
    c.wait_blocked(native=True)
    c.proc.send_signal(signal.SIGTERM)
    c.wait_for(lambda: c.records("torchelastic.worker.terminated"), "the terminated record", timeout=15)
    assert c.proc.poll() is None, "the bridge must not end a process whose own SIGTERM handler did not run"
    assert not c.printed("USER_HANDLER")


def test_a_handler_installed_after_the_bridge_wins(child: Any) -> None:
    """An application that sets its own handler after the bridge replaced it: its handler runs (exit 7); the
    watcher still delivered the terminated record."""
    c = child("--block", "python", "--user-handler", "after")
    c.wait_blocked(native=False)
    c.proc.send_signal(signal.SIGTERM)
    assert c.exit_code() == 7
    assert c.printed("USER_HANDLER")


def test_an_ignored_sigterm_stays_ignored(child: Any) -> None:
    """SIG_IGN before the bridge (whoever started the process wants it so): the bridge leaves SIGTERM alone."""
    c = child("--block", "python", "--ignore")
    c.wait_blocked(native=False)
    c.proc.send_signal(signal.SIGTERM)
    time_limit = time.monotonic() + 1.0
    while time.monotonic() < time_limit and c.proc.poll() is None:
        time.sleep(0.02)
    assert c.proc.poll() is None
    assert not c.records("torchelastic.worker.terminated")


_FORK_CHILD = r"""
import os, signal, sys
sys.path.insert(0, {root!r})
from torchelastic_otel._process import runtime, signals as _signals  # runtime: the fork hooks, as on the real path
assert _signals.install(lambda stacks: None, 500)
ours = signal.set_wakeup_fd(-1); signal.set_wakeup_fd(ours)
pid = os.fork()
if pid == 0:
    inherited = signal.set_wakeup_fd(-1)
    os._exit(0 if inherited == -1 else 3)  # the child gave the parent's pipe back (its signals are its own)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
print("PARENT_STILL_ARMED", signal.set_wakeup_fd(ours) == ours, flush=True)
_signals.uninstall()
print("RESTORED", signal.set_wakeup_fd(-1) == -1 and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)
"""


def test_fork_and_uninstall_give_back_the_wakeup_fd() -> None:
    """A forked child must not write its signals into the parent's pipe (the parent would take the child's SIGTERM
    for its own); uninstall restores the handler and the wakeup fd exactly."""
    result = subprocess.run([sys.executable, "-c", _FORK_CHILD.format(root=str(ROOT))], capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "PARENT_STILL_ARMED True" in result.stdout
    assert "RESTORED True" in result.stdout
