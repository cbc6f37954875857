"""The docs' one query for a job's first failure, run by a real Prometheus over two real agents ("nodes").

Each agent reports the first failure among its own workers; only a query over all agents finds the job's first.
Two ``torchelastic-otel run`` agents (through ``tests/support/workers/_stack_launcher.py``, which keeps an agent's
Prometheus endpoint up after its run so its final values are scraped) join one c10d rendezvous on 127.0.0.1 (its store
hosted by the test, as a dedicated store host would be, so the agents' exits do not take it down), 2 workers each
(``tests/support/workers/_root_cause_worker.py --fail-rank 3``): global rank 3, on the second agent, raises while ranks
0-2 wait for it in a gloo ``all_reduce``; gloo then fails ranks 0 and 1 on the first agent (and rank 2 on the second),
later by causality. Debian's ``prometheus`` scrapes both agents every second. The docs' query must name rank 3.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest

from tests.support import ROOT, WORKERS, stack
from tests.support.env import prometheus_env
from tests.support.jobs import c10d_args, unique_id
from tests.support.ports import free_port, free_port_block
from tests.support.waiting import wait_for

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")
yaml = pytest.importorskip("yaml")
from torch.distributed import TCPStore  # noqa: E402

WORKER = WORKERS / "_root_cause_worker.py"
README = ROOT / "docs" / "root-cause.md"
#: The query as the docs give it; the test fills in the run id.
QUERY = 'bottomk(1, torchelastic_root_cause_time_seconds{torchelastic_run_id="<run id>"})'
TIMEOUT = 90.0


def _config(ports: list[int]) -> str:
    job = {"job_name": "torchelastic-agents", "scrape_interval": "1s", "scrape_timeout": "1s",
           "static_configs": [{"targets": [f"{stack.HOST}:{port}" for port in ports]}]}  # fmt: skip
    return yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [job]}, sort_keys=False)


def test_readme_query_names_the_rank_that_failed_first_across_agents(tmp_path: Path) -> None:
    assert QUERY in README.read_text(), "docs/root-cause.md shows this query"
    bases = [free_port_block(3), free_port_block(3)]
    avoid = {base + i for base in bases for i in range(3)}
    prom = stack.Prometheus(stack.prometheus_bin(), tmp_path / "prometheus", _config(bases), avoid=avoid)
    run_id = unique_id("first-failure")
    # The rendezvous store is hosted here, not by an agent: the failing rank's agent exits at once (no restarts),
    # and the other agent must outlive it to see its own workers fail and report them.
    store_port = free_port()
    store = TCPStore("127.0.0.1", store_port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    rdzv = [*c10d_args(run_id, store_port), "--rdzv-conf", "is_host=false"]
    agents: list[stack.Proc] = []
    flags = [tmp_path / f"flags{i}" for i in range(2)]
    prom.start()
    try:
        for i, base in enumerate(bases):
            flags[i].mkdir()
            env = prometheus_env(base)
            cmd = [sys.executable, stack.LAUNCHER, flags[i], str(TIMEOUT), "--nnodes", "2", "--nproc-per-node", "2",
                   "--max-restarts", "0", *rdzv, WORKER, "--fail-rank", "3"]  # fmt: skip
            agents.append(stack.start(cmd, tmp_path / f"agent{i}.log", env=env))

        def describe() -> str:
            return prom.describe() + "".join(f"\nagent {i}:\n{a.output()[-4000:]}" for i, a in enumerate(agents))

        wait_for(lambda: all((f / "agent-done").exists() for f in flags), TIMEOUT, "both agents' runs to end",
                         on_timeout=describe, interval=0.2)  # fmt: skip
        selector = f'torchelastic_root_cause_time_seconds{{torchelastic_run_id="{run_id}"}}'
        wait_for(lambda: len(prom.query(selector)) == 2, 30, "both agents' root causes in Prometheus",
                         on_timeout=describe, interval=0.2)  # fmt: skip
        per_agent = prom.query(selector)
        first = prom.query(QUERY.replace("<run id>", run_id))
    finally:
        for f in flags:
            if f.exists():
                (f / "agent-exit").touch()
        for agent in agents:
            agent.stop()
        prom.stop()
        del store  # the server stops with the object

    assert len(first) == 1, per_agent
    labels = first[0]["metric"]
    assert labels["torchelastic_root_cause_rank"] == "3", per_agent
    assert labels["torchelastic_root_cause_reason"] == "ValueError"
    # Each agent reported its own first failure: the other one is a consequence on the first agent, and later.
    others = [s for s in per_agent if s["metric"]["torchelastic_root_cause_rank"] != "3"]
    assert len(others) == 1 and others[0]["metric"]["torchelastic_root_cause_rank"] in {"0", "1"}, per_agent
    assert others[0]["value"] > first[0]["value"]
