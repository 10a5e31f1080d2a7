"""The per-stream families' own text writer against prometheus_client's, byte for byte."""

from __future__ import annotations

from prometheus_client.exposition import generate_latest

from kvgateway.runtime.exposition import family_text, number_text
from kvgateway.runtime.metrics import LOSS_REASONS, STREAM_METRICS, LagHistogram, Metrics, StreamFamilies


class _Stream:
    """Exports one sample into every per-stream family, with awkward label values and numbers."""

    def __init__(self, source: str, dp_rank: int, scale: float) -> None:
        self.labels = (source, str(dp_rank))
        self.scale = scale
        self.lag = LagHistogram()
        for value in (0.0, 0.003 * scale, 7.0, 1e9):
            self.lag.observe(value)

    def export(self, families: StreamFamilies) -> None:
        for i, (key, spec) in enumerate(STREAM_METRICS.items()):
            if spec.kind == "histogram":
                families.add_histogram(key, self.labels, self.lag)
                continue
            own = tuple(LOSS_REASONS[: len(spec.labels)]) or ()
            values = (0, 1, 12345678901234567, 0.1 * self.scale, -3, 2.5e-7)
            families.add(key, (*self.labels, *own), values[i % len(values)])


def test_the_exposition_is_prometheus_clients_own_bytes() -> None:
    metrics = Metrics()
    for i, source in enumerate(["plain", 'quote"d', "back\\slash", "new\nline", "ünï"]):
        metrics.streams.add(_Stream(source, i, i + 1))
    written, _ = metrics.exposition()
    assert written == generate_latest(metrics.registry)  # the registry still holds the stream families
    assert b'source="quote\\"d"' in written and b"kvgateway_event_lag_seconds_bucket{" in written


def test_the_registry_is_whole_again_after_an_exposition() -> None:
    metrics = Metrics()
    metrics.streams.add(_Stream("a", 0, 1.0))
    metrics.exposition()
    assert metrics.registry.get_sample_value("kvgateway_batches_received_total", {"source": "a", "dp_rank": "0"}) == 0


def test_a_family_without_samples_is_its_header() -> None:
    lines = list(family_text("counter", "x_total", "Doc \\ and\nmore.", ("a",), rows=[], number=number_text()))
    assert lines == ["# HELP x_total Doc \\\\ and\\nmore.\n# TYPE x_total counter\n"]
