"""``promtool`` (Debian's prometheus package) on the committed Prometheus configuration, rules and rule tests.

- ``promtool check config collector-config/prometheus.yml`` (it also loads the rule file it names);
- ``promtool check rules collector-config/alerts/torchelastic.rules.yml``;
- ``promtool test rules collector-config/alerts/torchelastic.rules.test.yml``: series recorded from a real failing
  job (tests/stack/test_stack_prometheus.py generates it), in which every alert fires -- and the same file with one
  expectation removed must fail, so the test is not vacuous;
- ``promtool check rules`` and ``promtool test rules`` of the goodput recording rules
  (``collector-config/alerts/torchelastic-goodput.rules.yml`` and its ``.test.yml``), and the test with one expected
  ratio changed must fail.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support import stack

yaml = stack.require_yaml()

GOODPUT_RULES = stack.CONFIG_DIR / "alerts" / "torchelastic-goodput.rules.yml"
GOODPUT_RULES_TEST = stack.CONFIG_DIR / "alerts" / "torchelastic-goodput.rules.test.yml"
GOODPUT_RECORDS = {"torchelastic:job_goodput_seconds:rate5m", "torchelastic:job_goodput:ratio"}

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
    assert "SUCCESS" in result.stdout and "3 rule files found" in result.stdout, _ok(result)  # +training, goodput


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


# ---- the goodput recording rules --------------------------------------------------------------------------------


def test_promtool_check_goodput_rules() -> None:
    result = stack.run_tool([stack.promtool_bin(), "check", "rules", str(GOODPUT_RULES)])
    assert result.returncode == 0, _ok(result)
    assert f"SUCCESS: {len(GOODPUT_RECORDS)} rules found" in result.stdout, _ok(result)
    assert set(stack.rule_exprs(GOODPUT_RULES)) == GOODPUT_RECORDS
    assert (
        "torchelastic_goodput_time_seconds_total"
        in stack.rule_exprs(GOODPUT_RULES)["torchelastic:job_goodput_seconds:rate5m"]
    )


def test_promtool_test_goodput_rules() -> None:
    result = stack.run_tool([stack.promtool_bin(), "test", "rules", str(GOODPUT_RULES_TEST)])
    assert result.returncode == 0, _ok(result)
    assert "SUCCESS" in result.stdout, _ok(result)
    document = yaml.safe_load(GOODPUT_RULES_TEST.read_text())
    assert document["rule_files"] == [GOODPUT_RULES.name]
    tested = {name for test in document["tests"] for t in test["promql_expr_test"]
              for name in stack.promql_metric_names(t["expr"])}  # fmt: skip
    assert tested == GOODPUT_RECORDS, tested


def test_promtool_test_goodput_rules_fails_on_a_wrong_ratio(tmp_path: Path) -> None:
    """Expect 0.5 where the steady run's ratio is 0.6: promtool must fail and say which."""
    shutil.copy(GOODPUT_RULES, tmp_path / GOODPUT_RULES.name)
    document = yaml.safe_load(GOODPUT_RULES_TEST.read_text())
    case = next(t for t in document["tests"][0]["promql_expr_test"]
                if t["expr"].startswith("round(torchelastic:job_goodput:ratio,"))  # fmt: skip
    (sample,) = [s for s in case["exp_samples"] if "steady" in s["labels"]]
    assert sample["value"] == 0.6
    sample["value"] = 0.5
    broken = tmp_path / "broken.rules.test.yml"
    broken.write_text(yaml.safe_dump(document, sort_keys=False, width=1_000_000))
    result = stack.run_tool([stack.promtool_bin(), "test", "rules", str(broken)])
    assert result.returncode != 0, _ok(result)
    assert "job_goodput:ratio" in result.stdout + result.stderr, _ok(result)
