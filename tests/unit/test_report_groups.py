"""The deviating nodes grouped by what happened to them (``report/groups.py``): what folds, what never does.

The rule on its own here (``mask`` on real error messages: gloo's, NCCL's, CUDA's, Python's; ``of`` on the
overview's nodes); the views of generated runs of 16 and 1,024 nodes are in ``tests/jobs/test_report_at_scale.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.report_files import Shape, write_job
from torchelastic_otel.report import groups, hosts, model, nodes, read, training

pytest.importorskip("opentelemetry.exporter.otlp.json.file")

GLOO = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:{line}] Connection {how} by peer [{ip}]:{port}"

#: messages that differ only in what varies from rank to rank: each pair reads the same once masked
ALIKE = [
    (GLOO.format(line=553, how="closed", ip="10.0.3.7", port=41873),
     GLOO.format(line=534, how="closed", ip="10.1.0.255", port=29500)),
    ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, "
     "NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.",
     "[Rank 1021] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=13, OpType=ALLREDUCE, NumelIn=8, "
     "NumelOut=8, Timeout(ms)=600000) ran for 600431 milliseconds before timing out."),
    ("DataLoader worker (pid 4242) is killed by signal: Bus error.",
     "DataLoader worker (pid 77) is killed by signal: Bus error."),
    ("connect() to [fe80::1]:29500 failed", "connect() to [::1]:1234 failed"),
    ("cannot open /tmp/torchelastic_k3j2l_x/attempt_0/0/error.json",
     "cannot open /tmp/torchelastic_9zq1ma/attempt_1/7/error.json"),
    ("store key 9f86d081884c7d65 missing (run 123e4567-e89b-12d3-a456-426614174000)",
     "store key 0a1b2c3d4e5f6071 missing (run 00000000-0000-0000-0000-000000000001)"),
    ("illegal memory access at 0x7f3a2c000000", "illegal memory access at 0x55d1"),
    ("timed out after 1800.5 s on node0417:29400", "timed out after 600 s on node0003:29400"),
]  # fmt: skip

#: messages that differ in a word: never one group, whatever their numbers
UNLIKE = [
    (GLOO.format(line=553, how="closed", ip="10.0.3.7", port=1),
     GLOO.format(line=553, how="reset", ip="10.0.3.7", port=1)),
    ("CUDA out of memory. Tried to allocate 2.00 GiB", "CUDA out of memory. Tried to allocate 2.00 MiB"),
    ("cannot open /data/train/shard.bin", "cannot open /data/valid/shard.bin"),
    ("DataLoader worker (pid 1) is killed by signal: Bus error.",
     "DataLoader worker (pid 1) is killed by signal: Killed."),
]  # fmt: skip


@pytest.mark.parametrize(("one", "other"), ALIKE)
def test_messages_that_differ_in_numbers_read_the_same(one: str, other: str) -> None:
    assert groups.mask(one) == groups.mask(other)
    assert not any(c.isdigit() for c in groups.mask(one)), groups.mask(one)


@pytest.mark.parametrize(("one", "other"), UNLIKE)
def test_messages_that_differ_in_a_word_stay_apart(one: str, other: str) -> None:
    assert groups.mask(one) != groups.mask(other)


def test_what_a_mask_reads_like() -> None:
    assert groups.mask(GLOO.format(line=553, how="closed", ip="127.0.0.1", port=31929) + ".  GLHF!\n") == (
        "[<path>] Connection closed by peer <addr>. GLHF!"
    )
    assert groups.mask("batch 25 of rank 121 holds NaN inputs") == "batch <n> of rank <n> holds NaN inputs"
    assert groups.mask("allreduce/broadcast of tensor float16") == "allreduce/broadcast of tensor float<n>"


# ---- grouping the nodes ------------------------------------------------------------------------------------------


def _node(host: str, reason: str, head: str, details: dict[int, str]) -> nodes.Node:
    node = nodes.Node(host, ranks=sorted(details))
    for rank, detail in details.items():
        event = nodes.Event(reason, rank, head, detail)
        node.add(reason, rank, f"rank {rank}: {head}: {detail}", 1_000 + rank, event)
    return node


def _overview(deviating: list[nodes.Node]) -> nodes.Overview:
    counts = hosts.Counts(attempts=2, ranks=64, nodes=32, agents=32, failures=len(deviating))
    return nodes.Overview(counts, "", deviating, [], [])


def _gloo(node: int, rank: int, how: str = "closed") -> str:
    return "RuntimeError: " + GLOO.format(line=553, how=how, ip=f"10.0.{node}.{rank}", port=20000 + 7 * rank)


def test_many_nodes_that_failed_alike_are_one_group_and_the_few_their_own() -> None:
    cause = _node("node0003", "root cause", "root cause of attempt 0 (exit code 1)", {7: "ValueError: NaN"})
    failed = "failed in attempt 0 (exit code 1)"
    alike = [
        _node(f"node{n:04d}", "failure", failed, {2 * n: _gloo(n, 2 * n), 2 * n + 1: _gloo(n, 2 * n + 1)})
        for n in range(32)
        if n not in (3, 9, 20, 21)
    ]
    reset = _node("node0009", "failure", failed, {18: _gloo(9, 18, "reset"), 19: _gloo(9, 19)})  # one rank differs
    other_type = _node("node0020", "failure", failed, {40: "torch.distributed.DistBackendError: " + GLOO, 41: ""})
    later = _node("node0021", "failure", "failed in attempt 1 (exit code 1)", {42: _gloo(21, 42), 43: _gloo(21, 43)})
    view = _overview([cause, *alike[:5], reset, *alike[5:], other_type, later])

    found = groups.of(view)

    expected = [["node0003"], [n.host for n in alike], ["node0009"], ["node0020"], ["node0021"]]
    assert [[n.host for n in g.nodes] for g in found] == expected
    first, many, *few = found
    assert first.root_cause and first.line == "node0003  root cause: rank 7"
    assert first.notes() == ["rank 7: root cause of attempt 0 (exit code 1): ValueError: NaN"]  # as it was written
    assert many.line == (
        "node0000…node0002, node0004…node0008, node0010…node0019, node0022…node0031 (28 hosts)  "
        "failure: ranks 0–5, 8–17, 20–39, 44–63 (56 ranks)"
    )
    assert many.notes() == [f"{failed}: RuntimeError: [<path>] Connection closed by peer <addr>"]
    assert all(len(g.nodes) == 1 for g in few)
    assert few[0].what == [
        f"{failed}: RuntimeError: [<path>] Connection closed by peer <addr>",
        f"{failed}: RuntimeError: [<path>] Connection reset by peer <addr>",
    ]
    as_json = json.loads(json.dumps([g.as_json() for g in found]))
    assert [g["nodes"] for g in as_json] == [1, 28, 1, 1, 1]
    assert as_json[1]["ranks"] == many.ranks and as_json[1]["rank_count"] == 56
    assert as_json[1]["example"] == f"rank 0: {failed}: {_gloo(0, 0)}"
    assert as_json[1]["host_names"][:3] == ["node0000", "node0001", "node0002"]


def test_a_few_nodes_alike_are_named_and_counted() -> None:
    failed = "stalled in attempt 0"
    two = [_node(h, "stall", failed, {i: "train.py:12 in step"}) for i, h in enumerate(("gpu7", "gpu9"))]
    (group,) = groups.of(_overview(two))
    assert group.line == "gpu7, gpu9 (2 hosts)  stall: ranks 0, 1"


def test_no_deviating_node_no_group() -> None:
    assert groups.of(_overview([])) == []


# ---- in the report's JSON -------------------------------------------------------------------------------------------

KEYS = [
    "run_id", "outcome", "start", "seconds", "ranks", "attempts", "agents", "nodes", "failures", "hosts", "root_cause",
    "root_causes", "restarts", "stragglers", "steps", "stalls", "missing_ranks", "goodput", "goodput_attempts",
    "verdict", "memory_creep",
]  # fmt: skip


def _summary(directory: Path, shape: Shape) -> dict[str, object]:
    write_job(directory, shape)
    runs = training.summary(model.build(read([str(directory)])))["runs"]
    assert isinstance(runs, list) and len(runs) == 1 and isinstance(runs[0], dict)
    return runs[0]


def test_a_run_without_deviating_nodes_has_no_group_and_its_keys_as_before(tmp_path: Path) -> None:
    run = _summary(tmp_path / "ok", Shape(attempts=1))
    assert list(run) == [*KEYS, "groups"] and run["groups"] == []


def test_a_failed_run_on_one_node_has_its_root_cause_group(tmp_path: Path) -> None:
    run = _summary(tmp_path / "failed", Shape(ranks=4, cause_rank=2))
    assert list(run) == [*KEYS, "groups"]
    cause = run["root_cause"]
    assert isinstance(cause, dict) and cause["consequences"] == [0, 1, 3]
    assert run["groups"] == [
        {
            "line": "node0  root cause: rank 2",
            "root_cause": True,
            "reasons": ["root cause"],
            "what": ["root cause of attempt 0 (exit code 1): ValueError: rank <n> failed"],
            "nodes": 1,
            "hosts": "node0",
            "host_names": ["node0"],
            "rank_count": 1,
            "ranks": [2],
            "example": "rank 2: root cause of attempt 0 (exit code 1): ValueError: rank 2 failed",
        }
    ]
