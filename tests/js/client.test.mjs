// Unit tests of static/client.js's connection logic, with a fake WebSocket and a fake fetch:
// `node --test tests/js/client.test.mjs` (run by tests/integration/test_js_client.py).

import assert from "node:assert/strict";
import { test } from "node:test";

import { KVGatewayClient } from "../../static/client.js";

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Waits for a condition (a loaded machine is slow, never wrong): true, or false after 10 s. */
async function until(condition) {
  for (let i = 0; i < 1000 && !condition(); i++) await pause(10);
  return Boolean(condition());
}

class FakeWS {
  static made = [];
  constructor(url) {
    this.url = new URL(url);
    FakeWS.made.push(this);
  }
  close(code) {
    this.closedWith = code;
  }
  frame(...messages) {
    this.onmessage({ data: messages.map((m) => JSON.stringify(m)).join("\n") });
  }
}

const HELLO = { type: "hello", epoch: "ep", offset: 4, recovered: false, sources: [{ source: "a", dp_rank: 0, stale: false }], occupancy: null };
const STATE = { type: "state", offset: 4, source: "a", dp_rank: 0, stale: false, last: true, blocks: [] };
const batch = (offset) => ({ type: "batch", id: `ep:${offset}`, offset, source: "a", dp_rank: 0, seq: String(offset), ts: 1, events: [{ type: "BlockStored", block_hashes: [String(offset)] }] });

function client(options = {}) {
  FakeWS.made = [];
  return new KVGatewayClient("http://gw.test:8080", { WebSocket: FakeWS, backoffMs: [1], ...options });
}

test("a frame's messages all apply, even when a listener throws", () => {
  const c = client();
  const errors = [];
  c.on("error", (e) => errors.push(e.message));
  c.on("batch", () => {
    throw new Error("a listener's bug");
  });
  c.start();
  const ws = FakeWS.made[0];
  assert.equal(ws.url.pathname, "/v1/ws");
  assert.equal(ws.url.searchParams.get("snapshot"), "blocks");
  ws.onopen();
  ws.frame(HELLO, STATE, batch(5), batch(6));
  assert.deepEqual([c.state.offset, c.lastId, c.connection], [6, "ep:6", "live"]);
  assert.equal(c.state.rows("a", 0).length, 2);
  assert.deepEqual(errors, ["a listener's bug", "a listener's bug"]);
});

test("after a drop it resumes from its last id, with its filters", async () => {
  const c = client({ source: ["a"], dp_rank: 0, digest: 5, token: "t" });
  c.start();
  const first = FakeWS.made[0];
  assert.deepEqual([first.url.searchParams.getAll("source"), first.url.searchParams.get("digest")], [["a"], "5"]);
  assert.equal(first.url.searchParams.get("token"), "t");
  first.onopen();
  first.frame(HELLO, STATE, batch(5));
  first.onclose({ code: 1006, reason: "" });
  assert.equal(c.connection, "reconnecting");
  assert.ok(await until(() => FakeWS.made.length === 2));
  const second = FakeWS.made[1];
  assert.equal(second.url.searchParams.get("last_event_id"), "ep:5");
  assert.equal(second.url.searchParams.get("dp_rank"), "0");
  c.close();
});

test("a drop during the state resumes from the previous id, not the hello's", async () => {
  const c = client();
  c.start();
  FakeWS.made[0].onopen();
  FakeWS.made[0].frame(HELLO); // no state yet
  FakeWS.made[0].onclose({ code: 1006, reason: "" });
  assert.ok(await until(() => FakeWS.made.length === 2));
  assert.equal(FakeWS.made[1].url.searchParams.get("last_event_id"), null);
  c.close();
});

function sseFetch(calls, body, status = 200) {
  return async (url) => {
    calls.push(String(url));
    return new Response(body, { status, headers: { "Content-Type": status === 200 ? "text/event-stream" : "application/json" } });
  };
}

test("a WebSocket that fails to open twice while HTTP works: SSE, read with fetch", async () => {
  const calls = [];
  const sse = `retry: 2000\n\nid: ep:4\nevent: hello\ndata: ${JSON.stringify(HELLO)}\n\n: ping\n\nevent: state\ndata: ${JSON.stringify(STATE)}\n\n`;
  const c = client({ diagnose: async () => "ws", fetch: sseFetch(calls, sse) });
  const switched = [];
  c.on("transport", (t) => switched.push(t));
  c.start();
  FakeWS.made[0].onclose({ code: 1006, reason: "" });
  assert.ok(await until(() => FakeWS.made.length === 2));
  FakeWS.made[1].onclose({ code: 1006, reason: "" });
  assert.ok(await until(() => c.state.complete && c.state.lastId !== null));
  assert.deepEqual(switched, [{ transport: "sse", why: "WebSocket unavailable: switched to SSE" }]);
  assert.equal(new URL(calls[0]).pathname, "/v1/events");
  assert.equal(c.state.complete, true);
  assert.equal(c.state.lastId, "ep:4");
  c.close();
});

test("no token: the auth event, and no reconnecting until start()", async () => {
  const c = client({ diagnose: async () => "auth" });
  let asked = 0;
  c.on("auth", () => asked++);
  c.start();
  FakeWS.made[0].onerror(); // Node 20's WebSocket: an error, never a close
  assert.ok(await until(() => asked === 1));
  await pause(20); // (nothing else may follow)
  assert.deepEqual([asked, c.connection, FakeWS.made.length], [1, "stopped", 1]);
});

test("a 400 over SSE is refused with the gateway's reason, not retried", async () => {
  const calls = [];
  const c = new KVGatewayClient("http://gw.test:8080", { transport: "sse", fetch: sseFetch(calls, '{"error": "digest: expected 1 to 3600"}', 400) });
  const refused = [];
  c.on("refused", (r) => refused.push(r));
  c.start();
  assert.ok(await until(() => refused.length === 1));
  assert.deepEqual(refused, [{ status: 400, error: "digest: expected 1 to 3600" }]);
  assert.equal(calls.length, 1);
  assert.equal(c.connection, "stopped");
});

test("a slow-consumer cut over SSE backs off longer each time", async () => {
  const notice = { type: "notice", kind: "slow_consumer", reason: "too slow" };
  const sse = `data: ${JSON.stringify(HELLO)}\n\ndata: ${JSON.stringify(STATE)}\n\ndata: ${JSON.stringify(notice)}\n\n`;
  const calls = [];
  const c = new KVGatewayClient("http://gw.test:8080", { transport: "sse", backoffMs: [1, 2, 400], fetch: sseFetch(calls, sse) });
  const notes = [];
  c.on("connection", (s) => notes.push(s.note));
  c.start();
  assert.ok(await until(() => notes.filter((n) => n.startsWith("dropped")).length === 3));
  // every hello resets the backoff, but the third cut within a minute waits the third step
  const waits = notes.filter((n) => n.startsWith("dropped as a slow consumer")).map((n) => Number(/retry in ([\d.]+) s/.exec(n)[1]));
  assert.equal(waits.length, 3, JSON.stringify(notes));
  assert.ok(waits[0] < 0.1 && waits[1] < 0.1 && waits[2] >= 0.3, JSON.stringify(waits));
  c.close();
});
