"""The engines' KV-event wire format: the frames, every payload layout, and their decoding.

A PUB message is ``[topic, seq (8 bytes, big-endian, unsigned), payload (msgpack)]``.
The payload is ``[ts, events]`` or ``[ts, events, data_parallel_rank, ...]`` (every shipped
engine), or the same as a map ``{"ts", "events", "data_parallel_rank"}`` (some forks and
proposals); each event is either a tagged positional array (vLLM <= 0.23, SGLang until 2026) or
a ``"type"``-tagged map (vLLM >= 0.24, TensorRT-LLM), possibly mixed in one batch.

A map event's ``locality: "REMOTE"`` (vLLM 0.26, TensorRT-LLM) gives the block the medium
``REMOTE_<medium>`` (:func:`kvgateway.engine.mediums.remote_medium`): it is not in this engine's memory.

msgspec cannot put array-like and map structs in one Union, so ``events`` is decoded as raw
elements and each is dispatched on its first msgpack byte.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import msgspec
from msgspec import UNSET, UnsetType

from kvgateway.engine import _batch_py, _events_py, _tokens_py
from kvgateway.engine._events_py import located as _located
from kvgateway.engine._events_py import present as _present

Hash: TypeAlias = int | bytes

Stream: TypeAlias = tuple[str, int]
"""A stream of events: one engine publisher, named by (source, dp_rank) in the configuration."""

MAX_PAYLOAD_BYTES: Final = 64 * 1024 * 1024
"""Payloads above this are refused before decoding (a real batch is a few KiB to a few MiB)."""

SEQ_BYTES: Final = 8
END_SEQ: Final = -1
END_SEQ_BYTES: Final = END_SEQ.to_bytes(8, "big", signed=True)

STORED: Final = "BlockStored"
REMOVED: Final = "BlockRemoved"
CLEARED: Final = "AllBlocksCleared"
KNOWN_TYPES: Final = frozenset({STORED, REMOVED, CLEARED})


class DecodeError(ValueError):
    """A message or payload that is not a valid KV-event batch; the text is one line."""


# msgspec raises UnicodeDecodeError for invalid UTF-8 in a str, RecursionError for deep nesting.
_MALFORMED: Final = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


# --- the decoded, engine-independent form -------------------------------------------------


class _Grouped:
    """The KV-cache group of a block event (hybrid models); None when the engine sent none."""

    __slots__ = ()
    extra: dict[str, Any]

    @property
    def group_idx(self) -> int | None:
        value = self.extra.get("group_idx")
        return value if isinstance(value, int) else None


class BlockStored(msgspec.Struct, _Grouped, gc=False):
    """Blocks entered a cache. ``extra`` holds every further field the engine sent, by name.

    ``token_ids`` reads as a list of ints. Decoded by the compiled core, its slot may hold them as a
    compact array until first read (:mod:`kvgateway.engine._tokens_c`), which compares, prints and
    pickles as the list; the compiled renderer and learner read that array as it is."""

    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra: dict[str, Any] = {}

    type: Literal["BlockStored"] = STORED


class BlockRemoved(msgspec.Struct, _Grouped, gc=False):
    """Blocks left a cache (one announcement per physical copy)."""

    block_hashes: list[Hash]
    medium: str | None = None
    extra: dict[str, Any] = {}

    type: Literal["BlockRemoved"] = REMOVED


class AllBlocksCleared(msgspec.Struct, gc=False):
    """The publisher's whole cache was reset."""

    extra: dict[str, Any] = {}

    type: Literal["AllBlocksCleared"] = CLEARED


class UnknownEvent(msgspec.Struct, gc=False):
    """An event of a type this gateway does not know; kept and passed on as sent."""

    type: str
    body: dict[str, Any] | list[Any]


Event: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent


class Batch(msgspec.Struct, gc=False):
    ts: float
    events: list[Event]
    dp_rank: int | None = None


# --- positional (array) layouts: every historical field count ------------------------------


class _ArrStored(msgspec.Struct, array_like=True, tag=STORED, gc=False):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | UnsetType | None = UNSET
    lora_name: str | UnsetType | None = UNSET
    extra_keys: list[Any] | UnsetType | None = UNSET
    group_idx: int | UnsetType | None = UNSET
    kv_cache_spec_kind: str | UnsetType | None = UNSET
    kv_cache_spec_sliding_window: int | UnsetType | None = UNSET


