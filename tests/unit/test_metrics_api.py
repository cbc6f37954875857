"""The metrics API is a drop-in for ``torch.distributed.elastic.metrics``: same names, signatures and results.

Each claim is checked against torch's real module, with a capturing handler configured in both.
"""

from __future__ import annotations

import inspect
import re
import time
import types
import warnings

import pytest
import torch.distributed.elastic.metrics as tm
import torch.distributed.elastic.metrics.api as tm_api

from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import metrics
from torchelastic_otel.metrics import api as te_api

# ---- helpers ---------------------------------------------------------------------------------------------------


class _Collects:
    """A metric handler that keeps every value it is handed."""

    def __init__(self) -> None:
        self.data: list = []

    def emit(self, metric_data):
        self.data.append(metric_data)

    def shape(self) -> list[tuple]:
        """(group, name, value type) of every value, in order."""
        return [(d.group_name, d.name, type(d.value)) for d in self.data]


class Collecting(_Collects, te_api.MetricHandler):
    """The bridge's own handler type."""


class TorchCollecting(_Collects, tm_api.MetricHandler):
    """torch's handler type."""


@pytest.fixture
def torch_metrics_state():
    """Restore torch's metric routing (``_metrics_map`` and the default handler) after the test."""
    saved_map, saved_default = dict(tm_api._metrics_map), tm_api._default_metrics_handler
    try:
        yield
    finally:
        tm_api._metrics_map.clear()
        tm_api._metrics_map.update(saved_map)
        tm_api._default_metrics_handler = saved_default


@pytest.fixture
def both(clean_state, torch_metrics_state):
    """A collecting handler configured as the default of the bridge's module and of torch's."""
    ours, theirs = Collecting(), TorchCollecting()
    metrics.configure(ours)
    tm.configure(theirs)
    return ours, theirs


# ---- names and signatures --------------------------------------------------------------------------------------

PUBLIC = [
    "MetricData", "MetricsConfig", "MetricHandler", "ConsoleMetricHandler", "NullMetricHandler", "MetricStream",
    "configure", "getStream", "put_metric", "publish_metric", "prof", "profile", "get_elapsed_time_ms",
    "initialize_metrics", "_get_metric_name",
]  # fmt: skip


def _torch_attr(name: str):
    return getattr(tm, name) if hasattr(tm, name) else getattr(tm_api, name)


@pytest.mark.parametrize("name", PUBLIC)
def test_public_names_exist_in_both(name):
    assert hasattr(metrics, name)
    assert _torch_attr(name) is not None


def test_all_lists_cover_torchs():
    assert set(tm_api.__all__) <= set(te_api.__all__)
    assert set(tm_api.__all__) <= set(metrics.__all__) | {"MetricStream"} | set(te_api.__all__)
    torch_public = {n for n in dir(tm) if not n.startswith("_") and n not in ("api", "Optional")}
    assert torch_public <= set(dir(metrics))
    for name in te_api.__all__:
        assert hasattr(te_api, name)
    for name in metrics.__all__:
        assert hasattr(metrics, name)


def _params(fn) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize(
    "name",
    [
        "configure",
        "getStream",
        "put_metric",
        "publish_metric",
        "prof",
        "profile",
        "get_elapsed_time_ms",
        "initialize_metrics",
        "_get_metric_name",
    ],  # fmt: skip
)
def test_function_signatures_equal_torchs(name):
    assert _params(getattr(metrics, name)) == _params(_torch_attr(name))


@pytest.mark.parametrize(
    ("cls", "method"),
    [
        ("MetricStream", "__init__"),
        ("MetricStream", "add_value"),
        ("MetricsConfig", "__init__"),
        ("MetricHandler", "emit"),
        ("ConsoleMetricHandler", "emit"),
        ("NullMetricHandler", "emit"),
    ],  # fmt: skip
)
def test_method_signatures_equal_torchs(cls, method):
    ours = getattr(getattr(metrics, cls), method)
    theirs = getattr(_torch_attr(cls), method)
    assert _params(ours) == _params(theirs)


