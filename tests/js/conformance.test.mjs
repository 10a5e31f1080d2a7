// The paused-offset conformance of static/client.js in Node, against a real gateway:
// tests/integration/test_js_client.py starts the gateway and the scripted engine
// (tests/support/conformance.py) and runs `node --test` on this file with
//   KVGATEWAY_URL      the gateway
//   KVGATEWAY_CONTROL  where to ask for the script's steps (POST /step/<name>)
//   KVGATEWAY_DIGEST   seconds between digests, when the gateway knows the parameter ("" if not)
//   KVGATEWAY_TRANSPORT "ws" or "sse"
// After each step the gateway's offset holds still: the client's blocks and stale flags must
// equal GET /v1/blocks at that offset (and its digests the gateway's).

import assert from "node:assert/strict";
import { test } from "node:test";

import { KVGatewayClient, keyText, seqSpan, streamKey } from "../../static/client.js";

const base = process.env.KVGATEWAY_URL;
const control = process.env.KVGATEWAY_CONTROL;
const digest = Number(process.env.KVGATEWAY_DIGEST || 0);
const transport = process.env.KVGATEWAY_TRANSPORT || "ws";
const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function step(name) {
  const res = await fetch(`${control}/step/${name}`, { method: "POST" });
  const body = await res.json();
  assert.equal(res.status, 200, body.error);
  return body;
}

async function until(what, predicate, timeoutMs = 20000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await pause(20);
  }
}

const sorted = (rows) => rows.map((r) => JSON.stringify(r)).sort();

/** The client equals GET /v1/blocks at the same offset; that offset. */
async function check(client, what) {
  const doc = await until(`the client at the gateway's offset (${what})`, async () => {
    const answer = await (await fetch(`${base}/v1/blocks`)).json();
    return client.state.complete && client.state.offset === answer.offset ? answer : null;
  });
  for (const s of doc.streams) {
    const mine = client.state.streams.get(streamKey(s.source, s.dp_rank));
    const theirs = s.blocks.map((b) => [b.medium, b.group_idx, b.hash, b.refs]);
    assert.deepEqual(sorted(client.state.rows(s.source, s.dp_rank)), sorted(theirs), `blocks of ${s.source} after ${what}`);
    assert.equal(mine?.stale ?? false, s.stale, `stale flag of ${s.source} after ${what}`);
    if (s.digest !== undefined) assert.equal(mine?.digest.hex ?? "0000000000000000", s.digest, `digest of ${s.source} after ${what}`);
  }
  return doc.offset;
}

test("the client follows the gateway exactly at every paused offset", { timeout: 300000 }, async () => {
  const client = new KVGatewayClient(base, { digest, transport, backoffMs: [50, 100, 200] });
  const hellos = [];
  const restarts = [];
  const gaps = [];
  client.on("hello", (m) => hellos.push(m.recovered));
  client.on("connection", (c) => console.log(`connection: ${JSON.stringify(c)}`)); // in the TAP output on a failure
  client.on("complete", () => console.log(`complete at ${client.state.offset}`));
  client.on("error", (e) => console.log(`error: ${e.message}`));
  client.on("notice", (m) => (m.kind === "restart" ? restarts : m.kind === "unrecovered_gap" ? gaps : []).push(m));
  const offsets = [];
  try {
    await step("history"); // history before the client: it learns it from the state messages
    client.start();
    assert.equal(client.transport, transport);
    offsets.push(await check(client, "the snapshot"));
    for (const name of ["clear", "gap", "seq_reset", "cleared"]) {
      await step(name);
      offsets.push(await check(client, name));
    }
    assert.ok(gaps.some((n) => n.first === "50" && n.until === "52"), JSON.stringify(gaps));

    // TensorRT-LLM's time_ns seqs, beyond 2^53: every seq exact, as strings.
    const jump = await step("jump");
    offsets.push(await check(client, "jump"));
    const leap = restarts.find((n) => n.reason === "jump");
    assert.equal(leap.seq, jump.seq);
    const high = gaps.find((n) => n.first === jump.first);
    assert.deepEqual([high?.until, high?.count], [jump.until, 3], JSON.stringify(gaps));
    assert.equal(client.state.streams.get(streamKey("a", 0)).lastSeq, jump.last_seq);
    assert.equal(client.state.streams.get(streamKey("a", 0)).stale, true); // from the stale notice

    await step("window");
    offsets.push(await check(client, "window"));

    // A drop: what the engine publishes meanwhile arrives on resume.
    const before = hellos.length;
    client.stop();
    await step("while_dropped");
    client.start();
    await until("the reconnection", () => hellos.length > before);
    assert.equal(hellos.at(-1), true); // recovered: nothing lost, no state sent
    offsets.push(await check(client, "a resume"));

    const identity = await step("identity");
    offsets.push(await check(client, "identity"));
    const other = restarts.find((n) => n.reason === "identity");
    assert.deepEqual([other.seq, other.previous], [identity.previous, identity.previous]);
    await step("reconnect");
    offsets.push(await check(client, "reconnect"));

    // A gateway restart: another epoch, so the client starts over from a fresh state.
    const restarted = hellos.length;
    await step("gateway_restart");
    await until("a fresh state", () => hellos.length > restarted && client.state.complete, 30000);
    assert.equal(hellos.at(-1), false);
    await step("after_restart");
    const fresh = await check(client, "a gateway restart");
    assert.equal(client.state.streams.get(streamKey("a", 0)).stale, true); // the engine no longer holds seqs 0..5

    assert.deepEqual([...new Set(restarts.map((n) => n.reason))].sort(), ["cleared", "identity", "jump", "reconnect", "seq_reset", "window"]);
    assert.deepEqual(offsets, [...offsets].sort((x, y) => x - y));
    assert.ok(fresh < offsets.at(-1));
    for (const gap of gaps) assert.equal(seqSpan(gap.first, gap.until), BigInt(gap.count), JSON.stringify(gap)); // count == until - first + 1

    if (digest) {
      // Every digest so far matched; a corrupted model is caught at the very next digest of its stream.
      assert.equal(client.digestMismatches, 0);
      assert.ok(client.state.digestChecks > 0);
      const checks = [];
      client.on("digest", (m) => checks.push(m.source));
      const a = client.state.streams.get(streamKey("a", 0));
      const key = keyText("GPU", 0, "12345678901234567890");
      a.blocks.set(key, 1);
      a.digest.add(key);
      await until("the next digest of stream a", () => checks.includes("a"), 10000 + digest * 3000);
      assert.ok(client.digestMismatches >= 1);
      assert.equal(client.state.lastMismatch.source, "a");
    }
  } finally {
    client.close();
  }
});
