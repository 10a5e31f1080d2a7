"""Metric families written as Prometheus text directly (the per-stream ones, at ``GET /metrics``).

At 2,000 streams the per-stream families are about 90,000 samples; prometheus_client's own
writer spends some 5 us on each (a label dict per sample, sorted, each name validated and
escaped). Here a family's label order is worked out once and each value is formatted once per
distinct value, so a scrape pays little more than the string joins. The bytes are the ones
``generate_latest`` writes for the same family (tests/unit/runtime/test_exposition.py holds them to it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

from prometheus_client.utils import floatToGoString

Row = tuple[Sequence[str], Any]
"""(label values; the value, or for a histogram (its cumulative (bound, count) buckets, its sum))."""


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def number_text() -> Callable[[float], str]:
    """Formats values as prometheus_client does, each distinct value once (most are 0)."""
    memo: dict[float, str] = {}

    def text(value: float) -> str:
        found = memo.get(value)
        if found is None:
            found = memo[value] = floatToGoString(value)  # type: ignore[no-untyped-call]
        return found

    return text


def _labeller(names: Sequence[str]) -> Callable[[Sequence[str]], str]:
    """``{a="x",b="y"}`` for label values in ``names``' order, written sorted by name (as
    prometheus_client writes them)."""
    order = sorted(range(len(names)), key=names.__getitem__)
    heads = [f'{names[i]}="' for i in order]

    def text(values: Sequence[str]) -> str:
        return "{" + '",'.join([head + _escape(values[i]) for head, i in zip(heads, order, strict=True)]) + '"}'

    return text


def family_text(
    kind: Literal["counter", "gauge", "histogram"],
    name: str,
    documentation: str,
    label_names: Sequence[str],
    *,
    rows: Iterable[Row],
    number: Callable[[float], str],
) -> Iterator[str]:
    """One family (HELP, TYPE, its samples) as ``generate_latest`` writes it, in pieces."""
    if kind == "counter":
        name = (name[: -len("_total")] if name.endswith("_total") else name) + "_total"
    doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
    yield f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"
    labels = _labeller(label_names)
    if kind != "histogram":
        for values, value in rows:
            yield f"{name}{labels(values)} {number(value)}\n"
        return
    bucket_labels = _labeller((*label_names, "le"))
    for values, (buckets, total) in rows:
        for bound, count in buckets:
            yield f"{name}_bucket{bucket_labels((*values, bound))} {number(count)}\n"
        plain = labels(values)
        yield f"{name}_count{plain} {number(buckets[-1][1])}\n{name}_sum{plain} {number(total)}\n"