def test_metric_data_and_config_equal_torchs():
    assert metrics.MetricData._fields == tm.MetricData._fields
    assert tuple(metrics.MetricData(1.0, "g", "n", 3)) == tuple(tm.MetricData(1.0, "g", "n", 3))
    assert metrics.MetricsConfig.__slots__ == tm.MetricsConfig.__slots__
    assert metrics.MetricsConfig().params == tm.MetricsConfig().params == {}
    assert metrics.MetricsConfig({"a": "b"}).params == {"a": "b"}
    assert metrics.initialize_metrics() is None and metrics.initialize_metrics(metrics.MetricsConfig()) is None
    with pytest.raises(TypeError):
        metrics.MetricHandler()  # type: ignore[abstract]


# ---- _get_metric_name ------------------------------------------------------------------------------------------


def module_function():
    pass


class Agent:
    def method(self):
        pass

    @staticmethod
    def static():
        pass

    @classmethod
    def klass(cls):
        pass

    class Inner:
        def deep(self):
            pass


def _make_nested():
    def nested():
        pass

    return nested


def _no_module():
    pass


_no_module.__module__ = None  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (module_function, "test_metrics_api.module_function"),
        (Agent.method, "Agent.method"),
        (Agent().method, "Agent.method"),
        (Agent.static, "Agent.static"),
        (Agent.klass, "Agent.klass"),
        (Agent.Inner.deep, "Agent.Inner.deep"),
        (_make_nested(), "_make_nested.<locals>.nested"),
        (lambda: None, "test_metrics_api.<lambda>"),
        (_no_module, "_no_module"),
    ],
)
def test_get_metric_name_equals_torchs(fn, expected):
    assert metrics._get_metric_name(fn) == tm_api._get_metric_name(fn) == expected


# ---- @prof -----------------------------------------------------------------------------------------------------


def _decorate_both(body, **prof_kwargs):
    """The same function decorated by the bridge's ``prof`` and by torch's (optionally without parentheses)."""
    if prof_kwargs:
        return metrics.prof(**prof_kwargs)(body), tm.prof(**prof_kwargs)(body)
    return metrics.prof(body), tm.prof(body)


def test_prof_success_publishes_like_torch(both):
    ours_h, theirs_h = both

    def work(x, *, y=1):
        return x + y

    ours, theirs = _decorate_both(work)
    assert ours(1, y=2) == theirs(1, y=2) == 3
    assert ours.__name__ == theirs.__name__ == "work" and ours.__wrapped__ is work
    assert (
        ours_h.shape()
        == theirs_h.shape()
        == [
            ("torchelastic", "test_prof_success_publishes_like_torch.<locals>.work.success", int),
            ("torchelastic", "test_prof_success_publishes_like_torch.<locals>.work.duration.ms", int),
        ]
    )
    assert [d.value for d in ours_h.data][0] == 1


def test_prof_failure_publishes_like_torch_and_reraises(both):
    ours_h, theirs_h = both

    def fails():
        raise ValueError("boom")

    ours, theirs = _decorate_both(fails, group="agent")
    with pytest.raises(ValueError, match="boom"):
        ours()
    with pytest.raises(ValueError, match="boom"):
        theirs()
    key = "test_prof_failure_publishes_like_torch_and_reraises.<locals>.fails"
    assert (
        ours_h.shape()
        == theirs_h.shape()
        == [
            ("agent", f"{key}.failure", int),
            ("agent", f"{key}.duration.ms", int),
        ]
    )


