"""The trace tree of a job as text, the way the README shows it: one line a span, parents before children.

Leaf spans of one name from one process are folded into one line (``worker.step x3``), and the tree stops after
``max_lines`` lines (saying how many spans it left out), so a job with thousands of spans still prints a readable
tree of bounded size.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Iterable

from torchelastic_otel import _names as names
from torchelastic_otel.report.records import Span

#: span attributes worth a place on a tree line (the prefix ``torchelastic.`` is left out there)
KEY_ATTRIBUTES = (
    names.RESTART_REASON,
    names.FAILED_RANKS,
    names.RUN_STATE,
    names.STATE,
    names.ROOT_CAUSE_RANK,
)


def who(span: Span) -> str:
    proc = span.proc
    if proc.kind == "worker":
        return f"worker rank {proc.rank}, restart {proc.restart}"
    if proc.kind == "agent":
        return "agent"
    return proc.label


#: spans whose line names their restart count (on the others it is the same as their parent's)
_COUNTED = (names.RUN, names.ATTEMPT, names.RESTART)


def label(span: Span, count: int) -> str:
    keys = ((names.RESTART_COUNT,) if span.name in _COUNTED else ()) + KEY_ATTRIBUTES
    attrs = ", ".join(f"{k.split('.', 1)[1]}={_short(span.attrs[k])}" for k in keys if k in span.attrs)
    status = " [ERROR]" if span.failed else ""
    times = f" x{count}" if count > 1 else ""
    events = collections.Counter(e.name for e in span.events)
    named = ", ".join(f"event {n}" if c == 1 else f"{c} x {n}" for n, c in events.items() if not _rendezvous(n))
    rdzv = sum(c for n, c in events.items() if _rendezvous(n))
    notes = [part for part in (f"{rdzv} rendezvous span events" if rdzv else "", named) if part]
    note = f"  ({'; '.join(notes)})" if notes else ""
    return f"{span.name}{times}{status}  <{who(span)}>{'  ' + attrs if attrs else ''}{note}"


def _rendezvous(event_name: str) -> bool:
    return ".py:" in event_name  # torch's rendezvous events are named <file>.py:<function>


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


_NAME, _START, _SPAN_ID = operator.attrgetter("name"), operator.attrgetter("start"), operator.attrgetter("span_id")


def render(spans: Iterable[Span], max_lines: int = 200) -> list[str]:
    """The tree of ``spans`` (children by start time under their parent; spans whose parent is absent are roots)."""
    spans = list(spans)
    ids = set(map(_SPAN_ID, spans))
    children: dict[str, list[Span]] = collections.defaultdict(list)
    roots: list[Span] = []
    for span in spans:
        (children[span.parent_id] if span.parent_id in ids and span.parent_id != span.span_id else roots).append(span)
    roots = _in_order(roots)
    lines: list[str] = []
    shown = 0

    def walk(level: list[Span], prefix: str, top: bool) -> None:
        nonlocal shown
        folded = _fold(_in_order(level), children)
        for index, (span, count) in enumerate(folded):
            if len(lines) >= max_lines:
                return
            last = index == len(folded) - 1
            connector = "" if top else ("└── " if last else "├── ")
            lines.append(prefix + connector + label(span, count))
            shown += count
            walk(children.get(span.span_id, []), prefix + ("" if top else ("    " if last else "│   ")), False)

    for root in roots:
        if len(lines) >= max_lines:
            break
        parent = f" (parent {root.parent_id}: not in these files)" if root.parent_id else ""
        lines.append(f"trace {root.trace_id}{parent}")
        walk([root], "", True)
    if shown < len(spans):
        lines.append(f"... {len(spans) - shown} more spans not shown")
    return lines


def _in_order(spans: list[Span]) -> list[Span]:
    """By start, then name (two stable sorts on one attribute each, at C speed). Only the levels the tree shows
    are sorted: a large run has hundreds of thousands of spans, of which a tree shows a few hundred."""
    return sorted(sorted(spans, key=_NAME), key=_START)


def _fold(level: list[Span], children: dict[str, list[Span]]) -> list[tuple[Span, int]]:
    """Leaf spans of the same name and process after the first are counted on the first one's line."""
    folded: list[list[object]] = []
    leaves: dict[tuple[str, object], list[object]] = {}
    for span in level:
        key = (span.name, span.proc)
        leaf = span.span_id not in children
        if leaf and key in leaves:
            leaves[key][1] += 1  # type: ignore[operator]
            continue
        entry: list[object] = [span, 1]
        folded.append(entry)
        if leaf:
            leaves[key] = entry
    return [(e[0], e[1]) for e in folded]  # type: ignore[misc]
