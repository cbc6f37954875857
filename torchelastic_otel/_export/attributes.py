"""One function every path uses to turn arbitrary event metadata into valid, bounded OpenTelemetry attributes.

OpenTelemetry attribute values must be str, bool, int (64-bit), float or homogeneous sequences of those; anything
else is dropped by the SDK with a warning, and an out-of-range int fails the whole export batch in the protobuf
encoder. Users' metadata is arbitrary (nested dicts, bytes, self-referencing containers, huge strings), so every
value is made valid here, keys are namespaced so metadata can never pose as resource or semantic-convention
attributes, and sizes are bounded. Whatever is altered or left out is counted (see ``selftelemetry``).

Every string is also made encodable (:func:`encodable`): Python strings may hold lone surrogates (what
``surrogateescape`` makes of a non-UTF-8 file name, ``os.environ`` value or argv), which UTF-8 -- and so the OTLP
protobuf encoder -- cannot encode. As a record's body or name such a string fails the whole export batch; as an
attribute the SDK drops it and logs a traceback. They become U+FFFD here, counted as
``sanitized{reason="lone_surrogates"}``.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from torchelastic_otel import _selftelemetry as selftelemetry

__all__ = [
    "flatten",
    "attribute_value",
    "safe_str",
    "encodable",
    "encodable_attributes",
    "MAX_ATTRIBUTES",
    "MAX_STRING_LENGTH",
    "MAX_DEPTH",
]

#: At most this many attributes come out of one mapping; the rest are counted as dropped.
MAX_ATTRIBUTES = 96
#: Longer strings are cut to this many characters (and counted as sanitized).
MAX_STRING_LENGTH = 8192
#: Nested dicts are flattened into dotted keys this deep; deeper levels become JSON strings.
MAX_DEPTH = 3
#: Longest attribute key kept whole.
MAX_KEY_LENGTH = 256

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_PRIMITIVES = (bool, int, float, str)


#: The self-telemetry reason of a string whose lone surrogates were replaced.
LONE_SURROGATES = "lone_surrogates"


def encodable(text: str, signal: str = "logs") -> str:
    """``text`` as UTF-8 can encode it: each lone surrogate becomes U+FFFD (counted once per string as
    ``sanitized{signal, reason="lone_surrogates"}``); a surrogate pair becomes the character it encodes.

    The one function every string goes through on its way to OpenTelemetry. ASCII text (the common case) costs
    one O(1) ``isascii``; other text one UTF-8 encode; only an unencodable string is rebuilt.
    """
    if text.isascii():
        return text
    try:
        str.encode(text, "utf-8")
        return text
    except UnicodeEncodeError:
        pass
    selftelemetry.count(selftelemetry.SANITIZED, signal, LONE_SURROGATES)
    return str.encode(text, "utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def encodable_attributes(attributes: dict[str, Any], signal: str = "traces") -> dict[str, Any]:
    """``attributes`` (already valid OTel attribute values) with every string key, value and sequence element made
    :func:`encodable`; the same dict when nothing needed it (the common case: no copy)."""
    changed: dict[str, Any] | None = None
    for key, value in attributes.items():
        new_key = encodable(key, signal) if type(key) is str else key
        if isinstance(value, str):
            new_value: object = encodable(value, signal)
        elif isinstance(value, (list, tuple)) and any(isinstance(v, str) for v in value):
            new_value = [encodable(v, signal) if isinstance(v, str) else v for v in value]
            if all(a is b for a, b in zip(new_value, value, strict=True)):
                new_value = value
        else:
            new_value = value
        if new_key is not key or new_value is not value:
            if changed is None:
                changed = {}
            changed[key] = (new_key, new_value)
    if changed is None:
        return attributes
    out: dict[str, object] = {}
    for key, value in attributes.items():
        new_key, new_value = changed.get(key, (key, value))
        out[new_key] = new_value
    return out


def _text(value: str, signal: str) -> str:
    if len(value) > MAX_STRING_LENGTH:
        selftelemetry.count(selftelemetry.SANITIZED, signal, "string_truncated")
        value = value[:MAX_STRING_LENGTH]
    return value if value.isascii() else encodable(value, signal)


def safe_str(value: object) -> str:
    """``str(value)`` as a plain ``str``; a placeholder when the object's ``__str__`` raises (user objects)."""
    if type(value) is str:
        return value
    try:
        text = str(value)
        return text if type(text) is str else str.__str__(text)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _json_text(value: object, signal: str) -> str:
    """JSON for containers that have no attribute form; ``repr`` where JSON cannot say it (cycles, odd keys)."""
    try:
        text = json.dumps(value, default=safe_str, allow_nan=True)
    except Exception:  # cycles, odd keys, recursion depth, a user's __str__ or __eq__ raising...
        try:
            text = repr(value)
        except Exception:  # a user's __repr__ may raise
            text = f"<unrepresentable {type(value).__name__}>"
    selftelemetry.count(selftelemetry.SANITIZED, signal, "value_serialized")
    return _text(text, signal)


