"""The routers' routes end to end (issue 15): ``GET /v1/blocks`` (JSON and NDJSON), ``POST /v1/lookup``
(by hashes and by tokens, the limits, the token), and ``snapshot=blocks`` on ``/v1/ws`` and
``/v1/events``. A real ``kvgateway serve`` fed by ``kvgateway simulate`` (two ranks, CPU offload
with placeholder events); every state message and NDJSON line is checked against the JSON Schema.
The Go router's end-to-end run is in test_go_router.py.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.support import BIG_QUEUE, REPO, free_ports, source_spec, start_gateway, start_sim, wait_until, warmup
from tests.support.clients import WsCollector

pytestmark = pytest.mark.timeout(120)

TOKEN = "tk-routers-9f2Q"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SCHEMA = json.loads((REPO / "kvgateway" / "protocol" / "schema.json").read_text(encoding="utf-8"))
VALIDATOR = Draft202012Validator(SCHEMA)


def shape(name: str) -> Draft202012Validator:
    """A validator of one of the schema's ``$defs`` (the routes' documents are no stream message)."""
    return Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": f"#/$defs/{name}"})


BATCHES = 400


def _quiet_offset(base: str) -> int:
    """The gateway's offset once the engines are done (it stopped moving)."""
    last = [-1]

    def still() -> bool:
        now = httpx.get(f"{base}/v1/sources", headers=AUTH, timeout=10).json()["offset"]
        done = now == last[0]
        last[0] = now
        return done

    wait_until(still, timeout=30, interval=0.5, what="the engines to finish")
    return last[0]


def _comparable(streams: list[dict[str, Any]]) -> dict[tuple[str, int], Counter[tuple[Any, ...]]]:
    out: dict[tuple[str, int], Counter[tuple[Any, ...]]] = {}
    for stream in streams:
        held = out.setdefault((stream["source"], stream["dp_rank"]), Counter())
        for b in stream["blocks"]:
            held[(b["hash"], b["medium"], b["group_idx"], b["refs"], b["block_size"])] += 1
    return out


def _apply(index: dict[tuple[Any, ...], int], message: dict[str, Any]) -> None:
    """A router's index (the events the simulator sends: no group_idx, one medium per event)."""
    key = (message["source"], message["dp_rank"])
    if message["type"] == "notice" and message["kind"] == "restart":
        for k in [k for k in index if k[:2] == key]:
            del index[k]
    if message["type"] != "batch":
        return
    for event in message["events"]:
        if event["type"] == "AllBlocksCleared":
            for k in [k for k in index if k[:2] == key]:
                del index[k]
            continue
        medium = (event.get("medium") or "GPU").upper()
        for h in event["block_hashes"]:
            k = (*key, h, medium)
            index[k] = index.get(k, 0) + (1 if event["type"] == "BlockStored" else -1)
            if index[k] <= 0:
                del index[k]


@pytest.fixture
def fleet(procs: Any) -> str:
    http, pub, rep = free_ports(3, spacing=2)
    args = ["--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{rep}", "--dp-size", "2"]
    spec = source_spec("a", pub, rep, 2)
    extra = ["--token", TOKEN, "--lookup-burst", "40", "--lookup-rate", "0.01", "--max-snapshots", "3"]
    gw = start_gateway(procs, http, [spec], *extra, client_queue_bytes=BIG_QUEUE)
    sim_args = [*args, "--rate", "200", "--batches", str(BATCHES), "--cpu-offload", *warmup(1.0)]
    start_sim(procs, *sim_args, ranks=2)
    return gw.base


