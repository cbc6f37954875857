"""One drop-in scenario of ``test_launcher_dropin.py`` in a process of its own, under plain torch or with the bridge
installed the custom-launcher way (``torchelastic_otel.install()`` before launching in-process).

Usage: ``PYTHONPATH=. python tests/support/workers/_dropin_child.py MODE SCENARIO OUT_JSON`` with MODE ``plain`` or
``bridged``. The scenario's observations (return values, what the workers saw, the launching process's environment
around each launch) are written to OUT_JSON, so the test compares plain and bridged runs of the same code. A process of
its own per run: ``install()`` changes torch for the whole process, and the scenarios fork.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
import uuid
from typing import Any

from tests.support.ports import free_port  # the repository is on PYTHONPATH (test_launcher_dropin)

BRIDGE_VARS = (
    "TRACEPARENT",
    "TRACESTATE",
    "TORCHELASTIC_OTEL_FAILURE_DIR",
    "TORCHELASTIC_OTEL_AUTO_INSTALL",
    "PYTHONPATH",
)

#: A script worker: writes what it sees of the bridge to ``<dir>/<RANK>.json``.
SCRIPT = (
    "import json, os, sys\n"
    f"names = {BRIDGE_VARS!r}\n"
    "view = {'env': {k: os.environ.get(k) for k in names}, 'installed': 'torchelastic_otel' in sys.modules}\n"
    "open(os.path.join(sys.argv[1], os.environ['RANK'] + '.json'), 'w').write(json.dumps(view))\n"
)


def worker_view() -> dict[str, Any]:
    """A function worker's view: its rank, the bridge's variables in its environment, whether the bridge is
    installed in it (spawned: by the bootstrap at start-up; forked: inherited from the agent)."""
    installed = False
    if "torchelastic_otel" in sys.modules:
        import torchelastic_otel

        installed = torchelastic_otel.is_installed()
    return {
        "rank": int(os.environ["RANK"]),
        "env": {name: os.environ.get(name) for name in BRIDGE_VARS},
        "installed": installed,
    }


def config(nnodes: int = 1, nproc: int = 2, start_method: str = "spawn", endpoint: str = "127.0.0.1:0",
           run_id: str | None = None) -> Any:  # fmt: skip
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc,
        run_id=run_id or uuid.uuid4().hex[:8],
        rdzv_backend="c10d",
        rdzv_endpoint=endpoint,
        rdzv_configs={"join_timeout": 60, "timeout": 60},
        max_restarts=0,
        monitor_interval=0.05,
        start_method=start_method,
    )


def launch(entrypoint: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``elastic_launch`` in this process; the environment before and after it (it must not change)."""
    from torch.distributed.launcher.api import elastic_launch

    before = dict(os.environ)
    result = elastic_launch(config(**kwargs), entrypoint)(*args)
    return {"result": result, "environ_changed": _diff(before, dict(os.environ))}


def _diff(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def script_views(directory: str) -> dict[str, Any]:
    return {name[:-5]: json.load(open(os.path.join(directory, name))) for name in sorted(os.listdir(directory))}


# ---- scenarios ----------------------------------------------------------------------------------------------------


def sequential() -> dict[str, Any]:
    """In-process launches one after another in one process: functions (spawned, then forked workers) and a
    script (subprocess workers), each an agent of its own hosting its rendezvous store."""
    out: dict[str, Any] = {}
    for name, start_method in (("spawn", "spawn"), ("fork", "fork")):
        launched = launch(worker_view, start_method=start_method)
        out[name] = {"views": [launched["result"][r] for r in sorted(launched["result"])],
                     "environ_changed": launched["environ_changed"]}  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        launched = launch(sys.executable, "-c", SCRIPT, directory)
        out["script"] = {"returns": sorted(launched["result"].items()), "views": script_views(directory),
                         "environ_changed": launched["environ_changed"]}  # fmt: skip
    return out


def _agent_node(endpoint: str, run_id: str, queue: Any) -> None:
    """One more node of a two-node job, in a process of its own (started by the scenario). It starts with a
    garbage collection, as any code of a forked child may run one (allocations start them): whatever garbage the
    launching process left is collected here, in the child."""
    import gc

    gc.collect()
    gc.enable()
    launched = launch(worker_view, nnodes=2, endpoint=endpoint, run_id=run_id)
    queue.put(sorted(v["rank"] for v in launched["result"].values()))


def agents(context_name: str) -> dict[str, Any]:
    """Several agents of one job from one process: this process's agent and one in a ``context_name`` (spawn or
    fork) child, as torch's launcher tests do. The fork case forks after an in-process launch that hosted its
    rendezvous store here (and after one that failed: its exception's traceback keeps that agent in a reference
    cycle), which the child inherits. Automatic garbage collection is off in this process (as some training
    scripts have it), so whatever garbage it made is still there when it forks, for the child to collect."""
    import gc

    gc.disable()
    previous = launch(worker_view, nproc=1)
    failed = None
    try:
        launch(_fail, nproc=1)
    except Exception as exc:  # ChildFailedError, as plain torch
        failed = type(exc).__name__
    ctx = mp.get_context(context_name)
    queue = ctx.Queue()
    endpoint, run_id = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]
    child = ctx.Process(target=_agent_node, args=(endpoint, run_id, queue))
    child.start()
    here = launch(worker_view, nnodes=2, endpoint=endpoint, run_id=run_id)
    child.join(120)
    hung = child.is_alive()
    if hung:
        child.kill()
        child.join()
    ranks = sorted(v["rank"] for v in here["result"].values()) + ([] if hung else queue.get(timeout=10))
    return {
        "previous_environ_changed": previous["environ_changed"],
        "failed_launch": failed,
        "child_exitcode": None if hung else child.exitcode,
        "hung": hung,
        "ranks": sorted(ranks),
        "environ_changed": here["environ_changed"],
    }


