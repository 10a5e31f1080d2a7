"""The resume rule: a client's last message id against what the log still holds."""

from __future__ import annotations

from kvgateway.protocol import messages


def resume_after(last_event_id: str, *, epoch: str, first_offset: int, last_offset: int) -> int | None:
    """The offset to replay after, or None when the client cannot be recovered.

    Recovered only when the id names this epoch and every message after it is still held
    (``first_offset - 1 <= offset <= last_offset``): all or nothing, never a partial replay.
    """
    parsed = messages.parse_message_id(last_event_id)
    if parsed is None or parsed[0] != epoch:
        return None
    offset = parsed[1]
    return offset if first_offset - 1 <= offset <= last_offset else None