class _ArrRemoved(msgspec.Struct, array_like=True, tag=REMOVED, gc=False):
    block_hashes: list[Hash]
    medium: str | UnsetType | None = UNSET
    group_idx: int | UnsetType | None = UNSET


class _ArrCleared(msgspec.Struct, array_like=True, tag=CLEARED, gc=False):
    pass


# --- the field lists, derived from the definitions above ----------------------------------

STORED_FIELDS: Final = tuple(field.name for field in msgspec.structs.fields(_ArrStored))
"""BlockStored's fields in the engines' positional order (current vLLM sends all 11; older engines
send the first 5 to 8; SGLang the first 6). The map layout uses the same names."""
REMOVED_FIELDS: Final = tuple(field.name for field in msgspec.structs.fields(_ArrRemoved))
"""BlockRemoved's fields in positional order."""

_STORED_ATTRS: Final = frozenset(field.name for field in msgspec.structs.fields(BlockStored)) - {"extra", "type"}
"""Fields of :class:`BlockStored` itself; the other named fields go to ``extra`` under their name."""
_REMOVED_ATTRS: Final = frozenset(field.name for field in msgspec.structs.fields(BlockRemoved)) - {"extra", "type"}
_STORED_FURTHER: Final = tuple(name for name in STORED_FIELDS if name not in _STORED_ATTRS)
_REMOVED_FURTHER: Final = tuple(name for name in REMOVED_FIELDS if name not in _REMOVED_ATTRS)
_STORED_OPTIONAL: Final = tuple(name for name in STORED_FIELDS[1:] if name in _STORED_ATTRS)
"""A map BlockStored's own fields beside block_hashes, which it may leave out."""

# --- map layouts: decoded by struct; unknown keys kept via a slower generic pass ---------


class _MapStored(msgspec.Struct, tag_field="type", tag=STORED, gc=False):
    block_hashes: list[Hash]
    parent_block_hash: Hash | UnsetType | None = UNSET
    token_ids: list[int] | UnsetType = UNSET
    block_size: int | UnsetType = UNSET
    lora_id: int | UnsetType | None = UNSET
    medium: str | UnsetType | None = UNSET
    lora_name: str | UnsetType | None = UNSET
    extra_keys: list[Any] | UnsetType | None = UNSET
    group_idx: int | UnsetType | None = UNSET
    kv_cache_spec_kind: str | UnsetType | None = UNSET
    kv_cache_spec_sliding_window: int | UnsetType | None = UNSET


class _MapRemoved(msgspec.Struct, tag_field="type", tag=REMOVED, gc=False):
    block_hashes: list[Hash]
    medium: str | UnsetType | None = UNSET
    group_idx: int | UnsetType | None = UNSET


class _MapCleared(msgspec.Struct, tag_field="type", tag=CLEARED, gc=False):
    pass


_STORED_CORE: Final = _STORED_ATTRS | {"type"}
_REMOVED_CORE: Final = _REMOVED_ATTRS | {"type"}


class _WireBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _WireMapBatch(msgspec.Struct, gc=False):
    """The batch as a map (forks, proposals); keys beyond these are ignored, as trailing elements are."""

    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


