"""``torchelastic-otel report --follow``: a live view of a real job, in a real terminal, as a person watches it.

A real bridged torchrun job (2 ranks, gloo on CPU, ``tests/support/workers/_straggler_worker.py``: rank 1 is slow
at every step, and dies when told) writes OTLP JSON Lines files (``otlp_json_file`` with ``TORCHELASTIC_OTEL_FILE_DIR``)
while ``torchelastic-otel report --follow DIR`` runs in tmux (a terminal of 200 x 50; its screen read with
``tmux capture-pane``). The view is up before the job's first file; it updates while the job runs (the ranks' step
counts grow); the slow rank is named a straggler while the job still runs; when the rank dies, its failure and
exception appear within 2 s of the time stamp the worker wrote as it died; the follower ends with the job, printing
the report and writing the HTML, with ``report``'s exit status. Then the same command with its output not a
terminal, on the finished files: one frame, then exactly what ``report`` prints.

Every tmux server runs on its own socket and is killed in ``finally``; the job too; every wait has a deadline.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support import WORKERS, stack
from tests.support.env import PACE, clean_env, files_env
from tests.support.jobs import unique_id
from tests.support.waiting import wait_for

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")

WORKER = WORKERS / "_straggler_worker.py"
#: seconds from the rank's death (its own time stamp) to its failure on the screen, at most
SHOWN_WITHIN = 2.0


class Terminal:
    """A tmux server of its own (socket ``name``) running one command in a 200 x 50 window."""

    def __init__(self, tmux: str, command: str, env: dict[str, str]) -> None:
        self.tmux, self.name = tmux, f"follow-{uuid.uuid4().hex[:8]}"
        self._run(["new-session", "-d", "-s", "view", "-x", "200", "-y", "50", command], env)
        self._run(["set-window-option", "-t", "view", "remain-on-exit", "on"], env)  # the last screen stays

    def _run(self, args: list[str], env: dict[str, str] | None = None) -> str:
        done = subprocess.run([self.tmux, "-L", self.name, *args], capture_output=True, text=True, timeout=10,
                              env=env, stdin=subprocess.DEVNULL, check=False)  # fmt: skip
        assert done.returncode == 0 or args[0] == "kill-server", (args, done.stderr)
        return done.stdout

    def screen(self) -> str:
        return self._run(["capture-pane", "-p", "-t", "view"])

    def kill(self) -> None:
        self._run(["kill-server"])


def _steps(screen: str, rank: int) -> int:
    """Rank ``rank``'s steps in the RANKS table of the live view (0 while there is none)."""
    table = screen.split("RANKS", 1)[1] if "RANKS" in screen else ""
    match = re.search(rf"^\s*{rank}\s+\S+\s+([\d,]+)\s", table, re.MULTILINE)
    return int(match[1].replace(",", "")) if match else 0


def test_the_live_view_follows_a_job_to_its_end(tmp_path: Path) -> None:
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux is not installed (make test installs it: make tmux-deps)")
    files, go, died, rc = tmp_path / "files", tmp_path / "go", tmp_path / "died", tmp_path / "follow.rc"
    html = tmp_path / "report.html"
    files.mkdir()
    env = clean_env(OMP_NUM_THREADS="1", NO_COLOR="1")
    for size in ("COLUMNS", "LINES"):  # pytest-xdist's workers set 80 x 24: the view is to take tmux's size
        env.pop(size, None)
    follower = (
        f"{shlex.quote(sys.executable)} -m torchelastic_otel.report --follow --interval 0.5 "
        f"--html {shlex.quote(str(html))} {shlex.quote(str(files))}; echo $? > {shlex.quote(str(rc))}"
    )
    job_env = files_env(files, PACE, TORCHELASTIC_OTEL_COLLECTIVES_INTERVAL="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torchelastic_otel.run", "--standalone", "--nproc-per-node", "2", "--max-restarts",
           "0", "--rdzv-id", unique_id("follow"), "--monitor-interval", "0.1", str(WORKER), "--go", str(go),
           "--died", str(died), "--base", "0.1", "--slow-rank", "1", "--min-steps", "0", "--check-every", "5",
           "--max-steps", "1500"]  # fmt: skip
    terminal = Terminal(tmux, f"cd {shlex.quote(str(tmp_path))} && {follower}", env)
    job = None
    try:
        wait_for(lambda: "waiting for OTLP JSON Lines" in terminal.screen(), 20, "the view, before any file")
        job = stack.start(cmd, tmp_path / "job.log", job_env)

        def seen(what: str, timeout: float) -> str:
            return wait_for(lambda: (lambda s: s if re.search(what, s) else "")(terminal.screen()), timeout, what,
                            interval=0.05, on_timeout=lambda: terminal.screen() + job.output())  # fmt: skip

        first = _steps(seen(r"NOW  attempt 0 running", 90), 0)
        wait_for(lambda: _steps(terminal.screen(), 0) > first + 5, 30, "the view updates while the job runs")
        screen = seen(r"rank 1 \(\S+\) is a straggler", 60)
        assert job.running(), "the straggler is named while the job runs"
        assert re.search(r"^\s*1\s.*<- straggler$", screen, re.MULTILINE), screen

        go.touch()
        screen = seen(r"rank 1 failed first: ValueError: corrupt batch|root cause rank 1 .*corrupt batch", 60)
        shown = time.time_ns()
        death = int(wait_for(lambda: died.exists() and died.read_text(), 5, "the worker's time stamp"))
        assert (shown - death) / 1e9 < SHOWN_WITHIN, f"shown {(shown - death) / 1e9:.2f} s after the rank died"

        assert job.wait(60) != 0, "the job failed"
        ended = time.monotonic()
        wait_for(rc.exists, 30, "the follower ends with the job", on_timeout=terminal.screen)
        assert time.monotonic() - ended < 30
        assert rc.read_text().strip() == "0", terminal.screen()
        final = terminal.screen()
        assert f"report: {html}" in final and html.exists(), final
    finally:
        terminal.kill()
        if job is not None:
            job.stop()

    # on the finished files, the output no terminal: one frame, then what ``report`` prints, byte for byte
    report = subprocess.run([sys.executable, "-m", "torchelastic_otel.report", "--width", "120", "--html",
                             str(tmp_path / "a.html"), str(files)], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)  # fmt: skip
    followed = subprocess.run([sys.executable, "-m", "torchelastic_otel.report", "--follow", "--interval", "0.2",
                               "--width", "120", "--html", str(tmp_path / "b.html"), str(files)], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)  # fmt: skip
    assert report.returncode == followed.returncode == 0, followed.stderr
    frames, _, after = followed.stdout.partition(": the report of the files ====\n")
    assert len(re.findall(r"^==== \S+ UTC ====$", frames, re.MULTILINE)) == 1, frames
    assert "root cause rank 1" in frames, frames
    assert after.replace("b.html", "a.html") == report.stdout
