"""The values of OTLP's JSON encoding, by the rules the OpenTelemetry library (``opentelemetry.proto_json``)
applies: 64-bit integers as numbers or strings, ids in hex, bytes in base64, the same type checks and error
messages. Shared by the reader's general path (``otlpjson``) and its typed path (``typedlines``).
"""

from __future__ import annotations

import base64
import sys
from typing import cast

from torchelastic_otel.report.records import Attrs, AttrValue, Distribution, SpanEvent

# A field's value as parsed from JSON is any JSON value (``object``): each reader below checks it is what OTLP says
# the field holds, as the library does, and raises its error (``TypeError`` / ``ValueError``) when it is not.


def _wrong(raw: object, kinds: tuple[type, ...], field: str) -> TypeError:
    """The library's error for a field holding another JSON type (a bool is no number)."""
    names_ = ", ".join(k.__name__ for k in kinds)
    return TypeError(f"Field '{field}' expected {names_}, got {type(raw).__name__}")


def int64(raw: object, field: str) -> int:
    """A 64-bit integer field: a number or a decimal string (OTLP JSON's, tested first); absent is 0."""
    if type(raw) is str:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"Invalid int64 value for field '{field}': {raw}") from None
    if raw is None:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _wrong(raw, (int,), field)
    return int(raw)


def double(raw: object, field: str) -> float:
    """A double field: a number or a string (``NaN``, ``Infinity``, ``-Infinity`` too); absent is 0.0."""
    if type(raw) is float:
        return raw
    if raw is None:
        return 0.0
    if isinstance(raw, bool) or not isinstance(raw, (float, int, str)):
        raise _wrong(raw, (float, int, str), field)
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"Invalid float value for field '{field}': {raw}") from None


def hex_id(raw: object, field: str) -> str:
    """An id: hex in OTLP JSON; lower-case hex here, "" when absent."""
    if not raw:
        return ""
    if not isinstance(raw, str):
        raise _wrong(raw, (str,), field)
    try:
        return bytes.fromhex(raw).hex()
    except ValueError as error:
        raise ValueError(f"Invalid hex string for field '{field}': {error}") from None


def string(raw: object, field: str) -> str:
    if type(raw) is str:
        return raw
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise _wrong(raw, (str,), field)
    return str(raw)


def json_list(raw: object, field: str) -> list[object]:
    if type(raw) is list:
        return raw
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _wrong(raw, (list,), field)
    return list(raw)


def json_object(raw: object, field: str) -> dict[str, object]:
    if not isinstance(raw, dict):
        raise _wrong(raw, (dict,), field)
    return raw


def value(any_value: object) -> AttrValue:
    """A plain Python value from an ``AnyValue`` (bytes as hex, key-value lists as dicts)."""
    if any_value is None:
        return None
    data = json_object(any_value, "data")
    if "stringValue" in data and data["stringValue"] is not None:
        return string(data["stringValue"], "string_value")
    if "intValue" in data and data["intValue"] is not None:
        return int64(data["intValue"], "int_value")
    if "doubleValue" in data and data["doubleValue"] is not None:
        return double(data["doubleValue"], "double_value")
    if "boolValue" in data and data["boolValue"] is not None:
        flag = data["boolValue"]
        if not isinstance(flag, bool):
            raise _wrong(flag, (bool,), "bool_value")
        return flag
    if "arrayValue" in data and data["arrayValue"] is not None:
        return [value(v) for v in json_list(json_object(data["arrayValue"], "array_value").get("values"), "values")]
    if "kvlistValue" in data and data["kvlistValue"] is not None:
        return attributes(json_object(data["kvlistValue"], "kvlist_value").get("values"))
    if "bytesValue" in data and data["bytesValue"] is not None:
        raw = string(data["bytesValue"], "bytes_value")
        try:
            return base64.b64decode(raw).hex()
        except ValueError as error:
            raise ValueError(f"Invalid base64 string for field 'bytes_value': {error}") from None
    return None


def attributes(key_values: object) -> Attrs:
    """``KeyValue`` list -> dict (absent: empty); a string value (most are) on a short path."""
    out: Attrs = {}
    for item in json_list(key_values, "attributes"):
        kv = item if type(item) is dict else json_object(item, "data")
        key, raw = kv.get("key"), kv.get("value")
        key = intern(key) if type(key) is str else intern(string(key, "key"))
        if type(raw) is dict and len(raw) == 1:
            text = raw.get("stringValue")
            if type(text) is str:
                out[key] = intern(text) if len(text) <= _MAX_INTERNED else text
                continue
            number = raw.get("intValue")
            if type(number) is str:
                try:
                    out[key] = int(number)
                    continue
                except ValueError:
                    pass
        out[key] = value(raw)
    return out


