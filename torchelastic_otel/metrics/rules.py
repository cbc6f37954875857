"""The rule table that maps a metric stream ``(group, name)`` to an OpenTelemetry instrument.

torchelastic encodes roles and function names in metric names (``workers.default.flakiness``,
``SimpleElasticAgent._rendezvous.duration.ms``) and reports latencies in milliseconds. OpenTelemetry wants stable
instrument names with those parts as attributes, durations in seconds, and the right instrument kind. Each
:class:`MetricRule` is a regular expression over the metric name; the first rule that matches wins. Named groups
fill the instrument-name template and, if listed in ``attributes``, become attributes. Every instrument also gets
the ``metric_group`` attribute.

Extend it by putting your rules in front of the defaults::

    from torchelastic_otel.metrics import DEFAULT_RULES, MetricRule, OtelMetricHandler

    rules = [MetricRule(r"(?P<name>.+)\\.bytes", "{name}", "counter", unit="By"), *DEFAULT_RULES]
    metrics.configure(OtelMetricHandler(rules=rules))
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from torchelastic_otel import _names as names

__all__ = ["MetricRule", "DEFAULT_RULES", "DURATION_BUCKETS_S", "valid_instrument_name", "Binding", "resolve"]

InstrumentKind = Literal["counter", "histogram", "gauge", "updown_counter"]

#: Histogram bucket advisory for durations in seconds: 1 ms to 1 h.
DURATION_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip

_NAME_OK = re.compile(r"[a-zA-Z][-_./a-zA-Z0-9]{0,254}")
_BAD_CHARS = re.compile(r"[^-_./a-zA-Z0-9]+")


def valid_instrument_name(name: str) -> str:
    """Any string -> a valid OTel instrument name (``[a-zA-Z][-_./a-zA-Z0-9]{0,254}``), stable for equal inputs."""
    if _NAME_OK.fullmatch(name):
        return name
    cleaned = _BAD_CHARS.sub("_", name).strip("_") or "unnamed"
    if not cleaned[0].isalpha() or not cleaned[0].isascii():
        cleaned = "m_" + cleaned
    return cleaned[:255]


@dataclass(frozen=True)
class MetricRule:
    """One row of the table.

    Args:
        pattern: regular expression, matched against the whole metric name.
        instrument: instrument-name template, formatted with the pattern's named groups.
        kind: ``counter``, ``histogram``, ``gauge`` or ``updown_counter``.
        unit: UCUM unit of the instrument (after ``scale``).
        scale: factor applied to each value (``0.001``: milliseconds to seconds).
        attributes: named groups of ``pattern`` that become attributes.
        description: instrument description.
        group: only apply to this metric group (``None``: any group).
    """

    pattern: str
    instrument: str
    kind: InstrumentKind
    unit: str = ""
    scale: float = 1.0
    attributes: tuple[str, ...] = ()
    description: str = ""
    group: str | None = None
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", re.compile(self.pattern))

    def fullmatch(self, name: str) -> re.Match[str] | None:
        """``pattern`` matched against the whole of ``name`` (compiled once, with the rule)."""
        return self._regex.fullmatch(name)


_ROLE = r"workers\.(?P<role>[^.]+)\."
_MS = 0.001

#: The default table (documented in the README). Order matters: the first match wins.
DEFAULT_RULES: tuple[MetricRule, ...] = (
    MetricRule(_ROLE + r"remaining_restarts", names.WORKERS_REMAINING_RESTARTS, "gauge",
               unit="{restart}", attributes=("role",), description="Restarts the agent may still make"),
    MetricRule(_ROLE + r"flakiness", names.WORKERS_FLAKINESS, "gauge",
               unit="%", attributes=("role",), description="Share of the restart budget used (100 when failed)"),
    MetricRule(_ROLE + r"(?P<state>init|healthy|unhealthy|stopped|succeeded|failed|unknown)",
               names.WORKERS_STATE_OBSERVATIONS, "counter", unit="{observation}",
               attributes=("role", "state"), description="Monitor observations of the worker group, by state"),
    MetricRule(_ROLE + r"run_total", names.WORKERS_RUNS, "counter",
               unit="{run}", attributes=("role",), description="Finished agent runs"),
    MetricRule(_ROLE + r"run_(?P<outcome>(?:success|failed)_(?:with|no)_retries)", names.WORKERS_RUN_OUTCOMES,
               "counter", unit="{run}", attributes=("role", "outcome"), description="Finished runs by outcome"),
    MetricRule(_ROLE + r"restarts", names.WORKERS_RESTARTS, "counter", unit="{restart}",
               attributes=("role",), description="Worker-group restarts (emitted by the bridge; torch has none)"),
    MetricRule(_ROLE + r"(?P<metric>[^.]+)", "torchelastic.workers.{metric}", "gauge", attributes=("role",)),
    MetricRule(r"(?P<function>.+)\.(?P<outcome>success|failure)", names.FUNCTION_CALLS, "counter",
               unit="{call}", attributes=("function", "outcome"), description="Calls of @prof functions by outcome"),
    MetricRule(r"(?P<function>.+)\.duration\.ms", names.FUNCTION_DURATION, "histogram", unit="s",
               scale=_MS, attributes=("function",), description="Duration of @prof functions"),
    MetricRule(r"(?P<name>.+?)[._-](?:ms|millis|milliseconds)", "{name}", "histogram", unit="s", scale=_MS),
    MetricRule(r"(?P<name>.+(?:_total|\.total|\.count|_count))", "{name}", "counter"),
    MetricRule(r"(?P<name>.+)", "{name}", "gauge"),
)  # fmt: skip


@dataclass(frozen=True)
class Binding:
    """What a ``(group, name)`` resolves to: the instrument's identity, the value scale and the attributes."""

    instrument: str
    kind: InstrumentKind
    unit: str
    description: str
    scale: float
    attributes: dict[str, str]


def resolve(rules: tuple[MetricRule, ...] | list[MetricRule], group: str, name: str) -> Binding:
    """Apply the first matching rule; a name no rule matches becomes a gauge of its own (sanitized) name."""
    for rule in rules:
        if rule.group is not None and rule.group != group:
            continue
        match = rule.fullmatch(name)
        if match is None:
            continue
        parts = {k: (v or "") for k, v in match.groupdict().items()}
        try:
            instrument = rule.instrument.format(**parts)
        except (KeyError, IndexError, ValueError):
            instrument = rule.instrument
        attributes = {"metric_group": group}
        for attr in rule.attributes:
            attributes[attr] = parts.get(attr, "")[:256]
        return Binding(
            valid_instrument_name(instrument), rule.kind, rule.unit, rule.description, rule.scale, attributes
        )
    return Binding(valid_instrument_name(name), "gauge", "", "", 1.0, {"metric_group": group})
