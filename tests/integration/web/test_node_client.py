"""The Node.js example client (tests/integration/js/kvgateway-client.mjs) against a real gateway: u64
hashes digit for digit, the token and its refusals, and docs/protocol.md showing it as it is."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.support import GatewayProcess, arun
from tests.support.node import node_command
from tests.support.web import BODY_WITHIN, NODE_SCRIPT, PROTOCOL_DOC, TEST_WITHIN, TOKEN, U53, Clients, Conn, run_node

pytestmark = pytest.mark.timeout(TEST_WITHIN)


def test_the_node_client_gets_u64_hashes_digit_for_digit(live: GatewayProcess) -> None:
    node_command()
    batches = 12

    async def body() -> tuple[dict[str, Any], Conn]:
        async with Clients(live) as clients:
            python, _ = await clients.ws(label="python")
            code, out, err = await run_node(live.base, str(batches), "both")
            assert code == 0, err
            summary = json.loads(out)
            await python.wait_offset(max(b["offset"] for s in summary.values() for b in s["batches"]))
            return summary, python

    summary, python = arun(body(), BODY_WITHIN)
    by_offset = python.by_offset()
    assert set(summary) == {"ws", "sse"}
    for transport, result in summary.items():
        hello = result["hello"]
        assert hello["epoch"] == python.hello["epoch"]
        assert hello["recovered"] is False
        assert hello["occupancy_offset"] == hello["offset"] >= python.hello["offset"]
        assert len(result["batches"]) == batches
        offsets = [b["offset"] for b in result["batches"]]
        assert offsets == sorted(offsets) and offsets[0] > hello["offset"]
        hashes = []
        for got in result["batches"]:
            want = by_offset[got["offset"]]
            assert got == {
                "id": want["id"],
                "offset": want["offset"],
                "source": want["source"],
                "dp_rank": want["dp_rank"],
                "seq": want["seq"],
                "block_hashes": [event.get("block_hashes") for event in want["events"]],
            }, transport
            hashes += [h for event in got["block_hashes"] if event is not None for h in event]
        assert hashes and all(isinstance(h, str) and h.isdigit() for h in hashes)
        above = [h for h in hashes if int(h) > U53]
        assert above, "no hash above 2^53 in these batches"
        assert result["hash_types"] == ["string"]  # typeof after JSON.parse: strings, digit for digit
        assert result["above_2_53"] == len(above)
        assert result["lossy_as_number"] == sum(1 for h in hashes if int(float(int(h))) != int(h)) > 0
        window = range(hello["offset"] + 1, offsets[-1] + 1)
        assert result["notices"] == sum(1 for o in window if o in by_offset and by_offset[o]["type"] == "notice")


def test_the_node_client_sends_the_token_and_reports_refusals(guarded: GatewayProcess) -> None:
    node_command()

    async def body() -> None:
        await guarded.wait_clients(0)
        code, out, err = await run_node(guarded.base, "2", "both", token=TOKEN)
        assert code == 0, err
        summary = json.loads(out)
        assert {t: len(s["batches"]) for t, s in summary.items()} == {"ws": 2, "sse": 2}
        await guarded.wait_clients(0)
        code, out, err = await run_node(guarded.base, "2", "sse")
        assert (code, out) == (1, "")
        assert err.strip() == 'kvgateway-client: sse: HTTP 401 {"error":"missing or invalid token"}'
        code, out, err = await run_node(guarded.base, "2", "ws")
        assert (code, out) == (1, "")
        assert "kvgateway-client: websocket: connection failed or refused" in err
        await guarded.wait_clients(0)

    arun(body(), BODY_WITHIN)


def test_the_protocol_doc_shows_the_node_client_as_it_is() -> None:
    doc = PROTOCOL_DOC.read_text()
    section = doc.split("### JavaScript (Node.js)", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    blocks = re.findall(r"```js\n(.*?)```", section, re.DOTALL)
    assert blocks == [NODE_SCRIPT.read_text()]
    assert "tests/integration/js/kvgateway-client.mjs" in section
