"""Engine events rendered for clients (``events_json`` and ``batch_message``, what the log keeps of a
batch; ``render_events``, ``render_event``, ``hash_text``, ``plain``): the compiled renderer
(``_render_c``: the same source compiled by Cython, its two per-batch writers in C) where it was
built, else the pure-Python one (:mod:`kvgateway.protocol._render_py`, the reference: byte-identical
messages, checked by tests/unit/protocol/test_render_differential.py).

See :mod:`kvgateway.protocol._render_py` for what a rendered event holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvgateway.protocol import _render_py
from kvgateway.runtime.extensions import load

__all__ = [
    "MAX_RENDER_DEPTH",
    "TOO_DEEP",
    "batch_message",
    "events_json",
    "hash_text",
    "plain",
    "plain_key",
    "render_event",
    "render_events",
]

if TYPE_CHECKING:  # one API: the reference's
    from kvgateway.protocol._render_py import (
        MAX_RENDER_DEPTH,
        TOO_DEEP,
        batch_message,
        events_json,
        hash_text,
        plain,
        plain_key,
        render_event,
        render_events,
    )
else:
    _chosen = load("kvgateway.protocol._render_c") or _render_py
    MAX_RENDER_DEPTH = _chosen.MAX_RENDER_DEPTH
    TOO_DEEP = _chosen.TOO_DEEP
    batch_message = _chosen.batch_message
    events_json = _chosen.events_json
    hash_text = _chosen.hash_text
    plain = _chosen.plain
    plain_key = _chosen.plain_key
    render_event = _chosen.render_event
    render_events = _chosen.render_events