def _fail() -> None:
    raise RuntimeError("this worker fails")


def events() -> dict[str, Any]:
    """torch's rendezvous event call chain: ``construct_and_record_rdzv_event`` -> ``record_rdzv_event`` (here a
    wrapper, as a library would put there) whenever torch's "dynamic_rendezvous" destination has a real handler, and
    never while it is a NullHandler; called directly and from a real rendezvous."""
    import torch.distributed.elastic.events as torch_events
    import torch.distributed.elastic.events.handlers as torch_handlers
    import torch.distributed.elastic.rendezvous.registry as registry
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    seen: list[tuple[str, str, str]] = []
    original = torch_events.record_rdzv_event

    def wrapper(event: Any) -> None:
        seen.append((type(event).__module__, event.message, str(getattr(event.node_state, "value", ""))))
        original(event)

    torch_events.record_rdzv_event = wrapper
    out: dict[str, Any] = {}
    try:
        for handler_name, handler in (("null", logging.NullHandler()), ("stream", logging.StreamHandler(sys.stdout))):
            torch_handlers._log_handlers["dynamic_rendezvous"] = handler
            torch_events._events_loggers.pop("dynamic_rendezvous", None)
            seen.clear()
            torch_events.construct_and_record_rdzv_event(
                run_id="direct", message="called directly", node_state=torch_events.NodeState.RUNNING
            )
            params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{free_port()}", run_id="chain",
                                          min_nodes=1, max_nodes=1, is_host=True)  # fmt: skip
            rdzv = registry.get_rendezvous_handler(params)
            rdzv.next_rendezvous()
            rdzv.shutdown()
            del rdzv
            out[handler_name] = list(seen)
    finally:
        torch_events.record_rdzv_event = original
    return out


def run_main(mode: str) -> dict[str, Any]:
    """The launcher's ``main`` called in-process, twice (as torch's ``test_run.py`` calls
    ``torch.distributed.run.main``): torch's, or the bridge's standing in for it."""
    if mode == "plain":
        from torch.distributed.run import main as launcher_main
    else:
        from torchelastic_otel.run import main as launcher_main
    out: dict[str, Any] = {"launches": []}
    for run_id in ("first", "second"):
        with tempfile.TemporaryDirectory() as directory:
            before = dict(os.environ)
            launcher_main(["--nnodes=1", "--nproc-per-node=2", f"--rdzv-id={run_id}", "--rdzv-backend=c10d",
                           "--rdzv-endpoint=127.0.0.1:0", "--monitor-interval=0.05", "--start-method=spawn",
                           "--no-python", sys.executable, "-c", SCRIPT, directory])  # fmt: skip
            changed = _diff(before, dict(os.environ))
            out["launches"].append({"views": script_views(directory), "environ_changed": changed})
    return out


def _hosting_agent_run(port: int, entrypoint: Any, args: tuple[Any, ...] = ()) -> Any:
    """An agent whose c10d rendezvous store this process hosts on ``port``; run to the end. Returns weak
    references to the agent and its rendezvous handler."""
    import weakref

    import torch.distributed.elastic.rendezvous.registry as registry
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{port}", run_id=uuid.uuid4().hex[:8],
                                  min_nodes=1, max_nodes=1, is_host=True)  # fmt: skip
    handler = registry.get_rendezvous_handler(params)
    spec = WorkerSpec(role="default", local_world_size=1, entrypoint=entrypoint, args=args, rdzv_handler=handler,
                      max_restarts=0, monitor_interval=0.05)  # fmt: skip
    agent = LocalElasticAgent(spec, start_method="spawn", logs_specs=DefaultLogsSpecs(log_dir=tempfile.mkdtemp()))
    result = agent.run()
    handler.shutdown()
    assert not result.is_failed(), result
    return weakref.ref(agent), weakref.ref(handler)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def lifetime() -> dict[str, Any]:
    """Whether an agent, its rendezvous handler and the store it hosts are gone once its run is over and the
    caller lets go of them -- by reference counting alone (the garbage collector off), as with plain torch."""
    import gc

    _hosting_agent_run(free_port(), worker_view)  # the first run imports what the others use
    gc.collect()
    gc.disable()
    try:
        out = {}
        for name, entrypoint, args in (("function", worker_view, ()), ("script", sys.executable, ("-c", "0"))):
            port = free_port()
            agent, handler = _hosting_agent_run(port, entrypoint, args)
            out[name] = {"agent_alive": agent() is not None, "handler_alive": handler() is not None,
                         "store_port_open": _port_open(port)}  # fmt: skip
        return out
    finally:
        gc.enable()


SCENARIOS = {
    "sequential": sequential,
    "agents_spawn": lambda: agents("spawn"),
    "agents_fork": lambda: agents("fork"),
    "events": events,
    "run_main": lambda: run_main(sys.argv[1]),
    "lifetime": lifetime,
}


def main() -> None:
    mode, scenario, out_path = sys.argv[1:4]
    environ_before = dict(os.environ)
    if mode == "bridged":
        import torchelastic_otel

        if not torchelastic_otel.install():
            raise SystemExit("bridge not installed")
    started = time.monotonic()
    result = SCENARIOS[scenario]()
    result["seconds"] = time.monotonic() - started
    result["environ_changed_overall"] = _diff(environ_before, dict(os.environ))
    with open(out_path, "w") as fh:
        json.dump(result, fh, default=str)


if __name__ == "__main__":
    main()
