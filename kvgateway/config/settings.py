"""The settings of the process and of its engines: one typed object that the flags, the
environment and the TOML file's ``[server]`` table and ``[[sources]]`` all land in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvgateway.engine.endpoints import rank_endpoints
from kvgateway.engine.wire import Stream


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """One engine as configured: ``dp_size`` publishers on consecutive ports."""

    name: str
    endpoint: str
    replay: str | None = None
    topic: str = ""
    dp_size: int = 1
    bind: bool = False
    capacity_blocks: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """One (source, dp_rank) publisher after vLLM's port-offset rule was applied."""

    source: str
    dp_rank: int
    endpoint: str
    replay: str | None
    topic: str
    bind: bool
    capacity_blocks: Mapping[str, int]

    @property
    def key(self) -> Stream:
        return (self.source, self.dp_rank)


@dataclass(frozen=True, slots=True)
class Settings:
    """Every ``[server]`` key (kvgateway.config.options.OPTIONS) and the sources; the defaults are
    the built-in ones, which the help texts give."""

    sources: tuple[SourceConfig, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = None
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    allow_unauthenticated: bool = False
    max_clients: int = 1000
    ring_messages: int = 10_000
    ring_bytes: int = 64 * 1024 * 1024
    client_queue_bytes: int = 1024 * 1024
    replay_timeout: float = 5.0
    restart_window: int = 1024
    hold_limit: int = 10_000
    max_concurrent_replays: int = 4
    keepalive_seconds: float = 15.0
    max_learned_blocks: int = 2_000_000
    refetch_window: float = 60.0
    lookup_rate: float = 1000.0
    lookup_burst: int = 200
    max_snapshots: int = 4
    snapshot_queue_bytes: int = 8 * 1024 * 1024
    log_format: str = "text"
    log_level: str = "info"

    def streams(self) -> list[StreamConfig]:
        return [stream for source in self.sources for stream in expand_source(source)]


def expand_source(source: SourceConfig) -> list[StreamConfig]:
    return [
        StreamConfig(
            source=source.name,
            dp_rank=rank,
            endpoint=endpoint,
            replay=replay,
            topic=source.topic,
            bind=source.bind,
            capacity_blocks=source.capacity_blocks,
        )
        for rank, endpoint, replay in rank_endpoints(source.endpoint, source.replay, source.dp_size)
    ]
