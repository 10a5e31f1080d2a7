"""The one metrics scraper of the tests: GET /metrics, parsed by prometheus_client's own parser
into samples by name; and the views the tests take of one scrape."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]
"""Every sample of one scrape: name -> [(labels, value)]."""

STREAM_SERIES = frozenset(
    {
        "batches_received",
        "sequence_gaps",
        "missed_batches",
        "replayed_batches",
        "unrecovered_batches",
        "publisher_restarts",
        "duplicate_batches",
        "decode_errors",
        "rank_mismatches",
        "unknown_removes",
        "source_up",
        "source_last_seq",
        "ingest_queue_depth",
    }
)
"""The per-stream metrics :func:`stream_counters` reads (histograms and per-type counters aside)."""

_STREAM_METRICS = {
    "received": "kvgateway_batches_received_total",
    "gaps": "kvgateway_sequence_gaps_total",
    "missed": "kvgateway_missed_batches_total",
    "replayed": "kvgateway_replayed_batches_total",
    "unrecovered": "kvgateway_unrecovered_batches_total",
    "restarts": "kvgateway_publisher_restarts_total",
    "duplicates": "kvgateway_duplicate_batches_total",
    "decode_errors": "kvgateway_decode_errors_total",
    "up": "kvgateway_source_up",
    "last_seq": "kvgateway_source_last_seq",
    "queue_depth": "kvgateway_ingest_queue_depth",
}


def scrape(base: str, *, token: str | None = None, timeout: float = 30.0) -> Samples:
    """One GET ``base``/metrics: every sample by name."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    text = httpx.get(f"{base}/metrics", headers=headers, timeout=timeout, trust_env=False).text
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(value for have, value in samples.get(name, []) if all(have.get(k) == v for k, v in labels.items()))


def metric(base: str, name: str, **labels: str) -> float:
    """One scrape's :func:`total` of ``name``."""
    return total(scrape(base), name, **labels)


def metric_values(base: str, name: str, *, token: str | None = None) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of ``name`` from one scrape, keyed by its sorted labels."""
    return {tuple(sorted(labels.items())): value for labels, value in scrape(base, token=token).get(name, [])}


def _of_stream(samples: Samples, name: str, source: str, dp_rank: int) -> list[tuple[dict[str, str], float]]:
    want = {"source": source, "dp_rank": str(dp_rank)}
    return [(labels, v) for labels, v in samples.get(name, []) if all(labels.get(k) == x for k, x in want.items())]


def stream_counters(samples: Samples, source: str, dp_rank: int = 0) -> dict[str, int]:
    """The per-stream ingest metrics of ``samples`` by metric name (without the ``kvgateway_``
    prefix and the ``_total`` suffix), plus ``replay_<outcome>`` for the replay requests."""
    out: dict[str, int] = {}
    for name in samples:
        key = name.removeprefix("kvgateway_").removesuffix("_total")
        if key not in STREAM_SERIES and key != "replay_requests":
            continue
        for labels, value in _of_stream(samples, name, source, dp_rank):
            if key == "unrecovered_batches":  # one series per reason: their sum
                out[key] = out.get(key, 0) + int(value)
            else:
                out[f"replay_{labels['outcome']}" if key == "replay_requests" else key] = int(value)
    return out


def stream_metrics(base: str, source: str, dp_rank: int = 0) -> dict[str, Any]:
    """The per-stream ingest counters of one scrape by short name (``received``, ``gaps``, ...), as
    ints; ``losses`` maps reason -> unrecovered batches, ``replay`` outcome -> requests (non-zero)."""
    samples = scrape(base)
    out: dict[str, Any] = {}
    for key, name in _STREAM_METRICS.items():
        found = _of_stream(samples, name, source, dp_rank)
        if key == "unrecovered":  # one series per reason
            out[key] = sum(int(v) for _, v in found)
            out["losses"] = {labels["reason"]: int(v) for labels, v in found if int(v) != 0}
            continue
        assert len(found) == 1, f"{name} for {source}/{dp_rank}: {found}"
        out[key] = int(found[0][1])
    out["replay"] = {
        labels["outcome"]: int(v)
        for labels, v in _of_stream(samples, "kvgateway_replay_requests_total", source, dp_rank)
        if int(v) != 0
    }
    return out