def test_snapshot_then_stream_equals_the_blocks_document_and_lookups_answer(fleet: str, procs: Any) -> None:
    base = fleet
    wait_until(
        lambda: httpx.get(f"{base}/v1/sources", headers=AUTH, timeout=10).json()["offset"] >= 200,
        timeout=30,
        what="some history before the client connects",
    )
    ws_url = base.replace("http", "ws") + "/v1/ws"
    with WsCollector(ws_url, query=f"snapshot=blocks&token={TOKEN}") as ws:
        _quiet_offset(base)
        doc = httpx.get(f"{base}/v1/blocks", headers=AUTH, timeout=30).json()
        offset = doc["offset"]
        wait_until(lambda: any(m.get("offset") == offset for _, m in ws.messages), what="the document's offset")
    messages = [m for _, m in ws.messages]
    states = [m for m in messages if m["type"] == "state"]
    assert {m["offset"] for m in states} == {ws.hello["offset"]}
    first_live = next(i for i, m in enumerate(messages) if m["type"] != "state")
    assert all(m["type"] == "state" for m in messages[:first_live])  # state first, then live
    live = messages[first_live:]
    live = [m for m in live if m["offset"] <= offset]
    assert [m["offset"] for m in live] == list(range(ws.hello["offset"] + 1, offset + 1))  # none lost or doubled
    assert sum(m["last"] for m in states) == 2
    for m in states[:5] + states[-2:]:
        VALIDATOR.validate(m)
    assert {m["stale"] for m in states} == {False}  # the simulator lost nothing
    index: dict[tuple[Any, ...], int] = {}
    for m in states:
        for b in m["blocks"]:
            index[(m["source"], m["dp_rank"], b["hash"], b["medium"])] = b["refs"]
    for m in live:
        _apply(index, m)

    ndjson = httpx.get(f"{base}/v1/blocks?format=ndjson", headers=AUTH, timeout=30).text.splitlines()
    head, lines = json.loads(ndjson[0]), [json.loads(line) for line in ndjson[1:]]
    assert (head["epoch"], doc["epoch"]) == (ws.hello["epoch"], ws.hello["epoch"]) and head["offset"] >= offset
    for line in lines[:3]:
        VALIDATOR.validate(line)  # the WebSocket's state messages, stale included
    assert _comparable(doc["streams"]) == _comparable(lines)
    shape("blocks_document").validate(doc)
    expected = {
        (s["source"], s["dp_rank"], b["hash"], b["medium"]): b["refs"] for s in doc["streams"] for b in s["blocks"]
    }
    assert index == expected and len(expected) > 100

    _check_lookups(base, live, index, offset)
    occupancy = httpx.get(f"{base}/v1/occupancy", headers=AUTH, timeout=10).json()
    assert set(occupancy["fleet"]) >= {"distinct_blocks", "shared_blocks", "mediums", "offset"}
    shape("occupancy").validate(occupancy)


def _check_lookups(base: str, live: list[dict[str, Any]], index: dict[tuple[Any, ...], int], offset: int) -> None:
    """A stored chain by hashes and by its tokens give the same prefix for the stream that stored it."""
    stored = [
        (m, e)
        for m in live
        if m["type"] == "batch"
        for e in m["events"]
        if e["type"] == "BlockStored" and e["parent_block_hash"] is None and e.get("medium") in (None, "GPU")
    ]
    assert stored
    checked = 0
    for message, event in stored[-20:]:
        key = (message["source"], message["dp_rank"])
        by_hashes = _post(base, {"block_hashes": event["block_hashes"]})
        by_tokens = _post(base, {"token_ids": event["token_ids"], "lora_name": event.get("lora_name")})
        assert by_tokens["offset"] >= by_hashes["offset"] >= offset
        mine = next(s for s in by_hashes["streams"] if (s["source"], s["dp_rank"]) == key)
        assert mine == next(s for s in by_tokens["streams"] if (s["source"], s["dp_rank"]) == key)
        resident = sum(1 for h in event["block_hashes"] if (*key, h, "GPU") in index)
        checked += mine["blocks"] > 0
        assert mine["mediums"].get("GPU", {"blocks": 0})["blocks"] <= resident
    assert checked > 0


def _post(base: str, body: Any, **kw: Any) -> Any:
    shape("lookup_request").validate(body)
    response = httpx.post(f"{base}/v1/lookup", json=body, headers=AUTH, timeout=10, **kw)
    assert response.status_code == 200, response.text
    shape("lookup_answer").validate(response.json())
    return response.json()


