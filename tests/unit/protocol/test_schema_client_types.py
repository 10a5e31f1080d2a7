"""static/client.d.ts against the JSON Schema, field by field, with no TypeScript compiler.

Every interface marked ``@schema NAME`` declares the message ``$defs/NAME``: the same field names,
the same required ones (no ``?``), the same nullability, the same JSON types, and, where the
declaration lists literals (``"up" | "down"``), the schema's ``const``/``enum`` values exactly.
``Seq`` (engine seqs, which the client always hands out as decimal strings) matches a schema
integer or string. Every message and event shape of the schema has its interface; the ``digest``
message is checked once the schema has it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support import REPO

DTS = REPO / "static" / "client.d.ts"
SCHEMA = json.loads((REPO / "kvgateway" / "protocol" / "schema.json").read_text())
DEFS: dict[str, Any] = SCHEMA["$defs"]

INTERFACE = re.compile(r"/\*\*\s*@schema\s+(\w+)\s*\*/\s*export interface (\w+) \{\n(.*?)\n\}", re.S)
ALIAS = re.compile(r"^export type (\w+) =\s*([^;]+);", re.M)
FIELD = re.compile(r"^\s*(\w+)(\??): (.+);$")
PRIMITIVES = {"string": "string", "number": "number", "boolean": "boolean", "null": "null", "object": "object"}


@dataclass(frozen=True)
class Shape:
    """A field's type: JSON types (integers are numbers) and, when it names them, its literals."""

    types: frozenset[str]
    literals: frozenset[Any] | None = None


def declared(text: str) -> dict[str, tuple[str, dict[str, tuple[bool, Shape]]]]:
    """``@schema`` name -> (interface, field -> (optional, shape)) from a .d.ts text."""
    aliases = {name: body.strip() for name, body in ALIAS.findall(text)}
    out = {}
    for schema_name, interface, body in INTERFACE.findall(text):
        fields = {}
        for line in body.splitlines():
            match = FIELD.match(line)
            if match:  # (an index signature, `[further: string]: unknown`, is not a field)
                fields[match[1]] = (match[2] == "?", ts_shape(match[3], aliases))
        out[schema_name] = (interface, fields)
    return out


def ts_shape(expression: str, aliases: dict[str, str]) -> Shape:
    types: set[str] = set()
    literals: set[Any] = set()
    for part in (p.strip() for p in expression.split("|")):
        if not part:  # a union's leading "|"
            continue
        if part.startswith('"'):
            literals.add(json.loads(part))
            types.add("string")
        elif part.endswith("[]"):
            types.add("array")
        elif part in PRIMITIVES:
            types.add(PRIMITIVES[part])
        elif part == "Seq":
            types.add("seq")
        elif part in aliases:
            inner = ts_shape(aliases[part], aliases)
            types |= inner.types
            literals |= inner.literals or set()
        else:  # Record<...>, or another interface
            types.add("object")
    return Shape(frozenset(types), frozenset(literals) if literals else None)


def json_type(value: Any) -> str:
    return "null" if value is None else {bool: "boolean", str: "string", int: "number", float: "number"}[type(value)]


def schema_shape(node: dict[str, Any]) -> Shape:
    if "$ref" in node:
        return schema_shape(DEFS[node["$ref"].rsplit("/", 1)[1]])
    if "oneOf" in node or "anyOf" in node:
        parts = [schema_shape(n) for n in node.get("oneOf", node.get("anyOf"))]
        types = frozenset().union(*(p.types for p in parts))
        literal_sets = [p.literals for p in parts if p.types - {"null"}]
        literals = frozenset().union(*literal_sets) if literal_sets and all(literal_sets) else None
        return Shape(types, literals)  # type: ignore[arg-type]
    if "const" in node or "enum" in node:
        values = [node["const"]] if "const" in node else node["enum"]
        return Shape(frozenset(map(json_type, values)), frozenset(v for v in values if v is not None))
    kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
    return Shape(frozenset("number" if k == "integer" else k for k in kinds))


def disagreements(name: str, fields: dict[str, tuple[bool, Shape]]) -> list[str]:
    definition = DEFS[name]
    properties: dict[str, Any] = definition["properties"]
    required = set(definition.get("required", []))
    wrong = [f"{name}: {field} is not in the schema" for field in fields.keys() - properties.keys()]
    wrong += [f"{name}: {field} is not declared" for field in properties.keys() - fields.keys()]
    for field, (optional, mine) in fields.items():
        if field not in properties:
            continue
        theirs = schema_shape(properties[field])
        if optional == (field in required):
            wrong.append(f"{name}.{field}: {'optional' if optional else 'required'} here, not in the schema")
        types = set(mine.types)
        if "seq" in types:  # the client's seqs are strings whatever the gateway sent
            types = (types - {"seq"}) | (theirs.types & {"number", "string"} or {"seq"})
        if types != theirs.types:
            wrong.append(f"{name}.{field}: {sorted(types)} here, {sorted(theirs.types)} in the schema")
        elif mine.literals is not None and mine.literals != theirs.literals:
            wrong.append(f"{name}.{field}: {sorted(mine.literals)} here, {theirs.literals} in the schema")
    return wrong


def expected_names() -> set[str]:
    notices = {ref["$ref"].rsplit("/", 1)[1] for ref in DEFS["notice"]["oneOf"]}
    shapes = {"hello", "source_status", "batch", "state", "block", "BlockStored", "BlockRemoved", "AllBlocksCleared"}
    return shapes | notices | ({"digest"} & DEFS.keys())


def test_every_message_of_the_schema_is_declared() -> None:
    names = set(declared(DTS.read_text()))
    assert expected_names() <= names
    assert names - expected_names() <= {"digest"}  # declared ahead of a schema that lacks it


@pytest.mark.parametrize("name", sorted(expected_names()))
def test_the_declaration_matches_the_schema(name: str) -> None:
    _, fields = declared(DTS.read_text())[name]
    assert disagreements(name, fields) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("  reason: string | null;\n", "  reason: string;\n"), "source_status.reason: ['string'] here"),
        (("  replay: string | null;\n", "  replay?: string | null;\n"), "source_status.replay: optional here"),
        (("  lag_seconds: number | null;\n", ""), "source_status: lag_seconds is not declared"),
        (('  kind: "up" | "down";\n', '  kind: "up";\n'), "notice_reason.kind: ['up'] here"),
        (("  ts: number | null;\n", "  ts: number | null;\n  tz: string;\n"), "batch: tz is not in the schema"),
        (("  refs: number;\n", "  refs: string;\n"), "block.refs: ['string'] here, ['number']"),
    ],
)
def test_the_check_sees_a_wrong_declaration(change: tuple[str, str], expected: str) -> None:
    text = DTS.read_text()
    assert change[0] in text
    found = [
        line
        for name, (_, fields) in declared(text.replace(change[0], change[1], 1)).items()
        for line in (disagreements(name, fields) if name in DEFS else [])
    ]
    assert any(line.startswith(expected) for line in found), found
