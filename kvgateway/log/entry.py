"""One message of the ordered log at its offset (:class:`Entry`): what the ring keeps, what every
follower of the log is called with (:data:`Follower`), and what a resuming client is served from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import msgspec

from kvgateway.engine.wire import Stream
from kvgateway.protocol.filters import EventFilterKey, EventKey
from kvgateway.protocol.messages import EncodedBatch, OutMessage


class Entry(msgspec.Struct, gc=False, eq=False):
    """One message of the log at its offset: the record, its unfiltered encoding, and for a batch what
    filtering needs.

    Untracked by the garbage collector (``gc=False``, as its messages): the ring holds up to ten
    thousand, and with them tracked every full collection walked them all, a pause of tens of
    milliseconds for every client (:mod:`kvgateway.runtime.memory`). Nothing an entry refers to leads back
    to it, so no cycle needs the collector.
    """

    offset: int
    stream: Stream
    message: OutMessage
    batch: EncodedBatch | None  # None for a notice: event filters do not apply to notices
    keys: tuple[EventKey, ...]
    size: int  # len(message.data)
    record: Any = None  # what was appended (kvgateway.log.ordered.Record), while its followers apply it
    variants: dict[EventFilterKey, OutMessage | None] | None = None


Follower: TypeAlias = Callable[[Entry], None]
"""What follows the log: called with every entry appended, in offset order."""
