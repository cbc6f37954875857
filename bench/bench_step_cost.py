"""What the bridge costs a small training step, part by part: ``bench/bench_step_cost.py``.

``.venv/bin/python bench/bench_step_cost.py [--rounds 5] [--steps 3000] [--only "a;b"] [--parts] [--profile]
[--callgrind]``. A report, not a test: it exits 0 and asserts nothing.

The loop: a 1-rank gloo process group, ``DistributedDataParallel`` around ``Linear(128, 128)``, ``ReLU``,
``Linear(128, 128)`` (``--width``), batches of ``--batch`` rows from a ``DataLoader`` over an in-memory dataset,
``mse_loss``, ``backward()``, ``SGD.step()``; one thread (``torch.set_num_threads(1)``); some 0.9 ms a step on the
2-core machine this was written on. Each variant runs in a process of its own, started as a bridged agent starts a
worker (the bootstrap ``sitecustomize`` on ``PYTHONPATH``, torchrun's variables, ``OTEL_*`` to an ``OtlpReceiver`` on
127.0.0.1): the bridge is installed as in a worker, its pipeline built at start-up (no agent: no deferred build).
The variants, in a rotating order in every round so that load from other processes hits them alike:

- ``plain``: no bridge (torch's Flight Recorder at its default, 2,000 entries); ``plain, FR off``:
  ``TORCH_FR_BUFFER_SIZE=0``;
- ``hooks``: the bridge, but nothing runs beside the loop: the drainer paused and its periodic work (the stall
  watchdog's tick, the Flight Recorder's reads) taken off for the timed steps, no metric export (interval 10^9
  ms): the training path's own cost (the optimizer's step hook, the ``DataLoader`` and ``backward`` phase marks);
- ``+ drainer (steps)``: the drainer moves the marks into steps every 0.5 s (``TORCHELASTIC_OTEL_GOODPUT=0``: no
  phases), its periodic work still off;
- ``+ goodput``: the same with the phases and goodput (``anatomy``) on;
- ``+ periodic``: the drainer's periodic work on again (the watchdog's tick every second; the Flight Recorder read
  every second: ``TORCHELASTIC_OTEL_COLLECTIVES_INTERVAL=1``, ten times the default's rate at least);
- ``+ export``: and a metric collection and OTLP/gRPC export every second (``OTEL_METRIC_EXPORT_INTERVAL=1000``,
  the default is 60 s);
- ``bridged``: the bridge as a worker has it by default (export every 60 s: none during the loop; the Flight
  Recorder read every 10 s or more);
- ``bridged, FR off``: and ``TORCH_FR_BUFFER_SIZE=0`` (no recorder: the phases are resolved at each drain);
- experiments, run only when ``--only`` names them (nothing is changed on disk): ``bridged, switch 0.5 ms``
  (``sys.setswitchinterval(0.0005)``: a thread that wants the GIL asks for it after 0.5 ms, not 5 ms) and
  ``bridged, yield/64`` (the drain gives the step consumer its marks 64 at a time, ``time.sleep(0)`` between: the
  training thread can take the GIL back between them).

Printed per variant (medians over the rounds): the wall time of a step (µs) and its difference and ratio to
``plain``; the training thread's own CPU time a step (``time.thread_time``), and the rest of its wall time (waiting:
for the GIL, for gloo); the CPU time a step of the bridge's threads, by thread (``time.pthread_getcpuclockid``).
On a shared machine the wall times swing by tens of percent from run to run; the CPU times of the bridge's threads,
and ``--parts``, are the steadier measures.

``--parts``: the drainer's work for ``--steps`` steps, part by part, with the defaults and with the Flight Recorder
off: the steps run with the drainer paused, then each part is called once in the main thread, its CPU time taken.
``--profile``: in one more ``+ export`` process, cProfile on the drainer's thread and the metric reader's thread for
the timed steps. ``--callgrind``: under ``valgrind --tool=callgrind`` (instrumentation on only around each part,
``callgrind_control``), the instructions of the drain a step and of one Flight Recorder read: counts other
processes' load cannot change.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BOOTSTRAP = REPO / "torchelastic_otel" / "_bootstrap"
OFF = "1000000000"
#: name -> (bridged, environment, what the child does: "paused" drainer, "quiet" (no periodic work), "" as is)
VARIANTS: dict[str, tuple[bool, dict[str, str], str]] = {
    "plain": (False, {}, ""),
    "plain, FR off": (False, {"TORCH_FR_BUFFER_SIZE": "0"}, ""),
    "hooks": (True, {"OTEL_METRIC_EXPORT_INTERVAL": OFF}, "paused"),
    "+ drainer (steps)": (True, {"OTEL_METRIC_EXPORT_INTERVAL": OFF, "TORCHELASTIC_OTEL_GOODPUT": "0"}, "quiet"),
    "+ goodput": (True, {"OTEL_METRIC_EXPORT_INTERVAL": OFF}, "quiet"),
    "+ periodic": (True, {"OTEL_METRIC_EXPORT_INTERVAL": OFF, "TORCHELASTIC_OTEL_COLLECTIVES_INTERVAL": "1"}, ""),
    "+ export": (True, {"OTEL_METRIC_EXPORT_INTERVAL": "1000", "TORCHELASTIC_OTEL_COLLECTIVES_INTERVAL": "1"}, ""),
    "bridged": (True, {}, ""),
    "bridged, FR off": (True, {"TORCH_FR_BUFFER_SIZE": "0"}, ""),
    # experiments (not in the default set): the drain lets the training thread take the GIL back sooner
    "bridged, switch 0.5 ms": (True, {}, "switch=0.0005"),
    "bridged, yield/64": (True, {}, "yield=64"),
}
#: Run unless ``--only`` names others.
DEFAULT_VARIANTS = [name for name, (_, _, mode) in VARIANTS.items() if "=" not in mode]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(bridged: bool, extra: dict[str, str], endpoint: str) -> dict[str, str]:
    """A worker's environment as a bridged agent (or plain torchrun) hands it down, for a 1-rank job."""
    inherited = ("OTEL_", "TORCHELASTIC_", "TRACEPARENT", "TORCH_FR_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
    run_id = str(uuid.uuid4())
    env.update(RANK="0", LOCAL_RANK="0", GROUP_RANK="0", ROLE_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               ROLE_WORLD_SIZE="1", GROUP_WORLD_SIZE="1", ROLE_NAME="default", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT="0",
               TORCHELASTIC_MAX_RESTARTS="0", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")  # fmt: skip
    if bridged:
        env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(BOOTSTRAP), env.get("PYTHONPATH", "")])),
                   TORCHELASTIC_OTEL_AUTO_INSTALL="1", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
                   OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_EXPORTER_OTLP_INSECURE="true",
                   TRACEPARENT=f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01")  # fmt: skip
    env.update(extra)
    return env


