"""The metric catalogue as the operations tests read it: every family the gateway registers, its
type, labels and help, built from the package's own ``Metrics`` with one stream."""

from __future__ import annotations

import re
from dataclasses import dataclass

from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase

from kvgateway.config import StreamConfig
from kvgateway.ingest.outlet import StreamOutlet
from kvgateway.log.ordered import MemoryLog
from kvgateway.runtime.metrics import STREAM, STREAM_METRICS, Metrics, ScrapedFamilies
from kvgateway.state.occupancy import OccupancyIndex
from kvgateway.state.status_board import BoardFigures, StatusBoard


@dataclass(frozen=True)
class Family:
    name: str  # as registered: counters without _total, histograms without suffixes
    type: str  # counter | gauge | histogram
    labels: tuple[str, ...]
    documentation: str
    created: bool  # whether counters and histograms also expose a _created series

    @property
    def queried_as(self) -> str:
        """The name operators type: counters with _total, others as registered."""
        return f"{self.name}_total" if self.type == "counter" else self.name

    @property
    def sample_names(self) -> set[str]:
        if self.type == "counter":
            names = {f"{self.name}_total"}
        elif self.type == "histogram":
            names = {f"{self.name}_{suffix}" for suffix in ("bucket", "sum", "count")}
        else:
            return {self.name}
        return names | ({f"{self.name}_created"} if self.created else set())


@dataclass(frozen=True)
class Catalogue:
    families: dict[str, Family]
    exposed: set[str]  # sample names actually in the exposition with one stream

    @property
    def sample_names(self) -> set[str]:
        """Every series name the catalogue can expose, including families without series yet."""
        return set().union(*(family.sample_names for family in self.families.values()))

    @property
    def family_names(self) -> set[str]:
        return set(self.families)

    def family_of(self, sample_name: str) -> Family:
        for family in self.families.values():
            if sample_name in family.sample_names or sample_name == family.name:
                return family
        raise KeyError(sample_name)


def build_catalogue() -> Catalogue:
    metrics = Metrics()
    stream = StreamConfig("a", 0, "tcp://127.0.0.1:5557", None, "", False, {})
    # One stream as one process exposes it: the ingest's figures (its outlet) and the serving half's
    # (the status board and the index).
    metrics.streams.add(StreamOutlet(stream, MemoryLog(), clock=lambda: 0.0))
    metrics.streams.add(BoardFigures(StatusBoard([stream], OccupancyIndex()), lambda: 0.0))
    exposition = generate_latest(metrics.registry).decode()
    exposed = {
        re.split(r"[{ ]", line, maxsplit=1)[0] for line in exposition.splitlines() if line and not line.startswith("#")
    }
    # Label names are not in the exposition for families without series yet: read them from the
    # metric objects the catalogue holds, and from the table of per-stream families.
    labels = {
        wrapper._name: tuple(wrapper._labelnames)
        for wrapper in vars(metrics).values()
        if isinstance(wrapper, MetricWrapperBase)
    }
    labels.update({spec.name: (*STREAM, *spec.labels) for spec in STREAM_METRICS.values()})
    scraped = [c for c in vars(metrics).values() if isinstance(c, ScrapedFamilies)]  # (made when scraped)
    labels.update({family.name: c.labels for c in scraped for family in c.describe()})
    created = any(name.endswith("_created") for name in exposed)
    families = {
        family.name: Family(family.name, family.type, labels[family.name], family.documentation, created)
        for family in metrics.registry.collect()
    }
    return Catalogue(families, exposed)