def test_prof_base_exception_publishes_like_torch(both):
    """A BaseException (e.g. SystemExit) is not counted as failure by torch; only the duration is published."""
    ours_h, theirs_h = both

    def exits():
        raise SystemExit(3)

    ours, theirs = _decorate_both(exits)
    with pytest.raises(SystemExit):
        ours()
    with pytest.raises(SystemExit):
        theirs()
    assert ours_h.shape() == theirs_h.shape()
    assert [name.rsplit(".", 2)[-2:] for _, name, _ in ours_h.shape()] == [["duration", "ms"]]


def test_prof_on_methods_uses_class_qualname(both):
    ours_h, theirs_h = both

    class SimpleElasticAgent:
        @metrics.prof
        def _rendezvous(self):
            return "ours"

        @tm.prof
        def _rendezvous_torch(self):
            return "theirs"

    agent = SimpleElasticAgent()
    assert agent._rendezvous() == "ours" and agent._rendezvous_torch() == "theirs"
    prefix = "test_prof_on_methods_uses_class_qualname.<locals>.SimpleElasticAgent."
    assert [n for _, n, _ in ours_h.shape()] == [prefix + "_rendezvous.success", prefix + "_rendezvous.duration.ms"]
    assert [n.replace("_torch", "") for _, n, _ in theirs_h.shape()] == [n for _, n, _ in ours_h.shape()]


def test_prof_duration_is_elapsed_milliseconds(both, monkeypatch):
    ours_h, _ = both
    readings = [1000.0]  # the start; every later reading is 1.5 s on

    def fake_time() -> float:
        return readings.pop() if readings else 1001.5

    monkeypatch.setattr(te_api, "time", types.SimpleNamespace(time=fake_time))
    metrics.prof(lambda: None)()
    assert ours_h.data[-1].name.endswith(".duration.ms")
    assert ours_h.data[-1].value == 1500


def test_get_elapsed_time_ms():
    start = time.time() - 1.5
    elapsed = metrics.get_elapsed_time_ms(start)
    assert isinstance(elapsed, int) and 1500 <= elapsed < 1500 + 5000


# ---- handlers, routing, streams --------------------------------------------------------------------------------


def test_console_metric_handler_output_identical_to_torchs(capsys):
    for data in [
        metrics.MetricData(1574213883.4182858, "my_app", "my_metric", 3),
        metrics.MetricData(0.0, "torchelastic", "x.duration.ms", 2.5),
        metrics.MetricData(1.0, "g", "n", None),
    ]:
        metrics.ConsoleMetricHandler().emit(data)
        ours = capsys.readouterr().out
        tm.ConsoleMetricHandler().emit(tm.MetricData(*data))
        assert ours == capsys.readouterr().out
    assert ours == "[1.0][g]: n=None\n"


@pytest.mark.usefixtures("clean_state")
def test_console_metric_handler_through_put_metric(capsys):
    metrics.configure(metrics.ConsoleMetricHandler(), group="my_app")
    before = time.time()
    metrics.put_metric("my_metric", 7, "my_app")
    metrics.getStream("my_app").add_value("calculate_latency", 2)
    after = time.time()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    pattern = re.compile(r"\[(?P<ts>[0-9.]+)\]\[my_app\]: (?P<name>[a-z_]+)=(?P<value>\d+)")
    parsed = [pattern.fullmatch(line) for line in lines]
    assert all(parsed), lines
    assert [(m["name"], m["value"]) for m in parsed] == [("my_metric", "7"), ("calculate_latency", "2")]  # type: ignore[index]
    assert all(before <= float(m["ts"]) <= after for m in parsed)  # type: ignore[index]


