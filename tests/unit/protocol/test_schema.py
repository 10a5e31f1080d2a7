"""The JSON Schema as a typed client reads it: one type per field name across the message
envelopes (hello, batch, every notice, state) and across the events, so that a client decoding
every message (or every event) into one struct can (docs/protocol.md, "Writing a client")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import pytest

from kvgateway.protocol import messages
from kvgateway.serve.query import COMPATS
from tests.support import REPO

ENVELOPES = ("hello", "batch", "state")
"""With every ``notice_*`` definition: the shapes a stream message can have."""
EVENTS = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


def _schema() -> dict[str, Any]:
    served = json.loads(messages.schema_bytes())
    assert served == json.loads((REPO / "kvgateway" / "protocol" / "schema.json").read_bytes())
    return served


def _types(node: dict[str, Any], defs: dict[str, Any]) -> frozenset[str]:
    """The JSON types a property's schema allows, null left out (a nullable field is one type to a
    typed client: a pointer, an Option)."""
    if "$ref" in node:
        target = defs[node["$ref"].removeprefix("#/$defs/")]
        return _types({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    if "const" in node:
        return _value_types([node["const"]])
    if "enum" in node:
        return _value_types(node["enum"])
    if "type" in node:
        named = node["type"] if isinstance(node["type"], list) else [node["type"]]
        return frozenset(named) - {"null"}
    found: frozenset[str] = frozenset()
    for key in ("oneOf", "anyOf"):
        for branch in node.get(key, ()):
            found |= _types(branch, defs)
    assert found, f"a property without a type: {node}"
    return found


def _value_types(values: list[Any]) -> frozenset[str]:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return frozenset(names[type(value)] for value in values if value is not None)


def _fields(schema: dict[str, Any], names: tuple[str, ...]) -> Iterator[tuple[str, str, frozenset[str]]]:
    defs = schema["$defs"]
    for name in names:
        for field, node in defs[name]["properties"].items():
            yield name, field, _types(node, defs)


def _conflicts(schema: dict[str, Any], names: tuple[str, ...]) -> dict[str, dict[frozenset[str], list[str]]]:
    seen: dict[str, dict[frozenset[str], list[str]]] = {}
    for shape, field, types in _fields(schema, names):
        seen.setdefault(field, {}).setdefault(types, []).append(shape)
    return {field: by_type for field, by_type in seen.items() if len(by_type) > 1}


def _notice_shapes(schema: dict[str, Any]) -> tuple[str, ...]:
    return tuple(ref["$ref"].removeprefix("#/$defs/") for ref in schema["$defs"]["notice"]["oneOf"])


def test_no_field_name_has_two_types_across_the_messages() -> None:
    # No exception, not even for a deprecated name: a deprecated field of another type is sent
    # only to the clients that ask for it (compat=, docs/protocol.md "Deprecated fields") and is
    # not in the schema.
    schema = _schema()
    assert _conflicts(schema, (*ENVELOPES, *_notice_shapes(schema))) == {}


REMOVALS = {"gap_last": "0.2.0", "int_seqs": "0.2.0"}
"""Each ``compat`` value and the release that drops it (docs/protocol.md, "Deprecated fields")."""


def test_a_deprecated_copy_is_gone_by_its_removal_release() -> None:
    assert set(REMOVALS) == set(COMPATS), "every compat value has its removal release here"
    current = _release(version("kvgateway"))
    for value, removal in REMOVALS.items():
        assert current < _release(removal), f"compat={value}: remove it (and its copies) in {removal}"


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3])


def test_no_field_name_has_two_types_across_the_events() -> None:
    assert _conflicts(_schema(), EVENTS) == {}


@pytest.mark.parametrize(
    ("shapes", "field"),
    [
        ({"x": {"type": "boolean"}, "y": {"type": ["integer", "null"]}}, "f"),
        ({"x": {"const": True}, "y": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/n"}]}}, "f"),
    ],
)
def test_the_check_finds_a_field_with_two_types(shapes: dict[str, dict[str, Any]], field: str) -> None:
    defs: dict[str, Any] = {"n": {"type": "integer"}}
    defs |= {name: {"properties": {field: node}} for name, node in shapes.items()}
    assert set(_conflicts({"$defs": defs}, tuple(shapes))) == {field}
    # null beside a type is the same type to a typed client
    defs["y"] = {"properties": {field: {"type": ["boolean", "null"]}}}
    assert _conflicts({"$defs": defs}, tuple(shapes)) == {}