def _compiled(name: str) -> ModuleType | None:
    """The compiled module ``name`` where it was built and ``KVGATEWAY_NO_EXTENSIONS`` is not set (as
    :func:`kvgateway.runtime.extensions.load` decides, from below it), else None."""
    if os.environ.get("KVGATEWAY_NO_EXTENSIONS", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_tokens: Final = _compiled("kvgateway.engine._tokens_c") or _tokens_py
"""The token ids' core: the compiled one where it was built, else the reference."""
_tokens.install(BlockStored)
# The compiled parser keeps an event's hashes as the wire sent them where it can (a Hashes): the
# field reads as their list all the same.
_tokens.install(BlockStored, "block_hashes")
_tokens.install(BlockRemoved, "block_hashes")
_KEPT: Final = _tokens is not _tokens_py
"""Whether the fast decoders take ``token_ids`` as the wire sent them (``msgspec.Raw``), for the
compiled core to keep (:func:`_token_ids`; :class:`kvgateway.engine._tokens_py.NotTokens` sends the
batch to the general path); the reference core's take the list msgspec makes of them, as ever."""
if TYPE_CHECKING:
    _Sent: TypeAlias = Any  # the one or the other
else:
    _Sent = msgspec.Raw if _KEPT else list[int]
_token_ids: Final[Callable[[_Sent], list[int]]] = _tokens.token_ids
_NO_TOKENS: Final[Any] = _tokens_py.EMPTY if _KEPT else []


class _FastStored(msgspec.Struct, tag_field="type", tag=STORED, forbid_unknown_fields=True, gc=False):
    """A map BlockStored with no key beyond these (defaults as the general path applies them);
    ``token_ids`` as sent where the compiled core keeps them (``_KEPT``)."""

    block_hashes: list[Hash]
    parent_block_hash: Hash | None = None
    token_ids: _Sent = _NO_TOKENS
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | UnsetType | None = UNSET
    group_idx: int | UnsetType | None = UNSET
    kv_cache_spec_kind: str | UnsetType | None = UNSET
    kv_cache_spec_sliding_window: int | UnsetType | None = UNSET
    locality: str | UnsetType | None = UNSET


class _FastRemoved(msgspec.Struct, tag_field="type", tag=REMOVED, forbid_unknown_fields=True, gc=False):
    block_hashes: list[Hash]
    medium: str | None = None
    group_idx: int | UnsetType | None = UNSET
    locality: str | UnsetType | None = UNSET


class _FastCleared(msgspec.Struct, tag_field="type", tag=CLEARED, forbid_unknown_fields=True, gc=False):
    pass


class _FastBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_FastStored | _FastRemoved | _FastCleared]
    data_parallel_rank: int | None = None


class _FastMapBatch(msgspec.Struct, gc=False):
    ts: float
    events: list[_FastStored | _FastRemoved | _FastCleared]
    data_parallel_rank: int | None = None


if TYPE_CHECKING:  # what is read of it here is _ArrStored's, token_ids aside
    _FastArrStored = _ArrStored
else:
    _FastArrStored = msgspec.defstruct(
        "_FastArrStored",
        [
            (f.name, _Sent if f.name == "token_ids" else f.type)
            if f.default is msgspec.NODEFAULT
            else (f.name, f.type, f.default)
            for f in msgspec.structs.fields(_ArrStored)
        ],
        array_like=True,
        tag=STORED,
        gc=False,
        module=__name__,
    )
    """A positional BlockStored with _ArrStored's fields, ``token_ids`` as sent where the compiled
    core keeps them (``_KEPT``)."""


class _FastArrayBatch(msgspec.Struct, array_like=True, gc=False):
    """A batch of positional events only (SGLang, vLLM <= 0.23), in one msgspec call: each event
    decoded by the same union the general path decodes it by, one at a time (``token_ids`` aside)."""

    ts: float
    events: list[_FastArrStored | _ArrRemoved | _ArrCleared]
    data_parallel_rank: int | None = None


_fast_batch_decoder: Final = msgspec.msgpack.Decoder(_FastBatch)
_fast_array_batch_decoder: Final = msgspec.msgpack.Decoder(_FastArrayBatch)
_batch_decoder: Final = msgspec.msgpack.Decoder(_WireBatch)
_fast_map_batch_decoder: Final = msgspec.msgpack.Decoder(_FastMapBatch)
_map_batch_decoder: Final = msgspec.msgpack.Decoder(_WireMapBatch)
_array_event_decoder: Final = msgspec.msgpack.Decoder(_ArrStored | _ArrRemoved | _ArrCleared)
_map_event_decoder: Final = msgspec.msgpack.Decoder(_MapStored | _MapRemoved | _MapCleared)
_any_decoder: Final = msgspec.msgpack.Decoder()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _seq_error(frame: bytes) -> DecodeError:
    return DecodeError(f"sequence frame is {len(frame)} bytes, expected 8")


def parse_seq(frame: bytes) -> int:
    """The unsigned big-endian sequence number of a PUB message."""
    if len(frame) != SEQ_BYTES:
        raise _seq_error(frame)
    return int.from_bytes(frame, "big")


def split_message(frames: Sequence[bytes]) -> tuple[int, bytes]:
    """A PUB message's seq and (still encoded) payload: ``[topic, seq, payload]``. (Once per batch:
    :func:`parse_seq`'s test in line, not a second Python call.)"""
    if len(frames) != 3:
        raise DecodeError(f"message has {len(frames)} frames, expected 3")
    seq = frames[1]
    if len(seq) != SEQ_BYTES:
        raise _seq_error(seq)
    return int.from_bytes(seq, "big"), frames[2]


