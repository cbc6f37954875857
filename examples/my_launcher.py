"""A custom launcher (torchelastic's "my_launcher.py" customization example) with the OpenTelemetry bridge installed.

torch's documentation shows how to launch workers without ``torchrun``: build a rendezvous handler and a
``WorkerSpec``, hand them to a ``LocalElasticAgent`` and call ``agent.run()``. One call to
``torchelastic_otel.install()`` before ``agent.run()`` bridges this agent and every worker it starts (the workers
install the bridge at start-up), exactly as ``torchelastic-otel run`` does for ``torchrun``::

    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 \\
        python examples/my_launcher.py --nproc-per-node 2 --max-restarts 1 examples/train_ddp.py --steps 10

The rendezvous is c10d on 127.0.0.1 (a free port, this process hosts the store), or ``--rdzv-backend static``
for a single node. The pipeline is configured from the standard ``OTEL_*`` variables.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import uuid

from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

import torchelastic_otel

HOST = "127.0.0.1"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--monitor-interval", type=float, default=0.1)
    parser.add_argument("--run-id", default=None, help="rendezvous/run id (default: a fresh uuid)")
    parser.add_argument("--rdzv-backend", choices=("c10d", "static"), default="c10d")
    parser.add_argument("--role", default="trainer")
    parser.add_argument("--log-dir", default=None, help="torchelastic log directory (default: a temporary one)")
    parser.add_argument("script", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments of the training script")
    return parser.parse_args(argv)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def make_rdzv_handler(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    port = free_port()
    config = {"is_host": True} if args.rdzv_backend == "c10d" else {"rank": 0}
    params = RendezvousParameters(
        backend=args.rdzv_backend,
        endpoint=f"{HOST}:{port}",
        run_id=args.run_id,
        min_nodes=1,
        max_nodes=1,
        **config,
    )
    return get_rendezvous_handler(params)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.run_id = args.run_id or str(uuid.uuid4())

    # Before the agent runs: torch's agent, rendezvous, events and metrics now export to OpenTelemetry, and the
    # workers started below install the bridge themselves. With the run id in the environment first, the agent's
    # resource carries it (torchelastic.run_id), as the workers' do.
    os.environ.setdefault("TORCHELASTIC_RUN_ID", args.run_id)
    torchelastic_otel.install()

    rdzv_handler = make_rdzv_handler(args)
    spec = WorkerSpec(
        role=args.role,
        local_world_size=args.nproc_per_node,
        entrypoint=sys.executable,
        args=("-u", args.script, *args.script_args),
        rdzv_handler=rdzv_handler,
        max_restarts=args.max_restarts,
        monitor_interval=args.monitor_interval,
    )
    agent = LocalElasticAgent(spec, logs_specs=DefaultLogsSpecs(log_dir=args.log_dir), start_method="spawn")
    try:
        run_result = agent.run()
    except Exception as exc:
        print(f"agent failed: {type(exc).__name__}: {exc}", flush=True)
        return 1
    finally:
        rdzv_handler.shutdown()
        torchelastic_otel.flush()
    if run_result.is_failed():
        rank, failure = min(run_result.failures.items())
        print(f"worker {rank} failed with: {failure}", flush=True)
        return 1
    print(f"worker 0 return value is: {run_result.return_values.get(0)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
