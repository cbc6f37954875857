"""Drop-in for ``torch.distributed.elastic.metrics`` over OpenTelemetry.

Code written against torch's module works after a prefix change. Add :class:`OtelMetricHandler` to export::

    from torchelastic_otel import metrics

    metrics.configure(metrics.OtelMetricHandler())          # every group
    metrics.put_metric("loss", 0.25, "my_app")              # -> gauge "loss" {metric_group="my_app"}

    @metrics.prof(group="my_app")                           # -> torchelastic.function.calls / .duration
    def train_step(): ...

How names map to instruments is the rule table in :mod:`torchelastic_otel.metrics.rules`.
"""

from torchelastic_otel.metrics._otel import DEFAULT_MAX_PENDING, OtelMetricHandler
from torchelastic_otel.metrics.api import (  # noqa: F401
    ConsoleMetricHandler,
    MetricData,
    MetricHandler,
    MetricsConfig,
    MetricStream,
    NullMetricHandler,
    _get_metric_name,
    configure,
    get_elapsed_time_ms,
    getStream,
    prof,
    profile,
    publish_metric,
    put_metric,
)
from torchelastic_otel.metrics.rules import DEFAULT_RULES, DURATION_BUCKETS_S, MetricRule

__all__ = [
    "ConsoleMetricHandler",
    "MetricData",
    "MetricHandler",
    "MetricsConfig",
    "MetricStream",
    "NullMetricHandler",
    "configure",
    "get_elapsed_time_ms",
    "getStream",
    "initialize_metrics",
    "prof",
    "profile",
    "publish_metric",
    "put_metric",
    "OtelMetricHandler",
    "MetricRule",
    "DEFAULT_RULES",
    "DURATION_BUCKETS_S",
    "DEFAULT_MAX_PENDING",
]


def initialize_metrics(cfg: MetricsConfig | None = None):
    """torch's hook for metric initialisation; a no-op here as in torch."""
    pass
