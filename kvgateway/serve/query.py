"""The query parameters of a request: checked against what its route accepts (one declaration,
:data:`ROUTE_PARAMETERS`, which the 400s quote), the stream's filter and resume point parsed into a
:class:`ClientRequest`, or :class:`BadRequest` naming the parameter."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeAlias, cast

from kvgateway.protocol.filters import ClientFilter


class BadRequest(ValueError):
    """Invalid query parameters; ``message`` is one line naming the parameter (HTTP 400)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class ClientRequest:
    filter: ClientFilter
    last_event_id: str | None = None
    snapshot: str | None = None
    """``"blocks"``: the resident blocks (``state`` messages) follow a hello that is not recovered."""
    compat: frozenset[str] = frozenset()
    """Deprecated fields the client still reads (:data:`COMPATS`), sent to it alone."""
    digest: int | None = None
    """``digest=SECONDS``: a ``digest`` message per selected stream every that many seconds."""


class MultiItems(Protocol):
    """Starlette's ``QueryParams`` (every value of a repeated parameter, in order)."""

    def multi_items(self) -> list[tuple[str, str]]: ...


QueryInput: TypeAlias = Mapping[str, Sequence[str]] | MultiItems | Sequence[tuple[str, str]]

PARAMETERS: Final = ("source", "dp_rank", "type", "medium", "last_event_id", "snapshot", "compat", "digest", "token")
"""Every query parameter a stream endpoint accepts; any other name is a 400 (catches typos).
``token`` is the auth layer's and ignored here."""
SNAPSHOTS: Final = ("blocks",)
"""Values of ``snapshot``: what a client that is not recovered receives after the hello."""
GAP_LAST: Final = "gap_last"
INT_SEQS: Final = "int_seqs"
COMPATS: Final = (GAP_LAST, INT_SEQS)
"""Values of ``compat``: a deprecated form a client written against an older release still reads,
sent to that client until its removal (docs/protocol.md, "Deprecated fields").
``gap_last``: ``unrecovered_gap``'s ``until`` also as ``last`` (until 0.2.0).
``int_seqs``: engine seqs as JSON numbers rather than decimal strings, ``restart.previous`` -1
rather than null for none (until 0.2.0; also on ``GET /v1/sources``)."""
DIGEST_SECONDS: Final = (1, 3600)
"""The range of ``digest`` (whole seconds between two digests of a stream)."""
DIGEST_TYPES: Final = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})
"""What a ``type`` filter must keep for ``digest``: a client that does not see every block event
cannot keep the state the digest is of."""
MAX_VALUES: Final = 64
"""Distinct values per repeatable parameter."""

SELECT: Final = ("source", "dp_rank", "token")
"""What a route that answers per stream accepts at least: the stream's own stream selection."""
ROUTE_PARAMETERS: Final[Mapping[str, tuple[str, ...]]] = {
    "/v1/ws": PARAMETERS,
    "/v1/events": PARAMETERS,
    "/v1/sources": ("source", "dp_rank", "compat", "token"),
    "/v1/occupancy": SELECT,
    "/v1/analytics": SELECT,
    "/v1/history": ("source", "dp_rank", "medium", "since", "step", "token"),
    "/v1/blocks": ("source", "dp_rank", "format", "token"),
    "/v1/lookup": SELECT,
    "/v1/schema": ("token",),
}
"""Every query parameter each route accepts, in the order its 400 lists them: the one place that
says it. The stream's names (:data:`PARAMETERS`) mean on every route what they mean on the stream;
the others (``since``, ``step``, ``format``) are the route's own."""

_RANK_RE: Final = re.compile(r"[0-9]{1,9}")
_TYPE_RE: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_MEDIUM_RE: Final = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_SECONDS_RE: Final = re.compile(r"[0-9]{1,4}")


def _show(value: str) -> str:
    """A client-supplied value for an error message: quoted, escaped to one line, shortened."""
    return repr(value[:64]) + ("..." if len(value) > 64 else "")


def _query_items(params: QueryInput) -> Iterator[tuple[str, str]]:
    # QueryParams is a Mapping too, but its items() keeps only the last value of each name.
    # MultiItems was a runtime-checkable protocol tested with isinstance; this is what that asked
    # (the attribute is there and not None) without typing's check: 7 to 20 us, twice a request.
    multi_items = getattr(params, "multi_items", None)
    if multi_items is not None:
        yield from multi_items()
        return
    if not isinstance(params, Mapping):
        yield from cast("Sequence[tuple[str, str]]", params)  # what is left of QueryInput
        return
    for name, values in params.items():
        if isinstance(values, str):
            yield name, values
        else:
            for value in values:
                yield name, value


def _matching(name: str, value: str, pattern: re.Pattern[str], what: str) -> str:
    """``value``, when the whole of it matches ``pattern``; else a 400 saying ``what`` was expected."""
    if pattern.fullmatch(value) is None:
        raise BadRequest(f"{name}: expected {what}, got {_show(value)}")
    return value


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise BadRequest(f"{name}: expected {' or '.join(allowed)}, got {_show(value)}")
    return value


def check_once(name: str, values: list[str]) -> None:
    """A 400 when a parameter that takes one value was given more than once."""
    if len(values) > 1:
        raise BadRequest(f"{name}: given more than once")