def parse_replay_reply(frames: Sequence[bytes]) -> tuple[int, bytes] | None:
    """One replay reply as a DEALER receives it: ``(seq, payload)``, :data:`END_SEQ` with an empty
    payload for the end marker, None for a malformed reply.

    Both layouts, after the DEALER's empty delimiter: ``[topic, seq, payload]`` (vLLM >= 0.26)
    or ``[seq, payload]`` (older vLLM, SGLang)."""
    if len(frames) == 4 and frames[0] == b"":
        seq_frame, payload = frames[2], frames[3]
    elif len(frames) == 3 and frames[0] == b"":
        seq_frame, payload = frames[1], frames[2]
    else:
        return None
    if len(seq_frame) != SEQ_BYTES:
        return None
    if seq_frame == END_SEQ_BYTES:
        return END_SEQ, b""
    return int.from_bytes(seq_frame, "big"), payload


def decode_batch(payload: bytes | memoryview, *, max_bytes: int = MAX_PAYLOAD_BYTES) -> Batch:
    """Decode one msgpack batch payload; raises only :class:`DecodeError`."""
    if len(payload) > max_bytes:
        raise DecodeError(f"payload of {len(payload)} bytes exceeds the {max_bytes}-byte limit")
    # The envelope is an array in every shipped engine; a map one (forks) has decoders of its own.
    # (_is_map_byte's test in line: once per batch, not a second Python call.)
    first = payload[0] if payload else 0
    as_map = 0x80 <= first <= 0x8F or 0xDE <= first <= 0xDF  # two comparisons of ints: no tuple searched
    # Fast paths: a batch whose events are all map events with only known keys (vLLM >= 0.24: nearly
    # every batch), or all positional events (SGLang, older vLLM), in one call. Anything else (mixed,
    # unknown types or keys, bad data) takes the general path, which also words the errors.
    if not as_map:
        batch = _parse_batch(payload)
        return _decode_general(payload, False) if batch is None else batch
    try:
        fast = _fast_map_batch_decoder.decode(payload)
    except (*_MALFORMED, msgspec.ValidationError):
        return _decode_general(payload, True)
    try:
        events = _events_of(fast)
    except _tokens_py.NotTokens:  # what the typed decode would have refused
        return _decode_general(payload, True)
    return Batch(ts=fast.ts, events=events, dp_rank=fast.data_parallel_rank)


def _events_core() -> ModuleType:
    """What makes a fast-decoded batch's events the public ones: the compiled twin where it was
    built, else the reference (:mod:`kvgateway.engine._events_py`); each given this module's types."""
    chosen = _compiled("kvgateway.engine._events_c") or _events_py
    for core in (_events_py, chosen):  # the reference too: the general path and the twin use it
        core.install(
            stored=BlockStored,
            removed=BlockRemoved,
            cleared=AllBlocksCleared,
            map_stored=_FastStored,
            map_removed=_FastRemoved,
            array_stored=_FastArrStored,
            general_stored=_ArrStored,
            array_removed=_ArrRemoved,
            fast_array_batch=_FastArrayBatch,
            stored_further=_STORED_FURTHER,
            removed_further=_REMOVED_FURTHER,
            token_ids=_token_ids,
            kept=_KEPT,
        )
    return chosen


_events_of: Final[Callable[[Any], list[Event]]] = _events_core().events_of


def _batch_core() -> ModuleType:
    """What decodes an array envelope in one call: the compiled twin where it was built, else the
    reference (:mod:`kvgateway.engine._batch_py`), which the twin leaves what it declines; both
    given this module's types, the fast decoders and the chosen events core's ``events_of``."""
    chosen = _compiled("kvgateway.engine._batch_c") or _batch_py
    for core in (_batch_py, chosen):
        core.install(
            stored=BlockStored,
            removed=BlockRemoved,
            cleared=AllBlocksCleared,
            batch=Batch,
            fast_decoders=(_fast_batch_decoder, _fast_array_batch_decoder),
            refused=(*_MALFORMED, msgspec.ValidationError),
            events_of=_events_of,
        )
    return chosen


_parse_batch: Final[Callable[[bytes | memoryview], Batch | None]] = _batch_core().parse_batch
"""An array envelope of map or of positional events as the public batch, or None (``parse_batch``)."""