def attribute_value(value: object, signal: str = "logs") -> Any:
    """A valid OTel attribute value for ``value`` (``None`` means: leave the attribute out)."""
    if value is None:
        return None
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        if type(value) is not int:
            value = int.__int__(value)  # a subclass: the plain number
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
        selftelemetry.count(selftelemetry.SANITIZED, signal, "int_out_of_range")
        return str(value)
    if isinstance(value, float):
        return value if type(value) is float else float.__float__(value)
    if isinstance(value, str):
        return _text(value if type(value) is str else str.__str__(value), signal)
    if isinstance(value, (bytes, bytearray, memoryview)):
        selftelemetry.count(selftelemetry.SANITIZED, signal, "bytes_decoded")
        return _text(bytes(value).decode("utf-8", "replace"), signal)
    if isinstance(value, (list, tuple)):
        return _sequence_value(value, signal)
    if isinstance(value, (dict, set, frozenset)):
        return _json_text(value if isinstance(value, dict) else sorted(value, key=repr), signal)
    text = safe_str(value)
    selftelemetry.count(selftelemetry.SANITIZED, signal, "value_stringified")
    return _text(text, signal)


def _sequence_value(seq: list | tuple, signal: str) -> object:
    """Homogeneous primitive sequences stay arrays (ints widen to floats beside floats); others become JSON."""
    if not seq:
        return []
    kinds = {bool if isinstance(v, bool) else type(v) for v in seq}
    if kinds <= {int, float} and all(_INT64_MIN <= v <= _INT64_MAX for v in seq if type(v) is int):
        return [float(v) for v in seq] if float in kinds else list(seq)
    if len(kinds) == 1 and kinds <= {bool, str}:
        return [_text(v, signal) for v in seq] if str in kinds else list(seq)
    return _json_text(seq, signal)


def _key(key: object, signal: str) -> str:
    text = safe_str(key.value if isinstance(key, Enum) else key)
    return encodable(text[:MAX_KEY_LENGTH], signal) or "_"


def flatten(
    mapping: object,
    prefix: str,
    out: dict[str, Any],
    signal: str = "logs",
    depth: int = 0,
    skip: frozenset = frozenset(),
    unwrap: bool = False,
) -> dict[str, object]:
    """Add ``mapping``'s items to ``out`` as ``{prefix}{key}`` attributes; nested dicts become dotted keys.

    ``None`` values are left out by design (OTel has no null attribute); keys in ``skip`` too. ``unwrap`` takes
    the element of 1-element lists (torch packs worker details that way). This is the hot path of every event,
    so plain ASCII ``str`` keys with ``str``/``int``/``float``/``bool`` values -- all of torch's agent metadata --
    are checked inline; anything else goes through :func:`attribute_value` (other keys through :func:`encodable`).
    Returns ``out``.
    """
    if not isinstance(mapping, dict):
        return out
    for raw_key, value in list(mapping.items()):
        if skip and raw_key in skip:
            continue
        if unwrap and isinstance(value, (list, tuple)) and len(value) == 1:
            value = value[0]
        if value is None:
            continue
        if type(raw_key) is str and 0 < len(raw_key) <= MAX_KEY_LENGTH and raw_key.isascii():
            key = prefix + raw_key
        else:
            key = prefix + _key(raw_key, signal)
        kind = type(value)
        if kind is str:
            if len(value) > MAX_STRING_LENGTH or not value.isascii():
                value = _text(value, signal)
        elif kind is int:
            if not _INT64_MIN <= value <= _INT64_MAX:
                value = attribute_value(value, signal)
        elif kind is not float and kind is not bool:
            if isinstance(value, dict) and depth < MAX_DEPTH and value is not mapping:
                flatten(value, key + ".", out, signal, depth + 1)
                continue
            value = attribute_value(value, signal)
            if value is None:
                continue
        if len(out) >= MAX_ATTRIBUTES and key not in out:
            selftelemetry.count(selftelemetry.DROPPED, signal, "attribute_limit")
            continue
        out[key] = value
    return out
