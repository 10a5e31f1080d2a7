// Unit tests of static/client-state.js: `node --test tests/js/client-state.test.mjs`.
//
// KVGATEWAY_DIGEST_VECTORS (set by tests/integration/test_js_client.py) holds digests computed by
// Python's own FNV-1a: [{keys: [[medium, group_idx, hash], ...], digest: "<16 hex>"}, ...].

import assert from "node:assert/strict";
import { test } from "node:test";

import { BlockState, Digest, digestOf, fnv1a64, hex64, keyText, mediumFilter, parseMessage, seqSpan, tierOf } from "../../static/client-state.js";

const TIME_NS = "1795000000123456789"; // a TensorRT-LLM seq: time_ns, above 2^53

test("the digest equals Python's FNV-1a sums", { skip: !process.env.KVGATEWAY_DIGEST_VECTORS }, () => {
  const vectors = JSON.parse(process.env.KVGATEWAY_DIGEST_VECTORS);
  assert.ok(vectors.length >= 3);
  for (const { keys, digest } of vectors) {
    assert.equal(digestOf(keys.map(([m, g, h]) => keyText(m, g, h))), digest, JSON.stringify(keys));
  }
});

test("FNV-1a 64 of the empty string is the offset basis; the empty set is zero", () => {
  assert.equal(hex64(...fnv1a64("")), "cbf29ce484222325");
  assert.equal(hex64(...fnv1a64("a")), "af63dc4c8601ec8c"); // the published test vector
  assert.equal(digestOf([]), "0000000000000000");
});

