"""The run id a launcher settles before torch starts the run, shared by ``torchelastic-otel run`` and
``torchelastic-otel accelerate launch``: the agent's resource carries the run id it is built with, so it must be
known (and the pipeline rebuilt for it, where built for another) before the bridge is installed."""

from __future__ import annotations

import os
import uuid
from typing import Any

__all__ = ["settle_run_id", "renew_if_stale", "install_for_run", "RunIdKept"]

#: Where the agent's resource reads the run id from, when the pipeline is built.
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"


def settle_run_id(args: Any, standalone_id: str | None = None) -> None:
    """Generate torchrun's run id now where ``torch.distributed.run.run`` would generate it later.

    Same rules as torch 2.x: ``--standalone``, and a single-node static rendezvous without an endpoint, become a
    c10d rendezvous on ``localhost:0`` with a fresh uuid. Done here, torch then keeps these arguments as given.
    """
    if args.standalone:
        args.standalone = False
        args.rdzv_backend, args.rdzv_endpoint = "c10d", "localhost:0"
        args.rdzv_id = standalone_id or str(uuid.uuid4())
        return
    if args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None:
        from torch.distributed.run import parse_min_max_nnodes

        if parse_min_max_nnodes(args.nnodes)[1] == 1:
            args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())


def renew_if_stale(run_id: str | None, wait_seconds: float) -> None:
    """Rebuild the bridge's pipeline where it was built for another run id than this run's: an earlier run of this
    process (``main`` called again: a notebook, a test suite), or the early build's guess (waited for up to
    ``wait_seconds``). Its resource would otherwise give this run's records the other run's ``torchelastic.run_id``."""
    from torchelastic_otel import _names as names
    from torchelastic_otel import pipeline

    if pipeline.building():
        pipeline.wait_built(wait_seconds)
    current = pipeline.ready()
    if current is None or current.resource is None:
        return  # nothing built yet (install() builds it now), or the application's own providers
    if current.resource.attributes.get(names.RUN_ID) != run_id:
        pipeline.renew()


def install_for_run(run_id: str | None, wait_seconds: float) -> None:
    """Install the bridge for the run torch is about to start: ``TORCHELASTIC_RUN_ID`` set where ``run_id`` names
    one (not ``none``), the pipeline rebuilt where it was built for another run id (:func:`renew_if_stale`), then
    ``install()``."""
    from torchelastic_otel._install import install

    if run_id and run_id != "none":
        os.environ[RUN_ID_ENV] = run_id
    renew_if_stale(os.environ.get(RUN_ID_ENV), wait_seconds)
    install()


class RunIdKept:
    """``TORCHELASTIC_RUN_ID`` as it was before the block, after it: a launcher called in-process (in place of
    torch's) gives its caller's environment back."""

    def __enter__(self) -> None:
        self._previous = os.environ.get(RUN_ID_ENV)

    def __exit__(self, *exc: object) -> None:
        if self._previous is None:
            os.environ.pop(RUN_ID_ENV, None)
        else:
            os.environ[RUN_ID_ENV] = self._previous
