"""Engine seqs as the tests read them: the messages carry them as decimal strings (exact in any
JSON parser, docs/protocol.md), and a Python client turns them into ints, which are exact too.

:func:`read_message` is how every client in tests/support parses a line: it checks that each
engine seq is a string on the wire (so every test that reads messages checks the contract) and
hands the test ints to compare."""

from __future__ import annotations

import json
from typing import Any, Final

SEQ_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "restart": ("seq", "previous"),
    "unrecovered_gap": ("first", "until", "last"),
    "stale": ("seq",),
}
"""Per notice kind, its fields that hold an engine seq (``last``: compat=gap_last's copy)."""


def seq_int(value: object) -> int | None:
    """One engine seq from the wire: a decimal string (or null), as an int."""
    if value is None:
        return None
    assert isinstance(value, str) and value.isdigit(), f"an engine seq is a decimal string, got {value!r}"
    return int(value)


def status_seqs(status: dict[str, Any]) -> dict[str, Any]:
    """A stream's status (hello.sources, /v1/sources, a status notice) with ``last_seq`` an int."""
    status["last_seq"] = seq_int(status["last_seq"])
    return status


def message_seqs(message: dict[str, Any]) -> dict[str, Any]:
    """A decoded message with its engine seqs as ints (changed in place, and returned)."""
    kind = message.get("type")
    if kind == "batch":
        message["seq"] = seq_int(message["seq"])
    elif kind == "hello":
        for status in message["sources"]:
            status_seqs(status)
    elif kind == "notice":
        if message["kind"] == "status":
            status_seqs(message["status"])
        for name in SEQ_FIELDS.get(message["kind"], ()):
            if name in message:
                message[name] = seq_int(message[name])
    return message


def read_message(line: str) -> dict[str, Any]:
    """One line of the stream (a WebSocket frame's, an SSE data: line), its seqs as ints."""
    message: dict[str, Any] = json.loads(line)
    return message_seqs(message)


def sources_seqs(document: dict[str, Any]) -> dict[str, Any]:
    """A GET /v1/sources document with its ``last_seq`` as ints."""
    for status in document["sources"]:
        status_seqs(status)
    return document
