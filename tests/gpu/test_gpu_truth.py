"""The bridge's figures of a CUDA job against the job's own CUDA events, on a real GPU.

Each job is one bridged ``torchelastic-otel run`` of ``gpu_worker.py`` exporting OTLP JSON files, then
``torchelastic-otel report --json`` of them, as a user would. The worker records its own CUDA events at its phases'
boundaries (its truth); the report's ``steps[].phases`` (the median seconds per step, on the GPU's clock) must be
within 25 % of the worker's medians, and the verdicts right: a healthy loop that syncs each step or every 50 steps
is not compute-bound, a loop waiting for its loader is input-bound, a CUDA leak is named with its forecast, an OOM's
root cause carries the allocator's figures. Every figure is printed beside its truth (``make test-gpu`` shows them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.env import FILE_EXPORTERS, clean_env

WORKER = ROOT / "tests" / "support" / "workers" / "gpu_worker.py"
TOLERANCE = 0.25
#: Where a phase is this short, 25 % of it is below what a GPU's clock and a step's jitter resolve.
FLOOR_S = 0.0002

JOBS: dict[str, dict[str, str]] = {
    "sync-every-step": {"GPU_MODE": "compute", "GPU_SYNC_EVERY": "1", "GPU_STEPS": "300"},
    "sync-every-50": {"GPU_MODE": "compute", "GPU_SYNC_EVERY": "50", "GPU_STEPS": "300"},
    "input-bound": {"GPU_MODE": "input", "GPU_STEPS": "150", "GPU_INPUT_DELAY": "0.003"},
    "cuda-leak": {"GPU_MODE": "leak", "GPU_STEPS": "1000", "GPU_LEAK_MIB": "32"},  # ~11 s: 1 s exports see it
    "oom": {"GPU_MODE": "oom"},
}


def launcher(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    return found


def run_job(name: str, env_extra: dict[str, str], directory: Path, *, bridged: bool = True, nproc: int = 1,
            restarts: int = 0, timeout: float = 150) -> tuple[subprocess.CompletedProcess, Path, Path]:  # fmt: skip
    """One torchrun job of the GPU worker; its OTLP files and its own truth."""
    files, truth = directory / f"{name}-files", directory / f"{name}-truth"
    files.mkdir(parents=True, exist_ok=True)
    truth.mkdir(parents=True, exist_ok=True)
    env = clean_env(**env_extra, GPU_OUT=str(truth))
    if bridged:
        env.update(FILE_EXPORTERS, OTEL_METRIC_EXPORT_INTERVAL="1000", TORCHELASTIC_OTEL_FILE_DIR=str(files))
        command = [launcher("torchelastic-otel"), "run"]
    else:
        command = [launcher("torchrun")]
    command += ["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", str(restarts), str(WORKER)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    return done, files, truth


def report(files: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "torchelastic_otel.report", str(files), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = json.loads(done.stdout)["runs"]
    return run


def truth_of(directory: Path, rank: int = 0, restart: int = 0) -> dict[str, Any]:
    return json.loads((directory / f"rank{rank}-restart{restart}.json").read_text())


JOB_FILES: dict[str, Path] = {}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, dict[str, Any], Path]]:
    """Every job once, bridged, one after the other (they share the GPU): (the process, its report, its truth)."""
    directory = tmp_path_factory.mktemp("gpu")
    out = {}
    for name, env in JOBS.items():
        done, files, truth = run_job(name, env, directory)
        JOB_FILES[name] = files
        out[name] = (done, report(files), truth)
        print(f"\n[{name}] exit {done.returncode}")
    return out


def _rank0(run: dict[str, Any]) -> dict[str, Any]:
    (found,) = [s for s in run["steps"] if s["rank"] == 0]
    return found


def _compare(name: str, run: dict[str, Any], truth: dict[str, Any], phases: tuple[str, ...]) -> list[str]:
    """The bridge's median of each phase beside the job's own; the phases outside the tolerance."""
    steps = _rank0(run)
    wrong = []
    print(f"\n[{name}] clock {steps['clock']}, gpu_idle {steps['gpu_idle']}, verdict {run['verdict']}")
    for phase in phases:
        bridge, own = steps["phases"][phase], truth["median"][phase]
        print(f"  {phase:<10} bridge {bridge * 1e3:8.3f} ms   CUDA events {own * 1e3:8.3f} ms")
        if bridge is None or abs(bridge - own) > max(TOLERANCE * own, FLOOR_S):
            wrong.append(f"{phase}: {bridge} vs {own}")
    return wrong


@pytest.mark.parametrize("name", ["sync-every-step", "sync-every-50"])
def test_a_compute_loop_s_phases_are_the_gpu_s_and_it_is_healthy(jobs: Any, name: str) -> None:
    done, run, truth_dir = jobs[name]
    assert done.returncode == 0, done.stderr[-3000:]
    truth = truth_of(truth_dir)
    assert _rank0(run)["clock"] == "device"
    assert not _compare(name, run, truth, ("forward", "backward", "optimizer"))
    assert run["verdict"]["verdict"] == "healthy", run["verdict"]


def test_a_loop_waiting_for_its_loader_is_input_bound(jobs: Any) -> None:
    done, run, truth_dir = jobs["input-bound"]
    assert done.returncode == 0, done.stderr[-3000:]
    truth = truth_of(truth_dir)
    assert not _compare("input-bound", run, truth, ("input", "forward", "backward"))
    assert run["verdict"]["verdict"] == "input-bound", run["verdict"]
    steps = _rank0(run)
    own_share = truth["median"]["input"] / truth["median"]["step"]
    print(f"  input share of the GPU's step: bridge {steps['gpu_idle']}  CUDA events {own_share:.3f}")
    assert steps["gpu_idle"] == pytest.approx(own_share, abs=TOLERANCE * own_share)


def test_a_cuda_leak_is_named_with_its_forecast(jobs: Any) -> None:
    done, run, truth_dir = jobs["cuda-leak"]
    assert done.returncode == 0, done.stderr[-3000:]
    truth = truth_of(truth_dir)
    print(f"\n[cuda-leak] verdict {run['verdict']}; the job's peak {truth['peak_allocated'] / 2**30:.1f} GiB")
    assert run["verdict"]["verdict"] == "memory-creep", run["verdict"]
    assert "cuda" in run["verdict"]["reason"]


def test_an_oom_s_root_cause_carries_the_allocator_s_figures(jobs: Any) -> None:
    done, run, _ = jobs["oom"]
    assert done.returncode != 0
    cause = run["root_cause"]
    print(f"\n[oom] root cause {json.dumps(cause)[:800]}")
    assert cause is not None and cause["exception_type"] and "OutOfMemoryError" in cause["exception_type"]
    memory = cause.get("cuda_memory")
    assert memory and (memory.get("allocated_bytes") or 0) >= 1 << 30
    assert (memory.get("total_bytes") or 0) > memory["allocated_bytes"]


def test_each_rank_s_gpu_is_read_through_nvml(jobs: Any) -> None:
    """``hw.gpu.*`` from the worker of a CUDA job (NVML through nvidia-ml-py, which the GPU image has)."""
    assert jobs["sync-every-step"][0].returncode == 0
    names: set[str] = set()
    for path in JOB_FILES["sync-every-step"].rglob("*"):
        if path.is_file() and "metric" in path.name:
            for line in path.read_text(errors="replace").splitlines():
                for name in ("hw.gpu.utilization", "hw.gpu.memory.usage", "hw.gpu.memory.limit", "hw.power",
                             "hw.temperature"):  # fmt: skip
                    if f'"name":"{name}"' in line.replace(" ", ""):
                        names.add(name)
    print(f"\n[nvml] {sorted(names)}")
    assert {"hw.gpu.utilization", "hw.gpu.memory.usage", "hw.power", "hw.temperature"} <= names
