"""``torchelastic-otel run ...`` / ``python -m torchelastic_otel.run ...``: torchrun with the bridge installed.

Takes exactly torchrun's arguments. The pipeline is configured from ``OTEL_*``; the agent and every worker are
bridged (workers install the bridge at start-up through ``PYTHONPATH``). The run id is settled before the bridge
starts, so the agent's resource carries ``torchelastic.run_id`` like the workers' do.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any

__all__ = ["main"]


def _settle_run_id(args: Any) -> None:
    """Generate torchrun's run id now where ``torch.distributed.run.run`` would generate it later.

    Same rules as torch 2.x: ``--standalone``, and a single-node static rendezvous without an endpoint, become a
    c10d rendezvous on ``localhost:0`` with a fresh uuid. Done here, torch then keeps these arguments as given.
    """
    if args.standalone:
        args.standalone = False
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
        return
    if args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None:
        from torch.distributed.run import parse_min_max_nnodes

        if parse_min_max_nnodes(args.nnodes)[1] == 1:
            args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":  # `torchelastic-otel report PATH...`: render OTLP JSON Lines files
        from torchelastic_otel.report import main as report

        sys.exit(report(argv[1:]))
    if argv and argv[0] == "run":  # `torchelastic-otel run ...`
        argv = argv[1:]
    from torch.distributed import run as torchrun

    args = torchrun.parse_args(argv)
    _settle_run_id(args)
    # The agent's resource reads the run id from the environment when install() builds the pipeline; a launcher
    # called in-process (in place of torch.distributed.run.main) then gets its environment back as it was.
    previous = os.environ.get("TORCHELASTIC_RUN_ID")
    if args.rdzv_id and args.rdzv_id != "none":
        os.environ["TORCHELASTIC_RUN_ID"] = args.rdzv_id
    from torchelastic_otel._install import install

    try:
        install()
        _run(torchrun, args)
    finally:
        if previous is None:
            os.environ.pop("TORCHELASTIC_RUN_ID", None)
        else:
            os.environ["TORCHELASTIC_RUN_ID"] = previous


def _run(torchrun: Any, args: Any) -> None:
    """torch's ``main`` is ``@record``-decorated ``run(parse_args(...))``; keep the decoration, pass our args."""
    from torch.distributed.elastic.multiprocessing.errors import record

    record(torchrun.run)(args)


if __name__ == "__main__":
    main()