def _decode_general(payload: bytes | memoryview, as_map: bool) -> Batch:
    """Event by event: every layout, mixed in one batch, unknown types and keys kept; the errors'
    wording. What the fast paths take, it decodes to the same events."""
    try:
        wire = (_map_batch_decoder if as_map else _batch_decoder).decode(payload)
    except (*_MALFORMED, msgspec.ValidationError) as exc:
        raise DecodeError(f"bad batch: {_one_line(exc)}") from None
    events: list[Event] = []
    for index, raw in enumerate(wire.events):
        try:
            events.append(_decode_event(raw))
        except DecodeError as exc:
            raise DecodeError(f"event {index}: {exc}") from None
    return Batch(ts=wire.ts, events=events, dp_rank=wire.data_parallel_rank)


def _is_map_byte(first: int) -> bool:
    """Whether a msgpack value starting with this byte is a map (fixmap, map 16, map 32)."""
    return 0x80 <= first <= 0x8F or first in (0xDE, 0xDF)


def _decode_event(raw: msgspec.Raw) -> Event:
    data = memoryview(raw)
    if not data:
        raise DecodeError("empty event")
    first = data[0]
    if 0x90 <= first <= 0x9F or first in (0xDC, 0xDD):
        return _decode_array_event(raw)
    if _is_map_byte(first):
        return _decode_map_event(raw)
    raise DecodeError(f"event is neither an array nor a map (msgpack byte 0x{first:02x})")


def _decode_array_event(raw: msgspec.Raw) -> Event:
    try:
        decoded = _array_event_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        return _unknown_or_error(raw, exc)
    except _MALFORMED as exc:
        raise DecodeError(_one_line(exc)) from None
    event: Event = _events_py.from_array(decoded)
    return event


def _unknown_or_error(raw: msgspec.Raw, exc: msgspec.ValidationError) -> Event:
    """A known tag whose fields did not all fit: decoded leniently; an unknown tag is kept opaque."""
    try:
        body = _any_decoder.decode(raw)
    except _MALFORMED as inner:
        raise DecodeError(_one_line(inner)) from None
    tag = body[0] if body else None
    if not isinstance(tag, str):
        raise DecodeError("array event does not start with a type name")
    if tag in _LENIENT_TYPES:
        return _lenient_array(tag, body)
    if tag in KNOWN_TYPES:
        raise DecodeError(f"{tag}: {_one_line(exc)}")
    return UnknownEvent(type=tag, body=body)


def _map_len(data: memoryview) -> int:
    first = data[0]
    if first <= 0x8F:
        return first & 0x0F
    if first == 0xDE:
        return int.from_bytes(data[1:3], "big")
    return int.from_bytes(data[1:5], "big")


def _decode_map_event(raw: msgspec.Raw) -> Event:
    try:
        decoded = _map_event_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        return _map_fallback(raw, exc)
    except _MALFORMED as exc:
        raise DecodeError(_one_line(exc)) from None
    # Fast path: every key of the map is a known field. Otherwise a generic pass keeps the rest.
    if type(decoded) is _MapStored:
        extra = _present(decoded, _STORED_FURTHER)
        known = 2 + len(extra) + sum(getattr(decoded, name) is not UNSET for name in _STORED_OPTIONAL)
        if known != _map_len(memoryview(raw)):
            extra = _unknown_keys(raw, _STORED_CORE)
        return BlockStored(
            block_hashes=decoded.block_hashes,
            parent_block_hash=None if decoded.parent_block_hash is UNSET else decoded.parent_block_hash,
            token_ids=[] if decoded.token_ids is UNSET else decoded.token_ids,
            block_size=0 if decoded.block_size is UNSET else decoded.block_size,
            lora_id=None if decoded.lora_id is UNSET else decoded.lora_id,
            medium=_located(None if decoded.medium is UNSET else decoded.medium, extra),
            lora_name=None if decoded.lora_name is UNSET else decoded.lora_name,
            extra=extra,
        )
    if type(decoded) is _MapRemoved:
        extra = _present(decoded, _REMOVED_FURTHER)
        known = 2 + len(extra) + (decoded.medium is not UNSET)
        if known != _map_len(memoryview(raw)):
            extra = _unknown_keys(raw, _REMOVED_CORE)
        return BlockRemoved(
            block_hashes=decoded.block_hashes,
            medium=_located(None if decoded.medium is UNSET else decoded.medium, extra),
            extra=extra,
        )
    if _map_len(memoryview(raw)) != 1:
        return AllBlocksCleared(extra=_unknown_keys(raw, frozenset({"type"})))
    return AllBlocksCleared()


