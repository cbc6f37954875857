"""The values of OTLP's JSON encoding, by the rules the OpenTelemetry library (``opentelemetry.proto_json``)
applies: 64-bit integers as numbers or strings, ids in hex, bytes in base64, the same type checks and error
messages. Shared by the reader's general path (``otlpjson``) and its typed path (``typedlines``).
"""

from __future__ import annotations

import base64
import sys
from typing import Any

from torchelastic_otel.report.records import Point, SpanEvent


def _check(raw: Any, kinds: type | tuple[type, ...], field: str) -> None:
    if not isinstance(raw, kinds) or (isinstance(raw, bool) and bool not in _tuple(kinds)):
        names_ = ", ".join(k.__name__ for k in _tuple(kinds))
        raise TypeError(f"Field '{field}' expected {names_}, got {type(raw).__name__}")


def _tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _i64(raw: Any, field: str) -> int:
    """A 64-bit integer field: a number or a decimal string (OTLP JSON's, tested first); absent is 0."""
    if type(raw) is str:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"Invalid int64 value for field '{field}': {raw}") from None
    if raw is None:
        return 0
    _check(raw, int, field)
    return int(raw)


def _f64(raw: Any, field: str) -> float:
    """A double field: a number or a string (``NaN``, ``Infinity``, ``-Infinity`` too); absent is 0.0."""
    if type(raw) is float:
        return raw
    if raw is None:
        return 0.0
    _check(raw, (float, int, str), field)
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"Invalid float value for field '{field}': {raw}") from None


def _hex(raw: Any, field: str) -> str:
    """An id: hex in OTLP JSON; lower-case hex here, "" when absent."""
    if not raw:
        return ""
    _check(raw, str, field)
    try:
        return bytes.fromhex(raw).hex()
    except ValueError as error:
        raise ValueError(f"Invalid hex string for field '{field}': {error}") from None


def _str(raw: Any, field: str) -> str:
    if type(raw) is str:
        return raw
    if raw is None:
        return ""
    _check(raw, str, field)
    return str(raw)


def _list(raw: Any, field: str) -> list[Any]:
    if type(raw) is list:
        return raw
    if raw is None:
        return []
    _check(raw, list, field)
    return list(raw)


def _dict(raw: Any, field: str) -> dict[str, Any]:
    if type(raw) is not dict:
        _check(raw, dict, field)
    return raw


def value(any_value: Any) -> Any:
    """A plain Python value from an ``AnyValue`` (bytes as hex, key-value lists as dicts)."""
    if any_value is None:
        return None
    data = _dict(any_value, "data")
    if "stringValue" in data and data["stringValue"] is not None:
        return _str(data["stringValue"], "string_value")
    if "intValue" in data and data["intValue"] is not None:
        return _i64(data["intValue"], "int_value")
    if "doubleValue" in data and data["doubleValue"] is not None:
        return _f64(data["doubleValue"], "double_value")
    if "boolValue" in data and data["boolValue"] is not None:
        _check(data["boolValue"], bool, "bool_value")
        return data["boolValue"]
    if "arrayValue" in data and data["arrayValue"] is not None:
        return [value(v) for v in _list(_dict(data["arrayValue"], "array_value").get("values"), "values")]
    if "kvlistValue" in data and data["kvlistValue"] is not None:
        return attributes(_dict(data["kvlistValue"], "kvlist_value").get("values"))
    if "bytesValue" in data and data["bytesValue"] is not None:
        raw = _str(data["bytesValue"], "bytes_value")
        try:
            return base64.b64decode(raw).hex()
        except ValueError as error:
            raise ValueError(f"Invalid base64 string for field 'bytes_value': {error}") from None
    return None


