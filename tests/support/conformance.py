"""The paused-offset conformance script, for clients that are not in this process.

:class:`ConformanceScript` drives a gateway with tests/integration/test_client_conformance.py's
scripted vLLM engine (every seq chosen by the test) through the same steps: history before the
client, a clear, a loss, restarts of every reason, a drop resumed, a gateway restart. Each step
returns once the gateway delivered it, so the gateway's offset is paused until the next step and
the client under test must then equal ``GET /v1/blocks`` at that offset. The ``jump`` restart
leaps to TensorRT-LLM's ``time_ns`` seqs (about 1.8e18, beyond 2^53), and a loss follows it
there, so every seq field a client reads after it needs 64 exact bits.

A client in Node asks for the steps over HTTP (:class:`ControlServer`: ``POST /step/<name>``,
answered with the step's facts as JSON); a page in Chromium is driven by the test directly.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tests.integration.test_client_conformance import CLEARED, ScriptedEngine
from tests.support.gateway import BIG_QUEUE, GatewayProcess, start_gateway
from tests.support.ports import free_ports
from tests.support.processes import REPO, Start
from tests.support.sources import source_spec
from tests.support.waits import wait_until

STEPS = [
    "history",
    "clear",
    "gap",
    "seq_reset",
    "cleared",
    "jump",
    "window",
    "while_dropped",
    "identity",
    "reconnect",
    "gateway_restart",
    "after_restart",
]
RESTART_REASONS = ["cleared", "identity", "jump", "reconnect", "seq_reset", "window"]


def digest_supported(base: str) -> bool:
    """Whether this gateway knows the ``digest`` parameter: only a 400 naming it says no."""
    with httpx.stream("GET", f"{base}/v1/events", params={"digest": "1"}, timeout=10) as response:
        if response.status_code == 400:
            response.read()
            assert "digest" in response.text, response.text  # any other 400 is a failure
            schema = json.loads((REPO / "kvgateway" / "protocol" / "schema.json").read_text())
            assert "digest" not in schema["$defs"], "the schema has digest messages, the gateway refuses them"
            return False
        assert response.status_code == 200, response.status_code
        return True


class ConformanceScript:
    """A gateway on a free port with two streams: ``a`` (the scripted engine) and ``b`` (idle)."""

    def __init__(self, start: Start) -> None:
        self.start = start
        self.http, idle = free_ports(2)
        pub, rep = free_ports(2, spacing=2)
        self.specs = [source_spec("a", pub, rep), source_spec("b", idle)]
        self.engine = ScriptedEngine(pub, rep, random.Random(25))
        self.gateway = self._gateway()
        self.base = f"http://127.0.0.1:{self.http}"
        self.jump = 0
        self.window = 0
        self.steps: dict[str, Callable[[], dict[str, Any]]] = {name: getattr(self, f"step_{name}") for name in STEPS}

    def _gateway(self) -> GatewayProcess:
        return start_gateway(self.start, self.http, self.specs, "--replay-timeout", "0.5", client_queue_bytes=BIG_QUEUE)

    def close(self) -> None:
        self.engine.close()

    # what the gateway says

    def status(self) -> dict[str, Any]:
        sources: list[dict[str, Any]] = httpx.get(f"{self.base}/v1/sources", timeout=10).json()["sources"]
        return next(s for s in sources if s["source"] == "a")

    def delivered(self, seq: int) -> None:
        # int(): the seq is a string from a gateway that writes seqs as strings, a number before
        wait_until(
            lambda: (last := self.status()["last_seq"]) is not None and int(last) == seq,
            timeout=15,
            interval=0.02,
            what=f"seq {seq} delivered",
        )

    def counted(self, counter: str, before: int) -> None:
        wait_until(lambda: self.status()["counters"][counter] > before, timeout=15, interval=0.02, what=counter)

    def replaced(self, seqs: range) -> None:
        """Another process behind the same sockets publishes ``seqs``."""
        self.engine.new_process(down=False)
        self.engine.run(seqs)

    def restarted(self, act: Callable[[], None]) -> None:
        before = self.status()["counters"]["restarts"]
        act()
        self.counted("restarts", before)

    # the steps, in order

    def step_history(self) -> dict[str, Any]:
        wait_until(lambda: self.status()["connected"], timeout=15, what="the engine connected")
        self.engine.run(range(0, 30))
        self.delivered(29)
        return {}

    def step_clear(self) -> dict[str, Any]:
        self.engine.run(range(30, 40))
        self.engine.publish(40, [*self.engine.events(), CLEARED, *self.engine.events()])
        self.engine.run(range(41, 50))
        self.delivered(49)
        return {}

    def lose(self, seqs: range, then: range) -> None:
        before = self.status()["counters"]["unrecovered"]
        for seq in seqs:
            self.engine.publish(seq, live=False, held=False)
        self.engine.run(then)
        self.counted("unrecovered", before)
        self.delivered(then[-1])

    def step_gap(self) -> dict[str, Any]:
        self.lose(range(50, 53), range(53, 56))
        return {}

    def step_seq_reset(self) -> dict[str, Any]:
        self.restarted(lambda: self.replaced(range(0, 10)))
        self.delivered(9)
        return {}

    def step_cleared(self) -> dict[str, Any]:
        def act() -> None:
            self.engine.new_process(down=False)
            self.engine.publish(5, [CLEARED, *self.engine.events()])
            self.engine.run(range(6, 12))

        self.restarted(act)
        self.delivered(11)
        return {}

    def step_jump(self) -> dict[str, Any]:
        """TensorRT-LLM's clock-seeded seqs, then a loss up there."""
        jump = self.jump = time.time_ns()
        self.restarted(lambda: self.replaced(range(jump, jump + 6)))
        self.delivered(jump + 5)
        self.lose(range(jump + 6, jump + 9), range(jump + 9, jump + 12))
        return {"seq": str(jump), "first": str(jump + 6), "until": str(jump + 8), "last_seq": str(jump + 11)}

    def step_window(self) -> dict[str, Any]:
        window = self.window = self.jump + 11 - 2000
        self.restarted(lambda: self.replaced(range(window, window + 6)))
        self.delivered(window + 5)
        return {}

    def step_while_dropped(self) -> dict[str, Any]:
        """What the engine publishes while the client is away (it resumes afterwards)."""
        self.engine.run(range(self.window + 6, self.window + 12))
        self.delivered(self.window + 11)
        return {}

    def step_identity(self) -> dict[str, Any]:
        def act() -> None:
            self.engine.new_process(down=True)
            for seq in range(0, 5):  # its history, only in its buffer: caught up by replay
                self.engine.publish(seq, live=False)

        self.restarted(act)
        self.delivered(4)
        self.engine.run(range(5, 10))
        self.delivered(9)
        return {"previous": str(self.window + 11)}

    def step_reconnect(self) -> dict[str, Any]:
        self.engine.new_process(down=True)
        for seq in range(10, 13):  # held above the last seq: the gateway cannot tell
            self.engine.publish(seq, live=False)
        self.delivered(12)
        self.restarted(lambda: self.replaced(range(6, 9)))
        self.delivered(8)
        return {}

    def step_gateway_restart(self) -> dict[str, Any]:
        self.gateway.proc.stop()
        self.gateway = self._gateway()
        return {}

    def step_after_restart(self) -> dict[str, Any]:
        self.engine.run(range(9, 15))
        self.delivered(14)
        return {}


