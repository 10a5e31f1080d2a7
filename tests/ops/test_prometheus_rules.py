"""The Prometheus configuration, rules and their unit tests, checked by promtool itself."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.deploy import PROMETHEUS_CONFIG, PROMETHEUS_DIR, RULES, RULES_TEST, load_yaml, run_promtool

REQUIRED_ALERTS = {
    "KVGatewayStreamDown",
    "KVGatewaySequenceGaps",
    "KVGatewayUnrecoveredBatches",
    "KVGatewayPublisherRestarts",
    "KVGatewayHighEventLag",
    "KVGatewaySlowConsumers",
    "KVGatewayDecodeErrors",
}


def rules() -> list[dict[str, Any]]:
    data = load_yaml(RULES)
    assert isinstance(data, dict)
    return [rule for group in data["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in rules() if "alert" in rule}


@pytest.mark.prometheus
def test_promtool_check_config(promtool: str) -> None:
    output = run_promtool(promtool, "check", "config", PROMETHEUS_CONFIG.name, cwd=PROMETHEUS_DIR)
    assert "SUCCESS" in output


@pytest.mark.prometheus
def test_promtool_check_rules(promtool: str) -> None:
    output = run_promtool(promtool, "check", "rules", RULES.name, cwd=PROMETHEUS_DIR)
    assert f"SUCCESS: {len(rules())} rules found" in output


@pytest.mark.prometheus
def test_promtool_unit_tests(promtool: str) -> None:
    output = run_promtool(promtool, "test", "rules", RULES_TEST.name, cwd=PROMETHEUS_DIR)
    assert "SUCCESS" in output


def test_config_scrapes_gateway_metrics_and_loads_the_rules() -> None:
    config = load_yaml(PROMETHEUS_CONFIG)
    assert isinstance(config, dict)
    assert RULES.name in config["rule_files"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    job = jobs["kvgateway"]  # KVGatewayDown matches this job name
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for static in job["static_configs"] for t in static["targets"]]
    assert targets and all(t.endswith(":8080") for t in targets)
    assert 'up{job="kvgateway"}' in alerts()["KVGatewayDown"]["expr"]


def test_required_alerts_exist_and_are_complete() -> None:
    defined = alerts()
    assert set(defined) >= REQUIRED_ALERTS
    for name, rule in defined.items():
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert {"summary", "description"} <= set(rule["annotations"]), name


def test_alert_expressions_say_what_the_runbook_says() -> None:
    defined = alerts()
    assert defined["KVGatewayStreamDown"]["expr"].strip() == "kvgateway_source_up == 0"
    assert defined["KVGatewayStreamDown"]["for"] == "2m"
    # any increase of unrecovered batches, with no waiting time
    assert defined["KVGatewayUnrecoveredBatches"]["expr"].strip().endswith("> 0")
    assert "for" not in defined["KVGatewayUnrecoveredBatches"]
    assert "histogram_quantile" in defined["KVGatewayHighEventLag"]["expr"]
    assert "kvgateway_event_lag_seconds_bucket" in defined["KVGatewayHighEventLag"]["expr"]
    assert 'reason="slow_consumer"' in defined["KVGatewaySlowConsumers"]["expr"]
    assert "for" in defined["KVGatewaySequenceGaps"]  # sustained, not a single gap


def test_every_alert_has_unit_tests_firing_and_not_firing() -> None:
    data = load_yaml(RULES_TEST)
    assert isinstance(data, dict)
    assert data["rule_files"] == [RULES.name]
    firing: set[str] = set()
    silent: set[str] = set()
    for case in data["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = set(alerts())
    assert names - firing == set(), "alerts never shown firing"
    assert names - silent == set(), "alerts never shown not firing"
    assert firing | silent <= names, "tests of alerts that do not exist"


def test_recording_rules_follow_the_naming_convention() -> None:
    for rule in rules():
        if "record" in rule:
            level, metric, operation = rule["record"].split(":")
            assert level and operation, rule["record"]
            assert metric.startswith("kvgateway_"), rule["record"]