def attributes(key_values: Any) -> dict[str, Any]:
    """``KeyValue`` list -> dict (absent: empty); a string value (most are) on a short path."""
    out: dict[str, Any] = {}
    for kv in _list(key_values, "attributes"):
        if type(kv) is not dict:
            _check(kv, dict, "data")
        key, raw = kv.get("key"), kv.get("value")
        key = _intern(key) if type(key) is str else _intern(_str(key, "key"))
        if type(raw) is dict and len(raw) == 1:
            text = raw.get("stringValue")
            if type(text) is str:
                out[key] = _intern(text) if len(text) <= _MAX_INTERNED else text
                continue
            if type(raw.get("intValue")) is str:
                try:
                    out[key] = int(raw["intValue"])
                    continue
                except ValueError:
                    pass
        out[key] = value(raw)
    return out


#: strings up to this long are interned as read (names, keys, kinds, hosts: the same few millions of times on
#: 1,000 nodes; JSON decoding makes a new object of each, interning keeps one); longer ones (log lines) are not
_MAX_INTERNED = 96
_intern = sys.intern


def _int(raw: Any) -> int | None:
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def _enum(raw: Any, field: str) -> int:
    """An enum field (a status code, a severity number): its number (a name in JSON counts as unknown: 0)."""
    if raw is None or isinstance(raw, str):
        return 0
    _check(raw, int, field)
    return int(raw)


def _point_value(kind: str, dp: dict[str, Any]) -> tuple[float | None, int | None]:
    """``point_value`` of a data point's JSON object."""
    return point_value(kind, dp.get("asDouble"), dp.get("asInt"), dp.get("count"), dp.get("sum"))


def point_value(kind: str, as_double: Any, as_int: Any, count: Any, total: Any) -> tuple[float | None, int | None]:
    """(the number to plot, the count of a histogram/summary) from a data point's fields as written: a number
    point's value, a distribution's mean."""
    if kind in ("gauge", "sum"):
        if as_double is not None:
            return _f64(as_double, "as_double"), None
        if as_int is not None:
            return float(_i64(as_int, "as_int")), None
        return None, None
    count = _i64(count, "count")
    total = None if total is None else _f64(total, "sum")
    return (float(total) / count if count and total is not None else None), count


def _distribution(point: Point, dp: dict[str, Any]) -> None:
    """An explicit-bucket histogram point's sum, bounds, bucket counts, min and max (``distribution``)."""
    distribution(point, dp.get("sum"), dp.get("explicitBounds"), dp.get("bucketCounts"), dp.get("min"), dp.get("max"))


#: the types of explicit bounds and bucket counts ``float`` and ``int`` take as ``_f64`` and ``_i64`` do (a bool,
#: or a count with a fraction, is the slow path's to reject)
_BOUND_TYPES, _COUNT_TYPES = frozenset((float, int, str)), frozenset((int, str))


def distribution(point: Point, total: Any, raw_bounds: Any, raw_buckets: Any, low: Any, high: Any) -> None:
    """A histogram point's sum, bounds, bucket counts, min and max from their fields as written (buckets that do
    not match their bounds are dropped: the point keeps its mean; a negative count is kept, for ``figures`` to
    count where the report would compute with it)."""
    point.total = None if total is None else _f64(total, "sum")
    raw_bounds, raw_buckets = _list(raw_bounds, "explicit_bounds"), _list(raw_buckets, "bucket_counts")
    try:  # the common case at C speed: numbers (bounds), decimal strings (counts)
        if not (_BOUND_TYPES.issuperset(map(type, raw_bounds)) and _COUNT_TYPES.issuperset(map(type, raw_buckets))):
            raise TypeError("not the common case")
        bounds, buckets = tuple(map(float, raw_bounds)), tuple(map(int, raw_buckets))
    except (TypeError, ValueError):
        bounds = tuple(_f64(b, "explicit_bounds") for b in raw_bounds)
        buckets = tuple(_i64(n, "bucket_counts") for n in raw_buckets)
    if buckets and len(buckets) == len(bounds) + 1:
        point.bounds, point.buckets = bounds, buckets
    point.low = None if low is None else _f64(low, "min")
    point.high = None if high is None else _f64(high, "max")


_EMPTY: dict[str, Any] = {}
#: the events of a span without any (most): one shared list, read-only as every record is
_NO_EVENTS: list[SpanEvent] = []