def _ranks_text(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def check_ranks(client_filter: ClientFilter, streams: Iterable[tuple[str, int]]) -> None:
    """The filter rule for what the configuration defines: each ``dp_rank`` must be a rank of a
    selected source (of any source when ``source`` is not given), as each ``source`` must be a
    configured one; a 400 otherwise. (``type`` and ``medium`` name what the events carry, which
    no configuration lists: a value no event has matches nothing.)"""
    wanted = client_filter.dp_ranks
    if wanted is None:
        return
    chosen = client_filter.sources
    have = sorted({rank for name, rank in streams if chosen is None or name in chosen})
    missing = sorted(wanted.difference(have))
    if missing:
        of = f" of source {', '.join(map(repr, sorted(chosen)))}" if chosen else ""
        raise BadRequest(f"dp_rank: no configured stream{of} has rank {missing[0]} (ranks: {_ranks_text(have)})")


def parse_query(
    params: QueryInput, *, sources: Iterable[str] | None = None, last_event_id: str | None = None
) -> ClientRequest:
    """The filter and resume point of a stream request; raises :class:`BadRequest`.

    ``sources``: the configured source names (None: any name). ``last_event_id``: the SSE ``Last-Event-ID``
    header, which wins over the query parameter (EventSource sends it on reconnect, the query
    parameter serves the first connection). A malformed id is not an error: it just cannot be recovered.
    """
    known = None if sources is None else frozenset(sources)
    chosen_sources: set[str] = set()
    ranks: set[int] = set()
    types: set[str] = set()
    mediums: set[str] = set()
    resume_ids: list[str] = []
    snapshots: list[str] = []
    compat: set[str] = set()
    digests: list[str] = []
    for name, value in _query_items(params):
        if name == "source":
            if known is not None and value not in known:
                raise BadRequest(f"source: unknown source {_show(value)}")
            chosen_sources.add(value)
            _check_count(name, chosen_sources)
        elif name == "dp_rank":
            ranks.add(int(_matching(name, value, _RANK_RE, "a non-negative integer")))
            _check_count(name, ranks)
        elif name == "type":
            types.add(_matching(name, value, _TYPE_RE, "an event type name (letters, digits, _.:-)"))
            _check_count(name, types)
        elif name == "medium":
            mediums.add(_matching(name, value, _MEDIUM_RE, "a medium name (letters, digits, _.:-)").upper())
            _check_count(name, mediums)
        elif name == "last_event_id":
            resume_ids.append(value)
            check_once(name, resume_ids)
        elif name == "snapshot":
            snapshots.append(_one_of(name, value, SNAPSHOTS))
            check_once(name, snapshots)
        elif name == "compat":
            compat.add(_one_of(name, value, COMPATS))
        elif name == "digest":
            digests.append(value)
            check_once(name, digests)
        elif name != "token":
            raise BadRequest(f"unknown query parameter {_show(name)} (accepted: {', '.join(PARAMETERS)})")
    resume = last_event_id or (resume_ids[0] if resume_ids else None)
    client_filter = ClientFilter(
        sources=frozenset(chosen_sources) or None,
        dp_ranks=frozenset(ranks) or None,
        types=frozenset(types) or None,
        mediums=frozenset(mediums) or None,
    )
    return ClientRequest(
        filter=client_filter,
        last_event_id=resume or None,
        snapshot=snapshots[0] if snapshots else None,
        compat=frozenset(compat),
        digest=_digest_seconds(digests[0], types) if digests else None,
    )


def _digest_seconds(value: str, types: set[str]) -> int:
    """``digest``'s value; a 400 for a bad one, or with a ``type`` filter that drops block events."""
    low, high = DIGEST_SECONDS
    if _SECONDS_RE.fullmatch(value) is None or not low <= int(value) <= high:
        raise BadRequest(f"digest: expected whole seconds from {low} to {high}, got {_show(value)}")
    if types and not types >= DIGEST_TYPES:
        raise BadRequest(f"digest: needs every block event; a type filter must keep {', '.join(sorted(DIGEST_TYPES))}")
    return int(value)


def parse_route_query(
    route: str,
    params: QueryInput,
    *,
    sources: Iterable[str] | None = None,
    last_event_id: str | None = None,
    streams: Iterable[tuple[str, int]] | None = None,
) -> tuple[ClientRequest, dict[str, list[str]]]:
    """The stream filter of a request to ``route`` and the values of the route's own parameters
    (by name, in order); raises :class:`BadRequest` for a name ``route`` does not accept, listing
    what it does (:data:`ROUTE_PARAMETERS`), or for a bad value of the stream's parameters.
    ``streams``: the configured streams, for :func:`check_ranks` (None: any rank)."""
    accepted = ROUTE_PARAMETERS[route]
    stream: list[tuple[str, str]] = []
    own: dict[str, list[str]] = {}
    for name, value in _query_items(params):
        if name not in accepted:
            raise BadRequest(f"unknown query parameter {_show(name)} (accepted: {', '.join(accepted)})")
        if name in PARAMETERS:
            stream.append((name, value))
        else:
            own.setdefault(name, []).append(value)
    request = parse_query(stream, sources=sources, last_event_id=last_event_id)
    if streams is not None:
        check_ranks(request.filter, streams)
    return request, own


def _check_count(name: str, values: set[Any]) -> None:
    if len(values) > MAX_VALUES:
        raise BadRequest(f"{name}: more than {MAX_VALUES} distinct values")
