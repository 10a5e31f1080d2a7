"""kvgateway.config.settings: a source's ranks as streams, by vLLM's port-offset rule."""

from __future__ import annotations

from kvgateway.config.settings import Settings, SourceConfig, expand_source


def test_a_source_of_two_ranks_is_two_streams_on_consecutive_ports() -> None:
    source = SourceConfig("a", "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5657", "kv", 2, False, {"GPU": 10})
    streams = expand_source(source)
    assert [(s.key, s.endpoint, s.replay, s.topic, s.bind) for s in streams] == [
        (("a", 0), "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5657", "kv", False),
        (("a", 1), "tcp://10.0.0.1:5558", "tcp://10.0.0.1:5658", "kv", False),
    ]
    assert all(dict(s.capacity_blocks) == {"GPU": 10} for s in streams)


def test_the_settings_streams_are_every_sources_in_order() -> None:
    settings = Settings(sources=(SourceConfig("a", "tcp://h:1", dp_size=2), SourceConfig("b", "ipc:///tmp/kv")))
    assert [s.key for s in settings.streams()] == [("a", 0), ("a", 1), ("b", 0)]
    assert Settings().streams() == []
