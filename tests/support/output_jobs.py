"""Running ``tests/support/workers/_output_worker.py`` under plain torchrun and under the bridge, and reading what
each printed.

Shared by ``tests/jobs/test_worker_output.py``: a job runs with a given torchrun layout (console only; ``--redirects``,
``--tee``, ``--local-ranks-filter`` and ``--log-dir`` together), optionally on a terminal (a pty the test holds),
and comes back with its exit code, console text, log-dir files and the workers' probes (what their fds were).

Console text is compared "ignoring timing": the launcher's own traceback frames (torch's ``run.py`` or the
bridge's) and the numbers in it (times, pids, ports) are left out, the run id and log directory are masked; the
lines each rank wrote to each stream are compared in order.
"""

from __future__ import annotations

import collections
import json
import os
import re
import select
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import ROOT, WORKERS
from tests.support.env import otlp_env, plain_env
from tests.support.jobs import OTEL_INSTRUMENT, TORCHRUN, c10d_args, unique_id
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.procs import run_job, stop_tree

WORKER = WORKERS / "_output_worker.py"
JOB_TIMEOUT = 90.0  # seconds; a job that outlives it is killed with its workers
FILE_LAYOUT = ["--redirects", "1", "--tee", "2", "--local-ranks-filter", "0"]

#: "output_worker rank <r> <stream> <n>: ..." -- a line the worker wrote itself (console lines may have a prefix)
WORKER_LINE = re.compile(r"output_worker rank (\d) (stdout|stderr) \d+: .*$")
_TORCH_LOG = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")
_AGENT_TRACEBACK = "Traceback (most recent call last):"
_AGENT_ERROR = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"


@dataclass
class Finished:
    """What a job left: exit code, console text, the log-dir files and the workers' probes."""

    kind: str
    run_id: str
    returncode: int | None
    console: str
    log_dir: Path | None
    probes: dict[int, dict[str, Any]] = field(default_factory=dict)

    def files(self) -> dict[tuple[int, str], str]:
        """``(local rank, "stdout"|"stderr") -> text`` of torchrun's ``--log-dir`` files of the first attempt."""
        found: dict[tuple[int, str], str] = {}
        if self.log_dir is None:
            return found
        for path in self.log_dir.glob("*/attempt_0/*/std*.log"):
            found[(int(path.parent.name), path.stem)] = path.read_text(errors="replace")
        return found

    def masks(self) -> dict[str, str]:
        masks = {self.run_id: "RUN_ID"}
        if self.log_dir is not None:
            masks[str(self.log_dir)] = "LOG_DIR"
        return masks


def run(kind: str, tmp: Path, mode: list[str], layout: list[str] | None = None, rx: OtlpReceiver | None = None,
        nproc: int = 2, env_extra: dict[str, str] | None = None, terminal: bool = False) -> Finished:  # fmt: skip
    """Run ``_output_worker.py`` once, ``kind`` "plain" (torchrun, no bridge), "bridged" (``torchelastic_otel.run``
    exporting to ``rx``) or "instrument" (``opentelemetry-instrument torchrun``, exporting to ``rx``)."""
    name = f"{kind}-{len(list(tmp.glob(f'{kind}-*')))}"
    base = tmp / name
    probe_dir = base / "probes"
    probe_dir.mkdir(parents=True)
    log_dir = base / "logs" if layout else None
    run_id = unique_id(name)
    args = [*c10d_args(run_id), "--nproc-per-node", str(nproc), *(layout or [])]
    if log_dir is not None:
        args += ["--log-dir", str(log_dir)]
    args += [str(WORKER), *mode, "--probe-dir", str(probe_dir)]
    if kind == "plain":
        cmd, env = [str(TORCHRUN), *args], plain_env()
    elif kind == "instrument":
        assert rx is not None
        cmd = [str(OTEL_INSTRUMENT), str(TORCHRUN), *args]
        env = otlp_env(rx, OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="otlp", OTEL_LOGS_EXPORTER="otlp")
    else:
        assert rx is not None
        cmd, env = [sys.executable, "-m", "torchelastic_otel.run", *args], otlp_env(rx)
    env.update(env_extra or {})
    returncode, console = (_on_terminal if terminal else _on_pipe)(cmd, env, base)
    probes = {int(p.stem[4:]): json.loads(p.read_text()) for p in probe_dir.glob("rank*.json")}
    return Finished(kind, run_id, returncode, console, log_dir, probes)


def _on_pipe(cmd: list[str], env: dict[str, str], base: Path) -> tuple[int | None, str]:
    """torchrun's stdout and stderr to one file, as a batch system collects them."""
    job = run_job(cmd, env, ROOT, base / "console.txt", timeout=JOB_TIMEOUT)
    return job.returncode, job.output()


def _on_terminal(cmd: list[str], env: dict[str, str], base: Path) -> tuple[int | None, str]:
    """torchrun on a terminal (a pty of 120x40 held here), as a user at a shell runs it; the text it showed."""
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}
    try:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    finally:
        os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + JOB_TIMEOUT
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every process holding the terminal has closed it
                break
            if not data:
                break
            chunks.append(data)
        returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        stop_tree(proc)
        os.close(master)
    return returncode, b"".join(chunks).decode(errors="replace")


def normalize(text: str, masks: dict[str, str]) -> list[str]:
    """The console lines "ignoring timing": masked, torch's log prefix reduced to its level, numbers as ``N``,
    the launcher's own traceback left out (its frames are torch's ``run.py`` or the bridge's by construction)."""
    lines = text.replace("\r\n", "\n").splitlines()
    lines = _without_launcher_traceback(lines)
    out = []
    for raw in lines:
        for needle, token in masks.items():
            raw = raw.replace(needle, token)
        raw = _TORCH_LOG.sub(r"\1 ", raw)
        out.append(re.sub(r"\d+", "N", raw))
    return out


def _without_launcher_traceback(lines: list[str]) -> list[str]:
    """Drop the traceback header and indented frames right before torch's ``ChildFailedError`` line."""
    for end, raw in enumerate(lines):
        if raw.startswith(_AGENT_ERROR):
            start = end
            while start > 0 and lines[start - 1].startswith(" "):
                start -= 1
            if start > 0 and lines[start - 1] == _AGENT_TRACEBACK:
                start -= 1
            return lines[:start] + lines[end:]
    return lines


def worker_lines(text: str) -> dict[tuple[int, str], list[str]]:
    """``(rank, stream) -> [line, ...]`` in console order, of the lines the worker wrote itself."""
    found: dict[tuple[int, str], list[str]] = collections.defaultdict(list)
    for raw in text.replace("\r\n", "\n").splitlines():
        match = WORKER_LINE.search(raw)
        if match:
            found[(int(match.group(1)), match.group(2))].append(match.group(0))
    return dict(found)


def multiset_difference(a: list[str], b: list[str]) -> tuple[list[str], list[str]]:
    """Lines only in ``a`` and only in ``b`` (as multisets), sorted: empty, empty when they are the same."""
    ca, cb = collections.Counter(a), collections.Counter(b)
    return sorted((ca - cb).elements()), sorted((cb - ca).elements())
