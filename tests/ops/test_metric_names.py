"""Every metric the rules, the dashboard and the docs use exists, and every metric is documented.

The catalogue is kvgateway/runtime/metrics.py's ``Metrics``, read back from its registry with one
stream's outlet registered; families without series yet are named from their type (counter:
``_total``; histogram: ``_bucket``/``_sum``/``_count``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from kvgateway.runtime.metrics import REPLAY_OUTCOMES, TRANSPORTS
from kvgateway.serve.subscription import CloseReason
from tests.support.catalogue import Catalogue
from tests.support.deploy import (
    DASHBOARD,
    METRICS_DOC,
    OPERATIONS_DOC,
    RULES,
    all_promql,
    check_promql,
    dashboard_queries,
    dashboard_variable_queries,
    load_dashboard,
    metric_names_in,
    promql_blocks,
    rule_expressions,
)

# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"job", "instance"}

# Known values of enumerated labels: a typo in a matcher would silently match nothing.
LABEL_VALUES = {
    ("kvgateway_replay_requests_total", "outcome"): set(REPLAY_OUTCOMES),
    ("kvgateway_client_disconnects_total", "reason"): set(get_args(CloseReason)),
    ("kvgateway_client_disconnects_total", "transport"): set(TRANSPORTS),
    ("kvgateway_clients", "transport"): set(TRANSPORTS),
    ("kvgateway_messages_sent_total", "transport"): set(TRANSPORTS),
    ("kvgateway_resumes_total", "recovered"): {"true", "false"},
    ("kvgateway_gc_pause_seconds_bucket", "generation"): {"0", "1", "2"},
    ("kvgateway_build_info", "core"): {"compiled", "pure-Python"},
}

SELECTOR = re.compile(r"(?<![\w:])(kvgateway_[a-z0-9_]*[a-z0-9])\s*\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*\"([^\"]*)\"")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")


# --- the catalogue itself -------------------------------------------------------------------


def test_catalogue_names_match_the_exposition(catalogue: Catalogue) -> None:
    assert catalogue.exposed, "the registry exposed nothing"
    assert catalogue.exposed <= catalogue.sample_names
    for family in catalogue.families.values():
        assert family.name.startswith("kvgateway_"), family.name
        assert family.type in {"counter", "gauge", "histogram"}, family.name
    # a stream has every per-stream series from the start
    for name in ("kvgateway_source_up", "kvgateway_sequence_gaps_total", "kvgateway_event_lag_seconds_bucket"):
        assert name in catalogue.exposed


# --- names used elsewhere exist -------------------------------------------------------------


def test_rule_expressions_use_catalogue_metrics(catalogue: Catalogue) -> None:
    for where, expr in rule_expressions():
        unknown = metric_names_in(expr) - catalogue.sample_names
        assert not unknown, f"{where}: unknown metrics {sorted(unknown)}"


def test_rule_annotations_name_catalogue_metrics(catalogue: Catalogue) -> None:
    text = RULES.read_text(encoding="utf-8")
    unknown = metric_names_in(text) - catalogue.sample_names - catalogue.family_names
    assert not unknown, f"{RULES.name}: unknown metrics {sorted(unknown)}"


def test_dashboard_uses_catalogue_metrics(catalogue: Catalogue) -> None:
    data = load_dashboard()
    queries = dashboard_queries(data) + dashboard_variable_queries(data)
    assert queries
    for where, expr in queries:
        unknown = metric_names_in(expr) - catalogue.sample_names
        assert not unknown, f"dashboard {where}: unknown metrics {sorted(unknown)}"
    unknown = metric_names_in(DASHBOARD.read_text(encoding="utf-8")) - catalogue.sample_names - catalogue.family_names
    assert not unknown, f"dashboard text: unknown metrics {sorted(unknown)}"


def test_docs_use_catalogue_metrics(catalogue: Catalogue) -> None:
    for path in (METRICS_DOC, OPERATIONS_DOC):
        text = path.read_text(encoding="utf-8")
        unknown = metric_names_in(text) - catalogue.sample_names - catalogue.family_names
        assert not unknown, f"{path.name}: unknown metrics {sorted(unknown)}"
    blocks = promql_blocks(METRICS_DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 10
    for block in blocks:
        unknown = metric_names_in(block) - catalogue.sample_names
        assert not unknown, f"docs/metrics.md PromQL {block!r}: not a series name {sorted(unknown)}"


def test_labels_in_queries_exist(catalogue: Catalogue) -> None:
    """Label names in selectors and by/without/on clauses belong to the metrics queried."""
    for where, expr in all_promql():
        used_labels: set[str] = set(TARGET_LABELS)
        for name, matchers in SELECTOR.findall(expr):
            family = catalogue.family_of(name)
            allowed = set(family.labels) | TARGET_LABELS | ({"le"} if name.endswith("_bucket") else set())
            for label, _, value in MATCHER.findall(matchers):
                assert label in allowed, f"{where}: {name} has no label {label!r}"
                known = LABEL_VALUES.get((name, label))
                if known is not None and not re.search(r"[.*+?|\[\]()]", value):
                    assert value in known, f"{where}: {name}{{{label}={value!r}}} matches nothing ({sorted(known)})"
        for name in metric_names_in(expr):
            family = catalogue.family_of(name)
            used_labels |= set(family.labels) | ({"le"} if name.endswith("_bucket") else set())
        for group in GROUPING.findall(expr):
            for label in filter(None, (item.strip() for item in group.split(","))):
                assert label in used_labels, f"{where}: grouping by {label!r}, which no queried metric has"


@pytest.mark.prometheus
def test_all_promql_parses(promtool: str, tmp_path: Path) -> None:
    check_promql(promtool, all_promql(), tmp_path)


# --- every metric is documented -------------------------------------------------------------

ROW = re.compile(r"^\|\s*`(kvgateway_\w+)`\s*\|\s*(\w+)\s*\|([^|]*)\|([^|]*)\|\s*$", re.MULTILINE)


def documented_rows() -> dict[str, tuple[str, tuple[str, ...], str]]:
    rows: dict[str, tuple[str, tuple[str, ...], str]] = {}
    for name, kind, labels, meaning in ROW.findall(METRICS_DOC.read_text(encoding="utf-8")):
        assert name not in rows, f"{name} documented twice"
        label_names = tuple(re.findall(r"`(\w+)`", labels))
        assert label_names or labels.strip() == "none", f"{name}: labels column {labels.strip()!r}"
        rows[name] = (kind, label_names, meaning.strip())
    return rows


def test_every_metric_is_documented(catalogue: Catalogue) -> None:
    rows = documented_rows()
    expected = {family.queried_as: family for family in catalogue.families.values()}
    assert set(expected) - set(rows) == set(), "metrics missing from docs/metrics.md's catalogue"
    assert set(rows) - set(expected) == set(), "docs/metrics.md documents metrics that do not exist"
    for name, family in expected.items():
        kind, labels, meaning = rows[name]
        assert kind == family.type, f"{name}: documented as {kind}, is a {family.type}"
        assert labels == family.labels, f"{name}: documented labels {labels}, actual {family.labels}"
        assert len(meaning) >= 20, f"{name}: say what it means"