# ---- the child: the loop ---------------------------------------------------------------------------------------------


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of every live thread of this process, by name (threads of one name added up)."""
    import threading

    out: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, ProcessLookupError, AttributeError):
            continue
        out[thread.name] = out.get(thread.name, 0.0) + seconds
    return out


def _loop(width: int, batch: int) -> Any:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    data = [(torch.randn(batch, width), torch.randn(batch, width)) for _ in range(16)]

    class Batches(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 1 << 30

        def __getitem__(self, i: int) -> Any:
            return data[i % len(data)]

    loader = iter(torch.utils.data.DataLoader(Batches(), batch_size=None, shuffle=False))

    def step() -> None:
        x, y = next(loader)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    return step


def child(opts: argparse.Namespace) -> None:
    step = _loop(opts.width, opts.batch)
    _step_fn.append(step)
    for setting in opts.child_mode.split(","):
        key, _, value = setting.partition("=")
        if key == "switch":
            opts.switch_interval = float(value)
        elif key == "yield":
            opts.yield_every = int(value)
    if opts.parts:
        _parts(step, opts)
        return
    if opts.yield_every:
        _yield_in_drain(opts.yield_every)
    if opts.switch_interval:
        sys.setswitchinterval(opts.switch_interval)
    for _ in range(opts.warmup):
        step()
    quiet = None
    mode = opts.child_mode
    if mode in ("paused", "quiet"):
        from torchelastic_otel._export import drainer

        quiet = list(drainer.state.periodic)
        drainer.state.periodic.clear()  # the watchdog's tick and the Flight Recorder's reads: none meanwhile
        if mode == "paused":
            paused = drainer.paused()
            paused.__enter__()
            drainer.drain_all()
    profiler = _DrainerProfile() if opts.profile_out else None
    if profiler is not None:
        profiler.start()
    threads_before = _thread_cpu()
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(opts.steps):
        step()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    threads_after = _thread_cpu()
    if profiler is not None:
        profiler.stop(opts.profile_out, opts.steps)
    if mode == "paused":
        paused.__exit__(None, None, None)
    if quiet is not None:
        from torchelastic_otel._export import drainer

        drainer.state.periodic.extend(quiet)
    main = "MainThread"
    others = {
        name: (threads_after[name] - threads_before.get(name, 0.0)) / opts.steps * 1e6
        for name in threads_after
        if name != main
    }
    result = {"wall_us": wall / opts.steps * 1e6, "cpu_us": cpu / opts.steps * 1e6, "threads_us": others}
    Path(opts.out).write_text(json.dumps(result))
    import torch.distributed as dist

    dist.destroy_process_group()


class _DrainerProfile:
    """cProfile in the drainer's thread and in the metric reader's thread, for the timed steps: a periodic callback
    (drainer) and a wrapped ``collect`` (reader) switch a profiler on in their own thread, and off at the end."""

    def __init__(self) -> None:
        import cProfile
        import threading

        self.profiles = {"drainer": cProfile.Profile(), "reader": cProfile.Profile()}
        self.on = threading.Event()
        self.off = threading.Event()
        self.stopped = threading.Event()
        self.removes: list[Any] = []

    def start(self) -> None:
        from torchelastic_otel import pipeline
        from torchelastic_otel._export import drainer, providers

        state = {"running": False}

        def toggle() -> None:
            if not state["running"] and not self.off.is_set():
                self.profiles["drainer"].enable()
                state["running"] = True
                self.on.set()
            elif state["running"] and self.off.is_set():
                self.profiles["drainer"].disable()
                state["running"] = False
                self.stopped.set()

        self.removes.append(drainer.add_periodic(toggle, 0.0))
        self.on.wait(5.0)
        readers = providers.readers(pipeline.get_pipeline().meter_provider)
        profile = self.profiles["reader"]
        for reader in readers:
            original = reader.collect

            def collect(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                if self.off.is_set():
                    return _original(*args, **kwargs)
                profile.enable()
                try:
                    return _original(*args, **kwargs)
                finally:
                    profile.disable()

            reader.collect = collect

    def stop(self, out: str, steps: int) -> None:
        import io
        import pstats

        self.off.set()
        self.stopped.wait(5.0)
        for remove in self.removes:
            remove()
        text = io.StringIO()
        for name, profile in self.profiles.items():
            try:
                stats = pstats.Stats(profile, stream=text)
            except TypeError:  # nothing was profiled
                text.write(f"== {name}: nothing ran\n")
                continue
            total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
            text.write(f"== {name} thread: {total / steps * 1e6:.1f} µs a step (cProfile's own cost included)\n")
            stats.sort_stats("tottime").print_stats(25)
            stats.sort_stats("cumulative").print_stats(25)
        Path(out).write_text(text.getvalue())


def _cpu_us(fn: Any) -> float:
    began = time.thread_time()
    fn()
    return (time.thread_time() - began) * 1e6


def _callgrind_part(fn: Any) -> float:
    """Run ``fn()`` with callgrind's instrumentation on, then dump what it counted (the next numbered dump file);
    0.0 (the parent reads the counts from the dumps)."""
    pid = str(os.getpid())
    subprocess.run(["callgrind_control", "-i", "on", pid], check=False, capture_output=True)
    fn()
    subprocess.run(["callgrind_control", "-i", "off", pid], check=False, capture_output=True)
    subprocess.run(["callgrind_control", "-d", pid], check=False, capture_output=True)
    return 0.0


def _parts(step: Any, opts: argparse.Namespace) -> None:
    """The drainer's work for ``--steps`` steps, part by part, each timed in this thread (CPU µs a step; under
    ``--callgrind``, counted instead): the steps run with the drainer paused and its periodic work off, then each
    part is called once, as the drainer's thread and the metric reader's would call it."""
    from torchelastic_otel import pipeline
    from torchelastic_otel._export import drainer, providers
    from torchelastic_otel._torch.worker import collectives
    from torchelastic_otel._torch.worker import steps as worker_steps

    measure = _callgrind_part if opts.callgrind else _cpu_us
    for _ in range(opts.warmup):
        step()
    drainer.state.periodic.clear()
    readers = providers.readers(pipeline.get_pipeline().meter_provider)
    out: dict[str, float] = {}
    with drainer.paused():
        for reader in readers:  # what the warm-up left: not this measure's
            reader.collect()
        loop = time.thread_time()
        for _ in range(opts.steps):
            step()
        out["the step itself (training thread)"] = (time.thread_time() - loop) * 1e6
        out["drain: marks -> steps, goodput, step histogram"] = measure(worker_steps.drain)
        entries: list[Any] = []
        out["Flight Recorder read (2,000 entries, GIL held)"] = measure(lambda: entries.extend(
            collectives.read_entries()[1]))  # fmt: skip
        out["arrivals + phases resolved and recorded"] = measure(lambda: collectives._arrive(entries))
        out["metric collection + OTLP export"] = measure(lambda: [r.collect() for r in readers])
    Path(opts.out).write_text(json.dumps({k: v / opts.steps for k, v in out.items()}))
    import torch.distributed as dist

    dist.destroy_process_group()


_step_fn: list[Any] = []


def _yield_in_drain(every: int) -> None:
    """Experiment (no file changed): the timeline's consumer gets the marks of a drain in chunks of ``every``, with
    ``time.sleep(0)`` between them, so the training thread can take the GIL back (``switch interval`` waits
    otherwise). Bench-only reach into ``steps``' consumer."""
    from torchelastic_otel._torch.worker import steps as worker_steps
    from torchelastic_otel._torch.worker.timeline import timeline

    consume = worker_steps._steps.consume

    def chunked(marks: list[Any]) -> None:
        if not marks:
            consume(marks)
            return
        for start in range(0, len(marks), every):
            if start:
                time.sleep(0)
            consume(marks[start : start + every])

    timeline.consume_with(chunked)