def client_matches(view: Callable[[], dict[str, Any]], base: str, what: str) -> int:
    """The client equals ``GET /v1/blocks`` at the same offset (blocks, stale flags, and digests
    when the gateway gives them); that offset. ``view()`` is client.js's ``state.view()``:
    ``{offset, complete, streams: [{source, dp_rank, stale, digest, blocks: [[medium, group_idx,
    hash, refs], ...]}]}``."""

    def aligned() -> tuple[dict[str, Any], dict[str, Any]] | None:
        doc: dict[str, Any] = httpx.get(f"{base}/v1/blocks", timeout=10).json()
        mine = view()
        return (mine, doc) if mine["complete"] and mine["offset"] == doc["offset"] else None

    mine, doc = wait_until(aligned, timeout=20, interval=0.02, what=f"the client at the gateway's offset ({what})")
    ours = {(s["source"], s["dp_rank"]): s for s in mine["streams"]}
    for stream in doc["streams"]:
        key = (stream["source"], stream["dp_rank"])
        held = ours.get(key, {"stale": False, "blocks": [], "digest": "0000000000000000"})
        theirs = sorted((b["medium"], b["group_idx"], b["hash"], b["refs"]) for b in stream["blocks"])
        assert sorted(map(tuple, held["blocks"])) == theirs, f"blocks of {key} differ after {what}"
        assert held["stale"] == stream["stale"], f"stale flag of {key} differs after {what}"
        if "digest" in stream:
            assert held["digest"] == stream["digest"], f"digest of {key} differs after {what}"
    return int(doc["offset"])


class ControlServer:
    """``POST /step/<name>`` runs that step of a script; the answer is its facts as JSON (or a
    500 with the error). On a free loopback port, in a thread, until :meth:`close`."""

    def __init__(self, script: ConformanceScript) -> None:
        steps = script.steps

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                name = self.path.removeprefix("/step/")
                try:
                    code, body = 200, json.dumps(steps[name]())
                except Exception as exc:  # the Node test prints it and fails
                    code, body = 500, json.dumps({"error": f"{name}: {exc!r}"})
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
