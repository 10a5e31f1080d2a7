"""docs/protocol.md's field tables against kvgateway/protocol/schema.json, field by field: the
same fields, the same JSON types, the same nullability, every value of an enum named, and the
formats the docs spell out (the epoch, seqs, the tiers). One source of truth, two renderings: a
change to one that the other does not follow fails here, naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, get_args

import pytest

from kvgateway.engine.mediums import medium_tier as tier_of
from kvgateway.protocol.messages import ConnectionCode
from tests.support import REPO

DOC: Final = REPO / "docs" / "protocol.md"

TABLES: Final[dict[str, tuple[str, ...]]] = {
    "`hello`": ("hello",),
    "Source status": ("source_status",),
    "`batch`": ("batch",),
    "`state`": ("state",),
    "Event fields": ("BlockStored", "BlockRemoved"),
    "State digest": ("digest",),
}
"""Per heading of protocol.md, the schema definitions its ``| field | type | meaning |`` table
describes (an event table: the fields of either event)."""

ENVELOPE: Final = frozenset({"type", "kind", "id", "offset", "source", "dp_rank"})
"""A notice's fields that every stream notice has, which the notice table states once above it."""

_TYPES: Final = {"string", "integer", "number", "boolean", "array", "object", "null"}


@dataclass(frozen=True)
class DocField:
    """One field as a protocol.md table states it."""

    where: str  # the heading, or the notice kind
    name: str
    types: frozenset[str]  # JSON types, "null" included when the docs say "or null"
    note: str  # the parenthesis after the type ("seq", "16 lowercase hex characters")
    meaning: str


# --- reading the docs -------------------------------------------------------------------------


def _sections(text: str) -> Iterator[tuple[str, list[str]]]:
    heading, lines = "", []
    for line in text.splitlines():
        if line.startswith("#"):
            yield heading, lines
            heading, lines = line.lstrip("#").strip(), []
        else:
            lines.append(line)
    yield heading, lines


