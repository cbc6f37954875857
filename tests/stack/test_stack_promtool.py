"""``promtool`` (Debian's prometheus package) on the committed Prometheus configuration, rules and rule tests.

- ``promtool check config collector-config/prometheus.yml`` (it also loads the rule file it names);
- ``promtool check rules collector-config/alerts/torchelastic.rules.yml``;
- ``promtool test rules collector-config/alerts/torchelastic.rules.test.yml``: series recorded from a real failing
  job (tests/stack/test_stack_prometheus.py generates it), in which every alert fires -- and the same file with one
  expectation removed must fail, so the test is not vacuous.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support import stack

yaml = stack.require_yaml()

REQUIRED_ALERTS = {
    "TorchElasticWorkerGroupFailed",
    "TorchElasticRestartsExhausted",
    "TorchElasticRestartsHappening",
    "TorchElasticRendezvousSlow",
    "TorchElasticHighFlakiness",
}


def _ok(result: object) -> str:
    return f"{result.stdout}\n{result.stderr}"  # type: ignore[attr-defined]


def test_promtool_check_config() -> None:
    result = stack.run_tool([stack.promtool_bin(), "check", "config", str(stack.PROMETHEUS_YML)])
    assert result.returncode == 0, _ok(result)
    assert "SUCCESS" in result.stdout and "2 rule files found" in result.stdout, _ok(result)  # + training rules


def test_promtool_check_rules() -> None:
    result = stack.run_tool([stack.promtool_bin(), "check", "rules", str(stack.RULES)])
    assert result.returncode == 0, _ok(result)
    assert f"SUCCESS: {len(REQUIRED_ALERTS)} rules found" in result.stdout, _ok(result)


def test_the_rules_are_the_required_alerts() -> None:
    rules = yaml.safe_load(stack.RULES.read_text())
    alerts = [r for group in rules["groups"] for r in group["rules"]]
    assert {r["alert"] for r in alerts} == REQUIRED_ALERTS
    for rule in alerts:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule
    rendezvous = next(r for r in alerts if r["alert"] == "TorchElasticRendezvousSlow")["expr"]
    assert "histogram_quantile" in rendezvous and "torchelastic_function_duration_seconds_bucket" in rendezvous
    assert 'function="SimpleElasticAgent._rendezvous"' in rendezvous


def test_promtool_test_rules_on_the_committed_recording() -> None:
    result = stack.run_tool([stack.promtool_bin(), "test", "rules", str(stack.RULES_TEST)])
    assert result.returncode == 0, _ok(result)
    assert "SUCCESS" in result.stdout, _ok(result)
    document = yaml.safe_load(stack.RULES_TEST.read_text())
    assert document["rule_files"] == [stack.RULES.name]
    fired = {t["alertname"] for test in document["tests"] for t in test["alert_rule_test"] if t["exp_alerts"]}
    assert fired == REQUIRED_ALERTS


def test_promtool_test_rules_fails_when_an_alert_is_not_expected(tmp_path: Path) -> None:
    """Remove the expectation of one firing alert: promtool must report the alert it got and fail."""
    shutil.copy(stack.RULES, tmp_path / stack.RULES.name)
    document = yaml.safe_load(stack.RULES_TEST.read_text())
    case = next(
        t
        for t in document["tests"][0]["alert_rule_test"]
        if t["alertname"] == "TorchElasticWorkerGroupFailed" and t["exp_alerts"]
    )
    case["exp_alerts"] = []
    broken = tmp_path / "broken.rules.test.yml"
    broken.write_text(yaml.safe_dump(document, sort_keys=False, width=1_000_000))
    result = stack.run_tool([stack.promtool_bin(), "test", "rules", str(broken)])
    assert result.returncode != 0, _ok(result)
    assert "TorchElasticWorkerGroupFailed" in result.stdout + result.stderr, _ok(result)
