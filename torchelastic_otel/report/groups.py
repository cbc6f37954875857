"""The deviating nodes grouped by what happened to them: one line for the many that failed alike.

When the root cause's rank dies, the other ranks of a large job mostly fail too (gloo's ``Connection closed by peer
[10.0.3.7]:41873``, NCCL's watchdog), each with its own address, port, pid and rank in the message. Listed node by
node, hundreds of such nodes bury the one that failed differently. So the deviating nodes (``nodes.Overview``) are
grouped by what their ranks did: each rank's event (``nodes.Event``) reads as its head (``failed in attempt 0 (exit
code 1)``: the reason, the attempt, the exit code and signal, kept as they are) and its error's text with the parts
that differ from rank to rank masked (``mask``): hex ids and UUIDs, paths with a digit in them, addresses and
ports, then every other number (pids, ranks, sizes, line numbers). Nodes whose ranks' events read the same are one
group; a node whose error differs in its type or in a word is a group of its own, never folded into the many.

The groups come in the overview's order of their first node: the root cause's group first, then by when each
deviated. Every view calls ``of``: the terminal, the HTML, ``report --json`` (``Group.as_json``), a live view.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torchelastic_otel.report import hosts as hosts_mod
from torchelastic_otel.report.nodes import REASONS, Event, Node, Overview

__all__ = ["Group", "mask", "of"]

#: what ``mask`` puts in place of each kind of varying part
HEX, PATH, ADDR, NUMBER = "<hex>", "<path>", "<addr>", "<n>"

# In a word, at each place the first kind that matches: an id or a path holds numbers that would be masked piecemeal.
_VARYING = re.compile(
    # UUIDs, 0x-prefixed hex, bare hex ids of 8+ digits holding a digit and a letter (span and trace ids, hashes)
    r"(?P<hex>\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
    r"|\b0[xX][0-9a-fA-F]+\b"
    r"|\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b)"
    # a path: a run of characters with a slash in it (/tmp/torchelastic_k3j2/..., .../pair.cc:553), whole
    r"|(?P<path>(?<![^\s\[\](){}<>'\",;])[^\s\[\](){}<>'\",;]*/[^\s\[\](){}<>'\",;]*)"
    # an IPv4 address (bracketed or not) or a bracketed IPv6 one, with its port (a host name's port is a number)
    r"|(?P<addr>\[?\b\d{1,3}(?:\.\d{1,3}){3}\b\]?(?::\d+)?|\[[0-9a-fA-F]*:[0-9a-fA-F:.]*\](?::\d+)?)"
    # every other number: pids, ranks, ports, sizes, counts, line numbers; a digit run inside a word too (node0417)
    r"|(?P<n>\d+(?:\.\d+)?)"
)
_PLACEHOLDERS = {"hex": HEX, "path": PATH, "addr": ADDR, "n": NUMBER}
_MAY_VARY = re.compile(r"[\d/]")  # a word without a digit or a slash is kept as it is


def mask(text: str) -> str:
    """``text`` with what differs between ranks that failed alike masked, whitespace collapsed:
    ``[/__w/.../pair.cc:553] Connection closed by peer [10.0.3.7]:41873`` ->
    ``[<path>] Connection closed by peer <addr>``. Words are kept: a message that differs in a word stays apart.
    Word by word (nothing masked spans a space): most words hold no digit, and are passed over at once."""
    vary = _MAY_VARY.search
    return " ".join(_VARYING.sub(_placeholder, word) if vary(word) else word for word in text.split())


def _placeholder(match: re.Match[str]) -> str:
    """The placeholder of what matched; a path without a digit is a word like any other (``allreduce/broadcast``)."""
    kind = match.lastgroup or "n"
    if kind == "path" and not any(c.isdigit() for c in match.group(0)):
        return match.group(0)
    return _PLACEHOLDERS[kind]


def pattern(event: Event) -> str:
    """What ``event`` says, its error masked: ``failed in attempt 0 (exit code 1): RuntimeError: [<path>] ...``."""
    return event.head + (event.sep + mask(event.detail) if event.detail else "")


@dataclass
class Group:
    """Deviating nodes whose ranks did the same (``what``: each event's ``pattern``, in the order of the reasons)."""

    what: list[str]
    reasons: list[str]
    nodes: list[Node] = field(default_factory=list)

    @property
    def root_cause(self) -> bool:
        return "root cause" in self.reasons

    @property
    def ranks(self) -> list[int]:
        """The deviating ranks of every node of the group."""
        return sorted({r for n in self.nodes for r in n.deviating_ranks})

    @property
    def hosts(self) -> str:
        """``node0003`` alone; ``node0000…node0002, node0004…node1023 (1,023 hosts)``; ``a, b (2 hosts)``."""
        names = [n.host for n in self.nodes]
        text = hosts_mod.summarize(names) or "(no host)"
        many = len(set(names))
        return text + (f" ({many:,} hosts)" if 1 < many <= 3 else "")

    @property
    def line(self) -> str:
        """The group's line, as every view prints it: ``<hosts>  <reasons>: <ranks>`` (a node's line when alone)."""
        return f"{self.hosts}  {', '.join(self.reasons)}: {hosts_mod.rank_list(self.ranks)}"

    def notes(self) -> list[str]:
        """What to say under the line: a node alone, its own notes (every number as it was); several, ``what``."""
        return list(self.nodes[0].notes) if len(self.nodes) == 1 else list(self.what)

    def as_json(self) -> dict[str, object]:
        """``report --json``'s form: the line, how many nodes and ranks, which (all of them), what they did."""
        ranks = self.ranks
        return {
            "line": self.line,
            "root_cause": self.root_cause,
            "reasons": self.reasons,
            "what": self.what,
            "nodes": len(self.nodes),
            "hosts": self.hosts,
            "host_names": [n.host for n in self.nodes],
            "rank_count": len(ranks),
            "ranks": ranks,
            "example": self.nodes[0].notes[0] if self.nodes and self.nodes[0].notes else None,
        }


def of(view: Overview) -> list[Group]:
    """The deviating nodes of ``view`` grouped by what their ranks did (the module's docstring), the root cause's
    group first, then in the order of each group's first node; within a group, the nodes in the overview's order."""
    groups: dict[tuple[str, ...], Group] = {}
    for node in view.deviating:
        reason_of: dict[str, str] = {}
        for event in node.events:
            reason_of.setdefault(pattern(event), event.reason)
        what = sorted(reason_of, key=lambda text: (_order(reason_of[text]), text))
        key = tuple(what)
        if key not in groups:
            groups[key] = Group(what, list(node.reasons))
        groups[key].nodes.append(node)
    return sorted(groups.values(), key=lambda g: not g.root_cause)  # stable: the overview's order otherwise


def _order(reason: str) -> int:
    return REASONS.index(reason) if reason in REASONS else len(REASONS)