def test_sse_snapshot_limits_and_token(fleet: str) -> None:
    base = fleet
    # SSE: the hello has no id (the last state message has it)
    with httpx.stream("GET", f"{base}/v1/events?snapshot=blocks&source=a&dp_rank=1", headers=AUTH, timeout=10) as r:
        events: list[tuple[str | None, str]] = []
        current_id: str | None = None
        for line in r.iter_lines():
            if line.startswith("id: "):
                current_id = line[4:]
            elif line.startswith("event: "):
                events.append((current_id, line[7:]))
                current_id = None
            if len(events) >= 2 and events[-1][1] != "state":
                break
    assert events[0] == (None, "hello")
    states = [e for e in events if e[1] == "state"]
    assert states[-1][0] is not None and all(i is None for i, _ in states[:-1])

    for path, method in (("/v1/blocks", "GET"), ("/v1/lookup", "POST")):
        assert httpx.request(method, f"{base}{path}", timeout=10).status_code == 401
    bad = {
        b"{": "invalid JSON",
        b'{"block_hashes": [1,2': "invalid JSON",
        b'{"block_hashes": [1,2]}': "block_hashes[0]: hashes are decimal strings",
        b'{"block_hashes": ["1"], "token_ids": [1]}': "exactly one of",
        b'{"block_hashes": ["0x1"]}': "block_hashes[0]",
        b'{"block_hashes": ["1"], "x": 1}': "unknown field",
        b'{"token_ids": [-1]}': "token_ids[0]",
    }
    for body, fragment in bad.items():
        response = httpx.post(f"{base}/v1/lookup", content=body, headers=AUTH, timeout=10)
        assert response.status_code == 400 and fragment in response.json()["error"], (body, response.text)
        assert "\n" not in response.json()["error"]
    assert httpx.post(f"{base}/v1/lookup?type=x", json={"block_hashes": []}, headers=AUTH).status_code == 400
    assert httpx.get(f"{base}/v1/blocks?format=xml", headers=AUTH).status_code == 400
    assert httpx.get(f"{base}/v1/blocks?medium=GPU", headers=AUTH).status_code == 400
    wrong = httpx.get(f"{base}/v1/lookup", headers=AUTH, timeout=10)
    assert (wrong.status_code, wrong.headers["allow"]) == (405, "POST")
    huge = httpx.post(f"{base}/v1/lookup", content=b" " * (2 << 20), headers=AUTH, timeout=10)
    assert huge.status_code == 413
    codes = [httpx.post(f"{base}/v1/lookup", json={"block_hashes": []}, headers=AUTH).status_code for _ in range(40)]
    assert codes[0] == 200 and codes[-1] == 429  # a burst of 40 and almost no refill


def test_the_fleet_count_never_says_none_beside_resident_blocks(procs: Any) -> None:
    """Issue 33, item 4: for the first 15 s the fleet facts said 0 distinct blocks while the
    engines' blocks were resident (the count at start came before them). Every occupancy answer
    from the gateway's start on either has no fleet facts yet ("being counted") or counts blocks
    when some are resident; and a count of them comes."""
    http, pub, rep = free_ports(3, spacing=2)
    gw = start_gateway(procs, http, [source_spec("a", pub, rep, 2)], "--token", TOKEN)
    sim_args = ["--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{rep}", "--dp-size", "2"]
    start_sim(procs, *sim_args, "--rate", "200", "--batches", str(BATCHES), *warmup(1.0), ranks=2)
    answers: list[tuple[int, Any]] = []

    def counted() -> bool:
        body = httpx.get(f"{gw.base}/v1/occupancy", headers=AUTH, timeout=10).json()
        resident, fleet = sum(tier["blocks"] for tier in body["tiers"].values()), body["fleet"]
        answers.append((resident, fleet and fleet["distinct_blocks"]))
        assert fleet is None or resident == 0 or fleet["distinct_blocks"] > 0, answers[-5:]
        return fleet is not None and fleet["distinct_blocks"] > 0

    wait_until(counted, timeout=60, interval=0.05, what="a fleet count of the resident blocks")
    assert answers[-1][0] > 0


# --- the state digest -------------------------------------------------------------------------