def _unknown_keys(raw: msgspec.Raw, core: frozenset[str]) -> dict[str, Any]:
    try:
        body = _any_decoder.decode(raw)
    except _MALFORMED as exc:
        raise DecodeError(_one_line(exc)) from None
    return {_field_name(k): v for k, v in body.items() if k not in core}


def _field_name(key: Any) -> str:
    """A map event's key as the name ``extra`` keeps it under: msgpack allows nil, numbers, bools
    and arrays as keys, but ``extra`` promises names (and JSON objects need them)."""
    if type(key) is str:
        return key
    if type(key) is bytes:
        return key.hex()
    try:
        return msgspec.json.encode(key).decode()
    except (TypeError, ValueError):  # a msgpack extension, or one inside an array key
        return repr(key)


def _map_fallback(raw: msgspec.Raw, exc: msgspec.ValidationError) -> Event:
    """A known type with bad fields fails the batch; an unknown or missing type is judged here."""
    try:
        body = _any_decoder.decode(raw)
    except _MALFORMED as inner:
        raise DecodeError(_one_line(inner)) from None
    tag = body.get("type") if isinstance(body, dict) else None
    if not isinstance(tag, str):
        raise DecodeError("map event has no string 'type'")
    if tag in _LENIENT_TYPES:
        return _lenient_map(tag, body)
    if tag == CLEARED:  # it has no fields of its own to be wrong, only keys that are not names
        return AllBlocksCleared(extra={_field_name(k): v for k, v in body.items() if k != "type"})
    if tag in KNOWN_TYPES:
        raise DecodeError(f"{tag}: {_one_line(exc)}")
    return UnknownEvent(type=tag, body=body)


# --- the lenient fallback: one field of an unexpected type does not cost the event --------------
#
# Taken only after the typed decode of a BlockStored or BlockRemoved failed (the fast paths above
# are unchanged). Each field is checked on its own against the type the typed decoders expect:
#
# - a core field of the wrong type still fails the batch (DecodeError): block_hashes (the event
#   is about nothing without them) and BlockStored's token_ids and block_size (what the blocks
#   hold; the index counts tokens with block_size, clients match prefixes on token_ids). They may
#   be null or, in a map, absent: [] and 0, as in a placeholder offload event.
# - any other field of the wrong type is kept, unchanged, as an unnamed further field: positional
#   field N (its index in the array, the type tag being 0) as ``field_N``, a map key K as
#   ``field_K``; the named field is then None (or, for further fields, absent). So an SGLang
#   metadata map at position 7, where lora_name is expected, renders as ``"field_7": {...}``.


def _is_hash(value: Any) -> bool:
    kind = type(value)
    return kind is int or kind is bytes


def _is_hash_or_none(value: Any) -> bool:
    return value is None or _is_hash(value)


def _is_hashes(value: Any) -> bool:
    return type(value) is list and all(type(h) is int or type(h) is bytes for h in value)


def _is_ints_or_none(value: Any) -> bool:
    return value is None or (type(value) is list and all(type(v) is int for v in value))


def _is_int_or_none(value: Any) -> bool:
    return value is None or type(value) is int


def _is_str_or_none(value: Any) -> bool:
    return value is None or type(value) is str


def _is_list_or_none(value: Any) -> bool:
    return value is None or type(value) is list


_Check: TypeAlias = Callable[[Any], bool]
_CORE: Final = True
_LENIENT: Final = False

_FieldCheck: TypeAlias = tuple[str, _Check, bool, str]

