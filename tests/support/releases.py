"""What torch releases emit differently, for the tests that check torch's own output through the bridge.

``make test-compat`` runs the torchrun, worker and mapping tests against the oldest and the newest releases the
package supports. Where torch itself (not the bridge) emits something only from some release on, a test checks it
from that release on and, before it, checks that torch really emits none of it: on torch 2.13 nothing is checked
less than before. torch is imported only when asked, so the API tests keep running without it.
"""

from __future__ import annotations

import inspect


def torch_events_have_exit_code() -> bool:
    """``SimpleElasticAgent._construct_event(exit_code=, worker_pid=)`` -- and so ``exit_code`` and ``worker_pid`` in
    the metadata of torch's worker events -- from torch 2.10 on."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    return "exit_code" in inspect.signature(SimpleElasticAgent._construct_event).parameters


def torch_failure_report_names_signals() -> bool:
    """torch's ``ChildFailedError`` report names the signal a rank died of after its exit code
    (``exitcode  : -15 (pid: 42) (SIGTERM)``) from torch 2.11 on; 2.10 writes the exit code only."""
    from torch.distributed.elastic.multiprocessing import errors

    return "${signal_name}" in getattr(errors, "_FAILURE_FORMAT_TEMPLATE", "${signal_name}")