# ---- the parent: rounds of variants -------------------------------------------------------------------------------


def run_variant(name: str, opts: argparse.Namespace, endpoint: str, tmp: Path, **child_args: str) -> dict[str, Any]:
    bridged, extra, mode = VARIANTS[name]
    out = tmp / f"{uuid.uuid4().hex}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--child-mode", mode, "--out", str(out),
           "--steps", str(opts.steps), "--warmup", str(opts.warmup), "--width", str(opts.width),
           "--batch", str(opts.batch)]  # fmt: skip
    for key, value in child_args.items():
        cmd += [f"--{key.replace('_', '-')}", value] if value else [f"--{key.replace('_', '-')}"]
    if bridged and opts.yield_every:
        cmd += ["--yield-every", str(opts.yield_every)]
    if bridged and opts.switch_interval:
        cmd += ["--switch-interval", str(opts.switch_interval)]
    env = child_env(bridged, extra, endpoint)
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return dict(json.loads(out.read_text()))


def table(results: dict[str, list[dict[str, Any]]]) -> None:
    plain = statistics.median(r["wall_us"] for r in results["plain"]) if results.get("plain") else None
    print(f"  {'variant':<20}{'µs a step':>10}{'vs plain':>10}{'ratio':>8}{'own CPU':>9}{'waiting':>9}   "
          "the bridge's threads, CPU µs a step")  # fmt: skip
    for name, rows in results.items():
        if not rows:
            continue
        wall = statistics.median(r["wall_us"] for r in rows)
        cpu = statistics.median(r["cpu_us"] for r in rows)
        waiting = statistics.median(r["wall_us"] - r["cpu_us"] for r in rows)
        names = sorted({t for r in rows for t in r["threads_us"]})
        threads = {t: statistics.median(r["threads_us"].get(t, 0.0) for r in rows) for t in names}
        shown = ", ".join(f"{_short(t)} {v:.1f}" for t, v in sorted(threads.items(), key=lambda x: -x[1]) if v >= 0.05)
        diff = f"{wall - plain:+10.1f}{wall / plain:8.3f}" if plain else f"{'':>18}"
        print(f"  {name:<20}{wall:10.1f}{diff}{cpu:9.1f}{waiting:9.1f}   {shown}")


