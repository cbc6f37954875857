"""Process-tree helpers shared by the tests that start real torchrun jobs, and the child scripts the tests run from
the repository (``run_script``, ``start_script``, ``stop_script``)."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import ROOT


def descendants(root: int) -> list[int]:
    """Pids of every live descendant of ``root`` (torch starts workers in their own sessions, so killing the
    agent's process group does not reach them)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children[ppid].append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_tree(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop ``proc`` if it still runs: SIGTERM (a torchrun agent stops its workers on it), then SIGKILL whatever
    is left of its process tree, workers in their own sessions included."""
    if proc.poll() is None:
        stragglers = descendants(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        for pid in [proc.pid, *stragglers, *descendants(proc.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


@dataclass
class Job:
    """A started torchrun job: its process, its output file, when it started and what it ended with."""

    proc: subprocess.Popen
    output_path: Path
    started: float = field(default_factory=time.monotonic)
    returncode: int | None = None
    ended: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def seconds(self) -> float:
        assert self.ended is not None
        return self.ended - self.started

    def output(self) -> str:
        try:
            return self.output_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, n: int = 4000) -> str:
        return self.output()[-n:]

    def wait(self, timeout: float = 120.0) -> int:
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job did not finish within {timeout} s:\n{self.tail()}") from None
        self.ended = time.monotonic()
        return self.returncode

    def kill(self) -> None:
        """Stop the job if it still runs: SIGTERM (the agent stops its workers), then SIGKILL what is left."""
        stop_tree(self.proc)


def run_job(cmd: list[str], env: dict[str, str], cwd: Path, log: Path, timeout: float = 180.0) -> Job:
    """Run a torchrun command to its end (its output in ``log``); on a timeout, or anything else going wrong, the
    whole process tree is stopped -- the workers too, which a plain ``subprocess.run`` timeout would leave behind."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    job = Job(proc, log)
    try:
        job.wait(timeout=timeout)
    finally:
        job.kill()
    return job


def run_script(script: Path, *args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGS`` from the repository to its end, stdin closed and its output captured (text); killed if
    it outlives ``timeout``."""
    cmd = [sys.executable, str(script), *args]
    return subprocess.run(
        cmd, env=env, cwd=str(ROOT), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )


def start_script(script: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``python SCRIPT ARGS`` from the repository, started, its stdin, stdout and stderr pipes (text); the caller
    ends it with :func:`stop_script`."""
    pipe = subprocess.PIPE
    cmd = [sys.executable, str(script), *args]
    return subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdin=pipe, stdout=pipe, stderr=pipe, text=True)


def stop_script(proc: subprocess.Popen[str]) -> None:
    """Kill a started script if it still runs, and reap it (bounded)."""
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(Exception):
        proc.communicate(timeout=5)
