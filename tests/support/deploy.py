"""The deployment files as the operations tests read them: their paths, YAML, promtool, and
the PromQL found in the rules, the dashboard and the docs."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml

from tests.support.processes import REPO

DEPLOY = REPO / "deploy"
DOCS = REPO / "docs"
PROMETHEUS_DIR = DEPLOY / "prometheus"
RULES = PROMETHEUS_DIR / "kvgateway-rules.yml"
RULES_TEST = PROMETHEUS_DIR / "kvgateway-rules.test.yml"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "kvgateway-dashboard.json"
METRICS_DOC = DOCS / "metrics.md"
OPERATIONS_DOC = DOCS / "operations.md"
K8S = DEPLOY / "k8s"

PROMTOOL_MISSING = "promtool is not installed (Debian/Ubuntu: apt-get install prometheus)"

# A kvgateway metric name standing alone: not part of a recording rule name (level:metric:ops).
METRIC_NAME = re.compile(r"(?<![\w:])kvgateway_[a-z0-9_]*[a-z0-9](?![\w:])")


def metric_names_in(text: str) -> set[str]:
    return set(METRIC_NAME.findall(text))


def load_yaml(path: Path) -> object:
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def load_yaml_all(path: Path) -> list[object]:
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


# --- promtool -------------------------------------------------------------------------------


def run_promtool(promtool: str, *args: str, cwd: Path) -> str:
    result = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool {' '.join(args)} failed ({result.returncode}):\n{output}"
    return output


def check_promql(promtool: str, expressions: Iterable[tuple[str, str]], tmp_path: Path) -> None:
    """Parse PromQL with Prometheus's own parser: each (where, expr) becomes a recording rule."""
    items = list(expressions)
    assert items, "no expressions to check"
    rules = [{"record": f"check:expr_{i}", "expr": expr} for i, (_, expr) in enumerate(items)]
    path = tmp_path / "promql-check.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "promql-check", "rules": rules}]}), encoding="utf-8")
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    if result.returncode != 0:
        listing = "\n".join(f"  expr_{i} ({where}): {expr}" for i, (where, expr) in enumerate(items))
        pytest.fail(f"PromQL does not parse:\n{result.stdout}{result.stderr}\nexpressions:\n{listing}")


# --- PromQL found in the repository -------------------------------------------------------

GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1h",
    "$source": ".*",
    "$instance": ".*",
}


def grafana_to_promql(expr: str) -> str:
    """A dashboard query as Prometheus would receive it (Grafana's variables replaced)."""
    for variable, value in sorted(GRAFANA_VARIABLES.items(), key=lambda item: -len(item[0])):
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def dashboard_queries(dashboard: dict[str, object]) -> list[tuple[str, str]]:
    """(panel title, expression) of every panel target, nested rows included."""
    out: list[tuple[str, str]] = []

    def walk(panels: object) -> None:
        assert isinstance(panels, list)
        for panel in panels:
            for target in panel.get("targets", []):
                out.append((panel["title"], target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return out


def dashboard_variable_queries(dashboard: dict[str, object]) -> list[tuple[str, str]]:
    templating = dashboard["templating"]
    assert isinstance(templating, dict)
    out = []
    for variable in templating["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            out.append((f"variable {variable['name']}", query["query"] if isinstance(query, dict) else query))
    return out


def rule_expressions() -> list[tuple[str, str]]:
    data = load_yaml(RULES)
    assert isinstance(data, dict)
    return [(rule.get("alert") or rule["record"], rule["expr"]) for group in data["groups"] for rule in group["rules"]]


PROMQL_FENCE = re.compile(r"^```promql\n(.*?)^```", re.MULTILINE | re.DOTALL)


def promql_blocks(markdown: str) -> list[str]:
    return [block.strip() for block in PROMQL_FENCE.findall(markdown)]


def load_dashboard() -> dict[str, object]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def all_promql() -> list[tuple[str, str]]:
    """(where, PromQL) from the rules, the dashboard (variables replaced) and docs/metrics.md."""
    out = [(f"rule {name}", expr) for name, expr in rule_expressions()]
    out += [
        (f"dashboard panel {title!r}", grafana_to_promql(expr)) for title, expr in dashboard_queries(load_dashboard())
    ]
    out += [("docs/metrics.md", block) for block in promql_blocks(METRICS_DOC.read_text(encoding="utf-8"))]
    return out
