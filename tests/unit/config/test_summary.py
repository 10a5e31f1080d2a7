"""kvgateway.config.summary: the start-up line, one short line, never the token."""

from __future__ import annotations

from kvgateway.config.settings import Settings
from kvgateway.config.sources import parse_source_flag
from kvgateway.config.summary import stream_lines, summary


def test_summary_never_contains_the_token() -> None:
    settings = Settings(token="s3cret-value", sources=(parse_source_flag("name=a,endpoint=tcp://h:1"),))
    text = summary(settings)
    assert "s3cret-value" not in text and "auth token" in text and "a[0]=tcp://h:1" in text
    assert "auth none" in summary(Settings()) and "streams: none" in summary(Settings())


def test_summary_of_many_streams_is_one_short_line() -> None:
    """64 streams: counted, not listed (the issue saw an 8,042-character line); a few: each listed."""
    sources = tuple(parse_source_flag(f"name=pool-{n:02d},endpoint=tcp://h:{1000 + 8 * n},dp_size=8") for n in range(8))
    text = summary(Settings(sources=sources))
    assert len(text) < 300, text
    assert "streams: 64 from 8 sources (pool-00, pool-01, pool-02 ... pool-07; --log-level debug lists them)" in text
    assert len(stream_lines(Settings(sources=sources))) == 64
    few = summary(Settings(sources=sources[:1]))
    assert "pool-00[7]=tcp://h:1007" in few


def test_a_bound_stream_and_its_replay_are_shown() -> None:
    settings = Settings(sources=(parse_source_flag("name=a,endpoint=tcp://*:1,replay=tcp://h:2"),))
    assert stream_lines(settings) == ["a[0]=bind tcp://*:1 replay tcp://h:2"]