def _sse_events(url: str, wanted: int) -> list[tuple[str | None, str, dict[str, Any]]]:
    """(id, event, data) of an SSE stream, until ``wanted`` digest events came."""
    out: list[tuple[str | None, str, dict[str, Any]]] = []
    with httpx.stream("GET", url, headers=AUTH, timeout=30) as r:
        assert r.status_code == 200
        current: dict[str, str] = {}
        for line in r.iter_lines():
            if line == "" and "event" in current:
                out.append((current.get("id"), current["event"], json.loads(current["data"])))
                current = {}
                if sum(e == "digest" for _, e, _ in out) >= wanted:
                    break
            elif ": " in line:
                name, value = line.split(": ", 1)
                current[name] = value
    return out


def test_digests_in_blocks_state_and_digest_messages_agree(fleet: str) -> None:
    """Once the engines are done: /v1/blocks's digest per stream is the sum of its blocks' elements
    (computed here from the doc's algorithm); an SSE ``snapshot=blocks&digest=1`` client gets it in
    each stream's last state message and in ``digest`` events without an id; a ``medium`` filter
    sums the mediums it selects. Bad values and combinations are 400s."""
    base = fleet
    wait_until(
        lambda: httpx.get(f"{base}/v1/sources", headers=AUTH, timeout=10).json()["offset"] >= 2 * BATCHES,
        timeout=60,
        what="both ranks' batches",
    )
    _quiet_offset(base)
    doc = httpx.get(f"{base}/v1/blocks", headers=AUTH, timeout=30).json()
    shape("blocks_document").validate(doc)

    def own(blocks: list[dict[str, Any]]) -> tuple[str, int]:
        total = 0
        for b in blocks:
            state = 0xCBF29CE484222325
            for byte in f"{b['medium']}\n{b['group_idx']}\n{b['hash']}".encode():
                state = ((state ^ byte) * 0x100000001B3) % 2**64
            total += state
        return f"{total % 2**64:016x}", len(blocks)

    streams = {(s["source"], s["dp_rank"]): s for s in doc["streams"]}
    assert len(streams) == 2 and all(s["blocks"] for s in streams.values())
    for stream in streams.values():
        assert stream["digest"] == own(stream["blocks"])[0]

    events = _sse_events(f"{base}/v1/events?snapshot=blocks&digest=1", wanted=2)
    for ident, event, data in events:
        VALIDATOR.validate(data)
        if event == "digest":
            assert ident is None and data["offset"] >= doc["offset"]  # the blocks stay: the engines are done
            key = (data["source"], data["dp_rank"])
            assert (data["digest"], data["block_count"]) == own(streams[key]["blocks"])
    lasts = {(d["source"], d["dp_rank"]): d["digest"] for _, e, d in events if e == "state" and d["last"]}
    assert lasts == {key: s["digest"] for key, s in streams.items()}

    ws_url = base.replace("http", "ws") + "/v1/ws"
    with WsCollector(ws_url, query=f"digest=1&medium=cpu&dp_rank=0&token={TOKEN}") as ws:
        (found,) = wait_until(lambda: [m for _, m in ws.messages if m["type"] == "digest"][:1] or None, timeout=15)
    cpu = [b for b in streams[("a", 0)]["blocks"] if b["tier"] == "CPU"]
    assert cpu and (found["digest"], found["block_count"]) == own(cpu)

    for query, message in (
        ("digest=0", "digest: expected whole seconds from 1 to 3600, got '0'"),
        ("digest=3601", "digest: expected whole seconds"),
        ("digest=5&type=BlockStored&type=BlockRemoved", "digest: needs every block event"),
    ):
        response = httpx.get(f"{base}/v1/events?{query}", headers=AUTH, timeout=10)
        assert response.status_code == 400 and message in response.json()["error"], query
        with pytest.raises(InvalidStatus) as refused:  # the same before the WebSocket handshake
            connect(f"{ws_url}?{query}&token={TOKEN}", open_timeout=15).close()
        assert refused.value.response.status_code == 400, query
    assert httpx.get(f"{base}/v1/blocks?digest=1", headers=AUTH, timeout=10).status_code == 400
