"""static/client.js in Chromium: the paused-offset conformance, in the dashboard's own page.

The page is the gateway's dashboard; the test imports ``./client.js`` into it (as any page that
reaches the gateway can) and connects a ``snapshot=blocks`` client. tests/support/conformance.py's
scripted engine then takes the gateway through a clear, a loss, restarts of every reason (one of
them to TensorRT-LLM's ``time_ns`` seqs, beyond 2^53), a drop resumed and a gateway restart; at
every pause the client's blocks and stale flags equal ``GET /v1/blocks`` at the same offset
(tests/support/conformance.py's check), and every seq it received is exact. On a gateway that knows
the ``digest`` parameter, every digest matches and a corrupted model is caught at the next one. The
dashboard in the same page shows the ``time_ns`` seqs digit for digit.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import Start, wait_until
from tests.support.conformance import RESTART_REASONS, ConformanceScript, client_matches, digest_supported

CONNECT = """async (digest) => {
  const m = await import("./client.js");
  const client = new m.KVGatewayClient(document.baseURI, { digest, backoffMs: [50, 100, 200] });
  const log = { hellos: [], restarts: [], gaps: [], digests: [] };
  client.on("hello", (msg) => log.hellos.push(msg.recovered));
  client.on("notice", (msg) => {
    if (msg.kind === "restart") log.restarts.push(msg);
    if (msg.kind === "unrecovered_gap") log.gaps.push(msg);
  });
  client.on("digest", (msg) => log.digests.push(msg.source));
  window.kvtest = { client, log, m };
  client.start();
}"""


STREAM_A = "kvtest.client.state.streams.get(kvtest.m.streamKey('a', 0))"


class PageClient:
    """The page's client, as the test reads it."""

    def __init__(self, page: Any) -> None:
        self.page = page

    def view(self) -> dict[str, Any]:
        return dict(self.page.evaluate("() => kvtest.client.state.view()"))

    def log(self, name: str) -> Any:
        return self.page.evaluate(f"() => kvtest.log.{name}")

    def stream(self, expression: str) -> Any:
        """``expression`` of stream ``a``'s state, ``s``."""
        return self.page.evaluate(f"() => {{ const s = {STREAM_A}; return {expression}; }}")


@pytest.mark.timeout(360)
def test_the_javascript_client_follows_the_gateway_in_chromium(procs: Start, new_page: Callable[..., Any]) -> None:
    script = ConformanceScript(procs)
    try:
        every = 1 if digest_supported(script.base) else 0
        page = new_page()
        page.goto(f"{script.base}/")
        client = PageClient(page)
        script.steps["history"]()
        page.evaluate(CONNECT, every)
        offsets = [client_matches(client.view, script.base, "the snapshot")]
        facts: dict[str, dict[str, Any]] = {}
        for name in ["clear", "gap", "seq_reset", "cleared", "jump", "window"]:
            facts[name] = script.steps[name]()
            offsets.append(client_matches(client.view, script.base, name))

        # TensorRT-LLM's seqs, parsed in Chromium: exact, as strings.
        jump = facts["jump"]
        assert [n["seq"] for n in client.log("restarts") if n["reason"] == "jump"] == [jump["seq"]]
        assert [(g["until"], g["count"]) for g in client.log("gaps") if g["first"] == jump["first"]] == [
            (jump["until"], 3)
        ]
        exact = "() => kvtest.log.gaps.every((g) => kvtest.m.seqSpan(g.first, g.until) === BigInt(g.count))"
        assert page.evaluate(exact)  # count == until - first + 1
        window_last = str(int(jump["last_seq"]) - 2000 + 5)
        assert client.stream("s.lastSeq") == window_last
        # The dashboard itself (its polls parsed by the client's parseMessage) shows that seq exactly.
        seq = page.locator('[data-testid="card-a-0"] [data-testid="last-seq"]')
        wait_until(lambda: seq.get_attribute("data-value") == window_last, timeout=15, what="the card's last seq")
        assert re.sub(r"\D", "", seq.inner_text()) == window_last
        # and so do its notices, from its own stream
        lines = "() => kvgatewayDashboard.state.noticeList.map((n) => n.detail || '')"
        wanted = [f"→ {jump['seq']}", f"lost seq {jump['first']}\u2013{jump['until']} (3)"]
        wait_until(lambda: all(any(w in d for d in page.evaluate(lines)) for w in wanted), timeout=15, what=wanted)

        hellos = len(client.log("hellos"))
        page.evaluate("() => kvtest.client.stop()")
        script.steps["while_dropped"]()
        page.evaluate("() => kvtest.client.start()")
        wait_until(lambda: len(client.log("hellos")) > hellos, timeout=15, what="the reconnection")
        assert client.log("hellos")[-1] is True
        offsets.append(client_matches(client.view, script.base, "a resume"))

        identity = script.steps["identity"]()
        offsets.append(client_matches(client.view, script.base, "identity"))
        assert [(n["seq"], n["previous"]) for n in client.log("restarts") if n["reason"] == "identity"] == [
            (identity["previous"], identity["previous"])
        ]
        script.steps["reconnect"]()
        offsets.append(client_matches(client.view, script.base, "reconnect"))

        hellos = len(client.log("hellos"))
        script.steps["gateway_restart"]()
        fresh_state = lambda: len(client.log("hellos")) > hellos and client.view()["complete"]  # noqa: E731
        wait_until(fresh_state, timeout=30, what="a fresh state")
        assert client.log("hellos")[-1] is False
        script.steps["after_restart"]()
        fresh = client_matches(client.view, script.base, "a gateway restart")
        assert client.stream("s.stale") is True

        assert sorted({n["reason"] for n in client.log("restarts")}) == RESTART_REASONS
        assert offsets == sorted(offsets) and fresh < offsets[-1]
        if every:
            assert page.evaluate("() => [kvtest.client.digestMismatches, kvtest.client.state.digestChecks > 0]") == [
                0,
                True,
            ]
            corrupt = "const k = kvtest.m.keyText('GPU', 0, '99'); s.blocks.set(k, 1); s.digest.add(k); return true"
            assert client.stream(f"(() => {{ {corrupt}; }})()")
            seen = len(client.log("digests"))  # after the corruption: a digest logged before it matched
            wait_until(lambda: "a" in client.log("digests")[seen:], timeout=15, what="the next digest of stream a")
            assert page.evaluate("() => kvtest.client.digestMismatches") >= 1
    finally:
        script.close()
