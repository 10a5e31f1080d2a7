"""The start-up line: everything an operator checks, in one short line, never the token."""

from __future__ import annotations

from kvgateway.config.settings import Settings, StreamConfig

SUMMARY_STREAMS = 8
"""Past this many streams the start-up line counts them (each is then a debug line: stream_lines)."""


def _stream_text(stream: StreamConfig) -> str:
    replay = f" replay {stream.replay}" if stream.replay else ""
    return f"{stream.source}[{stream.dp_rank}]={'bind ' if stream.bind else ''}{stream.endpoint}{replay}"


def stream_lines(settings: Settings) -> list[str]:
    """Every stream's addresses, one line each."""
    return [_stream_text(stream) for stream in settings.streams()]


def streams_text(settings: Settings) -> str:
    """The streams, for a start-up line: each one, or a count and some names when there are many."""
    streams = settings.streams()
    if len(streams) > SUMMARY_STREAMS:
        names = [source.name for source in settings.sources]
        shown = ", ".join(names[:3]) + (f" ... {names[-1]}" if len(names) > 3 else "")
        return f"{len(streams)} from {len(names)} sources ({shown}; --log-level debug lists them)"
    return ", ".join(_stream_text(stream) for stream in streams) or "none"


def summary(settings: Settings) -> str:
    """The start-up line: everything an operator checks, never the token itself; one short line
    however many streams there are."""
    listed = streams_text(settings)
    return (
        f"http {settings.host}:{settings.port}, auth {'token' if settings.token else 'none'}, "
        f"ring {settings.ring_messages} msgs/{settings.ring_bytes} B, client queue {settings.client_queue_bytes} B, "
        f"max clients {settings.max_clients}, streams: {listed}"
    )