def _short(thread: str) -> str:
    return thread.replace("torchelastic-otel-", "").replace("OtelBatch", "batch-").replace("Thread-", "t")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--only", default="", help="variant names, separated by ';' (default: all but the experiments)")
    parser.add_argument("--profile", action="store_true", help="cProfile the drainer's and the reader's threads")
    parser.add_argument("--parts", action="store_true", help="the drainer's work part by part (CPU µs a step)")
    parser.add_argument("--callgrind", action="store_true", help="instructions of one drain a step (valgrind)")
    parser.add_argument("--yield-every", type=int, default=0,
                        help="experiment: the drain hands the GIL over (sleep(0)) after every N marks")  # fmt: skip
    parser.add_argument("--switch-interval", type=float, default=0.0,
                        help="experiment: sys.setswitchinterval(S) in the bridged processes")  # fmt: skip
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-mode", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", default="", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts)
        return 0
    from tests.support.otlp_receiver import OtlpReceiver

    names = [n.strip() for n in opts.only.split(";") if n.strip()] or DEFAULT_VARIANTS
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    print(f"DDP (1-rank gloo) of Linear({opts.width}, {opts.width}), ReLU, Linear; batch {opts.batch}; one thread; "
          f"{opts.steps} steps timed after {opts.warmup}; {opts.rounds} rounds of {len(names)} variants")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-step-cost-") as folder, OtlpReceiver() as rx:
        tmp = Path(folder)
        for round_ in range(opts.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                results[name].append(run_variant(name, opts, rx.grpc_endpoint, tmp))
            print(f"  round {round_ + 1}/{opts.rounds}: " + ", ".join(
                f"{n} {results[n][-1]['wall_us']:.0f}" for n in names), flush=True)  # fmt: skip
        print()
        table(results)
        if opts.parts:
            print()
            parts(opts, rx.grpc_endpoint, tmp)
        if opts.profile:
            out = tmp / "profile.txt"
            run_variant("+ export", opts, rx.grpc_endpoint, tmp, profile_out=str(out))
            print()
            print(out.read_text())
        if opts.callgrind:
            callgrind(opts, rx.grpc_endpoint, tmp)
    return 0


def parts(opts: argparse.Namespace, endpoint: str, tmp: Path) -> None:
    """``--parts``: medians over the rounds, for the bridge with its defaults and with the Flight Recorder off."""
    for name in ("bridged", "bridged, FR off"):
        rows = [run_variant(name, opts, endpoint, tmp, parts="") for _ in range(opts.rounds)]
        print(f"  {name}: the drainer's work for {opts.steps} steps, CPU µs a step (median of {opts.rounds})")
        for key in rows[0]:
            print(f"    {key:<52}{statistics.median(r[key] for r in rows):9.2f}")


def callgrind(opts: argparse.Namespace, endpoint: str, tmp: Path) -> None:
    """``--callgrind``: the drain of ``--parts`` in instructions a step, and one Flight Recorder read, under ``valgrind
    --tool=callgrind`` (the instrumentation on only around each part): counts the load of other processes cannot
    change. (Not the phases: they are a sample of the steps by the steps' own time, which valgrind stretches.)"""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("  callgrind: valgrind is not installed")
        return
    bridged, extra, _ = VARIANTS["bridged"]
    folder = tmp / f"callgrind-{uuid.uuid4().hex}"
    folder.mkdir()
    result = folder / "parts.json"
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={folder}/cg.out",
           sys.executable, str(Path(__file__).resolve()), "--child", "--parts", "--callgrind",
           "--out", str(result), "--steps", str(opts.steps), "--warmup", "50",
           "--width", str(opts.width), "--batch", str(opts.batch)]  # fmt: skip
    done = subprocess.run(cmd, env=child_env(bridged, extra, endpoint), cwd=REPO, capture_output=True, text=True,
                          timeout=7200)  # fmt: skip
    dumps = sorted(folder.glob("cg.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
    if not result.exists() or len(dumps) < 2:
        print(f"  callgrind: failed ({done.returncode}): {done.stderr[-1500:]}")
        return
    drain, read = (_callgrind_total(path) for path in dumps[:2])
    print(f"  callgrind, bridged: the drain of {opts.steps} steps' marks {drain / opts.steps:,.0f} instructions a "
          f"step; one Flight Recorder read {read:,.0f} instructions")  # fmt: skip


def _callgrind_total(path: Path) -> int:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return 0
    found = [int(line.split()[1]) for line in text.splitlines() if line.startswith(("summary:", "totals:"))]
    return max(found, default=0)


if __name__ == "__main__":
    sys.exit(main())