# name -> (check, core, what the check wants: for the error text); BlockRemoved's fields are
# BlockStored's by the same names.
_CHECKS: Final[dict[str, tuple[_Check, bool, str]]] = {
    "block_hashes": (_is_hashes, _CORE, "a list of int or bytes hashes"),
    "parent_block_hash": (_is_hash_or_none, _LENIENT, "a hash or null"),
    "token_ids": (_is_ints_or_none, _CORE, "a list of ints or null"),
    "block_size": (_is_int_or_none, _CORE, "an int or null"),
    "lora_id": (_is_int_or_none, _LENIENT, "an int or null"),
    "medium": (_is_str_or_none, _LENIENT, "a str or null"),
    "lora_name": (_is_str_or_none, _LENIENT, "a str or null"),
    "extra_keys": (_is_list_or_none, _LENIENT, "a list or null"),
    "group_idx": (_is_int_or_none, _LENIENT, "an int or null"),
    "kv_cache_spec_kind": (_is_str_or_none, _LENIENT, "a str or null"),
    "kv_cache_spec_sliding_window": (_is_int_or_none, _LENIENT, "an int or null"),
}
# (name, check, core, wanted), in positional order
_STORED_SPECS: Final[tuple[_FieldCheck, ...]] = tuple((name, *_CHECKS[name]) for name in STORED_FIELDS)
_REMOVED_SPECS: Final[tuple[_FieldCheck, ...]] = tuple((name, *_CHECKS[name]) for name in REMOVED_FIELDS)
_LENIENT_TYPES: Final = frozenset({STORED, REMOVED})
_STORED_REQUIRED: Final = 5
"""Positional BlockStored fields every engine sends (vLLM 0.9.0: hashes .. lora_id)."""
_STORED_BY_NAME: Final = {spec[0]: spec for spec in _STORED_SPECS}
_REMOVED_BY_NAME: Final = {spec[0]: spec for spec in _REMOVED_SPECS}

_TYPE_NAMES: Final[dict[type, str]] = {
    type(None): "null",
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    bytes: "bytes",
    list: "array",
    dict: "map",
    msgspec.msgpack.Ext: "ext",
}


def _place(
    tag: str,
    spec: _FieldCheck,
    value: Any,
    *,
    unnamed: str,
    where: str,
    attrs: frozenset[str],
    named: dict[str, Any],
    extra: dict[Any, Any],
) -> None:
    """Put one field where it belongs: named (its type fits), ``extra[unnamed]`` (it does not), or fail."""
    name, check, core, wanted = spec
    if check(value):
        if name in attrs:
            named[name] = value
        else:
            extra[name] = value
    elif core:
        raise DecodeError(f"{tag}: {where} should be {wanted}, got {_TYPE_NAMES.get(type(value), 'another type')}")
    else:
        extra[unnamed] = value


def _lenient_array(tag: str, body: list[Any]) -> Event:
    """A positional BlockStored or BlockRemoved, field by field (fields past the known ones are ignored)."""
    stored = tag == STORED
    specs = _STORED_SPECS if stored else _REMOVED_SPECS
    attrs = _STORED_ATTRS if stored else _REMOVED_ATTRS
    required = _STORED_REQUIRED if stored else 1
    values = body[1:]
    if len(values) < required:
        raise DecodeError(f"{tag}: expected at least {required} positional fields, got {len(values)}")
    named: dict[str, Any] = {}
    extra: dict[Any, Any] = {}
    for position, (spec, value) in enumerate(zip(specs, values, strict=False), start=1):
        where = f"field {position} ({spec[0]})"
        _place(tag, spec, value, unnamed=f"field_{position}", where=where, attrs=attrs, named=named, extra=extra)
    return _lenient_event(stored, named, extra)


def _lenient_map(tag: str, body: dict[Any, Any]) -> Event:
    """A map BlockStored or BlockRemoved, key by key (unknown keys are kept as they are)."""
    stored = tag == STORED
    by_name = _STORED_BY_NAME if stored else _REMOVED_BY_NAME
    attrs = _STORED_ATTRS if stored else _REMOVED_ATTRS
    if "block_hashes" not in body:
        raise DecodeError(f"{tag}: no block_hashes")
    named: dict[str, Any] = {}
    extra: dict[Any, Any] = {}
    for key, value in body.items():
        if key == "type":
            continue
        spec = by_name.get(key) if type(key) is str else None
        if spec is None:
            extra[_field_name(key)] = value
        else:
            _place(tag, spec, value, unnamed=f"field_{key}", where=key, attrs=attrs, named=named, extra=extra)
    return _lenient_event(stored, named, extra)


def _lenient_event(stored: bool, named: dict[str, Any], extra: dict[Any, Any]) -> Event:
    if stored:
        token_ids = named.get("token_ids")
        block_size = named.get("block_size")
        return BlockStored(
            block_hashes=named["block_hashes"],
            parent_block_hash=named.get("parent_block_hash"),
            token_ids=[] if token_ids is None else token_ids,
            block_size=0 if block_size is None else block_size,
            lora_id=named.get("lora_id"),
            medium=_located(named.get("medium"), extra),
            lora_name=named.get("lora_name"),
            extra=extra,
        )
    return BlockRemoved(block_hashes=named["block_hashes"], medium=_located(named.get("medium"), extra), extra=extra)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big")
