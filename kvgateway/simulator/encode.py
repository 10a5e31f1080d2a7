"""The engines' msgpack payloads, encoded as each engine and version sends them: the inverse of
:mod:`kvgateway.engine.wire`, for the simulator, the benchmarks and tests (anyone writing a publisher)."""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from kvgateway.engine.wire import (
    CLEARED,
    REMOVED,
    REMOVED_FIELDS,
    STORED,
    STORED_FIELDS,
    AllBlocksCleared,
    Batch,
    BlockRemoved,
    BlockStored,
    Event,
    UnknownEvent,
)

EventForm = Literal["map", "array"]

STORED_ARRAY_FIELDS: Final = len(STORED_FIELDS)
"""Positional BlockStored field count of current vLLM; older engines send 5, 6, 7, 8."""
REMOVED_ARRAY_FIELDS: Final = len(REMOVED_FIELDS)

Dialect = Literal["vllm", "sglang"]
DIALECTS: Final = ("vllm", "sglang")

SGLANG_STORED_ARRAY_FIELDS: Final = 6
"""SGLang's positional BlockStored: hashes, parent, tokens, block_size, lora_id, medium."""

_STORED_HEAD: Final = STORED_FIELDS[:SGLANG_STORED_ARRAY_FIELDS]
"""The BlockStored fields every dialect sends first, in this order (vLLM then adds lora_name)."""
_OWN: Final = frozenset(
    field.name for struct in (BlockStored, BlockRemoved) for field in msgspec.structs.fields(struct)
)
"""Fields the decoded events hold themselves; the others are in their ``extra`` under their name."""

_encoder: Final = msgspec.msgpack.Encoder()


def _stored_head(event: BlockStored) -> list[Any]:
    """``[tag, *_STORED_HEAD values]``: the start of a positional BlockStored in every dialect."""
    return [STORED, *(getattr(event, name) for name in _STORED_HEAD)]


def _stored_head_map(event: BlockStored) -> dict[str, Any]:
    return {"type": STORED, **{name: getattr(event, name) for name in _STORED_HEAD}}


def _positional(tag: str, event: BlockStored | BlockRemoved, names: tuple[str, ...]) -> list[Any]:
    """vLLM's positional layout: the tag, then every field in the engine's order (the event's own
    attribute, or its ``extra`` entry of that name)."""
    extra = event.extra
    return [tag, *(getattr(event, n) if n in _OWN else extra.get(n) for n in names)]


def event_to_wire(
    event: Event, form: EventForm = "map", *, fields: int | None = None, dialect: Dialect = "vllm"
) -> Any:
    """The msgpack-ready value of one event, as an engine of the given form sends it.

    ``fields`` truncates the positional form to an older engine's field count.
    ``dialect="sglang"``: SGLang's own layout (see :func:`_sglang_event_to_wire`).
    """
    if isinstance(event, UnknownEvent):
        return event.body
    if dialect == "sglang":
        return _sglang_event_to_wire(event, form)
    if form == "map":
        if type(event) is BlockStored:
            out: dict[str, Any] = _stored_head_map(event)
            out["lora_name"] = event.lora_name
        elif type(event) is BlockRemoved:
            out = {"type": REMOVED, "block_hashes": event.block_hashes, "medium": event.medium}
        else:
            out = {"type": CLEARED}
        out.update(event.extra)
        return out
    if type(event) is BlockStored:
        values = _positional(STORED, event, STORED_FIELDS)
        count = STORED_ARRAY_FIELDS if fields is None else fields
    elif type(event) is BlockRemoved:
        values = _positional(REMOVED, event, REMOVED_FIELDS)
        count = REMOVED_ARRAY_FIELDS if fields is None else fields
    else:
        return [CLEARED]
    return values[: count + 1]


def _sglang_event_to_wire(event: BlockStored | BlockRemoved | AllBlocksCleared, form: EventForm) -> Any:
    """SGLang's layout: no lora_name, extra_keys or group_idx.

    A BlockStored's ``extra`` (e.g. ``{"cache_salt": ...}``) becomes, in the positional form, one
    further element holding a map, at the position where vLLM has lora_name (index 7 of the array,
    the tag being index 0); in the map form its keys sit beside the others. A BlockRemoved's
    ``extra`` goes only into the map form.
    """
    if type(event) is BlockStored:
        if form == "map":
            stored = _stored_head_map(event)
            stored.update(event.extra)
            return stored
        values = _stored_head(event)
        if event.extra:
            values.append(dict(event.extra))
        return values
    if type(event) is BlockRemoved:
        if form == "map":
            removed: dict[str, Any] = {"type": REMOVED, "block_hashes": event.block_hashes, "medium": event.medium}
            removed.update(event.extra)
            return removed
        return [REMOVED, event.block_hashes, event.medium]
    return {"type": CLEARED} if form == "map" else [CLEARED]


def encode_batch(
    batch: Batch,
    form: EventForm = "map",
    *,
    fields: int | None = None,
    with_rank: bool = True,
    dialect: Dialect = "vllm",
) -> bytes:
    """A msgpack payload as an engine sends it (``with_rank=False``: the vLLM 0.9.0 layout)."""
    events = [event_to_wire(event, form, fields=fields, dialect=dialect) for event in batch.events]
    body: list[Any] = [batch.ts, events]
    if with_rank:
        body.append(batch.dp_rank)
    return _encoder.encode(body)
