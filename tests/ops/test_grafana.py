"""The Grafana dashboard and its provisioning files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.deploy import DASHBOARD, DEPLOY, check_promql, dashboard_queries, grafana_to_promql, load_yaml

PROVISIONING = DEPLOY / "grafana" / "provisioning"
DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}


def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def panels(data: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for panel in data["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def test_datasource_is_a_template_variable() -> None:
    data = dashboard()
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE_REF, variable["name"]
    for panel in panels(data):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE_REF, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE_REF, panel["title"]
    # no data source fixed anywhere: an import into any Grafana works
    assert "__inputs" not in data
    assert '"uid": "prometheus"' not in DASHBOARD.read_text(encoding="utf-8")


def test_layout_is_sound() -> None:
    data = dashboard()
    assert data["uid"] and data["title"]
    ids = [panel["id"] for panel in panels(data)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(data):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]
    for panel in panels(data):
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel.get("description"), f"{panel['title']}: say what the panel shows"


def test_dashboard_covers_the_operator_questions() -> None:
    queries = dashboard_queries(dashboard())
    text = "\n".join(expr for _, expr in queries)

    def panel_with(*fragments: str) -> str:
        for title, expr in queries:
            if all(fragment in expr for fragment in fragments):
                return title
        raise AssertionError(f"no panel queries {fragments}")

    panel_with("kvgateway_cache_blocks", "by (medium)")  # fleet occupancy by medium
    panel_with("rate(kvgateway_batches_received_total")  # ingest rate
    panel_with("kvgateway_sequence_gaps_total")
    panel_with("kvgateway_replay_requests_total", "by (outcome)")
    panel_with("kvgateway_unrecovered_batches_total")
    panel_with("histogram_quantile(0.5", "kvgateway_event_lag_seconds_bucket")
    panel_with("histogram_quantile(0.99", "kvgateway_event_lag_seconds_bucket")
    panel_with("kvgateway_clients", "by (transport)")
    panel_with("kvgateway_client_disconnects_total", 'reason="slow_consumer"')
    # cache analytics (docs/operations.md, "Cache analytics")
    panel_with("histogram_quantile(0.5", "kvgateway_block_lifetime_seconds_bucket")
    panel_with("kvgateway_block_refetches_total", "/", "kvgateway_sampled_evictions_total")
    panel_with('kvgateway_cache_blocks{medium=~"CPU.*"', "/")
    panel_with("kvgateway_prefix_engines_mean")
    # where the prefill goes (docs/operations.md): the shares by origin, the routing-miss share per engine
    panel_with("kvgateway_stored_tokens_total", "by (origin)")
    panel_with('kvgateway_stored_tokens_total{origin="elsewhere"', "/", "by (source, dp_rank)")
    # occupancy counts each stream once even when several replicas report it
    assert "max by (source, dp_rank, medium) (kvgateway_cache_blocks" in text


def test_dashboard_filters_follow_the_variables() -> None:
    for title, expr in dashboard_queries(dashboard()):
        if "source" in expr and "kvgateway_clients" not in expr:
            assert 'source=~"$source"' in expr, title
        assert 'instance=~"$instance"' in expr, title


@pytest.mark.prometheus
def test_dashboard_queries_parse(promtool: str, tmp_path: Path) -> None:
    queries = [(title, grafana_to_promql(expr)) for title, expr in dashboard_queries(dashboard())]
    check_promql(promtool, queries, tmp_path)


def test_provisioning() -> None:
    datasources = load_yaml(PROVISIONING / "datasources" / "prometheus.yaml")
    assert isinstance(datasources, dict)
    assert datasources["apiVersion"] == 1
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"  # the compose service
    assert source["isDefault"] is True

    providers = load_yaml(PROVISIONING / "dashboards" / "kvgateway.yaml")
    assert isinstance(providers, dict)
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]

    compose = load_yaml(DEPLOY / "compose.yaml")
    assert isinstance(compose, dict)
    mounts = compose["services"]["grafana"]["volumes"]
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in mounts
    assert f"./grafana/{DASHBOARD.name}:{path}/{DASHBOARD.name}:ro" in mounts