test("the digest of docs/protocol.md's vectors", () => {
  const rows = [
    ["GPU", 0, "15760518052499183552", "3507684041cdf1ef"],
    ["GPU", 0, "42", "a35ca2b5829f0e51"],
    ["GPU", 1, "-7", "271ae3ad40f2b726"],
    ["CPU_PINNED", 0, "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "e6678d1a36eb822a"],
    ["DISK", 2, "18446744073709551615", "70808f1053f5217f"],
  ];
  for (const [m, g, h, element] of rows) assert.equal(hex64(...fnv1a64(keyText(m, g, h))), element);
  const keys = rows.map(([m, g, h]) => keyText(m, g, h));
  assert.equal(digestOf(keys.slice(0, 2)), "d8640af5c46d0040");
  assert.equal(digestOf(keys), "56670acd90405b0f");
  assert.equal(digestOf(keys.filter((_, i) => mediumFilter(["GPU"])(rows[i][0]))), "ff7eeea3055fb766");
});

test("a state's last chunk with a digest is checked when the state is complete", () => {
  const s = new BlockState();
  s.apply(hello(1, false));
  const block = { hash: "42", refs: 3, medium: "GPU", group_idx: 0 };
  s.apply({ type: "state", offset: 1, source: "a", dp_rank: 0, stale: false, last: true, blocks: [block], digest: "a35ca2b5829f0e51" });
  assert.deepEqual([s.digestChecks, s.digestMismatches], [1, 0]);
  s.apply(hello(2, false));
  s.apply({ type: "state", offset: 2, source: "a", dp_rank: 0, stale: false, last: true, blocks: [block], digest: "0000000000000000" });
  assert.deepEqual([s.digestChecks, s.digestMismatches], [2, 1]);
});

test("the digest does not depend on order, and removing undoes adding", () => {
  const keys = Array.from({ length: 200 }, (_, i) => keyText(i % 3 ? "GPU" : "CPU", i % 2, String(2n ** 63n + BigInt(i) * 7919n)));
  const shuffled = [...keys].reverse();
  assert.equal(digestOf(keys), digestOf(shuffled));
  const d = new Digest();
  for (const k of keys) d.add(k);
  for (const k of keys.slice(100)) d.remove(k);
  assert.equal(d.hex, digestOf(keys.slice(0, 100)));
  assert.equal(d.blocks, 100);
  for (const k of keys.slice(0, 100)) d.remove(k);
  assert.equal(d.hex, "0000000000000000");
});

test("seqs beyond 2^53 stay exact, whether sent as strings or as numbers", () => {
  const asNumbers = `{"type":"notice","kind":"unrecovered_gap","id":"e:5","offset":5,"source":"t","dp_rank":0,"first":${TIME_NS},"until":1795000000123456798,"count":10,"reason":"evicted"}`;
  const gap = parseMessage(asNumbers);
  assert.equal(gap.first, TIME_NS);
  assert.equal(gap.until, "1795000000123456798");
  assert.equal(seqSpan(gap.first, gap.until), BigInt(gap.count));
  assert.notEqual(String(JSON.parse(asNumbers).first), TIME_NS); // what plain JSON.parse does
  const batch = parseMessage(`{"type":"batch","id":"e:6","offset":6,"source":"t","dp_rank":0,"seq":"${TIME_NS}","ts":1.5,"events":[]}`);
  assert.equal(batch.seq, TIME_NS);
  const small = parseMessage('{"type":"notice","kind":"restart","id":"e:7","offset":7,"source":"t","dp_rank":0,"seq":0,"previous":-1,"reason":"seq_reset"}');
  assert.deepEqual([small.seq, small.previous], ["0", "-1"]);
  const hello = parseMessage(`{"type":"hello","epoch":"e","offset":7,"recovered":false,"sources":[{"source":"t","dp_rank":0,"stale":false,"last_seq":${TIME_NS}}],"occupancy":null}`);
  assert.equal(hello.sources[0].last_seq, TIME_NS);
  const status = parseMessage(`{"type":"notice","kind":"status","id":"e:8","offset":8,"source":"t","dp_rank":0,"status":{"last_seq":${TIME_NS}}}`);
  assert.equal(status.status.last_seq, TIME_NS);
  // a seq-like text inside a string is not touched
  const event = parseMessage(`{"type":"batch","id":"e:9","offset":9,"source":"t","dp_rank":0,"seq":"1","ts":1,"events":[{"type":"X","note":"\\"seq\\":${TIME_NS}"}]}`);
  assert.equal(event.events[0].note, `"seq":${TIME_NS}`);
  const state = parseMessage('{"type":"state","offset":3,"source":"t","dp_rank":0,"stale":false,"blocks":[],"last":true}');
  assert.equal(state.last, true);
});

test("mediums: tiers by prefix, and a filter selects tiers or names", () => {
  assert.deepEqual(["GPU", "CPU_PINNED", "FS", "OBJ", "REMOTE_GPU", "XGPU"].map(tierOf), ["GPU", "CPU", "DISK", "EXTERNAL", "EXTERNAL", "EXTERNAL"]);
  const cpu = mediumFilter(["cpu"]);
  assert.deepEqual(["CPU", "CPU_PINNED", "GPU"].map(cpu), [true, true, false]);
  assert.equal(mediumFilter(["cpu_pinned"])("CPU"), false);
  assert.equal(mediumFilter([])("ANY"), true);
});

function hello(offset, recovered, sources = [{ source: "a", dp_rank: 0, stale: false }]) {
  return { type: "hello", epoch: "ep", offset, recovered, sources, occupancy: null };
}

function batch(offset, events, source = "a") {
  return { type: "batch", id: `ep:${offset}`, offset, source, dp_rank: 0, seq: String(offset), ts: 1, events };
}

const stored = (hashes, extra = {}) => ({ type: "BlockStored", block_hashes: hashes, ...extra });
const removed = (hashes, extra = {}) => ({ type: "BlockRemoved", block_hashes: hashes, ...extra });

test("the state is built apart and swapped in when every stream sent its last chunk", () => {
  const s = new BlockState();
  s.apply(hello(10, false, [{ source: "a", dp_rank: 0, stale: false }, { source: "b", dp_rank: 0, stale: true }]));
  assert.equal(s.complete, false);
  assert.equal(s.lastId, null); // a drop now resumes from nothing: the state is not complete
  s.apply({ type: "state", offset: 10, source: "a", dp_rank: 0, stale: false, last: true, blocks: [{ hash: "1", refs: 2, medium: "GPU", group_idx: 0 }] });
  assert.equal(s.complete, false);
  s.apply({ type: "state", offset: 10, source: "b", dp_rank: 0, stale: true, last: true, blocks: [] });
  assert.equal(s.complete, true);
  assert.equal(s.lastId, "ep:10");
  assert.deepEqual(s.rows("a", 0), [["GPU", 0, "1", 2]]);
  assert.equal(s.streams.get("b\u00000").stale, true);

  // A fresh hello keeps the old state visible until the new one is complete.
  s.apply(hello(20, false));
  assert.deepEqual(s.rows("a", 0), [["GPU", 0, "1", 2]]);
  s.apply({ type: "state", offset: 20, source: "a", dp_rank: 0, stale: false, last: false, blocks: [{ hash: "9", refs: 1, medium: "CPU", group_idx: 1 }] });
  // the fallback: the first live message completes the state
  s.apply(batch(21, [stored(["9"], { medium: "cpu", group_idx: 1 })]));
  assert.equal(s.complete, true);
  assert.deepEqual(s.rows("a", 0), [["CPU", 1, "9", 2]]);
  assert.equal(s.lastId, "ep:21");
});

test("batches and notices apply as 'Writing a client' says", () => {
  const s = new BlockState();
  s.apply(hello(1, false));
  s.apply({ type: "state", offset: 1, source: "a", dp_rank: 0, stale: false, last: true, blocks: [] });
  s.apply(batch(2, [stored(["1", "1", "2"]), stored(["3"], { medium: null, group_idx: "x" }), removed(["2", "404"]), { type: "Unknown" }]));
  assert.deepEqual(s.rows("a", 0).sort(), [["GPU", 0, "1", 2], ["GPU", 0, "3", 1]]);
  assert.equal(s.streams.get("a\u00000").digest.hex, digestOf([keyText("GPU", 0, "1"), keyText("GPU", 0, "3")]));
  s.apply({ type: "notice", kind: "stale", id: "ep:3", offset: 3, source: "a", dp_rank: 0, reason: "unrecovered", seq: "5", detail: "" });
  assert.equal(s.streams.get("a\u00000").stale, true);
  s.apply({ type: "notice", kind: "unrecovered_gap", id: "ep:4", offset: 4, source: "a", dp_rank: 0, first: "5", until: "6", count: 2, reason: "evicted" });
  assert.equal(s.streams.get("a\u00000").stale, true);
  s.apply(batch(5, [{ type: "AllBlocksCleared" }, stored(["7"], { medium: "CPU" })]));
  assert.equal(s.streams.get("a\u00000").stale, false);
  assert.deepEqual(s.rows("a", 0), [["CPU", 0, "7", 1]]);
  s.apply({ type: "notice", kind: "restart", id: "ep:6", offset: 6, source: "a", dp_rank: 0, seq: "0", previous: "5", reason: "seq_reset" });
  assert.deepEqual(s.rows("a", 0), []);
  assert.equal(s.streams.get("a\u00000").digest.hex, "0000000000000000");
  s.apply({ type: "notice", kind: "slow_consumer", reason: "too slow" });
  assert.deepEqual([s.offset, s.lastId], [6, "ep:6"]);

  // a recovered hello keeps everything
  s.apply(batch(7, [stored(["8"])]));
  s.apply(hello(7, true));
  assert.deepEqual(s.rows("a", 0), [["GPU", 0, "8", 1]]);
  assert.equal(s.lastId, "ep:7");
});

test("digest messages are compared and mismatches counted; a medium filter digests its mediums only", () => {
  const s = new BlockState({ filters: { medium: ["GPU"] } });
  s.apply(hello(1, false));
  s.apply({ type: "state", offset: 1, source: "a", dp_rank: 0, stale: false, last: true, blocks: [{ hash: "1", refs: 1, medium: "CPU", group_idx: 0 }] });
  s.apply(batch(2, [stored(["2"])]));
  const right = digestOf([keyText("GPU", 0, "2")]);
  const ok = s.apply({ type: "digest", source: "a", dp_rank: 0, offset: 2, digest: right, block_count: 1 });
  assert.equal(ok.ok, true);
  s.streams.get("a\u00000").blocks.set(keyText("GPU", 0, "666"), 1); // a corrupted model: the digest does not know
  s.streams.get("a\u00000").digest.add(keyText("GPU", 0, "666"));
  const bad = s.apply({ type: "digest", source: "a", dp_rank: 0, offset: 2, digest: right, block_count: 1 });
  assert.equal(bad.ok, false);
  assert.deepEqual([s.digestChecks, s.digestMismatches], [2, 1]);
  assert.equal(s.lastMismatch.theirs, right);
});

test("without blocks the state keeps stale flags, seqs and the resume id only", () => {
  const s = new BlockState({ blocks: false });
  s.apply(hello(3, false, [{ source: "a", dp_rank: 0, stale: true }]), { snapshot: false });
  assert.equal(s.complete, true);
  assert.equal(s.lastId, "ep:3");
  s.apply(batch(4, [stored(["1"])]));
  assert.deepEqual(s.rows("a", 0), []);
  assert.equal(s.streams.get("a\u00000").lastSeq, "4");
  assert.equal(s.streams.get("a\u00000").stale, true);
});