def _rows(lines: list[str], header: str) -> Iterator[list[str]]:
    """The cells of each row of the section's table whose header starts with ``header``."""
    inside = False
    for line in lines:
        if line.startswith(header):
            inside = True
        elif inside and line.startswith("|"):
            if not line.startswith("| ---"):
                yield [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        elif inside:
            return


def parse_type(text: str) -> tuple[frozenset[str], str]:
    """``"string or null (seq)"`` -> ({"string", "null"}, "seq")."""
    note = ""
    if "(" in text:
        text, note = text.split("(", 1)
        note = note.rstrip(")").strip()
    types = frozenset(part.strip() for part in text.split(" or "))
    assert types <= _TYPES, f"not JSON types: {text!r}"
    return types, note


def doc_fields(text: str) -> list[DocField]:
    found: list[DocField] = []
    for heading, lines in _sections(text):
        if heading in TABLES:
            for names, types, meaning in _rows(lines, "| field | type |"):
                name_list = re.findall(r"`(\w+)`", names)
                type_list = [types] if len(name_list) == 1 else types.split(", ")
                assert len(type_list) == len(name_list), f"{heading}: {names} | {types}"
                for name, type_text in zip(name_list, type_list, strict=True):
                    found.append(DocField(heading, name, *parse_type(type_text), meaning))
        for kind, fields, meaning in _rows(lines, "| kind | further fields |"):
            for name, type_text in re.findall(r"`(\w+)` ([a-z ]+(?:\([^)]*\))?)", fields):
                for each in re.findall(r"`(\w+)`", kind):
                    found.append(DocField(each, name, *parse_type(type_text.strip()), meaning))
    return found


# --- reading the schema -----------------------------------------------------------------------


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((REPO / "kvgateway" / "protocol" / "schema.json").read_bytes())
    return schema


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = {**defs[node["$ref"].removeprefix("#/$defs/")], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def schema_types(node: dict[str, Any], defs: dict[str, Any]) -> frozenset[str]:
    """Every JSON type a property's schema allows, null included."""
    node = _resolve(node, defs)
    values: list[Any] = [node["const"]] if "const" in node else node.get("enum", [])
    if values:
        names = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}
        return frozenset(names[type(value)] for value in values)
    if "type" in node:
        return frozenset(node["type"] if isinstance(node["type"], list) else [node["type"]])
    found: frozenset[str] = frozenset()
    for branch in node.get("oneOf", ()):
        found |= schema_types(branch, defs)
    return found


def schema_enum(node: dict[str, Any], defs: dict[str, Any]) -> list[Any]:
    node = _resolve(node, defs)
    values = list(node.get("enum", []))
    for branch in node.get("oneOf", ()):
        values += schema_enum(branch, defs)
    return [value for value in values if value is not None]


def _is_seq(node: dict[str, Any], defs: dict[str, Any]) -> bool:
    if node.get("$ref") == "#/$defs/seq":
        return True
    return any(_is_seq(branch, defs) for branch in node.get("oneOf", ()))


def schema_shapes(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per place of the docs (a heading, a notice kind), the schema's properties there."""
    defs = schema["$defs"]
    shapes: dict[str, dict[str, Any]] = {}
    for heading, names in TABLES.items():
        merged: dict[str, Any] = {}
        for name in names:
            merged |= defs[name]["properties"]
        shapes[heading] = merged
    for ref in defs["notice"]["oneOf"]:
        notice = defs[ref["$ref"].removeprefix("#/$defs/")]
        kind = notice["properties"]["kind"]
        for each in [kind["const"]] if "const" in kind else kind["enum"]:
            shapes[each] = notice["properties"]
    return shapes


# --- the checks -------------------------------------------------------------------------------


def disagreements(text: str, schema: dict[str, Any]) -> list[str]:
    """Every way the docs' tables and the schema differ, one line each."""
    defs = schema["$defs"]
    shapes = schema_shapes(schema)
    fields = doc_fields(text)
    out: list[str] = []
    documented: dict[str, set[str]] = {}
    for field in fields:
        documented.setdefault(field.where, set()).add(field.name)
        node = shapes.get(field.where, {}).get(field.name)
        if node is None:
            out.append(f"{field.where}.{field.name}: in the docs, not in the schema")
            continue
        out += _field_disagreements(field, node, defs)
    for where, properties in shapes.items():
        own = set(properties) - {"type"} - (ENVELOPE if where not in TABLES else set())
        for name in sorted(own - documented.get(where, set())):
            out.append(f"{where}.{name}: in the schema, not in the docs' table")
    return out


def _field_disagreements(field: DocField, node: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    out: list[str] = []
    label = f"{field.where}.{field.name}"
    types = schema_types(node, defs)
    if field.types != types:
        out.append(f"{label}: the docs say {' or '.join(sorted(field.types))}, the schema {' or '.join(sorted(types))}")
    if (field.note == "seq") != _is_seq(node, defs):
        out.append(f"{label}: an engine seq in {'the docs' if field.note == 'seq' else 'the schema'} only")
    hex_chars = re.fullmatch(r"(\d+) lowercase hex characters", field.note)
    if hex_chars is not None:
        pattern = _resolve(node, defs).get("pattern")
        if pattern != f"^[0-9a-f]{{{hex_chars.group(1)}}}$":
            out.append(f"{label}: the docs say {field.note}, the schema's pattern is {pattern}")
    for value in schema_enum(node, defs):
        if f"`{value}`" not in field.meaning:
            out.append(f"{label}: the schema's value {value!r} is not named in the docs")
    return out


def tier_disagreements(text: str, schema: dict[str, Any]) -> list[str]:
    """The docs' tier table against the code that maps mediums and the schema's tier description."""
    described = schema["$defs"]["tier"]["description"]
    by_tier = dict(re.findall(r"(GPU|CPU|DISK|EXTERNAL) \(([^)]*)\)", described))
    out: list[str] = []
    for heading, lines in _sections(text):
        if heading != "Mediums and tiers":
            continue
        for cell, mediums in _rows(lines, "| tier | mediums"):
            tier = cell.strip("`")
            listed = mediums.split("anything else")[0]  # then examples of "anything"
            schema_prefixes = re.findall(r"([A-Z_]+)\*", by_tier.get(tier, ""))
            for prefix in re.findall(r"`([A-Z_]+)(?:\.\.\.)?`", listed):
                if tier_of(prefix) != tier:
                    out.append(f"tier: the docs put {prefix} in {tier}, the code in {tier_of(prefix)}")
                if prefix != tier and not any(prefix.startswith(each) for each in schema_prefixes):
                    out.append(f"tier: the docs put {prefix} in {tier}, the schema's description does not")
    return out


# --- the tests --------------------------------------------------------------------------------


def test_the_docs_tables_and_the_schema_agree_field_by_field() -> None:
    text = DOC.read_text()
    assert disagreements(text, _schema()) == []
    assert len(doc_fields(text)) > 60, "the tables were read"


def test_the_docs_tier_table_agrees_with_the_code_and_the_schema() -> None:
    text = DOC.read_text()
    assert tier_disagreements(text, _schema()) == []


def test_the_connection_codes_are_the_code_s_own() -> None:
    assert tuple(_schema()["$defs"]["connection_code"]["enum"]) == get_args(ConnectionCode)


# The disagreements issue 32 found at 8a83c3d, each put back into an otherwise agreeing pair:
# the check must name every one.
BROKEN: Final[list[tuple[str, str, str, str]]] = [
    ("doc", "| `ts` | number or null |", "| `ts` | number |", "`batch`.ts"),
    ("doc", "`previous` string or null (seq)", "`previous` integer", "restart.previous"),
    ("doc", "`seq` string (seq), `detail`", "`seq` string or null (seq), `detail`", "stale.seq"),
    ("doc", "`detail` string |", "`detail` string or null |", "stale.detail"),
    ("doc", "(16 lowercase hex characters)", "(8 lowercase hex characters)", "`hello`.epoch"),
    ("doc", "| `lora_id` | integer or null |", "| `lora_id` | string or null |", "Event fields.lora_id"),
    ("doc", "| `extra_keys` | array or null |", "| `extra_keys` | array |", "Event fields.extra_keys"),
    ("doc", "| `kv_cache_spec_sliding_window` | integer or null |", "| `x` | integer |", "sliding_window"),
    ("doc", "`reason_code` string (connection", "`reason_code` integer (connection", "up.reason_code"),
    ("doc", "| `up` / `down` | `reason` string,", "| `up` / `down` | `reason` integer,", "down.reason"),
    ("doc", "`last_seq` | string or null (seq)", "`last_seq` | integer or null", "Source status.last_seq"),
    (
        "schema",
        '"pattern": "^[0-9a-f]{16}$"\n    },\n    "offset"',
        '"pattern": "^[0-9A-Za-z_-]{1,64}$"\n    },\n    "offset"',
        "`hello`.epoch",
    ),
    ("schema", '"enum": ["connected", "disconnected",', '"enum": ["connected", "gone", "disconnected",', "'gone'"),
]


@pytest.mark.parametrize(("where", "good", "bad", "named"), BROKEN, ids=[case[3] for case in BROKEN])
def test_the_check_names_each_disagreement_the_issue_found(where: str, good: str, bad: str, named: str) -> None:
    text, raw = DOC.read_text(), (REPO / "kvgateway" / "protocol" / "schema.json").read_text()
    if where == "doc":
        assert text.count(good) == 1, good
        text = text.replace(good, bad)
    else:
        assert raw.count(good) == 1, good
        raw = raw.replace(good, bad)
    found = disagreements(text, json.loads(raw))
    assert any(named in line for line in found), found


def test_the_tier_check_names_fs_put_elsewhere() -> None:
    text = DOC.read_text()
    good = "`HDD`, `FS` (vLLM 0.26's file system offload)"
    assert text.count(good) == 1
    moved = text.replace(good, "`HDD`").replace("| `EXTERNAL` | `OBJ`", "| `EXTERNAL` | `FS`, `OBJ`")
    assert any("FS" in line for line in tier_disagreements(moved, _schema()))
    schema = _schema()
    schema["$defs"]["tier"]["description"] = schema["$defs"]["tier"]["description"].replace(", FS*", "")
    assert any("FS" in line for line in tier_disagreements(text, schema))
