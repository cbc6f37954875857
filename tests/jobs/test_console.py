"""A failing job's console is plain torchrun's: no frame of the bridge in any traceback a user reads.

Four real jobs fail in training (``tests/support/workers/console_worker.py``, CPU, gloo, never importing the
bridge), each run bridged and plain:

- ``ddp``: a ``DistributedDataParallel`` loop whose ``loss.backward()`` raises (through the step phases' wrapper of
  ``torch.autograd.backward``); ``@record``, so the agent's failure report carries the error file's traceback;
- ``hf``: a Hugging Face ``Trainer`` whose model raises inside ``Trainer.train()`` (the ``train`` span's wrapper);
- ``lightning``: a Lightning ``Trainer`` whose ``training_step`` raises inside ``Trainer.fit()`` (the ``fit`` span's
  wrapper);
- ``accelerate``: ``accelerate launch`` on 2 ranks whose checkpoint (``torch.save`` through ``accelerator.save``)
  raises on rank 0 (the checkpoint span's wrapper); ``@record``; rank 1 is stopped by the agent;
- ``stopped``: a job stopped by SIGTERM to the agent (a scheduler, Ctrl-C) while its rank trains: the agent's
  ``SignalException`` goes through its ``run`` (the lifecycle spans' wrapper).

Bridged is ``torchelastic-otel`` (``torchelastic-otel accelerate launch``) exporting to a real OTLP receiver; plain is
``torchrun`` (``accelerate launch``) without the bridge. Every failing job's agent raises torch's ``ChildFailedError``
through the launcher. The two consoles, stdout and stderr apart, are compared after masking what differs from run to run
(times, pids, ports, addresses, the run id and temporary paths, the launcher's own name in the first frame): the
bridged console has no line plain's lacks and none fewer, and each traceback's lines are plain's, in order.
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, WORKERS
from tests.support.env import otlp_env, plain_env
from tests.support.jobs import BIN, TORCHELASTIC_OTEL, TORCHRUN, c10d_args, unique_id
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.ports import free_port
from tests.support.procs import Job
from tests.support.waiting import wait_for
from torchelastic_otel import _names as names

WORKER = WORKERS / "console_worker.py"
ACCELERATE = BIN / "accelerate"
JOB_TIMEOUT = 240.0
#: How long the bridged job's telemetry may take to arrive once the job has ended (it is flushed before exit).
TELEMETRY_WAIT = 20.0
STATUS_ERROR = 2
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
#: What each job's failure says, and the function of the user's the worker's traceback goes through.
FAILURES = {
    "ddp": ("RuntimeError: the backward exploded on purpose", "in backward"),
    "hf": ("RuntimeError: the forward of step 3 failed on purpose", "in train"),
    "lightning": ("RuntimeError: training_step 3 failed on purpose", "in fit"),
    "accelerate": ("does not exist.", "in save"),
    "stopped": ("SignalException: Process N got signal: 15", "in run"),
}
#: The tracebacks each job's console holds: the failing rank's, the agent's, the error file's (``@record``).
TRACEBACKS = {"ddp": 3, "hf": 2, "lightning": 2, "accelerate": 3, "stopped": 1}
#: What each job needs installed.
MODULES = {
    "ddp": "torch",
    "hf": "transformers",
    "lightning": "lightning",
    "accelerate": "accelerate",
    "stopped": "torch",
}
#: What differs from run to run, masked (pattern, replacement).
MASKS = [(re.compile(pattern), replacement) for pattern, replacement in (
    (r"^(\[rank\d+\]:)?([IWE])\d{4} \d\d:\d\d:\d\d\.\d+ \d+ ", r"\1\2MMDD TIME PID "),  # torch's log prefix
    (r"\[([IWE])\d{4} \d\d:\d\d:\d\d\.\d+ ", r"[\1MMDD TIME "),  # c10d's (C++) log prefix
    (r"\b(pid:? |PID |[Pp]rocess )\d+", r"\1N"),
    (r"\btime(\s*): \S+", r"time\1: T"),
    (r"(127\.0\.0\.1|localhost|0\.0\.0\.0|::1?)\]?:\d+", r"\1:PORT"),
    (r"0x[0-9a-fA-F]{6,}", "0xADDR"),
    (r"/tmp/torchelastic_[^\s)]+", "TORCHELASTIC_TMP"),  # torch's error files, under the run id
    (r"/bin/(torchelastic-otel|torchrun|accelerate)\"", '/bin/LAUNCHER"'),  # the command the user typed
)]  # fmt: skip


def _command(kind: str, bridged: bool, run_id: str) -> list[str]:
    if kind == "accelerate":
        launcher = [str(TORCHELASTIC_OTEL), "accelerate"] if bridged else [str(ACCELERATE)]
        return [*launcher, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no", "--max_restarts", "0", "--monitor_interval",
                "0.1", "--main_process_port", str(free_port()), str(WORKER)]  # fmt: skip
    launcher = TORCHELASTIC_OTEL if bridged else TORCHRUN
    return [str(launcher), *c10d_args(run_id), "--nproc-per-node", "1", "--max-restarts", "0", str(WORKER)]


def _launch(kind: str, bridged: bool, base: Path, rx: OtlpReceiver | None) -> dict[str, Any]:
    """Run the ``kind`` job to its end (``stopped``: SIGTERM to the agent once the rank trains); its exit code, and
    its stdout and stderr masked. Bridged where ``rx`` is given (exporting to it), else plain."""
    base.mkdir(parents=True)
    run_id = unique_id(f"console-{kind}")
    extra = {"CONSOLE_KIND": kind, "CONSOLE_OUT": str(base), "OMP_NUM_THREADS": "1", "HF_HOME": str(base / "hf"),
             "ACCELERATE_USE_CPU": "1", **OFFLINE}  # fmt: skip
    env = otlp_env(rx, **extra) if rx is not None else plain_env(**extra)
    out, err = base / "stdout", base / "stderr"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(_command(kind, bridged, run_id), env=env, cwd=ROOT, stdout=stdout, stderr=stderr,
                                stdin=subprocess.DEVNULL)  # fmt: skip
    job = Job(proc, err)
    try:
        if kind == "stopped":
            wait_for(lambda: "console_worker: training" in out.read_text(errors="replace"), timeout=JOB_TIMEOUT / 2,
                     what="the rank to start training", on_timeout=job.tail)  # fmt: skip
            proc.send_signal(signal.SIGTERM)
        job.wait(timeout=JOB_TIMEOUT)
    finally:
        job.kill()
    masks = {str(base): "BASE", run_id: "RUN_ID"}
    return {"code": proc.returncode, "stdout": _masked(out.read_text(errors="replace"), masks),
            "stderr": _masked(err.read_text(errors="replace"), masks)}  # fmt: skip


def _masked(text: str, masks: dict[str, str]) -> list[str]:
    lines = []
    for line in text.replace("\r\n", "\n").split("\n"):
        for needle, token in masks.items():
            line = line.replace(needle, token)
        for pattern, replacement in MASKS:
            line = pattern.sub(replacement, line)
        lines.append(line.rstrip())
    return [line for line in lines if line]


def _exported(rx: OtlpReceiver, kind: str) -> dict[str, Any]:
    """What shows the bridged job was bridged: the agent's root-cause record and the worker's own telemetry of the
    wrapped call (the span that ended with the exception; for ``ddp``, its steps); for ``stopped``, the agent's run
    span, ended by the signal."""
    if kind in ("hf", "lightning", "accelerate"):
        name = names.CHECKPOINT_SAVE if kind == "accelerate" else names.FRAMEWORK_TRAIN

        def arrived(rx: OtlpReceiver) -> bool:
            return any(s["status_code"] == STATUS_ERROR for s in rx.spans(name)) and bool(rx.logs(names.ROOT_CAUSE))
    elif kind == "ddp":

        def arrived(rx: OtlpReceiver) -> bool:
            return bool(rx.metric_points(names.WORKER_STEPS)) and bool(rx.logs(names.ROOT_CAUSE))
    else:  # stopped: the agent's run span ends with the signal's error

        def arrived(rx: OtlpReceiver) -> bool:
            return any(s["status_code"] == STATUS_ERROR for s in rx.spans(names.RUN))

    rx.wait_for(arrived, timeout=TELEMETRY_WAIT)
    return {"bridged": arrived(rx), "spans": sorted({s["name"] for s in rx.spans()})}


@pytest.fixture(scope="module", params=sorted(FAILURES))
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    kind = str(request.param)
    pytest.importorskip(MODULES[kind])
    base = tmp_path_factory.mktemp(f"console-{kind}")
    with OtlpReceiver() as rx:
        bridged = _launch(kind, True, base / "bridged", rx)
        bridged["exported"] = _exported(rx, kind)
    return {"kind": kind, "bridged": bridged, "plain": _launch(kind, False, base / "plain", None)}


def _tracebacks(lines: list[str]) -> list[list[str]]:
    """Each traceback in ``lines``: its header, its frames and the exception's line, in order (lines of others --
    another rank's, the agent's -- left out)."""
    found = []
    for start, line in enumerate(lines):
        at = line.find("Traceback (most recent call last):")
        if at < 0:
            continue
        tag = re.match(r"\[rank\d+\]:", line)
        prefix = tag.group(0) if tag else ""
        indent = len(line[len(prefix) :]) - len(line[len(prefix) :].lstrip(" "))
        block = [line]
        for following in lines[start + 1 :]:
            own = re.match(r"\[rank\d+\]:", following)
            if (own.group(0) if own else "") != prefix:
                continue
            body = following[len(prefix) :]
            block.append(following)
            if len(body) - len(body.lstrip(" ")) <= indent:  # the exception's line ends the traceback
                break
        found.append(block)
    return found


def test_the_job_fails_as_designed_bridged_and_plain(job: dict[str, Any]) -> None:
    bridged, plain = job["bridged"], job["plain"]
    message, _through = FAILURES[job["kind"]]
    assert bridged["code"] == plain["code"] == 1, (bridged["stderr"][-40:], plain["stderr"][-40:])
    for run in (bridged, plain):
        assert any(message in line for line in run["stderr"]), run["stderr"][-40:]
        ending = "SignalException" if job["kind"] == "stopped" else "ChildFailedError"
        assert any(ending in line for line in run["stderr"]), run["stderr"][-40:]
    assert bridged["exported"]["bridged"], bridged["exported"]


def test_every_traceback_is_plain_torchruns(job: dict[str, Any]) -> None:
    """The worker's traceback (its excepthook's), the agent's (``ChildFailedError``) and, where the worker has
    ``@record``, the error file's in the failure report: line for line plain torchrun's, none through the bridge."""
    bridged, plain = _tracebacks(job["bridged"]["stderr"]), _tracebacks(job["plain"]["stderr"])
    _message, through = FAILURES[job["kind"]]
    assert len(plain) == TRACEBACKS[job["kind"]] and any(through in line for block in plain for line in block), plain
    assert not [line for block in bridged for line in block if "torchelastic_otel" in line], bridged
    assert bridged == plain, "\n".join(["--- bridged:", *sum(bridged, []), "--- plain:", *sum(plain, [])])


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_the_console_has_the_lines_of_plain_torchrun(job: dict[str, Any], stream: str) -> None:
    """No line the plain console lacks, and none fewer (the two consoles interleave their processes' lines as their
    timing goes: the lines are compared as a multiset here, each traceback in order above)."""
    bridged = collections.Counter(job["bridged"][stream])
    plain = collections.Counter(job["plain"][stream])
    assert bridged - plain == collections.Counter() and plain - bridged == collections.Counter(), (
        f"only bridged: {sorted((bridged - plain).elements())}\nonly plain: {sorted((plain - bridged).elements())}"
    )
