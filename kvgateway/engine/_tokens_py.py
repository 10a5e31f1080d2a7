"""A BlockStored's ``token_ids`` from the msgpack array the engine sent (the pure-Python reference);
a block event's ``block_hashes`` likewise (:func:`block_hashes`).

The fast decoders of :mod:`kvgateway.engine.wire` take ``token_ids`` as the raw msgpack of the
array (``msgspec.Raw``) and hand it to :func:`token_ids`, which gives what the event's field holds:
here the list msgspec decodes it to as ``list[int]``; where msgspec would refuse it,
:class:`NotTokens` (the batch then takes the general path, which decodes and words the error as
ever). The compiled twin
(``_tokens_c``) keeps a list of token ids that all fit 32 bits as a compact C array instead, which
the field turns into this same list when it is first read (:func:`install`), and which the
compiled renderer and learner read without it; anything else it answers as this module does.
"""

from typing import Any, Final

import msgspec

EMPTY: Final = msgspec.Raw(b"\x90")
"""An empty msgpack array: ``token_ids`` absent from a map event."""

_decoder: Final = msgspec.msgpack.Decoder(list[int])


class NotTokens(ValueError):
    """``token_ids`` that are no array of msgpack ints: what a batch's typed decode refuses."""


def token_ids(raw: msgspec.Raw) -> list[int]:
    """What a BlockStored's ``token_ids`` field holds for the msgpack value ``raw``: its list of
    ints; :class:`NotTokens` where it is no array of msgpack ints."""
    try:
        return _decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise NotTokens("token_ids: not an array of msgpack ints") from None


_hashes_decoder: Final = msgspec.msgpack.Decoder(list[int | bytes])


def block_hashes(raw: bytes) -> list[int | bytes]:
    """What a block event's ``block_hashes`` field holds for the msgpack array ``raw`` of ints and
    bins: its list (a ``msgspec.DecodeError`` or ``ValidationError`` for anything else). The
    parsers make it in place as they read a batch; this reads one array alone."""
    return _hashes_decoder.decode(raw)


def install(cls: Any, name: str = "token_ids") -> None:
    """Make ``cls``'s field ``name`` (``token_ids``, ``block_hashes``) read as a list whatever its
    slot holds: here nothing to do, the slot holds the list."""