@pytest.mark.usefixtures("clean_state")
def test_configure_default_and_per_group_routing():
    default, app, other = Collecting(), Collecting(), Collecting()
    metrics.put_metric("before", 1)  # default NullMetricHandler: nowhere
    metrics.configure(default)  # group=None: the default
    metrics.configure(app, group="my_app")
    metrics.configure(other, "other")
    metrics.put_metric("a", 1)
    metrics.put_metric("b", 2, "my_app")
    metrics.put_metric("c", 3, metric_group="other")
    metrics.put_metric("d", 4, "unconfigured")
    metrics.getStream("my_app").add_value("e", 5)
    assert [(d.group_name, d.name, d.value) for d in default.data] == [
        ("torchelastic", "a", 1),
        ("unconfigured", "d", 4),
    ]
    assert [(d.group_name, d.name, d.value) for d in app.data] == [("my_app", "b", 2), ("my_app", "e", 5)]
    assert [(d.group_name, d.name, d.value) for d in other.data] == [("other", "c", 3)]
    assert all(isinstance(d, metrics.MetricData) and isinstance(d.timestamp, float) for d in default.data)


@pytest.mark.usefixtures("clean_state", "torch_metrics_state")
def test_get_stream_binds_handler_at_call_time_like_torch():
    first, second = Collecting(), Collecting()
    t_first, t_second = TorchCollecting(), TorchCollecting()
    metrics.configure(first, "g")
    tm.configure(t_first, "g")
    stream, t_stream = metrics.getStream("g"), tm.getStream("g")
    assert isinstance(stream, metrics.MetricStream) and stream.group_name == "g" and stream.handler is first
    metrics.configure(second, "g")
    tm.configure(t_second, "g")
    stream.add_value("n", 1)
    t_stream.add_value("n", 1)
    assert (len(first.data), len(second.data)) == (len(t_first.data), len(t_second.data)) == (1, 0)


@pytest.mark.usefixtures("clean_state")
def test_failing_handler_is_counted_not_raised():
    class Broken(te_api.MetricHandler):
        def emit(self, metric_data):
            raise RuntimeError("handler bug")

    metrics.configure(Broken(), "broken")
    before = selftelemetry.total(selftelemetry.DROPPED, "metrics", "handler_error")
    metrics.put_metric("n", 1, "broken")
    metrics.getStream("broken").add_value("n", 1)
    assert selftelemetry.total(selftelemetry.DROPPED, "metrics", "handler_error") == before + 2


# ---- deprecated API --------------------------------------------------------------------------------------------


def _warning_messages(fn) -> list[tuple[type, str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [(w.category, str(w.message)) for w in caught if issubclass(w.category, FutureWarning)]


@pytest.mark.usefixtures("both")
def test_profile_and_publish_metric_warn_like_torch():
    ours = _warning_messages(lambda: metrics.profile("g"))
    theirs = _warning_messages(lambda: tm.profile("g"))
    assert ours == theirs == [(FutureWarning, "Deprecated, use `@prof` instead")]
    ours = _warning_messages(lambda: metrics.publish_metric("g", "n", 1))
    theirs = _warning_messages(lambda: tm.publish_metric("g", "n", 1))
    assert ours == theirs and len(ours) == 1
    with pytest.warns(FutureWarning):
        metrics.publish_metric("g", "n", 1)


def test_profile_and_publish_metric_publish_like_torch(both):
    ours_h, theirs_h = both
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)

        def step():
            return 5

        def bad():
            raise KeyError("x")

        ours_step, theirs_step = metrics.profile("app")(step), tm.profile("app")(step)
        ours_bad, theirs_bad = metrics.profile("app")(bad), tm.profile("app")(bad)
        assert ours_step() == theirs_step() == 5
        with pytest.raises(KeyError):
            ours_bad()
        with pytest.raises(KeyError):
            theirs_bad()
        metrics.publish_metric("app", "direct", 9)
        tm.publish_metric("app", "direct", 9)
    assert (
        ours_h.shape()
        == theirs_h.shape()
        == [
            ("app", "step.success", int),
            ("app", "step.duration.ms", int),
            ("app", "bad.failure", int),
            ("app", "bad.duration.ms", int),
            ("app", "direct", int),
        ]
    )
    assert ours_h.data[-1].value == theirs_h.data[-1].value == 9
