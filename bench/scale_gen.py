"""A big run from a real small run's OTLP JSON files: N nodes x R ranks x A attempts, re-identified.

The records written are a real job's (``make demo``'s, or any job like it: one agent, 2+ local ranks, a first
attempt in which one rank raised and the agent restarted the group, a last attempt that succeeded), cloned and
re-identified so that they read as one run of ``nodes`` agents:

- one run id and one trace id for the whole run; host ``node0000``.. per agent; pids, ``service.instance.id``,
  global / local / group ranks, world sizes and restart counts rewritten; span ids (and every parent id, log
  record span id) remapped per clone so that they stay consistent (a worker's spans still hang under its own
  agent's attempt span);
- attempts: every attempt before the last is a clone of the source's failed attempt, the last one a clone of the
  source's successful attempt (so the generated run SUCCEEDS after ``attempts - 1`` restarts);
- failures (``--fail node0417:3@1``: local rank 3 of node 417 fails in attempt 1): that rank is a clone of the
  source rank that raised (its exception, traceback, output lines, the agent's failure and root-cause records),
  every other rank of that attempt a clone of a rank the agent stopped (SIGTERM); an attempt before the last
  without a ``--fail`` gets one (node ``k * 7919 % nodes``, local rank ``k % ranks``). Only the failing node's
  agent carries the root cause; the other agents record their workers as stopped;
- timestamps: attempt k starts where attempt k-1's clone ended; each node is shifted by ``node * 20 us`` and the
  i-th failure of an attempt by ``i * 200 ms``, so the first failure is unambiguous (the first one listed);
- ranks that die with the others (``--fail-alike N``): on N nodes (the first ones without a ``--fail``) the ranks
  the agent would have stopped in an attempt before the last fail themselves instead (exit code 1, no SIGTERM),
  as a large job's ranks do when a peer dies: each with the source's stopped rank's own exception (the demo's:
  gloo's ``RuntimeError: [...pair.cc:553] Connection closed by peer [127.0.0.1]:31929. ...``), its address and port
  made the clone's own (``[10.0.3.7]:41873``). ``--fail-unlike M``: M more nodes, spread among those, whose ranks
  fail differently: in words (``Connection reset by peer``, a DataLoader worker killed) or in the exception's type
  (NCCL's watchdog, ``torch.distributed.DistBackendError``), in turn. Their agents record no root cause.

Supported: failures. Not supported (the demo has no such records): stragglers, stalls, missing ranks.

Writing streams: one output file per source file per clone, rendered from templates compiled once per source
line (the variable parts -- times, ids, ranks, pids, hosts -- are slots), so 1,024 x 8 x 3 takes about a minute.

    python bench/scale_gen.py SRC OUT --nodes 16 --ranks 8 --attempts 3 --fail node0003:5@0 --fail node0011:2@1
    python bench/scale_gen.py SRC OUT --nodes 512 --ranks 2 --attempts 2 --fail node0417:1@0 --fail-alike 508 \
        --fail-unlike 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["generate", "Failure", "parse_fail"]

NODE_SHIFT_NS = 20_000  # per node
FAIL_SHIFT_NS = 200_000_000  # per failure of one attempt after the first
_SLOT = re.compile(r"@@S(\d+)@@")

# attribute keys -> what they hold
_GLOBAL = {"torchelastic.rank", "torchelastic.global_rank", "torchelastic.role_rank", "torchelastic.metadata.role_rank",
           "rank"}  # fmt: skip
_LOCAL = {"torchelastic.local_rank", "torchelastic.metadata.local_rank"}
_GROUP = {"torchelastic.group_rank"}
_WORLD = {"torchelastic.world_size", "torchelastic.metadata.role_world_size"}
_LWORLD = {"torchelastic.local_world_size"}
_NNODES = {"torchelastic.metadata.group_world_size"}
_RESTART = {"torchelastic.restart_count", "torchelastic.agent_restarts", "torchelastic.restart", "restart"}
_MAXR = {"torchelastic.max_restarts"}
_REMAIN = {"torchelastic.remaining_restarts"}
_HOST = {"host.name", "torchelastic.hostname"}
_PID = {"process.pid"}
_PPID = {"process.parent_pid"}
_WPID = {"torchelastic.worker_pid", "torchelastic.worker_id"}
_UUID = {"service.instance.id"}
_RC = "torchelastic.root_cause."


@dataclass(frozen=True)
class Failure:
    node: int
    local_rank: int
    attempt: int


def parse_fail(spec: str) -> Failure:
    """``node0417:3@1`` (or ``417:3@1``): local rank 3 of node 417 fails in attempt 1."""
    m = re.fullmatch(r"(?:node)?(\d+):(\d+)@(\d+)", spec.strip())
    if not m:
        raise ValueError(f"--fail {spec!r}: expected nodeNNNN:LOCAL_RANK@ATTEMPT, e.g. node0417:3@1")
    return Failure(int(m[1]), int(m[2]), int(m[3]))


# ---- the source ---------------------------------------------------------------------------------------------


def _attrs(kvs: Any) -> dict[str, Any]:
    out = {}
    for kv in kvs or []:
        v = kv.get("value") or {}
        out[kv["key"]] = next(iter(v.values()), None)
    return out


@dataclass
class SrcFile:
    path: Path
    lines: list[dict[str, Any]]
    resource: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.resource.get("torchelastic.process.kind", ""))


@dataclass
class Source:
    run_id: str
    trace_id: str
    host: str
    agent_pid: int
    agent_files: list[SrcFile]
    workers: dict[tuple[int, int], list[SrcFile]]  # (restart, local rank) -> files of its processes
    seg_start: dict[int, int]  # source restart -> its attempt span's start
    failed: int  # the failed attempt's restart count
    healthy: int  # the last (successful) attempt's restart count
    fail_rank: int  # the local rank that raised in the failed attempt
    stop_rank: int  # a local rank the agent stopped in it
    agent_ids: dict[str, int | None] = field(default_factory=dict)  # agent span id -> restart segment (None: before)
    end: int = 0
    max_restarts: int = 1

    def healthy_local(self, local: int) -> int:
        """The source local rank whose healthy records a target local rank is cloned from."""
        ranks = sorted(lr for (restart, lr) in self.workers if restart == self.healthy)
        return ranks[local % len(ranks)]

    def segment(self, t: int) -> int | None:
        """The source restart whose segment holds ``t`` (None: before the first attempt)."""
        seg = None
        for restart, start in self._order:
            if t >= start:
                seg = restart
        return seg

    def __post_init__(self) -> None:
        self._order = sorted(self.seg_start.items(), key=lambda kv: kv[1])


def _load(src: Path) -> Source:
    files = []
    for path in sorted(p for p in src.rglob("*") if p.is_file() and p.name.endswith((".jsonl", ".json"))):
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not lines:
            continue
        block = next(iter(next(iter(lines[0].values()))))
        files.append(SrcFile(path, lines, _attrs(block.get("resource", {}).get("attributes"))))
    agents = [f for f in files if f.kind == "agent"]
    if not agents or len({f.resource.get("host.name") for f in agents}) != 1:
        raise ValueError(f"{src}: needs the files of one node's agent (one host)")
    workers: dict[tuple[int, int], list[SrcFile]] = defaultdict(list)
    for f in files:
        if f.kind == "worker":
            workers[(int(f.resource["torchelastic.restart_count"]), int(f.resource["torchelastic.local_rank"]))].append(
                f
            )
    seg_start: dict[int, int] = {}
    failed_attempts, trace_id, end, max_restarts = set(), "", 0, 1
    for f in agents:
        for line in f.lines:
            for block in line.get("resourceSpans", []):
                for scope in block.get("scopeSpans", []):
                    for span in scope.get("spans", []):
                        trace_id = trace_id or span["traceId"]
                        end = max(end, int(span["endTimeUnixNano"]))
                        if span["name"] == "torchelastic.attempt":
                            a = _attrs(span.get("attributes"))
                            restart = int(a.get("torchelastic.restart_count") or 0)
                            max_restarts = int(a.get("torchelastic.max_restarts") or 1)
                            seg_start[restart] = int(span["startTimeUnixNano"])
                            if (span.get("status") or {}).get("code") == 2:
                                failed_attempts.add(restart)
    if len(seg_start) < 2 or not failed_attempts:
        raise ValueError(f"{src}: needs a job with a failed attempt and a later successful one (like make demo's)")
    healthy = max(seg_start)
    failed = min(failed_attempts)
    if healthy in failed_attempts:
        raise ValueError(f"{src}: the last attempt failed; needs a job that succeeded after a restart")
    fail_rank, stop_rank = _roles(agents, failed)
    source = Source(
        run_id=str(agents[0].resource.get("torchelastic.run_id")),
        trace_id=trace_id,
        host=str(agents[0].resource.get("host.name")),
        agent_pid=int(agents[0].resource.get("process.pid") or 0),
        agent_files=agents,
        workers=dict(workers),
        seg_start=seg_start,
        failed=failed,
        healthy=healthy,
        fail_rank=fail_rank,
        stop_rank=stop_rank,
        end=end,
        max_restarts=max_restarts,
    )
    for f in agents:
        for line in f.lines:
            for block in line.get("resourceSpans", []):
                for scope in block.get("scopeSpans", []):
                    for span in scope.get("spans", []):
                        source.agent_ids[span["spanId"]] = source.segment(int(span["startTimeUnixNano"]))
    have = sorted(source.workers)
    for key in ((failed, fail_rank), (failed, stop_rank)):
        if key not in source.workers:
            raise ValueError(f"{src}: no files of the worker with restart {key[0]}, local rank {key[1]} "
                             f"(workers with files, as (restart, local rank): {have})")  # fmt: skip
    if not any(restart == healthy for restart, _ in have):
        raise ValueError(f"{src}: no worker files of the last attempt (restart {healthy}; workers with files: {have})")
    return source


def _roles(agents: list[SrcFile], failed: int) -> tuple[int, int]:
    """(the local rank that failed by itself, one the agent stopped) in the failed attempt, from the agent's
    ``torchelastic.worker.failure`` records."""
    own, stopped = None, None
    for f in agents:
        for line in f.lines:
            for block in line.get("resourceLogs", []):
                for scope in block.get("scopeLogs", []):
                    for rec in scope.get("logRecords", []):
                        a = _attrs(rec.get("attributes"))
                        if rec.get("eventName") != "torchelastic.worker.failure":
                            continue
                        if int(a.get("torchelastic.restart_count") or 0) != failed:
                            continue
                        lr = int(a.get("torchelastic.local_rank") or 0)
                        if a.get("torchelastic.signal") == "SIGTERM" or str(a.get("torchelastic.exit_code")) == "-15":
                            stopped = lr if stopped is None else stopped
                        else:
                            own = lr if own is None else own
    if own is None or stopped is None:
        raise ValueError("the failed attempt needs a rank that failed by itself and one the agent stopped")
    return own, stopped


# ---- the target -----------------------------------------------------------------------------------------------


@dataclass
class Plan:
    nodes: int
    ranks: int
    attempts: int
    failures: list[Failure]
    run_id: str
    trace_id: str
    t0: int  # where target attempt 0 starts
    fail_len: int  # length of one failed attempt's segment
    alike: frozenset[int] = frozenset()  # nodes whose stopped ranks fail alike instead (--fail-alike)
    unlike: dict[int, int] = field(default_factory=dict)  # node -> its error in _UNLIKE (--fail-unlike)

    def start(self, k: int) -> int:
        return self.t0 + k * self.fail_len

    def fails(self, node: int, k: int) -> list[int]:
        """Indexes (order within attempt k) of the failures on ``node`` in attempt k, by local rank."""
        return [f.local_rank for f in self.failures if f.node == node and f.attempt == k]

    def order(self, f: Failure) -> int:
        return [g for g in self.failures if g.attempt == f.attempt].index(f)

    def shift(self, node: int, k: int) -> int:
        here = [f for f in self.failures if f.node == node and f.attempt == k]
        extra = min((self.order(f) for f in here), default=0) * FAIL_SHIFT_NS
        return node * NODE_SHIFT_NS + extra


def host(node: int) -> str:
    return f"node{node:04d}"


#: the errors of the nodes that fail differently (--fail-unlike), in turn: (exception type, message)
_UNLIKE = (
    ("RuntimeError", "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by "
                     "peer [{addr}]:{port}. This is typically caused by a remote worker crashing."),
    ("torch.distributed.DistBackendError", "[Rank {rank}] NCCL watchdog thread terminated with exception: [Rank "
     "{rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, "
     "NumelOut=1, Timeout(ms)=600000) ran for {ms} milliseconds before timing out."),
    ("RuntimeError", "DataLoader worker (pid {pid}) is killed by signal: Bus error. It is possible that dataloader's "
                     "workers are out of shared memory. Please try to raise your shared memory limit."),
)  # fmt: skip
_ADDRESS = re.compile(r"\[\d{1,3}(?:\.\d{1,3}){3}\]:\d+")


def _errored(fate: str, key: str, text: str, node: int, k: int, local: int, ranks: int) -> str:
    """An exception attribute's text (``key``) of a rank that fails alike (its address and port its own) or
    differently (``unlike<i>``: the i-th error of ``_UNLIKE`` in turn, its traceback's last line said so too)."""
    n = _salt("peer", node, k, local)
    addr, port = f"10.{n % 250}.{(n >> 8) % 250}.{(n >> 16) % 250 + 1}", 1024 + (n >> 24) % 60000
    if fate == "alike":
        return _ADDRESS.sub(f"[{addr}]:{port}", text)
    kind, message = _UNLIKE[int(fate[len("unlike") :]) % len(_UNLIKE)]
    rank, seq, ms = node * ranks + local, 1000 + 37 * k + local, 600000 + n % 997
    message = message.format(addr=addr, port=port, rank=rank, seq=seq, ms=ms, pid=pid(k, local, 0, ranks))
    if key == "exception.type":
        return kind
    if key == "exception.message":
        return message
    lines = text.rstrip("\n").split("\n")  # exception.stacktrace: its last line is the exception's
    return "\n".join([*lines[:-1], f"{kind}: {message}"]) + "\n"


def pid(k: int, local: int, j: int, ranks: int) -> int:
    """A worker process's pid on its node: distinct per attempt, rank and process (j: 0 the worker itself)."""
    return 1000 + (k * ranks + local) * 4 + j


def _array(values: list[int]) -> dict[str, Any]:
    return {"arrayValue": {"values": [{"intValue": str(v)} for v in values]}}


def _salt(*parts: Any) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big") or 1


def _map_id(old: str, salt: int) -> str:
    return f"{int(old, 16) ^ salt:016x}" if old else old


# ---- worker files: line templates with slots ------------------------------------------------------------------

_PER_CLONE = ("global", "local", "group", "restart", "remain", "host", "pid", "ppid", "wpid", "uuid")


class _Template:
    """One source line compiled once into a ``str.format`` string: literal text, and fields for what varies per
    clone, numbered so that a clone's arguments are a few list comprehensions (times, then ids, then the clone's
    constants, then texts naming a rank): rendering costs about a microsecond per field."""

    def __init__(self, line: dict[str, Any], src: Source, plan: Plan, src_rank: int, src_restart: int) -> None:
        self._src, self._plan = src, plan
        self.src_rank, self.src_restart = src_rank, src_restart
        self._slots: list[tuple[str, Any]] = []
        text = json.dumps(self._walk(line), separators=(",", ":"))
        groups: dict[str, list[Any]] = {"time": [], "own": [], "agent": [], "before": [], "const": [], "text": []}
        numbering: list[tuple[str, int]] = []  # per slot: (group, index in group)
        for kind, arg in self._slots:
            group = kind if kind in groups else "const"
            numbering.append((group, len(groups[group])))
            groups[group].append(kind if group == "const" else arg)
        base = {}
        n = 0
        for group in ("time", "own", "agent", "before", "const", "text"):
            base[group], n = n, n + len(groups[group])
        pieces = _SLOT.split(text)
        out = []
        for i, piece in enumerate(pieces):
            if i % 2 == 0:
                out.append(piece.replace("{", "{{").replace("}", "}}"))
            else:
                group, index = numbering[int(piece)]
                out.append(f"{{{base[group] + index}}}")
        self.fmt = "".join(out) + "\n"
        self.times: list[int] = groups["time"]
        self.own: list[int] = [int(x, 16) for x in groups["own"]]
        self.agent: list[int] = [int(x, 16) for x in groups["agent"]]
        self.before: list[int] = [int(x, 16) for x in groups["before"]]
        self.consts: list[str] = groups["const"]
        self.texts: list[tuple[str, str]] = groups["text"]  # (the exception attribute's key, or ""; the text)

    def _slot(self, kind: str, arg: Any) -> str:
        self._slots.append((kind, arg))
        return f"@@S{len(self._slots) - 1}@@"

    def _walk(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self._walk(v) for v in node]
        if isinstance(node, str):
            return node.replace(self._src.run_id, self._plan.run_id) if self._src.run_id in node else node
        if not isinstance(node, dict):
            return node
        if "key" in node and isinstance(node.get("value"), dict) and len(node["value"]) == 1:
            return self._attr(node)
        out = {}
        for k, v in node.items():
            if k.lower().endswith("timeunixnano") and isinstance(v, str):
                out[k] = self._slot("time", int(v))
            elif k in ("spanId", "parentSpanId") and v:
                seg = self._src.agent_ids.get(v, "own")
                out[k] = self._slot("own" if seg == "own" else "before" if seg is None else "agent", v)
            elif k == "traceId" and v:
                out[k] = self._plan.trace_id
            elif k == "body" and isinstance(v, dict) and isinstance(v.get("stringValue"), str):
                out[k] = {"stringValue": self._text(v["stringValue"])}
            else:
                out[k] = self._walk(v)
        return out

    def _text(self, text: str) -> str:
        text = text.replace(self._src.run_id, self._plan.run_id)
        if "rank" in text or "restart" in text:
            return self._slot("text", ("", text))
        return text

    def _attr(self, kv: dict[str, Any]) -> dict[str, Any]:
        key, (vkind, raw) = kv["key"], next(iter(kv["value"].items()))
        kind = next(
            (name for name, keys in _KEYS if key in keys),
            "text" if vkind == "stringValue" and isinstance(raw, str) and key.startswith("exception.") else None,
        )
        p = self._plan
        if kind is None:
            return {"key": key, "value": self._walk(kv["value"])}
        if kind == "text":  # an exception's text: a slot even without a rank in it (--fail-alike rewrites it)
            return {"key": key, "value": {vkind: self._slot("text", (key, raw.replace(self._src.run_id, p.run_id)))}}
        if kind == "rctime":
            return {"key": key, "value": {vkind: self._slot("time", int(raw))}}
        fixed = {"world": p.nodes * p.ranks, "lworld": p.ranks, "nnodes": p.nodes}.get(kind)
        if kind == "maxr":
            fixed = max(p.attempts - 1, int(raw))
        if fixed is not None:
            return {"key": key, "value": {vkind: str(fixed)}}
        return {"key": key, "value": {vkind: self._slot(kind, raw)}}

    def render(self, ctx: _Ctx) -> str:
        off, own, agent, before, consts = ctx.offset, ctx.salt_own, ctx.salt_agent, ctx.salt_agent_before, ctx.consts
        args = [str(t + off) for t in self.times]
        args += [f"{x ^ own:016x}" for x in self.own]
        args += [f"{x ^ agent:016x}" for x in self.agent]
        args += [f"{x ^ before:016x}" for x in self.before]
        args += [consts[kind] for kind in self.consts]
        if self.texts:
            args += [ctx.text(t, self.src_rank, self.src_restart) for t in self.texts]
        return self.fmt.format(*args)


_KEYS = (
    ("global", _GLOBAL), ("local", _LOCAL), ("group", _GROUP), ("world", _WORLD), ("lworld", _LWORLD),
    ("nnodes", _NNODES), ("restart", _RESTART), ("maxr", _MAXR), ("remain", _REMAIN), ("host", _HOST),
    ("pid", _PID), ("ppid", _PPID), ("wpid", _WPID), ("uuid", _UUID), ("rctime", {_RC + "time_unix_nano"}),
)  # fmt: skip


@dataclass
class _Ctx:
    """One clone: a worker process (node, attempt k, local rank, its process j), or an agent (local -1)."""

    plan: Plan
    node: int
    k: int
    local: int
    j: int
    offset: int
    salt_own: int
    salt_agent: int
    salt_agent_before: int
    consts: dict[str, str] = field(default_factory=dict)
    fate: str = ""  # "alike" or "unlike<i>": the rank fails with the others (--fail-alike, --fail-unlike)

    def __post_init__(self) -> None:
        p, node, k, local = self.plan, self.node, self.k, self.local
        agent = local < 0
        self.consts = {
            "global": str(node * p.ranks + max(local, 0)),
            "local": str(max(local, 0)),
            "group": str(node),
            "restart": str(k),
            "remain": str(p.attempts - 1 - k),
            "host": host(node),
            "pid": "100" if agent else str(pid(k, local, self.j, p.ranks)),
            "ppid": "100" if agent else str(pid(k, local, 0, p.ranks)),
            "wpid": "100" if agent else str(pid(k, local, 0, p.ranks)),
            "uuid": str(uuid.UUID(int=_salt("uuid", node, k if not agent else -1, local, self.j) << 64 | node)),
        }

    def text(self, item: tuple[str, str], src_rank: int, src_restart: int) -> str:
        key, text = item
        rank = self.node * self.plan.ranks + self.local
        text = _retext(text, src_rank, rank, src_restart, self.k)
        if self.fate and key:
            text = _errored(self.fate, key, text, self.node, self.k, self.local, self.plan.ranks)
        return json.dumps(text)[1:-1]


def _retext(text: str, src_rank: int, rank: int, src_restart: int, restart: int) -> str:
    text = re.sub(rf"(\brank ?){src_rank}\b", rf"\g<1>{rank}", text)
    text = re.sub(rf"(\[rank){src_rank}\]", rf"\g<1>{rank}]", text)
    return re.sub(rf"(\brestart ){src_restart}\b", rf"\g<1>{restart}", text)


# ---- agent files: rewritten as dicts (their per-worker records are repeated per local rank) --------------------


class _Agent:
    """One node's agent in one target attempt (k; None: the records before the first attempt)."""

    def __init__(self, plan: Plan, src: Source, node: int) -> None:
        self.plan, self.src, self.node = plan, src, node

    def roles(self, k: int) -> dict[int, str]:
        """local rank -> "fail" | "stop" | "ok" in attempt k; on a node that fails alike or differently
        (``--fail-alike``, ``--fail-unlike``) "alike" or "unlike<i>" where the agent would have stopped it."""
        if k == self.plan.attempts - 1:
            return {lr: "ok" for lr in range(self.plan.ranks)}
        failing = set(self.plan.fails(self.node, k))
        stop = self.fate()
        return {lr: "fail" if lr in failing else stop for lr in range(self.plan.ranks)}

    def fate(self) -> str:
        """How this node's ranks that its agent would have stopped end: "stop", "alike", "unlike<i>"."""
        if self.node in self.plan.alike:
            return "alike"
        return f"unlike{self.plan.unlike[self.node]}" if self.node in self.plan.unlike else "stop"

    def template(self, k: int) -> int:
        return self.src.healthy if k == self.plan.attempts - 1 else self.src.failed

    def offset(self, k: int | None) -> int:
        if k is None:
            return self.plan.shift(self.node, 0) + self.plan.t0 - self.src.seg_start[self.src.failed]
        return self.plan.start(k) - self.src.seg_start[self.template(k)] + self.plan.shift(self.node, k)

    def salt(self, k: int | None) -> int:
        return _salt("agent", self.node, k)

    def src_local(self, role: str) -> int:
        if role.startswith(("alike", "unlike")):  # a clone of the stopped rank, failing itself
            return self.src.stop_rank
        return {"fail": self.src.fail_rank, "stop": self.src.stop_rank}.get(role, 0)

    # -- ids and times
    def map_ref(self, old: str, k: int | None) -> str:
        if not old:
            return old
        seg = self.src.agent_ids.get(old, "external")
        if seg is None or seg == "external" or k is None:
            return _map_id(old, self.salt(None))
        if seg == self.template(k):
            return _map_id(old, self.salt(k))
        return _map_id(old, self.salt(k - 1 if k > 0 else None))

    def lines(self, line: dict[str, Any]) -> list[str]:
        """This source line's records, one output line per target attempt that has some."""
        out = []
        for k in [None, *range(self.plan.attempts)]:
            text = self.line_for(line, k)
            if text is not None:
                out.append(text)
        return out

    def in_seg(self, t: int, k: int | None) -> bool:
        seg = self.src.segment(t)
        return seg is None if k is None else seg == self.template(k)

    def line_for(self, line: dict[str, Any], k: int | None) -> str | None:
        data: dict[str, Any] = {}
        any_item = False
        for top, blocks in line.items():
            new_blocks = []
            for block in blocks:
                res = self.resource(block.get("resource", {}), k)
                scopes = []
                for scope_key in ("scopeSpans", "scopeLogs", "scopeMetrics"):
                    for scope in block.get(scope_key, []):
                        items = self.items(scope, k)
                        if items is not None:
                            scopes.append(items)
                            any_item = True
                if scopes:
                    key = next(s for s in ("scopeSpans", "scopeLogs", "scopeMetrics") if s in block)
                    new_blocks.append({"resource": res, key: scopes})
            if new_blocks:
                data[top] = new_blocks
        if not any_item:
            return None
        return json.dumps(data, separators=(",", ":")).replace(self.src.run_id, self.plan.run_id)

    def resource(self, res: dict[str, Any], k: int | None) -> dict[str, Any]:
        attrs = []
        for kv in res.get("attributes", []):
            key = kv["key"]
            if key in _HOST:
                kv = {"key": key, "value": {"stringValue": host(self.node)}}
            elif key in _PID:
                kv = {"key": key, "value": {"intValue": "100"}}
            elif key in _UUID:
                kv = {"key": key, "value": {"stringValue": str(uuid.UUID(int=_salt("agent-uuid", self.node)))}}
            attrs.append(kv)
        return {**res, "attributes": attrs}

    def items(self, scope: dict[str, Any], k: int | None) -> dict[str, Any] | None:
        if "spans" in scope:
            spans = [s for raw in scope["spans"] if self.in_seg(int(raw["startTimeUnixNano"]), k)
                     for s in [self.span(raw, k)]]  # fmt: skip
            return {**scope, "spans": spans} if spans else None
        if "logRecords" in scope:
            recs = [r for raw in scope["logRecords"] if self.in_seg(int(raw.get("timeUnixNano") or 0), k)
                    for r in self.per_worker(raw, k)]  # fmt: skip
            return {**scope, "logRecords": recs} if recs else None
        metrics = []
        for metric in scope.get("metrics", []):
            new = self.metric(metric, k)
            if new is not None:
                metrics.append(new)
        return {**scope, "metrics": metrics} if metrics else None

    def metric(self, metric: dict[str, Any], k: int | None) -> dict[str, Any] | None:
        kind = next((x for x in ("gauge", "sum", "histogram", "exponentialHistogram", "summary") if x in metric), None)
        if kind is None:
            return None
        points = []
        for dp in metric[kind].get("dataPoints", []):
            if not self.in_seg(int(dp.get("timeUnixNano") or 0), k):
                continue
            a = _attrs(dp.get("attributes"))
            if _RC + "rank" in a:
                cause = self.cause(k)
                if cause is None:
                    continue
                dp = {**dp, "attributes": self.rc_attrs(dp["attributes"], k, cause)}
            points.append(self.times(dp, k))
        if not points:
            return None
        return {**metric, kind: {**metric[kind], "dataPoints": points}}

    def cause(self, k: int | None) -> int | None:
        """The local rank of this node's first failure in attempt k (None: no failure here)."""
        if k is None or k == self.plan.attempts - 1:
            return None
        fails = self.plan.fails(self.node, k)
        return fails[0] if fails else None

    def times(self, item: dict[str, Any], k: int | None) -> dict[str, Any]:
        off = self.offset(k)
        return {key: (str(int(v) + off) if key.lower().endswith("timeunixnano") and isinstance(v, str) else v)
                for key, v in item.items()}  # fmt: skip

    def span(self, raw: dict[str, Any], k: int | None) -> dict[str, Any]:
        span = self.times(raw, k)
        start_seg, end_seg = (
            self.src.segment(int(raw["startTimeUnixNano"])),
            self.src.segment(int(raw["endTimeUnixNano"])),
        )
        if start_seg != end_seg:  # the run span (to the end), a restart span (into the next attempt)
            end, last = int(raw["endTimeUnixNano"]), self.plan.attempts - 1
            if k is None or k >= last:
                span["endTimeUnixNano"] = str(end + self.offset(last))
            else:
                span["endTimeUnixNano"] = str(
                    end
                    - self.src.seg_start[end_seg if end_seg is not None else 0]
                    + self.plan.start(k + 1)
                    + self.plan.shift(self.node, k + 1)
                )
        span["traceId"] = self.plan.trace_id
        span["spanId"] = _map_id(raw["spanId"], self.salt(k))
        span["parentSpanId"] = self.map_ref(raw.get("parentSpanId", ""), k)
        span["attributes"] = self.span_attrs(raw, k)
        if k is not None and k < self.plan.attempts - 1:
            ranks = [self.node * self.plan.ranks + lr for lr in self.roles(k)]
            for kv in span["attributes"]:
                if kv["key"] == "torchelastic.failed_ranks":
                    kv["value"] = _array(ranks)
            if (raw.get("status") or {}).get("message", "").startswith("FAILED: ranks"):
                span["status"] = {**raw["status"], "message": f"FAILED: ranks [{', '.join(map(str, ranks))}]"}
        if k is not None:
            pids = [pid(k, lr, 0, self.plan.ranks) for lr in range(self.plan.ranks)]
            for kv in span["attributes"]:
                if kv["key"] == "torchelastic.worker_pids":
                    kv["value"] = _array(pids)
        events = []
        for ev in raw.get("events", []):
            events.extend(self.per_worker(ev, k))
        span["events"] = events
        return span

    def span_attrs(self, raw: dict[str, Any], k: int | None) -> list[dict[str, Any]]:
        """A span's attributes; the root cause's (an attempt's, the run's) only where this node had it."""
        kvs = raw.get("attributes", [])
        if _RC + "rank" not in _attrs(kvs):
            return self.attrs(kvs, k)
        cause = self.cause(k) if k is not None else self.last_cause()
        kk = k if k is not None else self.last_cause_attempt()
        if cause is None or kk is None:
            return [kv for kv in self.attrs(kvs, k) if not (kv["key"].startswith((_RC, "exception.")) or kv["key"]
                    in ("process.pid", "process.exit.code", "host.name"))]  # fmt: skip
        return self.rc_attrs(kvs, kk, cause)

    def last_cause_attempt(self) -> int | None:
        mine = [f.attempt for f in self.plan.failures if f.node == self.node]
        return max(mine) if mine else None

    def last_cause(self) -> int | None:
        kk = self.last_cause_attempt()
        return None if kk is None else self.cause(kk)

    def per_worker(self, raw: dict[str, Any], k: int | None) -> list[dict[str, Any]]:
        """A record (or span event) about one worker, once per local rank of this node; a root-cause record only
        on a node with a failure; any other record once."""
        a = _attrs(raw.get("attributes"))
        base = self.times(raw, k)
        if "spanId" in raw:
            base["spanId"] = self.map_ref(raw.get("spanId", ""), k)
        if "traceId" in raw and raw["traceId"]:
            base["traceId"] = self.plan.trace_id
        if _RC + "rank" in a:
            cause = self.cause(k)
            if cause is None:
                return []
            base["attributes"] = self.rc_attrs(raw.get("attributes", []), k, cause)
            return [base]
        if "torchelastic.global_rank" not in a or k is None:
            base["attributes"] = self.attrs(raw.get("attributes", []), k)
            if "body" in raw:
                base["body"] = self.body(raw["body"])
            return [base]
        src_local = int(a.get("torchelastic.local_rank", a.get("torchelastic.metadata.local_rank", -1)))
        out = []
        for lr, role in self.roles(k).items():
            if role == "ok" and self.src.healthy_local(lr) != src_local:
                continue
            if role != "ok" and src_local != self.src_local(role):
                continue
            rec = dict(base)
            rec["attributes"] = self.attrs(raw.get("attributes", []), k, lr)
            if role.startswith(("alike", "unlike")):
                rec["attributes"] = _died(rec["attributes"])
            out.append(rec)
        return out

    def body(self, body: dict[str, Any]) -> dict[str, Any]:
        text = body.get("stringValue")
        if isinstance(text, str):
            return {"stringValue": text.replace("localhost", host(self.node))}
        return body

    def attrs(self, kvs: list[dict[str, Any]], k: int | None, local: int | None = None) -> list[dict[str, Any]]:
        out = []
        p = self.plan
        for kv in kvs:
            key = kv["key"]
            (vkind, raw) = next(iter(kv["value"].items())) if kv.get("value") else ("stringValue", None)
            new: Any = raw
            if key in _HOST:
                new = host(self.node)
            elif key == "torchelastic.pid":
                new = "100"
            elif key in _GROUP:
                new = str(self.node)
            elif key in _NNODES:
                new = str(p.nodes)
            elif key in _WORLD:
                new = str(p.nodes * p.ranks)
            elif key in _LWORLD:
                new = str(p.ranks)
            elif key in _MAXR:
                new = str(max(p.attempts - 1, int(raw)))
            elif key in _RESTART and k is not None:
                new = str(k + (1 if int(raw) > self.template(k) else 0))  # a restart record names the next one
            elif key in _REMAIN and k is not None:  # before the restart: max - k; after it: one less
                new = str(max(0, p.attempts - 1 - k - (self.src.max_restarts - self.template(k) - int(raw))))
            elif local is not None and key in _GLOBAL:
                new = str(self.node * p.ranks + local)
            elif local is not None and key in _LOCAL:
                new = str(local)
            elif local is not None and key in _WPID and k is not None:
                new = str(pid(k, local, 0, p.ranks))
            if new is raw:
                out.append(kv)
            else:
                out.append({"key": key, "value": {vkind: new}})
        return out

    def rc_attrs(self, kvs: list[dict[str, Any]], k: int | None, local: int) -> list[dict[str, Any]]:
        p = self.plan
        rank = self.node * p.ranks + local
        others = [self.node * p.ranks + lr for lr in range(p.ranks) if lr != local]
        out = []
        for kv in self.attrs(kvs, k):
            key = kv["key"]
            vkind = next(iter(kv["value"])) if kv.get("value") else "stringValue"
            if key == _RC + "rank":
                kv = {"key": key, "value": {vkind: str(rank)}}
            elif key == _RC + "local_rank":
                kv = {"key": key, "value": {vkind: str(local)}}
            elif key == _RC + "consequences":
                kv = {"key": key, "value": _array(others)}
            elif key == _RC + "time_unix_nano":
                kv = {"key": key, "value": {vkind: str(int(kv["value"][vkind]) + self.offset(k))}}
            elif key == "process.pid" and k is not None:
                kv = {"key": key, "value": {vkind: str(pid(k, local, 0, p.ranks))}}
            elif key.startswith("exception.") and isinstance(kv["value"].get(vkind), str):
                text = _retext(kv["value"][vkind], self.src.fail_rank + 0, rank, self.src.failed, k or 0)
                kv = {"key": key, "value": {vkind: text}}
            out.append(kv)
        return out


def _died(kvs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent's record of a worker it stopped, as of one that failed itself: exit code 1, no SIGTERM."""
    out = []
    for kv in kvs:
        if kv["key"] == "torchelastic.signal":
            continue
        if kv["key"] == "torchelastic.exit_code":
            kv = {"key": kv["key"], "value": {next(iter(kv["value"])): "1"}}
        out.append(kv)
    return out


# ---- generate ---------------------------------------------------------------------------------------------------


def _plan(src: Source, nodes: int, ranks: int, attempts: int, fail: list[str], alike: int = 0, unlike: int = 0) -> Plan:
    if nodes < 1 or ranks < 1 or attempts < 1:
        raise ValueError("nodes, ranks and attempts must be >= 1")
    if alike < 0 or unlike < 0:
        raise ValueError("--fail-alike and --fail-unlike must be >= 0")
    failures = [parse_fail(f) for f in fail]
    for f in failures:
        if f.node >= nodes or f.local_rank >= ranks:
            raise ValueError(f"--fail node{f.node:04d}:{f.local_rank}: no such node or local rank")
        if f.attempt >= attempts - 1:
            raise ValueError(f"--fail ...@{f.attempt}: only attempts before the last ({attempts - 1}) can fail")
    for k in range(attempts - 1):
        if not any(f.attempt == k for f in failures):
            failures.append(Failure((k * 7919) % nodes, k % ranks, k))
    failures = list(dict.fromkeys(failures))
    t0 = src.seg_start[src.failed]
    fail_len = src.seg_start[src.healthy] - t0 if src.healthy > src.failed else 0
    run_id = str(uuid.UUID(int=_salt("run", src.run_id, nodes, ranks, attempts, tuple(failures)) << 64 | 1))
    trace_id = f"{_salt('trace', run_id):016x}{_salt('trace2', run_id):016x}"
    plan = Plan(nodes, ranks, attempts, failures, run_id, trace_id, t0, fail_len)
    if alike or unlike:
        _fates(plan, alike, unlike)
    return plan


def _fates(plan: Plan, alike: int, unlike: int) -> None:
    """The first ``alike + unlike`` nodes without a failure of their own fail with the others; of them, ``unlike``
    spread evenly fail differently (so the many that fail alike are no one range), the rest alike."""
    failing = {f.node for f in plan.failures}
    pool = [n for n in range(plan.nodes) if n not in failing][: alike + unlike]
    if len(pool) < alike + unlike:
        raise ValueError(f"--fail-alike {alike} --fail-unlike {unlike}: only {len(pool)} nodes without a --fail")
    different = [pool[(i + 1) * len(pool) // (unlike + 1)] for i in range(unlike)]
    plan.unlike = {node: i for i, node in enumerate(different)}
    plan.alike = frozenset(pool) - set(different)


def generate(src: Path, out: Path, nodes: int, ranks: int, attempts: int, fail: list[str], *,
             metric_every: int = 1, jobs: int = 0, alike: int = 0, unlike: int = 0) -> None:  # fmt: skip
    """Write to ``out`` (emptied first) the OTLP JSON Lines files of a run of ``nodes`` agents, each with
    ``ranks`` local ranks, in ``attempts`` attempts, cloned from the real job whose files are in ``src``;
    ``fail``: ``nodeNNNN:LOCAL@ATTEMPT`` specs (see the module's docstring).

    ``metric_every``: keep every n-th metric export of each process (and its last), as a longer export interval
    would have written them (the demo exports every 250 ms; its sums and histograms are cumulative, so a thinned
    series is still a true one). ``jobs``: processes writing nodes in parallel (0: one per CPU). ``alike``,
    ``unlike``: nodes whose ranks fail with the others, alike or differently (``--fail-alike``, ``--fail-unlike``)."""
    source = _load(Path(src))
    if metric_every > 1:
        _thin(source, metric_every)
    plan = _plan(source, nodes, ranks, attempts, fail, alike, unlike)
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    workers = {
        key: [(f, [_Template(line, source, plan, int(f.resource.get("torchelastic.rank", key[1])), key[0])
                   for line in f.lines]) for f in files]
        for key, files in source.workers.items()
    }  # fmt: skip
    agent_metrics = _agent_metric_templates(source, plan)
    jobs = max(1, min(jobs or os.cpu_count() or 1, nodes))
    if jobs == 1:
        _write_nodes(source, plan, workers, agent_metrics, out, range(nodes))
        return
    children = []
    for j in range(jobs):
        child = os.fork()
        if child == 0:  # pragma: no cover - the child
            code = 0
            try:
                _write_nodes(source, plan, workers, agent_metrics, out, range(j, nodes, jobs))
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            os._exit(code)
        children.append(child)
    failed = [c for c in children if os.waitpid(c, 0)[1] != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} of {jobs} writer processes failed")


def _thin(source: Source, every: int) -> None:
    """Keep every n-th metric line of each process's files (and the last one)."""
    for f in [*source.agent_files, *(f for files in source.workers.values() for f in files)]:
        if any("resourceMetrics" in line for line in f.lines):
            last = len(f.lines) - 1
            f.lines = [line for i, line in enumerate(f.lines) if i % every == 0 or i == last]


def _write_nodes(source: Source, plan: Plan, workers: dict[tuple[int, int], list[tuple[SrcFile, list[_Template]]]],
                 agent_metrics: dict[Path, list[tuple[int | None, _Template]]], out: Path,
                 nodes: range) -> None:  # fmt: skip
    attempts = plan.attempts
    for node in nodes:
        agent = _Agent(plan, source, node)
        _write_agent(agent, agent_metrics, out)
        for k in range(attempts):
            restart = agent.template(k)
            for lr, role in agent.roles(k).items():
                src_local = agent.src_local(role) if role != "ok" else source.healthy_local(lr)
                fate = role if role.startswith(("alike", "unlike")) else ""
                _write_worker(agent, workers[(restart, src_local)], k, lr, out, fate)


def _agent_metric_templates(source: Source, plan: Plan) -> dict[Path, list[tuple[int | None, _Template]]]:
    """The agent's metric lines as templates, each with the source segment of its points; its root-cause gauge
    (``torchelastic.root_cause.time``) is left out (it names the source's failing rank on every export)."""
    found: dict[Path, list[tuple[int | None, _Template]]] = {}
    for f in source.agent_files:
        if not any("resourceMetrics" in line for line in f.lines):
            continue
        found[f.path] = []
        for line in f.lines:
            times = []
            for block in line.get("resourceMetrics", []):
                for scope in block.get("scopeMetrics", []):
                    scope["metrics"] = [m for m in scope.get("metrics", []) if m.get("name") != _RC + "time"]
                    for m in scope["metrics"]:
                        for kind in ("gauge", "sum", "histogram", "exponentialHistogram", "summary"):
                            times += [
                                int(dp.get("timeUnixNano") or 0) for dp in (m.get(kind) or {}).get("dataPoints", [])
                            ]
            if times:
                found[f.path].append((source.segment(min(times)), _Template(line, source, plan, -1, -1)))
    return found


def _agent_file(agent: _Agent, path: Path) -> str:
    src = agent.src
    return path.name.replace(f"-{src.host}-", f"-{host(agent.node)}-").replace(str(src.agent_pid), "100")


def _write_agent(agent: _Agent, metrics: dict[Path, list[tuple[int | None, _Template]]], out: Path) -> None:
    last = agent.plan.attempts - 1
    for f in agent.src.agent_files:
        with open(out / _agent_file(agent, f.path), "w", encoding="utf-8") as fh:
            if f.path in metrics:
                ctxs = {k: _Ctx(agent.plan, agent.node, k if k is not None else 0, -1, 0, agent.offset(k), 0, 0, 0)
                        for k in [None, *range(agent.plan.attempts)]}  # fmt: skip
                for seg, template in metrics[f.path]:
                    if seg is None:
                        fh.write(template.render(ctxs[None]))
                    elif seg == agent.src.failed:
                        fh.writelines(template.render(ctxs[k]) for k in range(last))
                    elif seg == agent.src.healthy:
                        fh.write(template.render(ctxs[last]))
                continue
            for line in f.lines:
                for text in agent.lines(line):
                    fh.write(text)
                    fh.write("\n")


def _write_worker(
    agent: _Agent, files: list[tuple[SrcFile, list[_Template]]], k: int, local: int, out: Path, fate: str = ""
) -> None:
    plan, node = agent.plan, agent.node
    pids = sorted({int(f.resource.get("process.pid") or 0) for f, _ in files})
    offset, salt_agent, salt_before = agent.offset(k), agent.salt(k), agent.salt(None)
    for f, lines in files:
        j = pids.index(int(f.resource.get("process.pid") or 0))
        ctx = _Ctx(plan, node, k, local, j, offset, _salt("w", node, k, local, j), salt_agent, salt_before, fate=fate)
        kind = f.path.name.split("-", 1)[0]
        name = f"{kind}-{host(node)}-rank{node * plan.ranks + local}-restart{k}-{pid(k, local, j, plan.ranks)}.jsonl"
        with open(out / name, "w", encoding="utf-8") as fh:
            fh.writelines(t.render(ctx) for t in lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("src", type=Path, help="directory of a real small job's OTLP JSON Lines files")
    p.add_argument("out", type=Path, help="directory to write (emptied first)")
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--ranks", type=int, default=8, help="local ranks per node")
    p.add_argument("--attempts", type=int, default=3)
    p.add_argument("--fail", action="append", default=[], help="nodeNNNN:LOCAL_RANK@ATTEMPT (repeatable)")
    p.add_argument("--metric-every", type=int, default=1, help="keep every n-th metric export of each process")
    p.add_argument("--jobs", type=int, default=0, help="writer processes (default: one per CPU)")
    p.add_argument(
        "--fail-alike",
        type=int,
        default=0,
        metavar="N",
        help="N nodes whose ranks fail alike with the others (gloo's Connection closed by peer)",
    )
    p.add_argument(
        "--fail-unlike",
        type=int,
        default=0,
        metavar="M",
        help="M nodes among those whose ranks fail differently (another error, in turn)",
    )
    args = p.parse_args(argv)
    generate(args.src, args.out, args.nodes, args.ranks, args.attempts, args.fail, metric_every=args.metric_every,
             jobs=args.jobs, alike=args.fail_alike, unlike=args.fail_unlike)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
