"""``_export.meters.PerPipeline``: what an adapter holds of the pipeline's providers is made again after a change."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import torchelastic_otel
from tests.support.otel import KEEP_ALIVE
from torchelastic_otel import pipeline
from torchelastic_otel._export.meters import PerPipeline


def test_a_value_is_made_once_a_pipeline_and_again_after_it_changes(otel: Any) -> None:
    made: list[Any] = []

    def make(current: Any) -> Any:
        made.append(current.meter_provider)
        return current.meter_provider.get_meter("test")

    cache = PerPipeline(make)
    first = cache.get()
    assert cache.get() is first and cache.made() is first and made == [otel.meter_provider]
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    KEEP_ALIVE.append(provider)
    before = pipeline.generation()
    torchelastic_otel.setup(meter_provider=provider)
    assert pipeline.generation() > before
    assert cache.made() is None  # nothing made for the new pipeline yet
    second = cache.get()
    assert second is not first and made[-1] is provider and cache.get() is second


def test_a_failing_make_raises_and_is_tried_again(otel: Any) -> None:
    calls: list[int] = []

    def make(current: Any) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("not yet")
        return len(calls)

    cache = PerPipeline(make)
    try:
        cache.get()
    except RuntimeError:
        pass
    assert cache.get() == 2 and cache.get() == 2
