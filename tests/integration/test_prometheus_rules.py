"""deploy/prometheus/ as the real promtool (Debian's ``prometheus`` package) judges it: the
rules are valid, their unit tests pass, the compose file's Prometheus configuration loads
them. Skipped, saying why, where promtool is not installed."""

from __future__ import annotations

import pytest
import yaml

from tests.monitoring import DEPLOY, PrometheusUnavailable, promtool

PROMETHEUS = DEPLOY / "prometheus"


def run_promtool(*args: str) -> str:
    try:
        done = promtool(*args, cwd=PROMETHEUS)
    except PrometheusUnavailable as exc:
        pytest.skip(str(exc))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_promtool_checks_the_rules() -> None:
    out = run_promtool("check", "rules", "rules/mana-ai.rules.yml")
    rules = yaml.safe_load((PROMETHEUS / "rules" / "mana-ai.rules.yml").read_text())
    count = sum(len(group["rules"]) for group in rules["groups"])
    assert f"SUCCESS: {count} rules found" in out


def test_the_rules_pass_their_promtool_unit_tests() -> None:
    out = run_promtool("test", "rules", "tests/mana-ai.test.yml")
    assert "SUCCESS" in out


def test_the_compose_prometheus_configuration_loads_the_rules() -> None:
    out = run_promtool("check", "config", "prometheus.yml")
    assert "SUCCESS: 1 rule files found" in out and "rules/mana-ai.rules.yml" in out


def test_every_alert_has_a_runbook_and_a_unit_test_that_fires_it() -> None:
    rules = yaml.safe_load((PROMETHEUS / "rules" / "mana-ai.rules.yml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    tests = yaml.safe_load((PROMETHEUS / "tests" / "mana-ai.test.yml").read_text())
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    for alert in alerts:
        annotations = alert["annotations"]
        assert {"summary", "description", "runbook"} <= set(annotations), alert["alert"]
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), alert["alert"]
        assert alert["alert"] in fired, f"no promtool test fires {alert['alert']}"