#: strings up to this long are interned as read (names, keys, kinds, hosts: the same few, millions of times on a
#: large run; JSON decoding makes a new object of each, interning keeps one); longer ones (log lines) are not
_MAX_INTERNED = 96
intern = sys.intern


def int_or_none(raw: AttrValue) -> int | None:
    """An attribute as an integer (``int()`` of a number or a decimal string); ``None`` for anything else."""
    if not isinstance(raw, (int, float, str)):
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def enum_number(raw: object, field: str) -> int:
    """An enum field (a status code, a severity number): its number (a name in JSON counts as unknown: 0)."""
    if raw is None or isinstance(raw, str):
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _wrong(raw, (int,), field)
    return int(raw)


def point_value_of(kind: str, dp: dict[str, object]) -> tuple[float | None, int | None]:
    """``point_value`` of a data point's JSON object."""
    return point_value(kind, dp.get("asDouble"), dp.get("asInt"), dp.get("count"), dp.get("sum"))


def point_value(
    kind: str, as_double: object, as_int: object, count: object, total: object
) -> tuple[float | None, int | None]:
    """(the number to plot, the count of a histogram/summary) from a data point's fields as written: a number
    point's value, a distribution's mean."""
    if kind in ("gauge", "sum"):
        if as_double is not None:
            return double(as_double, "as_double"), None
        if as_int is not None:
            return float(int64(as_int, "as_int")), None
        return None, None
    number = int64(count, "count")
    mean = None if total is None else double(total, "sum")
    return (float(mean) / number if number and mean is not None else None), number


def distribution_of(point: Distribution, dp: dict[str, object]) -> None:
    """An explicit-bucket histogram point's sum, bounds, bucket counts, min and max (``distribution``)."""
    distribution(point, dp.get("sum"), dp.get("explicitBounds"), dp.get("bucketCounts"), dp.get("min"), dp.get("max"))


#: the types of explicit bounds and bucket counts ``float`` and ``int`` take as ``double`` and ``int64`` do (a bool,
#: or a count with a fraction, is the slow path's to reject)
_BOUND_TYPES, _COUNT_TYPES = frozenset((float, int, str)), frozenset((int, str))


def distribution(
    point: Distribution, total: object, raw_bounds: object, raw_buckets: object, low: object, high: object
) -> None:
    """A histogram point's sum, bounds, bucket counts, min and max from their fields as written (``buckets``)."""
    fill_distribution(point, total, buckets(raw_bounds, raw_buckets), low, high)


def fill_distribution(
    point: Distribution,
    total: object,
    bounds_and_counts: tuple[tuple[float, ...], tuple[int, ...]],
    low: object,
    high: object,
) -> None:
    """``distribution``, its bounds and bucket counts given as ``buckets`` made them (the typed path makes them once
    for equal texts)."""
    point.total = None if total is None else double(total, "sum")
    point.bounds, point.buckets = bounds_and_counts
    point.low = None if low is None else double(low, "min")
    point.high = None if high is None else double(high, "max")


def buckets(raw_bounds: object, raw_buckets: object) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """A histogram point's bounds and bucket counts from their fields as written; both empty when the counts do not
    match the bounds (the point keeps its mean; a negative count is kept, for ``figures`` to count where the report
    would compute with it)."""
    bound_list, bucket_list = json_list(raw_bounds, "explicit_bounds"), json_list(raw_buckets, "bucket_counts")
    try:  # the common case at C speed: numbers (bounds), decimal strings (counts)
        if not (_BOUND_TYPES.issuperset(map(type, bound_list)) and _COUNT_TYPES.issuperset(map(type, bucket_list))):
            raise TypeError("not the common case")
        bounds = tuple(map(float, cast("list[float | int | str]", bound_list)))  # their types: checked just above
        counts = tuple(map(int, cast("list[int | str]", bucket_list)))
    except (TypeError, ValueError):
        bounds = tuple(double(b, "explicit_bounds") for b in bound_list)
        counts = tuple(int64(n, "bucket_counts") for n in bucket_list)
    if counts and len(counts) == len(bounds) + 1:
        return bounds, counts
    return (), ()


EMPTY: Attrs = {}
#: the events of a span without any (most): one shared list, read-only as every record is
NO_EVENTS: list[SpanEvent] = []
