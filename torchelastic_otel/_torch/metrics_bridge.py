"""Bridge torch's metric streams (every group) into OpenTelemetry, alongside whatever handlers are configured.

torch's ``put_metric`` and ``@prof`` go through ``MetricStream.add_value``; the bridge replaces that one method, so
every group is exported regardless of ``metrics.configure(...)`` calls made before or after install, and the
configured handler (the user's, or torch's null default) still receives every value.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torchelastic_otel._torch.patches import Patches
from torchelastic_otel.metrics._otel import OtelMetricHandler


def install(patches: Patches, handler: OtelMetricHandler) -> None:
    """Feed every value of torch's metric streams to ``handler`` as well as to the stream's own handler."""
    from torch.distributed.elastic.metrics import api as torch_metrics

    metric_data = torch_metrics.MetricData
    bridge_emit: Callable[[Any], None] = handler.emit  # takes torch's MetricData too: the same namedtuple fields

    def add_value(self: Any, metric_name: str, metric_value: int) -> None:
        data = metric_data(time.time(), self.group_name, metric_name, metric_value)
        bridge_emit(data)
        self.handler.emit(data)

    add_value.__torchelastic_otel__ = True  # type: ignore[attr-defined]
    patches.set(torch_metrics.MetricStream, "add_value", add_value)
